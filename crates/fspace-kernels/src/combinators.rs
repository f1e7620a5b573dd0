//! Sums, products and scalings of kernels, so that e.g. the Mauna Loa kernel of Rasmussen &
//! Williams §5.4.3 is one expression:
//!
//! ```
//! use fspace_kernels::{Kernel, Periodic, RationalQuadratic, Rbf, White};
//! let mauna_loa = Rbf::new(66.0_f64.powi(2), 67.0).unwrap().boxed()
//!     + Rbf::new(2.4_f64.powi(2), 90.0).unwrap().boxed() * Periodic::new(1.0, 1.3, 1.0).unwrap().boxed()
//!     + RationalQuadratic::new(0.66_f64.powi(2), 1.2, 0.78).unwrap().boxed()
//!     + Rbf::new(0.18_f64.powi(2), 1.6).unwrap().boxed()
//!     + White::new(0.19_f64.powi(2)).unwrap().boxed();
//! // R&W count 11 parameters: they fix the period (1 year) and the periodic factor's amplitude.
//! assert_eq!(mauna_loa.n_params(), 13);
//! ```
//!
//! Hyperparameters of a composite are the concatenation of its parts' (names prefixed with
//! `term{i}.`, `factor{i}.` or `inner.`).

use fspace_input::InputError;
use std::ops::{Add, Mul};

use crate::error::{check_param_len, from_log, positive, KernelError, Result};
use crate::kernel::{Kernel, KernelBase};
use crate::spec::KernelSpec;

fn common_input_dim(parts: &[Box<dyn Kernel>]) -> Option<usize> {
    parts.iter().find_map(|k| k.input_dim())
}

fn check_parts(parts: &[Box<dyn Kernel>], d: usize) -> Result<()> {
    parts.iter().try_for_each(|k| k.check_input_dim(d))
}

fn concat_params(parts: &[Box<dyn Kernel>]) -> Vec<f64> {
    parts.iter().flat_map(|k| k.params()).collect()
}

fn prefixed_names(parts: &[Box<dyn Kernel>], prefix: &str) -> Vec<String> {
    parts
        .iter()
        .enumerate()
        .flat_map(|(i, k)| k.param_names().into_iter().map(move |n| format!("{prefix}{i}.{n}")))
        .collect()
}

/// Sets each part's slice of `p` (all-or-nothing: on error no part is changed).
fn set_parts(parts: &mut [Box<dyn Kernel>], p: &[f64]) -> Result<()> {
    check_param_len(parts.iter().map(|k| k.n_params()).sum(), p.len())?;
    let mut updated: Vec<Box<dyn Kernel>> = parts.iter().map(|k| k.clone_box()).collect();
    let mut offset = 0;
    for k in updated.iter_mut() {
        let n = k.n_params();
        k.set_params(&p[offset..offset + n])?;
        offset += n;
    }
    parts.iter_mut().zip(updated).for_each(|(dst, src)| *dst = src);
    Ok(())
}

fn non_empty(parts: &[Box<dyn Kernel>], what: &'static str) -> Result<()> {
    if parts.is_empty() {
        Err(KernelError::Input(InputError::DimensionMismatch { what, expected: 1, found: 0 }))
    } else {
        Ok(())
    }
}

/// `k(x, y) = Σᵢ kᵢ(x, y)`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Sum {
    terms: Vec<Box<dyn Kernel>>,
}

impl Sum {
    /// The sum of at least one kernel.
    pub fn new(terms: Vec<Box<dyn Kernel>>) -> Result<Self> {
        non_empty(&terms, "terms of a kernel sum")?;
        Ok(Self { terms })
    }
    /// The summands.
    pub fn terms(&self) -> &[Box<dyn Kernel>] {
        &self.terms
    }
}

impl KernelBase for Sum {
    fn input_dim(&self) -> Option<usize> {
        common_input_dim(&self.terms)
    }
    fn n_params(&self) -> usize {
        self.terms.iter().map(|k| k.n_params()).sum()
    }
    fn params(&self) -> Vec<f64> {
        concat_params(&self.terms)
    }
    fn param_names(&self) -> Vec<String> {
        prefixed_names(&self.terms, "term")
    }
    fn set_params(&mut self, p: &[f64]) -> Result<()> {
        set_parts(&mut self.terms, p)
    }
    fn check_input_dim(&self, d: usize) -> Result<()> {
        check_parts(&self.terms, d)
    }
}

