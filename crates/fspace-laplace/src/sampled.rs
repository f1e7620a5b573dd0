//! Sampled linearised Laplace (Antorán et al. 2023, "Sampling-based inference for large linear
//! models"): posterior draws by sample-then-optimise and the prior precision by EM, with no
//! `p × p` matrix and no log-determinant.
//!
//! With `R` the whitened Jacobian of the training data (row `i·k + c` is `Lᵢ[:, c]ᵀ J(xᵢ)`,
//! `LᵢLᵢᵀ = Hᵢ`, so `RᵀR` is the GGN), the linearised posterior's precision is
//! `P = T·RᵀR + λI`. For `ε₀ ~ N(0, I_p)` and `ε ~ N(0, I_{nk})`,
//!
//! `z = P⁻¹ (√λ ε₀ + √T Rᵀ ε)`  has covariance  `P⁻¹ (λI + T RᵀR) P⁻¹ = P⁻¹`,
//!
//! so each draw is one SPD solve. The `K` solves share every product with `P` (one
//! [`cg_columns`] run, preconditioned by the GGN's top Ritz pairs by default, warm-started from
//! the previous EM step's draws). The M-step is MacKay's fixed point of the Laplace evidence in `λ`,
//!
//! `λ ← γ / ‖w*‖²`,  `γ = tr(P⁻¹ T RᵀR) = E[T ‖R z‖²]`  (`z ~ N(0, P⁻¹)`),
//!
//! with `γ` estimated by the mean of `T ‖R zⱼ‖²` over the draws. `ε₀` and `ε` are drawn once
//! and kept across the EM steps, so consecutive solves differ only through `λ`.

use fspace_input::InputError;
use fspace_linalg::{cg_columns, CgConfig};
use fspace_nn::Network;
use nalgebra::{DMatrix, DVector};
use rand::rngs::StdRng;
use rand::SeedableRng;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::curvature::{randn, CurvatureApprox, KronCurvature, SampleCurvature};
use crate::data::Data;
use crate::error::{LaplaceError, Result};
use crate::ggn::WhitenedJacobian;

/// The preconditioner `M ≈ P` of the sample solves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SampledPreconditioner {
    /// `T·KFAC + λI` (one extra statistics pass; needs the network's layer structure).
    Kfac,
    /// `T·diag(GGN) + λI` (Jacobi).
    Diag,
    /// `T·V S Vᵀ + λI` from `rank` Ritz pairs of one Lanczos run on the GGN (`1.5·rank + 10`
    /// products of one vector): deflates the largest eigenvalues, so CG sees about
    /// `(T s_{rank+1} + λ)/λ` as condition number.
    LowRank(usize),
    /// None.
    Identity,
}

/// Options of [`Structure::Sampled`](crate::Structure::Sampled).
///
/// | name | default | purpose |
/// |---|---|---|
/// | `samples` | 32 | posterior draws `K` (VaLLA Fig. 3: 32) |
/// | `em_steps` | 8 | λ updates (VaLLA Fig. 3: 8); `0` keeps the configured λ |
/// | `tol` | 1e-3 | relative residual of each draw's solve |
/// | `max_iterations` | 1 000 | CG iterations per solve at most |
/// | `preconditioner` | `LowRank(100)` | `M ≈ P` of the solves |
/// | `seed` | 0 | the draws' noise `ε₀`, `ε` |
/// | `statistics_cache_bytes` | 1 GiB | cache the layer statistics (and the dense layers' inputs transposed) for the products when they fit; `0` streams |
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SampledConfig {
    /// Posterior draws.
    pub samples: usize,
    /// EM updates of λ.
    pub em_steps: usize,
    /// Relative residual tolerance of the solves.
    pub tol: f64,
    /// Most CG iterations per solve.
    pub max_iterations: usize,
    /// Preconditioner of the solves.
    pub preconditioner: SampledPreconditioner,
    /// Seed of the draws.
    pub seed: u64,
    /// Largest layer-statistics cache (bytes).
    pub statistics_cache_bytes: usize,
}

