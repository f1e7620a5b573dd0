//! GFSVI's remaining toy figures on the sine data of `gfsvi-toy` (App. A.2.1), each against the
//! exact GP of the same prior, scored by the mean per-point W2 on 100 points over [−2, 2]:
//!
//! * `gfsvi-activations` — Fig. 3: "small models are prone to underfitting for smooth priors
//!   (RBF), and to collapsing uncertainty for rough priors (Matérn-1/2)" with ReLU, where tanh
//!   suffices. Networks: ReLU 2×30 (small), ReLU 2×100 (large), tanh 2×30 (App. A.2.1: the small
//!   BNN is the default 2×30, the large one has 100 units per layer). Priors fitted as in
//!   `gfsvi-toy`.
//! * `gfsvi-lengthscale` — Fig. 6: GFSVI follows the prior's lengthscale. RBF priors of variance
//!   1 and lengthscale ℓ ∈ {0.1, 0.3, 1} with the data's noise variance 0.01, nothing fitted
//!   (the paper does not list its ℓ values; these span rough to smooth on [−2, 2]). Besides W2,
//!   the roughness of the posterior samples (mean squared second difference) against the GP's.
//! * `gfsvi-gamma` — Fig. 10: GFSVI with γ ∈ {1e-10, 1e-5, 1e-2, 1} (RBF, fitted prior); Fig. 12:
//!   the value of `D̂_KL^γ` of one fitted posterior (γ = 1e-10) re-evaluated over
//!   γ ∈ {1e-15 … 1} and M ∈ {10, 50, 100, 500} uniform measurement points, RBF and Matérn-1/2.
//!
//! Budgets are `gfsvi-toy`'s: 5 000 Adam steps at lr 3e-3 and M = 500 (`--quick`: 1 500 at 1e-2,
//! M = 100), σ_y learned from 0.5, full batch.

use std::time::Instant;

use anyhow::Result;
use fspace_context::Sampler;
use fspace_core::{Data, Posterior};
use fspace_gfsvi::{fit, objective, KlPrior, VariationalParams};
use fspace_kernels::{Matern12, Rbf};
use fspace_nn::{Activation, Mlp, MlpConfig};
use rand::rngs::StdRng;
use rand::SeedableRng;
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::json;
use std::path::PathBuf;

use crate::harness::checkpoint::{Checkpoint, Timed};
use crate::harness::plot::{line_panels, regression_panels, LinePanel, Panel1d};
use crate::harness::publish::read_metrics;
use crate::harness::registry::Options;
use crate::harness::report::{fmt, markdown_table, Run};
use crate::protocols::linspace;
use crate::protocols::sine::{case_with, gfsvi_config, gp_case, roughness, w2_panel, GpCase, TOY_LIKELIHOOD};

/// Steps, learning rate and measurement points of one run mode (`gfsvi-toy`'s).
struct Budget {
    steps: usize,
    learning_rate: f64,
    m: usize,
}

const FULL: Budget = Budget { steps: 5000, learning_rate: 3e-3, m: 500 };
const QUICK: Budget = Budget { steps: 1500, learning_rate: 1e-2, m: 100 };

fn budget(opts: &Options) -> &'static Budget {
    if opts.quick {
        &QUICK
    } else {
        &FULL
    }
}

fn mlp(activation: Activation, width: usize, seed: u64) -> Result<Mlp> {
    Ok(Mlp::new(MlpConfig { input_dim: 1, hidden: vec![width, width], output_dim: 1, activation, seed })?)
}

/// One GFSVI fit on `case` with γ: the fitted posterior's panel, W2 to the GP, steps, seconds.
struct Fit {
    posterior: fspace_gfsvi::LinearizedPosterior<Mlp>,
    panel: Panel1d,
    w2: f64,
    steps: usize,
    seconds: f64,
}

fn fit_gfsvi(net: Mlp, case: &GpCase, b: &Budget, gamma: f64, title: String, seed: u64) -> Result<Fit> {
    let t = Instant::now();
    let cfg = fspace_gfsvi::GfsviConfig { gamma, ..gfsvi_config(b.steps, b.learning_rate, b.m, seed)? };
    let f = fit(
        net,
        TOY_LIKELIHOOD,
        &KlPrior::Gp(case.prior.clone()),
        &Data::new(&case.data.x, &case.data.y)?,
        &cfg,
    )?;
    let seconds = t.elapsed().as_secs_f64();
    let (panel, w2) = w2_panel(&f.posterior, &case.gp_samples, title, &case.points, seed)?;
    Ok(Fit { posterior: f.posterior, panel, w2, steps: f.report.steps, seconds })
}

