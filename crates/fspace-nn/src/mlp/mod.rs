//! Multi-layer perceptron with exact linearisation operators.
//!
//! Parameters are one flat vector, layer by layer: `W_l` (`out × in`, row-major) then `b_l`.
//! Layer `l` computes `z_l = a_{l−1} W_lᵀ + b_l`, `a_l = σ(z_l)` (the last layer is linear).
//!
//! This module holds the type, its configuration and checks, and the first-order products;
//! the children hold the rest: `batched` (the GEMM rules of `f`, `J·u`, `Jᵀ·V` and the fused
//! training pass), `curvature` (GGN products, layer statistics, KFAC factors, last-layer
//! features), `jsj` (`J S Jᵀ`'s tangent-network pull-back), `ntk` (NTK blocks and their
//! input gradients), `network` (the `Network` implementation) and `taped` (dfdx's taped passes: reverse mode
//! through taped tangents, and the tests' references).

use dfdx::prelude::*;
use fspace_input::InputError;

use nalgebra::{DMatrix, DVector};
use rand::rngs::StdRng;
use rand::SeedableRng;
use rand_distr::{Distribution, Normal};
use serde::{Deserialize, Serialize};

use crate::activation::{Activation, GELU_C};
use crate::error::{check_input_batch, check_param_vector, size_mul_add, NnError, Result};

use crate::tape::{Dev, M, V};

mod batched;
mod curvature;
mod jsj;
mod network;
mod ntk;
mod taped;

/// Architecture and initialisation of an [`Mlp`].
///
/// | name | purpose |
/// |---|---|
/// | `input_dim`, `output_dim` | `d`, `d'` (≥ 1) |
/// | `hidden` | hidden widths, e.g. `[50, 50]` for the papers' 2×50 nets |
/// | `activation` | hidden activation |
/// | `seed` | LeCun-normal weights `N(0, 1/fan_in)`, zero biases |
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MlpConfig {
    /// Input dimension `d`.
    pub input_dim: usize,
    /// Hidden widths.
    pub hidden: Vec<usize>,
    /// Output dimension `d'`.
    pub output_dim: usize,
    /// Hidden activation.
    pub activation: Activation,
    /// Initialisation seed.
    pub seed: u64,
}

impl MlpConfig {
    /// The MNIST MLP of the network-speed table and VaLLA Fig. 3: 784 inputs (`28 × 28` pixels), hidden
    /// 200, 200, `outputs`.
    pub fn mnist(outputs: usize, activation: Activation, seed: u64) -> Self {
        Self { input_dim: 784, hidden: vec![200, 200], output_dim: outputs, activation, seed }
    }
}

/// A multi-layer perceptron with flat parameters (serde: config + parameters; deserialising
/// checks the widths, the parameter count and that every weight is finite).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(try_from = "MlpData")]
pub struct Mlp {
    config: MlpConfig,
    params: Vec<f64>,
    #[serde(skip)]
    dev: Dev,
}

/// The serialised form of an [`Mlp`].
#[derive(Deserialize)]
struct MlpData {
    config: MlpConfig,
    params: Vec<f64>,
}

impl TryFrom<MlpData> for Mlp {
    type Error = NnError;
    fn try_from(d: MlpData) -> Result<Self> {
        check_widths(&d.config)?;
        let p = param_count(&d.config)?;
        crate::error::check_loaded_params("MLP parameter vector", &d.params, p)?;
        Ok(Self { config: d.config, params: d.params, dev: Default::default() })
    }
}

fn check_widths(config: &MlpConfig) -> Result<()> {
    if config.input_dim == 0 || config.output_dim == 0 || config.hidden.contains(&0) {
        return Err(NnError::Input(InputError::Empty { what: "layer widths (all must be ≥ 1)" }));
    }
    Ok(())
}

/// `Σ_l (w_l + 1) w_{l+1}`, or an error when a width is so large that it overflows.
fn param_count(config: &MlpConfig) -> Result<usize> {
    let mut widths = vec![config.input_dim];
    widths.extend(&config.hidden);
    widths.push(config.output_dim);
    widths
        .windows(2)
        .try_fold(0usize, |total, w| size_mul_add("MLP widths", w[0].saturating_add(1), w[1], total))
}

