//! `valla-toy` — VaLLA Figs. 1, 6 and 7: a 1-D regression with a gap, a 2×50 tanh MLP, and
//! VaLLA, ELLA and the exact linearised Laplace (LLA, the full-GGN GLM predictive, exact at this
//! size) side by side.
//!
//! * Fig. 7: VaLLA with `M ∈ {5, 10, 20}` inducing points (k-means start, `Z` optimised) and
//!   ELLA with `M` Nyström points (`K = M`), both with LLA's hyperparameters (σ₀² = 1/λ* from
//!   the Laplace marginal likelihood, σ from the MAP fit); the W2 of each predictive of `f` to
//!   LLA's on a grid over `[−2, 2]`.
//! * Fig. 6: VaLLA learning σ₀² and σ itself (α = 1), with and without early stopping on a
//!   validation set (`M ∈ {5, 10}`).
//!
//! Data: Izmailov et al.'s (2020) fixed toy set is in no registry; we use the sine toy with a
//! gap (`x ~ U([−1, −0.5] ∪ [0.5, 1])`, `y = sin 2πx + N(0, 0.1²)`, 100 training and 40
//! validation points), which shows the same effect the figures are about: uncertainty in the
//! gap. MAP: full-batch Adam (lr 1e-3, 12 000 steps as App. E; `--quick`: 3 000) on the
//! Gaussian NLL with σ learned jointly and weight decay 1e-3·n. VaLLA: 30 000 steps for Fig. 7,
//! 20 000 for Fig. 6 (`--quick`: 2 000), Adam lr 1e-3, batch 100.

use std::time::Instant;

use anyhow::Result;
use fspace_core::Data;
use fspace_core::LikelihoodSpec;
use fspace_core::Schedule;
use fspace_core::{Gaussian, Posterior};
use fspace_laplace::{
    fit as laplace_fit, LaplaceConfig, MarglikConfig, Predictive, PriorPrecision, Structure,
};
use fspace_nn::{train_map, TrainConfig};
use fspace_valla::{ella, fit, EllaConfig, EllaPrior, FeatureRoute, VallaConfig};
use rand::rngs::StdRng;
use rand::SeedableRng;
use serde::{Deserialize, Serialize};

use crate::harness::checkpoint::or_nan;
use crate::harness::plot::{regression_panels, Panel1d};
use crate::harness::registry::Options;
use crate::harness::report::{fmt, markdown_table, Run};
use crate::protocols::{linspace, tanh_mlp};

/// The values of a 1-D matrix, ascending (inducing inputs for the plots and the log).
fn sorted(m: &nalgebra::DMatrix<f64>) -> Vec<f64> {
    let mut v: Vec<f64> = m.iter().cloned().collect();
    v.sort_by(f64::total_cmp);
    v
}

fn round2(v: &[f64]) -> Vec<f64> {
    v.iter().map(|x| (x * 100.0).round() / 100.0).collect()
}

/// One fit against the exact LLA.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Row {
    /// The method (VaLLA, ELLA, LLA).
    pub method: String,
    /// Inducing (VaLLA) or basis (ELLA) points.
    pub m: usize,
    /// Mean W2 of its predictive marginals to the exact LLA's.
    #[serde(rename = "w2_to_lla", deserialize_with = "or_nan")]
    pub w2: f64,
    /// Mean predictive std in the gap.
    #[serde(deserialize_with = "or_nan")]
    pub std_gap: f64,
    /// Mean predictive std on the data.
    #[serde(deserialize_with = "or_nan")]
    pub std_data: f64,
    /// The prior variance σ₀² it ended with.
    #[serde(rename = "prior_variance", deserialize_with = "or_nan")]
    pub prior_var: f64,
    /// The noise σ it ended with.
    #[serde(deserialize_with = "or_nan")]
    pub noise_std: f64,
    /// Optimiser iterations run (0: not iterative).
    pub iterations: usize,
    /// The iteration whose state was kept.
    pub best_iteration: usize,
    /// Wall seconds of the fit.
    pub seconds: f64,
}

/// `metrics.json`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Metrics {
    /// Every fit.
    pub rows: Vec<Row>,
    /// The exact LLA's prior precision (marginal likelihood).
    pub lla_prior_precision: f64,
    /// The MAP's learned noise σ.
    pub map_noise_std: f64,
    /// Whether this was the `--quick` budget.
    pub quick: bool,
}

/// `valla-toy`: the paper's budgets (or `--quick`'s).
pub fn run(opts: &Options) -> Result<()> {
    run_named(opts, opts.quick, "valla-toy")
}

