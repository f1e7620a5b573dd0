//! The options of a Laplace fit and of its evidence maximisation.

use serde::{Deserialize, Serialize};

use crate::data::CurvatureSource;
use crate::structure::{KronBias, Structure, Weights};

/// The prior precision λ of `N(0, λ⁻¹ I)` on the weights: one value, or one per layer (in
/// [`Network::layer_infos`](fspace_nn::Network::layer_infos) order).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum PriorPrecision {
    /// One λ for every weight.
    Scalar(f64),
    /// One λ per layer.
    PerLayer(Vec<f64>),
    /// One λ per covered parameter, in ascending order of the flat parameter index
    /// (laplace-torch's diagonal prior precision). The diagonal, full, last-layer, subnetwork
    /// and B-Diag structures take it; Kronecker factors need one λ per layer block.
    PerParameter(Vec<f64>),
}

/// How [`Posterior::predict`](fspace_core::Posterior::predict) and
/// [`Posterior::sample_functions`](fspace_core::Posterior::sample_functions) predict.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Predictive {
    /// The linearised (GLM) predictive `N(f(x; w*), J(x) Σ J(x)ᵀ)`.
    Glm,
    /// The nonlinear Monte-Carlo predictive (Generalized Laplace eq. 22): weights
    /// `θₛ ~ N(w*, Σ)` pushed through the network; moments from `samples` draws of `seed`.
    Nonlinear {
        /// Weight samples (the paper: 50).
        samples: usize,
        /// Seed of the draws (fixed, so `predict` is deterministic).
        seed: u64,
    },
}

impl Predictive {
    /// The Generalized Laplace paper's nonlinear predictive: 50 weight samples (eq. 22).
    pub fn nonlinear(seed: u64) -> Self {
        Self::Nonlinear { samples: 50, seed }
    }
}

/// Options of [`fit`](crate::fit()).
///
/// | name | default | purpose |
/// |---|---|---|
/// | `structure` | `Kfac` | curvature structure |
/// | `curvature` | `Ggn` | the GGN, or the empirical Fisher (`CurvatureSource`) |
/// | `weights` | `All` | which weights the posterior covers (`LastLayer`: laplace-torch's `'last_layer'`) |
/// | `kron_bias` | `Folded` | KFAC / EKFAC: bias folded into the input factor, or a separate block (laplace-torch) |
/// | `prior_precision` | `Scalar(1.0)` | λ (laplace-torch's default) |
/// | `temperature` | 1.0 | `T` of the generalised posterior (`T = 1`: Bayes) |
/// | `chunk_points` | 256 | points per Jacobian / statistics chunk (memory `chunk·d'·p`; fewer where a chunk's layer statistics would pass 1 GiB) |
/// | `predictive` | `Glm` | what `predict` returns |
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LaplaceConfig {
    /// Curvature structure.
    pub structure: Structure,
    /// What the curvature is built from: the GGN or the empirical Fisher.
    #[serde(default)]
    pub curvature: CurvatureSource,
    /// Which weights (the others stay at MAP).
    #[serde(default)]
    pub weights: Weights,
    /// Where KFAC / EKFAC put the bias.
    #[serde(default)]
    pub kron_bias: KronBias,
    /// Prior precision λ.
    pub prior_precision: PriorPrecision,
    /// Temperature `T > 0`.
    pub temperature: f64,
    /// Points per chunk.
    pub chunk_points: usize,
    /// Predictive used by the `Posterior` methods.
    pub predictive: Predictive,
}

impl Default for LaplaceConfig {
    fn default() -> Self {
        Self {
            structure: Structure::Kfac,
            curvature: CurvatureSource::Ggn,
            weights: Weights::All,
            kron_bias: KronBias::Folded,
            prior_precision: PriorPrecision::Scalar(1.0),
            temperature: 1.0,
            chunk_points: 256,
            predictive: Predictive::Glm,
        }
    }
}

/// Options of [`LaplacePosterior::optimize_prior_precision`](crate::LaplacePosterior::optimize_prior_precision).
///
/// | name | default | purpose |
/// |---|---|---|
/// | `per_layer` | false | one λ per layer (coordinate ascent) instead of one |
/// | `bounds` | (1e-6, 1e6) | search interval of λ |
/// | `grid_points` | 49 | log-spaced starting grid, refined by golden-section search |
/// | `sweeps` | 3 | coordinate-ascent sweeps for `per_layer` |
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MarglikConfig {
    /// Per-layer λ.
    pub per_layer: bool,
    /// Search interval `(lo, hi)`, `0 < lo < hi`.
    pub bounds: (f64, f64),
    /// Starting grid size (≥ 3).
    pub grid_points: usize,
    /// Coordinate-ascent sweeps.
    pub sweeps: usize,
}

impl Default for MarglikConfig {
    fn default() -> Self {
        Self { per_layer: false, bounds: (1e-6, 1e6), grid_points: 49, sweeps: 3 }
    }
}
