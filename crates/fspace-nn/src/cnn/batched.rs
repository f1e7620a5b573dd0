//! The CNN's hot paths on whole batches: im2col lowering, one GEMM per layer
//! ([`crate::gemm`]), fused activation and pooling loops.
//!
//! A batch of feature maps is a row-major `n·H·W × C` buffer (NHWC: a row per image and
//! position, channels contiguous). A convolution lowers its input to patches
//! `P` (`n·H_o·W_o × k·k·C_in`, columns ordered `(ky, kx, c)` so that each patch row is filled
//! by contiguous channel copies) and computes `Z = P W̃ᵀ + 1bᵀ`, where `W̃` is the weight with its
//! columns permuted from the parameter layout `(c, ky, kx)` to the patch order. The first dense
//! layer after the convolutions reads the NHWC map of an image as one row, so its weight columns
//! are permuted from the parameter layout's channel-major flattening (`c·H·W + y·W + x`) to
//! `(y·W + x)·C + c`. Gradients are permuted back. The rules:
//!
//! * forward `Z = P(A) W̃ᵀ + 1bᵀ`, `A' = pool(σ(Z))`;
//! * tangent `Ż = P(Ȧ) W̃ᵀ + P(A) Ũᵀ + 1u_bᵀ`, `Ȧ' = pool_argmax(σ'(Z) ⊙ Ż)`;
//! * adjoint `Δ_Z = σ'(Z) ⊙ unpool(Δ)`, `∂W̃ = Δ_Zᵀ P(A)`, `∂b = Δ_Zᵀ1`,
//!   `∂A = col2im(Δ_Z W̃)`.
//!
//! Batches are processed in chunks of [`CHUNK_IMAGES`] images to bound the patch memory. The
//! KFAC statistics run one forward trace per chunk and one reverse pass per cotangent column,
//! recording `Δ_Z` per layer (measured, `cargo bench -p fspace-nn --bench operators --
//! kfac_statistics`: 100 images × 10 columns of the FSP CNN in 0.68 s against 2.64 s per
//! image, LeNet-5 0.25 s against 0.47 s). The per-image rules in `cnn.rs` (used by the
//! Jacobian rows) are the independent reference of the tests.

use nalgebra::{DMatrix, DVector};
use rayon::prelude::*;

use crate::batch::{activate, add_column_sums, bias_rows, check_cotangent, copy_short, row_major, scale_by};
use crate::cnn::{Cnn, Layer};
use crate::error::Result;
use crate::gemm::{gemm, Operand};
use crate::layers::LayerStatistics;
use crate::scratch::{overwritten, recycle, recycle_indices, zeroed, zeroed_indices};

/// Images per chunk of a batched pass.
pub(crate) const CHUNK_IMAGES: usize = 128;

/// Geometry of a convolution on a batch.
#[derive(Debug, Clone, Copy)]
struct Conv {
    cin: usize,
    cout: usize,
    k: usize,
    pad: usize,
    h: usize,
    wd: usize,
    ho: usize,
    wo: usize,
    pool: bool,
}

impl Conv {
    fn patch_width(&self) -> usize {
        self.k * self.k * self.cin
    }
    /// Positions per image after pooling (or before, without pooling).
    fn out_positions(&self) -> usize {
        if self.pool {
            (self.ho / 2) * (self.wo / 2)
        } else {
            self.ho * self.wo
        }
    }
}

/// Calls `run(patch_offset, Some(input_offset), len)` for every in-bounds run of one image's
/// patches, in the order `(position, ky)`: for a fixed position and `ky`, the in-bounds `kx`
/// and all channels are `len` consecutive values both in the NHWC map (adjacent positions of one
/// row) and in the patch row (columns `(ky, kx, c)`); `run(patch_offset, None, len)` for the
/// runs of padding entries. Shared by [`im2col`] and [`col2im`]; within a run `kx` ascends, so
/// col2im's sums are accumulated in the order of a per-`(ky, kx)` loop.
fn for_each_patch_run(g: &Conv, mut run: impl FnMut(usize, Option<usize>, usize)) {
    let (kw, c) = (g.patch_width(), g.cin);
    for y in 0..g.ho {
        for x in 0..g.wo {
            let row = (y * g.wo + x) * kw;
            // In-bounds kx: pad ≤ x + kx < pad + wd.
            let kx_lo = g.pad.saturating_sub(x).min(g.k);
            let kx_hi = g.k.min((g.pad + g.wd).saturating_sub(x)).max(kx_lo);
            for ky in 0..g.k {
                let yy = y + ky;
                let first = row + ky * g.k * c;
                if yy < g.pad || yy - g.pad >= g.h || kx_lo == kx_hi {
                    run(first, None, g.k * c);
                    continue;
                }
                if kx_lo > 0 {
                    run(first, None, kx_lo * c);
                }
                let src = ((yy - g.pad) * g.wd + x + kx_lo - g.pad) * c;
                run(first + kx_lo * c, Some(src), (kx_hi - kx_lo) * c);
                if kx_hi < g.k {
                    run(first + kx_hi * c, None, (g.k - kx_hi) * c);
                }
            }
        }
    }
}

/// im2col: patches `n·H_o·W_o × k·k·C_in` of an NHWC batch `a` (zero padding).
fn im2col(a: &[f64], n: usize, g: &Conv) -> Vec<f64> {
    let (per_image_in, per_image_p) = (g.h * g.wd * g.cin, g.ho * g.wo * g.patch_width());
    // Every entry is written: the in-bounds runs by copies, the padding by zeros.
    let mut patches = overwritten(n * per_image_p);
    patches.par_chunks_mut(per_image_p).zip(a.par_chunks(per_image_in)).for_each(|(img, ai)| {
        for_each_patch_run(g, |dst, src, len| match src {
            Some(src) => copy_short(&mut img[dst..dst + len], &ai[src..src + len]),
            None => img[dst..dst + len].fill(0.0),
        });
    });
    patches
}

