//! Error type of the context-point crate.

use thiserror::Error;

/// Everything that can go wrong when building a box or drawing context points.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum ContextError {
    /// A shape, non-finite, empty or out-of-range input (the workspace's shared
    /// [`fspace_input::InputError`]).
    #[error(transparent)]
    Input(#[from] fspace_input::InputError),
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
    /// A request for zero points.
    #[error("cannot draw n = 0 points")]
    ZeroSamples,
}

/// Result alias of this crate.
pub type Result<T, E = ContextError> = std::result::Result<T, E>;
