//! Fitting VaLLA ([`fit`]) and its posterior ([`VallaPosterior`]).

use fspace_input::InputError;
use std::time::Instant;

use fspace_core::{
    Adam, Data, Fitted, FunctionPredictive, LikelihoodSpec, Minibatches, Observer, Persist, PersistError,
    Posterior, ProcessShard, Progress, Schedule, ScheduleRun, Silent, StopDecision,
};
use fspace_linalg::fast::{cholesky_lower, solve_lower, solve_upper_of_lower};
use fspace_nn::{Network, NnError, Outputs};
use nalgebra::{DMatrix, DVector};
use rand::rngs::StdRng;
use rand::SeedableRng;
use rand_distr::{Distribution, StandardNormal};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::data::{
    check_data, check_evaluation_data, check_likelihood, marginals, mean_nll_from_blocks,
    outputs_and_ntk_diagonal, to_core,
};
use crate::error::{ensure_positive, Result, VallaError};
use crate::objective::{
    factor_b, kl_term, objective_part, Batch, ClassApprox, DataTerm, Learn, VallaLikelihood, VariationalState,
};

/// Options of VaLLA ([`fit`]); `Default` is the paper's setting (§5, App. C–E).
///
/// | name | default | purpose | range |
/// |---|---|---|---|
/// | `num_inducing` | 100 | `M`, inducing points (`Z`) | `1..=n` |
/// | `alpha` | 1.0 | α of the objective (eq. 22); 1 = log predictive of the data | `(0, 1]` |
/// | `batch_size` | 100 | minibatch `|b|` (eq. 23) | ≥ 1 |
/// | `learning_rate` | 1e-3 | Adam step | > 0 |
/// | `schedule` | 20 000 steps, validated every 100, patience 1, best restored | length, validation interval, patience in evaluations (App. D: 1, stop at the first evaluation that does not improve; needs a validation set, `with_patience(None)` trains without) and best-state restore ([`Schedule`]) | |
/// | `prior_variance` | 1.0 | initial σ₀² of `κ = σ₀² J Jᵀ` | > 0 |
/// | `learn_prior_variance` | true | optimise σ₀² | |
/// | `optimize_inducing` | true | move `Z` by the NTK's input gradient | |
/// | `class_approx` | probit | `log E_q[p(y|f)]` for classification | |
/// | `kmeans_iterations` | 100 | Lloyd iterations of the `Z` initialisation | ≥ 1 |
/// | `seed` | 0 | k-means, minibatches, MC noise | |
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VallaConfig {
    /// Inducing points `M`.
    pub num_inducing: usize,
    /// α of the α-objective.
    pub alpha: f64,
    /// Minibatch size.
    pub batch_size: usize,
    /// Adam learning rate.
    pub learning_rate: f64,
    /// Length, validation interval, early stopping (App. D: patience 1, which needs a
    /// validation set) and best-state restore.
    pub schedule: Schedule,
    /// Initial σ₀².
    pub prior_variance: f64,
    /// Optimise σ₀².
    pub learn_prior_variance: bool,
    /// Optimise `Z`.
    pub optimize_inducing: bool,
    /// Class-probability approximation in the objective.
    pub class_approx: ClassApprox,
    /// k-means iterations.
    pub kmeans_iterations: usize,
    /// Seed.
    pub seed: u64,
}

impl Default for VallaConfig {
    fn default() -> Self {
        Self {
            num_inducing: 100,
            alpha: 1.0,
            batch_size: 100,
            learning_rate: 1e-3,
            schedule: Schedule::steps(20_000).every_steps(100).patience(1),
            prior_variance: 1.0,
            learn_prior_variance: true,
            optimize_inducing: true,
            class_approx: ClassApprox::Probit,
            kmeans_iterations: 100,
            seed: 0,
        }
    }
}

impl VallaConfig {
    fn validate(&self) -> Result<()> {
        if self.num_inducing == 0 {
            return Err(VallaError::Input(InputError::Invalid {
                what: "num_inducing",
                reason: "must be ≥ 1".into(),
            }));
        }
        if !(self.alpha > 0.0 && self.alpha <= 1.0) {
            return Err(VallaError::Input(InputError::Invalid {
                what: "alpha",
                reason: format!("{} must lie in (0, 1]", self.alpha),
            }));
        }
        for (what, v) in [("batch_size", self.batch_size), ("kmeans_iterations", self.kmeans_iterations)] {
            if v == 0 {
                return Err(VallaError::Input(InputError::Invalid { what, reason: "must be ≥ 1".into() }));
            }
        }
        self.schedule.validate()?;
        ensure_positive("learning_rate", self.learning_rate)?;
        ensure_positive("prior_variance (σ₀²)", self.prior_variance)?;
        match self.class_approx {
            ClassApprox::MonteCarlo { samples: 0 } => {
                Err(VallaError::Input(InputError::Invalid { what: "class_approx samples", reason: "must be ≥ 1".into() }))
            }
            ClassApprox::Probit if self.alpha != 1.0 => Err(VallaError::Input(InputError::Invalid {
                what: "alpha",
                reason: "the probit approximation gives log E[p], i.e. α = 1 only; use ClassApprox::MonteCarlo for α < 1".into(),
            })),
            _ => Ok(()),
        }
    }
}

