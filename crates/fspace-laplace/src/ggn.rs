//! GGN-vector products from cached per-layer statistics.
//!
//! For a network that exposes its weight layers ([`Network::kfac_statistics`]) the whitened
//! Jacobian row of example `i`, cotangent column `c`, restricted to layer `l`, is
//! `g_{icl} = Σ_t δ_{ict} ã_{it}ᵀ` (`ã = [a; 1]`). Hence, with the layer's block `V_l` of `v`
//! (`fan_out × (fan_in + 1)`),
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
        // Per layer `[∂W | ∂b]` (fan_out × (fan_in + 1)), summed over chunks.
        let mut sums: Vec<DMatrix<f64>> =
            self.infos.iter().map(|i| DMatrix::zeros(i.fan_out, i.fan_in + 1)).collect();
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
                for j in 0..=info.fan_in {
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
                let mut m = DMatrix::zeros(fo, info.fan_in + 1);
                m.columns_mut(0, info.fan_in).copy_from(&(&dt * &st.inputs));
                m.set_column(info.fan_in, &dt.column_sum());
                m
            })
            .collect()
    }
}

/// The columns of a column-major matrix as contiguous slices.
fn columns(m: &DMatrix<f64>) -> std::slice::ChunksExact<'_, f64> {
    m.as_slice().chunks_exact(m.nrows().max(1))
}
