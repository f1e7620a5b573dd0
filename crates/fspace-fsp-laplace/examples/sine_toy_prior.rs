//! One FSP-Laplace fit on the sine toy under an RBF prior (the `perf` experiment's
//! `fsp_toy_prior_s`): 8 000 full-batch Adam steps of Alg. 1 with 100 uniform context points per
//! step, then Alg. 2 at 100 grid points. Prints Alg. 1's and Alg. 2's wall times; a target for
//! `perf record`. `--parts [name]` times the pieces of one step instead (Gram, Cholesky, network
//! passes, the RKHS regulariser), the fastest of 5 rounds.
//!
//! `cargo run --release -p fspace-fsp-laplace --example sine_toy_prior -- [epochs | --parts [name]]`
//!
//! xtask raises glibc's trim and mmap thresholds (`mallopt`); to time this binary under the
//! same allocator, run it with
//! `GLIBC_TUNABLES=glibc.malloc.mmap_threshold=1073741824:glibc.malloc.trim_threshold=2147483647`.

use fspace_context::BoundingBox;
use fspace_core::{Data, LikelihoodSpec};
use fspace_fsp_laplace::{fit, ContextDesign, FspConfig};
use fspace_kernels::{GpPrior, Rbf};
use fspace_nn::{Activation, Mlp, MlpConfig};
use rand::rngs::StdRng;
use rand::SeedableRng;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if std::env::args().nth(1).as_deref() == Some("--parts") {
        return parts(std::env::args().nth(2));
    }
    let epochs = std::env::args().nth(1).map_or(Ok(8000), |s| s.parse())?;
    let mut rng = StdRng::seed_from_u64(0);
    let data = fspace_data::sine(100, 0.1, &mut rng)?;
    let config = FspConfig {
        schedule: fspace_core::Schedule::epochs(epochs),
        batch_size: 100,
        n_context: 100,
        design: ContextDesign::Grid,
        context_box: Some(BoundingBox::cube(1, -2.0, 2.0)?),
        ..FspConfig::default()
    };
    let net = toy_net()?;
    let prior = GpPrior::centered(Rbf::new(1.0, 0.3)?);
    let t = std::time::Instant::now();
    let fitted = fit(net, LikelihoodSpec::gaussian(0.1), &prior, &Data::new(&data.x, &data.y)?, &config)?;
    println!(
        "total {:.3} s: Alg. 1 {:.3} s ({epochs} steps, {:.1} µs/step), Alg. 2 {:.3} s; last loss {:.6}",
        t.elapsed().as_secs_f64(),
        fitted.report.train_seconds,
        1e6 * fitted.report.train_seconds / epochs as f64,
        fitted.report.laplace_seconds,
        fitted.report.train.history.last().map_or(f64::NAN, |p| p.train_loss)
    );
    Ok(())
}

/// Microseconds per call of `f`: the fastest of 5 rounds of `reps` calls.
fn us(reps: usize, mut f: impl FnMut()) -> f64 {
    (0..5)
        .map(|_| {
            let t = std::time::Instant::now();
            for _ in 0..reps {
                f();
            }
            1e6 * t.elapsed().as_secs_f64() / reps as f64
        })
        .fold(f64::INFINITY, f64::min)
}

/// The toy's 1-50-50-1 tanh MLP (seed 0).
fn toy_net() -> Result<Mlp, fspace_nn::NnError> {
    Mlp::new(MlpConfig {
        input_dim: 1,
        hidden: vec![50, 50],
        output_dim: 1,
        activation: Activation::Tanh,
        seed: 0,
    })
}

/// Per-call cost of the pieces of one Alg. 1 step (`--parts`).
fn parts(only: Option<String>) -> Result<(), Box<dyn std::error::Error>> {
    use nalgebra::DMatrix;
    let net = toy_net()?;
    let c = DMatrix::from_fn(100, 1, |i, _| -2.0 + 4.0 * ((i as f64 * 0.618_034).fract()));
    let rbf = Rbf::new(1.0, 0.3)?;
    let k = fspace_kernels::gram(&rbf, &c, &c)?;
    let mut kj = k.clone();
    for i in 0..100 {
        kj[(i, i)] += 1e-3;
    }
    let cfg = fspace_linalg::JitterConfig::default();
    let chol = fspace_linalg::cholesky_jitter(&kj, &cfg)?;
    let r = DMatrix::from_fn(100, 1, |i, _| (i as f64).sin());
    let g = DMatrix::from_fn(100, 1, |i, _| (i as f64).cos());
    let show = |name: &str, f: &mut dyn FnMut()| {
        if only.as_deref().is_none_or(|o| name.starts_with(o)) {
            println!("{name:24} {:8.1} µs", us(if only.is_some() { 20_000 } else { 2000 }, f));
        }
    };
    show("gram 100×100", &mut || drop(fspace_kernels::gram(&rbf, &c, &c)));
    show("cholesky_jitter 100", &mut || drop(fspace_linalg::cholesky_jitter(&kj, &cfg)));
    show("fast::cholesky_lower 100", &mut || drop(fspace_linalg::fast::cholesky_lower(&kj)));
    show("nalgebra cholesky 100", &mut || drop(kj.clone().cholesky()));
    show("chol.solve 100×1", &mut || drop(chol.solve(&r)));
    show("forward 100", &mut || drop(net.forward(&c)));
    show("vjp 100", &mut || drop(net.vjp(&c, &g)));
    show("forward_vjp 100", &mut || drop(net.forward_vjp(&c, &mut |f: &DMatrix<f64>| Ok(f.clone()))));
    let prior = GpPrior::centered(rbf.clone());
    show("rkhs_regularizer 100", &mut || drop(fspace_fsp_laplace::rkhs_regularizer(&net, &prior, &c, 1e-3)));
    Ok(())
}
