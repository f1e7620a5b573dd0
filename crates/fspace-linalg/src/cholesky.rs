//! Cholesky factorization with escalating jitter, triangular solves, exact log-determinants, and
//! rank-k updates/downdates of a Cholesky factor.

use fspace_input::InputError;
use nalgebra::{DMatrix, DVector};

use crate::fast::{cholesky_lower, solve_lower, solve_upper_of_lower};

use crate::error::{ensure_dim, ensure_finite, LinalgError, Result};
use crate::operator::{symmetric_part, symmetrise_in_place};

/// Jitter schedule: try `A`, then `A + εI` with `ε = initial·mean(diag A)`, multiplied by
/// `factor` each retry, for at most `max_tries` retries.
///
/// | name | default | purpose |
/// |---|---|---|
/// | `initial` | 1e-10 | first jitter, relative to the mean diagonal |
/// | `factor` | 10 | growth per retry |
/// | `max_tries` | 8 | retries after the jitter-free attempt (largest jitter 1e-3·mean diag) |
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct JitterConfig {
    /// First relative jitter.
    pub initial: f64,
    /// Multiplier per retry.
    pub factor: f64,
    /// Number of retries.
    pub max_tries: usize,
}

impl Default for JitterConfig {
    fn default() -> Self {
        Self { initial: 1e-10, factor: 10.0, max_tries: 8 }
    }
}

/// A Cholesky factor of `A + jitter·I`, with the jitter that was needed. Factorisation and
/// solves are faer's, blocked and parallel ([`crate::fast`]).
///
/// Deserialising checks what a factorisation establishes: `L` square, non-empty, lower
/// triangular with a finite positive diagonal and finite entries, and a finite jitter ≥ 0. A
/// saved factor is used by solves that index it freely, so a file that breaks any of these is
/// refused. Files written before the factor stopped storing `Lᵀ` beside `L` still load; their
/// `lt` must be exactly `L`'s transpose.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "CholeskyData")]
pub struct JitteredCholesky {
    l: DMatrix<f64>,
    jitter: f64,
}

/// The serialised form of a [`JitteredCholesky`] (`lt`: older files only).
#[derive(serde::Deserialize)]
struct CholeskyData {
    l: DMatrix<f64>,
    #[serde(default)]
    lt: Option<DMatrix<f64>>,
    jitter: f64,
}

impl TryFrom<CholeskyData> for JitteredCholesky {
    type Error = LinalgError;
    fn try_from(d: CholeskyData) -> Result<Self> {
        let invalid = |reason: &str| {
            LinalgError::Input(InputError::Invalid { what: "saved Cholesky factor", reason: reason.into() })
        };
        let n = d.l.nrows();
        if n == 0 || d.l.ncols() != n || d.lt.as_ref().is_some_and(|lt| lt.shape() != (n, n)) {
            return Err(invalid("L and Lᵀ must be square, non-empty and of one size"));
        }
        if !(d.jitter.is_finite() && d.jitter >= 0.0) {
            return Err(invalid("the jitter must be finite and ≥ 0"));
        }
        for j in 0..n {
            for i in 0..n {
                let v = d.l[(i, j)];
                let ok = match i.cmp(&j) {
                    std::cmp::Ordering::Less => v == 0.0,
                    std::cmp::Ordering::Equal => v.is_finite() && v > 0.0,
                    std::cmp::Ordering::Greater => v.is_finite(),
                };
                if !ok {
                    return Err(invalid(
                        "L must be lower triangular with finite entries and a positive diagonal",
                    ));
                }
                if d.lt.as_ref().is_some_and(|lt| lt[(j, i)].to_bits() != v.to_bits()) {
                    return Err(invalid("the stored Lᵀ is not L's transpose"));
                }
            }
        }
        Ok(Self { l: d.l, jitter: d.jitter })
    }
}

/// Factorizes a symmetric PSD matrix, adding the least jitter of the schedule that succeeds.
/// The jitter used is reported, never silent. Errors: non-square, non-finite, asymmetric
/// (relative 1e-10), or still not positive definite at the largest jitter (`CholeskyFailed`).
pub fn cholesky_jitter(a: &DMatrix<f64>, config: &JitterConfig) -> Result<JitteredCholesky> {
    ensure_nonempty_square(a)?;
    factor_with_jitter(&symmetric_part("cholesky input", a, 1e-10)?, config)
}

/// [`cholesky_jitter`] of a matrix the caller gives up (a Gram matrix built for the factor):
/// it is symmetrised in place instead of into a copy, so the factor costs one `n × n` buffer
/// fewer — a fresh buffer is page-faulted in at every fit (`docs/PERFORMANCE.md`, "Fresh
/// pages"). The same factor and errors to the bit.
pub fn cholesky_jitter_owned(mut a: DMatrix<f64>, config: &JitterConfig) -> Result<JitteredCholesky> {
    ensure_nonempty_square(&a)?;
    symmetrise_in_place("cholesky input", &mut a, 1e-10)?;
    factor_with_jitter(&a, config)
}