/// col2im: the adjoint of [`im2col`] — patch cotangents summed back onto the NHWC input.
fn col2im(dp: &[f64], n: usize, g: &Conv) -> Vec<f64> {
    let (per_image_in, per_image_p) = (g.h * g.wd * g.cin, g.ho * g.wo * g.patch_width());
    let mut da = zeroed(n * per_image_in);
    da.par_chunks_mut(per_image_in).zip(dp.par_chunks(per_image_p)).for_each(|(img, dpi)| {
        for_each_patch_run(g, |src, dst, len| {
            if let Some(dst) = dst {
                img[dst..dst + len].iter_mut().zip(&dpi[src..src + len]).for_each(|(d, s)| *d += s)
            }
        });
    });
    da
}

/// 2×2 max-pool (stride 2, floor) of an NHWC batch `z` (`n·H_o·W_o × C`): the pooled map and,
/// per pooled entry, the flat index of its arg-max in `z` (first maximum on ties, in the
/// window order (0,0), (0,1), (1,0), (1,1), as the per-image rule).
fn max_pool(z: &[f64], n: usize, g: &Conv) -> (Vec<f64>, Vec<usize>) {
    let (hp, wp, c) = (g.ho / 2, g.wo / 2, g.cout);
    let (per_in, per_out) = (g.ho * g.wo * c, hp * wp * c);
    let mut out = overwritten(n * per_out);
    let mut arg = zeroed_indices(n * per_out);
    out.par_chunks_mut(per_out).zip(arg.par_chunks_mut(per_out)).enumerate().for_each(|(i, (o, a))| {
        let base = i * per_in;
        for y in 0..hp {
            for x in 0..wp {
                for ch in 0..c {
                    let at = |yy: usize, xx: usize| base + (yy * g.wo + xx) * c + ch;
                    let mut best = at(2 * y, 2 * x);
                    for cand in [at(2 * y, 2 * x + 1), at(2 * y + 1, 2 * x), at(2 * y + 1, 2 * x + 1)] {
                        if z[cand] > z[best] {
                            best = cand;
                        }
                    }
                    let j = (y * wp + x) * c + ch;
                    o[j] = z[best];
                    a[j] = best; // flat index into the chunk's z
                }
            }
        }
    });
    (out, arg)
}

/// Per layer: its weights in GEMM layout (rows = outputs, columns in the batched input order)
/// and, where the columns are permuted, the map from GEMM column to parameter column.
struct GemmWeights {
    w: Vec<Vec<f64>>,
    column_maps: Vec<Option<Vec<usize>>>,
}

/// What a batched forward pass keeps for the tangent and adjoint passes.
pub(crate) struct CnnBatchTrace {
    n: usize,
    /// Per layer: its GEMM input (patches for a convolution, the row-major input for a dense
    /// layer).
    inputs: Vec<Vec<f64>>,
    /// Per layer: `σ'(Z)` (empty for the linear output layer).
    slopes: Vec<Vec<f64>>,
    /// Per pooled convolution: the arg-max indices into `Z`.
    argmax: Vec<Vec<usize>>,
    output: Vec<f64>,
}

impl Cnn {
    fn conv_geometry(layer: &Layer) -> Option<Conv> {
        match *layer {
            Layer::Conv { cin, cout, k, pad, h, wd, pool, .. } => {
                let (ho, wo) = (Layer::conv_out(h, k, pad), Layer::conv_out(wd, k, pad));
                Some(Conv { cin, cout, k, pad, h, wd, ho, wo, pool })
            }
            Layer::Dense { .. } => None,
        }
    }

    /// The column maps of every layer (GEMM column → parameter column), `None` = identity.
    fn column_maps(&self) -> Vec<Option<Vec<usize>>> {
        let mut maps = Vec::with_capacity(self.layers.len());
        let mut last_conv: Option<Conv> = None;
        for layer in &self.layers {
            match *layer {
                Layer::Conv { .. } => {
                    let g = Self::conv_geometry(layer).expect("a convolution");
                    let mut map = vec![0; g.patch_width()];
                    for ky in 0..g.k {
                        for kx in 0..g.k {
                            for c in 0..g.cin {
                                map[(ky * g.k + kx) * g.cin + c] = (c * g.k + ky) * g.k + kx;
                            }
                        }
                    }
                    maps.push(Some(map));
                    last_conv = Some(g);
                }
                Layer::Dense { fan_in, .. } => match last_conv.take() {
                    Some(g) => {
                        let (hw, c) = (g.out_positions(), g.cout);
                        let mut map = vec![0; fan_in];
                        for s in 0..hw {
                            for ch in 0..c {
                                map[s * c + ch] = ch * hw + s;
                            }
                        }
                        maps.push(Some(map));
                    }
                    None => maps.push(None),
                },
            }
        }
        maps
    }

    /// Weights (or a tangent `u` in the parameter layout) in GEMM layout.
    fn gemm_weights(&self, flat: &[f64], maps: &[Option<Vec<usize>>]) -> Vec<Vec<f64>> {
        self.layers
            .iter()
            .zip(maps)
            .map(|(layer, map)| {
                let (w, b) = match *layer {
                    Layer::Conv { w, b, .. } | Layer::Dense { w, b, .. } => (w, b),
                };
                let block = &flat[w..b];
                match map {
                    None => block.to_vec(),
                    Some(map) => {
                        let cols = map.len();
                        let mut out = vec![0.0; block.len()];
                        for (orow, brow) in out.chunks_exact_mut(cols).zip(block.chunks_exact(cols)) {
                            orow.iter_mut().zip(map).for_each(|(o, &j)| *o = brow[j]);
                        }
                        out
                    }
                }
            })
            .collect()
    }

