//! The per-point data every curvature structure is built from, and the chunked parallel map
//! over it.

use fspace_core::Likelihood;
use nalgebra::{DMatrix, DVector};
use serde::{Deserialize, Serialize};

use crate::error::Result;

/// The data a structure is built from.
pub(crate) struct Data<'a> {
    pub x: &'a DMatrix<f64>,
    pub hessians: Vec<DMatrix<f64>>,
    pub factors: Vec<DMatrix<f64>>,
    pub chunk: usize,
    /// Points per chunk of the streamed matrix-free GGN products (`chunk_points` as configured,
    /// not capped by the layer statistics' size: a product holds no statistics, and fewer,
    /// larger calls are cheaper on a torch model, `docs/PERFORMANCE.md`).
    pub product_chunk: usize,
    /// Told the number of points folded so far after every chunk of a pass over the data
    /// ([`for_chunks`]); each pass counts from the start again.
    pub progress: Option<&'a (dyn Fn(usize) + Sync + 'a)>,
    /// A sharded fit's all-reduce ([`crate::fit_sharded`]): `x` is this process's shard of the
    /// data, and every sum over the data goes through [`Data::all_reduce`].
    pub shard: Option<&'a (dyn AllReduce + 'a)>,
    /// The last layer's inputs `φ(x)` (`n × fan_in`), kept from the fit's first pass when the
    /// structure is built from them ([`crate::fit::first_pass`]); `None`: asked of the network
    /// chunk by chunk.
    pub features: Option<DMatrix<f64>>,
}

/// The sum over every process of a sharded fit (a trait object, so that [`Data`] stays
/// covariant in its lifetime).
pub(crate) trait AllReduce: Sync {
    /// The points of every process together.
    fn n_total(&self) -> usize;
    /// The global index of this process's first point (the points of the processes before it).
    fn offset(&self) -> usize;
    /// The sum of every process's `part`, or an error where one of them said `failed`.
    fn sum(&self, part: DVector<f64>, failed: bool) -> Result<DVector<f64>>;
}

/// [`AllReduce`] through the engine's `reduce(part, failed)`.
pub(crate) struct ShardSum<'a> {
    pub n_total: usize,
    pub offset: usize,
    pub reduce: std::sync::Mutex<&'a mut ReduceFn<'a>>,
}

/// The engine's all-reduce of a sharded fit: `reduce(part, failed)`.
pub(crate) type ReduceFn<'a> = dyn FnMut(DVector<f64>, bool) -> Result<DVector<f64>> + Send + 'a;

impl AllReduce for ShardSum<'_> {
    fn n_total(&self) -> usize {
        self.n_total
    }
    fn offset(&self) -> usize {
        self.offset
    }
    fn sum(&self, part: DVector<f64>, failed: bool) -> Result<DVector<f64>> {
        // A reduce step that panicked poisons the lock: the fit cannot go on either way.
        let mut reduce = self.reduce.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        (*reduce)(part, failed)
    }
}

