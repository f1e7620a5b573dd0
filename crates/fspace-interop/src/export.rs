//! Predictions, variances, function samples and summaries written as `.npz` for Python.

use std::path::Path;

use fspace_core::{FunctionPredictive, Posterior};
use nalgebra::{DMatrix, DVector};
use rand::RngCore;

use crate::error::{InteropError, Result};
use crate::tensors::NpzBuffer;

/// Builds an `.npz` archive that `numpy.load` reads: matrices keep their `n × d` shape (rows
/// are points), sample sets become `S × n × d` arrays, scalars 0-d arrays and text 0-d
/// unicode arrays. Names must be distinct.
pub struct NpzWriter {
    buf: NpzBuffer,
}

impl Default for NpzWriter {
    fn default() -> Self {
        Self::new()
    }
}

fn row_major(m: &DMatrix<f64>) -> Vec<f64> {
    m.transpose().as_slice().to_vec()
}

impl NpzWriter {
    /// An empty archive.
    pub fn new() -> Self {
        Self { buf: NpzBuffer::new() }
    }

    /// An array of any shape from row-major values.
    pub fn array(&mut self, name: &str, shape: &[usize], data: &[f64]) -> Result<&mut Self> {
        self.buf.add_f64(name, shape, data)?;
        Ok(self)
    }

    /// An `n × d` matrix.
    pub fn matrix(&mut self, name: &str, m: &DMatrix<f64>) -> Result<&mut Self> {
        self.array(name, &[m.nrows(), m.ncols()], &row_major(m))
    }

    /// A vector (1-d array).
    pub fn vector(&mut self, name: &str, v: &DVector<f64>) -> Result<&mut Self> {
        self.array(name, &[v.len()], v.as_slice())
    }

    /// A scalar (0-d array).
    pub fn scalar(&mut self, name: &str, value: f64) -> Result<&mut Self> {
        self.array(name, &[], &[value])
    }

    /// A string (0-d unicode array; `str(npz[name])` in Python).
    pub fn text(&mut self, name: &str, text: &str) -> Result<&mut Self> {
        self.buf.add_text(name, text)?;
        Ok(self)
    }

    /// `S` function samples, each `n × d`, as one `S × n × d` array.
    pub fn samples(&mut self, name: &str, samples: &[DMatrix<f64>]) -> Result<&mut Self> {
        let (n, d) = samples.first().map_or((0, 0), |s| s.shape());
        if let Some(bad) = samples.iter().find(|s| s.shape() != (n, d)) {
            return Err(InteropError::InvalidArray {
                name: name.to_string(),
                reason: format!("samples of shapes {:?} and {:?}", (n, d), bad.shape()),
            });
        }
        let data: Vec<f64> = samples.iter().flat_map(row_major).collect();
        self.array(name, &[samples.len(), n, d], &data)
    }

    /// A marginal predictive as `mean` and `var` (both `n × d'`).
    pub fn predictive(&mut self, p: &FunctionPredictive) -> Result<&mut Self> {
        self.matrix("mean", &p.mean)?.matrix("var", &p.var)
    }

    /// The archive's bytes.
    pub fn into_bytes(self) -> Result<Vec<u8>> {
        self.buf.finish()
    }

    /// Writes the archive to `path`.
    pub fn write(self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let bytes = self.into_bytes()?;
        std::fs::write(path, bytes).map_err(|e| crate::error::io_error(&path.display().to_string(), &e))
    }
}

/// A posterior's predictions at `x`, ready for [`write_posterior_npz`].
pub struct PosteriorExport<'a> {
    /// The method's name (written as the text array `method`).
    pub method: &'a str,
    /// Test inputs, `n × d` (written as `x`).
    pub x: &'a DMatrix<f64>,
    /// Joint function samples to draw (written as `samples`, `S × n × d'`; none if 0).
    pub samples: usize,
    /// Named summary numbers of the fit (prior precision, marginal likelihood, fit time, …),
    /// written as 0-d arrays `summary.<name>`.
    pub summary: &'a [(&'a str, f64)],
}

/// Writes `x`, the predictive `mean` and `var`, `samples` joint samples and the summary of
/// `posterior` to an `.npz` file.
pub fn write_posterior_npz(
    path: impl AsRef<Path>,
    posterior: &dyn Posterior,
    export: &PosteriorExport<'_>,
    rng: &mut dyn RngCore,
) -> Result<()> {
    let mut npz = NpzWriter::new();
    npz.text("method", export.method)?.matrix("x", export.x)?;
    npz.predictive(&posterior.predict(export.x)?)?;
    if export.samples > 0 {
        npz.samples("samples", &posterior.sample_functions(export.x, export.samples, rng)?)?;
    }
    for (name, value) in export.summary {
        npz.scalar(&format!("summary.{name}"), *value)?;
    }
    npz.write(path)
}