fn gp_panel(case: &GpCase, label: &str, seed: u64) -> Result<Panel1d> {
    Ok(w2_panel(&case.gp, &case.gp_samples, format!("exact GP, {label}"), &case.points, seed + 1)?.0)
}

fn header(run: &mut Run, b: &Budget) {
    run.log(format!(
        "{} Adam steps (lr {}), M = {} measurement points on [−2, 2], σ_y learned from 0.5",
        b.steps, b.learning_rate, b.m
    ));
}

fn quick_note(opts: &Options) -> &'static str {
    if opts.quick {
        " (--quick: 1 500 steps, M = 100 — a smoke run, not the paper's budget)"
    } else {
        ""
    }
}

/// `gfsvi-activations`: one network under one prior.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ActivationFit {
    /// Mean per-point W2 of its samples to the exact GP's.
    pub w2: f64,
    /// The learned noise σ.
    pub noise_std: f64,
    /// Wall seconds of the fit.
    pub seconds: f64,
}

/// `gfsvi-activations`' `metrics.json`: the scores per `"prior/architecture"` and the figure's
/// panels in its order (rows RBF, Matérn-1/2; columns the three networks and the exact GP), so
/// that `cargo xtask redraw gfsvi-activations` redraws `activations.png` without refitting.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ActivationMetrics {
    /// Scores per `"prior/architecture"`.
    pub fits: BTreeMap<String, ActivationFit>,
    /// The panels of `activations.png`, row by row.
    pub panels: Vec<Panel1d>,
}

/// One finished (prior, network) fit of `gfsvi-activations` in its `checkpoint.json`: what its
/// row and its panel need.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct ActivationUnit {
    w2: f64,
    noise_std: f64,
    steps: usize,
    panel: Panel1d,
}

/// The networks of Fig. 3 (label, activation, width of both hidden layers).
const ACTIVATION_ARCHS: [(&str, Activation, usize); 3] = [
    ("ReLU 2×30", Activation::Relu, 30),
    ("ReLU 2×100", Activation::Relu, 100),
    ("tanh 2×30", Activation::Tanh, 30),
];

/// Columns of `activations.png`: the networks, then the exact GP.
const ACTIVATION_COLS: usize = ACTIVATION_ARCHS.len() + 1;

fn draw_activations(path: &std::path::Path, panels: &[Panel1d]) -> Result<()> {
    regression_panels(path, panels, ACTIVATION_COLS, (-3.0, 3.0), ("x", "y"))
}

