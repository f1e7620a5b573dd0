//! Errors of the weight-space Laplace crate.

use thiserror::Error;

/// Everything that can go wrong when fitting or querying a Laplace approximation.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum LaplaceError {
    /// From the network crate (shapes, non-finite inputs, unsupported operations).
    #[error(transparent)]
    Nn(#[from] fspace_nn::NnError),
    /// From the likelihoods / posterior contract.
    #[error(transparent)]
    Core(#[from] fspace_core::CoreError),
    /// From the linear algebra (non-PSD, breakdown, non-convergence).
    #[error(transparent)]
    Linalg(#[from] fspace_linalg::LinalgError),
    /// A hyperparameter or option out of range (λ ≤ 0, T ≤ 0, rank 0, empty grid …).
    #[error("invalid {what}: {reason}")]
    InvalidParameter {
        /// Which parameter.
        what: &'static str,
        /// Why it was rejected.
        reason: String,
    },
    /// A structure that cannot hold this network (full GGN too large, block too large).
    #[error("{structure} curvature is too large: {what} = {size} exceeds the limit {limit} (raise it in the structure's config, or choose another structure)")]
    TooLarge {
        /// The curvature structure.
        structure: &'static str,
        /// What is counted.
        what: &'static str,
        /// Its size.
        size: usize,
        /// The configured limit.
        limit: usize,
    },
    /// A structure the network does not support (KFAC without layer structure, last-layer
    /// on a network whose last layer is not dense).
    #[error("{structure} curvature is not available for this network: {reason}")]
    Unsupported {
        /// The curvature structure.
        structure: &'static str,
        /// Why.
        reason: String,
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
    /// Empty data.
    #[error("empty input: {what}")]
    Empty {
        /// Which input.
        what: &'static str,
    },
}

/// Result alias of this crate.
pub type Result<T, E = LaplaceError> = std::result::Result<T, E>;

/// `λ > 0`, finite.
pub(crate) fn ensure_positive(what: &'static str, v: f64) -> Result<()> {
    if !(v.is_finite() && v > 0.0) {
        return Err(LaplaceError::InvalidParameter { what, reason: format!("{v} must be finite and > 0") });
    }
    Ok(())
}
