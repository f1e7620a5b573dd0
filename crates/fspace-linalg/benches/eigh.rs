//! Symmetric eigendecomposition, `sym_eigh` (faer's blocked solver) beside nalgebra's
//! `symmetric_eigen`, for n = 128 … 3138 (3138: the KFAC input factor of the MNIST CNN's dense
//! layer; full-GGN Laplace of the 2×50 regression networks is n ≈ 2 800).
#![allow(missing_docs)] // criterion_group! generates an undocumented pub fn

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use fspace_linalg::sym_eigh;
use nalgebra::DMatrix;
use rand::{rngs::StdRng, SeedableRng};
use rand_distr::{Distribution, StandardNormal};

/// A Gram matrix `XᵀX / m` of a seeded Gaussian `m × n` (m = n + 100), like a KFAC factor.
fn gram(n: usize) -> DMatrix<f64> {
    let mut rng = StdRng::seed_from_u64(7);
    let x = DMatrix::from_fn(n + 100, n, |_, _| StandardNormal.sample(&mut rng));
    x.transpose() * &x / (n + 100) as f64
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("sym_eigh");
    group.sample_size(10);
    for n in [128usize, 512, 1024, 2048, 3138] {
        let a = gram(n);
        group.bench_with_input(BenchmarkId::new("faer", n), &n, |b, _| b.iter(|| sym_eigh(&a).unwrap()));
        if n <= 1024 {
            group.bench_with_input(BenchmarkId::new("nalgebra", n), &n, |b, _| {
                b.iter(|| a.clone().symmetric_eigen())
            });
        }
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default();
    targets = bench
}
criterion_main!(benches);
