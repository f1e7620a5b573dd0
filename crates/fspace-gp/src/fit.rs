//! Type-II maximum likelihood: maximise `log p(y | X, θ)` over the kernel's log-hyperparameters
//! and `log σ²` with Adam, from several starting points; optionally on random minibatches of
//! the data (Chen et al. 2021) when `n` is too large for an exact Cholesky per step.
//!
//! Why Adam rather than L-BFGS: the log-space objective is smooth and well-scaled, Adam needs no
//! line search (robust to the occasional jittered Cholesky), and the same loop serves the
//! minibatch objective, whose gradients are noisy.

use fspace_core::Adam;
use fspace_kernels::{MatrixKernel, PriorMean};
use nalgebra::{DMatrix, DVector};
use rand::rngs::StdRng;
use rand::seq::index::sample as sample_indices;
use rand::SeedableRng;
use rand_distr::{Distribution, Normal};

use crate::error::{invalid, GpError, Result};
use crate::exact::{ExactGp, Noise};

/// Options of [`fit_hyperparameters`].
///
/// | name | default | purpose |
/// |---|---|---|
/// | `iterations` | 200 | Adam steps per restart |
/// | `learning_rate` | 0.05 | Adam step size in log space |
/// | `restarts` | 3 | starting points (the first is the given kernel, the rest perturbed) |
/// | `init_spread` | 0.5 | std of the log-space perturbation of restarts |
/// | `batch_size` | `None` | minibatch size (Chen et al. 2021); `None`: full data |
/// | `learn_noise` | true | also fit `log σ²` |
/// | `min_noise_variance` | 1e-6 | lower bound on `σ²` |
/// | `seed` | 0 | restarts and minibatches |
#[derive(Debug, Clone, PartialEq)]
pub struct FitConfig {
    /// Adam steps per restart.
    pub iterations: usize,
    /// Adam learning rate.
    pub learning_rate: f64,
    /// Number of starting points (≥ 1).
    pub restarts: usize,
    /// Log-space perturbation of the extra starting points.
    pub init_spread: f64,
    /// Minibatch size, or `None` for the full marginal likelihood.
    pub batch_size: Option<usize>,
    /// Whether to fit the noise variance.
    pub learn_noise: bool,
    /// Floor on the noise variance.
    pub min_noise_variance: f64,
    /// Seed.
    pub seed: u64,
}

impl Default for FitConfig {
    fn default() -> Self {
        Self {
            iterations: 200,
            learning_rate: 0.05,
            restarts: 3,
            init_spread: 0.5,
            batch_size: None,
            learn_noise: true,
            min_noise_variance: 1e-6,
            seed: 0,
        }
    }
}

/// The outcome of [`fit_hyperparameters`].
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct HyperparameterReport<K> {
    /// The kernel with the best hyperparameters.
    pub kernel: K,
    /// The fitted noise variance.
    pub noise_variance: f64,
    /// Full-data log marginal likelihood at the optimum.
    pub log_marginal_likelihood: f64,
    /// Final full-data log marginal likelihood of each restart (`NaN` where it diverged).
    pub restart_lml: Vec<f64>,
}

fn with_params<K: MatrixKernel + Clone>(kernel: &K, theta: &DVector<f64>, np: usize) -> Result<K> {
    let mut k = kernel.clone();
    k.set_params(&theta.as_slice()[..np])?;
    Ok(k)
}

/// Fits the kernel hyperparameters (and the noise) of a GP regression model by maximising the
/// (full or minibatch) log marginal likelihood with Adam and restarts; returns the best.
pub fn fit_hyperparameters<K: MatrixKernel + Clone>(
    kernel: &K,
    mean: &PriorMean,
    noise_variance: f64,
    x: &DMatrix<f64>,
    y: &DMatrix<f64>,
    config: &FitConfig,
) -> Result<HyperparameterReport<K>> {
    if config.restarts == 0 || config.iterations == 0 {
        return Err(invalid("fit config", "restarts and iterations must be ≥ 1"));
    }
    if !(noise_variance.is_finite() && noise_variance >= config.min_noise_variance) {
        return Err(invalid(
            "initial noise variance",
            format!("{noise_variance} must be ≥ {}", config.min_noise_variance),
        ));
    }
    let n = x.nrows();
    if let Some(b) = config.batch_size {
        if b == 0 || b > n {
            return Err(invalid("batch_size", format!("{b} not in 1..={n}")));
        }
    }
    let np = kernel.n_params();
    let mut rng = StdRng::seed_from_u64(config.seed);
    let perturb =
        Normal::new(0.0, config.init_spread.max(0.0)).map_err(|e| invalid("init_spread", e.to_string()))?;
    let mut start = DVector::from_vec(kernel.params());
    start = start.push(noise_variance.ln());
    let log_floor = config.min_noise_variance.ln();
    let mut best: Option<(f64, DVector<f64>)> = None;
    let mut restart_lml = Vec::new();
    for r in 0..config.restarts {
        let mut theta = start.clone();
        if r > 0 {
            theta.iter_mut().for_each(|t| *t += perturb.sample(&mut rng));
        }
        let mut adam = Adam::new(theta.len(), config.learning_rate);
        let mut ok = true;
        for _ in 0..config.iterations {
            let (xb, yb) = match config.batch_size {
                Some(b) if b < n => {
                    let idx = sample_indices(&mut rng, n, b).into_vec();
                    (x.select_rows(&idx), y.select_rows(&idx))
                }
                _ => (x.clone(), y.clone()),
            };
            let step = with_params(kernel, &theta, np).and_then(|k| {
                let gp = ExactGp::fit(k, mean.clone(), Noise::Homoscedastic(theta[np].exp()), &xb, &yb)?;
                gp.lml_gradient()
            });
            match step {
                Ok(mut g) if g.iter().all(|v| v.is_finite()) => {
                    if !config.learn_noise {
                        g[np] = 0.0;
                    }
                    adam.ascend(&mut theta, &g);
                    theta[np] = theta[np].max(log_floor);
                }
                _ => {
                    ok = false;
                    break;
                }
            }
        }
        let lml = if ok {
            with_params(kernel, &theta, np)
                .and_then(|k| ExactGp::fit(k, mean.clone(), Noise::Homoscedastic(theta[np].exp()), x, y))
                .map(|gp| gp.log_marginal_likelihood())
                .unwrap_or(f64::NAN)
        } else {
            f64::NAN
        };
        restart_lml.push(lml);
        if lml.is_finite() && best.as_ref().is_none_or(|(b, _)| lml > *b) {
            best = Some((lml, theta));
        }
    }
    let (lml, theta) =
        best.ok_or_else(|| GpError::Diverged(format!("every restart diverged: {restart_lml:?}")))?;
    Ok(HyperparameterReport {
        kernel: with_params(kernel, &theta, np)?,
        noise_variance: theta[np].exp(),
        log_marginal_likelihood: lml,
        restart_lml,
    })
}
