//! The serialisable likelihood description every method takes.

use serde::{Deserialize, Serialize};

use crate::error::{CoreError, Result};
use crate::likelihood::{
    Bernoulli, Categorical, Gaussian, HeteroscedasticGaussian, IsotropicGaussian, Likelihood,
};

/// The observation model `p(y | f)`, as one value that every method of the workspace accepts
/// and every saved posterior records. [`build`](Self::build) gives the [`Likelihood`]
/// implementation (NLL, gradient, curvature blocks).
///
/// | variant | network outputs `d'` | targets per point | learnable |
/// |---|---|---|---|
/// | `Gaussian { sigma, learn }` | 1 | 1 real | `σ` if `learn` |
/// | `IsotropicGaussian { sigma, outputs, learn }` | `outputs` | `outputs` reals | `σ` if `learn` |
/// | `Bernoulli` | 1 | 0 / 1 | – |
/// | `Categorical { classes }` | `classes` | a label `0..classes` | – |
/// | `HeteroscedasticGaussian` | 2 (`μ`, `log σ²`) | 1 real | the network |
///
/// `learn`: the methods that train weights or a variational posterior (MAP training, GFSVI,
/// TFSVI, FVI, MFVI, VaLLA) start `σ` at `sigma` and optimise it when `learn` is set; the
/// post-hoc methods (Laplace, ELLA, FSP-Laplace's Alg. 2) take `sigma` as the fitted value, and
/// a fitted posterior records the `σ` it ended with. Knobs that belong to one method's
/// approximation of the likelihood (Monte-Carlo samples, probit vs. MC class terms) live in
/// that method's `Config`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum LikelihoodSpec {
    /// `y ~ N(f, σ²)`.
    Gaussian {
        /// Noise standard deviation σ > 0 (the start value when learned).
        sigma: f64,
        /// Whether training methods learn σ.
        learn: bool,
    },
    /// `yᵢ ~ N(fᵢ, σ² I)` with `outputs` outputs (targets point-major).
    IsotropicGaussian {
        /// Noise standard deviation σ > 0.
        sigma: f64,
        /// Outputs `d'` ≥ 1.
        outputs: usize,
        /// Whether training methods learn σ.
        learn: bool,
    },
    /// Binary labels with a logistic link (one logit).
    Bernoulli,
    /// Class labels `0..classes` with a softmax link.
    Categorical {
        /// Number of classes ≥ 2.
        classes: usize,
    },
    /// `y ~ N(μ, e^η)` with the network giving `(μ, η)` per point (laplace-torch users'
    /// heteroscedastic regression); curvature is the Fisher `diag(e^−η, ½)`.
    HeteroscedasticGaussian,
}

impl LikelihoodSpec {
    /// Gaussian with a fixed `σ`.
    pub fn gaussian(sigma: f64) -> Self {
        Self::Gaussian { sigma, learn: false }
    }
    /// Gaussian whose `σ` training methods learn, starting at `sigma`.
    pub fn gaussian_learned(sigma: f64) -> Self {
        Self::Gaussian { sigma, learn: true }
    }
    /// Gaussian with a fixed `σ` on `outputs` outputs per point: `Gaussian` for one,
    /// `IsotropicGaussian` for more (what a GP regression over a `d'`-output kernel takes).
    pub fn gaussian_outputs(sigma: f64, outputs: usize) -> Self {
        match outputs {
            1 => Self::gaussian(sigma),
            outputs => Self::IsotropicGaussian { sigma, outputs, learn: false },
        }
    }
    /// Softmax over `classes` logits.
    pub fn categorical(classes: usize) -> Self {
        Self::Categorical { classes }
    }

    /// Checks the parameters (σ > 0 and finite, `outputs ≥ 1`, `classes ≥ 2`).
    pub fn validate(&self) -> Result<()> {
        self.build().map(|_| ())
    }

    /// The [`Likelihood`] implementation.
    pub fn build(&self) -> Result<Box<dyn Likelihood>> {
        Ok(match *self {
            Self::Gaussian { sigma, .. } => Box::new(Gaussian::new(sigma)?),
            Self::IsotropicGaussian { sigma, outputs, .. } => {
                Box::new(IsotropicGaussian::new(sigma, outputs)?)
            }
            Self::Bernoulli => Box::new(Bernoulli),
            Self::Categorical { classes } => Box::new(Categorical::new(classes)?),
            Self::HeteroscedasticGaussian => Box::new(HeteroscedasticGaussian),
        })
    }

    /// Network outputs per point `d'`.
    pub fn output_dim(&self) -> usize {
        match *self {
            Self::Gaussian { .. } | Self::Bernoulli => 1,
            Self::IsotropicGaussian { outputs, .. } => outputs,
            Self::Categorical { classes } => classes,
            Self::HeteroscedasticGaussian => 2,
        }
    }

    /// Targets per point (the columns of the targets matrix).
    pub fn target_dim(&self) -> usize {
        match *self {
            Self::IsotropicGaussian { outputs, .. } => outputs,
            _ => 1,
        }
    }

    /// The homoscedastic noise σ of the Gaussian variants; `None` otherwise.
    pub fn noise_std(&self) -> Option<f64> {
        match *self {
            Self::Gaussian { sigma, .. } | Self::IsotropicGaussian { sigma, .. } => Some(sigma),
            _ => None,
        }
    }

    /// Whether training methods learn σ.
    pub fn learns_noise(&self) -> bool {
        matches!(*self, Self::Gaussian { learn: true, .. } | Self::IsotropicGaussian { learn: true, .. })
    }

    /// The same description with σ replaced (what a fitted posterior records after learning
    /// σ); unchanged for variants without σ.
    pub fn with_noise_std(self, new_sigma: f64) -> Self {
        match self {
            Self::Gaussian { learn, .. } => Self::Gaussian { sigma: new_sigma, learn },
            Self::IsotropicGaussian { outputs, learn, .. } => {
                Self::IsotropicGaussian { sigma: new_sigma, outputs, learn }
            }
            other => other,
        }
    }

    /// The same description with σ held fixed (`learn: false`): what a fit that learned σ
    /// hands on to a post-hoc method, which takes σ as given.
    pub fn fixed(self) -> Self {
        match self {
            Self::Gaussian { sigma, .. } => Self::Gaussian { sigma, learn: false },
            Self::IsotropicGaussian { sigma, outputs, .. } => {
                Self::IsotropicGaussian { sigma, outputs, learn: false }
            }
            other => other,
        }
    }

    /// A short name for errors and tables.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Gaussian { .. } => "Gaussian",
            Self::IsotropicGaussian { .. } => "isotropic Gaussian",
            Self::Bernoulli => "Bernoulli",
            Self::Categorical { .. } => "categorical",
            Self::HeteroscedasticGaussian => "heteroscedastic Gaussian",
        }
    }

    /// The error a method returns for a likelihood it does not implement.
    pub fn unsupported(&self, method: &'static str) -> CoreError {
        CoreError::Unsupported { method, likelihood: self.name() }
    }
}
