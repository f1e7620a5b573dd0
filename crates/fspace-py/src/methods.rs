//! The function-space methods in one call shape: `fit(method, X, y, …)` returns a
//! `fspace._fspace.Posterior` (FSP-Laplace, post-hoc FSP-Laplace, GFSVI, VaLLA, ELLA or the exact
//! GP) with one predictive surface.
//!
//! Every argument crosses the boundary by keyword. A method's settings arrive as a dict of its
//! Rust `Config` (`default_config(method)` gives the paper's values; the Python layer overlays
//! the user's keyword arguments and refuses unknown keys), its prior as the dict of a `GpPrior`
//! (the Python `fspace.GPPrior`'s `spec()`), both read through serde (`pythonize`); the fit's
//! report comes back as a dict.

use fspace_core::{Data, LikelihoodSpec, Link, Observer, Persist, Posterior, Progress};
use fspace_fsp_laplace::{FspConfig, FspLaplace};
use fspace_gfsvi::{GfsviConfig, KlPrior, LinearizedPosterior};
use fspace_gp::ExactGp;
use fspace_kernels::{GpPrior, SharedKernel};
use fspace_nn::Network;
use fspace_valla::{EllaConfig, EllaPosterior, VallaConfig, VallaPosterior};
use nalgebra::{DMatrix, DVector};
use numpy::{PyArray1, PyArray2, PyArray3, PyReadonlyArray2};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use serde::Serialize;

use crate::callback::{callback_network, CallbackErrors, PyNetwork, PyReduce, PyRows};
use crate::convert::{
    activation, from_py, likelihood as likelihood_spec, matrix, network, stack_to_numpy, to_numpy, to_py,
};
use crate::errors::{persist_error, raise, value_error};
use crate::interrupt::detach_interruptible;

/// The methods `fit` knows, by their Python names.
const METHODS: &str =
    "\"fsp_laplace\", \"fsp_laplace_posthoc\", \"gfsvi\", \"valla\", \"ella\", \"exact_gp\"";

/// A fitted posterior of one of the methods.
#[derive(Clone)]
enum Fit {
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

    fn from_json(method: &str, text: &str) -> PyResult<Self> {
        let what = format!("{method} posterior");
        let e = |e| persist_error(&what, e);
        Ok(match method {
            "fsp_laplace" => Fit::Fsp(FspLaplace::from_json(text).map_err(e)?),
            "gfsvi" => Fit::Gfsvi(LinearizedPosterior::from_json(text).map_err(e)?),
            "valla" => Fit::Valla(VallaPosterior::from_json(text).map_err(e)?),
            "ella" => Fit::Ella(EllaPosterior::from_json(text).map_err(e)?),
            "exact_gp" => Fit::Gp(ExactGp::from_json(text).map_err(e)?),
            other => return Err(value_error(format!("method {other:?} is not one of {METHODS}"))),
        })
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

/// A method's settings, read from the Python dict before the fit leaves the GIL.
enum Settings {
    Fsp(Box<FspConfig>),
    Gfsvi(Box<GfsviConfig>),
    Valla(Box<VallaConfig>),
    Ella(Box<EllaConfig>),
    Gp,
}

impl Settings {
    /// `method`'s settings from `config` (a dict with every field: the Python layer starts from
    /// [`default_config`]), or the paper's values when `config` is `None`.
    fn read(method: &str, config: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
        fn read<T: serde::de::DeserializeOwned + Default>(
            method: &str,
            c: Option<&Bound<'_, PyAny>>,
        ) -> PyResult<Box<T>> {
            match c {
                Some(c) => from_py(&format!("the {method} settings"), c).map(Box::new),
                None => Ok(Box::default()),
            }
        }
        Ok(match method {
            "fsp_laplace" | "fsp_laplace_posthoc" => Settings::Fsp(read(method, config)?),
            "gfsvi" => Settings::Gfsvi(read(method, config)?),
            "valla" => Settings::Valla(read(method, config)?),
            "ella" => Settings::Ella(read(method, config)?),
            "exact_gp" => Settings::Gp,
            other => return Err(value_error(format!("method {other:?} is not one of {METHODS}"))),
        })
    }
}

/// `method`'s default settings as a dict (the paper's values; see each crate's `Config`).
#[pyfunction]
pub(crate) fn default_config<'py>(py: Python<'py>, method: &str) -> PyResult<Bound<'py, PyAny>> {
    match Settings::read(method, None)? {
        Settings::Fsp(c) => to_py(py, &c),
        Settings::Gfsvi(c) => to_py(py, &c),
        Settings::Valla(c) => to_py(py, &c),
        Settings::Ella(c) => to_py(py, &c),
        Settings::Gp => to_py(py, &serde_json::Map::new()),
    }
}

