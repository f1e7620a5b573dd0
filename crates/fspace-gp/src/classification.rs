//! GP classification.
//!
//! * [`LaplaceGpClassifier`]: binary GP classification with a logistic likelihood and the
//!   Laplace approximation (Rasmussen & Williams 2006, Alg. 3.1 for the mode by Newton's method
//!   with `B = I + W^½ K W^½`, Alg. 3.2 for predictions). It returns a latent `Posterior`;
//!   class probabilities come from [`fspace_core::class_probabilities`].
//! * [`dirichlet_targets`]: Milios et al. (2018) turn one-hot labels into heteroscedastic
//!   regression targets, `α = y + α_ε`, `σ̃² = log(1/α + 1)`, `ỹ = log α − σ̃²/2`, one GP per
//!   class; FSP-Laplace uses this to fit classification priors by marginal likelihood
//!   ([`fit_dirichlet_hyperparameters`]).

use fspace_core::{Bernoulli, FunctionPredictive, Likelihood, Posterior};
use fspace_kernels::{gram, gram_diag, IntoScalarKernel, Kernel, PriorMean};
use fspace_linalg::{cholesky_jitter_owned, JitterConfig, JitteredCholesky};
use nalgebra::{DMatrix, DVector};

use crate::error::{invalid, GpError, Result};
use crate::exact::{posterior_variances, scalar_predictive, symmetrised, to_core, ExactGp, Noise};
use crate::fit::FitConfig;
use fspace_core::Adam;

/// Options of the Newton iteration for the posterior mode.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GpClassifierConfig {
    /// Maximum Newton steps (default 100).
    pub max_iter: usize,
    /// Stop when the objective improves by less than this (default 1e-10).
    pub tol: f64,
}

impl Default for GpClassifierConfig {
    fn default() -> Self {
        Self { max_iter: 100, tol: 1e-10 }
    }
}

/// Binary GP classifier with the Laplace approximation; labels in {0, 1}.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct LaplaceGpClassifier<K> {
    kernel: K,
    x: DMatrix<f64>,
    grad_log_lik: DVector<f64>,
    sqrt_w: DVector<f64>,
    b_chol: JitteredCholesky,
    log_marginal: f64,
    iterations: usize,
}

