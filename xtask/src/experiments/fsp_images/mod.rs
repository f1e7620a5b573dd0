//! `fsp-mnist` and `fsp-fmnist` — FSP-Laplace Table 2 (and Fig. C.10): the paper's CNN (3×3
//! convolutions with 16, 32, 64 channels, max-pooling after the first two, dense 128, tanh) on
//! MNIST / Fashion-MNIST; FSP-Laplace with RND context points, the weight-space Laplace (KFAC),
//! MAP, FVI and a sparse GP; expected log-likelihood, accuracy, ECE and OOD accuracy beside the
//! paper's numbers, and the predictive-entropy histograms of in- and out-of-distribution test
//! images.
//!
//! Protocol (App. B.2, with the compromises a 2-core CPU forces, each stated in `table.md`):
//! * data: the shared image pipeline ([`crate::protocols::images`]): pixels standardised by one scalar
//!   mean/sd, the 60 000 training images split 90/10 into train/validation by the seed, the
//!   10 000 test images; OOD: the other set's test images (standardised with this set's
//!   statistics);
//! * prior: an RBF kernel shared by ten independent logits, its variance and lengthscale by the
//!   exact GP's marginal likelihood on Milios et al.'s Dirichlet targets (α_ε = 0.01) of a
//!   seeded subset of the training images (the paper: minibatches of all of them, and a kernel
//!   chosen among five by a W&B sweep that is not published);
//! * FSP-Laplace training (Alg. 1): Adam 1e-3, batch 100, 100 context points per step drawn
//!   uniformly from the pixel box widened by half its range per pixel (RND), early stopping on
//!   the validation NLL; Laplace (Alg. 2): Halton points in the same box for the covariance
//!   (the paper: 25 000; here `n_halton`, see the budget), at most `max_rank` Lanczos
//!   iterations, and the data term on a seeded subset of `ggn_points` training images scaled by
//!   `N/m` (an unbiased estimate of the full sum; `LaplaceConfig::ggn_scale`);
//! * MAP: the same network, Adam 1e-3, batch 100, prior precision 1 (σ_p = 1, App. B.2's
//!   weight prior), the same early stopping;
//! * Laplace: KFAC of the GGN at the MAP on a seeded subset of `kfac_points` images scaled by
//!   `N/m` (the temperature `N/m`), prior precision by the Laplace marginal likelihood, then
//!   the best of that value ×1, ×10, …, ×10⁴ by the (probit) NLL of `lambda_val` validation
//!   images — the paper tunes the prior scale on validation ELL —, the GLM predictive;
//! * every metric from 10 posterior function samples (the paper's 10): class probabilities are
//!   the mean softmax of the samples; "log-likelihood" is the mean log predictive probability
//!   of the test label (−NLL of that predictive; the per-sample expectation is in
//!   `metrics.json` too); ECE with 15 bins; OOD accuracy: a one-threshold stump on the
//!   predictive entropy, ID test set vs the other set's test set (Osawa et al.);
//! * sparse GP: Milios et al.'s Dirichlet-based classifier ([`fspace_gp::SparseDirichletGp`]) with the same
//!   fitted RBF kernel, `inducing` random training images as inducing inputs and the
//!   closed-form optimal `q(u)` (the paper's sparse GP is not specified further); class
//!   probabilities from 10 samples of the latent marginals;
//! * FVI (RND): `fit_fvi` with the categorical data term, the same prior, measurement points
//!   uniform on the widened pixel box plus the minibatch (Sun et al.'s mixture), Adam 1e-3,
//!   batch 100, validation twice per epoch with patience 2, at most `fvi_epochs` epochs and
//!   `fvi_samples` function samples per step (the paper states neither), predictions from 10
//!   weight samples;
//! * KMNIST context points: the paper's values are shown, ours are empty, with the reason in
//!   `table.md`.
//!
//! A full run is ≈ 20 minutes per seed on 2 cores (MNIST seed 0: 1 201 s; `docs/PERFORMANCE.md`). Every (seed, method) row is written to
//! `metrics.json` as it finishes, with its entropy histograms, and `--resume` keeps those rows
//! and runs only the missing ones. `fsp-mnist-halton` ([`run_halton_sweep`]) measures what the
//! Halton budget (1 000 points instead of the paper's 25 000) changes, on one trained network.

