//! # fspace-nn
//!
//! The only crate that imports dfdx. Networks are seen by the rest of the workspace through the
//! [`Network`] trait: a flat parameter vector `w ∈ ℝᵖ` plus exact linearisation operators at
//! fixed `w`, as nalgebra values. Points are rows (`n × d` inputs, `n × d'` outputs; Jacobian
//! rows point-major).
//!
//! * [`Network`] (module `network`): `f(X)`, `J(X)·u`, `J(X)ᵀ·V` and their many-column forms,
//!   the fused `f` + `Jᵀg(f)` pass, the Jacobian, NTK blocks and their input gradients,
//!   `J diag(s) Jᵀ` with its pull-back ([`WeightedGram`], GFSVI), GGN products and diagonal,
//!   layer structure and KFAC statistics ([`LayerInfo`], [`LayerStatistics`]), last-layer
//!   features. Each network implements it in its own file.
//! * [`Mlp`] (tanh / ReLU / sigmoid / softplus / GELU, [`Activation`]): `f`, `J·u`, `Jᵀ·V` and
//!   the fused pass as row-major GEMM rules (`mlp::batched`), the NTK and its `Z` gradient as
//!   explicit rules (`ntk`, VaLLA App. F.3), `J S Jᵀ` and its pull-back by the tangent-network
//!   rule (`jsj`). dfdx's taped passes (`jvp_taped`, `vjp_taped`, `jsj_pullback`,
//!   `ntk_pullback_z`) are the independent references
//!   the tests compare the GEMM rules against.
//! * [`Cnn`] (conv / max-pool / dense: LeNet-5, FSP-Laplace's MNIST net): batched im2col GEMM
//!   rules (`cnn::batched`) and per-image rules for the Jacobian and as the tests' reference.
//! * [`HelmholtzNet`]: `f = ∇Φ + rot Ψ` from two scalar MLPs (FSP-Laplace eq. B.2), with `Jᵀ·V`
//!   by second-order reverse passes and `J·u` through its Jacobian.
//! * [`NativeNetwork`]: an [`Mlp`] or a [`Cnn`] behind one type (every method forwards to the
//!   wrapped network's rule), for callers that learn the architecture at run time.
//! * [`Featurized`]: a network on features `φ(x)` ([`FeatureMap`], e.g. `sin/cos(2πt/T)`),
//!   with priors and context points staying in raw inputs.
//! * [`train_map`]: minibatch MAP with Adam, any `fspace_core::Likelihood` (learnable
//!   parameters optional), a regulariser hook with its own gradient (FSP-Laplace's Alg. 1),
//!   weight decay, validation early stopping that restores the best weights, a progress callback;
//!   [`fit_map`] is the same training in the workspace's call shape (`Data`, `LikelihoodSpec`,
//!   a [`MapReport`] holding the trained likelihood), [`train_map_rows`] the same steps over rows
//!   read by position (`fspace_core::RowSource`), each minibatch checked as it arrives.
//!
//! Errors are [`NnError`] values (module `error`, with the input checks every network shares).
//! Not yet: second-order operators (`J S Jᵀ` pull-back, NTK input gradients) for the CNN.

mod activation;
mod batch;
mod cnn;
mod error;
mod features;
mod gemm;
mod helmholtz;
mod layers;
mod mlp;
mod native;
mod network;
mod scratch;
mod tape;
mod train;

pub use activation::Activation;
pub use cnn::{Cnn, CnnConfig, ConvBlock};
pub use error::{NnError, Result, MAX_LOADED_WEIGHT};

/// The input checks every network shares (shapes, emptiness, finiteness, with the same
/// errors), for networks implemented outside this crate — the Python binding's torch
/// callbacks.
pub mod checks {
    pub use crate::error::{check_input_batch, check_param_vector};
    pub use crate::network::{check_columns, check_point_cotangents};
}
pub use features::{FeatureMap, Featurized};
pub use helmholtz::HelmholtzNet;
pub use layers::{KfacFactorSums, LayerInfo, LayerKind, LayerStatistics};
pub use mlp::{Mlp, MlpConfig};
#[doc(hidden)]
pub use nalgebra as __nalgebra;
pub use native::NativeNetwork;
pub use network::{
    forward_vjp_many_default, GramCotangent, JointCotangents, Network, NtkPair, Outputs, OutputsAndGradients,
    WeightedGram,
};
pub use train::{
    fit_map, fit_map_observed, train_map, train_map_rows, train_map_sharded, MapReport, Regularizer,
    TrainConfig, TrainProgress, TrainReport,
};
