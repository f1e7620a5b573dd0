//! Two moons (FSP-Laplace App. C.2, Fig. C.5–C.8): data, the fitted RBF / Matérn-1/2 priors,
//! one FSP-Laplace fit with its predictive moments on the plotting grid, and the heat maps.

use anyhow::Result;
use fspace_context::BoundingBox;
use fspace_core::Schedule;
use fspace_core::{Data, Fitted, LikelihoodSpec, Posterior};
use fspace_fsp_laplace::{fit, fit_classification_prior, ContextDesign, FspConfig, FspLaplace};
use fspace_gp::FitConfig;
use fspace_kernels::{GpPrior, Kernel, KernelBase, Matern12, Rbf};
use fspace_nn::Mlp;
use nalgebra::{DMatrix, DVector};
use rand::rngs::StdRng;
use rand::SeedableRng;
use serde_json::{json, Map, Value};

use super::tanh_mlp;
use crate::harness::plot::Heatmap;

/// Half-width of the square the figures and the context points cover.
pub const BOX: f64 = 3.75;

/// `(x_train, y_train, x_test, y_test)`.
pub type MoonsData = (DMatrix<f64>, DVector<f64>, DMatrix<f64>, DVector<f64>);

/// Training and test sets from one standardised two-moons draw.
pub fn moons(seed: u64) -> Result<MoonsData> {
    let (all, _) = fspace_data::two_moons(1200, 0.1, &mut StdRng::seed_from_u64(seed))?;
    let train: Vec<usize> = (0..200).collect();
    let test: Vec<usize> = (200..1200).collect();
    let (a, b) = (all.select(&train), all.select(&test));
    Ok((a.x.clone(), a.y_vec(), b.x.clone(), b.y_vec()))
}

