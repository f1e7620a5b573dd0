//! Convolutional networks (conv → activation → optional 2×2 max-pool blocks, then dense
//! layers): enough for LeNet-5 and FSP-Laplace's MNIST net (App. B.2: 3×3 convolutions with
//! 16, 32, 64 channels interleaved with max-pooling, then dense 128 and 10).
//!
//! dfdx 0.13 compiles `conv2d` / `pool2d` only with its `nightly` feature, which the stable
//! toolchain here and in CI cannot build. The CNN is therefore written with explicit rules,
//! per image and in parallel over images (rayon), for all three passes:
//!
//! * forward: `z = W ⋆ a + b` (cross-correlation, stride 1, valid or same zero padding),
//!   `a' = σ(z)`, max-pool keeps the arg-max of each window;
//! * forward mode `J·u`: `ż = W ⋆ ȧ + U ⋆ a + u_b` (the conv is bilinear), `ȧ' = σ'(z) ż`,
//!   pooling routes the tangent through the primal arg-max;
//! * reverse mode `Jᵀ·V`: `∂W = δ ⋆ a`, `∂b = Σ δ`, `∂a = Wᵀ ⋆ δ` (transposed correlation),
//!   pooling scatters `δ` to the arg-max.
//!
//! Every pass is checked against central finite differences and the adjoint identity in the
//! tests. Ties inside a pooling window resolve to the first maximum (the function is not
//! differentiable there; FD tests use inputs without ties).

use fspace_input::InputError;
use nalgebra::{DMatrix, DVector};
use rand::rngs::StdRng;
use rand::SeedableRng;
use rand_distr::{Distribution, Normal};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::activation::Activation;
use crate::error::{check_input_batch, check_param_vector, size_mul_add, size_product, NnError, Result};
use crate::layers::{LayerInfo, LayerKind, LayerStatistics};

mod batched;
mod network;
mod per_image;

/// One convolutional block: `channels` filters of size `kernel × kernel`, the activation, and
/// an optional 2×2 max-pool (stride 2, floor).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConvBlock {
    /// Output channels.
    pub channels: usize,
    /// Kernel size `k` (odd for same padding).
    pub kernel: usize,
    /// Zero-pad by `k/2` so the spatial size is kept.
    pub same_padding: bool,
    /// Follow with a 2×2 max-pool.
    pub pool: bool,
}

/// Architecture and initialisation of a [`Cnn`]. Inputs are rows of `C·H·W` values,
/// channel-major (`c·H·W + y·W + x`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CnnConfig {
    /// `(channels, height, width)` of an input image.
    pub input_shape: (usize, usize, usize),
    /// Convolutional blocks.
    pub convs: Vec<ConvBlock>,
    /// Hidden dense widths after flattening.
    pub hidden: Vec<usize>,
    /// Outputs `d'`.
    pub output_dim: usize,
    /// Activation after every conv and hidden dense layer.
    pub activation: Activation,
    /// LeCun-normal initialisation seed (zero biases).
    pub seed: u64,
}

impl CnnConfig {
    /// LeNet-5 (LeCun et al. 1998) for `1 × 28 × 28` inputs: conv 6@5×5 (same) + pool,
    /// conv 16@5×5 + pool, dense 120, 84, `outputs`.
    pub fn lenet5(outputs: usize, activation: Activation, seed: u64) -> Self {
        let block = |channels, same_padding| ConvBlock { channels, kernel: 5, same_padding, pool: true };
        Self {
            input_shape: (1, 28, 28),
            convs: vec![block(6, true), block(16, false)],
            hidden: vec![120, 84],
            output_dim: outputs,
            activation,
            seed,
        }
    }

