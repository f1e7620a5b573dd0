//! Errors of the weight-space Laplace crate.

use thiserror::Error;

/// Everything that can go wrong when fitting or querying a Laplace approximation.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum LaplaceError {
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
    /// From the linear algebra (non-PSD, breakdown, non-convergence).
    #[error(transparent)]
    Linalg(#[from] fspace_linalg::LinalgError),
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
    /// The sampled structure's EM record ([`crate::SampledConfig::em_checkpoint`]) cannot be
    /// read, written or used for this fit.
    #[error("the sampled fit's EM record {path} {reason}")]
    EmCheckpoint {
        /// The file.
        path: String,
        /// What is wrong with it.
        reason: String,
    },
}

/// Result alias of this crate.
pub type Result<T, E = LaplaceError> = std::result::Result<T, E>;

/// `λ > 0`, finite.
pub(crate) fn ensure_positive(what: &'static str, v: f64) -> Result<()> {
    Ok(fspace_input::ensure_positive(what, v)?)
}
