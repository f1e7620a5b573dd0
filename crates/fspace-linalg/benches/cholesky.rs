//! `cholesky_jitter` (faer's blocked parallel Cholesky) and `K⁻¹` by its solves against
//! nalgebra's column-wise versions, for n = 500 … 4000 (the exact-GP and LML-gradient hot path);
//! then `A⁻¹` with `log|A|` at n = 100 … 1000 (the KL's piece of a GFSVI step), and GFSVI's
//! `J S Jᵀ` and `Jᵀ C` at M = 500 for p = 1 000 … 11 600 weights, faer against nalgebra's
//! product.
#![allow(missing_docs)] // criterion_group! generates an undocumented pub fn

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
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
        group.bench_with_input(BenchmarkId::new("cholesky_jitter (faer)", n), &n, |b, _| {
            b.iter(|| cholesky_jitter(&a, &JitterConfig::default()).unwrap())
        });
        if n <= 2000 {
            group.bench_with_input(BenchmarkId::new("nalgebra", n), &n, |b, _| {
                b.iter(|| a.clone().cholesky().unwrap())
            });
        }
    }
    group.finish();
    let mut group = c.benchmark_group("inverse_via_cholesky");
    group.sample_size(10);
    for n in [500usize, 1000, 2000, 4000] {
        let a = spd(n);
        let chol = cholesky_jitter(&a, &JitterConfig::default()).unwrap();
        let eye = DMatrix::identity(n, n);
        group.bench_with_input(BenchmarkId::new("JitteredCholesky::solve (faer)", n), &n, |b, _| {
            b.iter(|| chol.solve(&eye).unwrap())
        });
        if n <= 1000 {
            let nchol = a.clone().cholesky().unwrap();
            group.bench_with_input(BenchmarkId::new("nalgebra", n), &n, |b, _| b.iter(|| nchol.solve(&eye)));
        }
    }
    group.finish();
    // GFSVI's and TFSVI's KL inverts two such matrices per step (M = measurement points).
    let mut group = c.benchmark_group("spd_inverse_and_logdet");
    group.sample_size(10);
    for n in [100usize, 200, 500, 1000] {
        let a = spd(n);
        group.bench_with_input(BenchmarkId::new("fast (faer)", n), &n, |b, _| {
            b.iter(|| fspace_linalg::fast::spd_inverse_and_logdet(&a).unwrap())
        });
        group.bench_with_input(BenchmarkId::new("nalgebra", n), &n, |b, _| {
            b.iter(|| {
                let c = a.clone().cholesky().unwrap();
                (c.inverse(), c.determinant().ln())
            })
        });
    }
    group.finish();
    // GFSVI's `J S Jᵀ` (AᵀA) and its pull-back `Jᵀ C` (A C) at M = 500 measurement points, against
    // the weight count p: nalgebra's product against faer.
    let mut group = c.benchmark_group("gfsvi_products_m500");
    group.sample_size(10);
    for p in [1_000usize, 3_300, 11_600] {
        let a = DMatrix::from_fn(p, 500, |i, j| ((i * 7 + j * 13) % 17) as f64 / 17.0 - 0.4);
        let cm = spd(500);
        group
            .bench_with_input(BenchmarkId::new("gram nalgebra", p), &p, |b, _| b.iter(|| a.transpose() * &a));
        group.bench_with_input(BenchmarkId::new("gram fast (faer)", p), &p, |b, _| {
            b.iter(|| fspace_linalg::fast::gram(&a))
        });
        group.bench_with_input(BenchmarkId::new("matmul nalgebra", p), &p, |b, _| b.iter(|| &a * &cm));
        group.bench_with_input(BenchmarkId::new("matmul fast (faer)", p), &p, |b, _| {
            b.iter(|| fspace_linalg::fast::matmul(&a, &cm))
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
