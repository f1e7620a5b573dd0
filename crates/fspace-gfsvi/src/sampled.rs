//! A posterior over functions represented by Monte-Carlo weight samples from a mean-field
//! Gaussian `q(w) = N(m, diag(σ²))` on the (non-linearised) network — what FVI and MFVI return.

use fspace_core::{
    Fitted, FunctionPredictive, LikelihoodSpec, Link, Observer, Persist, PersistError, Posterior,
};
use fspace_input::InputError;
use fspace_nn::Network;
use nalgebra::{DMatrix, DVector};
use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};
use rand_distr::{Distribution, StandardNormal};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::error::{ensure_finite, GfsviError, Result};
use crate::observation::Observation;
use crate::optim::{OptimConfig, OptimReport};

/// `q(w) = N(m, diag(σ²))` with a fixed set of weight samples for predictions (the paper's
/// 100) and fresh draws for [`sample_functions`](Posterior::sample_functions).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WeightSamplePosterior<N> {
    net: N,
    mean: DVector<f64>,
    std: DVector<f64>,
    samples: Vec<DVector<f64>>,
    noise_std: f64,
    /// The observation model (`None` in files written before it was stored).
    #[serde(default)]
    likelihood: Option<LikelihoodSpec>,
}

fn draw(mean: &DVector<f64>, std: &DVector<f64>, rng: &mut dyn RngCore) -> DVector<f64> {
    DVector::from_fn(mean.len(), |k, _| {
        let e: f64 = StandardNormal.sample(rng);
        mean[k] + std[k] * e
    })
}

impl<N: Network + Clone> WeightSamplePosterior<N> {
    /// `n_samples` seeded draws from `N(mean, diag(std²))`. Errors: `mean` or `std` without the
    /// network's `p` entries, non-finite values, a negative deviation, `σ_y ≤ 0`, and
    /// `n_samples = 0` (the predictive is a Monte-Carlo average over the draws: with none it
    /// has no variance).
    pub fn new(
        net: N,
        mean: DVector<f64>,
        std: DVector<f64>,
        noise_std: f64,
        n_samples: usize,
        seed: u64,
    ) -> Result<Self> {
        let p = net.n_params();
        for (what, v) in [("weight means", &mean), ("weight standard deviations", &std)] {
            if v.len() != p {
                return Err(GfsviError::Input(InputError::DimensionMismatch {
                    what,
                    expected: p,
                    found: v.len(),
                }));
            }
            ensure_finite(what, v.iter())?;
        }
        if std.iter().any(|&s| s < 0.0) || !(noise_std.is_finite() && noise_std > 0.0) {
            return Err(GfsviError::Input(InputError::Invalid {
                what: "weight standard deviations / σ_y",
                reason: "deviations must be ≥ 0 and σ_y > 0".into(),
            }));
        }
        if n_samples == 0 {
            return Err(GfsviError::Input(InputError::Invalid {
                what: "predictive_samples",
                reason: "must be ≥ 1: the predictive averages over that many weight draws".into(),
            }));
        }
        let mut rng = StdRng::seed_from_u64(seed);
        let samples = (0..n_samples).map(|_| draw(&mean, &std, &mut rng)).collect();
        Ok(Self { net, mean, std, samples, noise_std, likelihood: None })
    }
    /// The same posterior with its observation model, for [`Posterior::predict_y`] and
    /// [`Posterior::class_probabilities`]; a Gaussian spec takes the posterior's `σ_y`.
    /// Errors: a spec whose outputs differ from the network's.
    pub fn with_likelihood(self, likelihood: LikelihoodSpec) -> Result<Self> {
        let likelihood =
            crate::observation::attach_likelihood(likelihood, self.net.output_dim(), self.noise_std)?;
        Ok(Self { likelihood: Some(likelihood), ..self })
    }
    /// Weight means.
    pub fn mean(&self) -> &DVector<f64> {
        &self.mean
    }
    /// Weight standard deviations.
    pub fn std(&self) -> &DVector<f64> {
        &self.std
    }
    /// The likelihood scale `σ_y`.
    pub fn noise_std(&self) -> f64 {
        self.noise_std
    }
    /// Class probabilities (`n × C`): the mean sigmoid (one output) or softmax of the logits
    /// over the stored weight samples — the predictive of a classifier; the link
    /// approximations of Gaussian logits do not apply to a sample average.
    fn sample_average_probabilities(&self, x: &DMatrix<f64>) -> fspace_core::Result<DMatrix<f64>> {
        fspace_core::mean_class_probabilities(&self.outputs(x, &self.samples)?)
    }
    fn outputs(&self, x: &DMatrix<f64>, weights: &[DVector<f64>]) -> fspace_core::Result<Vec<DMatrix<f64>>> {
        let mut net = self.net.clone();
        weights
            .iter()
            .map(|w| {
                net.set_params(w).map_err(err)?;
                net.forward(x).map_err(err)
            })
            .collect()
    }
}

