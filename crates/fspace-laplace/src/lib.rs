//! # fspace-laplace
//!
//! The weight-space linearised Laplace approximation and the **generalised (tempered)** Laplace
//! approximation of a trained network, with every curvature structure behind one enum.
//!
//! Around the MAP weights `w*` the posterior is `N(w*, Σ)` with precision
//!
//! `Σ⁻¹ = T · C + Λ`,  `C ≈ GGN = Σᵢ J(xᵢ)ᵀ Hᵢ J(xᵢ)`,
//!
//! where `Hᵢ = ∂²(−log p(yᵢ | f))/∂f²` at `f(xᵢ; w*)` (or, with
//! [`CurvatureSource::EmpiricalFisher`], `C = Σᵢ J(xᵢ)ᵀ gᵢgᵢᵀ J(xᵢ)` with `gᵢ = ∂(−log p(yᵢ | f))/∂f`,
//! the empirical Fisher of the Generalized Laplace paper's App. A.1, in every structure), `T` is the temperature of the generalised
//! posterior (`T = 1`: the ordinary Laplace; Generalized Laplace paper eq. 21) and `Λ = diag(λ)`
//! the prior precision (one λ, or one per layer). Structures ([`Structure`]):
//!
//! | structure | `C` | memory |
//! |---|---|---|
//! | `Full` | the GGN (thin SVD of the whitened Jacobian if `n·d' < p`, else dense eigh) | `p·min(p, n·d')` |
//! | `BlockDiag` | the GGN's diagonal blocks, one per layer | `Σ layer²` |
//! | `Diag` | `diag(GGN)` | `p` |
//! | `Kfac` | per layer `G ⊗ A`, `A = Σ ããᵀ`, `G = Σ δδᵀ/(n·T)` (KFC for convolutions) | `Σ fan_in² + fan_out²` |
//! | `Ekfac` | KFAC's eigenbasis, eigenvalues re-fitted to `Σᵢ (Q_Gᵀ gᵢ Q_A)²` | `+ p` |
//! | `LastLayer` | the last layer's GGN `Σ Hᵢ ⊗ φ̃φ̃ᵀ`, other weights fixed | `(d'(h+1))²` |
//! | `LowRank` | top-`k` GGN eigenpairs by Lanczos (+ optional diagonal remainder) | `p·k` (+ cached layer statistics, bounded) |
//! | `Sampled` | none: `K` posterior draws `z = (T·GGN + λI)⁻¹(√λ ε₀ + √T Rᵀε)` by preconditioned CG, λ by EM (Antorán et al. 2023) | `p·K` (+ cached layer statistics, bounded) |
//!
//! Predictives ([`LaplacePosterior`] implements `fspace_core::Posterior`): the linearised (GLM)
//! `f(x) ~ N(f(x; w*), J(x) Σ J(x)ᵀ)` — with probit, Laplace bridge or MC class probabilities —
//! and the nonlinear MC predictive (weights `θ ~ N(w*, Σ)` through the network; Generalized
//! Laplace eq. 22, 50 samples by default). The prior precision is chosen by the Laplace log
//! marginal likelihood
//!
//! `log Z(λ, T) = T·log p(D | w*) − ½ w*ᵀΛw* + ½ log|Λ| − ½ log|T·C + Λ|`,
//!
//! evaluated from stored eigenvalues in `O(#eigenvalues)` per candidate, or by a validation grid.
//!
//! ## Data that arrive in parts
//!
//! The one-pass structures (diagonal, KFAC, full, last-layer, subnetwork) are sums over the
//! data: [`LaplaceSums`] adds them batch by batch (a loader, a file read in parts), merges the
//! sums of other parts exactly (other loaders, other processes) and is finished once into the
//! posterior; [`fit_batches`] does it for an iterator of batches. Equal to [`fit`] on the
//! concatenated data to rounding, holding one batch at a time.
//!
//! ## Conventions (as laplace-torch)
//! * the GGN is **summed** over the data (not averaged), so `λ` is directly comparable;
//! * `λ` is a **precision** (`prior_precision`);
//! * `predict` is the distribution of `f` **without** observation noise; `predict_y` adds `σ²`.
//! * KFAC's `G` is averaged over examples and `A` summed (Martens & Grosse), so `G ⊗ A` is
//!   exact for one example; for convolutions (Grosse & Martens 2016) `G` is also averaged over
//!   the `T` output positions and `A` summed over them.

mod config;
mod construct;
mod curvature;
mod data;
mod error;
mod fit;
mod ggn;
mod posterior;
mod predict;
mod sampled;
mod stream;
mod structure;

pub use config::{LaplaceConfig, MarglikConfig, Predictive, PriorPrecision};
pub use curvature::{
    BlockDiagCurvature, Curvature, CurvatureApprox, DiagCurvature, EigenCurvature, KronCurvature, KronLayer,
    SampleCurvature,
};
pub use data::CurvatureSource;
pub use error::{LaplaceError, Result};
pub use fit::{fit, fit_observed, fit_sharded};
pub use posterior::{LaplacePosterior, QueryState};
pub use sampled::{SampledConfig, SampledPreconditioner};
pub use stream::{fit_batches, LaplaceSums};
pub use structure::{
    support, BlockDiagConfig, FitReport, FullConfig, KronBias, LastLayerConfig, LowRankConfig, Structure,
    Subset, Support, Weights, SUPPORT,
};
