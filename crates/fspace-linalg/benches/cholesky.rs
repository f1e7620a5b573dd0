//! Blocked (parallel) Cholesky and `K⁻¹` against nalgebra's column-wise versions and faer's
//! `llt` / `Llt::solve` (both threads), for n = 500 … 4000 (the exact-GP and LML-gradient hot
//! path). The faer rows include the copy into and out of faer's matrix types that using it
//! would cost. Then `A⁻¹` with `log|A|` at n = 100 … 1000, the KL's piece of a GFSVI step.
#![allow(missing_docs)] // criterion_group! generates an undocumented pub fn

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use faer::linalg::solvers::Solve;
use fspace_linalg::{cholesky_jitter, JitterConfig};
use nalgebra::DMatrix;

fn spd(n: usize) -> DMatrix<f64> {
    DMatrix::from_fn(n, n, |i, j| {
        (-((i as f64 - j as f64) / 50.0).powi(2)).exp() + if i == j { 1.0 } else { 0.0 }
    })
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("cholesky");
    group.sample_size(10);
    for n in [500usize, 1000, 2000, 4000] {
        let a = spd(n);
        group.bench_with_input(BenchmarkId::new("blocked", n), &n, |b, _| {
            b.iter(|| cholesky_jitter(&a, &JitterConfig::default()).unwrap())
        });
        if n <= 2000 {
            group.bench_with_input(BenchmarkId::new("nalgebra", n), &n, |b, _| {
                b.iter(|| a.clone().cholesky().unwrap())
            });
        }
        group.bench_with_input(BenchmarkId::new("faer", n), &n, |b, _| {
            b.iter(|| {
                let view = faer::MatRef::from_column_major_slice(a.as_slice(), n, n);
                let llt = view.llt(faer::Side::Lower).unwrap();
                let l = llt.L();
                DMatrix::from_fn(n, n, |i, j| l[(i, j)])
            })
        });
    }
    group.finish();
    let mut group = c.benchmark_group("inverse_via_cholesky");
    group.sample_size(10);
    for n in [500usize, 1000, 2000, 4000] {
        let a = spd(n);
        let chol = cholesky_jitter(&a, &JitterConfig::default()).unwrap();
        let eye = DMatrix::identity(n, n);
        group.bench_with_input(BenchmarkId::new("blocked", n), &n, |b, _| {
            b.iter(|| chol.solve(&eye).unwrap())
        });
        if n <= 1000 {
            let nchol = a.clone().cholesky().unwrap();
            group.bench_with_input(BenchmarkId::new("nalgebra", n), &n, |b, _| b.iter(|| nchol.solve(&eye)));
        }
        let view = faer::MatRef::from_column_major_slice(a.as_slice(), n, n);
        let llt = view.llt(faer::Side::Lower).unwrap();
        group.bench_with_input(BenchmarkId::new("faer", n), &n, |b, _| {
            b.iter(|| {
                let x = llt.solve(faer::Mat::<f64>::identity(n, n));
                DMatrix::from_fn(n, n, |i, j| x[(i, j)])
            })
        });
    }
    group.finish();
    // GFSVI's and TFSVI's KL inverts two such matrices per step (M = measurement points).
    let mut group = c.benchmark_group("spd_inverse_and_logdet");
    group.sample_size(10);
    for n in [100usize, 200, 500, 1000] {
        let a = spd(n);
        group.bench_with_input(BenchmarkId::new("blocked", n), &n, |b, _| {
            b.iter(|| fspace_linalg::blocked::spd_inverse_and_logdet(&a).unwrap())
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
