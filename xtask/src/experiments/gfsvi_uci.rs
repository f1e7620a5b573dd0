//! `gfsvi-uci` (Tables 1 and 5) and `gfsvi-ood` (Table 3) — one set of fits, all three tables
//! in either experiment's `table.md`: GFSVI, FVI, TFSVI, MFVI, Laplace,
//! SVGP and the exact GP on the UCI regression sets shipped in `datasets/` (Boston housing,
//! concrete, red wine, yacht; the paper's other seven sets are in no package registry).
//!
//! Protocol (App. A.2.2, A.2.4): 5-fold cross-validation over a seeded shuffle; 10 % of the
//! training folds held out for validation (early stopping on the validation NLL of the
//! predictive, every 100 steps, patience 5, best state restored — the MAP of Laplace: patience
//! [`PATIENCE_EPOCHS`] full-batch epochs, the same 500 steps); features and targets
//! standardised by the training rows; 2×50 tanh networks (the paper selects architectures by a
//! Bayesian-optimisation sweep we cannot afford; 2×50 is FSP-Laplace's UCI network), full-batch
//! Adam (the paper's batch is 2 000 > every shipped set), one learned σ_y shared by every input
//! (App. A.2 calls the noise model "heteroskedastic with a learned scale parameter", but a single
//! scale is homoskedastic and eq. 10 has one σ_y, so we read it as that), 100 posterior samples for
//! FVI/MFVI. Priors: zero mean and an ARD RBF kernel with its noise fitted by the exact GP's
//! marginal likelihood on the distinct training records (red wine's 240 exact duplicate records
//! otherwise collapse the noise; the paper fits by minibatch marginal likelihood).
//! GFSVI: M = 500 uniform measurement points over the training box; γ chosen per fold from
//! [`UCI_GAMMA_GRID`] = {1e-10 (the paper's [`UCI_GAMMA`]), 1e-6}: each fold fits GFSVI and TFSVI
//! once per γ and keeps the fit with the lowest validation NLL, its seconds counting every fit
//! (`--gamma G[,G…]` replaces the grid; `--gamma 1e-10` is the paper's fixed value); TFSVI σ_p = 0.2;
//! MFVI σ_p = 0.75; FVI 50 uniform + 450 batch points; Laplace: MAP with the Gaussian weight
//! prior σ_p = 0.75, diagonal GGN ([`LAPLACE_STRUCTURE`]), GLM predictive; SVGP: 100 k-means inducing points, 2 000
//! natural-gradient/Adam steps; exact GP with the fitted hyperparameters.
//!
//! Scores (standardised units): expected log-likelihood `E_q log N(y | f, σ_y²)` per test
//! point and MSE of the predictive mean (Tables 1, 5), mean ± std over folds, the paper's
//! mean-rank rule; OOD (Table 3): accuracy of one threshold on the epistemic variance `Var[f]`,
//! the test fold (ID) against as many OOD rows — the paper's song subset is in no registry, so
//! [`crate::protocols::uci::ood_rows`] (sklearn's digits, shipped) stands in.

use fspace_kernels::GpPrior;

use anyhow::Result;
use fspace_core::Data;
use fspace_core::LikelihoodSpec;
use fspace_core::Posterior;
use fspace_core::Schedule;
use fspace_data::{kfold, Dataset};
use fspace_gfsvi::{fit, fvi, mfvi, FviConfig, GfsviConfig, KlPrior, MfviConfig, OptimConfig};
use fspace_gp::SvgpConfig;
use nalgebra::{DMatrix, DVector};
use rand::rngs::StdRng;
use rand::SeedableRng;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::harness::checkpoint::{or_nan, or_nan_vec, Checkpoint, Timed};
use crate::harness::registry::Options;
use crate::harness::report::{fmt, markdown_table, Run};
use crate::protocols::tanh_mlp;
use crate::protocols::uci::{
    best_validation_loss, finished_sets, folds_label, load, map_laplace, ood_rows, prepare, rank_rows,
    scores, selected_folds, selected_sets, set_label, stored_fold, unit_key, Prepared, LAPLACE_STRUCTURE,
    PATIENCE_EPOCHS, PRIOR_FIT,
};

