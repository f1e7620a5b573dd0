//! GLM predictive covariances `J(x) Σ J(x)ᵀ`, computed per structure without `p × p`.

use fspace_input::InputError;
use fspace_nn::{LayerKind, Network};
use nalgebra::{DMatrix, DVector};
use rayon::prelude::*;

use fspace_linalg::fast;

use crate::curvature::{Curvature, KronCurvature};
use crate::error::{LaplaceError, Result};

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
/// `phi`: the last layer's inputs at the `m` points (`m × h`).
pub(crate) fn last_layer_jacobian(phi: &DMatrix<f64>, q: usize) -> DMatrix<f64> {
    let (m, h) = phi.shape();
    let mut j = DMatrix::zeros(m * q, q * (h + 1));
    for i in 0..m {
        for o in 0..q {
            for c in 0..h {
                j[(i * q + o, o * (h + 1) + c)] = phi[(i, c)];
            }
            j[(i * q + o, o * (h + 1) + h)] = 1.0;
        }
    }
    j
}

/// Last-layer covariances of a diagonal precision `T·d + λ` over the last layer's `[W | b]`
/// coordinates (`o·(h+1) + c`): output `o` depends on block `o` alone, so the covariance is
/// diagonal with `var_o(xᵢ) = Σ_c φ̃_c(xᵢ)² / (T·d_{oc} + λ_{oc})` — one `m × (h+1)` by
/// `(h+1) × q` product, where the Jacobian route forms the `m·q × q·(h+1)` Jacobian. `phi`: the
/// last layer's inputs at the `m` points.
pub(crate) fn last_layer_diag_covariances(
    phi: &DMatrix<f64>,
    q: usize,
    diag: &DVector<f64>,
    t: f64,
    lam: &DVector<f64>,
) -> Vec<DMatrix<f64>> {
    let (m, h) = phi.shape();
    let inv = DMatrix::from_fn(h + 1, q, |c, o| {
        let k = o * (h + 1) + c;
        1.0 / (t * diag[k] + lam[k])
    });
    let squares = DMatrix::from_fn(m, h + 1, |i, c| if c < h { phi[(i, c)] * phi[(i, c)] } else { 1.0 });
    let var = squares * inv;
    (0..m).map(|i| DMatrix::from_diagonal(&var.row(i).transpose())).collect()
}

/// Last-layer covariances of `Σ = V diag(c + 1/λ) Vᵀ + (I − VVᵀ)/λ` (`c = 1/(T s + λ) − 1/λ`)
/// without the `m·q × q·(h+1)` Jacobian: output `o`'s Jacobian row is `φ̃(xᵢ)` in block `o`, so
/// `J V` is one GEMM `Φ̃ V_o` per output and `J Jᵀ = ‖φ̃ᵢ‖² I`. Cost `O(m·q·(h+1)·k)` instead of
/// the dense route's `O(m·q·(q(h+1))²)`. `phi`: the last layer's inputs at the `m` points.
pub(crate) fn last_layer_covariances(
    phi: &DMatrix<f64>,
    q: usize,
    vectors: &DMatrix<f64>,
    c: &DVector<f64>,
    lambda: f64,
) -> Vec<DMatrix<f64>> {
    let (m, h) = phi.shape();
    let aug = DMatrix::from_fn(m, h + 1, |i, j| if j < h { phi[(i, j)] } else { 1.0 });
    let u: Vec<DMatrix<f64>> = (0..q).map(|o| &aug * vectors.rows(o * (h + 1), h + 1)).collect();
    let scaled: Vec<DMatrix<f64>> = u
        .iter()
        .map(|uo| {
            let mut s = uo.clone();
            for (j, mut col) in s.column_iter_mut().enumerate() {
                col *= c[j];
            }
            s
        })
        .collect();
    let pairs: Vec<(usize, usize)> = (0..q).flat_map(|o| (o..q).map(move |o2| (o, o2))).collect();
    let dots = row_dots(&scaled, &u, &pairs);
    (0..m)
        .map(|i| {
            let base = aug.row(i).norm_squared() / lambda;
            let mut ci = DMatrix::from_diagonal_element(q, q, base);
            for (p, &(o, o2)) in pairs.iter().enumerate() {
                let v = dots[(i, p)];
                ci[(o, o2)] += v;
                if o2 != o {
                    ci[(o2, o)] += v;
                }
            }
            ci
        })
        .collect()
}

