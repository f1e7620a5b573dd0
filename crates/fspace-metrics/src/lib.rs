//! # fspace-metrics
//!
//! The evaluation metrics of the FSP-Laplace, GFSVI, VaLLA and generalised-Laplace papers, as
//! plain functions over predictive means, standard deviations, class probabilities and targets.
//! Every function checks its inputs (lengths, finiteness, probability rows) and returns a
//! [`MetricsError`] naming the problem.
//!
//! | metric | function | definition |
//! |---|---|---|
//! | expected log-likelihood | [`gaussian_expected_log_likelihood`] | `mean −½log 2πσ² − ((y − m)² + v)/2σ²` (`E_{f~N(m,v)} log N(y; f, σ²)`) |
//! | | [`mc_expected_log_likelihood`] | mean over points of the mean of `log p(y | f_s)` over samples |
//! | predictive NLL | [`gaussian_nll`], [`categorical_nll`] | `mean −log p(y)` |
//! | MSE / RMSE | [`mse`], [`rmse`] | |
//! | CRPS | [`crps_gaussian`] | `s [z(2Φ(z) − 1) + 2φ(z) − 1/√π]`, `z = (y − m)/s` |
//! | CQM | [`cqm`] | `∫₀¹ |P[y ∈ I(α)] − α| dα`, trapezoid on 11 points (VaLLA eq. 24) |
//! | accuracy, ECE, Brier | [`accuracy`], [`ece`], [`brier`] | ECE with equal-width confidence bins (15 in the papers) |
//! | entropy | [`predictive_entropy`] | `−Σₖ pₖ log pₖ` per point |
//! | OOD | [`roc_auc`], [`stump_accuracy`] | AUC of OOD-vs-ID scores; accuracy of the best single threshold |
//! | W2 | [`w2_gaussian`], [`mean_w2`] | `√((m₁ − m₂)² + (s₁ − s₂)²)` between 1-D Gaussians |
//! | mean rank | [`ranks_with_error_bars`], [`mean_rank`] | rank 1 for the best and all overlapping it, recurse |
//!
//! Over a test set in shards (the processes of a sharded evaluation, the batches of a stream):
//! [`ClassificationSums`] and [`RegressionSums`] hold the sums behind the averaged and binned
//! metrics, merge exactly and flatten to a vector an all-reduce adds; [`Scores`] gathers the
//! scores of the rank metrics (AUC, stump), which do not sum ([`partial`]).

use fspace_input::InputError;
use nalgebra::DMatrix;
use thiserror::Error;

pub mod partial;
pub use partial::{ClassificationSums, RegressionSums, Scores};

/// Errors of the metrics.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum MetricsError {
    /// A shape, non-finite, empty or out-of-range input (the workspace's shared
    /// [`fspace_input::InputError`]).
    #[error(transparent)]
    Input(#[from] fspace_input::InputError),
    /// NaN or ±∞, or a negative standard deviation / variance.
    #[error("invalid value in {what} at index {index}: {value}")]
    InvalidValue {
        /// Which input.
        what: &'static str,
        /// Where.
        index: usize,
        /// The value.
        value: f64,
    },
    /// A class label outside `0..C` or not an integer.
    #[error("invalid label {value} at index {index} for {classes} classes")]
    InvalidLabel {
        /// Where.
        index: usize,
        /// The label.
        value: f64,
        /// Number of classes.
        classes: usize,
    },
    /// A row of probabilities that is negative or does not sum to 1 (±1e-6).
    #[error("row {row} is not a probability vector (sum {sum})")]
    NotProbabilities {
        /// The row.
        row: usize,
        /// Its sum.
        sum: f64,
    },
}

/// Result alias of this crate.
pub type Result<T, E = MetricsError> = std::result::Result<T, E>;

fn check_len(what: &'static str, expected: usize, found: usize) -> Result<()> {
    if expected != found {
        return Err(MetricsError::Input(InputError::DimensionMismatch { what, expected, found }));
    }
    if expected == 0 {
        return Err(MetricsError::Input(InputError::Empty { what }));
    }
    Ok(())
}

fn check_finite(what: &'static str, v: &[f64]) -> Result<()> {
    match v.iter().position(|x| !x.is_finite()) {
        Some(index) => Err(MetricsError::InvalidValue { what, index, value: v[index] }),
        None => Ok(()),
    }
}

