//! One VaLLA iteration (objective + exact gradient incl. `Z`, as `fit` runs it) and an ELLA fit,
//! against the number of inducing / Nyström points and the network size: the sine toy's
//! 1-50-50-1 tanh MLP and the MNIST 784-200-200-10 tanh MLP (batch 100).
#![allow(missing_docs)] // criterion_group! generates an undocumented pub fn

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use fspace_core::{Data, LikelihoodSpec};
use fspace_nn::{Activation, Mlp, MlpConfig};
use fspace_valla::internals::iteration;
use fspace_valla::{ella, EllaConfig, EllaPrior, FeatureRoute, VariationalState};
use nalgebra::DMatrix;

fn net(d: usize, width: usize, q: usize) -> Mlp {
    Mlp::new(MlpConfig {
        input_dim: d,
        hidden: vec![width, width],
        output_dim: q,
        activation: Activation::Tanh,
        seed: 0,
    })
    .unwrap()
}

fn inputs(n: usize, d: usize, phase: f64) -> DMatrix<f64> {
    DMatrix::from_fn(n, d, |i, j| ((i * d + j) as f64 * 0.618 + phase).sin())
}

fn state(z: DMatrix<f64>, q: usize) -> VariationalState {
    let m = z.nrows();
    let mut l = DMatrix::identity(m, m);
    for r in 1..m {
        l[(r, r - 1)] = 0.1;
    }
    VariationalState {
        outputs: (0..m).map(|i| i % q).collect(),
        z,
        log_prior_var: 0.0,
        log_noise_var: -2.0,
        l,
    }
}

fn bench_iteration(c: &mut Criterion) {
    let mut group = c.benchmark_group("valla_iteration");
    group.sample_size(20);
    let cases: [(&str, usize, usize, usize, &[usize]); 2] = [
        ("toy_1x50x50x1", 1, 50, 1, &[20, 50, 100, 200]),
        ("mnist_784x200x200x10", 784, 200, 10, &[50, 100, 200]),
    ];
    for (name, d, width, q, ms) in cases {
        let net = net(d, width, q);
        let lik = if q == 1 { LikelihoodSpec::gaussian_learned(0.1) } else { LikelihoodSpec::categorical(q) };
        let x = inputs(100, d, 0.0);
        let y: Vec<f64> =
            (0..100).map(|i| if q == 1 { (i as f64 * 0.1).sin() } else { (i % q) as f64 }).collect();
        let g = net.forward(&x).unwrap();
        let kxx = net.ntk_diagonal(&x).unwrap();
        for &m in ms {
            let s = state(inputs(m, d, 0.3), q);
            group.bench_with_input(BenchmarkId::new(name, m), &m, |b, _| {
                b.iter(|| iteration(&net, &s, lik, &x, &g, &kxx, &y, 10_000).unwrap())
            });
        }
    }
    group.finish();
}

/// `(name, d, width, outputs, n, Nyström sizes)`.
type EllaCase = (&'static str, usize, usize, usize, usize, &'static [usize]);

fn bench_ella(c: &mut Criterion) {
    let mut group = c.benchmark_group("ella_fit");
    group.sample_size(10);
    let cases: [EllaCase; 2] = [
        ("toy_1x50x50x1_n400", 1, 50, 1, 400, &[20, 50, 100, 400]),
        ("mnist_784x200x200x10_n2000", 784, 200, 10, 2000, &[100, 500, 2000]),
    ];
    for (name, d, width, q, n, ms) in cases {
        let net = net(d, width, q);
        let lik = if q == 1 { LikelihoodSpec::gaussian(0.1) } else { LikelihoodSpec::categorical(q) };
        let x = inputs(n, d, 0.0);
        let ym = DMatrix::from_fn(n, 1, |i, _| if q == 1 { (i as f64 * 0.1).sin() } else { (i % q) as f64 });
        for &m in ms {
            let config = EllaConfig {
                num_points: m,
                num_eigen: 20.min(m),
                prior: EllaPrior::Fixed(1.0),
                seed: 0,
                route: FeatureRoute::Auto,
                early_stopping: None,
            };
            group.bench_with_input(BenchmarkId::new(name, m), &m, |b, _| {
                b.iter(|| ella::fit(net.clone(), lik, &Data::new(&x, &ym).unwrap(), &config).unwrap())
            });
        }
    }
    group.finish();
}

criterion_group!(benches, bench_iteration, bench_ella);
criterion_main!(benches);
