//! Sampler throughput against n (d = 8).
#![allow(missing_docs)] // criterion_group! generates an undocumented pub fn

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use fspace_context::{BoundingBox, HaltonSampler, LatinHypercube, Sampler, SobolSampler, UniformSampler};
use rand::{rngs::StdRng, SeedableRng};

fn bench_samplers(c: &mut Criterion) {
    let bbox = BoundingBox::cube(8, -1.0, 1.0).unwrap();
    let samplers: Vec<(&str, Box<dyn Sampler>)> = vec![
        ("uniform", Box::new(UniformSampler::new(bbox.clone()))),
        ("halton", Box::new(HaltonSampler::new(bbox.clone()))),
        ("halton_scrambled", Box::new(HaltonSampler::new(bbox.clone()).scrambled(0))),
        ("sobol", Box::new(SobolSampler::new(bbox.clone()).unwrap())),
        ("lhs", Box::new(LatinHypercube::new(bbox.clone()))),
    ];
    for (name, s) in samplers {
        let mut group = c.benchmark_group(format!("sample_{name}_d8"));
        for n in [1_000usize, 4_000, 16_000] {
            group.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, &n| {
                let mut rng = StdRng::seed_from_u64(0);
                b.iter(|| s.sample(n, &mut rng).unwrap())
            });
        }
        group.finish();
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default();
    targets = bench_samplers
}
criterion_main!(benches);
