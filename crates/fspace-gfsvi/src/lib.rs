//! # fspace-gfsvi
//!
//! Function-space variational inference for neural networks with Gaussian-process priors
//! (Cinquin & Bamler, *Well-Defined Function-Space Variational Inference in Bayesian Neural
//! Networks via Regularized KL-Divergence*, UAI 2025, arXiv:2406.04317) and its VI baselines:
//!
//! * [`gfsvi::fit`] with [`KlPrior::Gp`] — **GFSVI**: `q(w) = N(m, diag(s))` on a network
//!   linearised at `m`, so that `q` induces the GP `GP(f(·; m), J S Jᵀ)`; the function-space KL
//!   to a GP prior (infinite for non-degenerate priors, Burt et al. 2020) is replaced by the
//!   regularised KL `D_KL^γ` (Quang 2019), estimated at `M` measurement points by
//!   `KL(N(f, J S Jᵀ + γM I) ‖ N(μ, K + γM I))` (eqs. 6–11). The expected log-likelihood is in
//!   closed form (eq. 10) and every gradient is exact — through `J` too.
//! * [`KlPrior::WeightPushforward`] — **TFSVI** (Rudner et al. 2022): the same
//!   linearised function-space KL with the prior `N(0, σ_p² I)` pushed forward.
//! * [`fvi::fit`] — **FVI** (Sun et al. 2019): the functional ELBO on the stochastic network
//!   (not linearised); the KL gradient uses the spectral Stein gradient estimator ([`Ssge`]) of
//!   `∇ log q` from function samples; measurement points mix uniform draws and the batch.
//! * [`mfvi::fit`] — **MFVI** (Bayes by Backprop, Blundell et al. 2015) on any network, with
//!   a weight prior `N(0, σ_p² I)`: the local reparameterisation trick on an MLP, one
//!   reparameterised weight draw per step through the network's own `forward_vjp` otherwise.
//!
//! All return the shared [`fspace_core::Posterior`]: GFSVI/TFSVI in closed form
//! ([`LinearizedPosterior`]), FVI/MFVI by Monte Carlo over stored weight samples
//! ([`WeightSamplePosterior`], 100 by default, as the paper). Every `Config` defaults to the
//! paper's values; every bad input is a typed [`GfsviError`].
//!
//! Depends on: `fspace-linalg`, `fspace-kernels`, `fspace-context`, `fspace-core`, `fspace-nn`.

pub mod divergence;
pub mod error;
pub mod fvi;
pub mod gfsvi;
pub mod mfvi;
mod nll;
mod observation;
pub mod optim;
pub mod sampled;
pub mod ssge;

pub use divergence::{gaussian_kl, regularized_kl, GaussianKl};
pub use error::{GfsviError, Result};
pub use fvi::{sample_data_term, FviConfig};
pub use gfsvi::{
    fit, fit_observed, fit_rows, fit_sharded, objective, objective_with, DataTerm, GfsviConfig, KlPrior,
    LinearizedPosterior, ObjectiveValue, VariationalParams,
};
pub use mfvi::{MfviConfig, MfviGradient};
pub use nll::gaussian_nll;
pub use optim::{OptimConfig, OptimReport};
pub use sampled::WeightSamplePosterior;
pub use ssge::Ssge;