    /// FSP-Laplace's MNIST network (App. B.2): 3×3 convolutions with 16, 32 and 64 channels
    /// (same padding), max-pooling after the first two, dense 128, `outputs`.
    pub fn fsp_mnist(outputs: usize, activation: Activation, seed: u64) -> Self {
        let block = |channels, pool| ConvBlock { channels, kernel: 3, same_padding: true, pool };
        Self {
            input_shape: (1, 28, 28),
            convs: vec![block(16, true), block(32, true), block(64, false)],
            hidden: vec![128],
            output_dim: outputs,
            activation,
            seed,
        }
    }
}

/// Offsets and shapes of one layer.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Layer {
    Conv {
        w: usize,
        b: usize,
        cin: usize,
        cout: usize,
        k: usize,
        pad: usize,
        h: usize,
        wd: usize,
        pool: bool,
    },
    Dense {
        w: usize,
        b: usize,
        fan_in: usize,
        fan_out: usize,
        last: bool,
    },
}

impl Layer {
    /// Output spatial size of a conv layer before pooling.
    pub(crate) fn conv_out(h: usize, k: usize, pad: usize) -> usize {
        h + 2 * pad + 1 - k
    }
}

/// A convolutional network with flat parameters (serde: config + parameters; deserialising
/// rebuilds and checks the layer table).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(try_from = "CnnData")]
pub struct Cnn {
    pub(crate) config: CnnConfig,
    pub(crate) params: Vec<f64>,
    #[serde(skip)]
    pub(crate) layers: Vec<Layer>,
}

/// The serialised form of a [`Cnn`].
#[derive(Deserialize)]
struct CnnData {
    config: CnnConfig,
    params: Vec<f64>,
}

impl TryFrom<CnnData> for Cnn {
    type Error = NnError;
    fn try_from(d: CnnData) -> Result<Self> {
        Cnn { config: d.config, params: d.params, layers: Vec::new() }.validated()
    }
}

/// What one image's forward pass keeps for the tangent and adjoint passes.
pub(crate) struct Trace {
    /// Input of each layer (feature map or vector, flattened).
    inputs: Vec<Vec<f64>>,
    /// Pre-activation of each layer.
    pre: Vec<Vec<f64>>,
    /// For pooled conv layers: arg-max index (into the activated map) per pooled output.
    argmax: Vec<Vec<usize>>,
    pub(crate) output: Vec<f64>,
}

fn build_layers(config: &CnnConfig) -> Result<Vec<Layer>> {
    let (mut c, mut h, mut wd) = config.input_shape;
    if c == 0 || h == 0 || wd == 0 || config.output_dim == 0 || config.hidden.contains(&0) {
        return Err(NnError::Input(InputError::Empty { what: "CNN shapes (all sizes must be ≥ 1)" }));
    }
    let mut layers = Vec::new();
    let mut offset = 0usize;
    // Sizes come from a configuration that may have been read from a file: every product and
    // sum is checked, so an absurd width is an error, never an overflow.
    size_product("CNN input shape", &[c, h, wd])?;
    for block in &config.convs {
        let k = block.kernel;
        if block.channels == 0 || k == 0 || (block.same_padding && k % 2 == 0) {
            return Err(NnError::Likelihood(format!(
                "invalid conv block {block:?} (same padding needs an odd kernel)"
            )));
        }
        let pad = if block.same_padding { k / 2 } else { 0 };
        let (hp, wp) =
            (size_mul_add("CNN padded map", 2, pad, h)?, size_mul_add("CNN padded map", 2, pad, wd)?);
        if hp < k || wp < k {
            return Err(NnError::Likelihood(format!("a {k}×{k} kernel does not fit a {h}×{wd} map")));
        }
        let (ho, wo) = (Layer::conv_out(h, k, pad), Layer::conv_out(wd, k, pad));
        if block.pool && (ho < 2 || wo < 2) {
            return Err(NnError::Likelihood(format!("cannot 2×2-pool a {ho}×{wo} map")));
        }
        let nw = size_product("CNN conv weights", &[block.channels, c, k, k])?;
        let b = size_mul_add("CNN parameter count", 1, offset, nw)?;
        // The layer's output map must be addressable too.
        size_product("CNN feature map", &[block.channels, ho, wo])?;
        layers.push(Layer::Conv {
            w: offset,
            b,
            cin: c,
            cout: block.channels,
            k,
            pad,
            h,
            wd,
            pool: block.pool,
        });
        offset = size_mul_add("CNN parameter count", 1, b, block.channels)?;
        c = block.channels;
        (h, wd) = if block.pool { (ho / 2, wo / 2) } else { (ho, wo) };
    }
    let mut fan_in = size_product("CNN flattened features", &[c, h, wd])?;
    let widths: Vec<usize> =
        config.hidden.iter().cloned().chain(std::iter::once(config.output_dim)).collect();
    for (i, &fan_out) in widths.iter().enumerate() {
        let b = size_mul_add("CNN parameter count", fan_in, fan_out, offset)?;
        layers.push(Layer::Dense { w: offset, b, fan_in, fan_out, last: i + 1 == widths.len() });
        offset = size_mul_add("CNN parameter count", 1, b, fan_out)?;
        fan_in = fan_out;
    }
    Ok(layers)
}

