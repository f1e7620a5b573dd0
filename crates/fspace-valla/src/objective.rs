//! VaLLA's variational state, its α-objective (eqs. 22–23) and the objective's exact gradient
//! with respect to `log σ₀²`, `log σ²`, the factor `L` of `A = LLᵀ` and the inducing inputs `Z`.
//!
//! Notation (unit NTK `κ̂ = J Jᵀ`, prior kernel `σ₀² κ̂`):
//! * `B = I + σ₀² Lᵀ κ̂(Z, Z) L` (`M × M`, `B ⪰ I`, so its Cholesky factor never needs jitter);
//! * `(A⁻¹ + K_Z)⁻¹ = L B⁻¹ Lᵀ` — valid for any `L`, no inverse of `A` is ever formed;
//! * predictive blocks `Σᵢ = σ₀² κ̂(xᵢ, xᵢ) − Wᵢ B⁻¹ Wᵢᵀ` with `W = σ₀² κ̂(X, Z) L`;
//! * `KL = ½ log|I + K_Z A| − ½ tr(K_Z (A⁻¹ + K_Z)⁻¹) = ½ (log|B| − M + tr B⁻¹)` (Sylvester's
//!   determinant identity; `tr(K_Z L B⁻¹ Lᵀ) = tr(B⁻¹(B − I))`);
//! * objective `F = (N/|b|) Σ_{i∈b} (1/α) log E_q[p(yᵢ | f(xᵢ))^α] − KL`.
//!
//! Reverse-mode by hand: the data term gives `Σ̄ᵢ = ∂tᵢ/∂Σᵢ`; then
//! `W̄ᵢ = −2(N/|b|) Σ̄ᵢ Yᵢᵀ`-style products with `Y = B⁻¹Wᵀ`, `B̄ = (N/|b|) Σᵢ Yᵢ Σ̄ᵢ Yᵢᵀ −
//! ½(B⁻¹ − B⁻²)`, `L̄ = 2σ₀² κ̂_Z L B̄ + σ₀² κ̂_{XZ}ᵀ W̄`, and the NTK cotangents
//! `σ₀² W̄ Lᵀ`, `σ₀² L B̄ Lᵀ` go to the network's NTK input gradient for `Z̄`.
//! Every piece is checked against central finite differences in the tests.

use fspace_input::InputError;
use std::f64::consts::PI;

use fspace_core::likelihood::logsumexp;
use fspace_core::LikelihoodSpec;
use fspace_linalg::fast::{cholesky_lower, solve_lower, solve_upper_of_lower};
use fspace_nn::{Network, Outputs};
use nalgebra::{DMatrix, DVector};
use serde::{Deserialize, Serialize};

use crate::error::{Result, VallaError};

/// The observation models VaLLA and ELLA implement, taken from a [`LikelihoodSpec`].
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub(crate) enum VallaLikelihood {
    /// `y ~ N(f, σ²)` for a one-output network; `noise_std` is σ (VaLLA's initial value when
    /// it learns σ).
    Gaussian {
        /// σ > 0.
        noise_std: f64,
    },
    /// `y ~ Cat(softmax(f))` with labels `0..d'` stored as `f64`.
    Categorical,
}

impl VallaLikelihood {
    /// The Gaussian (σ as given) and categorical specs; any other is
    /// [`CoreError::Unsupported`](fspace_core::CoreError::Unsupported). The number of classes
    /// must equal the network's outputs `d'`.
    pub(crate) fn from_spec(spec: &LikelihoodSpec, outputs: usize) -> Result<Self> {
        spec.validate()?;
        match *spec {
            LikelihoodSpec::Gaussian { sigma, .. } => Ok(Self::Gaussian { noise_std: sigma }),
            LikelihoodSpec::Categorical { classes } if classes == outputs => Ok(Self::Categorical),
            LikelihoodSpec::Categorical { classes } => {
                Err(VallaError::Input(InputError::DimensionMismatch {
                    what: "classes of the categorical likelihood vs. network outputs",
                    expected: outputs,
                    found: classes,
                }))
            }
            other => Err(other.unsupported("VaLLA / ELLA").into()),
        }
    }
}

