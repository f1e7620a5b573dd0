//! The Gaussian-process prior `f ~ GP(μ, Σ)` that every function-space method of the workspace
//! takes: FSP-Laplace regularises with it, GFSVI and FVI measure their KL against it, and the
//! GP baselines are its posteriors.

use std::sync::Arc;

use nalgebra::{DMatrix, DVector};

use crate::error::{KernelError, Result};
use crate::gram::{gram, gram_diag};
use crate::kernel::MatrixKernel;
use crate::mean::PriorMean;

/// A `d'`-output GP prior: a (matrix-valued) covariance function and a mean. Gram matrices and
/// means are point-major (`i·d' + o`), the order of a network's flattened outputs. Cloning
/// shares the kernel.
#[derive(Clone)]
pub struct GpPrior {
    /// `Σ(x, x')`, a `d' × d'` block per pair of points (scalar kernels have `d' = 1`; use
    /// `Independent` for independent outputs and `Helmholtz` for vector fields).
    pub kernel: Arc<dyn MatrixKernel>,
    /// `μ(x)`.
    pub mean: PriorMean,
}

impl std::fmt::Debug for GpPrior {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpPrior").field("kernel", &self.kernel).field("mean", &self.mean).finish()
    }
}

impl GpPrior {
    /// `GP(mean, kernel)`.
    pub fn new(kernel: impl MatrixKernel + 'static, mean: PriorMean) -> Self {
        Self { kernel: Arc::new(kernel), mean }
    }
    /// A zero-mean prior (the papers' default).
    pub fn centered(kernel: impl MatrixKernel + 'static) -> Self {
        Self::new(kernel, PriorMean::Zero)
    }
    /// A prior over a boxed kernel (e.g. one built from a
    /// [`MatrixKernelSpec`](crate::MatrixKernelSpec)).
    pub fn from_boxed(kernel: Box<dyn MatrixKernel>, mean: PriorMean) -> Self {
        Self { kernel: Arc::from(kernel), mean }
    }
    /// A prior over an already shared kernel.
    pub fn from_shared(kernel: Arc<dyn MatrixKernel>, mean: PriorMean) -> Self {
        Self { kernel, mean }
    }
    /// Outputs `d'`.
    pub fn output_dim(&self) -> usize {
        self.kernel.output_dim()
    }
    /// `μ(X)` point-major (`n·d'`).
    pub fn mean_at(&self, x: &DMatrix<f64>) -> Result<DVector<f64>> {
        self.mean.evaluate(x, self.output_dim())
    }
    /// `Σ(X, X)` (`n·d' × n·d'`, point-major) — for the small sets of a training step; use
    /// [`GramOperator`](crate::GramOperator) for a matrix-free product.
    pub fn gram(&self, x: &DMatrix<f64>) -> Result<DMatrix<f64>> {
        gram(&*self.kernel, x, x)
    }
    /// `diag Σ(X, X)` (`n·d'`): the prior marginal variances.
    pub fn variances(&self, x: &DMatrix<f64>) -> Result<DVector<f64>> {
        gram_diag(&*self.kernel, x)
    }
    /// Checks the prior against a model's input and output dimensions.
    pub fn check(&self, input_dim: usize, output_dim: usize) -> Result<()> {
        if self.output_dim() != output_dim {
            return Err(KernelError::DimensionMismatch {
                what: "prior outputs vs. network outputs",
                expected: output_dim,
                found: self.output_dim(),
            });
        }
        self.kernel.check_input_dim(input_dim)
    }
}
