//! Minibatch MAP training of any [`Network`] ([`Mlp`], [`HelmholtzNet`]) with Adam.
//!
//! Each step minimises `(n/b) Σ_{i∈batch} −log p(yᵢ | f(xᵢ; w)) + R(w) + (λ/2)‖w‖²`, where the
//! data term comes from any [`fspace_core::Likelihood`] (its function-space gradient is pulled
//! back by `J(X_b)ᵀ`), and `R` is an optional regulariser hook that returns its value and its
//! own parameter-space gradient — FSP-Laplace supplies `αᵀ f(C; w)` with `α = K(C,C)⁻¹(f(C) −
//! μ(C))` held constant (gradient `J(C)ᵀα`), redrawing `C` each step.

use fspace_core::{
    Adam, Data, Fitted, Likelihood, LikelihoodSpec, Minibatches, Observer, ProcessShard, Progress, RowSource,
    RowsInMemory, Schedule, ScheduleRun, Silent, StopDecision,
};
use fspace_input::InputError;
use nalgebra::{DMatrix, DVector};
use rand::rngs::StdRng;
use rand::SeedableRng;

use crate::error::{all_finite, NnError, Result};
use crate::mlp::Mlp;
use crate::network::Network;

/// A regulariser `R(w)`: returns `(R(w), ∇_w R(w))` for the current network; called once per
/// step with the step's RNG (e.g. to redraw context points). It runs on a rayon thread beside
/// the data term's pass (both read the same weights), hence `Send`.
pub type Regularizer<'a, N = Mlp> = dyn FnMut(&N, &mut StdRng) -> Result<(f64, DVector<f64>)> + Send + 'a;

/// Options of [`train_map`].
///
/// | name | default | purpose |
/// |---|---|---|
/// | `schedule` | 1 000 epochs, validated after each, no early stopping, best restored | length, validation interval, patience (in validations; needs validation data), best-state restore ([`Schedule`]) |
/// | `batch_size` | 100 | minibatch size `b` |
/// | `learning_rate` | 1e-3 | Adam step |
/// | `weight_decay` | 0 | `λ` of `(λ/2)‖w‖²` (an isotropic Gaussian weight prior) |
/// | `validation_adds_regularizer` | false | the validation loss is the validation NLL plus the regulariser's value (a validation log posterior) |
/// | `seed` | 0 | shuffling and the regulariser's RNG |
/// | `learn_likelihood` | false | also fit the likelihood's own parameters (Gaussian `log σ`) |
#[derive(Debug, Clone, PartialEq)]
pub struct TrainConfig {
    /// Length, validation interval, early stopping and best-state restore.
    pub schedule: Schedule,
    /// Minibatch size.
    pub batch_size: usize,
    /// Adam learning rate.
    pub learning_rate: f64,
    /// L2 weight decay λ.
    pub weight_decay: f64,
    /// Add the regulariser's value (drawn with the training RNG, e.g. at fresh context points)
    /// to the summed validation NLL: early stopping on a validation log posterior, as
    /// FSP-Laplace's public code does, instead of the validation NLL.
    pub validation_adds_regularizer: bool,
    /// Seed.
    pub seed: u64,
    /// Fit the likelihood's learnable parameters ([`Likelihood::params`]) jointly, with the
    /// same Adam step (the papers' "learned noise scale").
    pub learn_likelihood: bool,
}

impl Default for TrainConfig {
    fn default() -> Self {
        Self {
            schedule: Schedule::epochs(1000),
            batch_size: 100,
            learning_rate: 1e-3,
            weight_decay: 0.0,
            validation_adds_regularizer: false,
            seed: 0,
            learn_likelihood: false,
        }
    }
}

/// Progress after each epoch (for a progress bar or a log); a step-length schedule's last epoch
/// may be partial.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TrainProgress {
    /// Epoch just finished (1-based).
    pub epoch: usize,
    /// Mean training objective per step over the epoch.
    pub train_loss: f64,
    /// Validation NLL per point, if the schedule evaluated at this epoch's end (or at its
    /// steps: the last evaluation within the epoch) and validation data was given.
    pub validation_loss: Option<f64>,
}

