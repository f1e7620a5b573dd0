//! The MLP's curvature products: GGN-vector products and the GGN diagonal, per-layer
//! statistics and KFAC factors, last-layer features and the layer table.

use dfdx::prelude::*;
use nalgebra::{DMatrix, DVector};

use super::*;
use crate::error::{NnError, Result};
use crate::layers::{LayerInfo, LayerKind, LayerStatistics};
use crate::tape::M;

impl Mlp {
    /// The GGN-vector product `Σᵢ J(xᵢ)ᵀ Hᵢ J(xᵢ) v` for per-point function-space Hessian blocks
    /// `Hᵢ` (`d' × d'`, e.g. from a likelihood), without forming `J`.
    pub fn ggn_vector(
        &self,
        x: &DMatrix<f64>,
        hessians: &[DMatrix<f64>],
        v: &DVector<f64>,
    ) -> Result<DVector<f64>> {
        crate::network::Network::ggn_vector_product(self, x, hessians, v)
    }

    /// `Σᵢ J(xᵢ)ᵀ Hᵢ J(xᵢ)`'s diagonal (length `p`), from the Jacobian rows.
    pub fn ggn_diagonal(&self, x: &DMatrix<f64>, hessians: &[DMatrix<f64>]) -> Result<DVector<f64>> {
        let q = self.config.output_dim;
        crate::network::check_hessians(hessians, x.nrows(), q)?;
        Ok(crate::network::ggn_diagonal_from_jacobian(&self.jacobian(x)?, hessians, q))
    }

    /// The inputs of the last layer, `a_{L−1}(X)` (`n × width`): the features of a last-layer
    /// (Bayesian linear regression) approximation.
    pub fn last_layer_features(&self, x: &DMatrix<f64>) -> Result<DMatrix<f64>> {
        self.check_inputs(x)?;
        let (trace, _) = self.trace(x);
        Ok(to_matrix(trace.inputs.last().expect("at least one layer")))
    }

    /// Per-layer statistics for KFAC: each layer's inputs `a_{l−1}` (`n × fan_in`) and the
    /// back-propagated output gradients `δ_l` (`n·k × fan_out`, rows point-major) for the
    /// columns of per-point factors `Lᵢ` (`d' × k`, with `Hᵢ = LᵢLᵢᵀ`).
    pub fn layer_statistics(
        &self,
        x: &DMatrix<f64>,
        hessian_factors: &[DMatrix<f64>],
    ) -> Result<Vec<(DMatrix<f64>, DMatrix<f64>)>> {
        self.check_inputs(x)?;
        let (n, q) = (x.nrows(), self.config.output_dim);
        if hessian_factors.len() != n || hessian_factors.iter().any(|l| l.nrows() != q) {
            return Err(NnError::Input(InputError::DimensionMismatch {
                what: "Hessian factors (one d' × k per point)",
                expected: n,
                found: hessian_factors.len(),
            }));
        }
        let k = hessian_factors[0].ncols();
        if hessian_factors.iter().any(|l| l.ncols() != k) {
            return Err(NnError::Input(InputError::DimensionMismatch {
                what: "Hessian factor columns",
                expected: k,
                found: 0,
            }));
        }
        let (trace, _) = self.trace(x);
        let (w, _) = self.tensors(&self.params);
        // δ_L for column c of Lᵢ, stacked point-major: row i·k + c.
        let rows: Vec<f64> = (0..n * k)
            .flat_map(|r| (0..q).map(move |a| (r, a)))
            .map(|(r, a)| hessian_factors[r / k][(a, r % k)])
            .collect();
        let mut delta: M = self.dev.tensor_from_vec(rows, (n * k, q));
        let mut out = vec![(DMatrix::zeros(0, 0), DMatrix::zeros(0, 0)); w.len()];
        for l in (0..w.len()).rev() {
            out[l] = (to_matrix(&trace.inputs[l]), to_matrix(&delta));
            if l > 0 {
                let slope = self.act_map(&trace.pre[l - 1], |v| self.config.activation.slope(v));
                // Copy the slopes out once; each point's row repeats for its k factor columns.
                let (width, slope) = (slope.shape().1, slope.as_vec());
                let slope_rows = DMatrix::from_fn(n * k, width, |r, c| slope[(r / k) * width + c]);
                let back = delta.matmul(w[l].clone());
                delta = back * to_tensor(&self.dev, &slope_rows);
            }
        }
        Ok(out)
    }

    /// The weight layers (`layer0`, `layer1`, …) as [`LayerInfo`]s.
    pub fn layer_infos(&self) -> Vec<LayerInfo> {
        self.layers()
            .iter()
            .enumerate()
            .map(|(l, layer)| LayerInfo {
                name: format!("layer{l}"),
                kind: LayerKind::Dense,
                weight: layer.w..layer.b,
                bias: layer.b..layer.b + layer.fan_out,
                fan_in: layer.fan_in,
                fan_out: layer.fan_out,
            })
            .collect()
    }

    /// [`layer_statistics`](Self::layer_statistics) as [`LayerStatistics`] (one position per
    /// layer), one per [`layer_infos`](Self::layer_infos) entry.
    pub fn kfac_statistics(
        &self,
        x: &DMatrix<f64>,
        factors: &[DMatrix<f64>],
    ) -> Result<Vec<LayerStatistics>> {
        self.check_inputs(x)?;
        let k = crate::network::check_factors(factors, x.nrows(), self.config.output_dim)?;
        Ok(self
            .layer_statistics(x, factors)?
            .into_iter()
            .map(|(inputs, output_grads)| LayerStatistics { positions: 1, columns: k, inputs, output_grads })
            .collect())
    }

    /// KFAC factors per layer (Martens & Grosse 2015): `A = Σᵢ ãᵢãᵢᵀ` (`(fan_in + 1)²`, with
    /// `ã = [a; 1]` for the bias) and `G = Σᵢ Σ_c δ_{i,c} δ_{i,c}ᵀ / n` (`fan_out²`), so that the
    /// GGN block of `[W | b]` (row-major `fan_out × (fan_in + 1)`) is approximated by `G ⊗ A`;
    /// exact for a single point.
    pub fn kfac_factors(
        &self,
        x: &DMatrix<f64>,
        hessian_factors: &[DMatrix<f64>],
    ) -> Result<Vec<(DMatrix<f64>, DMatrix<f64>)>> {
        let n = x.nrows() as f64;
        Ok(self
            .layer_statistics(x, hessian_factors)?
            .into_iter()
            .map(|(a, d)| {
                let at =
                    DMatrix::from_fn(
                        a.nrows(),
                        a.ncols() + 1,
                        |i, j| if j < a.ncols() { a[(i, j)] } else { 1.0 },
                    );
                // `transpose() *` is a blocked GEMM; nalgebra's `tr_mul` is an unblocked loop.
                (at.transpose() * &at, d.transpose() * &d / n)
            })
            .collect())
    }
}
