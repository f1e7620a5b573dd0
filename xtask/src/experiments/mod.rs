//! The registry of experiments and the helpers they share.

use anyhow::Result;
use fspace_nn::{Activation, Mlp, MlpConfig};
use nalgebra::DMatrix;

mod fsp_ablation;
mod fsp_moons;
mod fsp_null_space;
mod fsp_toy;

/// Command-line options every experiment receives.
pub struct Options {
    /// Experiment names (empty: the default suite).
    pub names: Vec<String>,
    /// Reduced settings (a smoke test; numbers are not the paper's).
    pub quick: bool,
    /// Base seed: data, initialisation, context points.
    pub seed: u64,
    /// Output root (`results`).
    pub out: String,
}

/// An experiment the harness can run.
pub struct Experiment {
    /// `cargo xtask reproduce NAME`.
    pub name: &'static str,
    /// What it reproduces.
    pub paper: &'static str,
    /// Part of `cargo xtask reproduce` without names.
    pub in_default_suite: bool,
    /// Runs it, writing `results/NAME/`.
    pub run: fn(&Options) -> Result<()>,
}

/// Every experiment, in the order the default suite runs them.
pub const EXPERIMENTS: &[Experiment] = &[
    Experiment {
        name: "fsp-toy-regression",
        paper: "FSP-Laplace Fig. 1, C.1–C.4 (sine regression, 7 priors vs. exact GP)",
        in_default_suite: true,
        run: fsp_toy::run,
    },
    Experiment {
        name: "fsp-two-moons",
        paper: "FSP-Laplace Fig. C.5, C.6 (two moons, RBF and Matérn-1/2)",
        in_default_suite: true,
        run: fsp_moons::run,
    },
    Experiment {
        name: "fsp-context-ablation",
        paper: "FSP-Laplace Fig. C.7, C.8 (M ∈ {3, 5, 10, 100} training context points)",
        in_default_suite: true,
        run: fsp_ablation::run,
    },
    Experiment {
        name: "fsp-null-space",
        paper: "FSP-Laplace Table C.2 (‖P₀ΛP₀ᵀ‖_F / ‖Λ‖_F)",
        in_default_suite: true,
        run: fsp_null_space::run,
    },
];

/// A tanh MLP `d → hidden → q` (the papers' toy networks).
pub fn tanh_mlp(d: usize, hidden: &[usize], q: usize, seed: u64) -> Result<Mlp> {
    Ok(Mlp::new(MlpConfig { input_dim: d, hidden: hidden.to_vec(), output_dim: q, activation: Activation::Tanh, seed })?)
}

/// `n` equispaced points on `[lo, hi]` as an `n × 1` matrix.
pub fn linspace(lo: f64, hi: f64, n: usize) -> DMatrix<f64> {
    DMatrix::from_fn(n, 1, |i, _| lo + (hi - lo) * i as f64 / (n - 1) as f64)
}

/// Mean squared second difference of each sample on a regular grid, averaged over samples.
pub fn roughness(samples: &[DMatrix<f64>]) -> f64 {
    let per: Vec<f64> = samples
        .iter()
        .map(|s| {
            let v = s.column(0);
            let n = v.len();
            (1..n - 1).map(|i| (v[i + 1] - 2.0 * v[i] + v[i - 1]).powi(2)).sum::<f64>() / (n - 2) as f64
        })
        .collect();
    per.iter().sum::<f64>() / per.len() as f64
}
