//! One GFSVI step (objective + exact gradient, as `fit` runs it, measurement points redrawn)
//! against the number of measurement points `M` and the network width (2×30 … 2×400, batch
//! 100 on the 1-D sine toy), beside one MAP step (forward + `Jᵀ·v` on the same batch), and one
//! TFSVI, FVI and MFVI step at the toy size; FVI steps of FSP-Laplace Table 2's CNN (batch 100,
//! 50 uniform measurement points, 5 weight samples: `fsp-mnist`'s setting).
#![allow(missing_docs)] // criterion_group! generates an undocumented pub fn

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use fspace_core::{Data, LikelihoodSpec};
use fspace_gfsvi::{fvi, mfvi, objective, FviConfig, KlPrior, MfviConfig, OptimConfig, VariationalParams};
use fspace_kernels::GpPrior;
use fspace_kernels::{Independent, Rbf};
use fspace_nn::{Activation, Cnn, CnnConfig, Mlp, MlpConfig};
use nalgebra::{DMatrix, DVector};

fn net(width: usize) -> Mlp {
    Mlp::new(MlpConfig {
        input_dim: 1,
        hidden: vec![width, width],
        output_dim: 1,
        activation: Activation::Tanh,
        seed: 0,
    })
    .unwrap()
}

fn toy(n: usize) -> (DMatrix<f64>, DMatrix<f64>) {
    let x = DMatrix::from_fn(n, 1, |i, _| {
        let u = 0.5 + 0.5 * ((i as f64 * 0.618).fract());
        if i % 2 == 0 {
            u
        } else {
            -u
        }
    });
    let y = x.map(|v| (std::f64::consts::TAU * v).sin());
    (x, y)
}

fn points(m: usize) -> DMatrix<f64> {
    DMatrix::from_fn(m, 1, |i, _| -1.0 + 2.0 * ((i as f64 * 0.754_877_666).fract()))
}

fn params(net: &Mlp) -> VariationalParams {
    let p = net.params().len();
    VariationalParams { mean: net.params(), log_std: DVector::from_element(p, -3.0), log_noise_std: -2.0 }
}

fn bench_steps(c: &mut Criterion) {
    let mut group = c.benchmark_group("gfsvi_step");
    group.sample_size(10);
    let (x, y) = toy(100);
    let prior = KlPrior::Gp(GpPrior::centered(Rbf::new(1.0, 0.3).unwrap()));
    let sweep: [(usize, &[usize]); 4] =
        [(30, &[10, 100, 250, 500]), (100, &[100, 500]), (200, &[100]), (400, &[100])];
    for (width, ms) in sweep {
        let mut n = net(width);
        let pr = params(&n);
        group.bench_with_input(BenchmarkId::new("map_step", format!("2x{width}")), &width, |b, _| {
            b.iter(|| {
                let f = n.forward(&x).unwrap();
                n.vjp(&x, &(&y - f)).unwrap()
            })
        });
        for &m in ms {
            let xm = points(m);
            group.bench_with_input(BenchmarkId::new(format!("gfsvi_2x{width}"), m), &m, |b, _| {
                b.iter(|| objective(&mut n, &pr, &prior, &x, &y, 100, &xm, 1e-10).unwrap())
            });
        }
    }
    let mut n = net(30);
    let pr = params(&n);
    let xm = points(500);
    let tfsvi = KlPrior::WeightPushforward { sigma_p: 0.2 };
    group.bench_function("tfsvi_2x30/500", |b| {
        b.iter(|| objective(&mut n, &pr, &tfsvi, &x, &y, 100, &xm, 1e-10).unwrap())
    });
    // FVI and MFVI: 20 steps of `fit` (measured per fit; divide by 20 for one step).
    let one =
        OptimConfig { schedule: fspace_core::Schedule::steps(20), batch_size: 100, ..Default::default() };
    let gp = GpPrior::centered(Rbf::new(1.0, 0.3).unwrap());
    let fcfg = FviConfig { optim: one.clone(), predictive_samples: 1, ..Default::default() };
    group.bench_function("fvi_2x30_20_steps", |b| {
        b.iter(|| {
            fvi::fit(
                n.clone(),
                LikelihoodSpec::gaussian_learned(1.0),
                &gp,
                &Data::new(&x, &y).unwrap(),
                &fcfg,
            )
            .unwrap()
        })
    });
    let mcfg = MfviConfig { optim: one, predictive_samples: 1, ..Default::default() };
    group.bench_function("mfvi_2x30_20_steps", |b| {
        b.iter(|| {
            mfvi::fit(n.clone(), LikelihoodSpec::gaussian_learned(1.0), &Data::new(&x, &y).unwrap(), &mcfg)
                .unwrap()
        })
    });
    group.finish();
}

fn bench_fvi_cnn(c: &mut Criterion) {
    let mut group = c.benchmark_group("fvi_cnn");
    group.sample_size(10);
    let n = 200;
    let x = DMatrix::from_fn(n, 784, |i, j| (((i * 37 + j * 11) % 23) as f64 / 23.0 - 0.5) * 2.0);
    let y = DMatrix::from_fn(n, 1, |i, _| (i % 10) as f64);
    let prior = GpPrior::centered(Independent::new(Rbf::new(5.0, 23.0).unwrap(), 10).unwrap());
    let cnn = Cnn::new(CnnConfig::fsp_mnist(10, Activation::Tanh, 0)).unwrap();
    for samples in [2, 5] {
        let config = FviConfig {
            samples,
            predictive_samples: 1,
            optim: OptimConfig {
                schedule: fspace_core::Schedule::steps(2),
                batch_size: 100,
                ..Default::default()
            },
            ..Default::default()
        };
        let data = Data::new(&x, &y).unwrap();
        group.bench_with_input(BenchmarkId::new("two_steps_samples", samples), &samples, |b, _| {
            b.iter(|| fvi::fit(cnn.clone(), LikelihoodSpec::categorical(10), &prior, &data, &config).unwrap())
        });
    }
    group.finish();
}

criterion_group!(benches, bench_steps, bench_fvi_cnn);
criterion_main!(benches);
