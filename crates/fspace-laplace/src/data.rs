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
/// (`k = 1` for scalar outputs). Eigenvalues below zero (rounding) are clamped.
pub(crate) fn hessian_factors(hessians: &[DMatrix<f64>]) -> Vec<DMatrix<f64>> {
    hessians
        .iter()
        .map(|h| {
            if h.nrows() == 1 {
                return DMatrix::from_element(1, 1, h[(0, 0)].max(0.0).sqrt());
            }
            let eig = ((h + h.transpose()) * 0.5).symmetric_eigen();
            let mut l = eig.eigenvectors.clone();
            for (j, mut col) in l.column_iter_mut().enumerate() {
                col *= eig.eigenvalues[j].max(0.0).sqrt();
            }
            l
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
            let factors = hessian_factors(&hessians);
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
    Ok(Data { x, hessians, factors, chunk, product_chunk: chunk, progress: None })
}
