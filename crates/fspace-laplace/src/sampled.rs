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
//!
//! Sharded over processes ([`crate::fit_sharded`]), `Rᵀε`, each product with `RᵀR` and `γ`
//! are sums over the points, all-reduced as they are formed; `ε` is drawn as one process over
//! all the points draws it (every process walks the whole stream, `N·k·K` normals, and keeps
//! its own rows), so the draws are the single-process ones up to the order of the additions.
//!
//! A fit of hours can record its EM steps in a small file ([`SampledConfig::em_checkpoint`]):
//! λ after each step, with what the steps depend on. A fit given a file that holds steps of the
//! same settings, network weights and data continues from the last recorded λ instead of
//! starting again. The resumed solve starts cold (the draws of the step before are not kept:
//! `p × K` numbers), so a resumed fit matches an uninterrupted one to the solves' tolerance, not
//! bit for bit; the report's `cg_products` lists the recorded steps' products before this fit's,
//! and its `em_recorded_seconds` the recorded steps' wall time.

use std::path::{Path, PathBuf};
use std::time::Instant;

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
/// | `em_checkpoint` | none | a JSON file recording λ after each EM step; a fit whose file holds steps of the same settings, weights and data continues from them (module docs) |
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
    /// Where the EM steps are recorded, and read back to continue an interrupted fit.
    #[serde(default)]
    pub em_checkpoint: Option<PathBuf>,
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
            em_checkpoint: None,
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
    /// Wall seconds of the recorded EM steps the fit continued from.
    pub recorded_seconds: f64,
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

/// What the EM steps of a sampled fit depend on: a recorded step continues a fit only when
/// every field is equal.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct EmKey {
    seed: u64,
    samples: usize,
    tol: f64,
    max_iterations: usize,
    preconditioner: SampledPreconditioner,
    lambda0: f64,
    temperature: f64,
    params: usize,
    points: usize,
    outputs: usize,
    /// FNV-1a over the bits of the weights, of the inputs and of the likelihood factors.
    fingerprint: String,
}

/// The file of [`SampledConfig::em_checkpoint`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct EmProgress {
    key: EmKey,
    /// λ after each recorded EM step.
    prior_precisions: Vec<f64>,
    /// Products with the posterior precision of each recorded step's solve.
    cg_products: Vec<usize>,
    /// Wall seconds of each recorded step.
    seconds: Vec<f64>,
}

fn checkpoint_error(path: &Path, reason: impl Into<String>) -> LaplaceError {
    LaplaceError::EmCheckpoint { path: path.display().to_string(), reason: reason.into() }
}

