//! Error type of the core crate.

use thiserror::Error;

/// Everything that can go wrong in likelihoods, posteriors and training pieces.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum CoreError {
    /// Sizes that must agree do not.
    #[error("dimension mismatch in {what}: expected {expected}, found {found}")]
    DimensionMismatch {
        /// Which quantity.
        what: &'static str,
        /// Required size.
        expected: usize,
        /// Given size.
        found: usize,
    },
    /// NaN or ±∞ in an input.
    #[error("non-finite value in {what}")]
    NonFinite {
        /// Which input.
        what: &'static str,
    },
    /// An empty input where data is required.
    #[error("empty input: {what}")]
    Empty {
        /// Which input.
        what: &'static str,
    },
    /// A target that is not valid for the likelihood (e.g. a label outside 0..C).
    #[error("invalid target at index {index}: {value} ({reason})")]
    InvalidTarget {
        /// Row of the offending target.
        index: usize,
        /// Its value.
        value: f64,
        /// What was expected.
        reason: &'static str,
    },
    /// A parameter outside its valid range (non-positive noise, zero samples, …).
    #[error("invalid parameter {what}: {reason}")]
    InvalidParameter {
        /// Which parameter.
        what: &'static str,
        /// Why.
        reason: String,
    },
    /// A covariance that should be positive semi-definite is not.
    #[error("covariance {what} is not positive semi-definite")]
    NotPsd {
        /// Which covariance.
        what: &'static str,
    },
}

/// Result alias of this crate.
pub type Result<T, E = CoreError> = std::result::Result<T, E>;

pub(crate) fn ensure_finite<'a>(what: &'static str, v: impl IntoIterator<Item = &'a f64>) -> Result<()> {
    if v.into_iter().all(|x| x.is_finite()) {
        Ok(())
    } else {
        Err(CoreError::NonFinite { what })
    }
}

pub(crate) fn ensure_dim(what: &'static str, expected: usize, found: usize) -> Result<()> {
    if expected == found {
        Ok(())
    } else {
        Err(CoreError::DimensionMismatch { what, expected, found })
    }
}
