//! Alg. 2 (`laplace`) time against the number of context points and the network size
//! (criterion, 10 samples). Larger sweeps with peak memory: the `laplace_scaling` example.
#![allow(missing_docs)] // criterion_group! generates an undocumented pub fn

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use fspace_fsp_laplace::{laplace, LaplaceConfig};

#[path = "support/problem.rs"]
mod problem;

fn bench(c: &mut Criterion) {
    let cfg = LaplaceConfig { max_rank: 200, ..Default::default() };
    let mut g = c.benchmark_group("fsp_laplace_alg2");
    g.sample_size(10);
    let cases = [100usize, 400, 1600]
        .map(|n_c| ("n_context_2x50_r200", n_c, 50))
        .into_iter()
        .chain([50usize, 100, 200, 400].map(|w| ("width_nc400_r200", 400, w)));
    for (group, n_c, width) in cases {
        let p = problem::problem(n_c, width);
        let size = if group.starts_with("n_context") { n_c } else { width };
        g.bench_with_input(BenchmarkId::new(group, size), &size, |b, _| {
            b.iter(|| laplace(&p.net, &p.likelihood, &p.prior, &p.x, &p.y, &p.context, &cfg).unwrap())
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
