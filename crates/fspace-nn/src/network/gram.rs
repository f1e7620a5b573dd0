//! `J(X) diag(s) J(X)ᵀ` with its exact pull-back to the weights and to `s` — the type a
//! [`Network`](crate::Network) returns from `weighted_gram` (GFSVI and TFSVI differentiate it
//! every step), independent of the network that fills it.
//!
//! For `Φ(w, s) = ⟨C, J(w) S J(w)ᵀ⟩` with `C` symmetric and `S = diag(s)`:
//!
//! * `∂Φ/∂s_k = (Jᵀ C J)_kk`, the column-wise dot of `J` and `CJ`;
//! * `dΦ = 2 tr(C dJ S Jᵀ) = 2 Σ_r dJ_r · u_r` with `U = S Jᵀ C` held fixed, so
//!   `∂Φ/∂w = 2 ∂/∂w Σ_r J_r(w) u_r`: the gradient of a sum of *per-row* directional derivatives,
//!   the network's second-order rule (the MLP's tangent network, `mlp/jsj.rs`).

use fspace_input::InputError;
use fspace_linalg::fast;
use nalgebra::{DMatrix, DVector};
use rayon::prelude::*;

use crate::error::{NnError, Result};

/// The cotangent of `J S Jᵀ` handed to [`WeightedGram::pullback`].
#[derive(Debug, Clone, Copy)]
pub enum GramCotangent<'c> {
    /// A full `rows × rows` matrix (its symmetric part is used).
    Dense(&'c DMatrix<f64>),
    /// Only the diagonal (`rows` entries): data terms need only the marginal variances.
    Diagonal(&'c DVector<f64>),
}

type SecondOrder<'a> = dyn Fn(&DMatrix<f64>) -> Result<DVector<f64>> + Send + Sync + 'a;

/// `J(X) diag(s) J(X)ᵀ` for the selected outputs of each point, with its pull-back
/// (see the module docs). Built by [`Network::weighted_gram`](crate::Network::weighted_gram);
/// evaluate the value and the gradient from one instance so `J` is formed once.
pub struct WeightedGram<'a> {
    jt: DMatrix<f64>,
    s: DVector<f64>,
    second_order: Box<SecondOrder<'a>>,
}

impl<'a> WeightedGram<'a> {
    /// Wraps `Jᵀ` (`p × rows`), the diagonal `s` (`p`, ≥ 0) and the network's second-order rule
    /// `U ↦ ∂/∂w Σ_r J_r(w) U[:, r]` (for [`Network`](crate::Network) implementations).
    pub fn new(
        jt: DMatrix<f64>,
        s: DVector<f64>,
        second_order: impl Fn(&DMatrix<f64>) -> Result<DVector<f64>> + Send + Sync + 'a,
    ) -> Result<Self> {
        check_variances(&s, jt.nrows())?;
        Ok(Self { jt, s, second_order: Box::new(second_order) })
    }

    /// Number of rows (selected `(point, output)` pairs).
    pub fn rows(&self) -> usize {
        self.jt.ncols()
    }

    /// `Jᵀ` (`p × rows`).
    pub fn jacobian_t(&self) -> &DMatrix<f64> {
        &self.jt
    }

    /// The diagonal `s`.
    pub fn variances(&self) -> &DVector<f64> {
        &self.s
    }

    /// `J S Jᵀ` (`rows × rows`): the lower triangle of `(S^{1/2}Jᵀ)ᵀ(S^{1/2}Jᵀ)` by faer's GEMM
    /// (`fspace_linalg::fast::gram`), mirrored.
    pub fn gram(&self) -> DMatrix<f64> {
        fast::gram(&scaled_rows(&self.jt, &self.s.map(f64::sqrt)))
    }

