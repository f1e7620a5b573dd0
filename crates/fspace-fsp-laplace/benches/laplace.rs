//! Alg. 2 (`laplace`) time against the number of context points and the network size
//! (criterion, 10 samples). Larger sweeps with peak memory: the `laplace_scaling` example.
#![allow(missing_docs)] // criterion_group! generates an undocumented pub fn

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use fspace_context::{BoundingBox, HaltonSampler, Sampler};
use fspace_core::Gaussian;
use fspace_fsp_laplace::{laplace, FunctionPrior, LaplaceConfig};
use fspace_kernels::Rbf;
use fspace_nn::{Activation, Mlp, MlpConfig};
use nalgebra::{DMatrix, DVector};
use rand::{rngs::StdRng, Rng, SeedableRng};

fn setup(n_c: usize, width: usize) -> (Mlp, DMatrix<f64>, DVector<f64>, DMatrix<f64>) {
    let mut rng = StdRng::seed_from_u64(0);
    let x: DMatrix<f64> = DMatrix::from_fn(500, 2, |_, _| rng.gen_range(-1.5..1.5));
    let y = DVector::from_fn(500, |i, _| (x[(i, 0)] * 2.0).sin() + x[(i, 1)]);
    let c = HaltonSampler::new(BoundingBox::cube(2, -3.0, 3.0).unwrap()).sample(n_c, &mut rng).unwrap();
    let net = Mlp::new(MlpConfig {
        input_dim: 2,
        hidden: vec![width, width],
        output_dim: 1,
        activation: Activation::Tanh,
        seed: 0,
    })
    .unwrap();
    (net, x, y, c)
}

fn bench(c: &mut Criterion) {
    let prior = FunctionPrior::centered(Box::new(Rbf::new(1.0, 0.3).unwrap()));
    let lik = Gaussian::new(0.1).unwrap();
    let cfg = LaplaceConfig { max_rank: 200, ..Default::default() };
    let mut g = c.benchmark_group("fsp_laplace_alg2");
    g.sample_size(10);
    for n_c in [100usize, 400, 1600] {
        let (net, x, y, ctx) = setup(n_c, 50);
        g.bench_with_input(BenchmarkId::new("n_context_2x50_r200", n_c), &n_c, |b, _| {
            b.iter(|| laplace(&net, &lik, &prior, &x, &y, &ctx, &cfg).unwrap())
        });
    }
    for width in [50usize, 100, 200, 400] {
        let (net, x, y, ctx) = setup(400, width);
        g.bench_with_input(BenchmarkId::new("width_nc400_r200", width), &width, |b, _| {
            b.iter(|| laplace(&net, &lik, &prior, &x, &y, &ctx, &cfg).unwrap())
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
