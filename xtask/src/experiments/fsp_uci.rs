//! `fsp-uci` — FSP-Laplace Table C.1: expected log-likelihood and OOD-detection accuracy on the
//! UCI regression sets shipped in `datasets/` (Boston, concrete, red wine, yacht; the paper's
//! energy, kin8nm, naval, power, protein, wave and Denmark are in no package registry).
//!
//! Protocol (App. B.2): 5-fold cross-validation with 10 % of the training folds for validation
//! (the folds, standardisation and marginal-likelihood ARD-RBF prior of `gfsvi-uci`, see
//! [`crate::protocols::uci::prepare`]); 2×50 tanh; learned homoscedastic noise; early stopping on the
//! validation loss (patience 500 optimiser steps for every network, see
//! [`crate::protocols::uci::PATIENCE_EPOCHS`]); the paper's mean-rank rule (standard errors over folds).
//! * FSP-Laplace: 100 context points per step uniform on the data box widened by half its range
//!   (the paper's rule), Laplace at 200 Halton points of the same box, Lanczos ≤ 500.
//! * FVI: the same prior, 100 uniform measurement points per step in the same box.
//! * Laplace: MAP (σ_p = 0.75) and the full GGN, prior precision by the Laplace marginal likelihood.
//! * MAP: that network's point prediction (ELL with zero epistemic variance; no OOD column, as
//!   in the paper).
//! * GP and sparse GP (100 k-means inducing points): the fold's fitted prior.
//!
//! The paper estimates the ELL with 10 posterior samples; we use its exact value
//! `E_q[log N(y | f, σ²)]` (closed form for Gaussian marginals), which those samples estimate.
//! OOD: one threshold on the predictive variance of `f`, ID test fold against as many rows of
//! the shared substitute [`crate::protocols::uci::ood_rows`] (the paper's song subset is in no registry).

use fspace_kernels::GpPrior;

use anyhow::Result;
use fspace_core::Data;
use fspace_core::Fitted;
use fspace_core::LikelihoodSpec;
use fspace_core::Posterior;
use fspace_core::Schedule;
use fspace_data::kfold;
use fspace_fsp_laplace::{fit as fsp_fit, ContextDesign, FspConfig};
use fspace_gfsvi::{fvi, FviConfig, OptimConfig};
use fspace_gp::SvgpConfig;
use fspace_laplace::{MarglikConfig, Structure};
use nalgebra::{DMatrix, DVector};
use rand::rngs::StdRng;
use rand::SeedableRng;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::harness::checkpoint::{or_nan, or_nan_vec, Checkpoint, Timed};
use crate::harness::registry::Options;
use crate::harness::report::{fmt, markdown_table, mean_std, Run};
use crate::protocols::tanh_mlp;
use crate::protocols::uci::ood_rows;
use crate::protocols::uci::{
    finished_sets, load, map_laplace, prepare, rank_rows, scores, set_label, stored_fold, unit_key, Prepared,
    PATIENCE_EPOCHS, PRIOR_FIT,
};

const METHODS: [&str; 6] = ["FSP-Laplace", "FVI", "Laplace", "MAP", "GP", "Sparse GP"];
/// Methods with an OOD column in the paper (all but MAP).
const OOD_METHODS: [usize; 5] = [0, 1, 2, 4, 5];

/// `(mean, std)` pairs, one per method.
type Row<const N: usize> = [(f64, f64); N];

/// The paper's Table C.1 rows: ELL per method, then OOD accuracy per OOD method.
fn paper(ds: &str) -> (Row<6>, Row<5>) {
    match ds {
        "boston" => (
            [
                (-0.641, 0.084),
                (-0.512, 0.105),
                (-0.733, 0.019),
                (-0.908, 0.274),
                (-1.136, 0.035),
                (-0.762, 0.077),
            ],
            [(0.923, 0.015), (0.754, 0.019), (0.913, 0.008), (0.948, 0.004), (0.969, 0.003)],
        ),
        "concrete" => (
            [
                (-0.352, 0.052),
                (-0.378, 0.076),
                (-0.538, 0.026),
                (-0.199, 0.056),
                (-0.766, 0.115),
                (-0.609, 0.005),
            ],
            [(0.914, 0.007), (0.585, 0.011), (0.859, 0.002), (0.878, 0.005), (0.854, 0.007)],
        ),
        "wine" => (
            [
                (-1.189, 0.019),
                (-1.193, 0.015),
                (-1.403, 0.014),
                (-1.174, 0.022),
                (-1.313, 0.032),
                (-1.194, 0.020),
            ],
            [(0.591, 0.024), (0.541, 0.012), (0.761, 0.012), (0.812, 0.008), (0.680, 0.014)],
        ),
        _ => (
            [(0.183, 0.438), (0.655, 0.293), (0.136, 0.762), (1.644, 0.310), (1.336, 0.060), (1.532, 0.139)],
            [(0.973, 0.008), (0.594, 0.010), (0.851, 0.029), (0.842, 0.023), (0.651, 0.011)],
        ),
    }
}

