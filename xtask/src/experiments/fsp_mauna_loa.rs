//! `fsp-mauna-loa` — FSP-Laplace Table 1 (Mauna Loa row) and Fig. C.9: forecasting NOAA's
//! monthly Mauna Loa CO₂ record. Window January 1974 – December 2024 (612 months), the first
//! 70 % in time for training, the rest for testing; time and CO₂ standardised by the training
//! rows. Networks: 2×50 tanh on `(t, sin 2πt/T, cos 2πt/T)` with `T` = 1 year (R&W's period),
//! through [`fspace_nn::Featurized`], so prior, context points and data stay in time.
//!
//! Prior: Rasmussen & Williams' §5.4.3 kernel (long RBF trend + RBF × periodic + rational
//! quadratic + short RBF), started at R&W's values in standardised units and fitted with the
//! noise by the exact GP's marginal likelihood on the training rows.
//!
//! Methods (same prior and noise everywhere; the paper learns the networks' noise and reports
//! that every network under-estimates it — we fix it to the GP's fitted noise, so the methods
//! differ only in how they use the prior and the network):
//! * FSP-Laplace: full-batch Adam, 100 uniform context points per step on the data box widened
//!   by half its range (this covers the whole test period), Laplace at 100 grid points there,
//!   Lanczos ≤ 500.
//! * FVI: the same featurised network and prior, 100 uniform measurement points per step in the
//!   same box (the paper: "100 context points drawn uniformly at each update").
//! * Laplace: MAP with weight decay (σ_p = 1) on the featurised network, full GGN, the prior
//!   precision by the Laplace marginal likelihood (Immer et al. 2021), GLM predictive.
//! * GP: the exact GP with the fitted kernel.
//!
//! Where we disagree with the paper. The exact GP (19.3 ppm²) beats every network here, whereas
//! the paper has FSP-Laplace (8.99) far below its GP (35.66). Every network fits the training
//! years to a fraction of a ppm and flattens after ≈ 2015 (`forecasts.png`). Measured, each on
//! seed 0, FSP-Laplace test MSE in ppm²:
//! * not under-training: lr 1e-2 for 10 000 epochs improves the objective (−559 → −1049) while
//!   the test MSE rises to 192;
//! * not the context jitter: relative jitter 1e-3 / 1e-5 / 1e-7 gives 114.6 / 115.0 / 117.1
//!   (`--quick`, 1 500 epochs);
//! * not the prior missing the data: adding all 428 training inputs to the 100 uniform context
//!   points of every step and to Alg. 2's context set gives 114.2 (`--quick`) and 135.2 (10 000
//!   epochs), against 114.6 (`--quick`) and 128.3 ± 12.5 (10 000 epochs, 5 seeds) without them.
//!
//! With a noise σ of 0.2 ppm the data term outweighs the prior term by orders of magnitude, and
//! the tanh features of time saturate beyond the training window; the prior then only sets the
//! spread, not the trend, of the forecast.
//!
//! Units. The paper's numbers (MSE 8.99 / 38.38 / 28.26 / 35.66, ELL −6 015 … −2 124) cannot be
//! standardised-unit means (the whole test period lies within ≈ 4 training standard deviations),
//! but fit ppm² MSEs and test-set *sums* of log-likelihoods in ppm; we report both those and
//! the standardised per-point means.

use fspace_kernels::GpPrior;
use std::time::Instant;

use anyhow::{bail, Result};
use fspace_context::BoundingBox;
use fspace_core::Data;
use fspace_core::Fitted;
use fspace_core::LikelihoodSpec;
use fspace_core::{Gaussian, Posterior};
use fspace_data::Standardizer;
use fspace_fsp_laplace::{fit as fsp_fit, ContextDesign, FspConfig};
use fspace_gfsvi::{fit_fvi, FviConfig, OptimConfig};
use fspace_gp::{ExactGp, Noise};
use fspace_kernels::{Kernel, KernelBase, Periodic, PriorMean, RationalQuadratic, Rbf};
use fspace_laplace::{
    fit as laplace_fit, LaplaceConfig, MarglikConfig, Predictive, PriorPrecision, Structure,
};
use fspace_nn::{train_map, FeatureMap, Featurized, Mlp, TrainConfig};
use nalgebra::{DMatrix, DVector};
use rand::rngs::StdRng;
use rand::SeedableRng;
use serde_json::{json, Map, Value};