impl Default for SampledConfig {
    fn default() -> Self {
        Self {
            samples: 32,
            em_steps: 8,
            tol: 1e-3,
            max_iterations: 1_000,
            preconditioner: SampledPreconditioner::LowRank(100),
            seed: 0,
            statistics_cache_bytes: 1 << 30,
        }
    }
}

/// The built preconditioner: `M⁻¹ V` at `(T, λ)`, columns in parallel.
pub(crate) enum Precond {
    /// KFAC and the flat index of each of its coordinates.
    Kron(KronCurvature, Vec<usize>),
    /// The GGN's diagonal.
    Diag(DVector<f64>),
    /// The GGN's top eigenpairs: `Vᵀ` (`r × p`, so both products are plain GEMMs), `V`, `s`.
    LowRank {
        vt: DMatrix<f64>,
        v: DMatrix<f64>,
        s: DVector<f64>,
    },
    Identity,
}

/// What a sampled fit reports: whether the statistics were cached, λ after each EM step, the
/// products of each solve.
pub(crate) struct SampledRun {
    pub curvature: SampleCurvature,
    pub cached: bool,
    pub em_prior_precisions: Vec<f64>,
    pub cg_products: Vec<usize>,
}

impl Precond {
    fn apply(&self, t: f64, lambda: f64, v: &DMatrix<f64>) -> Result<DMatrix<f64>> {
        match self {
            Self::Identity => Ok(v.clone()),
            Self::Diag(d) => {
                Ok(DMatrix::from_fn(v.nrows(), v.ncols(), |i, j| v[(i, j)] / (t * d[i] + lambda)))
            }
            Self::LowRank { vt, v: u, s } => {
                // V diag(1/(T s + λ) − 1/λ) Vᵀ v + v/λ
                let mut c = vt * v;
                for (mut row, si) in c.row_iter_mut().zip(s.iter()) {
                    row *= 1.0 / (t * si + lambda) - 1.0 / lambda;
                }
                Ok(u * c + v / lambda)
            }
            Self::Kron(k, idx) => {
                let lam = DVector::from_element(idx.len(), lambda);
                let mut out = DMatrix::zeros(v.nrows(), v.ncols());
                out.as_mut_slice().par_chunks_exact_mut(v.nrows().max(1)).enumerate().try_for_each(
                    |(j, col)| -> Result<()> {
                        let vk = DMatrix::from_fn(idx.len(), 1, |c, _| v[(idx[c], j)]);
                        let s = k.solve(t, &lam, &vk)?;
                        for (c, &i) in idx.iter().enumerate() {
                            col[i] = s[(c, 0)];
                        }
                        Ok(())
                    },
                )?;
                Ok(out)
            }
        }
    }
}

fn invalid(what: &'static str, reason: impl Into<String>) -> LaplaceError {
    LaplaceError::Input(InputError::Invalid { what, reason: reason.into() })
}

/// Checks the options that need no data.
pub(crate) fn validate(config: &SampledConfig) -> Result<()> {
    if config.samples == 0 {
        return Err(invalid("sampled posterior samples", "must be ≥ 1"));
    }
    if config.max_iterations == 0 {
        return Err(invalid("sampled posterior max_iterations", "must be ≥ 1"));
    }
    crate::error::ensure_positive("sampled posterior tol", config.tol)
}

