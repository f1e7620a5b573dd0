//! The linearised network's function-space covariance `J(X) diag(s) J(X)ᵀ` and its exact
//! pull-back to the weights `w` (at which `J` is evaluated) and to `s` — what GFSVI and TFSVI
//! differentiate every step.
//!
//! For `Φ(w, s) = ⟨C, J(w) S J(w)ᵀ⟩` with `C` symmetric and `S = diag(s)`:
//!
//! * `∂Φ/∂s_k = (Jᵀ C J)_kk`, the column-wise dot of `J` and `CJ`;
//! * `dΦ = 2 tr(C dJ S Jᵀ) = 2 Σ_r dJ_r · u_r` with `U = S Jᵀ C` held fixed, so
//!   `∂Φ/∂w = 2 ∂/∂w Σ_r J_r(w) u_r`: the gradient of a sum of *per-row* directional derivatives
//!   (each row `r = (point, output)` has its own weight tangent `u_r`).
//!
//! For the MLP the last quantity is one forward-tangent pass and one reverse pass over all rows
//! at once (the "tangent network"): with layer `j` computing `h_j = W_j a_j + b_j`, the tangent
//! `ḣ_j = W_j ȧ_j + T_j` carries the injection `T_j[r] = U_j^{(r)} a_j(x_r) + u_{b_j}^{(r)}`, and
//! its reverse pass needs `R_j[r] = U_j^{(r)ᵀ} δ_j[r]` (the adjoint of the tangent stream is the
//! ordinary back-propagated `δ_j`). Everything else is a batched GEMM; the cost is
//! `O(rows · p)` beyond forming `J` and `JᵀC`. The reference is
//! `Mlp::jsj_pullback` (dfdx, one taped pass per row); the tests
//! check both against central finite differences.

use nalgebra::{DMatrix, DVector};
use rayon::prelude::*;

use super::ntk::Side;
use crate::error::Result;
use crate::mlp::Mlp;
use crate::network::{check_variances, Outputs, WeightedGram};

/// Offsets of each layer's weight block (row-major `fan_out × fan_in`) and bias.
fn offsets(weights: &[(DMatrix<f64>, DVector<f64>)]) -> Vec<(usize, usize)> {
    let mut off = 0;
    weights
        .iter()
        .map(|(w, _)| {
            let o = (off, off + w.len());
            off += w.len() + w.nrows();
            o
        })
        .collect()
}

/// A per-point matrix (`n × k`) expanded to rows (`rows × k`).
fn at_rows(m: &DMatrix<f64>, rows: &[(usize, usize)]) -> DMatrix<f64> {
    if rows.len() == m.nrows() && rows.iter().enumerate().all(|(r, &(i, _))| r == i) {
        return m.clone();
    }
    DMatrix::from_fn(rows.len(), m.ncols(), |r, k| m[(rows[r].0, k)])
}

impl Mlp {
    /// `J(X) diag(s) J(X)ᵀ` for the selected outputs with its exact pull-back to the weights
    /// and to `s` (see [`WeightedGram`]). Forms `Jᵀ` (`p × rows`) from the layer-wise
    /// derivatives `δ_j a_jᵀ` without automatic differentiation.
    pub fn weighted_gram(
        &self,
        x: &DMatrix<f64>,
        outputs: Outputs,
        s: &DVector<f64>,
    ) -> Result<WeightedGram<'_>> {
        check_variances(s, self.n_params())?;
        let weights = self.dense_weights();
        let side = self.ntk_side(&weights, x, outputs)?;
        let jt = jacobian_t(&side, &weights, self.n_params());
        WeightedGram::new(jt, s.clone(), move |u: &DMatrix<f64>| {
            Ok(tangent_network_pullback(&weights, &side, u))
        })
    }
}

/// `Jᵀ` (`p × rows`) from one side: column `r` holds `δ_j[r] ⊗ a_j(x_r)` and `δ_j[r]` per layer.
fn jacobian_t(side: &Side, weights: &[(DMatrix<f64>, DVector<f64>)], p: usize) -> DMatrix<f64> {
    let offs = offsets(weights);
    let at: Vec<DMatrix<f64>> = side.a.iter().map(|a| a.transpose()).collect();
    let mut jt = DMatrix::zeros(p, side.rows.len());
    jt.as_mut_slice().par_chunks_mut(p).enumerate().for_each(|(r, col)| {
        let i = side.rows[r].0;
        for (j, (w, _)) in weights.iter().enumerate() {
            let (fo, fi) = w.shape();
            let (ow, ob) = offs[j];
            let a = at[j].column(i);
            for o in 0..fo {
                let d = side.delta[j][(r, o)];
                col[ob + o] = d;
                if d != 0.0 {
                    for (dst, av) in col[ow + o * fi..ow + (o + 1) * fi].iter_mut().zip(a.iter()) {
                        *dst = d * av;
                    }
                }
            }
        }
    });
    jt
}

