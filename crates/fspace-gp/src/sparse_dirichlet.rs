//! Sparse Dirichlet-based GP classification (Milios, Camoriano, Michiardi, Rosasco & Filippone
//! 2018): each class's labels become regression targets `ỹ_c` with per-point noise `σ̃²_c`
//! ([`dirichlet_targets`]), and `C` independent sparse GPs sharing one kernel and inducing
//! inputs `Z` (`M` points) regress them. With the hyperparameters fixed, the optimal Gaussian
//! `q(u_c)` of the collapsed variational bound (Titsias 2009, heteroscedastic noise
//! `Λ_c = diag σ̃²_c`) is closed form:
//!
//! `Σ_c = K_mm + K_mn Λ_c⁻¹ K_nm`,
//! `E f_c(x*) = μ_c + k_*m Σ_c⁻¹ K_mn Λ_c⁻¹ (ỹ_c − μ_c)`,
//! `Var f_c(x*) = k_** − k_*m K_mm⁻¹ k_m* + k_*m Σ_c⁻¹ k_m*`.
//!
//! With `Z = X` this is the exact heteroscedastic GP (tested). Cost: `O(n M d)` for `K_nm`,
//! `O(C n M²)` for the `C` matrices `K_mn Λ_c⁻¹ K_nm`, memory `O(n M + C M²)`; no `n × n` matrix.
//! Class probabilities: the mean softmax of samples of the latent `f` (the latents approximate
//! log-Gamma variables, so `softmax(f)` is the Dirichlet mean), e.g. with
//! [`fspace_core::class_probabilities`] on [`Posterior::predict`]'s marginals.

use fspace_core::{FunctionPredictive, Posterior};
use fspace_kernels::{gram, gram_diag, IntoScalarKernel, Kernel};
use fspace_linalg::{cholesky_jitter_owned, JitterConfig, JitteredCholesky};
use nalgebra::{DMatrix, DVector};

use crate::classification::dirichlet_targets;
use crate::error::{invalid, Result};
use crate::exact::to_core;

/// The predictive pieces at test inputs.
struct Latent {
    /// Means `n × C`.
    mean: DMatrix<f64>,
    /// `L_Σc⁻¹ K_m*` per class (`M × n`).
    v_c: Vec<DMatrix<f64>>,
    /// `L_mm⁻¹ K_m*` (`M × n`).
    v_mm: DMatrix<f64>,
}

/// `C` sparse heteroscedastic GPs on Milios et al.'s targets, sharing a kernel and `Z`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct SparseDirichletGp<K> {
    kernel: K,
    z: DMatrix<f64>,
    /// Per-class prior mean `μ_c` (the mean of its targets, as in the marginal-likelihood fit).
    means: DVector<f64>,
    kmm: JitteredCholesky,
    /// `Σ_c` per class.
    sigma: Vec<JitteredCholesky>,
    /// `Σ_c⁻¹ K_mn Λ_c⁻¹ (ỹ_c − μ_c)` as columns (`M × C`).
    weights: DMatrix<f64>,
}

/// Settings of [`fit`].
#[derive(Debug, Clone, PartialEq)]
pub struct SparseDirichletConfig {
    /// The inducing inputs: k-means centres of the training inputs (default 100 points, 20
    /// iterations) or given.
    pub inducing: crate::InducingPoints,
    /// Milios et al.'s `α_ε` (0.01, their suggestion).
    pub alpha_eps: f64,
    /// Seed of the k-means initialisation.
    pub seed: u64,
}

impl Default for SparseDirichletConfig {
    fn default() -> Self {
        Self {
            inducing: crate::InducingPoints::KMeans { points: 100, iterations: 20 },
            alpha_eps: 0.01,
            seed: 0,
        }
    }
}

/// What [`fit`] did.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SparseDirichletReport {
    /// Inducing inputs used.
    pub inducing_points: usize,
    /// Wall time (s).
    pub seconds: f64,
}