/// The BNNs' likelihood: one σ_y, learned from 0.5.
const BNN_LIKELIHOOD: LikelihoodSpec = LikelihoodSpec::Gaussian { sigma: 0.5, learn: true };
const METHODS: [&str; 7] = ["GFSVI", "FVI", "TFSVI", "MFVI", "Laplace", "SVGP", "GP"];

/// The paper's rows for our four sets: (ELL, MSE, OOD accuracy) as (mean, std) per method.
fn paper(dataset: &str, table: usize) -> [(f64, f64); 7] {
    match (dataset, table) {
        ("boston", 0) => [
            (-0.733, 0.321),
            (-0.571, 0.253),
            (-1.416, 0.103),
            (-1.308, 0.117),
            (-0.812, 0.458),
            (-0.884, 0.408),
            (-1.594, 1.243),
        ],
        ("concrete", 0) => [
            (-0.457, 0.092),
            (-0.390, 0.038),
            (-0.983, 0.027),
            (-1.353, 0.041),
            (-0.715, 0.057),
            (-0.966, 0.057),
            (-2.099, 0.942),
        ],
        ("wine", 0) => [
            (-1.289, 0.090),
            (-1.215, 0.016),
            (-2.138, 0.495),
            (-1.248, 0.040),
            (-1.249, 0.055),
            (-1.240, 0.083),
            (-1.219, 0.079),
        ],
        ("yacht", 0) => [
            (1.058, 0.18),
            (0.545, 1.643),
            (-1.187, 0.144),
            (-1.638, 0.066),
            (0.68, 0.382),
            (-0.979, 0.206),
            (-0.914, 0.1),
        ],
        ("yacht", 1) => [
            (0.003, 0.001),
            (0.004, 0.002),
            (0.221, 0.082),
            (0.682, 0.313),
            (0.002, 0.001),
            (0.399, 0.144),
            (0.355, 0.066),
        ],
        ("yacht", 2) => [
            (0.616, 0.067),
            (0.604, 0.056),
            (0.659, 0.097),
            (0.642, 0.079),
            (0.612, 0.054),
            (0.762, 0.041),
            (0.788, 0.026),
        ],
        ("boston", 1) => [
            (0.123, 0.047),
            (0.136, 0.050),
            (0.995, 0.206),
            (0.532, 0.160),
            (0.203, 0.104),
            (0.122, 0.032),
            (0.115, 0.045),
        ],
        ("concrete", 1) => [
            (0.114, 0.019),
            (0.116, 0.009),
            (0.389, 0.035),
            (0.698, 0.102),
            (0.116, 0.015),
            (0.399, 0.045),
            (0.116, 0.016),
        ],
        ("wine", 1) => [
            (0.652, 0.050),
            (0.663, 0.020),
            (1.297, 0.208),
            (0.655, 0.052),
            (0.637, 0.069),
            (0.607, 0.074),
            (0.585, 0.071),
        ],
        ("boston", 2) => [
            (0.893, 0.025),
            (0.594, 0.054),
            (0.705, 0.239),
            (0.521, 0.013),
            (0.557, 0.021),
            (0.947, 0.024),
            (0.952, 0.006),
        ],
        ("concrete", 2) => [
            (0.656, 0.036),
            (0.583, 0.050),
            (0.511, 0.008),
            (0.605, 0.027),
            (0.578, 0.033),
            (0.776, 0.014),
            (0.933, 0.010),
        ],
        _ => [
            (0.665, 0.028),
            (0.517, 0.009),
            (0.549, 0.033),
            (0.542, 0.020),
            (0.531, 0.016),
            (0.781, 0.031),
            (0.787, 0.016),
        ],
    }
}