    fn prepared_weights(&self, flat: &[f64]) -> GemmWeights {
        let column_maps = self.column_maps();
        GemmWeights { w: self.gemm_weights(flat, &column_maps), column_maps }
    }

    /// The images of `x` (rows `start..start + n`, channel-major) as an NHWC buffer.
    fn nhwc_input(&self, x: &DMatrix<f64>, start: usize, n: usize) -> Vec<f64> {
        let (c, h, w) = self.config.input_shape;
        let hw = h * w;
        let mut out = overwritten(n * hw * c);
        for ch in 0..c {
            for s in 0..hw {
                let col = x.column(ch * hw + s);
                for i in 0..n {
                    out[(i * hw + s) * c + ch] = col[start + i];
                }
            }
        }
        out
    }

    /// The forward pass of `n` images starting at row `start`.
    fn chunk_trace(
        &self,
        x: &DMatrix<f64>,
        start: usize,
        n: usize,
        gw: &GemmWeights,
        keep: bool,
    ) -> CnnBatchTrace {
        let p = &self.params;
        let act = self.config.activation;
        let mut t = CnnBatchTrace { n, inputs: vec![], slopes: vec![], argmax: vec![], output: vec![] };
        let mut a = self.nhwc_input(x, start, n);
        for (l, layer) in self.layers.iter().enumerate() {
            match *layer {
                Layer::Conv { b, .. } => {
                    let g = Self::conv_geometry(layer).expect("a convolution");
                    let patches = im2col(&a, n, &g);
                    let rows = n * g.ho * g.wo;
                    let mut z = bias_rows(p, b, g.cout, rows);
                    gemm(
                        &mut z,
                        Operand::new(&patches, rows, g.patch_width()),
                        Operand::new(&gw.w[l], g.cout, g.patch_width()).t(),
                        1.0,
                        1.0,
                    );
                    let mut slopes = if keep { overwritten(z.len()) } else { Vec::new() };
                    activate(act, &mut z, keep.then_some(&mut slopes));
                    recycle(std::mem::take(&mut a));
                    if g.pool {
                        let (pooled, arg) = max_pool(&z, n, &g);
                        a = pooled;
                        recycle(z);
                        if keep {
                            t.argmax.push(arg);
                        } else {
                            recycle_indices(arg);
                        }
                    } else {
                        a = z;
                        if keep {
                            t.argmax.push(Vec::new());
                        }
                    }
                    if keep {
                        t.inputs.push(patches);
                        t.slopes.push(slopes);
                    } else {
                        recycle(patches);
                    }
                }
                Layer::Dense { b, fan_in, fan_out, last, .. } => {
                    let mut z = bias_rows(p, b, fan_out, n);
                    gemm(
                        &mut z,
                        Operand::new(&a, n, fan_in),
                        Operand::new(&gw.w[l], fan_out, fan_in).t(),
                        1.0,
                        1.0,
                    );
                    let mut slopes = if keep && !last { overwritten(z.len()) } else { Vec::new() };
                    if !last {
                        activate(act, &mut z, keep.then_some(&mut slopes));
                    }
                    if keep {
                        t.inputs.push(std::mem::take(&mut a));
                        t.slopes.push(slopes);
                        t.argmax.push(Vec::new());
                    } else {
                        recycle(std::mem::take(&mut a));
                    }
                    a = z;
                }
            }
        }
        t.output = a;
        t
    }

    /// `J u` for the chunk of `trace` (row-major `n × d'`).
    fn chunk_tangent(&self, trace: &CnnBatchTrace, gw: &GemmWeights, gu: &[Vec<f64>], u: &[f64]) -> Vec<f64> {
        let n = trace.n;
        let mut ad: Option<Vec<f64>> = None; // tangent of the current layer's input (None = 0)
        for (l, layer) in self.layers.iter().enumerate() {
            let slopes = &trace.slopes[l];
            match *layer {
                Layer::Conv { b, .. } => {
                    let g = Self::conv_geometry(layer).expect("a convolution");
                    let (rows, kw) = (n * g.ho * g.wo, g.patch_width());
                    let mut zd = bias_rows(u, b, g.cout, rows);
                    gemm(
                        &mut zd,
                        Operand::new(&trace.inputs[l], rows, kw),
                        Operand::new(&gu[l], g.cout, kw).t(),
                        1.0,
                        1.0,
                    );
                    if let Some(t) = ad.take() {
                        let tp = im2col(&t, n, &g);
                        gemm(
                            &mut zd,
                            Operand::new(&tp, rows, kw),
                            Operand::new(&gw.w[l], g.cout, kw).t(),
                            1.0,
                            1.0,
                        );
                        recycle(tp);
                        recycle(t);
                    }
                    scale_by(&mut zd, slopes);
                    ad = Some(if g.pool {
                        let mut pooled = overwritten(trace.argmax[l].len());
                        pooled.iter_mut().zip(&trace.argmax[l]).for_each(|(o, &i)| *o = zd[i]);
                        recycle(zd);
                        pooled
                    } else {
                        zd
                    });
                }
                Layer::Dense { b, fan_in, fan_out, last, .. } => {
                    let mut zd = bias_rows(u, b, fan_out, n);
                    gemm(
                        &mut zd,
                        Operand::new(&trace.inputs[l], n, fan_in),
                        Operand::new(&gu[l], fan_out, fan_in).t(),
                        1.0,
                        1.0,
                    );
                    if let Some(t) = ad.take() {
                        gemm(
                            &mut zd,
                            Operand::new(&t, n, fan_in),
                            Operand::new(&gw.w[l], fan_out, fan_in).t(),
                            1.0,
                            1.0,
                        );
                        recycle(t);
                    }
                    if !last {
                        scale_by(&mut zd, slopes);
                    }
                    ad = Some(zd);
                }
            }
        }
        ad.expect("a CNN has a dense output layer")
    }

