//! ELLA (Deng, Zhou & Zhu 2022, "Accelerated linearized Laplace approximation"), VaLLA's main
//! scalable baseline: Nyström features of the NTK and the Laplace posterior in that space.
//!
//! From `M` random training points `X_M` (each with one output: the only output for
//! regression, a uniformly drawn class otherwise — the `M·C × M·C` multi-output kernel of
//! MNIST, 20 000², does not fit), the unit NTK `κ̂(X_M, X_M) = U Λ Uᵀ` gives `K` orthonormal
//! parameter directions `v_k = J(X_M)ᵀ u_k / √λ_k` (the top eigenvectors), and the features
//! `φ_k(x) = J(x) v_k` (one JVP each) satisfy `φ(x)ᵀφ(x') = κ̂(x, X_M) κ̂_M⁺ κ̂(X_M, x')` on the
//! kept spectrum. The linearised model `f(x) = g(x) + Φ(x) β`, `β ~ N(0, σ₀² I)`, has the
//! Laplace posterior precision `P = Σᵢ Φᵢᵀ Hᵢ Φᵢ + λ I` (`λ = 1/σ₀²`, `Hᵢ` the likelihood
//! Hessian at the MAP) and predictive covariance `Φ(x) P⁻¹ Φ(x)ᵀ`. With `G = Q D Qᵀ` stored,
//! any `λ` costs `O(K)`: the prior precision is chosen on a validation set (or given).
//!
//! With `M = n` and every eigenvector the features span the data exactly, so ELLA equals the
//! exact linearised-Laplace GP at the training inputs; at a test point it misses exactly the
//! Nyström residual `σ₀² (κ̂(x, x) − κ̂(x, X) κ̂_X⁻¹ κ̂(X, x))` (tested).

use fspace_input::InputError;
use std::time::Instant;

use fspace_core::likelihood::softmax;
use fspace_core::{
    Data, Fitted, FunctionPredictive, LikelihoodSpec, Persist, PersistError, Posterior, Schedule,
    ScheduleRun, StopDecision,
};
use fspace_linalg::{sym_eigh, sym_eigh_owned};
use fspace_nn::{Network, Outputs};
use nalgebra::{DMatrix, DVector};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::data::{
    check_data, check_evaluation_data, check_likelihood, marginals, mean_nll_from_blocks, to_core,
};
use crate::error::{ensure_positive, Result, VallaError};
use crate::objective::VallaLikelihood;

/// How ELLA's prior precision `λ = 1/σ₀²` is set.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum EllaPrior {
    /// A given `λ > 0`.
    Fixed(f64),
    /// The `λ` of a log-spaced grid with the lowest validation NLL (Deng et al. tune it on
    /// validation data).
    Validation {
        /// Smallest λ of the grid.
        min: f64,
        /// Largest λ.
        max: f64,
        /// Grid points (≥ 2).
        points: usize,
    },
}

/// How ELLA evaluates its features `φ(x) = J(x) V` (same numbers, different cost).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FeatureRoute {
    /// The cheaper of the two by the operation counts below.
    Auto,
    /// `K` JVPs along stored directions (`O(K·p)` per point; any network).
    Jvp,
    /// The NTK block against the Nyström points (`O(d'·M·Σ widths)` per point).
    Kernel,
}

/// Options of [`fit`]; `Default` is §5.3's MNIST setting.
///
/// | name | default | purpose |
/// |---|---|---|
/// | `num_points` | 2 000 | `M`, random training points of the Nyström approximation |
/// | `num_eigen` | 20 | `K`, eigenvectors kept (Deng et al.'s default) |
/// | `prior` | validation grid `10⁻⁴ … 10⁴`, 41 points | prior precision |
/// | `seed` | 0 | choice of the points and their outputs, and the visiting order of the search |
/// | `route` | `Auto` | feature evaluation ([`FeatureRoute`]) |
/// | `early_stopping` | every 1 000 points, patience 5 | Deng et al.'s validation search over how much of the training set enters `G` ([`EllaEarlyStopping`]); `None`: all of it |
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EllaConfig {
    /// Nyström points `M`.
    pub num_points: usize,
    /// Eigenvectors `K` (≤ `M`).
    pub num_eigen: usize,
    /// Prior precision choice.
    pub prior: EllaPrior,
    /// Seed.
    pub seed: u64,
    /// Feature evaluation.
    pub route: FeatureRoute,
    /// ELLA's own early stopping (needs validation data); `None` accumulates `G` over the whole
    /// training set.
    #[serde(default)]
    pub early_stopping: Option<EllaEarlyStopping>,
}

impl Default for EllaConfig {
    fn default() -> Self {
        Self {
            num_points: 2000,
            num_eigen: 20,
            prior: EllaPrior::Validation { min: 1e-4, max: 1e4, points: 41 },
            seed: 0,
            route: FeatureRoute::Auto,
            early_stopping: Some(EllaEarlyStopping::default()),
        }
    }
}

/// ELLA's early stopping (Deng et al. 2022, §4: the posterior over-fits as more of the training
/// set enters `G = Σ ΦᵢᵀHᵢΦᵢ`; their code's `--search-freq` / `--early-stop`): the training
/// points are visited in a seeded random order, and every `check_every` points (and at the end)
/// the posterior from the points so far is scored by its validation NLL (at the best grid `λ`
/// for [`EllaPrior::Validation`], at the given `λ` otherwise). The best prefix is kept; the
/// pass ends at the `patience`-th check in a row without improvement. This is the workspace's
/// [`Schedule`] over one pass with one training point per step (`Schedule::steps(n)
/// .every_steps(check_every).patience(patience)`, best restored); ELLA has no optimiser steps,
/// so its length is always the one pass and only these two numbers are settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct EllaEarlyStopping {
    /// Training points between checks (≥ 1).
    pub check_every: usize,
    /// Checks without improvement before the pass ends (≥ 1).
    pub patience: usize,
}

