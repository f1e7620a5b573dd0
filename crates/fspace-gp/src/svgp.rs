//! Sparse variational GP regression (Hensman, Fusi & Lawrence 2013) with minibatches.
//!
//! Inducing inputs `Z` (`M × d`, initialised by [`kmeans`](crate::kmeans())), `q(u) = N(m, S)`
//! over `u = f(Z)`, and `A = K_bm K_mm⁻¹` for a minibatch `b` of size `B` out of `n`:
//!
//! `ELBO = (n/B) Σ_{i∈b} [log N(yᵢ | μᵢ + (Am)ᵢ, σ²) − (kᵢᵢ − (A K_mb)ᵢᵢ + (A S Aᵀ)ᵢᵢ)/2σ²] − KL(q(u) ‖ p(u))`.
//!
//! * `q(u)` follows natural-gradient steps (Hensman et al. 2013, §3.2): with step `ρ`,
//!   `S⁻¹ ← (1 − ρ) S⁻¹ + ρ (K_mm⁻¹ + (n/B) σ⁻² AᵀA)` and
//!   `S⁻¹m ← (1 − ρ) S⁻¹m + ρ (n/B) σ⁻² Aᵀ(y_b − μ_b)`. With `ρ = 1` on the full data this is
//!   the optimal `q(u)` (Titsias 2009), and with `Z = X` the exact GP.
//! * Kernel hyperparameters and `log σ²` follow Adam on the analytic ELBO gradient at fixed
//!   `q(u)`: `∂ELBO/∂θ = ⟨G_bm, ∂K_bm/∂θ⟩ + ⟨G_mm, ∂K_mm/∂θ⟩ + ⟨g, ∂diag K_bb/∂θ⟩` with
//!   `G_bm = (n/B)σ⁻² (r (K_mm⁻¹m)ᵀ + A − A S K_mm⁻¹)`,
//!   `G_mm = (n/B)σ⁻² (−(Aᵀr)(K_mm⁻¹m)ᵀ − ½AᵀA + AᵀA S K_mm⁻¹) + ½(K_mm⁻¹ S K_mm⁻¹ + K_mm⁻¹mmᵀK_mm⁻¹ − K_mm⁻¹)`,
//!   `g = −(n/B)/(2σ²)`, `r = y_b − μ_b − Am`.
//! * Optionally the inducing inputs too (`learn_inducing_points`, as GPflow and GPJax do by
//!   default), by Adam on the same contraction with `∂K/∂Z` from [`Kernel::eval_grad_x`]:
//!   `∂ELBO/∂z_a = Σ_i G_bm[i,a] ∂ₓk(z_a, xᵢ) + Σ_c (G_mm[a,c] + G_mm[c,a]) ∂ₓk(z_a, z_c)`.
//!   With `q(u)` at its optimum for `Z` this is the gradient of Titsias' collapsed bound
//!   (the envelope theorem), so moving `Z` tightens the bound on `log p(y)`.

use fspace_core::{FunctionPredictive, Posterior};
use fspace_kernels::{gram, gram_diag, IntoScalarKernel, Kernel, PointSet, PriorMean};
use fspace_linalg::{cholesky_jitter, cholesky_jitter_owned, JitterConfig, JitteredCholesky};
use nalgebra::{DMatrix, DVector};
use rand::rngs::StdRng;
use rand::seq::index::sample as sample_indices;
use rand::SeedableRng;

use crate::error::{invalid, GpError, Result};
use crate::exact::{posterior_variances, scalar_predictive, symmetrised, to_core};
use fspace_core::{Adam, Schedule, ScheduleRun};

