//! Lanczos tridiagonalisation with full reorthogonalisation and an embedded LDLᵀ factorisation
//! of the tridiagonal (Golub & Van Loan §10.1, §11.3.5), for symmetric PSD operators.
//!
//! After `k` steps, `A Q = Q T + β_k q_{k+1} e_kᵀ` with orthonormal `Q` (`n × k`) and tridiagonal
//! `T = QᵀAQ` (diagonal `α`, off-diagonal `β`). The factorisation `T = L D Lᵀ` (unit lower
//! bidiagonal `L`, pivots `D`) is updated as the iteration runs: `d₁ = α₁`,
//! `lⱼ = βⱼ/dⱼ`, `d_{j+1} = α_{j+1} − βⱼ lⱼ`. A pivot that is ≤ `pivot_tol·‖T‖` stops the
//! iteration: the Krylov space has reached the operator's (numerical) null space — or the
//! operator is indefinite.
//!
//! Why the pivots are not the final word: once `T` is numerically singular, its later pivots
//! carry errors of order `ε·κ(T)` and their sign is meaningless. Definiteness and regularity are
//! therefore decided on the Ritz values of `T` (accurate to `O(ε‖A‖)` under full
//! reorthogonalisation), computed once at the end in `O(k³)`: a Ritz value below
//! `−max(pivot_tol, 1e-12)·‖T‖` proves the operator indefinite (typed error).
//!
//! [`pinv_factor`] turns this into `F` (`n × r`) with `F Fᵀ ≈ A†`, the factor FSP-Laplace's
//! Algorithm 2 needs (`L Lᵀ ≈ Σ(C, C)†`):
//! * regular case: `F = Q L⁻ᵀ D^{-1/2}`, so `F Fᵀ = Q T⁻¹ Qᵀ`, in `O(n·k)` from the pivots;
//! * singular `T` (the start vector had a component in the null space): the pseudo-inverse of
//!   `T` by its eigendecomposition, `F = Q W₊ Θ₊^{-1/2}` over eigenvalues above the cut-off.
//!
//! When the Krylov space contains the range of `A` (rank reached), `Q T† Qᵀ = A†` exactly.
//! Memory is `O(n·k)`: the `n × n` matrix is never formed.

use fspace_input::InputError;
use nalgebra::{DMatrix, DVector};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::StandardNormal;

use crate::error::{LinalgError, Result};
use crate::operator::LinearOperator;

/// Where the Lanczos iteration starts.
#[derive(Debug, Clone, PartialEq)]
pub enum StartVector {
    /// A given vector (normalised internally; must be non-zero and finite).
    Given(DVector<f64>),
    /// A standard-normal vector drawn from this seed.
    Random(u64),
    /// The all-ones vector.
    Ones,
}

