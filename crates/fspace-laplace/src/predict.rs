//! GLM predictive covariances `J(x) Σ J(x)ᵀ`, computed per structure without `p × p`.

use fspace_nn::Network;
use nalgebra::{DMatrix, DVector};

use crate::curvature::{Curvature, KronCurvature};
use crate::error::{LaplaceError, Result};
use crate::posterior::{is_dense, LaplacePosterior};

/// Per-point `q × q` blocks of `J S` where `J` is `m·q × dim` and `S = Σ Jᵀ` is `dim × m·q`.
pub(crate) fn blocks(j: &DMatrix<f64>, s: &DMatrix<f64>, q: usize) -> Vec<DMatrix<f64>> {
    let m = j.nrows() / q;
    (0..m)
        .map(|i| {
            let c = j.rows(i * q, q) * s.columns(i * q, q);
            (&c + c.transpose()) * 0.5
        })
        .collect()
}

/// The last layer's Jacobian in its `[W | b]` coordinates: row `(i, o)` holds `φ̃(xᵢ)` in the
/// block of output `o` (`m·q × q·(h + 1)`).
pub(crate) fn last_layer_jacobian<N: Network>(net: &N, x: &DMatrix<f64>) -> Result<DMatrix<f64>> {
    let phi = net.last_layer_features(x)?;
    let (m, h) = phi.shape();
    let q = net.output_dim();
    let mut j = DMatrix::zeros(m * q, q * (h + 1));
    for i in 0..m {
        for o in 0..q {
            for c in 0..h {
                j[(i * q + o, o * (h + 1) + c)] = phi[(i, c)];
            }
            j[(i * q + o, o * (h + 1) + h)] = 1.0;
        }
    }
    Ok(j)
}

/// The Jacobian restricted to the curvature's coordinates (`m·q × dim`).
pub(crate) fn subset_jacobian<N: Network>(
    post: &LaplacePosterior<N>,
    x: &DMatrix<f64>,
) -> Result<DMatrix<f64>> {
    if let Curvature::Eigen(e) = post.curvature() {
        if e.label == "last_layer" {
            return last_layer_jacobian(post.network(), x);
        }
    }
    let jac = post.network().jacobian(x)?;
    Ok(jac.select_columns(post.indices()))
}

/// KFAC / EKFAC covariances from the layer statistics at `x` (unit cotangents, `k = d'`): in
/// each layer's Kronecker eigenbasis the Jacobian block of output `o` is
/// `P_o = Q_Gᵀ (Σ_t δ_{o,t} ã_tᵀ) Q_A`, and `cov[o, o'] += Σ_{rj} P_o P_o' / (T·E + λ)`. Dense
/// layers have `P_o = (Q_Gᵀδ_o)(Q_Aᵀã)ᵀ`, so the sum is `Σ_r u_{o,r} u_{o',r} w_r` with
/// `w = (1/(T·E + λ)) (Q_Aᵀã)²` — a GEMM per layer for the whole chunk.
pub(crate) fn kron_covariances<N: Network>(
    net: &N,
    kron: &KronCurvature,
    lam: &DVector<f64>,
    t: f64,
    x: &DMatrix<f64>,
) -> Result<Vec<DMatrix<f64>>> {
    let q = net.output_dim();
    let m = x.nrows();
    let eye = vec![DMatrix::identity(q, q); m];
    let stats = net.kfac_statistics(x, &eye)?;
    let infos = net.layer_infos();
    if stats.len() != kron.layers.len() {
        return Err(LaplaceError::DimensionMismatch {
            what: "KFAC layers vs network layers",
            expected: kron.layers.len(),
            found: stats.len(),
        });
    }
    let mut cov = vec![DMatrix::zeros(q, q); m];
    let mut offset = 0;
    for ((layer, st), info) in kron.layers.iter().zip(&stats).zip(&infos) {
        let (r, c) = layer.shape();
        let l = lam[offset];
        offset += r * c;
        let inv = layer.eigenvalues().map(|e| 1.0 / (t * e.max(0.0) + l));
        if is_dense(info.kind) {
            let at = DMatrix::from_fn(m, c, |i, j| if j < c - 1 { st.inputs[(i, j)] } else { 1.0 });
            let v2 = (at * &layer.a_vectors).map(|v| v * v); // m × c
            let w = v2 * inv.transpose(); // m × r
            let u = &st.output_grads * &layer.g_vectors; // m·q × r
            for (i, ci) in cov.iter_mut().enumerate() {
                for o in 0..q {
                    for o2 in o..q {
                        let s: f64 = (0..r).map(|k| u[(i * q + o, k)] * u[(i * q + o2, k)] * w[(i, k)]).sum();
                        ci[(o, o2)] += s;
                        if o2 != o {
                            ci[(o2, o)] += s;
                        }
                    }
                }
            }
        } else {
            for (i, ci) in cov.iter_mut().enumerate() {
                let proj: Vec<DMatrix<f64>> = (0..q)
                    .map(|o| layer.g_vectors.tr_mul(&st.example_gradient(i, o)) * &layer.a_vectors)
                    .collect();
                for o in 0..q {
                    let scaled = proj[o].component_mul(&inv);
                    for o2 in o..q {
                        let s = scaled.dot(&proj[o2]);
                        ci[(o, o2)] += s;
                        if o2 != o {
                            ci[(o2, o)] += s;
                        }
                    }
                }
            }
        }
    }
    Ok(cov)
}
