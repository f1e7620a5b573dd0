//! The registry of experiments and the helpers they share.

use anyhow::Result;
use fspace_nn::{Activation, Mlp, MlpConfig};
use nalgebra::DMatrix;

mod fsp_ablation;
mod fsp_bayesopt;
mod fsp_images;
mod fsp_mauna_loa;
mod fsp_moons;
mod fsp_null_space;
mod fsp_ocean;
mod fsp_toy;
mod fsp_uci;
mod gfsvi_toy;
mod gfsvi_uci;
mod gfsvi_w2;
mod gl_cubic;
mod gl_mnist;
pub mod images;
mod nn_speed;
mod perf;
mod valla_images;
mod valla_regression;
mod valla_toy;

/// Command-line options every experiment receives.
#[derive(Debug, Clone)]
pub struct Options {
    /// Experiment names (empty: the default suite).
    pub names: Vec<String>,
    /// Reduced settings (a smoke test; numbers are not the paper's).
    pub quick: bool,
    /// Base seed: data, initialisation, context points.
    pub seed: u64,
    /// Number of seeds for the multi-seed experiments (`None`: the experiment's own).
    pub seeds: Option<usize>,
    /// Output root (`results`).
    pub out: String,
    /// Keep the finished units of an earlier run of the same settings and compute only the rest:
    /// (seed, method) rows of `metrics.json` in `fsp-mnist` / `fsp-fmnist`, (set, fold, method)
    /// units of `checkpoint.json` in `fsp-uci`, `gfsvi-uci`, `gfsvi-ood`, `gfsvi-w2`; others ignore it.
    pub resume: bool,
    /// `--gamma`: the regularisers GFSVI and TFSVI try in `gfsvi-uci` / `gfsvi-ood` (one value
    /// fixes γ; several are chosen per fold by the validation NLL; `None`: `UCI_GAMMA_GRID`,
    /// the paper's 1e-10 and 1e-6).
    pub gammas: Option<Vec<f64>>,
    /// `--sets`: the data sets `gfsvi-uci` / `gfsvi-ood` / `gfsvi-w2` run (`None`: all four).
    pub sets: Option<Vec<String>>,
    /// `--folds`: the folds (1–5, ascending) those three run (`None`: the first `--seeds`, or all).
    pub folds: Option<Vec<usize>>,
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
        name: "fsp-mauna-loa",
        paper: "FSP-Laplace Table 1 (Mauna Loa) and Fig. C.9: FSP-Laplace, FVI, Laplace, GP forecasts of NOAA CO₂ 1974–2024",
        in_default_suite: false,
        run: fsp_mauna_loa::run,
    },
    Experiment {
        name: "fsp-ocean",
        paper: "FSP-Laplace Table 1 (ocean current) and Fig. 2: Helmholtz FSP-Laplace, FVI, Laplace, GP on the Gulf drifters",
        in_default_suite: false,
        run: fsp_ocean::run,
    },
    Experiment {
        name: "fsp-uci",
        paper: "FSP-Laplace Table C.1: ELL and OOD accuracy on the shipped UCI sets (FSP-Laplace, FVI, Laplace, MAP, GP, sparse GP)",
        in_default_suite: false,
        run: fsp_uci::run,
    },
    Experiment {
        name: "fsp-bayesopt",
        paper: "FSP-Laplace Fig. 3: BO on Branin, Ackley-4, Hartmann-6 with FSP-Laplace, Laplace, FVI and GP surrogates",
        in_default_suite: false,
        run: fsp_bayesopt::run,
    },
    Experiment {
        name: "fsp-bayesopt-covariance",
        paper: "FSP-Laplace Fig. 3's covariance budget: BO on Hartmann-6 with FSP-Laplace, 500 vs 2 000 Latin-hypercube covariance points (paper: 10 000)",
        in_default_suite: false,
        run: fsp_bayesopt::run_covariance_sweep,
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
    Experiment {
        name: "gl-cubic-toy",
        paper: "Generalized Laplace Fig. 2 (cubic toy: Diag, KFAC, EKFAC, B-Diag, full GGN)",
        in_default_suite: true,
        run: gl_cubic::run,
    },
    Experiment {
        name: "gl-mnist-temperature",
        paper: "Generalized Laplace Fig. 3, 5 (LeNet-5 on MNIST, T from 0.1 to 10, Diag/KFAC/EKFAC)",
        in_default_suite: false,
        run: gl_mnist::run,
    },
    Experiment {
        name: "fsp-mnist",
        paper: "FSP-Laplace Table 2, Fig. C.10 (MNIST CNN: FSP-Laplace RND, Laplace KFAC, MAP; LL, ACC, ECE, OOD vs FMNIST)",
        in_default_suite: false,
        run: fsp_images::run_mnist,
    },
    Experiment {
        name: "fsp-fmnist",
        paper: "FSP-Laplace Table 2, Fig. C.10 (Fashion-MNIST CNN: the same columns; OOD vs MNIST)",
        in_default_suite: false,
        run: fsp_images::run_fmnist,
    },
    Experiment {
        name: "fsp-mnist-halton",
        paper: "FSP-Laplace Table 2's covariance budget: MNIST FSP-Laplace (RND) with 250 … 4 000 Halton points (paper: 25 000), one trained network",
        in_default_suite: false,
        run: fsp_images::run_halton_sweep,
    },
    Experiment {
        name: "nn-epoch-timer",
        paper: "issue 15: one MNIST epoch and per-batch f / J·u / Jᵀ·V of MLP, LeNet-5, FSP CNN beside PyTorch 2 CPU",
        in_default_suite: false,
        run: nn_speed::run,
    },
    Experiment {
        name: "perf",
        paper: "issue 40: GFSVI step against its GEMM bound, LeNet-5 / FSP CNN epochs (beside PyTorch run live when importable), FSP toy prior, W1 full LLA (≤ 3 min)",
        in_default_suite: false,
        run: perf::run,
    },
    Experiment {
        name: "valla-toy",
        paper: "VaLLA Figs. 1, 6, 7 (1-D gap toy: VaLLA M ∈ {5, 10, 20}, ELLA, exact LLA; early stopping)",
        in_default_suite: false,
        run: valla_toy::run,
    },
    Experiment {
        name: "valla-mnist",
        paper: "VaLLA Fig. 3 (MNIST: MAP, LLA Diag/KFAC, last-layer LLA (+KFAC), ELLA, VaLLA 100/200; OOD vs FMNIST; fit times)",
        in_default_suite: false,
        run: valla_images::run_mnist,
    },
    Experiment {
        name: "valla-fmnist",
        paper: "VaLLA Fig. 4 (FMNIST: the same methods; OOD vs MNIST; rotated FMNIST ECE/NLL; fit times)",
        in_default_suite: false,
        run: valla_images::run_fmnist,
    },
    Experiment {
        name: "valla-regression",
        paper: "VaLLA Fig. 2 left (NLL, CRPS, CQM; 3×200 tanh) on the shipped Boston/concrete/wine sets (Airline/Year/Taxi unavailable)",
        in_default_suite: false,
        run: valla_regression::run,
    },
    Experiment {
        name: "valla-toy-quick",
        paper: "VaLLA Figs. 1, 6, 7 with the --quick budget (3 000 MAP, 2 000 VaLLA steps)",
        in_default_suite: true,
        run: valla_toy::run_quick,
    },
    Experiment {
        name: "gfsvi-toy",
        paper: "GFSVI Figs. 1, 2, 4–8 (sine toy: four priors vs exact GP; GFSVI/FVI/TFSVI/MFVI/Laplace; M sweep; σ_n = 1)",
        in_default_suite: false,
        run: gfsvi_toy::run,
    },
    Experiment {
        name: "gfsvi-toy-quick",
        paper: "GFSVI Figs. 1, 2, 4–8 with the --quick budget (1 500 steps, M = 100)",
        in_default_suite: true,
        run: gfsvi_toy::run_quick,
    },
    Experiment {
        name: "gfsvi-uci",
        paper: "GFSVI Tables 1, 5 (ELL, MSE; 5-fold CV; GFSVI/FVI/TFSVI/MFVI/Laplace/SVGP/GP) on the shipped Boston/concrete/wine/yacht",
        in_default_suite: false,
        run: gfsvi_uci::run_uci,
    },
    Experiment {
        name: "gfsvi-ood",
        paper: "GFSVI Table 3 (OOD accuracy of one threshold on Var[f]; digits stand in for the song subset; the same fits as gfsvi-uci, all three tables)",
        in_default_suite: false,
        run: gfsvi_uci::run_ood,
    },
    Experiment {
        name: "gfsvi-w2",
        paper: "GFSVI Table 2 (per-point W2 to the exact GP: GFSVI, FVI, SVGP; 2×100 tanh, γ = 1e-15)",
        in_default_suite: false,
        run: gfsvi_w2::run,
    },
];

