//! Likelihoods `p(y | f)` in function space.
//!
//! Function values at `n` points of a `d'`-output model are an `n × d'` matrix (row `i` holds
//! the outputs of point `i`: the point-major order of the workspace). Each likelihood gives the
//! negative log-likelihood summed over points, its gradient with respect to `f` (same shape),
//! and the per-point Hessian blocks `Hᵢ = ∂²(−log p(yᵢ | fᵢ))/∂fᵢ²` (`d' × d'`) that the
//! generalised Gauss–Newton matrix `Σᵢ Jᵢᵀ Hᵢ Jᵢ` is built from.
//!
//! | likelihood | `d'` | targets | `−log p(y | f)` | gradient | Hessian |
//! |---|---|---|---|---|---|
//! | [`Gaussian`] | 1 | real | `½log 2πσ² + (y − f)²/2σ²` | `(f − y)/σ²` | `1/σ²` |
//! | [`Bernoulli`] | 1 | 0 / 1 | `log(1 + eᶠ) − y f` | `s(f) − y` | `s(1 − s)` |
//! | [`Categorical`] | C | 0..C | `logsumexp(f) − f_y` | `softmax(f) − e_y` | `diag(p) − ppᵀ` |
//! | [`HeteroscedasticGaussian`] | 2 | real | `½log 2π + ½η + (y − μ)²/2eᶯ` | `((μ − y)e⁻ᶯ, ½ − (y − μ)²/2eᶯ)` | Fisher `diag(e⁻ᶯ, ½)` |
//!
//! For the first four the Hessian is the Fisher (canonical links). The heteroscedastic
//! Gaussian's exact Hessian in `(μ, η = log σ²)` is indefinite wherever `y ≠ μ`, so its
//! curvature block is the Fisher information — its expectation over `y` — which is what the
//! Laplace family needs (a PSD GGN). The trait is open: a new likelihood is a new
//! implementation; [`LikelihoodSpec`](crate::LikelihoodSpec) is the serialisable description
//! every method takes.

use fspace_input::InputError;
use nalgebra::{DMatrix, DVector};

use crate::error::{ensure_dim, ensure_finite, CoreError, Result};

/// A likelihood `p(y | f)` factorising over points.
pub trait Likelihood: Send + Sync + std::fmt::Debug {
    /// Outputs `d'` of the model per point.
    fn output_dim(&self) -> usize;
    /// Targets per point (1: a label or a scalar; `d'` for vector-valued regression). Targets
    /// are a flat vector, point-major: point `i`'s targets are `y[i·t .. (i+1)·t]`.
    fn target_dim(&self) -> usize {
        1
    }
    /// Checks targets (length, finiteness, allowed values).
    fn check_targets(&self, y: &DVector<f64>) -> Result<()>;
    /// `Σᵢ −log p(yᵢ | fᵢ)` for `f` of shape `n × d'`.
    fn nll(&self, f: &DMatrix<f64>, y: &DVector<f64>) -> Result<f64>;
    /// `∂/∂f Σᵢ −log p(yᵢ | fᵢ)`, shape `n × d'`.
    fn nll_grad(&self, f: &DMatrix<f64>, y: &DVector<f64>) -> Result<DMatrix<f64>>;
    /// Per-point Hessian blocks `Hᵢ` (`d' × d'`), which are positive semi-definite.
    fn nll_hessian(&self, f: &DMatrix<f64>, y: &DVector<f64>) -> Result<Vec<DMatrix<f64>>>;

    /// Learnable likelihood parameters in unconstrained form (e.g. the Gaussian's `log σ`);
    /// none by default.
    fn params(&self) -> DVector<f64> {
        DVector::zeros(0)
    }
    /// Replaces the learnable parameters (length [`params`](Self::params)`.len()`).
    fn set_params(&mut self, params: &DVector<f64>) -> Result<()> {
        ensure_dim("likelihood parameters", 0, params.len())
    }
    /// `∂/∂θ Σᵢ −log p(yᵢ | fᵢ; θ)` for the learnable parameters `θ`.
    fn nll_param_grad(&self, f: &DMatrix<f64>, y: &DVector<f64>) -> Result<DVector<f64>> {
        check_f(self, f, y)?;
        Ok(DVector::zeros(0))
    }
}