use fspace_kernels::GpPrior;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{anyhow, Result};
use fspace_context::{BoundingBox, UniformSampler};
use fspace_core::Data;
use fspace_core::LikelihoodSpec;
use fspace_core::Schedule;
use fspace_core::{Categorical, Posterior};
use fspace_fsp_laplace::{
    context_points, fit_classification_prior, laplace as fsp_laplace, train as fsp_train, ContextDesign,
    FspLaplace, FspLaplaceConfig, TrainOptions,
};
use fspace_gfsvi::{fvi, FviConfig, OptimConfig};
use fspace_gp::FitConfig;
use fspace_kernels::{Independent, Rbf};
use fspace_laplace::{fit as laplace_fit, LaplaceConfig, MarglikConfig, PriorPrecision, Structure};
use fspace_nn::{train_map, Activation, Cnn, CnnConfig, TrainConfig, TrainReport};
use nalgebra::DMatrix;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::harness::checkpoint::{or_nan, or_nan_vec, Checkpoint, Timed};
use crate::harness::plot::{line_panels, LinePanel};
use crate::harness::publish::read_metrics;
use crate::harness::registry::Options;
use crate::harness::report::{fmt, markdown_table, mean_se, pm_cell, Run};
use crate::protocols::images::{
    marginal_sampled_class_probs, sampled_class_probs, sparse_dirichlet_gp, test_with, train_val_test,
    ImageSet, Images,
};

mod fit;
mod halton;
mod rotated;
mod table;

use fit::*;
pub use halton::run_halton_sweep;
pub use rotated::run_rotated;
use table::*;

/// Table 2's columns, in the paper's order.
const COLUMNS: [&str; 7] =
    ["FSP-Laplace (KMNIST)", "FSP-Laplace (RND)", "FVI (KMNIST)", "FVI (RND)", "Laplace", "MAP", "Sparse GP"];

/// The methods we run, in the order of a seed.
const METHODS: [&str; 5] = ["FSP-Laplace (RND)", "MAP", "Laplace", "FVI (RND)", "Sparse GP"];

/// Bins of the predictive-entropy histograms on `[0, ln 10]` (Fig. C.10; stored per row so a
/// resumed run can redraw the figure).
const ENTROPY_BINS: usize = 30;

/// Counts of the ID and OOD predictive entropies on [`ENTROPY_BINS`] bins.
type EntropyHistograms = (Vec<u64>, Vec<u64>);

/// Table 2's rows.
const METRICS: [&str; 4] = ["log-likelihood (↑)", "accuracy (↑)", "ECE (↓)", "OOD accuracy (↑)"];

/// The paper's `(mean, standard error)` per metric (rows) and column.
type PaperTable = [[(f64, f64); 7]; 4];

const PAPER_MNIST: PaperTable = [
    [
        (-0.043, 0.001),
        (-0.037, 0.001),
        (-0.238, 0.006),
        (-0.145, 0.005),
        (-0.043, 0.001),
        (-0.039, 0.001),
        (-0.301, 0.002),
    ],
    [
        (0.989, 0.000),
        (0.989, 0.000),
        (0.943, 0.001),
        (0.976, 0.001),
        (0.989, 0.001),
        (0.987, 0.000),
        (0.930, 0.001),
    ],
    [
        (0.002, 0.000),
        (0.002, 0.000),
        (0.073, 0.003),
        (0.064, 0.001),
        (0.013, 0.001),
        (0.003, 0.000),
        (0.035, 0.001),
    ],
    [
        (0.977, 0.003),
        (0.895, 0.011),
        (0.891, 0.006),
        (0.894, 0.010),
        (0.907, 0.016),
        (0.889, 0.009),
        (0.904, 0.020),
    ],
];