    /// The diagonal of `J S Jᵀ` (`rows`): the marginal variances of the linearised outputs.
    pub fn diagonal(&self) -> DVector<f64> {
        let p = self.jt.nrows();
        DVector::from_iterator(
            self.rows(),
            self.jt
                .as_slice()
                .chunks(p)
                .map(|col| col.iter().zip(self.s.iter()).map(|(j, s)| j * j * s).sum()),
        )
    }

    /// `(∂Φ/∂w, ∂Φ/∂s)` of `Φ = ⟨C, J(w) S J(w)ᵀ⟩`.
    pub fn pullback(&self, c: GramCotangent) -> Result<(DVector<f64>, DVector<f64>)> {
        let rows = self.rows();
        // `JᵀC` (`p × rows`), then in one pass `∂Φ/∂s = Σ_r Jᵀ ⊙ JᵀC` and `U = S JᵀC` in place.
        let (u, grad_s) = match c {
            GramCotangent::Dense(c) => {
                check_cotangent(c.shape(), c.iter(), rows, rows)?;
                let mut jtc = fast::matmul(&self.jt, &((c + c.transpose()) * 0.5));
                let grad_s = dot_columns_then_scale(&self.jt, &mut jtc, &self.s, |_, _, jtc| jtc);
                (jtc, grad_s)
            }
            GramCotangent::Diagonal(c) => {
                check_cotangent((c.len(), 1), c.iter(), rows, 1)?;
                let mut jtc = DMatrix::zeros(self.jt.nrows(), rows);
                let grad_s = dot_columns_then_scale(&self.jt, &mut jtc, &self.s, |r, jt, _| jt * c[r]);
                (jtc, grad_s)
            }
        };
        Ok(((self.second_order)(&u)? * 2.0, grad_s))
    }

    /// `∂/∂w Σ_r J_r(w) U[:, r]` with the tangents `U` (`p × rows`) held fixed — the
    /// second-order part of the gradient of any `⟨c, J(w) u⟩` (TFSVI's pushed-forward prior
    /// mean `J(w) w` needs it with `U = w cᵀ`).
    pub fn tangent_pullback(&self, u: &DMatrix<f64>) -> Result<DVector<f64>> {
        check_cotangent(u.shape(), u.iter(), self.jt.nrows(), self.rows())?;
        (self.second_order)(u)
    }
}

/// `diag(d) · M` for a column-major `M`, column by column (contiguous) and in parallel.
fn scaled_rows(m: &DMatrix<f64>, d: &DVector<f64>) -> DMatrix<f64> {
    let p = m.nrows();
    let mut out = DMatrix::zeros(p, m.ncols());
    if p > 0 {
        out.as_mut_slice().par_chunks_mut(p).zip(m.as_slice().par_chunks(p)).for_each(|(o, col)| {
            for ((o, v), s) in o.iter_mut().zip(col).zip(d.iter()) {
                *o = v * s;
            }
        });
    }
    out
}

/// Weight rows per task of [`dot_columns_then_scale`] (a few pages of each column).
const WEIGHT_CHUNK: usize = 2048;