/// Options of [`fit`].
///
/// | name | default | purpose |
/// |---|---|---|
/// | `batch_size` | 256 | minibatch size `B` |
/// | `schedule` | 500 steps | length in steps (one natural-gradient step on `q(u)` + one Adam step each) or epochs (`⌈n / B⌉` steps); SVGP has no validation set, so a patience is refused ([`Schedule`]) |
/// | `natural_step` | 0.2 | `ρ` of the natural-gradient update |
/// | `learning_rate` | 0.01 | Adam step for `log θ`, `log σ²` |
/// | `learn_hyperparameters` | true | whether Adam moves the kernel and noise |
/// | `learn_inducing_points` | false | whether Adam moves `Z` (same learning rate) |
/// | `inducing` | k-means, 100 points, 20 iterations | where [`fit`] puts `Z` |
/// | `seed` | 0 | minibatch order (and k-means) |
#[derive(Debug, Clone, PartialEq)]
pub struct SvgpConfig {
    /// Minibatch size.
    pub batch_size: usize,
    /// Training length (steps or epochs); no validation, so no patience.
    pub schedule: Schedule,
    /// Natural-gradient step size `ρ ∈ (0, 1]`.
    pub natural_step: f64,
    /// Adam learning rate for the hyperparameters.
    pub learning_rate: f64,
    /// Fit the kernel hyperparameters ([`fit`] learns the noise when the likelihood asks for
    /// it).
    pub learn_hyperparameters: bool,
    /// Move the inducing inputs by Adam on the ELBO (needs [`Kernel::eval_grad_x`]). Off by
    /// default so that `Z` stays where the caller put it (k-means centres in the harness).
    pub learn_inducing_points: bool,
    /// The initial inducing inputs.
    pub inducing: InducingPoints,
    /// Seed.
    pub seed: u64,
}

/// Where [`fit`] puts the inducing inputs.
#[derive(Debug, Clone, PartialEq)]
pub enum InducingPoints {
    /// `points` k-means centres of the training inputs (capped at `n`), `iterations` Lloyd
    /// steps, seeded by [`SvgpConfig::seed`].
    KMeans {
        /// `M`.
        points: usize,
        /// Lloyd iterations.
        iterations: usize,
    },
    /// These rows (`M × d`).
    Given(DMatrix<f64>),
}

impl InducingPoints {
    /// The inducing inputs for training inputs `x`: the k-means centres (seeded by `seed`), or
    /// a copy of the given rows.
    pub(crate) fn resolve(&self, x: &DMatrix<f64>, seed: u64) -> Result<DMatrix<f64>> {
        Ok(match self {
            Self::KMeans { points, iterations } => {
                crate::kmeans(x, (*points).min(x.nrows()), *iterations, seed)?
            }
            Self::Given(z) => z.clone(),
        })
    }
}

/// What [`fit`] reports besides the posterior.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SvgpReport {
    /// The full-data ELBO after training (a lower bound on `log p(y | X)`).
    pub elbo: f64,
    /// The fitted observation noise `σ`.
    pub noise_sigma: f64,
    /// Number of inducing points `M`.
    pub inducing_points: usize,
    /// Wall-clock seconds.
    pub seconds: f64,
}

impl Default for SvgpConfig {
    fn default() -> Self {
        Self {
            batch_size: 256,
            schedule: Schedule::steps(500),
            natural_step: 0.2,
            learning_rate: 0.01,
            learn_hyperparameters: true,
            learn_inducing_points: false,
            inducing: InducingPoints::KMeans { points: 100, iterations: 20 },
            seed: 0,
        }
    }
}

/// A sparse variational GP regression model (scalar output).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Svgp<K> {
    kernel: K,
    mean: PriorMean,
    noise_variance: f64,
    z: DMatrix<f64>,
    m: DVector<f64>,
    s: DMatrix<f64>,
}

/// The predictive pieces at test inputs: mean, the variance reduction `diag(A K_m*) −
/// diag(A S Aᵀ)`, `A = K_*m K_mm⁻¹` and `K_*m`.
struct Latent {
    mean: DVector<f64>,
    reduction: DVector<f64>,
    a: DMatrix<f64>,
    ksm: DMatrix<f64>,
}