const PAPER_FMNIST: PaperTable = [
    [
        (-0.255, 0.002),
        (-0.259, 0.003),
        (-0.311, 0.005),
        (-0.300, 0.002),
        (-0.290, 0.006),
        (-0.281, 0.002),
        (-0.479, 0.002),
    ],
    [
        (0.909, 0.001),
        (0.909, 0.001),
        (0.906, 0.002),
        (0.910, 0.002),
        (0.897, 0.002),
        (0.900, 0.001),
        (0.848, 0.001),
    ],
    [
        (0.018, 0.002),
        (0.020, 0.003),
        (0.024, 0.002),
        (0.027, 0.005),
        (0.014, 0.002),
        (0.016, 0.002),
        (0.027, 0.001),
    ],
    [
        (0.994, 0.001),
        (0.797, 0.007),
        (0.975, 0.002),
        (0.925, 0.005),
        (0.801, 0.014),
        (0.794, 0.010),
        (0.938, 0.007),
    ],
];

/// Why a column of the paper has no numbers of ours.
const NOT_RUN: [(&str, &str); 2] = [
    ("FSP-Laplace (KMNIST)", "Kuzushiji-MNIST is in no package registry (no download at run time)"),
    ("FVI (KMNIST)", "Kuzushiji-MNIST is in no package registry"),
];

/// `fsp-mnist`: runs the experiment and writes its folder.
pub fn run_mnist(opts: &Options) -> Result<()> {
    run(opts, ImageSet::Mnist)
}

/// `fsp-fmnist`: runs the experiment and writes its folder.
pub fn run_fmnist(opts: &Options) -> Result<()> {
    run(opts, ImageSet::FashionMnist)
}

/// `cargo xtask redraw fsp-mnist`: `entropy.png` of the finished run in `dir` from the
/// histograms its `metrics.json` stores per (seed, method) row, with the current figure code
/// (nothing is recomputed); returns the files written.
pub fn redraw_mnist(dir: &Path) -> Result<Vec<PathBuf>> {
    redraw(dir, ImageSet::Mnist)
}

/// `cargo xtask redraw fsp-fmnist`: as [`redraw_mnist`], for Fashion-MNIST.
pub fn redraw_fmnist(dir: &Path) -> Result<Vec<PathBuf>> {
    redraw(dir, ImageSet::FashionMnist)
}

/// The experiment of `set`: its name, OOD set, the paper's Table 2 and the two sets' titles.
fn experiment(set: ImageSet) -> (&'static str, ImageSet, &'static PaperTable, &'static str, &'static str) {
    match set {
        ImageSet::Mnist => ("fsp-mnist", ImageSet::FashionMnist, &PAPER_MNIST, "MNIST", "Fashion-MNIST"),
        ImageSet::FashionMnist => ("fsp-fmnist", ImageSet::Mnist, &PAPER_FMNIST, "Fashion-MNIST", "MNIST"),
    }
}

/// Reads `dir/metrics.json` as `set`'s metrics and draws `entropy.png` from its rows.
fn redraw(dir: &Path, set: ImageSet) -> Result<Vec<PathBuf>> {
    let (name, _, _, title, ood_title) = experiment(set);
    let path = dir.join("metrics.json");
    let metrics: Metrics = read_metrics(dir, name)?;
    let rows = metrics.per_seed.into_iter().map(Row::from_record).collect::<Result<Vec<_>>>()?;
    if !rows.iter().any(|(_, r)| r.entropy.is_some()) {
        return Err(anyhow!("{} holds no entropy histograms to draw", path.display()));
    }
    let png = dir.join("entropy.png");
    draw_entropy(&png, (title, ood_title), &rows)?;
    Ok(vec![png])
}

