//! Stationary radial kernels `k(x, y) = σ² g(s)`, `s = Σᵢ ((xᵢ − yᵢ)/ℓᵢ)²`.
//!
//! One implementation, [`Stationary<P>`], serves every radial profile `g` (RBF, Matérn,
//! rational quadratic): lengthscale gradients, ARD and the cross second derivatives needed by
//! the Helmholtz kernel are written once in terms of `g` and its derivatives in `s`.
//!
//! | kernel | `g(s)`, `r = √s` |
//! |---|---|
//! | RBF | `exp(−s/2)` |
//! | Matérn-1/2 | `exp(−r)` |
//! | Matérn-3/2 | `(1 + √3 r) exp(−√3 r)` |
//! | Matérn-5/2 | `(1 + √5 r + 5s/3) exp(−√5 r)` |
//! | rational quadratic | `(1 + s/(2α))^(−α)` |
//!
//! Hyperparameters, in log space and in this order: `variance` (σ²), `lengthscale` (one
//! value: isotropic, any input dimension; `d` values: ARD, input dimension `d`), then shape
//! parameters (`alpha` for the rational quadratic).
//!
//! Cross second derivatives (with `τ = x − y`, `aᵢ = τᵢ/ℓᵢ²`):
//! `∂²k/∂xᵢ∂yⱼ = −σ² [4 g''(s) aᵢ aⱼ + 2 g'(s) δᵢⱼ/ℓᵢ²]`.

use std::fmt::Debug;

use serde::{Deserialize, Serialize};

use crate::error::{check_param_len, from_log, positive, validate_lengthscales, Result};
use crate::kernel::{indexed_names, Kernel, KernelBase, SecondOrderKernel};
use crate::spec::KernelSpec;

/// A radial profile `g(s)` of a stationary kernel, as a function of the squared scaled distance.
pub trait RadialProfile: Send + Sync + Debug + Clone + 'static {
    /// Short name used in specs and parameter names.
    const KIND: &'static str;
    /// Number of shape hyperparameters.
    fn n_shape(&self) -> usize {
        0
    }
    /// Shape hyperparameters in log space.
    fn shape_params(&self) -> Vec<f64> {
        Vec::new()
    }
    /// Names of the shape hyperparameters.
    fn shape_names(&self) -> Vec<String> {
        Vec::new()
    }
    /// Sets the shape hyperparameters from log space.
    fn set_shape_params(&mut self, _log_params: &[f64]) -> Result<()> {
        Ok(())
    }
    /// `g(s)`.
    fn value(&self, s: f64) -> f64;
    /// `g'(s)`; may be infinite at `s = 0` for rough kernels (callers guard `s = 0`).
    fn d1(&self, s: f64) -> f64;
    /// `∂g(s)/∂(log shape parameter)` for each shape parameter.
    fn shape_grad(&self, _s: f64, _out: &mut [f64]) {}
    /// The serialisable description of `σ² g` with these lengthscales.
    fn to_spec(&self, variance: f64, lengthscales: Vec<f64>) -> KernelSpec;
}

/// A twice (and thrice, for hyperparameter gradients) differentiable profile: the kernel's
/// sample paths are differentiable and the gradient field has a covariance.
pub trait SmoothProfile: RadialProfile {
    /// `g''(s)`.
    fn d2(&self, s: f64) -> f64;
    /// `g'''(s)`; may be infinite at `s = 0` (guarded by callers).
    fn d3(&self, s: f64) -> f64;
    /// `∂g'(s)/∂(log shape)` for each shape parameter.
    fn shape_grad_d1(&self, _s: f64, _out: &mut [f64]) {}
    /// `∂g''(s)/∂(log shape)` for each shape parameter.
    fn shape_grad_d2(&self, _s: f64, _out: &mut [f64]) {}
}

/// Squared-exponential profile `g(s) = exp(−s/2)`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct RbfProfile;