use super::{tanh_mlp, Options};
use crate::plot::{regression_panels, Panel1d};
use crate::report::{markdown_table, mean_std, pm_cell, Checkpoint, Run};

const METHODS: [&str; 4] = ["FSP-Laplace", "FVI", "Laplace", "GP"];
/// The paper's Table 1 row: ELL then MSE, (mean, std) per method.
const PAPER_ELL: [(f64, f64); 4] =
    [(-6015.39, 443.13), (-13594.57, 1303.26), (-16139.85, 2433.70), (-2123.90, 0.0)];
const PAPER_MSE: [(f64, f64); 4] = [(8.99, 1.15), (38.38, 2.10), (28.26, 6.87), (35.66, 0.0)];

/// The standardised Mauna Loa task.
struct Task {
    xtr: DMatrix<f64>,
    ytr: DVector<f64>,
    xte: DMatrix<f64>,
    yte: DVector<f64>,
    /// Year ↦ standardised time: `(year − t_mean) / t_std`.
    t_mean: f64,
    t_std: f64,
    /// CO₂ (ppm) ↦ standardised: `(ppm − y_mean) / y_std`.
    y_mean: f64,
    y_std: f64,
}

fn task() -> Result<Task> {
    let d = fspace_data::mauna_loa()?;
    let rows: Vec<usize> = (0..d.x.nrows()).filter(|&i| (1974.0..2025.0).contains(&d.x[(i, 0)])).collect();
    if rows.len() != 612 {
        bail!("expected 612 months in 1974–2024, found {}", rows.len());
    }
    let n_train = (0.7 * rows.len() as f64).round() as usize;
    let (tr, te) = rows.split_at(n_train);
    let sx = Standardizer::fit(&d.x.select_rows(tr))?;
    let sy = Standardizer::fit(&d.y.select_rows(tr))?;
    let col = |m: DMatrix<f64>| DVector::from_column_slice(m.as_slice());
    Ok(Task {
        xtr: sx.transform(&d.x.select_rows(tr))?,
        ytr: col(sy.transform(&d.y.select_rows(tr))?),
        xte: sx.transform(&d.x.select_rows(te))?,
        yte: col(sy.transform(&d.y.select_rows(te))?),
        t_mean: sx.mean[0],
        t_std: sx.std[0],
        y_mean: sy.mean[0],
        y_std: sy.std[0],
    })
}

/// R&W §5.4.3's kernel with their hyperparameters (ppm, years) mapped to standardised units.
fn rw_kernel(t: &Task) -> Result<Box<dyn Kernel>> {
    let (ts, ys) = (t.t_std, t.y_std);
    let v = |ppm: f64| (ppm / ys).powi(2);
    Ok(Rbf::new(v(66.0), 67.0 / ts)?.boxed()
        + Rbf::new(v(2.4), 90.0 / ts)?.boxed() * Periodic::new(1.0, 1.3, 1.0 / ts)?.boxed()
        + RationalQuadratic::new(v(0.66), 1.2 / ts, 0.78)?.boxed()
        + Rbf::new(v(0.18), 0.133 / ts)?.boxed())
}

/// Per-method, per-seed scores: standardised per-point ELL and MSE, ppm² MSE, summed ppm ELL.
#[derive(Clone, Copy)]
struct Scores {
    ell: f64,
    mse: f64,
    mse_ppm: f64,
    ell_sum_ppm: f64,
    seconds: f64,
}

fn score(
    post: &dyn Posterior,
    noise_var: f64,
    t: &Task,
    seconds: f64,
) -> Result<(Scores, Vec<f64>, Vec<f64>)> {
    let p = post.predict(&t.xte)?;
    let mean: Vec<f64> = p.mean.iter().cloned().collect();
    let var: Vec<f64> = p.var.iter().cloned().collect();
    let y: Vec<f64> = t.yte.iter().cloned().collect();
    let ell = fspace_metrics::gaussian_expected_log_likelihood(&mean, &var, noise_var, &y)?;
    let mse = fspace_metrics::mse(&mean, &y)?;
    // In ppm the density picks up −log y_std per point.
    let n = y.len() as f64;
    let ell_sum_ppm = n * (ell - t.y_std.ln());
    Ok((Scores { ell, mse, mse_ppm: mse * t.y_std * t.y_std, ell_sum_ppm, seconds }, mean, var))
}