/// A GP prior from the dict of a `GpPrior` (kernel spec and mean).
fn gp_prior(prior: &Bound<'_, PyAny>) -> PyResult<GpPrior> {
    from_py("the GP prior", prior)
}

/// The Gram matrix `K(X, Y)` (`n·d' × m·d'`, point-major) of a kernel given as the dict of a
/// `MatrixKernelSpec`.
#[pyfunction]
#[pyo3(signature = (*, kernel, x, y))]
pub(crate) fn gram<'py>(
    py: Python<'py>,
    kernel: &Bound<'py, PyAny>,
    x: PyReadonlyArray2<'py, f64>,
    y: PyReadonlyArray2<'py, f64>,
) -> PyResult<Bound<'py, PyArray2<f64>>> {
    let spec: fspace_kernels::MatrixKernelSpec = from_py("the kernel", kernel)?;
    let k = spec.build().map_err(raise)?;
    let (x, y) = (matrix(&x), matrix(&y));
    let g = py.detach(|| fspace_kernels::gram(&*k, &x, &y)).map_err(raise)?;
    Ok(to_numpy(py, &g))
}

/// `(½ (F − μ)ᵀ (Σ(C, C) + εI)⁻¹ (F − μ), α)` for function values `F` (`n_C × d'`) at the
/// context points `C` under the prior given as a `GpPrior`'s JSON, with FSP-Laplace's jitter
/// rule (`ε = jitter × mean prior variance`, more only if needed): the value of FSP-Laplace's
/// regulariser and its gradient `α` with respect to `F` (the torch loss term's backward).
#[pyfunction]
#[pyo3(signature = (*, prior, c, f, jitter))]
pub(crate) fn rkhs_norm<'py>(
    py: Python<'py>,
    prior: &Bound<'py, PyAny>,
    c: PyReadonlyArray2<'py, f64>,
    f: PyReadonlyArray2<'py, f64>,
    jitter: f64,
) -> PyResult<(f64, Bound<'py, PyArray2<f64>>)> {
    let prior = gp_prior(prior)?;
    let (c, f) = (matrix(&c), matrix(&f));
    let (value, alpha) = py
        .detach(|| {
            let context = fspace_fsp_laplace::ContextPrior::new(&prior, &c, f.ncols(), jitter)?;
            context.norm(&f)
        })
        .map_err(raise)?;
    Ok((value, to_numpy(py, &alpha)))
}

/// `(D̂_KL^γ, ∂/∂F, ∂/∂Σ_q)`: GFSVI's regularised KL (eqs. 7–8, 11)
/// `KL(N(F, Σ_q + γM·I) ‖ N(μ(C), K(C, C) + γM·I))` between the linearised network's Gaussian at
/// the `M` measurement points `C` — function values `F` (`M × d'`) and covariance `Σ_q = J S Jᵀ`
/// (`M·d'` square, point-major) — and the prior given as a `GpPrior`'s JSON, with its gradients
/// (the torch loss term's backward). `Σ_q` is symmetrised first, `(Σ_q + Σ_qᵀ)/2`, so the value
/// is a function of every entry and the gradient `½((K + γM·I)⁻¹ − (Σ_q + γM·I)⁻¹)` is its
/// derivative entry by entry.
#[pyfunction]
#[pyo3(signature = (*, prior, c, f, cov, gamma))]
#[allow(clippy::type_complexity)]
pub(crate) fn regularized_kl<'py>(
    py: Python<'py>,
    prior: &Bound<'py, PyAny>,
    c: PyReadonlyArray2<'py, f64>,
    f: PyReadonlyArray2<'py, f64>,
    cov: PyReadonlyArray2<'py, f64>,
    gamma: f64,
) -> PyResult<(f64, Bound<'py, PyArray2<f64>>, Bound<'py, PyArray2<f64>>)> {
    let prior = gp_prior(prior)?;
    let (c, f, cov) = (matrix(&c), matrix(&f), matrix(&cov));
    let (m, q) = (c.nrows(), prior.output_dim());
    if f.nrows() != m || f.ncols() != q {
        return Err(value_error(format!(
            "function values of shape {}×{} do not match {m} measurement points × {q} prior outputs",
            f.nrows(),
            f.ncols()
        )));
    }
    if cov.nrows() != m * q || cov.ncols() != m * q {
        return Err(value_error(format!(
            "the covariance is {}×{}; {m} measurement points × {q} outputs need {} square",
            cov.nrows(),
            cov.ncols(),
            m * q
        )));
    }
    let kl = py
        .detach(|| -> Result<_, fspace_gfsvi::GfsviError> {
            let mean_q = DVector::from_iterator(m * q, f.transpose().iter().copied());
            let cov_q = (&cov + cov.transpose()) * 0.5;
            let (mean_p, cov_p) = (prior.mean_at(&c)?, prior.gram(&c)?);
            fspace_gfsvi::regularized_kl(&mean_q, &cov_q, &mean_p, &cov_p, gamma, m, false)
        })
        .map_err(raise)?;
    let grad_f = DMatrix::from_row_slice(m, q, kl.grad_mean.as_slice());
    Ok((kl.value, to_numpy(py, &grad_f), to_numpy(py, &kl.grad_cov_q)))
}