struct Budget {
    epochs: usize,
    fvi_steps: usize,
    folds: usize,
    datasets: &'static [&'static str],
}
const FULL: Budget =
    Budget { epochs: 10_000, fvi_steps: 3000, folds: 5, datasets: &["boston", "concrete", "wine", "yacht"] };
const QUICK: Budget = Budget { epochs: 300, fvi_steps: 100, folds: 1, datasets: &["yacht"] };

/// One method's scores on one fold (the checkpoint's unit; standardised units).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FoldScore {
    /// Expected log-likelihood per test point.
    #[serde(deserialize_with = "or_nan")]
    pub ell: f64,
    /// OOD-detection accuracy (NaN for MAP, which has no epistemic variance).
    #[serde(deserialize_with = "or_nan")]
    pub ood_accuracy: f64,
}

/// One method's score on one set over folds.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ColumnStats {
    /// Mean over folds.
    #[serde(deserialize_with = "or_nan")]
    pub mean: f64,
    /// Standard error over folds.
    #[serde(deserialize_with = "or_nan")]
    pub se: f64,
    /// Each fold's score.
    #[serde(deserialize_with = "or_nan_vec")]
    pub folds: Vec<f64>,
    /// Each fold's seconds.
    pub seconds: Vec<f64>,
}

/// `metrics.json`: per `"set/method/ell"` and `"set/method/ood_accuracy"`.
pub type Metrics = std::collections::BTreeMap<String, ColumnStats>;

impl FoldScore {
    /// The table's columns: ELL, OOD accuracy, seconds.
    fn columns(unit: &Timed<FoldScore>) -> [f64; 3] {
        [unit.value.ell, unit.value.ood_accuracy, unit.seconds]
    }
}