/// Options of the Lanczos iteration.
///
/// | name | default | purpose |
/// |---|---|---|
/// | `max_rank` | 500 | most iterations (FSP-Laplace: "at most 500 Lanczos iterations") |
/// | `breakdown_tol` | 1e-12 | stop when `β_k ≤ tol·‖T‖` (invariant subspace) |
/// | `pivot_tol` | 1e-10 | pivots / eigenvalues below `tol·‖T‖` count as zero |
/// | `start` | `Random(0)` | start vector |
/// | `check_symmetry` | true | one probe `⟨Au, v⟩ = ⟨u, Av⟩` before iterating (2 extra products) |
/// | `project_start` | true | start from `A v₀` instead of `v₀` (1 extra product), see below |
/// | `negative_tol` | 1e-12 | a Ritz value below `−max(tol, pivot_tol)·max|θ|` means "not PSD" |
/// | `stop_at_singular_pivot` | true | with `project_start`, a vanishing pivot ends the iteration |
///
/// `project_start`: a start vector with a component in `null(A)` puts that direction into the
/// Krylov space, and `T` then drifts towards singularity before the range of `A` is captured.
/// Starting from `A v₀ ∈ range(A)` keeps the whole iteration inside the range, so a vanishing
/// pivot or `β` really means that the numerical rank has been reached. (FSP-Laplace Alg. 2
/// starts from `J(C)·1`; with this option the first Lanczos vector is `Σ(C,C)·J(C)·1`.)
#[derive(Debug, Clone, PartialEq)]
pub struct LanczosConfig {
    /// Maximum number of iterations (= maximum rank), ≥ 1.
    pub max_rank: usize,
    /// Relative breakdown tolerance on `β`.
    pub breakdown_tol: f64,
    /// Relative tolerance below which pivots / eigenvalues are treated as zero.
    pub pivot_tol: f64,
    /// Start vector.
    pub start: StartVector,
    /// Probe the operator for symmetry first.
    pub check_symmetry: bool,
    /// Start from `A v₀` (projects the start vector onto the range of `A`).
    pub project_start: bool,
    /// A Ritz value below `−max(negative_tol, pivot_tol) · max|θ|` is an error (the operator
    /// is not PSD); above it, a negative one is rounding of a PSD operator's null space.
    pub negative_tol: f64,
    /// With `project_start`, stop when a pivot of `T`'s LDLᵀ falls to `pivot_tol·‖T‖`: right
    /// when `T` is to be inverted (the pseudo-inverse factors). A top-`k` eigensolve turns it
    /// off: on an operator whose spectrum spans many orders of magnitude (a network's GGN),
    /// Lanczos finds the bottom of the spectrum as fast as its top, so a tiny pivot there says
    /// that a tiny eigenvalue has been found, not that the range is exhausted or the top pairs
    /// have converged (`docs/PERFORMANCE.md`, the ResNet lowrank rows).
    pub stop_at_singular_pivot: bool,
}

impl Default for LanczosConfig {
    fn default() -> Self {
        Self {
            max_rank: 500,
            breakdown_tol: 1e-12,
            pivot_tol: 1e-10,
            start: StartVector::Random(0),
            check_symmetry: true,
            project_start: true,
            negative_tol: 1e-12,
            stop_at_singular_pivot: true,
        }
    }
}

/// Why the iteration stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// `max_rank` iterations were done.
    MaxRank,
    /// `β` vanished: `Q` spans an invariant subspace (for a random start, the whole range).
    InvariantSubspace,
    /// A pivot of `T`'s LDLᵀ vanished (checked only with `project_start` and
    /// `stop_at_singular_pivot`): the Krylov space has exhausted the numerical range of `A`, or
    /// found an eigenvalue below `pivot_tol·‖T‖`.
    SingularPivot,
    /// Every direction of ℝⁿ is spanned (`k = n`).
    FullDimension,
}

/// Diagnostics of a Lanczos run.
#[derive(Debug, Clone, PartialEq)]
pub struct LanczosInfo {
    /// Iterations done (columns of `Q`).
    pub iterations: usize,
    /// Why it stopped.
    pub stop: StopReason,
    /// `β_k / ‖T‖`: the relative residual of the Krylov relation (at a singular pivot too; 0 at
    /// an invariant subspace and at the full dimension).
    pub residual: f64,
}

/// The result of a Lanczos run: `Q`, `T` (as `α`, `β`) and the LDLᵀ pivots of `T`.
#[derive(Debug, Clone)]
pub struct LanczosDecomposition {
    q: DMatrix<f64>,
    alpha: Vec<f64>,
    beta: Vec<f64>,
    pivots: Vec<f64>,
    /// Ritz values (descending) and eigenvectors of `T`.
    theta: DVector<f64>,
    w: DMatrix<f64>,
    pivot_tol: f64,
    info: LanczosInfo,
    /// Where the iteration stopped when it stopped at `max_rank` (for [`extend`](Self::extend)).
    next: Option<Continuation>,
}

/// The next Lanczos vector `q_{k+1}`, its coupling `β_k` and `‖T‖` so far.
#[derive(Debug, Clone)]
struct Continuation {
    vector: DVector<f64>,
    beta: f64,
    t_norm: f64,
}

/// The LDLᵀ factorisation of a symmetric tridiagonal matrix.
#[derive(Debug, Clone, PartialEq)]
pub struct TridiagonalLdlt {
    /// Sub-diagonal of the unit lower bidiagonal `L` (`k − 1` entries).
    pub l: Vec<f64>,
    /// Pivots `D` (`k` entries).
    pub d: Vec<f64>,
}

