//! The layer structure that Kronecker-factored and block curvature approximations need.
//!
//! A weight layer (dense or convolutional) computes, at each of its `T` output positions `t`,
//! `z_t = W ã_t` with `W` the `fan_out × (fan_in + 1)` matrix `[W | b]` and `ã_t = [a_t; 1]`
//! (the layer input, or for a convolution the im2col patch at position `t`, with a 1 for the
//! bias). The gradient of an output cotangent with respect to `[W | b]` is therefore
//! `Σ_t δ_t ã_tᵀ`, where `δ_t = ∂(cotangent · f)/∂z_t`. [`LayerStatistics`] holds exactly those
//! `ã_t` and `δ_t` for a batch, so a caller can build KFAC / KFC factors (Martens & Grosse
//! 2015; Grosse & Martens 2016), EKFAC eigenvalue fits, per-example gradients and the
//! per-layer Jacobian blocks without knowing the network's internals.

use std::ops::Range;

use nalgebra::{DMatrix, DVector};
use serde::{Deserialize, Serialize};

/// What kind of weight layer a [`LayerInfo`] describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum LayerKind {
    /// A dense layer: one position.
    Dense,
    /// A convolution with `positions = H_out · W_out` output positions (before pooling);
    /// `fan_in = C_in · k · k` (patch order: channel, row, column).
    Conv {
        /// Output positions `T`.
        positions: usize,
    },
}

/// One weight layer in the flat parameter vector: `W` (`fan_out × fan_in`, row-major) at
/// `weight` and `b` (`fan_out`) at `bias` — an empty `bias` range for a layer without one (a
/// torch convolution before BatchNorm, say): its coordinates are then `W` alone and its input
/// side has no appended 1 ([`width`](Self::width) = `fan_in`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerInfo {
    /// Name (`layer0`, `conv1`, `dense0`, …).
    pub name: String,
    /// Kind (dense or convolution).
    pub kind: LayerKind,
    /// Range of `W` in the flat parameters.
    pub weight: Range<usize>,
    /// Range of `b` in the flat parameters (empty: no bias).
    pub bias: Range<usize>,
    /// Inputs per position (without the bias's 1).
    pub fan_in: usize,
    /// Outputs per position.
    pub fan_out: usize,
}

impl LayerInfo {
    /// Output positions `T` (1 for a dense layer).
    pub fn positions(&self) -> usize {
        match self.kind {
            LayerKind::Dense => 1,
            LayerKind::Conv { positions } => positions,
        }
    }

    /// Whether the layer has a bias.
    pub fn has_bias(&self) -> bool {
        !self.bias.is_empty()
    }

    /// Columns of the layer's coordinate matrix: `fan_in + 1` for `[W | b]`, `fan_in` for a
    /// layer without bias.
    pub fn width(&self) -> usize {
        self.fan_in + self.has_bias() as usize
    }

    /// Number of parameters `fan_out · width` (`fan_out · (fan_in + 1)` with a bias).
    pub fn n_params(&self) -> usize {
        self.fan_out * self.width()
    }

    /// Flat index of entry `(r, j)` of `[W | b]` (`j = fan_in` is the bias), `j < width`.
    pub fn flat_index(&self, r: usize, j: usize) -> usize {
        if j < self.fan_in {
            self.weight.start + r * self.fan_in + j
        } else {
            self.bias.start + r
        }
    }

    /// All flat indices of the layer in `[W | b]` row-major order (`r·width + j`): the order in
    /// which Kronecker factors `G ⊗ A` index the layer.
    pub fn kron_order(&self) -> Vec<usize> {
        let width = self.width();
        (0..self.fan_out).flat_map(|r| (0..width).map(move |j| self.flat_index(r, j))).collect()
    }
}