impl Data<'_> {
    pub(crate) fn chunks(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        self.chunks_of(self.chunk)
    }
    pub(crate) fn chunks_of(&self, chunk: usize) -> impl Iterator<Item = (usize, usize)> + '_ {
        let n = self.x.nrows();
        let chunk = chunk.max(1);
        (0..n).step_by(chunk).map(move |s| (s, chunk.min(n - s)))
    }
    pub(crate) fn rows(&self, start: usize, len: usize) -> DMatrix<f64> {
        self.x.rows(start, len).into_owned()
    }
    pub(crate) fn k(&self) -> usize {
        self.factors[0].ncols()
    }
    /// The last layer's inputs at the `len` points from `start`: kept from the first pass, or
    /// asked of the network.
    pub(crate) fn last_layer_features<N: fspace_nn::Network>(
        &self,
        net: &N,
        start: usize,
        len: usize,
    ) -> Result<DMatrix<f64>> {
        match &self.features {
            Some(phi) => Ok(phi.rows(start, len).into_owned()),
            None => Ok(net.last_layer_features(&self.rows(start, len))?),
        }
    }
    /// The points of every process together (this process's when not sharded).
    pub(crate) fn n_total(&self) -> usize {
        self.shard.map_or(self.x.nrows(), |s| s.n_total())
    }
    /// The global index of this process's first point (0 when not sharded).
    pub(crate) fn offset(&self) -> usize {
        self.shard.map_or(0, |s| s.offset())
    }
    /// A sum over the data, summed over every process (the sum itself when not sharded). A
    /// local failure (`part` an error, `len` the sum's length) is sent to the others with the
    /// failure flag, so that none of them waits forever, and returned.
    pub(crate) fn all_reduce(&self, part: Result<DVector<f64>>, len: usize) -> Result<DVector<f64>> {
        let Some(shard) = self.shard else { return part };
        match part {
            Ok(part) => shard.sum(part, false),
            Err(e) => {
                // The others hear of the failure; this process's own error is the one reported.
                let _ = shard.sum(DVector::zeros(len), true);
                Err(e)
            }
        }
    }
}

/// Maps every chunk (in parallel, `threads` chunks at a time so memory stays bounded) and
/// folds the results in chunk order, so sums are bit-identical run to run. After each fold the
/// data's progress hook hears how many points this pass has folded.
pub(crate) fn for_chunks<T: Send>(
    data: &Data,
    map: impl Fn(usize, usize) -> Result<T> + Sync,
    fold: impl FnMut(usize, usize, T) -> Result<()>,
) -> Result<()> {
    for_chunks_of(data, data.chunk, map, fold)
}

/// [`for_chunks`] with `chunk` points per chunk.
pub(crate) fn for_chunks_of<T: Send>(
    data: &Data,
    chunk: usize,
    map: impl Fn(usize, usize) -> Result<T> + Sync,
    mut fold: impl FnMut(usize, usize, T) -> Result<()>,
) -> Result<()> {
    use rayon::prelude::*;
    let chunks: Vec<(usize, usize)> = data.chunks_of(chunk).collect();
    let width = rayon::current_num_threads().max(1);
    for group in chunks.chunks(width) {
        fspace_input::interrupt::check("the Laplace pass over the data")?;
        let parts: Vec<Result<T>> = group.par_iter().map(|&(s, l)| map(s, l)).collect();
        for (&(s, l), part) in group.iter().zip(parts) {
            fold(s, l, part?)?;
            if let Some(progress) = data.progress {
                progress(s + l);
            }
        }
    }
    Ok(())
}

/// What the curvature `C` of every structure is built from.
///
/// Both are `Σᵢ J(xᵢ)ᵀ Mᵢ J(xᵢ)` with a PSD output-space block `Mᵢ` per point, so every
/// structure (full, diagonal, block-diagonal, KFAC, EKFAC, last layer, low rank) takes either.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum CurvatureSource {
    /// The generalised Gauss-Newton: `Mᵢ = Hᵢ = ∂²(−log p(yᵢ | f))/∂f²` at `f(xᵢ; w*)` (PSD
    /// for every likelihood here; laplace-torch's default).
    #[default]
    Ggn,
    /// The empirical Fisher `Σᵢ ∇_w ℓᵢ ∇_w ℓᵢᵀ`: `Mᵢ = gᵢgᵢᵀ` with `gᵢ = ∂(−log p(yᵢ | f))/∂f`
    /// at the observed label (rank one per point). The Generalized Laplace paper's App. A.1:
    /// "the expectation of the squared gradients", KFAC's `G = E[ggᵀ]` of the backpropagated
    /// gradients.
    EmpiricalFisher,
}

