//! FVI (Sun, Zhang, Shi & Grosse 2019): the functional ELBO of a stochastic network
//! `f(·; w)`, `w ~ q(w) = N(m, diag(σ²))` (not linearised), with a GP prior:
//!
//! `L = (N/B) Σ_{i∈B} E_q log N(yᵢ | f(xᵢ; w), σ_y²) − KL(q(f(X_M)) ‖ p(f(X_M)))`.
//!
//! `q(f(X_M))` has no density; the KL's gradient is
//! `E_w[(∇_f log q(f) − ∇_f log p(f))ᵀ ∂f(X_M; w)/∂φ]` with `∇ log q` estimated by [`Ssge`] from
//! the `K` function samples of the step and `∇ log p(f) = −(K_M + jitter)⁻¹(f − μ)`. Both terms
//! are reparameterised (`w = m + σ ⊙ ε`) and pulled back with one `Jᵀ·v` per sample. The
//! measurement set mixes `n_uniform` uniform points of the box with `n_batch` points of the
//! minibatch (the paper: 50 + 450).
//!
//! The data term is Gaussian (the paper's regression) or categorical over the network's
//! logits (a `Categorical` [`LikelihoodSpec`]; FSP-Laplace Table 2's FVI column): then it is the Monte-Carlo
//! average of `log softmax(f(xᵢ; w))_{yᵢ}` over the same function samples, with the gradient
//! `onehot(yᵢ) − softmax(f)` per sample and no `σ_y`.

use fspace_context::{BoundingBox, Sampler, UniformSampler};
use fspace_core::{Categorical, Data, Fitted, Likelihood, LikelihoodSpec, Observer, Silent};
use fspace_input::InputError;

use crate::observation::{observation, Observation};
use fspace_nn::Network;
use nalgebra::{DMatrix, DVector};
use rand::rngs::StdRng;
use rand::seq::index::sample as sample_indices;
use rand_distr::{Distribution, StandardNormal};
use serde::{Deserialize, Serialize};

use crate::divergence::inverse_and_logdet;
use crate::error::{invalid, GfsviError, Result};
use crate::optim::OptimConfig;
use crate::optim::OptimReport;
use crate::sampled::{check_regression, fit_mean_field, pack, unpack, WeightSamplePosterior};
use crate::ssge::Ssge;
use fspace_kernels::GpPrior;

/// FVI settings; `Default` holds the paper's values where it states them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FviConfig {
    /// Uniform measurement points per step (50).
    pub n_uniform: usize,
    /// Measurement points taken from the minibatch per step (450; all of a smaller batch).
    pub n_batch: usize,
    /// Box of the uniform points; `None`: the training inputs' box.
    pub measurement_box: Option<BoundingBox>,
    /// Function samples per step (for the data term and SSGE). Not stated in the paper; 20.
    pub samples: usize,
    /// Jitter added to the prior Gram matrix (1e-6).
    pub prior_jitter: f64,
    /// SSGE spectrum threshold (0.99) and jitter.
    #[serde(skip)]
    pub ssge: Ssge,
    /// Initial weight standard deviation.
    pub init_std: f64,
    /// Weight samples kept for predictions (100).
    pub predictive_samples: usize,
    /// Adam, minibatches, early stopping.
    pub optim: OptimConfig,
}

impl Default for FviConfig {
    fn default() -> Self {
        Self {
            n_uniform: 50,
            n_batch: 450,
            measurement_box: None,
            samples: 20,
            prior_jitter: 1e-6,
            ssge: Ssge::default(),
            init_std: 1e-2,
            predictive_samples: 100,
            optim: OptimConfig::default(),
        }
    }
}

/// Fits FVI with the GP `prior` under `likelihood` (`Gaussian` / `IsotropicGaussian`: `σ_y`
/// starts at its σ and is learned if it says so; `Categorical`: labels `n × 1`), starting the
/// means at the network's current weights.
pub fn fit<N: Network + Clone>(
    net: N,
    likelihood: LikelihoodSpec,
    prior: &GpPrior,
    data: &Data,
    config: &FviConfig,
) -> Result<Fitted<WeightSamplePosterior<N>, OptimReport>> {
    fit_observed(net, likelihood, prior, data, config, &mut Silent)
}

