//! The `Posterior` contract that every inference method returns, so that the experiment
//! harness can run any method in any experiment, and the predictive transforms shared by all.

use fspace_input::InputError;
use nalgebra::{DMatrix, DVector};
use rand::RngCore;
use rand_distr::{Distribution, StandardNormal};

use rand::rngs::StdRng;
use rand::SeedableRng;
use serde::{Deserialize, Serialize};

use crate::error::{ensure_dim, ensure_finite, CoreError, Result};
use crate::likelihood::{sigmoid, softmax, HeteroscedasticGaussian};
use crate::spec::LikelihoodSpec;

/// Marginal predictive of the latent function at `n` points of a `d'`-output model.
#[derive(Debug, Clone, PartialEq)]
pub struct FunctionPredictive {
    /// Predictive means, `n × d'`.
    pub mean: DMatrix<f64>,
    /// Marginal predictive variances, `n × d'` (≥ 0).
    pub var: DMatrix<f64>,
}

impl FunctionPredictive {
    /// Checks shapes, finiteness and non-negative variances.
    pub fn new(mean: DMatrix<f64>, var: DMatrix<f64>) -> Result<Self> {
        ensure_dim("predictive variance rows", mean.nrows(), var.nrows())?;
        ensure_dim("predictive variance columns", mean.ncols(), var.ncols())?;
        ensure_finite("predictive mean", mean.iter())?;
        ensure_finite("predictive variance", var.iter())?;
        if var.iter().any(|&v| v < 0.0) {
            return Err(CoreError::NotPsd { what: "marginal predictive variance (negative entry)" });
        }
        Ok(Self { mean, var })
    }
    /// Standard deviations, `n × d'`.
    pub fn std(&self) -> DMatrix<f64> {
        self.var.map(f64::sqrt)
    }
}

/// A marginal variance with rounding below zero clipped to 0 — and a NaN kept, so that
/// [`FunctionPredictive::new`] refuses it (`f64::max(NaN, 0.0)` is 0: a clamp by `max` would
/// serve a broken posterior's NaN as a certain prediction).
pub fn clip_rounding(v: f64) -> f64 {
    if v < 0.0 {
        0.0
    } else {
        v
    }
}

/// Refuses, before any allocation, a joint predictive at `n` points of `q` outputs that the
/// memory budget ([`fspace_input::budget`]) cannot hold: the `n·q × n·q` covariance with the
/// two more such matrices its computation or a sampler's eigendecomposition holds beside it.
/// Every [`Posterior::predict_joint`] starts with it (a request of 10⁵ points is 80 GB per
/// matrix: an allocation failure would abort the process).
pub fn ensure_joint_fits(n: usize, q: usize) -> Result<()> {
    let side = n.saturating_mul(q);
    fspace_input::budget::ensure(
        "a joint predictive covariance (n·d' × n·d', with its workspace)",
        fspace_input::budget::matrix_bytes(side, side).saturating_mul(3),
        "fewer points per call, or the marginal predictive (predict / joint=False)",
    )?;
    Ok(())
}

/// Refuses, before any allocation, `s` function samples at `n` points of `q` outputs that the
/// memory budget cannot hold (`s · n · q` values, twice: the draws and their noise).
pub fn ensure_samples_fit(s: usize, n: usize, q: usize) -> Result<()> {
    fspace_input::budget::ensure(
        "function samples (n_samples × n × d')",
        fspace_input::budget::matrix_bytes(s, n.saturating_mul(q)).saturating_mul(2),
        "fewer n_samples, or fewer points per call",
    )?;
    Ok(())
}

/// How far below zero a joint covariance's diagonal may fall by rounding, relative to its
/// largest entry in magnitude, before [`checked_joint`] calls it not a covariance.
pub const JOINT_ROUNDING: f64 = 1e-6;

/// A joint predictive `(mean, cov)` as [`Posterior::predict_joint`] promises it: finite, the
/// covariance square with a diagonal that is non-negative up to rounding ([`JOINT_ROUNDING`]).
/// Every implementation returns through it, so a posterior whose numbers overflow (a loaded
/// file with entries near `f64::MAX`) is an error, never NaN or negative variances.
pub fn checked_joint(mean: DMatrix<f64>, cov: DMatrix<f64>) -> Result<(DMatrix<f64>, DMatrix<f64>)> {
    ensure_finite("joint predictive mean", mean.iter())?;
    ensure_dim("joint predictive covariance rows", mean.len(), cov.nrows())?;
    ensure_dim("joint predictive covariance columns", mean.len(), cov.ncols())?;
    ensure_finite("joint predictive covariance", cov.iter())?;
    let scale = cov.iter().fold(0.0_f64, |m, v| m.max(v.abs()));
    if cov.diagonal().iter().any(|&v| v < -JOINT_ROUNDING * scale) {
        return Err(CoreError::NotPsd { what: "joint predictive covariance (a negative variance)" });
    }
    Ok((mean, cov))
}

