//! # fspace-nn (in progress)
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
//! * [`Mlp::jacobian`] the `n·d' × p` Jacobian in row chunks, [`Mlp::ntk`] `J(X)J(Z)ᵀ`,
//!   [`Mlp::ggn_vector`] `Jᵀ H J v` for per-point function-space Hessian blocks `H`.
//!
//! * [`train_map`]: minibatch MAP with Adam, any `fspace_core::Likelihood`, a regulariser hook
//!   with its own gradient, weight decay, validation early stopping, progress callback;
//! * [`FeatureMap`]: e.g. appended `sin/cos(2πt/T)` inputs.
//!
//! Not yet: CNNs, the Helmholtz network, gradients through `J S Jᵀ` and
//! through `κ(X, Z)`, KFAC factors and the GGN diagonal, layer-wise NTK — see the
//! open issue "Networks on dfdx with exact linearisation operators and MAP training".

mod features;
mod mlp;
mod train;

pub use features::FeatureMap;
pub use mlp::{Activation, Mlp, MlpConfig, NnError, Result};
pub use train::{train_map, Regularizer, TrainConfig, TrainProgress, TrainReport};
