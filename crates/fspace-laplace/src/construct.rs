//! Building each curvature structure from a network at its MAP weights and the training data.
//!
//! Everything streams over the data in chunks of points, so memory is that of the structure
//! plus one chunk's Jacobian (`chunk·d' × p`) or layer statistics.

use fspace_input::InputError;
use fspace_linalg::{
    fast, lanczos, sym_eigh_owned, thick_restart_lanczos, thin_svd_owned, FnOperator, LanczosConfig,
    StartVector, StopReason, ThickRestartConfig,
};
use fspace_nn::{KfacFactorSums, LayerInfo, LayerKind, Network};
use nalgebra::{DMatrix, DVector};

use crate::curvature::{
    BlockDiagCurvature, Curvature, CurvatureApprox, DiagCurvature, EigenCurvature, KronCurvature, KronLayer,
};
use crate::data::{for_chunks, for_chunks_of, Data};
use crate::error::{LaplaceError, Result};
use crate::ggn::CachedGgn;
use crate::sampled::{sampled, validate, Precond, SampledPreconditioner};
use crate::structure::{
    BlockDiagConfig, FitReport, FullConfig, KronBias, LastLayerConfig, LowRankConfig, Structure, Weights,
};

/// `R` rows `Lᵢ[:, c]ᵀ J(xᵢ)` (`len·k × p`) for a chunk: `RᵀR = Σᵢ J(xᵢ)ᵀ Hᵢ J(xᵢ)`.
fn whitened_jacobian<N: Network>(net: &N, data: &Data, start: usize, len: usize) -> Result<DMatrix<f64>> {
    let (q, k) = (net.output_dim(), data.k());
    let jac = net.jacobian(&data.rows(start, len))?;
    let mut r = DMatrix::zeros(len * k, jac.ncols());
    for i in 0..len {
        let l = &data.factors[start + i];
        // rows i·k .. i·k + k = Lᵢᵀ J_i
        let ji = jac.rows(i * q, q);
        r.rows_mut(i * k, k).gemm_tr(1.0, l, &ji, 0.0);
    }
    Ok(r)
}

/// The full GGN: thin SVD of the whitened Jacobian `Rᵀ` when `n·k < p` (exact, `O(p·(nk)²)`),
/// otherwise the dense `RᵀR` accumulated over chunks and its eigendecomposition.
pub(crate) fn full<N: Network>(net: &N, data: &Data, config: &FullConfig) -> Result<EigenCurvature> {
    let p = net.n_params();
    if p > config.max_params {
        return Err(LaplaceError::TooLarge {
            structure: "full",
            what: "parameters",
            size: p,
            limit: config.max_params,
        });
    }
    let all: Vec<usize> = (0..p).collect();
    let mut factors = factor_blocks(net, data, std::slice::from_ref(&all))?;
    let mut full = factors.pop().expect("one block");
    full.label = "full".into();
    Ok(full)
}

/// Per-thread bytes of the `p × columns` block of per-point reverse passes that [`diagonal`]
/// and the GLM predictive form at once on a network without layer statistics (a torch model,
/// the Helmholtz net).
pub(crate) const PER_POINT_BLOCK_BYTES: usize = 256 << 20;

/// The GGN's diagonal: from layer statistics when the network has them (`Σ (δ_r ã_j)²` as one
/// GEMM per dense layer), otherwise Jacobian-free from per-point reverse passes
/// ([`Network::per_point_vjp`]: the rows `Lᵢ[:, c]ᵀ J(xᵢ)`), squared and summed, as many
/// points (or, when one point's `p × k` block is too large, as many of its columns) per call
/// as fit in [`PER_POINT_BLOCK_BYTES`] — no `n·d' × p` Jacobian is formed, so an
/// 11 M-parameter model needs `O(p)` memory per thread.
pub(crate) fn diagonal<N: Network>(net: &N, data: &Data) -> Result<DVector<f64>> {
    let p = net.n_params();
    let infos = net.layer_infos();
    let mut diag = DVector::zeros(p);
    if infos.is_empty() {
        let k = data.k().max(1);
        let columns = (PER_POINT_BLOCK_BYTES / (8 * p.max(1))).max(1);
        let (points, width) = if columns >= k { (columns / k, k) } else { (1, columns) };
        let add_squares = |acc: &mut DVector<f64>, rows: &DMatrix<f64>| {
            for row in rows.column_iter() {
                acc.zip_apply(&row, |a, r| *a += r * r);
            }
        };
        for_chunks(
            data,
            |s, l| {
                let mut acc = DVector::zeros(p);
                for g in (s..s + l).step_by(points) {
                    let m = points.min(s + l - g);
                    if width == k {
                        let rows = net.per_point_vjp(&data.rows(g, m), &data.factors[g..g + m])?;
                        add_squares(&mut acc, &rows);
                    } else {
                        for c0 in (0..k).step_by(width) {
                            let w = width.min(k - c0);
                            let block = [data.factors[g].columns(c0, w).into_owned()];
                            add_squares(&mut acc, &net.per_point_vjp(&data.rows(g, 1), &block)?);
                        }
                    }
                }
                Ok(acc)
            },
            |_, _, part| {
                diag += part;
                Ok(())
            },
        )?;
        return Ok(diag);
    }
    let k = data.k();
    let per_chunk = |start: usize, len: usize| -> Result<Vec<DMatrix<f64>>> {
        let stats = net.kfac_statistics(&data.rows(start, len), &data.factors[start..start + len])?;
        Ok(infos
            .iter()
            .zip(&stats)
            .map(|(info, st)| {
                if info.positions() == 1 {
                    // Σ_{i,c} δ²_{(i,c), r} ã²_{i, j}: rows of ã repeated per column c.
                    let at = st.augmented_inputs(info.has_bias());
                    let a2 = DMatrix::from_fn(len * k, info.width(), |row, j| at[(row / k, j)].powi(2));
                    st.output_grads.map(|d| d * d).transpose() * a2
                } else {
                    let mut acc = DMatrix::zeros(info.fan_out, info.width());
                    for i in 0..len {
                        for c in 0..k {
                            acc += st.example_gradient(i, c, info.has_bias()).map(|g| g * g);
                        }
                    }
                    acc
                }
            })
            .collect())
    };
    for_chunks(data, per_chunk, |_, _, parts| {
        for (info, sq) in infos.iter().zip(parts) {
            for r in 0..info.fan_out {
                for j in 0..info.width() {
                    diag[info.flat_index(r, j)] += sq[(r, j)];
                }
            }
        }
        Ok(())
    })?;
    Ok(diag)
}

