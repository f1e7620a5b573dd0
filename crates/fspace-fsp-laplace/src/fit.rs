//! Both steps with the paper's defaults: train (Alg. 1) with uniform context points on the
//! widened data box, then Laplace (Alg. 2) at a fixed low-discrepancy or grid design.

use std::time::Instant;

use fspace_context::{
    BoundingBox, DatasetSampler, GridSampler, HaltonSampler, LatinHypercube, Sampler, SobolSampler,
    UniformSampler,
};
use fspace_core::{Data, Fitted, LikelihoodSpec, Observer, Progress, RowSource, Schedule, Silent, Span};
use fspace_nn::{Network, TrainConfig, TrainProgress, TrainReport};
use nalgebra::{DMatrix, DVector};
use rand::rngs::StdRng;
use rand::SeedableRng;
use serde::{Deserialize, Serialize};

use crate::error::{ensure_dim, invalid, Result};
use crate::laplace::{laplace, FspLaplace, FspLaplaceConfig, LaplaceReport};
use crate::train::{train, TrainOptions};
use fspace_kernels::GpPrior;

/// How the fixed context points of Alg. 2 are placed in their box.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ContextDesign {
    /// A regular grid (`n = m^d`, corners included) — the paper's toys.
    Grid,
    /// The Halton sequence (the paper's MNIST runs: 25 000 points).
    Halton,
    /// The Sobol sequence.
    Sobol,
    /// Latin hypercube (the paper's Bayesian-optimisation runs), seeded.
    LatinHypercube,
    /// I.i.d. uniform, seeded (as in the training steps).
    Uniform,
    /// Training inputs drawn without replacement, seeded: for inputs where a box is
    /// meaningless (token ids, categorical codes), so the prior acts at real inputs. Only
    /// Alg. 2's context takes it (it needs the data; [`context_points`] refuses it).
    Dataset,
}

/// `n` context points of `design` in `bbox` (`seed` for the random designs).
pub fn context_points(
    design: ContextDesign,
    bbox: &BoundingBox,
    n: usize,
    seed: u64,
) -> Result<DMatrix<f64>> {
    let mut rng = StdRng::seed_from_u64(seed);
    let b = bbox.clone();
    Ok(match design {
        ContextDesign::Grid => GridSampler::new(b).sample(n, &mut rng)?,
        ContextDesign::Halton => HaltonSampler::new(b).sample(n, &mut rng)?,
        ContextDesign::Sobol => SobolSampler::new(b)?.sample(n, &mut rng)?,
        ContextDesign::LatinHypercube => LatinHypercube::new(b).sample(n, &mut rng)?,
        ContextDesign::Uniform => UniformSampler::new(b).sample(n, &mut rng)?,
        ContextDesign::Dataset => {
            return Err(invalid(
                "design",
                "the Dataset design draws from the training inputs; a box alone has none (FspConfig's Laplace step takes it)",
            ))
        }
    })
}

