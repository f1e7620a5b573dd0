//! Profiling target: repeated GFSVI (or, with `--tfsvi`, TFSVI) objective + gradient steps on a
//! 2×30 tanh network, batch 100, `M` measurement points (`perf`'s case). Usage:
//! `cargo run --release -p fspace-gfsvi --example gfsvi_step -- [M] [steps] [--tfsvi]`.

use fspace_gfsvi::{objective, KlPrior, VariationalParams};
use fspace_kernels::{GpPrior, Rbf};
use fspace_nn::{Activation, Mlp, MlpConfig};
use nalgebra::{DMatrix, DVector};
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let tfsvi = args.iter().any(|a| a == "--tfsvi");
    let nums: Vec<usize> = args.iter().filter_map(|a| a.parse().ok()).collect();
    let (m, steps) = (nums.first().copied().unwrap_or(500), nums.get(1).copied().unwrap_or(100));
    let mut net = Mlp::new(MlpConfig {
        input_dim: 1,
        hidden: vec![30, 30],
        output_dim: 1,
        activation: Activation::Tanh,
        seed: 0,
    })?;
    let p = net.params().len();
    let x = DMatrix::from_fn(100, 1, |i, _| -1.0 + 2.0 * ((i as f64 * 0.618_034).fract()));
    let y = x.map(|v| (std::f64::consts::TAU * v).sin());
    let xm = DMatrix::from_fn(m, 1, |i, _| -1.0 + 2.0 * ((i as f64 * 0.754_877_666).fract()));
    let params = VariationalParams {
        mean: net.params(),
        log_std: DVector::from_element(p, -3.0),
        log_noise_std: -2.0,
    };
    let prior = if tfsvi {
        KlPrior::WeightPushforward { sigma_p: 1.0 }
    } else {
        KlPrior::Gp(GpPrior::centered(Rbf::new(1.0, 0.3)?))
    };
    let t0 = Instant::now();
    for _ in 0..steps {
        objective(&mut net, &params, &prior, &x, &y, 100, &xm, 1e-10)?;
    }
    let ms = t0.elapsed().as_secs_f64() * 1e3 / steps as f64;
    println!("{} M = {m}, p = {p}: {ms:.2} ms per step", if tfsvi { "TFSVI" } else { "GFSVI" });
    Ok(())
}
