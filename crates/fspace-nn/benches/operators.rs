//! Forward, J·u, Jᵀ·V, GGN-vector and NTK-block times of 2×50 and 2×200 tanh MLPs (1 → 1)
//! against the batch size; the target is a JVP or VJP at most ~3 forward passes.
#![allow(missing_docs)] // criterion_group! generates an undocumented pub fn

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use fspace_nn::{Activation, Mlp, MlpConfig};
use nalgebra::{DMatrix, DVector};

fn bench(c: &mut Criterion) {
    for width in [50usize, 200] {
        let net = Mlp::new(MlpConfig {
            input_dim: 1,
            hidden: vec![width, width],
            output_dim: 1,
            activation: Activation::Tanh,
            seed: 0,
        })
        .unwrap();
        let u = DVector::from_fn(net.n_params(), |i, _| ((i as f64) * 0.37).sin());
        let mut group = c.benchmark_group(format!("mlp2x{width}"));
        group.sample_size(10);
        for n in [100usize, 1000, 10_000] {
            let x = DMatrix::from_fn(n, 1, |i, _| -2.0 + 4.0 * i as f64 / n as f64);
            let v = DMatrix::from_element(n, 1, 1.0);
            let h = vec![DMatrix::identity(1, 1); n];
            group.bench_with_input(BenchmarkId::new("forward", n), &n, |b, _| {
                b.iter(|| net.forward(&x).unwrap())
            });
            group
                .bench_with_input(BenchmarkId::new("jvp", n), &n, |b, _| b.iter(|| net.jvp(&x, &u).unwrap()));
            group
                .bench_with_input(BenchmarkId::new("vjp", n), &n, |b, _| b.iter(|| net.vjp(&x, &v).unwrap()));
            group.bench_with_input(BenchmarkId::new("ggn_vector", n), &n, |b, _| {
                b.iter(|| net.ggn_vector(&x, &h, &u).unwrap())
            });
            if n <= 1000 {
                let z = DMatrix::from_fn(100, 1, |i, _| -2.0 + 0.04 * i as f64);
                group.bench_with_input(BenchmarkId::new("ntk_block_x100", n), &n, |b, _| {
                    b.iter(|| net.ntk(&x, &z).unwrap())
                });
            }
        }
        group.finish();
    }
}

/// The MNIST networks of the network-speed table (MLP 784-200-200-10, LeNet-5, FSP-Laplace's CNN) on batches
/// of 28×28 images: `f`, `J·u`, `Jᵀ·V` and the fused training pass `forward_vjp`.
fn bench_cnn(c: &mut Criterion) {
    use fspace_nn::{Cnn, CnnConfig, Network};
    let mlp = Mlp::new(MlpConfig::mnist(10, Activation::Tanh, 0)).unwrap();
    let lenet = Cnn::new(CnnConfig::lenet5(10, Activation::Tanh, 0)).unwrap();
    let cnn = Cnn::new(CnnConfig::fsp_mnist(10, Activation::Tanh, 0)).unwrap();
    let nets: [(&str, &dyn Network); 3] =
        [("mlp_784_200_200_10", &mlp), ("lenet5", &lenet), ("cnn_fsp_mnist", &cnn)];
    for (name, net) in nets {
        bench_image_net(c, name, net);
    }
}

fn bench_image_net(c: &mut Criterion, name: &str, net: &dyn fspace_nn::Network) {
    let mut group = c.benchmark_group(name);
    group.sample_size(10);
    for n in [10usize, 100, 1000] {
        let x = nalgebra::DMatrix::from_fn(n, 784, |i, j| ((i * 31 + j * 7) % 17) as f64 / 17.0);
        let u = nalgebra::DVector::from_fn(net.n_params(), |i, _| ((i % 13) as f64 - 6.0) * 1e-2);
        let v = nalgebra::DMatrix::from_element(n, 10, 0.1);
        group
            .bench_with_input(BenchmarkId::new("forward", n), &n, |b, _| b.iter(|| net.forward(&x).unwrap()));
        group.bench_with_input(BenchmarkId::new("jvp", n), &n, |b, _| b.iter(|| net.jvp(&x, &u).unwrap()));
        group.bench_with_input(BenchmarkId::new("vjp", n), &n, |b, _| b.iter(|| net.vjp(&x, &v).unwrap()));
        group.bench_with_input(BenchmarkId::new("forward_vjp", n), &n, |b, _| {
            b.iter(|| net.forward_vjp(&x, &mut |_| Ok(v.clone())).unwrap())
        });
    }
    group.finish();
}