impl RadialProfile for RbfProfile {
    const KIND: &'static str = "rbf";
    fn value(&self, s: f64) -> f64 {
        (-0.5 * s).exp()
    }
    fn d1(&self, s: f64) -> f64 {
        -0.5 * (-0.5 * s).exp()
    }
    fn to_spec(&self, variance: f64, lengthscales: Vec<f64>) -> KernelSpec {
        KernelSpec::Rbf { variance, lengthscales }
    }
}

impl SmoothProfile for RbfProfile {
    fn d2(&self, s: f64) -> f64 {
        0.25 * (-0.5 * s).exp()
    }
    fn d3(&self, s: f64) -> f64 {
        -0.125 * (-0.5 * s).exp()
    }
}

/// Matérn ν = 1/2 (exponential) profile `g = exp(−r)`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Matern12Profile;

impl RadialProfile for Matern12Profile {
    const KIND: &'static str = "matern12";
    fn value(&self, s: f64) -> f64 {
        (-s.sqrt()).exp()
    }
    fn d1(&self, s: f64) -> f64 {
        let r = s.sqrt();
        -(-r).exp() / (2.0 * r)
    }
    fn to_spec(&self, variance: f64, lengthscales: Vec<f64>) -> KernelSpec {
        KernelSpec::Matern12 { variance, lengthscales }
    }
}

const SQRT3: f64 = 1.732_050_807_568_877_2;
const SQRT5: f64 = 2.236_067_977_499_79;

/// Matérn ν = 3/2 profile `g = (1 + √3 r) exp(−√3 r)`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Matern32Profile;

impl RadialProfile for Matern32Profile {
    const KIND: &'static str = "matern32";
    fn value(&self, s: f64) -> f64 {
        let r = SQRT3 * s.sqrt();
        (1.0 + r) * (-r).exp()
    }
    fn d1(&self, s: f64) -> f64 {
        -1.5 * (-SQRT3 * s.sqrt()).exp()
    }
    fn to_spec(&self, variance: f64, lengthscales: Vec<f64>) -> KernelSpec {
        KernelSpec::Matern32 { variance, lengthscales }
    }
}

/// Matérn ν = 5/2 profile `g = (1 + √5 r + 5s/3) exp(−√5 r)`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Matern52Profile;

impl RadialProfile for Matern52Profile {
    const KIND: &'static str = "matern52";
    fn value(&self, s: f64) -> f64 {
        let r = s.sqrt();
        (1.0 + SQRT5 * r + 5.0 * s / 3.0) * (-SQRT5 * r).exp()
    }
    fn d1(&self, s: f64) -> f64 {
        let r = s.sqrt();
        -(5.0 / 6.0) * (1.0 + SQRT5 * r) * (-SQRT5 * r).exp()
    }
    fn to_spec(&self, variance: f64, lengthscales: Vec<f64>) -> KernelSpec {
        KernelSpec::Matern52 { variance, lengthscales }
    }
}

impl SmoothProfile for Matern52Profile {
    fn d2(&self, s: f64) -> f64 {
        (25.0 / 12.0) * (-SQRT5 * s.sqrt()).exp()
    }
    fn d3(&self, s: f64) -> f64 {
        let r = s.sqrt();
        -(25.0 * SQRT5 / 24.0) * (-SQRT5 * r).exp() / r
    }
}

/// Rational-quadratic profile `g = (1 + s/(2α))^(−α)` with shape `α > 0`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RqProfile {
    alpha: f64,
}

impl RqProfile {
    /// A profile with shape `alpha > 0`.
    pub fn new(alpha: f64) -> Result<Self> {
        Ok(Self { alpha: positive("alpha", alpha)? })
    }
    /// The shape α.
    pub fn alpha(&self) -> f64 {
        self.alpha
    }
    fn u(&self, s: f64) -> f64 {
        1.0 + s / (2.0 * self.alpha)
    }
}

