//! `valla-mnist` and `valla-fmnist` — VaLLA Figs. 3 and 4: the 2×200 tanh MLP trained as in
//! App. F.1, then MAP, LLA Diag, LLA KFAC, last-layer LLA, last-layer LLA KFAC, ELLA, Sampled
//! LLA (MNIST only: Fig. 4's table has no such row), VaLLA 100 and VaLLA 200 on the same
//! network; ACC, NLL, ECE, Brier and OOD ROC-AUC (predictive entropy as the score; MNIST vs
//! Fashion-MNIST test images, and the other direction for `valla-fmnist`), each method's fit
//! time as a box plot, and (Fashion-MNIST, Fig. 4 right) ECE and NLL of the test images
//! rotated by 0°–180°.
//!
//! Protocol (full run; `--quick` is a smoke test on 3 000 images whose numbers are not the
//! paper's):
//! * data: the bundled IDX files, pixels standardised by one scalar mean/sd, the 60 000
//!   training images split 90/10 into train/validation by the seed; the whole 10 000-image test
//!   set and the other set's 10 000 test images as OOD;
//! * MAP: Adam lr 1e-3, batch 100, 37 epochs over the 54 000 training images = 19 980 steps
//!   (the paper: 20 000), weight decay 1e-3 in PyTorch's convention (on the mean loss), i.e.
//!   the prior precision `λ = 1e-3·N` for the summed NLL;
//! * LLA Diag / KFAC / last-layer / last-layer KFAC: `fspace-laplace` on all training images,
//!   λ by the Laplace marginal likelihood (App. F.2 does the same with laplace-torch), the GLM
//!   predictive with the probit link (laplace-torch's default). Last-layer KFAC is KFAC of the
//!   network's last (linear) layer on the frozen last-layer features;
//! * ELLA: 2 000 random Nyström points, `K = 20`, λ on a log grid by validation NLL (§5.3);
//! * Sampled LLA (Antorán et al. 2023): `Structure::Sampled` with Fig. 3's 32 draws and 8 EM
//!   steps from the MAP's λ, at both budgets (DEVIATIONS V5). Its EM steps are recorded in
//!   `checkpoint-em-seedS-MAP.json` as they finish, so a `--resume` of the multi-hour full-size
//!   unit continues from the last recorded λ (its first solve then starts cold);
//! * VaLLA 100 / 200: `VallaConfig::default()` (batch 100, Adam 1e-3, ≤ 20 000 steps,
//!   early stopping on validation NLL every 100 steps at the first worsening (App. D), probit data term), σ₀²
//!   started at the MAP's prior variance `1/λ` (the paper does not give its starting value);
//! * all class probabilities by the probit approximation; rotated Fashion-MNIST on a seeded
//!   2 000-image subset of the test set per angle (0°, 30°, …, 180°), to keep the GLM
//!   predictives of the LLA variants affordable on 2 cores;
//! * 5 seeds (`--seeds K` overrides); every table entry is the mean ± standard error over seeds.
//!
//! `--methods "MAP,VaLLA 100"` fits only the rows named (in the table's order; the MAP network is
//! trained either way, and its fingerprint keys the stored rows, so a later `--resume` without
//! the flag adds the others). Rows that `checkpoint.json` already holds around the same MAP
//! stay in the table whatever `--methods` names. The table's caption names the rows it lacks
//! and those fitted on fewer seeds than it states.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use fspace_core::Data;
use fspace_core::LikelihoodSpec;
use fspace_core::Schedule;
use fspace_core::{Link, Posterior};
use fspace_laplace::{LaplaceConfig, LaplacePosterior, PriorPrecision, SampledConfig, Structure, Weights};
use fspace_nn::{train_map, Mlp, TrainConfig};
use fspace_valla::{ella, fit, EllaConfig, EllaPosterior, VallaConfig, VallaPosterior};
use nalgebra::DMatrix;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::harness::checkpoint::{or_nan, or_nan_array, Checkpoint, Timed};
use crate::harness::plot::{line_panels, log_box_plot, LinePanel};
use crate::harness::publish::read_metrics;
use crate::harness::registry::Options;
use crate::harness::report::{fmt, markdown_table, mean_se, pm_cell, Run};
use crate::protocols::images::{
    class_metrics, map_probs, rotate, test_with, train_val_test, ImageSet, Images,
};
use crate::protocols::laplace_with_marglik as laplace;
use crate::protocols::{fingerprint, tanh_mlp, AroundMap};

mod metrics;
pub use metrics::*;