/// Points per block of [`row_dots`]: their sums run side by side, down contiguous columns.
const DOT_ROWS: usize = 16;

/// `D[(i, p)] = ⟨a[o](i, ·), b[o2](i, ·)⟩` for each pair `p = (o, o2)`, every row `i` summed over
/// the columns in order from `+0.0`, as nalgebra's `dot` of two row views does, so the bits are
/// the same; the rows of a block accumulate side by side (contiguous in the column-major
/// storage) and the blocks run in parallel.
fn row_dots(a: &[DMatrix<f64>], b: &[DMatrix<f64>], pairs: &[(usize, usize)]) -> DMatrix<f64> {
    let (m, k) = a[0].shape();
    let mut out = DMatrix::zeros(m, pairs.len());
    let blocks: Vec<(usize, Vec<f64>)> = (0..m.div_ceil(DOT_ROWS))
        .into_par_iter()
        .map(|block| {
            let r0 = block * DOT_ROWS;
            let rows = DOT_ROWS.min(m - r0);
            let mut sums = vec![0.0; rows * pairs.len()];
            for (p, &(o, o2)) in pairs.iter().enumerate() {
                let (x, y) = (a[o].as_slice(), b[o2].as_slice());
                let acc = &mut sums[p * rows..(p + 1) * rows];
                for j in 0..k {
                    let (xc, yc) = (&x[j * m + r0..j * m + r0 + rows], &y[j * m + r0..j * m + r0 + rows]);
                    for ((s, xv), yv) in acc.iter_mut().zip(xc).zip(yc) {
                        *s += xv * yv;
                    }
                }
            }
            (r0, sums)
        })
        .collect();
    for (r0, sums) in blocks {
        let rows = sums.len() / pairs.len();
        for p in 0..pairs.len() {
            for r in 0..rows {
                out[(r0 + r, p)] = sums[p * rows + r];
            }
        }
    }
    out
}

/// The Jacobian restricted to the curvature's coordinates (`m·q × dim`).
pub(crate) fn subset_jacobian<N: Network>(
    net: &N,
    curvature: &Curvature,
    indices: &[usize],
    x: &DMatrix<f64>,
) -> Result<DMatrix<f64>> {
    if let Curvature::Eigen(e) = curvature {
        if e.label == "last_layer" {
            return Ok(last_layer_jacobian(&net.last_layer_features(x)?, net.output_dim()));
        }
    }
    let jac = net.jacobian(x)?;
    Ok(jac.select_columns(indices))
}

/// One layer's view for [`layerwise_covariances`]: rotations `Q_G`, `Q_A` (identity if `None`)
/// and, per `(λ, T)` setting, the inverse precision eigenvalues `1/(T·E + λ)`
/// (`fan_out × (fan_in + 1)` each).
pub(crate) struct LayerView<'a> {
    pub q_g: Option<&'a DMatrix<f64>>,
    pub q_a: Option<&'a DMatrix<f64>>,
    pub inv: Vec<DMatrix<f64>>,
}