/// Offsets of one layer in the flat parameter vector.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Layer {
    pub(crate) w: usize,
    pub(crate) b: usize,
    pub(crate) fan_in: usize,
    pub(crate) fan_out: usize,
}

/// Intermediate values of a forward pass: layer inputs `a_{l−1}` and pre-activations `z_l`.
struct ForwardTrace {
    inputs: Vec<M>,
    pre: Vec<M>,
}

fn to_tensor(dev: &Dev, x: &DMatrix<f64>) -> M {
    let (n, d) = x.shape();
    let rows: Vec<f64> = (0..n).flat_map(|i| x.row(i).iter().cloned().collect::<Vec<_>>()).collect();
    dev.tensor_from_vec(rows, (n, d))
}

fn to_matrix(t: &M) -> DMatrix<f64> {
    let (n, c) = *t.shape();
    DMatrix::from_row_slice(n, c, &t.as_vec())
}

fn bcast(b: &V, n: usize) -> M {
    let o = b.shape().0;
    b.clone().broadcast_like::<_, Axis<0>>(&(n, o))
}

impl Mlp {
    /// Builds and initialises the network; errors on zero dimensions.
    pub fn new(config: MlpConfig) -> Result<Self> {
        check_widths(&config)?;
        param_count(&config)?;
        let mut net = Self { params: Vec::new(), config, dev: Default::default() };
        let mut rng = StdRng::seed_from_u64(net.config.seed);
        let mut params = vec![0.0; net.n_params()];
        for layer in net.layers() {
            let normal = Normal::new(0.0, (1.0 / layer.fan_in as f64).sqrt()).expect("positive std");
            for p in &mut params[layer.w..layer.w + layer.fan_in * layer.fan_out] {
                *p = normal.sample(&mut rng);
            }
        }
        net.params = params;
        Ok(net)
    }

    /// The configuration.
    pub fn config(&self) -> &MlpConfig {
        &self.config
    }

    /// Input dimension `d`.
    pub fn input_dim(&self) -> usize {
        self.config.input_dim
    }

    /// Output dimension `d'`.
    pub fn output_dim(&self) -> usize {
        self.config.output_dim
    }

    fn widths(&self) -> Vec<usize> {
        let mut w = vec![self.config.input_dim];
        w.extend(&self.config.hidden);
        w.push(self.config.output_dim);
        w
    }

    pub(crate) fn layers(&self) -> Vec<Layer> {
        let w = self.widths();
        let mut offset = 0;
        (0..w.len() - 1)
            .map(|l| {
                let layer = Layer { w: offset, b: offset + w[l] * w[l + 1], fan_in: w[l], fan_out: w[l + 1] };
                offset = layer.b + w[l + 1];
                layer
            })
            .collect()
    }

    /// Number of parameters `p`.
    pub fn n_params(&self) -> usize {
        let w = self.widths();
        (0..w.len() - 1).map(|l| (w[l] + 1) * w[l + 1]).sum()
    }

    /// Names and ranges of the per-layer blocks (`layer{l}.weight`, `layer{l}.bias`).
    pub fn param_blocks(&self) -> Vec<(String, std::ops::Range<usize>)> {
        self.layers()
            .iter()
            .enumerate()
            .flat_map(|(l, layer)| {
                [
                    (format!("layer{l}.weight"), layer.w..layer.b),
                    (format!("layer{l}.bias"), layer.b..layer.b + layer.fan_out),
                ]
            })
            .collect()
    }

    /// The flat parameters as a slice.
    pub(crate) fn flat(&self) -> &[f64] {
        &self.params
    }

    /// The flat parameter vector.
    pub fn params(&self) -> DVector<f64> {
        DVector::from_column_slice(&self.params)
    }

    /// Replaces the parameters (length `p`, finite).
    pub fn set_params(&mut self, params: &DVector<f64>) -> Result<()> {
        self.check_vector("parameter vector", params)?;
        self.params.copy_from_slice(params.as_slice());
        Ok(())
    }

