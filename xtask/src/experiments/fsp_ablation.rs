//! `fsp-context-ablation` — FSP-Laplace Fig. C.7 and C.8: M ∈ {3, 5, 10, 100} context points
//! drawn uniformly per training step, 100 Halton points for the Laplace step, RBF and
//! Matérn-1/2 priors, on the sine toy and on two moons.
//!
//! Choices: the priors are fitted once per task as in `fsp-toy-regression` / `fsp-two-moons`;
//! fewer epochs than those experiments (4000 / 1000) to keep the default suite short.

use anyhow::Result;
use fspace_core::Data;
use fspace_core::Fitted;
use fspace_core::{LikelihoodSpec, Posterior};
use fspace_fsp_laplace::{fit, ContextDesign};
use fspace_kernels::GpPrior;
use fspace_kernels::{Kernel, Matern12, Rbf};
use rand::rngs::StdRng;
use rand::SeedableRng;
use serde::{Deserialize, Serialize};

use crate::harness::plot::{heatmaps, regression_panels, Heatmap, Panel1d};
use crate::harness::registry::Options;
use crate::harness::report::{fmt, markdown_table, Run};
use crate::protocols::moons::{fitted_priors, moons, moons_run, PAPER};
use crate::protocols::sine::{eval_sine, fit_sine_prior, sine_config};
use crate::protocols::{linspace, tanh_mlp};

const MS: [usize; 4] = [3, 5, 10, 100];

/// One sine-regression fit with M training context points (Fig. C.7).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RegressionMetrics {
    /// Mean W2 of the predictive marginals to the exact GP's.
    pub w2_to_gp: f64,
    /// Predictive std away from the data over the prior std.
    pub std_out_over_prior: f64,
    /// Mean predictive std on the data range.
    pub std_in: f64,
    /// RMSE of the mean on the data range.
    pub rmse_in: f64,
    /// Training plus Laplace seconds.
    pub seconds: f64,
}

/// One two-moons fit with M training context points (Fig. C.8).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MoonsMetrics {
    /// Test accuracy.
    pub accuracy: f64,
    /// Mean std of p(class 1) far from the data.
    pub far_std: f64,
    /// Mean std on the data.
    pub on_data_std: f64,
    /// Their ratio.
    pub far_over_on: f64,
    /// Training plus Laplace seconds.
    pub seconds: f64,
}

/// One entry of `metrics.json`: `regression_KERNEL_MM` or `two_moons_KERNEL_MM`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Entry {
    /// A sine-regression fit.
    Regression(RegressionMetrics),
    /// A two-moons fit.
    TwoMoons(MoonsMetrics),
}

/// `metrics.json`.
pub type Metrics = std::collections::BTreeMap<String, Entry>;

