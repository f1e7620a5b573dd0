//! Splits and preprocessing: k-fold cross-validation with a validation fraction, the
//! chronological split, standardisation with an exact inverse, and one-hot encoding.

use fspace_input::InputError;
use nalgebra::DMatrix;
use rand::seq::SliceRandom;
use rand::RngCore;

use crate::error::{DataError, Result};

/// Per-column standardisation `(x − μ)/s` with the inverse `x = μ + s·z`. Constant columns get
/// `s = 1` (they are centred, not scaled), so the map is always invertible.
#[derive(Debug, Clone, PartialEq)]
pub struct Standardizer {
    /// Column means.
    pub mean: Vec<f64>,
    /// Column standard deviations (population, `1/n`), 1 for constant columns.
    pub std: Vec<f64>,
}

impl Standardizer {
    /// Fits on the rows of `x` (non-empty, finite).
    pub fn fit(x: &DMatrix<f64>) -> Result<Self> {
        if x.nrows() == 0 || x.ncols() == 0 {
            return Err(DataError::Input(InputError::Invalid {
                what: "data to standardise",
                reason: "is empty".into(),
            }));
        }
        if x.iter().any(|v| !v.is_finite()) {
            return Err(DataError::Input(InputError::Invalid {
                what: "data to standardise",
                reason: "has non-finite values".into(),
            }));
        }
        let n = x.nrows() as f64;
        let mean: Vec<f64> = x.column_iter().map(|c| c.sum() / n).collect();
        let std = x
            .column_iter()
            .zip(&mean)
            .map(|(c, m)| {
                let s = (c.iter().map(|v| (v - m).powi(2)).sum::<f64>() / n).sqrt();
                if s > 0.0 {
                    s
                } else {
                    1.0
                }
            })
            .collect();
        Ok(Self { mean, std })
    }
    fn check(&self, x: &DMatrix<f64>) -> Result<()> {
        if x.ncols() != self.mean.len() {
            return Err(DataError::Input(InputError::Invalid {
                what: "columns",
                reason: format!("standardiser fitted on {} columns, got {}", self.mean.len(), x.ncols()),
            }));
        }
        Ok(())
    }
    /// `(x − μ)/s`.
    pub fn transform(&self, x: &DMatrix<f64>) -> Result<DMatrix<f64>> {
        self.check(x)?;
        Ok(DMatrix::from_fn(x.nrows(), x.ncols(), |i, j| (x[(i, j)] - self.mean[j]) / self.std[j]))
    }
    /// `μ + s·z`.
    pub fn inverse(&self, z: &DMatrix<f64>) -> Result<DMatrix<f64>> {
        self.check(z)?;
        Ok(DMatrix::from_fn(z.nrows(), z.ncols(), |i, j| self.mean[j] + self.std[j] * z[(i, j)]))
    }
}

/// One fold of k-fold cross-validation: disjoint train, validation and test row indices.
#[derive(Debug, Clone, PartialEq)]
pub struct Fold {
    /// Rows to fit on.
    pub train: Vec<usize>,
    /// Rows held out from the training folds for early stopping / model selection.
    pub validation: Vec<usize>,
    /// The held-out fold.
    pub test: Vec<usize>,
}

/// `k`-fold cross-validation over a seeded shuffle of `0..n`; in each fold a fraction
/// `validation_fraction ∈ [0, 1)` of the training rows is held out for validation (the papers:
/// 5 folds, 10% validation). Every row is in exactly one test fold.
pub fn kfold(n: usize, k: usize, validation_fraction: f64, rng: &mut dyn RngCore) -> Result<Vec<Fold>> {
    if k < 2 || k > n {
        return Err(DataError::Input(InputError::Invalid {
            what: "k",
            reason: format!("need 2 ≤ k ≤ n, got k = {k}, n = {n}"),
        }));
    }
    if !(0.0..1.0).contains(&validation_fraction) {
        return Err(DataError::Input(InputError::Invalid {
            what: "validation_fraction",
            reason: format!("{validation_fraction} not in [0, 1)"),
        }));
    }
    let mut idx: Vec<usize> = (0..n).collect();
    idx.shuffle(rng);
    (0..k)
        .map(|f| {
            let (lo, hi) = (f * n / k, (f + 1) * n / k);
            let test = idx[lo..hi].to_vec();
            let rest: Vec<usize> = idx[..lo].iter().chain(&idx[hi..]).cloned().collect();
            let n_val = (validation_fraction * rest.len() as f64).round() as usize;
            if n_val >= rest.len() {
                return Err(DataError::Input(InputError::Invalid {
                    what: "validation_fraction",
                    reason: "leaves no training rows".into(),
                }));
            }
            Ok(Fold { validation: rest[..n_val].to_vec(), train: rest[n_val..].to_vec(), test })
        })
        .collect()
}

