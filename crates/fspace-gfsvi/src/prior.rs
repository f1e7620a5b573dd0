//! The GP prior `GP(μ, K)` of GFSVI and FVI, evaluated at measurement points.

use std::sync::Arc;

use fspace_kernels::{gram, MatrixKernel, PriorMean};
use nalgebra::{DMatrix, DVector};

use crate::error::Result;

/// A (possibly multi-output) GP prior: kernel and mean. Rows of its Gram matrices are
/// point-major (`i·d' + o`), matching the network's outputs.
#[derive(Clone)]
pub struct GpPrior {
    /// The covariance function (`d'` outputs).
    pub kernel: Arc<dyn MatrixKernel>,
    /// The mean function.
    pub mean: PriorMean,
}

impl std::fmt::Debug for GpPrior {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpPrior").field("kernel", &self.kernel).finish_non_exhaustive()
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
    /// Outputs per point.
    pub fn output_dim(&self) -> usize {
        self.kernel.output_dim()
    }
    /// `μ(X)` (`n·d'`, point-major).
    pub fn mean_at(&self, x: &DMatrix<f64>) -> Result<DVector<f64>> {
        Ok(self.mean.evaluate(x, self.output_dim())?)
    }
    /// `K(X, X)` (`n·d'` square).
    pub fn gram(&self, x: &DMatrix<f64>) -> Result<DMatrix<f64>> {
        Ok(gram(self.kernel.as_ref(), x, x)?)
    }
}
