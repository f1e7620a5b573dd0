//! Training-loop pieces that are not network-specific: seeded minibatches and Adam (the
//! schedule and early stopping are in [`crate::schedule`]).

use fspace_input::InputError;
use nalgebra::{DMatrix, DVector};
use rand::seq::SliceRandom;
use rand::RngCore;

use crate::error::{CoreError, Result};

/// Shuffled minibatches of row indices `0..n`, reshuffled each epoch from the caller's RNG.
#[derive(Debug, Clone)]
pub struct Minibatches {
    n: usize,
    batch_size: usize,
    drop_last: bool,
}

impl Minibatches {
    /// Batches of `batch_size ≥ 1` over `n ≥ 1` rows; with `drop_last` a final short batch is
    /// skipped (it would weigh its points more in an `n/b`-scaled loss).
    pub fn new(n: usize, batch_size: usize, drop_last: bool) -> Result<Self> {
        if n == 0 {
            return Err(CoreError::Input(InputError::Empty { what: "dataset for minibatches" }));
        }
        if batch_size == 0 {
            return Err(CoreError::Input(InputError::Invalid {
                what: "batch_size",
                reason: "must be ≥ 1".into(),
            }));
        }
        Ok(Self { n, batch_size: batch_size.min(n), drop_last })
    }
    /// The batches of one epoch.
    pub fn epoch(&self, rng: &mut dyn RngCore) -> Vec<Vec<usize>> {
        let mut idx: Vec<usize> = (0..self.n).collect();
        idx.shuffle(rng);
        idx.chunks(self.batch_size)
            .filter(|c| !self.drop_last || c.len() == self.batch_size)
            .map(|c| c.to_vec())
            .collect()
    }
    /// Batches per epoch.
    pub fn batches_per_epoch(&self) -> usize {
        if self.drop_last {
            self.n / self.batch_size
        } else {
            self.n.div_ceil(self.batch_size)
        }
    }
}

/// Training rows read by their position: the minibatch loops gather each step's rows through
/// it, so a data set held elsewhere — a loader over a map-style data set, read one minibatch at
/// a time — trains exactly as the same rows in memory ([`RowsInMemory`]).
pub trait RowSource {
    /// Rows held: positions `0..len()`.
    fn len(&self) -> usize;
    /// Whether no row is held.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The rows at `positions` (each `< len()`), in that order: inputs `b × d` and targets
    /// point-major (`b·t` values, `t` the likelihood's targets per point).
    fn rows(&mut self, positions: &[usize]) -> Result<(DMatrix<f64>, DVector<f64>)>;
}

/// An in-memory training set as a [`RowSource`]: rows are copied from a point-major copy of the
/// inputs (a column-major gather would touch every column of the whole set per batch).
#[derive(Debug, Clone)]
pub struct RowsInMemory {
    x_rows: DMatrix<f64>,
    y: DVector<f64>,
    t: usize,
}

impl RowsInMemory {
    /// Inputs `x` (`n × d`) and point-major targets `y` (`n·t` values, `t` per point).
    pub fn new(x: &DMatrix<f64>, y: DVector<f64>, t: usize) -> Result<Self> {
        if y.len() != x.nrows() * t {
            return Err(CoreError::Input(InputError::DimensionMismatch {
                what: "targets vs. inputs × targets per point",
                expected: x.nrows() * t,
                found: y.len(),
            }));
        }
        Ok(Self { x_rows: x.transpose(), y, t })
    }
}

impl RowSource for RowsInMemory {
    fn len(&self) -> usize {
        self.x_rows.ncols()
    }
    fn rows(&mut self, positions: &[usize]) -> Result<(DMatrix<f64>, DVector<f64>)> {
        let (d, t, n) = (self.x_rows.nrows(), self.t, self.x_rows.ncols());
        if let Some(&i) = positions.iter().find(|&&i| i >= n) {
            return Err(CoreError::Input(InputError::Invalid {
                what: "row position",
                reason: format!("{i} is past the {n} rows held"),
            }));
        }
        let mut rows = Vec::with_capacity(positions.len() * d);
        for &i in positions {
            rows.extend_from_slice(&self.x_rows.as_slice()[i * d..(i + 1) * d]);
        }
        let y = &self.y;
        let yb = DVector::from_iterator(
            positions.len() * t,
            positions.iter().flat_map(|&i| (0..t).map(move |k| y[i * t + k])),
        );
        Ok((DMatrix::from_row_slice(positions.len(), d, &rows), yb))
    }
}

/// Adam (Kingma & Ba 2015) on a flat parameter vector, shared by GP fitting and network
/// training: [`ascend`](Self::ascend) maximises, [`descend`](Self::descend) minimises.
#[derive(Debug, Clone)]
pub struct Adam {
    lr: f64,
    m: DVector<f64>,
    v: DVector<f64>,
    t: i32,
}

impl Adam {
    /// Adam with `β₁ = 0.9`, `β₂ = 0.999`, `ε = 1e-8`.
    pub fn new(dim: usize, lr: f64) -> Self {
        Self { lr, m: DVector::zeros(dim), v: DVector::zeros(dim), t: 0 }
    }
    /// One descent step on `θ` against the gradient `g`.
    pub fn descend(&mut self, theta: &mut DVector<f64>, g: &DVector<f64>) {
        self.step(theta, g, -1.0);
    }
    /// One ascent step on `θ` along the gradient `g`.
    pub fn ascend(&mut self, theta: &mut DVector<f64>, g: &DVector<f64>) {
        self.step(theta, g, 1.0);
    }
    /// The update for the gradient `sign·g` in one fused pass without temporaries, split over
    /// rayon in fixed chunks for long vectors (element-wise, so the result does not depend on
    /// the thread count). The bias corrections are folded into two scalars:
    /// `θ += (η/c₁) m / (√v / √c₂ + ε)`.
    fn step(&mut self, theta: &mut DVector<f64>, g: &DVector<f64>, sign: f64) {
        use rayon::prelude::*;
        assert_eq!((theta.len(), g.len()), (self.m.len(), self.m.len()), "Adam: dimension changed");
        self.t += 1;
        let (c1, c2) = (1.0 - 0.9f64.powi(self.t), 1.0 - 0.999f64.powi(self.t));
        let (step, inv_sqrt_c2) = (self.lr / c1, 1.0 / c2.sqrt());
        type Chunks<'a> = ((&'a mut [f64], &'a mut [f64]), (&'a mut [f64], &'a [f64]));
        let update = |((th, m), (v, g)): Chunks<'_>| {
            for (((th, m), v), g) in th.iter_mut().zip(m).zip(v).zip(g) {
                let g = sign * g;
                *m = *m * 0.9 + g * 0.1;
                *v = *v * 0.999 + g * g * 0.001;
                *th += step * *m / (v.sqrt() * inv_sqrt_c2 + 1e-8);
            }
        };
        const CHUNK: usize = 1 << 13;
        let (th, m, v, g) =
            (theta.as_mut_slice(), self.m.as_mut_slice(), self.v.as_mut_slice(), g.as_slice());
        if th.len() >= 4 * CHUNK {
            th.par_chunks_mut(CHUNK)
                .zip(m.par_chunks_mut(CHUNK))
                .zip(v.par_chunks_mut(CHUNK).zip(g.par_chunks(CHUNK)))
                .for_each(update);
        } else {
            update(((th, m), (v, g)));
        }
    }
}
