//! GGN-vector products from cached per-layer statistics.
//!
//! For a network that exposes its weight layers ([`Network::kfac_statistics`]) the whitened
//! Jacobian row of example `i`, cotangent column `c`, restricted to layer `l`, is
//! `g_{icl} = Σ_t δ_{ict} ã_{it}ᵀ` (`ã = [a; 1]`, or `a` for a layer without bias). Hence, with
//! the layer's block `V_l` of `v` (`fan_out × (fan_in + 1)`, or `fan_out × fan_in`),
//!
//! * `u_{ic} = Σ_l Σ_t δ_{ict}ᵀ V_l ã_{it}` — one GEMM `Ã V_lᵀ` per layer, then row dots;
//! * `(GGN v)_l = Σ_{ic} u_{ic} g_{icl} = D_lᵀ Ã_l` with `D_l[(i,t)] = Σ_c u_{ic} δ_{ict}` — one
//!   GEMM per layer.
//!
//! Two GEMMs per layer and no automatic differentiation: the statistics (`Ã`, `δ`) are computed
//! once with one forward and `k` reverse passes and reused by every product (Lanczos needs one
//! product per step). Their memory is `8 · n · Σ_l T_l (fan_in + k·fan_out)` bytes; above a
//! budget the caller falls back to [`Network::ggn_vector_product`] (one JVP + one VJP per chunk,
//! nothing cached).

use fspace_nn::{LayerInfo, LayerStatistics, Network};
use nalgebra::{DMatrix, DVector};

use crate::data::{for_chunks, Data};
use crate::error::Result;

/// Layer statistics of every data chunk, in chunk order.
pub(crate) struct CachedGgn {
    infos: Vec<LayerInfo>,
    chunks: Vec<Vec<LayerStatistics>>,
    p: usize,
}

/// Bytes a chunk of layer statistics may take: the points per chunk of every pass over layer
/// statistics (fit, GLM predictive, evidence grids) are capped so that one chunk's statistics
/// ([`cache_bytes`]) stay below it. 1 GiB leaves fspace's own MLPs and CNNs at their 256-point
/// chunks (`CnnConfig::fsp_mnist` takes ≈ 2.2 MB a point at 10 outputs) and holds a
/// ResNet-18-sized model (≈ 85 MB a point) to 12 points per chunk instead of ≈ 22 GB.
pub(crate) const LAYER_STATS_CHUNK_BYTES: usize = 1 << 30;

/// `chunk` points, or fewer so that a chunk's layer statistics for `k` cotangent columns per
/// point fit in [`LAYER_STATS_CHUNK_BYTES`] (at least one point).
pub(crate) fn statistics_chunk(infos: &[LayerInfo], k: usize, chunk: usize) -> usize {
    let per_point = cache_bytes(infos, 1, k).max(1);
    chunk.min(LAYER_STATS_CHUNK_BYTES / per_point).max(1)
}

/// Bytes the cache of [`CachedGgn`] takes for `n` examples and `k` cotangent columns each.
pub(crate) fn cache_bytes(infos: &[LayerInfo], n: usize, k: usize) -> usize {
    infos.iter().map(|i| 8 * n * i.positions() * (i.fan_in + k * i.fan_out)).sum()
}

impl CachedGgn {
    /// The cache, or `None` when the network has no layer structure covering every parameter
    /// or the cache would exceed `budget` bytes.
    pub(crate) fn build<N: Network>(net: &N, data: &Data, budget: usize) -> Result<Option<Self>> {
        let infos = net.layer_infos();
        let p = net.n_params();
        let covered: usize = infos.iter().map(|i| i.n_params()).sum();
        if infos.is_empty() || covered != p || cache_bytes(&infos, data.x.nrows(), data.k()) > budget {
            return Ok(None);
        }
        let mut chunks = Vec::new();
        for_chunks(
            data,
            |s, l| Ok(net.kfac_statistics(&data.rows(s, l), &data.factors[s..s + l])?),
            |_, _, st| {
                chunks.push(st);
                Ok(())
            },
        )?;
        Ok(Some(Self { infos, chunks, p }))
    }

