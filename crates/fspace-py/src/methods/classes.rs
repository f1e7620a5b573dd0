//! One pyclass per function-space method: `FspLaplace` (Alg. 1 + 2), `FspLaplacePosthoc`
//! (Alg. 2 at the given weights), `Gfsvi`, `Valla`, `Ella` and `ExactGp`.
//!
//! Each is made from typed settings — the likelihood, σ, the prior and the method's Rust
//! `Config` (a dict read through serde once, when the object is made: an error names the
//! setting) — and fits a network ([`PyNet`], made from the model's weights at each fit) to a
//! [`DataSource`](super::source::PySource) with
//! `fit(source, *, network=None, settings=None, progress=None) -> (Posterior, report)`. `settings` are the
//! settings that depend on the data (the box of the inputs, the design for their dimension),
//! laid over the held ones for that fit alone; the object itself is never changed by a fit.
//! What a method can read — rows by position, batches, a process shard — is its
//! [`Capabilities`], declared once below on its type ([`MethodKind::CAPABILITIES`]); the Python
//! layer asks it instead of naming methods.

use fspace_core::{Data, LikelihoodSpec, Persist, RowSource};
use fspace_fsp_laplace::{FspConfig, FspLaplace};
use fspace_gfsvi::{GfsviConfig, KlPrior, LinearizedPosterior};
use fspace_gp::ExactGp;
use fspace_kernels::GpPrior;
use fspace_nn::Network;
use fspace_valla::{EllaConfig, EllaPosterior, VallaConfig, VallaPosterior};
use nalgebra::DMatrix;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use super::source::{PySource, Shard, Source, Train, Validation};
use super::{report, Fit, PyPosterior, PyProgress};
use crate::callback::{callback_network, CallbackErrors, PyNetwork};
use crate::convert::{activation, likelihood as likelihood_spec, network, to_py};
use crate::errors::{persist_error, raise, value_error};

/// What a method can read besides arrays in memory (which every method reads).
#[pyclass(name = "Capabilities", module = "fspace._fspace", frozen, get_all)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Capabilities {
    /// `DataSource.rows`: training rows read by position, one minibatch in memory (one process).
    pub(crate) rows: bool,
    /// `DataSource.batches`: one pass (or two) over a loader, one batch in memory.
    pub(crate) batches: bool,
    /// A process shard whose every step's data term is all-reduced (`process=(rank, world)`).
    pub(crate) shards_each_step: bool,
    /// A process shard whose one sum over the data is all-reduced (`reduce` alone).
    pub(crate) shards_one_sum: bool,
}

#[pymethods]
impl Capabilities {
    /// Whether the method fits over a process group at all.
    #[getter]
    fn shards(&self) -> bool {
        self.shards_each_step || self.shards_one_sum
    }

    fn __repr__(&self) -> String {
        format!(
            "Capabilities(rows={}, batches={}, shards_each_step={}, shards_one_sum={})",
            py_bool(self.rows),
            py_bool(self.batches),
            py_bool(self.shards_each_step),
            py_bool(self.shards_one_sum)
        )
    }
}

fn py_bool(b: bool) -> &'static str {
    if b {
        "True"
    } else {
        "False"
    }
}

impl Capabilities {
    /// Refuses a source `name` cannot read, before any row is read.
    fn check(&self, name: &str, source: &Source) -> PyResult<()> {
        let refused = match (&source.train, &source.shard) {
            (Train::Rows(_), None) if !self.rows => Some("rows read by position"),
            (Train::Rows(_), Some(_)) => Some("rows read by position over a process group"),
            (Train::Batches(_), _) if !self.batches => Some("batches"),
            (Train::Batches(_), Some(s)) if s.process.is_some() => Some("batches reduced every step"),
            (_, Some(s)) if s.process.is_some() && !self.shards_each_step => {
                Some("a process shard reduced every step")
            }
            (_, Some(s)) if s.process.is_none() && !self.shards_one_sum => {
                Some("a process shard reduced once")
            }
            _ => None,
        };
        match refused {
            Some(what) => Err(value_error(format!(
                "{name} does not read {what} ({}); it reads {}",
                source.train.constructor(),
                self.describe()
            ))),
            None => Ok(()),
        }
    }