/// A posterior over functions, as returned by every method (exact GP, FSP-Laplace, GFSVI,
/// VaLLA, Laplace, …). Inputs are `n × d` matrices (points as rows).
pub trait Posterior: Send + Sync {
    /// Outputs `d'` per point.
    fn output_dim(&self) -> usize;

    /// Predictive mean and marginal variance of `f` at the rows of `x`.
    fn predict(&self, x: &DMatrix<f64>) -> Result<FunctionPredictive>;

    /// Predictive mean (`n × d'`) and joint covariance (`n·d' × n·d'`, point-major) of `f` at
    /// the rows of `x` — for small sets.
    fn predict_joint(&self, x: &DMatrix<f64>) -> Result<(DMatrix<f64>, DMatrix<f64>)>;

    /// `s` joint function samples at the rows of `x` (each `n × d'`), from the caller's RNG.
    /// The default draws from [`predict_joint`](Self::predict_joint) through a symmetric
    /// square root (robust to singular covariances); methods with a cheaper sampler override it.
    fn sample_functions(
        &self,
        x: &DMatrix<f64>,
        s: usize,
        rng: &mut dyn RngCore,
    ) -> Result<Vec<DMatrix<f64>>> {
        ensure_samples_fit(s, x.nrows(), self.output_dim())?;
        let (mean, cov) = self.predict_joint(x)?;
        sample_gaussian(&mean, &cov, s, rng)
    }

    /// The observation model the posterior was fitted under, with any learned parameter (σ)
    /// at its fitted value; `None` for a posterior over `f` alone.
    fn likelihood(&self) -> Option<LikelihoodSpec> {
        None
    }

    /// The predictive of the observations `y` at the rows of `x`: [`predict`](Self::predict)
    /// with the likelihood's noise added ([`observation_predictive`]). A classification
    /// likelihood, or none, is [`CoreError::Unsupported`]: use
    /// [`class_probabilities`](Self::class_probabilities).
    fn predict_y(&self, x: &DMatrix<f64>) -> Result<FunctionPredictive> {
        let spec = self.likelihood().ok_or(CoreError::Unsupported {
            method: "predict_y of a posterior without a likelihood",
            likelihood: "none",
        })?;
        observation_predictive(&spec, self.predict(x)?)
    }

    /// Class probabilities (`n × C`) at the rows of `x` under a Bernoulli or categorical
    /// likelihood, by the given [`Link`] applied to [`predict`](Self::predict) (methods whose
    /// predictive is not Gaussian in the logits override this). A regression likelihood, or
    /// none, is [`CoreError::Unsupported`].
    fn class_probabilities(&self, x: &DMatrix<f64>, link: &Link) -> Result<DMatrix<f64>> {
        ensure_classifier(self.likelihood())?;
        class_probabilities(&self.predict(x)?, link)
    }
}

/// `Ok` for a Bernoulli or categorical likelihood; [`CoreError::Unsupported`] otherwise (the
/// check every [`Posterior::class_probabilities`] starts with).
pub fn ensure_classifier(likelihood: Option<LikelihoodSpec>) -> Result<()> {
    match likelihood {
        Some(LikelihoodSpec::Bernoulli | LikelihoodSpec::Categorical { .. }) => Ok(()),
        Some(other) => {
            Err(other.unsupported("class probabilities (a classification posterior's predictive)"))
        }
        None => Err(CoreError::Unsupported {
            method: "class probabilities of a posterior without a likelihood",
            likelihood: "none",
        }),
    }
}

/// The predictive of `y` from that of `f` under `likelihood`: `f`'s variance plus σ² for the
/// Gaussian likelihoods; for the heteroscedastic Gaussian one column, the mean output's mean
/// and its variance plus `E[e^η] = exp(m_η + v_η/2)` under the predictive of the
/// log-variance output. Classification likelihoods are [`CoreError::Unsupported`].
pub fn observation_predictive(
    likelihood: &LikelihoodSpec,
    mut f: FunctionPredictive,
) -> Result<FunctionPredictive> {
    match *likelihood {
        LikelihoodSpec::Gaussian { sigma, .. } | LikelihoodSpec::IsotropicGaussian { sigma, .. } => {
            f.var.add_scalar_mut(sigma * sigma);
            Ok(f)
        }
        LikelihoodSpec::HeteroscedasticGaussian => {
            let (m, v) = HeteroscedasticGaussian.predictive(&f.mean, &f.var)?;
            FunctionPredictive::new(
                DMatrix::from_column_slice(m.len(), 1, m.as_slice()),
                DMatrix::from_column_slice(v.len(), 1, v.as_slice()),
            )
        }
        other => Err(other.unsupported("predict_y (the predictive of regression targets)")),
    }
}