/// Quantities shared by the ELBO, its gradient and the natural-gradient step on one batch.
struct Batch {
    kmm: JitteredCholesky,
    kmm_inv: DMatrix<f64>,
    kbm: DMatrix<f64>,
    a: DMatrix<f64>,
    ata: DMatrix<f64>, // AᵀA (blocked GEMM; `tr_mul` is unblocked)
    kdiag: DVector<f64>,
    centred: DVector<f64>, // y_b − μ_b (prior mean only)
    scale: f64,            // n / B
}

impl<K: Kernel + Clone> Svgp<K> {
    /// A model with inducing inputs `z` and `q(u) = p(u)`; `z` must be non-empty, finite and
    /// match the kernel's input dimension, `noise_variance > 0` (the public entry is [`fit`]).
    pub(crate) fn new(kernel: K, mean: PriorMean, noise_variance: f64, z: DMatrix<f64>) -> Result<Self> {
        if !(noise_variance.is_finite() && noise_variance > 0.0) {
            return Err(invalid("noise variance", format!("{noise_variance} must be > 0")));
        }
        let kmm = gram(&kernel, &z, &z)?;
        let m = DVector::zeros(z.nrows());
        Ok(Self { kernel, mean, noise_variance, z, m, s: kmm })
    }

    /// The kernel.
    pub fn kernel(&self) -> &K {
        &self.kernel
    }
    /// The noise variance σ².
    pub fn noise_variance(&self) -> f64 {
        self.noise_variance
    }
    /// The inducing inputs.
    pub fn inducing_points(&self) -> &DMatrix<f64> {
        &self.z
    }

    /// Moves the inducing inputs, keeping `q(u)` (the same `m`, `S` now describe `f(Z_new)`);
    /// `z` must have the current shape and finite entries.
    pub fn set_inducing_points(&mut self, z: DMatrix<f64>) -> Result<()> {
        if z.shape() != self.z.shape() {
            return Err(invalid(
                "inducing points",
                format!("shape {:?}, expected {:?}", z.shape(), self.z.shape()),
            ));
        }
        if z.iter().any(|v| !v.is_finite()) {
            return Err(invalid("inducing points", "contain NaN or ±∞"));
        }
        self.z = z;
        Ok(())
    }

    fn check_data(&self, x: &DMatrix<f64>, y: &DVector<f64>) -> Result<()> {
        if x.nrows() != y.len() || x.nrows() == 0 {
            return Err(invalid("training data", format!("{} inputs vs {} targets", x.nrows(), y.len())));
        }
        if y.iter().any(|v| !v.is_finite()) {
            return Err(invalid("targets", "contain NaN or ±∞"));
        }
        if x.ncols() != self.z.ncols() {
            return Err(invalid(
                "inputs",
                format!("{} columns, inducing points have {}", x.ncols(), self.z.ncols()),
            ));
        }
        Ok(())
    }

    fn batch(&self, x: &DMatrix<f64>, y: &DVector<f64>, n_total: usize) -> Result<Batch> {
        let kmm = cholesky_jitter_owned(gram(&self.kernel, &self.z, &self.z)?, &JitterConfig::default())?;
        let m = self.z.nrows();
        let kmm_inv = kmm.solve(&DMatrix::identity(m, m))?;
        let kbm = gram(&self.kernel, x, &self.z)?;
        let a = kmm.solve(&kbm.transpose())?.transpose();
        let ata = a.transpose() * &a;
        let kdiag = gram_diag(&self.kernel, x)?;
        let centred = y - self.mean.evaluate(x, 1)?;
        Ok(Batch { kmm, kmm_inv, kbm, a, ata, kdiag, centred, scale: n_total as f64 / x.nrows() as f64 })
    }