/// Flat indices of a layer's weights then biases.
fn layer_flat(info: &LayerInfo) -> Vec<usize> {
    info.weight.clone().chain(info.bias.clone()).collect()
}

/// The GGN restricted to each block of flat indices, factorised exactly: a block with fewer
/// whitened Jacobian rows (`n·k`) than parameters by the thin SVD of its rows
/// (`O(block·(nk)²)`), otherwise by accumulating its dense Gram and an eigendecomposition
/// (`O(block³)`). One pass over the data serves every block.
fn factor_blocks<N: Network>(net: &N, data: &Data, blocks: &[Vec<usize>]) -> Result<Vec<EigenCurvature>> {
    let nk = data.x.nrows() * data.k();
    let by_svd: Vec<bool> = blocks.iter().map(|b| nk < b.len()).collect();
    // A block that is every parameter in order (the full GGN) needs no column selection.
    let whole: Vec<bool> = blocks
        .iter()
        .map(|b| b.len() == net.n_params() && b.iter().enumerate().all(|(i, &c)| i == c))
        .collect();
    let mut grams: Vec<DMatrix<f64>> = blocks
        .iter()
        .zip(&by_svd)
        .map(|(b, &svd)| if svd { DMatrix::zeros(b.len(), nk) } else { DMatrix::zeros(b.len(), b.len()) })
        .collect();
    for_chunks(
        data,
        |s, l| whitened_jacobian(net, data, s, l),
        |start, len, r| {
            for (((b, g), &svd), &whole) in blocks.iter().zip(grams.iter_mut()).zip(&by_svd).zip(&whole) {
                let selected;
                let rb = if whole {
                    &r
                } else {
                    selected = r.select_columns(b);
                    &selected
                };
                if svd {
                    g.columns_mut(start * data.k(), len * data.k()).copy_from(&rb.transpose());
                } else {
                    g.gemm(1.0, &rb.transpose(), rb, 1.0);
                }
            }
            Ok(())
        },
    )?;
    grams
        .into_iter()
        .zip(by_svd)
        .map(|(g, svd)| {
            // One dense factorisation of seconds at p in the thousands: Ctrl-C is heard while it
            // runs (fspace_input::interrupt::wait_for).
            let (values, vectors) = if svd {
                let f =
                    fspace_input::interrupt::wait_for("the GGN's factorisation", move || thin_svd_owned(g))??;
                (f.s.map(|s| s * s), f.u)
            } else {
                fspace_input::interrupt::wait_for("the GGN's factorisation", move || sym_eigh_owned(g))??
            };
            Ok(EigenCurvature {
                label: "block".into(),
                vectors,
                values: values.map(|v| v.max(0.0)),
                remainder: None,
            })
        })
        .collect()
}

/// One dense block per layer (all parameters as one block for a network without layers);
/// returns the structure and the flat index of each coordinate.
pub(crate) fn block_diag<N: Network>(
    net: &N,
    data: &Data,
    config: &BlockDiagConfig,
) -> Result<(BlockDiagCurvature, Vec<usize>)> {
    let infos = net.layer_infos();
    let blocks: Vec<Vec<usize>> = if infos.is_empty() {
        vec![(0..net.n_params()).collect()]
    } else {
        infos.iter().map(layer_flat).collect()
    };
    if let Some(big) = blocks.iter().map(|b| b.len()).max().filter(|&m| m > config.max_block_params) {
        return Err(LaplaceError::TooLarge {
            structure: "block_diag",
            what: "parameters in one layer block",
            size: big,
            limit: config.max_block_params,
        });
    }
    let mut out = Vec::with_capacity(blocks.len());
    let mut offset = 0;
    for eig in factor_blocks(net, data, &blocks)? {
        let dim = eig.vectors.nrows();
        out.push((offset, eig));
        offset += dim;
    }
    Ok((BlockDiagCurvature { blocks: out }, blocks.concat()))
}

fn require_layers<N: Network>(net: &N, structure: &'static str) -> Result<Vec<LayerInfo>> {
    let infos = net.layer_infos();
    if infos.is_empty() {
        return Err(LaplaceError::Unsupported {
            structure,
            reason:
                "the network exposes no dense/convolutional layer structure (Network::layer_infos is empty)"
                    .into(),
        });
    }
    Ok(infos)
}

/// `AᵀA` of one chunk's layer statistics, on the calling thread (the chunks already run in
/// parallel): faer's Gram from 10⁹ multiply-adds up (convolution patches of ResNet size), where
/// it is faster, and nalgebra's product below, where the whole fit was faster with it
/// (`docs/PERFORMANCE.md`, "After faer's kernels").
fn chunk_gram(a: &DMatrix<f64>) -> DMatrix<f64> {
    let work = a.nrows() as f64 * (a.ncols() as f64).powi(2);
    if work >= 1e9 {
        fast::gram_serial(a)
    } else {
        a.transpose() * a
    }
}

/// Calls of [`Network::kfac_factor_sums`] per pass: the data go in this many groups of whole
/// chunks, so the progress hook hears of each tenth.
const FACTOR_SUM_CALLS: usize = 10;