/// How `log E_q[p(y | f)]` is computed for the categorical likelihood.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum ClassApprox {
    /// The probit approximation of the softmax the paper cites (Daxberger et al. 2021):
    /// `E[softmax(f)] ≈ softmax(m / √(1 + π/8 · diag Σ))`. Needs `α = 1`.
    Probit,
    /// Monte Carlo with `samples` reparameterised draws `f = m + chol(Σ) ε` (any α).
    MonteCarlo {
        /// Draws per point (≥ 1).
        samples: usize,
    },
}

/// VaLLA's variational parameters and hyperparameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VariationalState {
    /// Inducing inputs `Z` (`M × d`).
    pub z: DMatrix<f64>,
    /// The network output each inducing point carries (all 0 for one output).
    pub outputs: Vec<usize>,
    /// `log σ₀²` (prior variance of the NTK kernel `σ₀² J Jᵀ`).
    pub log_prior_var: f64,
    /// `log σ²` (Gaussian noise variance; unused for classification).
    pub log_noise_var: f64,
    /// Lower-triangular `L` with a positive diagonal, `A = LLᵀ` (positive definite).
    pub l: DMatrix<f64>,
}

impl VariationalState {
    /// `σ₀²`.
    pub fn prior_variance(&self) -> f64 {
        self.log_prior_var.exp()
    }
    /// `σ²`.
    pub fn noise_variance(&self) -> f64 {
        self.log_noise_var.exp()
    }
    /// `A = LLᵀ`.
    pub fn a(&self) -> DMatrix<f64> {
        &self.l * self.l.transpose()
    }
    /// Number of unconstrained coordinates of [`to_flat`](Self::to_flat).
    pub(crate) fn flat_len(&self) -> usize {
        let m = self.z.nrows();
        2 + m * (m + 1) / 2 + self.z.len()
    }
    /// `[log σ₀², log σ², L's lower triangle by columns (diagonal as log), Z row-major]`.
    pub(crate) fn to_flat(&self) -> DVector<f64> {
        let m = self.z.nrows();
        let mut v = Vec::with_capacity(self.flat_len());
        v.push(self.log_prior_var);
        v.push(self.log_noise_var);
        for c in 0..m {
            v.push(self.l[(c, c)].ln());
            for r in c + 1..m {
                v.push(self.l[(r, c)]);
            }
        }
        for i in 0..m {
            v.extend(self.z.row(i).iter());
        }
        DVector::from_vec(v)
    }
    /// Inverse of [`to_flat`](Self::to_flat) (outputs kept).
    pub(crate) fn set_flat(&mut self, v: &DVector<f64>) {
        let (m, d) = self.z.shape();
        self.log_prior_var = v[0];
        self.log_noise_var = v[1];
        let mut k = 2;
        for c in 0..m {
            self.l[(c, c)] = v[k].exp();
            k += 1;
            for r in c + 1..m {
                self.l[(r, c)] = v[k];
                k += 1;
            }
        }
        for i in 0..m {
            for j in 0..d {
                self.z[(i, j)] = v[k];
                k += 1;
            }
        }
    }
}

/// Gradient of the objective `F` in the coordinates of [`VariationalState`].
#[derive(Debug, Clone, PartialEq)]
pub struct StateGradient {
    /// `∂F/∂ log σ₀²`.
    pub log_prior_var: f64,
    /// `∂F/∂ log σ²`.
    pub log_noise_var: f64,
    /// `∂F/∂L` (lower triangle; the diagonal entries are `∂F/∂L_ii`, not w.r.t. their log).
    pub l: DMatrix<f64>,
    /// `∂F/∂Z` (`None` when not requested).
    pub z: Option<DMatrix<f64>>,
}

impl StateGradient {
    /// In the flat coordinates of [`VariationalState::to_flat`], with entries whose flag is
    /// off set to zero (a fixed coordinate).
    pub(crate) fn to_flat(&self, state: &VariationalState, learn: &Learn) -> DVector<f64> {
        let (m, d) = state.z.shape();
        let mut v = Vec::with_capacity(state.flat_len());
        v.push(if learn.prior_variance { self.log_prior_var } else { 0.0 });
        v.push(if learn.noise { self.log_noise_var } else { 0.0 });
        for c in 0..m {
            v.push(self.l[(c, c)] * state.l[(c, c)]);
            for r in c + 1..m {
                v.push(self.l[(r, c)]);
            }
        }
        for i in 0..m {
            for j in 0..d {
                v.push(self.z.as_ref().map_or(0.0, |g| g[(i, j)]));
            }
        }
        DVector::from_vec(v)
    }
}