fn check_f<L: Likelihood + ?Sized>(lik: &L, f: &DMatrix<f64>, y: &DVector<f64>) -> Result<()> {
    ensure_dim("function values: columns vs. likelihood outputs", lik.output_dim(), f.ncols())?;
    ensure_dim(
        "targets vs. rows of function values × targets per point",
        f.nrows() * lik.target_dim(),
        y.len(),
    )?;
    if f.nrows() == 0 {
        return Err(CoreError::Input(InputError::Empty { what: "function values" }));
    }
    ensure_finite("function values", f.iter())?;
    lik.check_targets(y)
}

/// The noise σ a Gaussian likelihood takes: within it σ², 1/σ² and their products with
/// squared residuals stay finite and non-zero in f64.
pub const SIGMA_RANGE: (f64, f64) = (1e-150, 1e150);

/// Homoscedastic Gaussian `y ~ N(f, σ²)`. The noise scale can be learned: [`Gaussian::nll_grad_log_sigma`]
/// is the gradient with respect to `log σ`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Gaussian {
    sigma: f64,
}

impl Gaussian {
    /// Noise standard deviation `σ > 0`.
    pub fn new(sigma: f64) -> Result<Self> {
        if !(sigma.is_finite() && sigma > 0.0) {
            return Err(CoreError::Input(InputError::Invalid {
                what: "Gaussian noise σ",
                reason: format!("{sigma} must be > 0"),
            }));
        }
        if !(SIGMA_RANGE.0..=SIGMA_RANGE.1).contains(&sigma) {
            return Err(CoreError::Input(InputError::Invalid {
                what: "Gaussian noise σ",
                reason: format!(
                    "{sigma:e} is outside [{:e}, {:e}]: σ² or its precision 1/σ² would overflow or vanish in f64",
                    SIGMA_RANGE.0, SIGMA_RANGE.1
                ),
            }));
        }
        Ok(Self { sigma })
    }
    /// `σ`.
    pub fn sigma(&self) -> f64 {
        self.sigma
    }
    /// `σ²`.
    pub fn variance(&self) -> f64 {
        self.sigma * self.sigma
    }
    /// `∂/∂log σ Σᵢ −log N(yᵢ | fᵢ, σ²) = Σᵢ (1 − (yᵢ − fᵢ)²/σ²)`.
    pub fn nll_grad_log_sigma(&self, f: &DMatrix<f64>, y: &DVector<f64>) -> Result<f64> {
        check_f(self, f, y)?;
        Ok((0..y.len()).map(|i| 1.0 - (y[i] - f[(i, 0)]).powi(2) / self.variance()).sum())
    }
    /// The predictive of `y` for `f ~ N(m, v)`: `N(m, v + σ²)` (mean, variance per point).
    pub fn predictive(
        &self,
        mean: &DVector<f64>,
        var: &DVector<f64>,
    ) -> Result<(DVector<f64>, DVector<f64>)> {
        ensure_dim("predictive variance vs. mean", mean.len(), var.len())?;
        ensure_finite("predictive mean/variance", mean.iter().chain(var.iter()))?;
        Ok((mean.clone(), var.add_scalar(self.variance())))
    }
}

impl Likelihood for Gaussian {
    fn output_dim(&self) -> usize {
        1
    }
    fn check_targets(&self, y: &DVector<f64>) -> Result<()> {
        ensure_finite("regression targets", y.iter())
    }
    fn nll(&self, f: &DMatrix<f64>, y: &DVector<f64>) -> Result<f64> {
        check_f(self, f, y)?;
        let s2 = self.variance();
        let c = 0.5 * (std::f64::consts::TAU * s2).ln();
        Ok((0..y.len()).map(|i| c + (y[i] - f[(i, 0)]).powi(2) / (2.0 * s2)).sum())
    }
    fn nll_grad(&self, f: &DMatrix<f64>, y: &DVector<f64>) -> Result<DMatrix<f64>> {
        check_f(self, f, y)?;
        Ok(DMatrix::from_fn(y.len(), 1, |i, _| (f[(i, 0)] - y[i]) / self.variance()))
    }
    fn nll_hessian(&self, f: &DMatrix<f64>, y: &DVector<f64>) -> Result<Vec<DMatrix<f64>>> {
        check_f(self, f, y)?;
        Ok(vec![DMatrix::from_element(1, 1, 1.0 / self.variance()); y.len()])
    }
    /// `[log σ]`.
    fn params(&self) -> DVector<f64> {
        DVector::from_element(1, self.sigma.ln())
    }
    fn set_params(&mut self, params: &DVector<f64>) -> Result<()> {
        ensure_dim("Gaussian likelihood parameters ([log σ])", 1, params.len())?;
        *self = Self::new(params[0].exp())?;
        Ok(())
    }
    fn nll_param_grad(&self, f: &DMatrix<f64>, y: &DVector<f64>) -> Result<DVector<f64>> {
        Ok(DVector::from_element(1, self.nll_grad_log_sigma(f, y)?))
    }
}

