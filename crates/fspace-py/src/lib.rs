//! # fspace-py
//!
//! The compiled module `fspace._fspace` of the Python package `fspace` (built by maturin from
//! `crates/fspace-py/pyproject.toml`). The pure-Python layer in `python/fspace/` turns a
//! PyTorch `nn.Sequential` (or a `state_dict` of numpy arrays) into the arguments here; this
//! module owns the numbers:
//!
//! * `PyLaplace` (`fspace._fspace.Laplace`): the linearised Laplace approximation of an MLP
//!   given as PyTorch's named tensors (`0.weight`, `0.bias`, `2.weight`, … in natural order)
//!   and one activation, in laplace-torch's vocabulary (`"regression"` / `"classification"`,
//!   `hessian_structure` `"full" | "kron" | "diag" | "lowrank" | "ekfac"`, `subset_of_weights`
//!   `"all" | "last_layer"`, `prior_precision`, `sigma_noise`, `temperature`); `fit`,
//!   `optimize_prior_precision`, `predict`, `log_marginal_likelihood`, `sample`, and pickling
//!   through the posterior's versioned JSON.
//!
//! Long calls (`fit`, the prior-precision searches, predictions) release the GIL. Errors keep
//! the Rust error's text and map by kind: bad input → `ValueError`, an unsupported request →
//! `NotImplementedError`, a curvature over its size limit → `MemoryError`, a numerical
//! failure → `fspace.NumericalError`. No input reaches a Rust panic.

use fspace_core::{CoreError, Data, LikelihoodSpec, Link, Persist, PersistError, Posterior};
use fspace_interop::{infer_mlp, InteropError, LayerNames, SourceDtype, Tensor, Tensors};
use fspace_laplace::{
    LaplaceConfig, LaplaceError, LaplacePosterior, MarglikConfig, Predictive, PriorPrecision, Structure,
    Weights,
};
use fspace_nn::{Activation, Mlp, NnError};
use nalgebra::{DMatrix, DVector};
use numpy::ndarray::Array2;
use numpy::{PyArray2, PyReadonlyArray1, PyReadonlyArray2};
use pyo3::exceptions::{PyMemoryError, PyNotImplementedError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

pyo3::create_exception!(
    _fspace,
    NumericalError,
    PyRuntimeError,
    "A numerical failure inside fspace (a matrix that is not positive definite, an iteration that broke down)."
);

/// The Python exception for a Laplace error, by kind; the message is the Rust error's text.
fn laplace_error(e: LaplaceError) -> PyErr {
    let text = e.to_string();
    exception(&e, text)
}

/// The exception class of `e` (a `CoreError::Method` is classed by the error it wraps), with
/// the message `text`.
fn exception(e: &LaplaceError, text: String) -> PyErr {
    if let LaplaceError::Core(CoreError::Method { source, .. }) = e {
        if let Some(inner) = source.downcast_ref::<LaplaceError>() {
            return exception(inner, text);
        }
    }
    match e {
        LaplaceError::Input(_)
        | LaplaceError::Nn(NnError::Input(_))
        | LaplaceError::Core(CoreError::Input(_)) => PyValueError::new_err(text),
        LaplaceError::Core(CoreError::InvalidTarget { .. }) => PyValueError::new_err(text),
        LaplaceError::Unsupported { .. }
        | LaplaceError::Nn(NnError::Unsupported { .. })
        | LaplaceError::Core(CoreError::Unsupported { .. }) => PyNotImplementedError::new_err(text),
        LaplaceError::TooLarge { .. } => PyMemoryError::new_err(text),
        _ => NumericalError::new_err(text),
    }
}

fn core_error(e: CoreError) -> PyErr {
    laplace_error(LaplaceError::Core(e))
}

fn persist_error(e: PersistError) -> PyErr {
    PyValueError::new_err(format!("not a saved fspace Laplace posterior: {e}"))
}

fn interop_error(e: InteropError) -> PyErr {
    PyValueError::new_err(e.to_string())
}

/// A 2-D float64 numpy array as a matrix (any strides; copied).
fn matrix(a: &PyReadonlyArray2<'_, f64>) -> DMatrix<f64> {
    let v = a.as_array();
    DMatrix::from_fn(v.nrows(), v.ncols(), |i, j| v[[i, j]])
}

fn to_numpy<'py>(py: Python<'py>, m: &DMatrix<f64>) -> Bound<'py, PyArray2<f64>> {
    PyArray2::from_owned_array(py, Array2::from_shape_fn((m.nrows(), m.ncols()), |(i, j)| m[(i, j)]))
}