fn n_params_of(layers: &[Layer]) -> usize {
    match layers.last() {
        Some(Layer::Dense { b, fan_out, .. }) => b + fan_out,
        _ => 0,
    }
}

impl Cnn {
    /// Builds and initialises the network; errors on zero sizes, an even kernel with same
    /// padding, or a kernel / pool that does not fit its map.
    pub fn new(config: CnnConfig) -> Result<Self> {
        let layers = build_layers(&config)?;
        let mut params = vec![0.0; n_params_of(&layers)];
        let mut rng = StdRng::seed_from_u64(config.seed);
        for layer in &layers {
            let (start, len, fan_in) = match *layer {
                Layer::Conv { w, cin, cout, k, .. } => (w, cout * cin * k * k, cin * k * k),
                Layer::Dense { w, fan_in, fan_out, .. } => (w, fan_in * fan_out, fan_in),
            };
            let normal = Normal::new(0.0, (1.0 / fan_in as f64).sqrt()).expect("positive std");
            for p in &mut params[start..start + len] {
                *p = normal.sample(&mut rng);
            }
        }
        Ok(Self { config, params, layers })
    }

    /// Rebuilds the layer table after deserialisation (serde skips it); checks the length and
    /// that every weight is finite and within [`MAX_LOADED_WEIGHT`](crate::error::MAX_LOADED_WEIGHT).
    pub fn validated(mut self) -> Result<Self> {
        self.layers = build_layers(&self.config)?;
        crate::error::check_loaded_params("CNN parameter vector", &self.params, n_params_of(&self.layers))?;
        Ok(self)
    }

    /// The configuration.
    pub fn config(&self) -> &CnnConfig {
        &self.config
    }
    /// Input dimension `C·H·W`.
    pub fn input_dim(&self) -> usize {
        let (c, h, w) = self.config.input_shape;
        c * h * w
    }
    /// Output dimension `d'`.
    pub fn output_dim(&self) -> usize {
        self.config.output_dim
    }
    /// Number of parameters.
    pub fn n_params(&self) -> usize {
        self.params.len()
    }
    /// The flat parameter vector.
    pub fn params(&self) -> DVector<f64> {
        DVector::from_column_slice(&self.params)
    }
    /// Names and ranges of the parameter blocks (`conv0.weight`, `dense1.bias`, …).
    pub fn param_blocks(&self) -> Vec<(String, std::ops::Range<usize>)> {
        let (mut conv, mut dense) = (0, 0);
        let mut out = Vec::new();
        for layer in &self.layers {
            let (kind, idx, w, b, nb) = match *layer {
                Layer::Conv { w, b, cout, .. } => {
                    conv += 1;
                    ("conv", conv - 1, w, b, cout)
                }
                Layer::Dense { w, b, fan_out, .. } => {
                    dense += 1;
                    ("dense", dense - 1, w, b, fan_out)
                }
            };
            out.push((format!("{kind}{idx}.weight"), w..b));
            out.push((format!("{kind}{idx}.bias"), b..b + nb));
        }
        out
    }
    /// Replaces the parameters (length and finiteness checked).
    pub fn set_params(&mut self, params: &DVector<f64>) -> Result<()> {
        self.check_vector("parameter vector", params)?;
        self.params.copy_from_slice(params.as_slice());
        Ok(())
    }