/// `s` samples of `N(mean, cov)` with `mean` `n × d'` and `cov` `n·d' × n·d'` (point-major),
/// through `cov = V Λ Vᵀ`, `sample = mean + V Λ₊^{1/2} z`. Eigenvalues below
/// `−1e−8·λ_max` prove `cov` indefinite (error); smaller negative ones are rounding and are
/// clamped to zero.
pub fn sample_gaussian(
    mean: &DMatrix<f64>,
    cov: &DMatrix<f64>,
    s: usize,
    rng: &mut dyn RngCore,
) -> Result<Vec<DMatrix<f64>>> {
    let (n, q) = mean.shape();
    ensure_dim("joint covariance size", n * q, cov.nrows())?;
    ensure_dim("joint covariance columns", n * q, cov.ncols())?;
    ensure_finite("joint mean", mean.iter())?;
    ensure_finite("joint covariance", cov.iter())?;
    if s == 0 {
        return Err(CoreError::Input(InputError::Invalid {
            what: "number of samples",
            reason: "must be ≥ 1".into(),
        }));
    }
    // fspace-linalg's (faer's) eigendecomposition: nalgebra 0.33's `symmetric_eigen` returns
    // orthonormal but wrong eigenpairs on some near-degenerate spectra (a softmax Hessian's
    // `V Λ Vᵀ` off by 6.6e-2; test `samples_of_a_near_degenerate_covariance_have_it`).
    let (values, vectors) = fspace_linalg::sym_eigh(&((cov + cov.transpose()) * 0.5))
        .map_err(|e| CoreError::method("the joint covariance's eigendecomposition", e))?;
    let lmax = values.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    if values.iter().any(|&l| l < -1e-8 * lmax) {
        return Err(CoreError::NotPsd { what: "joint predictive covariance" });
    }
    let mut root = vectors;
    for (j, l) in values.iter().enumerate() {
        root.column_mut(j).scale_mut(l.max(0.0).sqrt());
    }
    finite_samples(
        (0..s)
            .map(|_| {
                let z = DVector::from_fn(n * q, |_, _| StandardNormal.sample(rng));
                let flat = &root * z;
                DMatrix::from_fn(n, q, |i, a| mean[(i, a)] + flat[i * q + a])
            })
            .collect(),
    )
}

/// `draws` unchanged when every entry is finite; otherwise the typed error a
/// [`Posterior::sample_functions`] returns instead of non-finite draws (weights so large that
/// the network overflows, say).
pub fn finite_samples(draws: Vec<DMatrix<f64>>) -> Result<Vec<DMatrix<f64>>> {
    for d in &draws {
        ensure_finite("function samples", d.iter())?;
    }
    Ok(draws)
}

/// How class probabilities are computed from a Gaussian over logits (laplace-torch's
/// `link_approx`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Link {
    /// Probit approximation: `σ(m / √(1 + πv/8))` (binary); softmax of the scaled means
    /// (multi-class).
    Probit,
    /// Laplace bridge (Hobbhahn, Kristiadi & Hennig 2022): the Dirichlet matched to the logit
    /// Gaussian, `αₖ = (1 − 2/K + e^{mₖ}/K² Σₗ e^{−mₗ}) / vₖ`, probabilities `αₖ / Σα`.
    LaplaceBridge,
    /// Average of sigmoid/softmax over `samples` draws of independent per-output Gaussians,
    /// drawn from `StdRng::seed_from_u64(seed)` (the same call gives the same numbers).
    MonteCarlo {
        /// Number of draws (≥ 1).
        samples: usize,
        /// Seed of the draws.
        seed: u64,
    },
}

/// Class probabilities (`n × C`) from a Gaussian over logits.
///
/// One output (`d' = 1`) is a binary model with logit `f`: columns are `[1 − p, p]`. Otherwise
/// `d' = C` logits per point. Outputs are treated as independent given their marginal
/// variances (the per-point covariance is not part of [`FunctionPredictive`]).
pub fn class_probabilities(pred: &FunctionPredictive, link: &Link) -> Result<DMatrix<f64>> {
    match *link {
        Link::MonteCarlo { samples, seed } => {
            mc_class_probabilities(pred, samples, &mut StdRng::seed_from_u64(seed))
        }
        Link::Probit => link_probabilities(pred, false),
        Link::LaplaceBridge => link_probabilities(pred, true),
    }
}