/// GFSVI's objective `L = E_q[log p(y_b | f)]·n/b − D̂_KL^γ` (Gaussian likelihood) and its
/// gradients with respect to `(m, ρ = log √s, log σ_y)` on a native network (`state` +
/// `activation_name`): the Rust reference the torch loss terms of `fspace.torch` are checked
/// against. Returns `(L, expected log likelihood, divergence, ∂L/∂m, ∂L/∂ρ, ∂L/∂log σ_y)`.
#[pyfunction]
#[pyo3(signature = (*, state, activation_name, mean, log_std, log_noise_std, prior, x_b, y_b, n_total, x_m, gamma))]
#[allow(clippy::too_many_arguments)]
#[allow(clippy::type_complexity)]
pub(crate) fn gfsvi_objective<'py>(
    py: Python<'py>,
    state: &Bound<'py, PyDict>,
    activation_name: &str,
    mean: Vec<f64>,
    log_std: Vec<f64>,
    log_noise_std: f64,
    prior: &Bound<'py, PyAny>,
    x_b: PyReadonlyArray2<'py, f64>,
    y_b: PyReadonlyArray2<'py, f64>,
    n_total: usize,
    x_m: PyReadonlyArray2<'py, f64>,
    gamma: f64,
) -> PyResult<(f64, f64, f64, Bound<'py, PyArray1<f64>>, Bound<'py, PyArray1<f64>>, f64)> {
    let mut net = network(state, activation(activation_name)?, None)?;
    let prior = KlPrior::Gp(gp_prior(prior)?);
    let p = net.n_params();
    for (what, found) in [("mean", mean.len()), ("log_std", log_std.len())] {
        if found != p {
            return Err(value_error(format!("{what} has {found} entries; the network has {p} weights")));
        }
    }
    let params = fspace_gfsvi::VariationalParams {
        mean: DVector::from_vec(mean),
        log_std: DVector::from_vec(log_std),
        log_noise_std,
    };
    let (x_b, y_b, x_m) = (matrix(&x_b), matrix(&y_b), matrix(&x_m));
    let v = py
        .detach(|| fspace_gfsvi::objective(&mut net, &params, &prior, &x_b, &y_b, n_total, &x_m, gamma))
        .map_err(raise)?;
    Ok((
        v.value,
        v.expected_log_lik,
        v.divergence,
        PyArray1::from_slice(py, v.grad.mean.as_slice()),
        PyArray1::from_slice(py, v.grad.log_std.as_slice()),
        v.grad.log_noise_std,
    ))
}

