//! # fspace-valla
//!
//! **VaLLA** — the variational linearised Laplace approximation (Ortega, Santana &
//! Hernández-Lobato 2024) — and its scalable baseline **ELLA** (Deng et al. 2022).
//!
//! The linearised network around its MAP weights `θ̂` is a GP with the scaled NTK kernel
//! `κ(x, x') = σ₀² J(x) J(x')ᵀ`. VaLLA fits a sparse variational GP in that kernel's RKHS with the
//! decoupled parameterisation of Cheng & Boots, keeping the **network as the posterior mean**
//! (Prop. 1) and inducing points `Z` only for the covariance:
//!
//! `K*(x, x') = κ(x, x') − κ(x, Z) (A⁻¹ + K_Z)⁻¹ κ(Z, x')`,
//! `KL = ½ log|I + K_Z A| − ½ tr(K_Z (A⁻¹ + K_Z)⁻¹)`,
//!
//! trained on the α-objective `Σᵢ (1/α) log E_q[p(yᵢ | f(xᵢ))^α] − KL` (eq. 22; α = 1 by
//! default, which makes the data term the log predictive and lets σ₀² be learned) with
//! minibatches (eq. 23), `A = LLᵀ` (lower-triangular `L`, positive diagonal through its log),
//! `Z` from k-means then moved along the NTK's input gradient, and early stopping on validation
//! NLL (App. C). Computation uses `B = I + Lᵀ K_Z L ⪰ I`: `(A⁻¹ + K_Z)⁻¹ = L B⁻¹ Lᵀ` and
//! `KL = ½(log|B| − M + tr B⁻¹)` (module `objective`). Classification has one network output per
//! class; each inducing point carries one class (initialised per class by k-means), and
//! `log E_q[softmax(f)_y]` uses the probit approximation the paper cites (or MC).
//!
//! Prop. 2: for fixed `Z` the ELBO-optimal `A = σ⁻² K_Z⁻¹ K_{ZX} K_{XZ} K_Z⁻¹`
//! ([`prop2_optimal_state`]); with `Z = X` this is `A = σ⁻² I` and VaLLA is the exact
//! linearised-Laplace GP (tested to 1e-8).
//!
//! Cost per iteration `O(|b|·M·Σ widths + M³)` with the layer-wise NTK (App. F.3) — no Jacobian
//! is stored for MLPs. Any [`fspace_nn::Network`] works: networks without an NTK input gradient
//! keep `Z` fixed (`optimize_inducing = false`).
//!
//! ELLA ([`ella::fit`]): Nyström features of the NTK from `M` random points and `K`
//! eigenvectors, the Laplace posterior in feature space, prior precision on validation data,
//! and Deng et al.'s early stopping over how much of the training set enters the curvature
//! ([`EllaEarlyStopping`], on by default; it needs the validation set too). Without early
//! stopping [`EllaBatches`] fits it over a stream of batches (the Nyström rows at
//! [`ella::nystrom_choice`]'s positions gathered first).
//!
//! Both posteriors implement `fspace_core::Posterior` and save / load as JSON.

mod data;
pub mod ella;
mod error;
mod objective;
pub mod valla;

pub use ella::{
    EllaBatches, EllaConfig, EllaEarlyStopping, EllaPosterior, EllaPrior, EllaReport, FeatureRoute,
    NystromChoice, NystromFeatures,
};
pub use error::{Result, VallaError};
pub use objective::{ClassApprox, StateGradient, VariationalState};
pub use valla::{
    fit, fit_observed, fit_sharded, prop2_optimal_state, ValidationPoint, VallaConfig, VallaPosterior,
    VallaReport,
};

/// Objective internals for tests and benchmarks (not a stable API).
#[doc(hidden)]
pub mod internals {
    pub use crate::objective::{iteration, objective_value_and_gradient, point_term_public};
}
