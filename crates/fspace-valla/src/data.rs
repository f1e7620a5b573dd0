//! Input checks shared by VaLLA and ELLA, and the per-point quantities both precompute.

use fspace_core::FunctionPredictive;
use fspace_input::InputError;
use fspace_nn::Network;
use nalgebra::{DMatrix, DVector};

use crate::error::{ensure_positive, Result, VallaError};
use crate::objective::{point_term, ClassApprox, DataTerm, VallaLikelihood};

/// The model's checks of a data set (`what` names it in errors): the input width, one target
/// per input and targets valid for the likelihood (labels integral in `0..d'`). Training and
/// validation sets come through [`fspace_core::Data`], which checked them non-empty and finite
/// once at the boundary; an evaluation set from the caller goes through
/// [`check_evaluation_data`].
pub(crate) fn check_data<N: Network>(
    net: &N,
    likelihood: VallaLikelihood,
    x: &DMatrix<f64>,
    y: &DVector<f64>,
    what: &'static str,
) -> Result<()> {
    if x.nrows() == 0 {
        return Err(VallaError::Input(InputError::Empty { what }));
    }
    if x.ncols() != net.input_dim() {
        return Err(VallaError::Input(InputError::DimensionMismatch {
            what: "input columns",
            expected: net.input_dim(),
            found: x.ncols(),
        }));
    }
    if y.len() != x.nrows() {
        return Err(VallaError::Input(InputError::DimensionMismatch {
            what: "targets (one per input row)",
            expected: x.nrows(),
            found: y.len(),
        }));
    }
    check_likelihood(net, likelihood)?;
    if likelihood == VallaLikelihood::Categorical {
        let classes = net.output_dim();
        if let Some((index, &value)) =
            y.iter().enumerate().find(|(_, &v)| v < 0.0 || v.fract() != 0.0 || v >= classes as f64)
        {
            return Err(VallaError::InvalidTarget {
                index,
                value,
                reason: format!("labels must be integers in 0..{classes}"),
            });
        }
    }
    Ok(())
}

/// An evaluation set passed to a fitted posterior: finite, then [`check_data`].
pub(crate) fn check_evaluation_data<N: Network>(
    net: &N,
    likelihood: VallaLikelihood,
    x: &DMatrix<f64>,
    y: &DVector<f64>,
) -> Result<()> {
    if x.iter().any(|v| !v.is_finite()) {
        return Err(VallaError::Input(InputError::NonFinite { what: "evaluation inputs" }));
    }
    if y.iter().any(|v| !v.is_finite()) {
        return Err(VallaError::Input(InputError::NonFinite { what: "evaluation targets" }));
    }
    check_data(net, likelihood, x, y, "evaluation data")
}

/// The likelihood fits the network: Gaussian needs one output and σ > 0; categorical ≥ 2.
pub(crate) fn check_likelihood<N: Network>(net: &N, likelihood: VallaLikelihood) -> Result<()> {
    match likelihood {
        VallaLikelihood::Gaussian { noise_std } => {
            ensure_positive("noise_std (σ)", noise_std)?;
            if net.output_dim() != 1 {
                return Err(VallaError::Input(InputError::DimensionMismatch {
                    what: "network outputs for the Gaussian likelihood",
                    expected: 1,
                    found: net.output_dim(),
                }));
            }
        }
        VallaLikelihood::Categorical => {
            if net.output_dim() < 2 {
                return Err(VallaError::Input(InputError::Invalid {
                    what: "network outputs for the categorical likelihood",
                    reason: "need ≥ 2 classes (one logit per class)".into(),
                }));
            }
        }
    }
    Ok(())
}

/// MAP outputs and unit-NTK diagonal blocks of every row, in chunks of 512 points.
pub(crate) fn outputs_and_ntk_diagonal<N: Network>(
    net: &N,
    x: &DMatrix<f64>,
) -> Result<(DMatrix<f64>, Vec<DMatrix<f64>>)> {
    let mut g = DMatrix::zeros(x.nrows(), net.output_dim());
    let mut blocks = Vec::with_capacity(x.nrows());
    for start in (0..x.nrows()).step_by(512) {
        // Seconds over a large training set: Ctrl-C between chunks.
        fspace_input::interrupt::check("the network's outputs and NTK diagonal")?;
        let len = 512.min(x.nrows() - start);
        let xs = x.rows(start, len).into_owned();
        g.rows_mut(start, len).copy_from(&net.forward(&xs)?);
        blocks.extend(net.ntk_diagonal(&xs)?);
    }
    Ok((g, blocks))
}

/// Mean NLL of `y` under the predictive `p(y | x) ≈ E[p(y | f)]`, `f ~ N(g, Σᵢ)` per point
/// (Gaussian: `N(g, σ² + Σ)`; categorical: the probit approximation).
pub(crate) fn mean_nll_from_blocks(
    likelihood: VallaLikelihood,
    noise_variance: f64,
    g: &DMatrix<f64>,
    blocks: &[DMatrix<f64>],
    y: &DVector<f64>,
) -> Result<f64> {
    let term = DataTerm { likelihood, approx: ClassApprox::Probit, alpha: 1.0 };
    let mut total = 0.0;
    for (i, s) in blocks.iter().enumerate() {
        total -= point_term(term, &g.row(i).transpose(), s, y[i], noise_variance, None, i)?.0;
    }
    Ok(total / y.len() as f64)
}

/// The marginal predictive from per-point covariance blocks (rounding below 0 clipped).
pub(crate) fn marginals(g: DMatrix<f64>, blocks: &[DMatrix<f64>]) -> fspace_core::Result<FunctionPredictive> {
    let var = DMatrix::from_fn(g.nrows(), g.ncols(), |i, o| fspace_core::clip_rounding(blocks[i][(o, o)]));
    FunctionPredictive::new(g, var)
}

/// A crate error as the `Posterior` contract's error (`what` names the posterior).
pub(crate) fn to_core(e: VallaError, what: &'static str) -> fspace_core::CoreError {
    match e {
        VallaError::Core(c) => c,
        other => fspace_core::CoreError::method(what, other),
    }
}
