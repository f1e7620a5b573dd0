//! `AᵀA` of one statistics chunk, on one thread (the Laplace fits sum chunks in parallel):
//! nalgebra's `Aᵀ·A` beside faer's lower-triangle GEMM ([`fast::gram_serial`]), over the
//! shapes KFAC meets — a 2×200 MLP's chunk of 256 points (256 × 201), and the ResNet-18's
//! convolution patches for a 12-point chunk, stage by stage (`12·T × (9·c_in + 1)`:
//! 12 288 × 577 … 192 × 4 609).
#![allow(missing_docs)] // criterion_group! generates an undocumented pub fn

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use fspace_linalg::fast;
use nalgebra::DMatrix;
use rand::{rngs::StdRng, SeedableRng};
use rand_distr::{Distribution, StandardNormal};

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("chunk_gram_serial");
    group.sample_size(10);
    let shapes = [
        (256usize, 3usize),
        (256, 201),
        (2_560, 201),
        (12_288, 577),
        (3_072, 1_153),
        (768, 2_305),
        (192, 4_609),
    ];
    for (rows, cols) in shapes {
        let mut rng = StdRng::seed_from_u64(3);
        let a = DMatrix::from_fn(rows, cols, |_, _| StandardNormal.sample(&mut rng));
        let id = format!("{rows}x{cols}");
        group.bench_with_input(BenchmarkId::new("nalgebra", &id), &id, |b, _| b.iter(|| a.transpose() * &a));
        group.bench_with_input(BenchmarkId::new("faer gram_serial", &id), &id, |b, _| {
            b.iter(|| fast::gram_serial(&a))
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