    /// The reverse pass of the chunk of `trace` for the row-major cotangent `v` (`n × d'`):
    /// accumulates `Jᵀ V` into `grad` (if given) and/or records each layer's pre-activation
    /// cotangent `Δ_Z` (if given; row-major `rows × fan_out`, rows `(image, position)` before
    /// pooling for a convolution) — the batched twin of the per-image `adjoint_with`.
    fn chunk_reverse(
        &self,
        trace: &CnnBatchTrace,
        gw: &GemmWeights,
        v: Vec<f64>,
        mut grad: Option<&mut [f64]>,
        mut record: Option<&mut Vec<Vec<f64>>>,
    ) {
        let n = trace.n;
        if let Some(rec) = record.as_deref_mut() {
            rec.clear();
            rec.resize(self.layers.len(), Vec::new());
        }
        let mut delta = v; // cotangent of the current layer's output
        for l in (0..self.layers.len()).rev() {
            let layer = &self.layers[l];
            let (w, b, rows, width_in, width_out, dz) = match *layer {
                Layer::Dense { w, b, fan_in, fan_out, last } => {
                    if !last {
                        scale_by(&mut delta, &trace.slopes[l]);
                    }
                    (w, b, n, fan_in, fan_out, delta)
                }
                Layer::Conv { w, b, .. } => {
                    let g = Self::conv_geometry(layer).expect("a convolution");
                    let rows = n * g.ho * g.wo;
                    let mut dz = if g.pool {
                        // Image by image in parallel: an image's arg-max indices point into its
                        // own block of `Z`, and no entry is the maximum of two windows.
                        let per_in = g.ho * g.wo * g.cout;
                        let per_out = g.out_positions() * g.cout;
                        let mut dz = overwritten(rows * g.cout);
                        dz.par_chunks_mut(per_in)
                            .zip(trace.argmax[l].par_chunks(per_out).zip(delta.par_chunks(per_out)))
                            .enumerate()
                            .for_each(|(img, (dzi, (arg, d)))| {
                                dzi.fill(0.0);
                                for (&i, dv) in arg.iter().zip(d) {
                                    dzi[i - img * per_in] += dv;
                                }
                            });
                        recycle(delta);
                        dz
                    } else {
                        delta
                    };
                    scale_by(&mut dz, &trace.slopes[l]);
                    (w, b, rows, g.patch_width(), g.cout, dz)
                }
            };
            let d = Operand::new(&dz, rows, width_out);
            if let Some(grad) = grad.as_deref_mut() {
                match &gw.column_maps[l] {
                    None => {
                        gemm(&mut grad[w..b], d.t(), Operand::new(&trace.inputs[l], rows, width_in), 1.0, 1.0)
                    }
                    Some(map) => {
                        let mut gperm = overwritten(width_out * width_in);
                        gemm(&mut gperm, d.t(), Operand::new(&trace.inputs[l], rows, width_in), 1.0, 0.0);
                        for (grow, prow) in
                            grad[w..b].chunks_exact_mut(width_in).zip(gperm.chunks_exact(width_in))
                        {
                            map.iter().zip(prow).for_each(|(&j, v)| grow[j] += v);
                        }
                        recycle(gperm);
                    }
                }
                add_column_sums(&dz, width_out, &mut grad[b..b + width_out]);
            }
            let next = (l > 0).then(|| {
                let mut back = overwritten(rows * width_in);
                gemm(&mut back, d, Operand::new(&gw.w[l], width_out, width_in), 1.0, 0.0);
                match Self::conv_geometry(layer) {
                    Some(g) => {
                        let da = col2im(&back, n, &g);
                        recycle(back);
                        da
                    }
                    None => back,
                }
            });
            match record.as_deref_mut() {
                Some(rec) => rec[l] = dz,
                None => recycle(dz),
            }
            match next {
                Some(next) => delta = next,
                None => break,
            }
        }
    }

    /// `Jᵀ V` of the chunk of `trace` accumulated into `grad` (row-major cotangent `n × d'`).
    fn chunk_adjoint(&self, trace: &CnnBatchTrace, gw: &GemmWeights, v: Vec<f64>, grad: &mut [f64]) {
        self.chunk_reverse(trace, gw, v, Some(grad), None);
    }

    /// Hands a trace's buffers back for reuse.
    fn recycle_trace(trace: CnnBatchTrace) {
        trace.inputs.into_iter().chain(trace.slopes).chain([trace.output]).for_each(recycle);
        trace.argmax.into_iter().for_each(recycle_indices);
    }

    fn chunks(n: usize) -> impl Iterator<Item = (usize, usize)> {
        (0..n).step_by(CHUNK_IMAGES).map(move |s| (s, CHUNK_IMAGES.min(n - s)))
    }

