//! The one data-source type of every method's `fit`: `fspace._fspace.DataSource`.
//!
//! A source is made by one of its constructors and read once, by the fit it is passed to:
//!
//! | constructor | training rows | read by |
//! |---|---|---|
//! | `DataSource.memory(x, y)` | the arrays | every method |
//! | `DataSource.rows(read, n)` | `read(positions) -> (X, y)` ([`PyRows`], a [`RowSource`]) | the trained methods on one process |
//! | `DataSource.batches(make, total)` | pulled from the iterators `make()` returns, a pass each | the one-pass methods (post-hoc FSP-Laplace, ELLA) |
//!
//! Validation rows go with the training rows (`x_val`, `y_val` or `val_rows`), and a process
//! shard (`reduce`, `process=(rank, world)`) with the rows of this process. What a method
//! accepts is its [`Capabilities`](super::classes::Capabilities); a source it cannot read is
//! refused before any row is read.

use fspace_core::{Observer, Progress, RowSource};
use nalgebra::{DMatrix, DVector};
use numpy::PyReadonlyArray2;
use pyo3::prelude::*;

use crate::callback::{PyReduce, PyRows};
use crate::convert::matrix;
use crate::errors::value_error;

/// A fit's training rows.
pub(crate) enum Train {
    Memory { x: DMatrix<f64>, y: DMatrix<f64> },
    Rows(PyRows),
    Batches(PyBatches),
}

impl Train {
    /// The source's kind as its constructor's name (for the refusals).
    pub(crate) fn constructor(&self) -> &'static str {
        match self {
            Train::Memory { .. } => "DataSource.memory",
            Train::Rows(_) => "DataSource.rows",
            Train::Batches(_) => "DataSource.batches",
        }
    }
}

/// Validation rows: held, or read by position.
pub(crate) enum Validation {
    Memory(fspace_core::RowsInMemory, DMatrix<f64>, DMatrix<f64>),
    Rows(PyRows),
}

impl Validation {
    /// The held arrays `(x_val, y_val)`; `None` for rows read by position.
    pub(crate) fn arrays(&self) -> Option<(&DMatrix<f64>, &DMatrix<f64>)> {
        match self {
            Validation::Memory(_, x, y) => Some((x, y)),
            Validation::Rows(_) => None,
        }
    }

    /// The exception the read callable raised, if any (taken).
    pub(crate) fn take_error(&mut self) -> Option<PyErr> {
        match self {
            Validation::Rows(rows) => rows.error.take(),
            Validation::Memory(..) => None,
        }
    }
}

impl RowSource for Validation {
    fn len(&self) -> usize {
        match self {
            Validation::Memory(rows, ..) => rows.len(),
            Validation::Rows(rows) => rows.len(),
        }
    }
    fn rows(&mut self, positions: &[usize]) -> fspace_core::Result<(DMatrix<f64>, DVector<f64>)> {
        match self {
            Validation::Memory(rows, ..) => rows.rows(positions),
            Validation::Rows(rows) => rows.rows(positions),
        }
    }
}

/// This process's share of a sharded fit: the all-reduce step (`reduce`) and, for the methods
/// that reduce every step, `(rank, world)`.
pub(crate) struct Shard {
    pub(crate) reduce: PyReduce,
    pub(crate) process: Option<(usize, usize)>,
}

/// Batches pulled from Python: `make()` returns an iterator of `(X, y)` float64 pairs, one
/// pass over the data each time it is called (a loader iterated again). The first exception
/// is kept (and raised when the fit returns); the pass then ends.
pub(crate) struct PyBatches {
    make: Py<PyAny>,
    iter: Option<Py<PyAny>>,
    /// Points the source says it holds (`0`: unknown).
    pub(crate) total: usize,
    /// The first exception of `make` or of an iterator.
    pub(crate) error: Option<PyErr>,
}

impl PyBatches {
    /// The next batch of the current pass (`None` at its end, or when Python raised: see
    /// `error`).
    fn next(&mut self) -> Option<(DMatrix<f64>, DMatrix<f64>)> {
        if self.error.is_some() {
            return None;
        }
        let got = Python::attach(|py| -> PyResult<Option<(DMatrix<f64>, DMatrix<f64>)>> {
            let iter = match &self.iter {
                Some(iter) => iter.clone_ref(py),
                None => {
                    let iter = self.make.bind(py).call0()?.try_iter()?.into_any().unbind();
                    self.iter = Some(iter.clone_ref(py));
                    iter
                }
            };
            match iter.bind(py).call_method0("__next__") {
                Ok(pair) => {
                    let (x, y): (PyReadonlyArray2<'_, f64>, PyReadonlyArray2<'_, f64>) = pair.extract()?;
                    Ok(Some((matrix(&x), matrix(&y))))
                }
                Err(e) if e.is_instance_of::<pyo3::exceptions::PyStopIteration>(py) => Ok(None),
                Err(e) => Err(e),
            }
        });
        match got {
            Ok(Some(batch)) => Some(batch),
            Ok(None) => {
                self.iter = None;
                None
            }
            Err(e) => {
                self.iter = None;
                self.error = Some(e);
                None
            }
        }
    }

