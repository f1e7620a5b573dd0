//! # fspace-core
//!
//! The contracts every inference method shares:
//!
//! * [`Likelihood`]s in function space — [`Gaussian`], [`Bernoulli`], [`Categorical`] — with
//!   NLL, gradient and per-point Hessian blocks (the `H` of the GGN `Σᵢ Jᵢᵀ Hᵢ Jᵢ`).
//! * The [`Posterior`] trait: predictive mean and marginal variance of `f`, joint covariance
//!   for small sets, seeded function samples; [`class_probabilities`] by Monte Carlo, probit or
//!   Laplace bridge; Gaussian `y`-predictives via [`Gaussian::predictive`].
//! * Training pieces that are not network-specific: [`Minibatches`], [`EarlyStopping`].
//!
//! Function values at `n` points of a `d'`-output model are `n × d'` matrices (point-major).
//! Bad input is a [`CoreError`], never a panic.
#![doc = include_str!("../README.md")]

pub mod error;
pub mod likelihood;
pub mod posterior;
pub mod training;

pub use error::{CoreError, Result};
pub use likelihood::{
    logsumexp, sigmoid, softmax, softplus, Bernoulli, Categorical, Gaussian, IsotropicGaussian, Likelihood,
};
pub use posterior::{class_probabilities, sample_gaussian, ClassProbMethod, FunctionPredictive, Posterior};
pub use training::{Adam, EarlyStopping, Minibatches, StopDecision};
