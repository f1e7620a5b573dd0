//! Thick-restart Lanczos (Wu & Simon 2000; the symmetric case of Stewart's Krylov–Schur
//! method, 2001) for the `k` largest eigenpairs of a symmetric operator in a Krylov basis of at
//! most `m` vectors.
//!
//! Plain Lanczos with full reorthogonalisation ([`crate::lanczos()`]) keeps every Lanczos vector:
//! its memory is `n × (steps)` doubles and grows until the top pairs converge. On a network's
//! Gauss–Newton matrix (`n` = 11 M weights) that is 89 MB a step, and the ResNet-18 fit of
//! `docs/PERFORMANCE.md` needed 72 steps. Here the basis is allocated once, `n × m`, and when it
//! is full the iteration restarts from its best `ℓ` Ritz vectors:
//!
//! * after `j` steps, `A Q_j = Q_j H_j + b q_{j+1} e_jᵀ` with orthonormal `Q_j` and symmetric
//!   `H_j = Q_jᵀ A Q_j`, whose entries are the Gram–Schmidt coefficients of each new product
//!   against the whole basis (two passes: "twice is enough");
//! * Rayleigh–Ritz: `H_j = Y Θ Yᵀ` (descending); the Ritz pair `(θᵢ, Q_j yᵢ)` has residual
//!   `‖A Q_j yᵢ − θᵢ Q_j yᵢ‖ = |b|·|y_{j,i}|`, reported relative to `max|θ|` (≈ ‖A‖);
//! * restart (`j = m`): `Q_ℓ ← Q_m Y_{:, 1..ℓ}` (in place, row block by row block, so no second
//!   `n × ℓ` matrix is held), `H_ℓ = diag(θ₁…θ_ℓ)`, and the relation becomes
//!   `A Q_ℓ = Q_ℓ Θ_ℓ + q_{m+1} sᵀ` with `sᵢ = b·y_{m,i}`; `q_{m+1}` is the next basis vector,
//!   and its coupling `s` to the kept vectors (an "arrowhead" `H`) is recomputed by the next
//!   product's Gram–Schmidt coefficients. The Krylov space after a restart still contains the
//!   kept Ritz vectors, so their convergence continues where it stopped.
//!
//! `ℓ = k + ⌊(m − k)/2⌋` (half the free room kept, ARPACK's usual choice), so `m ≥ k + 2`.
//! With `m` at least the number of steps plain Lanczos needs, no restart happens and the
//! result equals plain Lanczos' top Ritz pairs to rounding. A restart costs `O(n·m·ℓ)` flops
//! and no product; the price of a small `m` is more products.
//!
//! Converged: every one of the top `k` pairs whose Ritz value exceeds `zero_tol·θ_max` has a
//! relative residual ≤ `tol` (pairs at the numerical null space need not converge: any vector
//! there is an eigenvector to that tolerance), or the Krylov space became invariant, or it
//! spans ℝⁿ.

use fspace_input::InputError;
use nalgebra::{DMatrix, DVector};

use crate::error::{ensure_dim, ensure_finite, LinalgError, Result};
use crate::lanczos::{start_vector, StartVector};
use crate::operator::LinearOperator;

/// Options of [`thick_restart_lanczos`].
///
/// | name | default | purpose |
/// |---|---|---|
/// | `k` | 20 | eigenpairs wanted (the largest algebraic) |
/// | `max_basis` | 50 | most basis vectors held (`n × max_basis` doubles); ≥ `k + 2` unless ≥ `n` |
/// | `tol` | 1e-8 | relative Ritz residual `‖Ay − θy‖ / max|θ|` each wanted pair must reach |
/// | `zero_tol` | 1e-12 | wanted pairs with `θ ≤ zero_tol·θ_max` need not converge |
/// | `max_products` | 2000 | most operator products before `NoConvergence` |
/// | `breakdown_tol` | 1e-13 | `b ≤ tol·max|θ|`: the Krylov space is invariant |
/// | `start` | `Random(0)` | start vector |
/// | `project_start` | true | start from `A v₀` (inside the range of `A`; 1 extra product) |
#[derive(Debug, Clone, PartialEq)]
pub struct ThickRestartConfig {
    /// Eigenpairs wanted, ≥ 1.
    pub k: usize,
    /// Most basis vectors held at once.
    pub max_basis: usize,
    /// Relative residual tolerance of the wanted pairs.
    pub tol: f64,
    /// Wanted pairs whose Ritz value is at most `zero_tol·θ_max` are not required to converge.
    pub zero_tol: f64,
    /// Most products with the operator.
    pub max_products: usize,
    /// Relative tolerance on the next vector's norm below which the space is invariant.
    pub breakdown_tol: f64,
    /// Start vector.
    pub start: StartVector,
    /// Start from `A v₀` instead of `v₀`.
    pub project_start: bool,
}