/// `fsp-context-ablation`: runs the experiment and writes its folder.
pub fn run(opts: &Options) -> Result<()> {
    let mut run = Run::new(&opts.out, "fsp-context-ablation")?;
    let (reg_epochs, cls_epochs) = if opts.quick { (800, 300) } else { (4000, 1000) };
    let bar = run.progress((MS.len() * 4) as u64, "runs");
    let (mut metrics, mut rows, mut panels, mut maps) = (Metrics::new(), Vec::new(), Vec::new(), Vec::new());

    // Regression (Fig. C.7).
    let data = fspace_data::sine(100, 0.1, &mut StdRng::seed_from_u64(opts.seed))?;
    let y = data.y_vec();
    let xt = linspace(-2.0, 2.0, 200);
    for (name, k) in [("rbf", Rbf::new(1.0, 0.3)?.boxed()), ("matern12", Matern12::new(1.0, 0.3)?.boxed())] {
        let (kernel, noise) = fit_sine_prior(&k, &data, opts.seed)?;
        let gp = crate::protocols::exact_gp(&kernel, noise, &data.x, &data.y)?;
        let prior = GpPrior::centered(kernel.clone());
        for m in MS {
            bar.set_message(format!("regression {name} M={m}"));
            let config = sine_config(100, reg_epochs, m, ContextDesign::Halton, opts.seed)?;
            let net = tanh_mlp(1, &[50, 50], 1, opts.seed)?;
            let Fitted { posterior: post, report: summary } = fit(
                net,
                LikelihoodSpec::gaussian(noise.sqrt()),
                &prior,
                &Data::new(&data.x, &crate::protocols::targets(&y, 1))?,
                &config,
            )?;
            let ev = eval_sine(&post, &gp, &kernel)?;
            let seconds = summary.train_seconds + summary.laplace_seconds;
            run.log(format!(
                "regression {name} M={m}: w2_to_gp {:.4}, std_out/prior {:.3}, rmse_in {:.4}, {seconds:.1}s",
                ev.w2_to_gp, ev.std_out_over_prior, ev.rmse_in
            ));
            metrics.insert(
                format!("regression_{name}_M{m}"),
                Entry::Regression(RegressionMetrics {
                    w2_to_gp: ev.w2_to_gp,
                    std_out_over_prior: ev.std_out_over_prior,
                    std_in: ev.std_in,
                    rmse_in: ev.rmse_in,
                    seconds,
                }),
            );
            rows.push(vec![
                "regression (Fig. C.7)".into(),
                name.into(),
                m.to_string(),
                format!(
                    "W2 to GP {}, std_out/prior {}, rmse_in {}",
                    fmt(ev.w2_to_gp),
                    fmt(ev.std_out_over_prior),
                    fmt(ev.rmse_in)
                ),
                format!("{seconds:.1}"),
            ]);
            let samples = post.sample_functions(&xt, 10, &mut StdRng::seed_from_u64(opts.seed + 1))?;
            panels.push(Panel1d {
                title: format!("{name}, M = {m}"),
                data: (0..100).map(|i| (data.x[(i, 0)], y[i])).collect(),
                x: ev.xs.clone(),
                mean: ev.mean.clone(),
                std: ev.std.clone(),
                samples: samples.iter().map(|s| s.column(0).iter().cloned().collect()).collect(),
                sample_label: "samples".into(),
                context: vec![],
                context_label: "context points".into(),
            });
            bar.inc(1);
        }
    }

    // Classification (Fig. C.8).
    let moons_data = moons(opts.seed)?;
    for (name, prior, _) in fitted_priors(&moons_data.0, &moons_data.1, opts.seed)? {
        for m in MS {
            bar.set_message(format!("two moons {name} M={m}"));
            let r = moons_run(&prior, &moons_data, m, ContextDesign::Halton, &PAPER, cls_epochs, opts.seed)?;
            let ratio = r.far_std / r.on_std;
            run.log(format!(
                "two moons {name} M={m}: accuracy {:.3}, std p1 far/on {ratio:.2}, {:.1}s",
                r.accuracy, r.seconds
            ));
            metrics.insert(
                format!("two_moons_{name}_M{m}"),
                Entry::TwoMoons(MoonsMetrics {
                    accuracy: r.accuracy,
                    far_std: r.far_std,
                    on_data_std: r.on_std,
                    far_over_on: ratio,
                    seconds: r.seconds,
                }),
            );
            rows.push(vec![
                "two moons (Fig. C.8)".into(),
                name.into(),
                m.to_string(),
                format!("accuracy {}, std p1 far/on {ratio:.2}", fmt(r.accuracy)),
                format!("{:.1}", r.seconds),
            ]);
            let axis = r.axis.clone();
            let points = (0..moons_data.0.nrows())
                .map(|i| (moons_data.0[(i, 0)], moons_data.0[(i, 1)], moons_data.1[i] as usize))
                .collect();
            maps.push(Heatmap {
                title: format!("{name}, M = {m}: mean p1"),
                xs: axis.clone(),
                ys: axis,
                values: r.mean,
                range: (0.0, 1.0),
                points,
                axes: ("x₁".into(), "x₂".into()),
            });
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    run.write_metrics(&metrics)?;
    regression_panels(&run.path("regression.png"), &panels, 4, (-3.0, 3.0), ("x", "y"))?;
    heatmaps(&run.path("two_moons.png"), &maps, 4)?;
    run.log("wrote regression.png and two_moons.png (rows: RBF, Matérn-1/2; columns: M = 3, 5, 10, 100)");
    run.write_table(&format!(
        "# fsp-context-ablation\n\nM context points per training step (uniform), 100 Halton points for the Laplace step; {reg_epochs} / {cls_epochs} full-batch epochs (regression / two moons), seed {}.\n\
The paper shows these runs as figures only (Fig. C.7, C.8: \"even with M = 3 or 5 the model produces useful uncertainty and reverts to the prior mean\").\n\n{}\n\nPlots: `regression.png`, `two_moons.png`.\n",
        opts.seed,
        markdown_table(&["task (paper figure)", "prior", "M", "results", "seconds"], &rows)
    ))?;
    Ok(())
}
