//! `fspace._fspace.Laplace`: laplace-torch's `Laplace` on an MLP (crate docs).

use fspace_core::{Data, LikelihoodSpec, Persist, Posterior};
use fspace_laplace::{
    KronBias, LaplaceConfig, LaplaceError, LaplacePosterior, MarglikConfig, Predictive, PriorPrecision,
    Structure, Weights,
};
use fspace_nn::Network;
use nalgebra::{DMatrix, DVector};
use numpy::{PyArray1, PyArray2, PyArray3, PyReadonlyArray2};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::callback::{callback_network, PyNetwork, PyReduce};
use crate::convert::{
    activation, columns_to_numpy, likelihood as likelihood_spec, matrix, network, stack_to_numpy, to_numpy,
    to_py,
};
use crate::errors::{persist_error, value_error};
use crate::interrupt::detach_interruptible;
use crate::methods::PyProgress;

/// λ as a query takes it: one value, or one per covered parameter (ascending flat order).
#[derive(FromPyObject)]
pub(crate) enum PriorArg {
    Scalar(f64),
    PerParameter(Vec<f64>),
}

fn structure(name: &str, rank: Option<usize>, max_basis: Option<usize>) -> PyResult<Structure> {
    for (what, value) in [("rank", rank), ("max_basis", max_basis)] {
        if let (Some(v), false) = (value, name == "lowrank") {
            return Err(value_error(format!(
                "{what} {v} applies to hessian_structure=\"lowrank\", not {name:?}"
            )));
        }
    }
    if rank == Some(0) {
        return Err(value_error("rank must be ≥ 1"));
    }
    Ok(match name {
        "full" => Structure::Full(Default::default()),
        "kron" => Structure::Kfac,
        "ekfac" => Structure::Ekfac,
        "diag" => Structure::Diag,
        "lowrank" => Structure::LowRank(fspace_laplace::LowRankConfig {
            rank: rank.unwrap_or(fspace_laplace::LowRankConfig::default().rank),
            max_basis,
            ..Default::default()
        }),
        other => {
            return Err(value_error(format!(
            "hessian_structure {other:?} is not one of \"full\", \"kron\", \"ekfac\", \"diag\", \"lowrank\""
        )))
        }
    })
}

/// `(log p(D | w*), n, covered flat indices, all weights)`: what the evidence needs besides
/// the curvature's eigenvalues.
type FitSummary<'py> = (f64, usize, Vec<usize>, Bound<'py, PyArray1<f64>>);
/// A predictive's mean (`n × d'`) and per-point covariances (`n × d' × d'`).
type MeanAndCovariances<'py> = (Bound<'py, PyArray2<f64>>, Bound<'py, PyArray3<f64>>);
/// A predictive's mean (`n × d'`) and joint covariance (`n·d' × n·d'`).
type MeanAndJoint<'py> = (Bound<'py, PyArray2<f64>>, Bound<'py, PyArray2<f64>>);

/// The curvature coordinates in ascending order of the flat parameter index they cover.
fn sorted_coordinates(indices: &[usize]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..indices.len()).collect();
    order.sort_by_key(|&c| indices[c]);
    order
}

/// The linearised Laplace approximation of an MLP or a CNN (module docs).
#[pyclass(name = "Laplace", module = "fspace._fspace")]
pub(crate) struct PyLaplace {
    net: PyNetwork,
    likelihood: LikelihoodSpec,
    config: LaplaceConfig,
    posterior: Option<LaplacePosterior<PyNetwork>>,
    /// The last fit's `FitReport` as JSON (`None` before a fit and after a load).
    report: Option<serde_json::Value>,
    /// The curvature's sums of a streamed fit (`add_batch`), kept so that a later streamed fit
    /// can add to them (laplace-torch's `fit(..., override=False)`).
    sums: Option<fspace_laplace::LaplaceSums>,
}

impl PyLaplace {
    fn fitted(&self) -> PyResult<&LaplacePosterior<PyNetwork>> {
        self.posterior.as_ref().ok_or_else(|| PyRuntimeError::new_err("call fit(X, y) first"))
    }
    /// The λ (one value, or one per covered parameter in ascending flat order: laplace-torch's
    /// diagonal prior) and the temperature `T` of `T·C + Λ` a query runs at, checked and
    /// resolved; the posterior itself is not changed (the Python layer keeps λ, σ and
    /// laplace-torch's temperature and passes them with each query).
    fn state(&self, prior_precision: PriorArg, temperature: f64) -> PyResult<fspace_laplace::QueryState> {
        let prior = match prior_precision {
            PriorArg::Scalar(l) => PriorPrecision::Scalar(l),
            PriorArg::PerParameter(v) => PriorPrecision::PerParameter(v),
        };
        let errors = self.net.errors();
        self.fitted()?.state_at(&prior, temperature).map_err(|e| errors.raise(e))
    }