impl RadialProfile for RqProfile {
    const KIND: &'static str = "rational_quadratic";
    fn n_shape(&self) -> usize {
        1
    }
    fn shape_params(&self) -> Vec<f64> {
        vec![self.alpha.ln()]
    }
    fn shape_names(&self) -> Vec<String> {
        vec!["alpha".into()]
    }
    fn set_shape_params(&mut self, p: &[f64]) -> Result<()> {
        self.alpha = from_log("alpha", p[0])?;
        Ok(())
    }
    fn value(&self, s: f64) -> f64 {
        self.u(s).powf(-self.alpha)
    }
    fn d1(&self, s: f64) -> f64 {
        -0.5 * self.u(s).powf(-self.alpha - 1.0)
    }
    fn shape_grad(&self, s: f64, out: &mut [f64]) {
        let (a, u) = (self.alpha, self.u(s));
        out[0] = a * self.value(s) * (-u.ln() + s / (2.0 * a * u));
    }
    fn to_spec(&self, variance: f64, lengthscales: Vec<f64>) -> KernelSpec {
        KernelSpec::RationalQuadratic { variance, lengthscales, alpha: self.alpha }
    }
}

impl SmoothProfile for RqProfile {
    fn d2(&self, s: f64) -> f64 {
        let a = self.alpha;
        (a + 1.0) / (4.0 * a) * self.u(s).powf(-a - 2.0)
    }
    fn d3(&self, s: f64) -> f64 {
        let a = self.alpha;
        -(a + 1.0) * (a + 2.0) / (8.0 * a * a) * self.u(s).powf(-a - 3.0)
    }
    fn shape_grad_d1(&self, s: f64, out: &mut [f64]) {
        let (a, u) = (self.alpha, self.u(s));
        out[0] = a * self.d1(s) * (-u.ln() + (a + 1.0) * s / (2.0 * a * a * u));
    }
    fn shape_grad_d2(&self, s: f64, out: &mut [f64]) {
        let (a, u) = (self.alpha, self.u(s));
        let dlog = 1.0 / (a + 1.0) - 1.0 / a - u.ln() + (a + 2.0) * s / (2.0 * a * a * u);
        out[0] = a * self.d2(s) * dlog;
    }
}

/// A stationary radial kernel `σ² g(‖(x − y)/ℓ‖²)`; see the module docs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Stationary<P> {
    variance: f64,
    lengthscales: Vec<f64>,
    profile: P,
}

/// Squared-exponential (RBF) kernel `σ² exp(−‖x − y‖²/(2ℓ²))`.
pub type Rbf = Stationary<RbfProfile>;
/// Matérn ν = 1/2 (exponential / Ornstein–Uhlenbeck) kernel.
pub type Matern12 = Stationary<Matern12Profile>;
/// Matérn ν = 3/2 kernel.
pub type Matern32 = Stationary<Matern32Profile>;
/// Matérn ν = 5/2 kernel.
pub type Matern52 = Stationary<Matern52Profile>;
/// Rational-quadratic kernel `σ² (1 + s/(2α))^(−α)`.
pub type RationalQuadratic = Stationary<RqProfile>;

impl<P: RadialProfile> Stationary<P> {
    /// Builds `σ² g` with a profile; `lengthscales` of length 1 is isotropic, of length `d` ARD.
    pub fn with_profile(variance: f64, lengthscales: Vec<f64>, profile: P) -> Result<Self> {
        positive("variance", variance)?;
        validate_lengthscales(&lengthscales)?;
        Ok(Self { variance, lengthscales, profile })
    }
    /// The output variance σ².
    pub fn variance(&self) -> f64 {
        self.variance
    }
    /// The lengthscales (one value: isotropic).
    pub fn lengthscales(&self) -> &[f64] {
        &self.lengthscales
    }
    /// The radial profile.
    pub fn profile(&self) -> &P {
        &self.profile
    }
    fn iso(&self) -> bool {
        self.lengthscales.len() == 1
    }
    #[inline]
    fn scaled_sq_dist(&self, x: &[f64], y: &[f64]) -> f64 {
        if self.iso() {
            let inv = 1.0 / self.lengthscales[0];
            sq_dist(x, y) * (inv * inv)
        } else {
            x.iter().zip(y).zip(&self.lengthscales).map(|((a, b), l)| ((a - b) / l).powi(2)).sum()
        }
    }
    #[inline]
    fn ls(&self, i: usize) -> f64 {
        if self.iso() {
            self.lengthscales[0]
        } else {
            self.lengthscales[i]
        }
    }
}

