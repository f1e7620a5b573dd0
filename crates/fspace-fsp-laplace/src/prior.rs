//! The Gaussian-process prior `f ~ GP(μ, Σ)` that FSP-Laplace regularises with, and the paper's
//! protocol for choosing its hyperparameters (maximum marginal likelihood before training).

use fspace_gp::FitConfig;
use fspace_kernels::{gram, gram_diag, Kernel, MatrixKernel, PriorMean};
use nalgebra::{DMatrix, DVector};

use crate::error::{ensure_dim, Result};

/// A `d'`-output GP prior: a (matrix-valued) covariance function and a mean.
#[derive(Debug)]
pub struct FunctionPrior {
    /// `Σ(x, x')`, a `d' × d'` block per pair of points (scalar kernels have `d' = 1`; use
    /// `Independent` for independent outputs and `Helmholtz` for vector fields).
    pub kernel: Box<dyn MatrixKernel>,
    /// `μ(x)`.
    pub mean: PriorMean,
}

impl FunctionPrior {
    /// A prior from a kernel and a mean.
    pub fn new(kernel: Box<dyn MatrixKernel>, mean: PriorMean) -> Self {
        Self { kernel, mean }
    }

    /// A centred prior (the paper's default).
    pub fn centered(kernel: Box<dyn MatrixKernel>) -> Self {
        Self::new(kernel, PriorMean::Zero)
    }

    /// Outputs `d'`.
    pub fn output_dim(&self) -> usize {
        self.kernel.output_dim()
    }

    /// `μ(C)` point-major (`n_C·d'`).
    pub fn mean_at(&self, c: &DMatrix<f64>) -> Result<DVector<f64>> {
        Ok(self.mean.evaluate(c, self.output_dim())?)
    }

    /// `Σ(C, C)` (`n_C·d' × n_C·d'`, point-major). Only for the small per-step context sets of
    /// training; the Laplace step stays matrix-free.
    pub fn gram(&self, c: &DMatrix<f64>) -> Result<DMatrix<f64>> {
        Ok(gram(&*self.kernel, c, c)?)
    }

    /// `diag Σ(C, C)` (`n_C·d'`): the prior marginal variances.
    pub fn variances(&self, c: &DMatrix<f64>) -> Result<DVector<f64>> {
        Ok(gram_diag(&*self.kernel, c)?)
    }

    /// Checks the prior against a network's input and output dimensions.
    pub(crate) fn check(&self, input_dim: usize, output_dim: usize) -> Result<()> {
        ensure_dim("prior outputs vs. network outputs", output_dim, self.output_dim())?;
        self.kernel.check_input_dim(input_dim)?;
        Ok(())
    }
}

/// The paper's regression protocol (App. B.1): hyperparameters of a scalar kernel (and the
/// noise variance) by maximising the exact GP's log marginal likelihood on the training data,
/// with a centred prior. Returns the fitted prior and the fitted noise variance.
pub fn fit_regression_prior<K: Kernel + Clone + 'static>(
    kernel: &K,
    x: &DMatrix<f64>,
    y: &DVector<f64>,
    initial_noise_variance: f64,
    config: &FitConfig,
) -> Result<(FunctionPrior, f64)> {
    let targets = DMatrix::from_column_slice(y.len(), 1, y.as_slice());
    let report = fspace_gp::fit_hyperparameters(
        kernel,
        &PriorMean::Zero,
        initial_noise_variance,
        x,
        &targets,
        config,
    )?;
    Ok((FunctionPrior::centered(Box::new(report.kernel)), report.noise_variance))
}

/// The paper's classification protocol (App. B.1): a scalar kernel's hyperparameters from
/// Milios et al.'s Dirichlet reparameterisation of the labels into regression targets; the
/// prior on the `classes` logits is centred with independent outputs sharing that kernel.
pub fn fit_classification_prior<K: Kernel + Clone + 'static>(
    kernel: &K,
    x: &DMatrix<f64>,
    labels: &DVector<f64>,
    classes: usize,
    alpha_eps: f64,
    config: &FitConfig,
) -> Result<FunctionPrior> {
    let (fitted, _lml) =
        fspace_gp::fit_dirichlet_hyperparameters(kernel, x, labels, classes, alpha_eps, config)?;
    Ok(FunctionPrior::centered(Box::new(fspace_kernels::Independent::new(fitted, classes)?)))
}