impl Kernel for Sum {
    fn eval(&self, x: &[f64], y: &[f64]) -> f64 {
        self.terms.iter().map(|k| k.eval(x, y)).sum()
    }
    fn eval_grad(&self, x: &[f64], y: &[f64], out: &mut [f64]) {
        let mut offset = 0;
        for k in &self.terms {
            let n = k.n_params();
            k.eval_grad(x, y, &mut out[offset..offset + n]);
            offset += n;
        }
    }
    fn eval_grad_x(&self, x: &[f64], y: &[f64], out: &mut [f64]) -> Result<()> {
        let d = x.len();
        let mut part = vec![0.0; d];
        out[..d].fill(0.0);
        for k in &self.terms {
            k.eval_grad_x(x, y, &mut part)?;
            out[..d].iter_mut().zip(&part).for_each(|(o, p)| *o += p);
        }
        Ok(())
    }
    fn is_stationary(&self) -> bool {
        self.terms.iter().all(|k| k.is_stationary())
    }
    fn exactly_symmetric(&self) -> bool {
        self.terms.iter().all(|k| k.exactly_symmetric())
    }
    fn clone_box(&self) -> Box<dyn Kernel> {
        Box::new(self.clone())
    }
    fn spec(&self) -> Option<KernelSpec> {
        let terms = self.terms.iter().map(|k| k.spec()).collect::<Option<Vec<_>>>()?;
        Some(KernelSpec::Sum { terms })
    }
    fn eval_tile(&self, x: &[f64], y: &[f64], d: usize, out: &mut [f64]) {
        let mut buf = vec![0.0; out.len()];
        self.terms[0].eval_tile(x, y, d, out);
        for k in &self.terms[1..] {
            k.eval_tile(x, y, d, &mut buf);
            out.iter_mut().zip(&buf).for_each(|(o, b)| *o += b);
        }
    }
}

/// `k(x, y) = Πᵢ kᵢ(x, y)`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Product {
    factors: Vec<Box<dyn Kernel>>,
}

impl Product {
    /// The product of at least one kernel.
    pub fn new(factors: Vec<Box<dyn Kernel>>) -> Result<Self> {
        non_empty(&factors, "factors of a kernel product")?;
        Ok(Self { factors })
    }
    /// The factors.
    pub fn factors(&self) -> &[Box<dyn Kernel>] {
        &self.factors
    }
}

impl KernelBase for Product {
    fn input_dim(&self) -> Option<usize> {
        common_input_dim(&self.factors)
    }
    fn n_params(&self) -> usize {
        self.factors.iter().map(|k| k.n_params()).sum()
    }
    fn params(&self) -> Vec<f64> {
        concat_params(&self.factors)
    }
    fn param_names(&self) -> Vec<String> {
        prefixed_names(&self.factors, "factor")
    }
    fn set_params(&mut self, p: &[f64]) -> Result<()> {
        set_parts(&mut self.factors, p)
    }
    fn check_input_dim(&self, d: usize) -> Result<()> {
        check_parts(&self.factors, d)
    }
}

impl Kernel for Product {
    fn eval(&self, x: &[f64], y: &[f64]) -> f64 {
        self.factors.iter().map(|k| k.eval(x, y)).product()
    }
    fn eval_grad(&self, x: &[f64], y: &[f64], out: &mut [f64]) {
        // ∂(Π kᵢ)/∂θ of factor j = ∂kⱼ/∂θ · Π_{i≠j} kᵢ (no division, so zeros are safe).
        let values: Vec<f64> = self.factors.iter().map(|k| k.eval(x, y)).collect();
        let mut offset = 0;
        for (j, k) in self.factors.iter().enumerate() {
            let n = k.n_params();
            let others: f64 = values.iter().enumerate().filter(|&(i, _)| i != j).map(|(_, v)| v).product();
            let slot = &mut out[offset..offset + n];
            k.eval_grad(x, y, slot);
            slot.iter_mut().for_each(|g| *g *= others);
            offset += n;
        }
    }
    fn eval_grad_x(&self, x: &[f64], y: &[f64], out: &mut [f64]) -> Result<()> {
        // Product rule, without division (zeros are safe).
        let d = x.len();
        let values: Vec<f64> = self.factors.iter().map(|k| k.eval(x, y)).collect();
        let mut part = vec![0.0; d];
        out[..d].fill(0.0);
        for (j, k) in self.factors.iter().enumerate() {
            let others: f64 = values.iter().enumerate().filter(|&(i, _)| i != j).map(|(_, v)| v).product();
            k.eval_grad_x(x, y, &mut part)?;
            out[..d].iter_mut().zip(&part).for_each(|(o, p)| *o += others * p);
        }
        Ok(())
    }
    fn is_stationary(&self) -> bool {
        self.factors.iter().all(|k| k.is_stationary())
    }
    fn exactly_symmetric(&self) -> bool {
        self.factors.iter().all(|k| k.exactly_symmetric())
    }
    fn clone_box(&self) -> Box<dyn Kernel> {
        Box::new(self.clone())
    }
    fn spec(&self) -> Option<KernelSpec> {
        let factors = self.factors.iter().map(|k| k.spec()).collect::<Option<Vec<_>>>()?;
        Some(KernelSpec::Product { factors })
    }
    fn eval_tile(&self, x: &[f64], y: &[f64], d: usize, out: &mut [f64]) {
        let mut buf = vec![0.0; out.len()];
        self.factors[0].eval_tile(x, y, d, out);
        for k in &self.factors[1..] {
            k.eval_tile(x, y, d, &mut buf);
            out.iter_mut().zip(&buf).for_each(|(o, b)| *o *= b);
        }
    }
}