/// `‖x − y‖²` with eight independent partial sums, so the compiler can keep them in vector
/// registers (a single `f64` sum must be evaluated in order and does not vectorise); for
/// 784-dimensional images this is most of a Gram matrix's cost.
#[inline]
pub(crate) fn sq_dist(x: &[f64], y: &[f64]) -> f64 {
    const LANES: usize = 8;
    let mut acc = [0.0f64; LANES];
    let (xc, yc) = (x.chunks_exact(LANES), y.chunks_exact(LANES));
    let (xr, yr) = (xc.remainder(), yc.remainder());
    for (a, b) in xc.zip(yc) {
        for k in 0..LANES {
            let t = a[k] - b[k];
            acc[k] += t * t;
        }
    }
    let tail: f64 = xr.iter().zip(yr).map(|(a, b)| (a - b) * (a - b)).sum();
    acc.iter().sum::<f64>() + tail
}

macro_rules! shapeless_constructors {
    ($($profile:ty => $doc:literal),*) => {$(
        impl Stationary<$profile> {
            #[doc = concat!("Isotropic ", $doc, " with variance σ² and lengthscale ℓ (both > 0).")]
            pub fn new(variance: f64, lengthscale: f64) -> Result<Self> {
                Self::with_profile(variance, vec![lengthscale], <$profile>::default())
            }
            #[doc = concat!("ARD ", $doc, " with one lengthscale per input dimension.")]
            pub fn ard(variance: f64, lengthscales: Vec<f64>) -> Result<Self> {
                Self::with_profile(variance, lengthscales, <$profile>::default())
            }
        }
    )*};
}
shapeless_constructors!(
    RbfProfile => "RBF kernel",
    Matern12Profile => "Matérn-1/2 kernel",
    Matern32Profile => "Matérn-3/2 kernel",
    Matern52Profile => "Matérn-5/2 kernel"
);

impl Stationary<RqProfile> {
    /// Isotropic rational-quadratic kernel with variance, lengthscale and shape α (all > 0).
    pub fn new(variance: f64, lengthscale: f64, alpha: f64) -> Result<Self> {
        Self::with_profile(variance, vec![lengthscale], RqProfile::new(alpha)?)
    }
    /// ARD rational-quadratic kernel.
    pub fn ard(variance: f64, lengthscales: Vec<f64>, alpha: f64) -> Result<Self> {
        Self::with_profile(variance, lengthscales, RqProfile::new(alpha)?)
    }
}

impl<P: RadialProfile> KernelBase for Stationary<P> {
    fn input_dim(&self) -> Option<usize> {
        (!self.iso()).then_some(self.lengthscales.len())
    }
    fn n_params(&self) -> usize {
        1 + self.lengthscales.len() + self.profile.n_shape()
    }
    fn params(&self) -> Vec<f64> {
        let mut p = vec![self.variance.ln()];
        p.extend(self.lengthscales.iter().map(|l| l.ln()));
        p.extend(self.profile.shape_params());
        p
    }
    fn param_names(&self) -> Vec<String> {
        let mut n = vec!["variance".to_string()];
        n.extend(indexed_names("lengthscale", self.lengthscales.len()));
        n.extend(self.profile.shape_names());
        n
    }
    fn set_params(&mut self, p: &[f64]) -> Result<()> {
        check_param_len(self.n_params(), p.len())?;
        let names = self.param_names();
        let variance = from_log(&names[0], p[0])?;
        let nl = self.lengthscales.len();
        let ls = (0..nl).map(|i| from_log(&names[1 + i], p[1 + i])).collect::<Result<Vec<_>>>()?;
        let mut profile = self.profile.clone();
        profile.set_shape_params(&p[1 + nl..])?;
        (self.variance, self.lengthscales, self.profile) = (variance, ls, profile);
        Ok(())
    }
}