    /// `GGN · v = Σᵢ J(xᵢ)ᵀ Hᵢ J(xᵢ) v`, chunks in parallel, summed in chunk order.
    pub(crate) fn product(&self, data: &Data, v: &DVector<f64>) -> Result<DVector<f64>> {
        // Per layer: Wᵀ (fan_in × fan_out, the row-major weight block read column-major), b.
        let blocks: Vec<(DMatrix<f64>, &[f64])> = self
            .infos
            .iter()
            .map(|i| {
                let wt = DMatrix::from_column_slice(i.fan_in, i.fan_out, &v.as_slice()[i.weight.clone()]);
                (wt, &v.as_slice()[i.bias.clone()])
            })
            .collect();
        // Per layer `[∂W | ∂b]` (fan_out × width), summed over chunks.
        let mut sums: Vec<DMatrix<f64>> =
            self.infos.iter().map(|i| DMatrix::zeros(i.fan_out, i.width())).collect();
        for_chunks(
            data,
            |s, _| Ok(self.chunk_product(&self.chunks[s / data.chunk], &blocks)),
            |_, _, parts| {
                for (sum, part) in sums.iter_mut().zip(parts) {
                    *sum += part;
                }
                Ok(())
            },
        )?;
        let mut out = DVector::zeros(self.p);
        for (info, m) in self.infos.iter().zip(&sums) {
            for r in 0..info.fan_out {
                for j in 0..info.width() {
                    out[info.flat_index(r, j)] = m[(r, j)];
                }
            }
        }
        Ok(out)
    }

    /// One chunk's `[∂W | ∂b]` per layer. Both GEMMs take untransposed operands (`Ã Wᵀ` and
    /// `Dᵀ Ã`): `Dᵀ` is written transposed directly, so no copy of `Ã` is ever transposed.
    fn chunk_product(
        &self,
        stats: &[LayerStatistics],
        blocks: &[(DMatrix<f64>, &[f64])],
    ) -> Vec<DMatrix<f64>> {
        let (n, k) = (stats[0].examples(), stats[0].columns);
        // u_{ic}, index i·k + c.
        let mut u = vec![0.0; n * k];
        for ((info, st), (wt, b)) in self.infos.iter().zip(stats).zip(blocks) {
            let t = info.positions();
            let mut pre = &st.inputs * wt; // (n·T) × fan_out: W ã per position, without the bias
            for (mut col, bi) in pre.column_iter_mut().zip(b.iter()) {
                col.add_scalar_mut(*bi);
            }
            // Column by column (contiguous in column-major storage).
            for (g, a) in columns(&st.output_grads).zip(columns(&pre)) {
                if t == 1 && k == 1 {
                    for ((ui, gi), ai) in u.iter_mut().zip(g).zip(a) {
                        *ui += gi * ai;
                    }
                    continue;
                }
                for (i, ai) in a.chunks_exact(t).enumerate() {
                    for c in 0..k {
                        let gi = &g[(i * k + c) * t..(i * k + c + 1) * t];
                        u[i * k + c] += gi.iter().zip(ai).map(|(x, y)| x * y).sum::<f64>();
                    }
                }
            }
        }
        self.infos
            .iter()
            .zip(stats)
            .map(|(info, st)| {
                let (t, fo) = (info.positions(), info.fan_out);
                let grads = st.output_grads.as_slice();
                let nr = st.output_grads.nrows();
                // Dᵀ (fan_out × n·T): column (i, t) = Σ_c u_{ic} δ_{ict}.
                let mut dt = DMatrix::zeros(fo, n * t);
                for (it, col) in dt.as_mut_slice().chunks_exact_mut(fo).enumerate() {
                    let (i, s) = (it / t, it % t);
                    for c in 0..k {
                        let (w, row) = (u[i * k + c], (i * k + c) * t + s);
                        for (r, x) in col.iter_mut().enumerate() {
                            *x += w * grads[row + r * nr];
                        }
                    }
                }
                let mut m = DMatrix::zeros(fo, info.width());
                m.columns_mut(0, info.fan_in).copy_from(&(&dt * &st.inputs));
                if info.has_bias() {
                    m.set_column(info.fan_in, &dt.column_sum());
                }
                m
            })
            .collect()
    }
}

/// The columns of a column-major matrix as contiguous slices.
fn columns(m: &DMatrix<f64>) -> std::slice::ChunksExact<'_, f64> {
    m.as_slice().chunks_exact(m.nrows().max(1))
}

