//! Error type of the kernels crate.

use fspace_input::InputError;
use fspace_linalg::LinalgError;
use thiserror::Error;

/// Everything that can go wrong when building or evaluating a kernel.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum KernelError {
    /// A shape, non-finite, empty or out-of-range input (the workspace's shared
    /// [`fspace_input::InputError`]).
    #[error(transparent)]
    Input(#[from] fspace_input::InputError),
    /// A hyperparameter is non-positive, non-finite or otherwise out of range.
    #[error("invalid hyperparameter {name} = {value}: {reason}")]
    InvalidHyperparameter {
        /// Parameter name (e.g. `lengthscale[1]`).
        name: String,
        /// The rejected value (natural scale).
        value: f64,
        /// Why it was rejected.
        reason: &'static str,
    },
    /// The operation is not available for this kernel (e.g. serialising a user kernel).
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// A failure in the linear-algebra layer.
    #[error(transparent)]
    Linalg(#[from] LinalgError),
}

/// Result alias of this crate.
pub type Result<T, E = KernelError> = std::result::Result<T, E>;

/// Checks that a natural-scale hyperparameter is finite and strictly positive.
pub fn positive(name: impl Into<String>, value: f64) -> Result<f64> {
    if value.is_finite() && value > 0.0 {
        Ok(value)
    } else {
        Err(KernelError::InvalidHyperparameter { name: name.into(), value, reason: "must be finite and > 0" })
    }
}

/// Maps a log-space parameter to its natural scale, rejecting values whose exponential is 0 or ∞.
pub fn from_log(name: impl Into<String>, log_value: f64) -> Result<f64> {
    let value = log_value.exp();
    if log_value.is_finite() && value.is_finite() && value > 0.0 {
        Ok(value)
    } else {
        Err(KernelError::InvalidHyperparameter {
            name: name.into(),
            value,
            reason: "log-parameter is non-finite or its exponential over/underflows",
        })
    }
}

/// Errors unless `params.len() == expected`.
pub fn check_param_len(expected: usize, found: usize) -> Result<()> {
    if expected == found {
        Ok(())
    } else {
        Err(KernelError::Input(InputError::DimensionMismatch {
            what: "log-hyperparameter vector",
            expected,
            found,
        }))
    }
}

/// Checks a lengthscale vector: one value (isotropic) or one per dimension, all positive.
pub(crate) fn validate_lengthscales(lengthscales: &[f64]) -> Result<()> {
    if lengthscales.is_empty() {
        return Err(KernelError::Input(InputError::DimensionMismatch {
            what: "lengthscales (need 1 for isotropic or d for ARD)",
            expected: 1,
            found: 0,
        }));
    }
    for (name, &l) in crate::names::indexed_names("lengthscale", lengthscales.len()).iter().zip(lengthscales)
    {
        positive(name.clone(), l)?;
    }
    Ok(())
}
