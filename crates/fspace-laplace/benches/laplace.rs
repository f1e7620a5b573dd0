//! Criterion benchmarks of the Laplace structures on the benchmark workloads (W1 = sine toy,
//! 2×50, p = 2 701; W2 = 10 000 points, 2×200, p = 40 801), a sweep over the number of
//! data points for KFAC, one over the number of draws for the sampled posterior, and KFAC's λ
//! grid search on the FSP MNIST CNN against the number of validation images, and the last-layer
//! GLM predictives (the `last_layer` structure, and last-layer KFAC's mean and covariances) of
//! the MNIST MLP against the number of test images, and the streamed fit
//! (batches of 128) beside the in-memory one over the number of points.
//! `cargo bench -p fspace-laplace`; peak memory per case:
//! `cargo run --release -p fspace-laplace --example laplace_workloads`.
#![allow(missing_docs)] // criterion_group! generates an undocumented pub fn

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use fspace_core::Data;
use fspace_core::LikelihoodSpec;
use fspace_laplace::{fit, fit_batches, LaplaceConfig, MarglikConfig, SampledConfig, Structure};
use fspace_nn::{Activation, Cnn, CnnConfig, Mlp, MlpConfig};
use nalgebra::{DMatrix, DVector};

#[path = "support/workloads.rs"]
mod workloads;

fn config(structure: Structure) -> LaplaceConfig {
    LaplaceConfig { structure, ..Default::default() }
}

fn w1(c: &mut Criterion) {
    let w = workloads::w1();
    let mut g = c.benchmark_group("w1");
    g.sample_size(10);
    g.bench_function("full_fit_marglik_predict1000", |b| {
        b.iter(|| {
            let mut post =
                fit(w.net.clone(), w.likelihood, &Data::new(&w.x, &w.y).unwrap(), &config(Structure::full()))
                    .unwrap()
                    .posterior;
            post.optimize_prior_precision(&MarglikConfig::default()).unwrap();
            post.predict_glm(&w.x_test).unwrap()
        })
    });
    for (name, s) in [
        ("kfac", Structure::Kfac),
        ("ekfac", Structure::Ekfac),
        ("diag", Structure::Diag),
        ("block_diag", Structure::block_diag()),
        ("last_layer", Structure::last_layer()),
    ] {
        g.bench_function(format!("{name}_fit_predict1000"), |b| {
            b.iter(|| {
                let post =
                    fit(w.net.clone(), w.likelihood, &Data::new(&w.x, &w.y).unwrap(), &config(s.clone()))
                        .unwrap()
                        .posterior;
                post.predict_glm(&w.x_test).unwrap()
            })
        });
    }
    g.finish();
}

fn w2(c: &mut Criterion) {
    let w = workloads::w2();
    let mut g = c.benchmark_group("w2");
    g.sample_size(10);
    g.bench_function("kfac_fit", |b| {
        b.iter(|| {
            fit(w.net.clone(), w.likelihood, &Data::new(&w.x, &w.y).unwrap(), &config(Structure::Kfac))
                .unwrap()
                .posterior
        })
    });
    let post = fit(w.net.clone(), w.likelihood, &Data::new(&w.x, &w.y).unwrap(), &config(Structure::Kfac))
        .unwrap()
        .posterior;
    g.bench_function("kfac_predict1000", |b| b.iter(|| post.predict_glm(&w.x_test).unwrap()));
    g.bench_function("diag_fit", |b| {
        b.iter(|| {
            fit(w.net.clone(), w.likelihood, &Data::new(&w.x, &w.y).unwrap(), &config(Structure::Diag))
                .unwrap()
                .posterior
        })
    });
    g.bench_function("low_rank100_fit", |b| {
        b.iter(|| {
            fit(
                w.net.clone(),
                w.likelihood,
                &Data::new(&w.x, &w.y).unwrap(),
                &config(Structure::low_rank(100)),
            )
            .unwrap()
            .posterior
        })
    });
    g.finish();
}

fn kfac_sweep(c: &mut Criterion) {
    let mut g = c.benchmark_group("kfac_fit_vs_n_2x200");
    g.sample_size(10);
    for n in [1_000, 4_000, 10_000] {
        let w = workloads::workload(n, 200);
        g.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, _| {
            b.iter(|| {
                fit(w.net.clone(), w.likelihood, &Data::new(&w.x, &w.y).unwrap(), &config(Structure::Kfac))
                    .unwrap()
                    .posterior
            })
        });
    }
    g.finish();
}

/// KFAC and diag from batches of 128 points (`fit_batches`, the streamed fit) against the
/// in-memory fit, over the number of points: the streamed cost should track the in-memory one.
fn streamed_sweep(c: &mut Criterion) {
    let mut g = c.benchmark_group("streamed_vs_in_memory_2x200");
    g.sample_size(10);
    for n in [1_000, 4_000, 10_000] {
        let w = workloads::workload(n, 200);
        for (name, structure) in [("kfac", Structure::Kfac), ("diag", Structure::Diag)] {
            g.bench_with_input(BenchmarkId::new(format!("{name}_in_memory"), n), &n, |b, _| {
                b.iter(|| {
                    fit(
                        w.net.clone(),
                        w.likelihood,
                        &Data::new(&w.x, &w.y).unwrap(),
                        &config(structure.clone()),
                    )
                    .unwrap()
                })
            });
            g.bench_with_input(BenchmarkId::new(format!("{name}_batches_of_128"), n), &n, |b, _| {
                b.iter(|| {
                    let batches = (0..n).step_by(128).map(|s| {
                        let l = 128.min(n - s);
                        (w.x.rows(s, l).into_owned(), w.y.rows(s, l).into_owned())
                    });
                    fit_batches(w.net.clone(), w.likelihood, batches, &config(structure.clone())).unwrap()
                })
            });
        }
    }
    g.finish();
}

