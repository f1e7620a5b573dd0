//! Axis-aligned boxes that context points are drawn from.

use fspace_input::InputError;
use nalgebra::DMatrix;
use serde::{Deserialize, Serialize};

use crate::error::{ContextError, Result};

/// An axis-aligned box `Πᵢ [lowerᵢ, upperᵢ]` (degenerate sides `lowerᵢ = upperᵢ` are allowed,
/// e.g. a constant pixel). A deserialised box is checked as [`BoundingBox::new`] checks one (an
/// inverted or non-finite box in a file or a configuration is an error, not a box that makes a
/// sampler panic).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "BoxFields")]
pub struct BoundingBox {
    lower: Vec<f64>,
    upper: Vec<f64>,
}

/// A box's fields as written, before [`BoundingBox::new`]'s checks.
#[derive(Deserialize)]
struct BoxFields {
    lower: Vec<f64>,
    upper: Vec<f64>,
}

impl TryFrom<BoxFields> for BoundingBox {
    type Error = ContextError;
    fn try_from(fields: BoxFields) -> Result<Self> {
        Self::new(fields.lower, fields.upper)
    }
}

impl BoundingBox {
    /// A box with the given bounds; errors on length mismatch, d = 0, non-finite or inverted
    /// bounds.
    pub fn new(lower: Vec<f64>, upper: Vec<f64>) -> Result<Self> {
        if lower.is_empty() {
            return Err(ContextError::Input(InputError::Empty { what: "box bounds" }));
        }
        if lower.len() != upper.len() {
            return Err(ContextError::Input(InputError::DimensionMismatch {
                what: "upper bounds vs. lower bounds",
                expected: lower.len(),
                found: upper.len(),
            }));
        }
        if lower.iter().chain(&upper).any(|v| !v.is_finite()) {
            return Err(ContextError::Input(InputError::NonFinite { what: "box bounds" }));
        }
        if let Some(dim) = (0..lower.len()).find(|&i| lower[i] > upper[i]) {
            return Err(ContextError::InvertedBox { dim, lower: lower[dim], upper: upper[dim] });
        }
        Ok(Self { lower, upper })
    }

    /// The cube `[lo, hi]^d`.
    pub fn cube(d: usize, lo: f64, hi: f64) -> Result<Self> {
        Self::new(vec![lo; d], vec![hi; d])
    }

    /// The box of the data's per-feature range widened by `widen` times its width on each side:
    /// `[v_min − widen·Δ, v_max + widen·Δ]`, `Δ = v_max − v_min`. FSP-Laplace App. B.2 uses
    /// `widen = 0.5`.
    pub fn from_data(x: &DMatrix<f64>, widen: f64) -> Result<Self> {
        if x.nrows() == 0 || x.ncols() == 0 {
            return Err(ContextError::Input(InputError::Empty { what: "data for the context box" }));
        }
        if x.iter().any(|v| !v.is_finite()) {
            return Err(ContextError::Input(InputError::NonFinite { what: "data for the context box" }));
        }
        if !(widen.is_finite() && widen >= 0.0) {
            return Err(ContextError::Input(InputError::Invalid {
                what: "widen",
                reason: format!("{widen} must be finite and ≥ 0"),
            }));
        }
        let (mut lower, mut upper) = (Vec::new(), Vec::new());
        for col in x.column_iter() {
            let (lo, hi) = (col.min(), col.max());
            let delta = hi - lo;
            lower.push(lo - widen * delta);
            upper.push(hi + widen * delta);
        }
        Self::new(lower, upper)
    }

    /// Dimension `d`.
    pub fn dim(&self) -> usize {
        self.lower.len()
    }
    /// Lower bounds.
    pub fn lower(&self) -> &[f64] {
        &self.lower
    }
    /// Upper bounds.
    pub fn upper(&self) -> &[f64] {
        &self.upper
    }
    /// Whether `x` lies in the closed box.
    pub fn contains(&self, x: &[f64]) -> bool {
        x.len() == self.dim() && x.iter().enumerate().all(|(i, v)| *v >= self.lower[i] && *v <= self.upper[i])
    }
    /// Maps unit-cube points (rows of `u`) affinely onto the box.
    pub fn from_unit(&self, u: &DMatrix<f64>) -> DMatrix<f64> {
        DMatrix::from_fn(u.nrows(), u.ncols(), |i, j| {
            // Clamp guards against the affine map rounding just past the upper bound.
            (self.lower[j] + u[(i, j)] * (self.upper[j] - self.lower[j])).clamp(self.lower[j], self.upper[j])
        })
    }
}
