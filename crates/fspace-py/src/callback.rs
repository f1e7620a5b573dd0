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
//! Layer structure comes from module hooks, when the caller passes it
//! ([`callback_network`]'s `layers`: `fspace.Laplace` does for `kron`, `ekfac` and
//! `last_layer`, and for the other structures whenever every trainable parameter sits in an
//! `nn.Linear` / `nn.Conv2d`): then the network reports those layers
//! ([`Network::layer_infos`]), their inputs and output gradients
//! ([`Network::kfac_statistics`]: a forward with hooks, one reverse pass per cotangent column),
//! KFAC's factor sums formed by torch on the model's device from those same hooks
//! ([`Network::kfac_factor_sums`]: only the `fan × fan` sums cross, not the patches) and the
//! last layer's features (with the outputs from the same pass,
//! [`Network::forward_with_last_layer_features`]), and fspace's layer rules serve every structure. Without them
//! it reports none, and the diagonal, low-rank and full structures and every predictive take
//! the Jacobian-free per-point route.
//!
//! [`PyNetwork`] puts it beside the [`NativeNetwork`]s behind one type, so every posterior of
//! the binding has one network type; only native networks save (a torch model is not
//! serialisable from here), and every saved file loads as a native network.

use std::sync::{Arc, Mutex};

use fspace_nn::checks::{check_columns, check_input_batch, check_param_vector, check_point_cotangents};
use fspace_nn::{
    KfacFactorSums, LayerInfo, LayerKind, LayerStatistics, NativeNetwork, Network, NnError, Result,
};
use nalgebra::{DMatrix, DVector};
use numpy::{PyArray1, PyReadonlyArray1, PyReadonlyArray2, PyUntypedArrayMethods};
use pyo3::prelude::*;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::convert::{columns_to_numpy, matrix, to_numpy};
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
    /// The weight layers torch's module hooks report (empty unless a layered structure asked
    /// for them), and the Python list they came from.
    layers: Arc<Vec<LayerInfo>>,
    layer_dicts: Option<Arc<Py<PyAny>>>,
    /// Most bytes of a `p × c` float64 block one `jvp` / `vjp` callback gets or returns
    /// ([`DEFAULT_COLUMN_BYTES`], or the callback object's `column_bytes`).
    column_bytes: usize,
    /// Whether the callback object sums KFAC's factors itself (`kfac_factor_sums`).
    factor_sums: bool,
    /// Whether the callback object returns the outputs and the last layer's inputs from one
    /// pass (`forward_with_features`).
    features_with_forward: bool,
}

/// How many bytes of a `p × c` float64 block cross to Python in one callback: `jvp`'s
/// directions and `vjp`'s results travel in column chunks of about this size, so the copy on
/// either side of the call stays near 256 MiB rather than the whole block (a ResNet-18's `p × 20`
/// block is 1.8 GB: 3 columns a chunk). Each chunk repeats the primal pass at its points.
pub(crate) const DEFAULT_COLUMN_BYTES: usize = 256 << 20;

/// The per-layer callbacks return one entry per hooked layer, in `layer_infos` order.
fn one_entry_per_layer(method: &str, got: usize, expected: usize) -> Result<()> {
    if got == expected {
        Ok(())
    } else {
        Err(NnError::Callback(format!("{method} returned {got} layers; expected {expected}")))
    }
}

/// `a` as an `rows × cols` (`cols` unchecked when `None`) finite float64 matrix, or the
/// callback error that names `method`.
fn checked_matrix(
    method: &str,
    a: &PyReadonlyArray2<'_, f64>,
    rows: usize,
    cols: Option<usize>,
) -> Result<DMatrix<f64>> {
    let shape = a.shape();
    if shape[0] != rows || cols.is_some_and(|c| shape[1] != c) {
        return Err(NnError::Callback(format!(
            "{method} returned a {}×{} array; expected {rows}×{}",
            shape[0],
            shape[1],
            cols.map_or("?".to_string(), |c| c.to_string())
        )));
    }
    let m = crate::convert::matrix(a);
    if m.iter().any(|v| !v.is_finite()) {
        return Err(NnError::Callback(format!("{method} returned a non-finite value")));
    }
    Ok(m)
}

