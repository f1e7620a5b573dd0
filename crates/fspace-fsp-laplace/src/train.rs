//! Algorithm 1: MAP training under the RKHS regulariser estimated at context points that are
//! redrawn every step.
//!
//! Per step, with a minibatch `B` of size `b` out of `n` points and fresh context points `C`:
//!
//! ```text
//! R(w) = (n/b) Σ_{i∈B} −log p(yᵢ | f(xᵢ; w))  +  ½ (f(C; w) − μ(C))ᵀ Σ(C, C)⁻¹ (f(C; w) − μ(C)).
//! ```
//!
//! `Σ(C, C)` does not depend on `w`, so the regulariser's gradient is `J(C)ᵀα` with
//! `α = Σ(C, C)⁻¹(f(C) − μ(C))`: one forward pass and one reverse-mode pass on the context
//! points. `Σ(C, C)` always gets a relative jitter (`context_jitter`, default 1e-3 of the mean
//! prior variance; more only if needed to factorise) and the jitter actually used is
//! reported by [`rkhs_regularizer`]. The paper does not state its jitter. Smooth kernels make
//! `Σ(C, C)` numerically singular, and with a tiny jitter the estimate penalises every
//! deviation from the kernel's numerical range by ~1/jitter: on the sine toy with a fitted
//! periodic prior (rank ≈ 9 at 100 points) a jitter of 1e-6 left the network unable to fit the
//! data (RMSE 0.71), 1e-3 fits it (0.044) while RBF runs stay within W2 0.17 of the exact GP
//! (`cargo xtask reproduce fsp-toy-regression`). The jitter acts like white noise of that
//! relative variance added to the prior at the context points.

use fspace_context::Sampler;
use fspace_core::Likelihood;
use fspace_kernels::gram;
use fspace_linalg::{cholesky_jitter, JitterConfig};
use fspace_nn::{train_map, Network, NnError, TrainConfig, TrainProgress, TrainReport};
use nalgebra::{DMatrix, DVector};

use crate::error::{ensure_dim, invalid, FspError, Result};
use fspace_kernels::GpPrior;

/// Flattens `n × d'` function values point-major (`n·d'`), the order of `Σ(C, C)`.
pub(crate) fn point_major(f: &DMatrix<f64>) -> DVector<f64> {
    DVector::from_column_slice(f.transpose().as_slice())
}

/// The inverse of [`point_major`]: `n·d'` values back to `n × d'`.
pub(crate) fn from_point_major(v: &[f64], q: usize) -> DMatrix<f64> {
    DMatrix::from_row_slice(v.len() / q, q, v)
}

/// The prior at fixed context points `C`, factorised once: `μ(C)` and the Cholesky factor of
/// `Σ(C, C) + εI` with `ε = jitter × mean diag Σ(C, C)` (more, ×10 per retry from 1e-10,
/// only if that still fails to factorise). [`ContextPrior::norm`] then gives the RKHS norm
/// estimate of any function values at `C` and its gradient with respect to them — what
/// [`rkhs_regularizer`] pulls back through a network, and what a framework with its own
/// autodiff (the Python binding's torch loss term) pulls back itself.
pub struct ContextPrior {
    mu: DMatrix<f64>,
    chol: fspace_linalg::JitteredCholesky,
    shared: bool,
    eps: f64,
    q: usize,
}

impl ContextPrior {
    /// Factorises the prior of `d'`-output functions at the rows of `c`.
    pub fn new(prior: &GpPrior, c: &DMatrix<f64>, output_dim: usize, jitter: f64) -> Result<Self> {
        if !(jitter.is_finite() && jitter >= 0.0) {
            return Err(invalid("context_jitter", format!("{jitter} must be finite and ≥ 0")));
        }
        prior.check(c.ncols(), output_dim)?;
        let q = output_dim;
        let mu = from_point_major(prior.mean_at(c)?.as_slice(), q);
        // Independent outputs sharing one kernel (`Σ = K₀ ⊗ I`): factor the n_C × n_C scalar
        // Gram and solve for all outputs at once, `α = K₀⁻¹ (F − M)` — the same numbers as the
        // n_C·d' system (identical jitter rule), d'³ times cheaper.
        let (mut k, shared) = match prior.kernel.shared_output_kernel() {
            Some(k0) => (gram(k0, c, c)?, true),
            None => (prior.gram(c)?, false),
        };
        let eps = jitter * k.diagonal().mean();
        for i in 0..k.nrows() {
            k[(i, i)] += eps;
        }
        let chol = cholesky_jitter(&k, &JitterConfig::default())?;
        Ok(Self { mu, chol, shared, eps, q })
    }

