//! The entry point: a Laplace approximation around a network's MAP weights, in the
//! workspace's call shape.

use std::sync::Mutex;
use std::time::Instant;

use fspace_core::{Data, Fitted, Likelihood, LikelihoodSpec, Observer, ProcessShard, Progress, Silent};
use fspace_input::InputError;
use fspace_nn::Network;
use nalgebra::DVector;

use crate::config::{LaplaceConfig, PriorPrecision};
use crate::construct::build;
use crate::curvature::{Curvature, CurvatureApprox};
use crate::data::{data_for, AllReduce, ShardSum};
use crate::error::{ensure_positive, LaplaceError, Result};
use crate::posterior::{forward_and_features_chunked, forward_chunked, prior_groups, LaplacePosterior};
use crate::structure::{FitReport, Structure};

/// The model's checks of data that [`Data::new`] checked once at the boundary (non-empty,
/// finite, one target row per input): the input width, the targets per point and the outputs.
pub(crate) fn check_data<N: Network>(net: &N, lik: &dyn Likelihood, data: &Data) -> Result<()> {
    if data.x().ncols() != net.input_dim() {
        return Err(LaplaceError::Input(InputError::DimensionMismatch {
            what: "input columns",
            expected: net.input_dim(),
            found: data.x().ncols(),
        }));
    }
    if data.y().ncols() != lik.target_dim() {
        return Err(LaplaceError::Input(InputError::DimensionMismatch {
            what: "target columns (the likelihood's targets per point)",
            expected: lik.target_dim(),
            found: data.y().ncols(),
        }));
    }
    if lik.output_dim() != net.output_dim() {
        return Err(LaplaceError::Input(InputError::DimensionMismatch {
            what: "likelihood outputs vs network outputs",
            expected: net.output_dim(),
            found: lik.output_dim(),
        }));
    }
    Ok(())
}

/// The network's weights are finite (checked once per fit, not per batch).
pub(crate) fn check_weights<N: Network>(net: &N) -> Result<()> {
    if net.params().iter().any(|v| !v.is_finite()) {
        return Err(LaplaceError::Input(InputError::NonFinite { what: "network weights" }));
    }
    Ok(())
}

/// Fits the Laplace approximation around `net`'s current (MAP) weights on `data`'s training
/// set (targets `n × t`, `t` the likelihood's targets per point). The report is also kept in
/// the posterior. Refused with a typed error rather than ignored: a validation set in `data`
/// (pass it to [`LaplacePosterior::gridsearch_prior_precision`] or
/// [`LaplacePosterior::select_temperature`]) and a likelihood that learns σ (the
/// approximation takes σ as given: learn it in MAP training, `fspace_nn::fit_map`).
pub fn fit<N: Network>(
    net: N,
    likelihood: LikelihoodSpec,
    data: &Data,
    config: &LaplaceConfig,
) -> Result<Fitted<LaplacePosterior<N>, FitReport>> {
    fit_observed(net, likelihood, data, config, &mut Silent)
}

/// [`fit`], reporting its passes over the training data to `observer`: after every chunk of
/// `config.chunk_points` points, [`Progress`] with `step` = the points this pass has folded and
/// `total` = `n` (`loss` and `validation` are `None`). Each pass counts from 0 again: one pass
/// for the diagonal, full, block-diagonal, last-layer and KFAC structures, two for EKFAC, and
/// for low rank one to gather the cached statistics then one per Lanczos product (or one per
/// product on the uncached route); the sampled structure adds its EM's products. A network that
/// sums KFAC's factors itself ([`Network::kfac_factor_sums`]) is asked in ten groups of chunks,
/// and its factor pass reports after each group.
pub fn fit_observed<N: Network>(
    net: N,
    likelihood: LikelihoodSpec,
    data: &Data,
    config: &LaplaceConfig,
    observer: &mut (dyn Observer + Send),
) -> Result<Fitted<LaplacePosterior<N>, FitReport>> {
    let start = Instant::now();
    let local = prepare(&net, &likelihood, data, config)?;
    let n = data.x().nrows();
    build_observed(net, likelihood, config, local, n, None, observer, start)
}