    /// One pass: each non-empty batch to `each`, with the rows seen before it; a batch whose
    /// inputs or targets change width, or whose targets are not one row per input, is refused
    /// by name. Returns the rows seen. Python's exception, if any, ends the pass early (see
    /// `error`).
    pub(crate) fn for_each(
        &mut self,
        mut each: impl FnMut(usize, DMatrix<f64>, DMatrix<f64>) -> PyResult<()>,
    ) -> PyResult<usize> {
        let (mut seen, mut batch) = (0, 0usize);
        let mut widths: Option<(usize, usize)> = None;
        while let Some((x, y)) = self.next() {
            batch += 1;
            fspace_input::interrupt::check("a pass over the data loader").map_err(crate::errors::raise)?;
            if x.nrows() == 0 {
                continue;
            }
            let (dx, dy) = *widths.get_or_insert((x.ncols(), y.ncols()));
            if (x.ncols(), y.ncols()) != (dx, dy) {
                return Err(value_error(format!(
                    "batch {batch} of the data loader has {} input and {} target columns; the batches before it had \
                     {dx} and {dy}: every batch must have the same widths",
                    x.ncols(),
                    y.ncols()
                )));
            }
            if y.nrows() != x.nrows() {
                return Err(value_error(format!(
                    "batch {batch} of the data loader has {} inputs and {} targets",
                    x.nrows(),
                    y.nrows()
                )));
            }
            let rows = x.nrows();
            each(seen, x, y)?;
            seen += rows;
        }
        Ok(seen)
    }

    /// [`for_each`](Self::for_each) with consecutive batches joined into blocks of at least
    /// `target` rows (the last may hold fewer), so that a loader's small batches are multiplied
    /// in the chunks an in-memory fit uses; each block goes to `each`, and `observer` hears the
    /// points read so far. Returns the points read.
    pub(crate) fn for_each_block(
        &mut self,
        target: usize,
        observer: &mut dyn Observer,
        mut each: impl FnMut(&DMatrix<f64>, &DMatrix<f64>) -> PyResult<()>,
    ) -> PyResult<usize> {
        let total = self.total;
        let (mut held, mut rows, mut points) = (Vec::new(), 0, 0);
        let mut flush = |held: &mut Vec<(DMatrix<f64>, DMatrix<f64>)>, points: &mut usize| -> PyResult<()> {
            let (x, y) = joined(std::mem::take(held));
            each(&x, &y)?;
            *points += x.nrows();
            observer.observe(&Progress {
                step: *points,
                total: total.max(*points),
                loss: None,
                validation: None,
            });
            Ok(())
        };
        self.for_each(|_, x, y| {
            rows += x.nrows();
            held.push((x, y));
            if rows >= target.max(1) {
                flush(&mut held, &mut points)?;
                rows = 0;
            }
            Ok(())
        })?;
        if !held.is_empty() {
            flush(&mut held, &mut points)?;
        }
        Ok(points)
    }
}

/// Batches of equal widths stacked by rows (one batch is returned as it is).
fn joined(mut held: Vec<(DMatrix<f64>, DMatrix<f64>)>) -> (DMatrix<f64>, DMatrix<f64>) {
    if held.len() == 1 {
        if let Some(one) = held.pop() {
            return one;
        }
    }
    let n: usize = held.iter().map(|(x, _)| x.nrows()).sum();
    let (dx, dy) = held.first().map_or((0, 0), |(x, y)| (x.ncols(), y.ncols()));
    let mut x = DMatrix::zeros(n, dx);
    let mut y = DMatrix::zeros(n, dy);
    let mut at = 0;
    for (bx, by) in &held {
        x.rows_mut(at, bx.nrows()).copy_from(bx);
        y.rows_mut(at, by.nrows()).copy_from(by);
        at += bx.nrows();
    }
    (x, y)
}

/// A fit's data: training rows, validation rows, and this process's share of a sharded fit.
pub(crate) struct Source {
    pub(crate) train: Train,
    pub(crate) val: Option<Validation>,
    pub(crate) shard: Option<Shard>,
}

impl Source {
    /// The first exception a Python callable of the source raised (read, batches, reduce).
    pub(crate) fn take_error(&mut self) -> Option<PyErr> {
        let train = match &mut self.train {
            Train::Rows(rows) => rows.error.take(),
            Train::Batches(b) => b.error.take(),
            Train::Memory { .. } => None,
        };
        train
            .or_else(|| self.val.as_mut().and_then(Validation::take_error))
            .or_else(|| self.shard.as_mut().and_then(|s| s.reduce.error.take()))
    }
}

/// Where a fit's data come from; made by `memory`, `rows` or `batches` and read once by the
/// `fit` it is passed to (module docs).
#[pyclass(name = "DataSource", module = "fspace._fspace")]
pub(crate) struct PySource {
    source: Option<Source>,
}

