//! Algorithm 2: the matrix-free linearised Laplace approximation under the GP prior.
//!
//! With fixed context points `C` (`n_C` points, `d'` outputs), the weight-space precision of the
//! linearised model is `Λ = J(C)ᵀ Σ(C,C)† J(C) + Σᵢ J(xᵢ)ᵀ Hᵢ J(xᵢ)` (`Hᵢ`: the NLL's Hessian
//! in `f`). It is never formed:
//!
//! 1. `L` (`n_C·d' × r`) with `LLᵀ ≈ Σ(C,C)†` by Lanczos with embedded LDLᵀ on the matrix-free
//!    Gram operator, started from `J(C)·1` (one forward-mode product), with deflated restarts
//!    when it stops early at an invariant subspace (repeated eigenvalues: see below);
//! 2. `M = J(C)ᵀL` (`p × r`): `r` reverse-mode products;
//! 3. thin SVD `M = U D Vᵀ` (`O(p r²)`), keeping singular values above `rank_rtol·max`;
//! 4. `A = D² + c·Σ_batches (J_B U)ᵀ H_B (J_B U)` (`r × r`; `c = ggn_scale`, 1 in the paper):
//!    `r` forward-mode products per data batch, batches in sequence, columns in parallel;
//! 5. `A = U_A D_A U_Aᵀ`, `S = U U_A D_A^{-1/2}` (eigenvalues `≤ rank_rtol·max` are
//!    pseudo-inverted to zero), columns ordered by increasing eigenvalue — decreasing variance;
//! 6. truncation (paper, §3.2): drop the leading (largest-variance) columns until
//!    `diag(J(C) S Sᵀ J(C)ᵀ) ≤ diag Σ(C,C)` at every context point and output.
//!
//! The posterior is `N(w*, S Sᵀ)`; the GLM predictive is `f(x) ~ N(f(x; w*), J(x) S Sᵀ J(x)ᵀ)`.
//! Memory: `O(p·r)` for `M`/`S` plus `O(batch·d'·r)` work space. No `p × p`, `p × n_C` or
//! `n_C × n_C` matrix is ever formed (`L` is `n_C·d' × r`, `J(C)S` is computed batch-wise),
//! except that step 1 keeps `Σ(C, C)`'s kernel tiles when they fit `gram_cache_bytes`
//! (256 MiB by default; 0 keeps it matrix-free): Lanczos then reuses them instead of
//! evaluating the kernel `n_C²` times per step, with the same bits.
//!
//! Deviation (documented in ARCHITECTURE.md): the Lanczos start is `Σ(C,C)·J(C)·1` rather than
//! `J(C)·1` (the linear-algebra crate projects the start onto the range of the operator, see
//! `LanczosConfig::project_start`); the Krylov space is the same up to the null space of `Σ`.
//!
//! Deviation: a single Krylov space contains one direction per *distinct* eigenvalue of
//! `Σ(C,C)`. Independent-output priors (`Σ = K ⊗ I_{d'}`) repeat every eigenvalue `d'` times
//! and grids repeat them by symmetry, so the paper's single run would stop with `LLᵀ` far from
//! `Σ†` (observed: rank 3 of 8 on a 2×2 grid with two outputs). We restart Lanczos on the
//! deflated operator until `max_rank` or the numerical range is exhausted.

use fspace_core::{
    CoreError, FunctionPredictive, Likelihood, LikelihoodSpec, Persist, PersistError, Posterior,
};
use fspace_kernels::GramOperator;
use fspace_linalg::{
    pinv_factor_restarted, sym_eigh, thin_svd_owned, DiagonalOperator, LanczosConfig, PinvMethod,
    StartVector, StopReason, SumOperator,
};
use fspace_nn::Network;
use nalgebra::{DMatrix, DVector};
use rand::RngCore;
use rand_distr::{Distribution, StandardNormal};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::error::{ensure_dim, invalid, Result};
use crate::train::point_major;
use fspace_kernels::GpPrior;

