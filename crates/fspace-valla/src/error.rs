//! Errors of the VaLLA / ELLA crate.

use thiserror::Error;

/// Everything that can go wrong when fitting or querying VaLLA or ELLA.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum VallaError {
    /// From the network crate (shapes, non-finite inputs, unsupported operations).
    #[error(transparent)]
    Nn(#[from] fspace_nn::NnError),
    /// From the likelihoods / posterior contract.
    #[error(transparent)]
    Core(#[from] fspace_core::CoreError),
    /// From the linear algebra.
    #[error(transparent)]
    Linalg(#[from] fspace_linalg::LinalgError),
    /// From k-means (inducing-point initialisation).
    #[error(transparent)]
    Gp(#[from] fspace_gp::GpError),
    /// A hyperparameter or option out of range (σ₀² ≤ 0, α ∉ (0, 1], batch 0, …).
    #[error("invalid {what}: {reason}")]
    InvalidParameter {
        /// Which parameter.
        what: &'static str,
        /// Why it was rejected.
        reason: String,
    },
    /// More inducing (or Nyström) points than data points.
    #[error("{what}: {requested} points requested but the data has only {available}")]
    TooManyPoints {
        /// Which set of points.
        what: &'static str,
        /// Requested.
        requested: usize,
        /// Available.
        available: usize,
    },
    /// Sizes that must agree do not.
    #[error("dimension mismatch in {what}: expected {expected}, found {found}")]
    DimensionMismatch {
        /// Which quantity.
        what: &'static str,
        /// Required.
        expected: usize,
        /// Given.
        found: usize,
    },
    /// NaN or ±∞ where finite values are required.
    #[error("non-finite value in {what}")]
    NonFinite {
        /// Which input.
        what: &'static str,
    },
    /// Empty data (training or validation set).
    #[error("empty input: {what}")]
    Empty {
        /// Which input.
        what: &'static str,
    },
    /// A target that is not valid for the likelihood (a label outside `0..C`, a fractional label).
    #[error("invalid target at index {index}: {value} ({reason})")]
    InvalidTarget {
        /// Row of the offending target.
        index: usize,
        /// Its value.
        value: f64,
        /// What was expected.
        reason: String,
    },
    /// A matrix that must be positive definite is not (after the stated jitter).
    #[error("not positive definite: {what}")]
    NotPositiveDefinite {
        /// Which matrix.
        what: &'static str,
    },
}

/// Result alias of this crate.
pub type Result<T, E = VallaError> = std::result::Result<T, E>;

/// `v > 0`, finite.
pub(crate) fn ensure_positive(what: &'static str, v: f64) -> Result<()> {
    if !(v.is_finite() && v > 0.0) {
        return Err(VallaError::InvalidParameter { what, reason: format!("{v} must be finite and > 0") });
    }
    Ok(())
}
