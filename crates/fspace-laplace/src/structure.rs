//! What a Laplace fit builds: the curvature structures and their options, which weights the
//! posterior covers, where KFAC puts the bias, and the fit's report.

use serde::{Deserialize, Serialize};

use crate::sampled::SampledConfig;

/// Options of the full GGN.
///
/// | name | default | purpose |
/// |---|---|---|
/// | `max_params` | 12 000 | refuse networks with more parameters (a dense `p × p` would need `8p²` bytes) |
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FullConfig {
    /// Largest `p` accepted.
    pub max_params: usize,
}
impl Default for FullConfig {
    fn default() -> Self {
        Self { max_params: 12_000 }
    }
}

/// Options of the layer-block-diagonal GGN (B-Diag).
///
/// | name | default | purpose |
/// |---|---|---|
/// | `max_block_params` | 6 000 | refuse layers with more parameters (one dense block each) |
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BlockDiagConfig {
    /// Largest block accepted.
    pub max_block_params: usize,
}
impl Default for BlockDiagConfig {
    fn default() -> Self {
        Self { max_block_params: 6_000 }
    }
}

/// Options of the last-layer GGN.
///
/// | name | default | purpose |
/// |---|---|---|
/// | `max_params` | 12 000 | refuse last layers with more parameters (`d'·(width + 1)`) |
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LastLayerConfig {
    /// Largest last layer accepted.
    pub max_params: usize,
}
impl Default for LastLayerConfig {
    fn default() -> Self {
        Self { max_params: 12_000 }
    }
}

/// Options of the low-rank GGN (top-`k` eigenpairs by Lanczos with full reorthogonalisation).
///
/// | name | default | purpose |
/// |---|---|---|
/// | `rank` | 100 | `k`, eigenpairs kept (laplax's default scale) |
/// | `diag_remainder` | false | add `max(diag(GGN) − diag(V S Vᵀ), 0)` so the diagonal is exact |
/// | `tol` | 1e-8 | relative Ritz residual every kept pair must reach |
/// | `max_iterations` | 1 000 | Lanczos steps at most (the Krylov space grows from `1.5k + 10` by 5 steps, or a tenth, until converged) |
/// | `seed` | 0 | Lanczos start vector |
/// | `statistics_cache_bytes` | 1 GiB | cache the layer statistics for the GGN products when they fit (two GEMMs per layer and product instead of a JVP + VJP); `0` always streams |
/// | `max_basis` | `None` | hold at most this many Krylov vectors (`p × max_basis` doubles, ≥ `rank + 2`), restarting from the best Ritz vectors when full (thick-restart Lanczos, `fspace_linalg::thick_restart`); `None` grows the basis as far as the iteration needs |
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LowRankConfig {
    /// Eigenpairs kept.
    pub rank: usize,
    /// Add the diagonal remainder.
    pub diag_remainder: bool,
    /// Relative residual tolerance of the kept Ritz pairs.
    pub tol: f64,
    /// Most Lanczos iterations.
    pub max_iterations: usize,
    /// Start-vector seed.
    pub seed: u64,
    /// Largest layer-statistics cache (bytes) used for the GGN products; see
    /// `crate::ggn` — networks without layer structure always stream.
    #[serde(default = "default_cache_bytes")]
    pub statistics_cache_bytes: usize,
    /// Most Krylov vectors held at once (thick restart); `None`: unbounded.
    #[serde(default)]
    pub max_basis: Option<usize>,
}
fn default_cache_bytes() -> usize {
    1 << 30
}
impl Default for LowRankConfig {
    fn default() -> Self {
        Self {
            rank: 100,
            diag_remainder: false,
            tol: 1e-8,
            max_iterations: 1_000,
            seed: 0,
            statistics_cache_bytes: default_cache_bytes(),
            max_basis: None,
        }
    }
}