/// Which coordinates are optimised.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Learn {
    pub prior_variance: bool,
    pub noise: bool,
}

/// A minibatch with the quantities that do not depend on the variational state.
pub(crate) struct Batch<'a> {
    /// Inputs (`b × d`).
    pub x: &'a DMatrix<f64>,
    /// MAP outputs `g(X)` (`b × d'`).
    pub g: &'a DMatrix<f64>,
    /// Unit-NTK diagonal blocks `κ̂(xᵢ, xᵢ)` (`d' × d'` each).
    pub kxx: &'a [DMatrix<f64>],
    /// Targets.
    pub y: &'a [f64],
    /// MC noise per point (`S × d'`), only for [`ClassApprox::MonteCarlo`].
    pub eps: Option<&'a [DMatrix<f64>]>,
}

/// Data-term settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct DataTerm {
    pub likelihood: VallaLikelihood,
    pub approx: ClassApprox,
    pub alpha: f64,
}

/// The lower Cholesky factor `R` of `B = I + σ₀² Lᵀ κ̂_Z L` from `κ̂_Z L` (`B ⪰ I`, so it exists
/// for any `L`; a failure means non-finite input).
pub(crate) fn factor_b(l: &DMatrix<f64>, kzl: &DMatrix<f64>, s0: f64) -> Result<DMatrix<f64>> {
    let mut bm = l.transpose() * kzl * s0;
    for i in 0..bm.nrows() {
        bm[(i, i)] += 1.0;
    }
    let bm = (&bm + bm.transpose()) * 0.5;
    cholesky_lower(&bm).ok_or(VallaError::NotPositiveDefinite { what: "B = I + σ₀² Lᵀ K_Z L" })
}

/// Value and gradient of the objective `F` (a maximisation) on one batch, with
/// the data term scaled by `n_total / |batch|`.
pub(crate) fn objective<N: Network>(
    net: &N,
    state: &VariationalState,
    batch: &Batch,
    term: DataTerm,
    n_total: usize,
    want_z_grad: bool,
) -> Result<(f64, StateGradient)> {
    let scale = n_total as f64 / batch.x.nrows() as f64;
    objective_part(net, state, batch, term, scale, true, want_z_grad)
}