/// FSP-Laplace end to end, one flat set of options. `Default` is the paper's toy setup
/// (App. B.1): Adam at 1e-3 for 5 000 epochs of batches of 100, 100 context points per training
/// step drawn uniformly from the data box widened by half its range on each side, and 100 grid
/// points there for the Laplace step, at most 500 Lanczos iterations.
///
/// | name | default | meaning |
/// |---|---|---|
/// | `schedule` | 5 000 epochs, validated after each, no early stopping, best restored | Alg. 1's length, validation interval, patience (in validations) and best-state restore ([`Schedule`]) |
/// | `batch_size`, `learning_rate` | 100, 1e-3 | Alg. 1's Adam loop |
/// | `weight_decay` | 0 | extra `½·wd·‖w‖²` (the paper: none; the prior is the regulariser) |
/// | `validation_includes_prior` | false | stop on the validation log posterior (NLL + RKHS term at fresh context points) |
/// | `seed` | 0 | minibatches and context draws |
/// | `n_context` | 100 | context points per training step |
/// | `context_jitter` | 1e-3 | relative jitter on `Σ(C, C)` in Alg. 1 |
/// | `laplace` | [`FspLaplaceConfig::default`] | Alg. 2's options (those of [`laplace`](crate::laplace) itself) |
/// | `design`, `n_laplace_context` | grid, 100 | Alg. 2's context points |
/// | `context_box`, `widen` | data box, 0.5 | where context points are drawn |
/// | `design_seed` | 0 | random Laplace designs |
/// | `context_includes_data` | false | append the training inputs to Alg. 2's context |
///
/// Whether Alg. 1 learns σ is the likelihood's `learn` flag.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FspConfig {
    /// Alg. 1: length, validation interval, early stopping and best-state restore.
    pub schedule: Schedule,
    /// Alg. 1: minibatch size.
    pub batch_size: usize,
    /// Alg. 1: Adam learning rate.
    pub learning_rate: f64,
    /// Alg. 1: weight decay added to the objective.
    pub weight_decay: f64,
    /// Alg. 1: early stopping on the validation log posterior (validation NLL plus the RKHS
    /// term at fresh context points, as the authors' code) instead of the validation NLL.
    pub validation_includes_prior: bool,
    /// Alg. 1: seed of the minibatches and context draws.
    pub seed: u64,
    /// Alg. 1: `n_C`, context points per step.
    pub n_context: usize,
    /// Alg. 1: first relative jitter added to `Σ(C, C)`.
    pub context_jitter: f64,
    /// Alg. 2 options.
    pub laplace: FspLaplaceConfig,
    /// Design of the fixed Laplace context points.
    pub design: ContextDesign,
    /// Number of Laplace context points (a perfect `d`-th power for `Grid`).
    pub n_laplace_context: usize,
    /// The context box; `None`: the data box widened by `widen × range` on each side.
    ///
    /// The prior acts only where the context points are: Alg. 2's truncation bounds the
    /// predictive variance by the prior's at them, and inside the box the variance reverts to
    /// the prior's away from the data. Outside the box nothing bounds the linearised network's
    /// variance (1-D sine toy, data in [−1, 1], the default box [−2, 2], Matérn-1/2 prior of
    /// variance 1: var f(3) ≈ 450). Cover every input you will predict at.
    pub context_box: Option<BoundingBox>,
    /// Widening of the data box (paper: 0.5).
    pub widen: f64,
    /// Seed of random Laplace designs.
    pub design_seed: u64,
    /// Append the training inputs to the Laplace context points (the "dataset" context of the
    /// paper's §3.2 discussion). Off in the paper's toys; it enforces the prior where the data
    /// are, which a coarse design can miss (two moons: on-data std of p(class 1) 0.17 → 0.085,
    /// the exact GP classifier's 0.088).
    pub context_includes_data: bool,
}

impl Default for FspConfig {
    fn default() -> Self {
        let train = TrainOptions::default();
        Self {
            schedule: train.train.schedule,
            batch_size: train.train.batch_size,
            learning_rate: train.train.learning_rate,
            weight_decay: train.train.weight_decay,
            validation_includes_prior: train.train.validation_adds_regularizer,
            seed: train.train.seed,
            n_context: train.n_context,
            context_jitter: train.context_jitter,
            laplace: FspLaplaceConfig::default(),
            design: ContextDesign::Grid,
            n_laplace_context: 100,
            context_box: None,
            widen: 0.5,
            design_seed: 0,
            context_includes_data: false,
        }
    }
}

impl FspConfig {
    /// Takes Alg. 1's schedule, batch size, learning rate, weight decay and seed from a
    /// MAP-training configuration (`learn_likelihood` is the likelihood's `learn` flag here).
    pub fn with_training(self, train: &TrainConfig) -> Self {
        Self {
            schedule: train.schedule,
            batch_size: train.batch_size,
            learning_rate: train.learning_rate,
            weight_decay: train.weight_decay,
            validation_includes_prior: train.validation_adds_regularizer,
            seed: train.seed,
            ..self
        }
    }

