//! Error type of the linear-algebra crate.

use thiserror::Error;

/// Everything that can go wrong in `fspace-linalg`. Each variant names the offending quantity.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum LinalgError {
    /// A shape, non-finite, empty or out-of-range input (the workspace's shared
    /// [`fspace_input::InputError`]).
    #[error(transparent)]
    Input(#[from] fspace_input::InputError),
    /// A matrix that must be symmetric is not (relative asymmetry ‖A − Aᵀ‖_F / ‖A‖_F).
    #[error("{what} is not symmetric (relative asymmetry {asymmetry:.3e})")]
    NotSymmetric {
        /// Which matrix.
        what: &'static str,
        /// ‖A − Aᵀ‖_F / ‖A‖_F.
        asymmetry: f64,
    },
    /// A matrix that must be positive (semi-)definite is not; `value` is the offending pivot or
    /// eigenvalue.
    #[error("{what} is not positive (semi-)definite: found {value:.3e}")]
    NotPositiveDefinite {
        /// Which matrix.
        what: &'static str,
        /// The negative (or too small) pivot / eigenvalue that proved it.
        value: f64,
    },
    /// Cholesky failed even after adding the largest permitted jitter.
    #[error("Cholesky of {what} failed with jitter up to {max_jitter:.3e}")]
    CholeskyFailed {
        /// Which matrix.
        what: &'static str,
        /// Largest jitter tried.
        max_jitter: f64,
    },
    /// An iterative method did not reach its tolerance.
    #[error("{method} did not converge in {iterations} iterations (relative residual {residual:.3e})")]
    NoConvergence {
        /// Which method (e.g. "cg").
        method: &'static str,
        /// Iterations performed.
        iterations: usize,
        /// Final relative residual.
        residual: f64,
    },
}

/// Result alias of this crate.
pub type Result<T, E = LinalgError> = std::result::Result<T, E>;

/// Returns `NonFinite` if any entry is NaN or infinite.
pub fn ensure_finite<'a>(what: &'static str, values: impl IntoIterator<Item = &'a f64>) -> Result<()> {
    Ok(fspace_input::ensure_finite(what, values)?)
}

/// Returns `DimensionMismatch` unless `found == expected`.
pub fn ensure_dim(what: &'static str, expected: usize, found: usize) -> Result<()> {
    Ok(fspace_input::ensure_dim(what, expected, found)?)
}
