//! Serialisable kernel configurations.
//!
//! [`KernelSpec`] describes any kernel built from this library's parts (natural-scale
//! hyperparameters, so a JSON file reads like the paper's tables). `kernel.spec()` produces one;
//! [`KernelSpec::build`] (module `builders`) turns it back into a kernel. User kernels return `None` from `spec()`
//! and simply do not serialise — the [`Kernel`](crate::Kernel) trait itself stays open.

use serde::{Deserialize, Serialize};

/// A scalar kernel configuration (natural-scale hyperparameters).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum KernelSpec {
    /// [`Rbf`](crate::Rbf).
    Rbf {
        /// σ².
        variance: f64,
        /// One (isotropic) or `d` (ARD) lengthscales.
        lengthscales: Vec<f64>,
    },
    /// [`Matern12`](crate::Matern12).
    Matern12 {
        /// σ².
        variance: f64,
        /// Lengthscales.
        lengthscales: Vec<f64>,
    },
    /// [`Matern32`](crate::Matern32).
    Matern32 {
        /// σ².
        variance: f64,
        /// Lengthscales.
        lengthscales: Vec<f64>,
    },
    /// [`Matern52`](crate::Matern52).
    Matern52 {
        /// σ².
        variance: f64,
        /// Lengthscales.
        lengthscales: Vec<f64>,
    },
    /// [`RationalQuadratic`](crate::RationalQuadratic).
    RationalQuadratic {
        /// σ².
        variance: f64,
        /// Lengthscales.
        lengthscales: Vec<f64>,
        /// Shape α.
        alpha: f64,
    },
    /// [`Periodic`](crate::Periodic).
    Periodic {
        /// σ².
        variance: f64,
        /// Lengthscales.
        lengthscales: Vec<f64>,
        /// Period p.
        period: f64,
    },
    /// [`Linear`](crate::Linear).
    Linear {
        /// σ².
        variance: f64,
    },
    /// [`Constant`](crate::Constant).
    Constant {
        /// σ².
        variance: f64,
    },
    /// [`White`](crate::White).
    White {
        /// σ².
        variance: f64,
    },
    /// [`Sum`](crate::Sum).
    Sum {
        /// Summands.
        terms: Vec<KernelSpec>,
    },
    /// [`Product`](crate::Product).
    Product {
        /// Factors.
        factors: Vec<KernelSpec>,
    },
    /// [`Scaled`](crate::Scaled).
    Scaled {
        /// Scale c.
        scale: f64,
        /// Inner kernel.
        kernel: Box<KernelSpec>,
    },
}

/// A matrix-valued kernel configuration. Tagged by `kind` (not `type`, which the scalar
/// [`KernelSpec`] inside `Scalar` already uses).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum MatrixKernelSpec {
    /// A scalar kernel (one output).
    Scalar(KernelSpec),
    /// [`Independent`](crate::Independent) outputs sharing a kernel.
    Independent {
        /// The shared kernel.
        kernel: KernelSpec,
        /// Number of outputs.
        outputs: usize,
    },
    /// [`Helmholtz`](crate::Helmholtz) kernel for 2-D vector fields.
    Helmholtz {
        /// Kernel of the potential Φ.
        phi: KernelSpec,
        /// Kernel of the stream function Ψ.
        psi: KernelSpec,
    },
}

/// Writes a kernel's spec, or fails naming the kernel when it has none (a user kernel).
pub(crate) fn serialize_spec<S: serde::Serializer, T: Serialize>(
    spec: Option<T>,
    kernel: &dyn std::fmt::Debug,
    serializer: S,
) -> std::result::Result<S::Ok, S::Error> {
    match spec {
        Some(spec) => spec.serialize(serializer),
        None => Err(serde::ser::Error::custom(format!("kernel {kernel:?} has no spec and cannot be saved"))),
    }
}
