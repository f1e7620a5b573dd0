//! The function-space methods across the boundary: one pyclass per method
//! ([`classes`]: `FspLaplace`, `FspLaplacePosthoc`, `Gfsvi`, `Valla`, `Ella`, `ExactGp`), made
//! from typed settings and fitting one data-source type ([`source`]: `DataSource`), each fit
//! returning a `fspace._fspace.Posterior` with one predictive surface.
//!
//! ```text
//! fspace.FSPLaplace ─▶ _fspace.FspLaplace(settings…) ─fit(DataSource)─▶ fspace_fsp_laplace::fit_* ─▶ Posterior
//! ```
//!
//! A method's settings arrive as a dict of its Rust `Config` (`Class.defaults()` gives the
//! paper's values; the Python layer overlays the user's keyword arguments and refuses unknown
//! keys), its prior as the dict of a `GpPrior` (the Python `fspace.GPPrior`'s `spec()`), both
//! read through serde (`pythonize`) when the object is made; the fit's report comes back as a
//! dict.

pub(crate) mod classes;
pub(crate) mod source;

use fspace_core::{Link, Observer, Persist, Posterior, Progress};
use fspace_fsp_laplace::FspLaplace;
use fspace_gfsvi::LinearizedPosterior;
use fspace_gp::ExactGp;
use fspace_kernels::SharedKernel;
use fspace_nn::Network;
use fspace_valla::{EllaPosterior, VallaPosterior};
use numpy::{PyArray1, PyArray2, PyArray3, PyReadonlyArray2};
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use serde::Serialize;

use crate::callback::{CallbackErrors, PyNetwork};
use crate::convert::{matrix, stack_to_numpy, to_numpy, to_py};
use crate::errors::{persist_error, value_error};
use crate::interrupt::detach_interruptible;

/// A fitted posterior of one of the methods.
#[derive(Clone)]
pub(crate) enum Fit {
    Fsp(FspLaplace<PyNetwork>),
    Gfsvi(LinearizedPosterior<PyNetwork>),
    Valla(VallaPosterior<PyNetwork>),
    Ella(EllaPosterior<PyNetwork>),
    Gp(ExactGp<SharedKernel>),
}

impl Fit {
    fn method(&self) -> &'static str {
        match self {
            Fit::Fsp(_) => "fsp_laplace",
            Fit::Gfsvi(_) => "gfsvi",
            Fit::Valla(_) => "valla",
            Fit::Ella(_) => "ella",
            Fit::Gp(_) => "exact_gp",
        }
    }

    /// The `fspace._fspace` class whose `load_posterior` reads this posterior back.
    fn class_name(&self) -> &'static str {
        match self {
            Fit::Fsp(_) => "FspLaplace",
            Fit::Gfsvi(_) => "Gfsvi",
            Fit::Valla(_) => "Valla",
            Fit::Ella(_) => "Ella",
            Fit::Gp(_) => "ExactGp",
        }
    }

    fn posterior(&self) -> &dyn Posterior {
        match self {
            Fit::Fsp(p) => p,
            Fit::Gfsvi(p) => p,
            Fit::Valla(p) => p,
            Fit::Ella(p) => p,
            Fit::Gp(p) => p,
        }
    }

    /// The network's weights where the method trains them (FSP-Laplace: the MAP under the
    /// prior; GFSVI: the variational mean); `None` for the GP and the post-hoc methods, whose
    /// weights are the caller's.
    fn trained_params(&self) -> Option<Vec<f64>> {
        match self {
            Fit::Fsp(p) => Some(p.network().params().as_slice().to_vec()),
            Fit::Gfsvi(p) => Some(p.network().params().as_slice().to_vec()),
            Fit::Valla(_) | Fit::Ella(_) | Fit::Gp(_) => None,
        }
    }

    fn to_json(&self) -> Result<String, fspace_core::PersistError> {
        match self {
            Fit::Fsp(p) => p.to_json(),
            Fit::Gfsvi(p) => p.to_json(),
            Fit::Valla(p) => p.to_json(),
            Fit::Ella(p) => p.to_json(),
            Fit::Gp(p) => p.to_json(),
        }
    }
}

/// Calls the Python `callback(step, total, loss, validation)` at each of a fit's reports,
/// taking the GIL for the call only. The first exception the callback raises is kept and
/// raised when the fit returns; the loop stops at its next interrupt check
/// (`fspace_input::interrupt`, polled through `src/interrupt.rs`).
pub(crate) struct PyProgress {
    pub(crate) callback: Option<Py<PyAny>>,
    pub(crate) error: Option<PyErr>,
    /// Set when the callback raises: the fit stops at its next interrupt check.
    pub(crate) stop: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
}

impl Observer for PyProgress {
    fn observe(&mut self, p: &Progress) {
        let (Some(callback), None) = (&self.callback, &self.error) else { return };
        Python::attach(|py| {
            if let Err(e) = callback.call1(py, (p.step, p.total, p.loss, p.validation)) {
                self.error = Some(e);
                if let Some(stop) = &self.stop {
                    stop.store(true, std::sync::atomic::Ordering::Relaxed);
                }
            }
        });
    }
}