    /// Each layer's `(W_l, b_l)` as nalgebra values (`W_l` is `fan_out × fan_in`).
    pub(crate) fn dense_weights(&self) -> Vec<(DMatrix<f64>, DVector<f64>)> {
        self.layers()
            .iter()
            .map(|l| {
                (
                    DMatrix::from_row_slice(l.fan_out, l.fan_in, &self.params[l.w..l.b]),
                    DVector::from_column_slice(&self.params[l.b..l.b + l.fan_out]),
                )
            })
            .collect()
    }

    fn check_vector(&self, what: &'static str, v: &DVector<f64>) -> Result<()> {
        check_param_vector(what, v, self.n_params())
    }

    pub(crate) fn check_inputs(&self, x: &DMatrix<f64>) -> Result<()> {
        check_input_batch(x, self.config.input_dim, "input columns")
    }

    fn tensors(&self, flat: &[f64]) -> (Vec<M>, Vec<V>) {
        self.layers()
            .iter()
            .map(|l| {
                let w = self.dev.tensor_from_vec(flat[l.w..l.b].to_vec(), (l.fan_out, l.fan_in));
                let b = self.dev.tensor_from_vec(flat[l.b..l.b + l.fan_out].to_vec(), (l.fan_out,));
                (w, b)
            })
            .unzip()
    }

    fn act_map(&self, z: &M, f: impl Fn(f64) -> f64) -> M {
        let v: Vec<f64> = z.as_vec().into_iter().map(f).collect();
        self.dev.tensor_from_vec(v, *z.shape())
    }

    fn trace(&self, x: &DMatrix<f64>) -> (ForwardTrace, M) {
        let (w, b) = self.tensors(&self.params);
        let n = x.nrows();
        let mut a = to_tensor(&self.dev, x);
        let mut trace = ForwardTrace { inputs: Vec::new(), pre: Vec::new() };
        for l in 0..w.len() {
            let z = a.clone().matmul(w[l].clone().permute::<_, Axes2<1, 0>>()) + bcast(&b[l], n);
            trace.inputs.push(a);
            trace.pre.push(z.clone());
            a = if l + 1 == w.len() { z } else { self.act_map(&z, |v| self.config.activation.value(v)) };
        }
        (trace, a)
    }

    /// `f(X)` (`n × d'`).
    pub fn forward(&self, x: &DMatrix<f64>) -> Result<DMatrix<f64>> {
        self.check_inputs(x)?;
        let trace = self.batch_trace(x, false);
        Ok(DMatrix::from_row_slice(x.nrows(), self.output_dim(), trace.output()))
    }

    /// `J(X)·u` (`n × d'`) for a parameter-space direction `u` (forward mode, batched GEMMs:
    /// `Ż = ȦWᵀ + AUᵀ + 1u_bᵀ`, `Ȧ = σ'(Z) ⊙ Ż`).
    pub fn jvp(&self, x: &DMatrix<f64>, u: &DVector<f64>) -> Result<DMatrix<f64>> {
        self.check_inputs(x)?;
        self.check_vector("tangent vector u", u)?;
        let trace = self.batch_trace(x, true);
        let out = self.batch_tangent(x, &trace, u.as_slice());
        Ok(DMatrix::from_row_slice(x.nrows(), self.output_dim(), &out))
    }

    /// `J(X)ᵀ·V` (length `p`) for a function-space cotangent `V` (`n × d'`), reverse mode as
    /// batched GEMMs (`∂W_l = Δ_lᵀA_{l−1}`, `Δ_{l−1} = (Δ_lW_l) ⊙ σ'(Z_{l−1})`).
    pub fn vjp(&self, x: &DMatrix<f64>, v: &DMatrix<f64>) -> Result<DVector<f64>> {
        self.check_inputs(x)?;
        crate::batch::check_cotangent(v, x.nrows(), self.config.output_dim)?;
        let trace = self.batch_trace(x, true);
        let mut grad = vec![0.0; self.n_params()];
        self.batch_adjoint(x, &trace, crate::batch::row_major(v), &mut grad);
        Ok(DVector::from_vec(grad))
    }