fn check_nonneg(what: &'static str, v: &[f64]) -> Result<()> {
    check_finite(what, v)?;
    match v.iter().position(|x| *x < 0.0) {
        Some(index) => Err(MetricsError::InvalidValue { what, index, value: v[index] }),
        None => Ok(()),
    }
}

fn check_regression(mean: &[f64], spread: &[f64], y: &[f64], spread_name: &'static str) -> Result<()> {
    check_len("targets vs. predictive means", mean.len(), y.len())?;
    check_len(spread_name, mean.len(), spread.len())?;
    check_finite("predictive means", mean)?;
    check_finite("targets", y)?;
    check_nonneg(spread_name, spread)
}

fn check_probs(probs: &DMatrix<f64>) -> Result<()> {
    if probs.nrows() == 0 || probs.ncols() == 0 {
        return Err(MetricsError::Input(InputError::Empty { what: "class probabilities" }));
    }
    for (row, r) in probs.row_iter().enumerate() {
        let sum: f64 = r.iter().sum();
        if r.iter().any(|p| !p.is_finite() || *p < 0.0) || (sum - 1.0).abs() > 1e-6 {
            return Err(MetricsError::NotProbabilities { row, sum });
        }
    }
    Ok(())
}

fn labels(probs: &DMatrix<f64>, y: &[f64]) -> Result<Vec<usize>> {
    check_len("labels vs. probability rows", probs.nrows(), y.len())?;
    check_probs(probs)?;
    let c = probs.ncols();
    y.iter()
        .enumerate()
        .map(|(index, &value)| {
            if value >= 0.0 && value < c as f64 && value.fract() == 0.0 {
                Ok(value as usize)
            } else {
                Err(MetricsError::InvalidLabel { index, value, classes: c })
            }
        })
        .collect()
}

/// Standard normal density.
pub fn normal_pdf(z: f64) -> f64 {
    (-0.5 * z * z).exp() / (2.0 * std::f64::consts::PI).sqrt()
}

/// Standard normal CDF `Φ(z) = ½ erfc(−z/√2)`.
pub fn normal_cdf(z: f64) -> f64 {
    0.5 * libm::erfc(-z / std::f64::consts::SQRT_2)
}

/// Standard normal quantile `Φ⁻¹(p)` for `p ∈ (0, 1)`: Acklam's rational approximation polished
/// by two Newton steps (≈ machine precision); ±∞ at 0 and 1, NaN outside `[0, 1]`.
pub fn normal_quantile(p: f64) -> f64 {
    if !(0.0..=1.0).contains(&p) {
        return f64::NAN;
    }
    if p == 0.0 {
        return f64::NEG_INFINITY;
    }
    if p == 1.0 {
        return f64::INFINITY;
    }
    const A: [f64; 6] = [
        -3.969683028665376e1,
        2.209460984245205e2,
        -2.759285104469687e2,
        1.38357751867269e2,
        -3.066479806614716e1,
        2.506628277459239,
    ];
    const B: [f64; 5] = [
        -5.447609879822406e1,
        1.615858368580409e2,
        -1.556989798598866e2,
        6.680131188771972e1,
        -1.328068155288572e1,
    ];
    const C: [f64; 6] = [
        -7.784894002430293e-3,
        -3.223964580411365e-1,
        -2.400758277161838,
        -2.549732539343734,
        4.374664141464968,
        2.938163982698783,
    ];
    const D: [f64; 4] = [7.784695709041462e-3, 3.224671290700398e-1, 2.445134137142996, 3.754408661907416];
    let plow = 0.02425;
    let mut x = if p < plow {
        let q = (-2.0 * p.ln()).sqrt();
        (((((C[0] * q + C[1]) * q + C[2]) * q + C[3]) * q + C[4]) * q + C[5])
            / ((((D[0] * q + D[1]) * q + D[2]) * q + D[3]) * q + 1.0)
    } else if p <= 1.0 - plow {
        let q = p - 0.5;
        let r = q * q;
        (((((A[0] * r + A[1]) * r + A[2]) * r + A[3]) * r + A[4]) * r + A[5]) * q
            / (((((B[0] * r + B[1]) * r + B[2]) * r + B[3]) * r + B[4]) * r + 1.0)
    } else {
        let q = (-2.0 * (1.0 - p).ln()).sqrt();
        -(((((C[0] * q + C[1]) * q + C[2]) * q + C[3]) * q + C[4]) * q + C[5])
            / ((((D[0] * q + D[1]) * q + D[2]) * q + D[3]) * q + 1.0)
    };
    for _ in 0..2 {
        let pdf = normal_pdf(x);
        if pdf > 0.0 {
            x -= (normal_cdf(x) - p) / pdf;
        }
    }
    x
}