/// Fits `method` on `(x, y)` (validation `(x_val, y_val)` where the method early-stops) and
/// returns `(posterior, report)`; see the module docs. Network methods take the network as
/// `state` + `activation_name` (+ a CNN's `architecture`) or a torch model's `calls`, the GP its
/// prior. FSP-Laplace (trained, one process) also takes its rows by position instead of `x`,
/// `y`: `rows=(read, n)` with `read(positions) -> (X, y)` (`fspace_fsp_laplace::fit_rows`; one
/// minibatch in memory), and its validation rows likewise (`val_rows`) or as `x_val`, `y_val`.
/// Keyword arguments only.
#[pyfunction]
#[pyo3(signature = (method, *, likelihood, x=None, y=None, rows=None, sigma_noise=1.0, learn_sigma=false, state=None, activation_name=None, prior=None, config=None, x_val=None, y_val=None, val_rows=None, progress=None, architecture=None, calls=None, reduce=None, process=None))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn fit<'py>(
    py: Python<'py>,
    method: &str,
    likelihood: &str,
    x: Option<PyReadonlyArray2<'py, f64>>,
    y: Option<PyReadonlyArray2<'py, f64>>,
    rows: Option<(Py<PyAny>, usize)>,
    sigma_noise: f64,
    learn_sigma: bool,
    state: Option<&Bound<'py, PyDict>>,
    activation_name: Option<&str>,
    prior: Option<&Bound<'py, PyAny>>,
    config: Option<&Bound<'py, PyAny>>,
    x_val: Option<PyReadonlyArray2<'py, f64>>,
    y_val: Option<PyReadonlyArray2<'py, f64>>,
    val_rows: Option<(Py<PyAny>, usize)>,
    progress: Option<Py<PyAny>>,
    architecture: Option<&Bound<'py, PyAny>>,
    calls: Option<&Bound<'py, PyAny>>,
    reduce: Option<Py<PyAny>>,
    process: Option<(usize, usize)>,
) -> PyResult<(PyPosterior, Bound<'py, PyAny>)> {
    let settings = Settings::read(method, config)?;
    match (method, reduce.is_some(), process.is_some()) {
        ("fsp_laplace_posthoc", _, false) | ("gfsvi" | "valla" | "fsp_laplace", true, true) | (_, false, false) => {}
        ("gfsvi" | "valla" | "fsp_laplace", _, _) => {
            return Err(value_error(format!("a sharded {method} fit needs both reduce and process=(rank, world)")))
        }
        _ => {
            return Err(value_error(format!(
                "{method} fits on one process: a reduce step (a process group) is taken by FSP-Laplace, GFSVI and \
                 VaLLA"
            )))
        }
    }
    let prior = prior.map(gp_prior).transpose()?;
    let net = method_network(state, activation_name, architecture, calls)?;
    let outputs = match (&net, &prior) {
        (Some(net), _) => net.output_dim(),
        (None, Some(prior)) => prior.output_dim(),
        (None, None) => return Err(value_error(format!("{method} needs a network or a GP prior"))),
    };
    let lik = likelihood_spec(likelihood, outputs, sigma_noise, learn_sigma)?;
    let validation = match (x_val, y_val) {
        (Some(xv), Some(yv)) => Some((matrix(&xv), matrix(&yv))),
        (None, None) => None,
        _ => return Err(value_error("validation data needs both x_val and y_val")),
    };
    let interrupt = crate::interrupt::interruptible();
    let mut observer = PyProgress { callback: progress, error: None, stop: Some(interrupt.stop_flag()) };
    let errors = net.as_ref().map(PyNetwork::errors).unwrap_or_default();
    let (x, y) = match (x, y, rows) {
        (None, None, Some(rows)) => {
            if !matches!(
                (method, &settings, &reduce),
                ("fsp_laplace", Settings::Fsp(_), None) | ("gfsvi", Settings::Gfsvi(_), None)
            ) {
                return Err(value_error(format!(
                    "{method} takes its data as x and y: rows read by position are taken by the training of \
                     FSP-Laplace and GFSVI on one process"
                )));
            }
            let net = need(net, method, "a network")?;
            let prior = need(prior, method, "a GP prior")?;
            let mut rows = PyRows::new(rows.0, rows.1);
            let mut val = match (validation, val_rows) {
                (Some(_), Some(_)) => {
                    return Err(value_error("validation data is x_val / y_val or val_rows, not both"))
                }
                (Some((xv, yv)), None) => {
                    let flat = fspace_core::fit::flatten(&yv);
                    let rows = fspace_core::RowsInMemory::new(&xv, flat, yv.ncols()).map_err(raise)?;
                    Some(ValRows::Memory(rows))
                }
                (None, Some((read, n))) => Some(ValRows::Read(PyRows::new(read, n))),
                (None, None) => None,
            };
            let result = py.detach(|| -> Result<(Fit, serde_json::Value), PyErr> {
                let val = val.as_mut().map(|v| v as &mut dyn fspace_core::RowSource);
                match settings {
                    Settings::Fsp(config) => {
                        let fitted = fspace_fsp_laplace::fit_rows(
                            net,
                            lik,
                            &prior,
                            &mut rows,
                            val,
                            &config,
                            &mut observer,
                        )
                        .map_err(|e| errors.take().unwrap_or_else(|| raise(e)))?;
                        Ok((Fit::Fsp(fitted.posterior), report(&fitted.report)?))
                    }
                    Settings::Gfsvi(config) => {
                        let prior = KlPrior::Gp(prior);
                        let fitted =
                            fspace_gfsvi::fit_rows(net, lik, &prior, &mut rows, val, &config, &mut observer)
                                .map_err(|e| errors.take().unwrap_or_else(|| raise(e)))?;
                        Ok((Fit::Gfsvi(fitted.posterior), report(&fitted.report)?))
                    }
                    _ => Err(value_error(format!("{method} does not read rows by position"))),
                }
            });
            let val_error = match &mut val {
                Some(ValRows::Read(v)) => v.error.take(),
                _ => None,
            };
            if let Some(e) = interrupt.take().or(observer.error.take()).or(rows.error.take()).or(val_error) {
                return Err(e);
            }
            let (fit, report) = result?;
            return Ok((PyPosterior { fit, errors }, to_py(py, &report)?));
        }
        (Some(x), Some(y), None) => (matrix(&x), matrix(&y)),
        _ => return Err(value_error("fit takes its data as x and y, or as rows=(read, n)")),
    };
    if val_rows.is_some() {
        return Err(value_error("val_rows goes with rows=(read, n); give x_val and y_val"));
    }
    let mut reducer = reduce.map(PyReduce::new);
    if let (Some(reducer), Some((_, world)), Some(net)) = (reducer.as_mut(), process, net.as_ref()) {
        // The first all-reduce, the processes' layout: VaLLA's `world·(2 + d')` numbers, GFSVI's
        // and MAP training's (FSP-Laplace) `2·world`.
        let checked = Data::new(&x, &y).and_then(|d| {
            d.with_optional_validation(validation.as_ref().map(|(xv, yv)| (xv, yv))).map(|_| ())
        });
        if let Err(e) = checked {
            let width = if method == "valla" { world * (2 + net.output_dim()) } else { 2 * world };
            let _ = reducer.call_vector(&DVector::zeros(width), true);
            return Err(raise(e));
        }
    }
    let result = py.detach(|| {
        run(
            method,
            net,
            prior,
            lik,
            &x,
            &y,
            validation.as_ref(),
            settings,
            &mut observer,
            reducer.as_mut(),
            process,
        )
    });
    if let Some(e) = interrupt.take() {
        return Err(e);
    }
    if let Some(e) = observer.error.take() {
        return Err(e);
    }
    if let Some(e) = reducer.and_then(|r| r.error) {
        return Err(e);
    }
    let (fit, report) = result.map_err(|e| errors.take().unwrap_or(e))?;
    Ok((PyPosterior { fit, errors }, to_py(py, &report)?))
}