/// The objective's data term `scale · Σᵢ tᵢ` over `batch`'s rows (`scale = N / B` for the
/// global batch size `B`), minus the KL with `with_kl`; and its gradient. A sharded fit sums the
/// processes' data terms (`with_kl = false`) and adds [`kl_term`] once.
pub(crate) fn objective_part<N: Network>(
    net: &N,
    state: &VariationalState,
    batch: &Batch,
    term: DataTerm,
    scale: f64,
    with_kl: bool,
    want_z_grad: bool,
) -> Result<(f64, StateGradient)> {
    let q = net.output_dim();
    let (b, m) = (batch.x.nrows(), state.z.nrows());
    let (s0, noise) = (state.prior_variance(), state.noise_variance());
    let sel = Outputs::One(&state.outputs);
    let pair = net.ntk_pair_with_pullback(batch.x, Outputs::All, &state.z, sel)?;
    let (kxz, kz) = (&pair.kxz, &pair.kzz);
    let l = &state.l;
    let kzl = kz * l;
    let r = factor_b(l, &kzl, s0)?;
    let binv = solve_upper_of_lower(&r, &solve_lower(&r, &DMatrix::identity(m, m)));
    let logdet: f64 = 2.0 * r.diagonal().iter().map(|d| d.ln()).sum::<f64>();
    let kl = 0.5 * (logdet - m as f64 + binv.trace());
    let kxzl = kxz * l;
    let w = &kxzl * s0; // b·q × M
    let v = solve_lower(&r, &w.transpose()); // M × b·q
    let kl_weight = if with_kl { 1.0 } else { 0.0 };
    let mut data = 0.0;
    let mut sbar = Vec::with_capacity(b); // ∂tᵢ/∂Σᵢ
    let mut d_noise = 0.0;
    for i in 0..b {
        let vi = v.columns(i * q, q);
        let sigma = &batch.kxx[i] * s0 - vi.transpose() * vi;
        let g = batch.g.row(i).transpose();
        let eps = batch.eps.map(|e| &e[i]);
        let (t, gs, gn) = point_term(term, &g, &sigma, batch.y[i], noise, eps, i)?;
        data += t;
        d_noise += gn;
        sbar.push(gs);
    }
    let value = scale * data - kl_weight * kl;
    // Cotangents. Σᵢ = σ₀² κ̂ᵢᵢ − Wᵢ B⁻¹ Wᵢᵀ, so with Y = B⁻¹Wᵀ:
    // W̄ᵢ = −2·scale·Σ̄ᵢ Yᵢᵀ, B̄ += scale·Σᵢ Yᵢ Σ̄ᵢ Yᵢᵀ.
    let y = solve_upper_of_lower(&r, &v); // M × b·q
    let mut wbar = DMatrix::zeros(b * q, m);
    let mut ys = DMatrix::zeros(m, b * q);
    let mut d_s0 = 0.0;
    for i in 0..b {
        let yi = y.columns(i * q, q);
        let ysi = yi * &sbar[i];
        wbar.rows_mut(i * q, q).copy_from(&(ysi.transpose() * (-2.0 * scale)));
        ys.columns_mut(i * q, q).copy_from(&ysi);
        d_s0 += scale * sbar[i].component_mul(&batch.kxx[i]).sum();
    }
    let mut bbar = &ys * y.transpose() * scale;
    if with_kl {
        bbar -= (&binv - &binv * &binv) * 0.5;
    }
    let bbar = (&bbar + bbar.transpose()) * 0.5;
    let ltkzl = l.transpose() * &kzl;
    d_s0 += bbar.component_mul(&ltkzl).sum() + wbar.component_mul(&kxzl).sum();
    let mut lbar = &kzl * &bbar * (2.0 * s0) + kxz.transpose() * &wbar * s0;
    for c in 0..m {
        for r in 0..c {
            lbar[(r, c)] = 0.0;
        }
    }
    let z = if want_z_grad {
        let c_xz = &wbar * l.transpose() * s0;
        let c_z = l * &bbar * l.transpose() * s0;
        Some(pair.pullback_z(&c_xz, &c_z)?)
    } else {
        None
    };
    Ok((
        value,
        StateGradient { log_prior_var: s0 * d_s0, log_noise_var: noise * scale * d_noise, l: lbar, z },
    ))
}

/// The objective's `−KL(q(u) ‖ p(u))` alone (no data) and its gradient: what a sharded fit
/// adds once to the processes' summed data terms. The same formulas as
/// [`objective_part`]'s KL, with `κ(Z, Z)` and its pull-back to `Z` from the network.
pub(crate) fn kl_term<N: Network>(
    net: &N,
    state: &VariationalState,
    want_z_grad: bool,
) -> Result<(f64, StateGradient)> {
    let m = state.z.nrows();
    let s0 = state.prior_variance();
    let sel = Outputs::One(&state.outputs);
    let kz = net.ntk_block(&state.z, sel, &state.z, sel)?;
    let l = &state.l;
    let kzl = &kz * l;
    let r = factor_b(l, &kzl, s0)?;
    let binv = solve_upper_of_lower(&r, &solve_lower(&r, &DMatrix::identity(m, m)));
    let logdet: f64 = 2.0 * r.diagonal().iter().map(|d| d.ln()).sum::<f64>();
    let kl = 0.5 * (logdet - m as f64 + binv.trace());
    let bbar = (&binv * &binv - &binv) * 0.5;
    let bbar = (&bbar + bbar.transpose()) * 0.5;
    let ltkzl = l.transpose() * &kzl;
    let d_s0 = bbar.component_mul(&ltkzl).sum();
    let mut lbar = &kzl * &bbar * (2.0 * s0);
    for c in 0..m {
        for r in 0..c {
            lbar[(r, c)] = 0.0;
        }
    }
    let z = if want_z_grad {
        let c_z = l * &bbar * l.transpose() * s0;
        let mut g = net.ntk_block_pullback_z(&state.z, sel, &state.z, sel, &c_z)?;
        g += net.ntk_block_pullback_z(&state.z, sel, &state.z, sel, &c_z.transpose())?;
        Some(g)
    } else {
        None
    };
    Ok((-kl, StateGradient { log_prior_var: s0 * d_s0, log_noise_var: 0.0, l: lbar, z }))
}