/// `cov_i[o, o'] = Σ_l Σ_{rj} P_{io}[r,j] P_{io'}[r,j] · inv_l[r,j]` with
/// `P_{io} = Q_Gᵀ (Σ_t δ_{io,t} ã_tᵀ) Q_A` the layer's Jacobian block of output `o` in its
/// eigenbasis, from the layer statistics at `x` (unit cotangents, `k = d'`). Dense layers have
/// `P = (Q_Gᵀδ)(Q_Aᵀã)ᵀ`, so the sum is `Σ_r u_{o,r} u_{o',r} w_r` with `w = inv · (Q_Aᵀã)²`: a
/// GEMM per layer for the whole chunk. Exact for KFAC / EKFAC (their covariance is diagonal in
/// that basis) and for the diagonal structure (`Q = I`).
///
/// Only `inv` depends on `(λ, T)`: the statistics and the projections `P_{io}` are computed once
/// for all `settings` (a grid search's candidates). Returns `[setting][point]`; each setting's
/// covariances are the arithmetic of a call with that setting alone.
pub(crate) fn layerwise_covariances<N: Network>(
    net: &N,
    views: &[LayerView],
    settings: usize,
    x: &DMatrix<f64>,
) -> Result<Vec<Vec<DMatrix<f64>>>> {
    covariances_from_statistics(
        &net.layer_infos(),
        &unit_statistics(net, x)?,
        views,
        settings,
        net.output_dim(),
    )
}

/// Layer statistics at `x` for unit cotangents (`k = d'`): the Jacobian's layer blocks.
fn unit_statistics<N: Network>(net: &N, x: &DMatrix<f64>) -> Result<Vec<fspace_nn::LayerStatistics>> {
    let q = net.output_dim();
    Ok(net.kfac_statistics(x, &vec![DMatrix::identity(q, q); x.nrows()])?)
}

/// [`layerwise_covariances`] from statistics already computed at the `m` test points. Points
/// run in parallel; each point's entries are summed layer by layer, as in a serial loop.
fn covariances_from_statistics(
    infos: &[fspace_nn::LayerInfo],
    stats: &[fspace_nn::LayerStatistics],
    views: &[LayerView],
    settings: usize,
    q: usize,
) -> Result<Vec<Vec<DMatrix<f64>>>> {
    let m = stats.first().map_or(0, |s| s.examples());
    if stats.len() != views.len() {
        return Err(LaplaceError::Input(InputError::DimensionMismatch {
            what: "curvature layers vs network layers",
            expected: views.len(),
            found: stats.len(),
        }));
    }
    if let Some(view) = views.iter().find(|v| v.inv.len() != settings) {
        return Err(LaplaceError::Input(InputError::DimensionMismatch {
            what: "inverse precisions per layer vs (λ, T) settings",
            expected: settings,
            found: view.inv.len(),
        }));
    }
    // Each point's `q × q` blocks, one per setting.
    let mut cov = vec![vec![DMatrix::zeros(q, q); settings]; m];
    for ((view, st), info) in views.iter().zip(stats).zip(infos) {
        if is_dense(info.kind) {
            let at = st.augmented_inputs(info.has_bias());
            let v = match view.q_a {
                Some(qa) => at * qa,
                None => at,
            };
            let squared = v.map(|v| v * v);
            let ws: Vec<DMatrix<f64>> = view.inv.iter().map(|inv| &squared * inv.transpose()).collect(); // m × r each
            let u = match view.q_g {
                Some(qg) => &st.output_grads * qg,
                None => st.output_grads.clone(),
            }; // m·q × r
            cov.par_iter_mut().enumerate().for_each(|(i, point)| {
                for (ci, w) in point.iter_mut().zip(&ws) {
                    let r = w.ncols();
                    for o in 0..q {
                        for o2 in o..q {
                            let s: f64 =
                                (0..r).map(|k| u[(i * q + o, k)] * u[(i * q + o2, k)] * w[(i, k)]).sum();
                            ci[(o, o2)] += s;
                            if o2 != o {
                                ci[(o2, o)] += s;
                            }
                        }
                    }
                }
            });
        } else {
            add_convolution(st, view, info.has_bias(), ConvPlan::cheaper(info, q), &mut cov);
        }
    }
    let mut by_setting = vec![Vec::with_capacity(m); settings];
    for point in cov {
        for (setting, ci) in by_setting.iter_mut().zip(point) {
            setting.push(ci);
        }
    }
    Ok(by_setting)
}

