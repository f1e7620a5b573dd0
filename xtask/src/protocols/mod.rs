//! The protocols experiments share: data, splits, priors and evaluation of the papers' set-ups.
//! An experiment file imports from here, from [`crate::harness`] and from the library crates,
//! never from another experiment.
//!
//! * [`sine`] — the 1-D sine toy (FSP-Laplace App. B.1, GFSVI App. A.1): prior fit, FSP
//!   configuration, evaluation against the exact GP.
//! * [`moons`] — two moons (FSP-Laplace App. C.2): data, fitted priors, one FSP-Laplace fit and
//!   its heat maps.
//! * [`uci`] — the UCI regression tables (GFSVI App. A.2, FSP-Laplace App. C.3): 5-fold splits,
//!   standardisation and prior fit per fold, scores, ranks, the MAP + Laplace baseline, OOD rows.
//! * [`images`] — MNIST / Fashion-MNIST splits, rotations and classification metrics.
//! * [`timing`] — medians of repeated calls, network epoch timing, PyTorch run live.

use anyhow::Result;
use fspace_core::{Data, LikelihoodSpec};
use fspace_laplace::{
    fit as laplace_fit, LaplaceConfig, LaplacePosterior, MarglikConfig, PriorPrecision, Structure, Weights,
};
use fspace_nn::{Activation, Mlp, MlpConfig};
use nalgebra::{DMatrix, DVector};

pub mod images;
pub mod moons;
pub mod sine;
pub mod timing;
pub mod uci;

/// Point-major targets (`t` per point) as the `n × t` matrix that `fspace_core::Data` takes.
pub fn targets(y: &nalgebra::DVector<f64>, t: usize) -> DMatrix<f64> {
    DMatrix::from_row_slice(y.len() / t, t, y.as_slice())
}

/// A tanh MLP `d → hidden → q` (the papers' toy networks).
pub fn tanh_mlp(d: usize, hidden: &[usize], q: usize, seed: u64) -> Result<Mlp> {
    Ok(Mlp::new(MlpConfig {
        input_dim: d,
        hidden: hidden.to_vec(),
        output_dim: q,
        activation: Activation::Tanh,
        seed,
    })?)
}

/// The exact GP baseline through `fspace_gp::exact::fit`: the zero-mean prior over `kernel`
/// conditioned on `y` (`n × d'`) with the noise variance `noise_var` (a
/// `fspace_gp::fit_hyperparameters` report's), isotropic over several outputs.
pub fn exact_gp<K: fspace_kernels::MatrixKernel + Clone>(
    kernel: &K,
    noise_var: f64,
    x: &DMatrix<f64>,
    y: &DMatrix<f64>,
) -> Result<fspace_gp::ExactGp<K>> {
    let likelihood = LikelihoodSpec::gaussian_outputs(noise_var.sqrt(), kernel.output_dim());
    let prior = fspace_kernels::GpPrior::with_kernel(kernel.clone(), fspace_kernels::PriorMean::Zero);
    Ok(fspace_gp::exact::fit(likelihood, &prior, &Data::new(x, y)?)?.posterior)
}

/// The SVGP baseline through `fspace_gp::svgp::fit`: the zero-mean prior over `kernel` trained
/// on `y` (`n × 1`) from the noise variance `noise_var` with `config` (its inducing inputs);
/// the noise is learned with the kernel when `config.learn_hyperparameters` is on.
pub fn svgp<K: fspace_kernels::Kernel + Clone>(
    kernel: &K,
    noise_var: f64,
    x: &DMatrix<f64>,
    y: &DMatrix<f64>,
    config: &fspace_gp::SvgpConfig,
) -> Result<fspace_gp::Svgp<K>> {
    let likelihood =
        LikelihoodSpec::Gaussian { sigma: noise_var.sqrt(), learn: config.learn_hyperparameters };
    let prior = fspace_kernels::GpPrior::with_kernel(kernel.clone(), fspace_kernels::PriorMean::Zero);
    Ok(fspace_gp::svgp::fit(likelihood, &prior, &Data::new(x, y)?, config)?.posterior)
}

/// `n` equispaced points on `[lo, hi]` as an `n × 1` matrix.
pub fn linspace(lo: f64, hi: f64, n: usize) -> DMatrix<f64> {
    DMatrix::from_fn(n, 1, |i, _| lo + (hi - lo) * i as f64 / (n - 1) as f64)
}

/// A Laplace posterior of `structure` over `weights` around `net` with λ by marginal likelihood
/// (from `lambda0`).
pub fn laplace_with_marglik(
    net: &Mlp,
    likelihood: LikelihoodSpec,
    x: &DMatrix<f64>,
    y: &DVector<f64>,
    structure: Structure,
    weights: Weights,
    lambda0: f64,
) -> Result<LaplacePosterior<Mlp>> {
    let mut post = laplace_fit(
        net.clone(),
        likelihood,
        &Data::new(x, &targets(y, 1))?,
        &LaplaceConfig {
            structure,
            weights,
            prior_precision: PriorPrecision::Scalar(lambda0),
            ..LaplaceConfig::default()
        },
    )?
    .posterior;
    post.optimize_prior_precision(&MarglikConfig::default())?;
    Ok(post)
}

/// A checkpoint unit fitted around a shared network (a MAP), stored with that network's
/// [`fingerprint`] beside the unit's own fields: a resumed run retrains the network and keeps
/// the unit only when `map` equals the retrained network's fingerprint.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct AroundMap<T> {
    /// The unit.
    #[serde(flatten)]
    pub unit: T,
    /// The fingerprint of the network it was fitted around.
    pub map: String,
}

/// A fingerprint of a network's parameters ([`fspace_core::fingerprint`] of them): a
/// resumed run that retrains a shared network (a MAP) keeps the units fitted around it only when
/// the retrained one has the same fingerprint ([`AroundMap`]).
pub fn fingerprint(net: &impl fspace_nn::Network) -> String {
    fspace_core::fingerprint(net.params().iter().copied())
}