/// `tᵢ = (1/α) log E_q[p(yᵢ | f)^α]` for `f ~ N(g, Σ)`, with `∂tᵢ/∂Σ` (symmetric `d' × d'`)
/// and `∂tᵢ/∂σ²`.
pub(crate) fn point_term(
    term: DataTerm,
    g: &DVector<f64>,
    sigma: &DMatrix<f64>,
    y: f64,
    noise: f64,
    eps: Option<&DMatrix<f64>>,
    index: usize,
) -> Result<(f64, DMatrix<f64>, f64)> {
    let alpha = term.alpha;
    match term.likelihood {
        VallaLikelihood::Gaussian { .. } => {
            let (r, v) = (y - g[0], sigma[(0, 0)]);
            let tau = noise / alpha + v;
            if tau.is_nan() || tau <= 0.0 {
                return Err(VallaError::NotPositiveDefinite { what: "predictive variance σ²/α + Σ" });
            }
            let log_n = -0.5 * (2.0 * PI * tau).ln() - r * r / (2.0 * tau);
            let t = ((1.0 - alpha) / 2.0 * (2.0 * PI * noise).ln() - 0.5 * alpha.ln() + log_n) / alpha;
            let dtau = (-0.5 / tau + r * r / (2.0 * tau * tau)) / alpha;
            let dnoise = (1.0 - alpha) / (2.0 * alpha * noise) + dtau / alpha;
            Ok((t, DMatrix::from_element(1, 1, dtau), dnoise))
        }
        VallaLikelihood::Categorical => {
            let q = g.len();
            let label = y as usize;
            match term.approx {
                ClassApprox::Probit => {
                    let kappa: Vec<f64> =
                        (0..q).map(|c| 1.0 / (1.0 + PI / 8.0 * sigma[(c, c)].max(0.0)).sqrt()).collect();
                    let u: Vec<f64> = (0..q).map(|c| g[c] * kappa[c]).collect();
                    let lse = logsumexp(&u);
                    let t = u[label] - lse;
                    let mut gs = DMatrix::zeros(q, q);
                    for c in 0..q {
                        if sigma[(c, c)] > 0.0 {
                            let p = (u[c] - lse).exp();
                            let du = (label == c) as u8 as f64 - p;
                            gs[(c, c)] = du * g[c] * (-0.5) * (PI / 8.0) * kappa[c].powi(3);
                        }
                    }
                    Ok((t, gs, 0.0))
                }
                ClassApprox::MonteCarlo { .. } => {
                    let eps = eps.ok_or(VallaError::Input(InputError::Invalid {
                        what: "Monte Carlo noise",
                        reason: format!("missing for point {index}"),
                    }))?;
                    mc_categorical(g, sigma, label, alpha, eps)
                }
            }
        }
    }
}

