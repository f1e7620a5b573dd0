//! Error type of the linear-algebra crate.

use thiserror::Error;

/// Everything that can go wrong in `fspace-linalg`. Each variant names the offending quantity.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum LinalgError {
    /// Two sizes that must agree do not.
    #[error("dimension mismatch in {what}: expected {expected}, found {found}")]
    DimensionMismatch {
        /// Which argument or quantity.
        what: &'static str,
        /// The size that was required.
        expected: usize,
        /// The size that was given.
        found: usize,
    },
    /// An input or an operator output contains NaN or ±∞.
    #[error("non-finite value in {what}")]
    NonFinite {
        /// Which argument or quantity.
        what: &'static str,
    },
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
    /// An argument is outside its valid range (zero rank, negative tolerance, …).
    #[error("invalid argument {what}: {reason}")]
    InvalidArgument {
        /// Which argument.
        what: &'static str,
        /// Why it is invalid.
        reason: String,
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
    if values.into_iter().all(|v| v.is_finite()) {
        Ok(())
    } else {
        Err(LinalgError::NonFinite { what })
    }
}

/// Returns `DimensionMismatch` unless `found == expected`.
pub fn ensure_dim(what: &'static str, expected: usize, found: usize) -> Result<()> {
    if expected == found {
        Ok(())
    } else {
        Err(LinalgError::DimensionMismatch { what, expected, found })
    }
}