/// [`fit`], reporting at every evaluation of the schedule to `observer` (`loss`: minus the minibatch
/// objective; `validation`: the validation NLL).
pub fn fit_observed<N: Network + Clone>(
    net: N,
    likelihood: LikelihoodSpec,
    prior: &GpPrior,
    data: &Data,
    config: &FviConfig,
    observer: &mut dyn Observer,
) -> Result<Fitted<WeightSamplePosterior<N>, OptimReport>> {
    let (x, y, validation) = (data.x(), data.y(), data.validation());
    let net = &net;
    let q = net.output_dim();
    let (observation, init_noise_std, learn_noise) = observation(&likelihood, q, "FVI", true)?;
    let categorical = observation == Observation::Categorical;
    let target_cols = if categorical { 1 } else { q };
    check_regression(x, y, net.input_dim(), target_cols, "training inputs")?;
    if let Some((xv, yv)) = validation {
        check_regression(xv, yv, net.input_dim(), target_cols, "validation inputs")?;
    }
    if categorical {
        check_labels(y, q, "training labels")?;
        if let Some((_, yv)) = validation {
            check_labels(yv, q, "validation labels")?;
        }
    }
    if prior.output_dim() != q {
        return Err(GfsviError::Input(InputError::DimensionMismatch {
            what: "prior outputs (network outputs)",
            expected: q,
            found: prior.output_dim(),
        }));
    }
    if config.n_uniform + config.n_batch == 0 {
        return Err(invalid("number of measurement points M", "n_uniform + n_batch must be ≥ 1"));
    }
    if config.samples < 2 {
        return Err(invalid("FVI function samples", "SSGE needs at least 2"));
    }
    if !(config.init_std.is_finite() && config.init_std > 0.0) {
        return Err(invalid("initial weight std", format!("{} (must be > 0)", config.init_std)));
    }
    if !(config.prior_jitter.is_finite() && config.prior_jitter >= 0.0) {
        return Err(invalid("FVI prior jitter", format!("{} (must be ≥ 0)", config.prior_jitter)));
    }
    let bbox = match &config.measurement_box {
        Some(b) => b.clone(),
        None => BoundingBox::from_data(x, 0.0)?,
    };
    let sampler = UniformSampler::new(bbox);
    let p = net.n_params();
    let n = x.nrows();
    let step = |theta: &DVector<f64>, batch: &[usize], rng: &mut StdRng| {
        let (m, sd, log_noise) = unpack(theta, p);
        let sigma2 = (2.0 * log_noise).exp();
        let xb = x.select_rows(batch);
        let yb = y.select_rows(batch);
        let b = batch.len();
        let scale = n as f64 / b as f64;
        // Measurement points: uniform draws and a subset of the batch.
        let from_batch = config.n_batch.min(b);
        let picks = sample_indices(rng, b, from_batch).into_vec();
        let mut xm = xb.select_rows(&picks);
        if config.n_uniform > 0 {
            let u = sampler.sample(config.n_uniform, rng)?;
            xm = DMatrix::from_fn(from_batch + u.nrows(), xb.ncols(), |i, c| {
                if i < from_batch {
                    xm[(i, c)]
                } else {
                    u[(i - from_batch, c)]
                }
            });
        }
        let mpts = xm.nrows();
        let mu = prior.mean_at(&xm)?;
        // Independent outputs sharing a kernel: (K₀ ⊗ I + jI)⁻¹ = (K₀ + jI)⁻¹ ⊗ I, an M × M
        // inverse instead of an M·d' × M·d' one (the ten logits of an image model).
        let shared = prior.kernel.shared_output_kernel();
        let mut kmm = match shared {
            Some(k0) => fspace_kernels::gram(k0, &xm, &xm)?,
            None => prior.gram(&xm)?,
        };
        for i in 0..kmm.nrows() {
            kmm[(i, i)] += config.prior_jitter;
        }
        let (kinv, _) = inverse_and_logdet(&kmm, "FVI prior covariance (K + jitter)")?;
        // ∇ log p(f) = −K⁻¹(f − μ), point-major.
        let grad_log_prior = |fvec: &DVector<f64>| -> DVector<f64> {
            let r = fvec - &mu;
            if shared.is_some() {
                let a = &kinv * DMatrix::from_row_slice(mpts, q, r.as_slice());
                DVector::from_fn(mpts * q, |t, _| -a[(t / q, t % q)])
            } else {
                -(&kinv * r)
            }
        };
        let all =
            DMatrix::from_fn(b + mpts, xb.ncols(), |i, c| if i < b { xb[(i, c)] } else { xm[(i - b, c)] });
        // Function samples.
        let k = config.samples;
        let eps: Vec<DVector<f64>> =
            (0..k).map(|_| DVector::from_fn(p, |_, _| StandardNormal.sample(rng))).collect();
        // One network per sample: the samples' passes run side by side (each sample's
        // arithmetic is its own, and the sums below keep the sample order).
        let nets = eps
            .iter()
            .map(|e| {
                let mut w = net.clone();
                w.set_params(&(&m + sd.component_mul(e)))?;
                Ok(w)
            })
            .collect::<Result<Vec<N>>>()?;
        let mut ell = 0.0;
        let mut sq_total = 0.0;
        // The cotangents need every sample's outputs (SSGE); a failure keeps its own error.
        let mut failure: Option<GfsviError> = None;
        let mut cotangents = |outs: &[DMatrix<f64>]| -> fspace_nn::Result<Vec<DMatrix<f64>>> {
            let mut run = || -> Result<Vec<DMatrix<f64>>> {
                let fm = DMatrix::from_fn(k, mpts * q, |s, r| outs[s][(b + r / q, r % q)]);
                let score_q = config.ssge.score_at_samples(&fm)?;
                let mut cots = Vec::with_capacity(k);
                for (s, f) in outs.iter().enumerate() {
                    let (logp, grad_f, sq) = data_term(observation, &f.rows(0, b).into_owned(), &yb, sigma2)?;
                    ell += scale * logp / k as f64;
                    sq_total += sq;
                    let mut cot = DMatrix::zeros(b + mpts, q);
                    cot.rows_mut(0, b).copy_from(&(grad_f * scale));
                    // −(∇ log q − ∇ log p) at this sample.
                    let fvec = DVector::from_fn(mpts * q, |r, _| fm[(s, r)]);
                    let grad_logp = grad_log_prior(&fvec);
                    for r in 0..mpts * q {
                        cot[(b + r / q, r % q)] = -(score_q[(s, r)] - grad_logp[r]);
                    }
                    cots.push(cot);
                }
                Ok(cots)
            };
            run().map_err(|e| {
                let msg = e.to_string();
                failure = Some(e);
                fspace_nn::NnError::Regularizer(msg)
            })
        };
        let passes = N::forward_vjp_many(&nets, &all, &mut cotangents);
        let gws = match (passes, failure) {
            (_, Some(e)) => return Err(e),
            (r, None) => r?.1,
        };
        let mut grad = DVector::zeros(2 * p + 1);
        for (gw, e) in gws.iter().zip(&eps) {
            for j in 0..p {
                grad[j] += gw[j] / k as f64;
                grad[p + j] += gw[j] * e[j] * sd[j] / k as f64;
            }
        }
        if learn_noise && !categorical {
            let count = (b * q) as f64;
            grad[2 * p] = scale * (-count + sq_total / k as f64 / sigma2);
        }
        Ok((ell, grad))
    };
    let theta0 = pack(&net.params(), config.init_std.ln(), init_noise_std.ln());
    fit_mean_field(
        net,
        theta0,
        n,
        &config.optim,
        validation,
        config.predictive_samples,
        observation,
        likelihood,
        step,
        observer,
    )
}