/// Options of Alg. 2.
///
/// | name | default | meaning |
/// |---|---|---|
/// | `max_rank` | 500 | Lanczos iterations at most (paper: 500) |
/// | `data_batch` | 256 | points per batch when accumulating the GGN term of `A` |
/// | `rank_rtol` | 1e-10 | singular values of `M` / eigenvalues of `A` below this × max are null |
/// | `truncate` | true | the prior-variance truncation rule |
/// | `lanczos_pivot_tol` | 1e-10 | Lanczos' relative tolerance for a vanishing pivot |
/// | `truncate_at_data` | false | also enforce the truncation bound at the training inputs (extension) |
/// | `lanczos_restarts` | 64 | deflated restarts after an early invariant subspace (repeated eigenvalues) |
/// | `ggn_scale` | 1 | multiplies the data term `Σᵢ J(xᵢ)ᵀ Hᵢ J(xᵢ)` (subset estimates) |
/// | `prior_jitter` | 0 | `ε / mean diag Σ(C, C)` added to `Σ(C, C)` before step 1 (0: the paper's pseudo-inverse) |
/// | `gram_cache_bytes` | 256 MiB | step 1 keeps `Σ(C, C)`'s kernel tiles when they fit (same bits, fewer kernel evaluations) |
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FspLaplaceConfig {
    /// Maximum Lanczos rank `r`.
    pub max_rank: usize,
    /// Data points per batch in step 4 (and context points per batch in step 6).
    pub data_batch: usize,
    /// Relative threshold for the numerical rank of `M` and `A`.
    pub rank_rtol: f64,
    /// Apply the truncation rule.
    pub truncate: bool,
    /// Extension of the paper's rule: enforce `var f(x) ≤ Σ(x, x)` at the training inputs as
    /// well as at the context points. In a linear-Gaussian model the posterior variance is
    /// below the prior's *everywhere*; the paper checks it only at `C`, which leaves data points
    /// between coarse context points free to exceed it (observed on two moons with 100 grid
    /// points: up to 6× the prior variance at training inputs).
    pub truncate_at_data: bool,
    /// Lanczos pivot tolerance.
    pub lanczos_pivot_tol: f64,
    /// Deflated Lanczos restarts (see `fspace_linalg::pinv_factor_restarted`): a single Krylov
    /// space misses repeated eigenvalues, which every independent-output kernel (`K ⊗ I_{d'}`)
    /// and every product kernel on a symmetric grid has.
    pub lanczos_restarts: usize,
    /// Multiplies the data term `Σᵢ J(xᵢ)ᵀ Hᵢ J(xᵢ)` of step 4. With a random `m`-point subset of
    /// the `n` training points passed as the data and `ggn_scale = n/m`, the term is an unbiased
    /// estimate of the full sum at `m/n` of the cost — the image runs, where the full sum costs
    /// `rank` forward-mode passes over 54 000 images. The paper: 1 on all the data.
    pub ggn_scale: f64,
    /// Relative jitter added to `Σ(C, C)` before its pseudo-inverse in step 1: `ε = prior_jitter
    /// × mean diag Σ(C, C)`. 0 (the paper's Alg. 2) uses the pseudo-inverse of `Σ(C, C)`
    /// itself; Alg. 1's training solves with `Σ(C, C) + 1e-3 × mean diag · I`. Without jitter the
    /// pseudo-inverse of a nearly low-rank `Σ(C, C)` is sensitive to the weights: a one-ulp
    /// change of them (another thread count, a sharded sum's order) moved the predictive
    /// covariance by 1e-4 on a 1-D toy and MNIST probabilities by 1e-3 (docs/PERFORMANCE.md,
    /// "Sharded fitting"); 1e-6 brought the toy's to 3e-11. Set it where runs must agree across
    /// machines.
    pub prior_jitter: f64,
    /// Memory step 1 may spend on `Σ(C, C)`: when its `8·(n_C·d')²` bytes fit, Lanczos multiplies
    /// by kept kernel tiles ([`GramOperator::with_tile_cache`]) instead of evaluating the kernel
    /// `n_C²` times per step: the same products bit for bit, at `O(n_C²d'²)` memory instead of
    /// the matrix-free `O(n_C·d)`. 0 keeps step 1 matrix-free at every size.
    pub gram_cache_bytes: usize,
}

impl Default for FspLaplaceConfig {
    fn default() -> Self {
        Self {
            max_rank: 500,
            data_batch: 256,
            rank_rtol: 1e-10,
            truncate: true,
            truncate_at_data: false,
            lanczos_pivot_tol: 1e-10,
            lanczos_restarts: 64,
            ggn_scale: 1.0,
            prior_jitter: 0.0,
            gram_cache_bytes: 256 << 20,
        }
    }
}