    fn fitted_mut(&mut self) -> PyResult<&mut LaplacePosterior<PyNetwork>> {
        self.posterior.as_mut().ok_or_else(|| PyRuntimeError::new_err("call fit(X, y) first"))
    }
}

#[pymethods]
impl PyLaplace {
    /// `Laplace(*, state, activation_name, likelihood, hessian_structure, subset_of_weights,
    /// prior_precision, sigma_noise, temperature, kron_bias, architecture, …)`, keywords only;
    /// `state` maps each tensor name to `(shape, row-major float64 values, was_float32)`;
    /// `architecture` is a CNN's layout as a dict (`None`: an MLP); `calls` a torch model's callback object, which
    /// replaces `state` (any `nn.Module`; see `src/callback.rs`), with `layers` its
    /// `layer_infos(…)` for `kron`, `ekfac` and `last_layer`; `rank` and `max_basis` (most
    /// Krylov vectors held, thick restart) for `lowrank`; `chunk_points` the points per chunk of
    /// network calls and statistics (default 256).
    #[new]
    #[pyo3(signature = (*, state, activation_name, likelihood, hessian_structure="kron", subset_of_weights="all", prior_precision=1.0, sigma_noise=1.0, temperature=1.0, kron_bias="folded", architecture=None, calls=None, layers=None, rank=None, max_basis=None, chunk_points=None, curvature="ggn", subnetwork_indices=None))]
    fn new(
        state: &Bound<'_, PyDict>,
        activation_name: &str,
        likelihood: &str,
        hessian_structure: &str,
        subset_of_weights: &str,
        prior_precision: f64,
        sigma_noise: f64,
        temperature: f64,
        kron_bias: &str,
        architecture: Option<&Bound<'_, PyAny>>,
        calls: Option<&Bound<'_, PyAny>>,
        layers: Option<&Bound<'_, PyAny>>,
        rank: Option<usize>,
        max_basis: Option<usize>,
        chunk_points: Option<usize>,
        curvature: &str,
        subnetwork_indices: Option<Vec<usize>>,
    ) -> PyResult<Self> {
        if chunk_points == Some(0) {
            return Err(value_error("chunk_points must be ≥ 1"));
        }
        let net = match calls {
            Some(calls) => callback_network(calls, layers)?,
            None => network(state, activation(activation_name)?, architecture)?.into(),
        };
        let q = net.output_dim();
        let likelihood = likelihood_spec(likelihood, q, sigma_noise, false)?;
        let weights = match (subset_of_weights, subnetwork_indices) {
            ("all", None) => Weights::All,
            ("last_layer", None) => Weights::LastLayer,
            ("subnetwork", Some(indices)) => {
                let p = net.n_params();
                if indices.is_empty() {
                    return Err(value_error("subnetwork_indices is empty: name at least one parameter"));
                }
                if let Some(bad) = indices.iter().find(|&&i| i >= p) {
                    return Err(value_error(format!(
                        "subnetwork_indices holds {bad}, but the model has {p} parameters (0..{p})"
                    )));
                }
                let mut sorted = indices.clone();
                sorted.sort_unstable();
                sorted.dedup();
                if sorted.len() != indices.len() {
                    return Err(value_error("subnetwork_indices repeats a parameter index"));
                }
                Weights::Subnetwork(sorted)
            }
            ("subnetwork", None) => {
                return Err(value_error("subset_of_weights=\"subnetwork\" needs subnetwork_indices"))
            }
            (other, Some(_)) => {
                return Err(value_error(format!(
                    "subnetwork_indices applies to subset_of_weights=\"subnetwork\", not {other:?}"
                )))
            }
            (other, None) => {
                return Err(value_error(format!(
                    "subset_of_weights {other:?} is not \"all\", \"last_layer\" or \"subnetwork\""
                )))
            }
        };
        let curvature = match curvature {
            "ggn" => fspace_laplace::CurvatureSource::Ggn,
            "ef" => fspace_laplace::CurvatureSource::EmpiricalFisher,
            other => {
                return Err(value_error(format!(
                    "curvature {other:?} is not \"ggn\" (the generalised Gauss-Newton) or \"ef\" (the empirical Fisher)"
                )))
            }
        };
        let kron_bias = match kron_bias {
            "folded" => KronBias::Folded,
            "separate" => KronBias::Separate,
            other => {
                return Err(value_error(format!(
                    "kron_bias {other:?} is not \"folded\" (the bias in the input factor) or \"separate\" \
                     (laplace-torch's separate bias block)"
                )))
            }
        };
        let config = LaplaceConfig {
            structure: structure(hessian_structure, rank, max_basis)?,
            chunk_points: chunk_points.unwrap_or(LaplaceConfig::default().chunk_points),
            kron_bias,
            weights,
            prior_precision: PriorPrecision::Scalar(prior_precision),
            temperature,
            curvature,
            ..Default::default()
        };
        // Checks λ, T and σ now rather than at fit.
        if !(prior_precision.is_finite() && prior_precision > 0.0) {
            return Err(value_error(format!("prior_precision {prior_precision} must be finite and > 0")));
        }
        if !(temperature.is_finite() && temperature > 0.0) {
            return Err(value_error(format!("temperature {temperature} must be finite and > 0")));
        }
        Ok(Self { net, likelihood, config, posterior: None, report: None, sums: None })
    }

