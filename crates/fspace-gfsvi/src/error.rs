//! Errors of the function-space VI crate.

use thiserror::Error;

/// Everything that can go wrong when fitting or querying GFSVI, TFSVI, FVI or MFVI.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum GfsviError {
    /// From the network crate (shapes, non-finite inputs, unsupported operations).
    #[error(transparent)]
    Nn(#[from] fspace_nn::NnError),
    /// From the likelihoods / posterior contract.
    #[error(transparent)]
    Core(#[from] fspace_core::CoreError),
    /// From the kernels (prior Gram matrices, prior means).
    #[error(transparent)]
    Kernel(#[from] fspace_kernels::KernelError),
    /// From the measurement-point samplers.
    #[error(transparent)]
    Context(#[from] fspace_context::ContextError),
    /// A hyperparameter or option out of range (γ ≤ 0, M = 0, prior scale ≤ 0, …).
    #[error("invalid {what}: {reason}")]
    InvalidParameter {
        /// Which parameter.
        what: &'static str,
        /// Why it was rejected.
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
    /// Empty data (training, validation or a cross-validation fold).
    #[error("empty input: {what}")]
    Empty {
        /// Which input.
        what: &'static str,
    },
    /// A covariance that must be positive definite is not (Cholesky failed).
    #[error("{what} is not positive definite")]
    NotPositiveDefinite {
        /// Which matrix.
        what: &'static str,
    },
    /// The optimisation produced a non-finite objective or gradient.
    #[error("optimisation diverged at step {step}: {what} is not finite")]
    Diverged {
        /// Step at which it happened.
        step: usize,
        /// Which quantity.
        what: &'static str,
    },
}

/// Result alias of this crate.
pub type Result<T, E = GfsviError> = std::result::Result<T, E>;

pub(crate) fn invalid(what: &'static str, reason: impl Into<String>) -> GfsviError {
    GfsviError::InvalidParameter { what, reason: reason.into() }
}

pub(crate) fn ensure_finite<'a>(what: &'static str, mut v: impl Iterator<Item = &'a f64>) -> Result<()> {
    if v.any(|x| !x.is_finite()) {
        return Err(GfsviError::NonFinite { what });
    }
    Ok(())
}