/// Labels `0..classes` in an `n × 1` matrix (`fspace_core::Categorical`'s rule), as an
/// invalid-parameter error naming `what`.
fn check_labels(y: &DMatrix<f64>, classes: usize, what: &'static str) -> Result<(), GfsviError> {
    let labels = DVector::from_column_slice(y.as_slice());
    Categorical::new(classes)?.check_targets(&labels).map_err(|e| invalid(what, e.to_string()))
}

/// One function sample's data term on a batch: `(Σᵢ log p(yᵢ | fᵢ), ∂/∂f (b × d'), Σ squared
/// residuals)` — the residuals only for the Gaussian, whose `σ_y` gradient needs them. The
/// categorical term is `fspace_core::Categorical`'s negated NLL and gradient.
/// `likelihood` is a Gaussian (`σ²` = `sigma2`, not the spec's σ) or a categorical spec whose
/// outputs match `f`'s columns.
pub fn sample_data_term(
    likelihood: &LikelihoodSpec,
    f: &DMatrix<f64>,
    y: &DMatrix<f64>,
    sigma2: f64,
) -> Result<(f64, DMatrix<f64>, f64), GfsviError> {
    data_term(observation(likelihood, f.ncols(), "FVI", true)?.0, f, y, sigma2)
}

fn data_term(
    likelihood: Observation,
    f: &DMatrix<f64>,
    y: &DMatrix<f64>,
    sigma2: f64,
) -> Result<(f64, DMatrix<f64>, f64), GfsviError> {
    let (b, q) = f.shape();
    Ok(match likelihood {
        Observation::Gaussian => {
            let r = y - f;
            let sq = r.norm_squared();
            let logp = -0.5 * (b * q) as f64 * (std::f64::consts::TAU * sigma2).ln() - sq / (2.0 * sigma2);
            (logp, r / sigma2, sq)
        }
        Observation::Categorical => {
            let (lik, labels) = (Categorical::new(q)?, DVector::from_column_slice(y.as_slice()));
            (-lik.nll(f, &labels)?, -lik.nll_grad(f, &labels)?, 0.0)
        }
    })
}