/// What Alg. 2 did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LaplaceReport {
    /// Columns of `L` (Lanczos rank).
    pub lanczos_rank: usize,
    /// Lanczos runs (1 + deflated restarts).
    pub lanczos_runs: usize,
    /// Why Lanczos stopped (`MaxRank`, `InvariantSubspace`, `SingularPivot`, `FullDimension`).
    pub lanczos_stop: String,
    /// `Ldlt` or `Eigen` (see `fspace_linalg::pinv_factor`).
    pub pinv_method: String,
    /// Numerical rank of `M = J(C)ᵀL`.
    pub range_rank: usize,
    /// Eigenvalues of `A`, ascending (the precision in the retained basis).
    pub precision_eigenvalues: Vec<f64>,
    /// Columns dropped by the truncation rule.
    pub truncated: usize,
    /// Final rank of `S`.
    pub rank: usize,
}

/// The FSP-Laplace posterior `N(w*, S Sᵀ)` of a network, with its GLM predictive.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FspLaplace<N> {
    net: N,
    s: DMatrix<f64>,
    u: DMatrix<f64>,
    report: LaplaceReport,
    /// The observation model (`None` in files written before it was stored, and from
    /// [`laplace`], which takes a `dyn Likelihood`; see [`FspLaplace::with_likelihood`]).
    #[serde(default)]
    likelihood: Option<LikelihoodSpec>,
}

/// Row-batches `[start, end)` of `n` rows.
fn batches(n: usize, size: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..n).step_by(size.max(1)).map(move |s| (s, (s + size.max(1)).min(n)))
}

/// The reduce step of a sharded Alg. 2 ([`laplace_sharded`]): called once with this process's
/// part of step 4's sum over the data, `Σ_B (J_B U)ᵀ H_B (J_B U)` over its own points (`k × k`),
/// and a fingerprint of the basis `U` it was taken in (`[k, Σ U, Σ U²]`, equal on every
/// process that runs the same network, prior and context points); returns the sum of every
/// process's part. The engine (torch.distributed, MPI) is the caller's.
pub type ReduceStep<'a> = dyn FnMut(DMatrix<f64>, &[f64]) -> Result<DMatrix<f64>> + 'a;

/// Alg. 2 at the trained weights of `net`: data `x`/`y` (likelihood `likelihood`), prior
/// `prior` and fixed context points `context` (`n_C × d`).
pub fn laplace<N: Network + Clone>(
    net: &N,
    likelihood: &dyn Likelihood,
    prior: &GpPrior,
    x: &DMatrix<f64>,
    y: &DVector<f64>,
    context: &DMatrix<f64>,
    config: &FspLaplaceConfig,
) -> Result<FspLaplace<N>> {
    laplace_inner(net, likelihood, prior, x, y, context, config, None)
}

/// Alg. 2 with its data split across processes: each process passes its own points `x`/`y`;
/// steps 1–3 (the prior's factor at the context points and the basis `U`) depend on the
/// network, the prior and the context points alone and are computed on every process; step
/// 4's sum over the data goes through `reduce`, so every process finishes the posterior of all
/// the points (the single-process one up to the order of the additions). The context points
/// and the settings must be the same on every process; `truncate_at_data` is refused (its
/// bound is taken at the data points, which no process holds whole).
pub fn laplace_sharded<N: Network + Clone>(
    net: &N,
    likelihood: &dyn Likelihood,
    prior: &GpPrior,
    x: &DMatrix<f64>,
    y: &DVector<f64>,
    context: &DMatrix<f64>,
    config: &FspLaplaceConfig,
    reduce: &mut ReduceStep<'_>,
) -> Result<FspLaplace<N>> {
    if config.truncate_at_data {
        return Err(invalid(
            "truncate_at_data",
            "takes the truncation bound at every data point, which a sharded fit does not hold in one process",
        ));
    }
    laplace_inner(net, likelihood, prior, x, y, context, config, Some(reduce))
}

#[allow(clippy::too_many_arguments)]
fn laplace_inner<N: Network + Clone>(
    net: &N,
    likelihood: &dyn Likelihood,
    prior: &GpPrior,
    x: &DMatrix<f64>,
    y: &DVector<f64>,
    context: &DMatrix<f64>,
    config: &FspLaplaceConfig,
    reduce: Option<&mut ReduceStep<'_>>,
) -> Result<FspLaplace<N>> {
    // The data's shapes before steps 1–3, which take the longest.
    check_likelihood(net, likelihood)?;
    check_batch(net, likelihood, x, y)?;
    let basis = LaplaceBasis::new(net, prior, context, config)?;
    let mut sum = basis.zero_sum();
    basis.add_checked(&mut sum, likelihood, x, y)?;
    if let Some(reduce) = reduce {
        let summed = reduce(sum.matrix.clone(), &basis.fingerprint())?;
        sum = DataSum::with_matrix(&sum, summed, sum.points)?;
    }
    basis.finish(prior, &sum, config.truncate_at_data.then_some(x))
}