/// One validation record of the training history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ValidationPoint {
    /// Iterations done.
    pub iteration: usize,
    /// Mean minibatch objective `F / N` since the previous record.
    pub objective_per_point: f64,
    /// Validation mean NLL (`None` without validation data).
    pub validation_nll: Option<f64>,
    /// σ₀² at this point.
    pub prior_variance: f64,
}

/// What a VaLLA fit did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VallaReport {
    /// Iterations run.
    pub iterations: usize,
    /// Iteration of the restored (best-validation) state.
    pub best_iteration: usize,
    /// Whether early stopping ended the run.
    pub stopped_early: bool,
    /// History, one entry per validation period.
    pub history: Vec<ValidationPoint>,
    /// Wall-clock seconds of the fit (precomputation, k-means and optimisation).
    pub seconds: f64,
}

/// The inducing outputs: one class per inducing point, round-robin over the classes that still
/// have unused points (so `M/C` per class when classes are large enough).
fn class_allocation(y: &DVector<f64>, classes: usize, m: usize) -> Vec<usize> {
    let mut count = vec![0usize; classes];
    for &v in y.iter() {
        count[v as usize] += 1;
    }
    let mut alloc = vec![0usize; classes];
    let mut total = 0;
    while total < m {
        for c in 0..classes {
            if total < m && alloc[c] < count[c] {
                alloc[c] += 1;
                total += 1;
            }
        }
    }
    alloc
}

/// k-means initialisation of `Z`: on all inputs (one output), or per class with the classes'
/// shares of [`class_allocation`] (each inducing point carries its class's output, as the
/// paper's multi-class VaLLA).
fn initial_inducing(
    x: &DMatrix<f64>,
    y: &DVector<f64>,
    likelihood: VallaLikelihood,
    classes: usize,
    config: &VallaConfig,
) -> Result<(DMatrix<f64>, Vec<usize>)> {
    let m = config.num_inducing;
    match likelihood {
        VallaLikelihood::Gaussian { .. } => {
            Ok((fspace_gp::kmeans(x, m, config.kmeans_iterations, config.seed)?, vec![0; m]))
        }
        VallaLikelihood::Categorical => {
            let alloc = class_allocation(y, classes, m);
            let mut z = DMatrix::zeros(m, x.ncols());
            let mut outputs = Vec::with_capacity(m);
            for (c, &k) in alloc.iter().enumerate().filter(|(_, &k)| k > 0) {
                let rows: Vec<usize> = (0..x.nrows()).filter(|&i| y[i] as usize == c).collect();
                let centroids = fspace_gp::kmeans(
                    &x.select_rows(&rows),
                    k,
                    config.kmeans_iterations,
                    config.seed + c as u64,
                )?;
                for r in 0..k {
                    z.set_row(outputs.len(), &centroids.row(r));
                    outputs.push(c);
                }
            }
            Ok((z, outputs))
        }
    }
}

/// The state-dependent pieces of the predictive: `R = chol(B)` with `B = I + σ₀² Lᵀ κ̂_Z L`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Prepared {
    state: VariationalState,
    r: DMatrix<f64>,
}

impl Prepared {
    fn new<N: Network>(net: &N, state: VariationalState) -> Result<Self> {
        let sel = Outputs::One(&state.outputs);
        let kz = net.ntk_block(&state.z, sel, &state.z, sel)?;
        let r = factor_b(&state.l, &(kz * &state.l), state.prior_variance())?;
        Ok(Self { state, r })
    }

    /// `V = R⁻¹ (σ₀² κ̂(X, Z) L)ᵀ` (`M × n·d'`): `K*(x, x') = σ₀² κ̂(x, x') − VₓᵀVₓ'`.
    fn v<N: Network>(&self, net: &N, x: &DMatrix<f64>) -> Result<DMatrix<f64>> {
        let kxz = net.ntk_block(x, Outputs::All, &self.state.z, Outputs::One(&self.state.outputs))?;
        Ok(solve_lower(&self.r, &(kxz * &self.state.l * self.state.prior_variance()).transpose()))
    }