impl Default for ThickRestartConfig {
    fn default() -> Self {
        Self {
            k: 20,
            max_basis: 50,
            tol: 1e-8,
            zero_tol: 1e-12,
            max_products: 2000,
            breakdown_tol: 1e-13,
            start: StartVector::Random(0),
            project_start: true,
        }
    }
}

/// Why [`thick_restart_lanczos`] stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThickRestartStop {
    /// Every wanted pair reached `tol`.
    Converged,
    /// The next vector vanished: the basis spans an invariant subspace (residuals ≈ 0).
    InvariantSubspace,
    /// The basis spans ℝⁿ.
    FullDimension,
}

/// Diagnostics of a thick-restart run.
#[derive(Debug, Clone, PartialEq)]
pub struct ThickRestartInfo {
    /// Products with the operator (the projected start's included).
    pub products: usize,
    /// Restarts done.
    pub restarts: usize,
    /// Most basis vectors held at once (≤ `max_basis`).
    pub basis_columns: usize,
    /// Why it stopped.
    pub stop: ThickRestartStop,
}

/// The top eigenpairs found: `values` descending, `vectors` (`n × k`, orthonormal columns; fewer
/// than `k` when the Krylov space became invariant in fewer steps) and each pair's relative
/// residual `‖A y − θ y‖ / max|θ|`.
#[derive(Debug, Clone)]
pub struct TopEigenpairs {
    /// Ritz values, descending.
    pub values: DVector<f64>,
    /// Ritz vectors, one per column.
    pub vectors: DMatrix<f64>,
    /// Relative residual of each pair.
    pub residuals: DVector<f64>,
    /// Diagnostics.
    pub info: ThickRestartInfo,
}