fn run(opts: &Options, set: ImageSet) -> Result<()> {
    let (name, ood_set, paper, title, ood_title) = experiment(set);
    let budget = Budget::new(opts);
    let mut run = Run::open(&opts.out, name, opts.resume)?;
    run.log(format!("budget: {}", serde_json::to_string(&budget)?));
    let mut ck = Checkpoint::<Timed<RowRecord>>::open(&mut run, &checkpoint_settings(&budget)?)?;
    let mut rows = stored_rows(&ck, (0..budget.seeds as u64).map(|s| opts.seed + s))?;
    // Tables and figures after every method, so a long run leaves them behind.
    // Rows in (seed, method) order, whatever order a resumed run computed them in.
    let push = |run: &mut Run, rows: &mut Vec<(u64, Row)>, unit: Timed<RowRecord>| -> Result<()> {
        let (seed, row) = Row::from_record(unit.value)?;
        rows.retain(|(s, r)| !(*s == seed && r.method == row.method));
        rows.push((seed, row));
        rows.sort_by_key(|(s, r)| (*s, METHODS.iter().position(|m| *m == r.method)));
        report(run, (name, title, ood_title), paper, rows, &budget, false)
    };
    for s in 0..budget.seeds as u64 {
        let seed = opts.seed + s;
        let todo: Vec<&str> = METHODS.into_iter().filter(|m| !ck.has(&row_key(seed, m))).collect();
        if todo.is_empty() {
            run.log(format!("seed {seed}: every method in checkpoint.json (--resume)"));
            continue;
        }
        let needs = |m: &str| todo.contains(&m);
        let SeedData { train, val, test, ood, .. } = seed_data(set, ood_set, &budget, seed)?;
        let n = train.x.nrows();
        run.log(format!(
            "seed {seed}: {n} train / {} validation / {} test / {} OOD images; to run: {todo:?}",
            val.x.nrows(),
            test.x.nrows(),
            ood.x.nrows()
        ));
        let validation = Some((&val.x, &val.y));

        // The GP prior serves FSP-Laplace, FVI and the sparse GP; a resumed seed that only
        // lacks MAP / Laplace skips its fit.
        let prior_fit = if ["FSP-Laplace (RND)", "FVI (RND)", "Sparse GP"].iter().any(|m| needs(m)) {
            Some(fit_prior(&mut run, &train, &budget, seed)?)
        } else {
            None
        };
        let fitted_prior =
            || prior_fit.as_ref().ok_or_else(|| anyhow::anyhow!("the GP prior was not fitted"));

        let bbox = BoundingBox::from_data(&train.x, 0.5)?;
        let mut lik = Categorical::new(10)?;
        // Each method through the checkpoint's driver: kept if stored, else fitted, evaluated,
        // timed and stored. FSP-Laplace (RND): Alg. 1 then Alg. 2.
        let unit = ck.unit(&mut run, &row_key(seed, "FSP-Laplace (RND)"), |run| {
            let (prior, hyper, prior_seconds) = fitted_prior()?;
            let (net, report, train_seconds) =
                train_fsp(run, &budget, &train, &val, prior, &bbox, &mut lik, seed)?;
            let (post, laplace_seconds) =
                fsp_posterior(&net, &lik, prior, &train, &bbox, budget.n_halton, &budget, seed)?;
            let rep = post.report();
            run.log(format!(
                "  FSP-Laplace: {} epochs (stopped early: {}) in {train_seconds:.1} s; Alg. 2 in {laplace_seconds:.1} s: \
                 Lanczos rank {} ({} runs, {}), range rank {}, truncated {}, rank {}",
                report.epochs,
                report.stopped_early,
                rep.lanczos_rank,
                rep.lanczos_runs,
                rep.lanczos_stop,
                rep.range_rank,
                rep.truncated,
                rep.rank
            ));
            let mut row =
                evaluate("FSP-Laplace (RND)", Predictor::Samples(&post), &test, &ood, budget.samples, seed)?;
            row.fit_seconds = train_seconds + laplace_seconds;
            row.extra = json!({
                "prior_variance": hyper[0], "prior_lengthscale": hyper[1], "prior_seconds": prior_seconds,
                "train_seconds": train_seconds, "laplace_seconds": laplace_seconds, "epochs": report.epochs,
                "stopped_early": report.stopped_early, "laplace": rep, "metrics": row.extra,
            });
            log_row(run, &row);
            Ok(row.record(seed))
        })?;
        push(&mut run, &mut rows, unit)?;

        // MAP and Laplace (KFAC) around it: the Laplace needs the network, so a MAP is kept only
        // together with its Laplace (else retrained, its stored row replaced).
        let mut map_net: Option<(Cnn, f64)> = None;
        let laplace_stored = ck.has(&row_key(seed, "Laplace"));
        let unit = ck.unit_keeping(&mut run, &row_key(seed, "MAP"), laplace_stored, |run| {
            let mut map = cnn(seed)?;
            let t0 = Instant::now();
            let bar = run.progress(budget.epochs as u64, "MAP epochs");
            let map_report = train_map(
                &mut map,
                &mut lik,
                &train.x,
                &train.y,
                validation,
                None,
                &train_config(&budget, 1.0, seed),
                |_| bar.inc(1),
            )?;
            bar.finish_and_clear();
            let map_seconds = t0.elapsed().as_secs_f64();
            let mut row = evaluate("MAP", Predictor::Map(&map), &test, &ood, budget.samples, seed)?;
            row.fit_seconds = map_seconds;
            row.extra = json!({ "epochs": map_report.epochs, "stopped_early": map_report.stopped_early, "metrics": row.extra });
            log_row(run, &row);
            map_net = Some((map, map_seconds));
            Ok(row.record(seed))
        })?;
        push(&mut run, &mut rows, unit)?;
        let unit = ck.unit(&mut run, &row_key(seed, "Laplace"), |run| {
            let (map, map_seconds) =
                map_net.as_ref().ok_or_else(|| anyhow!("the MAP network was not trained this part"))?;
            let t0 = Instant::now();
            let (lap, marglik_lambda, scores) = kfac_laplace(map, &train, &val, &budget, seed)?;
            let lambda = lap.prior_precision()[0];
            let mut row =
                evaluate("Laplace", Predictor::Samples(&lap), &test, &ood, budget.samples, seed)?;
            row.fit_seconds = map_seconds + t0.elapsed().as_secs_f64();
            row.extra = json!({
                "prior_precision": lambda, "marglik_prior_precision": marglik_lambda, "validation_nll_by_lambda": scores,
                "kfac_seconds": t0.elapsed().as_secs_f64(), "metrics": row.extra,
            });
            log_row(run, &row);
            Ok(row.record(seed))
        })?;
        push(&mut run, &mut rows, unit)?;
        // FVI (RND): the stochastic network from a fresh initialisation, the same GP prior on the
        // ten logits, measurement points uniform on the widened pixel box plus the batch.
        let unit = ck.unit(&mut run, &row_key(seed, "FVI (RND)"), |run| {
            let t0 = Instant::now();
            let labels = |imgs: &Images| DMatrix::from_column_slice(imgs.y.len(), 1, imgs.y.as_slice());
            let (y_train, y_val) = (labels(&train), labels(&val));
            let hyper = &fitted_prior()?.1;
            let fvi_prior = GpPrior::centered(Independent::new(Rbf::new(hyper[0], hyper[1])?, 10)?);
            let steps_per_epoch = n.div_ceil(100);
            let fvi_config = FviConfig {
                measurement_box: Some(bbox.clone()),
                samples: budget.fvi_samples,
                predictive_samples: budget.samples,
                optim: OptimConfig {
                    learning_rate: 1e-3,
                    batch_size: 100,
                    schedule: Schedule::epochs(budget.fvi_epochs)
                        .every_steps(steps_per_epoch.div_ceil(2))
                        .patience(2),
                    seed,
                },
                ..FviConfig::default()
            };
            let fvi = fvi::fit(
                cnn(seed)?,
                LikelihoodSpec::categorical(10),
                &fvi_prior,
                &Data::new(&train.x, &y_train)?.with_optional_validation(Some((&val.x, &y_val)))?,
                &fvi_config,
            )?;
            let fvi_seconds = t0.elapsed().as_secs_f64();
            let mut row =
                evaluate("FVI (RND)", Predictor::Samples(&fvi.posterior), &test, &ood, budget.samples, seed)?;
            row.fit_seconds = fvi_seconds;
            row.extra = json!({
                "steps": fvi.report.steps, "best_step": fvi.report.best_step,
                "validation": fvi.report.validation, "metrics": row.extra,
            });
            log_row(run, &row);
            Ok(row.record(seed))
        })?;
        push(&mut run, &mut rows, unit)?;

        // Sparse GP: Milios et al.'s Dirichlet targets, the prior's RBF kernel, a seeded random
        // subset of the training images as inducing inputs, the closed-form optimal q(u).
        let unit = ck.unit(&mut run, &row_key(seed, "Sparse GP"), |run| {
            let hyper = &fitted_prior()?.1;
            let t0 = Instant::now();
            let sgp = sparse_dirichlet_gp(&train, (hyper[0], hyper[1]), budget.inducing, seed + 8)?;
            let mut row =
                evaluate("Sparse GP", Predictor::Marginals(&sgp), &test, &ood, budget.samples, seed)?;
            row.fit_seconds = t0.elapsed().as_secs_f64();
            row.extra = json!({ "inducing": budget.inducing, "metrics": row.extra });
            log_row(run, &row);
            Ok(row.record(seed))
        })?;
        push(&mut run, &mut rows, unit)?;
    }
    // The seeds asked for, also when a resume computed nothing (another seed count, say).
    if rows.is_empty() {
        return Ok(());
    }
    report(&mut run, (name, title, ood_title), paper, &rows, &budget, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quick_budget() -> Budget {
        Budget::new(&Options {
            quick: true,
            seed: 0,
            seeds: None,
            out: String::new(),
            resume: true,
            gammas: None,
            sets: None,
            folds: None,
            covariance_points: None,
            methods: None,
        })
    }

    fn row(method: &'static str, ll: f64) -> Row {
        Row {
            method,
            metrics: [ll, 0.9, 0.01, 0.8],
            sample_ell: ll - 0.01,
            fit_seconds: 12.5,
            entropy: Some((entropy_counts(&[0.0, 0.5, 2.29, 9.0]), entropy_counts(&[1.0]))),
            extra: json!({ "epochs": 3 }),
        }
    }

    #[test]
    fn entropy_histograms_count_every_value_and_integrate_to_one() {
        let c = entropy_counts(&[0.0, 0.5, 2.29, 9.0]);
        assert_eq!(c.len(), ENTROPY_BINS);
        assert_eq!(c.iter().sum::<u64>(), 4);
        assert_eq!((c[0], c[ENTROPY_BINS - 1]), (1, 2), "values above ln 10 land in the last bin");
        let d = density(&c);
        let width = 10f64.ln() / ENTROPY_BINS as f64;
        assert!((d.iter().map(|(_, p)| p * width).sum::<f64>() - 1.0).abs() < 1e-12);
    }

    #[test]
    fn resume_reads_back_what_a_run_stores_and_refuses_another_budget() {
        let dir = std::env::temp_dir().join(format!("fspace-fsp-images-resume-{}", std::process::id()));
        let out = dir.to_str().unwrap();
        let budget = quick_budget();
        let rows = [(0u64, row("MAP", -0.25)), (1, row("FSP-Laplace (RND)", -0.2))];
        {
            let mut run = Run::new(out, "fsp-mnist").unwrap();
            let mut ck =
                Checkpoint::<Timed<RowRecord>>::open(&mut run, &checkpoint_settings(&budget).unwrap())
                    .unwrap();
            assert!(stored_rows(&ck, 0..2).unwrap().is_empty(), "a fresh run keeps nothing");
            for (s, r) in &rows {
                ck.put(&row_key(*s, r.method), &Timed { seconds: 1.0, value: r.record(*s) }).unwrap();
            }
        }
        // Another seed count is the same run continued; only the seeds asked for come back.
        let more_seeds = Budget { seeds: 5, ..quick_budget() };
        let mut run = Run::open(out, "fsp-mnist", true).unwrap();
        let ck = Checkpoint::<Timed<RowRecord>>::open(&mut run, &checkpoint_settings(&more_seeds).unwrap())
            .unwrap();
        let back = stored_rows(&ck, 0..5).unwrap();
        assert_eq!(back.len(), 2);
        for ((s0, r0), (s1, r1)) in rows.iter().zip(&back) {
            assert_eq!(
                (s0, r0.method, r0.metrics, r0.sample_ell),
                (s1, r1.method, r1.metrics, r1.sample_ell)
            );
            assert_eq!((&r0.entropy, &r0.extra, r0.fit_seconds), (&r1.entropy, &r1.extra, r1.fit_seconds));
        }
        assert_eq!(stored_rows(&ck, 1..2).unwrap().len(), 1);
        // Any other setting is not.
        let other = Budget { n_halton: 999, ..quick_budget() };
        let err = Checkpoint::<Timed<RowRecord>>::open(&mut run, &checkpoint_settings(&other).unwrap())
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("--resume only continues a run of the same settings"), "{err}");
        // An unknown method is an error, not a silently dropped row.
        let bad = RowRecord { method: "Oracle".into(), ..rows[0].1.record(0) };
        let err = Row::from_record(bad).unwrap_err().to_string();
        assert!(err.contains("Oracle"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn redraw_draws_the_entropy_figure_the_run_drew_from_metrics_alone() {
        let root = std::env::temp_dir().join(format!("fspace-fsp-images-redraw-{}", std::process::id()));
        let mut run = Run::new(root.to_str().unwrap(), "fsp-mnist").unwrap();
        let rows =
            vec![(0u64, row("MAP", -0.25)), (0, row("FSP-Laplace (RND)", -0.2)), (1, row("MAP", -0.3))];
        report(&mut run, ("fsp-mnist", "MNIST", "Fashion-MNIST"), &PAPER_MNIST, &rows, &quick_budget(), true)
            .unwrap();
        let dir = root.join("fsp-mnist");
        let drawn = std::fs::read(dir.join("entropy.png")).unwrap();
        std::fs::remove_file(dir.join("entropy.png")).unwrap();
        assert_eq!(redraw_mnist(&dir).unwrap(), vec![dir.join("entropy.png")]);
        assert!(std::fs::read(dir.join("entropy.png")).unwrap() == drawn, "the redrawn figure differs");
        // Rows from before the histograms were stored leave nothing to draw: an error, not a blank figure.
        let mut metrics: Metrics =
            serde_json::from_str(&std::fs::read_to_string(dir.join("metrics.json")).unwrap()).unwrap();
        metrics.per_seed.iter_mut().for_each(|r| r.entropy_histogram = None);
        std::fs::write(dir.join("metrics.json"), serde_json::to_string(&metrics).unwrap()).unwrap();
        let err = redraw_mnist(&dir).unwrap_err().to_string();
        assert!(err.contains("no entropy histograms"), "{err}");
        // A metrics.json of another experiment is refused with its path and the experiment's name.
        std::fs::write(dir.join("metrics.json"), "{\"seeds\": 1}").unwrap();
        let err = redraw_fmnist(&dir).unwrap_err().to_string();
        assert!(err.contains("metrics.json") && err.contains("fsp-fmnist"), "{err}");
        std::fs::remove_dir_all(&root).unwrap();
    }
}