/// The two priors of the figures, fitted on the training data.
pub fn fitted_priors(
    x: &DMatrix<f64>,
    y: &DVector<f64>,
    seed: u64,
) -> Result<Vec<(&'static str, GpPrior, Value)>> {
    let kernels: Vec<(&'static str, Box<dyn Kernel>)> =
        vec![("rbf", Rbf::new(1.0, 1.0)?.boxed()), ("matern12", Matern12::new(1.0, 1.0)?.boxed())];
    kernels
        .into_iter()
        .map(|(name, k)| {
            let cfg = FitConfig { seed, ..Default::default() };
            let prior = fit_classification_prior(&k, x, y, 2, 0.01, &cfg)?;
            let hyper: Map<String, Value> = prior
                .kernel
                .param_names()
                .into_iter()
                .zip(prior.kernel.params().into_iter().map(|p| json!(p.exp())))
                .collect();
            Ok((name, prior, Value::Object(hyper)))
        })
        .collect()
}

/// What one two-moons run produced.
pub struct MoonsRun {
    /// Test accuracy of the MC-averaged probabilities.
    pub accuracy: f64,
    /// Mean std of p(class 1) where `max|xᵢ| > 3` on the `METRIC_GRID`² grid.
    pub far_std: f64,
    /// Mean std of p(class 1) at the training inputs.
    pub on_std: f64,
    /// Axis of the [`PLOT_GRID`]² plotting grid.
    pub axis: Vec<f64>,
    /// Mean of p(class 1) on the grid (row `i` at ordinate `axis[i]`).
    pub mean: Vec<Vec<f64>>,
    /// Std of p(class 1) on the grid.
    pub std: Vec<f64>,
    /// Train + Laplace seconds.
    pub seconds: f64,
    /// Rank of S.
    pub rank: usize,
    /// Largest logit variance at a training input over the prior variance (> 1: the posterior
    /// is wider than the prior there).
    pub max_var_over_prior: f64,
}

/// How the Laplace step is set up.
pub struct Variant {
    /// Label in tables and plots.
    pub label: &'static str,
    /// Laplace context points (a square number: grid).
    pub n_laplace: usize,
    /// Append the training inputs to the Laplace context points.
    pub with_data: bool,
}

/// The paper's set-up.
pub const PAPER: Variant = Variant { label: "paper (100 grid points)", n_laplace: 100, with_data: false };

/// Mean and std over function samples of `p(f_sample, i)` at every point `i`.
fn sample_moments(samples: &[DMatrix<f64>], p: impl Fn(&DMatrix<f64>, usize) -> f64) -> (Vec<f64>, Vec<f64>) {
    let (n, s) = (samples[0].nrows(), samples.len() as f64);
    let (mut m, mut m2) = (vec![0.0; n], vec![0.0; n]);
    for f in samples {
        for i in 0..n {
            let v = p(f, i);
            m[i] += v / s;
            m2[i] += v * v / s;
        }
    }
    let sd = m.iter().zip(&m2).map(|(a, b)| (b - a * a).max(0.0).sqrt()).collect();
    (m, sd)
}

/// Mean and std of p(class 1) = sigmoid(f₁ − f₀) over `s` linearised function samples.
fn p1_moments(
    post: &FspLaplace<Mlp>,
    x: &DMatrix<f64>,
    s: usize,
    rng: &mut StdRng,
) -> Result<(Vec<f64>, Vec<f64>)> {
    let samples = post.sample_functions(x, s, rng)?;
    Ok(sample_moments(&samples, |f, i| fspace_core::sigmoid(f[(i, 1)] - f[(i, 0)])))
}

/// Points per side of the grid the far-from-data std is averaged on.
const METRIC_GRID: usize = 41;
/// Cells per side of the heat maps (≥ 100, so no block artefacts).
pub const PLOT_GRID: usize = 101;

/// `m` equispaced abscissae on [−BOX, BOX] and the `m² × 2` grid they span (x fastest).
fn square_grid(m: usize) -> (Vec<f64>, DMatrix<f64>) {
    let axis: Vec<f64> = (0..m).map(|i| -BOX + 2.0 * BOX * i as f64 / (m - 1) as f64).collect();
    let grid = DMatrix::from_fn(m * m, 2, |r, c| if c == 0 { axis[r % m] } else { axis[r / m] });
    (axis, grid)
}

/// Trains and evaluates FSP-Laplace on two moons with `n_context` training context points per
/// step and `laplace_design` for the 100 Laplace context points.
pub fn moons_run(
    prior: &GpPrior,
    data: &MoonsData,
    n_context: usize,
    laplace_design: ContextDesign,
    variant: &Variant,
    epochs: usize,
    seed: u64,
) -> Result<MoonsRun> {
    let (x, y, xt, yt) = data;
    let config = FspConfig {
        schedule: Schedule::epochs(epochs),
        batch_size: x.nrows(),
        learning_rate: 1e-3,
        seed,
        n_context,
        design: laplace_design,
        context_box: Some(BoundingBox::cube(2, -BOX, BOX)?),
        design_seed: seed,
        n_laplace_context: variant.n_laplace,
        context_includes_data: variant.with_data,
        ..Default::default()
    };
    let net = tanh_mlp(2, &[100, 100], 2, seed)?;
    let Fitted { posterior: post, report: summary } =
        fit(net, LikelihoodSpec::categorical(2), prior, &Data::new(x, &super::targets(y, 1))?, &config)?;
    let mut rng = StdRng::seed_from_u64(seed + 7);
    let pred = post.predict(x)?;
    let prior_var = prior.variances(x)?;
    let max_var_over_prior =
        (0..x.nrows() * 2).map(|k| pred.var[(k / 2, k % 2)] / prior_var[k]).fold(0.0, f64::max);
    let (pt, _) = p1_moments(&post, xt, 100, &mut rng)?;
    let accuracy = pt.iter().zip(yt.iter()).filter(|(p, &l)| ((**p > 0.5) as u8 as f64) == l).count() as f64
        / yt.len() as f64;
    let (_, on) = p1_moments(&post, x, 100, &mut rng)?;
    let (_, grid) = square_grid(METRIC_GRID);
    let (_, gs) = p1_moments(&post, &grid, 100, &mut rng)?;
    let far: Vec<usize> =
        (0..grid.nrows()).filter(|&r| grid[(r, 0)].abs().max(grid[(r, 1)].abs()) > 3.0).collect();
    let far_std = far.iter().map(|&r| gs[r]).sum::<f64>() / far.len() as f64;
    let on_std = on.iter().sum::<f64>() / on.len() as f64;
    // The figures' grid, drawn after every number above so the numbers do not depend on it.
    let m = PLOT_GRID;
    let (axis, grid) = square_grid(m);
    let (gm, gs) = p1_moments(&post, &grid, 100, &mut rng)?;
    let mean = (0..m).map(|i| gm[i * m..(i + 1) * m].to_vec()).collect();
    Ok(MoonsRun {
        accuracy,
        far_std,
        on_std,
        axis,
        mean,
        std: gs,
        seconds: summary.train_seconds + summary.laplace_seconds,
        rank: post.report().rank,
        max_var_over_prior,
    })
}

/// Heat maps of a run's mean and 2σ of p(class 1) with the training points.
pub fn moons_maps(label: &str, r: &MoonsRun, x: &DMatrix<f64>, y: &DVector<f64>) -> Vec<Heatmap> {
    let m = r.axis.len();
    let points: Vec<(f64, f64, usize)> =
        (0..x.nrows()).map(|i| (x[(i, 0)], x[(i, 1)], y[i] as usize)).collect();
    let two_sd: Vec<Vec<f64>> =
        (0..m).map(|i| r.std[i * m..(i + 1) * m].iter().map(|s| 2.0 * s).collect()).collect();
    vec![
        Heatmap {
            title: format!("{label}: mean p(class 1)"),
            xs: r.axis.clone(),
            ys: r.axis.clone(),
            values: r.mean.clone(),
            range: (0.0, 1.0),
            points: points.clone(),
            axes: ("x₁".into(), "x₂".into()),
        },
        Heatmap {
            title: format!("{label}: 2σ of p(class 1)"),
            xs: r.axis.clone(),
            ys: r.axis.clone(),
            values: two_sd,
            range: (0.0, 1.0),
            points,
            axes: ("x₁".into(), "x₂".into()),
        },
    ]
}

/// `(far std, on-data std)` of p(class 1) under the exact GP Laplace classifier with the same
/// prior on the logit difference (kernel variance doubled: two independent logits).
pub fn gp_reference(prior_name: &str, hyper: &Value, data: &MoonsData, seed: u64) -> Result<(f64, f64)> {
    let (var, ell) =
        (hyper["variance"].as_f64().unwrap_or(1.0), hyper["lengthscale"].as_f64().unwrap_or(1.0));
    let k: Box<dyn Kernel> = if prior_name == "rbf" {
        Rbf::new(2.0 * var, ell)?.boxed()
    } else {
        Matern12::new(2.0 * var, ell)?.boxed()
    };
    let labels = DMatrix::from_column_slice(data.1.len(), 1, data.1.as_slice());
    let gpc = fspace_gp::classification::fit(
        LikelihoodSpec::Bernoulli,
        &GpPrior::with_kernel(k, fspace_kernels::PriorMean::Zero),
        &Data::new(&data.0, &labels)?,
        &Default::default(),
    )?
    .posterior;
    let mut rng = StdRng::seed_from_u64(seed + 7);
    let mut p1_std = |x: &DMatrix<f64>| -> Result<Vec<f64>> {
        let samples = gpc.sample_functions(x, 100, &mut rng)?;
        Ok(sample_moments(&samples, |f, i| fspace_core::sigmoid(f[(i, 0)])).1)
    };
    let (_, grid) = square_grid(METRIC_GRID);
    let far_rows: Vec<usize> =
        (0..grid.nrows()).filter(|&r| grid[(r, 0)].abs().max(grid[(r, 1)].abs()) > 3.0).collect();
    let far = grid.select_rows(&far_rows);
    let mean = |v: Vec<f64>| v.iter().sum::<f64>() / v.len() as f64;
    Ok((mean(p1_std(&far)?), mean(p1_std(&data.0)?)))
}
