//! The Gaussian-process prior `f ~ GP(μ, Σ)` that every function-space method of the workspace
//! takes: FSP-Laplace regularises with it, GFSVI and FVI measure their KL against it, and the
//! GP baselines are its posteriors.

use fspace_input::InputError;
use std::sync::Arc;

use nalgebra::{DMatrix, DVector};

use serde::{Deserialize, Serialize};

use crate::error::{KernelError, Result};
use crate::gram::{gram, gram_diag};
use crate::kernel::{Kernel, KernelBase, MatrixKernel};
use crate::mean::PriorMean;
use crate::spec::MatrixKernelSpec;

/// A shared, read-only matrix kernel — what a [`GpPrior`] holds. It derefs to
/// `dyn MatrixKernel`, is itself a [`MatrixKernel`] (so models such as an exact GP can be built
/// on it), and serialises through its [`MatrixKernelSpec`] (a user kernel without a spec is a
/// serialisation error). Its hyperparameters cannot be set: fit them on the concrete kernel.
#[derive(Clone)]
pub struct SharedKernel(Arc<dyn MatrixKernel>);

impl SharedKernel {
    /// Shares `kernel`.
    pub fn new(kernel: Arc<dyn MatrixKernel>) -> Self {
        Self(kernel)
    }
    /// The shared kernel.
    pub fn arc(&self) -> &Arc<dyn MatrixKernel> {
        &self.0
    }
}

impl std::ops::Deref for SharedKernel {
    type Target = dyn MatrixKernel;
    fn deref(&self) -> &Self::Target {
        &*self.0
    }
}

impl std::fmt::Debug for SharedKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl KernelBase for SharedKernel {
    fn input_dim(&self) -> Option<usize> {
        self.0.input_dim()
    }
    fn n_params(&self) -> usize {
        self.0.n_params()
    }
    fn params(&self) -> Vec<f64> {
        self.0.params()
    }
    fn param_names(&self) -> Vec<String> {
        self.0.param_names()
    }
    fn set_params(&mut self, _p: &[f64]) -> Result<()> {
        Err(KernelError::Unsupported("a shared kernel's hyperparameters are read-only".into()))
    }
    fn check_input_dim(&self, d: usize) -> Result<()> {
        self.0.check_input_dim(d)
    }
}

impl MatrixKernel for SharedKernel {
    fn output_dim(&self) -> usize {
        self.0.output_dim()
    }
    fn eval_block(&self, x: &[f64], y: &[f64], out: &mut [f64]) {
        self.0.eval_block(x, y, out)
    }
    fn eval_block_grad(&self, x: &[f64], y: &[f64], out: &mut [f64]) {
        self.0.eval_block_grad(x, y, out)
    }
    fn matrix_spec(&self) -> Option<MatrixKernelSpec> {
        self.0.matrix_spec()
    }
    fn shared_output_kernel(&self) -> Option<&dyn MatrixKernel> {
        self.0.shared_output_kernel()
    }
    fn eval_block_tile(&self, x: &[f64], y: &[f64], d: usize, out: &mut [f64]) {
        self.0.eval_block_tile(x, y, d, out)
    }
    fn gram_mirrors(&self) -> bool {
        self.0.gram_mirrors()
    }
}

/// A prior's kernel as the owned scalar kernel of a one-output GP model (the sparse GP and the
/// GP classifiers, which evaluate `k(x, y)` and, when training, set its hyperparameters): a
/// scalar kernel is cloned as it is; a [`SharedKernel`] is rebuilt from its spec as a
/// `Box<dyn Kernel>`. A shared kernel with several outputs, or without a spec (a user kernel
/// put behind [`GpPrior::new`]), is [`KernelError::Unsupported`]: build its prior with
/// [`GpPrior::with_kernel`] instead.
pub trait IntoScalarKernel {
    /// The model's kernel type.
    type Scalar: Kernel + Clone;
    /// An owned copy.
    fn to_scalar_kernel(&self) -> Result<Self::Scalar>;
}

impl<K: Kernel + Clone> IntoScalarKernel for K {
    type Scalar = K;
    fn to_scalar_kernel(&self) -> Result<K> {
        Ok(self.clone())
    }
}

impl IntoScalarKernel for SharedKernel {
    type Scalar = Box<dyn Kernel>;
    fn to_scalar_kernel(&self) -> Result<Box<dyn Kernel>> {
        match self.0.matrix_spec() {
            Some(MatrixKernelSpec::Scalar(spec)) => spec.build(),
            Some(_) => Err(KernelError::Unsupported(format!(
                "a one-output GP model takes a scalar kernel; this one is matrix-valued (d' = {})",
                self.0.output_dim()
            ))),
            None => Err(KernelError::Unsupported(
                "the shared kernel has no spec to copy; build the prior with GpPrior::with_kernel".into(),
            )),
        }
    }
}

