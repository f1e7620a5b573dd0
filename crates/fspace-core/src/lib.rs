//! # fspace-core
//!
//! The contracts every inference method shares:
//!
//! * [`LikelihoodSpec`], the one serialisable likelihood description every method takes, and
//!   the [`Likelihood`]s it builds — [`Gaussian`], [`IsotropicGaussian`], [`Bernoulli`],
//!   [`Categorical`], [`HeteroscedasticGaussian`] — with NLL, gradient and per-point curvature
//!   blocks (the `H` of the GGN `Σᵢ Jᵢᵀ Hᵢ Jᵢ`).
//! * [`Persist`]: versioned JSON save/load that every fitted posterior implements.
//! * The shape of every method's `fit`: [`Data`] (training and optional validation set) in,
//!   [`Fitted`] `{ posterior, report }` out, progress through an [`Observer`].
//! * The [`Posterior`] trait: predictive mean and marginal variance of `f`, joint covariance
//!   for small sets, seeded function samples; [`class_probabilities`] by Monte Carlo, probit or
//!   Laplace bridge; Gaussian `y`-predictives via [`Gaussian::predictive`].
//! * The one [`Schedule`] of every iterative fit (steps or epochs, evaluate every k, patience
//!   in evaluations, best-state restore) and its loop-side [`ScheduleRun`]; [`Minibatches`],
//!   [`Adam`].
//!
//! Function values at `n` points of a `d'`-output model are `n × d'` matrices (point-major).
//! Bad input is a [`CoreError`], never a panic.
#![doc = include_str!("../README.md")]

pub mod error;
pub mod fit;
pub mod likelihood;
pub mod persist;
pub mod posterior;
pub mod schedule;
pub mod spec;
pub mod training;

pub use error::{CoreError, MethodError, Result};
pub use fit::{Data, Fitted, Observer, ProcessShard, Progress, ShardLayout, Silent};
pub use likelihood::{
    logsumexp, sigmoid, softmax, softplus, Bernoulli, Categorical, Gaussian, HeteroscedasticGaussian,
    IsotropicGaussian, Likelihood, SIGMA_RANGE,
};
pub use persist::{envelope_json, fingerprint, LoadCheck, LoadLimits, Persist, PersistError};
pub use posterior::{
    checked_joint, class_probabilities, clip_rounding, ensure_classifier, ensure_joint_fits,
    ensure_samples_fit, finite_samples, mc_class_probabilities, mean_class_probabilities,
    observation_predictive, sample_gaussian, FunctionPredictive, Link, Posterior,
};
pub use schedule::{Schedule, ScheduleRun, Span, StopDecision};
pub use spec::LikelihoodSpec;
pub use training::{Adam, Minibatches, RowSource, RowsInMemory};