    fn describe(&self) -> String {
        let mut out = vec!["arrays in memory"];
        if self.rows {
            out.push("rows read by position");
        }
        if self.batches {
            out.push("batches");
        }
        if self.shards_each_step {
            out.push("process shards reduced every step");
        }
        if self.shards_one_sum {
            out.push("process shards reduced once");
        }
        out.join(", ")
    }
}

/// The settings as `T`, read from a Python dict through serde; an error names the setting and
/// its value (`the FSP-Laplace setting laplace.max_rank = -1: a count cannot be negative`).
pub(crate) fn read_settings<T: DeserializeOwned>(name: &str, value: &Bound<'_, PyAny>) -> PyResult<T> {
    let mut de = pythonize::Depythonizer::from_object(value);
    serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let reason = plain_reason(&e.inner().to_string());
        if path == "." || path.is_empty() {
            return value_error(format!("the {name} settings: {reason}"));
        }
        match setting_at(value, e.path()) {
            Some(found) => value_error(format!("the {name} setting {path} = {found}: {reason}")),
            None => value_error(format!("the {name} setting {path}: {reason}")),
        }
    })
}

/// The `repr` of the value at `path` inside the settings dict, where it can be found.
fn setting_at(value: &Bound<'_, PyAny>, path: &serde_path_to_error::Path) -> Option<String> {
    use serde_path_to_error::Segment;
    let mut at = value.clone();
    for segment in path.iter() {
        at = match segment {
            Segment::Map { key } => at.get_item(key.as_str()).ok()?,
            Segment::Seq { index } => at.get_item(*index).ok()?,
            Segment::Enum { variant } => at.get_item(variant.as_str()).ok()?,
            Segment::Unknown => return None,
        };
    }
    at.repr().ok().map(|r| r.to_string())
}

/// Python's conversion errors, as what the setting must be.
fn plain_reason(inner: &str) -> String {
    const PLAIN: [(&str, &str); 4] = [
        ("can't convert negative int to unsigned", "a count cannot be negative"),
        ("object cannot be interpreted as an integer", "it must be a whole number"),
        ("must be real number", "it must be a number"),
        ("int too big to convert", "it is too large"),
    ];
    PLAIN
        .iter()
        .find(|(python, _)| inner.contains(python))
        .map_or_else(|| inner.to_string(), |(_, plain)| (*plain).to_string())
}

/// `base` with `patch` laid over it (objects merged key by key, anything else replaced).
fn overlay(base: &mut serde_json::Value, patch: serde_json::Value) {
    match (base, patch) {
        (serde_json::Value::Object(b), serde_json::Value::Object(p)) => {
            for (k, v) in p {
                match b.get_mut(&k) {
                    Some(slot) if slot.is_object() && v.is_object() => overlay(slot, v),
                    _ => {
                        b.insert(k, v);
                    }
                }
            }
        }
        (b, p) => *b = p,
    }
}

/// What every method holds besides its `Config`: the likelihood (its outputs are the
/// network's, known at the fit), the GP prior (none for VaLLA and ELLA).
pub(crate) struct Common {
    likelihood: String,
    sigma_noise: f64,
    learn_sigma: bool,
    prior: Option<GpPrior>,
}

/// What one fit works with: the network (none for the GP), the likelihood over its outputs,
/// the prior and the torch callbacks' errors.
pub(crate) struct FitInputs {
    net: Option<PyNetwork>,
    lik: LikelihoodSpec,
    prior: Option<GpPrior>,
    errors: CallbackErrors,
}

impl FitInputs {
    fn net(&self, name: &str) -> PyResult<PyNetwork> {
        self.net.clone().ok_or_else(|| value_error(format!("{name} needs a network")))
    }
    fn prior(&self, name: &str) -> PyResult<GpPrior> {
        self.prior.clone().ok_or_else(|| value_error(format!("{name} needs a GP prior")))
    }
}

/// A network as a fit takes it: `Network.native(state, activation_name, architecture=None)`
/// (a `state_dict`'s tensors, run by fspace's own engine) or `Network.torch(calls)` (a torch
/// model's callbacks). Made at each fit from the model's weights as they are then.
#[pyclass(name = "Network", module = "fspace._fspace", frozen)]
pub(crate) struct PyNet {
    net: PyNetwork,
}