    /// Fits the curvature at the network's weights on `(X, y)`: `X` is `n × d`, `y` is `n × d'`
    /// (regression) or `n` class labels (classification). `progress(step, total, None, None)`
    /// is called after every chunk of each pass over the data (`step` points of `total` folded;
    /// each pass counts from 0 again). With `reduce` and `process = (rank, world)`, a sharded fit
    /// of this process's rows (`fspace_laplace::fit_sharded`: KFAC, EKFAC, low rank):
    /// `reduce(part, failed)` returns the sum of every process's `part` (the Python layer
    /// all-reduces it over the process group), raising where another process failed; the fit
    /// calls it once per sum over the data (per Lanczos product for low rank).
    #[pyo3(signature = (x, y, progress=None, reduce=None, process=None))]
    #[allow(clippy::too_many_arguments)]
    fn fit(
        &mut self,
        py: Python<'_>,
        x: PyReadonlyArray2<'_, f64>,
        y: PyReadonlyArray2<'_, f64>,
        progress: Option<Py<PyAny>>,
        reduce: Option<Py<PyAny>>,
        process: Option<(usize, usize)>,
    ) -> PyResult<()> {
        let (rank, world) = match (&reduce, process) {
            (None, None) => (0, 1),
            (Some(_), Some(process)) => process,
            _ => return Err(value_error("a sharded fit takes reduce and process=(rank, world) together")),
        };
        // A torch model's callback exception, re-raised in place of the error it caused.
        let errors = self.net.errors();
        let (x, y) = (matrix(&x), matrix(&y));
        let (net, lik, config) = (self.net.clone(), self.likelihood, self.config.clone());
        let interrupt = crate::interrupt::interruptible();
        let mut observer = PyProgress { callback: progress, error: None, stop: Some(interrupt.stop_flag()) };
        let mut reducer = reduce.map(PyReduce::new);
        let fitted = py.detach(|| -> Result<_, LaplaceError> {
            let data = Data::new(&x, &y).map_err(LaplaceError::Core);
            let Some(reducer) = reducer.as_mut() else {
                return fspace_laplace::fit_observed(net, lik, &data?, &config, &mut observer);
            };
            let mut step = reducer.step::<LaplaceError>("the Laplace fit");
            let shard = fspace_core::ProcessShard { rank, world, reduce: &mut step };
            match data {
                Ok(data) => fspace_laplace::fit_sharded(net, lik, &data, &config, shard, &mut observer),
                Err(e) => {
                    // The others wait in the first all-reduce (`1 + world` numbers): tell them.
                    let _ = (shard.reduce)(DVector::zeros(1 + world), true);
                    Err(e)
                }
            }
        });
        // This process's own failure first (an interrupt, the progress callback: the fit went
        // on without it), then the model's or the reduce step's exception (another process
        // failed), then the fit's error.
        if let Some(e) = interrupt.take() {
            return Err(e);
        }
        if let Some(e) = observer.error.take() {
            return Err(e);
        }
        let fitted = match fitted {
            Ok(fitted) => fitted,
            Err(e) => {
                let reduced = reducer.and_then(|mut r| r.error.take());
                return Err(errors.take().or(reduced).unwrap_or_else(|| errors.raise(e)));
            }
        };
        self.report = Some(serde_json::to_value(&fitted.report).map_err(|e| value_error(e.to_string()))?);
        self.posterior = Some(fitted.posterior);
        // An in-memory fit replaces whatever a streamed fit had summed.
        self.sums = None;
        Ok(())
    }