/// The `k` largest eigenpairs of a symmetric operator, holding at most `max_basis` Krylov
/// vectors (module docs).
///
/// ```
/// use fspace_linalg::{thick_restart_lanczos, DiagonalOperator, ThickRestartConfig};
/// use nalgebra::DVector;
///
/// // diag(1, 1/2, …, 1/200): the top 3 eigenpairs in a basis of 8 vectors (it restarts).
/// let a = DiagonalOperator::new(DVector::from_fn(200, |i, _| 1.0 / (i + 1) as f64)).unwrap();
/// let cfg = ThickRestartConfig { k: 3, max_basis: 8, tol: 1e-10, ..Default::default() };
/// let top = thick_restart_lanczos(&a, &cfg).unwrap();
/// assert!((top.values[2] - 1.0 / 3.0).abs() < 1e-10);
/// assert!(top.info.restarts > 0 && top.vectors.ncols() == 3);
/// ```
///
/// Errors: `k = 0`, `max_basis < k + 2` (when below `n`), a tolerance that is not finite and
/// ≥ 0 (`Invalid`); a bad start vector or `A v₀ = 0`; a non-finite product (`NonFinite`); no
/// convergence within `max_products` (`NoConvergence`, with the worst wanted residual).
pub fn thick_restart_lanczos(op: &dyn LinearOperator, config: &ThickRestartConfig) -> Result<TopEigenpairs> {
    let n = op.dim();
    let invalid =
        |what: &'static str, reason: String| LinalgError::Input(InputError::Invalid { what, reason });
    if n == 0 {
        return Err(invalid("operator", "has dimension 0".into()));
    }
    if config.k == 0 {
        return Err(invalid("thick-restart Lanczos k", "must be ≥ 1".into()));
    }
    for (what, tol) in [
        ("thick-restart Lanczos tol", config.tol),
        ("thick-restart Lanczos zero_tol", config.zero_tol),
        ("thick-restart Lanczos breakdown_tol", config.breakdown_tol),
    ] {
        if !(tol.is_finite() && tol >= 0.0) {
            return Err(invalid(what, format!("{tol} must be finite and ≥ 0")));
        }
    }
    let k = config.k.min(n);
    let m = config.max_basis.min(n);
    if m < n && m < k + 2 {
        return Err(invalid(
            "thick-restart Lanczos max_basis",
            format!("{} must be ≥ k + 2 = {} (or ≥ the dimension {n})", config.max_basis, k + 2),
        ));
    }
    let keep = k + (m - k) / 2;
    let products = std::cell::Cell::new(0usize);
    let apply = |v: &DVector<f64>| -> Result<DVector<f64>> {
        products.set(products.get() + 1);
        let w = op.apply(v)?;
        ensure_dim("thick-restart Lanczos operator product", n, w.len())?;
        ensure_finite("thick-restart Lanczos operator product", w.iter())?;
        Ok(w)
    };
    let mut v0 = start_vector(&config.start, n)?;
    if config.project_start {
        v0 = apply(&v0)?;
        let norm = v0.norm();
        if norm == 0.0 {
            return Err(invalid(
                "thick-restart Lanczos start vector",
                "A·v₀ = 0 (the start vector lies in the null space, or A = 0)".into(),
            ));
        }
        v0 /= norm;
    }
    let mut q = DMatrix::zeros(n, m);
    q.set_column(0, &v0);
    let mut h = DMatrix::<f64>::zeros(m, m);
    let mut j = 0;
    let mut restarts = 0;
    loop {
        fspace_input::interrupt::check("the thick-restart Lanczos iteration")?;
        let mut w = apply(&q.column(j).into_owned())?;
        let mut coeffs = DVector::zeros(j + 1);
        for _ in 0..2 {
            let basis = q.columns(0, j + 1);
            let c = basis.tr_mul(&w);
            w -= basis * &c;
            coeffs += c;
        }
        for i in 0..=j {
            h[(i, j)] = coeffs[i];
            h[(j, i)] = coeffs[i];
        }
        let b = w.norm();
        j += 1;
        let (theta, y) = crate::dense::sym_eigh_desc(&h.view((0, 0), (j, j)).into_owned())?;
        let scale = theta.iter().fold(0.0f64, |a, t| a.max(t.abs())).max(f64::MIN_POSITIVE);
        let wanted = k.min(j);
        let residuals = DVector::from_fn(wanted, |i, _| b * y[(j - 1, i)].abs() / scale);
        let needed = (0..wanted).filter(|&i| theta[i] > config.zero_tol * theta[0].abs()).count();
        let worst = (0..needed).map(|i| residuals[i]).fold(0.0, f64::max);
        let stop = if b <= config.breakdown_tol * scale {
            Some(ThickRestartStop::InvariantSubspace)
        } else if j == n {
            Some(ThickRestartStop::FullDimension)
        } else if j >= k && worst <= config.tol {
            Some(ThickRestartStop::Converged)
        } else {
            None
        };
        if let Some(stop) = stop {
            let out = y.view((0, 0), (j, wanted)).into_owned();
            crate::dense::rotate_basis_in_place(&mut q, &out);
            let unused = q.ncols() - wanted;
            let vectors = q.remove_columns(wanted, unused);
            return Ok(TopEigenpairs {
                values: theta.rows(0, wanted).into_owned(),
                vectors,
                residuals,
                info: ThickRestartInfo { products: products.get(), restarts, basis_columns: m, stop },
            });
        }
        if products.get() >= config.max_products {
            return Err(LinalgError::NoConvergence {
                method: "thick-restart Lanczos (top-k Ritz residuals)",
                iterations: products.get(),
                residual: worst,
            });
        }
        w /= b;
        if j == m {
            // Keep the best `keep` Ritz vectors; the next vector couples to them through `s`.
            crate::dense::rotate_basis_in_place(&mut q, &y.columns(0, keep).into_owned());
            h.fill(0.0);
            for i in 0..keep {
                h[(i, i)] = theta[i];
                let s = b * y[(m - 1, i)];
                h[(i, keep)] = s;
                h[(keep, i)] = s;
            }
            j = keep;
            restarts += 1;
        }
        q.set_column(j, &w);
    }
}