fn run_fold(
    run: &mut Run,
    ck: &mut Checkpoint<Timed<FoldScore>>,
    (ds, f): (&str, usize),
    p: &Prepared,
    b: &Budget,
    seed: u64,
) -> Result<Vec<[f64; 3]>> {
    let ood = ood_rows(p.xtr.ncols(), p.xte.nrows(), seed)?;
    let d = p.xtr.ncols();
    let net = tanh_mlp(d, &[50, 50], 1, seed)?;
    let widened = fspace_context::BoundingBox::from_data(&p.xtr, 0.5)?;
    let yva = DVector::from_column_slice(p.yva_m.as_slice());
    let mut out = Vec::new();
    let mut map_net = None;
    for method in METHODS {
        // MAP is the Laplace's network: Laplace is kept only together with it, and MAP only when
        // Laplace was not refitted in this part.
        let keep = match method {
            "Laplace" => ck.has(&unit_key(ds, f, "MAP")),
            "MAP" => map_net.is_none(),
            _ => true,
        };
        let unit = ck.unit_keeping(run, &unit_key(ds, f, method), keep, |run| {
            let (post, noise): (Option<Box<dyn Posterior>>, f64) = match method {
                "FSP-Laplace" => {
                    let cfg = FspConfig {
                        schedule: Schedule::epochs(b.epochs).patience(PATIENCE_EPOCHS),
                        batch_size: p.xtr.nrows(),
                        learning_rate: 1e-3,
                        seed,
                        n_context: 100,
                        design: ContextDesign::Halton,
                        n_laplace_context: 200,
                        context_box: Some(widened.clone()),
                        ..Default::default()
                    };
                    let prior = GpPrior::centered(p.kernel.clone());
                    let Fitted { posterior: post, report: summary } = fsp_fit(
                        net.clone(),
                        LikelihoodSpec::gaussian_learned(0.5),
                        &prior,
                        &Data::new(&p.xtr, &crate::protocols::targets(&p.ytr, 1))?
                            .with_validation(&p.xva, &crate::protocols::targets(&yva, 1))?,
                        &cfg,
                    )?;
                    (Some(Box::new(post)), summary.likelihood.noise_std().unwrap_or(0.5))
                }
                "FVI" => {
                    let cfg = FviConfig {
                        n_uniform: 100,
                        n_batch: 0,
                        measurement_box: Some(widened.clone()),
                        optim: OptimConfig {
                            learning_rate: 1e-3,
                            batch_size: p.xtr.nrows(),
                            schedule: Schedule::steps(b.fvi_steps).every_steps(100).patience(5),
                            seed,
                        },
                        ..Default::default()
                    };
                    let f = fvi::fit(
                        net.clone(),
                        LikelihoodSpec::gaussian_learned(0.5),
                        &GpPrior::centered(p.kernel.clone()),
                        &Data::new(&p.xtr, &p.ytr_m)?.with_optional_validation(Some((&p.xva, &p.yva_m)))?,
                        &cfg,
                    )?;
                    let s = f.posterior.noise_std();
                    (Some(Box::new(f.posterior)), s)
                }
                "Laplace" => {
                    let (mut post, s) = map_laplace(
                        &net,
                        &p.xtr,
                        &p.ytr,
                        Some((&p.xva, &yva)),
                        Structure::full(),
                        b.epochs,
                        1e-3,
                        seed,
                    )?;
                    post.optimize_prior_precision(&MarglikConfig::default())?;
                    map_net = Some((post.network().clone(), s));
                    (Some(Box::new(post)), s)
                }
                "MAP" => (None, map_net.as_ref().map(|m| m.1).unwrap_or(f64::NAN)),
                "GP" => {
                    let gp = crate::protocols::exact_gp(&p.kernel, p.noise_var, &p.xtr, &p.ytr_m)?;
                    (Some(Box::new(gp)), p.noise_var.sqrt())
                }
                _ => {
                    let svgp = crate::protocols::svgp(
                        &p.kernel,
                        p.noise_var,
                        &p.xtr,
                        &p.ytr_m,
                        &SvgpConfig { schedule: Schedule::steps(2000), seed, ..Default::default() },
                    )?;
                    let s = svgp.noise_variance().sqrt();
                    (Some(Box::new(svgp)), s)
                }
            };
            let (ell, acc) = match post {
                Some(post) => {
                    let [ell, _, acc] = scores(post.as_ref(), noise, &p.xte, &p.yte, &ood)?;
                    (ell, acc)
                }
                None => {
                    let (mnet, s) = map_net.as_ref().expect("Laplace runs before MAP");
                    let f: Vec<f64> = mnet.forward(&p.xte)?.iter().cloned().collect();
                    let y: Vec<f64> = p.yte.iter().cloned().collect();
                    let zeros = vec![0.0; y.len()];
                    (fspace_metrics::gaussian_expected_log_likelihood(&f, &zeros, s * s, &y)?, f64::NAN)
                }
            };
            run.log(format!("{ds} {method}: ELL {ell:.3}, OOD acc {acc:.3}, σ_y {noise:.3}"));
            Ok(FoldScore { ell, ood_accuracy: acc })
        })?;
        out.push(FoldScore::columns(&unit));
    }
    Ok(out)
}

/// `fsp-uci`: Table C.1.
pub fn run(opts: &Options) -> Result<()> {
    let mut run = Run::open(&opts.out, "fsp-uci", opts.resume)?;
    let b = if opts.quick { &QUICK } else { &FULL };
    let folds = opts.seeds.unwrap_or(b.folds).clamp(1, 5);
    // A unit is one method on one fold; the settings that change its numbers name the file.
    let mut ck = Checkpoint::<Timed<FoldScore>>::open(
        &mut run,
        &json!({
            "epochs": b.epochs, "fvi_steps": b.fvi_steps, "seed": opts.seed, "prior_fit": PRIOR_FIT,
            "patience": PATIENCE_EPOCHS,
        }),
    )?;
    run.log(format!(
        "{folds} fold(s) of 5 per set, ≤ {} epochs (FVI ≤ {} steps), sets {:?}",
        b.epochs, b.fvi_steps, b.datasets
    ));
    // Per dataset: its finished folds and, per method, per fold [ell, ood accuracy, secs].
    let mut all: Vec<SetScores<'_>> = Vec::new();
    for &ds in b.datasets {
        let data = load(ds)?;
        let splits = kfold(data.x.nrows(), 5, 0.1, &mut StdRng::seed_from_u64(opts.seed))?;
        all.push((ds, Vec::new(), vec![Vec::new(); METHODS.len()]));
        for (f, fold) in splits.iter().take(folds).enumerate() {
            let seed = opts.seed + f as u64;
            let scores = match stored_fold(&ck, ds, f, &METHODS)? {
                Some(stored) => {
                    run.log(format!("{ds} fold {}: every method in checkpoint.json (--resume)", f + 1));
                    stored.iter().map(FoldScore::columns).collect()
                }
                None => run_fold(&mut run, &mut ck, (ds, f), &prepare(&data, fold, seed)?, b, seed)?,
            };
            let (_, done, per) = all.last_mut().expect("pushed above");
            done.push(f);
            for (k, s) in scores.into_iter().enumerate() {
                per[k].push(s);
            }
            // Written after every fold, so an interrupted run leaves its finished folds behind
            // (a partial set's row names them).
            write_table(&mut run, &ck, &all, folds, opts.quick)?;
        }
    }
    Ok(())
}