    fn check_vector(&self, what: &'static str, v: &DVector<f64>) -> Result<()> {
        check_param_vector(what, v, self.n_params())
    }

    fn check_inputs(&self, x: &DMatrix<f64>) -> Result<()> {
        check_input_batch(x, self.input_dim(), "input width (C·H·W)")
    }

    fn act(&self) -> Activation {
        self.config.activation
    }

    fn images(x: &DMatrix<f64>) -> Vec<Vec<f64>> {
        (0..x.nrows()).map(|i| x.row(i).iter().cloned().collect()).collect()
    }

    /// `f(X)` (`n × d'`): batched im2col GEMMs (module `cnn::batched`).
    pub fn forward(&self, x: &DMatrix<f64>) -> Result<DMatrix<f64>> {
        self.check_inputs(x)?;
        Ok(self.batched_forward(x))
    }

    /// `J(X)·u` (`n × d'`), forward mode on batches.
    pub fn jvp(&self, x: &DMatrix<f64>, u: &DVector<f64>) -> Result<DMatrix<f64>> {
        self.check_inputs(x)?;
        self.check_vector("tangent vector u", u)?;
        Ok(self.batched_jvp(x, u.as_slice()))
    }

    /// `J(X)ᵀ·V` (length `p`) for a cotangent `V` (`n × d'`), reverse mode on batches.
    pub fn vjp(&self, x: &DMatrix<f64>, v: &DMatrix<f64>) -> Result<DVector<f64>> {
        self.check_inputs(x)?;
        crate::batch::check_cotangent(v, x.nrows(), self.output_dim())?;
        Ok(self.batched_vjp(x, v))
    }

    /// `J(X)·U` point-major (`n·d' × r`) for the columns of `U` (`p × r`): per chunk of
    /// images one forward trace, then one tangent pass per column, columns in parallel.
    pub fn jvp_columns(&self, x: &DMatrix<f64>, u: &DMatrix<f64>) -> Result<DMatrix<f64>> {
        self.check_inputs(x)?;
        crate::network::check_columns("parameter directions U (rows = parameters)", u, self.n_params())?;
        Ok(self.batched_jvp_columns(x, u))
    }

    /// `J(X)ᵀ·L` (`p × r`) for point-major cotangent columns `L` (`n·d' × r`): per chunk of
    /// images one forward trace, then one reverse pass per column, columns in parallel.
    pub fn vjp_columns(&self, x: &DMatrix<f64>, l: &DMatrix<f64>) -> Result<DMatrix<f64>> {
        self.check_inputs(x)?;
        crate::network::check_columns(
            "cotangents L (rows = points × outputs)",
            l,
            x.nrows() * self.output_dim(),
        )?;
        Ok(self.batched_vjp_columns(x, l))
    }

    /// `(f(X), J(X)ᵀ g)` with `g = cotangent(f(X))`: one forward and one reverse pass per
    /// chunk of images (the training step).
    pub fn forward_vjp(
        &self,
        x: &DMatrix<f64>,
        cotangent: &mut dyn FnMut(&DMatrix<f64>) -> Result<DMatrix<f64>>,
    ) -> Result<(DMatrix<f64>, DVector<f64>)> {
        self.check_inputs(x)?;
        self.batched_forward_vjp(x, cotangent)
    }

