//! # fspace-kernels
//!
//! Covariance functions for Gaussian-process priors in function space.
//!
//! A GP prior `f ~ GP(μ, k)` says that for any points `X = (x₁ … xₙ)` the function values are
//! jointly Gaussian, `f(X) ~ N(μ(X), K(X, X))` with `K(X, X)ᵢⱼ = k(xᵢ, xⱼ)`. The kernel encodes
//! smoothness (RBF: infinitely differentiable paths; Matérn-ν: ⌈ν⌉−1 times), lengthscale,
//! periodicity and — for the matrix-valued [`Helmholtz`] kernel — physics: every sample is the
//! sum of a curl-free and a divergence-free vector field.
//!
//! * Traits: [`Kernel`] (scalar, composable with `+`, `*`, [`Scaled`]), [`MatrixKernel`]
//!   (`d' × d'` blocks), [`SecondOrderKernel`] (analytic `∂²k/∂xᵢ∂yⱼ`). Users implement them
//!   for their own kernels.
//! * Kernels: [`Rbf`], [`Matern12`], [`Matern32`], [`Matern52`], [`RationalQuadratic`],
//!   [`Periodic`], [`Linear`], [`Constant`], [`White`], [`Independent`], [`Helmholtz`].
//! * Gram matrices: [`gram()`], [`gram_diag`], [`gram_grad`] and the matrix-free
//!   [`GramOperator`] (a [`LinearOperator`](fspace_linalg::LinearOperator)).
//! * Hyperparameters are a flat **log-space** vector with names (`params`, `param_names`,
//!   `set_params`); gradients of Gram entries are analytic, in the hyperparameters
//!   (`eval_grad`) and in the inputs (`eval_grad_x`, `∂k(x, y)/∂x`, for learning inducing
//!   inputs; every library scalar kernel has it, user kernels opt in).
//! * [`KernelSpec`] / [`MatrixKernelSpec`]: serde configurations.
//! * [`PriorMean`]: zero, constant or a closure.
//!
//! Invalid input — non-positive hyperparameters, NaN points, empty point sets, points whose
//! dimension disagrees with ARD lengthscales — is a [`KernelError`], never a panic.
#![doc = include_str!("../README.md")]

pub mod basic;
mod builders;
pub mod combinators;
pub mod error;
pub mod gram;
pub mod kernel;
pub mod mean;
pub mod multi;
mod names;
pub mod periodic;
pub mod prior;
pub mod spec;
pub mod stationary;

pub use basic::{Constant, Linear, White};
pub use combinators::{Product, Scaled, Sum};
pub use error::{KernelError, Result};
pub use gram::{gram, gram_diag, gram_grad, GramOperator, PointSet};
pub use kernel::{Kernel, KernelBase, MatrixKernel, SecondOrderKernel};
pub use mean::{MeanFn, PriorMean};
pub use multi::{Helmholtz, Independent};
pub use periodic::Periodic;
pub use prior::{GpPrior, IntoScalarKernel, SharedKernel};
pub use spec::{KernelSpec, MatrixKernelSpec};
pub use stationary::{
    Matern12, Matern12Profile, Matern32, Matern32Profile, Matern52, Matern52Profile, RadialProfile,
    RationalQuadratic, Rbf, RbfProfile, RqProfile, SmoothProfile, Stationary,
};