    /// Alg. 1's options, as [`train`](crate::train) takes them.
    pub fn train_options(&self, learn_likelihood: bool) -> TrainOptions {
        TrainOptions {
            train: TrainConfig {
                schedule: self.schedule,
                batch_size: self.batch_size,
                learning_rate: self.learning_rate,
                weight_decay: self.weight_decay,
                validation_adds_regularizer: self.validation_includes_prior,
                seed: self.seed,
                learn_likelihood,
            },
            n_context: self.n_context,
            context_jitter: self.context_jitter,
        }
    }

    /// The box of Alg. 1's context points: `context_box`, or the training inputs' box widened
    /// by `widen` (checked finite and ≥ 0).
    fn context_box_for(&self, x: &DMatrix<f64>) -> Result<BoundingBox> {
        if !(self.widen.is_finite() && self.widen >= 0.0) {
            return Err(invalid("widen", format!("{} must be finite and ≥ 0", self.widen)));
        }
        Ok(match &self.context_box {
            Some(b) => b.clone(),
            None => BoundingBox::from_data(x, self.widen)?,
        })
    }

    /// Alg. 2's fixed context points: `n_laplace_context` points of `design` in `bbox`, followed
    /// by the training inputs when `context_includes_data`.
    fn laplace_context(&self, bbox: &BoundingBox, x: &DMatrix<f64>) -> Result<DMatrix<f64>> {
        let design = if self.design == ContextDesign::Dataset {
            let mut rng = StdRng::seed_from_u64(self.design_seed);
            DatasetSampler::new(x.clone())?.sample(self.n_laplace_context, &mut rng)?
        } else {
            context_points(self.design, bbox, self.n_laplace_context, self.design_seed)?
        };
        if self.context_includes_data {
            with_data_points(&design, x)
        } else {
            Ok(design)
        }
    }
}

/// Checks the memory the fit will hold for sizes the caller chooses against the budget
/// (`fspace_input::budget`) before any work, so a request that cannot fit is a typed error at
/// once (Python's `MemoryError`) instead of an allocation failure minutes in:
///
/// * Alg. 1 (`train`): the prior covariance at the `n_context` context points and its
///   Cholesky factor, `2·(n_context·d')²` values;
/// * Alg. 2: the Lanczos factor of the prior covariance at the `M = n_laplace_context` (+ `n`
///   with `context_includes_data`) points, rank `k = min(max_rank, M·d')`, and its image in
///   weight space with its SVD — `2·k·(M·d' + p)` values.
fn check_memory(p: usize, q: usize, n: usize, config: &FspConfig, train: bool) -> Result<()> {
    use fspace_input::budget::{ensure, matrix_bytes};
    if train {
        let m = config.n_context.saturating_mul(q);
        ensure(
            "Alg. 1's prior covariance at the context points and its Cholesky factor (2·(n_context·d')² values)",
            matrix_bytes(m, m).saturating_mul(2),
            "fewer context points (n_context)",
        )?;
    }
    let points = config.n_laplace_context.saturating_add(if config.context_includes_data { n } else { 0 });
    let rows = points.saturating_mul(q);
    let k = config.laplace.max_rank.min(rows);
    ensure(
        "Alg. 2's Lanczos factor of the prior at the context points and its image in weight space \
         (2·k·(n_laplace_context·d' + p) values, k = min(max_rank, n_laplace_context·d'))",
        matrix_bytes(k, rows.saturating_add(p)).saturating_mul(2),
        "fewer Laplace context points (n_laplace_context) or a smaller laplace max_rank",
    )?;
    Ok(())
}