    /// `(½ (F − μ)ᵀ (Σ + εI)⁻¹ (F − μ), α = (Σ + εI)⁻¹ (F − μ))` for function values `F`
    /// (`n_C × d'`); `α` (`n_C × d'`) is the value's gradient with respect to `F`.
    pub fn norm(&self, f: &DMatrix<f64>) -> Result<(f64, DMatrix<f64>)> {
        if f.shape() != self.mu.shape() {
            return Err(invalid(
                "function values at the context points",
                format!(
                    "{}×{} given for {}×{} context outputs",
                    f.nrows(),
                    f.ncols(),
                    self.mu.nrows(),
                    self.q
                ),
            ));
        }
        if f.iter().any(|v| !v.is_finite()) {
            return Err(invalid("function values at the context points", "a value is not finite"));
        }
        let r = f - &self.mu;
        let alpha = if self.shared {
            self.chol.solve(&r)?
        } else {
            from_point_major(self.chol.solve_vec(&point_major(&r))?.as_slice(), self.q)
        };
        Ok((0.5 * r.dot(&alpha), alpha))
    }

    /// The jitter actually added to `Σ(C, C)` (the relative one plus any retry's).
    pub fn jitter_used(&self) -> f64 {
        self.eps + self.chol.jitter()
    }
}

/// Value and weight gradient of the regulariser `½ (f(C) − μ(C))ᵀ (Σ(C, C) + εI)⁻¹ (f(C) − μ(C))`
/// at the context points `c` ([`ContextPrior`]'s jitter rule). Returns `(value, J(C)ᵀα,
/// ε actually used)`.
pub fn rkhs_regularizer<N: Network + ?Sized>(
    net: &N,
    prior: &GpPrior,
    c: &DMatrix<f64>,
    jitter: f64,
) -> Result<(f64, DVector<f64>, f64)> {
    ensure_dim("context-point dimension vs. network inputs", net.input_dim(), c.ncols())?;
    let context = ContextPrior::new(prior, c, net.output_dim(), jitter)?;
    let mut value = 0.0;
    let mut failure = None;
    let result = net.forward_vjp(c, &mut |f: &DMatrix<f64>| match context.norm(f) {
        Ok((v, alpha)) => {
            value = v;
            Ok(alpha)
        }
        Err(e) => {
            let msg = e.to_string();
            failure = Some(e);
            Err(NnError::Regularizer(msg))
        }
    });
    let grad = match (result, failure) {
        (_, Some(e)) => return Err(e),
        (r, None) => r?.1,
    };
    Ok((value, grad, context.jitter_used()))
}

/// The Alg. 1 objective on one minibatch for fixed context points, and its weight gradient:
/// `scale·Σ_B NLL + ½‖h_C‖²` (`scale = n/b`). This is what every training step descends.
pub fn objective<N: Network + ?Sized>(
    net: &N,
    likelihood: &dyn Likelihood,
    prior: &GpPrior,
    xb: &DMatrix<f64>,
    yb: &DVector<f64>,
    scale: f64,
    c: &DMatrix<f64>,
    jitter: f64,
) -> Result<(f64, DVector<f64>)> {
    let f = net.forward(xb)?;
    let nll = likelihood.nll(&f, yb)?;
    let g = likelihood.nll_grad(&f, yb)? * scale;
    let (r, gr, _) = rkhs_regularizer(net, prior, c, jitter)?;
    Ok((scale * nll + r, net.vjp(xb, &g)? + gr))
}

/// Options of Alg. 1.
///
/// | name | default | meaning |
/// |---|---|---|
/// | `train` | 5000 epochs (validated after each), batch 100, lr 1e-3, no patience | the minibatch/Adam loop ([`TrainConfig`]) |
/// | `n_context` | 100 | context points drawn per step (paper: 100 on the toys) |
/// | `context_jitter` | 1e-3 | relative jitter on `Σ(C, C)` (see the module docs) |
#[derive(Debug, Clone, PartialEq)]
pub struct TrainOptions {
    /// Epochs, batch size, learning rate, early stopping, seed, noise learning.
    pub train: TrainConfig,
    /// `n_C` per step.
    pub n_context: usize,
    /// First relative jitter added to `Σ(C, C)`.
    pub context_jitter: f64,
}

impl Default for TrainOptions {
    fn default() -> Self {
        Self {
            train: TrainConfig {
                schedule: fspace_core::Schedule::epochs(5000),
                batch_size: 100,
                learning_rate: 1e-3,
                ..Default::default()
            },
            n_context: 100,
            context_jitter: 1e-3,
        }
    }
}

