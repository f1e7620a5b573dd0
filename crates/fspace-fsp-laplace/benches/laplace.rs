//! Alg. 2 (`laplace`) time against the number of context points and the network size, and
//! Alg. 1 steps of the MNIST CNN and a small MLP (criterion, 10 samples). Larger sweeps with peak memory: the `laplace_scaling` example.
#![allow(missing_docs)] // criterion_group! generates an undocumented pub fn

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use fspace_context::{BoundingBox, UniformSampler};
use fspace_core::Categorical;
use fspace_fsp_laplace::{laplace, train, FspLaplaceConfig, TrainOptions};
use fspace_kernels::{GpPrior, Independent, Rbf};
use fspace_nn::{Activation, Cnn, CnnConfig, TrainConfig};
use nalgebra::{DMatrix, DVector};

#[path = "support/problem.rs"]
mod problem;

fn bench(c: &mut Criterion) {
    let cfg = FspLaplaceConfig { max_rank: 200, ..Default::default() };
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

/// Alg. 1 steps (`train`, batch 100, 100 uniform context points per step): the FSP MNIST CNN
/// on synthetic 28 × 28 images (10 steps) and the 2×50 MLP on the scaling problem's data
/// (100 steps). Each step runs the data pass and the context pass side by side.
fn alg1(c: &mut Criterion) {
    let mut g = c.benchmark_group("fsp_laplace_alg1");
    g.sample_size(10);
    let x = DMatrix::from_fn(1000, 784, |i, j| (((i * 31 + j * 7) % 255) as f64 / 255.0 - 0.5).max(0.0));
    let y = DVector::from_fn(1000, |i, _| (i % 10) as f64);
    let prior = GpPrior::centered(Independent::new(Rbf::new(4.0, 20.0).unwrap(), 10).unwrap());
    let context = UniformSampler::new(BoundingBox::cube(784, 0.0, 1.0).unwrap());
    let options = TrainOptions {
        train: TrainConfig {
            schedule: fspace_core::Schedule::epochs(1),
            batch_size: 100,
            ..Default::default()
        },
        ..Default::default()
    };
    let cnn = Cnn::new(CnnConfig::fsp_mnist(10, Activation::Tanh, 0)).unwrap();
    g.bench_function("fsp_cnn_10_steps", |b| {
        b.iter(|| {
            let mut net = cnn.clone();
            let mut lik = Categorical::new(10).unwrap();
            train(&mut net, &mut lik, &prior, &x, &y, None, &context, &options, |_| {}).unwrap()
        })
    });
    let p = problem::problem(100, 50);
    let context = UniformSampler::new(BoundingBox::cube(2, -3.0, 3.0).unwrap());
    let options = TrainOptions {
        train: TrainConfig { schedule: fspace_core::Schedule::epochs(20), ..options.train },
        ..Default::default()
    };
    g.bench_function("mlp_2x50_100_steps", |b| {
        b.iter(|| {
            let mut net = p.net.clone();
            let mut lik = p.likelihood;
            train(&mut net, &mut lik, &p.prior, &p.x, &p.y, None, &context, &options, |_| {}).unwrap()
        })
    });
    g.finish();
}

criterion_group!(benches, bench, alg1);
criterion_main!(benches);