/// [`fit_observed`] over data sharded across processes: every process calls it with its own
/// rows (`data`, at least one; process `rank`'s rows follow those of the processes before it in
/// the global order) and the same network, likelihood and settings, and ends with the same
/// posterior — the single-process one up to the order of the additions. The structures that
/// pass over the data more than once shard here, each sum over the data becoming one
/// `shard.reduce`:
///
/// | structure (weights) | all-reduces |
/// |---|---|
/// | `Kfac`, `Ekfac` (all, last layer) | the factor sums (`Σ((fan_in + 1)² + fan_out²)` values); EKFAC also the re-fitted eigenvalues (`Σ fan_out·(fan_in + 1)`) |
/// | `LowRank` (all) | one `p`-vector per Lanczos product (the products' count in the report), and the diagonal with `diag_remainder` |
/// | `Sampled` (all) | the preconditioner's sums (as `Kfac`, `LowRank` or the `p` diagonal), the draws' right-hand side `Rᵀε` (`p·K`), one `p·K` block per CG product (`cg_products` in the report), and `γ` per EM step |
///
/// plus, first, every process's point count and `log p(D | w*)` (`world + 1` numbers,
/// [`ProcessShard::exchange_layout`]). The
/// sampled structure's noise `ε` is drawn per global row, as one process over all rows draws it.
/// The one-pass structures (`Diag`, `Full`, `LastLayer`, subnetworks) shard as partial sums that
/// merge: [`LaplaceSums`](crate::LaplaceSums) and its [`to_flat`](crate::LaplaceSums::to_flat).
/// A process whose own work fails (its data, an interrupt) sends the failure flag in its next
/// reduce and returns its error; the others get the reduce's error, so none waits forever.
pub fn fit_sharded<N: Network>(
    net: N,
    likelihood: LikelihoodSpec,
    data: &Data,
    config: &LaplaceConfig,
    mut shard: ProcessShard<'_, LaplaceError>,
    observer: &mut (dyn Observer + Send),
) -> Result<Fitted<LaplacePosterior<N>, FitReport>> {
    let start = Instant::now();
    let rows = data.x().nrows();
    let local = sharded_structure(config).and_then(|()| prepare(&net, &likelihood, data, config));
    // The first all-reduce: every process's number of points and log p(D | w*).
    let log_likelihood = local.as_ref().map_or(0.0, |l| l.log_likelihood);
    let layout = shard.exchange_layout(
        local.as_ref().map(|_| ()).map_err(Clone::clone),
        &[rows],
        DVector::from_element(1, log_likelihood),
    );
    let mut local = local?;
    let layout = layout?;
    local.log_likelihood = layout.sums[0];
    let sum = ShardSum {
        n_total: layout.total(0),
        offset: layout.offset(0, shard.rank),
        reduce: Mutex::new(shard.reduce),
    };
    build_observed(net, likelihood, config, local, rows, Some(&sum), observer, start)
}

/// The structures [`fit_sharded`] takes.
fn sharded_structure(config: &LaplaceConfig) -> Result<()> {
    use crate::Weights;
    match (&config.structure, &config.weights) {
        (Structure::Sampled(c), Weights::All) if c.em_checkpoint.is_some() => {
            Err(LaplaceError::Unsupported {
                structure: "sampled",
                reason:
                    "a sharded fit cannot record its EM steps (em_checkpoint): every process would write \
                     the one file, and its data fingerprint is each process's own; leave it unset"
                        .into(),
            })
        }
        (s, w) if crate::structure::support(s, w)?.shards => Ok(()),
        (s, _) => Err(LaplaceError::Unsupported {
            structure: s.name(),
            reason: "fit_sharded takes kfac, ekfac (all weights or the last layer), low rank and sampled \
                     (all weights); diag, full and last_layer shard as LaplaceSums partial sums that merge"
                .into(),
        }),
    }
}

/// What a fit computes from its own rows before the curvature: the settings' and data's
/// checks, `log p(D | w*)` and the per-point output-space blocks.
struct Local<'a> {
    lambda0: f64,
    log_likelihood: f64,
    data: crate::data::Data<'a>,
}

fn prepare<'a, N: Network>(
    net: &N,
    likelihood: &LikelihoodSpec,
    data: &'a Data,
    config: &LaplaceConfig,
) -> Result<Local<'a>> {
    let (x, y) = (data.x(), &data.y_flat());
    if data.validation().is_some() {
        return Err(LaplaceError::Input(InputError::Invalid {
            what: "validation data",
            reason: "the Laplace fit does not use a validation set; pass it to \
                     gridsearch_prior_precision or select_temperature after the fit"
                .into(),
        }));
    }
    let lambda0 = check_settings(likelihood, config)?;
    let lik = likelihood.build()?;
    check_data(net, lik.as_ref(), data)?;
    check_memory(net, x.nrows(), config)?;
    check_weights(net)?;
    let (f, features) = first_pass(net, x, config)?;
    let log_likelihood = -lik.nll(&f, y)?;
    let mut data = data_for(x, &f, y, lik.as_ref(), config.chunk_points, config.curvature)?;
    data.features = features;
    let k = data.factors.first().map_or(1, |l| l.ncols());
    data.chunk = crate::ggn::statistics_chunk(&net.layer_infos(), k, data.chunk);
    Ok(Local { lambda0, log_likelihood, data })
}