/// The factor sums of every layer as the network itself computes them
/// ([`Network::kfac_factor_sums`]), in groups of whole chunks; `None` when it has no such
/// route. Each layer's sums must have its shapes.
fn network_factor_sums<N: Network>(
    net: &N,
    data: &Data,
    infos: &[LayerInfo],
) -> Result<Option<Vec<KfacFactorSums>>> {
    let chunks: Vec<(usize, usize)> = data.chunks().collect();
    let per_call = chunks.len().div_ceil(FACTOR_SUM_CALLS).max(1);
    let mut total: Option<Vec<KfacFactorSums>> = None;
    for group in chunks.chunks(per_call) {
        fspace_input::interrupt::check("the KFAC factor sums")?;
        let (start, end) = (group[0].0, group[group.len() - 1].0 + group[group.len() - 1].1);
        let Some(part) =
            net.kfac_factor_sums(&data.rows(start, end - start), &data.factors[start..end], data.chunk)?
        else {
            return Ok(None);
        };
        if part.len() != infos.len() {
            return Err(fspace_nn::NnError::Callback(format!(
                "kfac_factor_sums returned {} layers; expected {}",
                part.len(),
                infos.len()
            ))
            .into());
        }
        if let Some((_, info)) = part.iter().zip(infos).find(|(s, i)| !s.fits(i)) {
            return Err(fspace_nn::NnError::Callback(format!(
                "kfac_factor_sums returned sums of the wrong shapes for layer {} (fan_in {}, fan_out {})",
                info.name, info.fan_in, info.fan_out
            ))
            .into());
        }
        match total.as_mut() {
            None => total = Some(part),
            Some(t) => t.iter_mut().zip(&part).for_each(|(t, p)| t.add(p)),
        }
        if let Some(progress) = data.progress {
            progress(end);
        }
    }
    Ok(total)
}

/// The layers KFAC covers for `weights` (every layer, or the last one, which must be a dense
/// layer with a bias onto the outputs) and their positions among the network's layers.
fn kron_layers<N: Network>(
    net: &N,
    weights: &Weights,
    structure: &'static str,
) -> Result<(Vec<LayerInfo>, Vec<usize>)> {
    let all_infos = require_layers(net, structure)?;
    let ids: Vec<usize> = match weights {
        Weights::All => (0..all_infos.len()).collect(),
        Weights::LastLayer => vec![all_infos.len() - 1],
        Weights::Subnetwork(_) => {
            return Err(LaplaceError::Unsupported {
                structure,
                reason: "over a subnetwork only the full GGN and its diagonal are implemented".into(),
            })
        }
    };
    if matches!(weights, Weights::LastLayer) {
        checked_last_layer(net, structure)?;
    }
    Ok((ids.iter().map(|&l| all_infos[l].clone()).collect(), ids))
}

/// One chunk's layer statistics; the last layer alone (`last_only`) from its features: its
/// inputs are the last-layer features, and the gradients at its (linear) outputs are the factor
/// columns themselves — no pass through the other layers.
fn kron_statistics<N: Network>(
    net: &N,
    data: &Data,
    last_only: bool,
    start: usize,
    len: usize,
) -> Result<Vec<fspace_nn::LayerStatistics>> {
    if last_only {
        let (k, q) = (data.k(), net.output_dim());
        let factors = &data.factors[start..start + len];
        return Ok(vec![fspace_nn::LayerStatistics {
            positions: 1,
            columns: k,
            inputs: data.last_layer_features(net, start, len)?,
            output_grads: DMatrix::from_fn(len * k, q, |r, o| factors[r / k][(o, r % k)]),
        }]);
    }
    Ok(net.kfac_statistics(&data.rows(start, len), &data.factors[start..start + len])?)
}

/// KFAC's factor sums over some of the data (`Σ ããᵀ`-type sums per covered layer), which add
/// up exactly over disjoint parts of the data ([`crate::LaplaceSums`]).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct KronSums {
    /// Per covered layer.
    pub sums: Vec<KfacFactorSums>,
    /// The covered layers.
    pub infos: Vec<LayerInfo>,
    /// Their positions among the network's layers.
    pub ids: Vec<usize>,
    /// Whether every layer is covered.
    pub all_layers: bool,
}

impl KronSums {
    /// Zero sums over the layers KFAC covers for `weights` (no data yet).
    pub(crate) fn zeros<N: Network>(net: &N, weights: &Weights, structure: &'static str) -> Result<Self> {
        let (infos, ids) = kron_layers(net, weights, structure)?;
        let sums = infos.iter().map(KfacFactorSums::zeros).collect();
        Ok(KronSums { sums, infos, ids, all_layers: matches!(weights, Weights::All) })
    }

    pub(crate) fn add(&mut self, other: &KronSums) {
        for (total, part) in self.sums.iter_mut().zip(&other.sums) {
            total.add(part);
        }
    }

    /// The sums as one flat vector: per layer `Σ ããᵀ`, `Σ ã`, `Σ δδᵀ`, rows.
    pub(crate) fn to_flat(&self) -> Vec<f64> {
        let mut out = Vec::with_capacity(self.flat_len());
        for l in &self.sums {
            out.extend_from_slice(l.input_gram.as_slice());
            out.extend_from_slice(l.input_sum.as_slice());
            out.extend_from_slice(l.grad_gram.as_slice());
            out.push(l.input_rows as f64);
        }
        out
    }

    /// The length of [`to_flat`](Self::to_flat)'s vector.
    pub(crate) fn flat_len(&self) -> usize {
        self.sums.iter().map(|l| l.input_gram.len() + l.input_sum.len() + l.grad_gram.len() + 1).sum()
    }

