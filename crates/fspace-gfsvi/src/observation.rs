//! The observation models GFSVI, TFSVI, FVI and MFVI implement, read from a
//! [`LikelihoodSpec`].

use fspace_core::LikelihoodSpec;
use fspace_input::InputError;

use crate::error::{GfsviError, Result};

/// Which data term a fit uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Observation {
    /// `N(y | f, σ_y²)` per output; targets `n × d'`.
    Gaussian,
    /// Softmax over the `d'` logits; targets `n × 1` labels in `0..d'`.
    Categorical,
}

/// The data term, the start value of `σ_y` and whether it is learned, for a `d'`-output
/// network: `Gaussian` (`d' = 1`) and `IsotropicGaussian` (`outputs = d'`) give the Gaussian
/// term, `Categorical { classes = d' }` the categorical one where `categorical_ok`; any other
/// likelihood is [`CoreError::Unsupported`](fspace_core::CoreError::Unsupported).
pub(crate) fn observation(
    spec: &LikelihoodSpec,
    outputs: usize,
    method: &'static str,
    categorical_ok: bool,
) -> Result<(Observation, f64, bool)> {
    spec.validate()?;
    if spec.output_dim() != outputs {
        return Err(GfsviError::Input(InputError::DimensionMismatch {
            what: "likelihood outputs vs. network outputs (one-output regression is `Gaussian`, several `IsotropicGaussian`)",
            expected: outputs,
            found: spec.output_dim(),
        }));
    }
    match *spec {
        LikelihoodSpec::Gaussian { sigma, learn }
        | LikelihoodSpec::IsotropicGaussian { sigma, learn, .. } => Ok((Observation::Gaussian, sigma, learn)),
        LikelihoodSpec::Categorical { .. } if categorical_ok => Ok((Observation::Categorical, 1.0, false)),
        other => Err(other.unsupported(method).into()),
    }
}

/// `likelihood` as a fitted posterior keeps it: its outputs checked against the network's and,
/// for the Gaussian likelihoods, σ set to the posterior's `σ_y` (learned or given).
pub(crate) fn attach_likelihood(
    likelihood: LikelihoodSpec,
    outputs: usize,
    noise_std: f64,
) -> Result<LikelihoodSpec> {
    likelihood.validate()?;
    if likelihood.output_dim() != outputs {
        return Err(GfsviError::Input(InputError::DimensionMismatch {
            what: "likelihood outputs vs. network outputs",
            expected: outputs,
            found: likelihood.output_dim(),
        }));
    }
    Ok(match likelihood.noise_std() {
        Some(_) => likelihood.with_noise_std(noise_std),
        None => likelihood,
    })
}

/// The load-time twin of [`attach_likelihood`]: a stored likelihood must be valid, have the
/// network's outputs and carry the stored `σ_y`.
pub(crate) fn check_attached(
    check: &fspace_core::LoadCheck,
    likelihood: Option<LikelihoodSpec>,
    outputs: usize,
    noise_std: f64,
) -> std::result::Result<(), fspace_core::PersistError> {
    let Some(spec) = likelihood else { return Ok(()) };
    check.likelihood("likelihood", &spec, outputs)?;
    check.ensure(spec.noise_std().is_none_or(|s| s == noise_std), "likelihood", || {
        format!("σ {:?} differs from noise_std {noise_std}", spec.noise_std())
    })
}