impl<P: RadialProfile> Kernel for Stationary<P> {
    #[inline]
    fn eval(&self, x: &[f64], y: &[f64]) -> f64 {
        self.variance * self.profile.value(self.scaled_sq_dist(x, y))
    }
    /// `Σ_d ((x_d − y_d)/ℓ_d)²` (and the tile's pre-scaled `Σ_d (x_d/ℓ_d − y_d/ℓ_d)²`) is the
    /// same number with `x` and `y` swapped: `a − b = −(b − a)` exactly in IEEE arithmetic.
    fn exactly_symmetric(&self) -> bool {
        true
    }

    fn eval_grad(&self, x: &[f64], y: &[f64], out: &mut [f64]) {
        let s = self.scaled_sq_dist(x, y);
        out[0] = self.variance * self.profile.value(s);
        let nl = self.lengthscales.len();
        // ∂s/∂log ℓᵢ = −2 τᵢ²/ℓᵢ²; at s = 0 every τᵢ vanishes (guards g'(0) = −∞ for Matérn-1/2).
        let dg = if s > 0.0 { self.variance * self.profile.d1(s) } else { 0.0 };
        if self.iso() {
            out[1] = dg * (-2.0 * s);
        } else {
            for i in 0..nl {
                let t = (x[i] - y[i]) / self.lengthscales[i];
                out[1 + i] = dg * (-2.0 * t * t);
            }
        }
        let shape = &mut out[1 + nl..self.n_params()];
        self.profile.shape_grad(s, shape);
        shape.iter_mut().for_each(|g| *g *= self.variance);
    }

    fn eval_grad_x(&self, x: &[f64], y: &[f64], out: &mut [f64]) -> Result<()> {
        // ∂k/∂xᵢ = σ² g'(s) · 2(xᵢ − yᵢ)/ℓᵢ²; 0 at s = 0 (every τᵢ vanishes; guards g'(0) = −∞).
        let s = self.scaled_sq_dist(x, y);
        let c = if s > 0.0 { 2.0 * self.variance * self.profile.d1(s) } else { 0.0 };
        for (i, o) in out[..x.len()].iter_mut().enumerate() {
            *o = c * (x[i] - y[i]) / self.ls(i).powi(2);
        }
        Ok(())
    }

    fn is_stationary(&self) -> bool {
        true
    }

    fn clone_box(&self) -> Box<dyn Kernel> {
        Box::new(self.clone())
    }

    fn spec(&self) -> Option<KernelSpec> {
        Some(self.profile.to_spec(self.variance, self.lengthscales.clone()))
    }

    fn eval_tile(&self, x: &[f64], y: &[f64], d: usize, out: &mut [f64]) {
        // Pre-scale both blocks by 1/ℓ once, then the inner loop is a plain squared distance.
        let inv: Vec<f64> = (0..d).map(|i| 1.0 / self.ls(i)).collect();
        let scale = |block: &[f64]| -> Vec<f64> {
            block.chunks_exact(d).flat_map(|p| p.iter().zip(&inv).map(|(a, b)| a * b)).collect()
        };
        let (xs, ys) = (scale(x), scale(y));
        let ny = y.len() / d;
        for (i, xi) in xs.chunks_exact(d).enumerate() {
            let row = &mut out[i * ny..(i + 1) * ny];
            for (o, yj) in row.iter_mut().zip(ys.chunks_exact(d)) {
                *o = self.variance * self.profile.value(sq_dist(xi, yj));
            }
        }
    }
}