/// One layer's Kronecker-factor sums over a set of examples, what KFAC keeps of its
/// [`LayerStatistics`]: `Σ a aᵀ` and `Σ a` over the input rows `a` (`n·T` of them, im2col
/// patches for a convolution) and `Σ δ δᵀ` over the output-gradient rows `δ` (`n·k·T`).
/// [`Network::kfac_factor_sums`](crate::Network::kfac_factor_sums) returns them for networks
/// that can sum where their statistics live (a torch model sums on its own device).
#[derive(Debug, Clone, PartialEq)]
pub struct KfacFactorSums {
    /// `Σ a aᵀ` (`fan_in × fan_in`).
    pub input_gram: DMatrix<f64>,
    /// `Σ a` (`fan_in`).
    pub input_sum: DVector<f64>,
    /// How many input rows were summed (`n·T`).
    pub input_rows: usize,
    /// `Σ δ δᵀ` (`fan_out × fan_out`).
    pub grad_gram: DMatrix<f64>,
}

impl KfacFactorSums {
    /// Zero sums for a layer.
    pub fn zeros(info: &LayerInfo) -> Self {
        KfacFactorSums {
            input_gram: DMatrix::zeros(info.fan_in, info.fan_in),
            input_sum: DVector::zeros(info.fan_in),
            input_rows: 0,
            grad_gram: DMatrix::zeros(info.fan_out, info.fan_out),
        }
    }

    /// Adds another set of examples' sums.
    pub fn add(&mut self, other: &KfacFactorSums) {
        self.input_gram += &other.input_gram;
        self.input_sum += &other.input_sum;
        self.input_rows += other.input_rows;
        self.grad_gram += &other.grad_gram;
    }

    /// Whether the shapes are the layer's (`fan_in`, `fan_out`).
    pub fn fits(&self, info: &LayerInfo) -> bool {
        self.input_gram.shape() == (info.fan_in, info.fan_in)
            && self.input_sum.len() == info.fan_in
            && self.grad_gram.shape() == (info.fan_out, info.fan_out)
    }
}

/// Per-example statistics of one weight layer for a batch of `n` examples and `k` cotangent
/// columns per example (the columns of per-point factors `Lᵢ` with `Hᵢ = LᵢLᵢᵀ`, or unit
/// vectors for Jacobian rows).
#[derive(Debug, Clone, PartialEq)]
pub struct LayerStatistics {
    /// Output positions `T`.
    pub positions: usize,
    /// Cotangent columns per example `k`.
    pub columns: usize,
    /// Layer inputs (im2col patches for convolutions), `(n·T) × fan_in`, row `i·T + t`.
    pub inputs: DMatrix<f64>,
    /// Back-propagated pre-activation gradients, `(n·k·T) × fan_out`, row `(i·k + c)·T + t`.
    pub output_grads: DMatrix<f64>,
}

impl LayerStatistics {
    /// Examples `n` in the batch.
    pub fn examples(&self) -> usize {
        self.inputs.nrows() / self.positions.max(1)
    }

    /// The coordinates' input side: with a `bias`, the inputs with a column of ones appended,
    /// `ã = [a; 1]` per row (`(n·T) × (fan_in + 1)`); without, the inputs `a`.
    pub fn augmented_inputs(&self, bias: bool) -> DMatrix<f64> {
        let fan_in = self.inputs.ncols();
        if !bias {
            return self.inputs.clone();
        }
        DMatrix::from_fn(
            self.inputs.nrows(),
            fan_in + 1,
            |i, j| if j < fan_in { self.inputs[(i, j)] } else { 1.0 },
        )
    }

    /// The gradient of column `c` of example `i` with respect to `[W | b]` (`W` without a
    /// `bias`): `Σ_t δ_{i,c,t} ã_{i,t}ᵀ` (`fan_out × (fan_in + 1)`, or `fan_out × fan_in`).
    pub fn example_gradient(&self, i: usize, c: usize, bias: bool) -> DMatrix<f64> {
        let (t, fan_in, fan_out) = (self.positions, self.inputs.ncols(), self.output_grads.ncols());
        let a = self.inputs.rows(i * t, t);
        let d = self.output_grads.rows((i * self.columns + c) * t, t);
        let mut g = DMatrix::zeros(fan_out, fan_in + bias as usize);
        g.columns_mut(0, fan_in).copy_from(&(d.transpose() * a)); // Dᵀ A (transpose first: nalgebra's gemm_tr is not blocked)
        if bias {
            for r in 0..fan_out {
                g[(r, fan_in)] = d.column(r).sum();
            }
        }
        g
    }
}