/// What [`train_map`] did.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TrainReport {
    /// Epochs run (the last one may be partial under a step-length schedule).
    pub epochs: usize,
    /// Optimiser steps run.
    #[serde(default)]
    pub steps: usize,
    /// Step whose parameters were returned (the best validation with `restore_best`, else the
    /// last step).
    #[serde(default)]
    pub best_step: usize,
    /// Whether early stopping ended training.
    pub stopped_early: bool,
    /// Per-epoch progress.
    pub history: Vec<TrainProgress>,
}

fn nll_loss<N: Network>(net: &N, lik: &dyn Likelihood, x: &DMatrix<f64>, y: &DVector<f64>) -> Result<f64> {
    lik.nll(&net.forward(x)?, y).map_err(|e| NnError::Likelihood(e.to_string()))
}

/// Trains `net` (and, with `learn_likelihood`, the likelihood's parameters) in place under
/// `config.schedule`: `validation` is evaluated at the schedule's evaluations, stops training
/// after `patience` of them without improvement, and with `restore_best` the best evaluation's
/// weights and likelihood parameters are returned (also when the schedule runs out first). A
/// patience without `validation` is an error. `progress` is called after every epoch.
pub fn train_map<N: Network>(
    net: &mut N,
    likelihood: &mut dyn Likelihood,
    x: &DMatrix<f64>,
    y: &DVector<f64>,
    validation: Option<(&DMatrix<f64>, &DVector<f64>)>,
    regularizer: Option<&mut Regularizer<'_, N>>,
    config: &TrainConfig,
    progress: impl FnMut(&TrainProgress),
) -> Result<TrainReport> {
    let checked = check_training(&*likelihood, x.nrows(), y, config);
    let mut rows = in_memory(x, y, likelihood.target_dim(), &checked);
    let validation = validation.map(|(xv, yv)| Validation::Memory(xv, yv));
    let training = Training { rows: &mut rows, checked, streamed: false };
    train_map_inner(net, likelihood, training, validation, regularizer, config, progress, None)
}

/// [`train_map`] over rows read by position ([`RowSource`]): each step reads its minibatch
/// (the same seeded positions as the in-memory run, so the same rows give the same steps) and
/// checks it as it arrives — shapes, finite values, the likelihood's targets — and the
/// validation NLL is summed over chunks of `batch_size` rows. Nothing holds the whole set.
pub fn train_map_rows<N: Network>(
    net: &mut N,
    likelihood: &mut dyn Likelihood,
    rows: &mut dyn RowSource,
    validation: Option<&mut dyn RowSource>,
    regularizer: Option<&mut Regularizer<'_, N>>,
    config: &TrainConfig,
    progress: impl FnMut(&TrainProgress),
) -> Result<TrainReport> {
    let checked = check_settings(config);
    let validation = validation.map(Validation::Rows);
    let training = Training { rows, checked, streamed: true };
    train_map_inner(net, likelihood, training, validation, regularizer, config, progress, None)
}

/// The in-memory rows of `x`, `y` (none when the checks failed: a sharded run still reports the
/// failure in its first all-reduce).
fn in_memory(x: &DMatrix<f64>, y: &DVector<f64>, t: usize, checked: &Result<()>) -> RowsInMemory {
    let rows = match checked {
        Ok(()) => RowsInMemory::new(x, y.clone(), t),
        Err(_) => RowsInMemory::new(&DMatrix::zeros(0, 0), DVector::zeros(0), t),
    };
    rows.expect("the targets' length was checked")
}

/// [`train_map`] over data sharded across processes: every process calls it with its own rows
/// (`x`, `y`; the global rows are the processes' rows in rank order), its own validation rows
/// or none, and the same network, likelihood, regulariser and settings. Each step draws the
/// global minibatch from the shared seed; every process evaluates the data term on the batch's
/// rows it holds (scaled by `N / B`), the loss and its gradients in the weights and the
/// likelihood's parameters (`1 + p + |likelihood params|` numbers) are all-reduced, and the
/// regulariser — drawn from the same generator on every process — is added once; the
/// validation NLL is summed over every process's validation rows. Every process therefore
/// takes the single-process steps, up to the order of the additions. The first all-reduce
/// carries the processes' row counts (`2·world` numbers).
#[allow(clippy::too_many_arguments)]
pub fn train_map_sharded<N: Network>(
    net: &mut N,
    likelihood: &mut dyn Likelihood,
    x: &DMatrix<f64>,
    y: &DVector<f64>,
    validation: Option<(&DMatrix<f64>, &DVector<f64>)>,
    regularizer: Option<&mut Regularizer<'_, N>>,
    config: &TrainConfig,
    progress: impl FnMut(&TrainProgress),
    shard: ProcessShard<'_, NnError>,
) -> Result<TrainReport> {
    let checked = check_training(&*likelihood, x.nrows(), y, config);
    let mut rows = in_memory(x, y, likelihood.target_dim(), &checked);
    let validation = validation.map(|(xv, yv)| Validation::Memory(xv, yv));
    let training = Training { rows: &mut rows, checked, streamed: false };
    train_map_inner(net, likelihood, training, validation, regularizer, config, progress, Some(shard))
}