/// The paper's tables (Fig. 3 left: MNIST; Fig. 4 left: FMNIST): ACC (%), NLL, ECE, Brier,
/// OOD-AUC. Fig. 4's FMNIST table has no "Sampled LLA" row.
const PAPER_MNIST: &[(&str, [f64; 5])] = &[
    ("MAP", [97.6, 0.076, 0.008, 0.036, 0.905]),
    ("LLA Diag", [97.4, 0.143, 0.072, 0.053, 0.922]),
    ("LLA KFAC", [97.5, 0.094, 0.029, 0.041, 0.949]),
    ("LLA* (last layer)", [97.6, 0.081, 0.015, 0.037, 0.909]),
    ("LLA* KFAC", [97.6, 0.081, 0.015, 0.037, 0.909]),
    ("ELLA", [97.6, 0.076, 0.008, 0.036, 0.905]),
    ("Sampled LLA", [97.6, 0.087, 0.026, 0.040, 0.954]),
    ("VaLLA 100", [97.7, 0.076, 0.010, 0.036, 0.916]),
    ("VaLLA 200", [97.7, 0.075, 0.010, 0.035, 0.921]),
];
const PAPER_FMNIST: &[(&str, [f64; 5])] = &[
    ("MAP", [86.6, 0.373, 0.009, 0.193, 0.874]),
    ("LLA Diag", [86.2, 0.397, 0.043, 0.201, 0.914]),
    ("LLA KFAC", [86.5, 0.377, 0.014, 0.194, 0.932]),
    ("LLA* (last layer)", [86.6, 0.373, 0.008, 0.193, 0.882]),
    ("LLA* KFAC", [86.6, 0.373, 0.008, 0.193, 0.880]),
    ("ELLA", [86.6, 0.373, 0.008, 0.193, 0.874]),
    ("VaLLA 100", [87.4, 0.335, 0.011, 0.182, 0.923]),
    ("VaLLA 200", [87.6, 0.332, 0.013, 0.181, 0.933]),
];

const CATEGORICAL: LikelihoodSpec = LikelihoodSpec::Categorical { classes: 10 };

#[derive(serde::Serialize)]
struct Budget {
    seeds: usize,
    /// Training / validation / test-and-OOD images kept (`None`: all; set together).
    n_train: Option<usize>,
    n_val: Option<usize>,
    n_test: Option<usize>,
    map_epochs: usize,
    n_rotated: usize,
    angles: Vec<f64>,
    valla_iterations: usize,
    validate_every: usize,
    ella_points: usize,
}

impl Budget {
    /// The paper's budget: every image, 5 seeds, 37 MAP epochs, 20 000 VaLLA iterations.
    fn full() -> Self {
        Budget {
            seeds: 5,
            n_train: None,
            n_val: None,
            map_epochs: 37,
            n_test: None,
            n_rotated: 2_000,
            angles: (0..=6).map(|k| 30.0 * k as f64).collect(),
            valla_iterations: 20_000,
            validate_every: 100,
            ella_points: 2_000,
        }
    }

    fn new(opts: &Options) -> Self {
        let b = if opts.quick {
            Budget {
                seeds: 1,
                n_train: Some(3_000),
                n_val: Some(500),
                map_epochs: 5,
                n_test: Some(500),
                n_rotated: 200,
                angles: vec![0.0, 90.0, 180.0],
                valla_iterations: 200,
                validate_every: 50,
                ella_points: 300,
            }
        } else {
            Budget::full()
        };
        Budget { seeds: opts.seeds.unwrap_or(b.seeds), ..b }
    }
}

/// A fitted method, able to give class probabilities.
enum Fitted {
    Map(Mlp),
    Laplace(Box<LaplacePosterior<Mlp>>),
    Ella(Box<EllaPosterior<Mlp>>),
    Valla(Box<VallaPosterior<Mlp>>),
}

impl Fitted {
    /// Seconds earlier runs spent on this fit: the recorded EM steps a resumed Sampled LLA
    /// continued from (0 for every other row).
    fn earlier_seconds(&self) -> f64 {
        match self {
            Self::Laplace(post) => post.report().em_recorded_seconds,
            _ => 0.0,
        }
    }

    fn probs(&self, x: &DMatrix<f64>) -> Result<DMatrix<f64>> {
        Ok(match self {
            Fitted::Map(net) => map_probs(net, x)?,
            Fitted::Laplace(post) => post.class_probabilities(x, &Link::Probit)?,
            Fitted::Ella(post) => post.class_probabilities(x, &Link::Probit)?,
            Fitted::Valla(post) => post.class_probabilities(x, &Link::Probit)?,
        })
    }
}

/// `(angle, ECE, NLL)` on the rotated test images.
type RotatedPoint = (f64, f64, f64);