    /// The data term `T = T₁+T₂+T₃+T₄` on a batch (the bracket of the module docs' ELBO
    /// without its normalising constant, before the `n/B` scale).
    fn data_term(&self, b: &Batch) -> f64 {
        let s2 = self.noise_variance;
        let r = &b.centred - &b.a * &self.m;
        let t1 = -r.norm_squared() / (2.0 * s2);
        let t2 = -b.kdiag.sum() / (2.0 * s2);
        let t3 = b.a.component_mul(&b.kbm).sum() / (2.0 * s2);
        let t4 = -(&b.a * &self.s).component_mul(&b.a).sum() / (2.0 * s2);
        t1 + t2 + t3 + t4
    }

    /// `(ELBO, data term T)` on a batch.
    fn elbo_parts(&self, b: &Batch) -> (f64, f64) {
        let s2 = self.noise_variance;
        let t = self.data_term(b);
        let nb = b.centred.len() as f64;
        let data = b.scale * (-0.5 * nb * (std::f64::consts::TAU * s2).ln() + t);
        let mm = self.m.len() as f64;
        let s_chol = cholesky_jitter(&self.s, &JitterConfig::default());
        let log_det_s = s_chol.map(|c| c.log_det()).unwrap_or(f64::NEG_INFINITY);
        let kl = 0.5
            * ((&b.kmm_inv * &self.s).trace() + self.m.dot(&(&b.kmm_inv * &self.m)) - mm + b.kmm.log_det()
                - log_det_s);
        (data - kl, t)
    }

    /// The ELBO on the full data `(x, y)` (a lower bound on the log marginal likelihood).
    pub fn elbo(&self, x: &DMatrix<f64>, y: &DVector<f64>) -> Result<f64> {
        self.minibatch_elbo(x, y, x.nrows())
    }

    /// The minibatch estimate of the ELBO of a dataset with `n_total` rows (data term scaled
    /// by `n_total / B`).
    pub fn minibatch_elbo(&self, x: &DMatrix<f64>, y: &DVector<f64>, n_total: usize) -> Result<f64> {
        self.check_data(x, y)?;
        Ok(self.elbo_parts(&self.batch(x, y, n_total)?).0)
    }

    /// Replaces the kernel and noise variance, keeping `q(u)`.
    pub fn set_hyperparameters(&mut self, kernel: K, noise_variance: f64) -> Result<()> {
        if !(noise_variance.is_finite() && noise_variance > 0.0) {
            return Err(invalid("noise variance", format!("{noise_variance} must be > 0")));
        }
        kernel.check_input_dim(self.z.ncols())?;
        (self.kernel, self.noise_variance) = (kernel, noise_variance);
        Ok(())
    }

    /// `(G_bm, G_mm)`: the ELBO's derivatives in `K_bm` and `K_mm` at fixed `q(u)` (module docs).
    fn gram_weights(&self, b: &Batch) -> (DMatrix<f64>, DMatrix<f64>) {
        let c = b.scale / self.noise_variance;
        let kinv_m = &b.kmm_inv * &self.m;
        let r = &b.centred - &b.a * &self.m;
        let ata = &b.ata;
        let g_bm = (&r * kinv_m.transpose() + &b.a - &b.a * &self.s * &b.kmm_inv) * c;
        let g_mm = (-(b.a.tr_mul(&r)) * kinv_m.transpose() - ata * 0.5 + ata * &self.s * &b.kmm_inv) * c
            + (&b.kmm_inv * &self.s * &b.kmm_inv + &kinv_m * kinv_m.transpose() - &b.kmm_inv) * 0.5;
        (g_bm, g_mm)
    }

