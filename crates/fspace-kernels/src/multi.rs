//! Matrix-valued kernels: independent outputs and the Helmholtz kernel for 2-D vector fields.

use crate::error::{check_param_len, KernelError, Result};
use crate::kernel::{Kernel, KernelBase, MatrixKernel, SecondOrderKernel};
use crate::spec::MatrixKernelSpec;
use fspace_input::InputError;

/// `d'` independent outputs sharing one scalar kernel: `k(x, y) = k₀(x, y) · I_{d'}`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Independent<K> {
    kernel: K,
    outputs: usize,
}

impl<K: Kernel> Independent<K> {
    /// `outputs ≥ 1` independent copies of `kernel`.
    pub fn new(kernel: K, outputs: usize) -> Result<Self> {
        if outputs == 0 {
            return Err(KernelError::Input(InputError::DimensionMismatch {
                what: "number of outputs of an independent multi-output kernel",
                expected: 1,
                found: 0,
            }));
        }
        Ok(Self { kernel, outputs })
    }
    /// The shared scalar kernel.
    pub fn kernel(&self) -> &K {
        &self.kernel
    }
}

impl<K: Kernel> KernelBase for Independent<K> {
    fn input_dim(&self) -> Option<usize> {
        self.kernel.input_dim()
    }
    fn n_params(&self) -> usize {
        self.kernel.n_params()
    }
    fn params(&self) -> Vec<f64> {
        self.kernel.params()
    }
    fn param_names(&self) -> Vec<String> {
        self.kernel.param_names()
    }
    fn set_params(&mut self, p: &[f64]) -> Result<()> {
        self.kernel.set_params(p)
    }
    fn check_input_dim(&self, d: usize) -> Result<()> {
        self.kernel.check_input_dim(d)
    }
}

impl<K: Kernel> MatrixKernel for Independent<K> {
    fn output_dim(&self) -> usize {
        self.outputs
    }
    fn eval_block(&self, x: &[f64], y: &[f64], out: &mut [f64]) {
        let q = self.outputs;
        let k = self.kernel.eval(x, y);
        out[..q * q].iter_mut().enumerate().for_each(|(i, o)| *o = if i % (q + 1) == 0 { k } else { 0.0 });
    }
    fn eval_block_grad(&self, x: &[f64], y: &[f64], out: &mut [f64]) {
        let q = self.outputs;
        let np = self.kernel.n_params();
        let mut g = vec![0.0; np];
        self.kernel.eval_grad(x, y, &mut g);
        for (j, gj) in g.iter().enumerate() {
            let block = &mut out[j * q * q..(j + 1) * q * q];
            block.iter_mut().enumerate().for_each(|(i, o)| *o = if i % (q + 1) == 0 { *gj } else { 0.0 });
        }
    }
    fn matrix_spec(&self) -> Option<MatrixKernelSpec> {
        Some(MatrixKernelSpec::Independent { kernel: self.kernel.spec()?, outputs: self.outputs })
    }
    fn shared_output_kernel(&self) -> Option<&dyn MatrixKernel> {
        Some(&self.kernel)
    }
}

/// The Helmholtz kernel for 2-D vector fields `f = ∇Φ + rot Ψ` with independent
/// `Φ ~ GP(0, k_Φ)`, `Ψ ~ GP(0, k_Ψ)` and `rot Ψ = (∂Ψ/∂x₂, −∂Ψ/∂x₁)` (Berlinghieri et al.
/// 2023; FSP-Laplace App. B.2). With `Hᵢⱼ(x, y) = ∂²k/∂xᵢ∂yⱼ` and `R = [[0, 1], [−1, 0]]`:
///
/// `k_f(x, y) = H_Φ(x, y) + R H_Ψ(x, y) Rᵀ`,
///
/// the first term the covariance of the curl-free part, the second of the divergence-free part.
/// Hyperparameters: those of `k_Φ` (prefixed `phi.`) then of `k_Ψ` (`psi.`).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Helmholtz {
    phi: Box<dyn SecondOrderKernel>,
    psi: Box<dyn SecondOrderKernel>,
}