/// FSP-Laplace's validation rows when its training rows are read by position: given in memory,
/// or read by position too.
enum ValRows {
    Memory(fspace_core::RowsInMemory),
    Read(PyRows),
}

impl fspace_core::RowSource for ValRows {
    fn len(&self) -> usize {
        match self {
            ValRows::Memory(rows) => rows.len(),
            ValRows::Read(rows) => rows.len(),
        }
    }
    fn rows(&mut self, positions: &[usize]) -> fspace_core::Result<(DMatrix<f64>, DVector<f64>)> {
        match self {
            ValRows::Memory(rows) => rows.rows(positions),
            ValRows::Read(rows) => rows.rows(positions),
        }
    }
}

/// A method's network: a torch model's `calls`, or a native network's `state` and
/// `activation_name` (+ a CNN's `architecture`); `None` for the GP.
fn method_network(
    state: Option<&Bound<'_, PyDict>>,
    activation_name: Option<&str>,
    architecture: Option<&Bound<'_, PyAny>>,
    calls: Option<&Bound<'_, PyAny>>,
) -> PyResult<Option<PyNetwork>> {
    Ok(match (state, activation_name, calls) {
        (_, _, Some(calls)) => Some(callback_network(calls, None)?),
        (Some(state), Some(act), None) => {
            Some(PyNetwork::from(network(state, activation(act)?, architecture)?))
        }
        (None, None, None) => None,
        _ => return Err(value_error("a network needs both its state_dict and its activation")),
    })
}

/// Post-hoc FSP-Laplace over batches (a loader): steps 1–3 of Alg. 2 when it is made — from
/// the network, the prior and `config`'s context points in its `context_box`, which must be
/// given (`fspace_fsp_laplace::posthoc_basis`) — then `add(x, y)` per batch (step 4's `k × k`
/// sum, the GIL released, Ctrl-C polled) and `finish(reduce=None)` → `(Posterior, report)`:
/// `fit("fsp_laplace_posthoc", …)` over all the batches, up to the order of the additions.
/// `reduce(part, fingerprint)` (a process group's all-reduce) adds every process's sum first.
/// Keyword arguments only.
#[pyclass(name = "FspLaplaceBatches", module = "fspace._fspace")]
pub(crate) struct PyFspBatches {
    basis: Option<fspace_fsp_laplace::LaplaceBasis<PyNetwork>>,
    sum: fspace_fsp_laplace::DataSum,
    lik: LikelihoodSpec,
    prior: GpPrior,
    errors: CallbackErrors,
}

