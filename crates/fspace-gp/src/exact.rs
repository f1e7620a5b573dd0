//! Exact GP regression: posterior, log marginal likelihood and its analytic gradient.
//!
//! With `K_y = K(X, X) + Σ_noise` (Σ_noise = σ²I or a per-point diagonal), `r = y − μ(X)`,
//! `α = K_y⁻¹ r` and `K_y = LLᵀ`:
//!
//! * posterior mean `μ(x*) + K(x*, X) α`, covariance `K(x*, x*) − VᵀV` with `V = L⁻¹ K(X, x*)`;
//! * `log p(y) = −½ rᵀα − Σᵢ log Lᵢᵢ − (N/2) log 2π`;
//! * `∂ log p(y)/∂θⱼ = ½ tr((ααᵀ − K_y⁻¹) ∂K_y/∂θⱼ)` for every log-hyperparameter (the kernel's,
//!   then `log σ²` for homoscedastic noise), contracted entry by entry so the `P` gradient
//!   matrices are never stored.
//!
//! Multi-output and matrix-valued kernels (Helmholtz) work unchanged: targets are `n × d'`,
//! flattened point-major.

use fspace_core::{FunctionPredictive, Posterior};
use fspace_kernels::{gram, gram_diag, MatrixKernel, PointSet, PriorMean};
use fspace_linalg::{cholesky_jitter_owned, JitterConfig, JitteredCholesky};
use nalgebra::{DMatrix, DVector};
use rayon::prelude::*;

use crate::error::{invalid, point_major, unflatten, Result};

/// Observation noise of a GP regression model.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum Noise {
    /// `σ² I` with `σ² > 0` (learnable: its log is the last hyperparameter).
    Homoscedastic(f64),
    /// A fixed variance per observation (`n·d'` values, point-major), e.g. the Milios et al.
    /// label transform.
    PerPoint(DVector<f64>),
}

/// An exact GP regression posterior.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct ExactGp<K> {
    kernel: K,
    mean: PriorMean,
    noise: Noise,
    x: DMatrix<f64>,
    residual: DVector<f64>,
    chol: JitteredCholesky,
    alpha: DVector<f64>,
}

impl<K: MatrixKernel> ExactGp<K> {
    /// Conditions the prior `GP(mean, kernel)` on `y` (`n × d'`) at the rows of `x` (`n × d`)
    /// (the public entry is [`fit`]; per-point noise serves the Milios et al. targets).
    /// Errors: empty, non-finite or mis-shaped inputs, invalid noise, and a `K_y` that stays
    /// non-positive-definite after the jitter schedule (the jitter used is reported by
    /// [`jitter`](Self::jitter)).
    pub(crate) fn fit(
        kernel: K,
        mean: PriorMean,
        noise: Noise,
        x: &DMatrix<f64>,
        y: &DMatrix<f64>,
    ) -> Result<Self> {
        Self::check(&kernel, &noise, x, y)?;
        let k = gram(&kernel, x, x)?;
        Self::fit_checked(kernel, mean, noise, x, y, k)
    }

    /// [`fit`](Self::fit) with `K(X, X)` given: models of one kernel at the same inputs (the
    /// per-class GPs of [`crate::fit_dirichlet_hyperparameters`]) compute it once. `k` must be
    /// `gram(&kernel, x, x)`.
    pub(crate) fn fit_with_gram(
        kernel: K,
        mean: PriorMean,
        noise: Noise,
        x: &DMatrix<f64>,
        y: &DMatrix<f64>,
        k: DMatrix<f64>,
    ) -> Result<Self> {
        Self::check(&kernel, &noise, x, y)?;
        let n = x.nrows() * kernel.output_dim();
        if k.shape() != (n, n) {
            return Err(invalid("Gram matrix", format!("need {n} × {n}, got {} × {}", k.nrows(), k.ncols())));
        }
        Self::fit_checked(kernel, mean, noise, x, y, k)
    }