/// The "dataset" context of the paper's §3.2: the rows of `design` followed by the training
/// inputs `x`, so the prior term also acts where the data are. Errors if the column counts
/// differ.
pub fn with_data_points(design: &DMatrix<f64>, x: &DMatrix<f64>) -> Result<DMatrix<f64>> {
    ensure_dim("data inputs vs. context-point columns", design.ncols(), x.ncols())?;
    let mut c = DMatrix::zeros(design.nrows() + x.nrows(), design.ncols());
    c.rows_mut(0, design.nrows()).copy_from(design);
    c.rows_mut(design.nrows(), x.nrows()).copy_from(x);
    Ok(c)
}

/// What [`fit`] did, with timings.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct FitSummary {
    /// Alg. 1's report.
    pub train: TrainReport,
    /// Wall time of Alg. 1 (s).
    pub train_seconds: f64,
    /// Wall time of Alg. 2 (s).
    pub laplace_seconds: f64,
    /// The context box used.
    pub context_box: BoundingBox,
    /// The likelihood after training (σ the learned one where the spec learns it).
    pub likelihood: LikelihoodSpec,
}

/// Trains `net` under `prior` (Alg. 1) and returns its FSP-Laplace posterior (Alg. 2).
///
/// `likelihood` decides whether Alg. 1 learns `σ` (its `learn` flag); the summary records the
/// likelihood Alg. 2 used.
///
/// Targets are `n × t` (`t` the likelihood's targets per point); a validation set in `data`
/// enables Alg. 1's early stopping (`config.patience`).
pub fn fit<N: Network + Clone>(
    net: N,
    likelihood: LikelihoodSpec,
    prior: &GpPrior,
    data: &Data,
    config: &FspConfig,
) -> Result<Fitted<FspLaplace<N>, FitSummary>> {
    fit_observed(net, likelihood, prior, data, config, &mut Silent)
}

/// [`fit`], reporting every epoch of Alg. 1 to `observer` (`loss`: the mean training
/// objective per step; `validation`: the validation NLL per point).
pub fn fit_observed<N: Network + Clone>(
    net: N,
    likelihood: LikelihoodSpec,
    prior: &GpPrior,
    data: &Data,
    config: &FspConfig,
    observer: &mut dyn Observer,
) -> Result<Fitted<FspLaplace<N>, FitSummary>> {
    let (x, y) = (data.x(), &data.y_flat());
    let val_flat = data.validation_flat();
    let validation = val_flat.as_ref().map(|(xv, yv)| (*xv, yv));
    let progress = epoch_progress(observer, x.nrows(), config);
    let (posterior, report) = fit_inner(net, likelihood, prior, x, y, validation, config, progress)?;
    Ok(Fitted { posterior, report })
}

/// Post-hoc FSP-Laplace: Alg. 2 alone at the weights of a network trained elsewhere (by
/// [`fspace_nn::fit_map`], say, or loaded from PyTorch), in the workspace's call shape. The
/// context points are `config`'s (`design`, `n_laplace_context`, `design_seed`, in
/// `context_box` or the data's box widened by `widen`, plus the training inputs when
/// `context_includes_data`); Alg. 1's settings are not used, and a validation set is refused
/// (Alg. 2 has no use for one). A likelihood that learns σ is refused: σ is Alg. 2's input,
/// pass the learned value (`fit_map`'s report carries it).
pub fn fit_posthoc<N: Network + Clone>(
    net: N,
    likelihood: LikelihoodSpec,
    prior: &GpPrior,
    data: &Data,
    config: &FspConfig,
) -> Result<Fitted<FspLaplace<N>, LaplaceReport>> {
    if data.validation().is_some() {
        return Err(invalid(
            "validation data",
            "post-hoc FSP-Laplace (Alg. 2) does not use a validation set; leave it out",
        ));
    }
    if likelihood.learns_noise() {
        return Err(invalid(
            "likelihood",
            "post-hoc FSP-Laplace takes σ as given (learn: false); Alg. 1 learns it in fsp_laplace::fit",
        ));
    }
    let (x, y) = (data.x(), &data.y_flat());
    check_memory(net.params().len(), net.output_dim(), x.nrows(), config, false)?;
    let context = config.laplace_context(&config.context_box_for(x)?, x)?;
    let lik = likelihood.build()?;
    let posterior =
        laplace(&net, lik.as_ref(), prior, x, y, &context, &config.laplace)?.with_likelihood(likelihood)?;
    let report = posterior.report().clone();
    Ok(Fitted { posterior, report })
}