    /// Replaces the sums by a vector of [`to_flat`](Self::to_flat)'s layout (`flat_len`
    /// values, checked by the caller); a row count that is not a whole number ≥ 0 is an error.
    pub(crate) fn set_flat(&mut self, flat: &[f64]) -> Result<()> {
        let mut at = 0;
        for l in &mut self.sums {
            let (a, b, c) = (l.input_gram.len(), l.input_sum.len(), l.grad_gram.len());
            l.input_gram.copy_from_slice(&flat[at..at + a]);
            l.input_sum.copy_from_slice(&flat[at + a..at + a + b]);
            l.grad_gram.copy_from_slice(&flat[at + a + b..at + a + b + c]);
            l.input_rows = flat_count(flat[at + a + b + c], "flat partial sums' KFAC input rows")?;
            at += a + b + c + 1;
        }
        Ok(())
    }
}

/// A count carried as a float in a flat vector of sums (an all-reduce's): a whole number ≥ 0
/// below 2⁵³, else an error naming `what`.
pub(crate) fn flat_count(v: f64, what: &'static str) -> Result<usize> {
    if v >= 0.0 && v.fract() == 0.0 && v < 9.007_199_254_740_992e15 {
        Ok(v as usize)
    } else {
        Err(LaplaceError::Input(InputError::Invalid { what, reason: format!("{v} is not a count") }))
    }
}

/// The factor sums of the layers KFAC covers, over `data`: from the network when it sums them
/// itself ([`Network::kfac_factor_sums`]), otherwise from each chunk's layer statistics.
pub(crate) fn kron_sums<N: Network>(
    net: &N,
    data: &Data,
    weights: &Weights,
    structure: &'static str,
) -> Result<KronSums> {
    let (infos, ids) = kron_layers(net, weights, structure)?;
    let last_only = matches!(weights, Weights::LastLayer);
    let from_network = if last_only { None } else { network_factor_sums(net, data, &infos)? };
    let sums = match from_network {
        Some(sums) => sums,
        None => {
            let mut sums: Vec<KfacFactorSums> = infos.iter().map(KfacFactorSums::zeros).collect();
            let sums_of = |start: usize, len: usize| -> Result<Vec<KfacFactorSums>> {
                Ok(kron_statistics(net, data, last_only, start, len)?
                    .iter()
                    .map(|st| KfacFactorSums {
                        input_gram: chunk_gram(&st.inputs),
                        input_sum: st.inputs.row_sum().transpose(),
                        input_rows: st.inputs.nrows(),
                        grad_gram: chunk_gram(&st.output_grads),
                    })
                    .collect())
            };
            for_chunks(data, sums_of, |_, _, parts| {
                for (total, part) in sums.iter_mut().zip(&parts) {
                    total.add(part);
                }
                Ok(())
            })?;
            sums
        }
    };
    Ok(KronSums { sums, infos, ids, all_layers: matches!(weights, Weights::All) })
}

/// KFAC from factor sums over `n` points (module docs of [`kron`]): `A` as summed (with the
/// bias folded in or in its own block), `G` divided by `n·T`, each eigendecomposed.
pub(crate) fn kron_from_sums(
    sums: &KronSums,
    n: usize,
    bias: KronBias,
) -> Result<(KronCurvature, Vec<usize>)> {
    let mut layers = Vec::with_capacity(sums.infos.len());
    for (s, info) in sums.sums.iter().zip(&sums.infos) {
        let fi = info.fan_in;
        let g = &s.grad_gram / (n * info.positions()) as f64;
        // The sums stay (override=False adds to them): each factor is decomposed from a copy
        // symmetrised in place (`sym_eigh_owned`: two `fan_in²` buffers fewer than `sym_eigh`).
        let (a_values, a_vectors) = if !info.has_bias() {
            sym_eigh_owned(s.input_gram.clone())?
        } else if bias == KronBias::Separate {
            // The separate bias block [A 0; 0 rows] as the eigenpairs of A and `(rows, e_bias)`,
            // exactly: each eigenvector then lies in the weight or in the bias coordinates, so a
            // prior precision per parameter tensor stays diagonal in the Kronecker basis.
            let (v, q) = sym_eigh_owned(s.input_gram.clone())?;
            let mut values = DVector::zeros(fi + 1);
            values.rows_mut(0, fi).copy_from(&v);
            values[fi] = s.input_rows as f64;
            let mut vectors = DMatrix::zeros(fi + 1, fi + 1);
            vectors.view_mut((0, 0), (fi, fi)).copy_from(&q);
            vectors[(fi, fi)] = 1.0;
            (values, vectors)
        } else {
            // Ã = [A  Σa; Σaᵀ  rows] for ã = [a; 1].
            let mut a = DMatrix::zeros(fi + 1, fi + 1);
            a.view_mut((0, 0), (fi, fi)).copy_from(&s.input_gram);
            for j in 0..fi {
                a[(j, fi)] = s.input_sum[j];
                a[(fi, j)] = s.input_sum[j];
            }
            a[(fi, fi)] = s.input_rows as f64;
            sym_eigh_owned(a)?
        };
        let (g_values, g_vectors) = sym_eigh_owned(g)?;
        layers.push(KronLayer {
            a_values: a_values.map(|v| v.max(0.0)),
            a_vectors,
            g_values: g_values.map(|v| v.max(0.0)),
            g_vectors,
            fitted: None,
        });
    }
    let indices = sums.infos.iter().flat_map(|i| i.kron_order()).collect();
    let network_layers = if sums.all_layers { Vec::new() } else { sums.ids.clone() };
    Ok((KronCurvature { layers, network_layers }, indices))
}