/// The curvature of `local`'s data (summed over the processes with `shard`), then the
/// posterior; `rows` is this process's number of points, the progress' total.
#[allow(clippy::too_many_arguments)]
fn build_observed<N: Network>(
    net: N,
    likelihood: LikelihoodSpec,
    config: &LaplaceConfig,
    local: Local<'_>,
    rows: usize,
    shard: Option<&dyn AllReduce>,
    observer: &mut (dyn Observer + Send),
    start: Instant,
) -> Result<Fitted<LaplacePosterior<N>, FitReport>> {
    let Local { lambda0, log_likelihood, mut data } = local;
    let observer = Mutex::new(observer);
    let progress = |done: usize| {
        // A poisoned lock means an observer panicked earlier: stop reporting, keep fitting.
        if let Ok(mut observer) = observer.lock() {
            observer.observe(&Progress { step: done, total: rows, loss: None, validation: None });
        }
    };
    data.progress = Some(&progress);
    data.shard = shard;
    let mut report = FitReport::default();
    let (curvature, indices) = build(
        &net,
        &data,
        &config.structure,
        &config.weights,
        config.kron_bias,
        lambda0,
        config.temperature,
        &mut report,
    )?;
    let n_data = data.n_total();
    assemble(net, likelihood, config, curvature, indices, log_likelihood, n_data, report, start)
}

/// Whether the structure is built from the last layer's inputs alone (last-layer weights, or
/// the `last_layer` structure) on a network that reports its layers.
fn keeps_last_layer_features<N: Network>(net: &N, config: &LaplaceConfig) -> bool {
    let last_layer = matches!(config.weights, crate::Weights::LastLayer)
        || matches!(config.structure, Structure::LastLayer(_));
    last_layer && !net.layer_infos().is_empty()
}

/// The fit's first pass over `x`: the outputs `f(x)`, and the last layer's inputs from the same
/// passes when the structure is built from them (one pass of a torch model where two would
/// be made, [`Network::forward_with_last_layer_features`]).
pub(crate) fn first_pass<N: Network>(
    net: &N,
    x: &nalgebra::DMatrix<f64>,
    config: &LaplaceConfig,
) -> Result<(nalgebra::DMatrix<f64>, Option<nalgebra::DMatrix<f64>>)> {
    if keeps_last_layer_features(net, config) {
        let (f, phi) = forward_and_features_chunked(net, x, config.chunk_points)?;
        Ok((f, Some(phi)))
    } else {
        Ok((forward_chunked(net, x, config.chunk_points)?, None))
    }
}

/// The settings' checks every fit makes before touching the data; returns the starting λ of
/// the sampled structure's EM (1 for a per-layer prior).
pub(crate) fn check_settings(likelihood: &LikelihoodSpec, config: &LaplaceConfig) -> Result<f64> {
    if likelihood.learns_noise() {
        return Err(LaplaceError::Input(InputError::Invalid {
            what: "likelihood",
            reason: "the Laplace approximation takes σ as given (learn: false); learn it with the \
                     network in fspace_nn::fit_map, whose report holds the learned likelihood"
                .into(),
        }));
    }
    ensure_positive("temperature", config.temperature)?;
    if config.chunk_points == 0 {
        return Err(LaplaceError::Input(InputError::Invalid {
            what: "chunk_points",
            reason: "must be ≥ 1".into(),
        }));
    }
    // The sampled structure starts EM from one λ and draws at one (T, λ).
    let lambda0 = match (&config.structure, &config.prior_precision) {
        (Structure::Sampled(_), PriorPrecision::PerLayer(_) | PriorPrecision::PerParameter(_)) => {
            return Err(LaplaceError::Unsupported {
                structure: "sampled",
                reason: "EM sets one prior precision; pass PriorPrecision::Scalar (its start)".into(),
            })
        }
        (_, PriorPrecision::Scalar(l)) => {
            ensure_positive("prior precision λ", *l)?;
            *l
        }
        (_, PriorPrecision::PerLayer(_) | PriorPrecision::PerParameter(_)) => 1.0,
    };
    Ok(lambda0)
}