impl Default for EllaEarlyStopping {
    /// Every 1 000 points, patience 5. Deng et al. do not state their search frequency; this
    /// gives MNIST's 54 000 training images 54 checks.
    fn default() -> Self {
        Self { check_every: 1000, patience: 5 }
    }
}

/// How the features `φ(x) = J(x) V` are evaluated: the same numbers by two routes.
#[derive(Debug, Clone, Serialize, Deserialize)]
enum FeatureMap {
    /// `K` JVPs along stored parameter directions `V = J(X_M)ᵀ U Λ^{-1/2}` (`p × K`): cost
    /// `O(K·p)` per point; any network.
    Directions(DMatrix<f64>),
    /// `κ̂(x, X_M) U Λ^{-1/2}` through the network's NTK block: cost `O(d'·M·Σ widths)` per
    /// point, cheaper when `M` is small against `K·p / Σ widths` (the toy: `M = K = 20`).
    Kernel {
        /// The Nyström points.
        points: DMatrix<f64>,
        /// Their outputs.
        outputs: Vec<usize>,
        /// `U Λ^{-1/2}` (`M × K`).
        coefficients: DMatrix<f64>,
    },
}

impl FeatureMap {
    /// `Φ(X)` (`n·d' × K`, rows point-major).
    fn eval<N: Network>(&self, net: &N, x: &DMatrix<f64>) -> Result<DMatrix<f64>> {
        match self {
            Self::Directions(v) => features(net, x, v),
            Self::Kernel { points, outputs, coefficients } => {
                Ok(net.ntk_block(x, Outputs::All, points, Outputs::One(outputs))? * coefficients)
            }
        }
    }
}

impl FeatureMap {
    /// The map from the unit NTK's eigenpairs `(λ, U)` at `(points, outputs)`, keeping the top
    /// `k` (each `λ_j > 0`), by `route`.
    fn build<N: Network>(
        net: &N,
        points: DMatrix<f64>,
        outputs: Vec<usize>,
        lam: &DVector<f64>,
        u: &DMatrix<f64>,
        k: usize,
        route: FeatureRoute,
    ) -> Result<Self> {
        let (m, q) = (points.nrows(), net.output_dim());
        // Per point: the kernel route costs ~d'·M·Σ widths, K JVPs ~2·K·p (`Σ widths` from
        // the layer structure; networks without it take the JVP route).
        let widths: usize = net.layer_infos().iter().map(|l| l.fan_in + l.fan_out).sum();
        let kernel_route = match route {
            FeatureRoute::Auto => widths > 0 && q * m * widths <= 2 * k * net.n_params(),
            FeatureRoute::Jvp => false,
            FeatureRoute::Kernel => true,
        };
        let coefficients = DMatrix::from_fn(m, k, |r, j| u[(r, j)] / lam[j].sqrt());
        if kernel_route {
            return Ok(Self::Kernel { points, outputs, coefficients });
        }
        Ok(Self::Directions(directions(net, &points, &outputs, &coefficients)?))
    }

    /// Checks a loaded map against `net` and its `k` features: the directions `p × k`, or `M ≥ 1`
    /// Nyström points with the network's inputs, one output index below `d'` each and `M × k`
    /// coefficients; every number finite. `field` names the map in the errors.
    fn check_loaded<N: Network>(
        &self,
        check: &fspace_core::LoadCheck,
        field: &str,
        net: &N,
        k: usize,
    ) -> std::result::Result<(), PersistError> {
        match self {
            FeatureMap::Directions(v) => {
                let f = format!("{field}.Directions");
                check.shape(&f, v.shape(), (net.n_params(), k))?;
                check.finite(&f, v.iter())
            }
            FeatureMap::Kernel { points, outputs, coefficients } => {
                let m = points.nrows();
                let f = |name: &str| format!("{field}.Kernel.{name}");
                check.ensure(m >= 1, &f("points"), || "must hold ≥ 1 point".into())?;
                check.shape(&f("points"), points.shape(), (m, net.input_dim()))?;
                check.finite(&f("points"), points.iter())?;
                check.len(&f("outputs"), outputs.len(), m)?;
                let q = net.output_dim();
                check.ensure(outputs.iter().all(|&o| o < q), &f("outputs"), || {
                    format!("each must be an output index below {q}")
                })?;
                check.shape(&f("coefficients"), coefficients.shape(), (m, k))?;
                check.finite(&f("coefficients"), coefficients.iter())
            }
        }
    }

    fn num_features(&self) -> usize {
        match self {
            Self::Directions(v) => v.ncols(),
            Self::Kernel { coefficients, .. } => coefficients.ncols(),
        }
    }
}

/// `V = J(X_M)ᵀ C` (`p × K`) for the one-output rows `(points, outputs)` and coefficients `C`
/// (`M × K`): one VJP per column.
fn directions<N: Network>(
    net: &N,
    points: &DMatrix<f64>,
    outputs: &[usize],
    coefficients: &DMatrix<f64>,
) -> Result<DMatrix<f64>> {
    let (m, q) = (points.nrows(), net.output_dim());
    let mut v = DMatrix::zeros(net.n_params(), coefficients.ncols());
    for j in 0..coefficients.ncols() {
        let cot = DMatrix::from_fn(m, q, |r, o| if o == outputs[r] { coefficients[(r, j)] } else { 0.0 });
        v.set_column(j, &net.vjp(points, &cot)?);
    }
    Ok(v)
}