impl Serialize for SharedKernel {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        crate::spec::serialize_spec(self.0.matrix_spec(), &self.0, serializer)
    }
}

impl<'de> Deserialize<'de> for SharedKernel {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        let kernel =
            MatrixKernelSpec::deserialize(deserializer)?.build().map_err(serde::de::Error::custom)?;
        Ok(Self(Arc::from(kernel)))
    }
}

/// A `d'`-output GP prior: a (matrix-valued) covariance function and a mean. Gram matrices and
/// means are point-major (`i·d' + o`), the order of a network's flattened outputs. Cloning
/// shares the kernel; serde saves the kernel's spec and the mean (zero or constant).
///
/// `K` is the kernel's type. The function-space methods take the default, a type-erased
/// [`SharedKernel`] ([`GpPrior::new`], [`GpPrior::centered`]); a prior built with
/// [`GpPrior::with_kernel`] keeps the concrete kernel, so a GP model fitted on it holds that
/// type and its trained hyperparameters are read through it. [`GpPrior::shared`] turns the one
/// into the other.
#[derive(Clone, Serialize, Deserialize)]
pub struct GpPrior<K = SharedKernel> {
    /// `Σ(x, x')`, a `d' × d'` block per pair of points (scalar kernels have `d' = 1`; use
    /// `Independent` for independent outputs and `Helmholtz` for vector fields).
    pub kernel: K,
    /// `μ(x)`.
    pub mean: PriorMean,
}

impl<K: std::fmt::Debug> std::fmt::Debug for GpPrior<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpPrior").field("kernel", &self.kernel).field("mean", &self.mean).finish()
    }
}

impl GpPrior {
    /// `GP(mean, kernel)`.
    pub fn new(kernel: impl MatrixKernel + 'static, mean: PriorMean) -> Self {
        Self { kernel: SharedKernel(Arc::new(kernel)), mean }
    }
    /// A zero-mean prior (the papers' default).
    pub fn centered(kernel: impl MatrixKernel + 'static) -> Self {
        Self::new(kernel, PriorMean::Zero)
    }
    /// A prior over a boxed kernel (e.g. one built from a
    /// [`MatrixKernelSpec`]).
    pub fn from_boxed(kernel: Box<dyn MatrixKernel>, mean: PriorMean) -> Self {
        Self { kernel: SharedKernel(Arc::from(kernel)), mean }
    }
    /// A prior over an already shared kernel.
    pub fn from_shared(kernel: Arc<dyn MatrixKernel>, mean: PriorMean) -> Self {
        Self { kernel: SharedKernel(kernel), mean }
    }
}

impl<K: MatrixKernel> GpPrior<K> {
    /// `GP(mean, kernel)` keeping the kernel's type.
    pub fn with_kernel(kernel: K, mean: PriorMean) -> Self {
        Self { kernel, mean }
    }
    /// The same prior over a type-erased, shared copy of the kernel (what the function-space
    /// methods take).
    pub fn shared(&self) -> GpPrior
    where
        K: Clone + 'static,
    {
        GpPrior::new(self.kernel.clone(), self.mean.clone())
    }
    /// Outputs `d'`.
    pub fn output_dim(&self) -> usize {
        self.kernel.output_dim()
    }
    /// `μ(X)` point-major (`n·d'`).
    pub fn mean_at(&self, x: &DMatrix<f64>) -> Result<DVector<f64>> {
        self.mean.evaluate(x, self.output_dim())
    }
    /// `Σ(X, X)` (`n·d' × n·d'`, point-major) — for the small sets of a training step; use
    /// [`GramOperator`](crate::GramOperator) for a matrix-free product.
    pub fn gram(&self, x: &DMatrix<f64>) -> Result<DMatrix<f64>> {
        gram(&self.kernel, x, x)
    }
    /// `diag Σ(X, X)` (`n·d'`): the prior marginal variances.
    pub fn variances(&self, x: &DMatrix<f64>) -> Result<DVector<f64>> {
        gram_diag(&self.kernel, x)
    }
    /// Checks the prior against a model's input and output dimensions.
    pub fn check(&self, input_dim: usize, output_dim: usize) -> Result<()> {
        if self.output_dim() != output_dim {
            return Err(KernelError::Input(InputError::DimensionMismatch {
                what: "prior outputs vs. network outputs",
                expected: output_dim,
                found: self.output_dim(),
            }));
        }
        self.kernel.check_input_dim(input_dim)
    }
}