/// Where [`add_convolution`] applies a layer's rotations. A point's projections are
/// `R = [P_1ᵀ | … | P_qᵀ]` (`h × q·fo`; `h` the layer's width, `fo` its fan-out) with
/// `P_oᵀ = Q_Aᵀ Ãᵀ D_o Q_G` (`Ã`: the point's `T × h` inputs, `D_o`: its `T × fo` output
/// gradients of output `o`). The product `Ãᵀ [D_1 | … | D_q]` costs `T·h·q·fo` multiply-adds in
/// either order; `Q_A` costs `T·h²` a point applied to `Ã` first (one GEMM for all the points of
/// the chunk) or `h²·q·fo` applied to the product, and `Q_G` costs `q·T·fo²` applied to `D`
/// first (one GEMM for the chunk) or `q·h·fo²` afterwards. Each goes where it is cheaper: the
/// inputs first where positions are fewer than `q·fo` (ResNet-18's later stages, 16–256
/// positions against 1 280–5 120 columns), the gradients first where they are fewer than the
/// width (the late stages again; not a first convolution with `h = 28` and 1 024 positions).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ConvPlan {
    inputs_first: bool,
    grads_first: bool,
}

impl ConvPlan {
    fn cheaper(info: &fspace_nn::LayerInfo, q: usize) -> Self {
        let positions = info.positions();
        Self { inputs_first: positions < q * info.fan_out, grads_first: positions < info.width() }
    }
}

/// A convolution's terms of every point's covariances, `cov_i[o, o'] += Σ_{rj} inv[r,j]
/// P_{io}[r,j] P_{io'}[r,j]` for each setting's `inv`: each point's `R` (see [`ConvPlan`])
/// read as an `h·fan_out × q` matrix whose column `o` is `vec(P_oᵀ)`, scaled row-wise by
/// `√inv` and multiplied by its transpose — `AᵀA` by blocks of rows instead of `q²/2` strided
/// dot products. Rotations applied first are one GEMM each for the whole chunk; the per-point
/// products run in parallel over points, each on one thread, so the bits do not depend on the
/// thread count.
fn add_convolution(
    st: &fspace_nn::LayerStatistics,
    view: &LayerView,
    bias: bool,
    plan: ConvPlan,
    cov: &mut [Vec<DMatrix<f64>>],
) {
    let (t, q) = (st.positions, st.columns);
    let fo = st.output_grads.ncols();
    let a = st.augmented_inputs(bias); // m·T × h
    let h = a.ncols();
    // Rotations applied before the per-point products, one GEMM each for the chunk.
    let (q_a_late, q_g_late) =
        (view.q_a.filter(|_| !plan.inputs_first), view.q_g.filter(|_| !plan.grads_first));
    let grads = match view.q_g.filter(|_| plan.grads_first) {
        Some(qg) => std::borrow::Cow::Owned(fast::matmul(&st.output_grads, qg)),
        None => std::borrow::Cow::Borrowed(&st.output_grads),
    }; // m·q·T × fo, row (i·q + o)·T + t
    let inputs = match view.q_a.filter(|_| plan.inputs_first) {
        Some(qa) => fast::matmul(&a, qa),
        None => a,
    };
    // √inv, transposed (`h × fo`): row j, column r weighs `P_o[r, j]`.
    let roots: Vec<DMatrix<f64>> =
        view.inv.iter().map(|inv| inv.transpose().map(|v| v.max(0.0).sqrt())).collect();
    let rows_per_block = (BLOCK_DOUBLES / (q * fo).max(1)).clamp(1, h.max(1));
    let height = grads.nrows();
    cov.par_iter_mut().enumerate().for_each(|(i, point)| {
        // `T × q·fo`, column block o = D_{io}: rows (i·q + o)·T … of each gradient column, copied
        // as slices of the column-major storage.
        let mut dcat = DMatrix::zeros(t, q * fo);
        for o in 0..q {
            let start = (i * q + o) * t;
            for c in 0..fo {
                let src = &grads.as_slice()[c * height + start..c * height + start + t];
                dcat.column_mut(o * fo + c).copy_from_slice(src);
            }
        }
        // R = Lᵀ M: L = the point's inputs (rotated or not) with M = dcat, or L = Q_A with
        // M = Ãᵢᵀ dcat. Formed in row blocks that stay in cache (the whole R of ResNet-18's last
        // stage is 189 MB a point), each weighed and multiplied by its transpose at once.
        let inputs_i = inputs.rows(i * t, t).into_owned();
        let (l, m) = match q_a_late {
            Some(qa) => (std::borrow::Cow::Borrowed(qa), fast::matmul_tn_serial(&inputs_i, &dcat)),
            None => (std::borrow::Cow::Owned(inputs_i), dcat),
        };
        for j0 in (0..h).step_by(rows_per_block) {
            let nb = rows_per_block.min(h - j0);
            let mut r = fast::matmul_tn_serial(&l.columns(j0, nb).into_owned(), &m); // nb × q·fo
            if let Some(qg) = q_g_late {
                for o in 0..q {
                    let rotated = fast::matmul_serial(&r.columns(o * fo, fo).into_owned(), qg);
                    r.columns_mut(o * fo, fo).copy_from(&rotated);
                }
            }
            // Column o of the reshape is vec(P_oᵀ) over this block's rows (index j + nb·r).
            let r = r.reshape_generic(nalgebra::Dyn(nb * fo), nalgebra::Dyn(q));
            let weighed = |mut r: DMatrix<f64>, root: &DMatrix<f64>| {
                let w = DVector::from_iterator(nb * fo, root.rows(j0, nb).iter().copied());
                for mut col in r.column_iter_mut() {
                    col.component_mul_assign(&w);
                }
                fast::gram_serial(&r)
            };
            if let Some((last, rest)) = roots.split_last() {
                for (ci, root) in point.iter_mut().zip(rest) {
                    *ci += weighed(r.clone(), root);
                }
                point[rest.len()] += weighed(r, last);
            }
        }
    });
}