/// The eigenpairs (descending) of the unit NTK `κ̂(X_M, X_M) = J Jᵀ` at one output per point.
fn nystrom_spectrum<N: Network>(
    net: &N,
    points: &DMatrix<f64>,
    outputs: &[usize],
) -> Result<(DVector<f64>, DMatrix<f64>)> {
    let sel = Outputs::One(outputs);
    let km = net.ntk_block(points, sel, points, sel)?;
    // Symmetric to rounding (both sides are the same points); symmetrised in place.
    Ok(sym_eigh_owned(km)?)
}

/// ELLA's Nyström feature map on its own, for a caller that keeps the posterior itself
/// (fspace's laplace-torch surface holds `G`, `λ`, `σ` and `T` as tensors and streams `G` over
/// a loader): built from given points with one given output each, it evaluates
/// `φ(x) = J(x) V`, `V = J(X_M)ᵀ U_K Λ_K^{-1/2}`.
///
/// The rank rule is laplace-torch 0.3's: each of the `K` kept eigenvalues must exceed
/// `ε · max(M, p) · max|λ|`, or the build fails naming how many do ([`VallaError::RankDeficient`])
/// — a feature on a numerically null direction would be noise scaled by `λ^{-1/2}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NystromFeatures {
    map: FeatureMap,
    /// All `M` eigenvalues of the unit NTK at the points (descending).
    kernel_eigenvalues: DVector<f64>,
}

impl NystromFeatures {
    /// Builds the map at `points` (`M × d`, each with the output index `outputs[r] < d'`),
    /// keeping `num_eigen` features. Errors: shapes, non-finite points, `num_eigen` not in
    /// `1..=M`, an output index out of range, a rank-deficient kernel.
    pub fn build<N: Network>(
        net: &N,
        points: DMatrix<f64>,
        outputs: Vec<usize>,
        num_eigen: usize,
        route: FeatureRoute,
    ) -> Result<Self> {
        let (m, q) = (points.nrows(), net.output_dim());
        fspace_input::ensure_non_empty("Nyström points", m)?;
        fspace_input::ensure_dim("Nyström points' columns", net.input_dim(), points.ncols())?;
        fspace_input::ensure_finite("Nyström points", points.iter())?;
        if outputs.len() != m {
            return Err(VallaError::Input(InputError::Invalid {
                what: "Nyström outputs",
                reason: format!("{} output indices for {m} points", outputs.len()),
            }));
        }
        if let Some(bad) = outputs.iter().find(|&&o| o >= q) {
            return Err(VallaError::Input(InputError::Invalid {
                what: "Nyström outputs",
                reason: format!("output index {bad} but the network has {q} outputs"),
            }));
        }
        if num_eigen == 0 || num_eigen > m {
            return Err(VallaError::Input(InputError::Invalid {
                what: "n_eigenvalues",
                reason: format!("{num_eigen} must be in 1..={m} (the Nyström points)"),
            }));
        }
        let (lam, u) = nystrom_spectrum(net, &points, &outputs)?;
        let largest = lam.iter().fold(0.0_f64, |a, v| a.max(v.abs()));
        let tolerance = f64::EPSILON * m.max(net.n_params()) as f64 * largest;
        if lam[num_eigen - 1] <= tolerance {
            return Err(VallaError::RankDeficient {
                requested: num_eigen,
                usable: lam.iter().filter(|&&v| v > tolerance).count(),
                sampled: m,
            });
        }
        let map = FeatureMap::build(net, points, outputs, &lam, &u, num_eigen, route)?;
        Ok(Self { map, kernel_eigenvalues: lam })
    }

    /// `Φ(X)` (`n·d' × K`, rows point-major: point `i`'s output `o` is row `i·d' + o`).
    pub fn eval<N: Network>(&self, net: &N, x: &DMatrix<f64>) -> Result<DMatrix<f64>> {
        self.map.eval(net, x)
    }

    /// `K`, the features.
    pub fn num_features(&self) -> usize {
        self.map.num_features()
    }

    /// The `M` eigenvalues of the unit NTK at the Nyström points (descending).
    pub fn kernel_eigenvalues(&self) -> &DVector<f64> {
        &self.kernel_eigenvalues
    }

    /// The parameter directions `V` (`p × K`; computed by `K` VJPs on the kernel route).
    pub fn directions<N: Network>(&self, net: &N) -> Result<DMatrix<f64>> {
        match &self.map {
            FeatureMap::Directions(v) => Ok(v.clone()),
            FeatureMap::Kernel { points, outputs, coefficients } => {
                directions(net, points, outputs, coefficients)
            }
        }
    }

    /// Checks a loaded map against `net` (shapes, finite values, output indices).
    pub fn check<N: Network>(&self, net: &N) -> Result<()> {
        let check = fspace_core::LoadCheck::new("fspace_valla::NystromFeatures");
        let k = self.num_features();
        check
            .ensure(k >= 1, "map", || "must hold ≥ 1 feature".into())
            .and_then(|()| check.finite("kernel_eigenvalues", self.kernel_eigenvalues.iter()))
            .and_then(|()| self.map.check_loaded(&check, "map", net, k))
            .map_err(|e| {
                VallaError::Input(InputError::Invalid { what: "Nyström feature map", reason: e.to_string() })
            })
    }
}