struct Budget {
    steps: usize,
    m: usize,
    folds: usize,
    datasets: &'static [&'static str],
}

const FULL: Budget =
    Budget { steps: 3000, m: 500, folds: 5, datasets: &["boston", "concrete", "wine", "yacht"] };
const QUICK: Budget = Budget { steps: 300, m: 100, folds: 1, datasets: &["boston"] };

/// `gfsvi-uci`: Tables 1 and 5.
pub fn run_uci(opts: &Options) -> Result<()> {
    run_tables(opts, "gfsvi-uci", false)
}

/// `gfsvi-ood`: Table 3.
pub fn run_ood(opts: &Options) -> Result<()> {
    run_tables(opts, "gfsvi-ood", true)
}

/// One method's scores on one fold (the checkpoint's unit; standardised units).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FoldScore {
    /// Expected log-likelihood per test point (Table 1).
    #[serde(deserialize_with = "or_nan")]
    pub ell: f64,
    /// MSE of the predictive mean (Table 5).
    #[serde(deserialize_with = "or_nan")]
    pub mse: f64,
    /// OOD accuracy of one threshold on the epistemic variance (Table 3).
    #[serde(deserialize_with = "or_nan")]
    pub ood_accuracy: f64,
    /// Seconds of the fold's GP prior fit, counted in the exact GP's time (0 for the others,
    /// whose prior is given).
    pub prior_fit_seconds: f64,
    /// The γ a GFSVI/TFSVI fit chose from a grid of several (`None` otherwise).
    pub gamma: Option<f64>,
}

/// One method's score on one set over folds.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ColumnStats {
    /// Mean over folds.
    #[serde(deserialize_with = "or_nan")]
    pub mean: f64,
    /// Standard deviation over folds.
    #[serde(deserialize_with = "or_nan")]
    pub std: f64,
    /// Each fold's score.
    #[serde(deserialize_with = "or_nan_vec")]
    pub folds: Vec<f64>,
    /// Each fold's seconds.
    pub seconds: Vec<f64>,
}

/// `metrics.json`: per `"set/method/j"`, j = 0 ELL, 1 MSE, 2 OOD accuracy.
pub type Metrics = std::collections::BTreeMap<String, ColumnStats>;

impl FoldScore {
    /// The table's columns: ELL, MSE, OOD accuracy, seconds (fit and evaluation, the GP's
    /// prior fit included).
    fn columns(unit: &Timed<FoldScore>) -> [f64; 4] {
        let u = &unit.value;
        [u.ell, u.mse, u.ood_accuracy, unit.seconds + u.prior_fit_seconds]
    }
}

