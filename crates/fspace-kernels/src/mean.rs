//! Prior mean functions `μ(x)` of a Gaussian-process prior.

use fspace_input::InputError;
use std::fmt;
use std::sync::Arc;

use nalgebra::{DMatrix, DVector};

use crate::error::{KernelError, Result};
use crate::gram::PointSet;

/// A user-supplied mean: writes the `d'` outputs of `μ(x)` for one point `x`.
pub type MeanFn = Arc<dyn Fn(&[f64], &mut [f64]) + Send + Sync>;

/// The prior mean of a (possibly multi-output) GP.
#[derive(Clone, Default)]
pub enum PriorMean {
    /// `μ = 0`.
    #[default]
    Zero,
    /// `μ(x) = c` for every output.
    Constant(f64),
    /// A user closure; it receives one point and writes its `d'` outputs.
    Function(MeanFn),
}

impl fmt::Debug for PriorMean {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Zero => write!(f, "PriorMean::Zero"),
            Self::Constant(c) => write!(f, "PriorMean::Constant({c})"),
            Self::Function(_) => write!(f, "PriorMean::Function(..)"),
        }
    }
}

impl PriorMean {
    /// `μ(X)` for points as rows of `x`, for `outputs` outputs, point-major (`n·d'` values).
    /// Errors on empty or non-finite points, and on a closure that returns non-finite values.
    pub fn evaluate(&self, x: &DMatrix<f64>, outputs: usize) -> Result<DVector<f64>> {
        let points = PointSet::new("prior-mean points", x)?;
        let n = points.len();
        Ok(match self {
            Self::Zero => DVector::zeros(n * outputs),
            Self::Constant(c) => {
                if !c.is_finite() {
                    return Err(KernelError::Input(InputError::NonFinite { what: "constant prior mean" }));
                }
                DVector::from_element(n * outputs, *c)
            }
            Self::Function(f) => {
                let mut out = DVector::zeros(n * outputs);
                for i in 0..n {
                    f(points.row(i), &mut out.as_mut_slice()[i * outputs..(i + 1) * outputs]);
                }
                if out.iter().any(|v| !v.is_finite()) {
                    return Err(KernelError::Input(InputError::NonFinite {
                        what: "prior mean function output",
                    }));
                }
                out
            }
        })
    }
}

/// Zero and constant means serialise as `"zero"` / `{"constant": c}`; a closure mean cannot be
/// saved (a serialisation error that says so).
impl serde::Serialize for PriorMean {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        match self {
            Self::Zero => MeanSpec::Zero.serialize(serializer),
            Self::Constant(c) => MeanSpec::Constant(*c).serialize(serializer),
            Self::Function(_) => Err(serde::ser::Error::custom("a closure prior mean cannot be saved")),
        }
    }
}

impl<'de> serde::Deserialize<'de> for PriorMean {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        Ok(match MeanSpec::deserialize(deserializer)? {
            MeanSpec::Zero => Self::Zero,
            MeanSpec::Constant(c) => Self::Constant(c),
        })
    }
}

#[derive(serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
enum MeanSpec {
    Zero,
    Constant(f64),
}