/// A fitted ELLA posterior.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EllaPosterior<N> {
    net: N,
    likelihood: VallaLikelihood,
    /// The features `φ(x) = J(x) V`.
    feature_map: FeatureMap,
    /// Eigenvalues `D` of `G = Σ ΦᵢᵀHᵢΦᵢ` (descending).
    ggn_eigenvalues: DVector<f64>,
    /// Their eigenvectors `Q` (`K × K`).
    ggn_eigenvectors: DMatrix<f64>,
    prior_precision: f64,
    /// Validation NLL per grid λ (empty for a fixed λ).
    grid: Vec<(f64, f64)>,
    seconds: f64,
}

/// Features `Φ(X)` (`n·d' × K`, rows point-major) by the network's `J(X)·V` over all `K`
/// directions at once (one forward trace shared by the columns, columns in parallel).
fn features<N: Network>(net: &N, x: &DMatrix<f64>, directions: &DMatrix<f64>) -> Result<DMatrix<f64>> {
    Ok(net.jvp_columns(x, directions)?)
}

/// Per-point likelihood Hessians `Hᵢ` at the MAP outputs.
fn hessian(likelihood: VallaLikelihood, g: &[f64]) -> DMatrix<f64> {
    match likelihood {
        VallaLikelihood::Gaussian { noise_std } => DMatrix::from_element(1, 1, 1.0 / (noise_std * noise_std)),
        VallaLikelihood::Categorical => {
            let p = DVector::from_vec(softmax(g));
            DMatrix::from_diagonal(&p) - &p * p.transpose()
        }
    }
}

/// Fits ELLA to a trained network. `validation` is required for [`EllaPrior::Validation`].
/// Errors: bad data or labels, `M > n`, `K = 0` or `K > M`, a non-positive fixed λ, an empty
/// validation set.
///
/// Targets are `n × 1`; the validation set of `data` is used by [`EllaPrior::Validation`].
pub fn fit<N: Network + Clone>(
    net: N,
    likelihood: LikelihoodSpec,
    data: &Data,
    config: &EllaConfig,
) -> Result<Fitted<EllaPosterior<N>, EllaReport>> {
    let (x, y) = (data.x(), &data.y_flat());
    let val_flat = data.validation_flat();
    let validation = val_flat.as_ref().map(|(xv, yv)| (*xv, yv));
    let (post, points_used, search) = fit_ella_inner(net, likelihood, x, y, validation, config)?;
    let report = EllaReport {
        prior_precision: post.prior_precision,
        num_features: post.num_features(),
        grid: post.grid.clone(),
        points_used,
        search,
        seconds: post.seconds,
    };
    Ok(Fitted { posterior: post, report })
}

/// What an ELLA fit did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EllaReport {
    /// The prior precision `λ` chosen (or given).
    pub prior_precision: f64,
    /// Features `K` kept.
    pub num_features: usize,
    /// Validation NLL per grid `λ` (empty for a fixed λ).
    pub grid: Vec<(f64, f64)>,
    /// Training points that entered `G` (all of them without early stopping).
    pub points_used: usize,
    /// The early-stopping search: `(points visited, validation NLL)` per check (empty without).
    pub search: Vec<(usize, f64)>,
    /// Wall-clock seconds of the fit.
    pub seconds: f64,
}

fn fit_ella_inner<N: Network + Clone>(
    net: N,
    likelihood: LikelihoodSpec,
    x: &DMatrix<f64>,
    y: &DVector<f64>,
    validation: Option<(&DMatrix<f64>, &DVector<f64>)>,
    config: &EllaConfig,
) -> Result<(EllaPosterior<N>, usize, EllaSearch)> {
    let start = Instant::now();
    let likelihood = ella_likelihood(&net, likelihood)?;
    check_data(&net, likelihood, x, y, "training data")?;
    let (n, q) = (x.nrows(), net.output_dim());
    let m = config.num_points;
    check_sizes(config, n)?;
    if let Some(es) = config.early_stopping {
        if es.check_every == 0 || es.patience == 0 {
            return Err(VallaError::Input(InputError::Invalid {
                what: "ELLA early stopping",
                reason: format!("check_every {} and patience {} must be ≥ 1", es.check_every, es.patience),
            }));
        }
        match validation {
            None => return Err(VallaError::Input(InputError::Empty {
                what:
                    "validation data (ELLA's early stopping scores on it; set early_stopping: None without)",
            })),
            Some((xv, yv)) => check_data(&net, likelihood, xv, yv, "validation data")?,
        }
    }
    ensure_prior(&config.prior)?;
    match &config.prior {
        EllaPrior::Fixed(_) => {}
        EllaPrior::Validation { .. } => match validation {
            None => {
                return Err(VallaError::Input(InputError::Empty {
                    what: "validation data (ELLA's prior precision is chosen on it)",
                }))
            }
            Some((xv, yv)) => check_data(&net, likelihood, xv, yv, "validation data")?,
        },
    }
    let mut rng = StdRng::seed_from_u64(config.seed);
    let NystromChoice { indices, outputs } = draw_nystrom(&mut rng, n, m, q);
    let mut post =
        EllaPosterior::at_nystrom_points(net, likelihood, x.select_rows(&indices), outputs, config)?;
    let scored = match (&config.prior, config.early_stopping) {
        (EllaPrior::Fixed(_), None) => None,
        _ => Some(post.scored(validation.expect("checked above"))?),
    };
    // Without early stopping the rows are visited in the data order (the sum is the same);
    // with it, in a seeded random order so that a prefix is a random subset.
    let order: Option<Vec<usize>> = config.early_stopping.map(|_| {
        let mut o: Vec<usize> = (0..n).collect();
        o.shuffle(&mut rng);
        o
    });
    let check_every = config.early_stopping.map_or(n, |es| es.check_every);
    let k = post.num_features();
    let mut ggn = DMatrix::zeros(k, k);
    let mut search = Vec::new();
    let mut best: Option<(usize, EllaState)> = None;
    // The workspace's schedule over the pass, one training point per step: checks every
    // `check_every` points and at the end, stops at the `patience`-th without improvement.
    let mut stopper = match config.early_stopping {
        Some(es) => Some(ScheduleRun::new(
            &Schedule::steps(n).every_steps(es.check_every).patience(es.patience),
            1,
            true,
        )?),
        None => None,
    };
    let mut s = 0;
    while s < n {
        fspace_input::interrupt::check("ELLA's pass over the data")?;
        let len = CHUNK.min(n - s).min(check_every - s % check_every);
        let xs = match &order {
            None => x.rows(s, len).into_owned(),
            Some(o) => x.select_rows(&o[s..s + len]),
        };
        post.add_curvature(&mut ggn, &xs)?;
        s += len;
        if let Some(stopper) = stopper.as_mut() {
            if stopper.evaluates_after(s) {
                post.set_curvature(&ggn)?;
                let nll = post.choose_prior(&config.prior, scored.as_ref())?;
                search.push((s, nll));
                match stopper.record(s, nll) {
                    StopDecision::Improved => best = Some((s, post.state())),
                    StopDecision::Continue => {}
                    StopDecision::Stop => break,
                }
            }
        }
    }
    let points_used = match best {
        Some((used, state)) => {
            post.restore(state);
            used
        }
        None => {
            post.set_curvature(&ggn)?;
            post.choose_prior(&config.prior, scored.as_ref())?;
            n
        }
    };
    post.seconds = start.elapsed().as_secs_f64();
    Ok((post, points_used, search))
}

