//! # fspace-input
//!
//! The four ways an input can be wrong are the same in every crate of the workspace, so they
//! are declared once, here (with the one way the caller can end the work early,
//! [`InputError::Interrupted`], which every crate's error therefore carries too: see
//! [`interrupt`]): sizes that do not agree, a NaN or ±∞, an empty input, and a value
//! outside its range. Every crate's error type wraps [`InputError`] in a variant named
//! `Input` (`#[from]`, displayed transparently), so a caller matches one pattern whatever the
//! crate:
//!
//! ```
//! use fspace_input::{ensure_finite, InputError};
//! let err = ensure_finite("targets", [1.0, f64::NAN].iter()).unwrap_err();
//! assert_eq!(err, InputError::NonFinite { what: "targets" });
//! assert_eq!(err.to_string(), "non-finite value in targets");
//! ```

use thiserror::Error;

pub mod budget;
pub mod interrupt;

/// An input that is wrong in one of the ways every crate checks.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum InputError {
    /// Sizes that must agree do not.
    #[error("dimension mismatch in {what}: expected {expected}, found {found}")]
    DimensionMismatch {
        /// Which quantity.
        what: &'static str,
        /// Required size.
        expected: usize,
        /// Given size.
        found: usize,
    },
    /// NaN or ±∞ where finite values are required.
    #[error("non-finite value in {what}")]
    NonFinite {
        /// Which input.
        what: &'static str,
    },
    /// An empty input where data is required (no rows, a zero-width layer, no points).
    #[error("empty input: {what}")]
    Empty {
        /// Which input.
        what: &'static str,
    },
    /// A value outside its valid range (a non-positive hyperparameter, zero samples, an
    /// option that contradicts another).
    #[error("invalid {what}: {reason}")]
    Invalid {
        /// Which parameter, argument or option.
        what: &'static str,
        /// Why it was rejected.
        reason: String,
    },
    /// A request whose memory does not fit the budget ([`budget`]): refused before the
    /// allocation, which would abort the process.
    #[error(
        "{what} needs {gib:.1} GiB but the memory budget is {limit_gib:.1} GiB (the available memory, or \
         FSPACE_MEMORY_LIMIT / fspace.set_memory_limit): {cheaper}",
        gib = *bytes as f64 / 1073741824.0,
        limit_gib = *limit as f64 / 1073741824.0
    )]
    TooLarge {
        /// What would be allocated.
        what: &'static str,
        /// Its bytes.
        bytes: u128,
        /// The budget in bytes.
        limit: u64,
        /// A cheaper request.
        cheaper: &'static str,
    },
    /// The caller stopped the work: this thread's interrupt check ([`interrupt::check`]) said
    /// so between two steps (a Ctrl-C in Python).
    #[error("interrupted during {during}")]
    Interrupted {
        /// The work that stopped.
        during: &'static str,
    },
}

/// `expected == found`, else [`InputError::DimensionMismatch`].
pub fn ensure_dim(what: &'static str, expected: usize, found: usize) -> Result<(), InputError> {
    if expected == found {
        Ok(())
    } else {
        Err(InputError::DimensionMismatch { what, expected, found })
    }
}

/// Every value finite, else [`InputError::NonFinite`].
pub fn ensure_finite<'a>(
    what: &'static str,
    values: impl IntoIterator<Item = &'a f64>,
) -> Result<(), InputError> {
    if values.into_iter().all(|v| v.is_finite()) {
        Ok(())
    } else {
        Err(InputError::NonFinite { what })
    }
}

/// The largest magnitude an input or target may have: beyond it its square overflows f64, so a
/// kernel distance, a KFAC factor `Σ a aᵀ` or a squared residual of it is infinite.
pub const MAX_DATA_MAGNITUDE: f64 = 1e150;

/// Every value finite and within ±[`MAX_DATA_MAGNITUDE`], else the first one that is not,
/// named with its position ([`InputError::NonFinite`] or [`InputError::Invalid`]).
pub fn ensure_bounded<'a>(
    what: &'static str,
    values: impl IntoIterator<Item = &'a f64>,
) -> Result<(), InputError> {
    for (i, &v) in values.into_iter().enumerate() {
        if !v.is_finite() {
            return Err(InputError::NonFinite { what });
        }
        if v.abs() > MAX_DATA_MAGNITUDE {
            return Err(InputError::Invalid {
                what,
                reason: format!(
                    "{v:e} (entry {i}, column-major) is beyond ±{MAX_DATA_MAGNITUDE:e}: its square overflows f64; \
                     rescale the data"
                ),
            });
        }
    }
    Ok(())
}

/// `len > 0`, else [`InputError::Empty`].
pub fn ensure_non_empty(what: &'static str, len: usize) -> Result<(), InputError> {
    if len > 0 {
        Ok(())
    } else {
        Err(InputError::Empty { what })
    }
}

/// `value` finite and `> 0`, else [`InputError::Invalid`].
pub fn ensure_positive(what: &'static str, value: f64) -> Result<(), InputError> {
    if value.is_finite() && value > 0.0 {
        Ok(())
    } else {
        Err(InputError::Invalid { what, reason: format!("{value} must be finite and > 0") })
    }
}

/// An [`InputError::Invalid`].
pub fn invalid(what: &'static str, reason: impl Into<String>) -> InputError {
    InputError::Invalid { what, reason: reason.into() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checks_accept_good_input_and_name_bad_input() {
        assert_eq!(ensure_dim("x", 3, 3), Ok(()));
        assert_eq!(
            ensure_dim("x", 3, 2),
            Err(InputError::DimensionMismatch { what: "x", expected: 3, found: 2 })
        );
        assert_eq!(ensure_finite("y", [1.0, 2.0].iter()), Ok(()));
        assert_eq!(ensure_finite("y", [f64::INFINITY].iter()), Err(InputError::NonFinite { what: "y" }));
        assert_eq!(ensure_non_empty("z", 0), Err(InputError::Empty { what: "z" }));
        assert_eq!(ensure_positive("λ", 1e-300), Ok(()));
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            assert!(matches!(ensure_positive("λ", bad), Err(InputError::Invalid { what: "λ", .. })));
        }
        assert_eq!(invalid("k", "must be ≥ 1").to_string(), "invalid k: must be ≥ 1");
    }
}