/// Runs EM from `lambda0` and returns the draws at the final λ (`config` already passed
/// [`validate`], before its preconditioner was built).
pub(crate) fn sampled<N: Network>(
    net: &N,
    data: &Data,
    config: &SampledConfig,
    precond: Precond,
    lambda0: f64,
    t: f64,
) -> Result<SampledRun> {
    let p = net.n_params();
    let w2 = net.params().norm_squared();
    if config.em_steps > 0 && w2 == 0.0 {
        return Err(invalid("MAP weights", "EM's update λ = γ/‖w*‖² needs non-zero weights"));
    }
    let jac = WhitenedJacobian::new(net, data, config.statistics_cache_bytes)?;
    let (mut em_prior_precisions, mut cg_products) = (Vec::new(), Vec::new());
    let k = config.samples;
    let mut rng = StdRng::seed_from_u64(config.seed);
    let eps0 = randn(p, k, &mut rng);
    let eps = randn(data.x.nrows() * data.k(), k, &mut rng);
    let b_lik = jac.vjp(data, &eps)? * t.sqrt();
    let cg = CgConfig { tol: config.tol, max_iter: Some(config.max_iterations) };
    let mut lambda = lambda0;
    let mut z: Option<DMatrix<f64>> = None;
    for step in 0..=config.em_steps {
        let b = &eps0 * lambda.sqrt() + &b_lik;
        let apply = |v: &DMatrix<f64>| -> Result<DMatrix<f64>> {
            Ok(jac.vjp(data, &jac.jvp(data, v)?)? * t + v * lambda)
        };
        let mut m = |v: &DMatrix<f64>| precond.apply(t, lambda, v);
        let (zs, info) = cg_columns(apply, Some(&mut m), &b, z.as_ref(), &cg)?;
        cg_products.push(info.products);
        if step < config.em_steps {
            let gamma = t * jac.jvp(data, &zs)?.norm_squared() / k as f64;
            let next = gamma / w2;
            if !(next.is_finite() && next > 0.0) {
                return Err(invalid(
                    "EM prior precision",
                    format!("the update γ/‖w*‖² = {gamma:.3e}/{w2:.3e} is not a positive number"),
                ));
            }
            lambda = next;
            em_prior_precisions.push(lambda);
        }
        z = Some(zs);
    }
    let samples = z.expect("at least one solve");
    Ok(SampledRun {
        curvature: SampleCurvature { samples, temperature: t, prior_precision: lambda },
        cached: jac.cached(),
        em_prior_precisions,
        cg_products,
    })
}

impl CurvatureApprox for SampleCurvature {
    fn name(&self) -> &'static str {
        "sampled"
    }
    fn dim(&self) -> usize {
        self.samples.nrows()
    }
    fn log_det_precision(&self, _t: f64, _lam: &DVector<f64>) -> Result<f64> {
        Err(LaplaceError::Unsupported {
            structure: "sampled",
            reason: "draws carry no log-determinant; λ is set by EM when fitting (SampledConfig::em_steps)"
                .into(),
        })
    }
    fn solve(&self, t: f64, lam: &DVector<f64>, v: &DMatrix<f64>) -> Result<DMatrix<f64>> {
        self.check(t, lam)?;
        Ok(&self.samples * (self.samples.tr_mul(v) / self.samples.ncols() as f64))
    }
    fn sample(
        &self,
        t: f64,
        lam: &DVector<f64>,
        s: usize,
        rng: &mut dyn rand::RngCore,
    ) -> Result<DMatrix<f64>> {
        self.check(t, lam)?;
        let k = self.samples.ncols();
        Ok(&self.samples * randn(k, s, rng) / (k as f64).sqrt())
    }
    fn to_dense(&self) -> DMatrix<f64> {
        &self.samples * self.samples.transpose() / self.samples.ncols() as f64
    }
}

impl SampleCurvature {
    /// Errors unless `(t, λ)` is the pair the draws were made at.
    pub(crate) fn check(&self, t: f64, lam: &DVector<f64>) -> Result<()> {
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-12 * b.abs();
        if close(t, self.temperature) && lam.iter().all(|&l| close(l, self.prior_precision)) {
            return Ok(());
        }
        Err(LaplaceError::Unsupported {
            structure: "sampled",
            reason: format!(
                "the draws were made at λ = {:.6e}, T = {}; refit to use another prior precision or temperature",
                self.prior_precision, self.temperature
            ),
        })
    }
}
