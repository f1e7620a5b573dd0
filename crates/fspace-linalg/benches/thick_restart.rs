//! Thick-restart Lanczos for the top 20 eigenpairs of a Gauss–Newton-like operator
//! `A = G S Gᵀ` (`G`: `n × 100` Gaussian / √n, `S` geometric from 1 to 1e-6, so `A`'s spectrum
//! spans six decades like a network's GGN), for n = 10⁴ … 2·10⁵ and a basis of 30, 40 and 60
//! vectors (memory `n × basis` doubles). Each product costs `O(100·n)`; the reorthogonalisation
//! `O(basis·n)` per step, and a restart `O(basis²·n)`. A smaller basis costs more products.
#![allow(missing_docs)] // criterion_group! generates an undocumented pub fn

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use fspace_linalg::{thick_restart_lanczos, FnOperator, ThickRestartConfig};
use nalgebra::{DMatrix, DVector};
use rand::{rngs::StdRng, SeedableRng};
use rand_distr::{Distribution, StandardNormal};

const RANK: usize = 100;

fn ggn_like(n: usize) -> (DMatrix<f64>, DVector<f64>) {
    let mut rng = StdRng::seed_from_u64(3);
    let scale = 1.0 / (n as f64).sqrt();
    let g = DMatrix::from_fn(n, RANK, |_, _| {
        let z: f64 = StandardNormal.sample(&mut rng);
        scale * z
    });
    let s = DVector::from_fn(RANK, |i, _| 1e-6f64.powf(i as f64 / (RANK - 1) as f64));
    (g, s)
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("thick_restart_top20");
    group.sample_size(10);
    for n in [10_000usize, 50_000, 200_000] {
        let (g, s) = ggn_like(n);
        let op = FnOperator::new(n, |v: &DVector<f64>| &g * g.tr_mul(v).component_mul(&s));
        for basis in [30usize, 40, 60] {
            let cfg = ThickRestartConfig { k: 20, max_basis: basis, ..Default::default() };
            group.bench_with_input(BenchmarkId::new(format!("basis{basis}"), n), &n, |b, _| {
                b.iter(|| thick_restart_lanczos(&op, &cfg).unwrap())
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
