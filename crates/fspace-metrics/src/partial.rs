//! Metrics as partial statistics that merge: a shard of the test set (a process of a sharded
//! evaluation, a batch of a stream) adds its points to a partial, partials [`merge`] exactly,
//! and the metric is finished once from the merged partial.
//!
//! The averaged metrics (NLL, accuracy, Brier, MSE, CRPS) and the binned ones (ECE's bins,
//! CQM's coverage counts) are sums, so a partial is a vector of sums: [`ClassificationSums::to_flat`]
//! / [`RegressionSums::to_flat`] give it as `f64`s that an all-reduce (`SUM`) adds, and
//! `from_flat` takes the sum back (counts stay exact below 2⁵³ points). The rank metrics of
//! out-of-distribution detection (ROC-AUC, the stump's accuracy) are not sums — the mean of
//! per-shard AUCs is not the AUC — so [`Scores`] *gathers*: its merge concatenates the scores.
//!
//! [`merge`]: ClassificationSums::merge
//!
//! ```
//! use fspace_metrics::{accuracy, ClassificationSums};
//! use nalgebra::DMatrix;
//! let probs = DMatrix::from_row_slice(4, 2, &[0.9, 0.1, 0.2, 0.8, 0.6, 0.4, 0.3, 0.7]);
//! let y = [0.0, 1.0, 1.0, 1.0];
//! let (mut first, mut second) = (ClassificationSums::new(15).unwrap(), ClassificationSums::new(15).unwrap());
//! first.add(&probs.rows(0, 2).into_owned(), &y[..2]).unwrap();
//! second.add(&probs.rows(2, 2).into_owned(), &y[2..]).unwrap();
//! first.merge(&second).unwrap();
//! assert_eq!(first.accuracy().unwrap(), accuracy(&probs, &y).unwrap());
//! ```

use fspace_input::InputError;
use nalgebra::DMatrix;

use crate::{
    argmax, brier_term, categorical_nll_term, check_gaussian_predictive, cqm_half_widths, cqm_integral,
    crps_term, ece_bin, gaussian_nll_term, labels, MetricsError, Result, CQM_LEVELS,
};

fn empty(what: &'static str) -> MetricsError {
    MetricsError::Input(InputError::Empty { what })
}

fn layout(what: &'static str, expected: usize, found: usize) -> Result<()> {
    if expected == found {
        Ok(())
    } else {
        Err(MetricsError::Input(InputError::DimensionMismatch { what, expected, found }))
    }
}

/// The sums behind [`crate::categorical_nll`], [`crate::accuracy`], [`crate::ece`] and
/// [`crate::brier`] over the points added so far.
#[derive(Debug, Clone, PartialEq)]
pub struct ClassificationSums {
    points: f64,
    nll: f64,
    correct: f64,
    brier: f64,
    bin_count: Vec<f64>,
    bin_confidence: Vec<f64>,
    bin_correct: Vec<f64>,
}

impl ClassificationSums {
    /// No points yet, with `bins` equal-width confidence bins for the ECE (the papers use 15).
    pub fn new(bins: usize) -> Result<Self> {
        if bins == 0 {
            return Err(MetricsError::Input(InputError::Invalid {
                what: "bins",
                reason: "must be ≥ 1".into(),
            }));
        }
        Ok(Self {
            points: 0.0,
            nll: 0.0,
            correct: 0.0,
            brier: 0.0,
            bin_count: vec![0.0; bins],
            bin_confidence: vec![0.0; bins],
            bin_correct: vec![0.0; bins],
        })
    }

    /// The number of ECE bins.
    pub fn bins(&self) -> usize {
        self.bin_count.len()
    }

    /// The points added so far.
    pub fn points(&self) -> usize {
        self.points as usize
    }

    /// Adds the points `probs` (`n × C` probabilities) with labels `y` (checked as
    /// [`crate::accuracy`] checks them).
    pub fn add(&mut self, probs: &DMatrix<f64>, y: &[f64]) -> Result<()> {
        let l = labels(probs, y)?;
        let bins = self.bins();
        for (i, &k) in l.iter().enumerate() {
            let pred = argmax(probs, i);
            let c = probs[(i, pred)];
            let hit = (pred == k) as u8 as f64;
            self.nll += categorical_nll_term(probs, i, k);
            self.correct += hit;
            self.brier += brier_term(probs, i, k);
            let b = ece_bin(c, bins);
            self.bin_count[b] += 1.0;
            self.bin_confidence[b] += c;
            self.bin_correct[b] += hit;
        }
        self.points += l.len() as f64;
        Ok(())
    }