impl<K: Kernel> LaplaceGpClassifier<K> {
    /// Finds the posterior mode by Newton's method (with step halving when the objective
    /// `Ψ(f) = log p(y | f) − ½ fᵀK⁻¹f` would decrease) and builds the Laplace posterior (the
    /// public entry is [`fit`]).
    pub(crate) fn fit(
        kernel: K,
        x: &DMatrix<f64>,
        y: &DVector<f64>,
        config: &GpClassifierConfig,
    ) -> Result<Self> {
        let n = x.nrows();
        if y.len() != n || n == 0 {
            return Err(invalid("labels", format!("need {n} labels, got {}", y.len())));
        }
        if config.max_iter == 0 {
            return Err(invalid("GpClassifierConfig::max_iter", "must be ≥ 1 (Newton steps)"));
        }
        if !(config.tol.is_finite() && config.tol >= 0.0) {
            return Err(invalid("GpClassifierConfig::tol", format!("{} must be finite and ≥ 0", config.tol)));
        }
        Bernoulli.check_targets(y)?;
        let k = gram(&kernel, x, x)?;
        let lik = Bernoulli;
        let objective = |f: &DVector<f64>, a: &DVector<f64>| -> Result<f64> {
            let fm = DMatrix::from_column_slice(n, 1, f.as_slice());
            Ok(-lik.nll(&fm, y)? - 0.5 * a.dot(f))
        };
        let (mut f, mut a) = (DVector::zeros(n), DVector::zeros(n));
        let mut psi = objective(&f, &a)?;
        let mut iterations = 0;
        for it in 0..config.max_iter {
            iterations = it + 1;
            let fm = DMatrix::from_column_slice(n, 1, f.as_slice());
            let grad = -lik.nll_grad(&fm, y)?.column(0).into_owned(); // ∇ log p(y|f)
            let w = DVector::from_iterator(n, lik.nll_hessian(&fm, y)?.iter().map(|h| h[(0, 0)]));
            let sw = w.map(f64::sqrt);
            let b_chol = cholesky_jitter_owned(b_matrix(&k, &sw), &JitterConfig::default())?;
            let b = w.component_mul(&f) + &grad;
            let rhs = DMatrix::from_column_slice(n, 1, sw.component_mul(&(&k * &b)).as_slice());
            let c = b_chol.solve(&rhs)?.column(0).into_owned();
            let a_new = &b - sw.component_mul(&c);
            // Newton direction in a; halve the step until Ψ does not decrease.
            let mut step = 1.0;
            let (mut f_try, mut a_try, mut psi_try);
            loop {
                a_try = &a + (&a_new - &a) * step;
                f_try = &k * &a_try;
                psi_try = objective(&f_try, &a_try)?;
                if psi_try >= psi - 1e-12 * psi.abs() || step < 1e-6 {
                    break;
                }
                step *= 0.5;
            }
            let improvement = psi_try - psi;
            (f, a, psi) = (f_try, a_try, psi_try);
            if improvement.abs() < config.tol {
                break;
            }
        }
        let fm = DMatrix::from_column_slice(n, 1, f.as_slice());
        let grad_log_lik = -lik.nll_grad(&fm, y)?.column(0).into_owned();
        let w = DVector::from_iterator(n, lik.nll_hessian(&fm, y)?.iter().map(|h| h[(0, 0)]));
        let sqrt_w = w.map(f64::sqrt);
        let b_chol = cholesky_jitter_owned(b_matrix(&k, &sqrt_w), &JitterConfig::default())?;
        let log_marginal = psi - 0.5 * b_chol.log_det();
        if !log_marginal.is_finite() {
            return Err(GpError::Diverged("Laplace approximation gave a non-finite evidence".into()));
        }
        Ok(Self { kernel, x: x.clone(), grad_log_lik, sqrt_w, b_chol, log_marginal, iterations })
    }

    /// The Laplace approximation of `log p(y | X)` (R&W eq. 3.32).
    pub fn log_marginal_likelihood(&self) -> f64 {
        self.log_marginal
    }
    /// Newton iterations used.
    pub fn iterations(&self) -> usize {
        self.iterations
    }

    fn latent(&self, xs: &DMatrix<f64>) -> Result<(DVector<f64>, DMatrix<f64>)> {
        let k_xs = gram(&self.kernel, &self.x, xs)?;
        let mean = k_xs.tr_mul(&self.grad_log_lik);
        let mut scaled = k_xs.clone();
        for (i, mut row) in scaled.row_iter_mut().enumerate() {
            row *= self.sqrt_w[i];
        }
        let v = self.b_chol.solve_lower(&scaled)?;
        Ok((mean, v))
    }
}

fn b_matrix(k: &DMatrix<f64>, sw: &DVector<f64>) -> DMatrix<f64> {
    let n = k.nrows();
    DMatrix::from_fn(n, n, |i, j| sw[i] * k[(i, j)] * sw[j] + if i == j { 1.0 } else { 0.0 })
}

impl<K: Kernel> Posterior for LaplaceGpClassifier<K> {
    fn output_dim(&self) -> usize {
        1
    }
    fn likelihood(&self) -> Option<fspace_core::LikelihoodSpec> {
        Some(fspace_core::LikelihoodSpec::Bernoulli)
    }
    fn predict(&self, xs: &DMatrix<f64>) -> Result<FunctionPredictive, fspace_core::CoreError> {
        let run = || -> Result<FunctionPredictive> {
            let (mean, v) = self.latent(xs)?;
            let prior = gram_diag(&self.kernel, xs)?;
            scalar_predictive(&mean, &posterior_variances(&prior, |j| v.column(j).norm_squared()))
        };
        run().map_err(to_core)
    }
    fn predict_joint(
        &self,
        xs: &DMatrix<f64>,
    ) -> Result<(DMatrix<f64>, DMatrix<f64>), fspace_core::CoreError> {
        fspace_core::ensure_joint_fits(xs.nrows(), fspace_core::Posterior::output_dim(self))?;
        let run = || -> Result<(DMatrix<f64>, DMatrix<f64>)> {
            let (mean, v) = self.latent(xs)?;
            let cov = gram(&self.kernel, xs, xs)? - v.transpose() * &v; // blocked GEMM (`tr_mul` is unblocked)
            Ok((DMatrix::from_column_slice(mean.len(), 1, mean.as_slice()), symmetrised(&cov)))
        };
        let (mean, cov) = run().map_err(to_core)?;
        fspace_core::checked_joint(mean, cov)
    }
}