/// Class probabilities (`n × C`) of a predictive given by function draws (each `n × d'`): the
/// mean over the draws of the sigmoid (one output) or softmax of each draw's logits, summed in
/// draw order — the predictive of a weight-sample posterior, to which the link approximations
/// of Gaussian logits do not apply. Errors on an empty set of draws.
pub fn mean_class_probabilities(draws: &[DMatrix<f64>]) -> Result<DMatrix<f64>> {
    let Some(first) = draws.first() else {
        return Err(CoreError::Input(InputError::Empty { what: "function draws" }));
    };
    let zero = DMatrix::zeros(first.nrows(), first.ncols());
    let mut acc: Option<DMatrix<f64>> = None;
    for d in draws {
        let p =
            class_probabilities(&FunctionPredictive { mean: d.clone(), var: zero.clone() }, &Link::Probit)?;
        acc = Some(match acc {
            Some(a) => a + p,
            None => p,
        });
    }
    Ok(acc.expect("checked non-empty") / draws.len() as f64)
}

/// [`Link::MonteCarlo`] with the caller's RNG (a running stream shared with other draws).
pub fn mc_class_probabilities(
    pred: &FunctionPredictive,
    samples: usize,
    rng: &mut dyn RngCore,
) -> Result<DMatrix<f64>> {
    let (n, q) = check_logits(pred)?;
    if samples == 0 {
        return Err(CoreError::Input(InputError::Invalid {
            what: "Monte-Carlo samples",
            reason: "must be ≥ 1".into(),
        }));
    }
    let classes = if q == 1 { 2 } else { q };
    let mut out = DMatrix::zeros(n, classes);
    for i in 0..n {
        let mut acc = vec![0.0; classes];
        for _ in 0..samples {
            let logits: Vec<f64> = (0..q)
                .map(|a| {
                    let z: f64 = StandardNormal.sample(rng);
                    pred.mean[(i, a)] + pred.var[(i, a)].sqrt() * z
                })
                .collect();
            probs_of(&logits).iter().zip(acc.iter_mut()).for_each(|(p, a)| *a += p);
        }
        for k in 0..classes {
            out[(i, k)] = acc[k] / samples as f64;
        }
    }
    Ok(out)
}

fn check_logits(pred: &FunctionPredictive) -> Result<(usize, usize)> {
    let (n, q) = pred.mean.shape();
    if n == 0 {
        return Err(CoreError::Input(InputError::Empty { what: "predictive" }));
    }
    Ok((n, q))
}

/// Sigmoid as `[1 − p, p]` for one logit, softmax otherwise.
fn probs_of(logits: &[f64]) -> Vec<f64> {
    if logits.len() == 1 {
        let p = sigmoid(logits[0]);
        vec![1.0 - p, p]
    } else {
        softmax(logits)
    }
}

/// The deterministic links: probit, or the Laplace bridge with `bridge`.
fn link_probabilities(pred: &FunctionPredictive, bridge: bool) -> Result<DMatrix<f64>> {
    let (n, q) = check_logits(pred)?;
    let binary = q == 1;
    let classes = if binary { 2 } else { q };
    let mut out = DMatrix::zeros(n, classes);
    if !bridge {
        for i in 0..n {
            let scaled: Vec<f64> = (0..q)
                .map(|a| pred.mean[(i, a)] / (1.0 + std::f64::consts::PI * pred.var[(i, a)] / 8.0).sqrt())
                .collect();
            probs_of(&scaled).iter().enumerate().for_each(|(k, p)| out[(i, k)] = *p);
        }
    } else {
        for i in 0..n {
            // Binary: the logit f is the two-class softmax of (−f/2, f/2), variances v/4.
            let (m, v): (Vec<f64>, Vec<f64>) = if binary {
                let (f, var) = (pred.mean[(i, 0)], pred.var[(i, 0)]);
                (vec![-f / 2.0, f / 2.0], vec![var / 4.0; 2])
            } else {
                ((0..q).map(|a| pred.mean[(i, a)]).collect(), (0..q).map(|a| pred.var[(i, a)]).collect())
            };
            let k = classes as f64;
            // Shift logits (the bridge is shift-invariant only approximately; the shift by
            // the mean logit keeps e^{±m} finite, as in the reference implementation).
            let shift = m.iter().sum::<f64>() / k;
            let m: Vec<f64> = m.iter().map(|x| x - shift).collect();
            let sum_neg: f64 = m.iter().map(|x| (-x).exp()).sum();
            let alpha: Vec<f64> = (0..classes)
                .map(|c| (1.0 - 2.0 / k + m[c].exp() * sum_neg / (k * k)) / v[c].max(1e-12))
                .collect();
            let total: f64 = alpha.iter().sum();
            alpha.iter().enumerate().for_each(|(c, a)| out[(i, c)] = a / total);
        }
    }
    Ok(out)
}
