//! The kernel traits.
//!
//! * [`KernelBase`] — what every covariance function has: an input dimension (or none, for
//!   kernels defined on any ℝᵈ) and hyperparameters as a flat **log-space** vector with names.
//! * [`Kernel`] — a scalar covariance `k(x, y)` with analytic gradients of `k` with respect to
//!   its log-hyperparameters. Kernels compose with `+`, `*` and [`Scaled`](crate::Scaled).
//! * [`MatrixKernel`] — a matrix-valued covariance whose value at `(x, y)` is a `d' × d'` block
//!   (multi-output models, Helmholtz). Every [`Kernel`] is a `MatrixKernel` with `d' = 1`.
//! * [`SecondOrderKernel`] — a scalar kernel with analytic cross second derivatives
//!   `∂²k/∂xᵢ∂yⱼ`, required by the [`Helmholtz`](crate::Helmholtz) kernel. Only kernels whose
//!   sample paths are differentiable implement it (RBF, Matérn-5/2, rational quadratic), so a
//!   Helmholtz kernel built on Matérn-1/2 is a compile-time error.
//!
//! Users add kernels by implementing these traits; nothing here is a closed enum.

use fspace_input::InputError;
use std::fmt::Debug;
use std::sync::Arc;

use crate::error::Result;
use crate::spec::KernelSpec;

/// Hyperparameters and input dimension, shared by scalar and matrix-valued kernels.
pub trait KernelBase: Send + Sync + Debug {
    /// The input dimension this kernel requires (`None`: any dimension, e.g. isotropic kernels).
    fn input_dim(&self) -> Option<usize>;
    /// Number of hyperparameters.
    fn n_params(&self) -> usize;
    /// Hyperparameters in log space (log variance, log lengthscales, …).
    fn params(&self) -> Vec<f64>;
    /// Names, aligned with [`params`](Self::params).
    fn param_names(&self) -> Vec<String>;
    /// Sets all hyperparameters from a log-space vector; rejects wrong lengths and values whose
    /// exponential is not a positive finite number.
    fn set_params(&mut self, log_params: &[f64]) -> Result<()>;

    /// Checks that points of dimension `d` are valid inputs (composite kernels check every
    /// part, so conflicting ARD dimensions are reported instead of indexing out of bounds).
    fn check_input_dim(&self, d: usize) -> Result<()> {
        match self.input_dim() {
            Some(expected) if expected != d => {
                Err(crate::KernelError::Input(InputError::DimensionMismatch {
                    what: "point dimension vs. kernel input dimension",
                    expected,
                    found: d,
                }))
            }
            _ => Ok(()),
        }
    }
}

/// A scalar covariance function `k: ℝᵈ × ℝᵈ → ℝ`.
pub trait Kernel: KernelBase {
    /// `k(x, y)`. Both slices have the kernel's input dimension (checked by the Gram functions).
    fn eval(&self, x: &[f64], y: &[f64]) -> f64;

    /// `∂k(x, y)/∂θⱼ` for every log-hyperparameter `θⱼ`, written to `out[..n_params()]`.
    fn eval_grad(&self, x: &[f64], y: &[f64], out: &mut [f64]);

    /// `∂k(x, y)/∂x`, written to `out[..d]` (`d = x.len()`); by symmetry `∂k(x, y)/∂y` is
    /// `eval_grad_x(y, x)`. Where `k` is not differentiable in `x` at `x = y` (Matérn-1/2,
    /// white noise) the symmetric choice `0` is written, which is also the derivative of
    /// `k(x, x)` along the diagonal. Used to learn inducing inputs. The default reports
    /// [`KernelError::Unsupported`](crate::KernelError::Unsupported): user kernels opt in.
    fn eval_grad_x(&self, _x: &[f64], _y: &[f64], _out: &mut [f64]) -> Result<()> {
        Err(crate::KernelError::Unsupported(
            "this kernel has no input gradient ∂k(x, y)/∂x (implement Kernel::eval_grad_x)".into(),
        ))
    }

    /// Whether `k(x, y)` depends on `x − y` only.
    fn is_stationary(&self) -> bool {
        false
    }

    /// Whether `k(x, y)` and `k(y, x)` are the same floating-point number for every pair (not
    /// only mathematically): then the Gram matrix of a point set against itself fills one
    /// triangle and mirrors it, with the same bits as filling both. Default `false`.
    fn exactly_symmetric(&self) -> bool {
        false
    }

    /// A boxed clone (lets `Box<dyn Kernel>` be `Clone`).
    fn clone_box(&self) -> Box<dyn Kernel>;

    /// The serialisable description of this kernel, if it is built from the library's kernels.
    fn spec(&self) -> Option<KernelSpec> {
        None
    }

