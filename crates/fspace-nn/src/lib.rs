//! # fspace-nn
//!
//! The only crate that imports dfdx. Networks are seen by the rest of the workspace as a flat
//! parameter vector `w ∈ ℝᵖ` plus exact linearisation operators at fixed `w`, as nalgebra
//! values. Points are rows (`n × d` inputs, `n × d'` outputs; Jacobian rows point-major).
//!
//! Implemented so far ([`Mlp`], any widths, tanh / ReLU / sigmoid / softplus / GELU):
//! * [`Mlp::forward`] `f(X)`;
//! * [`Mlp::jvp`] `J(X)·u` — forward mode, written as dfdx tensor operations (tangent rules
//!   `ż = ȧWᵀ + aUᵀ + u_b`, `ȧ = σ'(z) ⊙ ż`) so that dfdx's reverse mode can later
//!   differentiate *through* them (DESIGN.md, "pullbacks");
//! * [`Mlp::vjp`] `J(X)ᵀ·V` — dfdx reverse mode;
//! * [`Mlp::jacobian`] the `n·d' × p` Jacobian, streamed in row chunks by
//!   [`Mlp::jacobian_rows`]; [`Mlp::ntk`] `J(X)J(Z)ᵀ` layer by layer without forming `J`
//!   (VaLLA App. F.3); [`Mlp::ggn_vector`] `Jᵀ H J v` for per-point function-space Hessian
//!   blocks `H`.
//!
//! * [`Mlp::ggn_diagonal`], [`Mlp::kfac_factors`] / [`Mlp::layer_statistics`],
//!   [`Mlp::last_layer_features`];
//! * [`Mlp::ntk_block`] / [`Mlp::ntk_diagonal`] / [`Mlp::ntk_block_pullback_z`]: NTK blocks
//!   for selected outputs ([`Outputs`]), their `d' × d'` diagonal blocks, and the gradient of
//!   `⟨C, J(X)J(Z)ᵀ⟩` with respect to inducing inputs `Z` (VaLLA) as explicit rules on GEMMs
//!   (module `ntk`); [`Mlp::ntk_pullback_z`] computes the latter by dfdx reverse mode through
//!   taped tangents and serves as its cross-check;
//! * [`Mlp::jsj_pullback`]: gradients of `⟨C, J diag(s) Jᵀ⟩` with respect to `w` and `s`
//!   (GFSVI), by reverse-over-tangent: the tangent rules are taped dfdx operations (tanh,
//!   sigmoid, softplus, ReLU, GELU);
//! * [`train_map`]: minibatch MAP with Adam, any `fspace_core::Likelihood`, a regulariser hook
//!   with its own gradient, weight decay, validation early stopping, progress callback;
//! * [`FeatureMap`]: e.g. appended `sin/cos(2πt/T)` inputs.
//!
//! * [`HelmholtzNet`]: `f = ∇Φ + rot Ψ` from two scalar MLPs (FSP-Laplace eq. B.2), with `Jᵀ·V`
//!   by reverse mode through taped input tangents, the Jacobian and `J·u`;
//!
//! * [`Cnn`]: conv / max-pool / dense networks (LeNet-5, FSP-Laplace's MNIST net) with `f`,
//!   `J·u`, `Jᵀ·V` and the Jacobian written as explicit per-image rules (dfdx 0.13's conv2d
//!   needs its nightly feature), parallel over images;
//!
//! * layer structure for curvature approximations ([`Network::layer_infos`],
//!   [`Network::kfac_statistics`] → [`LayerStatistics`]: layer inputs / im2col patches and
//!   per-position output gradients, Grosse & Martens's KFC ingredients for convolutions;
//!   [`Network::last_layer_features`]) for the MLP and the CNN;
//!
//! Not yet: second-order operators (`jsj_pullback`, NTK input gradients) for the CNN;
//! a forward-over-forward `J·u` for the Helmholtz net (it uses its explicit Jacobian).

mod cnn;
mod cnn_batched;
mod features;
mod gemm;
mod helmholtz;
mod jsj;
mod layers;
mod mlp;
mod mlp_batched;
mod ntk;
mod scratch;
mod train;

pub use cnn::{Cnn, CnnConfig, ConvBlock};
pub use features::{FeatureMap, Featurized};
pub use helmholtz::HelmholtzNet;
pub use jsj::{GramCotangent, WeightedGram};
pub use layers::{LayerInfo, LayerKind, LayerStatistics};
pub use mlp::{Activation, Mlp, MlpConfig, NnError, Result};
pub use ntk::{NtkPair, Outputs};
pub use train::{train_map, Network, Regularizer, TrainConfig, TrainProgress, TrainReport};