    /// The Jacobian `J(X)` (`n·d' × p`, rows point-major: point `i`, output `o` is row
    /// `i·d' + o`): the per-layer statistics for unit factors `Lᵢ = I_{d'}` give, for every
    /// point and output, the layer inputs `a` and output gradients `δ`, and the row's blocks are
    /// `δ aᵀ` (weights) and `δ` (biases).
    pub fn jacobian(&self, x: &DMatrix<f64>) -> Result<DMatrix<f64>> {
        let (n, q) = (x.nrows(), self.config.output_dim);
        let stats = self.layer_statistics(x, &vec![DMatrix::identity(q, q); n])?;
        let mut jac = DMatrix::zeros(n * q, self.n_params());
        for (layer, (a, delta)) in self.layers().iter().zip(&stats) {
            // Row i·q + o of `delta` is output o's gradient for point i: the Jacobian's row order.
            for row in 0..n * q {
                let i = row / q;
                for r in 0..layer.fan_out {
                    let dr = delta[(row, r)];
                    jac[(row, layer.b + r)] = dr;
                    for c in 0..layer.fan_in {
                        jac[(row, layer.w + r * layer.fan_in + c)] = dr * a[(i, c)];
                    }
                }
            }
        }
        Ok(jac)
    }

    /// The empirical NTK block `J(X) J(Z)ᵀ` (`n·d' × m·d'`), layer by layer without forming
    /// `J` (VaLLA App. F.3): a weight's derivative is `δ_l aᵀ_{l−1}` and a bias's `δ_l`, so
    ///
    /// `κ((x, o), (z, o')) = Σ_l ⟨δ_l(x, o), δ_l(z, o')⟩ · (⟨a_{l−1}(x), a_{l−1}(z)⟩ + 1)`.
    ///
    /// Cost `O(n·m·d'²·Σ_l widths)`, memory `O((n + m)·d'·width)` — independent of `p`.
    pub fn ntk(&self, x: &DMatrix<f64>, z: &DMatrix<f64>) -> Result<DMatrix<f64>> {
        self.ntk_block(x, crate::Outputs::All, z, crate::Outputs::All)
    }

    /// The Jacobian rows of `x` in chunks of `chunk` points: calls `visit(first_point, J)` with
    /// the `chunk·d' × p` block of each chunk (point-major rows), so a caller streams over a
    /// large set holding one block at a time. Errors from `visit` stop the stream.
    pub fn jacobian_rows(
        &self,
        x: &DMatrix<f64>,
        chunk: usize,
        mut visit: impl FnMut(usize, DMatrix<f64>) -> Result<()>,
    ) -> Result<()> {
        self.check_inputs(x)?;
        if chunk == 0 {
            return Err(NnError::Input(InputError::Empty { what: "Jacobian chunk size" }));
        }
        for start in (0..x.nrows()).step_by(chunk) {
            let len = chunk.min(x.nrows() - start);
            visit(start, self.jacobian(&x.rows(start, len).into_owned())?)?;
        }
        Ok(())
    }

    /// `∂f/∂x · ẋ` per point (`n × d'`) for input tangents `x_dot` (`n × d`), at fixed weights.
    pub fn input_jvp(&self, x: &DMatrix<f64>, x_dot: &DMatrix<f64>) -> Result<DMatrix<f64>> {
        self.check_inputs(x)?;
        if x_dot.shape() != x.shape() || x_dot.iter().any(|v| !v.is_finite()) {
            return Err(NnError::Input(InputError::DimensionMismatch {
                what: "input tangent (same shape as X, finite)",
                expected: x.len(),
                found: x_dot.len(),
            }));
        }
        let (trace, _) = self.trace(x);
        let (w, _) = self.tensors(&self.params);
        let mut tangent = to_tensor(&self.dev, x_dot);
        for l in 0..w.len() {
            let zd = tangent.matmul(w[l].clone().permute::<_, Axes2<1, 0>>());
            if l + 1 == w.len() {
                return Ok(to_matrix(&zd));
            }
            tangent = self.act_map(&trace.pre[l], |v| self.config.activation.slope(v)) * zd;
        }
        unreachable!("an MLP has at least one layer")
    }
}