/// For `X = Jᵀ` and `Y` (both `p × rows`): with `v_kr = value(r, X_kr, Y_kr)` (for a given
/// `Y = JᵀC` the entry itself; for a diagonal `C`, `X_kr c_r`), returns `Σ_r X_kr v_kr` per `k`
/// and writes `Y_kr = s_k v_kr`. One pass, parallel over blocks of weight rows `k`; each sum
/// runs over `r` in order.
fn dot_columns_then_scale(
    x: &DMatrix<f64>,
    y: &mut DMatrix<f64>,
    s: &DVector<f64>,
    value: impl Fn(usize, f64, f64) -> f64 + Sync,
) -> DVector<f64> {
    let p = x.nrows();
    let mut sums = vec![0.0; p];
    if p == 0 {
        return DVector::from_vec(sums);
    }
    // Task `b` gets block `b` of every column of `Y`.
    let mut blocks: Vec<Vec<&mut [f64]>> = (0..p.div_ceil(WEIGHT_CHUNK)).map(|_| Vec::new()).collect();
    for col in y.as_mut_slice().chunks_mut(p) {
        for (b, piece) in col.chunks_mut(WEIGHT_CHUNK).enumerate() {
            blocks[b].push(piece);
        }
    }
    sums.par_chunks_mut(WEIGHT_CHUNK).zip(blocks.into_par_iter()).enumerate().for_each(
        |(b, (acc, ycols))| {
            let k0 = b * WEIGHT_CHUNK;
            let ss = &s.as_slice()[k0..k0 + acc.len()];
            for (r, yc) in ycols.into_iter().enumerate() {
                let xc = &x.as_slice()[r * p + k0..r * p + k0 + acc.len()];
                for (((g, &xv), yv), &sv) in acc.iter_mut().zip(xc).zip(yc.iter_mut()).zip(ss) {
                    let v = value(r, xv, *yv);
                    *g += xv * v;
                    *yv = sv * v;
                }
            }
        },
    );
    DVector::from_vec(sums)
}

pub(crate) fn check_variances(s: &DVector<f64>, p: usize) -> Result<()> {
    if s.len() != p {
        return Err(NnError::Input(InputError::DimensionMismatch {
            what: "weight variances s",
            expected: p,
            found: s.len(),
        }));
    }
    if s.iter().any(|v| !v.is_finite() || *v < 0.0) {
        return Err(NnError::Input(InputError::NonFinite {
            what: "weight variances s (must be finite and ≥ 0)",
        }));
    }
    Ok(())
}

fn check_cotangent<'v>(
    shape: (usize, usize),
    mut values: impl Iterator<Item = &'v f64>,
    rows: usize,
    cols: usize,
) -> Result<()> {
    if shape != (rows, cols) {
        return Err(NnError::Input(InputError::DimensionMismatch {
            what: "cotangent / tangents of J S Jᵀ",
            expected: rows * cols,
            found: shape.0 * shape.1,
        }));
    }
    if values.any(|v| !v.is_finite()) {
        return Err(NnError::Input(InputError::NonFinite { what: "cotangent / tangents of J S Jᵀ" }));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The blocked pass gives the bits of the plain loops it replaced (a sum over rows in order,
    /// then the scaling), across several blocks of weight rows.
    #[test]
    fn the_blocked_pass_gives_the_plain_loops_bits() {
        let (p, rows) = (2 * WEIGHT_CHUNK + 37, 5);
        let x = DMatrix::from_fn(p, rows, |k, r| ((k * 7 + r * 3) % 19) as f64 / 7.0 - 1.1);
        let y = DMatrix::from_fn(p, rows, |k, r| ((k * 5 + r * 11) % 23) as f64 / 9.0 - 0.9);
        let s = DVector::from_fn(p, |k, _| 0.1 + (k % 13) as f64 / 17.0);
        let c = DVector::from_fn(rows, |r, _| 0.3 - r as f64 * 0.41);
        for diagonal in [false, true] {
            let v = |k: usize, r: usize| if diagonal { x[(k, r)] * c[r] } else { y[(k, r)] };
            let mut want_sum = vec![0.0; p];
            for r in 0..rows {
                for (k, g) in want_sum.iter_mut().enumerate() {
                    *g += x[(k, r)] * v(k, r);
                }
            }
            let want_y = DMatrix::from_fn(p, rows, |k, r| v(k, r) * s[k]);
            let mut got_y = y.clone();
            let got_sum = if diagonal {
                dot_columns_then_scale(&x, &mut got_y, &s, |r, xv, _| xv * c[r])
            } else {
                dot_columns_then_scale(&x, &mut got_y, &s, |_, _, yv| yv)
            };
            assert_eq!(got_sum.as_slice(), want_sum.as_slice(), "diagonal: {diagonal}");
            assert_eq!(got_y, want_y, "diagonal: {diagonal}");
        }
    }
}
