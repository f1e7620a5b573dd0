//! Conjugate gradients and preconditioned CG for symmetric positive-definite systems
//! `A x = b` — typically `(K + σ²I) x = y` with a matrix-free kernel operator — with Jacobi
//! (diagonal) and partial pivoted-Cholesky preconditioners (Harbrecht et al. 2012; Gardner et
//! al. 2018).

use fspace_input::InputError;
use nalgebra::{DMatrix, DVector};

use crate::error::{ensure_dim, ensure_finite, LinalgError, Result};
use crate::operator::{LinearOperator, SymmetricEntries};

/// Applies `M⁻¹ r` for a preconditioner `M ≈ A`.
pub trait Preconditioner: Send + Sync {
    /// `M⁻¹ r`.
    fn precondition(&self, r: &DVector<f64>) -> DVector<f64>;
}

/// Jacobi preconditioner `M = diag(A)`.
#[derive(Debug, Clone)]
pub struct DiagonalPreconditioner {
    inv_diag: DVector<f64>,
}

impl DiagonalPreconditioner {
    /// From the (strictly positive) diagonal of `A`.
    pub fn new(diag: &DVector<f64>) -> Result<Self> {
        ensure_finite("preconditioner diagonal", diag.iter())?;
        if let Some(&bad) = diag.iter().find(|&&d| d <= 0.0) {
            return Err(LinalgError::NotPositiveDefinite {
                what: "Jacobi preconditioner diagonal",
                value: bad,
            });
        }
        Ok(Self { inv_diag: diag.map(|d| 1.0 / d) })
    }
}

impl Preconditioner for DiagonalPreconditioner {
    fn precondition(&self, r: &DVector<f64>) -> DVector<f64> {
        r.component_mul(&self.inv_diag)
    }
}

/// A partial pivoted Cholesky factor `L` (`n × k`) with `L Lᵀ ≈ K`, greedy on the largest
/// remaining diagonal; stops at rank `k` or when the trace of the remainder falls below
/// `tol · trace(K)`. Costs `k` columns of `K` and `O(n·k²)`.
pub fn pivoted_cholesky(k: &dyn SymmetricEntries, max_rank: usize, tol: f64) -> Result<DMatrix<f64>> {
    let n = k.entries_dim();
    if max_rank == 0 || n == 0 {
        return Err(LinalgError::Input(InputError::Invalid {
            what: "pivoted Cholesky rank",
            reason: "must be ≥ 1 on a non-empty matrix".into(),
        }));
    }
    let mut diag = k.diagonal_entries();
    ensure_finite("pivoted Cholesky diagonal", diag.iter())?;
    let trace = diag.sum();
    let rank = max_rank.min(n);
    let mut l = DMatrix::zeros(n, rank);
    let mut used = 0;
    for m in 0..rank {
        let (piv, &dmax) = diag.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).expect("n ≥ 1");
        if diag.iter().sum::<f64>() <= tol * trace || dmax <= 0.0 {
            break;
        }
        let col = k.column_entries(piv);
        ensure_finite("pivoted Cholesky column", col.iter())?;
        let mut new: DVector<f64> = col - l.columns(0, m) * l.row(piv).columns(0, m).transpose();
        new /= dmax.sqrt();
        for i in 0..n {
            diag[i] -= new[i] * new[i];
        }
        diag[piv] = 0.0;
        l.set_column(m, &new);
        used = m + 1;
    }
    Ok(l.columns(0, used).into_owned())
}

/// `M = L Lᵀ + σ² I` from a pivoted Cholesky factor, applied by Woodbury:
/// `M⁻¹ = σ⁻² (I − L (σ² I + LᵀL)⁻¹ Lᵀ)`.
#[derive(Debug, Clone)]
pub struct PivotedCholeskyPreconditioner {
    l: DMatrix<f64>,
    sigma2: f64,
    inner: nalgebra::Cholesky<f64, nalgebra::Dyn>,
}