fn optim(b: &Budget, seed: u64) -> OptimConfig {
    OptimConfig {
        learning_rate: 1e-3,
        batch_size: 2000,
        schedule: Schedule::steps(b.steps).every_steps(100).patience(5),
        seed,
    }
}
#[allow(clippy::too_many_arguments)]
fn run_fold(
    run: &mut Run,
    ck: &mut Checkpoint<Timed<FoldScore>>,
    dataset: &str,
    data: &Dataset,
    (f, fold): (usize, &fspace_data::Fold),
    b: &Budget,
    gammas: &[f64],
    seed: u64,
) -> Result<Vec<[f64; 4]>> {
    if let Some(stored) = stored_fold(ck, dataset, f, &METHODS)? {
        run.log(format!("{dataset} fold {}: every method in checkpoint.json (--resume)", f + 1));
        return Ok(stored.iter().map(FoldScore::columns).collect());
    }
    let Prepared { xtr, ytr, ytr_m, xva, yva_m, xte, yte, kernel, noise_var, gp_secs } =
        prepare(data, fold, seed)?;
    let ood = ood_rows(xtr.ncols(), xte.nrows(), seed)?;
    let d = xtr.ncols();
    let prior = GpPrior::centered(kernel.clone());
    let net = tanh_mlp(d, &[50, 50], 1, seed)?;
    let val = Some((&xva, &yva_m));
    let bbox = fspace_context::BoundingBox::from_data(&xtr, 0.0)?;
    let mut out = Vec::new();
    for method in METHODS {
        let unit = ck.unit(run, &unit_key(dataset, f, method), |run| {
            let mut chosen_gamma = None;
            let (post, noise): (Box<dyn Posterior>, f64) = match method {
                "GFSVI" | "TFSVI" => {
                    let fp = if method == "GFSVI" {
                        KlPrior::Gp(prior.clone())
                    } else {
                        KlPrior::WeightPushforward { sigma_p: 0.2 }
                    };
                    // One fit per γ of the grid, from the same initialisation; the lowest best
                    // validation NLL wins (ties: the first listed).
                    let mut chosen: Option<(f64, f64, _)> = None;
                    for &gamma in gammas {
                        let cfg = GfsviConfig {
                            measurement_points: b.m,
                            gamma,
                            measurement_box: Some(bbox.clone()),
                            optim: optim(b, seed),
                            ..Default::default()
                        };
                        let f = fit(
                            net.clone(),
                            BNN_LIKELIHOOD,
                            &fp,
                            &Data::new(&xtr, &ytr_m)?.with_optional_validation(val)?,
                            &cfg,
                        )?;
                        let loss = best_validation_loss(&f.report);
                        if gammas.len() > 1 {
                            run.log(format!(
                                "{dataset} {method} γ = {gamma:e}: best validation NLL {loss:.4} at step {} of {}",
                                f.report.best_step, f.report.steps
                            ));
                        }
                        if chosen.as_ref().is_none_or(|(best, _, _)| loss < *best) {
                            chosen = Some((loss, gamma, f));
                        }
                    }
                    let (_, gamma, f) =
                        chosen.ok_or_else(|| anyhow::anyhow!("GFSVI/TFSVI need at least one γ"))?;
                    if gammas.len() > 1 {
                        chosen_gamma = Some(gamma);
                    }
                    let s = f.posterior.noise_std();
                    (Box::new(f.posterior), s)
                }
                "FVI" => {
                    let cfg = FviConfig {
                        measurement_box: Some(bbox.clone()),
                        optim: optim(b, seed),
                        ..Default::default()
                    };
                    let f = fvi::fit(
                        net.clone(),
                        BNN_LIKELIHOOD,
                        &prior,
                        &Data::new(&xtr, &ytr_m)?.with_optional_validation(val)?,
                        &cfg,
                    )?;
                    let s = f.posterior.noise_std();
                    (Box::new(f.posterior), s)
                }
                "MFVI" => {
                    let cfg = MfviConfig { optim: optim(b, seed), ..Default::default() };
                    let f = mfvi::fit(
                        net.clone(),
                        BNN_LIKELIHOOD,
                        &Data::new(&xtr, &ytr_m)?.with_optional_validation(val)?,
                        &cfg,
                    )?;
                    let s = f.posterior.noise_std();
                    (Box::new(f.posterior), s)
                }
                "Laplace" => {
                    let yva = DVector::from_column_slice(yva_m.as_slice());
                    let (post, s) = map_laplace(
                        &net,
                        &xtr,
                        &ytr,
                        Some((&xva, &yva)),
                        LAPLACE_STRUCTURE,
                        b.steps,
                        1e-3,
                        seed,
                    )?;
                    (Box::new(post), s)
                }
                "SVGP" => {
                    let svgp = crate::protocols::svgp(
                        &kernel,
                        noise_var,
                        &xtr,
                        &ytr_m,
                        &SvgpConfig {
                            schedule: Schedule::steps(2000),
                            seed,
                            ..Default::default()
                        },
                    )?;
                    let s = svgp.noise_variance().sqrt();
                    (Box::new(svgp), s)
                }
                _ => {
                    let gp = crate::protocols::exact_gp(&kernel, noise_var, &xtr, &ytr_m)?;
                    (Box::new(gp), noise_var.sqrt())
                }
            };
            let [ell, mse, ood_accuracy] = scores(post.as_ref(), noise, &xte, &yte, &ood)?;
            run.log(format!("{dataset} {method}: ELL {ell:.3}, MSE {mse:.3}, OOD acc {ood_accuracy:.3}, σ_y {noise:.3}"));
            let prior_fit_seconds = if method == "GP" { gp_secs } else { 0.0 };
            Ok(FoldScore { ell, mse, ood_accuracy, prior_fit_seconds, gamma: chosen_gamma })
        })?;
        out.push(FoldScore::columns(&unit));
    }
    Ok(out)
}

