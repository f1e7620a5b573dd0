//! Exact GP fit + predict against n, one SVGP step (natural gradient + hyperparameter
//! gradient on a 256-point minibatch) and 20 steps of SVGP training against the number of
//! inducing points M, and k-means
//! on image-sized points against n and k.
#![allow(missing_docs)] // criterion_group! generates an undocumented pub fn

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use fspace_core::{Posterior, Schedule};
use fspace_gp::{ExactGp, Noise, Svgp, SvgpConfig};
use fspace_kernels::{PriorMean, Rbf};
use nalgebra::{DMatrix, DVector};
use rand::{rngs::StdRng, Rng, SeedableRng};

fn data(n: usize, d: usize) -> (DMatrix<f64>, DVector<f64>) {
    let mut rng = StdRng::seed_from_u64(0);
    let x: DMatrix<f64> = DMatrix::from_fn(n, d, |_, _| rng.gen_range(-2.0..2.0));
    let y = DVector::from_fn(n, |i, _| x.row(i).sum().sin() + 0.1 * rng.gen_range(-1.0..1.0));
    (x, y)
}

fn bench(c: &mut Criterion) {
    let kernel = Rbf::ard(1.0, vec![0.8; 4]).unwrap();
    let mut group = c.benchmark_group("exact_gp_fit_predict_d4");
    group.sample_size(10);
    for n in [500usize, 1000, 2000, 4000] {
        let (x, y) = data(n, 4);
        let y = DMatrix::from_column_slice(n, 1, y.as_slice());
        let xs = data(100, 4).0;
        group.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, _| {
            b.iter(|| {
                let gp = ExactGp::fit(kernel.clone(), PriorMean::Zero, Noise::Homoscedastic(0.01), &x, &y)
                    .unwrap();
                gp.predict(&xs).unwrap()
            })
        });
    }
    group.finish();
    // The joint predictive's covariance `K** − VᵀV` (V: n × m) dominates for many test points.
    let mut group = c.benchmark_group("exact_gp_predict_joint_n2000_d4");
    group.sample_size(10);
    let (x, y) = data(2000, 4);
    let y = DMatrix::from_column_slice(2000, 1, y.as_slice());
    let gp = ExactGp::fit(kernel.clone(), PriorMean::Zero, Noise::Homoscedastic(0.01), &x, &y).unwrap();
    for m in [250usize, 500, 1000] {
        let xs = data(m, 4).0;
        group.bench_with_input(BenchmarkId::from_parameter(m), &m, |b, _| {
            b.iter(|| gp.predict_joint(&xs).unwrap())
        });
    }
    group.finish();
    let mut group = c.benchmark_group("svgp_step_b256_d4");
    group.sample_size(10);
    let (x, y) = data(256, 4);
    for m in [50usize, 100, 200, 400] {
        let z = data(m, 4).0;
        let mut model = Svgp::new(kernel.clone(), PriorMean::Zero, 0.1, z).unwrap();
        group.bench_with_input(BenchmarkId::from_parameter(m), &m, |b, _| {
            b.iter(|| {
                model.natural_gradient_step(&x, &y, 10_000, 0.2).unwrap();
                model.elbo_gradient(&x, &y, 10_000).unwrap()
            })
        });
    }
    group.finish();
    // Whole training steps as `Svgp::train` takes them (one minibatch's factors shared by the
    // natural-gradient step and the hyperparameter gradient), full batch of 222 six-dimensional
    // points as on a yacht fold, 20 steps per iteration.
    let mut group = c.benchmark_group("svgp_train_20_steps_n222_d6");
    group.sample_size(10);
    let (x6, y6) = data(222, 6);
    let kernel6 = Rbf::ard(1.0, vec![0.8; 6]).unwrap();
    for m in [50usize, 100, 200] {
        group.bench_with_input(BenchmarkId::from_parameter(m), &m, |b, &m| {
            b.iter(|| {
                let z = x6.rows(0, m).clone_owned();
                let mut model = Svgp::new(kernel6.clone(), PriorMean::Zero, 0.1, z).unwrap();
                let config = SvgpConfig { schedule: Schedule::steps(20), ..Default::default() };
                model.train(&x6, &y6, &config).unwrap()
            })
        });
    }
    group.finish();
    // The inducing-input gradient that `learn_inducing_points` adds to each step.
    let mut group = c.benchmark_group("svgp_inducing_gradient_b256_d4");
    group.sample_size(10);
    for m in [50usize, 100, 200, 400] {
        let model = Svgp::new(kernel.clone(), PriorMean::Zero, 0.1, data(m, 4).0).unwrap();
        group.bench_with_input(BenchmarkId::from_parameter(m), &m, |b, _| {
            b.iter(|| model.elbo_gradient_inducing(&x, &y, 10_000).unwrap())
        });
    }
    group.finish();
    // k-means at image size (VaLLA's per-class inducing points: 5 400 images per class).
    let mut group = c.benchmark_group("kmeans_d784_20_iterations");
    group.sample_size(10);
    for (n, k) in [(1_350usize, 10usize), (1_350, 20), (5_400, 10), (5_400, 20)] {
        let (x, _) = data(n, 784);
        group.bench_with_input(BenchmarkId::new(format!("n{n}"), k), &k, |b, &k| {
            b.iter(|| fspace_gp::kmeans(&x, k, 20, 0).unwrap())
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default();
    targets = bench
}
criterion_main!(benches);