impl PivotedCholeskyPreconditioner {
    /// For `A = K + σ² I`: a rank-`max_rank` pivoted Cholesky of `K` (its entries, without σ²).
    pub fn new(k: &dyn SymmetricEntries, sigma2: f64, max_rank: usize) -> Result<Self> {
        if !(sigma2.is_finite() && sigma2 > 0.0) {
            return Err(LinalgError::Input(InputError::Invalid {
                what: "sigma2",
                reason: format!("{sigma2} must be > 0"),
            }));
        }
        let l = pivoted_cholesky(k, max_rank, 1e-12)?;
        let small = l.tr_mul(&l) + DMatrix::identity(l.ncols(), l.ncols()) * sigma2;
        let inner = nalgebra::Cholesky::new(small)
            .ok_or(LinalgError::NotPositiveDefinite { what: "σ²I + LᵀL", value: sigma2 })?;
        Ok(Self { l, sigma2, inner })
    }
    /// The rank of the factor.
    pub fn rank(&self) -> usize {
        self.l.ncols()
    }
}

impl Preconditioner for PivotedCholeskyPreconditioner {
    fn precondition(&self, r: &DVector<f64>) -> DVector<f64> {
        let t = self.inner.solve(&self.l.tr_mul(r));
        (r - &self.l * t) / self.sigma2
    }
}

/// Options of (P)CG.
///
/// | name | default | purpose |
/// |---|---|---|
/// | `tol` | 1e-10 | stop when `‖b − A x‖ ≤ tol·‖b‖` |
/// | `max_iter` | `None` (= 10·n) | iteration limit |
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CgConfig {
    /// Relative residual tolerance.
    pub tol: f64,
    /// Iteration limit (`None`: `10·n`).
    pub max_iter: Option<usize>,
}

impl Default for CgConfig {
    fn default() -> Self {
        Self { tol: 1e-10, max_iter: None }
    }
}

/// Diagnostics of a converged (P)CG solve.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CgInfo {
    /// Iterations done.
    pub iterations: usize,
    /// Final relative residual `‖b − A x‖ / ‖b‖` (recomputed, not the recurrence's).
    pub residual: f64,
}

/// Solves `A x = b` for SPD `A` by (preconditioned) conjugate gradients from `x₀ = 0`.
///
/// Errors: dimension mismatch or non-finite `b`; `NotPositiveDefinite` if a search direction has
/// `pᵀAp ≤ 0`; `NoConvergence { residual }` after `max_iter` iterations.
pub fn cg(
    op: &dyn LinearOperator,
    b: &DVector<f64>,
    preconditioner: Option<&dyn Preconditioner>,
    config: &CgConfig,
) -> Result<(DVector<f64>, CgInfo)> {
    let n = op.dim();
    ensure_dim("cg right-hand side", n, b.len())?;
    ensure_finite("cg right-hand side", b.iter())?;
    if !(config.tol.is_finite() && config.tol > 0.0) {
        return Err(LinalgError::Input(InputError::Invalid {
            what: "cg tol",
            reason: format!("{} must be > 0", config.tol),
        }));
    }
    let b_norm = b.norm();
    let mut x = DVector::zeros(n);
    if b_norm == 0.0 {
        return Ok((x, CgInfo { iterations: 0, residual: 0.0 }));
    }
    let max_iter = config.max_iter.unwrap_or(10 * n);
    let apply_m = |r: &DVector<f64>| preconditioner.map_or_else(|| r.clone(), |m| m.precondition(r));
    let mut r = b.clone();
    let mut z = apply_m(&r);
    let mut p = z.clone();
    let mut rz = r.dot(&z);
    for it in 1..=max_iter {
        fspace_input::interrupt::check("conjugate gradients")?;
        let ap = op.apply(&p)?;
        let pap = p.dot(&ap);
        if pap.is_nan() || pap <= 0.0 {
            return Err(LinalgError::NotPositiveDefinite { what: "cg operator (pᵀAp)", value: pap });
        }
        let alpha = rz / pap;
        x.axpy(alpha, &p, 1.0);
        r.axpy(-alpha, &ap, 1.0);
        if r.norm() <= config.tol * b_norm {
            // Confirm with the true residual (the recurrence can drift).
            let true_res = (b - op.apply(&x)?).norm() / b_norm;
            if true_res <= config.tol {
                return Ok((x, CgInfo { iterations: it, residual: true_res }));
            }
            r = b - op.apply(&x)?;
        }
        z = apply_m(&r);
        let rz_new = r.dot(&z);
        p = &z + &p * (rz_new / rz);
        rz = rz_new;
    }
    let residual = (b - op.apply(&x)?).norm() / b_norm;
    Err(LinalgError::NoConvergence { method: "cg", iterations: max_iter, residual })
}