/// The early-stopping search: `(points visited, validation NLL)` per check.
type EllaSearch = Vec<(usize, f64)>;

/// Rows whose features are evaluated in one call (the in-memory pass and each streamed batch).
pub const CHUNK: usize = 512;

/// The validation set's MAP outputs `g(X_val)`, its features `Φ(X_val)` and its targets.
type Scored<'v> = (DMatrix<f64>, DMatrix<f64>, &'v DVector<f64>);

/// Which training points (by position, ascending) and which output of each span ELLA's
/// Nyström approximation: `M` positions drawn without replacement from `0..n`, then an output
/// per point drawn uniformly (the only output for regression). [`fit`] draws them from
/// `config.seed`; [`nystrom_choice`] gives the same draw to a caller that streams the data. The
/// positions are drawn first, so they do not depend on the number of outputs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NystromChoice {
    /// Positions of the Nyström points among the `n` training points (ascending).
    pub indices: Vec<usize>,
    /// The output of each (`< d'`).
    pub outputs: Vec<usize>,
}

fn draw_nystrom(rng: &mut StdRng, n: usize, m: usize, q: usize) -> NystromChoice {
    let mut indices = rand::seq::index::sample(rng, n, m).into_vec();
    indices.sort_unstable();
    let outputs = (0..m).map(|_| if q == 1 { 0 } else { rng.gen_range(0..q) }).collect();
    NystromChoice { indices, outputs }
}

/// The Nyström points [`fit`] would draw for `n` training points and a network of `outputs`
/// outputs under `config` (its `seed` and `num_points`). Errors: `fit`'s size checks
/// (`num_points` of 0 or above `n`, `num_eigen` of 0 or above `num_points`), `outputs` of 0.
pub fn nystrom_choice(n: usize, outputs: usize, config: &EllaConfig) -> Result<NystromChoice> {
    check_sizes(config, n)?;
    if outputs == 0 {
        return Err(VallaError::Input(InputError::Invalid {
            what: "ELLA outputs",
            reason: "the network has no output: need ≥ 1".into(),
        }));
    }
    Ok(draw_nystrom(&mut StdRng::seed_from_u64(config.seed), n, config.num_points, outputs))
}

/// ELLA's likelihood: σ fixed (ELLA is post hoc: σ comes with the trained network and is never
/// re-fitted), a Gaussian or a categorical over the network's outputs.
fn ella_likelihood<N: Network>(net: &N, likelihood: LikelihoodSpec) -> Result<VallaLikelihood> {
    if likelihood.learns_noise() {
        return Err(VallaError::Input(InputError::Invalid {
            what: "likelihood",
            reason: "ELLA does not learn σ (learn: true); pass the trained network's σ with \
                     LikelihoodSpec::gaussian(σ)"
                .into(),
        }));
    }
    VallaLikelihood::from_spec(&likelihood, net.output_dim())
}

/// `1 ≤ num_eigen ≤ num_points ≤ n`.
fn check_sizes(config: &EllaConfig, n: usize) -> Result<()> {
    let m = config.num_points;
    if m == 0 || config.num_eigen == 0 {
        return Err(VallaError::Input(InputError::Invalid {
            what: "ELLA num_points / num_eigen",
            reason: "must be ≥ 1".into(),
        }));
    }
    if m > n {
        return Err(VallaError::TooManyPoints { what: "ELLA Nyström points", requested: m, available: n });
    }
    if config.num_eigen > m {
        return Err(VallaError::TooManyPoints {
            what: "ELLA eigenvectors (K ≤ M)",
            requested: config.num_eigen,
            available: m,
        });
    }
    Ok(())
}