/// One set's finished folds (numbered from 0) and, per method, per fold `[ell, ood acc, secs]`.
type SetScores<'a> = (&'a str, Vec<usize>, Vec<Vec<[f64; 3]>>);

fn write_table(
    run: &mut Run,
    ck: &Checkpoint<Timed<FoldScore>>,
    all: &[SetScores<'_>],
    folds: usize,
    quick: bool,
) -> Result<()> {
    let (all, partial) = finished_sets(all, folds);
    // Mean and standard error over folds.
    let stat = |v: &[[f64; 3]], j: usize| {
        let (m, sd) = mean_std(&v.iter().map(|s| s[j]).collect::<Vec<_>>());
        (m, sd / (v.len() as f64).sqrt())
    };
    let mut md = format!(
        "# fsp-uci (FSP-Laplace Table C.1){}: {folds} fold(s) of 5-fold CV per set{partial}, mean ± standard error over folds; paper in parentheses\n\n",
        if quick { " — quick mode" } else { "" }
    );
    let mut metrics = Metrics::new();
    for (j, title, methods) in [
        (0usize, "expected log-likelihood (higher is better)", (0..METHODS.len()).collect::<Vec<_>>()),
        (1, "OOD-detection accuracy (higher is better)", OOD_METHODS.to_vec()),
    ] {
        let mut rows = Vec::new();
        let mut means = DMatrix::zeros(methods.len(), all.len());
        let mut ses = DMatrix::zeros(methods.len(), all.len());
        // The paper's numbers on the same sets, ranked by the same rule (its own row covers 11).
        let (mut paper_means, mut paper_ses) = (means.clone(), ses.clone());
        for (c, (ds, done, per)) in all.iter().enumerate() {
            let (pe, po) = paper(ds);
            let mut row = vec![set_label(ds, done, folds)];
            for (r, &k) in methods.iter().enumerate() {
                let (m, se) = stat(&per[k], j);
                means[(r, c)] = m;
                ses[(r, c)] = se;
                let pp = if j == 0 { pe[k] } else { po[r] };
                (paper_means[(r, c)], paper_ses[(r, c)]) = pp;
                row.push(format!("{} ± {} ({} ± {})", fmt(m), fmt(se), pp.0, pp.1));
                metrics.insert(
                    format!("{ds}/{}/{}", METHODS[k], if j == 0 { "ell" } else { "ood_accuracy" }),
                    ColumnStats {
                        mean: m,
                        se,
                        folds: per[k].iter().map(|s| s[j]).collect(),
                        seconds: per[k].iter().map(|s| s[2]).collect(),
                    },
                );
            }
            rows.push(row);
        }
        rows.extend(rank_rows("mean rank", (&means, &ses), (&paper_means, &paper_ses), true, 0)?);
        let mut header = vec!["dataset"];
        header.extend(methods.iter().map(|&k| METHODS[k]));
        md.push_str(&format!("## {title}\n\n{}\n\n", markdown_table(&header, &rows)));
    }
    md.push_str(&format!(
        "Standardised units; ELL exact (closed form) instead of the paper's 10-sample estimate. The paper's energy, kin8nm, naval, \
power, protein, wave and Denmark sets are in no package registry. OOD rows: sklearn's digits stand in for the song subset \
(`ood_rows`). \"–\": MAP is a point prediction with no epistemic variance, so it has no OOD detector (its ELL uses σ_y alone). {}.\n",
        ck.wall_time()
    ));
    run.write_table(&md)?;
    run.write_metrics(&metrics)
}