#[pymethods]
impl PyFspBatches {
    #[new]
    #[pyo3(signature = (*, likelihood, prior, config, sigma_noise=1.0, state=None, activation_name=None, architecture=None, calls=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        likelihood: &str,
        prior: &Bound<'_, PyAny>,
        config: &Bound<'_, PyAny>,
        sigma_noise: f64,
        state: Option<&Bound<'_, PyDict>>,
        activation_name: Option<&str>,
        architecture: Option<&Bound<'_, PyAny>>,
        calls: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let config: FspConfig = from_py("the fsp_laplace_posthoc settings", config)?;
        let prior = gp_prior(prior)?;
        let net =
            need(method_network(state, activation_name, architecture, calls)?, "FSP-Laplace", "a network")?;
        let lik = likelihood_spec(likelihood, net.output_dim(), sigma_noise, false)?;
        let errors = net.errors();
        let basis = detach_interruptible(
            py,
            || fspace_fsp_laplace::posthoc_basis(&net, &prior, &config),
            |e| errors.raise(e),
        )?;
        let sum = basis.zero_sum();
        Ok(Self { basis: Some(basis), sum, lik, prior, errors })
    }

    /// Adds the batch `(x, y)` (`b × d` inputs, `b × 1` class indices or `b × d'` targets) to
    /// step 4's sum; a refused batch leaves the sum as it was.
    fn add(
        &mut self,
        py: Python<'_>,
        x: PyReadonlyArray2<'_, f64>,
        y: PyReadonlyArray2<'_, f64>,
    ) -> PyResult<()> {
        let basis = self.basis.as_ref().ok_or_else(|| value_error("this fit over batches has finished"))?;
        let (x, y) = (matrix(&x), matrix(&y));
        let data = Data::new(&x, &y).map_err(raise)?;
        let (lik, sum, errors) = (self.lik, &mut self.sum, &self.errors);
        detach_interruptible(
            py,
            || {
                let built = lik.build()?;
                basis.add(sum, built.as_ref(), data.x(), &data.y_flat())
            },
            |e| errors.raise(e),
        )
    }

    /// Points worth adding in one call: Alg. 2's chunk (`laplace.data_batch`), the grain of the
    /// in-memory fit; a loader's smaller batches are gathered to it before they cross.
    #[getter]
    fn batch_target(&self) -> usize {
        self.basis.as_ref().map_or(1, |b| b.config().data_batch)
    }

    /// The points added so far.
    #[getter]
    fn points(&self) -> usize {
        self.sum.points()
    }

    /// Steps 5–6 on the sum (first added over the processes by `reduce(part, fingerprint)`
    /// where it is given): `(Posterior, report)`. The object cannot take batches after it.
    #[pyo3(signature = (reduce=None))]
    fn finish<'py>(
        &mut self,
        py: Python<'py>,
        reduce: Option<Py<PyAny>>,
    ) -> PyResult<(PyPosterior, Bound<'py, PyAny>)> {
        let basis = self.basis.take().ok_or_else(|| value_error("this fit over batches has finished"))?;
        let mut sum = self.sum.clone();
        if let Some(reduce) = reduce {
            let mut reducer = PyReduce::new(reduce);
            let summed = reducer.call(sum.matrix().clone(), &basis.fingerprint());
            if let Some(e) = reducer.error.take() {
                return Err(e);
            }
            sum = fspace_fsp_laplace::DataSum::with_matrix(&sum, summed.map_err(raise)?, sum.points())
                .map_err(raise)?;
        }
        let (prior, lik, errors) = (&self.prior, self.lik, &self.errors);
        let post = detach_interruptible(
            py,
            || basis.finish(prior, &sum, None).and_then(|p| p.with_likelihood(lik)),
            |e| errors.raise(e),
        )?;
        let report = to_py(py, post.report())?;
        Ok((PyPosterior { fit: Fit::Fsp(post), errors: self.errors.clone() }, report))
    }
}

/// The positions (ascending) of the Nyström points an in-memory ELLA fit of `n` points draws
/// under `config` (`fspace_valla::ella::nystrom_choice`; drawn before the outputs, so the same
/// for every number of outputs): a loader's first pass gathers these rows for
/// [`PyEllaBatches`]. Keyword arguments after `n`.
#[pyfunction]
#[pyo3(signature = (n, *, config))]
pub(crate) fn ella_nystrom_positions(n: usize, config: &Bound<'_, PyAny>) -> PyResult<Vec<usize>> {
    let config: EllaConfig = from_py("the ella settings", config)?;
    Ok(fspace_valla::ella::nystrom_choice(n, 1, &config).map_err(raise)?.indices)
}

/// ELLA over `n` points in batches (a loader): the Nyström feature map when made, from the rows
/// at `ella_nystrom_positions(n)`; `add(x, y)` per batch (`G`'s sum, the
/// GIL released, Ctrl-C polled); `finish(x_val=None, y_val=None)` → `(Posterior, report)`:
/// `fit("ella", …)` without early stopping over all the batches, up to the order of the
/// additions (`fspace_valla::EllaBatches`). Keyword arguments only.
#[pyclass(name = "EllaBatches", module = "fspace._fspace")]
pub(crate) struct PyEllaBatches {
    stream: Option<fspace_valla::EllaBatches<PyNetwork>>,
    errors: CallbackErrors,
}