/// The curvature structure, chosen with one word (laplace-torch's `hessian_structure` and
/// `subset_of_weights`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Structure {
    /// Dense GGN over all weights.
    Full(FullConfig),
    /// One dense GGN block per layer.
    BlockDiag(BlockDiagConfig),
    /// The GGN's diagonal.
    Diag,
    /// Kronecker factors per layer (bias folded into the input factor; KFC for convolutions).
    Kfac,
    /// KFAC eigenbasis with eigenvalues re-fitted to the per-example curvature.
    Ekfac,
    /// Dense GGN of the last layer over the last-layer features; other weights fixed at MAP.
    LastLayer(LastLayerConfig),
    /// Top-`k` eigenpairs of the GGN by matrix-free Lanczos.
    LowRank(LowRankConfig),
    /// Posterior draws by sample-then-optimise, λ by EM (Antorán et al. 2023; `crate::sampled`).
    Sampled(SampledConfig),
}

impl Structure {
    /// `Full` with its defaults.
    pub fn full() -> Self {
        Self::Full(FullConfig::default())
    }
    /// `BlockDiag` with its defaults.
    pub fn block_diag() -> Self {
        Self::BlockDiag(BlockDiagConfig::default())
    }
    /// `LastLayer` with its defaults.
    pub fn last_layer() -> Self {
        Self::LastLayer(LastLayerConfig::default())
    }
    /// `LowRank` with rank `k` and the other defaults.
    pub fn low_rank(k: usize) -> Self {
        Self::LowRank(LowRankConfig { rank: k, ..Default::default() })
    }
    /// Short name (`full`, `block_diag`, `diag`, `kfac`, `ekfac`, `last_layer`, `low_rank`,
    /// `sampled`).
    pub fn name(&self) -> &'static str {
        match self {
            Self::Full(_) => "full",
            Self::BlockDiag(_) => "block_diag",
            Self::Diag => "diag",
            Self::Kfac => "kfac",
            Self::Ekfac => "ekfac",
            Self::LastLayer(_) => "last_layer",
            Self::LowRank(_) => "low_rank",
            Self::Sampled(_) => "sampled",
        }
    }
}

/// Which weights the posterior covers (laplace-torch's `subset_of_weights`); the others stay
/// at their MAP values. Which [`Structure`]s exist over which weights is [`SUPPORT`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub enum Weights {
    /// Every weight (laplace-torch's `'all'`).
    #[default]
    All,
    /// The last layer's weights and biases (`'last_layer'`): with a one-output Gaussian head
    /// its KFAC is exact, `(1/σ²) ⊗ Σ φ̃φ̃ᵀ`.
    LastLayer,
    /// The weights at these flat parameter indices (strictly increasing, each `< p`), chosen
    /// by the caller (e.g. the largest-variance weights of a diagonal Laplace, Daxberger et al.
    /// 2021).
    Subnetwork(Vec<usize>),
}

impl Weights {
    /// The subset without a subnetwork's indices (the key of [`SUPPORT`]'s rows).
    pub fn subset(&self) -> Subset {
        match self {
            Weights::All => Subset::All,
            Weights::LastLayer => Subset::LastLayer,
            Weights::Subnetwork(_) => Subset::Subnetwork,
        }
    }
}

/// [`Weights`] without the subnetwork's indices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Subset {
    /// Every weight.
    All,
    /// The last layer's weights and biases.
    LastLayer,
    /// Chosen weights.
    Subnetwork,
}

/// One structure over one subset of the weights, as a fit may form it: a row of [`SUPPORT`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Support {
    /// [`Structure::name`].
    pub structure: &'static str,
    /// The weights it covers.
    pub subset: Subset,
    /// Its curvature is one pass over the data into sums that merge: [`LaplaceSums`](crate::LaplaceSums)
    /// takes a loader batch by batch, and processes' sums add.
    pub streams: bool,
    /// [`fit_sharded`](crate::fit_sharded) takes it: every sum over the data all-reduced as the fit
    /// forms it.
    pub shards: bool,
}

const fn row(structure: &'static str, subset: Subset, streams: bool, shards: bool) -> Support {
    Support { structure, subset, streams, shards }
}