/// `gfsvi-activations` (Fig. 3). Each (prior, network) fit is a unit of `checkpoint.json`, so
/// `--resume` continues an interrupted run.
pub fn run_activations(opts: &Options) -> Result<()> {
    let name = "gfsvi-activations";
    let mut run = Run::open(&opts.out, name, opts.resume)?;
    let (b, seed) = (budget(opts), opts.seed);
    let mut ck = Checkpoint::<Timed<ActivationUnit>>::open(
        &mut run,
        &json!({ "steps": b.steps, "learning_rate": b.learning_rate, "m": b.m, "seed": seed, "gamma": 1e-10 }),
    )?;
    header(&mut run, b);
    let cases: [(&str, GpCase); 2] = [
        ("RBF", gp_case(Rbf::new(1.0, 0.3)?, 0.1, seed)?),
        ("Matérn-1/2", gp_case(Matern12::new(1.0, 0.3)?, 0.1, seed)?),
    ];
    let (mut rows, mut panels) = (Vec::new(), Vec::new());
    let mut fits = BTreeMap::new();
    for (prior, case) in &cases {
        for (arch, activation, width) in ACTIVATION_ARCHS {
            let key = format!("{prior}/{arch}");
            let unit = ck.unit(&mut run, &key, |run| {
                let f = fit_gfsvi(
                    mlp(activation, width, seed)?,
                    case,
                    b,
                    1e-10,
                    format!("GFSVI {arch}, {prior}"),
                    seed,
                )?;
                let noise_std = f.posterior.noise_std();
                run.log(format!(
                    "{prior} {arch}: W2 to GP {:.4}, σ_y {noise_std:.3}, {:.1} s",
                    f.w2, f.seconds
                ));
                Ok(ActivationUnit { w2: f.w2, noise_std, steps: f.steps, panel: f.panel })
            })?;
            let Timed { seconds, value: u } = unit;
            rows.push(vec![
                prior.to_string(),
                arch.to_string(),
                fmt(u.w2),
                fmt(u.noise_std),
                u.steps.to_string(),
                format!("{seconds:.1}"),
            ]);
            fits.insert(key, ActivationFit { w2: u.w2, noise_std: u.noise_std, seconds });
            panels.push(u.panel);
        }
        panels.push(gp_panel(case, prior, seed)?);
    }
    draw_activations(&run.path("activations.png"), &panels)?;
    let verdict = |prior: &str| {
        let (relu, tanh) = (fits[&format!("{prior}/ReLU 2×30")].w2, fits[&format!("{prior}/tanh 2×30")].w2);
        format!(
            "{prior}: tanh 2×30 {} vs ReLU 2×30 {} — **{}**",
            fmt(tanh),
            fmt(relu),
            if tanh < relu { "holds" } else { "differs" }
        )
    };
    run.write_table(&format!(
        "# {name}: GFSVI Fig. 3 — network inductive bias against the prior{}\n\n\
         Sine toy (App. A.2.1), seed {seed}; W2 is the mean per-point 2-Wasserstein distance to the exact GP's posterior \
         on 100 points over [−2, 2]. The paper's claim: with ReLU, small networks underfit smooth priors and collapse \
         the uncertainty of rough ones; tanh 2×30 suffices. Checked as \"tanh 2×30 is closer to the GP than ReLU 2×30\":\n\n\
         - {}\n- {}\n\n{}\nFigure: `activations.png` (rows: RBF, Matérn-1/2; columns: ReLU 2×30, ReLU 2×100, tanh 2×30, exact GP).\n\n{}.\n",
        quick_note(opts),
        verdict("RBF"),
        verdict("Matérn-1/2"),
        markdown_table(&["prior", "network", "W2 to GP", "σ_y", "steps", "seconds"], &rows),
        ck.wall_time(),
    ))?;
    run.write_metrics(&ActivationMetrics { fits, panels })
}

/// `cargo xtask redraw gfsvi-activations`: `activations.png` of the finished run in `dir` from
/// the panels its `metrics.json` stores (nothing is refitted); returns the files written.
pub fn redraw_activations(dir: &std::path::Path) -> Result<Vec<PathBuf>> {
    let metrics: ActivationMetrics = read_metrics(dir, "gfsvi-activations")?;
    if metrics.panels.is_empty() || !metrics.panels.len().is_multiple_of(ACTIVATION_COLS) {
        anyhow::bail!(
            "{} holds {} panels; gfsvi-activations draws rows of {ACTIVATION_COLS}",
            dir.join("metrics.json").display(),
            metrics.panels.len()
        );
    }
    let png = dir.join("activations.png");
    draw_activations(&png, &metrics.panels)?;
    Ok(vec![png])
}

/// `gfsvi-lengthscale`: one prior lengthscale.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LengthscaleFit {
    /// Mean per-point W2 of its samples to the exact GP's.
    pub w2: f64,
    /// Mean squared second difference of its samples.
    pub roughness: f64,
    /// The same for the exact GP's samples.
    pub gp_roughness: f64,
    /// Wall seconds of the fit.
    pub seconds: f64,
}

/// `gfsvi-lengthscale`'s `metrics.json`: per lengthscale label.
pub type LengthscaleMetrics = BTreeMap<String, LengthscaleFit>;

/// `gfsvi-gamma`: one fit at one γ (Fig. 10).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct GammaFit {
    /// Mean per-point W2 of its samples to the exact GP's.
    pub w2: f64,
    /// Mean predictive std outside the data.
    pub std_outside: f64,
    /// Wall seconds of the fit.
    pub seconds: f64,
}

/// One entry of `gfsvi-gamma`'s `metrics.json`: `fit/γ=G` a fit, `kl/PRIOR/M=M/γ=G` the
/// regularised divergence of a fit at that γ and M (Fig. 12).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(untagged)]
pub enum GammaEntry {
    /// A fit.
    Fit(GammaFit),
    /// D_KL^γ in nats.
    Divergence(f64),
}

/// `gfsvi-gamma`'s `metrics.json`.
pub type GammaMetrics = BTreeMap<String, GammaEntry>;