impl TridiagonalLdlt {
    /// `L D Lᵀ` as a dense matrix (for tests).
    pub fn reconstruct(&self) -> DMatrix<f64> {
        let k = self.d.len();
        let mut l = DMatrix::identity(k, k);
        for (j, &v) in self.l.iter().enumerate() {
            l[(j + 1, j)] = v;
        }
        &l * DMatrix::from_diagonal(&DVector::from_column_slice(&self.d)) * l.transpose()
    }
}

pub(crate) fn start_vector(start: &StartVector, n: usize) -> Result<DVector<f64>> {
    let v = match start {
        StartVector::Given(v) => {
            if v.len() != n {
                return Err(LinalgError::Input(InputError::DimensionMismatch {
                    what: "Lanczos start vector",
                    expected: n,
                    found: v.len(),
                }));
            }
            v.clone()
        }
        StartVector::Random(seed) => {
            let mut rng = StdRng::seed_from_u64(*seed);
            DVector::from_fn(n, |_, _| rng.sample(StandardNormal))
        }
        StartVector::Ones => DVector::from_element(n, 1.0),
    };
    if v.iter().any(|x| !x.is_finite()) {
        return Err(LinalgError::Input(InputError::NonFinite { what: "Lanczos start vector" }));
    }
    let norm = v.norm();
    if norm == 0.0 {
        return Err(LinalgError::Input(InputError::Invalid {
            what: "Lanczos start vector",
            reason: "is zero".into(),
        }));
    }
    Ok(v / norm)
}

/// Checks `⟨A u, v⟩ = ⟨u, A v⟩` for random `u`, `v` (relative to ‖A u‖‖v‖).
pub fn probe_symmetry(op: &dyn LinearOperator, seed: u64) -> Result<f64> {
    let n = op.dim();
    let mut rng = StdRng::seed_from_u64(seed);
    let u: DVector<f64> = DVector::from_fn(n, |_, _| rng.sample(StandardNormal));
    let v: DVector<f64> = DVector::from_fn(n, |_, _| rng.sample(StandardNormal));
    let (au, av) = (op.apply(&u)?, op.apply(&v)?);
    let scale = (au.norm() * v.norm()).max(av.norm() * u.norm());
    let asym = if scale == 0.0 { 0.0 } else { (au.dot(&v) - u.dot(&av)).abs() / scale };
    if asym > 1e-8 {
        return Err(LinalgError::NotSymmetric { what: "Lanczos operator (random probe)", asymmetry: asym });
    }
    Ok(asym)
}

/// Runs Lanczos on a symmetric PSD operator.
///
/// Errors: `max_rank = 0` or invalid tolerances (`InvalidArgument`), a bad start vector,
/// an asymmetric operator (`NotSymmetric`, when probed), non-finite products (`NonFinite`), and
/// a negative Ritz value beyond the tolerance (`NotPositiveDefinite`).
pub fn lanczos(op: &dyn LinearOperator, config: &LanczosConfig) -> Result<LanczosDecomposition> {
    let n = op.dim();
    if n == 0 {
        return Err(LinalgError::Input(InputError::Invalid {
            what: "operator",
            reason: "has dimension 0".into(),
        }));
    }
    if config.max_rank == 0 {
        return Err(LinalgError::Input(InputError::Invalid {
            what: "max_rank",
            reason: "must be ≥ 1".into(),
        }));
    }
    for (what, tol) in [("breakdown_tol", config.breakdown_tol), ("pivot_tol", config.pivot_tol)] {
        if !(tol.is_finite() && tol >= 0.0) {
            return Err(LinalgError::Input(InputError::Invalid {
                what,
                reason: format!("{tol} must be finite and ≥ 0"),
            }));
        }
    }
    if config.check_symmetry {
        probe_symmetry(op, 0x5eed)?;
    }
    let max_k = config.max_rank.min(n);
    let mut v0 = start_vector(&config.start, n)?;
    if config.project_start {
        v0 = op.apply(&v0)?;
        let norm = v0.norm();
        if norm == 0.0 {
            return Err(LinalgError::Input(InputError::Invalid {
                what: "Lanczos start vector",
                reason: "A·v₀ = 0 (the start vector lies in the null space, or A = 0)".into(),
            }));
        }
        v0 /= norm;
    }
    let mut q = DMatrix::zeros(n, max_k);
    q.set_column(0, &v0);
    let state = Iteration { q, alpha: Vec::new(), beta: Vec::new(), pivots: Vec::new(), t_norm: 0.0, k: 0 };
    state.run(op, config)
}