/// Doubles of one row block of [`add_convolution`]'s projections (1 MiB).
const BLOCK_DOUBLES: usize = 1 << 17;

/// KFAC / EKFAC covariances (see [`layerwise_covariances`]) for each `(λ, T)` of `settings`.
pub(crate) fn kron_covariances<N: Network>(
    net: &N,
    kron: &KronCurvature,
    settings: &[(DVector<f64>, f64)],
    x: &DMatrix<f64>,
    features: Option<&DMatrix<f64>>,
) -> Result<Vec<Vec<DMatrix<f64>>>> {
    let infos = net.layer_infos();
    // Layers outside the curvature keep their MAP weights: a zero inverse precision.
    let mut views: Vec<LayerView> = infos
        .iter()
        .map(|info| LayerView {
            q_g: None,
            q_a: None,
            inv: vec![DMatrix::zeros(info.fan_out, info.width()); settings.len()],
        })
        .collect();
    let mut offset = 0;
    for (k, layer) in kron.layers.iter().enumerate() {
        let l_net = if kron.network_layers.is_empty() { k } else { kron.network_layers[k] };
        let (r, c) = layer.shape();
        let eigenvalues = layer.eigenvalues();
        views[l_net] = LayerView {
            q_g: Some(&layer.g_vectors),
            q_a: Some(&layer.a_vectors),
            inv: settings
                .iter()
                .map(|(lam, t)| {
                    let l = crate::curvature::KronCurvature::layer_lambdas(layer, lam, offset)?;
                    Ok(DMatrix::from_fn(r, c, |i, j| 1.0 / (t * eigenvalues[(i, j)].max(0.0) + l[j])))
                })
                .collect::<Result<Vec<_>>>()?,
        };
        offset += r * c;
    }
    // Last-layer KFAC (laplace-torch's default): the last layer's statistics at unit cotangents
    // are its inputs φ(x) and unit output gradients (the fit checked that its outputs are the
    // network's, `checked_last_layer`) — one forward pass instead of d' reverse passes, none
    // when the caller has them (`features`, the last layer's inputs at `x`).
    if kron.covers_last_layer_only(infos.len()) {
        let last = infos.len() - 1;
        let q = net.output_dim();
        let inputs = match features {
            Some(phi) => phi.clone(),
            None => net.last_layer_features(x)?,
        };
        let m = inputs.nrows();
        let stats = fspace_nn::LayerStatistics {
            positions: 1,
            columns: q,
            inputs,
            output_grads: DMatrix::from_fn(m * q, q, |r, o| if r % q == o { 1.0 } else { 0.0 }),
        };
        return covariances_from_statistics(&infos[last..], &[stats], &views[last..], settings.len(), q);
    }
    layerwise_covariances(net, &views, settings.len(), x)
}