    /// `f(X)` (`n × d'`), batched. `x` is checked by the caller.
    pub(crate) fn batched_forward(&self, x: &DMatrix<f64>) -> DMatrix<f64> {
        let gw = self.prepared_weights(&self.params);
        let q = self.output_dim();
        let mut out = Vec::with_capacity(x.nrows() * q);
        for (s, n) in Self::chunks(x.nrows()) {
            let trace = self.chunk_trace(x, s, n, &gw, false);
            out.extend_from_slice(&trace.output);
            Self::recycle_trace(trace);
        }
        DMatrix::from_row_slice(x.nrows(), q, &out)
    }

    /// `J(X) u` (`n × d'`), batched. Inputs are checked by the caller.
    pub(crate) fn batched_jvp(&self, x: &DMatrix<f64>, u: &[f64]) -> DMatrix<f64> {
        let gw = self.prepared_weights(&self.params);
        let gu = self.gemm_weights(u, &gw.column_maps);
        let q = self.output_dim();
        let mut out = Vec::with_capacity(x.nrows() * q);
        for (s, n) in Self::chunks(x.nrows()) {
            let trace = self.chunk_trace(x, s, n, &gw, true);
            let tangent = self.chunk_tangent(&trace, &gw, &gu, u);
            out.extend_from_slice(&tangent);
            recycle(tangent);
            Self::recycle_trace(trace);
        }
        DMatrix::from_row_slice(x.nrows(), q, &out)
    }

    /// `J(X)·U` point-major (`n·d' × r`), batched: per chunk one forward trace shared by the
    /// tangent passes of all columns (in parallel). Inputs are checked by the caller.
    pub(crate) fn batched_jvp_columns(&self, x: &DMatrix<f64>, u: &DMatrix<f64>) -> DMatrix<f64> {
        let (n_all, q, p) = (x.nrows(), self.output_dim(), self.n_params());
        let gw = self.prepared_weights(&self.params);
        let mut out = DMatrix::zeros(n_all * q, u.ncols());
        for (s, n) in Self::chunks(n_all) {
            let trace = self.chunk_trace(x, s, n, &gw, true);
            out.as_mut_slice().par_chunks_mut((n_all * q).max(1)).enumerate().for_each(|(j, col)| {
                let uj = &u.as_slice()[j * p..(j + 1) * p];
                let gu = self.gemm_weights(uj, &gw.column_maps);
                let tangent = self.chunk_tangent(&trace, &gw, &gu, uj);
                col[s * q..(s + n) * q].copy_from_slice(&tangent);
                recycle(tangent);
            });
            Self::recycle_trace(trace);
        }
        out
    }

    /// `J(X)ᵀ·L` (`p × r`) for point-major cotangent columns `L` (`n·d' × r`), batched: per
    /// chunk one forward trace shared by the reverse passes of all columns (in parallel).
    /// Inputs are checked by the caller.
    pub(crate) fn batched_vjp_columns(&self, x: &DMatrix<f64>, l: &DMatrix<f64>) -> DMatrix<f64> {
        let (n_all, q, p) = (x.nrows(), self.output_dim(), self.n_params());
        let gw = self.prepared_weights(&self.params);
        let mut out = DMatrix::zeros(p, l.ncols());
        for (s, n) in Self::chunks(n_all) {
            let trace = self.chunk_trace(x, s, n, &gw, true);
            out.as_mut_slice().par_chunks_mut(p.max(1)).enumerate().for_each(|(j, grad)| {
                let col = &l.as_slice()[j * n_all * q..(j + 1) * n_all * q];
                self.chunk_reverse(&trace, &gw, col[s * q..(s + n) * q].to_vec(), Some(grad), None);
            });
            Self::recycle_trace(trace);
        }
        out
    }

    /// KFAC statistics ([`LayerStatistics`]) on batches: per chunk one forward trace and one
    /// reverse pass per cotangent column `c` of the factors `Lᵢ` (`d' × k`), recording `Δ_Z`
    /// per layer; layer inputs (im2col patches, dense inputs) are permuted from the GEMM column
    /// order to the parameter layout. Inputs are checked by the caller; `k` is the factors'
    /// column count.
    pub(crate) fn batched_kfac_statistics(
        &self,
        x: &DMatrix<f64>,
        factors: &[DMatrix<f64>],
        k: usize,
    ) -> Vec<LayerStatistics> {
        let (n_all, q) = (x.nrows(), self.output_dim());
        let gw = self.prepared_weights(&self.params);
        let infos = self.layer_infos();
        let mut inputs: Vec<Vec<f64>> =
            infos.iter().map(|i| Vec::with_capacity(n_all * i.positions() * i.fan_in)).collect();
        let mut grads: Vec<Vec<f64>> =
            infos.iter().map(|i| vec![0.0; n_all * k * i.positions() * i.fan_out]).collect();
        let mut rec = Vec::new();
        for (s, n) in Self::chunks(n_all) {
            let trace = self.chunk_trace(x, s, n, &gw, true);
            for ((dst, src), map) in inputs.iter_mut().zip(&trace.inputs).zip(&gw.column_maps) {
                match map {
                    None => dst.extend_from_slice(src),
                    Some(map) => {
                        let width = map.len();
                        let at = dst.len();
                        dst.resize(at + src.len(), 0.0);
                        for (orow, irow) in dst[at..].chunks_exact_mut(width).zip(src.chunks_exact(width)) {
                            map.iter().zip(irow).for_each(|(&j, v)| orow[j] = *v);
                        }
                    }
                }
            }
            for c in 0..k {
                let mut v = overwritten(n * q);
                for (i, row) in v.chunks_exact_mut(q).enumerate() {
                    row.iter_mut().enumerate().for_each(|(o, r)| *r = factors[s + i][(o, c)]);
                }
                self.chunk_reverse(&trace, &gw, v, None, Some(&mut rec));
                // Row (i·k + c)·T + t of the layer's output gradients is image i's position t.
                for ((dst, dz), info) in grads.iter_mut().zip(rec.drain(..)).zip(&infos) {
                    let block = info.positions() * info.fan_out;
                    for (i, src) in dz.chunks_exact(block).enumerate() {
                        let at = ((s + i) * k + c) * block;
                        dst[at..at + block].copy_from_slice(src);
                    }
                    recycle(dz);
                }
            }
            Self::recycle_trace(trace);
        }
        infos
            .iter()
            .zip(inputs)
            .zip(grads)
            .map(|((info, a), g)| LayerStatistics {
                positions: info.positions(),
                columns: k,
                inputs: DMatrix::from_row_slice(n_all * info.positions(), info.fan_in, &a),
                output_grads: DMatrix::from_row_slice(n_all * k * info.positions(), info.fan_out, &g),
            })
            .collect()
    }