/// The regulariser `γ` of GFSVI's and TFSVI's regularised KL on the UCI sets: the paper's 1e-10
/// (`--gamma 1e-10`; why the default is the grid [`UCI_GAMMA_GRID`]: `docs/DEVIATIONS.md`,
/// "GFSVI UCI: γ").
pub const UCI_GAMMA: f64 = 1e-10;

/// The γ grid `gfsvi-uci` / `gfsvi-ood` choose from by default, per fold and method, by the
/// lowest validation NLL (no test data involved): the paper's [`UCI_GAMMA`] and 1e-6
/// (measurements: `docs/DEVIATIONS.md`, "GFSVI UCI: γ").
pub const UCI_GAMMA_GRID: [f64; 2] = [UCI_GAMMA, 1e-6];

/// The table's sentence on γ: the paper's value, a `--gamma` override, or the choice per fold.
fn gamma_footnote(
    ck: &Checkpoint<Timed<FoldScore>>,
    all: &[&SetScores<'_>],
    gammas: &[f64],
) -> Result<String> {
    Ok(match gammas {
        [g] if *g == UCI_GAMMA => format!(
            "GFSVI and TFSVI use the paper's γ = {UCI_GAMMA:e} (`--gamma`; the default chooses it per fold from \
             {UCI_GAMMA_GRID:?} by validation); where a fitted kernel is nearly low-rank over the \
             measurement box (yacht) that makes D_KL^γ ≈ 1e4 nats and the step budget does not reach the data \
             fit — `UCI_GAMMA` in the harness has the measurement. "
        ),
        [g] => format!("GFSVI and TFSVI use γ = {g:e} (`--gamma`; the paper's is {UCI_GAMMA:e}). "),
        _ => {
            let grid: Vec<String> = gammas.iter().map(|g| format!("{g:e}")).collect();
            let mut text = format!(
                "GFSVI and TFSVI choose γ per fold from {{{}}} (`UCI_GAMMA_GRID`, or `--gamma`) by the lowest \
                 validation NLL; the paper uses {UCI_GAMMA:e}. Chosen, fold by fold: ",
                grid.join(", ")
            );
            let mut entries = Vec::new();
            for (ds, done, _) in all {
                for method in ["GFSVI", "TFSVI"] {
                    let mut chosen = Vec::new();
                    for &f in done {
                        let g = ck.get(&unit_key(ds, f, method))?.and_then(|u| u.value.gamma);
                        chosen.push(g.map_or("?".into(), |g| format!("{g:e}")));
                    }
                    entries.push(format!("{ds} {method} {}", chosen.join(", ")));
                }
            }
            text.push_str(&entries.join("; "));
            text.push_str(". ");
            text
        }
    })
}

fn run_tables(opts: &Options, name: &str, ood_table: bool) -> Result<()> {
    let mut run = Run::open(&opts.out, name, opts.resume)?;
    let b = if opts.quick { &QUICK } else { &FULL };
    let folds = selected_folds(opts, b.folds);
    let gammas = opts.gammas.clone().unwrap_or_else(|| UCI_GAMMA_GRID.to_vec());
    let datasets = selected_sets(opts, b.datasets)?;
    // A unit is one method on one fold; the settings that change its numbers name the file
    // (one γ is stored as a number, as before the grid existed, so older checkpoints resume).
    let gamma_setting = if let [g] = gammas.as_slice() { json!(g) } else { json!(gammas) };
    let mut ck = Checkpoint::<Timed<FoldScore>>::open(
        &mut run,
        &json!({ "steps": b.steps, "m": b.m, "seed": opts.seed, "prior_fit": PRIOR_FIT, "map_patience": PATIENCE_EPOCHS, "laplace": format!("{LAPLACE_STRUCTURE:?}"), "gamma": gamma_setting }),
    )?;
    run.log(format!(
        "{} of 5 per set, ≤ {} Adam steps, M = {}, γ {:?}, sets {:?}",
        folds_label(&folds),
        b.steps,
        b.m,
        gammas,
        datasets
    ));
    // Per dataset: its finished folds and, per method, per fold [ell, mse, acc, secs].
    let mut all: Vec<SetScores<'_>> = Vec::new();
    for &ds in &datasets {
        let data = load(ds)?;
        let splits = kfold(data.x.nrows(), 5, 0.1, &mut StdRng::seed_from_u64(opts.seed))?;
        all.push((ds, Vec::new(), vec![Vec::new(); METHODS.len()]));
        for &f in &folds {
            let fold = &splits[f];
            run.log(format!(
                "{ds}: fold {} ({} train / {} validation / {} test)",
                f + 1,
                fold.train.len(),
                fold.validation.len(),
                fold.test.len()
            ));
            let scores = run_fold(&mut run, &mut ck, ds, &data, (f, fold), b, &gammas, opts.seed + f as u64)?;
            let (_, done, per_method) = all.last_mut().expect("pushed above");
            done.push(f);
            for (k, s) in scores.into_iter().enumerate() {
                per_method[k].push(s);
            }
            // Written after every fold, so an interrupted run leaves its finished folds behind
            // (a partial set's row names them).
            write_tables(&mut run, &ck, name, &all, (&folds, &gammas), ood_table)?;
        }
    }
    Ok(())
}

/// One set's finished folds (numbered from 0) and, per method, per fold `[ell, mse, acc, secs]`.
type SetScores<'a> = (&'a str, Vec<usize>, Vec<Vec<[f64; 4]>>);