/// The `n` per-point `q × k` blocks, checked ([`check_point_cotangents`]) and stacked
/// point-major (`n·q × k`), as the Python side takes them.
fn stacked_blocks(blocks: &[DMatrix<f64>], n: usize, q: usize) -> Result<DMatrix<f64>> {
    let k = check_point_cotangents(blocks, n, q)?;
    let mut stacked = DMatrix::zeros(n * q, k);
    for (i, l) in blocks.iter().enumerate() {
        stacked.rows_mut(i * q, q).copy_from(l);
    }
    Ok(stacked)
}

impl CallbackNetwork {
    /// The network of `calls` at weights `params`, for inputs of `input_dim` columns and
    /// `output_dim` outputs.
    pub(crate) fn new(calls: Py<PyAny>, params: DVector<f64>, input_dim: usize, output_dim: usize) -> Self {
        Self {
            calls: Arc::new(calls),
            params,
            input_dim,
            output_dim,
            error: Arc::new(Mutex::new(None)),
            layers: Arc::new(Vec::new()),
            layer_dicts: None,
            column_bytes: DEFAULT_COLUMN_BYTES,
            factor_sums: false,
            features_with_forward: false,
        }
    }

    /// `[start, end)` ranges of `cols` columns, each a `p × c` float64 block of at most
    /// `column_bytes` (at least one column a range; none for no columns, which need no call).
    fn column_chunks(&self, cols: usize) -> Vec<std::ops::Range<usize>> {
        let per = (self.column_bytes / (8 * self.params.len().max(1))).max(1);
        (0..cols).step_by(per).map(|s| s..(s + per).min(cols)).collect()
    }

    /// `method(w, x, block)` one column chunk of `block` at a time ([`Self::column_chunks`]), each
    /// returning the `rows × c` columns of the result it stands for.
    fn call_by_columns(
        &self,
        method: &str,
        x: &DMatrix<f64>,
        block: &DMatrix<f64>,
        rows: usize,
    ) -> Result<DMatrix<f64>> {
        let mut out = DMatrix::zeros(rows, block.ncols());
        for cols in self.column_chunks(block.ncols()) {
            let part = self.call(
                method,
                |py| vec![to_numpy(py, x).into_any(), columns_to_numpy(py, block, cols.clone()).into_any()],
                rows,
                Some(cols.len()),
            )?;
            out.columns_mut(cols.start, cols.len()).copy_from(&part);
        }
        Ok(out)
    }

