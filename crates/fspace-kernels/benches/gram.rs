//! Gram construction and matrix-free Gram products against n (d = 8, ARD RBF; and d = 784,
//! isotropic RBF, the image workloads), showing how the cost grows with n (both are O(n²·d));
//! memory of the matrix-free product stays O(n·d); and the product from kept tiles
//! (`with_tile_cache`, O(n²) memory).
#![allow(missing_docs)] // criterion_group! generates an undocumented pub fn

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use fspace_kernels::{gram, GramOperator, Matern32, Rbf};
use fspace_linalg::LinearOperator;
use nalgebra::{DMatrix, DVector};
use rand::{rngs::StdRng, Rng, SeedableRng};

const SIZES: [usize; 5] = [1_000, 2_000, 4_000, 8_000, 16_000];

fn points(n: usize) -> DMatrix<f64> {
    let mut rng = StdRng::seed_from_u64(0);
    DMatrix::from_fn(n, 8, |_, _| rng.gen_range(-1.0..1.0))
}

fn bench_gram(c: &mut Criterion) {
    let kernel = Rbf::ard(1.0, vec![0.7; 8]).unwrap();
    let mut group = c.benchmark_group("gram_dense_rbf_d8");
    group.sample_size(10);
    for n in SIZES {
        let x = points(n);
        group.throughput(Throughput::Elements((n * n) as u64));
        group.bench_with_input(BenchmarkId::from_parameter(n), &x, |b, x| {
            b.iter(|| gram(&kernel, x, x).unwrap())
        });
    }
    group.finish();

    let mut group = c.benchmark_group("gram_matvec_rbf_d8");
    group.sample_size(10);
    for n in SIZES {
        let op = GramOperator::new(kernel.clone(), &points(n)).unwrap();
        let v = DVector::from_element(n, 1.0);
        group.throughput(Throughput::Elements((n * n) as u64));
        group.bench_with_input(BenchmarkId::from_parameter(n), &v, |b, v| b.iter(|| op.matvec(v)));
    }
    group.finish();

    let mut group = c.benchmark_group("gram_matvec_matern32_d8");
    group.sample_size(10);
    let m32 = Matern32::ard(1.0, vec![0.7; 8]).unwrap();
    for n in [1_000, 4_000, 16_000] {
        let op = GramOperator::new(m32.clone(), &points(n)).unwrap();
        let v = DVector::from_element(n, 1.0);
        group.throughput(Throughput::Elements((n * n) as u64));
        group.bench_with_input(BenchmarkId::from_parameter(n), &v, |b, v| b.iter(|| op.matvec(v)));
    }
    group.finish();

    // The same products from kept tiles (`with_tile_cache`): a GEMV over the stored Gram, the
    // kernel evaluated once when the operator is built (not timed here).
    let mut group = c.benchmark_group("gram_matvec_matern32_d8_tile_cache");
    group.sample_size(10);
    for n in [1_000, 4_000] {
        let op = GramOperator::new(m32.clone(), &points(n)).unwrap().with_tile_cache(usize::MAX);
        let v = DVector::from_element(n, 1.0);
        group.throughput(Throughput::Elements((n * n) as u64));
        group.bench_with_input(BenchmarkId::from_parameter(n), &v, |b, v| b.iter(|| op.matvec(v)));
    }
    group.finish();

    // Images: an isotropic RBF on 784 pixels (the MNIST prior fit, the sparse GP's K_nm, the
    // FSP-Laplace context Gram). The squared distance dominates; it is summed in eight lanes.
    let mut group = c.benchmark_group("gram_dense_rbf_d784");
    group.sample_size(10);
    let iso = Rbf::new(1.0, 28.0).unwrap();
    for n in [250, 500, 1_000] {
        let mut rng = StdRng::seed_from_u64(1);
        let x = DMatrix::from_fn(n, 784, |_, _| rng.gen_range(-1.0..3.0));
        group.throughput(Throughput::Elements((n * n) as u64));
        group.bench_with_input(BenchmarkId::from_parameter(n), &x, |b, x| {
            b.iter(|| gram(&iso, x, x).unwrap())
        });
    }
    group.finish();

    // A block of 32 vectors costs far less than 32 products: the kernel tile is reused.
    let mut group = c.benchmark_group("gram_matmat32_rbf_d8");
    group.sample_size(10);
    for n in [1_000, 4_000] {
        let op = GramOperator::new(kernel.clone(), &points(n)).unwrap();
        let v = DMatrix::from_element(n, 32, 1.0);
        group.bench_with_input(BenchmarkId::from_parameter(n), &v, |b, v| b.iter(|| op.matmat(v)));
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default();
    targets = bench_gram
}
criterion_main!(benches);