#[pymethods]
impl PyNet {
    /// A native MLP or CNN from a `state_dict` (name → `(shape, values, float32 source)`), its
    /// activation and, for a CNN, its architecture.
    #[staticmethod]
    #[pyo3(signature = (state, activation_name, architecture=None))]
    fn native(
        state: &Bound<'_, PyDict>,
        activation_name: &str,
        architecture: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        Ok(Self { net: PyNetwork::from(network(state, activation(activation_name)?, architecture)?) })
    }

    /// A torch model behind its callbacks (`fspace._torch.TorchCalls`).
    #[staticmethod]
    fn torch(calls: &Bound<'_, PyAny>) -> PyResult<Self> {
        Ok(Self { net: callback_network(calls, None)? })
    }

    /// Inputs per point.
    #[getter]
    fn input_dim(&self) -> usize {
        self.net.input_dim()
    }

    /// Outputs per point.
    #[getter]
    fn output_dim(&self) -> usize {
        self.net.output_dim()
    }
}

/// One method: its name, settings type, capabilities, what it needs, and its fit over a
/// [`Source`].
pub(crate) trait MethodKind {
    type Config: Serialize + DeserializeOwned + Default + Clone + Send + Sync;
    /// The method's name in messages.
    const NAME: &'static str;
    /// What it reads (module docs).
    const CAPABILITIES: Capabilities;
    /// Whether it needs a network (else it refuses one).
    const NETWORK: bool;
    /// `Ok`: it needs a GP prior; `Err(why)`: it refuses one, for that reason.
    const PRIOR: Result<(), &'static str>;
    /// Fits `source` with the GIL released.
    fn run(
        inputs: &FitInputs,
        config: &Self::Config,
        source: &mut Source,
        obs: &mut PyProgress,
    ) -> PyResult<(Fit, Value)>;
    /// The width of a sharded fit's first all-reduce (the processes' layout) for `world`
    /// processes and `outputs` network outputs.
    fn layout_width(world: usize, _outputs: usize) -> usize {
        2 * world
    }
    /// A saved posterior of this method.
    fn load(text: &str) -> PyResult<Fit>;
}

/// The in-memory data with its validation rows (held ones only).
fn memory_data<'a>(
    x: &'a DMatrix<f64>,
    y: &'a DMatrix<f64>,
    val: &'a Option<Validation>,
) -> PyResult<Data<'a>> {
    let val = match val {
        None => None,
        Some(v) => Some(
            v.arrays()
                .ok_or_else(|| value_error("val_rows goes with DataSource.rows; give x_val and y_val"))?,
        ),
    };
    Data::new(x, y).and_then(|d| d.with_optional_validation(val)).map_err(raise)
}

/// A sharded fit's rank and world with its reduce step.
fn each_step(shard: &mut Option<Shard>) -> Option<(&mut crate::callback::PyReduce, usize, usize)> {
    match shard {
        Some(Shard { reduce, process: Some((rank, world)) }) => Some((reduce, *rank, *world)),
        _ => None,
    }
}

/// FSP-Laplace: Alg. 1 (training under the prior), then Alg. 2.
pub(crate) struct FspTrained;
/// Post-hoc FSP-Laplace: Alg. 2 at the given weights.
pub(crate) struct FspPosthoc;
pub(crate) struct GfsviKind;
pub(crate) struct VallaKind;
pub(crate) struct EllaKind;
pub(crate) struct ExactGpKind;

impl MethodKind for FspTrained {
    type Config = FspConfig;
    const NAME: &'static str = "FSP-Laplace";
    const CAPABILITIES: Capabilities =
        Capabilities { rows: true, batches: false, shards_each_step: true, shards_one_sum: false };
    const NETWORK: bool = true;
    const PRIOR: Result<(), &'static str> = Ok(());