    fn hyper_gradient(
        &self,
        x: &DMatrix<f64>,
        b: &Batch,
        (g_bm, g_mm): &(DMatrix<f64>, DMatrix<f64>),
    ) -> Result<DVector<f64>> {
        let s2 = self.noise_variance;
        let g_diag = -b.scale / (2.0 * s2);
        let np = self.kernel.n_params();
        let mut grad = DVector::zeros(np + 1);
        let (xs, zs) = (PointSet::new("batch inputs", x)?, PointSet::new("inducing points", &self.z)?);
        let mut g = vec![0.0; np];
        for i in 0..xs.len() {
            for a in 0..zs.len() {
                self.kernel.eval_grad(xs.row(i), zs.row(a), &mut g);
                (0..np).for_each(|p| grad[p] += g_bm[(i, a)] * g[p]);
            }
            self.kernel.eval_grad(xs.row(i), xs.row(i), &mut g);
            (0..np).for_each(|p| grad[p] += g_diag * g[p]);
        }
        for a in 0..zs.len() {
            for c2 in 0..zs.len() {
                self.kernel.eval_grad(zs.row(a), zs.row(c2), &mut g);
                (0..np).for_each(|p| grad[p] += g_mm[(a, c2)] * g[p]);
            }
        }
        let t = self.data_term(b);
        grad[np] = b.scale * (-0.5 * x.nrows() as f64 - t);
        Ok(grad)
    }

    fn inducing_gradient(
        &self,
        x: &DMatrix<f64>,
        (g_bm, g_mm): &(DMatrix<f64>, DMatrix<f64>),
    ) -> Result<DMatrix<f64>> {
        let (xs, zs) = (PointSet::new("batch inputs", x)?, PointSet::new("inducing points", &self.z)?);
        let d = self.z.ncols();
        let mut grad = DMatrix::zeros(zs.len(), d);
        let mut g = vec![0.0; d];
        for a in 0..zs.len() {
            for i in 0..xs.len() {
                self.kernel.eval_grad_x(zs.row(a), xs.row(i), &mut g)?;
                (0..d).for_each(|k| grad[(a, k)] += g_bm[(i, a)] * g[k]);
            }
            for c2 in 0..zs.len() {
                self.kernel.eval_grad_x(zs.row(a), zs.row(c2), &mut g)?;
                let w = g_mm[(a, c2)] + g_mm[(c2, a)];
                (0..d).for_each(|k| grad[(a, k)] += w * g[k]);
            }
        }
        Ok(grad)
    }

    /// Gradient of the (minibatch, `n_total`-scaled) ELBO at fixed `q(u)` with respect to the
    /// kernel's log-hyperparameters and `log σ²` (last).
    pub fn elbo_gradient(&self, x: &DMatrix<f64>, y: &DVector<f64>, n_total: usize) -> Result<DVector<f64>> {
        self.check_data(x, y)?;
        let b = self.batch(x, y, n_total)?;
        self.hyper_gradient(x, &b, &self.gram_weights(&b))
    }

    /// Gradient of the (minibatch, `n_total`-scaled) ELBO at fixed `q(u)` with respect to the
    /// inducing inputs (`M × d`, the shape of [`inducing_points`](Self::inducing_points)); an
    /// [`Unsupported`](fspace_kernels::KernelError::Unsupported) kernel error for kernels
    /// without [`Kernel::eval_grad_x`].
    pub fn elbo_gradient_inducing(
        &self,
        x: &DMatrix<f64>,
        y: &DVector<f64>,
        n_total: usize,
    ) -> Result<DMatrix<f64>> {
        self.check_data(x, y)?;
        let b = self.batch(x, y, n_total)?;
        self.inducing_gradient(x, &self.gram_weights(&b))
    }

    /// One natural-gradient step of size `rho ∈ (0, 1]` on `q(u)` from a minibatch of a dataset
    /// with `n_total` rows.
    pub fn natural_gradient_step(
        &mut self,
        x: &DMatrix<f64>,
        y: &DVector<f64>,
        n_total: usize,
        rho: f64,
    ) -> Result<()> {
        self.check_data(x, y)?;
        let b = self.batch(x, y, n_total)?;
        self.natural_step_on(&b, rho)
    }