    /// Fills a tile `out[i·ny + j] = k(xᵢ, yⱼ)` for row-major point blocks `x` (`nx × d`) and `y`
    /// (`ny × d`). Override when a vectorised loop beats pairwise calls (hot path of Gram
    /// products).
    fn eval_tile(&self, x: &[f64], y: &[f64], d: usize, out: &mut [f64]) {
        let ny = y.len() / d;
        for (i, xi) in x.chunks_exact(d).enumerate() {
            for (j, yj) in y.chunks_exact(d).enumerate() {
                out[i * ny + j] = self.eval(xi, yj);
            }
        }
    }

    /// Boxes the kernel as a trait object (for composition with `+` and `*`).
    fn boxed(self) -> Box<dyn Kernel>
    where
        Self: Sized + 'static,
    {
        Box::new(self)
    }
}

/// A matrix-valued covariance function: `k(x, y)` is a `d' × d'` block. Function values of a
/// `d'`-output model at `n` points are ordered point-major (all outputs of point 1, then point
/// 2, …), and Gram matrices use the same order.
pub trait MatrixKernel: KernelBase {
    /// The number of outputs `d'`.
    fn output_dim(&self) -> usize;

    /// Writes the block `k(x, y)` (row-major, `d'²` entries) to `out`.
    fn eval_block(&self, x: &[f64], y: &[f64], out: &mut [f64]);

    /// Writes `∂k(x, y)/∂θⱼ` for every log-hyperparameter, parameter-major: block `j` occupies
    /// `out[j·d'² .. (j+1)·d'²]`.
    fn eval_block_grad(&self, x: &[f64], y: &[f64], out: &mut [f64]);

    /// The serialisable description, if built from the library's kernels.
    fn matrix_spec(&self) -> Option<crate::spec::MatrixKernelSpec>;

    /// `Some(k₀)` when `k(x, y) = k₀(x, y)·I_{d'}` — independent outputs sharing one scalar
    /// kernel — so that solvers can factor the `n × n` scalar Gram instead of the
    /// `n·d' × n·d'` one: in point-major order `K = K₀ ⊗ I_{d'}` and `K⁻¹ = K₀⁻¹ ⊗ I_{d'}`.
    /// `None` (the default) for every other kernel.
    fn shared_output_kernel(&self) -> Option<&dyn MatrixKernel> {
        None
    }

    /// Whether the Gram matrix of a point set against itself may fill one triangle and mirror
    /// it: scalar kernels with `k(x, y) = k(y, x)` bit for bit ([`Kernel::exactly_symmetric`]).
    fn gram_mirrors(&self) -> bool {
        false
    }

    /// Fills the `(nx·d') × (ny·d')` row-major tile of the Gram matrix between point blocks.
    fn eval_block_tile(&self, x: &[f64], y: &[f64], d: usize, out: &mut [f64]) {
        let q = self.output_dim();
        let ny = y.len() / d;
        let width = ny * q;
        let mut block = vec![0.0; q * q];
        for (i, xi) in x.chunks_exact(d).enumerate() {
            for (j, yj) in y.chunks_exact(d).enumerate() {
                self.eval_block(xi, yj, &mut block);
                for a in 0..q {
                    let row = (i * q + a) * width + j * q;
                    out[row..row + q].copy_from_slice(&block[a * q..(a + 1) * q]);
                }
            }
        }
    }
}

impl<K: Kernel + ?Sized> MatrixKernel for K {
    fn output_dim(&self) -> usize {
        1
    }
    fn eval_block(&self, x: &[f64], y: &[f64], out: &mut [f64]) {
        out[0] = self.eval(x, y);
    }
    fn eval_block_grad(&self, x: &[f64], y: &[f64], out: &mut [f64]) {
        self.eval_grad(x, y, out);
    }
    fn matrix_spec(&self) -> Option<crate::spec::MatrixKernelSpec> {
        self.spec().map(crate::spec::MatrixKernelSpec::Scalar)
    }
    fn eval_block_tile(&self, x: &[f64], y: &[f64], d: usize, out: &mut [f64]) {
        self.eval_tile(x, y, d, out);
    }
    fn gram_mirrors(&self) -> bool {
        self.exactly_symmetric()
    }
}

/// A scalar kernel with analytic cross second derivatives, `Hᵢⱼ(x, y) = ∂²k/∂xᵢ∂yⱼ`: the
/// covariance between the gradients `∇f(x)` and `∇f(y)` of `f ~ GP(0, k)`.
pub trait SecondOrderKernel: Kernel {
    /// Writes `H(x, y)` (`d × d`, row-major, `d = x.len()`) to `out`.
    fn cross_hessian(&self, x: &[f64], y: &[f64], out: &mut [f64]);
    /// Writes `∂H(x, y)/∂θⱼ` for every log-hyperparameter, parameter-major blocks of `d²`.
    fn cross_hessian_grad(&self, x: &[f64], y: &[f64], out: &mut [f64]);
    /// A boxed clone.
    fn clone_second_order(&self) -> Box<dyn SecondOrderKernel>;
}