    fn run(
        c: &FitInputs,
        cfg: &FspConfig,
        source: &mut Source,
        obs: &mut PyProgress,
    ) -> PyResult<(Fit, Value)> {
        let Source { train, val, shard } = source;
        let (net, prior) = (c.net(Self::NAME)?, c.prior(Self::NAME)?);
        let fitted = match train {
            Train::Rows(rows) => {
                let val = val.as_mut().map(|v| v as &mut dyn RowSource);
                fspace_fsp_laplace::fit_rows(net, c.lik, &prior, rows, val, cfg, obs)
            }
            Train::Memory { x, y } => {
                let data = memory_data(x, y, val)?;
                match each_step(shard) {
                    Some((reducer, rank, world)) => {
                        let mut step = reducer.step::<fspace_fsp_laplace::FspError>(Self::NAME);
                        let shard = fspace_core::ProcessShard { rank, world, reduce: &mut step };
                        fspace_fsp_laplace::fit_sharded(net, c.lik, &prior, &data, cfg, shard, obs)
                    }
                    None => fspace_fsp_laplace::fit_observed(net, c.lik, &prior, &data, cfg, obs),
                }
            }
            Train::Batches(_) => return Err(value_error("FSP-Laplace's training reads rows, not batches")),
        }
        .map_err(raise)?;
        Ok((Fit::Fsp(fitted.posterior), report(&fitted.report)?))
    }

    fn load(text: &str) -> PyResult<Fit> {
        load_fsp(text)
    }
}

fn load_fsp(text: &str) -> PyResult<Fit> {
    let post = FspLaplace::from_json(text).map_err(|e| persist_error("FSP-Laplace posterior", e))?;
    Ok(Fit::Fsp(post))
}

impl MethodKind for FspPosthoc {
    type Config = FspConfig;
    const NAME: &'static str = "post-hoc FSP-Laplace";
    const CAPABILITIES: Capabilities =
        Capabilities { rows: false, batches: true, shards_each_step: false, shards_one_sum: true };
    const NETWORK: bool = true;
    const PRIOR: Result<(), &'static str> = Ok(());

    fn run(
        c: &FitInputs,
        cfg: &FspConfig,
        source: &mut Source,
        obs: &mut PyProgress,
    ) -> PyResult<(Fit, Value)> {
        let Source { train, val, shard } = source;
        let (net, prior) = (c.net(Self::NAME)?, c.prior(Self::NAME)?);
        let post = match train {
            Train::Memory { x, y } => {
                let data = memory_data(x, y, val)?;
                let fitted = match shard {
                    Some(shard) => {
                        let mut step =
                            |part: DMatrix<f64>, fingerprint: &[f64]| shard.reduce.call(part, fingerprint);
                        fspace_fsp_laplace::fit_posthoc_sharded(net, c.lik, &prior, &data, cfg, &mut step)
                    }
                    None => fspace_fsp_laplace::fit_posthoc(net, c.lik, &prior, &data, cfg),
                }
                .map_err(raise)?;
                return Ok((Fit::Fsp(fitted.posterior), report(&fitted.report)?));
            }
            Train::Batches(batches) => {
                // Steps 1–3 from the context points, each block of batches added to step 4's
                // k × k sum, the sum added over the processes, steps 5–6.
                let basis = fspace_fsp_laplace::posthoc_basis(&net, &prior, cfg).map_err(raise)?;
                let mut sum = basis.zero_sum();
                let built = c.lik.build().map_err(raise)?;
                let points = batches.for_each_block(cfg.laplace.data_batch, obs, |x, y| {
                    let data = Data::new(x, y).map_err(raise)?;
                    basis.add(&mut sum, built.as_ref(), data.x(), &data.y_flat()).map_err(raise)
                })?;
                if batches.error.is_some() {
                    return Err(value_error("the data loader raised"));
                }
                if let Some(shard) = shard {
                    let summed =
                        shard.reduce.call(sum.matrix().clone(), &basis.fingerprint()).map_err(raise)?;
                    sum = fspace_fsp_laplace::DataSum::with_matrix(&sum, summed, sum.points())
                        .map_err(raise)?;
                } else if points == 0 {
                    return Err(value_error("the data loader yielded no batch"));
                }
                basis.finish(&prior, &sum, None).and_then(|p| p.with_likelihood(c.lik)).map_err(raise)?
            }
            Train::Rows(_) => return Err(value_error("post-hoc FSP-Laplace reads batches, not rows")),
        };
        let report = report(post.report())?;
        Ok((Fit::Fsp(post), report))
    }

    fn load(text: &str) -> PyResult<Fit> {
        load_fsp(text)
    }
}

