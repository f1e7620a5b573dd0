//! The crate's error type and the input checks every network shares.

use fspace_input::InputError;
use nalgebra::{DMatrix, DVector};
use thiserror::Error;

/// Errors of the network crate.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum NnError {
    /// A shape, non-finite, empty or out-of-range input (the workspace's shared
    /// [`fspace_input::InputError`]).
    #[error(transparent)]
    Input(#[from] fspace_input::InputError),
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
    /// A network implemented outside Rust (a callback into another framework) failed; the
    /// text is that framework's error.
    #[error("network callback: {0}")]
    Callback(String),
}

/// Result alias of this crate.
pub type Result<T, E = NnError> = std::result::Result<T, E>;

/// `a · b + c` for sizes read from a configuration, or an error naming `what` when it does not
/// fit a `usize` (a corrupted or hostile file can declare any width).
pub(crate) fn size_mul_add(what: &'static str, a: usize, b: usize, c: usize) -> Result<usize> {
    a.checked_mul(b).and_then(|ab| ab.checked_add(c)).ok_or(NnError::Input(InputError::Invalid {
        what,
        reason: format!("{a} × {b} + {c} overflows the address space"),
    }))
}

/// The product of `factors` (sizes read from a configuration), or the same error as
/// [`size_mul_add`] when it does not fit a `usize`.
pub(crate) fn size_product(what: &'static str, factors: &[usize]) -> Result<usize> {
    factors.iter().try_fold(1, |n, &f| size_mul_add(what, n, f, 0))
}

/// A parameter-space vector of length `p` with finite entries (`what` names it in errors).
pub fn check_param_vector(what: &'static str, v: &DVector<f64>, p: usize) -> Result<()> {
    check_param_slice(what, v.as_slice(), p)
}

/// `p` finite parameters.
pub(crate) fn check_param_slice(what: &'static str, v: &[f64], p: usize) -> Result<()> {
    if v.len() != p {
        return Err(NnError::Input(InputError::DimensionMismatch { what, expected: p, found: v.len() }));
    }
    if !all_finite(v) {
        return Err(NnError::Input(InputError::NonFinite { what }));
    }
    Ok(())
}

/// The largest weight magnitude a saved network may hold: a weight whose square overflows f64
/// (|w| > 1.3e154) makes every Jacobian product, Gram matrix and `J Σ Jᵀ` of the network
/// overflow, and no training produces one; a file holding one is refused when it is read (a
/// tampered or corrupted file), not served as zero or infinite variances.
pub const MAX_LOADED_WEIGHT: f64 = 1e150;

/// A saved parameter vector: `p` finite values, none beyond [`MAX_LOADED_WEIGHT`].
pub(crate) fn check_loaded_params(what: &'static str, v: &[f64], p: usize) -> Result<()> {
    check_param_slice(what, v, p)?;
    if let Some((i, w)) = v.iter().enumerate().find(|(_, w)| w.abs() > MAX_LOADED_WEIGHT) {
        return Err(NnError::Input(InputError::Invalid {
            what,
            reason: format!(
                "weight {i} is {w:e}, beyond ±{MAX_LOADED_WEIGHT:e}: its square overflows f64, so every Jacobian \
                 product of the network would (a tampered or corrupted file)"
            ),
        }));
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
pub fn check_input_batch(x: &DMatrix<f64>, d: usize, width: &'static str) -> Result<()> {
    if x.nrows() == 0 {
        return Err(NnError::Input(InputError::Empty { what: "input batch" }));
    }
    if x.ncols() != d {
        return Err(NnError::Input(InputError::DimensionMismatch {
            what: width,
            expected: d,
            found: x.ncols(),
        }));
    }
    if x.iter().any(|v| !v.is_finite()) {
        return Err(NnError::Input(InputError::NonFinite { what: "inputs" }));
    }
    Ok(())
}