impl<P: SmoothProfile> SecondOrderKernel for Stationary<P> {
    fn cross_hessian(&self, x: &[f64], y: &[f64], out: &mut [f64]) {
        let d = x.len();
        let s = self.scaled_sq_dist(x, y);
        let (g1, g2) = (self.profile.d1(s), self.profile.d2(s));
        for i in 0..d {
            let ai = (x[i] - y[i]) / self.ls(i).powi(2);
            for j in 0..d {
                let aj = (x[j] - y[j]) / self.ls(j).powi(2);
                let delta = if i == j { 2.0 * g1 / self.ls(i).powi(2) } else { 0.0 };
                out[i * d + j] = -self.variance * (4.0 * g2 * ai * aj + delta);
            }
        }
    }

    fn cross_hessian_grad(&self, x: &[f64], y: &[f64], out: &mut [f64]) {
        let d = x.len();
        let dd = d * d;
        let s = self.scaled_sq_dist(x, y);
        let (g1, g2) = (self.profile.d1(s), self.profile.d2(s));
        let g3 = if s > 0.0 { self.profile.d3(s) } else { 0.0 };
        let a: Vec<f64> = (0..d).map(|i| (x[i] - y[i]) / self.ls(i).powi(2)).collect();
        let inv_l2: Vec<f64> = (0..d).map(|i| 1.0 / self.ls(i).powi(2)).collect();
        let sv = self.variance;
        // log variance: H itself.
        self.cross_hessian(x, y, &mut out[..dd]);
        let nl = self.lengthscales.len();
        // Lengthscale k (ARD) — for isotropic, k ranges over all dimensions at once.
        for k in 0..nl {
            let block = &mut out[(1 + k) * dd..(2 + k) * dd];
            let owns = |i: usize| self.iso() || i == k;
            // ∂s/∂log ℓₖ
            let ds: f64 = (0..d).filter(|&i| owns(i)).map(|i| -2.0 * (x[i] - y[i]).powi(2) * inv_l2[i]).sum();
            for i in 0..d {
                for j in 0..d {
                    // ∂(aᵢaⱼ)/∂log ℓₖ = −2 aᵢaⱼ ([i owned] + [j owned])
                    let n_owned = owns(i) as u8 + owns(j) as u8;
                    let daa = -2.0 * a[i] * a[j] * n_owned as f64;
                    let mut v = 4.0 * g3 * ds * a[i] * a[j] + 4.0 * g2 * daa;
                    if i == j {
                        v += 2.0 * g2 * ds * inv_l2[i];
                        if owns(i) {
                            v += 2.0 * g1 * (-2.0 * inv_l2[i]);
                        }
                    }
                    block[i * d + j] = -sv * v;
                }
            }
        }
        let ns = self.profile.n_shape();
        if ns > 0 {
            let (mut dg1, mut dg2) = (vec![0.0; ns], vec![0.0; ns]);
            self.profile.shape_grad_d1(s, &mut dg1);
            self.profile.shape_grad_d2(s, &mut dg2);
            for q in 0..ns {
                let block = &mut out[(1 + nl + q) * dd..(2 + nl + q) * dd];
                for i in 0..d {
                    for j in 0..d {
                        let delta = if i == j { 2.0 * dg1[q] * inv_l2[i] } else { 0.0 };
                        block[i * d + j] = -sv * (4.0 * dg2[q] * a[i] * a[j] + delta);
                    }
                }
            }
        }
    }

    fn clone_second_order(&self) -> Box<dyn SecondOrderKernel> {
        Box::new(self.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::sq_dist;

    #[test]
    fn lane_summed_squared_distance_equals_the_plain_sum() {
        // Every length around the 8-lane blocks, including the empty and remainder-only cases.
        for len in 0..40 {
            let x: Vec<f64> = (0..len).map(|i| (i as f64 * 0.7).sin() * 3.0).collect();
            let y: Vec<f64> = (0..len).map(|i| (i as f64 * 1.3).cos()).collect();
            let plain: f64 = x.iter().zip(&y).map(|(a, b)| (a - b) * (a - b)).sum();
            assert!((sq_dist(&x, &y) - plain).abs() <= 1e-13 * plain.max(1.0), "length {len}");
        }
        assert_eq!(sq_dist(&[1.0; 784], &[1.0; 784]), 0.0);
    }
}
