//! Exact GP fit + predict against n, one SVGP step (natural gradient + hyperparameter
//! gradient on a 256-point minibatch) and 20 steps of SVGP training against the number of
//! inducing points M, and k-means
//! on image-sized points against n and k.
#![allow(missing_docs)] // criterion_group! generates an undocumented pub fn

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use fspace_core::{Data, LikelihoodSpec, Posterior, Schedule};
use fspace_gp::{ExactGp, InducingPoints, Svgp, SvgpConfig};
use fspace_kernels::{GpPrior, PriorMean, Rbf};
use nalgebra::{DMatrix, DVector};
use rand::{rngs::StdRng, Rng, SeedableRng};

fn data(n: usize, d: usize) -> (DMatrix<f64>, DVector<f64>) {
    let mut rng = StdRng::seed_from_u64(0);
    let x: DMatrix<f64> = DMatrix::from_fn(n, d, |_, _| rng.gen_range(-2.0..2.0));
    let y = DVector::from_fn(n, |i, _| x.row(i).sum().sin() + 0.1 * rng.gen_range(-1.0..1.0));
    (x, y)
}

/// The exact GP with noise σ = 0.1 through its entry point.
fn exact_gp(kernel: &Rbf, x: &DMatrix<f64>, y: &DMatrix<f64>) -> ExactGp<Rbf> {
    let prior = GpPrior::with_kernel(kernel.clone(), PriorMean::Zero);
    fspace_gp::exact::fit(LikelihoodSpec::gaussian(0.1), &prior, &Data::new(x, y).unwrap()).unwrap().posterior
}

/// The SVGP (σ ≈ 0.32, learned with the kernel) with inducing inputs `z` after `steps` training
/// steps, through its entry point.
fn svgp(kernel: &Rbf, z: DMatrix<f64>, x: &DMatrix<f64>, y: &DVector<f64>, steps: usize) -> Svgp<Rbf> {
    let prior = GpPrior::with_kernel(kernel.clone(), PriorMean::Zero);
    let y = DMatrix::from_column_slice(y.len(), 1, y.as_slice());
    let config = SvgpConfig {
        schedule: Schedule::steps(steps),
        inducing: InducingPoints::Given(z),
        ..Default::default()
    };
    let likelihood = LikelihoodSpec::gaussian_learned(0.1f64.sqrt());
    fspace_gp::svgp::fit(likelihood, &prior, &Data::new(x, &y).unwrap(), &config).unwrap().posterior
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
            b.iter(|| exact_gp(&kernel, &x, &y).predict(&xs).unwrap())
        });
    }
    group.finish();
    // The same fit and predictive on the shared prior the function-space methods take
    // (`GpPrior::centered`): the type-erased kernel costs what the concrete one does.
    let mut group = c.benchmark_group("exact_gp_fit_predict_shared_prior_d4");
    group.sample_size(10);
    let shared = GpPrior::centered(kernel.clone());
    for n in [1000usize, 2000] {
        let (x, y) = data(n, 4);
        let y = DMatrix::from_column_slice(n, 1, y.as_slice());
        let (data, xs) = (Data::new(&x, &y).unwrap(), data(100, 4).0);
        group.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, _| {
            b.iter(|| {
                let gp = fspace_gp::exact::fit(LikelihoodSpec::gaussian(0.1), &shared, &data).unwrap();
                gp.posterior.predict(&xs).unwrap()
            })
        });
    }
    group.finish();
    // The joint predictive's covariance `K** − VᵀV` (V: n × m) dominates for many test points.
    let mut group = c.benchmark_group("exact_gp_predict_joint_n2000_d4");
    group.sample_size(10);
    let (x, y) = data(2000, 4);
    let y = DMatrix::from_column_slice(2000, 1, y.as_slice());
    let gp = exact_gp(&kernel, &x, &y);
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
    // The models are built on 1 000 points (at most one inducing input per point), then step on
    // a 256-point minibatch of a 10 000-point set.
    let (x_fit, y_fit) = data(1000, 4);
    for m in [50usize, 100, 200, 400] {
        let z = data(m, 4).0;
        let mut model = svgp(&kernel, z, &x_fit, &y_fit, 1);
        group.bench_with_input(BenchmarkId::from_parameter(m), &m, |b, _| {
            b.iter(|| {
                model.natural_gradient_step(&x, &y, 10_000, 0.2).unwrap();
                model.elbo_gradient(&x, &y, 10_000).unwrap()
            })
        });
    }
    group.finish();
    // Whole training steps as `svgp::fit` takes them (one minibatch's factors shared by the
    // natural-gradient step and the hyperparameter gradient), full batch of 222 six-dimensional
    // points as on a yacht fold, 20 steps per iteration.
    let mut group = c.benchmark_group("svgp_train_20_steps_n222_d6");
    group.sample_size(10);
    let (x6, y6) = data(222, 6);
    let kernel6 = Rbf::ard(1.0, vec![0.8; 6]).unwrap();
    for m in [50usize, 100, 200] {
        group.bench_with_input(BenchmarkId::from_parameter(m), &m, |b, &m| {
            b.iter(|| svgp(&kernel6, x6.rows(0, m).clone_owned(), &x6, &y6, 20))
        });
    }
    group.finish();
    // The inducing-input gradient that `learn_inducing_points` adds to each step.
    let mut group = c.benchmark_group("svgp_inducing_gradient_b256_d4");
    group.sample_size(10);
    for m in [50usize, 100, 200, 400] {
        let model = svgp(&kernel, data(m, 4).0, &x_fit, &y_fit, 1);
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