fn write_tables(
    run: &mut Run,
    ck: &Checkpoint<Timed<FoldScore>>,
    name: &str,
    all: &[SetScores<'_>],
    (folds, gammas): (&[usize], &[f64]),
    ood_table: bool,
) -> Result<()> {
    let stat = |v: &[[f64; 4]], j: usize| {
        let n = v.len() as f64;
        let m = v.iter().map(|s| s[j]).sum::<f64>() / n;
        let sd = if v.len() > 1 {
            (v.iter().map(|s| (s[j] - m).powi(2)).sum::<f64>() / (n - 1.0)).sqrt()
        } else {
            0.0
        };
        (m, sd)
    };
    // Both experiments fit the same models, so each writes all three tables (OOD first in
    // `gfsvi-ood`): running one of them is enough.
    let mut tables: Vec<(usize, &str, bool)> = vec![
        (0, "expected log-likelihood (higher is better; Table 1)", true),
        (1, "MSE (lower is better; Table 5)", false),
        (2, "OOD accuracy (higher is better; Table 3)", true),
    ];
    if ood_table {
        tables.rotate_right(1);
    }
    let (all, partial) = finished_sets(all, folds.len());
    let mut md = format!(
        "# {name}: {} of 5-fold CV per set{partial} (mean ± std over folds); paper in parentheses\n\n",
        folds_label(folds)
    );
    let mut metrics = Metrics::new();
    for (j, title, higher) in tables {
        let mut rows = Vec::new();
        let nm = METHODS.len() - 2; // BNN methods (the gold standards are not ranked)
        let mut means = DMatrix::zeros(nm, all.len());
        let mut sds = DMatrix::zeros(nm, all.len());
        let (mut paper_means, mut paper_sds) = (means.clone(), sds.clone());
        for (c, (ds, done, per)) in all.iter().enumerate() {
            let pp = paper(ds, j);
            let mut row = vec![set_label(ds, done, folds.len())];
            for (k, method) in METHODS.iter().enumerate() {
                let (m, sd) = stat(&per[k], j);
                if k < nm {
                    means[(k, c)] = m;
                    sds[(k, c)] = sd;
                    (paper_means[(k, c)], paper_sds[(k, c)]) = pp[k];
                }
                row.push(format!("{} ± {} ({} ± {})", fmt(m), fmt(sd), pp[k].0, pp[k].1));
                metrics.insert(
                    format!("{ds}/{method}/{j}"),
                    ColumnStats {
                        mean: m,
                        std: sd,
                        folds: per[k].iter().map(|s| s[j]).collect(),
                        seconds: per[k].iter().map(|s| s[3]).collect(),
                    },
                );
            }
            rows.push(row);
        }
        rows.extend(rank_rows("mean rank (BNNs)", (&means, &sds), (&paper_means, &paper_sds), higher, 2)?);
        let mut header = vec!["dataset"];
        header.extend(METHODS);
        md.push_str(&format!("## {title}\n\n{}\n\n", markdown_table(&header, &rows)));
    }
    md.push_str(
        "Standardised units. The paper's other sets (energy, kin8nm, naval, power, protein, wave, Denmark) are in \
         no package registry and stay out. ",
    );
    md.push_str("OOD rows: the paper's song subset is in no registry; sklearn's digits (shipped) stand in — see `ood_rows` in the harness (the d highest-variance pixel columns, standardised by their own statistics, as many rows as the test fold). ");
    md.push_str(&gamma_footnote(ck, &all, gammas)?);
    md.push_str(
        "\"–\" in the rank rows: SVGP and the exact GP are not BNNs, and the paper ranks the BNNs only. ",
    );
    md.push_str(&format!("{}.\n", ck.wall_time()));
    run.write_table(&md)?;
    run.write_metrics(&metrics)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_written_mid_set_names_the_partial_set_s_folds() {
        let dir = std::env::temp_dir().join(format!("fspace-gfsvi-uci-{}", std::process::id()));
        let mut run = Run::new(dir.to_str().unwrap(), "gfsvi-uci").unwrap();
        let ck = Checkpoint::<Timed<FoldScore>>::open(&mut run, &json!({})).unwrap();
        let per = |folds: usize| vec![vec![[-1.0, 0.5, 0.9, 2.0]; folds]; METHODS.len()];
        let all: Vec<SetScores<'_>> = vec![
            ("boston", vec![0, 1], per(2)),
            ("concrete", vec![0], per(1)),
            // A set the run has not reached yet is left out.
            ("yacht", vec![], per(0)),
        ];
        write_tables(&mut run, &ck, "gfsvi-uci", &all, (&[0, 1], &[UCI_GAMMA]), false).unwrap();
        let md = std::fs::read_to_string(run.path("table.md")).unwrap();
        assert!(md.starts_with(
            "# gfsvi-uci: 2 fold(s) of 5-fold CV per set (a set with fewer names its finished ones)"
        ));
        assert!(md.contains("| boston |") && md.contains("| concrete (1 fold(s)) |"), "{md}");
        assert!(!md.contains("yacht |"), "{md}");
        let metrics: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(run.path("metrics.json")).unwrap()).unwrap();
        assert_eq!(metrics["concrete/GFSVI/0"]["folds"], json!([-1.0]));
        assert!(metrics.get("yacht/GFSVI/0").is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