impl MethodKind for GfsviKind {
    type Config = GfsviConfig;
    const NAME: &'static str = "GFSVI";
    const CAPABILITIES: Capabilities =
        Capabilities { rows: true, batches: false, shards_each_step: true, shards_one_sum: false };
    const NETWORK: bool = true;
    const PRIOR: Result<(), &'static str> = Ok(());

    fn run(
        c: &FitInputs,
        cfg: &GfsviConfig,
        source: &mut Source,
        obs: &mut PyProgress,
    ) -> PyResult<(Fit, Value)> {
        let Source { train, val, shard } = source;
        let (net, prior) = (c.net(Self::NAME)?, KlPrior::Gp(c.prior(Self::NAME)?));
        let fitted = match train {
            Train::Rows(rows) => {
                let val = val.as_mut().map(|v| v as &mut dyn RowSource);
                fspace_gfsvi::fit_rows(net, c.lik, &prior, rows, val, cfg, obs)
            }
            Train::Memory { x, y } => {
                let data = memory_data(x, y, val)?;
                match each_step(shard) {
                    Some((reducer, rank, world)) => {
                        let mut step = reducer.step::<fspace_gfsvi::GfsviError>(Self::NAME);
                        let shard = fspace_core::ProcessShard { rank, world, reduce: &mut step };
                        fspace_gfsvi::fit_sharded(net, c.lik, &prior, &data, cfg, shard, obs)
                    }
                    None => fspace_gfsvi::fit_observed(net, c.lik, &prior, &data, cfg, obs),
                }
            }
            Train::Batches(_) => return Err(value_error("GFSVI reads rows, not batches")),
        }
        .map_err(raise)?;
        Ok((Fit::Gfsvi(fitted.posterior), report(&fitted.report)?))
    }

    fn load(text: &str) -> PyResult<Fit> {
        let post = LinearizedPosterior::from_json(text).map_err(|e| persist_error("GFSVI posterior", e))?;
        Ok(Fit::Gfsvi(post))
    }
}

impl MethodKind for VallaKind {
    type Config = VallaConfig;
    const NAME: &'static str = "VaLLA";
    const CAPABILITIES: Capabilities =
        Capabilities { rows: false, batches: false, shards_each_step: true, shards_one_sum: false };
    const NETWORK: bool = true;
    const PRIOR: Result<(), &'static str> = Err("its prior is the network's linearisation");

    /// VaLLA's layout round: each process's row counts and its outputs' sums.
    fn layout_width(world: usize, outputs: usize) -> usize {
        world * (2 + outputs)
    }

    fn run(
        c: &FitInputs,
        cfg: &VallaConfig,
        source: &mut Source,
        obs: &mut PyProgress,
    ) -> PyResult<(Fit, Value)> {
        let Source { train, val, shard } = source;
        let net = c.net(Self::NAME)?;
        let Train::Memory { x, y } = train else {
            return Err(value_error("VaLLA reads arrays in memory"));
        };
        let data = memory_data(x, y, val)?;
        let fitted = match each_step(shard) {
            Some((reducer, rank, world)) => {
                let mut step = reducer.step::<fspace_valla::VallaError>(Self::NAME);
                let shard = fspace_core::ProcessShard { rank, world, reduce: &mut step };
                fspace_valla::fit_sharded(net, c.lik, &data, cfg, shard, obs)
            }
            None => fspace_valla::fit_observed(net, c.lik, &data, cfg, obs),
        }
        .map_err(raise)?;
        Ok((Fit::Valla(fitted.posterior), report(&fitted.report)?))
    }

    fn load(text: &str) -> PyResult<Fit> {
        let post = VallaPosterior::from_json(text).map_err(|e| persist_error("VaLLA posterior", e))?;
        Ok(Fit::Valla(post))
    }
}

impl MethodKind for EllaKind {
    type Config = EllaConfig;
    const NAME: &'static str = "ELLA";
    const CAPABILITIES: Capabilities =
        Capabilities { rows: false, batches: true, shards_each_step: false, shards_one_sum: false };
    const NETWORK: bool = true;
    const PRIOR: Result<(), &'static str> = Err("its prior is isotropic in the weights");

