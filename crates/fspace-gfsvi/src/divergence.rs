//! The KL divergence between two multivariate Gaussians with its gradients, and the regularised
//! KL estimator of GFSVI (eqs. 7–8, 11).
//!
//! `KL(N(m_q, Σ_q) ‖ N(m_p, Σ_p)) = ½[tr(Σ_p⁻¹Σ_q) − M + δᵀΣ_p⁻¹δ + log|Σ_p| − log|Σ_q|]`,
//! `δ = m_q − m_p`. (The paper's eq. 8 prints the log-determinant ratio upside down,
//! `log det Σ₁/det Σ₂`; the KL of `p₁` from `p₂` has `log det Σ₂/det Σ₁`, which is what we use.)
//! Gradients: `∂/∂m_q = Σ_p⁻¹δ`, `∂/∂Σ_q = ½(Σ_p⁻¹ − Σ_q⁻¹)`,
//! `∂/∂Σ_p = ½(Σ_p⁻¹ − Σ_p⁻¹(Σ_q + δδᵀ)Σ_p⁻¹)`.
//!
//! The regularised estimator `D̂_KL^γ` adds `γM·I` to both covariances (`M` = number of
//! measurement points; for `d'` outputs per point the matrices are `M·d'` square and the
//! shift is still `γM`, the operator regulariser `γ` times the sample count).

use fspace_input::InputError;
use fspace_linalg::fast;
use nalgebra::{DMatrix, DVector};

use crate::error::{ensure_finite, invalid, GfsviError, Result};

/// Value and gradients of a Gaussian KL divergence.
#[derive(Debug, Clone)]
pub struct GaussianKl {
    /// `KL(q ‖ p)`.
    pub value: f64,
    /// `∂KL/∂m_q` (`= −∂KL/∂m_p`).
    pub grad_mean: DVector<f64>,
    /// `∂KL/∂Σ_q` (symmetric).
    pub grad_cov_q: DMatrix<f64>,
    /// `∂KL/∂Σ_p` (symmetric), when asked for (TFSVI's prior covariance moves with the weights).
    pub grad_cov_p: Option<DMatrix<f64>>,
}

/// `Σ⁻¹` and `log|Σ|` by faer's Cholesky (`fspace_linalg::fast`); a typed error names `what`
/// if `Σ` is not positive definite.
pub(crate) fn inverse_and_logdet(a: &DMatrix<f64>, what: &'static str) -> Result<(DMatrix<f64>, f64)> {
    fast::spd_inverse_and_logdet(a).ok_or(GfsviError::NotPositiveDefinite { what })
}

fn check(
    mean_q: &DVector<f64>,
    cov_q: &DMatrix<f64>,
    mean_p: &DVector<f64>,
    cov_p: &DMatrix<f64>,
) -> Result<()> {
    let m = mean_q.len();
    if m == 0 {
        return Err(GfsviError::Input(InputError::Empty { what: "Gaussian KL (no dimensions)" }));
    }
    for (what, found) in [
        ("prior mean length", mean_p.len()),
        ("variational covariance size", cov_q.nrows()),
        ("variational covariance columns", cov_q.ncols()),
        ("prior covariance size", cov_p.nrows()),
        ("prior covariance columns", cov_p.ncols()),
    ] {
        if found != m {
            return Err(GfsviError::Input(InputError::DimensionMismatch { what, expected: m, found }));
        }
    }
    ensure_finite("variational mean", mean_q.iter())?;
    ensure_finite("prior mean", mean_p.iter())?;
    ensure_finite("variational covariance", cov_q.iter())?;
    ensure_finite("prior covariance", cov_p.iter())
}

/// `KL(N(m_q, Σ_q) ‖ N(m_p, Σ_p))` with its gradients (`∂/∂Σ_p` only if `with_prior_grad`).
pub fn gaussian_kl(
    mean_q: &DVector<f64>,
    cov_q: &DMatrix<f64>,
    mean_p: &DVector<f64>,
    cov_p: &DMatrix<f64>,
    with_prior_grad: bool,
) -> Result<GaussianKl> {
    check(mean_q, cov_q, mean_p, cov_p)?;
    let m = mean_q.len() as f64;
    // The two inverses are independent: side by side.
    let (prior, variational) = rayon::join(
        || inverse_and_logdet(cov_p, "prior covariance (K + γM·I)"),
        || inverse_and_logdet(cov_q, "variational covariance (J S Jᵀ + γM·I)"),
    );
    let (p_inv, logdet_p) = prior?;
    let (q_inv, logdet_q) = variational?;
    let delta = mean_q - mean_p;
    let alpha = &p_inv * &delta;
    let trace = p_inv.component_mul(cov_q).sum();
    let value = 0.5 * (trace - m + delta.dot(&alpha) + logdet_p - logdet_q);
    let grad_cov_q = (&p_inv - &q_inv) * 0.5;
    let grad_cov_p = with_prior_grad.then(|| {
        let pq = fast::matmul(&fast::matmul(&p_inv, cov_q), &p_inv);
        (&p_inv - (&pq + pq.transpose()) * 0.5 - &alpha * alpha.transpose()) * 0.5
    });
    Ok(GaussianKl { value, grad_mean: alpha, grad_cov_q, grad_cov_p })
}

/// The regularised KL estimator `D̂_KL^γ` (eq. 7/11): [`gaussian_kl`] after adding `γM·I` to
/// both covariances, with `M` the number of measurement points (`points`). `γ > 0`.
pub fn regularized_kl(
    mean_q: &DVector<f64>,
    cov_q: &DMatrix<f64>,
    mean_p: &DVector<f64>,
    cov_p: &DMatrix<f64>,
    gamma: f64,
    points: usize,
    with_prior_grad: bool,
) -> Result<GaussianKl> {
    check_gamma(gamma)?;
    if points == 0 {
        return Err(invalid("number of measurement points M", "must be ≥ 1"));
    }
    let shift = gamma * points as f64;
    let add = |c: &DMatrix<f64>| {
        let mut c = c.clone();
        for i in 0..c.nrows() {
            c[(i, i)] += shift;
        }
        c
    };
    gaussian_kl(mean_q, &add(cov_q), mean_p, &add(cov_p), with_prior_grad)
}

pub(crate) fn check_gamma(gamma: f64) -> Result<()> {
    if !(gamma.is_finite() && gamma > 0.0) {
        return Err(invalid("regulariser γ", format!("{gamma} (must be finite and > 0)")));
    }
    Ok(())
}