/// Sampled LLA (one EM step: two preconditioned solves plus the rank-100 Lanczos
/// preconditioner) against the number of draws: the products' GEMMs are `K` columns wide.
fn sampled_sweep(c: &mut Criterion) {
    let mut g = c.benchmark_group("sampled_fit_vs_draws_2x200_n1000");
    g.sample_size(10);
    let w = workloads::workload(1_000, 200);
    for k in [4, 16, 64] {
        let s = Structure::Sampled(SampledConfig { samples: k, em_steps: 1, ..Default::default() });
        g.bench_with_input(BenchmarkId::from_parameter(k), &k, |b, _| {
            b.iter(|| {
                fit(w.net.clone(), w.likelihood, &Data::new(&w.x, &w.y).unwrap(), &config(s.clone()))
                    .unwrap()
                    .posterior
            })
        });
    }
    g.finish();
}

/// `n` deterministic 28 × 28 "images" (pixels in [−0.3, 0.7]) with labels `0..10`, shifted by
/// `shift` rows.
fn synthetic_images(n: usize, shift: usize) -> (DMatrix<f64>, DMatrix<f64>) {
    let x = DMatrix::from_fn(n, 784, |i, j| (((i + shift) * 31 + j * 7) % 255) as f64 / 255.0 - 0.3);
    let y = DMatrix::from_fn(n, 1, |i, _| ((i + shift) % 10) as f64);
    (x, y)
}

/// KFAC's λ grid search (5 candidates, categorical, the FSP MNIST CNN fitted on 200 synthetic
/// images) against the number of validation images, beside one candidate's validation NLL: the
/// candidates share the forward pass and the layer statistics, so the search costs about one
/// candidate plus five cheap contractions.
fn kfac_gridsearch_cnn(c: &mut Criterion) {
    let (x, y) = synthetic_images(200, 0);
    let net = Cnn::new(CnnConfig::fsp_mnist(10, Activation::Tanh, 0)).unwrap();
    let lik = LikelihoodSpec::categorical(10);
    let post = fit(net, lik, &Data::new(&x, &y).unwrap(), &config(Structure::Kfac)).unwrap().posterior;
    let grid = [1.0, 10.0, 100.0, 1e3, 1e4];
    let mut g = c.benchmark_group("kfac_gridsearch_fsp_cnn");
    g.sample_size(10);
    for n in [50, 200] {
        let (xv, yv) = synthetic_images(n, 7);
        let yv = DVector::from_column_slice(yv.as_slice());
        g.bench_with_input(BenchmarkId::new("one_candidate", n), &n, |b, _| {
            b.iter(|| post.predictive_nll(&xv, &yv).unwrap())
        });
        g.bench_with_input(BenchmarkId::new("grid_of_5", n), &n, |b, _| {
            b.iter(|| post.clone().gridsearch_prior_precision(&grid, &xv, &yv).unwrap())
        });
    }
    g.finish();
}

/// The last-layer GLM predictive of VaLLA Fig. 3's MLP (784-200-200-10, categorical, all
/// 2 010 last-layer eigenvectors) against the number of test images: one GEMM per output, then
/// 55 per-point dot products over the eigenvectors.
fn last_layer_predict_mnist_mlp(c: &mut Criterion) {
    let (x, y) = synthetic_images(500, 0);
    let net = Mlp::new(MlpConfig::mnist(10, Activation::Tanh, 0)).unwrap();
    let lik = LikelihoodSpec::categorical(10);
    let post =
        fit(net, lik, &Data::new(&x, &y).unwrap(), &config(Structure::last_layer())).unwrap().posterior;
    test_image_sweep(c, "last_layer_predict_mnist_mlp", |xt| post.glm_covariances(xt).unwrap());
    // laplace-torch's default, KFAC over the last layer: the GLM mean and covariances from one
    // pass that gives the logits and the head's inputs together (`glm_mean_and_covariances`).
    let kfac_config =
        LaplaceConfig { weights: fspace_laplace::Weights::LastLayer, ..config(Structure::Kfac) };
    let net = Mlp::new(MlpConfig::mnist(10, Activation::Tanh, 0)).unwrap();
    let post = fit(net, lik, &Data::new(&x, &y).unwrap(), &kfac_config).unwrap().posterior;
    test_image_sweep(c, "last_layer_kfac_predict_mnist_mlp", |xt| post.glm_mean_and_covariances(xt).unwrap());
}

/// A predictive timed at 500 and 2 000 synthetic test images.
fn test_image_sweep<R>(c: &mut Criterion, group: &str, predict: impl Fn(&DMatrix<f64>) -> R) {
    let mut g = c.benchmark_group(group);
    g.sample_size(10);
    for n in [500, 2_000] {
        let (xt, _) = synthetic_images(n, 3);
        g.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, _| b.iter(|| predict(&xt)));
    }
    g.finish();
}

criterion_group!(
    benches,
    w1,
    w2,
    kfac_sweep,
    streamed_sweep,
    sampled_sweep,
    kfac_gridsearch_cnn,
    last_layer_predict_mnist_mlp
);
criterion_main!(benches);
