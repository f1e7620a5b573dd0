//! Conversions between Python's arguments and fspace's types: numpy arrays ↔ matrices, a
//! `state_dict` (+ a CNN's architecture) → a [`NativeNetwork`], laplace-torch's likelihood names → a [`LikelihoodSpec`].

use fspace_core::LikelihoodSpec;
use fspace_interop::{infer_mlp, load_cnn, LayerNames, SourceDtype, Tensor, Tensors};
use fspace_nn::{Activation, CnnConfig, ConvBlock, NativeNetwork};
use nalgebra::DMatrix;
use numpy::ndarray::{Array2, Array3, ShapeBuilder};
use numpy::{PyArray2, PyArray3, PyReadonlyArray1, PyReadonlyArray2};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::errors::{raise, value_error};

/// A Python value (dicts, lists, strings, numbers, `None`) as the serde type `T`; `what` names
/// it in the error (`"the fsp_laplace settings: missing field …"`).
pub(crate) fn from_py<T: DeserializeOwned>(what: &str, value: &Bound<'_, PyAny>) -> PyResult<T> {
    pythonize::depythonize(value).map_err(|e| value_error(format!("{what}: {e}")))
}

/// A serde value as Python dicts, lists, strings and numbers.
pub(crate) fn to_py<'py, T: Serialize>(py: Python<'py>, value: &T) -> PyResult<Bound<'py, PyAny>> {
    pythonize::pythonize(py, value).map_err(|e| value_error(e.to_string()))
}

/// A 2-D float64 numpy array as a matrix (any strides; copied — one `memcpy` when the array
/// is column-major, as the callbacks' `p × r` results are).
pub(crate) fn matrix(a: &PyReadonlyArray2<'_, f64>) -> DMatrix<f64> {
    let v = a.as_array();
    match v.t().as_slice() {
        Some(column_major) => DMatrix::from_column_slice(v.nrows(), v.ncols(), column_major),
        None => DMatrix::from_fn(v.nrows(), v.ncols(), |i, j| v[[i, j]]),
    }
}

/// A matrix as a new 2-D numpy array.
pub(crate) fn to_numpy<'py>(py: Python<'py>, m: &DMatrix<f64>) -> Bound<'py, PyArray2<f64>> {
    PyArray2::from_owned_array(py, Array2::from_shape_fn((m.nrows(), m.ncols()), |(i, j)| m[(i, j)]))
}

/// Columns `cols` of a matrix as a new column-major (Fortran-ordered) 2-D numpy array: one
/// `memcpy` of that contiguous range of the matrix's storage. The callbacks hand `p × r` blocks
/// to torch this way — `m.T` is then C-contiguous on the Python side, so no second copy is made
/// (a ResNet-18's `p × 20` block is 1.8 GB; [`crate::callback`] sends it a few columns at a time).
pub(crate) fn columns_to_numpy<'py>(
    py: Python<'py>,
    m: &DMatrix<f64>,
    cols: std::ops::Range<usize>,
) -> Bound<'py, PyArray2<f64>> {
    let p = m.nrows();
    let data = m.as_slice()[cols.start * p..cols.end * p].to_vec();
    match Array2::from_shape_vec((p, cols.len()).f(), data) {
        Ok(a) => PyArray2::from_owned_array(py, a),
        Err(_) => to_numpy(py, &m.columns(cols.start, cols.len()).into_owned()), // unreachable: the shape is the range's own
    }
}

/// Equal-shaped matrices stacked as a 3-D numpy array (`len × rows × cols`).
pub(crate) fn stack_to_numpy<'py>(
    py: Python<'py>,
    ms: &[DMatrix<f64>],
    rows: usize,
    cols: usize,
) -> Bound<'py, PyArray3<f64>> {
    PyArray3::from_owned_array(py, Array3::from_shape_fn((ms.len(), rows, cols), |(s, i, j)| ms[s][(i, j)]))
}

/// fspace's activation of a name the Python layer derived from a torch module.
pub(crate) fn activation(name: &str) -> PyResult<Activation> {
    Ok(match name {
        "tanh" => Activation::Tanh,
        "relu" => Activation::Relu,
        "sigmoid" => Activation::Sigmoid,
        "softplus" => Activation::Softplus,
        "gelu_tanh" => Activation::Gelu,
        other => {
            return Err(value_error(format!(
                "activation {other:?} is not supported; fspace's MLP has tanh, relu, sigmoid, softplus and gelu_tanh \
                 (nn.GELU(approximate=\"tanh\"))"
            )))
        }
    })
}

/// A CNN's architecture as the Python layer reads it off an `nn.Sequential` (the weights'
/// shapes cannot tell padding or pooling): `input_shape` `[C, H, W]`, one block per `Conv2d`,
/// the hidden dense widths and the outputs. The activation comes separately.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CnnArchitecture {
    input_shape: (usize, usize, usize),
    convs: Vec<ConvBlock>,
    hidden: Vec<usize>,
    output_dim: usize,
}

/// The network of a `state_dict`: name → (shape, row-major float64 values as a 1-D array,
/// whether the source was float32). An MLP's layout is read off the weights' shapes; a CNN
/// needs `architecture` (a dict of a [`CnnArchitecture`]).
pub(crate) fn network(
    state: &Bound<'_, PyDict>,
    act: Activation,
    architecture: Option<&Bound<'_, PyAny>>,
) -> PyResult<NativeNetwork> {
    let mut tensors = Tensors::new("state_dict");
    for (key, value) in state.iter() {
        let name: String = key.extract()?;
        let (shape, values, f32_source): (Vec<usize>, PyReadonlyArray1<'_, f64>, bool) = value.extract()?;
        let data = values.as_array().iter().copied().collect();
        let dtype = if f32_source { SourceDtype::F32 } else { SourceDtype::F64 };
        tensors.insert(&name, Tensor::new(&name, shape, data, dtype).map_err(raise)?);
    }
    let Some(architecture) = architecture else {
        return Ok(infer_mlp(&tensors, act, &LayerNames::Natural).map_err(raise)?.into());
    };
    let arch: CnnArchitecture = from_py("the CNN architecture", architecture)?;
    let config = CnnConfig {
        input_shape: arch.input_shape,
        convs: arch.convs,
        hidden: arch.hidden,
        output_dim: arch.output_dim,
        activation: act,
        seed: 0,
    };
    Ok(load_cnn(&tensors, &config, &LayerNames::Natural).map_err(raise)?.into())
}

/// laplace-torch's likelihood name for a network (or GP) with `outputs` outputs:
/// `"regression"` → Gaussian noise σ (isotropic over several outputs, σ learned where the
/// method learns it and `learn_sigma`), `"classification"` → categorical over `outputs ≥ 2`
/// classes. σ is checked here, before any work.
pub(crate) fn likelihood(
    name: &str,
    outputs: usize,
    sigma: f64,
    learn_sigma: bool,
) -> PyResult<LikelihoodSpec> {
    let spec = match name {
        "regression" if outputs == 1 => LikelihoodSpec::Gaussian { sigma, learn: learn_sigma },
        "regression" => LikelihoodSpec::IsotropicGaussian { sigma, outputs, learn: learn_sigma },
        "classification" if outputs >= 2 => LikelihoodSpec::categorical(outputs),
        "classification" => {
            return Err(value_error("classification needs a network with one output per class (≥ 2 logits)"))
        }
        other => {
            return Err(value_error(format!(
                "likelihood {other:?} is not \"regression\" or \"classification\""
            )))
        }
    };
    spec.build().map_err(raise)?;
    Ok(spec)
}
