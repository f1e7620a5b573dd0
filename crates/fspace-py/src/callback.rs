//! A [`Network`] whose products come from Python: `f(X)`, `J(X)·U` and `J(X)ᵀ·L` for blocks of
//! columns, computed by torch (`fspace/_torch.py`: `torch.func.functional_call`, `jvp`, `vjp`
//! and `vmap`, on the model's device and dtype) — any `torch.nn.Module`, whatever its
//! `forward`.
//!
//! The Python object gets the flat parameters with every call (`forward(w, X)`,
//! `jvp(w, X, U)`, `vjp(w, X, L)`), so clones of the network with
//! different weights share one callback object and the GIL is taken once per block of
//! columns, not per column. Results come back as float64 (an f32 model is evaluated in f32 by
//! torch and accumulated in f64 here). The first exception a callback raises is kept
//! ([`CallbackErrors`]) and raised by the binding in place of the Rust error it
//! caused, so the user sees torch's own message.
//!
//! Layer structure is not reachable through these calls: `kron`, `ekfac` and `last_layer`
//! are [`NnError::Unsupported`] on this network (they need module hooks, not yet written).
//!
//! [`PyNetwork`] puts it beside the [`NativeNetwork`]s behind one type, so every posterior of
//! the binding has one network type; only native networks save (a torch model is not
//! serialisable from here), and every saved file loads as a native network.

use std::sync::{Arc, Mutex};

use fspace_nn::checks::{check_columns, check_input_batch, check_param_vector, check_point_cotangents};
use fspace_nn::{NativeNetwork, Network, NnError, Result};
use nalgebra::{DMatrix, DVector};
use numpy::{PyArray1, PyReadonlyArray1, PyReadonlyArray2, PyUntypedArrayMethods};
use pyo3::prelude::*;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::convert::to_numpy;
use crate::errors::{raise, value_error, Classify};

/// The network of a Python object with `forward`, `jvp` and `vjp` (module docs). Inputs,
/// directions and cotangents pass fspace-nn's shared checks before any call.
#[derive(Clone)]
pub(crate) struct CallbackNetwork {
    calls: Arc<Py<PyAny>>,
    params: DVector<f64>,
    input_dim: usize,
    output_dim: usize,
    error: Arc<Mutex<Option<PyErr>>>,
}

impl CallbackNetwork {
    /// The network of `calls` at weights `params`, for inputs of `input_dim` columns and
    /// `output_dim` outputs.
    pub(crate) fn new(calls: Py<PyAny>, params: DVector<f64>, input_dim: usize, output_dim: usize) -> Self {
        Self { calls: Arc::new(calls), params, input_dim, output_dim, error: Arc::new(Mutex::new(None)) }
    }

    /// Calls `method(w, *args)` and reads an `rows × cols` float64 matrix back.
    fn call(
        &self,
        method: &str,
        args: impl for<'py> FnOnce(Python<'py>) -> Vec<Bound<'py, PyAny>>,
        rows: usize,
        cols: Option<usize>,
    ) -> Result<DMatrix<f64>> {
        Python::attach(|py| {
            let w = PyArray1::from_slice(py, self.params.as_slice()).into_any();
            let mut all = vec![w];
            all.extend(args(py));
            let out = pyo3::types::PyTuple::new(py, all)
                .and_then(|args| self.calls.bind(py).call_method1(method, args))
                .and_then(|r| {
                    r.extract::<PyReadonlyArray2<'_, f64>>()
                        .map(|a| (a.shape().to_vec(), crate::convert::matrix(&a)))
                });
            match out {
                Ok((shape, m)) => {
                    if shape[0] != rows || cols.is_some_and(|c| shape[1] != c) {
                        return Err(NnError::Callback(format!(
                            "{method} returned a {}×{} array; expected {rows}×{}",
                            shape[0],
                            shape[1],
                            cols.map_or("?".to_string(), |c| c.to_string())
                        )));
                    }
                    if m.iter().any(|v| !v.is_finite()) {
                        return Err(NnError::Callback(format!("{method} returned a non-finite value")));
                    }
                    Ok(m)
                }
                Err(e) => {
                    let text = e.to_string();
                    if let Ok(mut slot) = self.error.lock() {
                        slot.get_or_insert(e);
                    }
                    Err(NnError::Callback(format!("{method}: {text}")))
                }
            }
        })
    }

    fn check_x(&self, x: &DMatrix<f64>) -> Result<()> {
        check_input_batch(x, self.input_dim, "input columns")
    }
}

