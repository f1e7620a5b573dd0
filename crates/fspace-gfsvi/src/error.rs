//! Errors of the function-space VI crate.

use fspace_input::InputError;
use thiserror::Error;

/// Everything that can go wrong when fitting or querying GFSVI, TFSVI, FVI or MFVI.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum GfsviError {
    /// A shape, non-finite, empty or out-of-range input (the workspace's shared
    /// [`fspace_input::InputError`]).
    #[error(transparent)]
    Input(#[from] fspace_input::InputError),
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
    GfsviError::Input(InputError::Invalid { what, reason: reason.into() })
}

pub(crate) fn ensure_finite<'a>(what: &'static str, v: impl Iterator<Item = &'a f64>) -> Result<()> {
    Ok(fspace_input::ensure_finite(what, v)?)
}