    /// Per-point `d' × d'` predictive covariances from precomputed unit-NTK diagonal blocks.
    fn blocks<N: Network>(
        &self,
        net: &N,
        x: &DMatrix<f64>,
        kxx: &[DMatrix<f64>],
    ) -> Result<Vec<DMatrix<f64>>> {
        let q = net.output_dim();
        let s0 = self.state.prior_variance();
        let mut out = Vec::with_capacity(x.nrows());
        for start in (0..x.nrows()).step_by(512) {
            let len = 512.min(x.nrows() - start);
            let v = self.v(net, &x.rows(start, len).into_owned())?;
            for i in 0..len {
                let vi = v.columns(i * q, q);
                out.push(&kxx[start + i] * s0 - vi.transpose() * vi);
            }
        }
        Ok(out)
    }
}

/// Mean validation NLL of the predictive `p(y | x) ≈ E_q[p(y | f)]` (Gaussian: closed form;
/// categorical: probit, as the predictive of [`VallaPosterior::class_probabilities`]).
fn mean_nll<N: Network>(
    net: &N,
    prepared: &Prepared,
    likelihood: VallaLikelihood,
    x: &DMatrix<f64>,
    g: &DMatrix<f64>,
    kxx: &[DMatrix<f64>],
    y: &DVector<f64>,
) -> Result<f64> {
    let blocks = prepared.blocks(net, x, kxx)?;
    mean_nll_from_blocks(likelihood, prepared.state.noise_variance(), g, &blocks, y)
}

/// Fits VaLLA to a trained network `net` (its parameters are the MAP `θ̂`): the sparse
/// variational GP with prior `GP(g(·; θ̂), σ₀² J(·)J(·)ᵀ)` whose mean stays the network
/// (Prop. 1), with `Z`, `A`, σ₀² and σ² found by Adam on the α-objective (eq. 23) and, with a
/// validation set, early stopping that restores the best state (App. C).
///
/// Targets are `n × 1` (regression values or class labels). A validation set in `data` is
/// required when `config.patience` is set. Errors: bad data or labels, more inducing points
/// than data, non-positive hyperparameters, an empty validation set, `Z` optimisation on a
/// network without an NTK input gradient. The report is also kept in the posterior.
pub fn fit<N: Network + Clone>(
    net: N,
    likelihood: LikelihoodSpec,
    data: &Data,
    config: &VallaConfig,
) -> Result<Fitted<VallaPosterior<N>, VallaReport>> {
    fit_observed(net, likelihood, data, config, &mut Silent)
}

/// [`fit`], reporting every validation period to `observer` (`loss`: minus the mean minibatch
/// objective per point since the previous report; `validation`: the validation mean NLL).
pub fn fit_observed<N: Network + Clone>(
    net: N,
    likelihood: LikelihoodSpec,
    data: &Data,
    config: &VallaConfig,
    observer: &mut dyn Observer,
) -> Result<Fitted<VallaPosterior<N>, VallaReport>> {
    let (x, y) = (data.x(), &data.y_flat());
    let val_flat = data.validation_flat();
    let validation = val_flat.as_ref().map(|(xv, yv)| (*xv, yv));
    let post = fit_inner(net, likelihood, x, y, validation, config, observer, None)?;
    Ok(Fitted { report: post.report.clone(), posterior: post })
}

/// [`fit_observed`] over data sharded across processes: every process calls it with its own
/// training rows (and its own validation rows, or none) and the same network, likelihood and
/// settings; the global rows are the processes' rows in rank order. The k-means start runs over
/// every process's rows ([`fspace_gp::kmeans_sharded`]); each step draws the global minibatch
/// and the MC noise from the shared seed, every process evaluates the data term on the batch's
/// rows it holds (scaled by `N / B`), the terms and their gradients (`1 + |θ|` numbers) are
/// all-reduced and the KL is added once; validation NLLs are summed over every process's
/// validation rows. Every process therefore takes the single-process steps, up to the order of
/// the additions, and ends with the same posterior. A process whose own work fails (its data,
/// an interrupt) sends the failure flag in its next all-reduce and returns its error; the
/// others get the reduce's error, so none waits forever.
pub fn fit_sharded<N: Network + Clone>(
    net: N,
    likelihood: LikelihoodSpec,
    data: &Data,
    config: &VallaConfig,
    shard: ProcessShard<'_, VallaError>,
    observer: &mut dyn Observer,
) -> Result<Fitted<VallaPosterior<N>, VallaReport>> {
    let (x, y) = (data.x(), &data.y_flat());
    let val_flat = data.validation_flat();
    let validation = val_flat.as_ref().map(|(xv, yv)| (*xv, yv));
    let post = fit_inner(net, likelihood, x, y, validation, config, observer, Some(shard))?;
    Ok(Fitted { report: post.report.clone(), posterior: post })
}

/// What a fit computes from its own rows before it learns anything from other processes.
struct Local {
    likelihood: VallaLikelihood,
    g_all: DMatrix<f64>,
    kxx_all: Vec<DMatrix<f64>>,
    val: Option<(DMatrix<f64>, Vec<DMatrix<f64>>)>,
}