/// Vector-valued regression `yᵢ ~ N(fᵢ, σ² I_{d'})` (e.g. velocities of the Helmholtz net):
/// targets are `n·d'` values, point-major; learnable `log σ` like [`Gaussian`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct IsotropicGaussian {
    sigma: f64,
    outputs: usize,
}

impl IsotropicGaussian {
    /// `outputs ≥ 1` outputs with noise standard deviation `σ > 0`.
    pub fn new(sigma: f64, outputs: usize) -> Result<Self> {
        if outputs == 0 {
            return Err(CoreError::Input(InputError::Empty { what: "outputs of an isotropic Gaussian" }));
        }
        Ok(Self { sigma: Gaussian::new(sigma)?.sigma(), outputs })
    }
    /// `σ`.
    pub fn sigma(&self) -> f64 {
        self.sigma
    }
    fn residuals(&self, f: &DMatrix<f64>, y: &DVector<f64>) -> Result<Vec<f64>> {
        check_f(self, f, y)?;
        let q = self.outputs;
        Ok((0..y.len()).map(|k| f[(k / q, k % q)] - y[k]).collect())
    }
}

impl Likelihood for IsotropicGaussian {
    fn output_dim(&self) -> usize {
        self.outputs
    }
    fn target_dim(&self) -> usize {
        self.outputs
    }
    fn check_targets(&self, y: &DVector<f64>) -> Result<()> {
        ensure_finite("regression targets", y.iter())
    }
    fn nll(&self, f: &DMatrix<f64>, y: &DVector<f64>) -> Result<f64> {
        let s2 = self.sigma * self.sigma;
        let c = 0.5 * (std::f64::consts::TAU * s2).ln();
        Ok(self.residuals(f, y)?.iter().map(|r| c + r * r / (2.0 * s2)).sum())
    }
    fn nll_grad(&self, f: &DMatrix<f64>, y: &DVector<f64>) -> Result<DMatrix<f64>> {
        let r = self.residuals(f, y)?;
        let s2 = self.sigma * self.sigma;
        Ok(DMatrix::from_fn(f.nrows(), self.outputs, |i, o| r[i * self.outputs + o] / s2))
    }
    fn nll_hessian(&self, f: &DMatrix<f64>, y: &DVector<f64>) -> Result<Vec<DMatrix<f64>>> {
        check_f(self, f, y)?;
        let h = DMatrix::identity(self.outputs, self.outputs) / (self.sigma * self.sigma);
        Ok(vec![h; f.nrows()])
    }
    /// `[log σ]`.
    fn params(&self) -> DVector<f64> {
        DVector::from_element(1, self.sigma.ln())
    }
    fn set_params(&mut self, params: &DVector<f64>) -> Result<()> {
        ensure_dim("isotropic Gaussian parameters ([log σ])", 1, params.len())?;
        *self = Self::new(params[0].exp(), self.outputs)?;
        Ok(())
    }
    fn nll_param_grad(&self, f: &DMatrix<f64>, y: &DVector<f64>) -> Result<DVector<f64>> {
        let s2 = self.sigma * self.sigma;
        Ok(DVector::from_element(1, self.residuals(f, y)?.iter().map(|r| 1.0 - r * r / s2).sum()))
    }
}

/// Logistic sigmoid, computed without overflow.
pub fn sigmoid(f: f64) -> f64 {
    if f >= 0.0 {
        1.0 / (1.0 + (-f).exp())
    } else {
        let e = f.exp();
        e / (1.0 + e)
    }
}