fn check_likelihood<N: Network + ?Sized>(net: &N, likelihood: &dyn Likelihood) -> Result<()> {
    ensure_dim("likelihood outputs vs. network outputs", net.output_dim(), likelihood.output_dim())
}

/// A batch's shapes and targets against the network and the likelihood.
fn check_batch<N: Network + ?Sized>(
    net: &N,
    likelihood: &dyn Likelihood,
    x: &DMatrix<f64>,
    y: &DVector<f64>,
) -> Result<()> {
    ensure_dim("data inputs vs. network inputs", net.input_dim(), x.ncols())?;
    let t = likelihood.target_dim();
    ensure_dim("targets vs. data points × targets per point", x.nrows() * t, y.len())?;
    likelihood.check_targets(y)?;
    Ok(())
}

/// Steps 1–3 of Alg. 2 — the prior's pseudo-inverse factor `L` at the context points, `M =
/// J(C)ᵀL` and its range `U` (`p × k`) with the singular values `D` — which depend on the
/// network, the prior and the context points alone. The data enter only through step 4's `k ×
/// k` sum `Σ_B (J_B U)ᵀ H_B (J_B U)`, which [`LaplaceBasis::add`] takes batch by batch into a
/// [`DataSum`]; sums over disjoint batches (or over the shards of several processes) merge by
/// addition ([`DataSum::merge`]), and [`LaplaceBasis::finish`] runs steps 5–6 on the total.
/// So a data set streams through Alg. 2 with one batch in memory, and [`laplace`] is `new`,
/// one `add` over all the points, and `finish`.
#[derive(Debug, Clone)]
pub struct LaplaceBasis<N> {
    net: N,
    context: DMatrix<f64>,
    u: DMatrix<f64>,
    d2: DVector<f64>,
    config: FspLaplaceConfig,
    /// `[k, Σ U, Σ U²]`, taken once (two passes over `U`, `p × k`).
    fingerprint: [f64; 3],
    lanczos_rank: usize,
    lanczos_runs: usize,
    lanczos_stop: StopReason,
    pinv_method: PinvMethod,
}

/// Step 4's sum over data points in a [`LaplaceBasis`]: `Σ (J_B U)ᵀ H_B (J_B U)` (`k × k`,
/// without `D²` and without `ggn_scale`), the number of points in it, and the fingerprint of
/// the basis it was taken in (`[k, Σ U, Σ U²]`).
#[derive(Debug, Clone, PartialEq)]
pub struct DataSum {
    matrix: DMatrix<f64>,
    points: usize,
    fingerprint: [f64; 3],
}

impl DataSum {
    /// The `k × k` sum.
    pub fn matrix(&self) -> &DMatrix<f64> {
        &self.matrix
    }

    /// The data points summed.
    pub fn points(&self) -> usize {
        self.points
    }

    /// The fingerprint of the basis the sum was taken in.
    pub fn fingerprint(&self) -> [f64; 3] {
        self.fingerprint
    }

    /// Adds another sum over other points, taken in the same basis (refused otherwise: sums
    /// in different bases do not add).
    pub fn merge(&mut self, other: &DataSum) -> Result<()> {
        if self.fingerprint != other.fingerprint {
            return Err(invalid(
                "the data sums to merge",
                "were taken in different bases (another network, prior, context or setting)",
            ));
        }
        self.matrix += &other.matrix;
        self.points += other.points;
        Ok(())
    }

    /// A sum formed elsewhere (every process's, all-reduced) in the basis of `like`: a
    /// finite `k × k` matrix over `points` points.
    pub fn with_matrix(like: &DataSum, matrix: DMatrix<f64>, points: usize) -> Result<DataSum> {
        let k = like.matrix.nrows();
        if matrix.shape() != (k, k) || matrix.iter().any(|v| !v.is_finite()) {
            return Err(invalid(
                "the summed data term",
                format!("must be a finite {k} × {k} matrix, got {} × {}", matrix.nrows(), matrix.ncols()),
            ));
        }
        Ok(DataSum { matrix, points, fingerprint: like.fingerprint })
    }
}

