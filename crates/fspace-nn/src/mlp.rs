//! Multi-layer perceptron with exact linearisation operators.
//!
//! Parameters are one flat vector, layer by layer: `W_l` (`out × in`, row-major) then `b_l`.
//! Layer `l` computes `z_l = a_{l−1} W_lᵀ + b_l`, `a_l = σ(z_l)` (the last layer is linear).

use dfdx::prelude::*;
use fspace_input::InputError;
#[cfg(feature = "taped-reference")]
use std::ops::AddAssign;

use nalgebra::{DMatrix, DVector};
use rand::rngs::StdRng;
use rand::SeedableRng;
use rand_distr::{Distribution, Normal};
use serde::{Deserialize, Serialize};

use crate::activation::{Activation, GELU_C};
use crate::error::{check_input_batch, check_param_slice, check_param_vector, size_mul_add, NnError, Result};
use crate::layers::{LayerInfo, LayerKind, LayerStatistics};

use crate::tape::{Dev, M, TM, V};

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
    /// The MNIST MLP of issue 15 and VaLLA Fig. 3: 784 inputs (`28 × 28` pixels), hidden
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
        check_param_slice("MLP parameter vector", &d.params, p)?;
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

    #[cfg(feature = "taped-reference")]
    /// The same as [`jvp`](Self::jvp) through dfdx tensor operations (the reference the tests
    /// compare the GEMM rule with).
    pub fn jvp_taped(&self, x: &DMatrix<f64>, u: &DVector<f64>) -> Result<DMatrix<f64>> {
        self.check_inputs(x)?;
        self.check_vector("tangent vector u", u)?;
        let (trace, _) = self.trace(x);
        let (w, _) = self.tensors(&self.params);
        let (uw, ub) = self.tensors(u.as_slice());
        let n = x.nrows();
        let mut tangent: Option<M> = None; // ȧ, the tangent of the layer input
        for l in 0..w.len() {
            // ż = ȧ Wᵀ + a Uᵀ + u_b
            let mut zd =
                trace.inputs[l].clone().matmul(uw[l].clone().permute::<_, Axes2<1, 0>>()) + bcast(&ub[l], n);
            if let Some(t) = tangent {
                zd = zd + t.matmul(w[l].clone().permute::<_, Axes2<1, 0>>());
            }
            if l + 1 == w.len() {
                return Ok(to_matrix(&zd));
            }
            let slope = self.act_map(&trace.pre[l], |v| self.config.activation.slope(v));
            tangent = Some(slope * zd); // ȧ = σ'(z) ⊙ ż
        }
        unreachable!("an MLP has at least one layer")
    }

    /// `J(X)ᵀ·V` (length `p`) for a function-space cotangent `V` (`n × d'`), reverse mode as
    /// batched GEMMs (`∂W_l = Δ_lᵀA_{l−1}`, `Δ_{l−1} = (Δ_lW_l) ⊙ σ'(Z_{l−1})`).
    pub fn vjp(&self, x: &DMatrix<f64>, v: &DMatrix<f64>) -> Result<DVector<f64>> {
        self.check_inputs(x)?;
        crate::mlp_batched::check_cotangent(v, x.nrows(), self.config.output_dim)?;
        let trace = self.batch_trace(x, true);
        let mut grad = vec![0.0; self.n_params()];
        self.batch_adjoint(x, &trace, crate::mlp_batched::row_major(v), &mut grad);
        Ok(DVector::from_vec(grad))
    }

    #[cfg(feature = "taped-reference")]
    /// `J(X)ᵀ·V` by dfdx's reverse mode on `Σ f(X) ⊙ V`: the independent reference the tests
    /// compare the GEMM rule of [`vjp`](Self::vjp) with.
    pub fn vjp_taped(&self, x: &DMatrix<f64>, v: &DMatrix<f64>) -> Result<DVector<f64>> {
        self.check_inputs(x)?;
        crate::mlp_batched::check_cotangent(v, x.nrows(), self.config.output_dim)?;
        let (w, b) = self.tensors(&self.params);
        let n = x.nrows();
        let input = to_tensor(&self.dev, x);
        let mut a: TM = input.clone().leaky_trace() * 0.0 + input; // tape on the left from the start
        for l in 0..w.len() {
            let z = a.matmul(w[l].clone().permute::<_, Axes2<1, 0>>()) + bcast(&b[l], n);
            a = if l + 1 == w.len() { z } else { self.config.activation.taped(z) };
        }
        let grads = (a * to_tensor(&self.dev, v)).sum().backward();
        let mut out = vec![0.0; self.n_params()];
        for (layer, (wl, bl)) in self.layers().iter().zip(w.iter().zip(&b)) {
            out[layer.w..layer.b].copy_from_slice(&grads.get(wl).as_vec());
            out[layer.b..layer.b + layer.fan_out].copy_from_slice(&grads.get(bl).as_vec());
        }
        Ok(DVector::from_vec(out))
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

    /// The GGN-vector product `Σᵢ J(xᵢ)ᵀ Hᵢ J(xᵢ) v` for per-point function-space Hessian blocks
    /// `Hᵢ` (`d' × d'`, e.g. from a likelihood), without forming `J`.
    pub fn ggn_vector(
        &self,
        x: &DMatrix<f64>,
        hessians: &[DMatrix<f64>],
        v: &DVector<f64>,
    ) -> Result<DVector<f64>> {
        crate::network::Network::ggn_vector_product(self, x, hessians, v)
    }

    /// `Σᵢ J(xᵢ)ᵀ Hᵢ J(xᵢ)`'s diagonal (length `p`), from the Jacobian rows.
    pub fn ggn_diagonal(&self, x: &DMatrix<f64>, hessians: &[DMatrix<f64>]) -> Result<DVector<f64>> {
        let q = self.config.output_dim;
        crate::network::check_hessians(hessians, x.nrows(), q)?;
        Ok(crate::network::ggn_diagonal_from_jacobian(&self.jacobian(x)?, hessians, q))
    }

    /// The inputs of the last layer, `a_{L−1}(X)` (`n × width`): the features of a last-layer
    /// (Bayesian linear regression) approximation.
    pub fn last_layer_features(&self, x: &DMatrix<f64>) -> Result<DMatrix<f64>> {
        self.check_inputs(x)?;
        let (trace, _) = self.trace(x);
        Ok(to_matrix(trace.inputs.last().expect("at least one layer")))
    }

    /// Per-layer statistics for KFAC: each layer's inputs `a_{l−1}` (`n × fan_in`) and the
    /// back-propagated output gradients `δ_l` (`n·k × fan_out`, rows point-major) for the
    /// columns of per-point factors `Lᵢ` (`d' × k`, with `Hᵢ = LᵢLᵢᵀ`).
    pub fn layer_statistics(
        &self,
        x: &DMatrix<f64>,
        hessian_factors: &[DMatrix<f64>],
    ) -> Result<Vec<(DMatrix<f64>, DMatrix<f64>)>> {
        self.check_inputs(x)?;
        let (n, q) = (x.nrows(), self.config.output_dim);
        if hessian_factors.len() != n || hessian_factors.iter().any(|l| l.nrows() != q) {
            return Err(NnError::Input(InputError::DimensionMismatch {
                what: "Hessian factors (one d' × k per point)",
                expected: n,
                found: hessian_factors.len(),
            }));
        }
        let k = hessian_factors[0].ncols();
        if hessian_factors.iter().any(|l| l.ncols() != k) {
            return Err(NnError::Input(InputError::DimensionMismatch {
                what: "Hessian factor columns",
                expected: k,
                found: 0,
            }));
        }
        let (trace, _) = self.trace(x);
        let (w, _) = self.tensors(&self.params);
        // δ_L for column c of Lᵢ, stacked point-major: row i·k + c.
        let rows: Vec<f64> = (0..n * k)
            .flat_map(|r| (0..q).map(move |a| (r, a)))
            .map(|(r, a)| hessian_factors[r / k][(a, r % k)])
            .collect();
        let mut delta: M = self.dev.tensor_from_vec(rows, (n * k, q));
        let mut out = vec![(DMatrix::zeros(0, 0), DMatrix::zeros(0, 0)); w.len()];
        for l in (0..w.len()).rev() {
            out[l] = (to_matrix(&trace.inputs[l]), to_matrix(&delta));
            if l > 0 {
                let slope = self.act_map(&trace.pre[l - 1], |v| self.config.activation.slope(v));
                // Copy the slopes out once; each point's row repeats for its k factor columns.
                let (width, slope) = (slope.shape().1, slope.as_vec());
                let slope_rows = DMatrix::from_fn(n * k, width, |r, c| slope[(r / k) * width + c]);
                let back = delta.matmul(w[l].clone());
                delta = back * to_tensor(&self.dev, &slope_rows);
            }
        }
        Ok(out)
    }

    /// The weight layers (`layer0`, `layer1`, …) as [`LayerInfo`]s.
    pub fn layer_infos(&self) -> Vec<LayerInfo> {
        self.layers()
            .iter()
            .enumerate()
            .map(|(l, layer)| LayerInfo {
                name: format!("layer{l}"),
                kind: LayerKind::Dense,
                weight: layer.w..layer.b,
                bias: layer.b..layer.b + layer.fan_out,
                fan_in: layer.fan_in,
                fan_out: layer.fan_out,
            })
            .collect()
    }

    /// [`layer_statistics`](Self::layer_statistics) as [`LayerStatistics`] (one position per
    /// layer), one per [`layer_infos`](Self::layer_infos) entry.
    pub fn kfac_statistics(
        &self,
        x: &DMatrix<f64>,
        factors: &[DMatrix<f64>],
    ) -> Result<Vec<LayerStatistics>> {
        self.check_inputs(x)?;
        let k = crate::network::check_factors(factors, x.nrows(), self.config.output_dim)?;
        Ok(self
            .layer_statistics(x, factors)?
            .into_iter()
            .map(|(inputs, output_grads)| LayerStatistics { positions: 1, columns: k, inputs, output_grads })
            .collect())
    }

    /// KFAC factors per layer (Martens & Grosse 2015): `A = Σᵢ ãᵢãᵢᵀ` (`(fan_in + 1)²`, with
    /// `ã = [a; 1]` for the bias) and `G = Σᵢ Σ_c δ_{i,c} δ_{i,c}ᵀ / n` (`fan_out²`), so that the
    /// GGN block of `[W | b]` (row-major `fan_out × (fan_in + 1)`) is approximated by `G ⊗ A`;
    /// exact for a single point.
    pub fn kfac_factors(
        &self,
        x: &DMatrix<f64>,
        hessian_factors: &[DMatrix<f64>],
    ) -> Result<Vec<(DMatrix<f64>, DMatrix<f64>)>> {
        let n = x.nrows() as f64;
        Ok(self
            .layer_statistics(x, hessian_factors)?
            .into_iter()
            .map(|(a, d)| {
                let at =
                    DMatrix::from_fn(
                        a.nrows(),
                        a.ncols() + 1,
                        |i, j| if j < a.ncols() { a[(i, j)] } else { 1.0 },
                    );
                // `transpose() *` is a blocked GEMM; nalgebra's `tr_mul` is an unblocked loop.
                (at.transpose() * &at, d.transpose() * &d / n)
            })
            .collect())
    }

    /// `Σᵢₒ weights[i, o] · ḟ(xᵢ)ₒ` and its gradients with respect to the weights and to the
    /// inputs `X`, where `ḟ` is
    /// the tangent of the output for an input tangent `x_dot` (`n × d`) and/or a parameter
    /// tangent `u`. The tangent rules are taped dfdx operations, so reverse mode differentiates
    /// *through* them (reverse-over-tangent). Supported for tanh, sigmoid, softplus and ReLU.
    pub(crate) fn taped_tangent(
        &self,
        x: &DMatrix<f64>,
        x_dot: Option<&DMatrix<f64>>,
        u: Option<&[f64]>,
        weights: &DMatrix<f64>,
    ) -> Result<(f64, Vec<f64>, DMatrix<f64>)> {
        let n = x.nrows();
        let (w, b) = self.tensors(&self.params);
        let param_tangent = u.map(|u| self.tensors(u));
        let act = self.config.activation;
        let taped = |m: &DMatrix<f64>| -> TM {
            let t = to_tensor(&self.dev, m);
            t.clone().leaky_trace() * 0.0 + t // tape on the left (trap 1)
        };
        let input = to_tensor(&self.dev, x);
        let mut a: TM = input.clone().leaky_trace() * 0.0 + input.clone();
        let mut ad: Option<TM> = x_dot.map(taped);
        for l in 0..w.len() {
            let wt = w[l].clone().permute::<_, Axes2<1, 0>>();
            let a_branch = a.with_empty_tape();
            let z: TM = a.matmul(wt.clone()) + bcast(&b[l], n);
            let lin: Option<TM> = param_tangent.as_ref().map(|(uw, ub)| {
                a_branch.matmul(uw[l].clone().permute::<_, Axes2<1, 0>>()) + bcast(&ub[l], n)
            });
            let zd: TM = match (ad, lin) {
                (Some(t), Some(lin)) => t.matmul(wt) + lin,
                (Some(t), None) => t.matmul(wt),
                (None, Some(lin)) => lin,
                (None, None) => {
                    return Err(NnError::Input(InputError::Empty {
                        what: "tangent (need an input or a parameter tangent)",
                    }))
                }
            };
            if l + 1 == w.len() {
                // Merge the primal tape into the scalar, or its gradients are lost (trap 2).
                let objective = (zd * to_tensor(&self.dev, weights)).sum() + z.sum() * 0.0;
                let value = objective.array();
                let grads = objective.backward();
                // Per layer W then b: the flat parameter layout.
                let g = w
                    .iter()
                    .zip(&b)
                    .flat_map(|(wl, bl)| {
                        let mut v = grads.get(wl).as_vec();
                        v.extend(grads.get(bl).as_vec());
                        v
                    })
                    .collect();
                let grad_x = to_matrix(&grads.get(&input));
                return Ok((value, g, grad_x));
            }
            let (h, slope): (TM, TM) = match act {
                Activation::Tanh => {
                    let h = z.tanh();
                    let s = h.with_empty_tape().square().negate() + 1.0;
                    (h, s)
                }
                Activation::Sigmoid => {
                    let h = z.sigmoid();
                    let hb = h.with_empty_tape();
                    let s = hb.with_empty_tape() * (hb.negate() + 1.0);
                    (h, s)
                }
                Activation::Softplus => {
                    let zb = z.with_empty_tape();
                    (act.taped(z), zb.sigmoid())
                }
                Activation::Relu => {
                    let mask = self.act_map(&z.retaped::<NoneTape>(), |v| (v > 0.0) as u8 as f64);
                    (z.relu(), mask.leaky_trace() * 1.0)
                }
                Activation::Gelu => {
                    // σ'(z) = ½(1 + t) + ½ z (1 − t²) c (1 + 3a z²), t = tanh(c(z + a z³)),
                    // taped so that its own derivative reaches z (each branch a tape copy).
                    let zb = z.with_empty_tape();
                    let h = act.taped(z);
                    let z2 = zb.with_empty_tape().square();
                    let u = (z2.with_empty_tape() * zb.with_empty_tape() * 0.044715 + zb.with_empty_tape())
                        * GELU_C;
                    let t = u.tanh();
                    let dinner = (z2 * (3.0 * 0.044715) + 1.0) * GELU_C;
                    let s =
                        (t.with_empty_tape() + 1.0) * 0.5 + zb * 0.5 * (t.square().negate() + 1.0) * dinner;
                    (h, s)
                }
            };
            ad = Some(slope * zd);
            a = h;
        }
        unreachable!("an MLP has at least one layer")
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

    #[cfg(feature = "taped-reference")]
    /// Pullback of `Φ(w, s) = ⟨C, J(X; w) diag(s) J(X; w)ᵀ⟩` for a symmetric cotangent `C`
    /// (`n·d' × n·d'`, point-major): returns `(∂Φ/∂w, ∂Φ/∂s)`. GFSVI's KL term depends on the
    /// weights through exactly this covariance. Uses `dΦ = 2 tr(dJ · U)` with `U = diag(s) Jᵀ C`
    /// held fixed, differentiated by reverse-over-tangent per point and output (`n·d'` passes on
    /// one point each, `O(n·d'·p)`).
    pub fn jsj_pullback(
        &self,
        x: &DMatrix<f64>,
        s: &DVector<f64>,
        c: &DMatrix<f64>,
    ) -> Result<(DVector<f64>, DVector<f64>)> {
        self.check_inputs(x)?;
        self.check_vector("diagonal s", s)?;
        let nq = x.nrows() * self.config.output_dim;
        if c.shape() != (nq, nq) {
            return Err(NnError::Input(InputError::DimensionMismatch {
                what: "cotangent of J S Jᵀ (n·d' square)",
                expected: nq,
                found: c.nrows(),
            }));
        }
        if c.iter().any(|v| !v.is_finite()) {
            return Err(NnError::Input(InputError::NonFinite { what: "cotangent of J S Jᵀ" }));
        }
        let jac = self.jacobian(x)?;
        let cj = c * &jac; // n·d' × p
        let grad_s = DVector::from_fn(self.n_params(), |k, _| jac.column(k).dot(&cj.column(k)));
        // U = diag(s) Jᵀ C: column j is the tangent for output row j.
        let mut u = cj.transpose();
        for (k, mut row) in u.row_iter_mut().enumerate() {
            row *= s[k];
        }
        let q = self.config.output_dim;
        let mut grad_w = DVector::zeros(self.n_params());
        for i in 0..x.nrows() {
            let xi = x.rows(i, 1).into_owned();
            for a in 0..q {
                let col = u.column(i * q + a).into_owned();
                let pick = DMatrix::from_fn(1, q, |_, o| (o == a) as u8 as f64);
                let (_, g, _) = self.taped_tangent(&xi, None, Some(col.as_slice()), &pick)?;
                grad_w += DVector::from_vec(g) * 2.0;
            }
        }
        Ok((grad_w, grad_s))
    }

    #[cfg(feature = "taped-reference")]
    /// Gradient with respect to the inducing inputs `Z` (`m × d`) of `⟨C, J(X) J(Z)ᵀ⟩` for a
    /// cotangent `C` (`n·d' × m·d'`) of an NTK block (VaLLA optimises `Z`). With `G = J(X)ᵀC`
    /// fixed, this is `∂/∂Z tr(J(Z) G)`: one taped parameter-tangent pass per inducing point and
    /// output, differentiated with respect to its input.
    pub fn ntk_pullback_z(
        &self,
        x: &DMatrix<f64>,
        z: &DMatrix<f64>,
        c: &DMatrix<f64>,
    ) -> Result<DMatrix<f64>> {
        self.check_inputs(z)?;
        let q = self.config.output_dim;
        if c.shape() != (x.nrows() * q, z.nrows() * q) {
            return Err(NnError::Input(InputError::DimensionMismatch {
                what: "NTK cotangent (n·d' × m·d')",
                expected: x.nrows() * z.nrows() * q * q,
                found: c.len(),
            }));
        }
        if c.iter().any(|v| !v.is_finite()) {
            return Err(NnError::Input(InputError::NonFinite { what: "NTK cotangent" }));
        }
        let g = self.jacobian(x)?.transpose() * c; // p × m·d'
        let mut grad = DMatrix::zeros(z.nrows(), z.ncols());
        for j in 0..z.nrows() {
            let zj = z.rows(j, 1).into_owned();
            for a in 0..q {
                let pick = DMatrix::from_fn(1, q, |_, o| (o == a) as u8 as f64);
                let col = g.column(j * q + a).into_owned();
                let (_, _, gx) = self.taped_tangent(&zj, None, Some(col.as_slice()), &pick)?;
                grad.row_mut(j).add_assign(&gx.row(0));
            }
        }
        Ok(grad)
    }
}

/// [`Network`](crate::Network) for [`Mlp`], forwarding to its inherent methods.
mod network {
    use super::Mlp;
    use crate::error::Result;
    use crate::jsj::WeightedGram;
    use crate::layers::LayerInfo;
    use crate::layers::LayerStatistics;
    use crate::network::network_impl;
    use crate::ntk::NtkPair;
    use crate::ntk::Outputs;
    use nalgebra::DMatrix;
    use nalgebra::DVector;

    network_impl!(Mlp {
        fn forward_vjp_many(
            nets: &[Mlp],
            x: &DMatrix<f64>,
            cotangents: &mut crate::network::JointCotangents<'_>,
        ) -> Result<crate::network::OutputsAndGradients> {
            <Mlp>::forward_vjp_many(nets, x, cotangents)
        }
        fn forward_vjp(
            &self,
            x: &DMatrix<f64>,
            cotangent: &mut dyn FnMut(&DMatrix<f64>) -> Result<DMatrix<f64>>,
        ) -> Result<(DMatrix<f64>, DVector<f64>)> {
            <Mlp>::forward_vjp(self, x, cotangent)
        }
        fn weighted_gram(&self, x: &DMatrix<f64>, outputs: Outputs, s: &DVector<f64>) -> Result<WeightedGram<'_>> {
            <Mlp>::weighted_gram(self, x, outputs, s)
        }
        fn layer_infos(&self) -> Vec<LayerInfo> { <Mlp>::layer_infos(self) }
        fn kfac_statistics(&self, x: &DMatrix<f64>, factors: &[DMatrix<f64>]) -> Result<Vec<LayerStatistics>> {
            <Mlp>::kfac_statistics(self, x, factors)
        }
        fn last_layer_features(&self, x: &DMatrix<f64>) -> Result<DMatrix<f64>> { <Mlp>::last_layer_features(self, x) }
        fn ntk_block(&self, x: &DMatrix<f64>, xo: Outputs, z: &DMatrix<f64>, zo: Outputs) -> Result<DMatrix<f64>> {
            <Mlp>::ntk_block(self, x, xo, z, zo)
        }
        fn ntk_diagonal(&self, x: &DMatrix<f64>) -> Result<Vec<DMatrix<f64>>> { <Mlp>::ntk_diagonal(self, x) }
        fn jvp_columns(&self, x: &DMatrix<f64>, u: &DMatrix<f64>) -> Result<DMatrix<f64>> { <Mlp>::jvp_columns(self, x, u) }
        fn vjp_columns(&self, x: &DMatrix<f64>, l: &DMatrix<f64>) -> Result<DMatrix<f64>> { <Mlp>::vjp_columns(self, x, l) }
        fn ntk_block_pullback_z(
            &self,
            x: &DMatrix<f64>,
            xo: Outputs,
            z: &DMatrix<f64>,
            zo: Outputs,
            c: &DMatrix<f64>,
        ) -> Result<DMatrix<f64>> {
            <Mlp>::ntk_block_pullback_z(self, x, xo, z, zo, c)
        }
        fn ntk_pair(&self, x: &DMatrix<f64>, xo: Outputs, z: &DMatrix<f64>, zo: Outputs) -> Result<(DMatrix<f64>, DMatrix<f64>)> {
            <Mlp>::ntk_pair(self, x, xo, z, zo)
        }
        fn ntk_pair_with_pullback<'a>(
            &'a self,
            x: &'a DMatrix<f64>,
            xo: Outputs<'a>,
            z: &'a DMatrix<f64>,
            zo: Outputs<'a>,
        ) -> Result<NtkPair<'a>> {
            <Mlp>::ntk_pair_with_pullback(self, x, xo, z, zo)
        }
        fn ntk_pair_pullback_z(
            &self,
            x: &DMatrix<f64>,
            xo: Outputs,
            z: &DMatrix<f64>,
            zo: Outputs,
            c_xz: &DMatrix<f64>,
            c_zz: &DMatrix<f64>,
        ) -> Result<DMatrix<f64>> {
            <Mlp>::ntk_pair_pullback_z(self, x, xo, z, zo, c_xz, c_zz)
        }
    });
}