    /// The weight layers (`conv0`, …, `dense0`, …) as [`LayerInfo`]s; a convolution's
    /// `fan_in` is its patch size `C_in·k·k`, its positions the output map size before pooling.
    pub fn layer_infos(&self) -> Vec<LayerInfo> {
        let (mut conv, mut dense) = (0, 0);
        self.layers
            .iter()
            .map(|layer| match *layer {
                Layer::Conv { w, b, cin, cout, k, pad, h, wd, .. } => {
                    conv += 1;
                    let positions = Layer::conv_out(h, k, pad) * Layer::conv_out(wd, k, pad);
                    LayerInfo {
                        name: format!("conv{}", conv - 1),
                        kind: LayerKind::Conv { positions },
                        weight: w..b,
                        bias: b..b + cout,
                        fan_in: cin * k * k,
                        fan_out: cout,
                    }
                }
                Layer::Dense { w, b, fan_in, fan_out, .. } => {
                    dense += 1;
                    LayerInfo {
                        name: format!("dense{}", dense - 1),
                        kind: LayerKind::Dense,
                        weight: w..b,
                        bias: b..b + fan_out,
                        fan_in,
                        fan_out,
                    }
                }
            })
            .collect()
    }

    /// Per-layer statistics (see [`LayerStatistics`]): im2col patches and per-position
    /// pre-activation gradients for convolutions (Grosse & Martens's KFC), inputs and output
    /// gradients for dense layers, for the columns of per-image cotangent factors `Lᵢ`
    /// (`d' × k`). Batched: one forward trace per chunk of images and one reverse pass per
    /// factor column, as GEMMs (module `cnn::batched`).
    pub fn kfac_statistics(
        &self,
        x: &DMatrix<f64>,
        factors: &[DMatrix<f64>],
    ) -> Result<Vec<LayerStatistics>> {
        self.check_inputs(x)?;
        let k = crate::network::check_factors(factors, x.nrows(), self.output_dim())?;
        Ok(self.batched_kfac_statistics(x, factors, k))
    }

    /// The inputs of the last dense layer (`n × width`): the features of a last-layer
    /// (Bayesian linear regression) approximation.
    pub fn last_layer_features(&self, x: &DMatrix<f64>) -> Result<DMatrix<f64>> {
        self.check_inputs(x)?;
        let feats: Vec<Vec<f64>> = Self::images(x)
            .par_iter()
            .map(|img| self.trace(img).inputs.pop().expect("a dense layer"))
            .collect();
        let width = feats[0].len();
        Ok(DMatrix::from_fn(x.nrows(), width, |i, j| feats[i][j]))
    }

    /// `Σᵢ J(xᵢ)ᵀ Hᵢ J(xᵢ)`'s diagonal (length `p`) from the Jacobian rows, for per-point
    /// Hessian blocks `Hᵢ` (`d' × d'`).
    pub fn ggn_diagonal(&self, x: &DMatrix<f64>, hessians: &[DMatrix<f64>]) -> Result<DVector<f64>> {
        let q = self.output_dim();
        crate::network::check_hessians(hessians, x.nrows(), q)?;
        Ok(crate::network::ggn_diagonal_from_jacobian(&self.jacobian(x)?, hessians, q))
    }

    /// The Jacobian `J(X)` (`n·d' × p`, point-major rows), one reverse pass per row.
    pub fn jacobian(&self, x: &DMatrix<f64>) -> Result<DMatrix<f64>> {
        self.check_inputs(x)?;
        let (n, q, p) = (x.nrows(), self.output_dim(), self.n_params());
        let rows: Vec<Vec<f64>> = (0..n * q)
            .into_par_iter()
            .map(|r| {
                let img: Vec<f64> = x.row(r / q).iter().cloned().collect();
                let mut v = vec![0.0; q];
                v[r % q] = 1.0;
                let mut g = vec![0.0; p];
                self.adjoint(&self.trace(&img), &v, &mut g);
                g
            })
            .collect();
        Ok(DMatrix::from_fn(n * q, p, |r, c| rows[r][c]))
    }
}