    fn run(
        c: &FitInputs,
        cfg: &EllaConfig,
        source: &mut Source,
        obs: &mut PyProgress,
    ) -> PyResult<(Fit, Value)> {
        let Source { train, val, shard: _ } = source;
        let net = c.net(Self::NAME)?;
        let fitted = match train {
            Train::Memory { x, y } => {
                let data = memory_data(x, y, val)?;
                fspace_valla::ella::fit(net, c.lik, &data, cfg).map_err(raise)?
            }
            Train::Batches(batches) => {
                // A pass that counts the points where the loader does not say, one that gathers
                // the Nyström rows at the positions an in-memory fit draws, one that sums G.
                if batches.total == 0 {
                    batches.total = batches.for_each(|_, _, _| Ok(()))?;
                }
                let n = batches.total;
                if batches.error.is_none() && n == 0 {
                    return Err(value_error("the data loader yielded no batch"));
                }
                let positions = fspace_valla::ella::nystrom_choice(n, 1, cfg).map_err(raise)?.indices;
                let mut rows: Vec<Vec<f64>> = Vec::with_capacity(positions.len());
                let mut at = 0;
                let seen = batches.for_each(|before, x, _| {
                    while at < positions.len() && positions[at] < before + x.nrows() {
                        rows.push(x.row(positions[at] - before).iter().copied().collect());
                        at += 1;
                    }
                    Ok(())
                })?;
                if batches.error.is_some() {
                    return Err(value_error("the data loader raised"));
                }
                visited(seen, n)?;
                let d = rows.first().map_or(0, Vec::len);
                let xm = DMatrix::from_fn(rows.len(), d, |i, j| rows[i][j]);
                let mut stream = fspace_valla::EllaBatches::new(net, c.lik, n, xm, cfg).map_err(raise)?;
                let summed = batches.for_each_block(fspace_valla::ella::CHUNK, obs, |x, y| {
                    let data = Data::new(x, y).map_err(raise)?;
                    stream.add(&data).map_err(raise)
                })?;
                if batches.error.is_some() {
                    return Err(value_error("the data loader raised"));
                }
                visited(summed, n)?;
                let validation = match val.as_ref().and_then(|v| v.arrays()) {
                    Some((xv, yv)) => Some((xv.clone(), Data::new(xv, yv).map_err(raise)?.y_flat())),
                    None => None,
                };
                stream.finish(validation.as_ref().map(|(xv, yv)| (xv, yv))).map_err(raise)?
            }
            Train::Rows(_) => return Err(value_error("ELLA reads batches, not rows")),
        };
        Ok((Fit::Ella(fitted.posterior), report(&fitted.report)?))
    }

    fn load(text: &str) -> PyResult<Fit> {
        let post = EllaPosterior::from_json(text).map_err(|e| persist_error("ELLA posterior", e))?;
        Ok(Fit::Ella(post))
    }
}

/// ELLA draws its Nyström points among the data set's points by position: a loader must visit
/// each of them once per pass.
fn visited(count: usize, n: usize) -> PyResult<()> {
    if count == n {
        return Ok(());
    }
    Err(value_error(format!(
        "the loader visited {count} points but its dataset holds {n}: ELLA draws its Nyström points among the \
         dataset's points by position, so a loader that skips some (drop_last, a sampler over part of it) cannot be \
         streamed; fit(X, y) in memory, or use a loader that visits each point once"
    )))
}

impl MethodKind for ExactGpKind {
    type Config = NoSettings;
    const NAME: &'static str = "the exact GP";
    const CAPABILITIES: Capabilities =
        Capabilities { rows: false, batches: false, shards_each_step: false, shards_one_sum: false };
    const NETWORK: bool = false;
    const PRIOR: Result<(), &'static str> = Ok(());

    fn run(c: &FitInputs, _: &NoSettings, source: &mut Source, _: &mut PyProgress) -> PyResult<(Fit, Value)> {
        let Source { train, val, shard: _ } = source;
        let prior = c.prior(Self::NAME)?;
        let Train::Memory { x, y } = train else {
            return Err(value_error("the exact GP reads arrays in memory"));
        };
        let data = memory_data(x, y, val)?;
        let fitted = fspace_gp::exact::fit(c.lik, &prior, &data).map_err(raise)?;
        Ok((Fit::Gp(fitted.posterior), report(&fitted.report)?))
    }