/// [`fit_posthoc`] with the data split across processes (each passes its own points in
/// `data`): Alg. 2's one sum over the data goes through `reduce` ([`crate::laplace_sharded`]),
/// and every process ends with the posterior of all the points. What the processes must share
/// is checked here: the context box must be given (`context_box`: the data's box differs
/// between shards), and the context may not come from the data (`context_includes_data`,
/// `design = Dataset`, `truncate_at_data`).
pub fn fit_posthoc_sharded<N: Network + Clone>(
    net: N,
    likelihood: LikelihoodSpec,
    prior: &GpPrior,
    data: &Data,
    config: &FspConfig,
    reduce: &mut crate::ReduceStep<'_>,
) -> Result<Fitted<FspLaplace<N>, LaplaceReport>> {
    if data.validation().is_some() {
        return Err(invalid(
            "validation data",
            "post-hoc FSP-Laplace (Alg. 2) does not use a validation set; leave it out",
        ));
    }
    if likelihood.learns_noise() {
        return Err(invalid("likelihood", "post-hoc FSP-Laplace takes σ as given (learn: false)"));
    }
    let bbox = shared_context_box(config, "a sharded fit", "the data's box differs between the processes")?;
    let (x, y) = (data.x(), &data.y_flat());
    check_memory(net.params().len(), net.output_dim(), x.nrows(), config, false)?;
    let context = config.laplace_context(&bbox, x)?;
    let lik = likelihood.build()?;
    let posterior =
        crate::laplace_sharded(&net, lik.as_ref(), prior, x, y, &context, &config.laplace, reduce)?
            .with_likelihood(likelihood)?;
    let report = posterior.report().clone();
    Ok(Fitted { posterior, report })
}

/// What a fit that never holds all the data — a sharded one, or one over batches — needs of
/// the context points: the box, given (`why`: the data's box is not at hand), and no context
/// taken from the data (`context_includes_data`, `design = Dataset`, `truncate_at_data`).
fn shared_context_box(config: &FspConfig, who: &str, why: &str) -> Result<BoundingBox> {
    let Some(bbox) = config.context_box.clone() else {
        return Err(invalid(
            "context_box",
            format!("{who} needs the context box given: {why} (take the box of all the points)"),
        ));
    };
    if config.context_includes_data
        || config.design == ContextDesign::Dataset
        || config.laplace.truncate_at_data
    {
        return Err(invalid(
            "context points",
            format!(
                "{who} draws them in the context box alone: context_includes_data, design = Dataset and \
                 truncate_at_data take them from the data, which it does not hold whole"
            ),
        ));
    }
    Ok(bbox)
}

/// Post-hoc FSP-Laplace over data that arrive in batches (a loader, or a data set larger than
/// memory): steps 1–3 of Alg. 2 at `config`'s context points in its `context_box` (which must be
/// given: the data's box is not at hand — take it in a first pass), as [`fit_posthoc`] places
/// them. Add each batch with [`LaplaceBasis::add`](crate::LaplaceBasis::add) (sums over other
/// batches or processes merge with [`DataSum::merge`](crate::DataSum::merge)) and end with
/// [`LaplaceBasis::finish`](crate::LaplaceBasis::finish): the posterior of [`fit_posthoc`] over
/// all the batches, up to the order of the additions. The context may not come from the data
/// (`context_includes_data`, `design = Dataset`, `truncate_at_data` are refused).
pub fn posthoc_basis<N: Network + Clone>(
    net: &N,
    prior: &GpPrior,
    config: &FspConfig,
) -> Result<crate::LaplaceBasis<N>> {
    let bbox = shared_context_box(config, "a fit over batches", "the data's box is not at hand")?;
    check_memory(net.params().len(), net.output_dim(), 0, config, false)?;
    let context = config.laplace_context(&bbox, &DMatrix::zeros(0, net.input_dim()))?;
    crate::LaplaceBasis::new(net, prior, &context, &config.laplace)
}