/// The whitened Jacobian `R` of the training data (row `i·k + c` is `Lᵢ[:, c]ᵀ J(xᵢ)`, so
/// `RᵀR` is the GGN) applied to blocks of vectors: from cached layer statistics when they fit
/// (one GEMM per layer and direction, all `K` columns side by side), otherwise streamed through
/// [`Network::jvp_columns`] / [`Network::vjp_columns`] chunk by chunk.
pub(crate) struct WhitenedJacobian<'a, N> {
    net: &'a N,
    cache: Option<CachedGgn>,
    /// Per chunk and layer, a dense layer's inputs transposed (`fan_in × n`).
    inputs_t: Vec<Vec<Option<DMatrix<f64>>>>,
}

impl<'a, N: Network> WhitenedJacobian<'a, N> {
    /// Caches the layer statistics, and the dense layers' inputs transposed, when together
    /// they take at most `budget` bytes.
    pub(crate) fn new(net: &'a N, data: &Data, budget: usize) -> Result<Self> {
        let infos = net.layer_infos();
        let n = data.x.nrows();
        let transposed: usize = infos.iter().filter(|i| i.positions() == 1).map(|i| 8 * n * i.fan_in).sum();
        let bytes = cache_bytes(&infos, n, data.k()).saturating_add(transposed);
        let cache = if bytes <= budget { CachedGgn::build(net, data, usize::MAX)? } else { None };
        let inputs_t = cache.as_ref().map_or_else(Vec::new, |c| {
            c.chunks
                .iter()
                .map(|stats| {
                    stats.iter().map(|st| (st.positions == 1).then(|| st.inputs.transpose())).collect()
                })
                .collect()
        });
        Ok(Self { net, cache, inputs_t })
    }

    /// Whether the products use cached layer statistics.
    pub(crate) fn cached(&self) -> bool {
        self.cache.is_some()
    }

    /// `R V` (`n·k × K`) for parameter directions `V` (`p × K`).
    pub(crate) fn jvp(&self, data: &Data, v: &DMatrix<f64>) -> Result<DMatrix<f64>> {
        let k = data.k();
        let mut out = DMatrix::zeros(data.x.nrows() * k, v.ncols());
        for_chunks(
            data,
            |s, l| match &self.cache {
                Some(c) => Ok(c.chunk_jvp(&c.chunks[s / data.chunk], v)),
                None => {
                    let q = self.net.output_dim();
                    let jv = self.net.jvp_columns(&data.rows(s, l), v)?; // row i·q + o
                    let mut u = DMatrix::zeros(l * k, v.ncols());
                    for i in 0..l {
                        u.rows_mut(i * k, k).gemm_tr(1.0, &data.factors[s + i], &jv.rows(i * q, q), 0.0);
                    }
                    Ok(u)
                }
            },
            |s, l, u| {
                out.rows_mut(s * k, l * k).copy_from(&u);
                Ok(())
            },
        )?;
        Ok(out)
    }

    /// `Rᵀ U` (`p × K`) for whitened output directions `U` (`n·k × K`).
    pub(crate) fn vjp(&self, data: &Data, u: &DMatrix<f64>) -> Result<DMatrix<f64>> {
        let k = data.k();
        let mut out = DMatrix::zeros(self.net.n_params(), u.ncols());
        for_chunks(
            data,
            |s, l| {
                let uc = u.rows(s * k, l * k);
                match &self.cache {
                    Some(c) => {
                        let j = s / data.chunk;
                        Ok(c.chunk_vjp(&c.chunks[j], &self.inputs_t[j], &uc.into_owned()))
                    }
                    None => {
                        let q = self.net.output_dim();
                        let mut cot = DMatrix::zeros(l * q, u.ncols());
                        for i in 0..l {
                            cot.rows_mut(i * q, q).gemm(1.0, &data.factors[s + i], &uc.rows(i * k, k), 0.0);
                        }
                        Ok(self.net.vjp_columns(&data.rows(s, l), &cot)?)
                    }
                }
            },
            |_, _, part| {
                out += part;
                Ok(())
            },
        )?;
        Ok(out)
    }
}

