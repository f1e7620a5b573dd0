//! Errors of FSP-Laplace: the building blocks' errors, passed through with their messages, and
//! the method's own configuration and shape checks.

use fspace_input::InputError;
use thiserror::Error;

/// Everything that can go wrong in FSP-Laplace.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum FspError {
    /// A shape, non-finite, empty or out-of-range input (the workspace's shared
    /// [`fspace_input::InputError`]).
    #[error(transparent)]
    Input(#[from] fspace_input::InputError),
    /// The network (forward, J·u, Jᵀ·V, training).
    #[error("network: {0}")]
    Network(#[from] fspace_nn::NnError),
    /// The kernel (hyperparameters, Gram matrices).
    #[error("kernel: {0}")]
    Kernel(#[from] fspace_kernels::KernelError),
    /// Linear algebra (Lanczos, SVD, eigendecomposition, Cholesky).
    #[error("linear algebra: {0}")]
    Linalg(#[from] fspace_linalg::LinalgError),
    /// Likelihoods and posterior contracts.
    #[error("{0}")]
    Core(#[from] fspace_core::CoreError),
    /// Context-point sampling.
    #[error("context points: {0}")]
    Context(#[from] fspace_context::ContextError),
    /// Marginal-likelihood fitting of the prior.
    #[error("GP prior fitting: {0}")]
    Gp(#[from] fspace_gp::GpError),
}

/// Result alias of this crate.
pub type Result<T, E = FspError> = std::result::Result<T, E>;

pub(crate) fn invalid(what: &'static str, reason: impl Into<String>) -> FspError {
    FspError::Input(InputError::Invalid { what, reason: reason.into() })
}

pub(crate) fn ensure_dim(what: &'static str, expected: usize, found: usize) -> Result<()> {
    Ok(fspace_input::ensure_dim(what, expected, found)?)
}
