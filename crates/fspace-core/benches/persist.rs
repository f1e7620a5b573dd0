//! Loading a saved value: the whole `from_json` (envelope, matrix scan, typed parse, validation)
//! against the typed parse alone, for payloads of one `n × n` matrix (n = 100 … 1 000, i.e.
//! 10⁴ … 10⁶ numbers), so the load invariant's cost is visible as the payload grows.
#![allow(missing_docs)] // criterion_group! generates an undocumented pub fn

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use fspace_core::{LoadCheck, Persist, PersistError};
use nalgebra::DMatrix;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct Saved {
    m: DMatrix<f64>,
}

impl Persist for Saved {
    const KIND: &'static str = "bench::Saved";
    const VERSION: u32 = 1;
    fn validate_loaded(&self) -> Result<(), PersistError> {
        LoadCheck::new(Self::KIND).finite("m", self.m.iter())
    }
}

fn load(c: &mut Criterion) {
    let mut group = c.benchmark_group("persist_load_matrix");
    group.sample_size(10);
    for n in [100usize, 300, 1000] {
        let saved = Saved { m: DMatrix::from_fn(n, n, |i, j| ((i * 7 + j * 3) % 11) as f64 / 7.0) };
        let text = saved.to_json().unwrap();
        let payload = serde_json::to_string(&saved).unwrap();
        group.bench_with_input(BenchmarkId::new("from_json", n), &text, |b, t| {
            b.iter(|| Saved::from_json(t).unwrap())
        });
        group.bench_with_input(BenchmarkId::new("typed_parse_only", n), &payload, |b, t| {
            b.iter(|| serde_json::from_str::<Saved>(t).unwrap())
        });
    }
    group.finish();
}

criterion_group!(benches, load);
criterion_main!(benches);