    /// [`natural_gradient_step`](Self::natural_gradient_step) on a prepared batch (which does
    /// not depend on `q(u)`, so the hyperparameter step that follows reuses it).
    fn natural_step_on(&mut self, b: &Batch, rho: f64) -> Result<()> {
        if !(rho > 0.0 && rho <= 1.0) {
            return Err(invalid("natural_step", format!("{rho} not in (0, 1]")));
        }
        let c = b.scale / self.noise_variance;
        let target_prec = &b.kmm_inv + &b.ata * c;
        let target_eta = b.a.tr_mul(&b.centred) * c;
        let s_chol = cholesky_jitter(&self.s, &JitterConfig::default())?;
        let m = self.m.len();
        let prec = s_chol.solve(&DMatrix::identity(m, m))? * (1.0 - rho) + target_prec * rho;
        let eta = s_chol.solve_vec(&self.m)? * (1.0 - rho) + target_eta * rho;
        let prec = (&prec + prec.transpose()) * 0.5;
        let p_chol = cholesky_jitter_owned(prec, &JitterConfig::default())?;
        self.s = p_chol.solve(&DMatrix::identity(m, m))?;
        self.s = (&self.s + self.s.transpose()) * 0.5;
        self.m = p_chol.solve_vec(&eta)?;
        Ok(())
    }

    /// Sets `q(u)` to its optimum for the full data (one natural-gradient step with `ρ = 1`).
    pub fn set_optimal_variational(&mut self, x: &DMatrix<f64>, y: &DVector<f64>) -> Result<()> {
        self.natural_gradient_step(x, y, x.nrows(), 1.0)
    }

    /// Trains `q(u)` (natural gradients) and, if enabled, the kernel's hyperparameters (Adam)
    /// on minibatches, the noise iff `learn_noise`; returns the full-data ELBO after training.
    fn train(
        &mut self,
        x: &DMatrix<f64>,
        y: &DVector<f64>,
        config: &SvgpConfig,
        learn_noise: bool,
    ) -> Result<f64> {
        self.check_data(x, y)?;
        let n = x.nrows();
        if self.z.nrows() > n {
            return Err(invalid(
                "inducing points",
                format!("{} inducing points for {n} data points", self.z.nrows()),
            ));
        }
        if config.batch_size == 0 {
            return Err(invalid("batch_size", "must be ≥ 1"));
        }
        let bsz = config.batch_size.min(n);
        let schedule = ScheduleRun::new(&config.schedule, n.div_ceil(bsz), false)?;
        let mut rng = StdRng::seed_from_u64(config.seed);
        let np = self.kernel.n_params();
        let mut theta = DVector::from_vec(self.kernel.params()).push(self.noise_variance.ln());
        let mut adam = Adam::new(np + 1, config.learning_rate);
        // Z as one vector, column-major like nalgebra's storage.
        let mut zvec = DVector::from_column_slice(self.z.as_slice());
        let mut adam_z = Adam::new(zvec.len(), config.learning_rate);
        if config.learn_inducing_points {
            // Fail before training, with the kernel's own message, if it has no input gradient.
            let mut probe = vec![0.0; self.z.ncols()];
            let z0: Vec<f64> = self.z.row(0).iter().copied().collect();
            self.kernel.eval_grad_x(&z0, &z0, &mut probe)?;
        }
        for _ in 0..schedule.total_steps() {
            let idx = sample_indices(&mut rng, n, bsz).into_vec();
            let (xb, yb) = (x.select_rows(&idx), y.select_rows(&idx));
            let b = self.batch(&xb, &yb, n)?;
            self.natural_step_on(&b, config.natural_step)?;
            if !(config.learn_hyperparameters || learn_noise || config.learn_inducing_points) {
                continue;
            }
            // Both gradients at the same q(u), hyperparameters and Z (so the same batch), then
            // both steps.
            let weights = self.gram_weights(&b);
            let g_theta = if config.learn_hyperparameters || learn_noise {
                let mut g = self.hyper_gradient(&xb, &b, &weights)?;
                if !config.learn_hyperparameters {
                    g.rows_mut(0, np).fill(0.0);
                }
                if !learn_noise {
                    g[np] = 0.0;
                }
                Some(g)
            } else {
                None
            };
            let g_z = if config.learn_inducing_points {
                Some(self.inducing_gradient(&xb, &weights)?)
            } else {
                None
            };
            let finite = g_theta
                .iter()
                .flat_map(|g| g.iter())
                .chain(g_z.iter().flat_map(|g| g.iter()))
                .all(|v| v.is_finite());
            if !finite {
                return Err(GpError::Diverged("non-finite SVGP ELBO gradient".into()));
            }
            if let Some(g) = g_theta {
                adam.ascend(&mut theta, &g);
                theta[np] = theta[np].max(1e-6f64.ln());
                self.kernel.set_params(&theta.as_slice()[..np])?;
                self.noise_variance = theta[np].exp();
            }
            if let Some(g) = g_z {
                adam_z.ascend(&mut zvec, &DVector::from_column_slice(g.as_slice()));
                self.z.copy_from_slice(zvec.as_slice());
            }
        }
        self.elbo(x, y)
    }

