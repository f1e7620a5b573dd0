//! Non-radial building blocks: linear, constant and white-noise kernels.

use crate::error::{check_param_len, from_log, positive, Result};
use crate::kernel::{Kernel, KernelBase};
use crate::spec::KernelSpec;

macro_rules! single_variance_base {
    ($t:ty) => {
        impl KernelBase for $t {
            fn input_dim(&self) -> Option<usize> {
                None
            }
            fn n_params(&self) -> usize {
                1
            }
            fn params(&self) -> Vec<f64> {
                vec![self.variance.ln()]
            }
            fn param_names(&self) -> Vec<String> {
                vec!["variance".into()]
            }
            fn set_params(&mut self, p: &[f64]) -> Result<()> {
                check_param_len(1, p.len())?;
                self.variance = from_log("variance", p[0])?;
                Ok(())
            }
        }
        impl $t {
            /// A kernel with the given variance (> 0).
            pub fn new(variance: f64) -> Result<Self> {
                Ok(Self { variance: positive("variance", variance)? })
            }
            /// The variance σ².
            pub fn variance(&self) -> f64 {
                self.variance
            }
        }
    };
}

/// Linear (dot-product) kernel `k(x, y) = σ² xᵀy`.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Linear {
    variance: f64,
}
single_variance_base!(Linear);

impl Kernel for Linear {
    fn eval(&self, x: &[f64], y: &[f64]) -> f64 {
        self.variance * x.iter().zip(y).map(|(a, b)| a * b).sum::<f64>()
    }
    fn eval_grad(&self, x: &[f64], y: &[f64], out: &mut [f64]) {
        out[0] = self.eval(x, y);
    }
    fn eval_grad_x(&self, x: &[f64], y: &[f64], out: &mut [f64]) -> Result<()> {
        out[..x.len()].iter_mut().zip(y).for_each(|(o, b)| *o = self.variance * b);
        Ok(())
    }
    fn clone_box(&self) -> Box<dyn Kernel> {
        Box::new(self.clone())
    }
    fn spec(&self) -> Option<KernelSpec> {
        Some(KernelSpec::Linear { variance: self.variance })
    }
}

/// Constant kernel `k(x, y) = σ²` (a random constant offset).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Constant {
    variance: f64,
}
single_variance_base!(Constant);

impl Kernel for Constant {
    fn eval(&self, _x: &[f64], _y: &[f64]) -> f64 {
        self.variance
    }
    fn eval_grad(&self, _x: &[f64], _y: &[f64], out: &mut [f64]) {
        out[0] = self.variance;
    }
    fn eval_grad_x(&self, x: &[f64], _y: &[f64], out: &mut [f64]) -> Result<()> {
        out[..x.len()].fill(0.0);
        Ok(())
    }
    fn is_stationary(&self) -> bool {
        true
    }
    fn clone_box(&self) -> Box<dyn Kernel> {
        Box::new(self.clone())
    }
    fn spec(&self) -> Option<KernelSpec> {
        Some(KernelSpec::Constant { variance: self.variance })
    }
}

/// White-noise kernel `k(x, y) = σ² · [x = y]` (exact equality of all coordinates), so
/// `K(X, X) = σ² I` for distinct points and cross-covariances between distinct sets vanish.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct White {
    variance: f64,
}
single_variance_base!(White);

impl Kernel for White {
    fn eval(&self, x: &[f64], y: &[f64]) -> f64 {
        if x == y {
            self.variance
        } else {
            0.0
        }
    }
    fn eval_grad(&self, x: &[f64], y: &[f64], out: &mut [f64]) {
        out[0] = self.eval(x, y);
    }
    /// `0`: the kernel is locally constant off the diagonal, and `k(x, x)` is constant on it.
    fn eval_grad_x(&self, x: &[f64], _y: &[f64], out: &mut [f64]) -> Result<()> {
        out[..x.len()].fill(0.0);
        Ok(())
    }
    fn is_stationary(&self) -> bool {
        true
    }
    fn clone_box(&self) -> Box<dyn Kernel> {
        Box::new(self.clone())
    }
    fn spec(&self) -> Option<KernelSpec> {
        Some(KernelSpec::White { variance: self.variance })
    }
}