/// Per-point square roots `Lᵢ` (`d' × k`, `LᵢLᵢᵀ = Hᵢ`) of PSD Hessian blocks; `k = d'`
/// (`k = 1` for scalar outputs). Eigenvalues below zero (rounding) are clamped. The
/// eigendecomposition is fspace-linalg's (faer's): nalgebra 0.33's `symmetric_eigen` returned
/// orthonormal but wrong eigenpairs for some near-uniform softmax Hessians (`LLᵀ` off `H` by
/// 6.6e-2 on a 10-class MLP), which skewed KFAC's output factor
/// (`tests/laplace.rs`, `softmax_hessian_factors_reproduce_the_hessians`).
pub(crate) fn hessian_factors(hessians: &[DMatrix<f64>]) -> Result<Vec<DMatrix<f64>>> {
    hessians
        .iter()
        .map(|h| {
            if h.nrows() == 1 {
                return Ok(DMatrix::from_element(1, 1, h[(0, 0)].max(0.0).sqrt()));
            }
            let (values, mut l) = fspace_linalg::sym_eigh(&((h + h.transpose()) * 0.5))?;
            for (j, mut col) in l.column_iter_mut().enumerate() {
                col *= values[j].max(0.0).sqrt();
            }
            Ok(l)
        })
        .collect()
}

/// The per-point output-space blocks `Mᵢ` of `source` at `f(X; w*)` and their square roots.
pub(crate) fn data_for<'a>(
    x: &'a DMatrix<f64>,
    f: &DMatrix<f64>,
    y: &DVector<f64>,
    lik: &dyn Likelihood,
    chunk: usize,
    source: CurvatureSource,
) -> Result<Data<'a>> {
    let (hessians, factors) = match source {
        CurvatureSource::Ggn => {
            let hessians = lik.nll_hessian(f, y)?;
            let factors = hessian_factors(&hessians)?;
            (hessians, factors)
        }
        CurvatureSource::EmpiricalFisher => {
            // Row i of the gradient is gᵢᵀ; its square root is gᵢ itself (k = 1).
            let grad = lik.nll_grad(f, y)?;
            let factors: Vec<DMatrix<f64>> = grad
                .row_iter()
                .map(|g| DMatrix::from_column_slice(g.len(), 1, g.transpose().as_slice()))
                .collect();
            let hessians = factors.iter().map(|g| g * g.transpose()).collect();
            (hessians, factors)
        }
    };
    Ok(Data {
        x,
        hessians,
        factors,
        chunk,
        product_chunk: chunk,
        progress: None,
        shard: None,
        features: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The softmax Hessian `diag(p) − ppᵀ` at logits on which nalgebra 0.33's
    /// `symmetric_eigen` returned a factor 6.6e-2 off (found on a 20-30-30-10 tanh MLP): the
    /// factors reproduce it, and keep (to rounding) its null vector `1`.
    #[test]
    #[allow(clippy::excessive_precision)] // the logits as printed with 17 digits: these exact bits
    fn softmax_hessian_factors_reproduce_the_hessians() {
        let logits = [
            -8.57150033405157386e-02,
            1.34122773440324861e-01,
            -3.95452081588568150e-03,
            1.59239466678930991e-01,
            -1.99170411918241308e-01,
            2.00093703747225016e-02,
            -5.62877084888412094e-03,
            4.69175574236582599e-02,
            -9.33833040845309936e-02,
            -9.57413032152359122e-02,
        ];
        let p = DVector::from_vec(fspace_core::softmax(&logits));
        let h = DMatrix::from_diagonal(&p) - &p * p.transpose();
        let l = hessian_factors(std::slice::from_ref(&h)).unwrap().pop().unwrap();
        let err = (&l * l.transpose() - &h).abs().max();
        assert!(err < 1e-14, "LLᵀ − H = {err:e}");
        // Lᵀ1 is √(rounding) small: the null eigenvalue ≈ 1e-17 enters as its square root.
        let null = l.transpose() * DVector::from_element(10, 1.0);
        assert!(null.abs().max() < 1e-7, "Lᵀ1 = {:e}", null.abs().max());
    }
}