/// KFAC (Martens & Grosse 2015) and, for convolutions, KFC (Grosse & Martens 2016):
/// `A = Σᵢ Σ_t ã ãᵀ`, `G = Σᵢ Σ_c Σ_t δ δᵀ / (n·T)`, so that `G ⊗ A` is exact for one example at
/// one position. With `ekfac`, a second pass re-fits the eigenvalues in the Kronecker eigenbasis:
/// `E_{rj} = Σᵢ Σ_c ((Q_Gᵀ gᵢ_c Q_A)_{rj})²` with `gᵢ_c = Σ_t δ ãᵀ` (George et al. 2018).
pub(crate) fn kron<N: Network>(
    net: &N,
    data: &Data,
    ekfac: bool,
    weights: &Weights,
    bias: KronBias,
) -> Result<(KronCurvature, Vec<usize>)> {
    let structure = if ekfac { "ekfac" } else { "kfac" };
    let mut sums = kron_sums(net, data, weights, structure)?;
    if data.shard.is_some() {
        let summed = data.all_reduce(Ok(DVector::from_vec(sums.to_flat())), sums.flat_len())?;
        sums.set_flat(summed.as_slice())?;
    }
    let (mut curvature, indices) = kron_from_sums(&sums, data.n_total(), bias)?;
    let infos = &sums.infos;
    let last_only = matches!(weights, Weights::LastLayer);
    let stats_of = |start: usize, len: usize| kron_statistics(net, data, last_only, start, len);
    if ekfac {
        let k = data.k();
        let mut fitted: Vec<DMatrix<f64>> =
            infos.iter().map(|i| DMatrix::zeros(i.fan_out, i.width())).collect();
        let layers_ref = &curvature.layers;
        let fit_of = |start: usize, len: usize| -> Result<Vec<DMatrix<f64>>> {
            let stats = stats_of(start, len)?;
            Ok(stats
                .iter()
                .zip(infos)
                .zip(layers_ref)
                .map(|((st, info), layer)| {
                    if info.positions() == 1 {
                        // (Q_Gᵀ δ)_r² (Q_Aᵀ ã)_j² summed over (i, c): one GEMM.
                        let va = (st.augmented_inputs(info.has_bias()) * &layer.a_vectors).map(|v| v * v);
                        let va_rep = DMatrix::from_fn(len * k, info.width(), |row, j| va[(row / k, j)]);
                        let ug = (&st.output_grads * &layer.g_vectors).map(|v| v * v);
                        ug.transpose() * va_rep
                    } else {
                        let mut acc = DMatrix::zeros(info.fan_out, info.width());
                        for i in 0..len {
                            for c in 0..k {
                                let proj = layer.g_vectors.transpose()
                                    * st.example_gradient(i, c, info.has_bias())
                                    * &layer.a_vectors;
                                acc += proj.map(|v| v * v);
                            }
                        }
                        acc
                    }
                })
                .collect())
        };
        let pass = for_chunks(data, fit_of, |_, _, parts| {
            for (f, part) in fitted.iter_mut().zip(parts) {
                *f += part;
            }
            Ok(())
        });
        if data.shard.is_some() {
            // One all-reduce of every layer's re-fitted eigenvalues, concatenated.
            let len = fitted.iter().map(DMatrix::len).sum();
            let flat =
                pass.map(|()| DVector::from_iterator(len, fitted.iter().flat_map(|f| f.iter().copied())));
            let summed = data.all_reduce(flat, len)?;
            let mut at = 0;
            for f in &mut fitted {
                let l = f.len();
                f.copy_from_slice(&summed.as_slice()[at..at + l]);
                at += l;
            }
        } else {
            pass?;
        }
        for (layer, e) in curvature.layers.iter_mut().zip(fitted) {
            layer.fitted = Some(e);
        }
    }
    Ok((curvature, indices))
}

/// The last layer: `C = Σᵢ Hᵢ ⊗ φ̃ᵢφ̃ᵢᵀ` in the layer's `[W | b]` coordinates, `φ̃ = [φ; 1]`
/// the last-layer features, by one GEMM per output pair; then its eigendecomposition.
pub(crate) fn last_layer<N: Network>(
    net: &N,
    data: &Data,
    config: &LastLayerConfig,
) -> Result<(EigenCurvature, Vec<usize>, LayerInfo)> {
    let last = checked_last_layer(net, "last_layer")?;
    let dim = last.n_params();
    if dim > config.max_params {
        return Err(LaplaceError::TooLarge {
            structure: "last_layer",
            what: "last-layer parameters",
            size: dim,
            limit: config.max_params,
        });
    }
    let c = last_layer_gram(net, data, &last)?;
    let (values, vectors) = sym_eigh_owned(c)?;
    let indices = last.kron_order();
    Ok((
        EigenCurvature {
            label: "last_layer".into(),
            vectors,
            values: values.map(|v| v.max(0.0)),
            remainder: None,
        },
        indices,
        last,
    ))
}

/// The last layer's dense GGN `Σᵢ Hᵢ ⊗ φ̃ᵢφ̃ᵢᵀ` over `data` (in its `[W | b]` coordinates); the
/// layer `last` was checked by the caller.
pub(crate) fn last_layer_gram<N: Network>(net: &N, data: &Data, last: &LayerInfo) -> Result<DMatrix<f64>> {
    let q = net.output_dim();
    let dim = last.n_params();
    let h1 = last.fan_in + 1;
    let mut c = DMatrix::zeros(dim, dim);
    for (start, len) in data.chunks() {
        let phi = data.last_layer_features(net, start, len)?;
        let phit = DMatrix::from_fn(len, h1, |i, j| if j < last.fan_in { phi[(i, j)] } else { 1.0 });
        for o in 0..q {
            for o2 in o..q {
                let w: Vec<f64> = (0..len).map(|i| data.hessians[start + i][(o, o2)]).collect();
                if w.iter().all(|&v| v == 0.0) {
                    continue;
                }
                let weighted = DMatrix::from_fn(len, h1, |i, j| phit[(i, j)] * w[i]);
                let block = weighted.transpose() * &phit;
                c.view_mut((o * h1, o2 * h1), (h1, h1)).add_assign(&block);
                if o2 != o {
                    c.view_mut((o2 * h1, o * h1), (h1, h1)).add_assign(&block.transpose());
                }
            }
        }
    }
    Ok(c)
}