/// The training rows of a run: where they come from, the result of the checks taken before the
/// run (all the targets when in memory, the settings alone when streamed) and whether each
/// minibatch is checked as it arrives.
struct Training<'r> {
    rows: &'r mut dyn RowSource,
    checked: Result<()>,
    streamed: bool,
}

/// The validation rows: in memory (one pass) or read by position, `batch_size` rows at a time.
enum Validation<'v> {
    Memory(&'v DMatrix<f64>, &'v DVector<f64>),
    Rows(&'v mut dyn RowSource),
}

impl Validation<'_> {
    fn rows(&self) -> usize {
        match self {
            Validation::Memory(x, _) => x.nrows(),
            Validation::Rows(rows) => rows.len(),
        }
    }

    /// `(Σ NLL, rows)` at the network's current weights.
    fn nll<N: Network>(&mut self, net: &N, lik: &dyn Likelihood, chunk: usize) -> Result<(f64, usize)> {
        match self {
            Validation::Memory(x, y) => Ok((nll_loss(net, lik, x, y)?, x.nrows())),
            Validation::Rows(rows) => {
                let n = rows.len();
                let positions: Vec<usize> = (0..n).collect();
                let mut sum = 0.0;
                for part in positions.chunks(chunk.max(1)) {
                    let (x, y) = read_rows(*rows, part, net.input_dim(), lik, "validation")?;
                    sum += nll_loss(net, lik, &x, &y)?;
                }
                Ok((sum, n))
            }
        }
    }
}

/// A streamed minibatch, checked at the boundary: its shapes against the network and the
/// likelihood, finite values, and the likelihood's targets.
fn read_rows(
    rows: &mut dyn RowSource,
    positions: &[usize],
    input_dim: usize,
    lik: &dyn Likelihood,
    set: &'static str,
) -> Result<(DMatrix<f64>, DVector<f64>)> {
    let lik_err = |e: fspace_core::CoreError| NnError::Likelihood(e.to_string());
    let (x, y) = rows.rows(positions).map_err(|e| match e {
        fspace_core::CoreError::Input(i) => NnError::Input(i),
        other => lik_err(other),
    })?;
    let (inputs, targets) = match set {
        "validation" => ("validation inputs", "validation targets"),
        _ => ("training inputs", "training targets"),
    };
    if x.shape() != (positions.len(), input_dim) {
        return Err(NnError::Input(InputError::Invalid {
            what: inputs,
            reason: format!(
                "{} rows were read as {}×{}, the network takes {input_dim} inputs",
                positions.len(),
                x.nrows(),
                x.ncols()
            ),
        }));
    }
    if y.len() != positions.len() * lik.target_dim() {
        return Err(NnError::Input(InputError::DimensionMismatch {
            what: targets,
            expected: positions.len() * lik.target_dim(),
            found: y.len(),
        }));
    }
    if !all_finite(x.as_slice()) {
        return Err(NnError::Input(InputError::NonFinite { what: inputs }));
    }
    if !all_finite(y.as_slice()) {
        return Err(NnError::Input(InputError::NonFinite { what: targets }));
    }
    lik.check_targets(&y).map_err(lik_err)?;
    Ok((x, y))
}

/// The settings' and targets' checks of a training run.
fn check_training(
    likelihood: &dyn Likelihood,
    n: usize,
    y: &DVector<f64>,
    config: &TrainConfig,
) -> Result<()> {
    check_settings(config)?;
    let t = likelihood.target_dim();
    if y.len() != n * t {
        return Err(NnError::Input(InputError::DimensionMismatch {
            what: "targets vs. inputs × targets per point",
            expected: n * t,
            found: y.len(),
        }));
    }
    likelihood.check_targets(y).map_err(|e| NnError::Likelihood(e.to_string()))
}