/// Diagonal-structure covariances (coordinates = flat parameters), layer by layer with `Q = I`,
/// for each `(λ, T)` of `settings`.
pub(crate) fn diag_covariances<N: Network>(
    net: &N,
    diag: &DVector<f64>,
    settings: &[(DVector<f64>, f64)],
    x: &DMatrix<f64>,
) -> Result<Vec<Vec<DMatrix<f64>>>> {
    let views: Vec<LayerView> = net
        .layer_infos()
        .iter()
        .map(|info| LayerView {
            q_g: None,
            q_a: None,
            inv: settings
                .iter()
                .map(|(lam, t)| {
                    DMatrix::from_fn(info.fan_out, info.width(), |r, j| {
                        let i = info.flat_index(r, j);
                        1.0 / (t * diag[i] + lam[i])
                    })
                })
                .collect(),
        })
        .collect();
    layerwise_covariances(net, &views, settings.len(), x)
}

/// Covariances of an isotropic eigen structure over all parameters (full, low-rank):
/// `Σ = V diag(c) Vᵀ + I/λ` with `c = 1/(T s + λ) − 1/λ`, so
/// `cov_i = (J_i V) diag(c) (J_i V)ᵀ + J_i J_iᵀ / λ`. `J_i V` is computed per layer from the
/// statistics (`Ã [V_{l,1}ᵀ … V_{l,k}ᵀ]`, one GEMM, then contracted with `δ`) and `J_i J_iᵀ`
/// with unit weights — no `m·d' × p` Jacobian.
pub(crate) fn eigen_covariances<N: Network>(
    net: &N,
    vectors: &DMatrix<f64>,
    c: &DVector<f64>,
    lambda: f64,
    x: &DMatrix<f64>,
) -> Result<Vec<DMatrix<f64>>> {
    let q = net.output_dim();
    let m = x.nrows();
    let k = vectors.ncols();
    let infos = net.layer_infos();
    let ones: Vec<LayerView> = infos
        .iter()
        .map(|info| LayerView {
            q_g: None,
            q_a: None,
            inv: vec![DMatrix::from_element(info.fan_out, info.width(), 1.0)],
        })
        .collect();
    // One set of statistics serves both terms.
    let stats = unit_statistics(net, x)?;
    let mut cov = covariances_from_statistics(&infos, &stats, &ones, 1, q)?.swap_remove(0);
    for ci in cov.iter_mut() {
        *ci /= lambda;
    }
    let mut jv = DMatrix::zeros(m * q, k);
    for (info, st) in infos.iter().zip(&stats) {
        let (fo, c1) = (info.fan_out, info.width());
        if is_dense(info.kind) {
            // Column block j of `stack` is V_{l,j}ᵀ (width × fan_out).
            let mut stack = DMatrix::zeros(c1, fo * k);
            for j in 0..k {
                for r in 0..fo {
                    for jj in 0..c1 {
                        stack[(jj, j * fo + r)] = vectors[(info.flat_index(r, jj), j)];
                    }
                }
            }
            let mm = st.augmented_inputs(info.has_bias()) * &stack; // m × fo·k
            for i in 0..m {
                for o in 0..q {
                    let d = st.output_grads.row(i * q + o);
                    for j in 0..k {
                        jv[(i * q + o, j)] += (0..fo).map(|r| d[r] * mm[(i, j * fo + r)]).sum::<f64>();
                    }
                }
            }
        } else {
            // The layer's rows of V in the column-major order of an example gradient
            // (`r + fan_out·jj`), so that a point's q example gradients, one column each, meet
            // V in one GEMM `V_lᵀ [vec g_1 … vec g_q]` (k × q): V_l is read once a point rather
            // than once an output (docs/PERFORMANCE.md, the lowrank row). Points run in
            // parallel, each holding its `fan_out·width × q` block.
            let vl = DMatrix::from_fn(fo * c1, k, |row, j| vectors[(info.flat_index(row % fo, row / fo), j)]);
            let per_point: Vec<DMatrix<f64>> = (0..m)
                .into_par_iter()
                .map(|i| {
                    let mut g = DMatrix::zeros(fo * c1, q);
                    for o in 0..q {
                        let eg = st.example_gradient(i, o, info.has_bias());
                        g.column_mut(o).copy_from_slice(eg.as_slice());
                    }
                    fast::matmul_tn_serial(&vl, &g)
                })
                .collect();
            for (i, dots) in per_point.iter().enumerate() {
                for o in 0..q {
                    for j in 0..k {
                        jv[(i * q + o, j)] += dots[(j, o)];
                    }
                }
            }
        }
    }
    for (i, ci) in cov.iter_mut().enumerate() {
        let rows = jv.rows(i * q, q);
        let mut scaled = rows.clone_owned();
        for (j, mut col) in scaled.column_iter_mut().enumerate() {
            col *= c[j];
        }
        *ci += scaled * rows.transpose();
    }
    Ok(cov)
}

