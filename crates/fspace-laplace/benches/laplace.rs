//! Criterion benchmarks of the Laplace structures on the workloads (W1 = sine toy,
//! 2×50, p = 2 701; W2 = 10 000 points, 2×200, p = 40 801), a sweep over the number of
//! data points for KFAC and one over the number of draws for the sampled posterior.
//! `cargo bench -p fspace-laplace`; peak memory per case:
//! `cargo run --release -p fspace-laplace --example laplace_workloads`.
#![allow(missing_docs)] // criterion_group! generates an undocumented pub fn

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use fspace_core::Data;
use fspace_laplace::{fit, LaplaceConfig, MarglikConfig, SampledConfig, Structure};

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

criterion_group!(benches, w1, w2, kfac_sweep, sampled_sweep);
criterion_main!(benches);
