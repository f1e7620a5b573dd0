//! The UCI regression protocol of the GFSVI tables (App. A.2.2) and FSP-Laplace Table C.1:
//! the shipped sets, 5-fold splits with 10 % validation, standardisation and the ARD RBF prior
//! fitted per fold, the scores (ELL, MSE, OOD accuracy), the mean-rank rows, the MAP + Laplace
//! baseline, resumable units and the OOD substitute rows.

use std::time::Instant;

use anyhow::Result;
use fspace_core::Schedule;
use fspace_core::{Data, FunctionPredictive, Gaussian, LikelihoodSpec, Posterior};
use fspace_data::{boston, concrete, distinct_rows, wine_quality_red, yacht, Dataset, Standardizer};
use fspace_kernels::{PriorMean, Rbf};
use fspace_laplace::{fit as laplace_fit, LaplaceConfig, Predictive, PriorPrecision, Structure};
use fspace_nn::{train_map, Mlp, TrainConfig};
use nalgebra::{DMatrix, DVector};

use super::targets;
use crate::harness::checkpoint::Checkpoint;
use crate::harness::registry::Options;

/// The UCI regression sets shipped in `datasets/`, in table order.
pub const UCI_SETS: [&str; 4] = ["boston", "concrete", "wine", "yacht"];

/// The folds to run, numbered from 0: `--folds`, else the first `--seeds` (else `default`) of 5.
pub fn selected_folds(opts: &Options, default: usize) -> Vec<usize> {
    match &opts.folds {
        Some(folds) => folds.iter().map(|f| f - 1).collect(),
        None => (0..opts.seeds.unwrap_or(default).clamp(1, 5)).collect(),
    }
}

/// How a table names its folds: "3 fold(s)" for the first three, else "fold 2" or "folds 4, 5".
pub fn folds_label(folds: &[usize]) -> String {
    let names: Vec<String> = folds.iter().map(|f| (f + 1).to_string()).collect();
    match folds {
        _ if folds.iter().enumerate().all(|(i, &f)| i == f) => format!("{} fold(s)", folds.len()),
        [_] => format!("fold {}", names[0]),
        _ => format!("folds {}", names.join(", ")),
    }
}

/// A table row's name for a set with the folds `done` (numbered from 0) of the run's `n_folds`:
/// the set alone when all are in, else which ones ("concrete (2 fold(s))", "wine (fold 3)"), so
/// a table written mid-run never passes a partial set off as a whole one.
pub fn set_label(ds: &str, done: &[usize], n_folds: usize) -> String {
    if done.len() < n_folds {
        format!("{ds} ({})", folds_label(done))
    } else {
        ds.to_string()
    }
}

/// A set, its finished folds (numbered from 0) and their scores.
pub type SetFolds<'a, T> = (&'a str, Vec<usize>, T);

/// The sets of a table written mid-run: those with a finished fold, and the title's note when
/// one of them has fewer than the run's `n_folds` (each entry: set, finished folds, scores).
pub fn finished_sets<'s, 'a, T>(
    all: &'s [SetFolds<'a, T>],
    n_folds: usize,
) -> (Vec<&'s SetFolds<'a, T>>, &'static str) {
    let shown: Vec<_> = all.iter().filter(|(_, done, _)| !done.is_empty()).collect();
    let partial = shown.iter().any(|(_, done, _)| done.len() < n_folds);
    (shown, if partial { " (a set with fewer names its finished ones)" } else { "" })
}