/// Mean over points of `E_{f ~ N(m, v)} log N(y; f, σ²)` (closed form), the "expected
/// log-likelihood" of FSP-Laplace's tables; `noise_var = σ² > 0`.
pub fn gaussian_expected_log_likelihood(mean: &[f64], var: &[f64], noise_var: f64, y: &[f64]) -> Result<f64> {
    check_regression(mean, var, y, "predictive variances")?;
    if !(noise_var.is_finite() && noise_var > 0.0) {
        return Err(MetricsError::Input(InputError::Invalid {
            what: "noise variance",
            reason: format!("{noise_var} must be > 0"),
        }));
    }
    let c = -0.5 * (2.0 * std::f64::consts::PI * noise_var).ln();
    Ok((0..y.len()).map(|i| c - ((y[i] - mean[i]).powi(2) + var[i]) / (2.0 * noise_var)).sum::<f64>()
        / y.len() as f64)
}

/// Monte-Carlo expected log-likelihood: `log_lik` is `S × n` with `log p(yᵢ | f_s(xᵢ))`; returns
/// the mean over points and samples.
pub fn mc_expected_log_likelihood(log_lik: &DMatrix<f64>) -> Result<f64> {
    if log_lik.is_empty() {
        return Err(MetricsError::Input(InputError::Empty { what: "Monte-Carlo log-likelihoods" }));
    }
    check_finite("Monte-Carlo log-likelihoods", log_lik.as_slice())?;
    Ok(log_lik.mean())
}

/// Mean Gaussian predictive NLL `−log N(y; m, v)` with total predictive variance `v > 0`.
pub fn gaussian_nll(mean: &[f64], var: &[f64], y: &[f64]) -> Result<f64> {
    check_gaussian_predictive(mean, var, y)?;
    Ok((0..y.len()).map(|i| gaussian_nll_term(mean[i], var[i], y[i])).sum::<f64>() / y.len() as f64)
}

/// The checks of a Gaussian predictive with total variances `var > 0` against targets `y`.
fn check_gaussian_predictive(mean: &[f64], var: &[f64], y: &[f64]) -> Result<()> {
    check_regression(mean, var, y, "predictive variances")?;
    match var.iter().position(|v| *v <= 0.0) {
        Some(index) => Err(MetricsError::InvalidValue {
            what: "predictive variances (must be > 0)",
            index,
            value: var[index],
        }),
        None => Ok(()),
    }
}

/// One point's `−log N(y; m, v)`.
fn gaussian_nll_term(mean: f64, var: f64, y: f64) -> f64 {
    0.5 * (2.0 * std::f64::consts::PI * var).ln() + (y - mean).powi(2) / (2.0 * var)
}

/// Mean categorical NLL `−log p_{yᵢ}` (probabilities clamped at 1e-300 to stay finite).
pub fn categorical_nll(probs: &DMatrix<f64>, y: &[f64]) -> Result<f64> {
    let l = labels(probs, y)?;
    Ok(l.iter().enumerate().map(|(i, &k)| categorical_nll_term(probs, i, k)).sum::<f64>() / l.len() as f64)
}

/// Point `i`'s `−log p_k` (clamped at 1e-300).
fn categorical_nll_term(probs: &DMatrix<f64>, i: usize, k: usize) -> f64 {
    -probs[(i, k)].max(1e-300).ln()
}

/// Mean squared error.
pub fn mse(pred: &[f64], y: &[f64]) -> Result<f64> {
    check_len("targets vs. predictions", pred.len(), y.len())?;
    check_finite("predictions", pred)?;
    check_finite("targets", y)?;
    Ok(pred.iter().zip(y).map(|(p, t)| (p - t).powi(2)).sum::<f64>() / y.len() as f64)
}

/// Root mean squared error.
pub fn rmse(pred: &[f64], y: &[f64]) -> Result<f64> {
    mse(pred, y).map(f64::sqrt)
}