fn err(e: impl std::error::Error + Send + Sync + 'static) -> fspace_core::CoreError {
    fspace_core::CoreError::method("weight-sample posterior", e)
}

impl<N: Network + Clone> Posterior for WeightSamplePosterior<N> {
    fn output_dim(&self) -> usize {
        self.net.output_dim()
    }
    fn likelihood(&self) -> Option<LikelihoodSpec> {
        self.likelihood
    }
    /// The average over the stored weight samples whatever the `link` (see
    /// `sample_average_probabilities`).
    fn class_probabilities(&self, x: &DMatrix<f64>, _link: &Link) -> fspace_core::Result<DMatrix<f64>> {
        fspace_core::ensure_classifier(self.likelihood)?;
        self.sample_average_probabilities(x)
    }
    fn predict(&self, x: &DMatrix<f64>) -> fspace_core::Result<FunctionPredictive> {
        let fs = self.outputs(x, &self.samples)?;
        let s = fs.len() as f64;
        let mean = fs.iter().fold(DMatrix::zeros(x.nrows(), self.output_dim()), |a, f| a + f) / s;
        let var = fs.iter().fold(DMatrix::zeros(x.nrows(), self.output_dim()), |a, f| {
            let d = f - &mean;
            a + d.component_mul(&d)
        }) / s;
        FunctionPredictive::new(mean, var)
    }
    fn predict_joint(&self, x: &DMatrix<f64>) -> fspace_core::Result<(DMatrix<f64>, DMatrix<f64>)> {
        fspace_core::ensure_joint_fits(x.nrows(), fspace_core::Posterior::output_dim(self))?;
        let fs = self.outputs(x, &self.samples)?;
        let s = fs.len() as f64;
        let (n, q) = (x.nrows(), self.output_dim());
        let mean = fs.iter().fold(DMatrix::zeros(n, q), |a, f| a + f) / s;
        let mut cov = DMatrix::zeros(n * q, n * q);
        for f in &fs {
            let d = DVector::from_fn(n * q, |r, _| f[(r / q, r % q)] - mean[(r / q, r % q)]);
            cov += &d * d.transpose();
        }
        fspace_core::checked_joint(mean, cov / s)
    }
    fn sample_functions(
        &self,
        x: &DMatrix<f64>,
        s: usize,
        rng: &mut dyn RngCore,
    ) -> fspace_core::Result<Vec<DMatrix<f64>>> {
        fspace_core::ensure_samples_fit(s, x.nrows(), fspace_core::Posterior::output_dim(self))?;
        let w: Vec<DVector<f64>> = (0..s).map(|_| draw(&self.mean, &self.std, rng)).collect();
        fspace_core::finite_samples(self.outputs(x, &w)?)
    }
}

/// Saves the network, the mean, the standard deviations, the predictive weight samples and
/// `σ_y`.
impl<N: Network + Clone + Serialize + DeserializeOwned> Persist for WeightSamplePosterior<N> {
    const KIND: &'static str = "fspace_gfsvi::WeightSamplePosterior";
    const VERSION: u32 = 1;

    /// The network checked itself while it was read; here: the mean, the standard deviations
    /// and every predictive sample have the network's `p` finite entries (deviations ≥ 0), at
    /// least one sample, and `σ_y > 0`.
    fn validate_loaded(&self) -> std::result::Result<(), PersistError> {
        let check = fspace_core::LoadCheck::new(Self::KIND);
        let p = self.net.n_params();
        check.len("mean", self.mean.len(), p)?;
        check.finite("mean", self.mean.iter())?;
        check.len("std", self.std.len(), p)?;
        check.non_negative("std", self.std.iter())?;
        check.ensure(!self.samples.is_empty(), "samples", || "must hold ≥ 1 weight sample".into())?;
        for w in &self.samples {
            check.len("samples", w.len(), p)?;
            check.finite("samples", w.iter())?;
        }
        check.positive("noise_std", self.noise_std)?;
        crate::observation::check_attached(&check, self.likelihood, self.net.output_dim(), self.noise_std)
    }
}