/// `gfsvi-lengthscale` (Fig. 6).
pub fn run_lengthscale(opts: &Options) -> Result<()> {
    let name = "gfsvi-lengthscale";
    let mut run = Run::new(&opts.out, name)?;
    let (b, seed) = (budget(opts), opts.seed);
    header(&mut run, b);
    let data = fspace_data::sine(100, 0.1, &mut StdRng::seed_from_u64(seed))?;
    let xt = linspace(-2.0, 2.0, 100);
    let (mut rows, mut panels, mut metrics) = (Vec::new(), Vec::new(), LengthscaleMetrics::new());
    let mut rough = Vec::new();
    for ell in [0.1, 0.3, 1.0] {
        let case = case_with(Rbf::new(1.0, ell)?, 0.01, data.clone(), seed)?;
        let label = format!("RBF ℓ = {ell}");
        let net = mlp(Activation::Tanh, 30, seed)?;
        let f = fit_gfsvi(net, &case, b, 1e-10, format!("GFSVI, {label}"), seed)?;
        let samples = f.posterior.sample_functions(&xt, 100, &mut StdRng::seed_from_u64(seed + 3))?;
        let (r, r_gp) = (roughness(&samples), roughness(&case.gp_samples[..100]));
        run.log(format!(
            "{label}: W2 to GP {:.4}, roughness {r:.3e} (GP {r_gp:.3e}), {:.1} s",
            f.w2, f.seconds
        ));
        rows.push(vec![
            label.clone(),
            fmt(f.w2),
            fmt(r),
            fmt(r_gp),
            f.steps.to_string(),
            format!("{:.1}", f.seconds),
        ]);
        metrics.insert(
            label.clone(),
            LengthscaleFit { w2: f.w2, roughness: r, gp_roughness: r_gp, seconds: f.seconds },
        );
        rough.push(r);
        panels.push(f.panel);
        panels.push(gp_panel(&case, &label, seed)?);
    }
    regression_panels(&run.path("lengthscale.png"), &panels, 2, (-3.0, 3.0), ("x", "y"))?;
    let falls = rough.windows(2).all(|w| w[1] < w[0]);
    run.write_table(&format!(
        "# {name}: GFSVI Fig. 6 — the prior's lengthscale{}\n\n\
         Sine toy, seed {seed}; RBF priors of variance 1 and lengthscale ℓ (the paper does not list its values), noise \
         variance 0.01, nothing fitted; 2×30 tanh. Roughness: mean squared second difference of 100 posterior samples on \
         100 points over [−2, 2] (the GP's from its own samples). The paper's claim: GFSVI adapts to the function \
         variability the lengthscale specifies — checked as \"GFSVI's roughness falls as ℓ grows, as the GP's\": **{}**.\n\n{}\n\
         Figure: `lengthscale.png` (rows: ℓ = 0.1, 0.3, 1; left GFSVI, right the exact GP).\n",
        quick_note(opts),
        if falls { "holds" } else { "differs" },
        markdown_table(&["prior", "W2 to GP", "roughness", "GP roughness", "steps", "seconds"], &rows),
    ))?;
    run.write_metrics(&metrics)
}

/// `D̂_KL^γ` of `post` (mean and variances of its weights) at `m` uniform points on [−2, 2].
fn divergence_at(
    post: &fspace_gfsvi::LinearizedPosterior<Mlp>,
    case: &GpCase,
    m: usize,
    gamma: f64,
    seed: u64,
) -> Result<f64> {
    let mut net = post.network().clone();
    let params = VariationalParams {
        mean: net.params(),
        log_std: post.variances().map(|v| 0.5 * v.ln()),
        log_noise_std: post.noise_std().ln(),
    };
    let xm = fspace_context::UniformSampler::new(fspace_context::BoundingBox::cube(1, -2.0, 2.0)?)
        .sample(m, &mut StdRng::seed_from_u64(seed))?;
    let (x, y) = (&case.data.x, &case.data.y);
    Ok(objective(&mut net, &params, &KlPrior::Gp(case.prior.clone()), x, y, x.nrows(), &xm, gamma)?
        .divergence)
}