/// MC estimate of `(1/α) log (1/S) Σₛ softmax(fₛ)_y^α` with `fₛ = g + C εₛ`, `C = chol(Σ)`,
/// and its exact gradient with respect to `Σ` through the Cholesky factor (Murray 2016:
/// `Σ̄ = sym(C⁻ᵀ Φ(Cᵀ C̄) C⁻¹)`, `Φ` = lower triangle with the diagonal halved).
fn mc_categorical(
    g: &DVector<f64>,
    sigma: &DMatrix<f64>,
    label: usize,
    alpha: f64,
    eps: &DMatrix<f64>,
) -> Result<(f64, DMatrix<f64>, f64)> {
    let q = g.len();
    let s = eps.nrows();
    // Σ is PSD up to rounding; a relative jitter keeps the factor defined.
    let jitter = 1e-10 * (sigma.trace() / q as f64).abs().max(1e-300);
    let mut sj = (sigma + sigma.transpose()) * 0.5;
    for c in 0..q {
        sj[(c, c)] += jitter;
    }
    let c =
        sj.cholesky().ok_or(VallaError::NotPositiveDefinite { what: "per-point predictive covariance" })?.l();
    let mut logp = Vec::with_capacity(s);
    let mut grads = Vec::with_capacity(s);
    for k in 0..s {
        let f = g + &c * eps.row(k).transpose();
        let lse = logsumexp(f.as_slice());
        logp.push(f[label] - lse);
        grads.push(DVector::from_fn(q, |j, _| (j == label) as u8 as f64 - (f[j] - lse).exp()));
    }
    let scaled: Vec<f64> = logp.iter().map(|l| alpha * l).collect();
    let lse_s = logsumexp(&scaled);
    let t = (lse_s - (s as f64).ln()) / alpha;
    let mut cbar = DMatrix::zeros(q, q);
    for k in 0..s {
        let w = (scaled[k] - lse_s).exp();
        cbar += &grads[k] * eps.row(k) * w;
    }
    let mut phi = c.transpose() * cbar.lower_triangle();
    for i in 0..q {
        for j in i + 1..q {
            phi[(i, j)] = 0.0;
        }
        phi[(i, i)] *= 0.5;
    }
    let ct = c.transpose();
    let left = ct.solve_upper_triangular(&phi).expect("positive diagonal");
    let sbar_t = ct.solve_upper_triangular(&left.transpose()).expect("positive diagonal");
    let sbar = (&sbar_t + sbar_t.transpose()) * 0.5;
    Ok((t, sbar, 0.0))
}

/// Test / benchmark entry to `objective` with owned inputs: `(F, ∂F)` on the batch
/// `(x, y)` with `n_total` the data size (`eps`: MC noise per point for
/// [`ClassApprox::MonteCarlo`]).
#[allow(clippy::too_many_arguments)]
pub fn objective_value_and_gradient<N: Network>(
    net: &N,
    state: &VariationalState,
    likelihood: LikelihoodSpec,
    approx: ClassApprox,
    alpha: f64,
    x: &DMatrix<f64>,
    y: &[f64],
    eps: Option<&[DMatrix<f64>]>,
    n_total: usize,
    want_z_grad: bool,
) -> Result<(f64, StateGradient)> {
    let likelihood = VallaLikelihood::from_spec(&likelihood, net.output_dim())?;
    let g = net.forward(x)?;
    let kxx = net.ntk_diagonal(x)?;
    let batch = Batch { x, g: &g, kxx: &kxx, y, eps };
    let term = DataTerm { likelihood, approx, alpha };
    objective(net, state, &batch, term, n_total, want_z_grad)
}

/// Test entry to `point_term`: `(t, ∂t/∂Σ, ∂t/∂σ²)`.
pub fn point_term_public(
    likelihood: LikelihoodSpec,
    approx: ClassApprox,
    alpha: f64,
    g: &DVector<f64>,
    sigma: &DMatrix<f64>,
    y: f64,
    noise: f64,
    eps: Option<&DMatrix<f64>>,
) -> Result<(f64, DMatrix<f64>, f64)> {
    let likelihood = VallaLikelihood::from_spec(&likelihood, g.len())?;
    point_term(DataTerm { likelihood, approx, alpha }, g, sigma, y, noise, eps, 0)
}

/// Bench entry: one iteration's objective and gradient as [`fit`](crate::fit) runs it, with the
/// batch's MAP outputs `g` and NTK diagonal blocks `kxx` precomputed (as the fit does once).
#[allow(clippy::too_many_arguments)]
pub fn iteration(
    net: &impl Network,
    state: &VariationalState,
    likelihood: LikelihoodSpec,
    x: &DMatrix<f64>,
    g: &DMatrix<f64>,
    kxx: &[DMatrix<f64>],
    y: &[f64],
    n_total: usize,
) -> Result<(f64, StateGradient)> {
    let likelihood = VallaLikelihood::from_spec(&likelihood, net.output_dim())?;
    let batch = Batch { x, g, kxx, y, eps: None };
    let term = DataTerm { likelihood, approx: ClassApprox::Probit, alpha: 1.0 };
    objective(net, state, &batch, term, n_total, true)
}