/// [`fit_observed`] (Alg. 1, then Alg. 2) over data sharded across processes: every process
/// passes its own training rows (and its own validation rows, or none) with the same network,
/// prior and settings; the global rows are the processes' rows in rank order. Alg. 1 runs
/// [`crate::train_sharded`] — the minibatches and the context points drawn from the shared
/// seed, each step's data term all-reduced, the prior term added once, early stopping on the
/// validation NLL of every process's rows — so every process trains the same weights; Alg. 2
/// then sums its one data term over the processes (a status round first, so that a process
/// failing before its sum releases the others). What the processes must share is checked
/// first: the context box given (`context_box`: the box of every process's points), no
/// context taken from the data (`context_includes_data`, `design = Dataset`) and no
/// `truncate_at_data`.
pub fn fit_sharded<N: Network + Clone>(
    mut net: N,
    likelihood: LikelihoodSpec,
    prior: &GpPrior,
    data: &Data,
    config: &FspConfig,
    shard: fspace_core::ProcessShard<'_, crate::FspError>,
    observer: &mut dyn Observer,
) -> Result<Fitted<FspLaplace<N>, FitSummary>> {
    let fspace_core::ProcessShard { rank, world, reduce } = shard;
    let (x, y) = (data.x(), &data.y_flat());
    let val_flat = data.validation_flat();
    let validation = val_flat.as_ref().map(|(xv, yv)| (*xv, yv));
    let checked = (|| -> Result<(BoundingBox, Box<dyn fspace_core::Likelihood>)> {
        let bbox =
            shared_context_box(config, "a sharded fit", "the data's box differs between the processes")?;
        check_memory(net.params().len(), net.output_dim(), x.nrows(), config, true)?;
        if matches!(config.schedule.length, Span::Steps(0) | Span::Epochs(0)) {
            return Err(invalid(
                "schedule length",
                "must be ≥ 1: fit trains the network under the prior (Alg. 1)",
            ));
        }
        Ok((bbox, likelihood.build()?))
    })();
    let (bbox, mut lik) = match checked {
        Ok(ok) => ok,
        Err(e) => {
            // The others wait in the training's first all-reduce (the row counts, 2·world values).
            let _ = reduce(DVector::zeros(2 * world), true);
            return Err(e);
        }
    };
    let progress = epoch_progress(observer, x.nrows(), config);
    let train_options = config.train_options(likelihood.learns_noise());
    let t0 = Instant::now();
    let report = {
        let mut nn_reduce = |part: DVector<f64>, failed: bool| {
            reduce(part, failed).map_err(|e| fspace_nn::NnError::Callback(e.to_string()))
        };
        let shard = fspace_core::ProcessShard { rank, world, reduce: &mut nn_reduce };
        crate::train::train_sharded(
            &mut net,
            lik.as_mut(),
            prior,
            x,
            y,
            validation,
            &UniformSampler::new(bbox.clone()),
            &train_options,
            progress,
            Some(shard),
        )?
    };
    let fitted = trained_likelihood(likelihood, lik.as_ref());
    let train_seconds = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    let context = config.laplace_context(&bbox, x)?;
    let mut called = false;
    let post = {
        // Alg. 2's one sum: a status round (every process reached it) that also brings rank 0's
        // basis fingerprint to every process (the others send zeros: the sum is its bits), then
        // the k × k part — refused on every process, through the failure flag, where a process's
        // basis differs (weights that drifted apart would give parts in different bases).
        let mut step = |part: DMatrix<f64>, fingerprint: &[f64]| -> Result<DMatrix<f64>> {
            called = true;
            let mut status = DVector::zeros(1 + fingerprint.len());
            if rank == 0 {
                status.rows_mut(1, fingerprint.len()).copy_from_slice(fingerprint);
            }
            let first = reduce(status, false)?;
            let (r, c) = part.shape();
            if first.rows(1, fingerprint.len()).iter().ne(fingerprint.iter()) {
                let _ = reduce(DVector::zeros(r * c), true);
                return Err(invalid(
                    "Alg. 2's basis",
                    "differs from process 0's: the processes' trained weights are not the same bits",
                ));
            }
            let summed = reduce(DVector::from_column_slice(part.as_slice()), false)?;
            Ok(DMatrix::from_column_slice(r, c, summed.as_slice()))
        };
        crate::laplace_sharded(&net, lik.as_ref(), prior, x, y, &context, &config.laplace, &mut step)
    };
    let post = match post {
        Ok(post) => post.with_likelihood(fitted)?,
        Err(e) => {
            if !called {
                // The status round's width: the flag and the 3-number fingerprint.
                let _ = reduce(DVector::zeros(4), true);
            }
            return Err(e);
        }
    };
    let summary = FitSummary {
        train: report,
        train_seconds,
        laplace_seconds: t1.elapsed().as_secs_f64(),
        context_box: bbox,
        likelihood: fitted,
    };
    Ok(Fitted { posterior: post, report: summary })
}

