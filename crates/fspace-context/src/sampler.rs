//! The [`Sampler`] contract and the simple samplers: uniform, grid, Latin hypercube, dataset
//! rows and the uniform-plus-batch mixture.

use fspace_input::InputError;
use nalgebra::DMatrix;
use rand::seq::index::sample as sample_indices;
use rand::{Rng, RngCore};

use crate::bbox::BoundingBox;
use crate::error::{ContextError, Result};

/// Draws `n` context points as the rows of an `n × d` matrix.
///
/// Randomised samplers take their randomness from `rng` only, so a seeded RNG makes every draw
/// reproducible. Deterministic samplers (grid, unscrambled low-discrepancy sequences) ignore it.
pub trait Sampler: Send + Sync {
    /// The dimension `d` of the points.
    fn dim(&self) -> usize;
    /// Draws `n ≥ 1` points.
    fn sample(&self, n: usize, rng: &mut dyn RngCore) -> Result<DMatrix<f64>>;
}

pub(crate) fn nonzero(n: usize) -> Result<()> {
    if n == 0 {
        Err(ContextError::ZeroSamples)
    } else {
        Ok(())
    }
}

/// i.i.d. uniform points in a box.
#[derive(Debug, Clone, PartialEq)]
pub struct UniformSampler {
    bbox: BoundingBox,
}

impl UniformSampler {
    /// Uniform on `bbox`.
    pub fn new(bbox: BoundingBox) -> Self {
        Self { bbox }
    }
    /// The box.
    pub fn bbox(&self) -> &BoundingBox {
        &self.bbox
    }
}

impl Sampler for UniformSampler {
    fn dim(&self) -> usize {
        self.bbox.dim()
    }
    fn sample(&self, n: usize, rng: &mut dyn RngCore) -> Result<DMatrix<f64>> {
        nonzero(n)?;
        let u = DMatrix::from_fn(n, self.dim(), |_, _| rng.gen::<f64>());
        Ok(self.bbox.from_unit(&u))
    }
}

/// A regular grid including the box's corners (`linspace` per dimension, first dimension
/// varying slowest).
///
/// Either fixed per-dimension counts (`sample(n)` then requires `n` = their product), or, with
/// no counts, `n` must be a perfect `d`-th power `m^d` and `m` points per side are used.
#[derive(Debug, Clone, PartialEq)]
pub struct GridSampler {
    bbox: BoundingBox,
    counts: Option<Vec<usize>>,
}

impl GridSampler {
    /// A grid whose size is set by `n` in `sample` (`n = m^d`).
    pub fn new(bbox: BoundingBox) -> Self {
        Self { bbox, counts: None }
    }
    /// A grid with `counts[i] ≥ 1` points along dimension `i` (e.g. 12 × 8 = 96 points).
    pub fn with_counts(bbox: BoundingBox, counts: Vec<usize>) -> Result<Self> {
        if counts.len() != bbox.dim() {
            return Err(ContextError::Input(InputError::DimensionMismatch {
                what: "grid counts vs. box dimension",
                expected: bbox.dim(),
                found: counts.len(),
            }));
        }
        if counts.contains(&0) {
            return Err(ContextError::ZeroSamples);
        }
        Ok(Self { bbox, counts: Some(counts) })
    }
    /// A grid with `m` points per side (`m^d` points in all).
    pub fn per_side(bbox: BoundingBox, m: usize) -> Result<Self> {
        let d = bbox.dim();
        Self::with_counts(bbox, vec![m; d])
    }
    /// The number of points of a grid with fixed counts.
    pub fn size(&self) -> Option<usize> {
        self.counts.as_ref().map(|c| c.iter().product())
    }

    fn counts_for(&self, n: usize) -> Result<Vec<usize>> {
        let d = self.bbox.dim();
        match &self.counts {
            Some(c) => {
                let total: usize = c.iter().product();
                if total == n {
                    Ok(c.clone())
                } else {
                    Err(ContextError::Input(InputError::Invalid {
                        what: "n",
                        reason: format!("this grid has {c:?} = {total} points, {n} requested"),
                    }))
                }
            }
            None => {
                let m = (n as f64).powf(1.0 / d as f64).round() as usize;
                if m.checked_pow(d as u32) == Some(n) {
                    Ok(vec![m; d])
                } else {
                    Err(ContextError::Input(InputError::Invalid {
                        what: "n",
                        reason: format!(
                            "{n} is not a perfect {d}-th power: a grid in {d} dimensions has m^{d} points; \
                             choose such a count, or another design (Halton, Sobol, Latin hypercube)"
                        ),
                    }))
                }
            }
        }
    }
}

impl Sampler for GridSampler {
    fn dim(&self) -> usize {
        self.bbox.dim()
    }
    fn sample(&self, n: usize, _rng: &mut dyn RngCore) -> Result<DMatrix<f64>> {
        nonzero(n)?;
        let counts = self.counts_for(n)?;
        let d = counts.len();
        let mut u = DMatrix::zeros(n, d);
        for i in 0..n {
            let mut rem = i;
            for j in (0..d).rev() {
                let m = counts[j];
                let k = rem % m;
                rem /= m;
                u[(i, j)] = if m == 1 { 0.5 } else { k as f64 / (m - 1) as f64 };
            }
        }
        Ok(self.bbox.from_unit(&u))
    }
}

/// Latin hypercube sampling (McKay et al. 1979): each dimension's range is cut into `n` equal
/// strata and every stratum holds exactly one point.
#[derive(Debug, Clone, PartialEq)]
pub struct LatinHypercube {
    bbox: BoundingBox,
    centred: bool,
}