fn prepare_local<N: Network>(
    net: &N,
    spec: &LikelihoodSpec,
    x: &DMatrix<f64>,
    y: &DVector<f64>,
    validation: Option<(&DMatrix<f64>, &DVector<f64>)>,
    config: &VallaConfig,
) -> Result<Local> {
    config.validate()?;
    let likelihood = VallaLikelihood::from_spec(spec, net.output_dim())?;
    check_data(net, likelihood, x, y, "training data")?;
    if let Some((xv, yv)) = validation {
        check_data(net, likelihood, xv, yv, "validation data")?;
    }
    let (g_all, kxx_all) = outputs_and_ntk_diagonal(net, x)?;
    let val = match validation {
        Some((xv, _)) => Some(outputs_and_ntk_diagonal(net, xv)?),
        None => None,
    };
    Ok(Local { likelihood, g_all, kxx_all, val })
}

/// Who holds what in a sharded fit: every process's training rows, validation rows and
/// training rows per class (from the first all-reduce).
struct Layout {
    rank: usize,
    rows: Vec<usize>,
    val_rows: Vec<usize>,
    /// `class_rows[r][c]`: process `r`'s training rows of class `c`.
    class_rows: Vec<Vec<usize>>,
}

impl Layout {
    fn offset(&self) -> usize {
        self.rows[..self.rank].iter().sum()
    }
    /// `(first global row, rows)` of every process among the rows `counts` gives.
    fn spans(counts: impl Iterator<Item = usize>) -> Vec<(usize, usize)> {
        let mut at = 0;
        counts
            .map(|c| {
                let span = (at, c);
                at += c;
                span
            })
            .collect()
    }
}