/// `k(x, y) = c · k₀(x, y)` with a learnable scale `c > 0` (hyperparameter `scale`).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Scaled {
    scale: f64,
    inner: Box<dyn Kernel>,
}

impl Scaled {
    /// `scale · inner` with `scale > 0`.
    pub fn new(scale: f64, inner: Box<dyn Kernel>) -> Result<Self> {
        Ok(Self { scale: positive("scale", scale)?, inner })
    }
    /// The scale `c`.
    pub fn scale(&self) -> f64 {
        self.scale
    }
}

impl KernelBase for Scaled {
    fn input_dim(&self) -> Option<usize> {
        self.inner.input_dim()
    }
    fn n_params(&self) -> usize {
        1 + self.inner.n_params()
    }
    fn params(&self) -> Vec<f64> {
        let mut p = vec![self.scale.ln()];
        p.extend(self.inner.params());
        p
    }
    fn param_names(&self) -> Vec<String> {
        let mut n = vec!["scale".to_string()];
        n.extend(self.inner.param_names().into_iter().map(|s| format!("inner.{s}")));
        n
    }
    fn set_params(&mut self, p: &[f64]) -> Result<()> {
        check_param_len(self.n_params(), p.len())?;
        let scale = from_log("scale", p[0])?;
        let mut inner = self.inner.clone_box();
        inner.set_params(&p[1..])?;
        (self.scale, self.inner) = (scale, inner);
        Ok(())
    }
    fn check_input_dim(&self, d: usize) -> Result<()> {
        self.inner.check_input_dim(d)
    }
}

impl Kernel for Scaled {
    fn eval(&self, x: &[f64], y: &[f64]) -> f64 {
        self.scale * self.inner.eval(x, y)
    }
    fn eval_grad(&self, x: &[f64], y: &[f64], out: &mut [f64]) {
        out[0] = self.eval(x, y);
        self.inner.eval_grad(x, y, &mut out[1..]);
        out[1..self.n_params()].iter_mut().for_each(|g| *g *= self.scale);
    }
    fn eval_grad_x(&self, x: &[f64], y: &[f64], out: &mut [f64]) -> Result<()> {
        self.inner.eval_grad_x(x, y, out)?;
        out[..x.len()].iter_mut().for_each(|g| *g *= self.scale);
        Ok(())
    }
    fn is_stationary(&self) -> bool {
        self.inner.is_stationary()
    }
    fn exactly_symmetric(&self) -> bool {
        self.inner.exactly_symmetric()
    }
    fn clone_box(&self) -> Box<dyn Kernel> {
        Box::new(self.clone())
    }
    fn spec(&self) -> Option<KernelSpec> {
        Some(KernelSpec::Scaled { scale: self.scale, kernel: Box::new(self.inner.spec()?) })
    }
    fn eval_tile(&self, x: &[f64], y: &[f64], d: usize, out: &mut [f64]) {
        self.inner.eval_tile(x, y, d, out);
        out.iter_mut().for_each(|o| *o *= self.scale);
    }
}

impl Add for Box<dyn Kernel> {
    type Output = Box<dyn Kernel>;
    /// `k₁ + k₂` as a [`Sum`].
    fn add(self, rhs: Self) -> Self::Output {
        Box::new(Sum { terms: vec![self, rhs] })
    }
}

impl Mul for Box<dyn Kernel> {
    type Output = Box<dyn Kernel>;
    /// `k₁ · k₂` as a [`Product`].
    fn mul(self, rhs: Self) -> Self::Output {
        Box::new(Product { factors: vec![self, rhs] })
    }
}
