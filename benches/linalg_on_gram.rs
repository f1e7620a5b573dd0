//! Lanczos-LDLᵀ pseudo-inverse factors (rank 100 and 500) on the matrix-free RBF Gram operator
//! (d = 8) against n, next to a dense symmetric eigendecomposition; PCG on `K + σ²I`.
//! Larger n (to 16k) and peak memory: `cargo run --release --example lanczos_scaling`.
#![allow(missing_docs)] // criterion_group! generates an undocumented pub fn

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use fspace::kernels::{gram, GramOperator, Rbf};
use fspace::linalg::{cg, pinv_factor, sym_eigh, CgConfig, LanczosConfig, PivotedCholeskyPreconditioner};
use nalgebra::{DMatrix, DVector};
use rand::{rngs::StdRng, Rng, SeedableRng};

fn points(n: usize) -> DMatrix<f64> {
    let mut rng = StdRng::seed_from_u64(0);
    DMatrix::from_fn(n, 8, |_, _| rng.gen_range(-1.0..1.0))
}

fn bench(c: &mut Criterion) {
    let kernel = Rbf::ard(1.0, vec![0.7; 8]).unwrap();
    for r in [100usize, 500] {
        let mut group = c.benchmark_group(format!("lanczos_pinv_rank{r}_rbf_d8"));
        group.sample_size(10);
        let sizes: &[usize] = if r == 100 { &[1000, 2000, 4000] } else { &[1000, 2000] };
        for &n in sizes {
            let op = GramOperator::new(kernel.clone(), &points(n)).unwrap();
            let cfg = LanczosConfig { max_rank: r, pivot_tol: 0.0, ..Default::default() };
            group.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, _| {
                b.iter(|| pinv_factor(&op, &cfg).unwrap())
            });
        }
        group.finish();
    }
    let mut group = c.benchmark_group("dense_gram_eigh_rbf_d8");
    group.sample_size(10);
    for n in [1000usize, 2000] {
        let x = points(n);
        group.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, _| {
            b.iter(|| sym_eigh(&gram(&kernel, &x, &x).unwrap()).unwrap())
        });
    }
    group.finish();
    let mut group = c.benchmark_group("pcg_gram_rbf_d8_sigma2_1e-2");
    group.sample_size(10);
    for n in [1000usize, 2000, 4000] {
        let x = points(n);
        let op = GramOperator::new(kernel.clone(), &x).unwrap().with_shift(1e-2).unwrap();
        let entries = GramOperator::new(kernel.clone(), &x).unwrap();
        let y = DVector::from_fn(n, |i, _| (i as f64 * 0.1).sin());
        let cfg = CgConfig { tol: 1e-8, max_iter: Some(5000) };
        group.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, _| {
            b.iter(|| {
                let pc = PivotedCholeskyPreconditioner::new(&entries, 1e-2, 50).unwrap();
                cg(&op, &y, Some(&pc), &cfg).unwrap()
            })
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