/// The k-means start over every process's rows: one clustering of all rows (regression), or
/// one per class of that class's rows.
fn initial_inducing_sharded(
    x: &DMatrix<f64>,
    y: &DVector<f64>,
    likelihood: VallaLikelihood,
    layout: &Layout,
    config: &VallaConfig,
    reducer: &mut ProcessShard<'_, VallaError>,
) -> Result<(DMatrix<f64>, Vec<usize>)> {
    let m = config.num_inducing;
    let mut sum = |part: Vec<f64>| -> fspace_gp::Result<Vec<f64>> {
        let n = part.len();
        reducer.sum(Ok(DVector::from_vec(part)), n).map(|v| v.data.into()).map_err(|e| {
            fspace_gp::GpError::Input(InputError::Invalid {
                what: "the sum over the processes",
                reason: e.to_string(),
            })
        })
    };
    match likelihood {
        VallaLikelihood::Gaussian { .. } => {
            let spans = Layout::spans(layout.rows.iter().copied());
            let shard = fspace_gp::KmeansShard { rank: layout.rank, layout: &spans, sum: &mut sum };
            Ok((fspace_gp::kmeans_sharded(x, m, config.kmeans_iterations, config.seed, shard)?, vec![0; m]))
        }
        VallaLikelihood::Categorical => {
            let classes = layout.class_rows[0].len();
            let totals: Vec<f64> =
                (0..classes).map(|c| layout.class_rows.iter().map(|r| r[c]).sum::<usize>() as f64).collect();
            // class_allocation reads labels; the global class counts stand in for them.
            let labels = DVector::from_iterator(
                totals.iter().map(|&t| t as usize).sum(),
                totals.iter().enumerate().flat_map(|(c, &t)| std::iter::repeat_n(c as f64, t as usize)),
            );
            let alloc = class_allocation(&labels, classes, m);
            let mut z = DMatrix::zeros(m, x.ncols());
            let mut outputs = Vec::with_capacity(m);
            for (c, &k) in alloc.iter().enumerate().filter(|(_, &k)| k > 0) {
                let rows: Vec<usize> = (0..x.nrows()).filter(|&i| y[i] as usize == c).collect();
                let spans = Layout::spans(layout.class_rows.iter().map(|r| r[c]));
                let shard = fspace_gp::KmeansShard { rank: layout.rank, layout: &spans, sum: &mut sum };
                let centroids = fspace_gp::kmeans_sharded(
                    &x.select_rows(&rows),
                    k,
                    config.kmeans_iterations,
                    config.seed + c as u64,
                    shard,
                )?;
                for r in 0..k {
                    z.set_row(outputs.len(), &centroids.row(r));
                    outputs.push(c);
                }
            }
            Ok((z, outputs))
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn fit_inner<N: Network + Clone>(
    net: N,
    spec: LikelihoodSpec,
    x: &DMatrix<f64>,
    y: &DVector<f64>,
    validation: Option<(&DMatrix<f64>, &DVector<f64>)>,
    config: &VallaConfig,
    observer: &mut dyn Observer,
    mut shard: Option<ProcessShard<'_, VallaError>>,
) -> Result<VallaPosterior<N>> {
    let start = Instant::now();
    let q = net.output_dim();
    let local = prepare_local(&net, &spec, x, y, validation, config);
    let mut reducer = shard.as_mut();
    // Sharded: the first all-reduce tells every process who holds what (or that one failed).
    let layout = match reducer.as_mut() {
        None => None,
        Some(reducer) => {
            // Training rows, validation rows, then the training rows of each class.
            let mut counts = vec![x.nrows(), validation.map_or(0, |(xv, _)| xv.nrows())];
            counts.resize(2 + q, 0);
            if let Ok(Local { likelihood: VallaLikelihood::Categorical, .. }) = &local {
                for &v in y.iter() {
                    counts[2 + v as usize] += 1;
                }
            }
            let checked = local.as_ref().map(|_| ()).map_err(Clone::clone);
            let layout = reducer.exchange_layout(checked, &counts, DVector::zeros(0))?;
            let mut sets = layout.counts.into_iter();
            let (rows, val_rows) = (sets.next().unwrap_or_default(), sets.next().unwrap_or_default());
            let per_class: Vec<Vec<usize>> = sets.collect();
            Some(Layout {
                rank: reducer.rank,
                rows,
                val_rows,
                class_rows: (0..reducer.world).map(|r| per_class.iter().map(|c| c[r]).collect()).collect(),
            })
        }
    };
    let Local { likelihood, g_all, kxx_all, val: val_local } = local?;
    let n = layout.as_ref().map_or(x.nrows(), |l| l.rows.iter().sum());
    let has_validation =
        layout.as_ref().map_or(validation.is_some(), |l| l.val_rows.iter().sum::<usize>() > 0);
    if !has_validation && config.schedule.patience.is_some() {
        return Err(VallaError::Input(InputError::Empty {
            what: "validation data (early stopping needs it; set patience = None to train without)",
        }));
    }
    if config.num_inducing > n {
        return Err(VallaError::TooManyPoints {
            what: "inducing points",
            requested: config.num_inducing,
            available: n,
        });
    }
    let noise_std = match likelihood {
        VallaLikelihood::Gaussian { noise_std } => noise_std,
        VallaLikelihood::Categorical => 1.0,
    };
    let (z, outputs) = match (&layout, reducer.as_mut()) {
        (Some(layout), Some(reducer)) => initial_inducing_sharded(x, y, likelihood, layout, config, reducer)?,
        _ => initial_inducing(x, y, likelihood, q, config)?,
    };
    let m = z.nrows();
    let mut state = VariationalState {
        z,
        outputs,
        log_prior_var: config.prior_variance.ln(),
        log_noise_var: 2.0 * noise_std.ln(),
        l: DMatrix::identity(m, m),
    };
    if config.optimize_inducing {
        let probe = state.z.rows(0, 1).into_owned();
        let sel = [state.outputs[0]];
        match net.ntk_block_pullback_z(
            &probe,
            Outputs::All,
            &probe,
            Outputs::One(&sel),
            &DMatrix::zeros(q, 1),
        ) {
            Err(NnError::Unsupported { what }) => {
                return Err(VallaError::Input(InputError::Invalid {
                    what: "optimize_inducing",
                    reason: format!(
                        "{what}; set optimize_inducing = false to keep the k-means inducing points"
                    ),
                }))
            }
            other => {
                other?;
            }
        }
    }
    let val = match (validation, val_local) {
        (Some((xv, yv)), Some((g, k))) => Some((xv, yv, g, k)),
        _ => None,
    };
    let term = DataTerm { likelihood, approx: config.class_approx, alpha: config.alpha };
    let learn = Learn { prior_variance: config.learn_prior_variance, noise: spec.learns_noise() };
    let batches = Minibatches::new(n, config.batch_size, false)?;
    let mut schedule = ScheduleRun::new(&config.schedule, batches.batches_per_epoch(), has_validation)?;
    let total = schedule.total_steps();
    let mut rng = StdRng::seed_from_u64(config.seed);
    let mut adam = Adam::new(state.flat_len(), config.learning_rate);
    let mut theta = state.to_flat();
    let mut best = state.clone();
    let mut history = Vec::new();
    let (offset, rows) = layout.as_ref().map_or((0, n), |l| (l.offset(), x.nrows()));
    let (mut it, mut running, mut running_count, mut stopped_early) = (0usize, 0.0, 0usize, false);
    'outer: loop {
        for idx in batches.epoch(&mut rng) {
            // The MC noise of every point of the global batch, drawn in the batch's order.
            let eps: Option<Vec<DMatrix<f64>>> = match config.class_approx {
                ClassApprox::MonteCarlo { samples } if likelihood == VallaLikelihood::Categorical => Some(
                    (0..idx.len())
                        .map(|_| DMatrix::from_fn(samples, q, |_, _| StandardNormal.sample(&mut rng)))
                        .collect(),
                ),
                _ => None,
            };
            // The batch's rows this process holds (all of them in one process).
            let held: Vec<usize> =
                (0..idx.len()).filter(|&b| (offset..offset + rows).contains(&idx[b])).collect();
            let step = |state: &VariationalState| -> Result<(f64, DVector<f64>)> {
                fspace_input::interrupt::check("VaLLA's optimisation")?;
                let local: Vec<usize> = held.iter().map(|&b| idx[b] - offset).collect();
                let xb = x.select_rows(&local);
                let gb = g_all.select_rows(&local);
                let kxx: Vec<DMatrix<f64>> = local.iter().map(|&i| kxx_all[i].clone()).collect();
                let yb: Vec<f64> = local.iter().map(|&i| y[i]).collect();
                let eps_b: Option<Vec<DMatrix<f64>>> =
                    eps.as_ref().map(|e| held.iter().map(|&b| e[b].clone()).collect());
                let batch = Batch { x: &xb, g: &gb, kxx: &kxx, y: &yb, eps: eps_b.as_deref() };
                let scale = n as f64 / idx.len() as f64;
                let sharded = layout.is_some();
                let (value, grad) =
                    objective_part(&net, state, &batch, term, scale, !sharded, config.optimize_inducing)?;
                Ok((value, grad.to_flat(state, &learn)))
            };
            let (value, grad) = match reducer.as_mut() {
                None => step(&state)?,
                Some(reducer) => {
                    // Every process's data term summed, then the KL once (computed first, so that
                    // a process where it fails says so in the sum).
                    let width = 1 + state.flat_len();
                    let kl = kl_term(&net, &state, config.optimize_inducing);
                    let part = match &kl {
                        Err(e) => Err(e.clone()),
                        Ok(_) if held.is_empty() => fspace_input::interrupt::check("VaLLA's optimisation")
                            .map(|()| DVector::zeros(width))
                            .map_err(VallaError::from),
                        Ok(_) => step(&state).map(|(v, g)| {
                            DVector::from_iterator(width, std::iter::once(v).chain(g.iter().copied()))
                        }),
                    };
                    let summed = reducer.sum(part, width)?;
                    let (kl, kl_grad) = kl?;
                    let grad = summed.rows(1, width - 1) + kl_grad.to_flat(&state, &learn);
                    (summed[0] + kl, grad)
                }
            };
            if !value.is_finite() {
                return Err(VallaError::Input(InputError::NonFinite {
                    what: "VaLLA objective (lower the learning rate)",
                }));
            }
            adam.ascend(&mut theta, &grad);
            state.set_flat(&theta);
            it += 1;
            running += value / n as f64;
            running_count += 1;
            if schedule.evaluates_after(it) {
                let vnll = if !has_validation {
                    None
                } else {
                    // This process's mean validation NLL and its number of points.
                    let local_nll = |state: &VariationalState| -> Result<(f64, f64)> {
                        match &val {
                            Some((xv, yv, g, k)) => {
                                let prepared = Prepared::new(&net, state.clone())?;
                                Ok((mean_nll(&net, &prepared, likelihood, xv, g, k, yv)?, xv.nrows() as f64))
                            }
                            None => Ok((0.0, 0.0)),
                        }
                    };
                    match reducer.as_mut() {
                        None => Some(local_nll(&state)?.0),
                        Some(reducer) => {
                            let part =
                                local_nll(&state).map(|(mean, c)| DVector::from_vec(vec![mean * c, c]));
                            let summed = reducer.sum(part, 2)?;
                            Some(summed[0] / summed[1])
                        }
                    }
                };
                history.push(ValidationPoint {
                    iteration: it,
                    objective_per_point: running / running_count as f64,
                    validation_nll: vnll,
                    prior_variance: state.prior_variance(),
                });
                observer.observe(&Progress {
                    step: it,
                    total,
                    loss: Some(-running / running_count as f64),
                    validation: vnll,
                });
                running = 0.0;
                running_count = 0;
                if let Some(v) = vnll {
                    match schedule.record(it, v) {
                        StopDecision::Improved => best = state.clone(),
                        StopDecision::Continue => {}
                        StopDecision::Stop => {
                            stopped_early = true;
                            break 'outer;
                        }
                    }
                }
            }
            if schedule.is_last(it) {
                break 'outer;
            }
        }
    }
    let (state, best_iteration) = match schedule.best_step() {
        Some(at) if schedule.restores_best() => (best, at),
        _ => (state, it),
    };
    let prepared = Prepared::new(&net, state)?;
    let report = VallaReport {
        iterations: it,
        best_iteration,
        stopped_early,
        history,
        seconds: start.elapsed().as_secs_f64(),
    };
    Ok(VallaPosterior { net, likelihood, spec, prepared, report })
}

/// A fitted VaLLA posterior: `f ~ GP(g(·; θ̂), K*)` with
/// `K*(x, x') = σ₀² κ̂(x, x') − σ₀² κ̂(x, Z) L B⁻¹ Lᵀ κ̂(Z, x') σ₀²` (Prop. 1, eq. 17).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VallaPosterior<N> {
    net: N,
    likelihood: VallaLikelihood,
    spec: LikelihoodSpec,
    prepared: Prepared,
    report: VallaReport,
}

/// The shapes and values [`VallaPosterior::from_state`] requires of a state: `M ≥ 1` inducing
/// points with the network's input columns, one output index (below `d'`) per point, `L`
/// `M × M`, everything finite.
fn check_state<N: Network>(net: &N, state: &VariationalState) -> Result<()> {
    let m = state.z.nrows();
    if m == 0 {
        return Err(VallaError::Input(InputError::Empty { what: "inducing points" }));
    }
    if state.z.ncols() != net.input_dim() {
        return Err(VallaError::Input(InputError::DimensionMismatch {
            what: "inducing-point columns",
            expected: net.input_dim(),
            found: state.z.ncols(),
        }));
    }
    if state.outputs.len() != m || state.l.shape() != (m, m) {
        return Err(VallaError::Input(InputError::DimensionMismatch {
            what: "inducing outputs / L (one per inducing point)",
            expected: m,
            found: state.outputs.len(),
        }));
    }
    if state.z.iter().chain(state.l.iter()).any(|v| !v.is_finite())
        || !state.log_prior_var.is_finite()
        || !state.log_noise_var.is_finite()
    {
        return Err(VallaError::Input(InputError::NonFinite { what: "variational state" }));
    }
    if state.outputs.iter().any(|&o| o >= net.output_dim()) {
        return Err(VallaError::Input(InputError::Invalid {
            what: "inducing outputs",
            reason: format!("each must be an output index below {}", net.output_dim()),
        }));
    }
    Ok(())
}

impl<N: Network + Clone> VallaPosterior<N> {
    /// Builds a posterior from a given state (e.g. Prop. 2's optimal `A`, or a saved one);
    /// checks shapes and positivity.
    pub fn from_state(net: N, spec: LikelihoodSpec, state: VariationalState) -> Result<Self> {
        let likelihood = VallaLikelihood::from_spec(&spec, net.output_dim())?;
        check_likelihood(&net, likelihood)?;
        check_state(&net, &state)?;
        let prepared = Prepared::new(&net, state)?;
        let report = VallaReport {
            iterations: 0,
            best_iteration: 0,
            stopped_early: false,
            history: Vec::new(),
            seconds: 0.0,
        };
        Ok(Self { net, likelihood, spec, prepared, report })
    }

    /// The variational state (`Z`, outputs, σ₀², σ², `L`).
    pub fn state(&self) -> &VariationalState {
        &self.prepared.state
    }
    /// The network (MAP weights).
    pub fn network(&self) -> &N {
        &self.net
    }
    /// What the fit did.
    pub fn report(&self) -> &VallaReport {
        &self.report
    }

    /// Predictive mean `g(X)` (`n × d'`) and the per-point `d' × d'` covariances of `f`.
    pub fn predict_blocks(&self, x: &DMatrix<f64>) -> Result<(DMatrix<f64>, Vec<DMatrix<f64>>)> {
        let (g, kxx) = outputs_and_ntk_diagonal(&self.net, x)?;
        let blocks = self.prepared.blocks(&self.net, x, &kxx)?;
        Ok((g, blocks))
    }

    /// Mean NLL of `y` under the predictive (Gaussian: `N(g, σ² + Σ)`; categorical: probit).
    pub fn predictive_nll(&self, x: &DMatrix<f64>, y: &DVector<f64>) -> Result<f64> {
        check_evaluation_data(&self.net, self.likelihood, x, y)?;
        let (g, kxx) = outputs_and_ntk_diagonal(&self.net, x)?;
        mean_nll(&self.net, &self.prepared, self.likelihood, x, &g, &kxx, y)
    }
}

/// Saves the network, the likelihood and the variational state.
impl<N: Network + Clone + Serialize + DeserializeOwned> Persist for VallaPosterior<N> {
    const KIND: &'static str = "fspace_valla::VallaPosterior";
    const VERSION: u32 = 2;

    /// The network checked itself while it was read; here: the spec against the network and
    /// the stored observation model, the state as [`VallaPosterior::from_state`] checks it, and
    /// `R` (`M × M`, finite).
    fn validate_loaded(&self) -> std::result::Result<(), PersistError> {
        let check = fspace_core::LoadCheck::new(Self::KIND);
        let from_spec = VallaLikelihood::from_spec(&self.spec, self.net.output_dim())
            .map_err(|e| check.invalid("spec", e.to_string()))?;
        check.ensure(from_spec == self.likelihood, "likelihood", || {
            format!("{:?} does not match the spec {:?}", self.likelihood, self.spec)
        })?;
        check_likelihood(&self.net, self.likelihood)
            .map_err(|e| check.invalid("likelihood", e.to_string()))?;
        let state = &self.prepared.state;
        check_state(&self.net, state).map_err(|e| check.invalid("prepared.state", e.to_string()))?;
        let m = state.z.nrows();
        check.shape("prepared.r", self.prepared.r.shape(), (m, m))?;
        check.finite("prepared.r", self.prepared.r.iter())
    }
}

fn core_err(e: VallaError) -> fspace_core::CoreError {
    to_core(e, "VaLLA posterior")
}

impl<N: Network + Clone> Posterior for VallaPosterior<N> {
    fn output_dim(&self) -> usize {
        self.net.output_dim()
    }
    /// The spec with σ the fitted one for Gaussian models.
    fn likelihood(&self) -> Option<LikelihoodSpec> {
        Some(self.spec.with_noise_std(self.state().noise_variance().sqrt()))
    }

    fn predict(&self, x: &DMatrix<f64>) -> fspace_core::Result<FunctionPredictive> {
        let (g, blocks) = self.predict_blocks(x).map_err(core_err)?;
        marginals(g, &blocks)
    }

    fn predict_joint(&self, x: &DMatrix<f64>) -> fspace_core::Result<(DMatrix<f64>, DMatrix<f64>)> {
        fspace_core::ensure_joint_fits(x.nrows(), fspace_core::Posterior::output_dim(self))?;
        let run = || -> Result<(DMatrix<f64>, DMatrix<f64>)> {
            let g = self.net.forward(x)?;
            let k = self.net.ntk_block(x, Outputs::All, x, Outputs::All)? * self.state().prior_variance();
            let v = self.prepared.v(&self.net, x)?;
            let cov = k - v.transpose() * v;
            Ok((g, (&cov + cov.transpose()) * 0.5))
        };
        let (mean, cov) = run().map_err(core_err)?;
        fspace_core::checked_joint(mean, cov)
    }
}

/// Prop. 2's ELBO-optimal `A = σ⁻² K_Z⁻¹ K_{ZX} K_{XZ} K_Z⁻¹` for fixed inducing inputs
/// (Gaussian likelihood), as a state with `L = chol(A)`. With `Z = X` this is `σ⁻² I` and the
/// posterior is the exact linearised-Laplace GP. Errors when `K_Z` or `A` is singular (e.g.
/// duplicated inducing points, or more inducing points than data).
pub fn prop2_optimal_state<N: Network>(
    net: &N,
    x: &DMatrix<f64>,
    z: &DMatrix<f64>,
    prior_variance: f64,
    noise_variance: f64,
) -> Result<VariationalState> {
    ensure_positive("prior_variance (σ₀²)", prior_variance)?;
    ensure_positive("noise_variance (σ²)", noise_variance)?;
    if net.output_dim() != 1 {
        return Err(VallaError::Input(InputError::DimensionMismatch {
            what: "network outputs (Prop. 2 is stated for regression)",
            expected: 1,
            found: net.output_dim(),
        }));
    }
    let m = z.nrows();
    let outputs = vec![0; m];
    let sel = Outputs::One(&outputs);
    let kz = net.ntk_block(z, sel, z, sel)? * prior_variance;
    let kzx = net.ntk_block(z, sel, x, Outputs::All)? * prior_variance;
    let rz = cholesky_lower(&kz).ok_or(VallaError::NotPositiveDefinite { what: "K_Z (Prop. 2)" })?;
    // The squared smallest pivot relative to K_Z's largest diagonal entry bounds K_Z's
    // condition number from below; at 1e-12 or less, K_Z⁻¹K_ZX keeps fewer than four correct
    // digits, so a numerically singular K_Z is refused whatever the rounding's sign (a last
    // pivot of −1e-17 fails the factorisation, one of +1e-17 would pass it). 15 points of a 1-D
    // input give 9e-15; a well-spread 3-D set 3e-5.
    let scale = kz.diagonal().max();
    let smallest = rz.diagonal().min();
    if smallest * smallest <= 1e-12 * scale {
        return Err(VallaError::NotPositiveDefinite { what: "K_Z (Prop. 2): numerically singular" });
    }
    // K_Z⁻¹ K_ZX, then A = σ⁻² (K_Z⁻¹K_ZX)(K_Z⁻¹K_ZX)ᵀ.
    let s = solve_upper_of_lower(&rz, &solve_lower(&rz, &kzx));
    let a = &s * s.transpose() / noise_variance;
    let l = cholesky_lower(&((&a + a.transpose()) * 0.5))
        .ok_or(VallaError::NotPositiveDefinite { what: "Prop. 2's A" })?;
    Ok(VariationalState {
        z: z.clone(),
        outputs,
        log_prior_var: prior_variance.ln(),
        log_noise_var: noise_variance.ln(),
        l,
    })
}
