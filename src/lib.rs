//! # fspace
//!
//! Bayesian deep learning with function-space priors: neural networks trained under
//! Gaussian-process priors, with Laplace and variational posteriors that scale through
//! matrix-free linear algebra. This facade re-exports the workspace crates; depend on the
//! individual crates to pull in only what you use.
//!
//! | module | crate | contents |
//! |---|---|---|
//! | [`linalg`] | `fspace-linalg` | `LinearOperator`, dense/closure/sum/diagonal operators |
//! | [`kernels`] | `fspace-kernels` | covariance functions, Gram matrices and operators, prior means |
//! | [`context`] | `fspace-context` | context-point samplers and boxes |

pub use fspace_context as context;
pub use fspace_kernels as kernels;
pub use fspace_linalg as linalg;
