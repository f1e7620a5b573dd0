//! Error type of the core crate.

use std::sync::Arc;

use thiserror::Error;

/// Everything that can go wrong in likelihoods, posteriors and training pieces.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum CoreError {
    /// A shape, non-finite, empty or out-of-range input (the workspace's shared
    /// [`fspace_input::InputError`]).
    #[error(transparent)]
    Input(#[from] fspace_input::InputError),
    /// A target that is not valid for the likelihood (e.g. a label outside 0..C).
    #[error("invalid target at index {index}: {value} ({reason})")]
    InvalidTarget {
        /// Row of the offending target.
        index: usize,
        /// Its value.
        value: f64,
        /// What was expected.
        reason: &'static str,
    },
    /// A covariance that should be positive semi-definite is not.
    #[error("covariance {what} is not positive semi-definite")]
    NotPsd {
        /// Which covariance.
        what: &'static str,
    },
    /// A method was given a likelihood it does not implement.
    #[error("{method} does not support the {likelihood} likelihood")]
    Unsupported {
        /// The method.
        method: &'static str,
        /// The likelihood's name.
        likelihood: &'static str,
    },
    /// A method's own error, passed through the [`Posterior`](crate::Posterior) contract with
    /// its source kept (`std::error::Error::source`, [`MethodError::downcast_ref`]).
    #[error("{method}: {source}")]
    Method {
        /// The method or posterior that failed.
        method: &'static str,
        /// The original error.
        #[source]
        source: MethodError,
    },
}

impl CoreError {
    /// Wraps a method's error, keeping it as the source.
    pub fn method(method: &'static str, error: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self::Method { method, source: MethodError(Arc::new(error)) }
    }
}

/// A method's error inside a [`CoreError::Method`]: cheap to clone, displays as the original,
/// and gives the original back with [`downcast_ref`](Self::downcast_ref). Two are equal when
/// they share the error or display the same text.
#[derive(Debug, Clone)]
pub struct MethodError(Arc<dyn std::error::Error + Send + Sync + 'static>);

impl MethodError {
    /// The original error, if it is a `T`.
    pub fn downcast_ref<T: std::error::Error + 'static>(&self) -> Option<&T> {
        self.0.downcast_ref::<T>()
    }
    /// The original error.
    pub fn inner(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.0
    }
}

impl std::fmt::Display for MethodError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for MethodError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

impl PartialEq for MethodError {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self.0.to_string() == other.0.to_string()
    }
}

/// Result alias of this crate.
pub type Result<T, E = CoreError> = std::result::Result<T, E>;

pub(crate) fn ensure_finite<'a>(what: &'static str, v: impl IntoIterator<Item = &'a f64>) -> Result<()> {
    Ok(fspace_input::ensure_finite(what, v)?)
}

pub(crate) fn ensure_dim(what: &'static str, expected: usize, found: usize) -> Result<()> {
    Ok(fspace_input::ensure_dim(what, expected, found)?)
}