/// What [`fit`] did.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct GpClassifierReport {
    /// The Laplace approximation of `log p(y)`.
    pub log_marginal_likelihood: f64,
    /// Newton steps to the posterior mode.
    pub iterations: usize,
    /// Wall time (s).
    pub seconds: f64,
}

/// The binary GP classifier — the model's one entry point, in the workspace's call shape: the
/// zero-mean scalar `prior` conditioned on labels `n × 1` in {0, 1} under the `Bernoulli`
/// (logistic) likelihood by the Laplace approximation. The kernel is used as given (fit its
/// hyperparameters first); the posterior owns a copy ([`IntoScalarKernel`]: a concrete kernel
/// keeps its type, a shared one is rebuilt from its spec). Refused with a typed error: another
/// likelihood, a non-zero prior mean (the classifier's latent has mean zero), targets with
/// several columns and a validation set (it would not be used).
pub fn fit<K: IntoScalarKernel>(
    likelihood: fspace_core::LikelihoodSpec,
    prior: &fspace_kernels::GpPrior<K>,
    data: &fspace_core::Data,
    config: &GpClassifierConfig,
) -> Result<fspace_core::Fitted<LaplaceGpClassifier<K::Scalar>, GpClassifierReport>> {
    let start = std::time::Instant::now();
    if likelihood != fspace_core::LikelihoodSpec::Bernoulli {
        return Err(likelihood.unsupported("the Laplace GP classifier").into());
    }
    check_classifier_inputs(&prior.mean, data, "the Laplace GP classifier")?;
    let kernel = crate::svgp::scalar_prior_kernel(prior, "the Laplace GP classifier")?;
    let posterior = LaplaceGpClassifier::fit(kernel, data.x(), &data.y().column(0).into_owned(), config)?;
    let report = GpClassifierReport {
        log_marginal_likelihood: posterior.log_marginal_likelihood(),
        iterations: posterior.iterations(),
        seconds: start.elapsed().as_secs_f64(),
    };
    Ok(fspace_core::Fitted { posterior, report })
}

/// The checks the two GP classifiers' `fit` share: zero prior mean, one target column, no
/// validation set.
pub(crate) fn check_classifier_inputs(
    mean: &PriorMean,
    data: &fspace_core::Data,
    method: &str,
) -> Result<()> {
    if !matches!(mean, PriorMean::Zero) {
        return Err(invalid("prior mean", format!("{method} takes a zero-mean prior")));
    }
    if data.y().ncols() != 1 {
        return Err(invalid("targets", format!("{method} takes one label column, got {}", data.y().ncols())));
    }
    if data.validation().is_some() {
        return Err(invalid(
            "validation data",
            format!("{method} does not use a validation set; leave it out"),
        ));
    }
    Ok(())
}

/// Milios et al. (2018) regression targets for labels `0..classes`: returns `ỹ` (`n × C`) and
/// the per-point noise variances `σ̃²` (`n × C`) for `α_ε > 0` (they suggest 0.01).
pub fn dirichlet_targets(
    labels: &DVector<f64>,
    classes: usize,
    alpha_eps: f64,
) -> Result<(DMatrix<f64>, DMatrix<f64>)> {
    if classes < 2 || !(alpha_eps.is_finite() && alpha_eps > 0.0) {
        return Err(invalid(
            "dirichlet targets",
            format!("need classes ≥ 2 and α_ε > 0 (got {classes}, {alpha_eps})"),
        ));
    }
    if let Some((i, &l)) =
        labels.iter().enumerate().find(|(_, &l)| !(l >= 0.0 && l < classes as f64 && l.fract() == 0.0))
    {
        return Err(invalid("labels", format!("label {l} at index {i} is not in 0..{classes}")));
    }
    let n = labels.len();
    let alpha =
        DMatrix::from_fn(
            n,
            classes,
            |i, c| if labels[i] as usize == c { 1.0 + alpha_eps } else { alpha_eps },
        );
    let var = alpha.map(|a| (1.0 / a + 1.0).ln());
    let y = DMatrix::from_fn(n, classes, |i, c| alpha[(i, c)].ln() - var[(i, c)] / 2.0);
    Ok((y, var))
}

