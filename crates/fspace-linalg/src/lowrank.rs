//! Low-rank-plus-diagonal operators `A = Δ + U C Uᵀ` (`Δ` positive diagonal, `C = diag(c) ⪰ 0`,
//! `U` `n × k`) with Woodbury solves and log-determinants in `O(n·k²)`:
//!
//! with `W = C^{1/2}` and `S = I_k + W Uᵀ Δ⁻¹ U W` (SPD for any `c ≥ 0`),
//! `A⁻¹ b = Δ⁻¹ b − Δ⁻¹ U W S⁻¹ W Uᵀ Δ⁻¹ b` and `log det A = Σ log Δᵢ + log det S`.

use nalgebra::{Cholesky, DMatrix, DVector, Dyn};

use crate::error::{ensure_dim, ensure_finite, LinalgError, Result};
use crate::operator::LinearOperator;

/// `Δ + U diag(c) Uᵀ`; see the module docs.
#[derive(Debug, Clone)]
pub struct LowRankPlusDiagonal {
    u: DMatrix<f64>,
    c: DVector<f64>,
    delta: DVector<f64>,
    /// `U W` (scaled factor) and the Cholesky factor of `S`, computed once.
    uw: DMatrix<f64>,
    s_chol: Cholesky<f64, Dyn>,
}

impl LowRankPlusDiagonal {
    /// Builds the operator; `delta > 0`, `c ≥ 0`, all finite, shapes consistent.
    pub fn new(u: DMatrix<f64>, c: DVector<f64>, delta: DVector<f64>) -> Result<Self> {
        ensure_dim("low-rank factor rows", delta.len(), u.nrows())?;
        ensure_dim("low-rank weights", u.ncols(), c.len())?;
        ensure_finite("low-rank factor", u.iter().chain(c.iter()).chain(delta.iter()))?;
        if let Some(&bad) = delta.iter().find(|&&d| d <= 0.0) {
            return Err(LinalgError::NotPositiveDefinite { what: "diagonal part Δ", value: bad });
        }
        if let Some(&bad) = c.iter().find(|&&v| v < 0.0) {
            return Err(LinalgError::NotPositiveDefinite { what: "low-rank weights c", value: bad });
        }
        let mut uw = u.clone();
        for (j, mut col) in uw.column_iter_mut().enumerate() {
            col.scale_mut(c[j].sqrt());
        }
        let mut scaled = uw.clone();
        for (i, mut row) in scaled.row_iter_mut().enumerate() {
            row.scale_mut(1.0 / delta[i]);
        }
        let s = DMatrix::identity(u.ncols(), u.ncols()) + uw.tr_mul(&scaled);
        let s_chol = Cholesky::new(s)
            .ok_or(LinalgError::NotPositiveDefinite { what: "I + W UᵀΔ⁻¹U W", value: f64::NAN })?;
        Ok(Self { u, c, delta, uw, s_chol })
    }

    /// `A⁻¹ b` by Woodbury.
    pub fn solve(&self, b: &DVector<f64>) -> Result<DVector<f64>> {
        ensure_dim("Woodbury right-hand side", self.delta.len(), b.len())?;
        ensure_finite("Woodbury right-hand side", b.iter())?;
        let db = b.component_div(&self.delta);
        let t = self.s_chol.solve(&self.uw.tr_mul(&db));
        Ok(&db - (&self.uw * t).component_div(&self.delta))
    }

    /// `log det A`.
    pub fn log_det(&self) -> f64 {
        self.delta.iter().map(|d| d.ln()).sum::<f64>()
            + 2.0 * self.s_chol.l_dirty().diagonal().iter().map(|v| v.ln()).sum::<f64>()
    }

    /// The dense matrix (tests, small n).
    pub fn to_dense(&self) -> DMatrix<f64> {
        DMatrix::from_diagonal(&self.delta) + &self.uw * self.uw.transpose()
    }

    /// The factor `U`.
    pub fn factor(&self) -> &DMatrix<f64> {
        &self.u
    }

    /// The weights `c`.
    pub fn weights(&self) -> &DVector<f64> {
        &self.c
    }
}

impl LinearOperator for LowRankPlusDiagonal {
    fn dim(&self) -> usize {
        self.delta.len()
    }
    fn matvec(&self, v: &DVector<f64>) -> DVector<f64> {
        v.component_mul(&self.delta) + &self.uw * self.uw.tr_mul(v)
    }
    fn matmat(&self, v: &DMatrix<f64>) -> DMatrix<f64> {
        let mut out = &self.uw * self.uw.tr_mul(v);
        for (i, mut row) in out.row_iter_mut().enumerate() {
            row += v.row(i) * self.delta[i];
        }
        out
    }
}