/// The diagonal of the last layer's GGN over `data` (in its `[W | b]` coordinates `o·(h+1) + c`):
/// `Σᵢ Hᵢ[o, o] φ̃ᵢ_c²`, one `(h+1) × m` by `m × d'` product per chunk — without the
/// `(d'(h+1))²` Gram [`last_layer_gram`] forms. The layer `last` was checked by the caller.
pub(crate) fn last_layer_diagonal<N: Network>(
    net: &N,
    data: &Data,
    last: &LayerInfo,
) -> Result<DVector<f64>> {
    let q = net.output_dim();
    let h1 = last.fan_in + 1;
    let mut sums = DMatrix::zeros(h1, q);
    for (start, len) in data.chunks() {
        let phi = data.last_layer_features(net, start, len)?;
        let squares =
            DMatrix::from_fn(len, h1, |i, j| if j < last.fan_in { phi[(i, j)] * phi[(i, j)] } else { 1.0 });
        let weights = DMatrix::from_fn(len, q, |i, o| data.hessians[start + i][(o, o)]);
        sums += squares.transpose() * weights;
    }
    Ok(DVector::from_fn(q * h1, |k, _| sums[(k % h1, k / h1)].max(0.0)))
}

/// The last layer of `net`, checked to be a dense layer with a bias onto the outputs.
pub(crate) fn checked_last_layer<N: Network>(net: &N, structure: &'static str) -> Result<LayerInfo> {
    let infos = require_layers(net, structure)?;
    let last = infos.last().expect("non-empty").clone();
    let q = net.output_dim();
    if last.kind != LayerKind::Dense || last.fan_out != q || !last.has_bias() {
        return Err(LaplaceError::Unsupported {
            structure,
            reason: format!(
                "the last layer {} is not a dense layer with a bias onto the {q} outputs",
                last.name
            ),
        });
    }
    Ok(last)
}

/// Subnetwork parameter indices: non-empty, strictly increasing and below the `p` parameters.
pub(crate) fn check_subnetwork(idx: &[usize], p: usize) -> Result<()> {
    if idx.is_empty() {
        return Err(LaplaceError::Input(InputError::Empty { what: "subnetwork parameter indices" }));
    }
    if let Some(w) = idx.windows(2).find(|w| w[0] >= w[1]) {
        return Err(LaplaceError::Input(InputError::Invalid {
            what: "subnetwork parameter indices",
            reason: format!("must be strictly increasing ({} then {})", w[0], w[1]),
        }));
    }
    if idx[idx.len() - 1] >= p {
        return Err(LaplaceError::Input(InputError::Invalid {
            what: "subnetwork parameter indices",
            reason: format!("index {} is not below the {p} parameters", idx[idx.len() - 1]),
        }));
    }
    Ok(())
}

/// The dense GGN `RᵀR` restricted to the flat parameter indices `idx` (every parameter when
/// `None`), accumulated over `data`'s chunks: what the full and subnetwork structures sum when
/// the data arrive in parts ([`crate::LaplaceSums`]).
pub(crate) fn dense_gram<N: Network>(net: &N, data: &Data, idx: Option<&[usize]>) -> Result<DMatrix<f64>> {
    let dim = idx.map_or(net.n_params(), |i| i.len());
    let mut gram = DMatrix::zeros(dim, dim);
    for_chunks(
        data,
        |s, l| whitened_jacobian(net, data, s, l),
        |_, _, r| {
            match idx {
                None => gram.gemm(1.0, &r.transpose(), &r, 1.0),
                Some(i) => {
                    let rb = r.select_columns(i);
                    gram.gemm(1.0, &rb.transpose(), &rb, 1.0)
                }
            }
            Ok(())
        },
    )?;
    Ok(gram)
}

use std::ops::AddAssign;