/// `valla-toy-quick` (default suite): always the `--quick` budget.
pub fn run_quick(opts: &Options) -> Result<()> {
    run_named(opts, true, "valla-toy-quick")
}

fn run_named(opts: &Options, quick: bool, name: &str) -> Result<()> {
    let mut run = Run::new(&opts.out, name)?;
    let mut rng = StdRng::seed_from_u64(opts.seed);
    let train = fspace_data::sine(100, 0.1, &mut rng)?;
    let val = fspace_data::sine(40, 0.1, &mut rng)?;
    let (x, y) = (train.x.clone(), train.y_vec());
    let (xv, yv) = (val.x.clone(), val.y_vec());
    let map_steps = if quick { 3000 } else { 12_000 };
    let (fig7_steps, fig6_steps) = if quick { (2000, 2000) } else { (30_000, 20_000) };
    let mut net = tanh_mlp(1, &[50, 50], 1, opts.seed)?;
    let mut lik = Gaussian::new(0.3)?;
    let t0 = Instant::now();
    train_map(
        &mut net,
        &mut lik,
        &x,
        &y,
        None,
        None,
        &TrainConfig {
            schedule: Schedule::epochs(map_steps),
            batch_size: 100,
            learning_rate: 1e-3,
            weight_decay: 0.1,
            learn_likelihood: true,
            seed: opts.seed,
            ..Default::default()
        },
        |_| {},
    )?;
    let sigma = lik.sigma();
    run.log(format!(
        "MAP: 2×50 tanh ({} params), {map_steps} steps in {:.1}s, σ = {sigma:.4}",
        net.n_params(),
        t0.elapsed().as_secs_f64()
    ));

    // Exact LLA: full GGN, λ by the Laplace marginal likelihood.
    let t = Instant::now();
    let mut lla = laplace_fit(
        net.clone(),
        LikelihoodSpec::gaussian(sigma),
        &Data::new(&x, &crate::protocols::targets(&y, 1))?,
        &LaplaceConfig {
            structure: Structure::full(),
            prior_precision: PriorPrecision::Scalar(1.0),
            predictive: Predictive::Glm,
            ..Default::default()
        },
    )?
    .posterior;
    lla.optimize_prior_precision(&MarglikConfig::default())?;
    let lambda = lla.prior_precision()[0];
    let lla_secs = t.elapsed().as_secs_f64();
    let prior_var = 1.0 / lambda;
    run.log(format!(
        "LLA (full GGN): λ* = {lambda:.4} (σ₀² = {prior_var:.4}) by marginal likelihood, {lla_secs:.2}s"
    ));

    let xt = linspace(-2.0, 2.0, 200);
    let xs: Vec<f64> = xt.iter().cloned().collect();
    let lla_pred = lla.predict_glm(&xt)?;
    let lla_mean: Vec<f64> = lla_pred.mean.iter().cloned().collect();
    let lla_std: Vec<f64> = lla_pred.var.iter().map(|v| v.max(0.0).sqrt()).collect();
    let gap: Vec<usize> = (0..200).filter(|&i| xs[i].abs() < 0.5).collect();
    let data_region: Vec<usize> = (0..200).filter(|&i| (0.5..=1.0).contains(&xs[i].abs())).collect();
    let avg = |v: &[f64], idx: &[usize]| idx.iter().map(|&i| v[i]).sum::<f64>() / idx.len() as f64;
    let data_pts: Vec<(f64, f64)> = (0..100).map(|i| (x[(i, 0)], y[i])).collect();
    let lla_band = |mean: &[f64]| -> Vec<Vec<f64>> {
        vec![
            mean.iter().zip(&lla_std).map(|(m, s)| m + 2.0 * s).collect(),
            mean.iter().zip(&lla_std).map(|(m, s)| m - 2.0 * s).collect(),
        ]
    };
    let mut rows = vec![Row {
        method: "LLA (full GGN, exact)".into(),
        m: 100,
        w2: 0.0,
        std_gap: avg(&lla_std, &gap),
        std_data: avg(&lla_std, &data_region),
        prior_var,
        noise_std: sigma,
        iterations: 0,
        best_iteration: 0,
        seconds: lla_secs,
    }];
    let mut fig7 = Vec::new();
    let mut fig6 = Vec::new();
    let evaluate = |post: &dyn Posterior| -> Result<(Vec<f64>, Vec<f64>, f64)> {
        let p = post.predict(&xt)?;
        let mean: Vec<f64> = p.mean.iter().cloned().collect();
        let std: Vec<f64> = p.var.iter().map(|v| v.max(0.0).sqrt()).collect();
        let w2 = fspace_metrics::mean_w2(&mean, &std, &lla_mean, &lla_std)?;
        Ok((mean, std, w2))
    };
    // Fig. 7: LLA's hyperparameters, VaLLA and ELLA against M.
    let ms = [5usize, 10, 20];
    let mut ella_panels = Vec::new();
    for &m in &ms {
        let config = VallaConfig {
            num_inducing: m,
            // No early stopping, the last state kept (validation only records the history).
            schedule: Schedule::steps(fig7_steps).every_steps(500).keep_last(),
            prior_variance: prior_var,
            learn_prior_variance: false,
            seed: opts.seed,
            ..VallaConfig::default()
        };
        // The k-means start (fit draws the same), to report how far Z moved.
        let initial = fspace_gp::kmeans(&x, m, config.kmeans_iterations, config.seed)?;
        let post = fit(
            net.clone(),
            LikelihoodSpec::gaussian(sigma),
            &Data::new(&x, &crate::protocols::targets(&y, 1))?,
            &config,
        )?
        .posterior;
        let (mean, std, w2) = evaluate(&post)?;
        let rep = post.report();
        run.log(format!("VaLLA M = {m} (LLA hyperparameters): W2 to LLA {w2:.4}, {} iterations in {:.2}s ({:.3} ms/iteration)", rep.iterations, rep.seconds, rep.seconds * 1e3 / rep.iterations as f64));
        rows.push(Row {
            method: "VaLLA (LLA hyperparameters)".into(),
            m,
            w2,
            std_gap: avg(&std, &gap),
            std_data: avg(&std, &data_region),
            prior_var,
            noise_std: sigma,
            iterations: rep.iterations,
            best_iteration: rep.best_iteration,
            seconds: rep.seconds,
        });
        let context = sorted(&post.state().z);
        let init = sorted(&initial);
        let moved = init.iter().zip(&context).map(|(a, b)| (a - b).abs()).fold(0.0f64, f64::max);
        run.log(format!(
            "  Z (sorted) k-means start {:?} → optimised {:?} (max move {moved:.3})",
            round2(&init),
            round2(&context)
        ));
        fig7.push(Panel1d {
            title: format!("VaLLA M = {m}"),
            data: data_pts.clone(),
            x: xs.clone(),
            samples: lla_band(&mean),
            sample_label: "exact LLA ±2σ".into(),
            mean,
            std,
            context,
            context_label: "optimised inducing inputs Z".into(),
        });
        let t = Instant::now();
        let ella = ella::fit(
            net.clone(),
            LikelihoodSpec::gaussian(sigma),
            &Data::new(&x, &crate::protocols::targets(&y, 1))?,
            &EllaConfig {
                num_points: m,
                num_eigen: m,
                prior: EllaPrior::Fixed(lambda),
                seed: opts.seed,
                route: FeatureRoute::Auto,
                // The toy compares ELLA's Nyström posterior with LLA's at LLA's
                // hyperparameters on all the data (no validation set).
                early_stopping: None,
            },
        )?
        .posterior;
        let secs = t.elapsed().as_secs_f64();
        let (mean, std, w2) = evaluate(&ella)?;
        run.log(format!("ELLA M = K = {m}: W2 to LLA {w2:.4}, {:.1} ms", secs * 1e3));
        rows.push(Row {
            method: "ELLA (LLA hyperparameters)".into(),
            m,
            w2,
            std_gap: avg(&std, &gap),
            std_data: avg(&std, &data_region),
            prior_var,
            noise_std: sigma,
            iterations: 0,
            best_iteration: 0,
            seconds: secs,
        });
        ella_panels.push(Panel1d {
            title: format!("ELLA M = K = {m}"),
            data: data_pts.clone(),
            x: xs.clone(),
            samples: lla_band(&mean),
            sample_label: "exact LLA ±2σ".into(),
            mean,
            std,
            context: vec![],
            context_label: "context points".into(),
        });
    }
    fig7.extend(ella_panels);
    // Fig. 6: hyperparameters learned by VaLLA, with and without early stopping.
    for &m in &[5usize, 10] {
        for early in [true, false] {
            let config = VallaConfig {
                num_inducing: m,
                // With early stopping App. D's patience (the best state restored); without, the
                // last state.
                schedule: if early {
                    Schedule::steps(fig6_steps).every_steps(100).patience(1)
                } else {
                    Schedule::steps(fig6_steps).every_steps(100).keep_last()
                },
                prior_variance: prior_var,
                seed: opts.seed,
                ..VallaConfig::default()
            };
            let (ym, yvm) = (crate::protocols::targets(&y, 1), crate::protocols::targets(&yv, 1));
            let data = Data::new(&x, &ym)?.with_validation(&xv, &yvm)?;
            let post = fit(net.clone(), LikelihoodSpec::gaussian_learned(sigma), &data, &config)?.posterior;
            let (mean, std, w2) = evaluate(&post)?;
            let rep = post.report();
            let (pv, ns) = (post.state().prior_variance(), post.state().noise_variance().sqrt());
            let label =
                if early { "VaLLA learned, early stopping" } else { "VaLLA learned, no early stopping" };
            run.log(format!(
                "{label} M = {m}: σ₀² {pv:.4}, σ {ns:.4}, W2 to LLA {w2:.4}, best iteration {} of {}",
                rep.best_iteration, rep.iterations
            ));
            rows.push(Row {
                method: label.into(),
                m,
                w2,
                std_gap: avg(&std, &gap),
                std_data: avg(&std, &data_region),
                prior_var: pv,
                noise_std: ns,
                iterations: rep.iterations,
                best_iteration: rep.best_iteration,
                seconds: rep.seconds,
            });
            let context = sorted(&post.state().z);
            fig6.push(Panel1d {
                title: format!("{} M = {m}: σ₀² = {pv:.3}", if early { "Val" } else { "No-Val" }),
                data: data_pts.clone(),
                x: xs.clone(),
                samples: lla_band(&mean),
                sample_label: "exact LLA ±2σ".into(),
                mean,
                std,
                context,
                context_label: "optimised inducing inputs Z".into(),
            });
        }
    }
    let mut table_rows = Vec::new();
    for r in &rows {
        table_rows.push(vec![
            r.method.clone(),
            r.m.to_string(),
            fmt(r.w2),
            fmt(r.std_gap),
            fmt(r.std_data),
            fmt(r.prior_var),
            fmt(r.noise_std),
            if r.iterations > 0 { format!("{} / {}", r.best_iteration, r.iterations) } else { "–".into() },
            format!("{:.2}", r.seconds),
        ]);
    }
    run.write_metrics(&Metrics { rows, lla_prior_precision: lambda, map_noise_std: sigma, quick })?;
    regression_panels(&run.path("fig7_inducing.png"), &fig7, 3, (-2.5, 2.5), ("x", "y"))?;
    regression_panels(&run.path("fig6_early_stopping.png"), &fig6, 2, (-2.5, 2.5), ("x", "y"))?;
    run.log("wrote fig7_inducing.png (VaLLA row 1, ELLA row 2) and fig6_early_stopping.png; thin lines: LLA's ±2σ around each mean");
    let table = format!(
        "# {name}\n\nVaLLA Figs. 1, 6, 7 on the sine toy with a gap (Izmailov et al.'s set is in no registry; see the module docs), 2×50 tanh MLP, seed {}{}. \
The paper shows figures only; its claims: (Fig. 7) VaLLA approaches LLA as M grows, faster than ELLA, VaLLA over-estimating and ELLA under-estimating the variance; (Fig. 6) learning σ₀² without early stopping shrinks the uncertainty in the gap, early stopping prevents it.\n\n\
W2 is the mean pointwise 2-Wasserstein distance of the predictive of f to LLA's on 200 points over [−2, 2]; `std gap` the mean std on |x| < 0.5, `std data` on 0.5 ≤ |x| ≤ 1. \
LLA: λ* = {} (σ₀² = {}) by the Laplace marginal likelihood, σ = {} from the MAP fit.\n\n{}\n\
\"–\": LLA and ELLA are closed-form fits with no iterations.\n\n\
Plots: `fig7_inducing.png` (VaLLA M = 5, 10, 20 with optimised Z as ticks; ELLA below), `fig6_early_stopping.png`.\n",
        opts.seed,
        if quick { " (--quick: 3 000 MAP steps, 2 000 VaLLA steps — a smoke run, not the paper's budget)" } else { "" },
        fmt(lambda),
        fmt(prior_var),
        fmt(sigma),
        markdown_table(&["method", "M", "W2 to LLA", "std gap", "std data", "σ₀²", "σ", "best / iterations", "seconds"], &table_rows),
    );
    run.write_table(&table)?;
    Ok(())
}