/// The iteration's state between steps: `Q`'s first `k` columns are done and column `k` (when
/// `k < Q.ncols()`) holds the next Lanczos vector; `β` has an entry for each vector after the
/// first.
struct Iteration {
    q: DMatrix<f64>,
    alpha: Vec<f64>,
    beta: Vec<f64>,
    pivots: Vec<f64>,
    t_norm: f64,
    k: usize,
}

impl Iteration {
    /// Steps until `Q` is full or the iteration stops, then forms `T`'s eigenpairs.
    fn run(self, op: &dyn LinearOperator, config: &LanczosConfig) -> Result<LanczosDecomposition> {
        let Iteration { mut q, mut alpha, mut beta, mut pivots, mut t_norm, mut k } = self;
        let (n, max_k) = q.shape();
        let mut next = None;
        let stop = loop {
            fspace_input::interrupt::check("the Lanczos iteration")?;
            let qk = q.column(k).into_owned();
            let mut w = op.apply(&qk)?;
            let a = qk.dot(&w);
            alpha.push(a);
            // Embedded LDLᵀ pivot of T_{k+1}.
            let d = match k {
                0 => a,
                _ => a - beta[k - 1] * beta[k - 1] / pivots[k - 1],
            };
            pivots.push(d);
            t_norm = t_norm.max(a.abs() + beta.last().copied().unwrap_or(0.0));
            k += 1;
            // Rank detection by a vanishing pivot is valid only inside range(A); an unprojected
            // start makes T drift towards singularity earlier (see `project_start`).
            let singular =
                config.stop_at_singular_pivot && config.project_start && d <= config.pivot_tol * t_norm;
            // Full reorthogonalisation, twice (Kahan–Parlett "twice is enough").
            for _ in 0..2 {
                let qk_block = q.columns(0, k);
                let coeffs = qk_block.tr_mul(&w);
                w -= qk_block * coeffs;
            }
            let b = w.norm();
            if singular {
                // The coupling to the next vector is still the Krylov residual of the Ritz pairs.
                beta.push(b);
                break StopReason::SingularPivot;
            }
            if k == n {
                break StopReason::FullDimension;
            }
            if b <= config.breakdown_tol * t_norm {
                beta.push(b);
                break StopReason::InvariantSubspace;
            }
            beta.push(b);
            w /= b;
            let t_norm_with_b = t_norm.max(a.abs() + b);
            if k == max_k {
                // Kept for `extend`: the iteration can go on from here. (The residual below is
                // relative to ‖T‖ before this β counts in it.)
                next = Some(Continuation { vector: w, beta: b, t_norm: t_norm_with_b });
                break StopReason::MaxRank;
            }
            t_norm = t_norm_with_b;
            q.set_column(k, &w);
        };
        // β has one entry per step that produced a next vector; the last one (if any) couples T
        // to the unused q_{k+1} and is the Krylov residual.
        let coupling = if beta.len() == k { beta.pop() } else { None };
        let residual = coupling.unwrap_or(0.0) / t_norm.max(f64::MIN_POSITIVE);
        // The unused columns are released in place (no copy of the basis beside it).
        let unused = q.ncols() - k;
        let q = q.remove_columns(k, unused);
        let t = tridiagonal(&alpha, &beta);
        let (theta, w) = crate::dense::sym_eigh_desc(&t)?;
        let scale = theta.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        let lowest = theta[k - 1];
        if lowest < -config.pivot_tol.max(config.negative_tol) * scale {
            return Err(LinalgError::NotPositiveDefinite {
                what: "Lanczos operator (Ritz value of T)",
                value: lowest,
            });
        }
        Ok(LanczosDecomposition {
            q,
            alpha,
            beta,
            pivots,
            theta,
            w,
            pivot_tol: config.pivot_tol,
            info: LanczosInfo { iterations: k, stop, residual },
            next,
        })
    }
}