    /// The targets' shape and values and the noise model's variances.
    fn check(kernel: &K, noise: &Noise, x: &DMatrix<f64>, y: &DMatrix<f64>) -> Result<()> {
        let q = kernel.output_dim();
        if y.ncols() != q || y.nrows() != x.nrows() {
            return Err(invalid(
                "targets",
                format!("need {} × {q}, got {} × {}", x.nrows(), y.nrows(), y.ncols()),
            ));
        }
        if y.iter().any(|v| !v.is_finite()) {
            return Err(invalid("targets", "contain NaN or ±∞"));
        }
        let n = x.nrows() * q;
        match noise {
            Noise::Homoscedastic(s2) if !(s2.is_finite() && *s2 > 0.0) => {
                Err(invalid("noise variance", format!("{s2} must be > 0")))
            }
            Noise::PerPoint(v) if v.len() != n || v.iter().any(|s| !(s.is_finite() && *s > 0.0)) => {
                Err(invalid("per-point noise", format!("need {n} positive finite variances")))
            }
            _ => Ok(()),
        }
    }

    fn fit_checked(
        kernel: K,
        mean: PriorMean,
        noise: Noise,
        x: &DMatrix<f64>,
        y: &DMatrix<f64>,
        mut k: DMatrix<f64>,
    ) -> Result<Self> {
        let (q, n) = (kernel.output_dim(), k.nrows());
        match &noise {
            Noise::Homoscedastic(s2) => (0..n).for_each(|i| k[(i, i)] += s2),
            Noise::PerPoint(v) => (0..n).for_each(|i| k[(i, i)] += v[i]),
        }
        let chol = cholesky_jitter_owned(k, &JitterConfig::default())?;
        let residual = point_major(y) - mean.evaluate(x, q)?;
        let alpha = chol.solve_vec(&residual)?;
        Ok(Self { kernel, mean, noise, x: x.clone(), residual, chol, alpha })
    }

    /// The kernel.
    pub fn kernel(&self) -> &K {
        &self.kernel
    }
    /// The noise model.
    pub fn noise(&self) -> &Noise {
        &self.noise
    }
    /// Jitter added to `K_y` by the Cholesky (0 if none).
    pub fn jitter(&self) -> f64 {
        self.chol.jitter()
    }

    /// `log p(y | X, θ)`.
    pub fn log_marginal_likelihood(&self) -> f64 {
        let n = self.residual.len() as f64;
        -0.5 * self.residual.dot(&self.alpha)
            - 0.5 * self.chol.log_det()
            - 0.5 * n * (std::f64::consts::TAU).ln()
    }

    /// `∂ log p(y)/∂θ` for the kernel's log-hyperparameters followed, for homoscedastic noise,
    /// by `∂/∂ log σ²`.
    pub fn lml_gradient(&self) -> Result<DVector<f64>> {
        Ok(Self::lml_gradients(std::slice::from_ref(self))?.remove(0))
    }

