//! # fspace
//!
//! Bayesian deep learning with function-space priors: neural networks trained under
//! Gaussian-process priors, with Laplace and variational posteriors that scale through
//! matrix-free linear algebra. This facade re-exports the workspace crates; depend on the
//! individual crates to pull in only what you use.
//!
//! | module | crate | contents |
//! |---|---|---|
//! | [`input`] | `fspace-input` | `InputError`, the shape / non-finite / empty / invalid-value errors every crate wraps as its `Input` variant |
//! | [`linalg`] | `fspace-linalg` | `LinearOperator`, Lanczos (+LDLᵀ), CG, Cholesky, SLQ, low-rank updates |
//! | [`kernels`] | `fspace-kernels` | covariance functions, Gram matrices and operators, prior means |
//! | [`context`] | `fspace-context` | context-point samplers and boxes |
//! | [`core`] | `fspace-core` | likelihoods, the `Posterior` contract, minibatches, early stopping |
//! | [`metrics`] | `fspace-metrics` | ELL, NLL, RMSE, CRPS, CQM, accuracy, ECE, Brier, OOD AUC, W2, mean rank |
//! | [`gp`] | `fspace-gp` | exact GP, marginal-likelihood fitting, GP classification, SVGP, k-means |
//! | [`nn`] | `fspace-nn` | MLP, CNN and Helmholtz nets with f, J·u, Jᵀ·V, Jacobian, NTK, GGN products, MAP training |
//! | [`fsp_laplace`] | `fspace-fsp-laplace` | FSP-Laplace: MAP under a GP prior (Alg. 1), matrix-free linearised Laplace (Alg. 2) |
//! | [`laplace`] | `fspace-laplace` | weight-space linearised and generalised (tempered) Laplace: full, B-Diag, diag, KFAC, EKFAC, last-layer, low-rank |
//! | [`valla`] | `fspace-valla` | VaLLA (sparse variational GP on the NTK, MAP net as mean) and ELLA (Nyström NTK features) |
//! | [`gfsvi`] | `fspace-gfsvi` | GFSVI (regularised-KL function-space VI), TFSVI, FVI (spectral Stein gradients), mean-field VI |
//! | [`data`] | `fspace-data` | generators, bundled datasets, CSV/IDX loaders, splits |
//! | [`interop`] | `fspace-interop` | PyTorch / numpy weights (safetensors, .npz) into `Mlp` / `Cnn`; predictions out as .npz |

pub use fspace_context as context;
pub use fspace_core as core;
pub use fspace_data as data;
pub use fspace_fsp_laplace as fsp_laplace;
pub use fspace_gfsvi as gfsvi;
pub use fspace_gp as gp;
pub use fspace_input as input;
pub use fspace_interop as interop;
pub use fspace_kernels as kernels;
pub use fspace_laplace as laplace;
pub use fspace_linalg as linalg;
pub use fspace_metrics as metrics;
pub use fspace_nn as nn;
pub use fspace_valla as valla;

#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

#[doc = include_str!("../docs/guide.md")]
#[cfg(doctest)]
pub struct GuideDoctests;

#[doc = include_str!("../docs/getting-started/rust.md")]
#[cfg(doctest)]
pub struct GettingStartedRustDoctests;