fn activation(name: &str) -> PyResult<Activation> {
    Ok(match name {
        "tanh" => Activation::Tanh,
        "relu" => Activation::Relu,
        "sigmoid" => Activation::Sigmoid,
        "softplus" => Activation::Softplus,
        "gelu_tanh" => Activation::Gelu,
        other => {
            return Err(PyValueError::new_err(format!(
                "activation {other:?} is not supported; fspace's MLP has tanh, relu, sigmoid, softplus and gelu_tanh \
                 (nn.GELU(approximate=\"tanh\"))"
            )))
        }
    })
}

/// The network of a `state_dict`: name → (shape, row-major float64 values as a 1-D array,
/// whether the source was float32).
fn network(state: &Bound<'_, PyDict>, act: Activation) -> PyResult<Mlp> {
    let mut tensors = Tensors::new("state_dict");
    for (key, value) in state.iter() {
        let name: String = key.extract()?;
        let (shape, values, f32_source): (Vec<usize>, PyReadonlyArray1<'_, f64>, bool) = value.extract()?;
        let data = values.as_array().iter().copied().collect();
        let dtype = if f32_source { SourceDtype::F32 } else { SourceDtype::F64 };
        tensors.insert(&name, Tensor::new(&name, shape, data, dtype).map_err(interop_error)?);
    }
    infer_mlp(&tensors, act, &LayerNames::Natural).map_err(interop_error)
}

fn structure(name: &str) -> PyResult<Structure> {
    Ok(match name {
        "full" => Structure::Full(Default::default()),
        "kron" => Structure::Kfac,
        "ekfac" => Structure::Ekfac,
        "diag" => Structure::Diag,
        "lowrank" => Structure::LowRank(Default::default()),
        other => {
            return Err(PyValueError::new_err(format!(
            "hessian_structure {other:?} is not one of \"full\", \"kron\", \"ekfac\", \"diag\", \"lowrank\""
        )))
        }
    })
}

/// The linearised Laplace approximation of an MLP (module docs).
#[pyclass(name = "Laplace", module = "fspace._fspace")]
struct PyLaplace {
    net: Mlp,
    likelihood: LikelihoodSpec,
    config: LaplaceConfig,
    posterior: Option<LaplacePosterior<Mlp>>,
}

impl PyLaplace {
    fn fitted(&self) -> PyResult<&LaplacePosterior<Mlp>> {
        self.posterior.as_ref().ok_or_else(|| PyRuntimeError::new_err("call fit(X, y) first"))
    }
    fn fitted_mut(&mut self) -> PyResult<&mut LaplacePosterior<Mlp>> {
        self.posterior.as_mut().ok_or_else(|| PyRuntimeError::new_err("call fit(X, y) first"))
    }
    fn classification(&self) -> bool {
        matches!(self.likelihood, LikelihoodSpec::Categorical { .. })
    }
}

#[pymethods]
impl PyLaplace {
    /// `Laplace(state, activation, likelihood, hessian_structure, subset_of_weights,
    /// prior_precision, sigma_noise, temperature)`; `state` maps each tensor name to
    /// `(shape, row-major float64 values, was_float32)`.
    #[new]
    #[pyo3(signature = (state, activation_name, likelihood, hessian_structure="kron", subset_of_weights="all", prior_precision=1.0, sigma_noise=1.0, temperature=1.0))]
    fn new(
        state: &Bound<'_, PyDict>,
        activation_name: &str,
        likelihood: &str,
        hessian_structure: &str,
        subset_of_weights: &str,
        prior_precision: f64,
        sigma_noise: f64,
        temperature: f64,
    ) -> PyResult<Self> {
        let net = network(state, activation(activation_name)?)?;
        let q = net.output_dim();
        let likelihood = match likelihood {
            "regression" if q == 1 => LikelihoodSpec::gaussian(sigma_noise),
            "regression" => {
                LikelihoodSpec::IsotropicGaussian { sigma: sigma_noise, outputs: q, learn: false }
            }
            "classification" if q >= 2 => LikelihoodSpec::categorical(q),
            "classification" => {
                return Err(PyValueError::new_err(
                    "classification needs a network with one output per class (≥ 2 logits)",
                ))
            }
            other => {
                return Err(PyValueError::new_err(format!(
                    "likelihood {other:?} is not \"regression\" or \"classification\""
                )))
            }
        };
        let weights = match subset_of_weights {
            "all" => Weights::All,
            "last_layer" => Weights::LastLayer,
            other => {
                return Err(PyValueError::new_err(format!(
                    "subset_of_weights {other:?} is not \"all\" or \"last_layer\""
                )))
            }
        };
        let config = LaplaceConfig {
            structure: structure(hessian_structure)?,
            weights,
            prior_precision: PriorPrecision::Scalar(prior_precision),
            temperature,
            ..Default::default()
        };
        // Checks λ, T and σ now rather than at fit.
        if !(prior_precision.is_finite() && prior_precision > 0.0) {
            return Err(PyValueError::new_err(format!(
                "prior_precision {prior_precision} must be finite and > 0"
            )));
        }
        if !(temperature.is_finite() && temperature > 0.0) {
            return Err(PyValueError::new_err(format!("temperature {temperature} must be finite and > 0")));
        }
        likelihood.build().map_err(core_error)?;
        Ok(Self { net, likelihood, config, posterior: None })
    }

    /// Fits the curvature at the network's weights on `(X, y)`: `X` is `n × d`, `y` is `n × d'`
    /// (regression) or `n` class labels (classification).
    fn fit(
        &mut self,
        py: Python<'_>,
        x: PyReadonlyArray2<'_, f64>,
        y: PyReadonlyArray2<'_, f64>,
    ) -> PyResult<()> {
        let (x, y) = (matrix(&x), matrix(&y));
        let (net, lik, config) = (self.net.clone(), self.likelihood, self.config.clone());
        let posterior = py.detach(move || -> Result<_, LaplaceError> {
            let data = Data::new(&x, &y).map_err(LaplaceError::Core)?;
            Ok(fspace_laplace::fit(net, lik, &data, &config)?.posterior)
        });
        self.posterior = Some(posterior.map_err(laplace_error)?);
        Ok(())
    }

    /// λ by the marginal likelihood (`"marglik"`) or by the validation NLL over `grid`
    /// (`"gridsearch"`, needs `x_val`, `y_val`); returns the chosen λ.
    #[pyo3(signature = (method="marglik", x_val=None, y_val=None, grid=None))]
    fn optimize_prior_precision(
        &mut self,
        py: Python<'_>,
        method: &str,
        x_val: Option<PyReadonlyArray2<'_, f64>>,
        y_val: Option<PyReadonlyArray2<'_, f64>>,
        grid: Option<Vec<f64>>,
    ) -> PyResult<f64> {
        let post = self.fitted_mut()?;
        match method {
            "marglik" => {
                py.detach(|| post.optimize_prior_precision(&MarglikConfig::default()))
                    .map_err(laplace_error)?;
                Ok(post.prior_precision()[0])
            }
            "gridsearch" => {
                let (Some(xv), Some(yv)) = (x_val, y_val) else {
                    return Err(PyValueError::new_err("gridsearch needs x_val and y_val"));
                };
                let (xv, yv) = (matrix(&xv), matrix(&yv));
                let yv = DVector::from_iterator(yv.len(), yv.transpose().iter().copied());
                let grid =
                    grid.unwrap_or_else(|| (0..21).map(|i| 10f64.powf(-4.0 + 0.4 * i as f64)).collect());
                py.detach(|| post.gridsearch_prior_precision(&grid, &xv, &yv)).map_err(laplace_error)?;
                Ok(post.prior_precision()[0])
            }
            other => {
                Err(PyValueError::new_err(format!("method {other:?} is not \"marglik\" or \"gridsearch\"")))
            }
        }
    }

    /// Regression: `(mean, variance)` of `f` (`n × d'` each). Classification: class
    /// probabilities (`n × C`) by `link_approx` `"probit" | "bridge" | "mc"` (`n_samples`
    /// draws from `seed`). `pred_type` `"glm"` (the linearised predictive) or `"nn"`
    /// (the network at weight samples).
    #[pyo3(signature = (x, pred_type="glm", link_approx="probit", n_samples=100, seed=0))]
    fn predict<'py>(
        &mut self,
        py: Python<'py>,
        x: PyReadonlyArray2<'py, f64>,
        pred_type: &str,
        link_approx: &str,
        n_samples: usize,
        seed: u64,
    ) -> PyResult<Py<PyAny>> {
        let classification = self.classification();
        let predictive = match pred_type {
            "glm" => Predictive::Glm,
            "nn" => Predictive::Nonlinear { samples: n_samples, seed },
            other => {
                return Err(PyValueError::new_err(format!("pred_type {other:?} is not \"glm\" or \"nn\"")))
            }
        };
        let link = match link_approx {
            "probit" => Link::Probit,
            "bridge" => Link::LaplaceBridge,
            "mc" => Link::MonteCarlo { samples: n_samples, seed },
            other => {
                return Err(PyValueError::new_err(format!(
                    "link_approx {other:?} is not \"probit\", \"bridge\" or \"mc\""
                )))
            }
        };
        let post = self.fitted_mut()?;
        post.set_predictive(predictive).map_err(laplace_error)?;
        let x = matrix(&x);
        if classification {
            let p = py.detach(|| post.class_probabilities(&x, &link)).map_err(core_error)?;
            Ok(to_numpy(py, &p).into_any().unbind())
        } else {
            let f = py.detach(|| post.predict(&x)).map_err(core_error)?;
            Ok(PyTuple::new(py, [to_numpy(py, &f.mean), to_numpy(py, &f.var)])?.into_any().unbind())
        }
    }

    /// The Laplace log marginal likelihood at the current λ and T.
    fn log_marginal_likelihood(&self, py: Python<'_>) -> PyResult<f64> {
        let post = self.fitted()?;
        py.detach(|| post.log_marginal_likelihood()).map_err(laplace_error)
    }

    /// `n` weight samples from the posterior (`n × p`, the weights in PyTorch's
    /// `named_parameters()` order; weights outside the subset at their MAP values).
    #[pyo3(signature = (n_samples=100, seed=0))]
    fn sample<'py>(
        &self,
        py: Python<'py>,
        n_samples: usize,
        seed: u64,
    ) -> PyResult<Bound<'py, PyArray2<f64>>> {
        use rand::SeedableRng;
        let post = self.fitted()?;
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let draws = py.detach(|| post.sample_weights(n_samples, &mut rng)).map_err(laplace_error)?;
        let p = self.net.n_params();
        let m = DMatrix::from_fn(draws.len(), p, |i, j| draws[i][j]);
        Ok(to_numpy(py, &m))
    }

    /// The prior precision λ (per layer when it was optimised per layer).
    #[getter]
    fn prior_precision(&self) -> PyResult<Vec<f64>> {
        Ok(self.fitted()?.prior_precision().to_vec())
    }

    /// Whether `fit` has run.
    #[getter]
    fn is_fitted(&self) -> bool {
        self.posterior.is_some()
    }

    /// The fitted posterior as fspace's versioned JSON (what `pickle` stores).
    fn to_json(&self) -> PyResult<String> {
        self.fitted()?.to_json().map_err(persist_error)
    }

    /// A fitted posterior from [`to_json`](Self::to_json)'s text (checked as every fspace load is).
    #[staticmethod]
    fn from_json(text: &str) -> PyResult<Self> {
        let post = LaplacePosterior::<Mlp>::from_json(text).map_err(persist_error)?;
        let likelihood = post
            .likelihood()
            .ok_or_else(|| PyValueError::new_err("the saved posterior names no likelihood"))?;
        Ok(Self {
            net: post.network().clone(),
            likelihood,
            config: LaplaceConfig::default(),
            posterior: Some(post),
        })
    }

    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<(Bound<'py, PyAny>, (String,))> {
        let from_json = slf.get_type().getattr("from_json")?;
        Ok((from_json, (slf.borrow().to_json()?,)))
    }
}

/// The compiled half of the `fspace` Python package.
#[pymodule]
fn _fspace(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyLaplace>()?;
    m.add("NumericalError", m.py().get_type::<NumericalError>())?;
    Ok(())
}