    /// Calls `method(w, *args)` and hands the result to `read`; the first exception (of the
    /// call or of `read`) is kept for the binding to raise.
    fn call_with<T>(
        &self,
        method: &str,
        args: impl for<'py> FnOnce(Python<'py>) -> Vec<Bound<'py, PyAny>>,
        read: impl for<'py> FnOnce(&Bound<'py, PyAny>) -> PyResult<Result<T>>,
    ) -> Result<T> {
        Python::attach(|py| {
            let w = PyArray1::from_slice(py, self.params.as_slice()).into_any();
            let mut all = vec![w];
            all.extend(args(py));
            let out = pyo3::types::PyTuple::new(py, all)
                .and_then(|args| self.calls.bind(py).call_method1(method, args))
                .and_then(|r| read(&r));
            match out {
                Ok(result) => result,
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

    /// Calls `method(w, *args)` and reads an `rows × cols` float64 matrix back.
    fn call(
        &self,
        method: &str,
        args: impl for<'py> FnOnce(Python<'py>) -> Vec<Bound<'py, PyAny>>,
        rows: usize,
        cols: Option<usize>,
    ) -> Result<DMatrix<f64>> {
        self.call_with(method, args, |r| {
            let a = r.extract::<PyReadonlyArray2<'_, f64>>()?;
            Ok(checked_matrix(method, &a, rows, cols))
        })
    }

    /// The layer list handed back to the Python side with every layer call.
    fn layer_list<'py>(&self, py: Python<'py>) -> Bound<'py, PyAny> {
        match &self.layer_dicts {
            Some(dicts) => dicts.bind(py).clone(),
            None => py.None().into_bound(py),
        }
    }

    fn check_x(&self, x: &DMatrix<f64>) -> Result<()> {
        check_input_batch(x, self.input_dim, "input columns")
    }

    /// The last reported layer, or the error that `what` needs layers the callbacks were not
    /// asked for.
    fn require_layers(&self, what: &str) -> Result<&LayerInfo> {
        self.layers.last().ok_or_else(|| NnError::Unsupported {
            what: format!(
                "{what} of a torch model whose layers were not collected (a layered structure collects them)"
            ),
        })
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
    /// One callback per column chunk ([`DEFAULT_COLUMN_BYTES`]; torch vmaps over the columns).
    fn jvp_columns(&self, x: &DMatrix<f64>, u: &DMatrix<f64>) -> Result<DMatrix<f64>> {
        self.check_x(x)?;
        check_columns("parameter directions U (rows = parameters)", u, self.params.len())?;
        self.call_by_columns("jvp", x, u, x.nrows() * self.output_dim)
    }
    /// One callback per column chunk of the `p × r` result ([`DEFAULT_COLUMN_BYTES`]).
    fn vjp_columns(&self, x: &DMatrix<f64>, l: &DMatrix<f64>) -> Result<DMatrix<f64>> {
        self.check_x(x)?;
        check_columns("cotangents L (rows = points × outputs)", l, x.nrows() * self.output_dim)?;
        self.call_by_columns("vjp", x, l, self.params.len())
    }
    /// One callback: torch vmaps the single-point reverse pass over the points (per-sample
    /// gradients) and over each point's columns. The blocks travel stacked, `n·d' × k`.
    fn per_point_vjp(&self, x: &DMatrix<f64>, cotangents: &[DMatrix<f64>]) -> Result<DMatrix<f64>> {
        self.check_x(x)?;
        let (q, n) = (self.output_dim, x.nrows());
        let stacked = stacked_blocks(cotangents, n, q)?;
        let k = stacked.ncols();
        let p = self.params.len();
        self.call(
            "per_point_vjp",
            |py| vec![to_numpy(py, x).into_any(), to_numpy(py, &stacked).into_any()],
            p,
            Some(n * k),
        )
    }
    fn layer_infos(&self) -> Vec<LayerInfo> {
        self.layers.as_ref().clone()
    }
    /// One callback: a forward pass with hooks on the layers, then one reverse pass per
    /// cotangent column (`TorchCalls.kfac_statistics`).
    fn kfac_statistics(&self, x: &DMatrix<f64>, factors: &[DMatrix<f64>]) -> Result<Vec<LayerStatistics>> {
        self.check_x(x)?;
        self.require_layers("per-layer statistics (KFAC)")?;
        let (q, n) = (self.output_dim, x.nrows());
        let stacked = stacked_blocks(factors, n, q)?;
        let k = stacked.ncols();
        let layers = self.layers.clone();
        self.call_with(
            "kfac_statistics",
            |py| vec![to_numpy(py, x).into_any(), to_numpy(py, &stacked).into_any(), self.layer_list(py)],
            |r| {
                let parts: Vec<(PyReadonlyArray2<'_, f64>, PyReadonlyArray2<'_, f64>)> = r.extract()?;
                if let Err(e) = one_entry_per_layer("kfac_statistics", parts.len(), layers.len()) {
                    return Ok(Err(e));
                }
                Ok(parts
                    .iter()
                    .zip(layers.iter())
                    .map(|((a, d), info)| {
                        let t = info.positions();
                        Ok(LayerStatistics {
                            positions: t,
                            columns: k,
                            inputs: checked_matrix(
                                "kfac_statistics (layer inputs)",
                                a,
                                n * t,
                                Some(info.fan_in),
                            )?,
                            output_grads: checked_matrix(
                                "kfac_statistics (output gradients)",
                                d,
                                n * k * t,
                                Some(info.fan_out),
                            )?,
                        })
                    })
                    .collect())
            },
        )
    }
    /// One callback for the whole of `x` (`TorchCalls.kfac_factor_sums`): torch takes `chunk`
    /// points at a time, as [`kfac_statistics`](Network::kfac_statistics) would, forms each
    /// chunk's `Σ a aᵀ`, `Σ a`, `Σ δ δᵀ` in the model's dtype on its device and adds them up in
    /// float64; only the sums cross to Rust. `None` when the callback object has no such method.
    fn kfac_factor_sums(
        &self,
        x: &DMatrix<f64>,
        factors: &[DMatrix<f64>],
        chunk: usize,
    ) -> Result<Option<Vec<KfacFactorSums>>> {
        if !self.factor_sums {
            return Ok(None);
        }
        self.check_x(x)?;
        self.require_layers("per-layer factor sums (KFAC)")?;
        let (q, n) = (self.output_dim, x.nrows());
        let stacked = stacked_blocks(factors, n, q)?;
        let layers = self.layers.clone();
        let method = "kfac_factor_sums";
        self.call_with(
            method,
            |py| {
                vec![
                    to_numpy(py, x).into_any(),
                    to_numpy(py, &stacked).into_any(),
                    self.layer_list(py),
                    pyo3::types::PyInt::new(py, chunk.max(1)).into_any(),
                ]
            },
            |r| {
                type Sums<'py> =
                    (PyReadonlyArray2<'py, f64>, PyReadonlyArray1<'py, f64>, usize, PyReadonlyArray2<'py, f64>);
                let parts: Vec<Sums<'_>> = r.extract()?;
                if let Err(e) = one_entry_per_layer(method, parts.len(), layers.len()) {
                    return Ok(Err(e));
                }
                Ok(parts
                    .iter()
                    .zip(layers.iter())
                    .map(|((aa, sum, rows, gg), info)| {
                        let sum = sum.as_slice().map_err(|e| NnError::Callback(format!("{method}: {e}")))?;
                        if sum.len() != info.fan_in || sum.iter().any(|v| !v.is_finite()) {
                            return Err(NnError::Callback(format!(
                                "{method} (input sums of {}) returned {} values, or a non-finite one; expected {} finite",
                                info.name,
                                sum.len(),
                                info.fan_in
                            )));
                        }
                        Ok(KfacFactorSums {
                            input_gram: checked_matrix(method, aa, info.fan_in, Some(info.fan_in))?,
                            input_sum: DVector::from_column_slice(sum),
                            input_rows: *rows,
                            grad_gram: checked_matrix(method, gg, info.fan_out, Some(info.fan_out))?,
                        })
                    })
                    .collect::<Result<Vec<_>>>()
                    .map(Some))
            },
        )
    }
    /// One callback: a forward pass with a hook on the last layer.
    fn last_layer_features(&self, x: &DMatrix<f64>) -> Result<DMatrix<f64>> {
        self.check_x(x)?;
        let fan_in = self.require_layers("last-layer features")?.fan_in;
        self.call(
            "last_layer_features",
            |py| vec![to_numpy(py, x).into_any(), self.layer_list(py)],
            x.nrows(),
            Some(fan_in),
        )
    }
    /// One callback: a forward pass with a hook on the last layer, returning the outputs and
    /// the hooked inputs (a last-layer fit's and predictive's one pass over the points).
    fn forward_with_last_layer_features(&self, x: &DMatrix<f64>) -> Result<(DMatrix<f64>, DMatrix<f64>)> {
        if !self.features_with_forward {
            return Ok((self.forward(x)?, self.last_layer_features(x)?));
        }
        self.check_x(x)?;
        let fan_in = self.require_layers("last-layer features")?.fan_in;
        let method = "forward_with_features";
        let (n, q) = (x.nrows(), self.output_dim);
        self.call_with(
            method,
            |py| vec![to_numpy(py, x).into_any(), self.layer_list(py)],
            |r| {
                let (f, phi) = r.extract::<(PyReadonlyArray2<'_, f64>, PyReadonlyArray2<'_, f64>)>()?;
                Ok(checked_matrix(method, &f, n, Some(q))
                    .and_then(|f| Ok((f, checked_matrix(method, &phi, n, Some(fan_in))?))))
            },
        )
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
/// `params` (flat float64, `named_parameters()` order), `input_dim`, `output_dim` and, optionally,
/// `column_bytes` (see [`DEFAULT_COLUMN_BYTES`]); `layers`, when given, is
/// `TorchCalls.layer_infos(…)`'s list (see the module docs).
pub(crate) fn callback_network(
    calls: &Bound<'_, PyAny>,
    layers: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyNetwork> {
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
    let p = params.len();
    let mut net = CallbackNetwork::new(calls.clone().unbind(), params, input_dim, output_dim);
    if calls.hasattr("column_bytes")? {
        net.column_bytes = calls.getattr("column_bytes")?.extract()?;
        if net.column_bytes == 0 {
            return Err(value_error("column_bytes must be positive"));
        }
    }
    net.factor_sums = calls.hasattr("kfac_factor_sums")?;
    net.features_with_forward = calls.hasattr("forward_with_features")?;
    if let Some(list) = layers {
        let infos = list.try_iter()?.map(|d| layer_info(&d?, p)).collect::<PyResult<Vec<_>>>()?;
        if infos.is_empty() {
            return Err(value_error("the model reports no weight layer"));
        }
        net.layers = Arc::new(infos);
        net.layer_dicts = Some(Arc::new(list.clone().unbind()));
    }
    Ok(PyNetwork::Torch(net))
}

/// One of `TorchCalls.layer_infos`'s dicts as a [`LayerInfo`], its ranges checked against the
/// `p` parameters.
fn layer_info(d: &Bound<'_, PyAny>, p: usize) -> PyResult<LayerInfo> {
    let name: String = d.get_item("name")?.extract()?;
    let positions: usize = d.get_item("positions")?.extract()?;
    let (fan_in, fan_out): (usize, usize) =
        (d.get_item("fan_in")?.extract()?, d.get_item("fan_out")?.extract()?);
    let range = |key: &str| -> PyResult<std::ops::Range<usize>> {
        let [a, b]: [usize; 2] = d.get_item(key)?.extract()?;
        Ok(a..b)
    };
    let (weight, bias) = (range("weight")?, range("bias")?);
    if positions == 0
        || fan_in == 0
        || fan_out == 0
        || weight.len() != fan_in * fan_out
        || !(bias.len() == fan_out || bias.is_empty())
        || weight.end > p
        || bias.end > p
    {
        return Err(value_error(format!(
            "layer {name}: weight {weight:?} / bias {bias:?} do not hold a {fan_out} × {fan_in} weight and {fan_out} \
             biases (or none) within the {p} parameters (positions {positions})"
        )));
    }
    let kind = if positions == 1 { LayerKind::Dense } else { LayerKind::Conv { positions } };
    Ok(LayerInfo { name, kind, weight, bias, fan_in, fan_out })
}

/// The Python reduce step of a sharded fit: post-hoc FSP-Laplace's `callback(part,
/// fingerprint)` and the per-step `callback(part, failed)` of GFSVI and of Laplace's
/// multi-pass structures return the sum of every process's `part` (the Python layer
/// all-reduces it over the process group). Its exception is kept and raised when the fit
/// returns.
pub(crate) struct PyReduce {
    callback: Py<PyAny>,
    /// The callback's first exception.
    pub error: Option<PyErr>,
}

impl PyReduce {
    pub(crate) fn new(callback: Py<PyAny>) -> Self {
        Self { callback, error: None }
    }

    /// `callback(part, failed)`: the sum of every process's `part`; `None` when the callback
    /// raised (another process failed, or the engine did) — the exception is kept in `error`.
    pub(crate) fn call_vector(&mut self, part: &DVector<f64>, failed: bool) -> Option<DVector<f64>> {
        let n = part.len();
        let out = Python::attach(|py| -> PyResult<DVector<f64>> {
            let array = PyArray1::from_slice(py, part.as_slice());
            let summed = self.callback.call1(py, (array, failed))?;
            let values: PyReadonlyArray1<'_, f64> = summed.bind(py).extract()?;
            let values = values.as_slice()?;
            if values.len() != n {
                return Err(value_error(format!("the reduce step returned {} values for {n}", values.len())));
            }
            Ok(DVector::from_column_slice(values))
        });
        out.map_err(|e| self.error = Some(e)).ok()
    }

    /// [`call_vector`](Self::call_vector) as a sharded fit's reduce step: where the callback
    /// raised, the method's input error naming `method` (the exception itself is kept).
    pub(crate) fn step<E: From<fspace_input::InputError>>(
        &mut self,
        method: &'static str,
    ) -> impl FnMut(DVector<f64>, bool) -> Result<DVector<f64>, E> + '_ {
        move |part, failed| {
            self.call_vector(&part, failed).ok_or_else(|| {
                E::from(fspace_input::InputError::Invalid {
                    what: "the sum over the processes",
                    reason: format!("the reduce step of {method} failed"),
                })
            })
        }
    }

    /// Post-hoc FSP-Laplace's one reduce: `callback(part, fingerprint)`.
    pub(crate) fn call(
        &mut self,
        part: DMatrix<f64>,
        fingerprint: &[f64],
    ) -> fspace_fsp_laplace::Result<DMatrix<f64>> {
        let k = part.nrows();
        let out = Python::attach(|py| -> PyResult<DMatrix<f64>> {
            let summed = self.callback.call1(py, (to_numpy(py, &part), fingerprint.to_vec()))?;
            let array: PyReadonlyArray2<'_, f64> = summed.bind(py).extract()?;
            Ok(matrix(&array))
        });
        out.map_err(|e| {
            self.error = Some(e);
            fspace_fsp_laplace::FspError::Input(fspace_input::InputError::Invalid {
                what: "the sum over the processes",
                reason: format!("the reduce step of the {k} × {k} curvature part failed"),
            })
        })
    }
}

/// Training rows behind a Python callable (`fspace_core::RowSource`): `read(positions)` — an
/// int64 array of row positions — returns `(X, y)`, float64 `b × d` and `b × t`, those rows in
/// that order (the Python layer reads them from a loader's map-style data set). The callable's
/// first exception is kept and raised when the fit returns.
pub(crate) struct PyRows {
    read: Py<PyAny>,
    n: usize,
    /// The callable's first exception.
    pub error: Option<PyErr>,
}

impl PyRows {
    pub(crate) fn new(read: Py<PyAny>, n: usize) -> Self {
        Self { read, n, error: None }
    }
}

impl fspace_core::RowSource for PyRows {
    fn len(&self) -> usize {
        self.n
    }
    fn rows(&mut self, positions: &[usize]) -> fspace_core::Result<(DMatrix<f64>, DVector<f64>)> {
        let out = Python::attach(|py| -> PyResult<(DMatrix<f64>, DVector<f64>)> {
            let at: Vec<i64> = positions.iter().map(|&i| i as i64).collect();
            let got = self.read.call1(py, (numpy::PyArray1::from_vec(py, at),))?;
            let (x, y): (PyReadonlyArray2<'_, f64>, PyReadonlyArray2<'_, f64>) = got.bind(py).extract()?;
            Ok((matrix(&x), fspace_core::fit::flatten(&matrix(&y))))
        });
        out.map_err(|e| {
            let text = e.to_string();
            self.error.get_or_insert(e);
            fspace_core::CoreError::Input(fspace_input::InputError::Invalid {
                what: "rows read from the data loader",
                reason: text,
            })
        })
    }
}