    fn latent(&self, xs: &DMatrix<f64>) -> Result<Latent> {
        let kmm = cholesky_jitter_owned(gram(&self.kernel, &self.z, &self.z)?, &JitterConfig::default())?;
        let ksm = gram(&self.kernel, xs, &self.z)?;
        let a = kmm.solve(&ksm.transpose())?.transpose();
        let mean = self.mean.evaluate(xs, 1)? + &a * &self.m;
        let var = DVector::from_fn(xs.nrows(), |i, _| {
            let ai = a.row(i);
            let quad = (ai * &self.s).dot(&ai);
            ai.dot(&ksm.row(i)) - quad
        });
        Ok(Latent { mean, reduction: var, a, ksm })
    }
}

impl<K: Kernel + Clone> Posterior for Svgp<K> {
    fn output_dim(&self) -> usize {
        1
    }
    fn likelihood(&self) -> Option<fspace_core::LikelihoodSpec> {
        Some(fspace_core::LikelihoodSpec::gaussian(self.noise_variance.sqrt()))
    }
    fn predict(&self, xs: &DMatrix<f64>) -> Result<FunctionPredictive, fspace_core::CoreError> {
        let run = || -> Result<FunctionPredictive> {
            let Latent { mean, reduction, .. } = self.latent(xs)?;
            let prior = gram_diag(&self.kernel, xs)?;
            scalar_predictive(&mean, &posterior_variances(&prior, |i| reduction[i]))
        };
        run().map_err(to_core)
    }
    fn predict_joint(
        &self,
        xs: &DMatrix<f64>,
    ) -> Result<(DMatrix<f64>, DMatrix<f64>), fspace_core::CoreError> {
        fspace_core::ensure_joint_fits(xs.nrows(), fspace_core::Posterior::output_dim(self))?;
        let run = || -> Result<(DMatrix<f64>, DMatrix<f64>)> {
            let Latent { mean, a, ksm, .. } = self.latent(xs)?;
            let cov = gram(&self.kernel, xs, xs)? - &a * ksm.transpose() + &a * &self.s * a.transpose();
            Ok((DMatrix::from_column_slice(mean.len(), 1, mean.as_slice()), symmetrised(&cov)))
        };
        let (mean, cov) = run().map_err(to_core)?;
        fspace_core::checked_joint(mean, cov)
    }
}