/// Mean CRPS of Gaussian predictives `N(m, s²)` (Gneiting & Raftery 2007); `s = 0` gives the
/// absolute error.
pub fn crps_gaussian(mean: &[f64], std: &[f64], y: &[f64]) -> Result<f64> {
    check_regression(mean, std, y, "predictive standard deviations")?;
    Ok((0..y.len()).map(|i| crps_term(mean[i], std[i], y[i])).sum::<f64>() / y.len() as f64)
}

/// One point's CRPS of `N(m, s²)` (the absolute error at `s = 0`).
fn crps_term(mean: f64, std: f64, y: f64) -> f64 {
    if std == 0.0 {
        return (y - mean).abs();
    }
    let z = (y - mean) / std;
    std * (z * (2.0 * normal_cdf(z) - 1.0) + 2.0 * normal_pdf(z) - 1.0 / std::f64::consts::PI.sqrt())
}

/// The coverage levels of the CQM: `α ∈ {0, 0.1, …, 1}`.
const CQM_LEVELS: usize = 11;

/// The half-widths `Φ⁻¹((1 + α)/2)` of the CQM's central intervals at `α = 0, 0.1, …, 1`.
fn cqm_half_widths() -> [f64; CQM_LEVELS] {
    std::array::from_fn(|k| normal_quantile((1.0 + k as f64 / 10.0) / 2.0))
}

/// The CQM's integral of `|γ(α) − α|` over its `(α, γ)` curve (trapezoid rule).
fn cqm_integral(curve: &[(f64, f64)]) -> f64 {
    curve.windows(2).map(|w| 0.5 * 0.1 * ((w[0].1 - w[0].0).abs() + (w[1].1 - w[1].0).abs())).sum()
}

/// The centred quantile metric (VaLLA eq. 24): `∫₀¹ |γ(α) − α| dα` with `γ(α)` the fraction of
/// targets inside the central interval of mass `α`, `|y − m| < s·Φ⁻¹((1 + α)/2)`, by the
/// trapezoid rule on `α ∈ {0, 0.1, …, 1}` (11 points). Also returns the `(α, γ)` curve.
pub fn cqm(mean: &[f64], std: &[f64], y: &[f64]) -> Result<(f64, Vec<(f64, f64)>)> {
    check_regression(mean, std, y, "predictive standard deviations")?;
    let n = y.len() as f64;
    let curve: Vec<(f64, f64)> = cqm_half_widths()
        .iter()
        .enumerate()
        .map(|(k, &half_width)| {
            let inside = (0..y.len()).filter(|&i| (y[i] - mean[i]).abs() < std[i] * half_width).count();
            (k as f64 / 10.0, inside as f64 / n)
        })
        .collect();
    Ok((cqm_integral(&curve), curve))
}

/// Fraction of points whose most probable class is the label.
pub fn accuracy(probs: &DMatrix<f64>, y: &[f64]) -> Result<f64> {
    let l = labels(probs, y)?;
    let correct = l.iter().enumerate().filter(|(i, &k)| argmax(probs, *i) == k).count();
    Ok(correct as f64 / l.len() as f64)
}

fn argmax(probs: &DMatrix<f64>, i: usize) -> usize {
    (0..probs.ncols()).fold(0, |best, k| if probs[(i, k)] > probs[(i, best)] { k } else { best })
}

/// Expected calibration error with `bins` equal-width confidence bins on `[0, 1]` (the papers
/// use 15): `Σ_b (n_b/n) |acc_b − conf_b|`.
pub fn ece(probs: &DMatrix<f64>, y: &[f64], bins: usize) -> Result<f64> {
    if bins == 0 {
        return Err(MetricsError::Input(InputError::Invalid {
            what: "bins", reason: "must be ≥ 1".into()
        }));
    }
    let l = labels(probs, y)?;
    let (mut count, mut conf, mut acc) = (vec![0usize; bins], vec![0.0; bins], vec![0.0; bins]);
    for (i, &k) in l.iter().enumerate() {
        let pred = argmax(probs, i);
        let c = probs[(i, pred)];
        let b = ece_bin(c, bins);
        count[b] += 1;
        conf[b] += c;
        acc[b] += (pred == k) as u8 as f64;
    }
    let n = l.len() as f64;
    Ok((0..bins).filter(|&b| count[b] > 0).map(|b| (acc[b] - conf[b]).abs() / n).sum())
}