/// KFAC statistics (per-layer inputs and back-propagated output gradients for 10 cotangent
/// columns per image, the categorical GGN's factor) of the two CNNs against the batch size.
fn bench_kfac_statistics(c: &mut Criterion) {
    use fspace_nn::{Cnn, CnnConfig};
    let nets = [
        ("lenet5", Cnn::new(CnnConfig::lenet5(10, Activation::Tanh, 0)).unwrap()),
        ("cnn_fsp_mnist", Cnn::new(CnnConfig::fsp_mnist(10, Activation::Tanh, 0)).unwrap()),
    ];
    let mut group = c.benchmark_group("kfac_statistics_k10");
    group.sample_size(10);
    for (name, net) in &nets {
        for n in [10usize, 100, 500] {
            let x = DMatrix::from_fn(n, 784, |i, j| ((i * 31 + j * 7) % 17) as f64 / 17.0);
            let factors: Vec<DMatrix<f64>> =
                (0..n).map(|i| DMatrix::from_fn(10, 10, |o, c| ((i + o + 3 * c) % 5) as f64 * 0.1)).collect();
            group.bench_with_input(BenchmarkId::new(*name, n), &n, |b, _| {
                b.iter(|| net.kfac_statistics(&x, &factors).unwrap())
            });
        }
    }
    group.finish();
}

/// `J·U` and `Jᵀ·L` for 20 columns on the FSP CNN (FSP-Laplace's Alg. 2 applies `J` to up
/// to 150 columns): one product per column, in parallel (the trait's default), against the
/// CNN's shared forward trace.
fn bench_multi_column(c: &mut Criterion) {
    use fspace_nn::{Cnn, CnnConfig};
    use rayon::prelude::*;
    let net = Cnn::new(CnnConfig::fsp_mnist(10, Activation::Tanh, 0)).unwrap();
    let (p, r) = (net.n_params(), 20);
    let u = DMatrix::from_fn(p, r, |i, j| (((i + 3 * j) % 13) as f64 - 6.0) * 1e-2);
    let mut group = c.benchmark_group("cnn_fsp_mnist_20_columns");
    group.sample_size(10);
    for n in [128usize, 512] {
        let x = DMatrix::from_fn(n, 784, |i, j| ((i * 31 + j * 7) % 17) as f64 / 17.0);
        let l = DMatrix::from_fn(n * 10, r, |i, j| ((i + j) % 7) as f64 * 0.1);
        group.bench_with_input(BenchmarkId::new("jvp_per_column", n), &n, |b, _| {
            b.iter(|| {
                (0..r)
                    .into_par_iter()
                    .map(|j| net.jvp(&x, &u.column(j).into_owned()).unwrap())
                    .collect::<Vec<_>>()
            })
        });
        group.bench_with_input(BenchmarkId::new("jvp_columns", n), &n, |b, _| {
            b.iter(|| net.jvp_columns(&x, &u).unwrap())
        });
        group.bench_with_input(BenchmarkId::new("vjp_per_column", n), &n, |b, _| {
            b.iter(|| {
                (0..r)
                    .into_par_iter()
                    .map(|j| net.vjp(&x, &DMatrix::from_row_slice(n, 10, l.column(j).as_slice())).unwrap())
                    .collect::<Vec<_>>()
            })
        });
        group.bench_with_input(BenchmarkId::new("vjp_columns", n), &n, |b, _| {
            b.iter(|| net.vjp_columns(&x, &l).unwrap())
        });
    }
    group.finish();
}

/// `J·U` of the ocean experiment's Helmholtz net (two 2×100 tanh potentials, p ≈ 21 000) for
/// 20 columns against the number of points: one Jacobian per chunk of points for all columns
/// (`jvp_columns`) against one `jvp` per column (each builds the Jacobian).
fn bench_helmholtz_columns(c: &mut Criterion) {
    use fspace_nn::{HelmholtzNet, Network};
    let net = HelmholtzNet::new(vec![100, 100], Activation::Tanh, 0).unwrap();
    let (p, r) = (net.n_params(), 20);
    let u = DMatrix::from_fn(p, r, |i, j| (((i + 3 * j) % 13) as f64 - 6.0) * 1e-2);
    let mut group = c.benchmark_group("helmholtz_2x100_20_columns");
    group.sample_size(10);
    for n in [16usize, 64, 256] {
        let x = DMatrix::from_fn(n, 2, |i, j| ((i * 7 + j * 3) % 11) as f64 / 5.5 - 1.0);
        if n <= 64 {
            group.bench_with_input(BenchmarkId::new("jvp_per_column", n), &n, |b, _| {
                b.iter(|| (0..r).map(|j| net.jvp(&x, &u.column(j).into_owned()).unwrap()).collect::<Vec<_>>())
            });
        }
        group.bench_with_input(BenchmarkId::new("jvp_columns", n), &n, |b, _| {
            b.iter(|| Network::jvp_columns(&net, &x, &u).unwrap())
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().measurement_time(std::time::Duration::from_secs(3)).warm_up_time(std::time::Duration::from_secs(1));
    targets = bench, bench_cnn, bench_kfac_statistics, bench_multi_column, bench_helmholtz_columns
}
criterion_main!(benches);