impl CachedGgn {
    /// One chunk's `R V`: per layer `Ã [W₁ᵀ … W_Kᵀ]` (one GEMM, the weight blocks of `V`'s
    /// columns are contiguous `fan_in × fan_out` column-major slices), then contracted with `δ`.
    fn chunk_jvp(&self, stats: &[LayerStatistics], v: &DMatrix<f64>) -> DMatrix<f64> {
        let (n, k, cols) = (stats[0].examples(), stats[0].columns, v.ncols());
        let nk = n * k;
        let mut u = DMatrix::zeros(nk, cols);
        for (info, st) in self.infos.iter().zip(stats) {
            let (t, fo, fi) = (info.positions(), info.fan_out, info.fan_in);
            let column = |m: usize| &v.as_slice()[m * self.p..(m + 1) * self.p];
            let mut stack = DMatrix::zeros(fi, fo * cols);
            for m in 0..cols {
                stack.columns_mut(m * fo, fo).copy_from_slice(&column(m)[info.weight.clone()]);
            }
            // pre[(i, t), (m, r)] = Σ_j W_m[r, j] a_{it, j}, without the bias b_m[r].
            let pre = &st.inputs * stack;
            let grads = st.output_grads.as_slice();
            if t == 1 {
                // u[(i, c), m] += Σ_r δ[(i, c), r] (pre[i, (m, r)] + b_m[r]): contiguous columns
                // of δ, pre and u, no transposes.
                for m in 0..cols {
                    let b = &column(m)[info.bias.clone()];
                    let um = &mut u.as_mut_slice()[m * nk..(m + 1) * nk];
                    for r in 0..fo {
                        let br = b.get(r).copied().unwrap_or(0.0); // no bias: 0
                        let d = &grads[r * nk..(r + 1) * nk];
                        let a = pre.column(m * fo + r);
                        for ((ui, di), ai) in um.chunks_exact_mut(k).zip(d.chunks_exact(k)).zip(a.iter()) {
                            let x = ai + br;
                            for (uc, dc) in ui.iter_mut().zip(di) {
                                *uc += dc * x;
                            }
                        }
                    }
                }
                continue;
            }
            let mut pre_t = pre.transpose(); // column i·T + t holds rows (m, r)
            for m in 0..cols {
                let b = &column(m)[info.bias.clone()];
                for mut col in pre_t.column_iter_mut() {
                    for (x, bi) in col.rows_mut(m * fo, fo).iter_mut().zip(b) {
                        *x += bi;
                    }
                }
            }
            let grads_t = st.output_grads.transpose(); // fan_out × (n·k·T), column (i·k + c)·T + t
            for i in 0..n {
                for c in 0..k {
                    for s in 0..t {
                        let g = grads_t.column((i * k + c) * t + s);
                        let a = pre_t.column(i * t + s);
                        for m in 0..cols {
                            u[(i * k + c, m)] += g.dot(&a.rows(m * fo, fo));
                        }
                    }
                }
            }
        }
        u
    }