/// The sparse Dirichlet-based GP classifier — the model's one entry point, in the workspace's
/// call shape: `C` sparse GPs sharing the zero-mean scalar `prior`'s kernel (used as given; the
/// posterior owns a copy, [`IntoScalarKernel`]) and the inducing inputs of `config.inducing`,
/// fitted to labels `n × 1` in `0..C` under `Categorical { classes: C }`; each class's prior
/// mean is set from its transformed targets, as in the marginal-likelihood fit. Refused with
/// a typed error: another likelihood, a non-zero prior mean, several target columns and a
/// validation set.
pub fn fit<K: IntoScalarKernel>(
    likelihood: fspace_core::LikelihoodSpec,
    prior: &fspace_kernels::GpPrior<K>,
    data: &fspace_core::Data,
    config: &SparseDirichletConfig,
) -> Result<fspace_core::Fitted<SparseDirichletGp<K::Scalar>, SparseDirichletReport>> {
    let start = std::time::Instant::now();
    let classes = match likelihood {
        fspace_core::LikelihoodSpec::Categorical { classes } => classes,
        other => return Err(other.unsupported("the sparse Dirichlet GP classifier").into()),
    };
    crate::classification::check_classifier_inputs(&prior.mean, data, "the sparse Dirichlet GP classifier")?;
    let kernel = crate::svgp::scalar_prior_kernel(prior, "the sparse Dirichlet GP classifier")?;
    let x = data.x();
    let z = config.inducing.resolve(x, config.seed)?;
    let labels = data.y().column(0).into_owned();
    let posterior = SparseDirichletGp::fit(kernel, z, x, &labels, classes, config.alpha_eps)?;
    let report = SparseDirichletReport {
        inducing_points: posterior.inducing_points().nrows(),
        seconds: start.elapsed().as_secs_f64(),
    };
    Ok(fspace_core::Fitted { posterior, report })
}

impl<K: Kernel + Clone> SparseDirichletGp<K> {
    /// Fits the model to `labels` (`0..classes`) at the rows of `x` with inducing inputs `z`
    /// and Milios et al.'s `alpha_eps` (they suggest 0.01). The kernel is used as given (fit it
    /// first with [`fit_dirichlet_hyperparameters`](crate::fit_dirichlet_hyperparameters));
    /// the public entry is [`fit`].
    pub(crate) fn fit(
        kernel: K,
        z: DMatrix<f64>,
        x: &DMatrix<f64>,
        labels: &DVector<f64>,
        classes: usize,
        alpha_eps: f64,
    ) -> Result<Self> {
        if x.nrows() == 0 || x.nrows() != labels.len() {
            return Err(invalid("training data", format!("{} inputs vs {} labels", x.nrows(), labels.len())));
        }
        if z.nrows() == 0 || z.ncols() != x.ncols() {
            return Err(invalid(
                "inducing points",
                format!("{} × {} for inputs with {} columns (need ≥ 1 row)", z.nrows(), z.ncols(), x.ncols()),
            ));
        }
        if z.nrows() > x.nrows() {
            // As the SVGP: a sparse model with more inducing points than data is a mistake.
            return Err(invalid(
                "inducing points",
                format!(
                    "{} inducing points for {} data points (at most one per point)",
                    z.nrows(),
                    x.nrows()
                ),
            ));
        }
        let (targets, noise) = dirichlet_targets(labels, classes, alpha_eps)?;
        let kmm = cholesky_jitter_owned(gram(&kernel, &z, &z)?, &JitterConfig::default())?;
        let knm = gram(&kernel, x, &z)?; // n × M
        let n = x.nrows() as f64;
        let means = DVector::from_fn(classes, |c, _| targets.column(c).sum() / n);
        let kmm_dense = kmm.l() * kmm.l().transpose();
        let mut sigma = Vec::with_capacity(classes);
        let mut weights = DMatrix::zeros(z.nrows(), classes);
        let mut scaled = knm.clone(); // one n × M buffer, refilled per class
        for c in 0..classes {
            // K_mn Λ_c⁻¹ K_nm through the rows scaled by Λ_c^{-1/2}.
            scaled.copy_from(&knm);
            let mut rhs = DVector::zeros(x.nrows());
            for i in 0..x.nrows() {
                let w = 1.0 / noise[(i, c)];
                scaled.row_mut(i).scale_mut(w.sqrt());
                rhs[i] = w * (targets[(i, c)] - means[c]);
            }
            let s = &kmm_dense + fspace_linalg::fast::gram(&scaled);
            let chol = cholesky_jitter_owned((&s + s.transpose()) * 0.5, &JitterConfig::default())?;
            weights.set_column(c, &chol.solve_vec(&knm.tr_mul(&rhs))?);
            sigma.push(chol);
        }
        Ok(Self { kernel, z, means, kmm, sigma, weights })
    }

    /// The kernel.
    pub fn kernel(&self) -> &K {
        &self.kernel
    }
    /// The inducing inputs.
    pub fn inducing_points(&self) -> &DMatrix<f64> {
        &self.z
    }
    /// Number of classes `C`.
    pub fn classes(&self) -> usize {
        self.means.len()
    }

    fn check_inputs(&self, xs: &DMatrix<f64>) -> Result<()> {
        if xs.ncols() != self.z.ncols() {
            return Err(invalid(
                "inputs",
                format!("{} columns, inducing points have {}", xs.ncols(), self.z.ncols()),
            ));
        }
        Ok(())
    }