/// `fsp-mauna-loa`.
pub fn run(opts: &Options) -> Result<()> {
    let mut run = Run::open(&opts.out, "fsp-mauna-loa", opts.resume)?;
    // FVI's step (20 function samples through the network, SSGE on 100 points) costs ≈ 75 ms
    // here against ≈ 5 ms for an FSP / MAP epoch, so it gets fewer steps.
    let (epochs, fvi_steps, seeds) =
        if opts.quick { (1500, 200, 1) } else { (10_000, 3000, opts.seeds.unwrap_or(5)) };
    let t = task()?;
    // A unit is one (seed, method) score; `forecasts.png` comes from the sitting that ran seed 0,
    // so seed 0's units are kept only once that figure exists (a sitting stopped inside seed 0
    // reruns all of it).
    let mut ck =
        Checkpoint::open(&mut run, json!({ "epochs": epochs, "fvi_steps": fvi_steps, "seed": opts.seed }))?;
    run.log(format!(
        "{} training months ({:.1}–{:.1}), {} test months; time std {:.2} years, CO₂ std {:.2} ppm; {epochs} epochs, {seeds} seed(s)",
        t.xtr.nrows(),
        t.xtr[(0, 0)] * t.t_std + t.t_mean,
        t.xtr[(t.xtr.nrows() - 1, 0)] * t.t_std + t.t_mean,
        t.xte.nrows(),
        t.t_std,
        t.y_std
    ));
    // The prior: R&W's kernel and the noise by marginal likelihood.
    let t0 = Instant::now();
    let ytr_m = DMatrix::from_column_slice(t.ytr.len(), 1, t.ytr.as_slice());
    let rep = fspace_gp::fit_hyperparameters(
        &rw_kernel(&t)?,
        &PriorMean::Zero,
        (0.19 / t.y_std).powi(2),
        &t.xtr,
        &ytr_m,
        &fspace_gp::FitConfig {
            seed: opts.seed,
            iterations: 300,
            learning_rate: 0.02,
            restarts: 1,
            ..Default::default()
        },
    )?;
    let (kernel, noise_var) = (rep.kernel, rep.noise_variance);
    let hyper: Map<String, Value> =
        kernel.param_names().into_iter().zip(kernel.params().into_iter().map(|p| json!(p.exp()))).collect();
    run.log(format!(
        "prior fitted in {:.1}s: noise σ = {:.4} ({:.3} ppm), hyperparameters {hyper:?}",
        t0.elapsed().as_secs_f64(),
        noise_var.sqrt(),
        noise_var.sqrt() * t.y_std
    ));
    let period = 1.0 / t.t_std;
    let bbox = BoundingBox::from_data(&t.xtr, 0.5)?;
    let features = FeatureMap::Periodic { column: 0, period };
    let net = |seed: u64| -> Result<Featurized<Mlp>> {
        Ok(Featurized::new(features.clone(), 1, tanh_mlp(3, &[50, 50], 1, seed)?)?)
    };
    // Evaluation grid for the figure: the whole window, in years.
    let grid_years: Vec<f64> = (0..=400).map(|i| 1974.0 + 51.0 * i as f64 / 400.0).collect();
    let grid =
        DMatrix::from_iterator(grid_years.len(), 1, grid_years.iter().map(|y| (y - t.t_mean) / t.t_std));

    let gp = ExactGp::fit(kernel.clone(), PriorMean::Zero, Noise::Homoscedastic(noise_var), &t.xtr, &ytr_m)?;
    let mut per: Vec<Vec<Scores>> = vec![Vec::new(); METHODS.len()];
    let mut panels: Vec<Panel1d> = Vec::new();
    let figure_done = run.path("forecasts.png").exists();
    for s in 0..seeds {
        let seed = opts.seed + s as u64;
        for (k, method) in METHODS.iter().enumerate() {
            if *method == "GP" && s > 0 {
                let first = per[k][0];
                per[k].push(first);
                continue;
            }
            let key = format!("seed {seed}/{method}");
            let stored = if s > 0 || figure_done { ck.get_array(&key)? } else { None };
            if let Some([ell, mse, mse_ppm, ell_sum_ppm, seconds]) = stored {
                run.log(format!("{key}: kept from checkpoint.json (--resume)"));
                per[k].push(Scores { ell, mse, mse_ppm, ell_sum_ppm, seconds });
                continue;
            }
            let tm = Instant::now();
            let post: Box<dyn Posterior> = match *method {
                "FSP-Laplace" => {
                    let cfg = FspConfig {
                        epochs,
                        batch_size: t.xtr.nrows(),
                        learning_rate: 1e-3,
                        seed,
                        n_context: 100,
                        design: ContextDesign::Grid,
                        n_laplace_context: 100,
                        context_box: Some(bbox.clone()),
                        ..Default::default()
                    };
                    let prior = GpPrior::centered(kernel.clone());
                    let lik = LikelihoodSpec::gaussian(noise_var.sqrt());
                    let Fitted { posterior: post, report: summary } = fsp_fit(
                        net(seed)?,
                        lik,
                        &prior,
                        &Data::new(&t.xtr, &super::targets(&t.ytr, 1))?,
                        &cfg,
                    )?;
                    run.log(format!(
                        "seed {seed}: FSP-Laplace trained {:.1}s, Laplace {:.1}s, rank {}",
                        summary.train_seconds,
                        summary.laplace_seconds,
                        post.report().rank
                    ));
                    Box::new(post)
                }
                "FVI" => {
                    let cfg = FviConfig {
                        n_uniform: 100,
                        n_batch: 0,
                        measurement_box: Some(bbox.clone()),
                        optim: OptimConfig {
                            learning_rate: 1e-3,
                            batch_size: t.xtr.nrows(),
                            max_steps: fvi_steps,
                            eval_every: fvi_steps,
                            patience: usize::MAX,
                            seed,
                        },
                        ..Default::default()
                    };
                    let prior = GpPrior::centered(kernel.clone());
                    let lik = LikelihoodSpec::gaussian(noise_var.sqrt());
                    Box::new(fit_fvi(net(seed)?, lik, &prior, &Data::new(&t.xtr, &ytr_m)?, &cfg)?.posterior)
                }
                "Laplace" => {
                    let mut map = net(seed)?;
                    let mut lik = Gaussian::new(noise_var.sqrt())?;
                    train_map(
                        &mut map,
                        &mut lik,
                        &t.xtr,
                        &t.ytr,
                        None,
                        None,
                        &TrainConfig {
                            epochs,
                            batch_size: t.xtr.nrows(),
                            learning_rate: 1e-3,
                            weight_decay: 1.0,
                            seed,
                            ..Default::default()
                        },
                        |_| {},
                    )?;
                    let mut post = laplace_fit(
                        map,
                        LikelihoodSpec::gaussian(noise_var.sqrt()),
                        &Data::new(&t.xtr, &super::targets(&t.ytr, 1))?,
                        &LaplaceConfig {
                            structure: Structure::full(),
                            prior_precision: PriorPrecision::Scalar(1.0),
                            predictive: Predictive::Glm,
                            ..Default::default()
                        },
                    )?
                    .posterior;
                    post.optimize_prior_precision(&MarglikConfig::default())?;
                    run.log(format!("seed {seed}: Laplace prior precision {:?}", post.prior_precision()));
                    Box::new(post)
                }
                _ => Box::new(gp.clone()),
            };
            let secs = tm.elapsed().as_secs_f64();
            let (sc, _, _) = score(post.as_ref(), noise_var, &t, secs)?;
            run.log(format!(
                "seed {seed}: {method}: ELL {:.3} / point (std units), Σ ELL {:.1} (ppm); MSE {:.4} (std units) = {:.2} ppm² ({secs:.1}s)",
                sc.ell, sc.ell_sum_ppm, sc.mse, sc.mse_ppm
            ));
            ck.put_numbers(&key, &[sc.ell, sc.mse, sc.mse_ppm, sc.ell_sum_ppm, sc.seconds])?;
            per[k].push(sc);
            if s == 0 {
                let p = post.predict(&grid)?;
                let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed);
                let samples = post.sample_functions(&grid, 5, &mut rng)?;
                let ppm = |v: f64| v * t.y_std + t.y_mean;
                let data: Vec<(f64, f64)> = t
                    .xtr
                    .iter()
                    .zip(t.ytr.iter())
                    .chain(t.xte.iter().zip(t.yte.iter()))
                    .map(|(&x, &y)| (x * t.t_std + t.t_mean, ppm(y)))
                    .collect();
                panels.push(Panel1d {
                    title: format!("{method} (test from {:.0})", t.xte[(0, 0)] * t.t_std + t.t_mean),
                    data,
                    x: grid_years.clone(),
                    mean: p.mean.iter().map(|&m| ppm(m)).collect(),
                    std: p.var.iter().map(|&v| v.max(0.0).sqrt() * t.y_std).collect(),
                    samples: samples.iter().map(|m| m.iter().map(|&v| ppm(v)).collect()).collect(),
                    context: vec![],
                });
            }
        }
        write_outputs(&mut run, &ck, &per, &hyper, noise_var, &t, (epochs, fvi_steps), s + 1, opts.quick)?;
        if s == 0 && panels.len() == METHODS.len() {
            // The figure shows the first seed; written now so a long run leaves it behind.
            regression_panels(&run.path("forecasts.png"), &panels, 2, (320.0, 440.0), ("year", "CO₂ (ppm)"))?;
            run.log("wrote forecasts.png (CO₂ in ppm against year; mean red, ±2σ of f green, 5 samples, data grey)");
        }
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn write_outputs(
    run: &mut Run,
    ck: &Checkpoint,
    per: &[Vec<Scores>],
    hyper: &Map<String, Value>,
    noise_var: f64,
    t: &Task,
    (epochs, fvi_steps): (usize, usize),
    seeds: usize,
    quick: bool,
) -> Result<()> {
    let cell = |v: Vec<f64>| pm_cell(mean_std(&v));
    let mut rows = Vec::new();
    let mut metrics = Map::new();
    for (k, method) in METHODS.iter().enumerate() {
        let col = |f: fn(&Scores) -> f64| per[k].iter().map(f).collect::<Vec<f64>>();
        rows.push(vec![
            method.to_string(),
            cell(col(|s| s.mse_ppm)),
            format!("{} ± {}", PAPER_MSE[k].0, PAPER_MSE[k].1),
            cell(col(|s| s.ell_sum_ppm)),
            format!("{} ± {}", PAPER_ELL[k].0, PAPER_ELL[k].1),
            cell(col(|s| s.mse)),
            cell(col(|s| s.ell)),
            cell(col(|s| s.seconds)),
        ]);
        metrics.insert(
            method.to_string(),
            json!({
                "mse_ppm2": col(|s| s.mse_ppm), "ell_sum_ppm": col(|s| s.ell_sum_ppm),
                "mse_std": col(|s| s.mse), "ell_std_per_point": col(|s| s.ell), "seconds": col(|s| s.seconds),
            }),
        );
    }
    metrics.insert("prior_hyperparameters".into(), Value::Object(hyper.clone()));
    metrics.insert("noise_std_ppm".into(), json!(noise_var.sqrt() * t.y_std));
    run.write_metrics(&Value::Object(metrics))?;
    let table = format!(
        "# fsp-mauna-loa (FSP-Laplace Table 1, Mauna Loa row){}\n\n\
NOAA GML monthly CO₂, 1974–2024: {} training months (first 70 %), {} test months; 2×50 tanh on (t, sin 2πt/T, cos 2πt/T), T = 1 year; \
R&W §5.4.3 kernel fitted by marginal likelihood (noise σ = {:.3} ppm, shared by every method); {epochs} full-batch Adam epochs (FVI: {fvi_steps} steps); {seeds} seed(s), mean ± std.\n\n{}\n\n\
MSE and Σ ELL in ppm² and ppm (the paper's numbers only make sense in these units — see the module docs); the last three columns \
in standardised units (per test point). {}.\n\nFigure: `forecasts.png` (Fig. C.9).\n",
        if quick { " — quick mode" } else { "" },
        t.xtr.nrows(),
        t.xte.nrows(),
        noise_var.sqrt() * t.y_std,
        markdown_table(
            &["method", "MSE (ppm²)", "paper MSE", "Σ ELL (ppm)", "paper ELL", "MSE (std)", "ELL/pt (std)", "seconds"],
            &rows
        ),
        ck.wall_time()
    );
    run.write_table(&table)
}
