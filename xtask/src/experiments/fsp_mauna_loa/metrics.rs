//! `fsp-mauna-loa`: the checkpoint's unit and the typed `metrics.json`.

use super::*;

/// One method's scores on one seed (the checkpoint's unit).
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct Scores {
    /// Expected log-likelihood per test month, standardised units.
    #[serde(deserialize_with = "or_nan")]
    pub ell: f64,
    /// MSE of the predictive mean, standardised units.
    #[serde(deserialize_with = "or_nan")]
    pub mse: f64,
    /// The same MSE in ppm².
    #[serde(deserialize_with = "or_nan")]
    pub mse_ppm: f64,
    /// ELL in the paper's convention (module docs).
    #[serde(deserialize_with = "or_nan")]
    pub ell_paper: f64,
    /// The method's observation-noise σ in ppm.
    #[serde(deserialize_with = "or_nan")]
    pub sigma_ppm: f64,
}

/// One method's scores, seed by seed.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SeedScores {
    /// MSE in ppm².
    #[serde(deserialize_with = "or_nan_vec")]
    pub mse_ppm2: Vec<f64>,
    /// ELL in the paper's convention.
    #[serde(deserialize_with = "or_nan_vec")]
    pub ell_paper_convention: Vec<f64>,
    /// MSE in standardised units.
    #[serde(deserialize_with = "or_nan_vec")]
    pub mse_std: Vec<f64>,
    /// ELL per point in standardised units.
    #[serde(deserialize_with = "or_nan_vec")]
    pub ell_std_per_point: Vec<f64>,
    /// Noise σ in ppm.
    #[serde(deserialize_with = "or_nan_vec")]
    pub sigma_ppm: Vec<f64>,
    /// Wall seconds of each seed's fit and evaluation.
    pub seconds: Vec<f64>,
}

/// `metrics.json`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Metrics {
    /// Per method.
    #[serde(flatten)]
    pub methods: BTreeMap<String, SeedScores>,
    /// The GP prior's fitted hyperparameters (positive scale).
    pub prior_hyperparameters: BTreeMap<String, f64>,
    /// The GP's fitted noise σ in ppm.
    pub gp_noise_std_ppm: f64,
}