pub(crate) fn unpack(theta: &DVector<f64>, p: usize) -> (DVector<f64>, DVector<f64>, f64) {
    (theta.rows(0, p).into_owned(), theta.rows(p, p).map(f64::exp), theta[2 * p])
}

pub(crate) fn pack(mean: &DVector<f64>, log_std: f64, log_noise: f64) -> DVector<f64> {
    let p = mean.len();
    let mut v = DVector::from_element(2 * p + 1, log_std);
    v.rows_mut(0, p).copy_from(mean);
    v[2 * p] = log_noise;
    v
}

/// The loop FVI and MFVI share: Adam on `θ = (m, log σ, log σ_y)` with the method's `step`,
/// validation NLL of a 20-sample predictive for early stopping, and the fitted
/// [`WeightSamplePosterior`] with `predictive_samples` draws.
pub(crate) fn fit_mean_field<N: Network + Clone>(
    net: &N,
    theta0: DVector<f64>,
    n: usize,
    optim: &OptimConfig,
    validation: Option<(&DMatrix<f64>, &DMatrix<f64>)>,
    predictive_samples: usize,
    likelihood: Observation,
    spec: LikelihoodSpec,
    step: impl FnMut(&DVector<f64>, &[usize], &mut StdRng) -> Result<(f64, DVector<f64>)>,
    observer: &mut dyn Observer,
) -> Result<Fitted<WeightSamplePosterior<N>, OptimReport>> {
    if predictive_samples == 0 {
        return Err(GfsviError::Input(InputError::Invalid {
            what: "predictive_samples",
            reason: "must be ≥ 1: the predictive averages over that many weight draws".into(),
        }));
    }
    let p = net.n_params();
    let mut val_net = net.clone();
    let mut validate = |theta: &DVector<f64>| -> Result<f64> {
        let (xv, yv) = validation.expect("only called with a validation set");
        let (m, sd, log_noise) = unpack(theta, p);
        val_net.set_params(&m)?;
        let post = WeightSamplePosterior::new(val_net.clone(), m, sd, log_noise.exp(), 20, optim.seed)?;
        match likelihood {
            Observation::Gaussian => crate::nll::gaussian_nll(&post.predict(xv)?, yv, log_noise.exp()),
            Observation::Categorical => {
                let probs = post.sample_average_probabilities(xv)?;
                let nll: f64 =
                    (0..xv.nrows()).map(|i| -probs[(i, yv[(i, 0)] as usize)].max(1e-300).ln()).sum();
                Ok(nll / xv.nrows() as f64)
            }
        }
    };
    let mut step = step;
    let step = |theta: &DVector<f64>, batch: &[usize], rng: &mut StdRng| {
        fspace_input::interrupt::check("the mean-field optimisation")?;
        step(theta, batch, rng)
    };
    let (theta, report) = crate::optim::optimise(
        theta0,
        n,
        optim,
        step,
        validation.is_some().then_some(&mut validate as crate::optim::Validator<'_>),
        observer,
    )?;
    let (m, sd, log_noise) = unpack(&theta, p);
    let mut fitted = net.clone();
    fitted.set_params(&m)?;
    let posterior =
        WeightSamplePosterior::new(fitted, m, sd, log_noise.exp(), predictive_samples, optim.seed ^ 0x5eed)?
            .with_likelihood(spec)?;
    Ok(Fitted { posterior, report })
}

pub(crate) fn check_regression(
    x: &DMatrix<f64>,
    y: &DMatrix<f64>,
    d: usize,
    q: usize,
    what: &'static str,
) -> Result<()> {
    if x.nrows() == 0 {
        return Err(GfsviError::Input(InputError::Empty { what }));
    }
    if x.ncols() != d {
        return Err(GfsviError::Input(InputError::DimensionMismatch {
            what: "input columns",
            expected: d,
            found: x.ncols(),
        }));
    }
    if y.shape() != (x.nrows(), q) {
        return Err(GfsviError::Input(InputError::DimensionMismatch {
            what: "targets (n × d')",
            expected: x.nrows() * q,
            found: y.len(),
        }));
    }
    ensure_finite("inputs", x.iter())?;
    ensure_finite("targets", y.iter())
}