impl LatinHypercube {
    /// Points uniformly jittered inside their strata.
    pub fn new(bbox: BoundingBox) -> Self {
        Self { bbox, centred: false }
    }
    /// Points at the centres of their strata.
    pub fn centred(bbox: BoundingBox) -> Self {
        Self { bbox, centred: true }
    }
}

impl Sampler for LatinHypercube {
    fn dim(&self) -> usize {
        self.bbox.dim()
    }
    fn sample(&self, n: usize, rng: &mut dyn RngCore) -> Result<DMatrix<f64>> {
        nonzero(n)?;
        let d = self.dim();
        let mut u = DMatrix::zeros(n, d);
        for j in 0..d {
            let perm = sample_indices(rng, n, n).into_vec();
            for (i, stratum) in perm.into_iter().enumerate() {
                let offset = if self.centred { 0.5 } else { rng.gen::<f64>() };
                u[(i, j)] = (stratum as f64 + offset) / n as f64;
            }
        }
        Ok(self.bbox.from_unit(&u))
    }
}

/// Rows drawn uniformly from a fixed dataset (e.g. an unlabelled image set such as KMNIST).
#[derive(Debug, Clone, PartialEq)]
pub struct DatasetSampler {
    data: DMatrix<f64>,
    replace: bool,
}

impl DatasetSampler {
    /// Draws rows without replacement (`n` may not exceed the number of rows).
    pub fn new(data: DMatrix<f64>) -> Result<Self> {
        Self::build(data, false)
    }
    /// Draws rows with replacement.
    pub fn with_replacement(data: DMatrix<f64>) -> Result<Self> {
        Self::build(data, true)
    }
    fn build(data: DMatrix<f64>, replace: bool) -> Result<Self> {
        if data.nrows() == 0 || data.ncols() == 0 {
            return Err(ContextError::Input(InputError::Empty { what: "dataset for context points" }));
        }
        if data.iter().any(|v| !v.is_finite()) {
            return Err(ContextError::Input(InputError::NonFinite { what: "dataset for context points" }));
        }
        Ok(Self { data, replace })
    }
}

pub(crate) fn take_rows(
    data: &DMatrix<f64>,
    n: usize,
    replace: bool,
    rng: &mut dyn RngCore,
) -> Result<DMatrix<f64>> {
    let rows = data.nrows();
    let idx: Vec<usize> = if replace {
        (0..n).map(|_| rng.gen_range(0..rows)).collect()
    } else {
        if n > rows {
            return Err(ContextError::Input(InputError::Invalid {
                what: "n",
                reason: format!("{n} rows requested without replacement from {rows}"),
            }));
        }
        sample_indices(rng, rows, n).into_vec()
    };
    Ok(data.select_rows(&idx))
}

impl Sampler for DatasetSampler {
    fn dim(&self) -> usize {
        self.data.ncols()
    }
    fn sample(&self, n: usize, rng: &mut dyn RngCore) -> Result<DMatrix<f64>> {
        nonzero(n)?;
        take_rows(&self.data, n, self.replace, rng)
    }
}

/// FVI's measurement-point mixture (Sun et al. 2019): uniform points in a box plus rows of the
/// *current* training batch. `sample(n)` returns `n − b` uniform points followed by `b =
/// min(batch_rows, batch size, n)` rows drawn without replacement from the batch set with
/// [`set_batch`](Self::set_batch).
#[derive(Debug, Clone, PartialEq)]
pub struct MixtureSampler {
    uniform: UniformSampler,
    batch_rows: usize,
    batch: Option<DMatrix<f64>>,
}

impl MixtureSampler {
    /// Uniform on `bbox`, plus up to `batch_rows` rows of the current batch.
    pub fn new(bbox: BoundingBox, batch_rows: usize) -> Self {
        Self { uniform: UniformSampler::new(bbox), batch_rows, batch: None }
    }
    /// Sets the current training batch (its columns must match the box dimension).
    pub fn set_batch(&mut self, batch: DMatrix<f64>) -> Result<()> {
        if batch.ncols() != self.uniform.dim() {
            return Err(ContextError::Input(InputError::DimensionMismatch {
                what: "batch columns vs. box dimension",
                expected: self.uniform.dim(),
                found: batch.ncols(),
            }));
        }
        if batch.iter().any(|v| !v.is_finite()) {
            return Err(ContextError::Input(InputError::NonFinite { what: "training batch" }));
        }
        self.batch = Some(batch);
        Ok(())
    }
}

impl Sampler for MixtureSampler {
    fn dim(&self) -> usize {
        self.uniform.dim()
    }
    fn sample(&self, n: usize, rng: &mut dyn RngCore) -> Result<DMatrix<f64>> {
        nonzero(n)?;
        let batch = self.batch.as_ref().ok_or(ContextError::Input(InputError::Invalid {
            what: "batch",
            reason: "MixtureSampler::set_batch must be called before sampling".into(),
        }))?;
        let b = self.batch_rows.min(batch.nrows()).min(n);
        let mut out = DMatrix::zeros(n, self.dim());
        if n > b {
            out.rows_mut(0, n - b).copy_from(&self.uniform.sample(n - b, rng)?);
        }
        if b > 0 {
            out.rows_mut(n - b, b).copy_from(&take_rows(batch, b, false, rng)?);
        }
        Ok(out)
    }
}