    fn load(text: &str) -> PyResult<Fit> {
        let post = ExactGp::from_json(text).map_err(|e| persist_error("exact GP posterior", e))?;
        Ok(Fit::Gp(post))
    }
}

/// The exact GP's settings: none (its hyperparameters are the prior's).
#[derive(Clone, Default, Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct NoSettings {}

/// The common constructor: the prior and the likelihood, checked against what `M` needs, and
/// the settings, read once.
fn make<M: MethodKind>(
    likelihood: &str,
    prior: Option<&Bound<'_, PyAny>>,
    settings: Option<&Bound<'_, PyAny>>,
    sigma_noise: f64,
    learn_sigma: bool,
) -> PyResult<(Common, M::Config)> {
    let config: M::Config = match settings {
        Some(s) => read_settings(M::NAME, s)?,
        None => M::Config::default(),
    };
    let prior: Option<GpPrior> = prior.map(|p| crate::convert::from_py("the GP prior", p)).transpose()?;
    match (M::PRIOR, &prior) {
        (Ok(()), None) => return Err(value_error(format!("{} needs a GP prior", M::NAME))),
        (Err(why), Some(_)) => {
            return Err(value_error(format!("{} does not take a GP prior ({why})", M::NAME)))
        }
        _ => {}
    }
    // The likelihood's name and σ now; its outputs are the network's (the prior's for the GP).
    let outputs = match (likelihood, &prior) {
        (_, Some(prior)) if !M::NETWORK => prior.output_dim(),
        ("classification", _) => 2,
        _ => 1,
    };
    likelihood_spec(likelihood, outputs, sigma_noise, learn_sigma)?;
    Ok((Common { likelihood: likelihood.to_string(), sigma_noise, learn_sigma, prior }, config))
}

/// One fit's inputs: `network` checked against what `M` needs, the likelihood over its outputs.
fn fit_inputs<M: MethodKind>(common: &Common, network: Option<&PyNet>) -> PyResult<FitInputs> {
    let net = network.map(|n| n.net.clone());
    match (M::NETWORK, &net) {
        (true, None) => return Err(value_error(format!("{} needs a network", M::NAME))),
        (false, Some(_)) => return Err(value_error(format!("{} does not take a network", M::NAME))),
        _ => {}
    }
    let outputs = match (&net, &common.prior) {
        (Some(net), _) => net.output_dim(),
        (None, Some(prior)) => prior.output_dim(),
        (None, None) => 1,
    };
    let lik = likelihood_spec(&common.likelihood, outputs, common.sigma_noise, common.learn_sigma)?;
    let errors = net.as_ref().map(PyNetwork::errors).unwrap_or_default();
    Ok(FitInputs { net, lik, prior: common.prior.clone(), errors })
}

/// `M`'s fit of `source` under `config` with `patch` laid over it: the GIL released, Ctrl-C
/// polled, progress reported; the first Python exception of the fit (a signal handler's, the
/// progress callable's, the source's callables', a torch callback's) is raised in place of
/// the error it caused.
fn fit<'py, M: MethodKind>(
    py: Python<'py>,
    common: &Common,
    network: Option<&PyNet>,
    config: &M::Config,
    source: &Bound<'py, PySource>,
    patch: Option<&Bound<'py, PyAny>>,
    progress: Option<Py<PyAny>>,
) -> PyResult<(PyPosterior, Bound<'py, PyAny>)> {
    let patched;
    let config = match patch {
        None => config,
        Some(patch) => {
            let mut value = serde_json::to_value(config).map_err(|e| value_error(e.to_string()))?;
            let patch: serde_json::Value = crate::convert::from_py(M::NAME, patch)?;
            overlay(&mut value, patch);
            patched = read_settings::<M::Config>(M::NAME, &pythonize::pythonize(py, &value)?)?;
            &patched
        }
    };
    let inputs = fit_inputs::<M>(common, network)?;
    let mut source = source.borrow_mut().take()?;
    M::CAPABILITIES.check(M::NAME, &source)?;
    if let (Some((reducer, _, world)), Train::Memory { x, y }, Some(net)) =
        (each_step(&mut source.shard), &source.train, inputs.net.as_ref())
    {
        // A process whose data are refused still joins the first all-reduce, the processes'
        // layout, so that none waits.
        if let Err(e) = Data::new(x, y) {
            let width = M::layout_width(world, net.output_dim());
            let _ = reducer.call_vector(&nalgebra::DVector::zeros(width), true);
            return Err(raise(e));
        }
    }
    let interrupt = crate::interrupt::interruptible();
    let mut observer = PyProgress { callback: progress, error: None, stop: Some(interrupt.stop_flag()) };
    let result = py.detach(|| M::run(&inputs, config, &mut source, &mut observer));
    if let Some(e) = interrupt.take().or(observer.error.take()).or_else(|| source.take_error()) {
        return Err(e);
    }
    let (fit, report) = result.map_err(|e| inputs.errors.take().unwrap_or(e))?;
    Ok((PyPosterior::new(fit, inputs.errors.clone()), to_py(py, &report)?))
}