/// `∂/∂w Σ_r J_r(w) U[:, r]` for the MLP: forward tangents with per-row injections, then the
/// reverse pass of the tangent network (module docs).
fn tangent_network_pullback(
    weights: &[(DMatrix<f64>, DVector<f64>)],
    side: &Side,
    u: &DMatrix<f64>,
) -> DVector<f64> {
    let depth = weights.len();
    let rows = side.rows.len();
    let p = u.nrows();
    let offs = offsets(weights);
    let at: Vec<DMatrix<f64>> = side.a.iter().map(|a| a.transpose()).collect();
    // Injections T_j (rows × fan_out) and R_j (rows × fan_in), row by row in parallel.
    let per_row: Vec<Vec<(Vec<f64>, Vec<f64>)>> = (0..rows)
        .into_par_iter()
        .map(|r| {
            let col = &u.as_slice()[r * p..(r + 1) * p];
            let i = side.rows[r].0;
            weights
                .iter()
                .enumerate()
                .map(|(j, (w, _))| {
                    let (fo, fi) = w.shape();
                    let (ow, ob) = offs[j];
                    let a = at[j].column(i);
                    let mut t = vec![0.0; fo];
                    let mut rr = vec![0.0; if j > 0 { fi } else { 0 }];
                    for o in 0..fo {
                        let seg = &col[ow + o * fi..ow + (o + 1) * fi];
                        t[o] = seg.iter().zip(a.iter()).map(|(x, y)| x * y).sum::<f64>() + col[ob + o];
                        if j > 0 {
                            let d = side.delta[j][(r, o)];
                            if d != 0.0 {
                                for (acc, v) in rr.iter_mut().zip(seg) {
                                    *acc += v * d;
                                }
                            }
                        }
                    }
                    (t, rr)
                })
                .collect()
        })
        .collect();
    let inj = |j: usize, which: usize, width: usize| {
        DMatrix::from_fn(rows, width, |r, k| if which == 0 { per_row[r][j].0[k] } else { per_row[r][j].1[k] })
    };
    // Forward tangents: ż_0 = T_0, ȧ_j = σ'(h_{j−1}) ⊙ ż_{j−1}, ż_j = ȧ_j W_jᵀ + T_j.
    let slope: Vec<DMatrix<f64>> = side.slope.iter().map(|s| at_rows(s, &side.rows)).collect();
    let curvature: Vec<DMatrix<f64>> = side.curvature.iter().map(|c| at_rows(c, &side.rows)).collect();
    let mut zdot = vec![inj(0, 0, weights[0].0.nrows())];
    let mut adot: Vec<DMatrix<f64>> = Vec::with_capacity(depth);
    adot.push(DMatrix::zeros(0, 0));
    for j in 1..depth {
        let a = zdot[j - 1].component_mul(&slope[j - 1]);
        let z = &a * weights[j].0.transpose() + inj(j, 0, weights[j].0.nrows());
        adot.push(a);
        zdot.push(z);
    }
    // Reverse: the tangent stream's adjoint is δ_j; the primal stream's starts at zero.
    let mut grad = DVector::zeros(p);
    let q = weights[depth - 1].0.nrows();
    let mut zbar = DMatrix::zeros(rows, q);
    for j in (0..depth).rev() {
        let (ow, ob) = offs[j];
        let (fo, fi) = weights[j].0.shape();
        let mut gw: DMatrix<f64> = zbar.transpose() * at_rows(&side.a[j], &side.rows);
        if j > 0 {
            gw += side.delta[j].transpose() * &adot[j];
        }
        for o in 0..fo {
            for k in 0..fi {
                grad[ow + o * fi + k] = gw[(o, k)];
            }
            grad[ob + o] = zbar.column(o).sum();
        }
        if j > 0 {
            let abar = &zbar * &weights[j].0 + inj(j, 1, fi);
            let pre = &side.pre_slope[j - 1];
            zbar = DMatrix::from_fn(rows, fi, |r, k| {
                slope[j - 1][(r, k)] * abar[(r, k)]
                    + curvature[j - 1][(r, k)] * zdot[j - 1][(r, k)] * pre[(r, k)]
            });
        }
    }
    grad
}