fn ensure_nonempty_square(a: &DMatrix<f64>) -> Result<()> {
    ensure_dim("cholesky: columns of a square matrix", a.nrows(), a.ncols())?;
    if a.nrows() == 0 {
        return Err(LinalgError::Input(InputError::Invalid {
            what: "cholesky input",
            reason: "is empty".into(),
        }));
    }
    Ok(())
}

/// The jitter schedule on a symmetric `sym`.
fn factor_with_jitter(sym: &DMatrix<f64>, config: &JitterConfig) -> Result<JitteredCholesky> {
    let scale = sym.diagonal().mean().abs().max(f64::MIN_POSITIVE);
    let mut jitter = 0.0;
    for attempt in 0..=config.max_tries {
        if attempt > 0 {
            jitter = scale * config.initial * config.factor.powi(attempt as i32 - 1);
        }
        let factor = if attempt == 0 {
            cholesky_lower(sym)
        } else {
            let mut m = sym.clone();
            for i in 0..m.nrows() {
                m[(i, i)] += jitter;
            }
            cholesky_lower(&m)
        };
        if let Some(l) = factor {
            return Ok(JitteredCholesky { l, jitter });
        }
    }
    Err(LinalgError::CholeskyFailed { what: "cholesky input", max_jitter: jitter })
}

impl JitteredCholesky {
    /// The size `n` of the factored `n × n` matrix.
    pub fn dim(&self) -> usize {
        self.l.nrows()
    }
    /// The jitter added to the diagonal (0 if none was needed).
    pub fn jitter(&self) -> f64 {
        self.jitter
    }
    /// The lower-triangular factor `L` (`LLᵀ = A + jitter·I`).
    pub fn l(&self) -> DMatrix<f64> {
        self.l.clone()
    }
    /// `(A + jitter·I)⁻¹ b` for a vector or a block of columns.
    pub fn solve(&self, b: &DMatrix<f64>) -> Result<DMatrix<f64>> {
        ensure_dim("cholesky solve right-hand side rows", self.l.nrows(), b.nrows())?;
        ensure_finite("cholesky solve right-hand side", b.iter())?;
        Ok(solve_upper_of_lower(&self.l, &solve_lower(&self.l, b)))
    }
    /// `(A + jitter·I)⁻¹ b` for a vector.
    pub fn solve_vec(&self, b: &DVector<f64>) -> Result<DVector<f64>> {
        ensure_dim("cholesky solve right-hand side", self.l.nrows(), b.len())?;
        ensure_finite("cholesky solve right-hand side", b.iter())?;
        let b = DMatrix::from_column_slice(b.len(), 1, b.as_slice());
        let x = solve_upper_of_lower(&self.l, &solve_lower(&self.l, &b));
        Ok(DVector::from_column_slice(x.as_slice()))
    }
    /// `L⁻¹ b` (forward substitution).
    pub fn solve_lower(&self, b: &DMatrix<f64>) -> Result<DMatrix<f64>> {
        ensure_dim("triangular solve rows", self.l.nrows(), b.nrows())?;
        ensure_finite("triangular solve right-hand side", b.iter())?;
        Ok(solve_lower(&self.l, b))
    }
    /// `log det(A + jitter·I) = 2 Σ log Lᵢᵢ`.
    pub fn log_det(&self) -> f64 {
        2.0 * self.l.diagonal().iter().map(|v| v.ln()).sum::<f64>()
    }
}

/// Whether a rank-k modification adds (`+VVᵀ`) or removes (`−VVᵀ`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpdateSign {
    /// `A + V Vᵀ`.
    Update,
    /// `A − V Vᵀ`.
    Downdate,
}

/// In place, turns a lower Cholesky factor `L` of `A` into that of `A ± V Vᵀ` (`V` is `n × k`)
/// by `k` rank-one updates, `O(k·n²)`. A downdate that would make the matrix indefinite is an
/// error (`NotPositiveDefinite`), and `L` is then left unchanged.
pub fn cholesky_rank_update(l: &mut DMatrix<f64>, v: &DMatrix<f64>, sign: UpdateSign) -> Result<()> {
    let n = l.nrows();
    ensure_dim("cholesky factor columns", n, l.ncols())?;
    ensure_dim("update vectors rows", n, v.nrows())?;
    ensure_finite("update vectors", v.iter())?;
    let s = match sign {
        UpdateSign::Update => 1.0,
        UpdateSign::Downdate => -1.0,
    };
    let mut work = l.clone();
    for col in v.column_iter() {
        let mut x = col.into_owned();
        for k in 0..n {
            let lkk = work[(k, k)];
            let r2 = lkk * lkk + s * x[k] * x[k];
            if r2.is_nan() || r2 <= 0.0 || lkk <= 0.0 {
                return Err(LinalgError::NotPositiveDefinite {
                    what: "matrix after Cholesky downdate",
                    value: r2,
                });
            }
            let r = r2.sqrt();
            let (c, sn) = (r / lkk, x[k] / lkk);
            work[(k, k)] = r;
            for i in k + 1..n {
                work[(i, k)] = (work[(i, k)] + s * sn * x[i]) / c;
                x[i] = c * x[i] - sn * work[(i, k)];
            }
        }
    }
    *l = work;
    Ok(())
}
