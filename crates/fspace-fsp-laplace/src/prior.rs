//! The paper's protocol for choosing the GP prior's hyperparameters (maximum marginal
//! likelihood before training).

use fspace_gp::FitConfig;
use fspace_kernels::{GpPrior, Kernel, PriorMean};
use nalgebra::{DMatrix, DVector};

use crate::error::Result;

/// The paper's regression protocol (App. B.1): hyperparameters of a scalar kernel (and the
/// noise variance) by maximising the exact GP's log marginal likelihood on the training data,
/// with a centred prior. Returns the fitted prior and the fitted noise variance.
pub fn fit_regression_prior<K: Kernel + Clone + 'static>(
    kernel: &K,
    x: &DMatrix<f64>,
    y: &DVector<f64>,
    initial_noise_variance: f64,
    config: &FitConfig,
) -> Result<(GpPrior, f64)> {
    let targets = DMatrix::from_column_slice(y.len(), 1, y.as_slice());
    let report = fspace_gp::fit_hyperparameters(
        kernel,
        &PriorMean::Zero,
        initial_noise_variance,
        x,
        &targets,
        config,
    )?;
    Ok((GpPrior::centered(report.kernel), report.noise_variance))
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
) -> Result<GpPrior> {
    let (fitted, _lml) =
        fspace_gp::fit_dirichlet_hyperparameters(kernel, x, labels, classes, alpha_eps, config)?;
    Ok(GpPrior::centered(fspace_kernels::Independent::new(fitted, classes)?))
}