    /// [`lml_gradient`](Self::lml_gradient) of several models that share the kernel (same
    /// hyperparameters) and the inputs, differing in targets, mean or noise: each kernel
    /// derivative `∂K_ab/∂θ` is evaluated once for all of them. Every model's gradient is
    /// summed in the order `lml_gradient` sums it alone, so the numbers are the same.
    pub(crate) fn lml_gradients(gps: &[Self]) -> Result<Vec<DVector<f64>>> {
        let Some(first) = gps.first() else { return Ok(Vec::new()) };
        let ws = gps
            .iter()
            .map(|gp| {
                let n = gp.residual.len();
                let k_inv = gp.chol.solve(&DMatrix::identity(n, n))?;
                Ok(&gp.alpha * gp.alpha.transpose() - k_inv)
            })
            .collect::<Result<Vec<DMatrix<f64>>>>()?;
        let np = first.kernel.n_params();
        let q = first.kernel.output_dim();
        let pts = PointSet::new("training inputs", &first.x)?;
        // ½ Σ_ab W_ab ∂K_ab/∂θ, accumulated row by row in parallel.
        let per_row: Vec<Vec<Vec<f64>>> = (0..pts.len())
            .into_par_iter()
            .map(|i| {
                let mut g = vec![0.0; np * q * q];
                let mut acc = vec![vec![0.0; np]; ws.len()];
                for j in 0..pts.len() {
                    first.kernel.eval_block_grad(pts.row(i), pts.row(j), &mut g);
                    for (acc, w) in acc.iter_mut().zip(&ws) {
                        for p in 0..np {
                            for a in 0..q {
                                for b in 0..q {
                                    acc[p] += w[(i * q + a, j * q + b)] * g[p * q * q + a * q + b];
                                }
                            }
                        }
                    }
                }
                acc
            })
            .collect();
        Ok(gps
            .iter()
            .zip(&ws)
            .enumerate()
            .map(|(m, (gp, w))| {
                // Summed in row order, not by rayon's `reduce` (whose association depends on
                // work stealing): the same inputs give bit-identical gradients.
                let grad_k = per_row
                    .iter()
                    .fold(vec![0.0; np], |a, b| a.iter().zip(&b[m]).map(|(x, y)| x + y).collect());
                let mut grad: Vec<f64> = grad_k.into_iter().map(|g| 0.5 * g).collect();
                if let Noise::Homoscedastic(s2) = gp.noise {
                    grad.push(0.5 * s2 * w.trace());
                }
                DVector::from_vec(grad)
            })
            .collect())
    }

    fn cross(&self, xs: &DMatrix<f64>) -> Result<(DMatrix<f64>, DMatrix<f64>)> {
        let k_xs = gram(&self.kernel, &self.x, xs)?; // N × M
        let v = self.chol.solve_lower(&k_xs)?;
        Ok((k_xs, v))
    }

    fn mean_at(&self, xs: &DMatrix<f64>, k_xs: &DMatrix<f64>) -> Result<DMatrix<f64>> {
        let q = self.kernel.output_dim();
        let m = self.mean.evaluate(xs, q)? + k_xs.tr_mul(&self.alpha);
        Ok(unflatten(&m, q))
    }
}

impl<K: MatrixKernel> Posterior for ExactGp<K> {
    fn output_dim(&self) -> usize {
        self.kernel.output_dim()
    }
    /// `Gaussian` / `IsotropicGaussian` with the homoscedastic σ; `None` for per-point noise
    /// (it has no value at new inputs, so the GP has no predictive of `y` there).
    fn likelihood(&self) -> Option<fspace_core::LikelihoodSpec> {
        use fspace_core::LikelihoodSpec;
        match &self.noise {
            Noise::Homoscedastic(var) => {
                Some(LikelihoodSpec::gaussian_outputs(var.sqrt(), self.kernel.output_dim()))
            }
            Noise::PerPoint(_) => None,
        }
    }

    fn predict(&self, xs: &DMatrix<f64>) -> Result<FunctionPredictive, fspace_core::CoreError> {
        let run = || -> Result<FunctionPredictive> {
            let (k_xs, v) = self.cross(xs)?;
            let prior = gram_diag(&self.kernel, xs)?;
            let var = posterior_variances(&prior, |j| v.column(j).norm_squared());
            Ok(FunctionPredictive::new(self.mean_at(xs, &k_xs)?, unflatten(&var, self.kernel.output_dim()))?)
        };
        run().map_err(to_core)
    }

    fn predict_joint(
        &self,
        xs: &DMatrix<f64>,
    ) -> Result<(DMatrix<f64>, DMatrix<f64>), fspace_core::CoreError> {
        fspace_core::ensure_joint_fits(xs.nrows(), fspace_core::Posterior::output_dim(self))?;
        let run = || -> Result<(DMatrix<f64>, DMatrix<f64>)> {
            let (k_xs, v) = self.cross(xs)?;
            let cov = gram(&self.kernel, xs, xs)? - v.transpose() * &v; // blocked GEMM (`tr_mul` is unblocked)
            Ok((self.mean_at(xs, &k_xs)?, symmetrised(&cov)))
        };
        let (mean, cov) = run().map_err(to_core)?;
        fspace_core::checked_joint(mean, cov)
    }
}