/// Whether a layer kind has a rank-one per-example Jacobian block (dense).
pub(crate) fn is_dense(kind: LayerKind) -> bool {
    kind == LayerKind::Dense
}

#[cfg(test)]
mod tests {
    use super::*;
    use fspace_testutil::{randn, rng};

    #[test]
    fn row_dots_give_the_bits_of_dot_on_row_views() {
        // 37 rows: two full blocks and a partial one; the products' signs cancel in the sums.
        let (m, k) = (37, 50);
        let a: Vec<DMatrix<f64>> = (0..3).map(|s| randn(m, k, &mut rng(s))).collect();
        let b: Vec<DMatrix<f64>> = (3..6).map(|s| randn(m, k, &mut rng(s))).collect();
        let pairs = [(0, 0), (0, 2), (1, 1), (2, 0), (2, 2)];
        let dots = row_dots(&a, &b, &pairs);
        for (p, &(o, o2)) in pairs.iter().enumerate() {
            for i in 0..m {
                let expected = a[o].row(i).dot(&b[o2].row(i));
                assert_eq!(dots[(i, p)].to_bits(), expected.to_bits(), "row {i}, pair {p}");
            }
        }
    }

    #[test]
    fn eigen_covariances_equal_the_dense_jacobians_on_a_cnn_and_an_mlp() {
        use fspace_nn::{Activation, Cnn, CnnConfig, ConvBlock, Mlp, MlpConfig};
        fn check<N: Network>(net: &N, x: &DMatrix<f64>) {
            let (p, q, k, lambda) = (net.n_params(), net.output_dim(), 5, 0.7);
            let vectors = randn(p, k, &mut rng(11)).qr().q();
            let c = DVector::from_fn(k, |j, _| -0.1 * (j + 1) as f64);
            let covs = eigen_covariances(net, &vectors, &c, lambda, x).unwrap();
            let jac = net.jacobian(x).unwrap();
            let sigma = &vectors * DMatrix::from_diagonal(&c) * vectors.transpose()
                + DMatrix::identity(p, p) / lambda;
            for (i, cov) in covs.iter().enumerate() {
                let ji = jac.rows(i * q, q);
                let want = ji * &sigma * ji.transpose();
                assert!((cov - &want).amax() <= 1e-12 * want.amax(), "point {i}");
            }
        }
        let cnn = Cnn::new(CnnConfig {
            input_shape: (2, 5, 5),
            convs: vec![ConvBlock { channels: 3, kernel: 3, same_padding: true, pool: false }],
            hidden: vec![4],
            output_dim: 3,
            activation: Activation::Tanh,
            seed: 1,
        })
        .unwrap();
        check(&cnn, &randn(4, 50, &mut rng(12)));
        let mlp = Mlp::new(MlpConfig {
            input_dim: 3,
            hidden: vec![5],
            output_dim: 2,
            activation: Activation::Tanh,
            seed: 2,
        })
        .unwrap();
        check(&mlp, &randn(4, 3, &mut rng(13)));
    }

