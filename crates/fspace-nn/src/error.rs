//! The crate's error type and the input checks every network shares.

use nalgebra::{DMatrix, DVector};
use thiserror::Error;

/// Errors of the network crate.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum NnError {
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
    /// NaN or ±∞ in inputs, parameters or vectors.
    #[error("non-finite value in {what}")]
    NonFinite {
        /// Which input.
        what: &'static str,
    },
    /// An empty batch or a zero-width layer.
    #[error("empty input: {what}")]
    Empty {
        /// Which input.
        what: &'static str,
    },
    /// A likelihood / training-loop error (targets, batch sizes, early stopping setup).
    #[error("training: {0}")]
    Likelihood(String),
    /// The regulariser hook of [`train_map`](crate::train_map) failed.
    #[error("regulariser: {0}")]
    Regularizer(String),
    /// The network does not provide this operation (e.g. KFAC statistics for a network
    /// without dense / convolutional layer structure).
    #[error("unsupported: {what}")]
    Unsupported {
        /// What was asked for.
        what: String,
    },
}

/// Result alias of this crate.
pub type Result<T, E = NnError> = std::result::Result<T, E>;

/// A parameter-space vector of length `p` with finite entries (`what` names it in errors).
pub(crate) fn check_param_vector(what: &'static str, v: &DVector<f64>, p: usize) -> Result<()> {
    if v.len() != p {
        return Err(NnError::DimensionMismatch { what, expected: p, found: v.len() });
    }
    if !all_finite(v.as_slice()) {
        return Err(NnError::NonFinite { what });
    }
    Ok(())
}

/// Whether every entry is finite: a branch-free pass over chunks of 8 (vectorised; the
/// early-exit `any` is not, and this check runs on every parameter update).
pub(crate) fn all_finite(v: &[f64]) -> bool {
    let mut ok = true;
    for chunk in v.chunks(8) {
        ok &= chunk.iter().fold(true, |a, x| a & x.is_finite());
    }
    ok
}

/// A non-empty, finite input batch with `d` columns (`width` names the columns in errors).
pub(crate) fn check_input_batch(x: &DMatrix<f64>, d: usize, width: &'static str) -> Result<()> {
    if x.nrows() == 0 {
        return Err(NnError::Empty { what: "input batch" });
    }
    if x.ncols() != d {
        return Err(NnError::DimensionMismatch { what: width, expected: d, found: x.ncols() });
    }
    if x.iter().any(|v| !v.is_finite()) {
        return Err(NnError::NonFinite { what: "inputs" });
    }
    Ok(())
}