/// A fit's report as a JSON value.
pub(crate) fn report<T: Serialize>(value: &T) -> PyResult<serde_json::Value> {
    serde_json::to_value(value).map_err(|e| value_error(e.to_string()))
}

/// A fitted posterior of a method's `fit`: predictive, samples, weights, pickling.
#[pyclass(name = "Posterior", module = "fspace._fspace")]
pub(crate) struct PyPosterior {
    fit: Fit,
    /// A torch model's callback exceptions (re-raised in place of the error they caused).
    errors: CallbackErrors,
}

impl PyPosterior {
    pub(crate) fn new(fit: Fit, errors: CallbackErrors) -> Self {
        Self { fit, errors }
    }
}

fn link(name: &str, n_samples: usize, seed: u64) -> PyResult<Link> {
    Ok(match name {
        "probit" => Link::Probit,
        "bridge" => Link::LaplaceBridge,
        "mc" => Link::MonteCarlo { samples: n_samples, seed },
        other => {
            return Err(value_error(format!("link_approx {other:?} is not \"probit\", \"bridge\" or \"mc\"")))
        }
    })
}

#[pymethods]
impl PyPosterior {
    /// The method's name (`"fsp_laplace"`, `"gfsvi"`, `"valla"`, `"ella"`, `"exact_gp"`).
    #[getter]
    fn method(&self) -> &'static str {
        self.fit.method()
    }

    /// Outputs per input (`d'`).
    #[getter]
    fn output_dim(&self) -> usize {
        self.fit.posterior().output_dim()
    }

    /// `(mean, variance)` of `f` at the rows of `x` (`n × d'` each); with `observation_noise`
    /// the likelihood's σ² is added (regression only).
    #[pyo3(signature = (x, observation_noise=false))]
    fn predict<'py>(
        &self,
        py: Python<'py>,
        x: PyReadonlyArray2<'py, f64>,
        observation_noise: bool,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let x = matrix(&x);
        let post = self.fit.posterior();
        let f = detach_interruptible(
            py,
            || if observation_noise { post.predict_y(&x) } else { post.predict(&x) },
            |e| self.errors.raise(e),
        )?;
        PyTuple::new(py, [to_numpy(py, &f.mean), to_numpy(py, &f.var)])
    }

    /// Class probabilities (`n × C`) by `link_approx` `"probit" | "bridge" | "mc"`.
    #[pyo3(signature = (x, link_approx="probit", n_samples=100, seed=0))]
    fn class_probabilities<'py>(
        &self,
        py: Python<'py>,
        x: PyReadonlyArray2<'py, f64>,
        link_approx: &str,
        n_samples: usize,
        seed: u64,
    ) -> PyResult<Bound<'py, PyArray2<f64>>> {
        let link = link(link_approx, n_samples, seed)?;
        let x = matrix(&x);
        let post = self.fit.posterior();
        let p = detach_interruptible(py, || post.class_probabilities(&x, &link), |e| self.errors.raise(e))?;
        Ok(to_numpy(py, &p))
    }

    /// `n_samples` joint function draws at the rows of `x` (`n_samples × n × d'`), seeded.
    #[pyo3(signature = (x, n_samples=100, seed=0))]
    fn sample_functions<'py>(
        &self,
        py: Python<'py>,
        x: PyReadonlyArray2<'py, f64>,
        n_samples: usize,
        seed: u64,
    ) -> PyResult<Bound<'py, PyArray3<f64>>> {
        use rand::SeedableRng;
        let x = matrix(&x);
        let post = self.fit.posterior();
        let q = post.output_dim();
        let draws = detach_interruptible(
            py,
            || {
                let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
                post.sample_functions(&x, n_samples, &mut rng)
            },
            |e| self.errors.raise(e),
        )?;
        Ok(stack_to_numpy(py, &draws, x.nrows(), q))
    }

    /// The trained weights in `named_parameters()` order (FSP-Laplace: the MAP under the prior;
    /// GFSVI: the variational mean), or `None` where the method keeps the caller's.
    fn trained_params<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyArray1<f64>>> {
        self.fit.trained_params().map(|p| PyArray1::from_vec(py, p))
    }

    /// The likelihood the posterior was fitted under (σ at its fitted value), as a dict.
    fn likelihood<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        self.fit.posterior().likelihood().map(|l| to_py(py, &l)).transpose()
    }

    /// The posterior as fspace's versioned JSON (what `pickle` stores).
    fn to_json(&self) -> PyResult<String> {
        self.fit.to_json().map_err(|e| persist_error(&format!("{} posterior", self.fit.method()), e))
    }

    /// Pickled as its method class's `load_posterior` of its JSON.
    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<(Bound<'py, PyAny>, (String,))> {
        let this = slf.borrow();
        let class = slf.py().import("fspace._fspace")?.getattr(this.fit.class_name())?;
        Ok((class.getattr("load_posterior")?, (this.to_json()?,)))
    }
}