/// ELLA over a stream of `n` training points in batches, `G = Σᵢ Φᵢᵀ Hᵢ Φᵢ` summed as they
/// come: made from the Nyström points' rows (at the positions of [`nystrom_choice`] among the
/// `n`, gathered by the caller in a first pass), then [`add`](Self::add) per batch, then
/// [`finish`](Self::finish) — [`fit`] without early stopping over the concatenated batches, up
/// to the order of the additions. The
/// stream's early stopping would score prefixes of a seeded random order of the training set,
/// which batches in the caller's order do not give: `config.early_stopping` must be `None`.
pub struct EllaBatches<N> {
    post: EllaPosterior<N>,
    ggn: DMatrix<f64>,
    points: usize,
    prior: EllaPrior,
    start: Instant,
}

impl<N: Network + Clone> EllaBatches<N> {
    /// From the network, its likelihood (σ fixed), the number `n` of training points the
    /// stream will hold, the Nyström rows `xm` (`M × d`, `M = config.num_points`: the rows at
    /// `nystrom_choice(n, ·, config).indices`, in that order) and `config`; each row's output is
    /// [`nystrom_choice`]'s. Errors: ELLA's setting checks (as [`fit`]'s), early stopping set,
    /// `M > n`, rows that do not match `num_points` or the network's inputs, non-finite rows, a
    /// null NTK at the points.
    pub fn new(
        net: N,
        likelihood: LikelihoodSpec,
        n: usize,
        xm: DMatrix<f64>,
        config: &EllaConfig,
    ) -> Result<Self> {
        let start = Instant::now();
        if config.early_stopping.is_some() {
            return Err(VallaError::Input(InputError::Invalid {
                what: "ELLA early stopping",
                reason: "it scores prefixes of a seeded random order of the training set, which a stream of \
                         batches does not give: set early_stopping to None, or fit in memory"
                    .into(),
            }));
        }
        let likelihood = ella_likelihood(&net, likelihood)?;
        check_likelihood(&net, likelihood)?;
        let outputs = nystrom_choice(n, net.output_dim(), config)?.outputs;
        fspace_input::ensure_dim("Nyström rows", config.num_points, xm.nrows())?;
        fspace_input::ensure_dim("Nyström rows' columns", net.input_dim(), xm.ncols())?;
        fspace_input::ensure_finite("Nyström rows", xm.iter())?;
        ensure_prior(&config.prior)?;
        let post = EllaPosterior::at_nystrom_points(net, likelihood, xm, outputs, config)?;
        let k = post.num_features();
        Ok(Self { post, ggn: DMatrix::zeros(k, k), points: 0, prior: config.prior.clone(), start })
    }

    /// Adds the batch `data` to `G`; a refused batch leaves the sum as it was. Errors: the
    /// data's shape against the network, labels that are not classes.
    pub fn add(&mut self, data: &Data) -> Result<()> {
        let (x, y) = (data.x(), data.y_flat());
        check_data(&self.post.net, self.post.likelihood, x, &y, "training batch")?;
        let mut ggn = self.ggn.clone();
        for s in (0..x.nrows()).step_by(CHUNK) {
            fspace_input::interrupt::check("ELLA's pass over the data")?;
            self.post.add_curvature(&mut ggn, &x.rows(s, CHUNK.min(x.nrows() - s)).into_owned())?;
        }
        self.ggn = ggn;
        self.points += x.nrows();
        Ok(())
    }

    /// The training points added so far.
    pub fn points(&self) -> usize {
        self.points
    }

    /// The posterior from the batches added: `G`'s eigenpairs and `λ` as `config.prior` sets it
    /// (the validation grid scores on `validation`, which it needs). Errors: no batch added, a
    /// grid without validation data, validation data of the wrong shape.
    pub fn finish(
        self,
        validation: Option<(&DMatrix<f64>, &DVector<f64>)>,
    ) -> Result<Fitted<EllaPosterior<N>, EllaReport>> {
        let Self { mut post, ggn, points, prior, start } = self;
        if points == 0 {
            return Err(VallaError::Input(InputError::Empty { what: "training batches (none was added)" }));
        }
        let scored = match (&prior, validation) {
            (EllaPrior::Validation { .. }, None) => {
                return Err(VallaError::Input(InputError::Empty {
                    what: "validation data (ELLA's prior precision is chosen on it)",
                }))
            }
            (_, Some((xv, yv))) => {
                check_data(&post.net, post.likelihood, xv, yv, "validation data")?;
                Some(post.scored((xv, yv))?)
            }
            (EllaPrior::Fixed(_), None) => None,
        };
        post.set_curvature(&ggn)?;
        post.choose_prior(&prior, scored.as_ref())?;
        post.seconds = start.elapsed().as_secs_f64();
        let report = EllaReport {
            prior_precision: post.prior_precision,
            num_features: post.num_features(),
            grid: post.grid.clone(),
            points_used: points,
            search: Vec::new(),
            seconds: post.seconds,
        };
        Ok(Fitted { posterior: post, report })
    }
}

/// A fixed `λ > 0`, or a grid `0 < min < max` of at least two points.
fn ensure_prior(prior: &EllaPrior) -> Result<()> {
    match prior {
        EllaPrior::Fixed(l) => ensure_positive("ELLA prior precision", *l),
        EllaPrior::Validation { min, max, points } => {
            ensure_positive("ELLA grid min", *min)?;
            ensure_positive("ELLA grid max", *max)?;
            if *points < 2 || min >= max {
                return Err(VallaError::Input(InputError::Invalid {
                    what: "ELLA grid",
                    reason: "need min < max and ≥ 2 points".into(),
                }));
            }
            Ok(())
        }
    }
}