fn tridiagonal(alpha: &[f64], beta: &[f64]) -> DMatrix<f64> {
    let mut t = DMatrix::from_diagonal(&DVector::from_column_slice(alpha));
    for (j, &b) in beta.iter().enumerate() {
        t[(j, j + 1)] = b;
        t[(j + 1, j)] = b;
    }
    t
}

impl LanczosDecomposition {
    /// The orthonormal Lanczos basis `Q` (`n × k`).
    pub fn basis(&self) -> &DMatrix<f64> {
        &self.q
    }
    /// Diagonal `α` of `T`.
    pub fn alpha(&self) -> &[f64] {
        &self.alpha
    }
    /// Off-diagonal `β` of `T` (`k − 1` entries).
    pub fn beta(&self) -> &[f64] {
        &self.beta
    }
    /// Diagnostics.
    pub fn info(&self) -> &LanczosInfo {
        &self.info
    }
    /// `T` as a dense `k × k` matrix.
    pub fn tridiagonal(&self) -> DMatrix<f64> {
        tridiagonal(&self.alpha, &self.beta)
    }
    /// The LDLᵀ factorisation of `T` computed during the iteration (meaningful when
    /// [`is_regular`](Self::is_regular); pivots after a vanishing one are not).
    pub fn ldlt(&self) -> TridiagonalLdlt {
        let l = self.beta.iter().zip(&self.pivots).map(|(b, d)| b / d).collect();
        TridiagonalLdlt { l, d: self.pivots.clone() }
    }
    /// Ritz values (descending) and Ritz vectors `Q W` (`n × k`): a truncated
    /// eigendecomposition of `A`.
    pub fn ritz(&self) -> (DVector<f64>, DMatrix<f64>) {
        (self.theta.clone(), &self.q * &self.w)
    }
    /// The leading `k` Ritz pairs `(θⱼ, Q wⱼ)`, `j < k` (all of them if `k` exceeds their
    /// number), consuming the decomposition. Each block of `Q`'s rows is multiplied by `W`'s
    /// first `k` columns and written over the same rows of `Q`'s first `k` columns, then the
    /// rest of `Q` is released, so no second `n × m` matrix is held beside `Q` (as
    /// [`ritz`](Self::ritz) holds `QW`; `docs/PERFORMANCE.md`, where `lowrank`'s peak sat).
    pub fn into_top_ritz(self, k: usize) -> (DVector<f64>, DMatrix<f64>) {
        let m = self.q.ncols();
        let k = k.min(m);
        let mut q = self.q;
        crate::dense::rotate_basis_in_place(&mut q, &self.w.columns(0, k).into_owned());
        let theta = self.theta.rows(0, k).into_owned();
        (theta, q.remove_columns(k, m - k))
    }
    /// Continues an iteration that stopped at its `max_rank` until `Q` has `config.max_rank`
    /// columns (or the iteration stops earlier), on the same operator: the same decomposition,
    /// to rounding, as one run with the larger `max_rank`, without redoing the first `k`
    /// products. `Q` grows in place (its storage is reallocated, not copied beside itself). A
    /// decomposition that stopped for another reason (an invariant subspace, a singular pivot,
    /// the full dimension), or a `max_rank` not above `k`, is returned unchanged. `config`
    /// supplies the tolerances; its start and symmetry settings are not used again.
    ///
    /// Errors: an operator of another dimension (`DimensionMismatch`), and those of
    /// [`lanczos`] during the new steps.
    pub fn extend(mut self, op: &dyn LinearOperator, config: &LanczosConfig) -> Result<Self> {
        let (n, k) = self.q.shape();
        if op.dim() != n {
            return Err(LinalgError::Input(InputError::DimensionMismatch {
                what: "operator extending a Lanczos decomposition",
                expected: n,
                found: op.dim(),
            }));
        }
        let max_k = config.max_rank.min(n);
        if max_k <= k {
            return Ok(self);
        }
        let Some(next) = self.next.take() else {
            return Ok(self);
        };
        let mut q = self.q.resize_horizontally(max_k, 0.0);
        q.set_column(k, &next.vector);
        let mut beta = self.beta;
        beta.push(next.beta);
        Iteration { q, alpha: self.alpha, beta, pivots: self.pivots, t_norm: next.t_norm, k }.run(op, config)
    }
    /// Relative residuals of the Ritz pairs, `‖A yⱼ − θⱼ yⱼ‖ / ‖T‖ = (β_k/‖T‖)·|w_{k,j}|` (the
    /// last component of `T`'s eigenvector times the Krylov residual; 0 at an invariant
    /// subspace), in the order of [`ritz_values`](Self::ritz_values).
    pub fn ritz_residuals(&self) -> DVector<f64> {
        let k = self.theta.len();
        DVector::from_fn(k, |j, _| self.info.residual * self.w[(k - 1, j)].abs())
    }
    /// Ritz values only (eigenvalues of `T`, descending).
    pub fn ritz_values(&self) -> &DVector<f64> {
        &self.theta
    }
    /// Whether `T` is safely invertible: the iteration did not stop on a vanishing pivot and
    /// the smallest Ritz value exceeds `pivot_tol` times the largest.
    pub fn is_regular(&self) -> bool {
        let k = self.theta.len();
        self.info.stop != StopReason::SingularPivot && self.theta[k - 1] > self.cutoff()
    }
    /// Ritz values at or below this count as zero: `max(pivot_tol, k·ε)·θ_max` (the floor keeps
    /// `pivot_tol = 0` from inverting rounding noise).
    fn cutoff(&self) -> f64 {
        self.pivot_tol.max(f64::EPSILON * self.theta.len() as f64) * self.theta[0].abs()
    }
}