    /// One chunk's `Rᵀ U`: per layer with `D[(i, t), (m, r)] = Σ_c U[(i, c), m] δ_{(i, c, t), r}`,
    /// the weight gradients `Ãᵀ D` (one GEMM for all columns; `inputs_t` holds a dense layer's
    /// `Ãᵀ`, so its result's columns are the flat weight rows) and the bias gradients `Σ_(i, t) D`.
    fn chunk_vjp(
        &self,
        stats: &[LayerStatistics],
        inputs_t: &[Option<DMatrix<f64>>],
        u: &DMatrix<f64>,
    ) -> DMatrix<f64> {
        let (n, k, cols) = (stats[0].examples(), stats[0].columns, u.ncols());
        let nk = n * k;
        let mut out = DMatrix::zeros(self.p, cols);
        for ((info, st), at) in self.infos.iter().zip(stats).zip(inputs_t) {
            let (t, fo, fi) = (info.positions(), info.fan_out, info.fan_in);
            let grads = st.output_grads.as_slice();
            if let (1, Some(at)) = (t, at) {
                let mut d = DMatrix::zeros(n, fo * cols);
                for m in 0..cols {
                    let um = &u.as_slice()[m * nk..(m + 1) * nk];
                    for r in 0..fo {
                        let g = &grads[r * nk..(r + 1) * nk];
                        let col = &mut d.as_mut_slice()[(m * fo + r) * n..(m * fo + r + 1) * n];
                        for ((x, uc), gc) in col.iter_mut().zip(um.chunks_exact(k)).zip(g.chunks_exact(k)) {
                            *x = uc.iter().zip(gc).map(|(a, b)| a * b).sum();
                        }
                    }
                }
                let wg = at * &d; // fan_in × fan_out·K: column (m, r) is row r of W's gradient
                for m in 0..cols {
                    let slice = &mut out.as_mut_slice()[m * self.p..(m + 1) * self.p];
                    slice[info.weight.clone()]
                        .copy_from_slice(&wg.as_slice()[m * fo * fi..(m + 1) * fo * fi]);
                    for (r, x) in slice[info.bias.clone()].iter_mut().enumerate() {
                        *x = d.column(m * fo + r).sum(); // nothing without a bias
                    }
                }
                continue;
            }
            let grads_t = st.output_grads.transpose();
            let mut dt = DMatrix::zeros(fo * cols, n * t);
            for i in 0..n {
                for s in 0..t {
                    let mut col = dt.column_mut(i * t + s);
                    for c in 0..k {
                        let g = grads_t.column((i * k + c) * t + s);
                        for m in 0..cols {
                            col.rows_mut(m * fo, fo).axpy(u[(i * k + c, m)], &g, 1.0);
                        }
                    }
                }
            }
            // (fan_in × fan_out·K): column (m, r) is row r of W's gradient for direction m.
            let wt = (&dt * &st.inputs).transpose();
            let bias = dt.column_sum();
            for m in 0..cols {
                let slice = &mut out.as_mut_slice()[m * self.p..(m + 1) * self.p];
                slice[info.weight.clone()].copy_from_slice(&wt.as_slice()[m * fo * fi..(m + 1) * fo * fi]);
                if info.has_bias() {
                    slice[info.bias.clone()].copy_from_slice(&bias.as_slice()[m * fo..(m + 1) * fo]);
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::{data_for, CurvatureSource};
    use fspace_core::LikelihoodSpec;
    use fspace_nn::{Activation, Cnn, CnnConfig, ConvBlock, Mlp, MlpConfig};
    use fspace_testutil::{randn, rel_frob, rng};
    use rand::Rng;

    /// `R` from the explicit Jacobian: row `i·k + c` is `Lᵢ[:, c]ᵀ J(xᵢ)`.
    fn dense_r<N: Network>(net: &N, data: &Data) -> DMatrix<f64> {
        let (q, k) = (net.output_dim(), data.k());
        let j = net.jacobian(data.x).unwrap();
        let mut r = DMatrix::zeros(data.x.nrows() * k, net.n_params());
        for i in 0..data.x.nrows() {
            r.rows_mut(i * k, k).copy_from(&(data.factors[i].transpose() * j.rows(i * q, q)));
        }
        r
    }

    fn check<N: Network>(net: &N, x: &DMatrix<f64>, classes: usize, seed: u64) {
        let mut g = rng(seed);
        let y = DVector::from_fn(x.nrows(), |_, _| g.gen_range(0..classes) as f64);
        let lik = LikelihoodSpec::Categorical { classes }.build().unwrap();
        let f = net.forward(x).unwrap();
        let data = data_for(x, &f, &y, lik.as_ref(), 3, CurvatureSource::Ggn).unwrap();
        let r = dense_r(net, &data);
        let v = randn(net.n_params(), 4, &mut g);
        let u = randn(r.nrows(), 4, &mut g);
        for budget in [usize::MAX, 0] {
            let wj = WhitenedJacobian::new(net, &data, budget).unwrap();
            assert_eq!(wj.cached(), budget > 0);
            let (jv, vj) = (wj.jvp(&data, &v).unwrap(), wj.vjp(&data, &u).unwrap());
            let (e1, e2) = (rel_frob(&jv, &(&r * &v)), rel_frob(&vj, &(r.transpose() * &u)));
            assert!(e1 < 1e-12 && e2 < 1e-12, "cached {}: R V {e1:.2e}, Rᵀ U {e2:.2e}", wj.cached());
        }
    }

    #[test]
    fn whitened_jacobian_products_equal_the_explicit_jacobian() {
        let mlp = Mlp::new(MlpConfig {
            input_dim: 3,
            hidden: vec![5, 4],
            output_dim: 3,
            activation: Activation::Tanh,
            seed: 1,
        })
        .unwrap();
        let mut g = rng(2);
        check(&mlp, &DMatrix::from_fn(11, 3, |_, _| g.gen_range(-2.0..2.0)), 3, 3);
        let cnn = Cnn::new(CnnConfig {
            input_shape: (1, 6, 6),
            convs: vec![ConvBlock { channels: 2, kernel: 3, same_padding: true, pool: true }],
            hidden: vec![4],
            output_dim: 3,
            activation: Activation::Tanh,
            seed: 4,
        })
        .unwrap();
        check(&cnn, &DMatrix::from_fn(5, 36, |_, _| g.gen_range(-1.0..1.0)), 3, 5);
    }
}