/// The sine-toy prior protocol (App. B.1): kernel hyperparameters and noise variance by the
/// exact GP's marginal likelihood (centred prior, initial noise variance 0.05).
pub fn fit_sine_prior<K: fspace_kernels::Kernel + Clone>(
    kernel: &K,
    data: &fspace_data::Dataset,
    seed: u64,
) -> Result<(K, f64)> {
    let cfg = fspace_gp::FitConfig { seed, ..Default::default() };
    let rep = fspace_gp::fit_hyperparameters(
        kernel,
        &fspace_kernels::PriorMean::Zero,
        0.05,
        &data.x,
        &data.y,
        &cfg,
    )?;
    Ok((rep.kernel, rep.noise_variance))
}

/// The sine-toy FSP-Laplace set-up: full-batch Adam (lr 1e-3) for `epochs`, `n_context`
/// training context points per step and 100 Laplace points of `design`, both on [−2, 2].
pub fn sine_config(
    n_train: usize,
    epochs: usize,
    n_context: usize,
    design: fspace_fsp_laplace::ContextDesign,
    seed: u64,
) -> Result<fspace_fsp_laplace::FspConfig> {
    let train = fspace_nn::TrainConfig {
        epochs,
        batch_size: n_train,
        learning_rate: 1e-3,
        seed,
        ..Default::default()
    };
    Ok(fspace_fsp_laplace::FspConfig {
        n_context,
        design,
        context_box: Some(fspace_context::BoundingBox::cube(1, -2.0, 2.0)?),
        ..fspace_fsp_laplace::FspConfig::default().with_training(&train)
    })
}