impl<N: Network + Clone> LaplaceBasis<N> {
    /// Steps 1–3 at the weights of `net`, prior `prior`, context points `context` (`n_C × d`).
    pub fn new(net: &N, prior: &GpPrior, context: &DMatrix<f64>, config: &FspLaplaceConfig) -> Result<Self> {
        let (d, q) = (net.input_dim(), net.output_dim());
        prior.check(d, q)?;
        ensure_dim("context-point dimension vs. network inputs", d, context.ncols())?;
        if context.nrows() == 0 {
            return Err(invalid("context points", "at least one is needed"));
        }
        if config.max_rank == 0 || config.data_batch == 0 {
            return Err(invalid("max_rank / data_batch", "must be ≥ 1"));
        }
        if !(config.rank_rtol.is_finite() && config.rank_rtol > 0.0 && config.rank_rtol < 1.0) {
            return Err(invalid("rank_rtol", format!("{} must lie in (0, 1)", config.rank_rtol)));
        }
        if !(config.ggn_scale.is_finite() && config.ggn_scale > 0.0) {
            return Err(invalid("ggn_scale", format!("{} must be finite and > 0", config.ggn_scale)));
        }
        if !(config.prior_jitter.is_finite() && config.prior_jitter >= 0.0) {
            return Err(invalid("prior_jitter", format!("{} must be finite and ≥ 0", config.prior_jitter)));
        }
        let p = net.params().len();

        // 1. L Lᵀ ≈ Σ(C,C)†, Lanczos started from J(C)·1.
        let start = point_major(&net.jvp(context, &DVector::from_element(p, 1.0))?);
        let start = if start.norm() > 0.0 { StartVector::Given(start) } else { StartVector::Ones };
        let op = GramOperator::new(&*prior.kernel, context)?.with_tile_cache(config.gram_cache_bytes);
        let lanczos = LanczosConfig {
            max_rank: config.max_rank.min(context.nrows() * q),
            start,
            pivot_tol: config.lanczos_pivot_tol,
            ..Default::default()
        };
        let (l, restarted) = if config.prior_jitter > 0.0 {
            let eps = config.prior_jitter * op.diagonal().mean();
            let jittered =
                SumOperator::new(op, DiagonalOperator::identity_scaled(context.nrows() * q, eps)?)?;
            pinv_factor_restarted(&jittered, &lanczos, config.lanczos_restarts, 0x1a2c)?
        } else {
            pinv_factor_restarted(&op, &lanczos, config.lanczos_restarts, 0x1a2c)?
        };
        let info = &restarted.runs[0];

        // 2–3. M = J(C)ᵀL (p × r) and its range: the left singular vectors of M, or, when the
        // prior's rank r exceeds the weights p (a small network with many context points), the
        // right singular vectors of Mᵀ.
        let m = net.vjp_columns(context, &l)?;
        let (left, singular) = if m.nrows() >= m.ncols() {
            let svd = thin_svd_owned(m)?;
            (svd.u, svd.s)
        } else {
            let svd = thin_svd_owned(m.transpose())?;
            (svd.v, svd.s)
        };
        let smax = singular[0];
        let k = singular.iter().take_while(|&&s| s > config.rank_rtol * smax).count();
        if k == 0 {
            return Err(invalid(
                "context points",
                "J(C)ᵀ Σ(C,C)† J(C) vanishes: the network is constant there",
            ));
        }
        let d2 = singular.rows(0, k).map(|s| s * s);
        let u = if k == left.ncols() { left } else { left.columns(0, k).into_owned() };
        let fingerprint = [k as f64, u.sum(), u.norm_squared()];
        Ok(Self {
            net: net.clone(),
            context: context.clone(),
            u,
            d2,
            config: config.clone(),
            fingerprint,
            lanczos_rank: l.ncols(),
            lanczos_runs: restarted.runs.len(),
            lanczos_stop: info.lanczos.stop,
            pinv_method: info.method,
        })
    }

    /// Alg. 2's settings.
    pub fn config(&self) -> &FspLaplaceConfig {
        &self.config
    }

    /// `k`, the dimension of the basis (the numerical rank of `M`).
    pub fn rank(&self) -> usize {
        self.u.ncols()
    }

    /// `[k, Σ U, Σ U²]`: equal on every process that runs the same network, prior, context
    /// points and settings (the same bits).
    pub fn fingerprint(&self) -> [f64; 3] {
        self.fingerprint
    }