/// What a check of the early-stopping search keeps: `G`'s eigenpairs, `λ` and its grid.
type EllaState = (DVector<f64>, DMatrix<f64>, f64, Vec<(f64, f64)>);

impl<N: Network + Clone> EllaPosterior<N> {
    /// The posterior before any data: the unit NTK's spectrum at the Nyström points `xm` (one
    /// output each), its top `num_eigen` eigenpairs above `1e-10` of the largest, the feature
    /// map by `config.route`; `G = 0`, `λ = 1` until the data and the prior's choice set them.
    fn at_nystrom_points(
        net: N,
        likelihood: VallaLikelihood,
        xm: DMatrix<f64>,
        outputs: Vec<usize>,
        config: &EllaConfig,
    ) -> Result<Self> {
        let (lam, u) = nystrom_spectrum(&net, &xm, &outputs)?;
        let top = lam[0].max(0.0);
        let k = (0..config.num_eigen).take_while(|&j| lam[j] > 1e-10 * top).count();
        if k == 0 {
            return Err(VallaError::NotPositiveDefinite {
                what: "ELLA's NTK at the Nyström points (all eigenvalues ≈ 0)",
            });
        }
        let feature_map = FeatureMap::build(&net, xm, outputs, &lam, &u, k, config.route)?;
        Ok(Self {
            net,
            likelihood,
            feature_map,
            ggn_eigenvalues: DVector::zeros(k),
            ggn_eigenvectors: DMatrix::identity(k, k),
            prior_precision: 1.0,
            grid: Vec::new(),
            seconds: 0.0,
        })
    }

    /// The validation set's MAP outputs and features (rotated into `G`'s eigenbasis per
    /// check), with its targets.
    fn scored<'v>(&self, (xv, yv): (&DMatrix<f64>, &'v DVector<f64>)) -> Result<Scored<'v>> {
        Ok((self.net.forward(xv)?, self.feature_map.eval(&self.net, xv)?, yv))
    }

    /// `G += Σᵢ Φᵢᵀ Hᵢ Φᵢ` over the rows of `xs` (`Hᵢ` the likelihood's Hessian at the MAP
    /// output: `G` does not depend on the targets).
    fn add_curvature(&self, ggn: &mut DMatrix<f64>, xs: &DMatrix<f64>) -> Result<()> {
        let q = self.net.output_dim();
        let g = self.net.forward(xs)?;
        let phi = self.feature_map.eval(&self.net, xs)?;
        for i in 0..xs.nrows() {
            let h = hessian(self.likelihood, g.row(i).transpose().as_slice());
            let pi = phi.rows(i * q, q);
            *ggn += pi.transpose() * h * pi;
        }
        Ok(())
    }

    /// Stores the eigenpairs of the accumulated `G` (negative rounding clipped to 0).
    fn set_curvature(&mut self, ggn: &DMatrix<f64>) -> Result<()> {
        let (d, qv) = sym_eigh(&((ggn + ggn.transpose()) * 0.5))?;
        self.ggn_eigenvalues = d.map(|v| v.max(0.0));
        self.ggn_eigenvectors = qv;
        Ok(())
    }

    /// Sets `λ` by `prior` and returns the validation NLL at it (NaN for a fixed `λ` without
    /// validation data). `scored`: the validation MAP outputs, features and targets.
    fn choose_prior(&mut self, prior: &EllaPrior, scored: Option<&Scored<'_>>) -> Result<f64> {
        self.grid.clear();
        let rot = scored.map(|(_, phi, _)| phi * &self.ggn_eigenvectors); // n·q × K
        let nll_at = |post: &Self, rot: &DMatrix<f64>| {
            let (g, _, yv) = scored.expect("validation data");
            post.nll_from_rotated(g, rot, yv)
        };
        match (prior, rot) {
            (&EllaPrior::Fixed(l), rot) => {
                self.prior_precision = l;
                rot.map_or(Ok(f64::NAN), |rot| nll_at(self, &rot))
            }
            (&EllaPrior::Validation { min, max, points }, Some(rot)) => {
                let mut best = (f64::INFINITY, 1.0);
                for t in 0..points {
                    let lam = (min.ln() + (max.ln() - min.ln()) * t as f64 / (points - 1) as f64).exp();
                    self.prior_precision = lam;
                    let nll = nll_at(self, &rot)?;
                    self.grid.push((lam, nll));
                    if nll < best.0 {
                        best = (nll, lam);
                    }
                }
                self.prior_precision = best.1;
                Ok(best.0)
            }
            (EllaPrior::Validation { .. }, None) => unreachable!("validation data checked above"),
        }
    }

    fn state(&self) -> EllaState {
        (self.ggn_eigenvalues.clone(), self.ggn_eigenvectors.clone(), self.prior_precision, self.grid.clone())
    }

    fn restore(&mut self, (d, qv, lam, grid): EllaState) {
        (self.ggn_eigenvalues, self.ggn_eigenvectors, self.prior_precision, self.grid) = (d, qv, lam, grid);
    }

    /// The prior precision `λ = 1/σ₀²` in use.
    pub fn prior_precision(&self) -> f64 {
        self.prior_precision
    }
    /// Number of features `K` kept.
    pub fn num_features(&self) -> usize {
        self.ggn_eigenvalues.len()
    }
    /// Validation NLL per grid `λ` (empty for a fixed λ).
    pub fn grid(&self) -> &[(f64, f64)] {
        &self.grid
    }
    /// Wall-clock seconds of the fit.
    pub fn seconds(&self) -> f64 {
        self.seconds
    }
    /// Replaces the prior precision (`λ > 0`).
    pub fn set_prior_precision(&mut self, lambda: f64) -> Result<()> {
        ensure_positive("ELLA prior precision", lambda)?;
        self.prior_precision = lambda;
        Ok(())
    }

    /// Per-point covariances from features rotated into `G`'s eigenbasis.
    fn blocks_from_rotated(&self, rot: &DMatrix<f64>) -> Vec<DMatrix<f64>> {
        let q = self.net.output_dim();
        let scale = self.ggn_eigenvalues.map(|d| 1.0 / (d + self.prior_precision).sqrt());
        let mut scaled = rot.clone();
        for (j, s) in scale.iter().enumerate() {
            scaled.column_mut(j).scale_mut(*s);
        }
        (0..rot.nrows() / q)
            .map(|i| {
                let r = scaled.rows(i * q, q);
                r * r.transpose()
            })
            .collect()
    }

    fn nll_from_rotated(&self, g: &DMatrix<f64>, rot: &DMatrix<f64>, y: &DVector<f64>) -> Result<f64> {
        let noise = match self.likelihood {
            VallaLikelihood::Gaussian { noise_std } => noise_std * noise_std,
            VallaLikelihood::Categorical => 1.0,
        };
        mean_nll_from_blocks(self.likelihood, noise, g, &self.blocks_from_rotated(rot), y)
    }

    /// Predictive mean `g(X)` and per-point `d' × d'` covariances.
    pub fn predict_blocks(&self, x: &DMatrix<f64>) -> Result<(DMatrix<f64>, Vec<DMatrix<f64>>)> {
        let g = self.net.forward(x)?;
        let rot = self.feature_map.eval(&self.net, x)? * &self.ggn_eigenvectors;
        Ok((g, self.blocks_from_rotated(&rot)))
    }

    /// Mean NLL of `y` (Gaussian: `N(g, σ² + Σ)`; categorical: probit).
    pub fn predictive_nll(&self, x: &DMatrix<f64>, y: &DVector<f64>) -> Result<f64> {
        check_evaluation_data(&self.net, self.likelihood, x, y)?;
        let g = self.net.forward(x)?;
        let rot = self.feature_map.eval(&self.net, x)? * &self.ggn_eigenvectors;
        self.nll_from_rotated(&g, &rot, y)
    }
}