    /// Starts a streamed fit: empty sums (`override=True`, or no earlier streamed fit), or the
    /// earlier streamed fit's sums to add to (`override=False`). Refuses a structure that passes
    /// over the data more than once.
    #[pyo3(signature = (override_=true))]
    fn begin_batches(&mut self, override_: bool) -> PyResult<()> {
        let errors = self.net.errors();
        if override_ || self.sums.is_none() {
            if !override_ {
                return Err(value_error(
                    "fit(override=False) adds to an earlier streamed fit's sums; this Laplace has none",
                ));
            }
            self.sums = Some(
                fspace_laplace::LaplaceSums::new(&self.net, self.likelihood, &self.config)
                    .map_err(|e| errors.raise(e))?,
            );
        }
        Ok(())
    }

    /// Adds one batch `(X, y)` to the streamed fit's sums (`begin_batches` first); the GIL is
    /// released while it is summed.
    fn add_batch(
        &mut self,
        py: Python<'_>,
        x: PyReadonlyArray2<'_, f64>,
        y: PyReadonlyArray2<'_, f64>,
    ) -> PyResult<()> {
        let errors = self.net.errors();
        let (x, y) = (matrix(&x), matrix(&y));
        let net = &self.net;
        let sums = self.sums.as_mut().ok_or_else(|| PyRuntimeError::new_err("call begin_batches() first"))?;
        py.detach(|| sums.add(net, &x, &y)).map_err(|e| errors.raise(e))
    }

    /// Points worth summing in one `add_batch` call: a chunk per thread (`chunk_points` × the
    /// threads), the grain of the in-memory fit. A loader's smaller batches are gathered up to
    /// this many before they cross (fewer, larger GEMMs; `docs/PERFORMANCE.md`).
    #[getter]
    fn batch_target(&self) -> usize {
        self.config.chunk_points * rayon::current_num_threads().max(1)
    }

    /// The number of points the streamed fit's sums hold.
    #[getter]
    fn batch_points(&self) -> usize {
        self.sums.as_ref().map_or(0, |s| s.n_data())
    }

    /// The streamed fit's partial sums as one flat float64 vector (`LaplaceSums::to_flat`), for
    /// an all-reduce over processes.
    fn sums_flat<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray1<f64>>> {
        let sums = self.sums.as_ref().ok_or_else(|| PyRuntimeError::new_err("call begin_batches() first"))?;
        Ok(PyArray1::from_vec(py, sums.to_flat()))
    }

    /// Replaces the streamed fit's partial sums by a flat vector of `sums_flat`'s layout (the
    /// all-reduced sum of every process's).
    fn set_sums_flat(&mut self, flat: numpy::PyReadonlyArray1<'_, f64>) -> PyResult<()> {
        let errors = self.net.errors();
        let sums = self.sums.as_mut().ok_or_else(|| PyRuntimeError::new_err("call begin_batches() first"))?;
        sums.set_flat(flat.as_slice()?).map_err(|e| errors.raise(e))
    }

    /// Finishes the streamed fit into the posterior (the sums are kept for `override=False`).
    fn end_batches(&mut self, py: Python<'_>) -> PyResult<()> {
        let errors = self.net.errors();
        let net = self.net.clone();
        let sums = self.sums.as_ref().ok_or_else(|| PyRuntimeError::new_err("call begin_batches() first"))?;
        let fitted = py.detach(|| sums.finish(net)).map_err(|e| errors.raise(e))?;
        self.report = Some(serde_json::to_value(&fitted.report).map_err(|e| value_error(e.to_string()))?);
        self.posterior = Some(fitted.posterior);
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
        let errors = self.net.errors();
        let post = self.fitted_mut()?;
        match method {
            "marglik" => {
                py.detach(|| post.optimize_prior_precision(&MarglikConfig::default()))
                    .map_err(|e| errors.raise(e))?;
                Ok(post.prior_precision()[0])
            }
            "gridsearch" => {
                let (Some(xv), Some(yv)) = (x_val, y_val) else {
                    return Err(value_error("gridsearch needs x_val and y_val"));
                };
                let (xv, yv) = (matrix(&xv), matrix(&yv));
                let yv = DVector::from_iterator(yv.len(), yv.transpose().iter().copied());
                let grid =
                    grid.unwrap_or_else(|| (0..21).map(|i| 10f64.powf(-4.0 + 0.4 * i as f64)).collect());
                py.detach(|| post.gridsearch_prior_precision(&grid, &xv, &yv))
                    .map_err(|e| errors.raise(e))?;
                Ok(post.prior_precision()[0])
            }
            other => Err(value_error(format!("method {other:?} is not \"marglik\" or \"gridsearch\""))),
        }
    }