impl Network for CallbackNetwork {
    fn input_dim(&self) -> usize {
        self.input_dim
    }
    fn output_dim(&self) -> usize {
        self.output_dim
    }
    fn n_params(&self) -> usize {
        self.params.len()
    }
    fn params(&self) -> DVector<f64> {
        self.params.clone()
    }
    fn set_params(&mut self, params: &DVector<f64>) -> Result<()> {
        check_param_vector("parameter vector", params, self.params.len())?;
        self.params.copy_from(params);
        Ok(())
    }
    fn forward(&self, x: &DMatrix<f64>) -> Result<DMatrix<f64>> {
        self.check_x(x)?;
        self.call("forward", |py| vec![to_numpy(py, x).into_any()], x.nrows(), Some(self.output_dim))
    }
    fn jvp(&self, x: &DMatrix<f64>, u: &DVector<f64>) -> Result<DMatrix<f64>> {
        let ju = self.jvp_columns(x, &DMatrix::from_column_slice(u.len(), 1, u.as_slice()))?;
        Ok(DMatrix::from_row_slice(x.nrows(), self.output_dim, ju.as_slice()))
    }
    fn vjp(&self, x: &DMatrix<f64>, v: &DMatrix<f64>) -> Result<DVector<f64>> {
        let flat = DMatrix::from_iterator(v.len(), 1, v.transpose().iter().copied());
        Ok(self.vjp_columns(x, &flat)?.column(0).into_owned())
    }
    /// One callback for all columns (torch vmaps over them in blocks).
    fn jvp_columns(&self, x: &DMatrix<f64>, u: &DMatrix<f64>) -> Result<DMatrix<f64>> {
        self.check_x(x)?;
        check_columns("parameter directions U (rows = parameters)", u, self.params.len())?;
        let rows = x.nrows() * self.output_dim;
        self.call(
            "jvp",
            |py| vec![to_numpy(py, x).into_any(), to_numpy(py, u).into_any()],
            rows,
            Some(u.ncols()),
        )
    }
    /// One callback for all columns (torch vmaps over them in blocks).
    fn vjp_columns(&self, x: &DMatrix<f64>, l: &DMatrix<f64>) -> Result<DMatrix<f64>> {
        self.check_x(x)?;
        check_columns("cotangents L (rows = points × outputs)", l, x.nrows() * self.output_dim)?;
        let p = self.params.len();
        self.call(
            "vjp",
            |py| vec![to_numpy(py, x).into_any(), to_numpy(py, l).into_any()],
            p,
            Some(l.ncols()),
        )
    }
    /// One callback: torch vmaps the single-point reverse pass over the points (per-sample
    /// gradients) and over each point's columns. The blocks travel stacked, `n·d' × k`.
    fn per_point_vjp(&self, x: &DMatrix<f64>, cotangents: &[DMatrix<f64>]) -> Result<DMatrix<f64>> {
        self.check_x(x)?;
        let (q, n) = (self.output_dim, x.nrows());
        let k = check_point_cotangents(cotangents, n, q)?;
        let mut stacked = DMatrix::zeros(n * q, k);
        for (i, l) in cotangents.iter().enumerate() {
            stacked.rows_mut(i * q, q).copy_from(l);
        }
        let p = self.params.len();
        self.call(
            "per_point_vjp",
            |py| vec![to_numpy(py, x).into_any(), to_numpy(py, &stacked).into_any()],
            p,
            Some(n * k),
        )
    }
    /// `J(X)` by per-point reverse passes over the identity cotangents
    /// ([`per_point_vjp`](Network::per_point_vjp)), in blocks of points so that one callback
    /// covers many rows and no point's pass runs over another's inputs.
    fn jacobian(&self, x: &DMatrix<f64>) -> Result<DMatrix<f64>> {
        self.check_x(x)?;
        let q = self.output_dim;
        let mut jac = DMatrix::zeros(x.nrows() * q, self.params.len());
        let eye = DMatrix::<f64>::identity(q, q);
        let block = 64usize;
        for start in (0..x.nrows()).step_by(block) {
            let len = block.min(x.nrows() - start);
            let xb = x.rows(start, len).into_owned();
            let jt = self.per_point_vjp(&xb, &vec![eye.clone(); len])?;
            jac.rows_mut(start * q, len * q).copy_from(&jt.transpose());
        }
        Ok(jac)
    }
}

