//! `valla-mnist` / `valla-fmnist`: the typed `metrics.json`.

use super::*;

/// One Fig. 3/4 cell: ours over seeds beside the paper's.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CellStats {
    /// Mean over seeds.
    #[serde(deserialize_with = "or_nan")]
    pub mean: f64,
    /// Standard error (NaN with one seed).
    #[serde(deserialize_with = "or_nan")]
    pub se: f64,
    /// The paper's value.
    pub paper: f64,
}

/// One method over seeds.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MethodSummary {
    /// Test accuracy in percent.
    #[serde(rename = "ACC (%)")]
    pub accuracy_percent: CellStats,
    /// Test NLL.
    #[serde(rename = "NLL")]
    pub nll: CellStats,
    /// Expected calibration error.
    #[serde(rename = "ECE")]
    pub ece: CellStats,
    /// Brier score.
    #[serde(rename = "Brier")]
    pub brier: CellStats,
    /// AUC of the entropy between ID and OOD test images.
    #[serde(rename = "OOD-AUC")]
    pub ood_auc: CellStats,
    /// Each seed's fit seconds.
    pub fit_seconds: Vec<f64>,
}

/// One method's ECE and NLL against the rotation angle (FMNIST, Fig. 4 right; mean over seeds).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RotationCurves {
    /// The method.
    pub method: String,
    /// `(degrees, ECE)`.
    pub ece: Vec<(f64, f64)>,
    /// `(degrees, NLL)`.
    pub nll: Vec<(f64, f64)>,
}

/// One method on one seed.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SeedRecord {
    /// The seed.
    pub seed: u64,
    /// The method.
    pub method: String,
    /// Fit seconds (MAP: its training).
    pub fit_seconds: f64,
    /// Test accuracy in percent.
    pub accuracy_percent: f64,
    /// Test NLL.
    pub nll: f64,
    /// ECE.
    pub ece: f64,
    /// Brier score.
    pub brier: f64,
    /// OOD AUC.
    pub ood_auc: f64,
    /// `(degrees, ECE, NLL)` on the rotated test images (FMNIST).
    pub rotated: Vec<RotatedPoint>,
    /// The method's own details.
    pub extra: Value,
}

/// `metrics.json` of `valla-mnist` / `valla-fmnist`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Metrics {
    /// Seeds run.
    pub seeds: usize,
    /// Whether this was the `--quick` budget.
    pub quick: bool,
    /// Per method.
    pub summary: BTreeMap<String, MethodSummary>,
    /// Rotation curves (FMNIST only).
    pub rotation: Vec<RotationCurves>,
    /// Every (seed, method).
    pub per_seed: Vec<SeedRecord>,
}