/// The ECE bin `(b/bins, (b+1)/bins]` of a confidence `c` (0 in the first).
fn ece_bin(c: f64, bins: usize) -> usize {
    ((c * bins as f64).ceil() as usize).clamp(1, bins) - 1
}

/// Brier score `mean Σₖ (pₖ − 1[y = k])²`.
pub fn brier(probs: &DMatrix<f64>, y: &[f64]) -> Result<f64> {
    let l = labels(probs, y)?;
    Ok(l.iter().enumerate().map(|(i, &k)| brier_term(probs, i, k)).sum::<f64>() / l.len() as f64)
}

/// Point `i`'s `Σₖ (pₖ − 1[y = k])²`.
fn brier_term(probs: &DMatrix<f64>, i: usize, label: usize) -> f64 {
    (0..probs.ncols()).map(|c| (probs[(i, c)] - (c == label) as u8 as f64).powi(2)).sum::<f64>()
}

/// Predictive entropy `−Σₖ pₖ log pₖ` of each row (nats).
pub fn predictive_entropy(probs: &DMatrix<f64>) -> Result<Vec<f64>> {
    check_probs(probs)?;
    Ok(probs.row_iter().map(|r| -r.iter().filter(|p| **p > 0.0).map(|p| p * p.ln()).sum::<f64>()).collect())
}

/// ID (false) and OOD (true) scores merged and sorted ascending, after checking both sets are
/// non-empty and finite.
fn sorted_labelled(id_scores: &[f64], ood_scores: &[f64]) -> Result<Vec<(f64, bool)>> {
    if id_scores.is_empty() || ood_scores.is_empty() {
        return Err(MetricsError::Input(InputError::Empty { what: "ID or OOD scores" }));
    }
    check_finite("ID scores", id_scores)?;
    check_finite("OOD scores", ood_scores)?;
    let mut all: Vec<(f64, bool)> =
        id_scores.iter().map(|&s| (s, false)).chain(ood_scores.iter().map(|&s| (s, true))).collect();
    all.sort_by(|a, b| a.0.total_cmp(&b.0));
    Ok(all)
}

/// ROC-AUC for separating out-of-distribution (`ood`, positive) from in-distribution (`id`)
/// points by a score (e.g. predictive entropy): `P(s_ood > s_id) + ½ P(s_ood = s_id)`.
pub fn roc_auc(id_scores: &[f64], ood_scores: &[f64]) -> Result<f64> {
    // Mann–Whitney U via midranks, O(n log n).
    let all = sorted_labelled(id_scores, ood_scores)?;
    let mut rank_sum_ood = 0.0;
    let mut i = 0;
    while i < all.len() {
        let mut j = i;
        while j + 1 < all.len() && all[j + 1].0 == all[i].0 {
            j += 1;
        }
        let midrank = (i + j) as f64 / 2.0 + 1.0;
        rank_sum_ood += all[i..=j].iter().filter(|x| x.1).count() as f64 * midrank;
        i = j + 1;
    }
    let (n_id, n_ood) = (id_scores.len() as f64, ood_scores.len() as f64);
    Ok((rank_sum_ood - n_ood * (n_ood + 1.0) / 2.0) / (n_id * n_ood))
}

/// Accuracy of a depth-1 decision stump separating ID (label 0) from OOD (label 1) points by
/// one threshold on a score, in either direction (FSP-Laplace App. B.2, GFSVI App. A.2.4,
/// following Osawa et al. 2019). The threshold is fitted on the given points and evaluated on
/// them, as in those papers.
pub fn stump_accuracy(id_scores: &[f64], ood_scores: &[f64]) -> Result<f64> {
    let all = sorted_labelled(id_scores, ood_scores)?;
    let n = all.len();
    let total_ood = ood_scores.len();
    // Predict OOD above the threshold: sweep thresholds between distinct sorted scores.
    let (mut id_below, mut ood_below) = (0usize, 0usize);
    let mut best = total_ood.max(n - total_ood); // everything on one side
    let mut i = 0;
    while i < n {
        let mut j = i;
        while j < n && all[j].0 == all[i].0 {
            if all[j].1 {
                ood_below += 1;
            } else {
                id_below += 1;
            }
            j += 1;
        }
        let up = id_below + (total_ood - ood_below); // OOD predicted above the cut
        let down = ood_below + (id_scores.len() - id_below); // OOD predicted below the cut
        best = best.max(up).max(down);
        i = j;
    }
    Ok(best as f64 / n as f64)
}