    /// `(f(X), J(X)ᵀ g)` with `g` computed from the outputs of each chunk's forward pass by
    /// `cotangent` over the whole batch: the forward passes run first, then the reverse passes
    /// re-run each chunk's forward trace only when the batch has more than one chunk.
    pub(crate) fn batched_forward_vjp(
        &self,
        x: &DMatrix<f64>,
        cotangent: &mut dyn FnMut(&DMatrix<f64>) -> Result<DMatrix<f64>>,
    ) -> Result<(DMatrix<f64>, DVector<f64>)> {
        let (n_all, q) = (x.nrows(), self.output_dim());
        let gw = self.prepared_weights(&self.params);
        let mut grad = vec![0.0; self.n_params()];
        if n_all <= CHUNK_IMAGES {
            let trace = self.chunk_trace(x, 0, n_all, &gw, true);
            let f = DMatrix::from_row_slice(n_all, q, &trace.output);
            let v = cotangent(&f)?;
            check_cotangent(&v, n_all, q)?;
            self.chunk_adjoint(&trace, &gw, row_major(&v), &mut grad);
            Self::recycle_trace(trace);
            return Ok((f, DVector::from_vec(grad)));
        }
        let f = self.batched_forward(x);
        let v = cotangent(&f)?;
        check_cotangent(&v, n_all, q)?;
        self.chunked_adjoints(x, &gw, &row_major(&v), &mut grad);
        Ok((f, DVector::from_vec(grad)))
    }

    /// `J(X)ᵀ V` for a cotangent known beforehand: per chunk one forward trace and its adjoint
    /// (no separate forward pass for the outputs). Inputs are checked by the caller.
    pub(crate) fn batched_vjp(&self, x: &DMatrix<f64>, v: &DMatrix<f64>) -> DVector<f64> {
        let gw = self.prepared_weights(&self.params);
        let mut grad = vec![0.0; self.n_params()];
        self.chunked_adjoints(x, &gw, &row_major(v), &mut grad);
        DVector::from_vec(grad)
    }

    /// Adds `J(X)ᵀ V` to `grad` chunk by chunk (`v_rows`: `V` row-major), a trace at a time.
    fn chunked_adjoints(&self, x: &DMatrix<f64>, gw: &GemmWeights, v_rows: &[f64], grad: &mut [f64]) {
        let q = self.output_dim();
        for (s, n) in Self::chunks(x.nrows()) {
            let trace = self.chunk_trace(x, s, n, gw, true);
            self.chunk_adjoint(&trace, gw, v_rows[s * q..(s + n) * q].to_vec(), grad);
            Self::recycle_trace(trace);
        }
    }

