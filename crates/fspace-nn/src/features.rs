//! Input feature maps applied before a network, e.g. the Mauna Loa setup's
//! `(t, sin(2πt/T), cos(2πt/T))`. They transform inputs only, so the network's parameter
//! Jacobian is unchanged.

use nalgebra::DMatrix;
use serde::{Deserialize, Serialize};

use crate::mlp::{NnError, Result};

/// A feature map `x ↦ φ(x)`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum FeatureMap {
    /// Keep `x`.
    Identity,
    /// Append `sin(2π x_c / T)` and `cos(2π x_c / T)` for input column `c`.
    Periodic {
        /// The column.
        column: usize,
        /// The period `T > 0`.
        period: f64,
    },
}

impl FeatureMap {
    /// Output dimension for `d` input columns.
    pub fn output_dim(&self, d: usize) -> usize {
        match self {
            Self::Identity => d,
            Self::Periodic { .. } => d + 2,
        }
    }
    /// `φ(X)` row by row.
    pub fn apply(&self, x: &DMatrix<f64>) -> Result<DMatrix<f64>> {
        match *self {
            Self::Identity => Ok(x.clone()),
            Self::Periodic { column, period } => {
                if column >= x.ncols() {
                    return Err(NnError::DimensionMismatch {
                        what: "periodic feature column",
                        expected: x.ncols(),
                        found: column,
                    });
                }
                if !(period.is_finite() && period > 0.0) {
                    return Err(NnError::NonFinite { what: "period (must be finite and > 0)" });
                }
                let d = x.ncols();
                Ok(DMatrix::from_fn(x.nrows(), d + 2, |i, j| {
                    let w = std::f64::consts::TAU * x[(i, column)] / period;
                    match j {
                        j if j < d => x[(i, j)],
                        j if j == d => w.sin(),
                        _ => w.cos(),
                    }
                }))
            }
        }
    }
}