/// How a pseudo-inverse factor was formed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PinvMethod {
    /// `F = Q L⁻ᵀ D^{-1/2}` from the embedded LDLᵀ.
    Ldlt,
    /// `F = Q W₊ Θ₊^{-1/2}` from the eigendecomposition of a singular `T`.
    Eigen,
}

/// Diagnostics of [`pinv_factor`].
#[derive(Debug, Clone, PartialEq)]
pub struct PinvInfo {
    /// The Lanczos diagnostics.
    pub lanczos: LanczosInfo,
    /// Columns of the factor (the rank of the approximation).
    pub rank: usize,
    /// Which formula produced the factor.
    pub method: PinvMethod,
}

/// `F` (`n × r`) with `F Fᵀ ≈ A†` for a symmetric PSD operator, by Lanczos with embedded LDLᵀ
/// (see the module docs). `r ≤ max_rank`; the approximation is exact once the Krylov space
/// contains `range(A)`.
pub fn pinv_factor(op: &dyn LinearOperator, config: &LanczosConfig) -> Result<(DMatrix<f64>, PinvInfo)> {
    let dec = lanczos(op, config)?;
    pinv_factor_from(&dec)
}

/// [`pinv_factor`] from an existing decomposition.
pub fn pinv_factor_from(dec: &LanczosDecomposition) -> Result<(DMatrix<f64>, PinvInfo)> {
    let (n, k) = dec.q.shape();
    if dec.is_regular() {
        // Z Lᵀ = Q column by column: z₁ = q₁, z_{j+1} = q_{j+1} − lⱼ zⱼ; then F = Z D^{-1/2}.
        let ldlt = dec.ldlt();
        let mut f = DMatrix::zeros(n, k);
        let mut z = dec.q.column(0).into_owned();
        for j in 0..k {
            if j > 0 {
                z = dec.q.column(j) - &z * ldlt.l[j - 1];
            }
            f.set_column(j, &(&z / ldlt.d[j].sqrt()));
        }
        return Ok((f, PinvInfo { lanczos: dec.info.clone(), rank: k, method: PinvMethod::Ldlt }));
    }
    let (theta, w) = (&dec.theta, &dec.w);
    let cutoff = dec.cutoff();
    let keep: Vec<usize> = (0..k).filter(|&i| theta[i] > cutoff).collect();
    let mut f = DMatrix::zeros(n, keep.len());
    for (c, &i) in keep.iter().enumerate() {
        f.set_column(c, &(&dec.q * w.column(i) / theta[i].sqrt()));
    }
    let rank = keep.len();
    Ok((f, PinvInfo { lanczos: dec.info.clone(), rank, method: PinvMethod::Eigen }))
}