    /// Adds `other`'s points (the same number of bins).
    pub fn merge(&mut self, other: &Self) -> Result<()> {
        layout("ECE bins of the merged partial", self.bins(), other.bins())?;
        let mut flat = self.to_flat();
        for (a, b) in flat.iter_mut().zip(other.to_flat()) {
            *a += b;
        }
        *self = Self::from_flat(self.bins(), &flat)?;
        Ok(())
    }

    /// The sums as one vector (`4 + 3·bins` values) for an all-reduce: the elementwise sum of
    /// several partials' vectors is the vector of their merge.
    pub fn to_flat(&self) -> Vec<f64> {
        let mut v = vec![self.points, self.nll, self.correct, self.brier];
        v.extend(&self.bin_count);
        v.extend(&self.bin_confidence);
        v.extend(&self.bin_correct);
        v
    }

    /// The partial of `to_flat`'s vector (or a sum of such vectors) for `bins` bins.
    pub fn from_flat(bins: usize, flat: &[f64]) -> Result<Self> {
        layout("classification partial (4 + 3·bins values)", 4 + 3 * bins, flat.len())?;
        if let Some(index) = flat.iter().position(|v| !v.is_finite() || *v < 0.0) {
            return Err(MetricsError::InvalidValue {
                what: "classification partial (finite sums ≥ 0)",
                index,
                value: flat[index],
            });
        }
        let mut out = Self::new(bins)?;
        out.points = flat[0];
        out.nll = flat[1];
        out.correct = flat[2];
        out.brier = flat[3];
        out.bin_count.copy_from_slice(&flat[4..4 + bins]);
        out.bin_confidence.copy_from_slice(&flat[4 + bins..4 + 2 * bins]);
        out.bin_correct.copy_from_slice(&flat[4 + 2 * bins..]);
        Ok(out)
    }

    fn n(&self) -> Result<f64> {
        if self.points > 0.0 {
            Ok(self.points)
        } else {
            Err(empty("points of the classification partial"))
        }
    }

    /// [`crate::categorical_nll`] of the points added.
    pub fn nll(&self) -> Result<f64> {
        Ok(self.nll / self.n()?)
    }

    /// [`crate::accuracy`] of the points added.
    pub fn accuracy(&self) -> Result<f64> {
        Ok(self.correct / self.n()?)
    }

    /// [`crate::brier`] of the points added.
    pub fn brier(&self) -> Result<f64> {
        Ok(self.brier / self.n()?)
    }

    /// [`crate::ece`] of the points added.
    pub fn ece(&self) -> Result<f64> {
        let n = self.n()?;
        Ok((0..self.bins())
            .filter(|&b| self.bin_count[b] > 0.0)
            .map(|b| (self.bin_correct[b] - self.bin_confidence[b]).abs() / n)
            .sum())
    }
}

/// The sums behind [`crate::gaussian_nll`], [`crate::mse`], [`crate::crps_gaussian`] and
/// [`crate::cqm`] of Gaussian predictives `N(m, v)` over the points added so far.
#[derive(Debug, Clone, PartialEq)]
pub struct RegressionSums {
    points: f64,
    nll: f64,
    squared_error: f64,
    crps: f64,
    inside: [f64; CQM_LEVELS],
}

impl Default for RegressionSums {
    fn default() -> Self {
        Self { points: 0.0, nll: 0.0, squared_error: 0.0, crps: 0.0, inside: [0.0; CQM_LEVELS] }
    }
}

impl RegressionSums {
    /// No points yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The points added so far.
    pub fn points(&self) -> usize {
        self.points as usize
    }

    /// Adds targets `y` under predictive means `mean` and total predictive variances `var`
    /// (> 0, as [`crate::gaussian_nll`] needs).
    pub fn add(&mut self, mean: &[f64], var: &[f64], y: &[f64]) -> Result<()> {
        check_gaussian_predictive(mean, var, y)?;
        let half_widths = cqm_half_widths();
        for i in 0..y.len() {
            let (r, s) = (y[i] - mean[i], var[i].sqrt());
            self.nll += gaussian_nll_term(mean[i], var[i], y[i]);
            self.squared_error += r.powi(2);
            self.crps += crps_term(mean[i], s, y[i]);
            for (count, w) in self.inside.iter_mut().zip(&half_widths) {
                *count += (r.abs() < s * w) as u8 as f64;
            }
        }
        self.points += y.len() as f64;
        Ok(())
    }