/// [`fit_observed`] (Alg. 1, then Alg. 2) over rows read by position ([`RowSource`]: a loader
/// over a map-style data set, or a data set larger than memory) with one minibatch in memory:
/// Alg. 1 reads each step's minibatch ([`crate::train_rows`]: the in-memory run's positions, so
/// the same rows give the same weights), and Alg. 2 adds the rows `data_batch` at a time, in
/// order, to its `k × k` sum ([`crate::LaplaceBasis`]: the in-memory fit's chunks, the same
/// sum). The context box must be given (`context_box`: the data's box is not at hand — take it
/// in a first pass) and the context may not come from the data (`context_includes_data`,
/// `design = Dataset`, `truncate_at_data`). With a validation set the early stopping reads it
/// in chunks of `batch_size` rows (its sum, and so a tie between two evaluations, may differ
/// from the one-pass in-memory sum in the last bits).
pub fn fit_rows<N: Network + Clone>(
    mut net: N,
    likelihood: LikelihoodSpec,
    prior: &GpPrior,
    rows: &mut dyn RowSource,
    validation: Option<&mut dyn RowSource>,
    config: &FspConfig,
    observer: &mut dyn Observer,
) -> Result<Fitted<FspLaplace<N>, FitSummary>> {
    let bbox =
        shared_context_box(config, "a fit over rows read by position", "the data's box is not at hand")?;
    let n = rows.len();
    if n == 0 {
        return Err(fspace_input::InputError::Empty { what: "training rows" }.into());
    }
    check_memory(net.params().len(), net.output_dim(), n, config, true)?;
    check_trains(config)?;
    let mut lik = likelihood.build()?;
    let train_options = config.train_options(likelihood.learns_noise());
    let progress = epoch_progress(observer, n, config);
    let t0 = Instant::now();
    let sampler = UniformSampler::new(bbox.clone());
    let report = crate::train::train_rows(
        &mut net,
        lik.as_mut(),
        prior,
        rows,
        validation,
        &sampler,
        &train_options,
        progress,
    )?;
    let fitted = trained_likelihood(likelihood, lik.as_ref());
    let train_seconds = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    let context = config.laplace_context(&bbox, &DMatrix::zeros(0, net.input_dim()))?;
    let basis = crate::LaplaceBasis::new(&net, prior, &context, &config.laplace)?;
    let mut sum = basis.zero_sum();
    let positions: Vec<usize> = (0..n).collect();
    for chunk in positions.chunks(config.laplace.data_batch.max(1)) {
        let (x, y) = rows.rows(chunk)?;
        fspace_input::ensure_finite("training inputs", x.iter())?;
        basis.add(&mut sum, lik.as_ref(), &x, &y)?;
    }
    let post = basis.finish(prior, &sum, None)?.with_likelihood(fitted)?;
    let summary = FitSummary {
        train: report,
        train_seconds,
        laplace_seconds: t1.elapsed().as_secs_f64(),
        context_box: bbox,
        likelihood: fitted,
    };
    Ok(Fitted { posterior: post, report: summary })
}