/// `gfsvi-gamma` (Figs. 10 and 12).
pub fn run_gamma(opts: &Options) -> Result<()> {
    let name = "gfsvi-gamma";
    let mut run = Run::new(&opts.out, name)?;
    let (b, seed) = (budget(opts), opts.seed);
    header(&mut run, b);
    let rbf = gp_case(Rbf::new(1.0, 0.3)?, 0.1, seed)?;
    let m12 = gp_case(Matern12::new(1.0, 0.3)?, 0.1, seed)?;
    let xt = linspace(-2.0, 2.0, 100);
    let outside: Vec<usize> = (0..100).filter(|&i| xt[(i, 0)].abs() >= 1.2).collect();
    let (mut rows, mut panels, mut metrics) = (Vec::new(), Vec::new(), GammaMetrics::new());
    let mut fitted = Vec::new();
    for gamma in [1e-10, 1e-5, 1e-2, 1.0] {
        let f = fit_gfsvi(
            mlp(Activation::Tanh, 30, seed)?,
            &rbf,
            b,
            gamma,
            format!("GFSVI, RBF, γ = {gamma:e}"),
            seed,
        )?;
        let std = f.posterior.predict(&xt)?.var.map(|v| v.max(0.0).sqrt());
        let std_out = outside.iter().map(|&i| std[(i, 0)]).sum::<f64>() / outside.len() as f64;
        run.log(format!(
            "γ = {gamma:e}: W2 to GP {:.4}, std |x| ≥ 1.2 {std_out:.3}, {:.1} s",
            f.w2, f.seconds
        ));
        rows.push(vec![
            format!("{gamma:e}"),
            fmt(f.w2),
            fmt(std_out),
            fmt(f.posterior.noise_std()),
            format!("{:.1}", f.seconds),
        ]);
        metrics.insert(
            format!("fit/γ={gamma:e}"),
            GammaEntry::Fit(GammaFit { w2: f.w2, std_outside: std_out, seconds: f.seconds }),
        );
        panels.push(f.panel.clone());
        fitted.push(f);
    }
    panels.push(gp_panel(&rbf, "RBF", seed)?);
    regression_panels(&run.path("gamma_fits.png"), &panels, 3, (-3.0, 3.0), ("x", "y"))?;
    let gp_out = {
        let g = rbf.gp.predict(&xt)?.var.map(|v| v.max(0.0).sqrt());
        outside.iter().map(|&i| g[(i, 0)]).sum::<f64>() / outside.len() as f64
    };

    // Fig. 12: D̂_KL^γ of the γ = 1e-10 fits over γ and M.
    let gammas = [1e-15, 1e-12, 1e-10, 1e-8, 1e-6, 1e-4, 1e-2, 1.0];
    let ms = [10, 50, 100, 500];
    let mut kl_panels = Vec::new();
    let m12_fit =
        fit_gfsvi(mlp(Activation::Tanh, 30, seed)?, &m12, b, 1e-10, "GFSVI, Matérn-1/2".into(), seed)?;
    let mut kl_rows = Vec::new();
    // Fig. 12's claim: D_KL^γ falls as γ grows (for every prior and M).
    let mut monotone = true;
    for (prior, case, post) in [("RBF", &rbf, &fitted[0].posterior), ("Matérn-1/2", &m12, &m12_fit.posterior)]
    {
        let mut series = Vec::new();
        for &m in &ms {
            let mut pts = Vec::new();
            for &g in &gammas {
                let d = divergence_at(post, case, m, g, seed + 11)?;
                metrics.insert(format!("kl/{prior}/M={m}/γ={g:e}"), GammaEntry::Divergence(d));
                pts.push((g, d));
            }
            monotone &= pts.windows(2).all(|w| w[1].1 <= w[0].1);
            kl_rows.push(
                std::iter::once(format!("{prior}, M = {m}"))
                    .chain(pts.iter().map(|&(_, d)| fmt(d)))
                    .collect::<Vec<_>>(),
            );
            // The divergences span five decades: plotted as log10.
            series.push((format!("M = {m}"), pts.iter().map(|&(g, d)| (g, d.max(1e-300).log10())).collect()));
        }
        kl_panels.push(LinePanel {
            title: format!("D_KL^γ of the γ = 1e-10 GFSVI fit, {prior}"),
            labels: ("γ (log scale)".into(), "log10 D_KL^γ (nats)".into()),
            series,
            log_x: true,
        });
    }
    line_panels(&run.path("kl_vs_gamma.png"), &kl_panels, 2)?;
    let kl_header: Vec<String> =
        std::iter::once("prior, M".to_string()).chain(gammas.iter().map(|g| format!("γ = {g:e}"))).collect();
    let kl_header: Vec<&str> = kl_header.iter().map(String::as_str).collect();
    run.write_table(&format!(
        "# {name}: GFSVI Figs. 10 and 12 — the regulariser γ{}\n\n\
         Sine toy, seed {seed}, 2×30 tanh. Fig. 10: GFSVI fitted with each γ (RBF prior fitted by marginal likelihood); \
         `std out` is the mean predictive std of f on |x| ≥ 1.2 (the exact GP's: {}). The paper: γ should be small \
         enough to regularise strongly.\n\n{}\n\
         Fig. 12: `D̂_KL^γ` (nats) of the γ = 1e-10 fit re-evaluated at each γ and number M of uniform measurement \
         points. The paper: γ controls the magnitude of the divergence, and rougher priors need more points for a \
         stable estimate. \"D_KL^γ falls as γ grows at every M and prior\": **{}**.\n\n{}\n\
         Figures: `gamma_fits.png` (Fig. 10, with the exact GP last), `kl_vs_gamma.png` (Fig. 12).\n",
        quick_note(opts),
        fmt(gp_out),
        markdown_table(&["γ", "W2 to GP", "std out", "σ_y", "seconds"], &rows),
        if monotone { "holds" } else { "differs" },
        markdown_table(&kl_header, &kl_rows),
    ))?;
    run.write_metrics(&metrics)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn activations_redraws_from_the_panels_its_metrics_store_and_refuses_a_partial_row() {
        // The exact GP's panels stand in for the fits: what matters is that panels survive
        // metrics.json (the JSON round trip is exact) and that redraw draws them.
        let case = gp_case(Rbf::new(1.0, 0.3).unwrap(), 0.1, 0).unwrap();
        let panels: Vec<Panel1d> =
            (0..2 * ACTIVATION_COLS as u64).map(|k| gp_panel(&case, "RBF", k).unwrap()).collect();
        let fits = BTreeMap::from([(
            "RBF/tanh 2×30".to_string(),
            ActivationFit { w2: 0.3, noise_std: 0.1, seconds: 1.0 },
        )]);
        let metrics = ActivationMetrics { fits, panels: panels.clone() };
        let back: ActivationMetrics =
            serde_json::from_str(&serde_json::to_string(&metrics).unwrap()).unwrap();
        assert_eq!(back.panels, panels);
        let dir =
            std::env::temp_dir().join(format!("fspace-gfsvi-activations-redraw-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("metrics.json"), serde_json::to_string(&metrics).unwrap()).unwrap();
        assert_eq!(redraw_activations(&dir).unwrap(), vec![dir.join("activations.png")]);
        assert!(std::fs::metadata(dir.join("activations.png")).unwrap().len() > 10_000);
        let partial = ActivationMetrics { panels: panels[..ACTIVATION_COLS + 1].to_vec(), ..metrics };
        std::fs::write(dir.join("metrics.json"), serde_json::to_string(&partial).unwrap()).unwrap();
        let err = format!("{:#}", redraw_activations(&dir).unwrap_err());
        assert!(err.contains("holds 5 panels") && err.contains("rows of 4"), "{err}");
        std::fs::write(dir.join("metrics.json"), "{\"RBF/tanh 2×30\": {\"w2\": 0.3}}").unwrap();
        let err = format!("{:#}", redraw_activations(&dir).unwrap_err());
        assert!(err.contains("not a gfsvi-activations metrics.json"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_committed_run_holds_every_fit_and_panel_of_the_activations_figure() {
        let docs = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/results/gfsvi-activations");
        let metrics: ActivationMetrics = read_metrics(&docs, "gfsvi-activations").unwrap();
        assert_eq!((metrics.fits.len(), metrics.panels.len()), (6, 8));
    }

    #[test]
    fn the_divergence_of_a_fit_falls_as_gamma_grows() {
        // γ is added to both covariances: the divergence between two Gaussians shrinks as the
        // common isotropic part grows (a property the Fig. 12 table reports).
        let seed = 0;
        let case = gp_case(Rbf::new(1.0, 0.3).unwrap(), 0.1, seed).unwrap();
        let b = Budget { steps: 200, learning_rate: 1e-2, m: 50 };
        let f =
            fit_gfsvi(mlp(Activation::Tanh, 10, seed).unwrap(), &case, &b, 1e-10, "t".into(), seed).unwrap();
        let d: Vec<f64> = [1e-8, 1e-4, 1.0]
            .iter()
            .map(|&g| divergence_at(&f.posterior, &case, 50, g, 1).unwrap())
            .collect();
        assert!(d[0] > d[1] && d[1] > d[2] && d[2] >= 0.0, "{d:?}");
    }
}