/// Fits the method `label` (a row name of the paper's table) around the MAP `net`; returns the
/// fit and extra numbers for the log.
fn fit_method(
    label: &str,
    net: &Mlp,
    train: &Images,
    val: &Images,
    budget: &Budget,
    lambda0: f64,
    seed: u64,
    em_record: &Path,
) -> Result<(Fitted, Value)> {
    let (x, y) = (&train.x, &train.y);
    let (y_m, yv_m) = (crate::protocols::targets(y, 1), crate::protocols::targets(&val.y, 1));
    let data = Data::new(x, &y_m)?.with_validation(&val.x, &yv_m)?;
    let laplace_row = |post: LaplacePosterior<Mlp>| {
        let lambda = post.prior_precision()[0];
        (Fitted::Laplace(Box::new(post)), json!({ "lambda": lambda }))
    };
    Ok(match label {
        "MAP" => (Fitted::Map(net.clone()), json!({})),
        "LLA Diag" => laplace_row(laplace(net, CATEGORICAL, x, y, Structure::Diag, Weights::All, lambda0)?),
        "LLA KFAC" => laplace_row(laplace(net, CATEGORICAL, x, y, Structure::Kfac, Weights::All, lambda0)?),
        "LLA* (last layer)" => laplace_row(laplace(
            net,
            CATEGORICAL,
            x,
            y,
            Structure::LastLayer(Default::default()),
            Weights::All,
            lambda0,
        )?),
        "LLA* KFAC" => {
            laplace_row(laplace(net, CATEGORICAL, x, y, Structure::Kfac, Weights::LastLayer, lambda0)?)
        }
        "Sampled LLA" => {
            let cfg = LaplaceConfig {
                // The defaults are Fig. 3's 32 draws and 8 EM steps.
                structure: Structure::Sampled(SampledConfig {
                    seed,
                    // The layer statistics of 54 000 images take 2.8 GB with the transposed
                    // inputs; cached, each product is two GEMMs per layer instead of a JVP and
                    // a VJP.
                    statistics_cache_bytes: 4 << 30,
                    // λ after each EM step, so an interrupted unit of hours continues.
                    em_checkpoint: Some(em_record.to_path_buf()),
                    ..SampledConfig::default()
                }),
                prior_precision: PriorPrecision::Scalar(lambda0),
                ..LaplaceConfig::default()
            };
            let post = fspace_laplace::fit(net.clone(), CATEGORICAL, &Data::new(x, &y_m)?, &cfg)?.posterior;
            let rep = post.report();
            let extra = json!({
                "lambda": post.prior_precision()[0],
                "em_lambdas": rep.em_prior_precisions,
                "cg_products": rep.cg_products,
                "earlier_em_seconds": rep.em_recorded_seconds,
            });
            (Fitted::Laplace(Box::new(post)), extra)
        }
        "ELLA" => {
            let points = budget.ella_points.min(x.nrows());
            let cfg = EllaConfig { num_points: points, seed, ..EllaConfig::default() };
            let fitted = ella::fit(net.clone(), CATEGORICAL, &data, &cfg)?;
            let (lambda, used) = (fitted.posterior.prior_precision(), fitted.report.points_used);
            (
                Fitted::Ella(Box::new(fitted.posterior)),
                json!({ "lambda": lambda, "points": points, "training_points_used": used }),
            )
        }
        _ => {
            let m: usize = label.trim_start_matches("VaLLA ").parse()?;
            // σ₀² starts at the MAP's weight prior 1/λ (the linearised Laplace prior of this
            // network) instead of 1: the 784-input NTK is large, and from σ₀² = 1 Adam at 1e-3
            // needs thousands of steps just to shrink the prior.
            let cfg = VallaConfig {
                num_inducing: m,
                schedule: Schedule::steps(budget.valla_iterations)
                    .every_steps(budget.validate_every)
                    .patience(1),
                prior_variance: 1.0 / lambda0,
                seed,
                ..VallaConfig::default()
            };
            let post = fit(net.clone(), CATEGORICAL, &data, &cfg)?.posterior;
            let rep = post.report();
            let extra = json!({
                "iterations": rep.iterations,
                "best_iteration": rep.best_iteration,
                "stopped_early": rep.stopped_early,
                "prior_variance": post.state().prior_variance(),
            });
            (Fitted::Valla(Box::new(post)), extra)
        }
    })
}

/// One method's numbers on one seed (the checkpoint's unit).
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Row {
    method: String,
    fit_seconds: f64,
    /// ACC (%), NLL, ECE, Brier, OOD-AUC.
    #[serde(deserialize_with = "or_nan_array")]
    metrics: [f64; 5],
    rotated: Vec<RotatedPoint>,
    extra: Value,
}

fn evaluate(
    fitted: &Fitted,
    test: &Images,
    ood: &Images,
    rotated: &[(f64, Images)],
) -> Result<([f64; 5], Vec<RotatedPoint>)> {
    let p_test = fitted.probs(&test.x)?;
    let m = class_metrics(&p_test, &test.y)?;
    let p_ood = fitted.probs(&ood.x)?;
    let auc = fspace_metrics::roc_auc(
        fspace_metrics::predictive_entropy(&p_test)?.as_slice(),
        fspace_metrics::predictive_entropy(&p_ood)?.as_slice(),
    )?;
    let mut rot = Vec::new();
    for (angle, imgs) in rotated {
        let r = class_metrics(&fitted.probs(&imgs.x)?, &imgs.y)?;
        rot.push((*angle, r.ece, r.nll));
    }
    Ok(([100.0 * m.accuracy, m.nll, m.ece, m.brier, auc], rot))
}

/// `valla-mnist`: runs the experiment and writes its folder.
pub fn run_mnist(opts: &Options) -> Result<()> {
    run(opts, ImageSet::Mnist, "valla-mnist")
}