/// A tanh MLP `d → hidden → q` (the papers' toy networks).
/// Point-major targets (`t` per point) as the `n × t` matrix that `fspace_core::Data` takes.
pub fn targets(y: &nalgebra::DVector<f64>, t: usize) -> DMatrix<f64> {
    DMatrix::from_row_slice(y.len() / t, t, y.as_slice())
}

pub fn tanh_mlp(d: usize, hidden: &[usize], q: usize, seed: u64) -> Result<Mlp> {
    Ok(Mlp::new(MlpConfig {
        input_dim: d,
        hidden: hidden.to_vec(),
        output_dim: q,
        activation: Activation::Tanh,
        seed,
    })?)
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

/// The sine-toy checks of one posterior against the exact GP on a grid over [−2, 2].
pub struct SineEval {
    /// Grid abscissae.
    pub xs: Vec<f64>,
    /// Predictive mean and std of f.
    pub mean: Vec<f64>,
    /// Predictive std of f.
    pub std: Vec<f64>,
    /// Exact GP mean.
    pub gp_mean: Vec<f64>,
    /// Exact GP std.
    pub gp_std: Vec<f64>,
    /// Mean pointwise W2 to the exact GP.
    pub w2_to_gp: f64,
    /// Mean std on |x| ≥ 1.2 over the prior std there.
    pub std_out_over_prior: f64,
    /// Same for the GP.
    pub gp_std_out_over_prior: f64,
    /// Mean std on the data region 0.5 ≤ |x| ≤ 1.
    pub std_in: f64,
    /// RMSE of the mean against sin(2πx) on the data region.
    pub rmse_in: f64,
    /// Same for the GP mean.
    pub gp_rmse_in: f64,
}

/// Evaluates `post` and `gp` on 200 points over [−2, 2] (prior std from `prior_var`).
pub fn eval_sine(
    post: &dyn fspace_core::Posterior,
    gp: &dyn fspace_core::Posterior,
    kernel: &dyn fspace_kernels::MatrixKernel,
) -> Result<SineEval> {
    let xt = linspace(-2.0, 2.0, 200);
    let xs: Vec<f64> = xt.iter().cloned().collect();
    let inside: Vec<usize> = (0..200).filter(|&i| (0.5..=1.0).contains(&xs[i].abs())).collect();
    let outside: Vec<usize> = (0..200).filter(|&i| xs[i].abs() >= 1.2).collect();
    let truth: Vec<f64> = xs.iter().map(|x| (std::f64::consts::TAU * x).sin()).collect();
    let (p, g) = (post.predict(&xt)?, gp.predict(&xt)?);
    let sd = |v: &DMatrix<f64>| v.iter().map(|x| x.max(0.0).sqrt()).collect::<Vec<f64>>();
    let (mean, std) = (p.mean.iter().cloned().collect::<Vec<_>>(), sd(&p.var));
    let (gp_mean, gp_std) = (g.mean.iter().cloned().collect::<Vec<_>>(), sd(&g.var));
    let prior_sd: Vec<f64> = fspace_kernels::gram_diag(kernel, &xt)?.iter().map(|v| v.sqrt()).collect();
    let avg = |v: &[f64], idx: &[usize]| idx.iter().map(|&i| v[i]).sum::<f64>() / idx.len() as f64;
    let rmse = |m: &[f64]| {
        (inside.iter().map(|&i| (m[i] - truth[i]).powi(2)).sum::<f64>() / inside.len() as f64).sqrt()
    };
    Ok(SineEval {
        w2_to_gp: fspace_metrics::mean_w2(&mean, &std, &gp_mean, &gp_std)?,
        std_out_over_prior: avg(&std, &outside) / avg(&prior_sd, &outside),
        gp_std_out_over_prior: avg(&gp_std, &outside) / avg(&prior_sd, &outside),
        std_in: avg(&std, &inside),
        rmse_in: rmse(&mean),
        gp_rmse_in: rmse(&gp_mean),
        xs,
        mean,
        std,
        gp_mean,
        gp_std,
    })
}

/// The OOD rows of the regression OOD tables (GFSVI Table 3, FSP-Laplace Table C.1). The
/// papers' subset of the million-song set is in no package registry; sklearn's digits
/// (shipped in `datasets/`, 1 797 rows of 64 pixel intensities) stand in: its `d`
/// highest-variance pixel columns (ties by column order), each standardised by its own mean
/// and standard deviation (the ID features are standardised too), `n` rows of a seeded
/// permutation (`n ≤ 1 797`).
pub fn ood_rows(d: usize, n: usize, seed: u64) -> Result<DMatrix<f64>> {
    use rand::seq::SliceRandom;
    use rand::SeedableRng;
    let digits = fspace_data::digits()?;
    let x = &digits.x;
    anyhow::ensure!(d >= 1 && d <= x.ncols(), "OOD substitute has {} features, {d} requested", x.ncols());
    anyhow::ensure!(n >= 1 && n <= x.nrows(), "OOD substitute has {} rows, {n} requested", x.nrows());
    let stats: Vec<(usize, f64, f64)> = (0..x.ncols())
        .map(|c| {
            let col = x.column(c);
            let m = col.mean();
            (c, m, (col.iter().map(|v| (v - m).powi(2)).sum::<f64>() / col.len() as f64).sqrt())
        })
        .collect();
    let mut by_var = stats.clone();
    by_var.sort_by(|a, b| b.2.total_cmp(&a.2).then(a.0.cmp(&b.0)));
    let cols = &by_var[..d];
    let mut rows: Vec<usize> = (0..x.nrows()).collect();
    rows.shuffle(&mut rand::rngs::StdRng::seed_from_u64(seed ^ 0x00d5));
    Ok(DMatrix::from_fn(n, d, |i, j| {
        let (c, m, s) = cols[j];
        (x[(rows[i], c)] - m) / s
    }))
}

#[cfg(test)]
mod tests {
    #[test]
    fn ood_rows_are_standardised_digits_columns_and_reject_bad_sizes() {
        let x = super::ood_rows(13, 1797, 0).unwrap();
        assert_eq!(x.shape(), (1797, 13));
        for c in 0..13 {
            let col = x.column(c);
            let m = col.mean();
            let v = col.iter().map(|v| (v - m).powi(2)).sum::<f64>() / 1797.0;
            assert!(m.abs() < 1e-10 && (v - 1.0).abs() < 1e-10, "column {c}: mean {m}, var {v}");
        }
        // Seeded: same rows for the same seed, another permutation for another.
        assert_eq!(super::ood_rows(8, 50, 1).unwrap(), super::ood_rows(8, 50, 1).unwrap());
        assert_ne!(super::ood_rows(8, 50, 1).unwrap(), super::ood_rows(8, 50, 2).unwrap());
        assert!(super::ood_rows(65, 10, 0).is_err());
        assert!(super::ood_rows(8, 1798, 0).is_err());
        assert!(super::ood_rows(0, 10, 0).is_err());
    }
}