/// Wasserstein-2 distance between `N(m₁, s₁²)` and `N(m₂, s₂²)`.
pub fn w2_gaussian(m1: f64, s1: f64, m2: f64, s2: f64) -> f64 {
    ((m1 - m2).powi(2) + (s1 - s2).powi(2)).sqrt()
}

/// Mean pointwise W2 between two sets of Gaussian marginals.
pub fn mean_w2(m1: &[f64], s1: &[f64], m2: &[f64], s2: &[f64]) -> Result<f64> {
    check_regression(m1, s1, m2, "standard deviations (first)")?;
    check_len("standard deviations (second)", m1.len(), s2.len())?;
    check_nonneg("standard deviations (second)", s2)?;
    Ok((0..m1.len()).map(|i| w2_gaussian(m1[i], s1[i], m2[i], s2[i])).sum::<f64>() / m1.len() as f64)
}

/// Empirical Wasserstein-2 distance between two equally sized 1-D samples (the optimal coupling
/// in one dimension pairs order statistics): `√(mean((a₍ᵢ₎ − b₍ᵢ₎)²))`.
pub fn w2_empirical_1d(a: &[f64], b: &[f64]) -> Result<f64> {
    check_len("second sample", a.len(), b.len())?;
    if a.is_empty() {
        return Err(MetricsError::Input(InputError::Empty { what: "samples for the empirical W2" }));
    }
    check_finite("first sample", a)?;
    check_finite("second sample", b)?;
    let sorted = |v: &[f64]| {
        let mut s = v.to_vec();
        s.sort_by(f64::total_cmp);
        s
    };
    let (sa, sb) = (sorted(a), sorted(b));
    Ok((sa.iter().zip(&sb).map(|(x, y)| (x - y).powi(2)).sum::<f64>() / a.len() as f64).sqrt())
}

/// Ranks of methods on one dataset by the papers' rule: the best mean and every method whose
/// error bar `[m − se, m + se]` overlaps the best's get rank 1; the rule is applied again to
/// the rest with rank 2, and so on. `higher_is_better` picks the direction.
pub fn ranks_with_error_bars(
    means: &[f64],
    std_errors: &[f64],
    higher_is_better: bool,
) -> Result<Vec<usize>> {
    check_len("standard errors vs. means", means.len(), std_errors.len())?;
    check_finite("means", means)?;
    check_nonneg("standard errors", std_errors)?;
    let mut ranks = vec![0usize; means.len()];
    let mut rank = 1;
    while ranks.contains(&0) {
        let open: Vec<usize> = (0..means.len()).filter(|&i| ranks[i] == 0).collect();
        let best = *open
            .iter()
            .max_by(|&&a, &&b| {
                let (x, y) = if higher_is_better { (means[a], means[b]) } else { (means[b], means[a]) };
                x.total_cmp(&y)
            })
            .expect("non-empty");
        let (lo, hi) = (means[best] - std_errors[best], means[best] + std_errors[best]);
        for &i in &open {
            if means[i] + std_errors[i] >= lo && means[i] - std_errors[i] <= hi {
                ranks[i] = rank;
            }
        }
        rank += 1;
    }
    Ok(ranks)
}

/// Mean rank of each method over datasets: `means` and `std_errors` are `methods × datasets`.
pub fn mean_rank(
    means: &DMatrix<f64>,
    std_errors: &DMatrix<f64>,
    higher_is_better: bool,
) -> Result<Vec<f64>> {
    check_len("standard-error rows", means.nrows(), std_errors.nrows())?;
    check_len("standard-error columns", means.ncols(), std_errors.ncols())?;
    let mut total = vec![0.0; means.nrows()];
    for d in 0..means.ncols() {
        let m: Vec<f64> = means.column(d).iter().cloned().collect();
        let s: Vec<f64> = std_errors.column(d).iter().cloned().collect();
        for (t, r) in total.iter_mut().zip(ranks_with_error_bars(&m, &s, higher_is_better)?) {
            *t += r as f64;
        }
    }
    Ok(total.into_iter().map(|t| t / means.ncols() as f64).collect())
}