    /// `n` weight samples from the posterior at λ and `T` (`n × p`, the weights in PyTorch's
    /// `named_parameters()` order; weights outside the subset at their MAP values).
    #[pyo3(signature = (n_samples, seed, prior_precision, temperature))]
    fn sample<'py>(
        &self,
        py: Python<'py>,
        n_samples: usize,
        seed: u64,
        prior_precision: PriorArg,
        temperature: f64,
    ) -> PyResult<Bound<'py, PyArray2<f64>>> {
        let errors = self.net.errors();
        use rand::SeedableRng;
        let state = self.state(prior_precision, temperature)?;
        let post = self.fitted()?;
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let draws = detach_interruptible(
            py,
            || post.sample_weights_in(&state, n_samples, &mut rng),
            |e| errors.raise(e),
        )?;
        let p = self.net.n_params();
        let m = DMatrix::from_fn(draws.len(), p, |i, j| draws[i][j]);
        Ok(to_numpy(py, &m))
    }

    /// For each of [`curvature_eigenvalues`](Self::curvature_eigenvalues), the position (in
    /// ascending flat order of the covered parameters) of the parameter whose λ it is paired
    /// with under the per-parameter `prior_precision`; `None` where the structure's eigenbasis
    /// does not hold under that λ (the Python evidence then takes the dense route). A λ the
    /// structure cannot take is a `ValueError`.
    fn curvature_eigenvalue_owners(&self, prior_precision: Vec<f64>) -> PyResult<Option<Vec<usize>>> {
        let errors = self.net.errors();
        self.fitted()?
            .eigenvalue_owners(&PriorPrecision::PerParameter(prior_precision))
            .map_err(|e| errors.raise(e))
    }

    /// The eigenvalues of the fitted curvature `C` (at the σ of the fit, untempered; the
    /// unlisted ones are 0), `None` for a structure that stores none (`Curvature::eigenvalues`).
    fn curvature_eigenvalues<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyArray1<f64>>>> {
        Ok(self.fitted()?.curvature().eigenvalues().map(|v| PyArray1::from_vec(py, v)))
    }

    /// `C` as a dense `dim × dim` matrix in the posterior's parameter order (for
    /// `posterior_precision` of the full and subnetwork structures).
    fn curvature_dense<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray2<f64>>> {
        use fspace_laplace::CurvatureApprox;
        let post = self.fitted()?;
        let dim = post.indices().len();
        // Refused before allocating (two `dim × dim` matrices: the curvature and its reordering).
        fspace_input::budget::ensure(
            "the dense curvature (dim × dim, twice)",
            fspace_input::budget::matrix_bytes(dim, dim).saturating_mul(2),
            "hessian_structure='diag' (its diagonal is read without a dense matrix) or fewer parameters",
        )
        .map_err(crate::errors::raise)?;
        let dense = post.curvature().to_dense();
        // Coordinates → ascending flat parameter order (laplace-torch's `named_parameters` order).
        let order = sorted_coordinates(post.indices());
        let m = DMatrix::from_fn(order.len(), order.len(), |a, b| dense[(order[a], order[b])]);
        Ok(to_numpy(py, &m))
    }

    /// The diagonal structure's `C` as its `dim` diagonal entries in ascending flat parameter
    /// order (no `dim × dim` matrix); other structures are refused.
    fn curvature_diagonal<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray1<f64>>> {
        let post = self.fitted()?;
        match post.curvature() {
            fspace_laplace::Curvature::Diag(d) => {
                let order = sorted_coordinates(post.indices());
                Ok(PyArray1::from_vec(py, order.iter().map(|&c| d.diag[c]).collect()))
            }
            _ => Err(value_error("curvature_diagonal belongs to hessian_structure='diag'")),
        }
    }

    /// What the evidence needs besides the eigenvalues: `(log p(D | w*) at the fit's σ, number
    /// of data points, the flat indices of the covered parameters in ascending order, all the
    /// network's flat weights)`.
    fn fit_summary<'py>(&self, py: Python<'py>) -> PyResult<FitSummary<'py>> {
        let post = self.fitted()?;
        let mut idx = post.indices().to_vec();
        idx.sort_unstable();
        let w = post.network().params();
        Ok((post.log_likelihood(), post.n_data(), idx, PyArray1::from_vec(py, w.as_slice().to_vec())))
    }

    /// The curvature's coordinates: the flat parameter index of each (`Σ`'s row order in
    /// `covariance_solve`).
    fn coordinates(&self) -> PyResult<Vec<usize>> {
        Ok(self.fitted()?.indices().to_vec())
    }

    /// `Σ V` at λ and T for `V` (`dim × m`, rows in `coordinates` order): the posterior
    /// covariance applied to a block of Jacobian columns that the caller formed (the predictive
    /// differentiated in its inputs).
    fn covariance_solve<'py>(
        &self,
        py: Python<'py>,
        v: PyReadonlyArray2<'py, f64>,
        prior_precision: PriorArg,
        temperature: f64,
    ) -> PyResult<Bound<'py, PyArray2<f64>>> {
        let errors = self.net.errors();
        let state = self.state(prior_precision, temperature)?;
        let post = self.fitted()?;
        let v = matrix(&v);
        let out = detach_interruptible(py, || post.covariance_solve_in(&state, &v), |e| errors.raise(e))?;
        // Column-major out, as it came in (a transposed C-contiguous n·d' × dim Jacobian): one memcpy each way.
        Ok(columns_to_numpy(py, &out, 0..out.ncols()))
    }

    /// The diagonal structure's `Σ` at λ and T (`dim` entries in `coordinates` order); `None`
    /// for the other structures.
    fn covariance_diagonal<'py>(
        &self,
        py: Python<'py>,
        prior_precision: PriorArg,
        temperature: f64,
    ) -> PyResult<Option<Bound<'py, PyArray1<f64>>>> {
        let state = self.state(prior_precision, temperature)?;
        Ok(self
            .fitted()?
            .covariance_diagonal_in(&state)
            .map(|d| PyArray1::from_vec(py, d.as_slice().to_vec())))
    }

    /// The GLM predictive at λ and T: `(mean n × d', covariances n × d' × d')`.
    fn glm<'py>(
        &self,
        py: Python<'py>,
        x: PyReadonlyArray2<'py, f64>,
        prior_precision: PriorArg,
        temperature: f64,
    ) -> PyResult<MeanAndCovariances<'py>> {
        let errors = self.net.errors();
        let state = self.state(prior_precision, temperature)?;
        let post = self.fitted()?;
        let x = matrix(&x);
        let q = self.net.output_dim();
        let (mean, covs) =
            detach_interruptible(py, || post.glm_mean_and_covariances_in(&state, &x), |e| errors.raise(e))?;
        Ok((to_numpy(py, &mean), stack_to_numpy(py, &covs, q, q)))
    }

    /// The joint GLM predictive at λ and T: `(mean n × d', covariance n·d' × n·d')`
    /// (point-major).
    fn glm_joint<'py>(
        &self,
        py: Python<'py>,
        x: PyReadonlyArray2<'py, f64>,
        prior_precision: PriorArg,
        temperature: f64,
    ) -> PyResult<MeanAndJoint<'py>> {
        let errors = self.net.errors();
        let state = self.state(prior_precision, temperature)?;
        let post = self.fitted()?;
        if post.predictive() != &Predictive::Glm {
            return Err(value_error(
                "the joint predictive is the GLM one; this posterior was saved with the nonlinear mode",
            ));
        }
        let x = matrix(&x);
        fspace_core::ensure_joint_fits(x.nrows(), self.net.output_dim()).map_err(crate::errors::raise)?;
        let (mean, cov) = detach_interruptible(py, || post.glm_joint_in(&state, &x), |e| errors.raise(e))?;
        Ok((to_numpy(py, &mean), to_numpy(py, &cov)))
    }

    /// The network's outputs at `n_samples` weight draws from `seed` at λ and T:
    /// `n_samples × n × d'`.
    #[pyo3(signature = (x, n_samples, seed, prior_precision, temperature))]
    fn nn_samples<'py>(
        &self,
        py: Python<'py>,
        x: PyReadonlyArray2<'py, f64>,
        n_samples: usize,
        seed: u64,
        prior_precision: PriorArg,
        temperature: f64,
    ) -> PyResult<Bound<'py, PyArray3<f64>>> {
        use rand::SeedableRng;
        let errors = self.net.errors();
        let state = self.state(prior_precision, temperature)?;
        let post = self.fitted()?;
        let x = matrix(&x);
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let draws = detach_interruptible(
            py,
            || post.nonlinear_samples_in(&state, &x, n_samples, &mut rng),
            |e| errors.raise(e),
        )?;
        Ok(stack_to_numpy(py, &draws, x.nrows(), self.net.output_dim()))
    }

    /// The prior precision λ (per layer when it was optimised per layer).
    #[getter]
    fn prior_precision(&self) -> PyResult<Vec<f64>> {
        Ok(self.fitted()?.prior_precision().to_vec())
    }

    /// The last fit's report as a dict (`FitReport`: the parameters covered, the low-rank
    /// structure's Lanczos iterations, largest Ritz residual and kept rank, the seconds spent);
    /// `None` before a fit and on a loaded posterior.
    #[getter]
    fn report<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        self.report.as_ref().map(|r| to_py(py, r)).transpose()
    }

    /// The network's number of outputs `d'`.
    #[getter]
    fn output_dim(&self) -> usize {
        self.net.output_dim()
    }

    /// The network's number of parameters (all of them, not only the covered ones).
    #[getter]
    fn n_params(&self) -> usize {
        self.net.n_params()
    }

    /// The fitted posterior as fspace's versioned JSON (what `pickle` stores), with λ and T
    /// (the ones it holds when not given).
    #[pyo3(signature = (prior_precision=None, temperature=None))]
    fn to_json(&self, prior_precision: Option<PriorArg>, temperature: Option<f64>) -> PyResult<String> {
        let post = self.fitted()?;
        let state = match (prior_precision, temperature) {
            (None, None) => post.state(),
            (Some(prior), Some(t)) => self.state(prior, t)?,
            _ => return Err(value_error("to_json takes both prior_precision and temperature, or neither")),
        };
        post.to_json_in(&state).map_err(|e| persist_error("Laplace posterior", e))
    }

    /// A fitted posterior from [`to_json`](Self::to_json)'s text (checked as every fspace load is).
    /// fspace_laplace's support table in laplace-torch's names: `(hessian_structure,
    /// subset_of_weights, streams, shards)` for every structure the Python layer offers over
    /// every subset it exists over (`fspace_laplace::SUPPORT`; `"full"` over the last layer is
    /// its `last_layer` structure).
    #[staticmethod]
    fn support_table() -> Vec<(&'static str, &'static str, bool, bool)> {
        let names = [
            ("full", "full"),
            ("kron", "kfac"),
            ("ekfac", "ekfac"),
            ("diag", "diag"),
            ("lowrank", "low_rank"),
        ];
        let subsets = [
            ("all", fspace_laplace::Subset::All),
            ("last_layer", fspace_laplace::Subset::LastLayer),
            ("subnetwork", fspace_laplace::Subset::Subnetwork),
        ];
        let mut out = Vec::new();
        for (python, rust) in names {
            for (subset_name, subset) in subsets {
                if let Some(row) =
                    fspace_laplace::SUPPORT.iter().find(|r| r.structure == rust && r.subset == subset)
                {
                    out.push((python, subset_name, row.streams, row.shards));
                }
            }
        }
        out
    }

    #[staticmethod]
    fn from_json(text: &str) -> PyResult<Self> {
        let post = LaplacePosterior::<PyNetwork>::from_json(text)
            .map_err(|e| persist_error("Laplace posterior", e))?;
        let likelihood =
            post.likelihood().ok_or_else(|| value_error("the saved posterior names no likelihood"))?;
        Ok(Self {
            net: post.network().clone(),
            likelihood,
            config: LaplaceConfig::default(),
            posterior: Some(post),
            report: None,
            sums: None,
        })
    }

    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<(Bound<'py, PyAny>, (String,))> {
        let from_json = slf.get_type().getattr("from_json")?;
        Ok((from_json, (slf.borrow().to_json(None, None)?,)))
    }
}