impl PySource {
    /// The source, taken by the fit that reads it.
    pub(crate) fn take(&mut self) -> PyResult<Source> {
        self.source
            .take()
            .ok_or_else(|| value_error("this DataSource has been read by a fit: make a new one"))
    }
}

/// Validation rows from `x_val` + `y_val` or `val_rows=(read, n)`, or none.
fn validation(
    x_val: Option<PyReadonlyArray2<'_, f64>>,
    y_val: Option<PyReadonlyArray2<'_, f64>>,
    val_rows: Option<(Py<PyAny>, usize)>,
) -> PyResult<Option<Validation>> {
    Ok(match (x_val, y_val, val_rows) {
        (None, None, None) => None,
        (Some(xv), Some(yv), None) => {
            let (xv, yv) = (matrix(&xv), matrix(&yv));
            let flat = fspace_core::fit::flatten(&yv);
            let rows = fspace_core::RowsInMemory::new(&xv, flat, yv.ncols()).map_err(crate::errors::raise)?;
            Some(Validation::Memory(rows, xv, yv))
        }
        (None, None, Some((read, n))) => Some(Validation::Rows(PyRows::new(read, n))),
        (Some(_), Some(_), Some(_)) => {
            return Err(value_error("validation data is x_val / y_val or val_rows, not both"))
        }
        _ => return Err(value_error("validation data needs both x_val and y_val")),
    })
}

fn shard(reduce: Option<Py<PyAny>>, process: Option<(usize, usize)>) -> PyResult<Option<Shard>> {
    match (reduce, process) {
        (None, None) => Ok(None),
        (None, Some(_)) => Err(value_error("process=(rank, world) needs its reduce step")),
        (Some(reduce), process) => {
            if let Some((rank, world)) = process {
                if world == 0 || rank >= world {
                    return Err(value_error(format!(
                        "process=(rank={rank}, world={world}) needs rank < world"
                    )));
                }
            }
            Ok(Some(Shard { reduce: PyReduce::new(reduce), process }))
        }
    }
}

#[pymethods]
impl PySource {
    /// Training rows held as arrays (`x`: `n × d`, `y`: `n × d'` targets or `n × 1` class
    /// indices); validation as `x_val` + `y_val` or `val_rows=(read, n)`; over a process group,
    /// `reduce` (the group's all-reduce) and, for the methods that reduce every step,
    /// `process=(rank, world)`.
    #[staticmethod]
    #[pyo3(signature = (x, y, *, x_val=None, y_val=None, val_rows=None, reduce=None, process=None))]
    fn memory(
        x: PyReadonlyArray2<'_, f64>,
        y: PyReadonlyArray2<'_, f64>,
        x_val: Option<PyReadonlyArray2<'_, f64>>,
        y_val: Option<PyReadonlyArray2<'_, f64>>,
        val_rows: Option<(Py<PyAny>, usize)>,
        reduce: Option<Py<PyAny>>,
        process: Option<(usize, usize)>,
    ) -> PyResult<Self> {
        let train = Train::Memory { x: matrix(&x), y: matrix(&y) };
        let source =
            Source { train, val: validation(x_val, y_val, val_rows)?, shard: shard(reduce, process)? };
        Ok(Self { source: Some(source) })
    }

    /// `n` training rows read by position: `read(positions)` (an int64 array) returns `(X, y)`
    /// for those rows in that order; validation as for `memory`.
    #[staticmethod]
    #[pyo3(signature = (read, n, *, x_val=None, y_val=None, val_rows=None))]
    fn rows(
        read: Py<PyAny>,
        n: usize,
        x_val: Option<PyReadonlyArray2<'_, f64>>,
        y_val: Option<PyReadonlyArray2<'_, f64>>,
        val_rows: Option<(Py<PyAny>, usize)>,
    ) -> PyResult<Self> {
        if n == 0 {
            return Err(value_error("the data loader's data set is empty"));
        }
        let source = Source {
            train: Train::Rows(PyRows::new(read, n)),
            val: validation(x_val, y_val, val_rows)?,
            shard: None,
        };
        Ok(Self { source: Some(source) })
    }

    /// Training batches pulled one at a time: `make()` returns an iterator of `(X, y)` float64
    /// pairs, a pass over the data (a method that needs two passes calls it twice); `total`
    /// points expected (`0`: unknown); validation as for `memory`; over a process group,
    /// `reduce` adds the processes' sums.
    #[staticmethod]
    #[pyo3(signature = (make, *, total=0, x_val=None, y_val=None, reduce=None))]
    fn batches(
        make: Py<PyAny>,
        total: usize,
        x_val: Option<PyReadonlyArray2<'_, f64>>,
        y_val: Option<PyReadonlyArray2<'_, f64>>,
        reduce: Option<Py<PyAny>>,
    ) -> PyResult<Self> {
        let train = Train::Batches(PyBatches { make, iter: None, total, error: None });
        let source = Source { train, val: validation(x_val, y_val, None)?, shard: shard(reduce, None)? };
        Ok(Self { source: Some(source) })
    }
}