/// Alg. 1's epochs as the observer's [`Progress`] (`total`: the schedule's epochs over `n` rows).
fn epoch_progress<'o>(
    observer: &'o mut dyn Observer,
    n: usize,
    config: &FspConfig,
) -> impl FnMut(&TrainProgress) + 'o {
    let steps_per_epoch = n.max(1).div_ceil(config.batch_size.clamp(1, n.max(1)));
    let total = config.schedule.length.in_epochs(steps_per_epoch);
    move |p: &TrainProgress| {
        observer.observe(&Progress {
            step: p.epoch,
            total,
            loss: Some(p.train_loss),
            validation: p.validation_loss,
        })
    }
}

/// The likelihood after Alg. 1: σ at its trained value where the spec has one.
fn trained_likelihood(likelihood: LikelihoodSpec, lik: &dyn fspace_core::Likelihood) -> LikelihoodSpec {
    match likelihood.noise_std() {
        Some(_) => likelihood.with_noise_std(lik.params()[0].exp()),
        None => likelihood,
    }
}

/// Alg. 1 must run: a schedule of at least one step.
fn check_trains(config: &FspConfig) -> Result<()> {
    if matches!(config.schedule.length, Span::Steps(0) | Span::Epochs(0)) {
        return Err(invalid(
            "schedule length",
            "must be ≥ 1: fit trains the network under the prior (Alg. 1) first; for a network \
             trained elsewhere call fsp_laplace::fit_posthoc (Alg. 2 alone)",
        ));
    }
    Ok(())
}

fn fit_inner<N: Network + Clone>(
    mut net: N,
    likelihood: LikelihoodSpec,
    prior: &GpPrior,
    x: &DMatrix<f64>,
    y: &DVector<f64>,
    validation: Option<(&DMatrix<f64>, &DVector<f64>)>,
    config: &FspConfig,
    progress: impl FnMut(&TrainProgress),
) -> Result<(FspLaplace<N>, FitSummary)> {
    let bbox = config.context_box_for(x)?;
    check_memory(net.params().len(), net.output_dim(), x.nrows(), config, true)?;
    check_trains(config)?;
    let mut lik = likelihood.build()?;
    let train_options = config.train_options(likelihood.learns_noise());
    let t0 = Instant::now();
    let report = train(
        &mut net,
        lik.as_mut(),
        prior,
        x,
        y,
        validation,
        &UniformSampler::new(bbox.clone()),
        &train_options,
        progress,
    )?;
    let fitted = trained_likelihood(likelihood, lik.as_ref());
    let train_seconds = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    let context = config.laplace_context(&bbox, x)?;
    let post =
        laplace(&net, lik.as_ref(), prior, x, y, &context, &config.laplace)?.with_likelihood(fitted)?;
    let summary = FitSummary {
        train: report,
        train_seconds,
        laplace_seconds: t1.elapsed().as_secs_f64(),
        context_box: bbox,
        likelihood: fitted,
    };
    Ok((post, summary))
}