    /// [`Network::forward_vjp_many`] for CNNs: each network's chunk traces are kept from the
    /// forward pass to the reverse pass, so each image is traced once. Inputs are checked by
    /// the caller.
    pub(crate) fn batched_forward_vjp_many(
        nets: &[Cnn],
        x: &DMatrix<f64>,
        cotangents: &mut crate::network::JointCotangents<'_>,
    ) -> Result<crate::network::OutputsAndGradients> {
        let n_all = x.nrows();
        crate::network::forward_vjp_traced(
            nets,
            n_all,
            cotangents,
            |net| {
                let gw = net.prepared_weights(&net.params);
                let traces: Vec<CnnBatchTrace> =
                    Self::chunks(n_all).map(|(s, n)| net.chunk_trace(x, s, n, &gw, true)).collect();
                (gw, traces)
            },
            |(_, traces)| traces.iter().flat_map(|t| t.output.iter().copied()).collect(),
            |net, (gw, traces), v_rows| {
                let q = net.output_dim();
                let mut grad = vec![0.0; net.n_params()];
                for (trace, (s, n)) in traces.into_iter().zip(Self::chunks(n_all)) {
                    net.chunk_adjoint(&trace, &gw, v_rows[s * q..(s + n) * q].to_vec(), &mut grad);
                    Self::recycle_trace(trace);
                }
                grad
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::activation::Activation;
    use crate::cnn::{CnnConfig, ConvBlock};

    fn nets() -> Vec<Cnn> {
        let mixed = CnnConfig {
            input_shape: (2, 9, 8),
            convs: vec![
                ConvBlock { channels: 3, kernel: 3, same_padding: true, pool: true },
                ConvBlock { channels: 4, kernel: 2, same_padding: false, pool: false },
            ],
            hidden: vec![6],
            output_dim: 3,
            activation: Activation::Tanh,
            seed: 3,
        };
        vec![
            Cnn::new(mixed.clone()).unwrap(),
            Cnn::new(CnnConfig { activation: Activation::Relu, ..mixed }).unwrap(),
            Cnn::new(CnnConfig::lenet5(10, Activation::Tanh, 1)).unwrap(),
            Cnn::new(CnnConfig::fsp_mnist(10, Activation::Sigmoid, 2)).unwrap(),
        ]
    }

    fn inputs(net: &Cnn, n: usize) -> DMatrix<f64> {
        DMatrix::from_fn(n, net.input_dim(), |i, j| (((i * 37 + j * 11) % 23) as f64 / 23.0 - 0.5) * 2.0)
    }

    /// The traced passes give the bits of the separate ones: `forward_vjp_many` (traces kept
    /// from the forward to the reverse pass) against `forward` and `vjp` per network, and `vjp`
    /// (one trace per chunk) against `forward_vjp`, across a chunk boundary.
    #[test]
    fn kept_traces_give_the_separate_passes_bits() {
        use crate::network::Network;
        let base = nets().swap_remove(0);
        let n = CHUNK_IMAGES + 9;
        let x = inputs(&base, n);
        let samples: Vec<Cnn> = (0..3)
            .map(|s| {
                let mut w = base.clone();
                w.set_params(&base.params().map(|v| v * (1.0 + 0.1 * s as f64))).unwrap();
                w
            })
            .collect();
        // Cotangents that mix the networks' outputs, as FVI's score estimate does.
        let mut mix = |fs: &[DMatrix<f64>]| -> Result<Vec<DMatrix<f64>>> {
            Ok((0..fs.len()).map(|s| &fs[s] * 0.5 - &fs[(s + 1) % fs.len()]).collect())
        };
        let (fs, gs) = Cnn::forward_vjp_many(&samples, &x, &mut mix).unwrap();
        let vs = mix(&fs).unwrap();
        for ((net, (f, g)), v) in samples.iter().zip(fs.iter().zip(&gs)).zip(&vs) {
            assert_eq!(*f, net.forward(&x).unwrap());
            assert_eq!(*g, net.vjp(&x, v).unwrap());
            assert_eq!(*g, Network::forward_vjp(net, &x, &mut |_| Ok(v.clone())).unwrap().1);
        }
        // So does the MLP's.
        let mlps: Vec<crate::Mlp> = (0..3)
            .map(|seed| {
                let config = crate::MlpConfig {
                    input_dim: base.input_dim(),
                    hidden: vec![5],
                    output_dim: 3,
                    activation: Activation::Tanh,
                    seed,
                };
                crate::Mlp::new(config).unwrap()
            })
            .collect();
        let (fs, gs) = crate::Mlp::forward_vjp_many(&mlps, &x, &mut mix).unwrap();
        let vs = mix(&fs).unwrap();
        for ((net, (f, g)), v) in mlps.iter().zip(fs.iter().zip(&gs)).zip(&vs) {
            assert_eq!((f, g), (&net.forward(&x).unwrap(), &net.vjp(&x, v).unwrap()));
        }
        // And the trait's default (separate passes; the Helmholtz network keeps it).
        let fields: Vec<crate::HelmholtzNet> =
            (0..3).map(|seed| crate::HelmholtzNet::new(vec![4], Activation::Tanh, seed).unwrap()).collect();
        let xy = DMatrix::from_fn(7, 2, |i, j| (i as f64 - 3.0) * 0.3 + j as f64 * 0.1);
        let (fs, gs) = crate::HelmholtzNet::forward_vjp_many(&fields, &xy, &mut mix).unwrap();
        let vs = mix(&fs).unwrap();
        for ((net, (f, g)), v) in fields.iter().zip(fs.iter().zip(&gs)).zip(&vs) {
            assert_eq!((f, g), (&net.forward(&xy).unwrap(), &net.vjp(&xy, v).unwrap()));
        }
        let err = crate::Mlp::forward_vjp_many(&mlps, &x, &mut |_| Ok(vec![])).unwrap_err();
        assert!(err.to_string().contains("one per network"), "{err}");
        let err = Cnn::forward_vjp_many(&samples, &x, &mut |_| Ok(vec![])).unwrap_err();
        assert!(err.to_string().contains("one per network"), "{err}");
    }

    /// Buffers from the scratch pool that the passes overwrite without clearing: a pool full of
    /// NaN must not change a single bit of any pass.
    #[test]
    fn stale_scratch_buffers_do_not_leak_into_the_passes() {
        for net in nets() {
            let x = inputs(&net, 40);
            let v = DMatrix::from_fn(40, net.output_dim(), |i, j| ((i + 3 * j) % 7) as f64 * 0.1 - 0.3);
            let u: Vec<f64> = (0..net.n_params()).map(|i| ((i % 17) as f64 - 8.0) * 0.01).collect();
            let passes = || {
                let (f, g) =
                    crate::Network::forward_vjp(&net, &x, &mut |_: &DMatrix<f64>| Ok(v.clone())).unwrap();
                (f, net.batched_jvp(&x, &u), g)
            };
            // One-thread pools, so every chunk runs on the thread whose pool was filled.
            let pool = || rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
            let clean = pool().install(passes);
            let dirty = pool().install(|| {
                let mut size = 1;
                while size < 1 << 22 {
                    crate::scratch::recycle(vec![f64::NAN; size]);
                    size *= 3;
                }
                passes()
            });
            let same = |a: &[f64], b: &[f64]| a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(same(clean.0.as_slice(), dirty.0.as_slice()), "forward");
            assert!(same(clean.1.as_slice(), dirty.1.as_slice()), "jvp");
            assert!(same(clean.2.as_slice(), dirty.2.as_slice()), "vjp");
        }
    }

    /// The batched passes against the per-image rules (which the FD tests check), on batches
    /// that span several chunks.
    #[test]
    fn batched_passes_match_the_per_image_rules() {
        for net in nets() {
            let n = if net.input_dim() == 784 { 130 } else { 300 };
            let x = inputs(&net, n);
            let q = net.output_dim();
            let images: Vec<Vec<f64>> = (0..n).map(|i| x.row(i).iter().cloned().collect()).collect();
            let reference = DMatrix::from_fn(n, q, |i, o| net.trace(&images[i]).output[o]);
            let f = net.batched_forward(&x);
            assert!((&f - &reference).abs().max() < 1e-12, "forward");
            let u: Vec<f64> = (0..net.n_params()).map(|i| ((i % 17) as f64 - 8.0) * 0.01).collect();
            let ju = net.batched_jvp(&x, &u);
            for i in [0, n / 2, n - 1] {
                let t = net.tangent(&net.trace(&images[i]), &u);
                for o in 0..q {
                    assert!((ju[(i, o)] - t[o]).abs() < 1e-11 * (1.0 + t[o].abs()), "jvp");
                }
            }
            let v = DMatrix::from_fn(n, q, |i, o| ((i + 2 * o) % 5) as f64 - 2.0);
            let mut g_ref = vec![0.0; net.n_params()];
            for (i, img) in images.iter().enumerate() {
                let vi: Vec<f64> = v.row(i).iter().cloned().collect();
                net.adjoint(&net.trace(img), &vi, &mut g_ref);
            }
            let (f2, g) = net.batched_forward_vjp(&x, &mut |_| Ok(v.clone())).unwrap();
            assert_eq!(f2, f);
            let scale = g_ref.iter().map(|v| v.abs()).fold(0.0, f64::max);
            let err = g.iter().zip(&g_ref).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
            assert!(err < 1e-11 * scale, "vjp: {err} vs scale {scale}");
        }
    }

    /// Batched KFAC statistics against the per-image rules, on batches spanning several chunks
    /// and with several cotangent columns per image.
    #[test]
    fn batched_kfac_statistics_match_the_per_image_rules() {
        for net in nets() {
            let n = if net.input_dim() == 784 { 130 } else { 260 };
            let x = inputs(&net, n);
            let q = net.output_dim();
            let factors: Vec<DMatrix<f64>> = (0..n)
                .map(|i| DMatrix::from_fn(q, 3, |o, c| ((i + 3 * o + 5 * c) % 7) as f64 / 7.0 - 0.4))
                .collect();
            let reference = net.kfac_statistics_per_image(&x, &factors).unwrap();
            let batched = net.kfac_statistics(&x, &factors).unwrap();
            assert_eq!(reference.len(), batched.len());
            for (r, b) in reference.iter().zip(&batched) {
                assert_eq!((r.positions, r.columns), (b.positions, b.columns));
                assert_eq!(r.inputs.shape(), b.inputs.shape());
                assert_eq!(r.output_grads.shape(), b.output_grads.shape());
                assert!((&r.inputs - &b.inputs).abs().max() < 1e-13, "inputs");
                let scale = r.output_grads.abs().max();
                let err = (&r.output_grads - &b.output_grads).abs().max();
                assert!(err <= 1e-11 * scale, "output grads: {err} vs scale {scale}");
            }
        }
    }

    /// im2col against its definition (every entry, padding included, with the scratch pool full
    /// of NaN) and col2im as its adjoint, summed in the per-`(ky, kx)` order, bit for bit.
    #[test]
    fn im2col_and_col2im_follow_their_definitions() {
        let geometries =
            [(1, 5, 2, 7, 6), (3, 3, 1, 5, 4), (2, 3, 0, 6, 6), (2, 5, 2, 3, 4), (1, 7, 3, 2, 2)];
        for (cin, k, pad, h, wd) in geometries {
            let (ho, wo) = (Layer::conv_out(h, k, pad), Layer::conv_out(wd, k, pad));
            let g = Conv { cin, cout: 1, k, pad, h, wd, ho, wo, pool: false };
            let n = 2;
            let a: Vec<f64> = (0..n * h * wd * cin).map(|i| ((i * 7) % 13) as f64 - 6.0).collect();
            recycle(vec![f64::NAN; n * ho * wo * g.patch_width()]);
            let patches = im2col(&a, n, &g);
            let kw = g.patch_width();
            let mut expected_back = vec![0.0; a.len()];
            let dp: Vec<f64> = (0..patches.len()).map(|i| ((i * 5) % 11) as f64 * 0.25 - 1.0).collect();
            for img in 0..n {
                for y in 0..ho {
                    for x in 0..wo {
                        for ky in 0..k {
                            for kx in 0..k {
                                for c in 0..cin {
                                    let at = (img * ho * wo + y * wo + x) * kw + (ky * k + kx) * cin + c;
                                    let (yy, xx) =
                                        ((y + ky) as isize - pad as isize, (x + kx) as isize - pad as isize);
                                    let inside =
                                        yy >= 0 && xx >= 0 && (yy as usize) < h && (xx as usize) < wd;
                                    let want = if inside {
                                        let src = ((img * h + yy as usize) * wd + xx as usize) * cin + c;
                                        expected_back[src] += dp[at];
                                        a[src]
                                    } else {
                                        0.0
                                    };
                                    assert_eq!(
                                        patches[at].to_bits(),
                                        want.to_bits(),
                                        "{:?}",
                                        (cin, k, pad, at)
                                    );
                                }
                            }
                        }
                    }
                }
            }
            let back = col2im(&dp, n, &g);
            assert!(
                back.iter().zip(&expected_back).all(|(u, v)| u.to_bits() == v.to_bits()),
                "{:?}",
                (cin, k, pad)
            );
        }
    }
}