/// The pyclass of one method (module docs): construction, `defaults`, `settings`,
/// `capabilities`, `fit`, `load_posterior`.
macro_rules! method_class {
    ($py:ident, $name:literal, $kind:ty) => {
        #[doc = concat!("`fspace._fspace.", $name, "`: see the module docs.")]
        #[pyclass(name = $name, module = "fspace._fspace", frozen)]
        pub(crate) struct $py {
            common: Common,
            config: <$kind as MethodKind>::Config,
        }

        #[pymethods]
        impl $py {
            #[new]
            #[pyo3(signature = (*, likelihood, prior=None, settings=None, sigma_noise=1.0, learn_sigma=false))]
            fn new(
                likelihood: &str,
                prior: Option<&Bound<'_, PyAny>>,
                settings: Option<&Bound<'_, PyAny>>,
                sigma_noise: f64,
                learn_sigma: bool,
            ) -> PyResult<Self> {
                let (common, config) = make::<$kind>(likelihood, prior, settings, sigma_noise, learn_sigma)?;
                Ok(Self { common, config })
            }

            /// The method's settings at the paper's values (its Rust `Config`), as a dict.
            #[staticmethod]
            fn defaults(py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
                to_py(py, &<$kind as MethodKind>::Config::default())
            }

            /// The settings this object holds, as a dict.
            #[getter]
            fn settings<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
                to_py(py, &self.config)
            }

            /// What the method reads besides arrays in memory.
            #[classattr]
            fn capabilities() -> Capabilities {
                <$kind as MethodKind>::CAPABILITIES
            }

            /// The method's name in messages.
            #[classattr]
            fn name() -> &'static str {
                <$kind as MethodKind>::NAME
            }

            /// Fits the network (a `Network`; none for the GP) to `source` (a `DataSource`,
            /// read once) with `settings` (the settings that depend on the data, for this fit
            /// only) laid over the held ones: `(Posterior, report)`.
            /// `progress(step, total, loss, validation)` hears the fit.
            #[pyo3(signature = (source, *, network=None, settings=None, progress=None))]
            fn fit<'py>(
                &self,
                py: Python<'py>,
                source: &Bound<'py, PySource>,
                network: Option<PyRef<'py, PyNet>>,
                settings: Option<&Bound<'py, PyAny>>,
                progress: Option<Py<PyAny>>,
            ) -> PyResult<(PyPosterior, Bound<'py, PyAny>)> {
                fit::<$kind>(py, &self.common, network.as_deref(), &self.config, source, settings, progress)
            }

            /// A posterior of this method from `Posterior.to_json`'s text, checked as every
            /// fspace load is.
            #[staticmethod]
            fn load_posterior(text: &str) -> PyResult<PyPosterior> {
                Ok(PyPosterior::new(<$kind as MethodKind>::load(text)?, CallbackErrors::default()))
            }
        }
    };
}

method_class!(PyFspLaplace, "FspLaplace", FspTrained);
method_class!(PyFspLaplacePosthoc, "FspLaplacePosthoc", FspPosthoc);
method_class!(PyGfsvi, "Gfsvi", GfsviKind);
method_class!(PyValla, "Valla", VallaKind);
method_class!(PyElla, "Ella", EllaKind);
method_class!(PyExactGp, "ExactGp", ExactGpKind);