/// A native network or a torch model's callbacks (module docs).
#[derive(Clone)]
pub(crate) enum PyNetwork {
    /// An MLP or a CNN converted from an `nn.Sequential` or a `state_dict`.
    Native(NativeNetwork),
    /// Any `torch.nn.Module`, through torch's derivatives.
    Torch(CallbackNetwork),
}

fspace_nn::enum_network!(PyNetwork { Native(NativeNetwork), Torch(CallbackNetwork) });

impl PyNetwork {
    /// Where the callbacks of this network (and of its clones) keep their first exception.
    pub(crate) fn errors(&self) -> CallbackErrors {
        match self {
            PyNetwork::Torch(net) => CallbackErrors(Some(net.error.clone())),
            PyNetwork::Native(_) => CallbackErrors(None),
        }
    }
}

/// A handle on a callback network's first exception (none for a native network).
#[derive(Clone, Default)]
pub(crate) struct CallbackErrors(Option<Arc<Mutex<Option<PyErr>>>>);

impl CallbackErrors {
    /// The Python exception a callback raised during the failed call, or `e` as fspace's
    /// exception of its kind.
    pub(crate) fn raise<E: Classify>(&self, e: E) -> PyErr {
        self.take().unwrap_or_else(|| raise(e))
    }

    /// The kept exception, if any (cleared).
    pub(crate) fn take(&self) -> Option<PyErr> {
        self.0.as_ref().and_then(|slot| slot.lock().ok().and_then(|mut e| e.take()))
    }
}

impl From<NativeNetwork> for PyNetwork {
    fn from(net: NativeNetwork) -> Self {
        PyNetwork::Native(net)
    }
}

/// Saved exactly as the [`NativeNetwork`] it holds; a torch model cannot be saved.
impl Serialize for PyNetwork {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        match self {
            PyNetwork::Native(net) => net.serialize(s),
            PyNetwork::Torch(_) => Err(serde::ser::Error::custom(
                "a posterior on a torch model's callbacks cannot be saved: save the model with torch and refit",
            )),
        }
    }
}

impl<'de> Deserialize<'de> for PyNetwork {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        NativeNetwork::deserialize(d).map(PyNetwork::Native)
    }
}

/// The network of a torch model's callback object (`fspace/_torch.py`'s `TorchCalls`): its
/// `params` (flat float64, `named_parameters()` order), `input_dim`, `output_dim`.
pub(crate) fn callback_network(calls: &Bound<'_, PyAny>) -> PyResult<PyNetwork> {
    let params: PyReadonlyArray1<'_, f64> = calls.getattr("params")?.extract()?;
    let params = nalgebra::DVector::from_column_slice(params.as_slice()?);
    if params.is_empty() || params.iter().any(|v| !v.is_finite()) {
        return Err(value_error("the model's parameters must be non-empty and finite"));
    }
    let input_dim: usize = calls.getattr("input_dim")?.extract()?;
    let output_dim: usize = calls.getattr("output_dim")?.extract()?;
    if input_dim == 0 || output_dim == 0 {
        return Err(value_error("the model's input and output dimensions must be positive"));
    }
    Ok(PyNetwork::Torch(CallbackNetwork::new(calls.clone().unbind(), params, input_dim, output_dim)))
}