/// Refuses, before any allocation, a fit whose largest holdings do not fit the memory budget
/// (`fspace_input::budget`): the per-point output-space Hessians and their square roots of
/// `rows` points (`2·rows·d'²` values), and the structure's own matrices — the full curvature
/// and its eigenvectors (`2p²`), KFAC's factors and their eigenvectors (`2Σ((fan_in+1)² +
/// fan_out²)`), low rank's Krylov basis (`p × max_basis`, at least `p × (rank + 2)`).
pub(crate) fn check_memory<N: Network>(net: &N, rows: usize, config: &LaplaceConfig) -> Result<()> {
    use fspace_input::budget::{ensure, matrix_bytes};
    let q = net.output_dim();
    // The weights the structure covers: a subnetwork's, the last layer's, or every one.
    let infos = net.layer_infos();
    let p = match &config.weights {
        crate::Weights::Subnetwork(indices) => indices.len(),
        crate::Weights::LastLayer => infos.last().map_or(net.n_params(), |l| (l.fan_in + 1) * l.fan_out),
        crate::Weights::All => net.n_params(),
    };
    ensure(
        "the per-point output-space Hessians and their square roots (2·n·d'² values)",
        matrix_bytes(rows, q * q).saturating_mul(2),
        "fit from a loader in smaller batches, or use a model with fewer outputs",
    )?;
    if keeps_last_layer_features(net, config) {
        ensure(
            "the last layer's inputs at every point (n × fan_in values)",
            matrix_bytes(rows, infos.last().map_or(0, |l| l.fan_in)),
            "fit from a loader in smaller batches",
        )?;
    }
    match &config.structure {
        Structure::Full(_) => ensure(
            "the full curvature and its eigenvectors (2·p² values)",
            matrix_bytes(p, p).saturating_mul(2),
            "choose hessian_structure 'kron', 'diag' or 'lowrank'",
        )?,
        Structure::Kfac | Structure::Ekfac => {
            let layers = match config.weights {
                crate::Weights::LastLayer => &infos[infos.len().saturating_sub(1)..],
                _ => &infos[..],
            };
            let values: u128 = layers
                .iter()
                .map(|l| matrix_bytes(l.fan_in + 1, l.fan_in + 1) + matrix_bytes(l.fan_out, l.fan_out))
                .sum();
            ensure(
                "the KFAC factors and their eigenvectors (2·Σ((fan_in+1)² + fan_out²) values)",
                values.saturating_mul(2),
                "choose hessian_structure 'diag' or 'lowrank', or a narrower layer",
            )?
        }
        Structure::LowRank(c) => ensure(
            "the low-rank Krylov basis (p × max_basis values)",
            // Without max_basis the basis grows as the iteration needs: at least rank + 2.
            matrix_bytes(p, c.max_basis.unwrap_or(c.rank + 2)),
            "a smaller max_basis or rank",
        )?,
        _ => {}
    }
    Ok(())
}

/// The posterior from a built curvature: prior groups, λ, `T`, the predictive and the report.
#[allow(clippy::too_many_arguments)]
pub(crate) fn assemble<N: Network>(
    net: N,
    likelihood: LikelihoodSpec,
    config: &LaplaceConfig,
    curvature: Curvature,
    indices: Vec<usize>,
    log_likelihood: f64,
    n_data: usize,
    mut report: FitReport,
    start: Instant,
) -> Result<Fitted<LaplacePosterior<N>, FitReport>> {
    let infos = net.layer_infos();
    let n_groups = infos.len().max(1);
    let groups = prior_groups(&infos, net.n_params(), &indices);
    report.dim = curvature.dim();
    if report.rank == 0 {
        report.rank = curvature.dim();
    }
    report.seconds = start.elapsed().as_secs_f64();
    let mut post = LaplacePosterior {
        net,
        likelihood,
        curvature,
        indices,
        groups,
        n_groups,
        lambdas: vec![1.0; n_groups],
        coordinate_lambdas: None,
        temperature: config.temperature,
        log_likelihood,
        n_data,
        predictive: config.predictive.clone(),
        report,
    };
    post.set_prior_precision(config.prior_precision.clone())?;
    if let Curvature::Samples(s) = &post.curvature {
        post.lambdas = vec![s.prior_precision; post.n_groups];
    }
    post.set_predictive(config.predictive.clone())?;
    Ok(Fitted { report: post.report.clone(), posterior: post })
}
