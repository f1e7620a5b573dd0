//! Error type of the GP crate.

use fspace_core::CoreError;
use fspace_input::InputError;
use fspace_kernels::KernelError;
use fspace_linalg::LinalgError;
use thiserror::Error;

/// Everything that can go wrong in the GP baselines.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum GpError {
    /// A shape, non-finite, empty or out-of-range input (the workspace's shared
    /// [`fspace_input::InputError`]).
    #[error(transparent)]
    Input(#[from] fspace_input::InputError),
    /// An optimiser produced non-finite hyperparameters or objective in every restart.
    #[error("hyperparameter optimisation diverged: {0}")]
    Diverged(String),
    /// A kernel error (bad hyperparameters, dimension mismatch, …).
    #[error(transparent)]
    Kernel(#[from] KernelError),
    /// A linear-algebra error (Cholesky failure after jitter, …).
    #[error(transparent)]
    Linalg(#[from] LinalgError),
    /// A likelihood / posterior error.
    #[error(transparent)]
    Core(#[from] CoreError),
}

/// Result alias of this crate.
pub type Result<T, E = GpError> = std::result::Result<T, E>;

pub(crate) fn invalid(what: &'static str, reason: impl Into<String>) -> GpError {
    GpError::Input(InputError::Invalid { what, reason: reason.into() })
}

/// Point-major flattening of an `n × q` matrix (row `i` = outputs of point `i`).
pub(crate) fn point_major(m: &nalgebra::DMatrix<f64>) -> nalgebra::DVector<f64> {
    let (n, q) = m.shape();
    nalgebra::DVector::from_fn(n * q, |k, _| m[(k / q, k % q)])
}

/// Inverse of [`point_major`].
pub(crate) fn unflatten(v: &nalgebra::DVector<f64>, q: usize) -> nalgebra::DMatrix<f64> {
    nalgebra::DMatrix::from_fn(v.len() / q, q, |i, a| v[i * q + a])
}

/// The checks every saved GP model starts its load with, returning the [`LoadCheck`] for the
/// rest: a kernel whose log-space hyperparameters are not all finite (a tampered or corrupt
/// file: a zero or negative scale) is refused, and so are training or inducing inputs `x`
/// without rows or columns, with non-finite entries, or with other columns than the kernel
/// takes (when it says).
///
/// [`LoadCheck`]: fspace_core::LoadCheck
pub(crate) fn check_loaded_kernel_and_inputs(
    kind: &'static str,
    kernel: &impl fspace_kernels::KernelBase,
    field: &str,
    x: &nalgebra::DMatrix<f64>,
) -> std::result::Result<fspace_core::LoadCheck, fspace_core::PersistError> {
    let check = fspace_core::LoadCheck::new(kind);
    check.ensure(kernel.params().iter().all(|v| v.is_finite()), "kernel", || {
        "kernel hyperparameters must be finite and positive".into()
    })?;
    check.ensure(x.nrows() >= 1 && x.ncols() >= 1, field, || "must have ≥ 1 row and column".into())?;
    if let Some(d) = kernel.input_dim() {
        check.ensure(x.ncols() == d, field, || format!("has {} columns, the kernel takes {d}", x.ncols()))?;
    }
    check.finite(field, x.iter())?;
    Ok(check)
}

/// A saved constant prior mean is finite.
pub(crate) fn check_loaded_mean(
    check: &fspace_core::LoadCheck,
    mean: &fspace_kernels::PriorMean,
) -> std::result::Result<(), fspace_core::PersistError> {
    match mean {
        fspace_kernels::PriorMean::Constant(c) => check.finite("mean", [*c].iter()),
        _ => Ok(()),
    }
}