    #[test]
    fn every_convolution_plan_equals_the_example_gradients_projected_one_by_one() {
        // 3 points, 4 outputs, 5 positions, fan_in 6, fan_out 7; random orthogonal Q_G, Q_A;
        // two settings of positive inverse precisions.
        let (n, q, t, fi, fo) = (3, 4, 5, 6, 7);
        let st = fspace_nn::LayerStatistics {
            positions: t,
            columns: q,
            inputs: randn(n * t, fi, &mut rng(1)),
            output_grads: randn(n * q * t, fo, &mut rng(2)),
        };
        let qg = fspace_testutil::random_orthogonal(fo, &mut rng(3));
        let qa = fspace_testutil::random_orthogonal(fi + 1, &mut rng(4));
        let inv: Vec<DMatrix<f64>> =
            (5..7).map(|s| randn(fo, fi + 1, &mut rng(s)).map(|v| v.abs() + 0.1)).collect();
        for (g, a) in [(Some(&qg), Some(&qa)), (None, None)] {
            let view = LayerView { q_g: g, q_a: a, inv: inv.clone() };
            let want: Vec<Vec<DMatrix<f64>>> = (0..n)
                .map(|i| {
                    let proj: Vec<DMatrix<f64>> = (0..q)
                        .map(|o| {
                            let e = st.example_gradient(i, o, true);
                            let e = g.map_or(e.clone(), |qg| qg.transpose() * &e);
                            a.map_or(e.clone(), |qa| e * qa)
                        })
                        .collect();
                    inv.iter()
                        .map(|w| DMatrix::from_fn(q, q, |o, o2| proj[o].component_mul(w).dot(&proj[o2])))
                        .collect()
                })
                .collect();
            for (inputs_first, grads_first) in [(true, true), (true, false), (false, true), (false, false)] {
                let plan = ConvPlan { inputs_first, grads_first };
                let mut cov = vec![vec![DMatrix::zeros(q, q); 2]; n];
                add_convolution(&st, &view, true, plan, &mut cov);
                for (i, (got, want)) in cov.iter().zip(&want).enumerate() {
                    for (c, w) in got.iter().zip(want) {
                        assert!((c - w).amax() <= 1e-12 * w.amax(), "{plan:?}, point {i}");
                        assert_eq!(c, &c.transpose(), "exactly symmetric");
                    }
                }
            }
        }
        let layer = |positions, fan_in, fan_out| fspace_nn::LayerInfo {
            name: "l".into(),
            kind: fspace_nn::LayerKind::Conv { positions },
            weight: 0..fan_in * fan_out,
            bias: fan_in * fan_out..(fan_in + 1) * fan_out,
            fan_in,
            fan_out,
        };
        // ResNet-18's last stage, its first convolution and its first stage; the FSP-Laplace
        // MNIST CNN's first convolution (9 inputs and a bias at 784 positions).
        let plan = |inputs_first, grads_first| ConvPlan { inputs_first, grads_first };
        assert_eq!(ConvPlan::cheaper(&layer(16, 4608, 512), 10), plan(true, true));
        assert_eq!(ConvPlan::cheaper(&layer(1024, 27, 64), 10), plan(false, false));
        assert_eq!(ConvPlan::cheaper(&layer(1024, 576, 64), 10), plan(false, false));
        assert_eq!(ConvPlan::cheaper(&layer(784, 9, 32), 10), plan(false, false));
    }
}