/// Saves the network, the likelihood, the feature map and the curvature's eigenpairs.
impl<N: Network + Clone + Serialize + DeserializeOwned> Persist for EllaPosterior<N> {
    const KIND: &'static str = "fspace_valla::EllaPosterior";
    const VERSION: u32 = 2;

    /// The network checked itself while it was read; here: the likelihood against the
    /// network, the feature map's shapes (`p × K` directions, or `M` Nyström points with the
    /// network's inputs, one output index below `d'` each, `M × K` coefficients), the `K`
    /// eigenpairs, `λ > 0`, all finite.
    fn validate_loaded(&self) -> std::result::Result<(), PersistError> {
        let check = fspace_core::LoadCheck::new(Self::KIND);
        check_likelihood(&self.net, self.likelihood)
            .map_err(|e| check.invalid("likelihood", e.to_string()))?;
        let k = self.ggn_eigenvalues.len();
        check.ensure(k >= 1, "ggn_eigenvalues", || "must hold ≥ 1 eigenvalue".into())?;
        check.finite("ggn_eigenvalues", self.ggn_eigenvalues.iter())?;
        check.shape("ggn_eigenvectors", self.ggn_eigenvectors.shape(), (k, k))?;
        check.finite("ggn_eigenvectors", self.ggn_eigenvectors.iter())?;
        check.positive("prior_precision", self.prior_precision)?;
        self.feature_map.check_loaded(&check, "feature_map", &self.net, k)
    }
}

fn core_err(e: VallaError) -> fspace_core::CoreError {
    to_core(e, "ELLA posterior")
}

impl<N: Network + Clone> Posterior for EllaPosterior<N> {
    fn output_dim(&self) -> usize {
        self.net.output_dim()
    }
    fn likelihood(&self) -> Option<LikelihoodSpec> {
        Some(match self.likelihood {
            VallaLikelihood::Gaussian { noise_std } => LikelihoodSpec::gaussian(noise_std),
            VallaLikelihood::Categorical => LikelihoodSpec::categorical(self.net.output_dim()),
        })
    }

    fn predict(&self, x: &DMatrix<f64>) -> fspace_core::Result<FunctionPredictive> {
        let (g, blocks) = self.predict_blocks(x).map_err(core_err)?;
        marginals(g, &blocks)
    }

    fn predict_joint(&self, x: &DMatrix<f64>) -> fspace_core::Result<(DMatrix<f64>, DMatrix<f64>)> {
        fspace_core::ensure_joint_fits(x.nrows(), fspace_core::Posterior::output_dim(self))?;
        let run = || -> Result<(DMatrix<f64>, DMatrix<f64>)> {
            let g = self.net.forward(x)?;
            let mut rot = self.feature_map.eval(&self.net, x)? * &self.ggn_eigenvectors;
            for (j, d) in self.ggn_eigenvalues.iter().enumerate() {
                rot.column_mut(j).scale_mut(1.0 / (d + self.prior_precision).sqrt());
            }
            Ok((g, &rot * rot.transpose()))
        };
        let (mean, cov) = run().map_err(core_err)?;
        fspace_core::checked_joint(mean, cov)
    }
}