/// The first `⌊fraction·n⌋` rows for training and the rest for testing, in order (Mauna Loa:
/// 70/30). Both parts must be non-empty.
pub fn chronological_split(n: usize, fraction: f64) -> Result<(Vec<usize>, Vec<usize>)> {
    let cut = (fraction * n as f64).floor() as usize;
    if !(fraction > 0.0 && fraction < 1.0) || cut == 0 || cut >= n {
        return Err(DataError::Input(InputError::Invalid {
            what: "chronological split",
            reason: format!("fraction {fraction} of {n} rows leaves an empty part"),
        }));
    }
    Ok(((0..cut).collect(), (cut..n).collect()))
}

/// For each encoded column: the original column and, for one-hot columns, the category value.
pub type OneHotLayout = Vec<(usize, Option<f64>)>;

/// Replaces the listed (categorical) columns by one-hot columns, one per distinct value in
/// ascending order; other columns keep their order. Returns the new matrix and, for every new
/// column, `(original column, category value or None)`.
pub fn one_hot(x: &DMatrix<f64>, categorical: &[usize]) -> Result<(DMatrix<f64>, OneHotLayout)> {
    if let Some(&bad) = categorical.iter().find(|&&c| c >= x.ncols()) {
        return Err(DataError::Input(InputError::Invalid {
            what: "categorical column",
            reason: format!("{bad} ≥ {} columns", x.ncols()),
        }));
    }
    let mut layout = Vec::new();
    for j in 0..x.ncols() {
        if categorical.contains(&j) {
            let mut values: Vec<f64> = x.column(j).iter().cloned().collect();
            values.sort_by(f64::total_cmp);
            values.dedup();
            layout.extend(values.into_iter().map(|v| (j, Some(v))));
        } else {
            layout.push((j, None));
        }
    }
    let out = DMatrix::from_fn(x.nrows(), layout.len(), |i, c| match layout[c] {
        (j, None) => x[(i, j)],
        (j, Some(v)) => (x[(i, j)] == v) as u8 as f64,
    });
    Ok((out, layout))
}

/// Indices of the first occurrence of every distinct row of `[x | y]`, in order: exact duplicate
/// records (inputs and target bit-for-bit equal) collapse to one. Rows with equal inputs but
/// different targets are replicated measurements and are all kept.
///
/// Why: UCI red wine ships 240 exact duplicate records. Counted as independent noisy
/// observations, they let the GP marginal likelihood drive the noise variance to its floor
/// (σ² ≈ 4e-6 standardised, with lengthscales short enough to interpolate the copies), so
/// hyperparameters are fitted on the distinct records only.
pub fn distinct_rows(x: &DMatrix<f64>, y: &DMatrix<f64>) -> Result<Vec<usize>> {
    if x.nrows() != y.nrows() {
        return Err(DataError::Input(InputError::Invalid {
            what: "distinct rows",
            reason: format!("inputs have {} rows, targets {}", x.nrows(), y.nrows()),
        }));
    }
    // -0.0 and 0.0 are the same record; NaN cells compare by bits (every NaN row stays distinct
    // from non-NaN ones).
    let bits = |v: f64| if v == 0.0 { 0 } else { v.to_bits() };
    let mut seen = std::collections::HashSet::with_capacity(x.nrows());
    Ok((0..x.nrows())
        .filter(|&i| {
            seen.insert(x.row(i).iter().chain(y.row(i).iter()).map(|&v| bits(v)).collect::<Vec<u64>>())
        })
        .collect())
}