    /// The sum over no points.
    pub fn zero_sum(&self) -> DataSum {
        let k = self.rank();
        DataSum { matrix: DMatrix::zeros(k, k), points: 0, fingerprint: self.fingerprint() }
    }

    /// Step 4 over the points `x` (targets `y`, flat, `likelihood.target_dim()` per point),
    /// added to `sum`: `r` forward-mode products per `data_batch` points, a Ctrl-C check
    /// between them. Errors: shapes or targets the network and the likelihood do not take, a
    /// sum from another basis; `sum` is left as it was.
    pub fn add(
        &self,
        sum: &mut DataSum,
        likelihood: &dyn Likelihood,
        x: &DMatrix<f64>,
        y: &DVector<f64>,
    ) -> Result<()> {
        check_likelihood(&self.net, likelihood)?;
        check_batch(&self.net, likelihood, x, y)?;
        self.add_checked(sum, likelihood, x, y)
    }

    fn add_checked(
        &self,
        sum: &mut DataSum,
        likelihood: &dyn Likelihood,
        x: &DMatrix<f64>,
        y: &DVector<f64>,
    ) -> Result<()> {
        if sum.fingerprint != self.fingerprint() {
            return Err(invalid("the data sum", "was taken in another basis"));
        }
        let (q, t, k) = (self.net.output_dim(), likelihood.target_dim(), self.rank());
        let mut part = DMatrix::zeros(k, k);
        for (s0, s1) in batches(x.nrows(), self.config.data_batch) {
            fspace_input::interrupt::check("FSP-Laplace's pass over the data")?;
            let xb = x.rows(s0, s1 - s0).into_owned();
            let yb = y.rows(s0 * t, (s1 - s0) * t).into_owned();
            let hess = likelihood.nll_hessian(&self.net.forward(&xb)?, &yb)?;
            let g = self.net.jvp_columns(&xb, &self.u)?; // (b·q) × k
            let mut hg = DMatrix::zeros(g.nrows(), k);
            for (i, h) in hess.iter().enumerate() {
                let rows = g.rows(i * q, q);
                hg.rows_mut(i * q, q).copy_from(&(h * rows));
            }
            part += g.transpose() * &hg; // blocked GEMM (nalgebra's gemm_tr is an unblocked loop)
        }
        sum.matrix += &part;
        sum.points += x.nrows();
        Ok(())
    }

    /// Steps 5–6 on the data sum: `A = D² + ggn_scale · sum`, `S = U U_A D_A^{-1/2}`, and the
    /// truncation at the context points (and at `data_points` with `truncate_at_data`, which
    /// needs them: refused without).
    pub fn finish(
        self,
        prior: &GpPrior,
        sum: &DataSum,
        data_points: Option<&DMatrix<f64>>,
    ) -> Result<FspLaplace<N>> {
        let (k, config) = (self.rank(), &self.config);
        if sum.fingerprint != self.fingerprint() || sum.matrix.shape() != (k, k) {
            return Err(invalid("the data sum", "was taken in another basis"));
        }
        if config.truncate_at_data && data_points.is_none() {
            return Err(invalid(
                "truncate_at_data",
                "takes the truncation bound at the data points, which a fit over batches does not hold",
            ));
        }
        let (net, u) = (self.net, self.u);
        // 4. A = D² + c·Σ_B (J_B U)ᵀ H_B (J_B U).
        let mut a = &sum.matrix * config.ggn_scale;
        for i in 0..k {
            a[(i, i)] += self.d2[i];
        }
        let a = (&a + a.transpose()) * 0.5;

        // 5. S = U U_A D_A^{-1/2}, ascending eigenvalues (largest variance first).
        let (values, vectors) = sym_eigh(&a)?;
        let lmax = values[0];
        let keep: Vec<usize> =
            (0..values.len()).rev().filter(|&i| values[i] > config.rank_rtol * lmax).collect();
        let mut s = &u * vectors.select_columns(&keep);
        for (c, &i) in keep.iter().enumerate() {
            s.column_mut(c).scale_mut(values[i].powf(-0.5));
        }
        let precision_eigenvalues: Vec<f64> = keep.iter().map(|&i| values[i]).collect();

        // 6. Truncation: the smallest k with diag(J(C) S_{:,k:} S_{:,k:}ᵀ J(C)ᵀ) ≤ diag Σ(C,C).
        let truncated = if config.truncate && s.ncols() > 0 {
            let mut first_ok = truncation_index(&net, prior, &self.context, &s, config.data_batch)?;
            if let (true, Some(x)) = (config.truncate_at_data, data_points) {
                first_ok = first_ok.max(truncation_index(&net, prior, x, &s, config.data_batch)?);
            }
            first_ok
        } else {
            0
        };
        // In place: no second `p × rank` copy beside `U` and `S`.
        let s = if truncated == 0 { s } else { s.remove_columns(0, truncated) };
        let report = LaplaceReport {
            lanczos_rank: self.lanczos_rank,
            lanczos_runs: self.lanczos_runs,
            lanczos_stop: stop_name(self.lanczos_stop).into(),
            pinv_method: match self.pinv_method {
                PinvMethod::Ldlt => "Ldlt",
                PinvMethod::Eigen => "Eigen",
            }
            .into(),
            range_rank: k,
            precision_eigenvalues,
            truncated,
            rank: s.ncols(),
        };
        Ok(FspLaplace { net, s, u, report, likelihood: None })
    }
}

