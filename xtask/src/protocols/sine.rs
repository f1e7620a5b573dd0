//! The sine toy (FSP-Laplace App. B.1, GFSVI App. A.1): the prior fitted by the exact GP's
//! marginal likelihood, the FSP-Laplace set-up on [−2, 2], and a posterior's checks against the
//! exact GP on a grid; GFSVI's toy cases (a prior's exact GP and its samples, the W2 of a
//! posterior to them, the GFSVI configuration).

use anyhow::Result;
use fspace_core::Schedule;
use fspace_core::{LikelihoodSpec, Posterior};
use fspace_gfsvi::{GfsviConfig, OptimConfig};
use fspace_gp::ExactGp;
use fspace_kernels::{GpPrior, Kernel};
use nalgebra::DMatrix;
use rand::rngs::StdRng;
use rand::SeedableRng;

use super::linspace;
use crate::harness::plot::Panel1d;

/// σ_y learned from 0.5 by every VI method of the GFSVI toy.
pub const TOY_LIKELIHOOD: LikelihoodSpec = LikelihoodSpec::Gaussian { sigma: 0.5, learn: true };

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
        schedule: Schedule::epochs(epochs),
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

/// A fitted posterior's panel and its W2 to the exact GP's samples on the grid.
pub fn w2_panel(
    post: &dyn Posterior,
    gp_samples: &[DMatrix<f64>],
    title: String,
    data: &[(f64, f64)],
    seed: u64,
) -> Result<(Panel1d, f64)> {
    let xt = linspace(-2.0, 2.0, 100);
    let mut rng = StdRng::seed_from_u64(seed);
    let samples = post.sample_functions(&xt, gp_samples.len(), &mut rng)?;
    let w2 = (0..xt.nrows())
        .map(|i| {
            let a: Vec<f64> = samples.iter().map(|f| f[(i, 0)]).collect();
            let b: Vec<f64> = gp_samples.iter().map(|f| f[(i, 0)]).collect();
            fspace_metrics::w2_empirical_1d(&a, &b)
        })
        .sum::<Result<f64, _>>()?
        / xt.nrows() as f64;
    let pred = post.predict(&xt)?;
    let panel = Panel1d {
        title,
        data: data.to_vec(),
        x: xt.iter().cloned().collect(),
        mean: pred.mean.iter().cloned().collect(),
        std: pred.var.iter().map(|v| v.max(0.0).sqrt()).collect(),
        samples: samples.iter().take(8).map(|f| f.iter().cloned().collect()).collect(),
        sample_label: "samples".into(),
        context: Vec::new(),
        context_label: "context points".into(),
    };
    Ok((panel, w2))
}

/// One prior's sine case: data, the prior with its kernel fitted by marginal likelihood, the
/// exact GP and 1 000 of its posterior samples on 100 points over [−2, 2].
pub struct GpCase {
    /// The training data.
    pub data: fspace_data::Dataset,
    /// `(x, y)` of the data, for the panels.
    pub points: Vec<(f64, f64)>,
    /// The prior with the fitted kernel.
    pub prior: GpPrior,
    /// The exact GP posterior.
    pub gp: ExactGp<Box<dyn Kernel>>,
    /// Its samples on the grid.
    pub gp_samples: Vec<DMatrix<f64>>,
}

/// The case of `kernel`'s family on 100 sine points with noise std `noise` (hyperparameters
/// and noise variance by [`fit_sine_prior`]).
pub fn gp_case<K: Kernel + Clone + 'static>(kernel: K, noise: f64, seed: u64) -> Result<GpCase> {
    let mut rng = StdRng::seed_from_u64(seed);
    let data = fspace_data::sine(100, noise, &mut rng)?;
    let (k, noise_var) = fit_sine_prior(&kernel, &data, seed)?;
    case_with(k, noise_var, data, seed)
}

/// The case of a given `kernel` and noise variance on `data` (nothing fitted).
pub fn case_with<K: Kernel + Clone + 'static>(
    k: K,
    noise_var: f64,
    data: fspace_data::Dataset,
    seed: u64,
) -> Result<GpCase> {
    let boxed: Box<dyn Kernel> = Box::new(k.clone());
    let gp = super::exact_gp(&boxed, noise_var, &data.x, &data.y)?;
    let xt = linspace(-2.0, 2.0, 100);
    let mut rng = StdRng::seed_from_u64(seed ^ 0x9e37);
    let gp_samples = gp.sample_functions(&xt, 1000, &mut rng)?;
    let points = (0..data.len()).map(|i| (data.x[(i, 0)], data.y[(i, 0)])).collect();
    Ok(GpCase { data, points, prior: GpPrior::centered(k), gp, gp_samples })
}

/// GFSVI on the toy: `m` measurement points uniform on [−2, 2], γ = 1e-10, full batch.
pub fn gfsvi_config(steps: usize, learning_rate: f64, m: usize, seed: u64) -> Result<GfsviConfig> {
    Ok(GfsviConfig {
        measurement_points: m,
        gamma: 1e-10,
        measurement_box: Some(fspace_context::BoundingBox::cube(1, -2.0, 2.0)?),
        optim: optim(steps, learning_rate, seed),
        ..Default::default()
    })
}

/// Full-batch Adam for `steps` (validation every 500 steps, no early stopping).
pub fn optim(steps: usize, learning_rate: f64, seed: u64) -> OptimConfig {
    OptimConfig { learning_rate, batch_size: 100, schedule: Schedule::steps(steps).every_steps(500), seed }
}