impl Clone for Box<dyn Kernel> {
    fn clone(&self) -> Self {
        self.clone_box()
    }
}

impl Clone for Box<dyn SecondOrderKernel> {
    fn clone(&self) -> Self {
        self.clone_second_order()
    }
}

macro_rules! forward_base {
    ($($wrapper:ty),*) => {$(
        impl<K: KernelBase + ?Sized> KernelBase for $wrapper {
            fn input_dim(&self) -> Option<usize> { (**self).input_dim() }
            fn n_params(&self) -> usize { (**self).n_params() }
            fn params(&self) -> Vec<f64> { (**self).params() }
            fn param_names(&self) -> Vec<String> { (**self).param_names() }
            fn set_params(&mut self, p: &[f64]) -> Result<()> { (**self).set_params(p) }
            fn check_input_dim(&self, d: usize) -> Result<()> { (**self).check_input_dim(d) }
        }
    )*};
}
forward_base!(Box<K>);

impl<K: KernelBase + ?Sized> KernelBase for &K {
    fn input_dim(&self) -> Option<usize> {
        (**self).input_dim()
    }
    fn n_params(&self) -> usize {
        (**self).n_params()
    }
    fn params(&self) -> Vec<f64> {
        (**self).params()
    }
    fn param_names(&self) -> Vec<String> {
        (**self).param_names()
    }
    fn set_params(&mut self, _p: &[f64]) -> Result<()> {
        Err(crate::KernelError::Unsupported("cannot set hyperparameters through a shared reference".into()))
    }
    fn check_input_dim(&self, d: usize) -> Result<()> {
        (**self).check_input_dim(d)
    }
}

impl<K: KernelBase + ?Sized> KernelBase for Arc<K> {
    fn input_dim(&self) -> Option<usize> {
        (**self).input_dim()
    }
    fn n_params(&self) -> usize {
        (**self).n_params()
    }
    fn params(&self) -> Vec<f64> {
        (**self).params()
    }
    fn param_names(&self) -> Vec<String> {
        (**self).param_names()
    }
    fn set_params(&mut self, _p: &[f64]) -> Result<()> {
        Err(crate::KernelError::Unsupported(
            "cannot set hyperparameters through a shared Arc; clone the kernel first".into(),
        ))
    }
    fn check_input_dim(&self, d: usize) -> Result<()> {
        (**self).check_input_dim(d)
    }
}

macro_rules! forward_kernel {
    ($($wrapper:ty),*) => {$(
        impl<K: Kernel + ?Sized> Kernel for $wrapper {
            fn eval(&self, x: &[f64], y: &[f64]) -> f64 { (**self).eval(x, y) }
            fn eval_grad(&self, x: &[f64], y: &[f64], out: &mut [f64]) { (**self).eval_grad(x, y, out) }
            fn eval_grad_x(&self, x: &[f64], y: &[f64], out: &mut [f64]) -> Result<()> { (**self).eval_grad_x(x, y, out) }
            fn is_stationary(&self) -> bool { (**self).is_stationary() }
            fn exactly_symmetric(&self) -> bool { (**self).exactly_symmetric() }
            fn clone_box(&self) -> Box<dyn Kernel> { (**self).clone_box() }
            fn spec(&self) -> Option<KernelSpec> { (**self).spec() }
            fn eval_tile(&self, x: &[f64], y: &[f64], d: usize, out: &mut [f64]) { (**self).eval_tile(x, y, d, out) }
        }
    )*};
}
forward_kernel!(Box<K>, &K, Arc<K>);

pub(crate) use crate::names::indexed_names;

/// Boxed and borrowed matrix kernels are matrix kernels (a borrowed one lets an operator such
/// as `GramOperator` use a kernel owned elsewhere; its hyperparameters are read-only).
macro_rules! forward_matrix_kernel {
    ($($t:ty),*) => {$(
        impl MatrixKernel for $t {
            fn output_dim(&self) -> usize { (**self).output_dim() }
            fn eval_block(&self, x: &[f64], y: &[f64], out: &mut [f64]) { (**self).eval_block(x, y, out) }
            fn eval_block_grad(&self, x: &[f64], y: &[f64], out: &mut [f64]) {
                (**self).eval_block_grad(x, y, out)
            }
            fn matrix_spec(&self) -> Option<crate::spec::MatrixKernelSpec> { (**self).matrix_spec() }
            fn eval_block_tile(&self, x: &[f64], y: &[f64], d: usize, out: &mut [f64]) {
                (**self).eval_block_tile(x, y, d, out)
            }
        }
    )*};
}
forward_matrix_kernel!(Box<dyn MatrixKernel>, &dyn MatrixKernel);