/// The smallest `k` such that `diag(J(P) S_{:,k:} S_{:,k:}ᵀ J(P)ᵀ) ≤ diag Σ(P, P)` at every
/// point of `points` and output (the columns of `S` ordered by decreasing variance): the
/// maximum over rows of each row's own minimum, computed batch-wise.
fn truncation_index<N: Network + ?Sized>(
    net: &N,
    prior: &GpPrior,
    points: &DMatrix<f64>,
    s: &DMatrix<f64>,
    batch: usize,
) -> Result<usize> {
    let r = s.ncols();
    let mut first_ok = 0;
    for (c0, c1) in batches(points.nrows(), batch) {
        fspace_input::interrupt::check("FSP-Laplace's truncation")?;
        let block = points.rows(c0, c1 - c0).into_owned();
        let prior_var = prior.variances(&block)?;
        let jc = net.jvp_columns(&block, s)?;
        for row in 0..jc.nrows() {
            let bound = prior_var[row] * (1.0 + 1e-12);
            let mut tail = 0.0;
            for j in (0..r).rev() {
                tail += jc[(row, j)] * jc[(row, j)];
                if tail > bound {
                    first_ok = first_ok.max(j + 1);
                    break;
                }
            }
        }
    }
    Ok(first_ok)
}

fn stop_name(stop: StopReason) -> &'static str {
    match stop {
        StopReason::MaxRank => "MaxRank",
        StopReason::InvariantSubspace => "InvariantSubspace",
        StopReason::SingularPivot => "SingularPivot",
        StopReason::FullDimension => "FullDimension",
    }
}

fn to_core(e: crate::error::FspError) -> CoreError {
    match e {
        crate::error::FspError::Core(c) => c,
        other => CoreError::method("FSP-Laplace posterior", other),
    }
}

/// Saves the network at `w*`, the factor `S`, the range basis and the report.
impl<N: Network + Clone + Serialize + DeserializeOwned> Persist for FspLaplace<N> {
    const KIND: &'static str = "fspace_fsp_laplace::FspLaplace";
    const VERSION: u32 = 1;

    /// The network checked itself while it was read; here: `S` (`p × rank`) and `U`
    /// (`p × range_rank`) against the network and the report, finite.
    fn validate_loaded(&self) -> std::result::Result<(), PersistError> {
        let check = fspace_core::LoadCheck::new(Self::KIND);
        let p = self.net.n_params();
        check.shape("s", self.s.shape(), (p, self.report.rank))?;
        check.finite("s", self.s.iter())?;
        check.ensure(self.report.range_rank >= 1, "report.range_rank", || "must be ≥ 1".into())?;
        check.shape("u", self.u.shape(), (p, self.report.range_rank))?;
        check.finite("u", self.u.iter())?;
        check.finite("report.precision_eigenvalues", self.report.precision_eigenvalues.iter())?;
        match &self.likelihood {
            Some(spec) => check.likelihood("likelihood", spec, self.net.output_dim()),
            None => Ok(()),
        }
    }
}

impl<N: Network> FspLaplace<N> {
    /// The same posterior with the observation model Alg. 2 used, for
    /// [`Posterior::predict_y`] and [`Posterior::class_probabilities`] ([`fit`](crate::fit)
    /// and [`fit_posthoc`](crate::fit_posthoc) attach it). Errors: a spec whose outputs differ
    /// from the network's.
    pub fn with_likelihood(self, likelihood: LikelihoodSpec) -> Result<Self> {
        likelihood.validate()?;
        ensure_dim("likelihood outputs vs. network outputs", self.net.output_dim(), likelihood.output_dim())?;
        Ok(Self { likelihood: Some(likelihood), ..self })
    }