/// Top-`k` eigenpairs of the GGN by Lanczos with full reorthogonalisation on the matrix-free
/// product `v ↦ Σᵢ J(xᵢ)ᵀ Hᵢ J(xᵢ) v` (one forward and one reverse pass per chunk). The Krylov
/// space starts at `1.5k + 10` vectors and grows (extending the decomposition, so each growth
/// costs only its new products: by 5 vectors, or a tenth once it holds more than 50) until
/// every kept Ritz pair has a relative residual below `tol`, or the range of the GGN is
/// exhausted, so the kept pairs are eigenpairs, not just Ritz pairs. With `max_basis` the space
/// never holds more than that many vectors: thick-restart Lanczos restarts from its best Ritz
/// vectors instead of growing (more products, bounded memory; `docs/PERFORMANCE.md`).
pub(crate) fn low_rank<N: Network>(
    net: &N,
    data: &Data,
    config: &LowRankConfig,
    report: &mut FitReport,
) -> Result<EigenCurvature> {
    if config.rank == 0 {
        return Err(LaplaceError::Input(InputError::Invalid {
            what: "low-rank rank",
            reason: "must be ≥ 1".into(),
        }));
    }
    crate::error::ensure_positive("low-rank tolerance", config.tol)?;
    let p = net.n_params();
    let k = config.rank.min(p);
    let cache = CachedGgn::build(net, data, config.statistics_cache_bytes)?;
    report.cached_statistics = cache.is_some();
    let failure = std::sync::Mutex::new(None);
    let streamed = |v: &DVector<f64>| -> Result<DVector<f64>> {
        let mut out = DVector::zeros(p);
        for_chunks_of(
            data,
            data.product_chunk,
            |s, l| Ok(net.ggn_vector_product(&data.rows(s, l), &data.hessians[s..s + l], v)?),
            |_, _, g| {
                out += g;
                Ok(())
            },
        )?;
        Ok(out)
    };
    let op = FnOperator::new(p, |v: &DVector<f64>| {
        // After a failure no product is formed (nor, sharded, reduced): the Lanczos run ends
        // on NaN and the failure is returned.
        if failure.lock().expect("not poisoned").is_some() {
            return DVector::from_element(p, f64::NAN);
        }
        let result = match &cache {
            Some(c) => c.product(data, v),
            None => streamed(v),
        };
        // Sharded: this process's product summed with every other's (one all-reduce of `p`).
        match data.all_reduce(result, p) {
            Ok(out) => out,
            Err(e) => {
                *failure.lock().expect("not poisoned") = Some(e);
                DVector::from_element(p, f64::NAN)
            }
        }
    });
    let (kept, theta, v) = match config.max_basis {
        Some(max_basis) => {
            let cfg = ThickRestartConfig {
                k,
                max_basis,
                tol: config.tol,
                // Only the pairs that are kept must converge.
                zero_tol: ZERO_RITZ,
                // The iteration limit counts products here (restarts cost none).
                max_products: config.max_iterations,
                breakdown_tol: 1e-13,
                start: StartVector::Random(config.seed),
                project_start: true,
            };
            let top = thick_restart_lanczos(&op, &cfg);
            if let Some(e) = failure.lock().expect("not poisoned").take() {
                return Err(e);
            }
            let top = top?;
            let kept = nonzero_pairs(&top.values, k);
            report.lanczos_iterations = top.info.products - 1;
            report.max_ritz_residual = (0..kept).map(|j| top.residuals[j]).fold(0.0, f64::max);
            report.rank = kept;
            let vectors = top.vectors.remove_columns(kept, top.values.len() - kept);
            (kept, top.values.rows(0, kept).into_owned(), vectors)
        }
        None => growing_lanczos(&op, &failure, p, k, config, report)?,
    };
    let s = theta.map(|x| x.max(0.0));
    let remainder = if config.diag_remainder {
        let d = data.all_reduce(diagonal(net, data), p)?;
        let mut vs2 = DVector::zeros(p);
        for j in 0..kept {
            for i in 0..p {
                vs2[i] += s[j] * v[(i, j)] * v[(i, j)];
            }
        }
        Some((d - vs2).map(|x| x.max(0.0)))
    } else {
        None
    };
    Ok(EigenCurvature { label: "low_rank".into(), vectors: v, values: s, remainder })
}

/// Ritz values at or below `ZERO_RITZ·θ_max` are the GGN's numerical null space.
const ZERO_RITZ: f64 = 1e-12;

/// How many of the top `k` Ritz values (descending) are numerically non-zero, at least one: the
/// pairs a low-rank fit keeps (rank ≤ numerical rank).
fn nonzero_pairs(theta: &DVector<f64>, k: usize) -> usize {
    let cutoff = ZERO_RITZ * theta[0].abs();
    (0..k.min(theta.len())).filter(|&j| theta[j] > cutoff).count().max(1)
}

/// Plain Lanczos whose Krylov space grows until the kept pairs converge: returns the number
/// kept, their Ritz values and vectors.
fn growing_lanczos(
    op: &dyn fspace_linalg::LinearOperator,
    failure: &std::sync::Mutex<Option<LaplaceError>>,
    p: usize,
    k: usize,
    config: &LowRankConfig,
    report: &mut FitReport,
) -> Result<(usize, DVector<f64>, DMatrix<f64>)> {
    let mut m = (k + k / 2 + 10).min(p).min(config.max_iterations.max(k));
    let lanczos_config = |m| LanczosConfig {
        max_rank: m,
        start: StartVector::Random(config.seed),
        check_symmetry: false,
        pivot_tol: 1e-13,
        breakdown_tol: 1e-13,
        // The GGN is PSD by construction, but a float32 network's products are symmetric only
        // to ≈ 1e-7, so its null space's Ritz values can fall below the default −1e-12·θ_max
        // (docs/PERFORMANCE.md, the lowrank row). Such pairs are dropped below with the zero
        // ones.
        negative_tol: 1e-6,
        // A GGN's spectrum spans many orders of magnitude: a vanishing pivot means Lanczos has
        // met its bottom, not that the top `k` pairs have converged; their residuals decide.
        // Exhaustion of the range still ends the iteration (β vanishes).
        stop_at_singular_pivot: false,
        ..Default::default()
    };
    // The Krylov space grows by extending the decomposition: the products already made are kept.
    let mut previous: Option<fspace_linalg::LanczosDecomposition> = None;
    loop {
        let cfg = lanczos_config(m);
        let dec = match previous.take() {
            None => lanczos(op, &cfg),
            Some(dec) => dec.extend(op, &cfg),
        };
        if let Some(e) = failure.lock().expect("not poisoned").take() {
            return Err(e);
        }
        let dec = dec?;
        let theta = dec.ritz_values().clone();
        let res = dec.ritz_residuals();
        let exhausted = dec.info().stop != StopReason::MaxRank;
        let kept = nonzero_pairs(&theta, k);
        let worst = (0..kept).map(|j| res[j]).fold(0.0, f64::max);
        let converged = exhausted || worst <= config.tol;
        if converged || m >= config.max_iterations.min(p) {
            if !converged {
                return Err(LaplaceError::Linalg(fspace_linalg::LinalgError::NoConvergence {
                    method: "low-rank Lanczos (top-k Ritz residuals)",
                    iterations: m,
                    residual: worst,
                }));
            }
            report.lanczos_iterations = dec.info().iterations;
            report.max_ritz_residual = worst;
            report.rank = kept;
            // Only the kept Ritz vectors, formed in the Krylov basis' storage.
            let (theta, v) = dec.into_top_ritz(kept);
            return Ok((kept, theta, v));
        }
        // Extending costs only the new products, so the residuals are checked often: every 5
        // steps, or every tenth of the space once it is larger (the check is an eigensolve of
        // the m × m tridiagonal). The space, p × m doubles, is held only as far as it is needed.
        m = (m + (m / 10).max(5)).min(config.max_iterations).min(p);
        previous = Some(dec);
    }
}

