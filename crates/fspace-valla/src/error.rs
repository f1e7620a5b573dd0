//! Errors of the VaLLA / ELLA crate.

use thiserror::Error;

/// Everything that can go wrong when fitting or querying VaLLA or ELLA.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum VallaError {
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
    /// From the linear algebra.
    #[error(transparent)]
    Linalg(#[from] fspace_linalg::LinalgError),
    /// From k-means (inducing-point initialisation).
    #[error(transparent)]
    Gp(#[from] fspace_gp::GpError),
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
    /// A Nyström kernel with fewer numerically positive eigenvalues than features requested.
    #[error(
        "the Nyström kernel has insufficient positive rank: {requested} features requested, but only {usable} of \
         {sampled} sampled directions exceed the numerical tolerance; reduce the features (n_eigenvalues), sample \
         more points (subsample_size) or try another seed"
    )]
    RankDeficient {
        /// Features requested.
        requested: usize,
        /// Eigenvalues above the tolerance.
        usable: usize,
        /// Points sampled.
        sampled: usize,
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
    Ok(fspace_input::ensure_positive(what, v)?)
}