/// `valla-mnist-quick`: `valla-mnist` at the `--quick` budget in a folder of its own, so that
/// the committed full run (whose Sampled LLA row takes more than 2 h a seed) and the quick run
/// that has every row both stay readable.
pub fn run_mnist_quick(opts: &Options) -> Result<()> {
    run(&Options { quick: true, ..opts.clone() }, ImageSet::Mnist, "valla-mnist-quick")
}

/// `valla-fmnist`: runs the experiment and writes its folder.
pub fn run_fmnist(opts: &Options) -> Result<()> {
    run(opts, ImageSet::FashionMnist, "valla-fmnist")
}

/// The experiment on `set`: its name, the out-of-distribution set and the paper's rows.
fn experiment(set: ImageSet) -> (&'static str, ImageSet, &'static [(&'static str, [f64; 5])]) {
    match set {
        ImageSet::Mnist => ("valla-mnist", ImageSet::FashionMnist, PAPER_MNIST),
        ImageSet::FashionMnist => ("valla-fmnist", ImageSet::Mnist, PAPER_FMNIST),
    }
}

/// The rows to fit: every row of `paper`, or those `--methods` names, in the paper's order.
fn selected_methods(
    name: &str,
    paper: &[(&'static str, [f64; 5])],
    chosen: Option<&[String]>,
) -> Result<Vec<&'static str>> {
    let all: Vec<&'static str> = paper.iter().map(|p| p.0).collect();
    let Some(chosen) = chosen else { return Ok(all) };
    if let Some(unknown) = chosen.iter().find(|c| !all.contains(&c.as_str())) {
        bail!("--methods: {name} has no row {unknown:?}; its rows are {}", all.join(", "));
    }
    Ok(all.into_iter().filter(|m| chosen.iter().any(|c| c == m)).collect())
}

fn run(opts: &Options, set: ImageSet, name: &str) -> Result<()> {
    let (_, ood_set, paper) = experiment(set);
    let methods = selected_methods(name, paper, opts.methods.as_deref())?;
    let mut run = Run::open(&opts.out, name, opts.resume)?;
    let budget = Budget::new(opts);
    let with_rotation = set == ImageSet::FashionMnist;
    // A unit is one method on one seed; another seed count is the same run continued.
    let mut settings = serde_json::to_value(&budget)?;
    if let Some(o) = settings.as_object_mut() {
        o.remove("seeds");
    }
    // A resumed seed retrains its MAP and keeps a stored row only around the same one.
    let mut ck = Checkpoint::<Timed<AroundMap<Row>>>::open(&mut run, &settings)?;
    let mut rows: Vec<(u64, Row)> = Vec::new();
    for s in 0..budget.seeds as u64 {
        let seed = opts.seed + s;
        let key = |method: &str| format!("seed {seed}/{method}");
        if let Some(stored) = ck.all(methods.iter().map(|m| key(m)))? {
            run.log(format!("seed {seed}: every method in checkpoint.json (--resume)"));
            let map = stored[0].value.map.clone();
            rows.extend(stored.into_iter().map(|u| (seed, u.value.unit)));
            rows.extend(stored_others(&ck, &methods, paper, key, &map)?.into_iter().map(|r| (seed, r)));
            continue;
        }
        let (train, val, test, stats) = train_val_test(set, seed)?;
        let ood = test_with(ood_set, stats)?;
        let (train, val, test, ood) = match (budget.n_train, budget.n_val, budget.n_test) {
            (Some(nt), Some(nv), Some(ne)) => (
                train.subset(nt, seed),
                val.subset(nv, seed + 1),
                test.subset(ne, seed + 2),
                ood.subset(ne, seed + 3),
            ),
            _ => (train, val, test, ood),
        };
        let rotated: Vec<(f64, Images)> = if with_rotation {
            let base = test.subset(budget.n_rotated, seed + 4);
            let black = -stats.0 / stats.1;
            budget
                .angles
                .iter()
                .map(|&a| (a, Images { x: rotate(&base.x, a, black), y: base.y.clone() }))
                .collect()
        } else {
            Vec::new()
        };
        let n = train.x.nrows();
        let lambda0 = 1e-3 * n as f64;
        run.log(format!(
            "seed {seed}: {n} train / {} validation / {} test / {} OOD images; weight decay 1e-3 → λ = {lambda0}",
            val.x.nrows(),
            test.x.nrows(),
            ood.x.nrows()
        ));
        // MAP (App. F.1).
        let mut net = tanh_mlp(784, &[200, 200], 10, seed)?;
        let mut lik = fspace_core::Categorical::new(10)?;
        let t0 = Instant::now();
        let cfg = TrainConfig {
            schedule: Schedule::epochs(budget.map_epochs),
            batch_size: 100,
            learning_rate: 1e-3,
            weight_decay: lambda0,
            seed,
            ..TrainConfig::default()
        };
        let bar = run.progress(budget.map_epochs as u64, "MAP epochs");
        train_map(&mut net, &mut lik, &train.x, &train.y, None, None, &cfg, |_| bar.inc(1))?;
        bar.finish_and_clear();
        let map_seconds = t0.elapsed().as_secs_f64();
        let steps = budget.map_epochs * n.div_ceil(100);
        let map = fingerprint(&net);
        run.log(format!("  MAP: {steps} Adam steps in {map_seconds:.1} s (fingerprint {map})"));

        rows.extend(stored_others(&ck, &methods, paper, key, &map)?.into_iter().map(|r| (seed, r)));
        for &label in &methods {
            // A stored row counts only if it was fitted around this MAP.
            let unit = ck.unit_when(&mut run, &key(label), |u| u.map == map, |run| {
                // Named by the MAP's fingerprint: a record of another MAP is never continued.
                let em_record = run.path(&format!("checkpoint-em-seed{seed}-{map}.json"));
                if label == "Sampled LLA" {
                    continue_em_record(run, &em_record)?;
                }
                let t0 = Instant::now();
                let (fitted, extra) = fit_method(label, &net, &train, &val, &budget, lambda0, seed, &em_record)?;
                let fit_seconds =
                    if label == "MAP" { map_seconds } else { t0.elapsed().as_secs_f64() + fitted.earlier_seconds() };
                let t1 = Instant::now();
                let (metrics, rot) = evaluate(&fitted, &test, &ood, &rotated)?;
                run.log(format!(
                    "  {label:<18} fit {fit_seconds:8.1} s  predict {:6.1} s  ACC {:.2}  NLL {:.4}  ECE {:.4}  Brier {:.4}  OOD-AUC {:.3}  {extra}",
                    t1.elapsed().as_secs_f64(),
                    metrics[0],
                    metrics[1],
                    metrics[2],
                    metrics[3],
                    metrics[4]
                ));
                let row = Row { method: label.to_string(), fit_seconds, metrics, rotated: rot, extra };
                Ok(AroundMap { unit: row, map: map.clone() })
            })?;
            rows.push((seed, unit.value.unit));
            // After every method, so a long run leaves its finished rows behind, with the stored
            // rows of the seeds it has not reached yet (an interrupted part's table keeps them).
            let mut shown = rows.clone();
            shown.extend(stored_later(&ck, paper, seed + 1..opts.seed + budget.seeds as u64)?);
            report(&mut run, name, paper, &shown, &budget, with_rotation)?;
        }
    }
    report(&mut run, name, paper, &rows, &budget, with_rotation)
}

/// Sampled LLA records its EM steps in `checkpoint-em-seedS-MAP.json` beside `checkpoint.json`
/// (`SampledConfig::em_checkpoint`; `cargo xtask publish` and `restore` carry it). A `--resume`
/// continues from the steps it holds, and the log says how many; a fresh run removes it first.
/// The record itself refuses steps of another MAP or other data.
fn continue_em_record(run: &mut Run, file: &Path) -> Result<()> {
    if !file.exists() {
        return Ok(());
    }
    if !run.resumed {
        return std::fs::remove_file(file).with_context(|| format!("removing {}", file.display()));
    }
    let text = std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let steps = serde_json::from_str::<Value>(&text)
        .ok()
        .and_then(|v| v["prior_precisions"].as_array().map(Vec::len));
    let name = file.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
    run.log(match steps {
        Some(n) => format!(
            "  Sampled LLA continues from the {n} EM steps {name} records (the first solve starts cold)"
        ),
        None => format!("  {name} is not an EM record; the fit will say why"),
    });
    Ok(())
}

/// The rows `--methods` leaves out that `checkpoint.json` already holds for one seed (its unit
/// keys by `key`), fitted around the MAP `map`: they stay in the table, so fitting a subset never
/// drops finished rows.
fn stored_others(
    ck: &Checkpoint<Timed<AroundMap<Row>>>,
    methods: &[&str],
    paper: &[(&str, [f64; 5])],
    key: impl Fn(&str) -> String,
    map: &str,
) -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    for label in paper.iter().map(|p| p.0).filter(|m| !methods.contains(m)) {
        if let Some(stored) = ck.get(&key(label))? {
            if stored.value.map == map {
                rows.push(stored.value.unit);
            }
        }
    }
    Ok(rows)
}

/// The rows `checkpoint.json` holds for `seeds`, each seed's fitted around its stored MAP (a
/// seed whose MAP row is not stored has none): what a table written before the run reaches
/// those seeds shows for them.
fn stored_later(
    ck: &Checkpoint<Timed<AroundMap<Row>>>,
    paper: &[(&str, [f64; 5])],
    seeds: std::ops::Range<u64>,
) -> Result<Vec<(u64, Row)>> {
    let mut rows = Vec::new();
    for seed in seeds {
        let key = |method: &str| format!("seed {seed}/{method}");
        if let Some(map) = ck.get(&key("MAP"))?.map(|u| u.value.map) {
            rows.extend(stored_others(ck, &[], paper, key, &map)?.into_iter().map(|r| (seed, r)));
        }
    }
    Ok(rows)
}

fn report(
    run: &mut Run,
    name: &str,
    paper: &[(&str, [f64; 5])],
    rows: &[(u64, Row)],
    budget: &Budget,
    with_rotation: bool,
) -> Result<()> {
    let methods: Vec<&str> = paper.iter().map(|p| p.0).collect();
    let mut table = Vec::new();
    let mut summary = BTreeMap::new();
    for (method, paper_vals) in paper.iter() {
        let mine: Vec<&Row> = rows.iter().filter(|r| r.1.method == *method).map(|r| &r.1).collect();
        if mine.is_empty() {
            continue;
        }
        let mut cells = vec![method.to_string()];
        let stats: [CellStats; 5] = std::array::from_fn(|k| {
            let (mean, se) = mean_se(&mine.iter().map(|r| r.metrics[k]).collect::<Vec<_>>());
            cells.push(format!("{} ({})", pm_cell((mean, se)), fmt(paper_vals[k])));
            CellStats { mean, se, paper: paper_vals[k] }
        });
        let secs: Vec<f64> = mine.iter().map(|r| r.fit_seconds).collect();
        let (t, _) = mean_se(&secs);
        cells.push(fmt(t));
        let [accuracy_percent, nll, ece, brier, ood_auc] = stats;
        summary.insert(
            method.to_string(),
            MethodSummary { accuracy_percent, nll, ece, brier, ood_auc, fit_seconds: secs.clone() },
        );
        table.push(cells);
    }
    let mut md = format!(
        "# {name}\n\nMean ± standard error over {} seed(s); the paper's value in parentheses (5 seeds, \
         laplace-torch and the authors' GPU code). Fit seconds on this machine (2 cores); MAP's \
         entry is its training time; a Sampled LLA continued from its EM record counts the recorded \
         steps' seconds too.{}\n\n",
        budget.seeds,
        coverage_note(&methods, rows, budget.seeds)
    );
    md += &markdown_table(&["method", "ACC (%)", "NLL", "ECE", "Brier", "OOD-AUC", "fit (s)"], &table);
    let mut rotation = Vec::new();
    if with_rotation {
        let mut rot_rows = Vec::new();
        for method in &methods {
            let mine: Vec<&Row> = rows.iter().filter(|r| r.1.method == *method).map(|r| &r.1).collect();
            if mine.is_empty() {
                continue;
            }
            let mut ece = Vec::new();
            let mut nll = Vec::new();
            let mut cells = vec![method.to_string()];
            for (a, &angle) in budget.angles.iter().enumerate() {
                let e = mean_se(&mine.iter().map(|r| r.rotated[a].1).collect::<Vec<_>>()).0;
                let l = mean_se(&mine.iter().map(|r| r.rotated[a].2).collect::<Vec<_>>()).0;
                ece.push((angle, e));
                nll.push((angle, l));
                cells.push(format!("{} / {}", fmt(e), fmt(l)));
            }
            rotation.push(RotationCurves { method: method.to_string(), ece, nll });
            rot_rows.push(cells);
        }
        let header: Vec<String> = std::iter::once("method".to_string())
            .chain(budget.angles.iter().map(|a| format!("{a}°")))
            .collect();
        let header: Vec<&str> = header.iter().map(|s| s.as_str()).collect();
        md += &format!(
            "\n## Rotated test images (Fig. 4 right): ECE / NLL against the angle\n\n{} test images per angle.\n\n",
            budget.n_rotated
        );
        md += &markdown_table(&header, &rot_rows);
    }
    run.write_table(&md)?;
    let per_seed: Vec<SeedRecord> = rows
        .iter()
        .map(|(seed, r)| SeedRecord {
            seed: *seed,
            method: r.method.clone(),
            fit_seconds: r.fit_seconds,
            accuracy_percent: r.metrics[0],
            nll: r.metrics[1],
            ece: r.metrics[2],
            brier: r.metrics[3],
            ood_auc: r.metrics[4],
            rotated: r.rotated.clone(),
            extra: r.extra.clone(),
        })
        .collect();
    let metrics =
        Metrics { seeds: budget.seeds, quick: budget.n_train.is_some(), summary, rotation, per_seed };
    draw_figures(run.dir(), name, paper, &metrics)?;
    run.write_metrics(&metrics)?;
    Ok(())
}

/// What the table lacks, said after its caption: the paper's rows with no fitted row yet, and
/// the rows fitted on fewer seeds than the caption names (`--methods`, or a run still going).
fn coverage_note(methods: &[&str], rows: &[(u64, Row)], seeds: usize) -> String {
    let count = |m: &str| rows.iter().filter(|r| r.1.method == m).count();
    let absent: Vec<&str> = methods.iter().copied().filter(|m| count(m) == 0).collect();
    let fewer: Vec<String> = methods
        .iter()
        .map(|m| (m, count(m)))
        .filter(|&(_, n)| n > 0 && n < seeds)
        .map(|(m, n)| format!("{m} ({n} of {seeds})"))
        .collect();
    let mut note = String::new();
    if !absent.is_empty() {
        note += &format!(" Not in this run: {}.", absent.join(", "));
    }
    if !fewer.is_empty() {
        note += &format!(" Fewer seeds: {}.", fewer.join(", "));
    }
    note
}

/// The run's figures, from its metrics alone (so `cargo xtask redraw` draws what the run drew):
/// `fit_times.png`, each method's fit seconds over the seeds in the paper's row order, and
/// `rotated.png` (Fashion-MNIST), the mean ECE and NLL against the rotation angle.
fn draw_figures(
    dir: &Path,
    name: &str,
    paper: &[(&str, [f64; 5])],
    metrics: &Metrics,
) -> Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    if !metrics.rotation.is_empty() {
        let curves = |pick: fn(&RotationCurves) -> &Vec<(f64, f64)>| -> Vec<(String, Vec<(f64, f64)>)> {
            metrics.rotation.iter().map(|c| (c.method.clone(), pick(c).clone())).collect()
        };
        written.push(dir.join("rotated.png"));
        line_panels(
            &written[0],
            &[
                LinePanel {
                    title: "Rotated test images: ECE".into(),
                    labels: ("rotation (degrees)".into(), "ECE".into()),
                    series: curves(|c| &c.ece),
                    log_x: false,
                },
                LinePanel {
                    title: "Rotated test images: NLL".into(),
                    labels: ("rotation (degrees)".into(), "NLL".into()),
                    series: curves(|c| &c.nll),
                    log_x: false,
                },
            ],
            2,
        )?;
    }
    let times: Vec<(String, Vec<f64>)> = paper
        .iter()
        .filter_map(|(method, _)| {
            metrics.summary.get(*method).map(|m| (method.to_string(), m.fit_seconds.clone()))
        })
        .collect();
    written.push(dir.join("fit_times.png"));
    log_box_plot(
        written.last().expect("pushed"),
        &format!("{name}: fit time per method"),
        "seconds",
        &times,
    )?;
    Ok(written)
}

/// `cargo xtask redraw valla-mnist`: the figures of the finished run in `dir` from its
/// `metrics.json`, with the current figure code (nothing is recomputed); returns the files written.
pub fn redraw_mnist(dir: &Path) -> Result<Vec<PathBuf>> {
    redraw(dir, ImageSet::Mnist)
}

/// `cargo xtask redraw valla-fmnist`: the figures of the finished run in `dir` from its
/// `metrics.json`, with the current figure code (nothing is recomputed); returns the files written.
pub fn redraw_fmnist(dir: &Path) -> Result<Vec<PathBuf>> {
    redraw(dir, ImageSet::FashionMnist)
}

/// Reads `dir/metrics.json` as the metrics of `set`'s experiment and draws its figures.
fn redraw(dir: &Path, set: ImageSet) -> Result<Vec<PathBuf>> {
    let (name, _, paper) = experiment(set);
    let metrics: Metrics = read_metrics(dir, name)?;
    draw_figures(dir, name, paper, &metrics)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stored_row_round_trips_and_names_the_map_it_was_fitted_around() {
        let (a, b) = (tanh_mlp(3, &[4], 2, 0).unwrap(), tanh_mlp(3, &[4], 2, 1).unwrap());
        assert_eq!(fingerprint(&a), fingerprint(&a.clone()));
        assert_ne!(fingerprint(&a), fingerprint(&b));
        let dir = std::env::temp_dir().join(format!("fspace-valla-images-{}", std::process::id()));
        let out = dir.to_str().unwrap();
        let row = Row {
            method: "VaLLA 100".into(),
            fit_seconds: 1.5,
            metrics: [97.5, 0.1 + 0.2, 0.01, 0.04, f64::NAN],
            rotated: vec![(0.0, 0.01, 0.1), (90.0, 0.2, 1.5)],
            extra: json!({ "iterations": 200 }),
        };
        let stored = AroundMap { unit: row.clone(), map: fingerprint(&a) };
        let settings = json!({ "map_epochs": 5 });
        Checkpoint::<Timed<AroundMap<Row>>>::open(&mut Run::new(out, "valla-mnist").unwrap(), &settings)
            .unwrap()
            .put("seed 0/VaLLA 100", &Timed { seconds: 2.0, value: stored.clone() })
            .unwrap();
        let mut run = Run::open(out, "valla-mnist", true).unwrap();
        let back = Checkpoint::<Timed<AroundMap<Row>>>::open(&mut run, &settings)
            .unwrap()
            .get("seed 0/VaLLA 100")
            .unwrap()
            .unwrap()
            .value;
        assert_eq!(back.map, stored.map);
        let back = back.unit;
        assert_eq!((&back.method, &back.rotated), (&row.method, &row.rotated));
        assert_eq!(back.metrics[..4], row.metrics[..4]);
        assert!(back.metrics[4].is_nan());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_table_written_before_later_seeds_shows_their_stored_rows_around_their_map() {
        let dir = std::env::temp_dir().join(format!("fspace-valla-later-{}", std::process::id()));
        let out = dir.to_str().unwrap();
        let row = |method: &str| Row {
            method: method.into(),
            fit_seconds: 1.0,
            metrics: [97.0, 0.1, 0.01, 0.04, 0.9],
            rotated: Vec::new(),
            extra: json!({}),
        };
        let mut run = Run::new(out, "valla-mnist").unwrap();
        let mut ck = Checkpoint::<Timed<AroundMap<Row>>>::open(&mut run, &json!({})).unwrap();
        let mut put = |key: &str, method: &str, map: &str| {
            let unit = AroundMap { unit: row(method), map: map.into() };
            ck.put(key, &Timed { seconds: 1.0, value: unit }).unwrap();
        };
        put("seed 1/VaLLA 100", "VaLLA 100", "a");
        put("seed 1/ELLA", "ELLA", "stale");
        put("seed 1/MAP", "MAP", "a");
        // Seed 2 has no stored MAP: its row's network is unknown, so it is not shown.
        put("seed 2/VaLLA 100", "VaLLA 100", "b");
        let later = stored_later(&ck, PAPER_MNIST, 1..3).unwrap();
        let shown: Vec<(u64, &str)> = later.iter().map(|(s, r)| (*s, r.method.as_str())).collect();
        assert_eq!(shown, [(1, "MAP"), (1, "VaLLA 100")]);
        assert!(stored_later(&ck, PAPER_MNIST, 3..5).unwrap().is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn methods_keeps_the_table_s_order_and_names_an_unknown_row() {
        let all = selected_methods("valla-mnist", PAPER_MNIST, None).unwrap();
        assert_eq!(all.len(), PAPER_MNIST.len());
        let chosen = ["VaLLA 200".to_string(), "MAP".to_string()];
        assert_eq!(
            selected_methods("valla-mnist", PAPER_MNIST, Some(&chosen)).unwrap(),
            ["MAP", "VaLLA 200"]
        );
        // FMNIST's table has no Sampled LLA row.
        let err = selected_methods("valla-fmnist", PAPER_FMNIST, Some(&["Sampled LLA".to_string()]))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("valla-fmnist has no row \"Sampled LLA\"") && err.contains("VaLLA 200"),
            "{err}"
        );
    }

    #[test]
    fn the_caption_names_absent_rows_and_rows_on_fewer_seeds() {
        let methods: Vec<&str> = PAPER_FMNIST.iter().map(|p| p.0).collect();
        let rows = made_up_rows();
        assert_eq!(coverage_note(&methods, &rows, 3), "");
        let partial: Vec<(u64, Row)> = rows
            .into_iter()
            .filter(|(seed, r)| r.method != "ELLA" && (*seed == 0 || r.method != "MAP"))
            .collect();
        assert_eq!(
            coverage_note(&methods, &partial, 3),
            " Not in this run: ELLA. Fewer seeds: MAP (1 of 3)."
        );
    }

    /// Seeds × methods of made-up rows with a rotation sweep, as a finished run would hold.
    fn made_up_rows() -> Vec<(u64, Row)> {
        let mut rows = Vec::new();
        for seed in 0..3u64 {
            for (k, (method, _)) in PAPER_FMNIST.iter().enumerate() {
                let x = (seed as f64 + 1.0) * 0.01 + k as f64 * 0.1;
                rows.push((
                    seed,
                    Row {
                        method: method.to_string(),
                        fit_seconds: 0.5 + 10.0 * x,
                        metrics: [87.0 + x, 0.33 + x, 0.02 + x / 10.0, 0.19 + x, 0.9 - x / 10.0],
                        rotated: (0..=6)
                            .map(|a| (30.0 * a as f64, 0.1 * a as f64 + x, 0.3 + a as f64 + x))
                            .collect(),
                        extra: json!({}),
                    },
                ));
            }
        }
        rows
    }

    #[test]
    fn figures_redrawn_from_metrics_json_are_byte_for_byte_the_run_s() {
        let root = std::env::temp_dir().join(format!("fspace-valla-redraw-{}", std::process::id()));
        let out = root.join("run");
        let mut run = Run::new(out.to_str().unwrap(), "valla-fmnist").unwrap();
        let budget = Budget { seeds: 3, ..Budget::full() };
        report(&mut run, "valla-fmnist", PAPER_FMNIST, &made_up_rows(), &budget, true).unwrap();
        let ran = out.join("valla-fmnist");
        let copy = root.join("copy");
        std::fs::create_dir_all(&copy).unwrap();
        std::fs::copy(ran.join("metrics.json"), copy.join("metrics.json")).unwrap();
        let written = redraw_fmnist(&copy).unwrap();
        assert_eq!(written, vec![copy.join("rotated.png"), copy.join("fit_times.png")]);
        for file in ["rotated.png", "fit_times.png"] {
            let (a, b) = (std::fs::read(ran.join(file)).unwrap(), std::fs::read(copy.join(file)).unwrap());
            assert!(a.len() > 1000, "{file}: {} bytes", a.len());
            assert!(a == b, "{file} redrawn differs from the run's");
        }
        // A metrics.json of another shape is refused with its path.
        std::fs::write(copy.join("metrics.json"), "{\"seeds\": 1}").unwrap();
        let err = format!("{:#}", redraw_fmnist(&copy).unwrap_err());
        assert!(err.contains("metrics.json") && err.contains("valla-fmnist"), "{err}");
        std::fs::remove_dir_all(&root).unwrap();
    }
}