/// A map of `n × r` blocks, `V ↦ A V` or `V ↦ M⁻¹ V`, that can fail with `E`.
pub type BlockMap<'a, E> = &'a mut dyn FnMut(&DMatrix<f64>) -> Result<DMatrix<f64>, E>;

/// Diagnostics of [`cg_columns`].
#[derive(Debug, Clone, PartialEq)]
pub struct CgColumnsInfo {
    /// Iterations of each column until it converged.
    pub iterations: Vec<usize>,
    /// Products with `A` (one per lockstep iteration, on the columns still running).
    pub products: usize,
    /// Largest final relative residual `‖bⱼ − A xⱼ‖ / ‖bⱼ‖` (recomputed, not the recurrence's).
    pub residual: f64,
}

/// Solves `A X = B` for SPD `A`, one independent (preconditioned) CG recurrence per column of
/// `B`, run in lockstep: every iteration applies `A` (and `M⁻¹`) once to the block of columns
/// not yet converged, so a matrix-free `A` whose cost is dominated by reading its data (a GGN
/// from cached layer statistics, a kernel matrix) does that once per iteration for all
/// columns. `x0` warm-starts the solve (zeros otherwise). Column `j` stops when
/// `‖bⱼ − A xⱼ‖ ≤ tol·‖bⱼ‖`, confirmed on the recomputed residual.
///
/// `apply` and `precondition` map a `n × r` block to `A V` / `M⁻¹ V`; their errors pass
/// through. Errors: shape mismatch or non-finite `B` / `x0`; `NotPositiveDefinite` if a search
/// direction has `pᵀAp ≤ 0`; `NoConvergence` (worst relative residual) after `max_iter`
/// iterations.
pub fn cg_columns<E: From<LinalgError>>(
    mut apply: impl FnMut(&DMatrix<f64>) -> Result<DMatrix<f64>, E>,
    mut precondition: Option<BlockMap<'_, E>>,
    b: &DMatrix<f64>,
    x0: Option<&DMatrix<f64>>,
    config: &CgConfig,
) -> Result<(DMatrix<f64>, CgColumnsInfo), E> {
    let (n, r) = b.shape();
    ensure_finite("cg_columns right-hand sides", b.iter())?;
    if !(config.tol.is_finite() && config.tol > 0.0) {
        return Err(LinalgError::Input(InputError::Invalid {
            what: "cg tol",
            reason: format!("{} must be > 0", config.tol),
        })
        .into());
    }
    let mut x = match x0 {
        Some(x0) => {
            if x0.shape() != (n, r) {
                return Err(LinalgError::Input(InputError::DimensionMismatch {
                    what: "cg_columns start (rows × columns)",
                    expected: n * r,
                    found: x0.nrows() * x0.ncols(),
                })
                .into());
            }
            ensure_finite("cg_columns start", x0.iter())?;
            x0.clone()
        }
        None => DMatrix::zeros(n, r),
    };
    let max_iter = config.max_iter.unwrap_or(10 * n);
    let b_norms: Vec<f64> = b.column_iter().map(|c| c.norm()).collect();
    let mut info = CgColumnsInfo { iterations: vec![0; r], products: 0, residual: 0.0 };
    // The residual of the start; columns with b = 0 are solved by x = 0.
    let res = if x0.is_some() {
        info.products += 1;
        b - apply(&x)?
    } else {
        b.clone()
    };
    let mut active: Vec<usize> = Vec::with_capacity(r);
    for j in 0..r {
        if b_norms[j] == 0.0 {
            x.column_mut(j).fill(0.0);
        } else if res.column(j).norm() > config.tol * b_norms[j] {
            active.push(j);
        } else {
            info.residual = info.residual.max(res.column(j).norm() / b_norms[j]);
        }
    }
    let mut precond = |v: &DMatrix<f64>| -> Result<DMatrix<f64>, E> {
        match precondition.as_mut() {
            Some(m) => m(v),
            None => Ok(v.clone()),
        }
    };
    if active.is_empty() {
        return Ok((x, info));
    }
    // State of the active columns, in `active` order.
    let mut rr = res.select_columns(&active);
    let mut z = precond(&rr)?;
    let mut p = z.clone();
    let mut rz: Vec<f64> = (0..active.len()).map(|a| rr.column(a).dot(&z.column(a))).collect();
    let mut it = 0;
    while !active.is_empty() {
        if it == max_iter {
            let xa = x.select_columns(&active);
            let ra = b.select_columns(&active) - apply(&xa)?;
            let worst = active
                .iter()
                .enumerate()
                .map(|(a, &j)| ra.column(a).norm() / b_norms[j])
                .fold(info.residual, f64::max);
            return Err(LinalgError::NoConvergence {
                method: "cg_columns",
                iterations: max_iter,
                residual: worst,
            }
            .into());
        }
        it += 1;
        let ap = apply(&p)?;
        info.products += 1;
        let mut done = Vec::new();
        for (a, &j) in active.iter().enumerate() {
            let pap = p.column(a).dot(&ap.column(a));
            if pap.is_nan() || pap <= 0.0 {
                return Err(LinalgError::NotPositiveDefinite {
                    what: "cg_columns operator (pᵀAp)",
                    value: pap,
                }
                .into());
            }
            let alpha = rz[a] / pap;
            x.column_mut(j).axpy(alpha, &p.column(a), 1.0);
            rr.column_mut(a).axpy(-alpha, &ap.column(a), 1.0);
            if rr.column(a).norm() <= config.tol * b_norms[j] {
                done.push(a);
            }
        }
        if !done.is_empty() {
            // Confirm on the true residuals (the recurrence can drift); reset the others.
            let cols: Vec<usize> = done.iter().map(|&a| active[a]).collect();
            let true_res = b.select_columns(&cols) - apply(&x.select_columns(&cols))?;
            info.products += 1;
            let mut finished = Vec::new();
            for (d, &a) in done.iter().enumerate() {
                let rel = true_res.column(d).norm() / b_norms[active[a]];
                if rel <= config.tol {
                    info.iterations[active[a]] = it;
                    info.residual = info.residual.max(rel);
                    finished.push(a);
                } else {
                    rr.set_column(a, &true_res.column(d));
                }
            }
            if !finished.is_empty() {
                let keep: Vec<usize> = (0..active.len()).filter(|a| !finished.contains(a)).collect();
                active = keep.iter().map(|&a| active[a]).collect();
                rr = rr.select_columns(&keep);
                p = p.select_columns(&keep);
                rz = keep.iter().map(|&a| rz[a]).collect();
                if active.is_empty() {
                    break;
                }
            }
        }
        z = precond(&rr)?;
        for a in 0..active.len() {
            let rz_new = rr.column(a).dot(&z.column(a));
            let beta = rz_new / rz[a];
            let pa = z.column(a) + p.column(a) * beta;
            p.set_column(a, &pa);
            rz[a] = rz_new;
        }
    }
    Ok((x, info))
}