    /// Adds `other`'s points.
    pub fn merge(&mut self, other: &Self) -> Result<()> {
        let mut flat = self.to_flat();
        for (a, b) in flat.iter_mut().zip(other.to_flat()) {
            *a += b;
        }
        *self = Self::from_flat(&flat)?;
        Ok(())
    }

    /// The sums as one vector (`4 + 11` values) for an all-reduce.
    pub fn to_flat(&self) -> Vec<f64> {
        let mut v = vec![self.points, self.nll, self.squared_error, self.crps];
        v.extend(self.inside);
        v
    }

    /// The partial of `to_flat`'s vector (or a sum of such vectors).
    pub fn from_flat(flat: &[f64]) -> Result<Self> {
        layout("regression partial (15 values)", 4 + CQM_LEVELS, flat.len())?;
        if let Some(index) = flat.iter().position(|v| !v.is_finite()) {
            return Err(MetricsError::InvalidValue { what: "regression partial", index, value: flat[index] });
        }
        let mut inside = [0.0; CQM_LEVELS];
        inside.copy_from_slice(&flat[4..]);
        Ok(Self { points: flat[0], nll: flat[1], squared_error: flat[2], crps: flat[3], inside })
    }

    fn n(&self) -> Result<f64> {
        if self.points > 0.0 {
            Ok(self.points)
        } else {
            Err(empty("points of the regression partial"))
        }
    }

    /// [`crate::gaussian_nll`] of the points added.
    pub fn nll(&self) -> Result<f64> {
        Ok(self.nll / self.n()?)
    }

    /// [`crate::rmse`] of the predictive means.
    pub fn rmse(&self) -> Result<f64> {
        Ok((self.squared_error / self.n()?).sqrt())
    }

    /// [`crate::crps_gaussian`] with `std = √var`.
    pub fn crps(&self) -> Result<f64> {
        Ok(self.crps / self.n()?)
    }

    /// [`crate::cqm`] with `std = √var`: the integral and the `(α, γ)` curve.
    pub fn cqm(&self) -> Result<(f64, Vec<(f64, f64)>)> {
        let n = self.n()?;
        let curve: Vec<(f64, f64)> =
            self.inside.iter().enumerate().map(|(k, &count)| (k as f64 / 10.0, count / n)).collect();
        Ok((cqm_integral(&curve), curve))
    }
}

/// The scores of out-of-distribution detection, gathered: [`crate::roc_auc`] and
/// [`crate::stump_accuracy`] rank all the points together, so shards merge by concatenation
/// (in shard order), not by a sum.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Scores {
    in_distribution: Vec<f64>,
    out_of_distribution: Vec<f64>,
}

impl Scores {
    /// No scores yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds in-distribution scores (e.g. predictive entropies of test points).
    pub fn add_in_distribution(&mut self, scores: &[f64]) -> Result<()> {
        crate::check_finite("ID scores", scores)?;
        self.in_distribution.extend_from_slice(scores);
        Ok(())
    }

    /// Adds out-of-distribution scores.
    pub fn add_out_of_distribution(&mut self, scores: &[f64]) -> Result<()> {
        crate::check_finite("OOD scores", scores)?;
        self.out_of_distribution.extend_from_slice(scores);
        Ok(())
    }

    /// Gathers `other`'s scores after these.
    pub fn merge(&mut self, other: &Self) {
        self.in_distribution.extend_from_slice(&other.in_distribution);
        self.out_of_distribution.extend_from_slice(&other.out_of_distribution);
    }

    /// [`crate::roc_auc`] of every score gathered.
    pub fn roc_auc(&self) -> Result<f64> {
        crate::roc_auc(&self.in_distribution, &self.out_of_distribution)
    }

    /// [`crate::stump_accuracy`] of every score gathered.
    pub fn stump_accuracy(&self) -> Result<f64> {
        crate::stump_accuracy(&self.in_distribution, &self.out_of_distribution)
    }
}