impl EmProgress {
    /// The steps `path` records for `key` (none when the file does not exist); a file of other
    /// settings, weights or data is an error that names the first field that differs.
    fn read(path: &Path, key: &EmKey) -> Result<Self> {
        let fresh = Self {
            key: key.clone(),
            prior_precisions: Vec::new(),
            cg_products: Vec::new(),
            seconds: Vec::new(),
        };
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(fresh),
            Err(e) => return Err(checkpoint_error(path, format!("cannot be read: {e}"))),
        };
        let stored: Self = serde_json::from_str(&text)
            .map_err(|e| checkpoint_error(path, format!("is not a sampled-fit EM record: {e}")))?;
        if stored.key != *key {
            let (a, b) = (serde_json::to_value(&stored.key), serde_json::to_value(key));
            let field = match (a, b) {
                (Ok(serde_json::Value::Object(a)), Ok(serde_json::Value::Object(b))) => a
                    .iter()
                    .find(|(k, v)| b.get(*k) != Some(*v))
                    .map(|(k, v)| format!("{k}: {v} there, {} here", b[k])),
                _ => None,
            };
            return Err(checkpoint_error(
                path,
                format!(
                    "records the EM steps of another fit ({}); remove it or name another file",
                    field.unwrap_or_else(|| "its settings differ".into())
                ),
            ));
        }
        let n = stored.prior_precisions.len();
        if stored.cg_products.len() != n || stored.seconds.len() != n {
            return Err(checkpoint_error(path, "holds lists of different lengths"));
        }
        if let Some(bad) = stored.prior_precisions.iter().find(|l| !(l.is_finite() && **l > 0.0)) {
            return Err(checkpoint_error(
                path,
                format!("records the prior precision {bad}, not a positive number"),
            ));
        }
        if let Some(bad) = stored.seconds.iter().find(|s| !(s.is_finite() && **s >= 0.0)) {
            return Err(checkpoint_error(path, format!("records a step of {bad} seconds, not a duration")));
        }
        Ok(stored)
    }

    /// Writes the file (a temporary file renamed over it, so an interrupted write keeps the
    /// previous record).
    fn write(&self, path: &Path) -> Result<()> {
        let text = serde_json::to_string_pretty(self).map_err(|e| checkpoint_error(path, e.to_string()))?;
        let tmp = path.with_extension("json.partial");
        std::fs::write(&tmp, text + "\n")
            .and_then(|_| std::fs::rename(&tmp, path))
            .map_err(|e| checkpoint_error(path, format!("cannot be written: {e}")))
    }
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
    let k = config.samples;
    let mut rng = StdRng::seed_from_u64(config.seed);
    let eps0 = randn(p, k, &mut rng);
    let eps = match data.shard {
        None => randn(data.x.nrows() * data.k(), k, &mut rng),
        // Sharded: the rows of this process's points in the one stream of all the points.
        Some(_) => {
            let rows = data.n_total() * data.k();
            noise_rows(rows, k, data.offset() * data.k(), data.x.nrows() * data.k(), &mut rng)
        }
    };
    // The first reduce (sharded) is the right-hand side's `Rᵀε`: a failure building the
    // Jacobian's statistics travels in it.
    let jac = WhitenedJacobian::new(net, data, config.statistics_cache_bytes);
    let b_lik = reduce_matrix(data, jac.as_ref().map_err(Clone::clone).and_then(|j| j.vjp(data, &eps)), p, k);
    let jac = jac?;
    let b_lik = b_lik? * t.sqrt();
    let (mut em_prior_precisions, mut cg_products) = (Vec::new(), Vec::new());
    let cg = CgConfig { tol: config.tol, max_iter: Some(config.max_iterations) };
    let mut lambda = lambda0;
    // The EM steps an earlier fit recorded (at most `em_steps` of them are used).
    let mut record = match &config.em_checkpoint {
        Some(path) => {
            let key = EmKey {
                seed: config.seed,
                samples: k,
                tol: config.tol,
                max_iterations: config.max_iterations,
                preconditioner: config.preconditioner,
                lambda0,
                temperature: t,
                params: p,
                points: data.x.nrows(),
                outputs: data.k(),
                fingerprint: fspace_core::fingerprint(
                    net.params()
                        .iter()
                        .chain(data.x.iter())
                        .copied()
                        .chain(data.factors.iter().flat_map(|f| f.iter().copied())),
                ),
            };
            let mut r = EmProgress::read(path, &key)?;
            r.prior_precisions.truncate(config.em_steps);
            r.cg_products.truncate(config.em_steps);
            r.seconds.truncate(config.em_steps);
            Some((path, r))
        }
        None => None,
    };
    let resumed = record.as_ref().map_or(0, |(_, r)| r.prior_precisions.len());
    // A fold from +0: f64's `Sum` of no terms is −0.0, which reports and logs would print as "-0.0".
    let recorded_seconds = record.as_ref().map_or(0.0, |(_, r)| r.seconds.iter().fold(0.0, |acc, s| acc + s));
    if let Some((_, r)) = &record {
        if let Some(&last) = r.prior_precisions.last() {
            lambda = last;
            em_prior_precisions.extend_from_slice(&r.prior_precisions);
            cg_products.extend_from_slice(&r.cg_products);
        }
    }
    let mut z: Option<DMatrix<f64>> = None;
    for step in resumed..=config.em_steps {
        let started = Instant::now();
        let b = &eps0 * lambda.sqrt() + &b_lik;
        let apply = |v: &DMatrix<f64>| -> Result<DMatrix<f64>> {
            let ggn_v = jac.jvp(data, v).and_then(|u| jac.vjp(data, &u));
            Ok(reduce_matrix(data, ggn_v, p, v.ncols())? * t + v * lambda)
        };
        let mut m = |v: &DMatrix<f64>| precond.apply(t, lambda, v);
        let (zs, info) = cg_columns(apply, Some(&mut m), &b, z.as_ref(), &cg)?;
        cg_products.push(info.products);
        if step < config.em_steps {
            let r_z = jac.jvp(data, &zs).map(|u| DVector::from_element(1, u.norm_squared()));
            let gamma = t * data.all_reduce(r_z, 1)?[0] / k as f64;
            let next = gamma / w2;
            if !(next.is_finite() && next > 0.0) {
                return Err(invalid(
                    "EM prior precision",
                    format!("the update γ/‖w*‖² = {gamma:.3e}/{w2:.3e} is not a positive number"),
                ));
            }
            lambda = next;
            em_prior_precisions.push(lambda);
            if let Some((path, r)) = &mut record {
                r.prior_precisions.push(lambda);
                r.cg_products.push(info.products);
                r.seconds.push(started.elapsed().as_secs_f64());
                r.write(path)?;
            }
        }
        z = Some(zs);
    }
    let samples = z.expect("at least one solve");
    Ok(SampledRun {
        curvature: SampleCurvature { samples, temperature: t, prior_precision: lambda },
        cached: jac.cached(),
        em_prior_precisions,
        cg_products,
        recorded_seconds,
    })
}

/// Rows `start..start + len` of the `rows × cols` matrix of standard normals drawn column by
/// column from `rng` (as [`randn`] draws it), without holding the rest.
fn noise_rows(rows: usize, cols: usize, start: usize, len: usize, rng: &mut StdRng) -> DMatrix<f64> {
    use rand_distr::{Distribution, StandardNormal};
    let mut out = DMatrix::zeros(len, cols);
    for c in 0..cols {
        for r in 0..rows {
            let z: f64 = StandardNormal.sample(rng);
            if (start..start + len).contains(&r) {
                out[(r - start, c)] = z;
            }
        }
    }
    out
}

/// A `rows × cols` sum over the data, summed over every process of a sharded fit (column by
/// column through [`Data::all_reduce`]; the matrix itself when not sharded).
fn reduce_matrix(data: &Data, part: Result<DMatrix<f64>>, rows: usize, cols: usize) -> Result<DMatrix<f64>> {
    if data.shard.is_none() {
        return part;
    }
    let flat = part.map(|m| DVector::from_column_slice(m.as_slice()));
    let summed = data.all_reduce(flat, rows * cols)?;
    Ok(DMatrix::from_column_slice(rows, cols, summed.as_slice()))
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