/// Marginal variances `diag K(X*, X*) − reductionᵢ`, clamped at 0 (rounding can push a
/// variance that is exactly zero in theory slightly below it).
pub(crate) fn posterior_variances(prior: &DVector<f64>, reduction: impl Fn(usize) -> f64) -> DVector<f64> {
    DVector::from_fn(prior.len(), |i, _| fspace_core::clip_rounding(prior[i] - reduction(i)))
}

/// A scalar-output predictive from mean and variance vectors.
pub(crate) fn scalar_predictive(mean: &DVector<f64>, var: &DVector<f64>) -> Result<FunctionPredictive> {
    Ok(FunctionPredictive::new(
        DMatrix::from_column_slice(mean.len(), 1, mean.as_slice()),
        DMatrix::from_column_slice(var.len(), 1, var.as_slice()),
    )?)
}

/// `½(C + Cᵀ)`: joint covariances assembled from differences are symmetric only to rounding.
pub(crate) fn symmetrised(cov: &DMatrix<f64>) -> DMatrix<f64> {
    (cov + cov.transpose()) * 0.5
}

/// Maps a GP error into the `Posterior` contract's error type, keeping the message.
pub(crate) fn to_core(e: crate::GpError) -> fspace_core::CoreError {
    match e {
        crate::GpError::Core(c) => c,
        other => fspace_core::CoreError::method("gp posterior", other),
    }
}

/// Saves the kernel, the mean, the noise, the training inputs and the factorisation. The kernel is saved through serde (the library's kernels derive it; a boxed
/// kernel goes through its `KernelSpec`).
impl<K: MatrixKernel + serde::Serialize + serde::de::DeserializeOwned> fspace_core::Persist for ExactGp<K> {
    const KIND: &'static str = "fspace_gp::ExactGp";
    const VERSION: u32 = 1;

    fn validate_loaded(&self) -> std::result::Result<(), fspace_core::PersistError> {
        let check = crate::error::check_loaded_kernel_and_inputs(Self::KIND, &self.kernel, "x", &self.x)?;
        let q = self.kernel.output_dim();
        check.ensure(q >= 1, "kernel", || "must have ≥ 1 output".into())?;
        let n = self.x.nrows().saturating_mul(q);
        check.len("residual", self.residual.len(), n)?;
        check.finite("residual", self.residual.iter())?;
        check.len("alpha", self.alpha.len(), n)?;
        check.finite("alpha", self.alpha.iter())?;
        check.shape("chol", (self.chol.dim(), self.chol.dim()), (n, n))?;
        match &self.noise {
            Noise::Homoscedastic(s2) => check.positive("noise", *s2),
            Noise::PerPoint(v) => {
                check.len("noise", v.len(), n)?;
                v.iter().try_for_each(|s| check.positive("noise", *s))
            }
        }?;
        crate::error::check_loaded_mean(&check, &self.mean)
    }
}

/// What [`fit`] did.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ExactGpReport {
    /// `log p(y | X)` of the training targets.
    pub log_marginal_likelihood: f64,
    /// Jitter the Cholesky of `K + σ²I` needed (0 if none).
    pub jitter: f64,
    /// Wall-clock seconds.
    pub seconds: f64,
}