/// Alg. 1: trains `net` (and the likelihood's parameters if `options.train.learn_likelihood`)
/// under the FSP objective, drawing `n_context` points from `context` every step.
pub fn train<N: Network>(
    net: &mut N,
    likelihood: &mut dyn Likelihood,
    prior: &GpPrior,
    x: &DMatrix<f64>,
    y: &DVector<f64>,
    validation: Option<(&DMatrix<f64>, &DVector<f64>)>,
    context: &dyn Sampler,
    options: &TrainOptions,
    progress: impl FnMut(&TrainProgress),
) -> Result<TrainReport> {
    train_sharded(net, likelihood, prior, x, y, validation, context, options, progress, None)
}

/// [`train`] over data sharded across processes ([`fspace_nn::train_map_sharded`]): each
/// process passes its own rows; the context points are drawn from the same generator on every
/// process, so the prior term is the same everywhere and added once.
#[allow(clippy::too_many_arguments)]
pub fn train_sharded<N: Network>(
    net: &mut N,
    likelihood: &mut dyn Likelihood,
    prior: &GpPrior,
    x: &DMatrix<f64>,
    y: &DVector<f64>,
    validation: Option<(&DMatrix<f64>, &DVector<f64>)>,
    context: &dyn Sampler,
    options: &TrainOptions,
    progress: impl FnMut(&TrainProgress),
    shard: Option<fspace_core::ProcessShard<'_, NnError>>,
) -> Result<TrainReport> {
    with_context_regularizer(net, likelihood.output_dim(), prior, context, options, |net, hook| match shard {
        None => train_map(net, likelihood, x, y, validation, Some(hook), &options.train, progress),
        Some(shard) => fspace_nn::train_map_sharded(
            net,
            likelihood,
            x,
            y,
            validation,
            Some(hook),
            &options.train,
            progress,
            shard,
        ),
    })
}

/// [`train`] over rows read by position ([`fspace_core::RowSource`], e.g. a loader over a
/// map-style data set): each step reads its minibatch — the in-memory run's positions, so the
/// same rows give the same weights — and the validation NLL is summed over chunks of
/// `batch_size` rows ([`fspace_nn::train_map_rows`]). Nothing holds the whole set.
#[allow(clippy::too_many_arguments)]
pub fn train_rows<N: Network>(
    net: &mut N,
    likelihood: &mut dyn Likelihood,
    prior: &GpPrior,
    rows: &mut dyn fspace_core::RowSource,
    validation: Option<&mut dyn fspace_core::RowSource>,
    context: &dyn Sampler,
    options: &TrainOptions,
    progress: impl FnMut(&TrainProgress),
) -> Result<TrainReport> {
    with_context_regularizer(net, likelihood.output_dim(), prior, context, options, |net, hook| {
        fspace_nn::train_map_rows(net, likelihood, rows, validation, Some(hook), &options.train, progress)
    })
}

/// Checks Alg. 1's settings, then runs `train` with the regulariser hook that draws
/// `n_context` points from `context` every step; a failure of the hook is returned as it was.
fn with_context_regularizer<N: Network>(
    net: &mut N,
    likelihood_outputs: usize,
    prior: &GpPrior,
    context: &dyn Sampler,
    options: &TrainOptions,
    train: impl FnOnce(&mut N, &mut fspace_nn::Regularizer<'_, N>) -> fspace_nn::Result<TrainReport>,
) -> Result<TrainReport> {
    prior.check(net.input_dim(), net.output_dim())?;
    ensure_dim("likelihood outputs vs. network outputs", net.output_dim(), likelihood_outputs)?;
    ensure_dim("context sampler dimension vs. network inputs", net.input_dim(), context.dim())?;
    if options.n_context == 0 {
        return Err(invalid("n_context", "at least one context point per step"));
    }
    if !(options.context_jitter.is_finite() && options.context_jitter >= 0.0) {
        return Err(invalid("context_jitter", format!("{} must be finite and ≥ 0", options.context_jitter)));
    }
    // The hook speaks `NnError`; keep the original error to return it unchanged.
    let mut failure: Option<FspError> = None;
    let mut hook = |net: &N, rng: &mut rand::rngs::StdRng| -> fspace_nn::Result<(f64, DVector<f64>)> {
        let step = context
            .sample(options.n_context, rng)
            .map_err(FspError::from)
            .and_then(|c| rkhs_regularizer(net, prior, &c, options.context_jitter));
        match step {
            Ok((value, grad, _)) => Ok((value, grad)),
            Err(e) => {
                let msg = e.to_string();
                failure = Some(e);
                Err(NnError::Regularizer(msg))
            }
        }
    };
    let result = train(net, &mut hook);
    match (result, failure) {
        (Ok(report), _) => Ok(report),
        // The regulariser runs beside the data pass: its failure is the one reported only
        // when it is the error `train_map` returns.
        (Err(NnError::Regularizer(_)), Some(original)) => Err(original),
        (Err(e), _) => Err(e.into()),
    }
}