    /// Means `n × C` and, per class, `L_Σc⁻¹ K_m*` (`M × n`), with `L_mm⁻¹ K_m*`.
    fn latent(&self, xs: &DMatrix<f64>) -> Result<Latent> {
        self.check_inputs(xs)?;
        let ksm = gram(&self.kernel, xs, &self.z)?; // n × M
        let mut mean = &ksm * &self.weights;
        for (c, mu) in self.means.iter().enumerate() {
            mean.column_mut(c).add_scalar_mut(*mu);
        }
        let kms = ksm.transpose();
        let v_mm = self.kmm.solve_lower(&kms)?;
        let v_c =
            self.sigma.iter().map(|s| s.solve_lower(&kms)).collect::<std::result::Result<Vec<_>, _>>()?;
        Ok(Latent { mean, v_c, v_mm })
    }
}

impl<K: Kernel + Clone> Posterior for SparseDirichletGp<K> {
    fn output_dim(&self) -> usize {
        self.classes()
    }
    /// Categorical over the `C` latent GPs: Milios et al.'s class probabilities are the
    /// expected softmax of the latents, which [`Link::MonteCarlo`](fspace_core::Link) estimates
    /// and the probit and bridge links approximate.
    fn likelihood(&self) -> Option<fspace_core::LikelihoodSpec> {
        Some(fspace_core::LikelihoodSpec::categorical(self.classes()))
    }

    fn predict(&self, xs: &DMatrix<f64>) -> fspace_core::Result<FunctionPredictive> {
        let run = || -> Result<FunctionPredictive> {
            let Latent { mean, v_c, v_mm } = self.latent(xs)?;
            let prior = gram_diag(&self.kernel, xs)?;
            let nystrom = DVector::from_fn(xs.nrows(), |i, _| v_mm.column(i).norm_squared());
            let var = DMatrix::from_fn(xs.nrows(), self.classes(), |i, c| {
                fspace_core::clip_rounding(prior[i] - nystrom[i] + v_c[c].column(i).norm_squared())
            });
            Ok(FunctionPredictive::new(mean, var)?)
        };
        run().map_err(to_core)
    }

    /// Point-major joint covariance: classes are independent, each block
    /// `K_** − K_*m K_mm⁻¹ K_m* + K_*m Σ_c⁻¹ K_m*`.
    fn predict_joint(&self, xs: &DMatrix<f64>) -> fspace_core::Result<(DMatrix<f64>, DMatrix<f64>)> {
        fspace_core::ensure_joint_fits(xs.nrows(), fspace_core::Posterior::output_dim(self))?;
        let run = || -> Result<(DMatrix<f64>, DMatrix<f64>)> {
            let Latent { mean, v_c, v_mm } = self.latent(xs)?;
            let base = gram(&self.kernel, xs, xs)? - v_mm.transpose() * &v_mm;
            let (n, q) = (xs.nrows(), self.classes());
            let mut cov = DMatrix::zeros(n * q, n * q);
            for (c, v) in v_c.iter().enumerate() {
                let block = &base + v.transpose() * v;
                for i in 0..n {
                    for j in 0..n {
                        cov[(i * q + c, j * q + c)] = 0.5 * (block[(i, j)] + block[(j, i)]);
                    }
                }
            }
            Ok((mean, cov))
        };
        let (mean, cov) = run().map_err(to_core)?;
        fspace_core::checked_joint(mean, cov)
    }
}

/// Saves the kernel, `Z`, the class means and the factors. The kernel is saved through serde (the library's kernels derive it; a boxed
/// kernel goes through its `KernelSpec`).
impl<K: Kernel + Clone + serde::Serialize + serde::de::DeserializeOwned> fspace_core::Persist
    for SparseDirichletGp<K>
{
    const KIND: &'static str = "fspace_gp::SparseDirichletGp";
    const VERSION: u32 = 1;

    fn validate_loaded(&self) -> std::result::Result<(), fspace_core::PersistError> {
        let check = crate::error::check_loaded_kernel_and_inputs(Self::KIND, &self.kernel, "z", &self.z)?;
        let (m, c) = (self.z.nrows(), self.means.len());
        check.ensure(c >= 2, "means", || format!("has {c} classes, need ≥ 2"))?;
        check.finite("means", self.means.iter())?;
        check.shape("kmm", (self.kmm.dim(), self.kmm.dim()), (m, m))?;
        check.len("sigma", self.sigma.len(), c)?;
        for s in &self.sigma {
            check.shape("sigma", (s.dim(), s.dim()), (m, m))?;
        }
        check.shape("weights", self.weights.shape(), (m, c))?;
        check.finite("weights", self.weights.iter())
    }
}