/// `R A Rᵀ` for a 2×2 row-major block with `R = [[0, 1], [−1, 0]]`.
fn rotate(a: &[f64], out: &mut [f64]) {
    out[0] = a[3];
    out[1] = -a[2];
    out[2] = -a[1];
    out[3] = a[0];
}

impl Helmholtz {
    /// Builds the kernel from the potentials' kernels (any twice-differentiable scalar kernels).
    pub fn new(phi: Box<dyn SecondOrderKernel>, psi: Box<dyn SecondOrderKernel>) -> Result<Self> {
        phi.check_input_dim(2)?;
        psi.check_input_dim(2)?;
        Ok(Self { phi, psi })
    }
    /// The kernel of the scalar potential Φ.
    pub fn phi(&self) -> &dyn SecondOrderKernel {
        self.phi.as_ref()
    }
    /// The kernel of the stream function Ψ.
    pub fn psi(&self) -> &dyn SecondOrderKernel {
        self.psi.as_ref()
    }
    /// Covariance block of the curl-free part `∇Φ` alone.
    pub fn curl_free_block(&self, x: &[f64], y: &[f64], out: &mut [f64]) {
        self.phi.cross_hessian(x, y, out);
    }
    /// Covariance block of the divergence-free part `rot Ψ` alone.
    pub fn divergence_free_block(&self, x: &[f64], y: &[f64], out: &mut [f64]) {
        let mut h = [0.0; 4];
        self.psi.cross_hessian(x, y, &mut h);
        rotate(&h, out);
    }
}

impl KernelBase for Helmholtz {
    fn input_dim(&self) -> Option<usize> {
        Some(2)
    }
    fn n_params(&self) -> usize {
        self.phi.n_params() + self.psi.n_params()
    }
    fn params(&self) -> Vec<f64> {
        let mut p = self.phi.params();
        p.extend(self.psi.params());
        p
    }
    fn param_names(&self) -> Vec<String> {
        let mut n: Vec<String> = self.phi.param_names().into_iter().map(|s| format!("phi.{s}")).collect();
        n.extend(self.psi.param_names().into_iter().map(|s| format!("psi.{s}")));
        n
    }
    fn set_params(&mut self, p: &[f64]) -> Result<()> {
        check_param_len(self.n_params(), p.len())?;
        let np = self.phi.n_params();
        let (mut phi, mut psi) = (self.phi.clone(), self.psi.clone());
        phi.set_params(&p[..np])?;
        psi.set_params(&p[np..])?;
        (self.phi, self.psi) = (phi, psi);
        Ok(())
    }
}

impl MatrixKernel for Helmholtz {
    fn output_dim(&self) -> usize {
        2
    }
    fn eval_block(&self, x: &[f64], y: &[f64], out: &mut [f64]) {
        let (mut a, mut b) = ([0.0; 4], [0.0; 4]);
        self.curl_free_block(x, y, &mut a);
        self.divergence_free_block(x, y, &mut b);
        for i in 0..4 {
            out[i] = a[i] + b[i];
        }
    }
    fn eval_block_grad(&self, x: &[f64], y: &[f64], out: &mut [f64]) {
        let (n_phi, n_psi) = (self.phi.n_params(), self.psi.n_params());
        self.phi.cross_hessian_grad(x, y, &mut out[..4 * n_phi]);
        let mut g = vec![0.0; 4 * n_psi];
        self.psi.cross_hessian_grad(x, y, &mut g);
        for j in 0..n_psi {
            rotate(&g[4 * j..4 * j + 4], &mut out[4 * (n_phi + j)..4 * (n_phi + j + 1)]);
        }
    }
    fn matrix_spec(&self) -> Option<MatrixKernelSpec> {
        Some(MatrixKernelSpec::Helmholtz { phi: self.phi.spec()?, psi: self.psi.spec()? })
    }
}
