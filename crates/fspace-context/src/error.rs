//! Error type of the context-point crate.

use thiserror::Error;

/// Everything that can go wrong when building a box or drawing context points.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum ContextError {
    /// A box whose lower bound exceeds its upper bound in some dimension.
    #[error("inverted box in dimension {dim}: lower {lower} > upper {upper}")]
    InvertedBox {
        /// The dimension.
        dim: usize,
        /// Lower bound.
        lower: f64,
        /// Upper bound.
        upper: f64,
    },
    /// NaN or ±∞ in an input.
    #[error("non-finite value in {what}")]
    NonFinite {
        /// Which input.
        what: &'static str,
    },
    /// An empty point set or a box of dimension 0.
    #[error("empty input: {what}")]
    Empty {
        /// Which input.
        what: &'static str,
    },
    /// A request for zero points.
    #[error("cannot draw n = 0 points")]
    ZeroSamples,
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
    /// Any other invalid argument.
    #[error("invalid argument {what}: {reason}")]
    InvalidArgument {
        /// Which argument.
        what: &'static str,
        /// Why.
        reason: String,
    },
}

/// Result alias of this crate.
pub type Result<T, E = ContextError> = std::result::Result<T, E>;
