//! # fspace-gp
//!
//! Gaussian-process machinery, both as baselines (the papers treat the exact GP as the gold
//! standard) and as prior machinery for function-space methods (hyperparameters by marginal
//! likelihood). Every model returns the shared [`fspace_core::Posterior`].
//!
//! Every model has one entry point in the workspace's call shape,
//! `fit(likelihood, prior, data[, config]) -> Fitted { posterior, report }`, generic over the
//! prior's kernel type: a [`GpPrior`](fspace_kernels::GpPrior) built with
//! [`GpPrior::with_kernel`](fspace_kernels::GpPrior::with_kernel) keeps the concrete kernel (the
//! posterior holds it, so trained hyperparameters are read through its type); the shared default
//! serves the same call.
//!
//! * [`exact::fit`] → [`ExactGp`]: regression, any (matrix-valued) kernel; log marginal
//!   likelihood and its analytic gradient.
//! * [`fit_hyperparameters`]: Adam with restarts on the full or minibatch (Chen et al. 2021)
//!   log marginal likelihood — the kernel and σ² to hand to a model's `fit`.
//! * [`classification::fit`] → [`LaplaceGpClassifier`]: binary classification by the Laplace
//!   approximation; [`dirichlet_targets`] / [`fit_dirichlet_hyperparameters`]: Milios et al.
//!   (2018).
//! * [`svgp::fit`] → [`Svgp`]: sparse variational GP (Hensman et al. 2013) with minibatches,
//!   natural gradients on `q(u)`, Adam on the hyperparameters and optionally on the inducing
//!   inputs; [`kmeans()`] to initialise them.
//! * [`sparse_dirichlet::fit`] → [`SparseDirichletGp`]: sparse multi-class classification on
//!   Milios et al.'s targets — `C` heteroscedastic sparse GPs with the closed-form optimal `q(u)`
//!   (Titsias 2009).
//!
//! Ill-conditioned Gram matrices are factorised with reported jitter; anything that cannot be
//! recovered — non-finite targets, more inducing points than data, diverging hyperparameters —
//! is a [`GpError`].
#![doc = include_str!("../README.md")]

pub mod classification;
pub mod error;
pub mod exact;
pub mod fit;
pub mod kmeans;
pub mod sparse_dirichlet;
pub mod svgp;
#[cfg(test)]
mod tests;

pub use classification::{
    dirichlet_targets, fit_dirichlet_hyperparameters, GpClassifierConfig, GpClassifierReport,
    LaplaceGpClassifier,
};
pub use error::{GpError, Result};
pub use exact::{ExactGp, ExactGpReport, Noise};
pub use fit::{fit_hyperparameters, FitConfig, HyperparameterReport};
pub use kmeans::{kmeans, kmeans_sharded, KmeansShard};
pub use sparse_dirichlet::{SparseDirichletConfig, SparseDirichletGp, SparseDirichletReport};
pub use svgp::{InducingPoints, Svgp, SvgpConfig, SvgpReport};