/// `log(1 + eᶠ)` without overflow.
pub fn softplus(f: f64) -> f64 {
    if f > 0.0 {
        f + (-f).exp().ln_1p()
    } else {
        f.exp().ln_1p()
    }
}

/// Bernoulli with a logistic link, `p(y = 1 | f) = s(f)`, targets in {0, 1}.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Bernoulli;

impl Likelihood for Bernoulli {
    fn output_dim(&self) -> usize {
        1
    }
    fn check_targets(&self, y: &DVector<f64>) -> Result<()> {
        for (index, &value) in y.iter().enumerate() {
            if value != 0.0 && value != 1.0 {
                return Err(CoreError::InvalidTarget {
                    index,
                    value,
                    reason: "binary targets must be 0 or 1",
                });
            }
        }
        Ok(())
    }
    fn nll(&self, f: &DMatrix<f64>, y: &DVector<f64>) -> Result<f64> {
        check_f(self, f, y)?;
        Ok((0..y.len()).map(|i| softplus(f[(i, 0)]) - y[i] * f[(i, 0)]).sum())
    }
    fn nll_grad(&self, f: &DMatrix<f64>, y: &DVector<f64>) -> Result<DMatrix<f64>> {
        check_f(self, f, y)?;
        Ok(DMatrix::from_fn(y.len(), 1, |i, _| sigmoid(f[(i, 0)]) - y[i]))
    }
    fn nll_hessian(&self, f: &DMatrix<f64>, y: &DVector<f64>) -> Result<Vec<DMatrix<f64>>> {
        check_f(self, f, y)?;
        Ok((0..y.len())
            .map(|i| {
                let s = sigmoid(f[(i, 0)]);
                DMatrix::from_element(1, 1, s * (1.0 - s))
            })
            .collect())
    }
}

/// Softmax probabilities of one row of logits (max-shifted for stability).
pub fn softmax(logits: &[f64]) -> Vec<f64> {
    let m = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = logits.iter().map(|l| (l - m).exp()).collect();
    let z: f64 = e.iter().sum();
    e.into_iter().map(|v| v / z).collect()
}

/// `log Σ exp(logits)` without overflow.
pub fn logsumexp(logits: &[f64]) -> f64 {
    let m = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    m + logits.iter().map(|l| (l - m).exp()).sum::<f64>().ln()
}

/// Categorical with a softmax link over `C ≥ 2` classes; targets are class indices `0..C`
/// stored as `f64`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Categorical {
    classes: usize,
}

impl Categorical {
    /// `classes ≥ 2`.
    pub fn new(classes: usize) -> Result<Self> {
        if classes < 2 {
            return Err(CoreError::Input(InputError::Invalid {
                what: "classes",
                reason: format!("{classes} < 2"),
            }));
        }
        Ok(Self { classes })
    }
    /// Number of classes `C`.
    pub fn classes(&self) -> usize {
        self.classes
    }
}

impl Likelihood for Categorical {
    fn output_dim(&self) -> usize {
        self.classes
    }
    fn check_targets(&self, y: &DVector<f64>) -> Result<()> {
        for (index, &value) in y.iter().enumerate() {
            if !(value >= 0.0 && value < self.classes as f64 && value.fract() == 0.0) {
                return Err(CoreError::InvalidTarget {
                    index,
                    value,
                    reason: "class labels must be integers in 0..C",
                });
            }
        }
        Ok(())
    }
    fn nll(&self, f: &DMatrix<f64>, y: &DVector<f64>) -> Result<f64> {
        check_f(self, f, y)?;
        Ok((0..y.len())
            .map(|i| {
                let row: Vec<f64> = f.row(i).iter().cloned().collect();
                logsumexp(&row) - row[y[i] as usize]
            })
            .sum())
    }
    fn nll_grad(&self, f: &DMatrix<f64>, y: &DVector<f64>) -> Result<DMatrix<f64>> {
        check_f(self, f, y)?;
        let mut g = DMatrix::zeros(y.len(), self.classes);
        for i in 0..y.len() {
            let p = softmax(&f.row(i).iter().cloned().collect::<Vec<_>>());
            for k in 0..self.classes {
                g[(i, k)] = p[k] - if k == y[i] as usize { 1.0 } else { 0.0 };
            }
        }
        Ok(g)
    }
    fn nll_hessian(&self, f: &DMatrix<f64>, y: &DVector<f64>) -> Result<Vec<DMatrix<f64>>> {
        check_f(self, f, y)?;
        Ok((0..y.len())
            .map(|i| {
                let p = DVector::from_vec(softmax(&f.row(i).iter().cloned().collect::<Vec<_>>()));
                DMatrix::from_diagonal(&p) - &p * p.transpose()
            })
            .collect())
    }
}