/// Fits a kernel shared by `C` independent per-class GPs on the Milios et al. targets by
/// maximising `Σ_c log p(ỹ_c | X)` with Adam (noise fixed by the transform; prior mean per
/// class: the mean of its targets). Returns the kernel and the summed log marginal likelihood.
pub fn fit_dirichlet_hyperparameters<K: Kernel + Clone>(
    kernel: &K,
    x: &DMatrix<f64>,
    labels: &DVector<f64>,
    classes: usize,
    alpha_eps: f64,
    config: &FitConfig,
) -> Result<(K, f64)> {
    let (y, var) = dirichlet_targets(labels, classes, alpha_eps)?;
    let total = |k: &K, with_grad: bool| -> Result<(f64, DVector<f64>)> {
        // One Gram matrix and one pass of kernel derivatives serve every class (the classes
        // differ in targets and noise only); each class's numbers are those of its own fit.
        let gram_xx = gram(k, x, x)?;
        let gps = (0..classes)
            .map(|c| {
                let yc = y.column(c).into_owned();
                let mean = PriorMean::Constant(yc.mean());
                let noise = Noise::PerPoint(var.column(c).into_owned());
                let yc = DMatrix::from_column_slice(yc.len(), 1, yc.as_slice());
                ExactGp::fit_with_gram(k.clone(), mean, noise, x, &yc, gram_xx.clone())
            })
            .collect::<Result<Vec<_>>>()?;
        let mut lml = 0.0;
        let mut grad = DVector::zeros(k.n_params());
        for gp in &gps {
            lml += gp.log_marginal_likelihood();
        }
        if with_grad {
            for g in ExactGp::lml_gradients(&gps)? {
                grad += g;
            }
        }
        Ok((lml, grad))
    };
    let mut theta = DVector::from_vec(kernel.params());
    let mut adam = Adam::new(theta.len(), config.learning_rate);
    let mut current = kernel.clone();
    for _ in 0..config.iterations {
        let (_, g) = total(&current, true)?;
        if g.iter().any(|v| !v.is_finite()) {
            return Err(GpError::Diverged("non-finite Dirichlet LML gradient".into()));
        }
        adam.ascend(&mut theta, &g);
        current.set_params(theta.as_slice())?;
    }
    let (lml, _) = total(&current, false)?;
    Ok((current, lml))
}

/// Saves the kernel, the training inputs and the Laplace factors. The kernel is saved through serde (the library's kernels derive it; a boxed
/// kernel goes through its `KernelSpec`).
impl<K: Kernel + serde::Serialize + serde::de::DeserializeOwned> fspace_core::Persist
    for LaplaceGpClassifier<K>
{
    const KIND: &'static str = "fspace_gp::LaplaceGpClassifier";
    const VERSION: u32 = 1;

    fn validate_loaded(&self) -> std::result::Result<(), fspace_core::PersistError> {
        let check = crate::error::check_loaded_kernel_and_inputs(Self::KIND, &self.kernel, "x", &self.x)?;
        let n = self.x.nrows();
        check.len("grad_log_lik", self.grad_log_lik.len(), n)?;
        check.finite("grad_log_lik", self.grad_log_lik.iter())?;
        check.len("sqrt_w", self.sqrt_w.len(), n)?;
        check.non_negative("sqrt_w", self.sqrt_w.iter())?;
        check.shape("b_chol", (self.b_chol.dim(), self.b_chol.dim()), (n, n))?;
        check.finite("log_marginal", [self.log_marginal].iter())
    }
}
