//! Validation losses of the VI methods: mean Gaussian and categorical NLL of a predictive.

use fspace_core::FunctionPredictive;
use fspace_input::InputError;
use nalgebra::DMatrix;

use crate::error::{GfsviError, Result};

/// Mean categorical NLL of class probabilities (`n × C`) at integer labels.
pub(crate) fn categorical_nll(probs: &DMatrix<f64>, labels: &[f64]) -> Result<f64> {
    let n = labels.len() as f64;
    Ok(labels.iter().enumerate().map(|(i, &l)| -probs[(i, l as usize)].max(1e-300).ln()).sum::<f64>() / n)
}

/// Mean Gaussian NLL per target of a predictive of `f` plus noise `σ_y`.
pub fn gaussian_nll(pred: &FunctionPredictive, y: &DMatrix<f64>, noise_std: f64) -> Result<f64> {
    if pred.mean.shape() != y.shape() {
        return Err(GfsviError::Input(InputError::DimensionMismatch {
            what: "targets for the NLL",
            expected: pred.mean.len(),
            found: y.len(),
        }));
    }
    let s2 = noise_std * noise_std;
    let total: f64 = pred
        .mean
        .iter()
        .zip(pred.var.iter())
        .zip(y.iter())
        .map(|((m, v), t)| {
            let var = v + s2;
            0.5 * ((std::f64::consts::TAU * var).ln() + (t - m) * (t - m) / var)
        })
        .sum();
    Ok(total / y.len() as f64)
}