/// Every structure × subset that exists — the one table [`fit`](crate::fit()),
/// [`LaplaceSums`](crate::LaplaceSums) and [`fit_sharded`](crate::fit_sharded) read; a pair not
/// listed is refused by each of them with the same error. Over the last layer `Full` is
/// `LastLayer`; over a subnetwork the dense GGN of those weights and its diagonal (laplace-torch's
/// `SubnetLaplace`) exist.
pub const SUPPORT: &[Support] = &[
    row("full", Subset::All, true, false),
    row("full", Subset::LastLayer, true, false),
    row("full", Subset::Subnetwork, true, false),
    row("block_diag", Subset::All, false, false),
    row("diag", Subset::All, true, false),
    row("diag", Subset::LastLayer, true, false),
    row("diag", Subset::Subnetwork, true, false),
    row("kfac", Subset::All, true, true),
    row("kfac", Subset::LastLayer, true, true),
    row("ekfac", Subset::All, false, true),
    row("ekfac", Subset::LastLayer, false, true),
    row("last_layer", Subset::All, true, false),
    row("last_layer", Subset::LastLayer, true, false),
    row("low_rank", Subset::All, false, true),
    row("sampled", Subset::All, false, true),
];

/// `structure` over `weights`' subset, as [`SUPPORT`] lists it; an unlisted pair is
/// [`LaplaceError::Unsupported`](crate::LaplaceError::Unsupported), naming the subsets the structure covers.
pub fn support(structure: &Structure, weights: &Weights) -> crate::Result<Support> {
    let (name, subset) = (structure.name(), weights.subset());
    if let Some(row) = SUPPORT.iter().find(|r| r.structure == name && r.subset == subset) {
        return Ok(*row);
    }
    let covered: Vec<String> =
        SUPPORT.iter().filter(|r| r.structure == name).map(|r| format!("{:?}", r.subset)).collect();
    Err(crate::LaplaceError::Unsupported {
        structure: name,
        reason: format!("it is not implemented over {subset:?} weights; it covers {}", covered.join(", ")),
    })
}

/// Where KFAC / EKFAC put a layer's bias.
///
/// `Folded` (default, Martens & Grosse's augmented input `ã = [a; 1]`): one Kronecker block
/// `G ⊗ Σ ããᵀ` over `[W | b]`, which couples weights and bias. `Separate`: a block `G ⊗ Σ aaᵀ`
/// for `W` and `n·G = Σ δδᵀ` (the exact bias GGN) for `b`, with no weight–bias coupling — the
/// convention of laplace-torch's KFAC backends, as far as we can tell from their factor lists
/// (weight `[G, A]`, bias `[G]`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum KronBias {
    /// Bias folded into the input factor.
    #[default]
    Folded,
    /// Weight and bias in separate blocks.
    Separate,
}

/// Diagnostics of a fit.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct FitReport {
    /// Parameters the curvature covers.
    pub dim: usize,
    /// Low-rank: Lanczos iterations, the largest relative Ritz residual of the kept pairs, and
    /// the rank actually kept (smaller than asked when the GGN's numerical rank is smaller).
    /// Sampled with the `LowRank` preconditioner: the same for the preconditioner's pairs.
    pub lanczos_iterations: usize,
    /// See `lanczos_iterations`.
    pub max_ritz_residual: f64,
    /// See `lanczos_iterations`.
    pub rank: usize,
    /// Low-rank: whether the GGN products used cached layer statistics (`crate::ggn`).
    #[serde(default)]
    pub cached_statistics: bool,
    /// Seconds spent building the curvature.
    pub seconds: f64,
    /// Sampled: λ after each EM step.
    #[serde(default)]
    pub em_prior_precisions: Vec<f64>,
    /// Sampled: products with the posterior precision in each solve (one per CG iteration,
    /// plus residual checks).
    #[serde(default)]
    pub cg_products: Vec<usize>,
    /// Sampled with an EM record: the wall seconds of the recorded EM steps this fit continued
    /// from, spent by the fits before it (`0` for a fit that started afresh). A resumed fit's
    /// whole cost is its own time plus this.
    #[serde(default)]
    pub em_recorded_seconds: f64,
}