/// Diagnostics of [`pinv_factor_restarted`].
#[derive(Debug, Clone, PartialEq)]
pub struct RestartedPinvInfo {
    /// One entry per Lanczos run (the first from the configured start, then restarts).
    pub runs: Vec<PinvInfo>,
    /// Total columns of the factor.
    pub rank: usize,
}

/// [`pinv_factor`] with deflated restarts, for operators with repeated eigenvalues.
///
/// A single Krylov space holds at most one direction per *distinct* eigenvalue, so Lanczos stops
/// at an invariant subspace (or a vanishing pivot) before it has seen `range(A)` when
/// eigenvalues repeat — as they always do for independent-output kernels
/// (`K ⊗ I_{d'}`) and for product kernels on symmetric grids. When a run stops that way before
/// `max_rank`, the columns found so far span (up to the breakdown tolerance) an invariant
/// subspace `V`, so `A = P_V A P_V + P⊥ A P⊥` and `A† = F Fᵀ + (P⊥ A P⊥)†`; the next run is
/// Lanczos on `P⊥ A P⊥` from a seeded random start. Restarts end at `max_rank` columns, after
/// `max_restarts`, or when `‖P⊥ A P⊥ v‖ ≤ pivot_tol·‖A‖·‖v‖` for the new start (the numerical
/// range is exhausted).
pub fn pinv_factor_restarted(
    op: &dyn LinearOperator,
    config: &LanczosConfig,
    max_restarts: usize,
    seed: u64,
) -> Result<(DMatrix<f64>, RestartedPinvInfo)> {
    let n = op.dim();
    let dec = lanczos(op, config)?;
    let scale = dec.theta[0].abs();
    let (mut f, info) = pinv_factor_from(&dec)?;
    let mut runs = vec![info];
    let mut rng = StdRng::seed_from_u64(seed);
    let restartable =
        |stop: StopReason| matches!(stop, StopReason::InvariantSubspace | StopReason::SingularPivot);
    while runs.len() <= max_restarts
        && restartable(runs.last().expect("one run").lanczos.stop)
        && f.ncols() < config.max_rank.min(n)
        && f.ncols() > 0
    {
        let basis = f.clone().qr().q();
        let project = move |v: &DVector<f64>| v - &basis * basis.tr_mul(v);
        let deflated = crate::operator::FnOperator::new(n, |v: &DVector<f64>| {
            let pv = project(v);
            project(&op.apply(&pv).expect("operator products succeeded on the first run"))
        });
        let v0 = project(&DVector::from_fn(n, |_, _| rng.sample(StandardNormal)));
        let av0 = deflated.apply(&v0)?;
        if av0.norm() <= config.pivot_tol.max(1e-12) * scale * v0.norm() {
            break;
        }
        let run_config = LanczosConfig {
            max_rank: config.max_rank.min(n) - f.ncols(),
            start: StartVector::Given(v0),
            check_symmetry: false,
            ..config.clone()
        };
        // The deflated operator's own scale can be tiny; a negative Ritz value that is
        // rounding relative to the *original* operator ends the restarts instead of failing.
        let dec = match lanczos(&deflated, &run_config) {
            Ok(dec) => dec,
            Err(LinalgError::NotPositiveDefinite { value, .. })
                if value.abs() <= config.pivot_tol.max(1e-12) * scale =>
            {
                break
            }
            Err(e) => return Err(e),
        };
        let (f2, info) = pinv_factor_from(&dec)?;
        if f2.ncols() == 0 {
            break;
        }
        let mut joined = DMatrix::zeros(n, f.ncols() + f2.ncols());
        joined.columns_mut(0, f.ncols()).copy_from(&f);
        joined.columns_mut(f.ncols(), f2.ncols()).copy_from(&f2);
        f = joined;
        runs.push(info);
    }
    let rank = f.ncols();
    Ok((f, RestartedPinvInfo { runs, rank }))
}