/// The sparse variational GP — the model's one entry point, in the workspace's call shape: the
/// scalar `prior` fitted to `data` (targets `n × 1`) under a `Gaussian` likelihood (σ learned
/// iff `learn`), with the inducing inputs of `config.inducing`: natural-gradient steps on
/// `q(u)` and, unless `config.learn_hyperparameters` is off, Adam steps on the kernel. Training
/// moves the kernel, so the posterior owns a copy ([`IntoScalarKernel`]): a concrete kernel
/// ([`GpPrior::with_kernel`](fspace_kernels::GpPrior::with_kernel)) keeps its type, a shared
/// one is rebuilt from its spec as a `Box<dyn Kernel>`; a shared kernel without a spec, or with
/// several outputs, is refused. A validation set is refused (SVGP training does not use one).
pub fn fit<K: IntoScalarKernel>(
    likelihood: fspace_core::LikelihoodSpec,
    prior: &fspace_kernels::GpPrior<K>,
    data: &fspace_core::Data,
    config: &SvgpConfig,
) -> Result<fspace_core::Fitted<Svgp<K::Scalar>, SvgpReport>> {
    use fspace_core::LikelihoodSpec;
    let start = std::time::Instant::now();
    likelihood.validate()?;
    if data.validation().is_some() {
        return Err(invalid("validation data", "SVGP training does not use a validation set; leave it out"));
    }
    let (sigma, learn_noise) = match likelihood {
        LikelihoodSpec::Gaussian { sigma, learn } => (sigma, learn),
        other => return Err(other.unsupported("SVGP regression").into()),
    };
    let kernel = scalar_prior_kernel(prior, "SVGP regression")?;
    let (x, y) = (data.x(), data.y());
    if y.ncols() != 1 {
        return Err(invalid(
            "targets",
            format!("SVGP regression has one output; the targets have {} columns", y.ncols()),
        ));
    }
    let z = config.inducing.resolve(x, config.seed)?;
    let mut svgp = Svgp::new(kernel, prior.mean.clone(), sigma * sigma, z)?;
    let elbo = svgp.train(x, &y.column(0).into_owned(), config, learn_noise)?;
    let report = SvgpReport {
        elbo,
        noise_sigma: svgp.noise_variance().sqrt(),
        inducing_points: svgp.inducing_points().nrows(),
        seconds: start.elapsed().as_secs_f64(),
    };
    Ok(fspace_core::Fitted { posterior: svgp, report })
}

/// The prior's kernel as the owned scalar kernel of a one-output model, its refusal naming
/// `method`.
pub(crate) fn scalar_prior_kernel<K: IntoScalarKernel>(
    prior: &fspace_kernels::GpPrior<K>,
    method: &str,
) -> Result<K::Scalar> {
    prior.kernel.to_scalar_kernel().map_err(|e| invalid("prior", format!("{method}: {e}")))
}

/// Saves the kernel, the mean, the noise, `Z` and `q(u)`. The kernel is saved through serde (the library's kernels derive it; a boxed
/// kernel goes through its `KernelSpec`).
impl<K: Kernel + Clone + serde::Serialize + serde::de::DeserializeOwned> fspace_core::Persist for Svgp<K> {
    const KIND: &'static str = "fspace_gp::Svgp";
    const VERSION: u32 = 1;

    fn validate_loaded(&self) -> std::result::Result<(), fspace_core::PersistError> {
        let check = crate::error::check_loaded_kernel_and_inputs(Self::KIND, &self.kernel, "z", &self.z)?;
        let m = self.z.nrows();
        check.len("m", self.m.len(), m)?;
        check.finite("m", self.m.iter())?;
        check.shape("s", self.s.shape(), (m, m))?;
        check.finite("s", self.s.iter())?;
        // S is a covariance: symmetric and PSD (up to rounding), or the predictive variances
        // it serves could be negative.
        let scale = self.s.iter().fold(0.0_f64, |a, v| a.max(v.abs()));
        check.ensure((&self.s - self.s.transpose()).amax() <= 1e-9 * scale, "s", || {
            "must be symmetric".into()
        })?;
        let (values, _) = fspace_linalg::sym_eigh(&self.s).map_err(|e| check.invalid("s", e.to_string()))?;
        check.ensure(values.iter().all(|&v| v >= -1e-9 * scale), "s", || {
            "must be positive semi-definite (a covariance)".into()
        })?;
        check.positive("noise_variance", self.noise_variance)?;
        crate::error::check_loaded_mean(&check, &self.mean)
    }
}