/// The exact GP regression posterior — the model's one entry point, in the workspace's call
/// shape: `prior` conditioned on `data` (targets `n × d'`) under a `Gaussian` (one output) or
/// `IsotropicGaussian` likelihood with the given σ. The posterior holds the prior's kernel type
/// `K` ([`GpPrior::with_kernel`](fspace_kernels::GpPrior::with_kernel) keeps a concrete one;
/// the default is the shared kernel). The prior's hyperparameters are taken as given; a
/// likelihood that asks to learn σ is refused — fit σ and the kernel together with
/// [`fit_hyperparameters`](crate::fit_hyperparameters) first, as the papers' protocols do. A
/// validation set is refused (conditioning does not use one).
pub fn fit<K: MatrixKernel + Clone>(
    likelihood: fspace_core::LikelihoodSpec,
    prior: &fspace_kernels::GpPrior<K>,
    data: &fspace_core::Data,
) -> Result<fspace_core::Fitted<ExactGp<K>, ExactGpReport>> {
    use fspace_core::LikelihoodSpec;
    let start = std::time::Instant::now();
    likelihood.validate()?;
    if data.validation().is_some() {
        return Err(invalid("validation data", "the exact GP does not use a validation set; leave it out"));
    }
    let sigma = match likelihood {
        LikelihoodSpec::Gaussian { sigma, learn: false }
        | LikelihoodSpec::IsotropicGaussian { sigma, learn: false, .. } => sigma,
        LikelihoodSpec::Gaussian { .. } | LikelihoodSpec::IsotropicGaussian { .. } => {
            return Err(invalid(
                "likelihood",
                "the exact GP takes σ as given; learn it with the kernel by fit_hyperparameters",
            ))
        }
        other => return Err(other.unsupported("exact GP regression").into()),
    };
    if likelihood.output_dim() != prior.output_dim() {
        return Err(invalid(
            "likelihood",
            format!("{} outputs for a prior with {}", likelihood.output_dim(), prior.output_dim()),
        ));
    }
    let gp = ExactGp::fit(
        prior.kernel.clone(),
        prior.mean.clone(),
        Noise::Homoscedastic(sigma * sigma),
        data.x(),
        data.y(),
    )?;
    let report = ExactGpReport {
        log_marginal_likelihood: gp.log_marginal_likelihood(),
        jitter: gp.jitter(),
        seconds: start.elapsed().as_secs_f64(),
    };
    Ok(fspace_core::Fitted { posterior: gp, report })
}

#[cfg(test)]
mod tests {
    use super::*;
    use fspace_kernels::Matern32;

    #[test]
    fn gradients_sharing_the_kernel_pass_are_each_models_own_bits() {
        let x = DMatrix::from_fn(23, 3, |i, j| ((i * 7 + j * 3) % 11) as f64 / 5.0 - 1.0);
        let kernel = Matern32::new(1.3, 0.8).unwrap();
        let models: Vec<(DMatrix<f64>, PriorMean, Noise)> = (0..3)
            .map(|c| {
                let y = DMatrix::from_fn(23, 1, |i, _| ((i + c) as f64 * 0.37).sin());
                let noise = DVector::from_fn(23, |i, _| 0.05 + 0.01 * ((i + 2 * c) % 5) as f64);
                (y, PriorMean::Constant(0.1 * c as f64), Noise::PerPoint(noise))
            })
            .collect();
        let k = gram(&kernel, &x, &x).unwrap();
        let gps: Vec<ExactGp<Matern32>> = models
            .iter()
            .map(|(y, m, n)| {
                ExactGp::fit_with_gram(kernel.clone(), m.clone(), n.clone(), &x, y, k.clone()).unwrap()
            })
            .collect();
        let shared = ExactGp::lml_gradients(&gps).unwrap();
        for ((y, m, n), (gp, g)) in models.iter().zip(gps.iter().zip(&shared)) {
            let alone = ExactGp::fit(kernel.clone(), m.clone(), n.clone(), &x, y).unwrap();
            assert_eq!(alone.lml_gradient().unwrap(), *g);
            assert_eq!(alone.log_marginal_likelihood(), gp.log_marginal_likelihood());
        }
        let bad = ExactGp::fit_with_gram(
            kernel.clone(),
            PriorMean::Zero,
            Noise::Homoscedastic(0.1),
            &x,
            &DMatrix::zeros(23, 1),
            DMatrix::zeros(22, 22),
        );
        assert!(bad.unwrap_err().to_string().contains("Gram matrix"));
    }
}