#[pymethods]
impl PyEllaBatches {
    #[new]
    #[pyo3(signature = (*, likelihood, config, n, x_nystrom, sigma_noise=1.0, state=None, activation_name=None, architecture=None, calls=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        likelihood: &str,
        config: &Bound<'_, PyAny>,
        n: usize,
        x_nystrom: PyReadonlyArray2<'_, f64>,
        sigma_noise: f64,
        state: Option<&Bound<'_, PyDict>>,
        activation_name: Option<&str>,
        architecture: Option<&Bound<'_, PyAny>>,
        calls: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let config: EllaConfig = from_py("the ella settings", config)?;
        let net = need(method_network(state, activation_name, architecture, calls)?, "ELLA", "a network")?;
        let lik = likelihood_spec(likelihood, net.output_dim(), sigma_noise, false)?;
        let errors = net.errors();
        let xm = matrix(&x_nystrom);
        let stream = detach_interruptible(
            py,
            || fspace_valla::EllaBatches::new(net, lik, n, xm, &config),
            |e| errors.raise(e),
        )?;
        Ok(Self { stream: Some(stream), errors })
    }

    /// Adds the batch `(x, y)` (`b × d` inputs, `b × 1` class indices or targets) to `G`; a
    /// refused batch leaves the sum as it was.
    fn add(
        &mut self,
        py: Python<'_>,
        x: PyReadonlyArray2<'_, f64>,
        y: PyReadonlyArray2<'_, f64>,
    ) -> PyResult<()> {
        let stream = self.stream.as_mut().ok_or_else(|| value_error("this fit over batches has finished"))?;
        let (x, y) = (matrix(&x), matrix(&y));
        let data = Data::new(&x, &y).map_err(raise)?;
        let errors = &self.errors;
        detach_interruptible(py, || stream.add(&data), |e| errors.raise(e))
    }

    /// The points added so far.
    #[getter]
    fn points(&self) -> usize {
        self.stream.as_ref().map_or(0, |s| s.points())
    }

    /// `G`'s eigenpairs and `λ` (the validation grid scores on `(x_val, y_val)`):
    /// `(Posterior, report)`. The object cannot take batches after it.
    #[pyo3(signature = (x_val=None, y_val=None))]
    fn finish<'py>(
        &mut self,
        py: Python<'py>,
        x_val: Option<PyReadonlyArray2<'py, f64>>,
        y_val: Option<PyReadonlyArray2<'py, f64>>,
    ) -> PyResult<(PyPosterior, Bound<'py, PyAny>)> {
        let validation = match (x_val, y_val) {
            (Some(xv), Some(yv)) => {
                let xv = matrix(&xv);
                // The targets' shape read as every fit reads them (n × 1 labels or n × d' values).
                let y = Data::new(&xv, &matrix(&yv)).map_err(raise)?.y_flat();
                Some((xv, y))
            }
            (None, None) => None,
            _ => return Err(value_error("validation data needs both x_val and y_val")),
        };
        let stream = self.stream.take().ok_or_else(|| value_error("this fit over batches has finished"))?;
        let errors = &self.errors;
        let fitted = detach_interruptible(
            py,
            || stream.finish(validation.as_ref().map(|(xv, yv)| (xv, yv))),
            |e| errors.raise(e),
        )?;
        let report = to_py(py, &fitted.report)?;
        Ok((PyPosterior { fit: Fit::Ella(fitted.posterior), errors: self.errors.clone() }, report))
    }
}

/// A fit's report as a JSON value (turned into a dict once the fit is back under the GIL).
fn report<T: Serialize>(value: &T) -> PyResult<serde_json::Value> {
    serde_json::to_value(value).map_err(|e| value_error(e.to_string()))
}

fn need<T>(value: Option<T>, method: &str, what: &str) -> PyResult<T> {
    value.ok_or_else(|| value_error(format!("{method} needs {what}")))
}

fn refuse<T>(value: &Option<T>, method: &str, what: &str) -> PyResult<()> {
    match value {
        Some(_) => Err(value_error(format!("{method} does not take {what}"))),
        None => Ok(()),
    }
}