/// The sets to run: `default`, or `--sets` (any of the full run's, in the order given).
pub fn selected_sets(opts: &Options, default: &[&'static str]) -> Result<Vec<&'static str>> {
    match &opts.sets {
        None => Ok(default.to_vec()),
        Some(names) => names
            .iter()
            .map(|n| {
                UCI_SETS.iter().copied().find(|d| d == n).ok_or_else(|| {
                    anyhow::anyhow!("--sets: unknown set {n:?}; the UCI tables know {UCI_SETS:?}")
                })
            })
            .collect(),
    }
}

/// A shipped UCI set by its table name (`boston`, `concrete`, `wine`, `yacht`).
pub fn load(name: &str) -> Result<Dataset> {
    Ok(match name {
        "boston" => boston()?,
        "concrete" => concrete()?,
        "yacht" => yacht()?,
        _ => wine_quality_red()?,
    })
}

/// ELL (closed form), MSE and OOD accuracy (one threshold on `Var[f]`) of a posterior.
pub fn scores(
    post: &dyn Posterior,
    noise_std: f64,
    xt: &DMatrix<f64>,
    yt: &DVector<f64>,
    ood: &DMatrix<f64>,
) -> Result<[f64; 3]> {
    let p: FunctionPredictive = post.predict(xt)?;
    let mean: Vec<f64> = p.mean.iter().cloned().collect();
    let var: Vec<f64> = p.var.iter().cloned().collect();
    let y: Vec<f64> = yt.iter().cloned().collect();
    let ell = fspace_metrics::gaussian_expected_log_likelihood(&mean, &var, noise_std * noise_std, &y)?;
    let mse = fspace_metrics::mse(&mean, &y)?;
    let var_ood: Vec<f64> = post.predict(ood)?.var.iter().cloned().collect();
    let acc = fspace_metrics::stump_accuracy(&var, &var_ood)?;
    Ok([ell, mse, acc])
}

/// One fold in standardised units with the GP prior fitted on its training rows.
pub struct Prepared {
    /// Training features.
    pub xtr: DMatrix<f64>,
    /// Training targets.
    pub ytr: DVector<f64>,
    /// Training targets as one column.
    pub ytr_m: DMatrix<f64>,
    /// Validation features.
    pub xva: DMatrix<f64>,
    /// Validation targets as one column.
    pub yva_m: DMatrix<f64>,
    /// Test features.
    pub xte: DMatrix<f64>,
    /// Test targets.
    pub yte: DVector<f64>,
    /// ARD RBF fitted by the exact GP's marginal likelihood.
    pub kernel: fspace_kernels::Rbf,
    /// The fitted noise variance.
    pub noise_var: f64,
    /// Seconds of the prior fit.
    pub gp_secs: f64,
}

/// How [`prepare`] fits the prior (ARD RBF by marginal likelihood on the distinct training
/// records), named in the checkpoint settings of every experiment that uses it, so `--resume`
/// refuses units fitted another way.
pub const PRIOR_FIT: &str = "distinct records";

/// Standardises a fold by its training rows and fits the prior (ARD RBF + noise).
pub fn prepare(data: &Dataset, fold: &fspace_data::Fold, seed: u64) -> Result<Prepared> {
    let xs = Standardizer::fit(&data.x.select_rows(&fold.train))?;
    let yall = data.y_vec();
    let ytr: Vec<f64> = fold.train.iter().map(|&i| yall[i]).collect();
    let (ym, ysd) = {
        let m = ytr.iter().sum::<f64>() / ytr.len() as f64;
        (m, (ytr.iter().map(|v| (v - m).powi(2)).sum::<f64>() / ytr.len() as f64).sqrt())
    };
    let x = |idx: &[usize]| xs.transform(&data.x.select_rows(idx));
    let y = |idx: &[usize]| DVector::from_iterator(idx.len(), idx.iter().map(|&i| (yall[i] - ym) / ysd));
    let (xtr, ytr, xva, yva, xte, yte) = (
        x(&fold.train)?,
        y(&fold.train),
        x(&fold.validation)?,
        y(&fold.validation),
        x(&fold.test)?,
        y(&fold.test),
    );
    let ytr_m = DMatrix::from_column_slice(ytr.len(), 1, ytr.as_slice());
    let yva_m = DMatrix::from_column_slice(yva.len(), 1, yva.as_slice());
    let t = Instant::now();
    // Hyperparameters from the distinct training records only: counted as independent noisy
    // observations, red wine's exact duplicates collapse the fitted noise to σ² ≈ 4e-6 and the
    // exact GP's ELL to ≈ −2e5 (see `fspace_data::distinct_rows`). The GP itself then
    // conditions on every training row.
    let distinct = distinct_rows(&xtr, &ytr_m)?;
    let rep = fspace_gp::fit_hyperparameters(
        &Rbf::ard(1.0, vec![1.0; xtr.ncols()])?,
        &PriorMean::Zero,
        0.1,
        &xtr.select_rows(&distinct),
        &ytr_m.select_rows(&distinct),
        &fspace_gp::FitConfig { seed, ..Default::default() },
    )?;
    Ok(Prepared {
        xtr,
        ytr,
        ytr_m,
        xva,
        yva_m,
        xte,
        yte,
        kernel: rep.kernel,
        noise_var: rep.noise_variance,
        gp_secs: t.elapsed().as_secs_f64(),
    })
}

/// The mean-rank row of our table and, under it, the paper's per-set numbers ranked by the same
/// rule on the same sets (the papers' own mean ranks cover sets we cannot ship, so they are not
/// comparable with ours); each row padded with `pad` dashes for unranked columns. Means and
/// errors are methods × sets.
pub fn rank_rows(
    label: &str,
    (means, errors): (&DMatrix<f64>, &DMatrix<f64>),
    (paper_means, paper_errors): (&DMatrix<f64>, &DMatrix<f64>),
    higher_is_better: bool,
    pad: usize,
) -> Result<[Vec<String>; 2]> {
    let row = |label: String, ranks: Vec<f64>, wrap: fn(String) -> String| {
        let mut r = vec![label];
        r.extend(ranks.iter().map(|v| wrap(format!("{v:.2}"))));
        r.extend(std::iter::repeat_n("–".to_string(), pad));
        r
    };
    Ok([
        row(label.to_string(), fspace_metrics::mean_rank(means, errors, higher_is_better)?, |s| s),
        row(
            "paper's mean rank on these sets".to_string(),
            fspace_metrics::mean_rank(paper_means, paper_errors, higher_is_better)?,
            |s| format!("({s})"),
        ),
    ])
}

/// The checkpoint key of one method's scores on one fold.
pub fn unit_key(dataset: &str, fold: usize, method: &str) -> String {
    format!("{dataset}/fold {}/{method}", fold + 1)
}

/// The scores of every method on a fold when the checkpoint has them all (`--resume`).
pub fn stored_fold<T: serde::Serialize + serde::de::DeserializeOwned>(
    ck: &Checkpoint<T>,
    dataset: &str,
    fold: usize,
    methods: &[&str],
) -> Result<Option<Vec<T>>> {
    ck.all(methods.iter().map(|m| unit_key(dataset, fold, m)))
}

/// The GGN structure of the Laplace column: diagonal, App. A.2.2's "fully-factorized Gaussian
/// approximate posterior" (measurements in `docs/DEVIATIONS.md`, "GFSVI UCI: the Laplace column").
pub const LAPLACE_STRUCTURE: Structure = Structure::Diag;

/// The lowest validation loss an optimisation run saw (`+∞` without one; NaN losses never win).
pub fn best_validation_loss(report: &fspace_gfsvi::OptimReport) -> f64 {
    report.validation.iter().map(|&(_, l)| l).filter(|l| !l.is_nan()).fold(f64::INFINITY, f64::min)
}

/// Early-stopping patience, in evaluations (epochs, each one full-batch optimiser step), of every UCI network trained full-batch epoch by
/// epoch (MAP here, FSP-Laplace in `fsp-uci`): the same 500 steps as the variational methods'
/// validation every 100 steps with patience 5. A patience of 100 epochs stopped MAP and
/// FSP-Laplace on yacht folds 2 and 4 after ≈ 110 epochs on a transient rise of the validation
/// NLL (fold 4's MAP: 0.633 at epoch 10, 0.744 at 100, −0.52 at 800), keeping a network that
/// had barely left its initialisation (σ_y = 0.507 from 0.5).
pub const PATIENCE_EPOCHS: usize = 500;

/// MAP with the Gaussian weight prior σ_p = 0.75 (σ learned; Adam at `learning_rate`, batches
/// of up to 2 000), then the linearised Laplace with the given GGN `structure`, that prior
/// precision and the GLM predictive; returns it and σ. With a
/// validation set the MAP stops early ([`PATIENCE_EPOCHS`], best weights and σ kept):
/// without it the learned σ collapses onto the training residuals (measured on Boston: σ = 0.07,
/// test ELL −155).
pub fn map_laplace(
    net: &Mlp,
    x: &DMatrix<f64>,
    y: &DVector<f64>,
    validation: Option<(&DMatrix<f64>, &DVector<f64>)>,
    structure: Structure,
    steps: usize,
    learning_rate: f64,
    seed: u64,
) -> Result<(fspace_laplace::LaplacePosterior<Mlp>, f64)> {
    let mut map = net.clone();
    let mut lik = Gaussian::new(0.5)?;
    let precision = 1.0 / (0.75 * 0.75);
    train_map(
        &mut map,
        &mut lik,
        x,
        y,
        validation,
        None,
        &TrainConfig {
            schedule: Schedule::epochs(steps).with_patience(validation.map(|_| PATIENCE_EPOCHS)),
            batch_size: 2000.min(x.nrows()),
            learning_rate,
            weight_decay: precision,
            validation_adds_regularizer: false,
            learn_likelihood: true,
            seed,
        },
        |_| {},
    )?;
    let sigma = lik.sigma();
    let post = laplace_fit(
        map,
        LikelihoodSpec::gaussian(sigma),
        &Data::new(x, &targets(y, 1))?,
        &LaplaceConfig {
            structure,
            prior_precision: PriorPrecision::Scalar(precision),
            predictive: Predictive::Glm,
            ..Default::default()
        },
    )?
    .posterior;
    Ok((post, sigma))
}

/// The OOD rows of the regression OOD tables (GFSVI Table 3, FSP-Laplace Table C.1). The
/// papers' subset of the million-song set is in no package registry; sklearn's digits
/// (shipped in `datasets/`, 1 797 rows of 64 pixel intensities) stand in: its `d`
/// highest-variance pixel columns (ties by column order), each standardised by its own mean
/// and standard deviation (the ID features are standardised too), `n` rows of a seeded
/// permutation (`n ≤ 1 797`).
pub fn ood_rows(d: usize, n: usize, seed: u64) -> Result<DMatrix<f64>> {
    use rand::seq::SliceRandom;
    use rand::SeedableRng;
    let digits = fspace_data::digits()?;
    let x = &digits.x;
    anyhow::ensure!(d >= 1 && d <= x.ncols(), "OOD substitute has {} features, {d} requested", x.ncols());
    anyhow::ensure!(n >= 1 && n <= x.nrows(), "OOD substitute has {} rows, {n} requested", x.nrows());
    let stats: Vec<(usize, f64, f64)> = (0..x.ncols())
        .map(|c| {
            let col = x.column(c);
            let m = col.mean();
            (c, m, (col.iter().map(|v| (v - m).powi(2)).sum::<f64>() / col.len() as f64).sqrt())
        })
        .collect();
    let mut by_var = stats.clone();
    by_var.sort_by(|a, b| b.2.total_cmp(&a.2).then(a.0.cmp(&b.0)));
    let cols = &by_var[..d];
    let mut rows: Vec<usize> = (0..x.nrows()).collect();
    rows.shuffle(&mut rand::rngs::StdRng::seed_from_u64(seed ^ 0x00d5));
    Ok(DMatrix::from_fn(n, d, |i, j| {
        let (c, m, s) = cols[j];
        (x[(rows[i], c)] - m) / s
    }))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_partial_set_is_named_with_its_finished_folds() {
        assert_eq!(super::set_label("boston", &[0, 1, 2, 3, 4], 5), "boston");
        assert_eq!(super::set_label("concrete", &[0, 1], 5), "concrete (2 fold(s))");
        assert_eq!(super::set_label("wine", &[2], 5), "wine (fold 3)");
        assert_eq!(super::set_label("yacht", &[3, 4], 5), "yacht (folds 4, 5)");
        // A run of `--folds 2` is whole with its one fold.
        assert_eq!(super::set_label("yacht", &[1], 1), "yacht");
    }

    #[test]
    fn ood_rows_are_standardised_digits_columns_and_reject_bad_sizes() {
        let x = super::ood_rows(13, 1797, 0).unwrap();
        assert_eq!(x.shape(), (1797, 13));
        for c in 0..13 {
            let col = x.column(c);
            let m = col.mean();
            let v = col.iter().map(|v| (v - m).powi(2)).sum::<f64>() / 1797.0;
            assert!(m.abs() < 1e-10 && (v - 1.0).abs() < 1e-10, "column {c}: mean {m}, var {v}");
        }
        // Seeded: same rows for the same seed, another permutation for another.
        assert_eq!(super::ood_rows(8, 50, 1).unwrap(), super::ood_rows(8, 50, 1).unwrap());
        assert_ne!(super::ood_rows(8, 50, 1).unwrap(), super::ood_rows(8, 50, 2).unwrap());
        assert!(super::ood_rows(65, 10, 0).is_err());
        assert!(super::ood_rows(8, 1798, 0).is_err());
        assert!(super::ood_rows(0, 10, 0).is_err());
    }
}