    /// The network at the MAP weights `w*` (the posterior mean).
    pub fn network(&self) -> &N {
        &self.net
    }

    /// `S` (`p × rank`): the posterior covariance of the weights is `S Sᵀ`.
    pub fn covariance_factor(&self) -> &DMatrix<f64> {
        &self.s
    }

    /// `U` (`p × range_rank`): orthonormal basis of `range(M)`, the subspace the approximation
    /// lives in (`P = U Uᵀ`, `P₀ = I − P`).
    pub fn range_basis(&self) -> &DMatrix<f64> {
        &self.u
    }

    /// Diagnostics of Alg. 2.
    pub fn report(&self) -> &LaplaceReport {
        &self.report
    }

    /// `J(X) S` point-major (`n·d' × rank`), batch-wise.
    pub fn jacobian_times_factor(&self, x: &DMatrix<f64>) -> Result<DMatrix<f64>> {
        Ok(self.net.jvp_columns(x, &self.s)?)
    }

    fn marginals(&self, x: &DMatrix<f64>) -> Result<FunctionPredictive> {
        ensure_dim("input dimension vs. network inputs", self.net.input_dim(), x.ncols())?;
        let q = self.net.output_dim();
        let mut mean = DMatrix::zeros(x.nrows(), q);
        let mut var = DMatrix::zeros(x.nrows(), q);
        // Chunks of points: bounded temporaries, and a Ctrl-C check between them.
        for (s0, s1) in batches(x.nrows(), 512) {
            fspace_input::interrupt::check("FSP-Laplace's predictive")?;
            let xb = x.rows(s0, s1 - s0).into_owned();
            mean.rows_mut(s0, s1 - s0).copy_from(&self.net.forward(&xb)?);
            let g = self.jacobian_times_factor(&xb)?;
            for row in 0..g.nrows() {
                var[(s0 + row / q, row % q)] = g.row(row).norm_squared();
            }
        }
        Ok(FunctionPredictive::new(mean, var)?)
    }
}

impl<N: Network> Posterior for FspLaplace<N> {
    fn output_dim(&self) -> usize {
        self.net.output_dim()
    }

    fn likelihood(&self) -> Option<LikelihoodSpec> {
        self.likelihood
    }

    /// Mean `f(x; w*)`, variance `‖J(x) S‖²` per output.
    fn predict(&self, x: &DMatrix<f64>) -> fspace_core::Result<FunctionPredictive> {
        self.marginals(x).map_err(to_core)
    }

    fn predict_joint(&self, x: &DMatrix<f64>) -> fspace_core::Result<(DMatrix<f64>, DMatrix<f64>)> {
        fspace_core::ensure_joint_fits(x.nrows(), fspace_core::Posterior::output_dim(self))?;
        let mean = self.net.forward(x).map_err(|e| to_core(e.into()))?;
        let g = self.jacobian_times_factor(x).map_err(to_core)?;
        fspace_core::checked_joint(mean, &g * g.transpose())
    }

    /// `f(x; w*) + J(x) S z`, `z ~ N(0, I_rank)`: exact for the linearised model; the `s`
    /// forward-mode products share one forward trace ([`Network::jvp_blocks`]).
    fn sample_functions(
        &self,
        x: &DMatrix<f64>,
        s: usize,
        rng: &mut dyn RngCore,
    ) -> fspace_core::Result<Vec<DMatrix<f64>>> {
        fspace_core::ensure_samples_fit(s, x.nrows(), fspace_core::Posterior::output_dim(self))?;
        fspace_input::budget::ensure(
            "weight-space directions (n_params × n_samples)",
            fspace_input::budget::matrix_bytes(self.s.nrows(), s),
            "fewer n_samples",
        )?;
        let mean = self.net.forward(x).map_err(|e| to_core(e.into()))?;
        // z drawn sample by sample (column-major fill), as one draw per sample would.
        let z = DMatrix::from_fn(self.s.ncols(), s, |_, _| StandardNormal.sample(rng));
        let dw = &self.s * z;
        let ju = self.net.jvp_blocks(x, &dw).map_err(|e| to_core(e.into()))?;
        fspace_core::finite_samples(ju.into_iter().map(|j| &mean + j).collect())
    }
}