#[allow(clippy::too_many_arguments)]
fn run(
    method: &str,
    net: Option<PyNetwork>,
    prior: Option<GpPrior>,
    lik: LikelihoodSpec,
    x: &DMatrix<f64>,
    y: &DMatrix<f64>,
    validation: Option<&(DMatrix<f64>, DMatrix<f64>)>,
    settings: Settings,
    observer: &mut PyProgress,
    reduce: Option<&mut PyReduce>,
    process: Option<(usize, usize)>,
) -> PyResult<(Fit, serde_json::Value)> {
    let data = Data::new(x, y).map_err(raise)?;
    let data = data.with_optional_validation(validation.map(|(xv, yv)| (xv, yv))).map_err(raise)?;
    match settings {
        Settings::Fsp(cfg) => {
            let net = need(net, method, "a network")?;
            let prior = need(prior, method, "a GP prior")?;
            if method == "fsp_laplace" {
                let fitted = match (reduce, process) {
                    (Some(reducer), Some((rank, world))) => {
                        let mut step = reducer.step::<fspace_fsp_laplace::FspError>("FSP-Laplace");
                        let shard = fspace_core::ProcessShard { rank, world, reduce: &mut step };
                        fspace_fsp_laplace::fit_sharded(net, lik, &prior, &data, &cfg, shard, observer)
                    }
                    _ => fspace_fsp_laplace::fit_observed(net, lik, &prior, &data, &cfg, observer),
                }
                .map_err(raise)?;
                Ok((Fit::Fsp(fitted.posterior), report(&fitted.report)?))
            } else if let Some(reducer) = reduce {
                let mut step = |part: DMatrix<f64>, fingerprint: &[f64]| reducer.call(part, fingerprint);
                let fitted =
                    fspace_fsp_laplace::fit_posthoc_sharded(net, lik, &prior, &data, &cfg, &mut step)
                        .map_err(raise)?;
                Ok((Fit::Fsp(fitted.posterior), report(&fitted.report)?))
            } else {
                let fitted = fspace_fsp_laplace::fit_posthoc(net, lik, &prior, &data, &cfg).map_err(raise)?;
                Ok((Fit::Fsp(fitted.posterior), report(&fitted.report)?))
            }
        }
        Settings::Gfsvi(cfg) => {
            let net = need(net, method, "a network")?;
            let prior = need(prior, method, "a GP prior")?;
            let fitted = match (reduce, process) {
                (Some(reducer), Some((rank, world))) => {
                    let mut step = reducer.step::<fspace_gfsvi::GfsviError>("GFSVI");
                    let shard = fspace_core::ProcessShard { rank, world, reduce: &mut step };
                    fspace_gfsvi::fit_sharded(net, lik, &KlPrior::Gp(prior), &data, &cfg, shard, observer)
                }
                _ => fspace_gfsvi::fit_observed(net, lik, &KlPrior::Gp(prior), &data, &cfg, observer),
            }
            .map_err(raise)?;
            Ok((Fit::Gfsvi(fitted.posterior), report(&fitted.report)?))
        }
        Settings::Valla(cfg) => {
            let net = need(net, method, "a network")?;
            refuse(&prior, method, "a GP prior (its prior is the network's linearisation)")?;
            let fitted = match (reduce, process) {
                (Some(reducer), Some((rank, world))) => {
                    let mut step = reducer.step::<fspace_valla::VallaError>("VaLLA");
                    let shard = fspace_core::ProcessShard { rank, world, reduce: &mut step };
                    fspace_valla::fit_sharded(net, lik, &data, &cfg, shard, observer)
                }
                _ => fspace_valla::fit_observed(net, lik, &data, &cfg, observer),
            }
            .map_err(raise)?;
            Ok((Fit::Valla(fitted.posterior), report(&fitted.report)?))
        }
        Settings::Ella(cfg) => {
            let net = need(net, method, "a network")?;
            refuse(&prior, method, "a GP prior (its prior is isotropic in the weights)")?;
            let fitted = fspace_valla::ella::fit(net, lik, &data, &cfg).map_err(raise)?;
            Ok((Fit::Ella(fitted.posterior), report(&fitted.report)?))
        }
        Settings::Gp => {
            refuse(&net, method, "a network")?;
            let prior = need(prior, method, "a GP prior")?;
            let fitted = fspace_gp::exact::fit(lik, &prior, &data).map_err(raise)?;
            Ok((Fit::Gp(fitted.posterior), report(&fitted.report)?))
        }
    }
}

/// A fitted posterior of [`fit`]: predictive, samples, weights, pickling.
#[pyclass(name = "Posterior", module = "fspace._fspace")]
pub(crate) struct PyPosterior {
    fit: Fit,
    /// A torch model's callback exceptions (re-raised in place of the error they caused).
    errors: CallbackErrors,
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

    /// The posterior as fspace's versioned JSON (what `pickle` stores, with the method's name).
    fn to_json(&self) -> PyResult<String> {
        self.fit.to_json().map_err(|e| persist_error(&format!("{} posterior", self.fit.method()), e))
    }

    /// A posterior of `method` from [`to_json`](Self::to_json)'s text, checked as every fspace load is.
    #[staticmethod]
    fn from_json(method: &str, text: &str) -> PyResult<Self> {
        Ok(Self { fit: Fit::from_json(method, text)?, errors: CallbackErrors::default() })
    }

    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<(Bound<'py, PyAny>, (String, String))> {
        let from_json = slf.get_type().getattr("from_json")?;
        let this = slf.borrow();
        Ok((from_json, (this.fit.method().to_string(), this.to_json()?)))
    }
}