/// The settings' checks of a training run.
fn check_settings(config: &TrainConfig) -> Result<()> {
    fspace_input::ensure_positive("learning_rate", config.learning_rate)?;
    if !(config.weight_decay.is_finite() && config.weight_decay >= 0.0) {
        return Err(NnError::Input(InputError::Invalid {
            what: "weight_decay",
            reason: format!("{} must be finite and ≥ 0", config.weight_decay),
        }));
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn train_map_inner<N: Network>(
    net: &mut N,
    likelihood: &mut dyn Likelihood,
    training: Training<'_>,
    mut validation: Option<Validation<'_>>,
    mut regularizer: Option<&mut Regularizer<'_, N>>,
    config: &TrainConfig,
    mut progress: impl FnMut(&TrainProgress),
    mut shard: Option<ProcessShard<'_, NnError>>,
) -> Result<TrainReport> {
    let Training { rows: source, checked, streamed } = training;
    // Sharded: the first all-reduce gives every process's training and validation row counts
    // (or says that one failed its checks).
    let (n, offset, has_validation) = match shard.as_mut() {
        None => {
            checked?;
            (source.len(), 0, validation.is_some())
        }
        Some(shard) => {
            let val_rows = validation.as_ref().map_or(0, Validation::rows);
            let layout = shard.exchange_layout(checked, &[source.len(), val_rows], DVector::zeros(0))?;
            (layout.total(0), layout.offset(0, shard.rank), layout.total(1) > 0)
        }
    };
    let batches =
        Minibatches::new(n, config.batch_size, false).map_err(|e| NnError::Likelihood(e.to_string()))?;
    let mut schedule = ScheduleRun::new(&config.schedule, batches.batches_per_epoch(), has_validation)
        .map_err(schedule_error)?;
    let mut rng = StdRng::seed_from_u64(config.seed);
    let rows_here = offset..offset + source.len();
    let mut theta = net.params();
    let p = theta.len();
    let n_lik = if config.learn_likelihood { likelihood.params().len() } else { 0 };
    let mut lik_theta = likelihood.params();
    let mut adam = Adam::new(p + n_lik, config.learning_rate);
    let mut joint = DVector::zeros(p + n_lik);
    let mut best = (theta.clone(), lik_theta.clone());
    let mut history = Vec::new();
    let (mut step, mut stopped_early, mut done) = (0usize, false, false);
    for epoch in 1.. {
        let (mut total, mut steps_in_epoch) = (0.0, 0usize);
        let mut validation_loss = None;
        let epoch_batches = batches.epoch(&mut rng);
        for idx in &epoch_batches {
            let interrupted = fspace_input::interrupt::check("training").map_err(NnError::from);
            if shard.is_none() {
                interrupted.clone()?;
            }
            // The batch's rows this process holds (all of them in one process).
            let held: Vec<usize> =
                idx.iter().filter(|i| rows_here.contains(i)).map(|&i| i - offset).collect();
            let (xb, yb) = if streamed {
                read_rows(source, &held, net.input_dim(), &*likelihood, "training")?
            } else {
                source.rows(&held).map_err(|e| NnError::Likelihood(e.to_string()))?
            };
            let scale = n as f64 / idx.len() as f64;
            let (mut nll, mut lik_grad) = (0.0, DVector::zeros(n_lik));
            let lik = &*likelihood;
            let shared: &N = net;
            let mut data_pass = || {
                if held.is_empty() {
                    // A process without rows in this batch adds nothing to the data term.
                    return Ok((DMatrix::zeros(0, 0), DVector::zeros(p)));
                }
                shared.forward_vjp(&xb, &mut |f: &DMatrix<f64>| {
                    let lik_err = |e: fspace_core::CoreError| NnError::Likelihood(e.to_string());
                    nll = lik.nll(f, &yb).map_err(lik_err)?;
                    if n_lik > 0 {
                        lik_grad = lik.nll_param_grad(f, &yb).map_err(lik_err)? * scale;
                    }
                    Ok(lik.nll_grad(f, &yb).map_err(lik_err)? * scale)
                })
            };
            // The regulariser's pass (FSP-Laplace's context points) runs beside the data pass:
            // neither changes the weights, and each one's arithmetic is its own whatever thread
            // runs it, so the sums below are those of the two passes run one after the other.
            let (data, regularized) = match regularizer.as_deref_mut() {
                Some(reg) => {
                    let (data, r) = rayon::join(data_pass, || reg(shared, &mut rng));
                    (data, Some(r))
                }
                None => (data_pass(), None),
            };
            let mut grad = match shard.as_mut() {
                None => data?.1,
                Some(shard) => {
                    // Every process's data term summed: [Σ nll, Σ ∂/∂w, Σ ∂/∂(likelihood)]. A
                    // regulariser that failed here (a callback network's error) fails this
                    // step's reduce, so the others do not wait in the next one.
                    let width = 1 + p + n_lik;
                    let reg_failure = match &regularized {
                        Some(Err(e)) => Err(e.clone()),
                        _ => Ok(()),
                    };
                    let part = interrupted.and(reg_failure).and(data).map(|(_, g)| {
                        DVector::from_iterator(
                            width,
                            std::iter::once(nll).chain(g.iter().copied()).chain(lik_grad.iter().copied()),
                        )
                    });
                    let summed = shard.sum(part, width)?;
                    nll = summed[0];
                    lik_grad = summed.rows(1 + p, n_lik).into_owned();
                    summed.rows(1, p).into_owned()
                }
            };
            let mut loss = scale * nll;
            if let Some(r) = regularized {
                let (r, g) = r?;
                if g.len() != p {
                    return Err(NnError::Input(InputError::DimensionMismatch {
                        what: "regulariser gradient",
                        expected: p,
                        found: g.len(),
                    }));
                }
                loss += r;
                grad += g;
            }
            if config.weight_decay > 0.0 {
                loss += 0.5 * config.weight_decay * theta.norm_squared();
                grad += &theta * config.weight_decay;
            }
            if !loss.is_finite() || !all_finite(grad.as_slice()) || !all_finite(lik_grad.as_slice()) {
                return Err(NnError::Input(InputError::NonFinite {
                    what: "training loss or gradient (diverged; lower the learning rate)",
                }));
            }
            if n_lik == 0 {
                adam.descend(&mut theta, &grad);
            } else {
                joint.rows_mut(0, p).copy_from(&theta);
                joint.rows_mut(p, n_lik).copy_from(&lik_theta);
                let g = DVector::from_iterator(p + n_lik, grad.iter().chain(lik_grad.iter()).cloned());
                adam.descend(&mut joint, &g);
                theta.copy_from(&joint.rows(0, p));
                lik_theta.copy_from(&joint.rows(p, n_lik));
                likelihood.set_params(&lik_theta).map_err(|e| NnError::Likelihood(e.to_string()))?;
            }
            net.set_params(&theta)?;
            total += loss;
            step += 1;
            steps_in_epoch += 1;
            if has_validation && schedule.evaluates_after(step) {
                // Σ NLL over the validation rows (every process's, sharded) and their count.
                // The regulariser's term (the same on every process), before the sum so that a
                // process where it fails says so in the sum.
                let extra = match regularizer.as_deref_mut() {
                    Some(reg) if config.validation_adds_regularizer => reg(net, &mut rng).map(|r| r.0),
                    _ => Ok(0.0),
                };
                let chunk = config.batch_size;
                let (v, count) = match shard.as_mut() {
                    None => {
                        let set = validation.as_mut().expect("has_validation");
                        let (sum, rows) = set.nll(net, &*likelihood, chunk)?;
                        (sum, rows as f64)
                    }
                    Some(shard) => {
                        let part = extra.clone().and_then(|_| match validation.as_mut() {
                            Some(set) => set
                                .nll(net, &*likelihood, chunk)
                                .map(|(s, rows)| DVector::from_vec(vec![s, rows as f64])),
                            None => Ok(DVector::zeros(2)),
                        });
                        let summed = shard.sum(part, 2)?;
                        (summed[0], summed[1])
                    }
                };
                let v = (v + extra?) / count;
                validation_loss = Some(v);
                match schedule.record(step, v) {
                    StopDecision::Improved => best = (theta.clone(), lik_theta.clone()),
                    StopDecision::Continue => {}
                    StopDecision::Stop => (stopped_early, done) = (true, true),
                }
            }
            if done || schedule.is_last(step) {
                done = true;
                break;
            }
        }
        let p = TrainProgress { epoch, train_loss: total / steps_in_epoch as f64, validation_loss };
        progress(&p);
        history.push(p);
        if done {
            break;
        }
    }
    // The best evaluation's parameters, also when the schedule ran out first (the last
    // evaluations may have been worse without exhausting the patience).
    let best_step = match schedule.best_step() {
        Some(at) if schedule.restores_best() => {
            net.set_params(&best.0)?;
            if n_lik > 0 {
                likelihood.set_params(&best.1).map_err(|e| NnError::Likelihood(e.to_string()))?;
            }
            at
        }
        _ => step,
    };
    Ok(TrainReport { epochs: history.len(), steps: step, best_step, stopped_early, history })
}

fn schedule_error(e: fspace_core::CoreError) -> NnError {
    match e {
        fspace_core::CoreError::Input(i) => NnError::Input(i),
        other => NnError::Likelihood(other.to_string()),
    }
}

/// What [`fit_map`] did: the training report and the likelihood after training.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct MapReport {
    /// Epochs, early stopping and the per-epoch history.
    pub train: TrainReport,
    /// The likelihood with σ at its trained value where the spec learned it, held fixed
    /// (`learn: false`), ready for a post-hoc method (Laplace, post-hoc FSP-Laplace, VaLLA,
    /// ELLA) on the returned network.
    pub likelihood: LikelihoodSpec,
    /// Wall time (s).
    pub seconds: f64,
}

/// MAP training in the workspace's call shape: `net` trained on `data` under `likelihood`
/// (σ learned iff the spec's `learn`), returned with a [`MapReport`]. A validation set in
/// `data` is used: it is evaluated at the schedule's evaluations, enables early stopping with
/// its `patience`, and with `restore_best` the best-validation weights are returned. `config`'s
/// `learn_likelihood` must be left `false` (the spec decides) or agree with the spec.
pub fn fit_map<N: Network>(
    net: N,
    likelihood: LikelihoodSpec,
    data: &Data,
    config: &TrainConfig,
) -> Result<Fitted<N, MapReport>> {
    fit_map_observed(net, likelihood, data, config, &mut Silent)
}

/// [`fit_map`], reporting every epoch to `observer` (`loss`: the mean training objective per
/// step; `validation`: the validation NLL per point on validated epochs).
pub fn fit_map_observed<N: Network>(
    mut net: N,
    likelihood: LikelihoodSpec,
    data: &Data,
    config: &TrainConfig,
    observer: &mut dyn Observer,
) -> Result<Fitted<N, MapReport>> {
    let start = std::time::Instant::now();
    if config.learn_likelihood && !likelihood.learns_noise() {
        return Err(NnError::Input(InputError::Invalid {
            what: "TrainConfig::learn_likelihood",
            reason: format!(
                "is true but the {} likelihood spec does not learn σ; set learn: true in the spec instead",
                likelihood.name()
            ),
        }));
    }
    let mut lik = likelihood.build().map_err(|e| NnError::Likelihood(e.to_string()))?;
    let config = TrainConfig { learn_likelihood: likelihood.learns_noise(), ..config.clone() };
    let (x, y) = (data.x(), data.y_flat());
    let validation = data.validation_flat();
    let steps_per_epoch = x.nrows().max(1).div_ceil(config.batch_size.clamp(1, x.nrows().max(1)));
    let total = config.schedule.length.in_epochs(steps_per_epoch);
    let train = train_map(
        &mut net,
        lik.as_mut(),
        x,
        &y,
        validation.as_ref().map(|(xv, yv)| (*xv, yv)),
        None,
        &config,
        |p: &TrainProgress| {
            observer.observe(&Progress {
                step: p.epoch,
                total,
                loss: Some(p.train_loss),
                validation: p.validation_loss,
            })
        },
    )?;
    let trained = match likelihood.noise_std() {
        Some(_) if likelihood.learns_noise() => likelihood.with_noise_std(lik.params()[0].exp()),
        _ => likelihood,
    };
    let report = MapReport { train, likelihood: trained.fixed(), seconds: start.elapsed().as_secs_f64() };
    Ok(Fitted { posterior: net, report })
}
