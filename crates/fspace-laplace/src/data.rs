//! The per-point data every curvature structure is built from, and the chunked parallel map
//! over it.

use nalgebra::DMatrix;

use crate::error::Result;

/// The data a structure is built from.
pub(crate) struct Data<'a> {
    pub x: &'a DMatrix<f64>,
    pub hessians: Vec<DMatrix<f64>>,
    pub factors: Vec<DMatrix<f64>>,
    pub chunk: usize,
}

impl Data<'_> {
    pub(crate) fn chunks(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        let n = self.x.nrows();
        (0..n).step_by(self.chunk).map(move |s| (s, self.chunk.min(n - s)))
    }
    pub(crate) fn rows(&self, start: usize, len: usize) -> DMatrix<f64> {
        self.x.rows(start, len).into_owned()
    }
    pub(crate) fn k(&self) -> usize {
        self.factors[0].ncols()
    }
}

/// Maps every chunk (in parallel, `threads` chunks at a time so memory stays bounded) and
/// folds the results in chunk order, so sums are bit-identical run to run.
pub(crate) fn for_chunks<T: Send>(
    data: &Data,
    map: impl Fn(usize, usize) -> Result<T> + Sync,
    mut fold: impl FnMut(usize, usize, T) -> Result<()>,
) -> Result<()> {
    use rayon::prelude::*;
    let chunks: Vec<(usize, usize)> = data.chunks().collect();
    let width = rayon::current_num_threads().max(1);
    for group in chunks.chunks(width) {
        let parts: Vec<Result<T>> = group.par_iter().map(|&(s, l)| map(s, l)).collect();
        for (&(s, l), part) in group.iter().zip(parts) {
            fold(s, l, part?)?;
        }
    }
    Ok(())
}