/// Heteroscedastic regression: the model outputs a mean `μ` and a log-variance `η = log σ²`
/// per point (`d' = 2`, column 0 is `μ`, column 1 is `η`), and `y ~ N(μ, eᶯ)`.
///
/// [`nll_hessian`](Likelihood::nll_hessian) returns the Fisher information
/// `diag(e⁻ᶯ, ½)` — the expected Hessian — rather than the exact Hessian
/// `[[e⁻ᶯ, (y − μ)e⁻ᶯ], [(y − μ)e⁻ᶯ, (y − μ)²/2eᶯ]]`, whose determinant
/// `−(y − μ)²e⁻²ᶯ/2` makes it indefinite whenever `y ≠ μ`. It has no learnable parameters: the
/// noise is part of the network.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct HeteroscedasticGaussian;

impl HeteroscedasticGaussian {
    /// The predictive of `y` when `μ ~ N(m_μ, v_μ)` and `η ~ N(m_η, v_η)` independently:
    /// mean `m_μ`, variance `v_μ + E[eᶯ] = v_μ + exp(m_η + v_η/2)` (per point).
    pub fn predictive(
        &self,
        mean: &DMatrix<f64>,
        var: &DMatrix<f64>,
    ) -> Result<(DVector<f64>, DVector<f64>)> {
        ensure_dim("heteroscedastic predictive: mean columns (μ, η)", 2, mean.ncols())?;
        ensure_dim("heteroscedastic predictive: variance columns", 2, var.ncols())?;
        ensure_dim("heteroscedastic predictive: variance rows", mean.nrows(), var.nrows())?;
        ensure_finite("predictive mean/variance", mean.iter().chain(var.iter()))?;
        let m = DVector::from_fn(mean.nrows(), |i, _| mean[(i, 0)]);
        let v = DVector::from_fn(mean.nrows(), |i, _| var[(i, 0)] + (mean[(i, 1)] + 0.5 * var[(i, 1)]).exp());
        Ok((m, v))
    }
}

impl Likelihood for HeteroscedasticGaussian {
    fn output_dim(&self) -> usize {
        2
    }
    fn check_targets(&self, y: &DVector<f64>) -> Result<()> {
        ensure_finite("regression targets", y.iter())
    }
    fn nll(&self, f: &DMatrix<f64>, y: &DVector<f64>) -> Result<f64> {
        check_f(self, f, y)?;
        let c = 0.5 * std::f64::consts::TAU.ln();
        Ok((0..y.len())
            .map(|i| {
                let (mu, eta) = (f[(i, 0)], f[(i, 1)]);
                c + 0.5 * eta + 0.5 * (y[i] - mu).powi(2) * (-eta).exp()
            })
            .sum())
    }
    fn nll_grad(&self, f: &DMatrix<f64>, y: &DVector<f64>) -> Result<DMatrix<f64>> {
        check_f(self, f, y)?;
        let mut g = DMatrix::zeros(y.len(), 2);
        for i in 0..y.len() {
            let (r, prec) = (f[(i, 0)] - y[i], (-f[(i, 1)]).exp());
            g[(i, 0)] = r * prec;
            g[(i, 1)] = 0.5 - 0.5 * r * r * prec;
        }
        Ok(g)
    }
    fn nll_hessian(&self, f: &DMatrix<f64>, y: &DVector<f64>) -> Result<Vec<DMatrix<f64>>> {
        check_f(self, f, y)?;
        Ok((0..y.len())
            .map(|i| DMatrix::from_diagonal(&DVector::from_vec(vec![(-f[(i, 1)]).exp(), 0.5])))
            .collect())
    }
}