/// Builds the structure over the chosen weights; returns it with the flat index of each of its
/// coordinates.
/// `lambda0` and `t` matter only to `Sampled`, whose draws are made at one `(T, λ)` (EM's start).
#[allow(clippy::too_many_arguments)]
pub(crate) fn build<N: Network>(
    net: &N,
    data: &Data,
    structure: &Structure,
    weights: &Weights,
    bias: KronBias,
    lambda0: f64,
    t: f64,
    report: &mut FitReport,
) -> Result<(Curvature, Vec<usize>)> {
    crate::structure::support(structure, weights)?;
    let all = || (0..net.n_params()).collect::<Vec<_>>();
    if let Weights::Subnetwork(idx) = weights {
        check_subnetwork(idx, net.n_params())?;
        return match structure {
            Structure::Full(c) => {
                if idx.len() > c.max_params {
                    return Err(LaplaceError::TooLarge {
                        structure: "full",
                        what: "subnetwork parameters",
                        size: idx.len(),
                        limit: c.max_params,
                    });
                }
                let mut e = factor_blocks(net, data, std::slice::from_ref(idx))?.pop().expect("one block");
                e.label = "subnetwork".into();
                Ok((Curvature::Eigen(e), idx.clone()))
            }
            Structure::Diag => {
                // laplace-torch's DiagSubnetLaplace: the diagonal of the subnetwork's GGN block,
                // read off the dense block (so bounded as the full structure's).
                let limit = crate::structure::FullConfig::default().max_params;
                if idx.len() > limit {
                    return Err(LaplaceError::TooLarge {
                        structure: "diag",
                        what: "subnetwork parameters (their dense GGN block is formed)",
                        size: idx.len(),
                        limit,
                    });
                }
                let e = factor_blocks(net, data, std::slice::from_ref(idx))?.pop().expect("one block");
                let diag = e.to_dense().diagonal().map(|v| v.max(0.0));
                Ok((Curvature::Diag(DiagCurvature { diag }), idx.clone()))
            }
            // Unreachable: `support` above refused every pair SUPPORT does not list.
            other => Err(LaplaceError::Unsupported {
                structure: other.name(),
                reason: "not over a subnetwork".into(),
            }),
        };
    }
    if let Weights::LastLayer = weights {
        return match structure {
            Structure::Kfac | Structure::Ekfac => {
                let (k, idx) = kron(net, data, matches!(structure, Structure::Ekfac), weights, bias)?;
                Ok((Curvature::Kron(k), idx))
            }
            Structure::Full(c) => {
                let (e, idx, _) = last_layer(net, data, &LastLayerConfig { max_params: c.max_params })?;
                Ok((Curvature::Eigen(e), idx))
            }
            Structure::LastLayer(c) => {
                let (e, idx, _) = last_layer(net, data, c)?;
                Ok((Curvature::Eigen(e), idx))
            }
            Structure::Diag => {
                // The diagonal of the last layer's GGN (laplace-torch's DiagLLLaplace), summed
                // directly: `d'(h + 1)` doubles.
                let last = checked_last_layer(net, "diag")?;
                let diag = last_layer_diagonal(net, data, &last)?;
                Ok((Curvature::Diag(DiagCurvature { diag }), last.kron_order()))
            }
            // Unreachable: `support` above refused every pair SUPPORT does not list.
            other => Err(LaplaceError::Unsupported {
                structure: other.name(),
                reason: "not over the last layer".into(),
            }),
        };
    }
    Ok(match structure {
        Structure::Full(c) => (Curvature::Eigen(full(net, data, c)?), all()),
        Structure::Diag => (Curvature::Diag(DiagCurvature { diag: diagonal(net, data)? }), all()),
        Structure::BlockDiag(c) => {
            let (b, idx) = block_diag(net, data, c)?;
            (Curvature::BlockDiag(b), idx)
        }
        Structure::Kfac | Structure::Ekfac => {
            let (k, idx) = kron(net, data, matches!(structure, Structure::Ekfac), weights, bias)?;
            (Curvature::Kron(k), idx)
        }
        Structure::LastLayer(c) => {
            let (e, idx, _) = last_layer(net, data, c)?;
            (Curvature::Eigen(e), idx)
        }
        Structure::LowRank(c) => (Curvature::Eigen(low_rank(net, data, c, report)?), all()),
        Structure::Sampled(c) => {
            validate(c)?;
            let precond = match c.preconditioner {
                SampledPreconditioner::Kfac => {
                    let (k, idx) = kron(net, data, false, &Weights::All, KronBias::Folded)?;
                    Precond::Kron(k, idx)
                }
                SampledPreconditioner::Diag => {
                    Precond::Diag(data.all_reduce(diagonal(net, data), net.n_params())?)
                }
                SampledPreconditioner::LowRank(rank) => {
                    // Any Ritz pairs precondition: one Lanczos run, no residual target.
                    let cfg = LowRankConfig {
                        rank,
                        tol: f64::MAX,
                        statistics_cache_bytes: c.statistics_cache_bytes,
                        seed: c.seed,
                        ..Default::default()
                    };
                    let e = low_rank(net, data, &cfg, report)?;
                    Precond::LowRank { vt: e.vectors.transpose(), v: e.vectors, s: e.values }
                }
                SampledPreconditioner::Identity => Precond::Identity,
            };
            let run = sampled(net, data, c, precond, lambda0, t)?;
            report.cached_statistics = run.cached;
            report.em_prior_precisions = run.em_prior_precisions;
            report.cg_products = run.cg_products;
            report.em_recorded_seconds = run.recorded_seconds;
            (Curvature::Samples(run.curvature), all())
        }
    })
}
