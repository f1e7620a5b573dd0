//! The fitted Laplace posterior: the type, its accessors and settings, save/load and the
//! `Posterior` contract. Its predictives (`predictive.rs`) and its evidence and searches
//! (`evidence.rs`) are child modules.

mod evidence;
mod predictive;

use fspace_core::{CoreError, FunctionPredictive, LikelihoodSpec, Link, Persist, Posterior};
use fspace_input::InputError;
use fspace_nn::Network;
use nalgebra::{DMatrix, DVector};
use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::config::{Predictive, PriorPrecision};
use crate::curvature::{Curvature, CurvatureApprox};
use crate::error::{ensure_positive, LaplaceError, Result};
use crate::structure::FitReport;
pub(crate) use predictive::{forward_and_features_chunked, forward_chunked, moments};

/// A fitted (generalised) Laplace approximation `N(w*, (T·C + Λ)⁻¹)` around a network's MAP
/// weights. Conventions (as laplace-torch): the GGN `C` is **summed** over the data, λ is a
/// **precision**, and [`Posterior::predict`] returns the distribution of `f` **without** the
/// observation noise (add σ² with [`predict_y`](Self::predict_y)).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LaplacePosterior<N> {
    pub(crate) net: N,
    pub(crate) likelihood: LikelihoodSpec,
    pub(crate) curvature: Curvature,
    /// Flat network index of each curvature coordinate.
    pub(crate) indices: Vec<usize>,
    /// Prior group (layer) of each curvature coordinate.
    pub(crate) groups: Vec<usize>,
    pub(crate) n_groups: usize,
    pub(crate) lambdas: Vec<f64>,
    /// λ per curvature coordinate when the prior was given per parameter
    /// ([`PriorPrecision::PerParameter`]); it then overrides `lambdas` (which hold each layer's
    /// mean, for reporting).
    #[serde(default)]
    pub(crate) coordinate_lambdas: Option<Vec<f64>>,
    pub(crate) temperature: f64,
    /// `log p(D | w*)` (untempered).
    pub(crate) log_likelihood: f64,
    pub(crate) n_data: usize,
    pub(crate) predictive: Predictive,
    pub(crate) report: FitReport,
}

/// The prior precision and temperature a query of a [`LaplacePosterior`] runs at: the ones set
/// now ([`LaplacePosterior::state`]) or given ([`LaplacePosterior::state_at`]), checked and
/// resolved for the posterior's coordinates. The `*_in` queries take one, so that asking at
/// another λ or `T` never changes the posterior (its readers in other threads see it as it
/// was).
#[derive(Debug, Clone, PartialEq)]
pub struct QueryState {
    /// λ per prior group (layer): each group's mean under a per-parameter prior.
    lambdas: Vec<f64>,
    /// λ per curvature coordinate under a per-parameter prior.
    coordinate: Option<Vec<f64>>,
    /// λ per curvature coordinate.
    lam: DVector<f64>,
    temperature: f64,
}

impl QueryState {
    /// λ per curvature coordinate.
    pub fn lambdas(&self) -> &DVector<f64> {
        &self.lam
    }

    /// The temperature `T`.
    pub fn temperature(&self) -> f64 {
        self.temperature
    }

    /// Whether one λ covers every coordinate.
    pub(crate) fn isotropic(&self) -> bool {
        self.coordinate.is_none() && self.lambdas.iter().all(|&l| l == self.lambdas[0])
    }
}

/// The prior group (layer) of each curvature coordinate: the layer whose weight or bias range
/// holds its flat index (group 0 for a network without layer structure).
pub(crate) fn prior_groups(infos: &[fspace_nn::LayerInfo], p: usize, indices: &[usize]) -> Vec<usize> {
    let mut group_of_flat = vec![0usize; p];
    for (g, info) in infos.iter().enumerate() {
        for i in info.weight.clone().chain(info.bias.clone()) {
            group_of_flat[i] = g;
        }
    }
    indices.iter().map(|&i| group_of_flat[i]).collect()
}

impl<N: Network> LaplacePosterior<N> {
    /// The network at its MAP weights.
    pub fn network(&self) -> &N {
        &self.net
    }

    fn is_regression(&self) -> bool {
        matches!(
            self.likelihood,
            LikelihoodSpec::Gaussian { .. }
                | LikelihoodSpec::IsotropicGaussian { .. }
                | LikelihoodSpec::HeteroscedasticGaussian
        )
    }

    /// The fitted curvature.
    pub fn curvature(&self) -> &Curvature {
        &self.curvature
    }

    /// Flat network index of each curvature coordinate.
    pub fn indices(&self) -> &[usize] {
        &self.indices
    }

    /// Diagnostics of the fit.
    pub fn report(&self) -> &FitReport {
        &self.report
    }

    /// λ per layer (all equal for a scalar prior).
    pub fn prior_precision(&self) -> &[f64] {
        &self.lambdas
    }

    /// The temperature `T`.
    pub fn temperature(&self) -> f64 {
        self.temperature
    }

    /// `log p(D | w*)` at the MAP (untempered).
    pub fn log_likelihood(&self) -> f64 {
        self.log_likelihood
    }

    /// The number of training points the curvature sums over.
    pub fn n_data(&self) -> usize {
        self.n_data
    }

    /// What the `Posterior` methods predict with.
    pub fn predictive(&self) -> &Predictive {
        &self.predictive
    }

    /// The network's outputs at the MAP weights (`n × d'`, the GLM predictive's mean), in
    /// chunks of 256 points.
    pub fn map_outputs(&self, x: &DMatrix<f64>) -> Result<DMatrix<f64>> {
        forward_chunked(&self.net, x, 256)
    }

    /// Sets λ (scalar, one per layer or one per covered parameter); errors on λ ≤ 0 or a wrong
    /// count.
    pub fn set_prior_precision(&mut self, prior: PriorPrecision) -> Result<()> {
        let state = self.state_at(&prior, self.temperature)?;
        self.lambdas = state.lambdas;
        self.coordinate_lambdas = state.coordinate;
        Ok(())
    }

    /// The λ and `T` set now, for the `*_in` queries.
    pub fn state(&self) -> QueryState {
        QueryState {
            lambdas: self.lambdas.clone(),
            coordinate: self.coordinate_lambdas.clone(),
            lam: self.current_lambdas(),
            temperature: self.temperature,
        }
    }

    /// `prior` and `t` checked and resolved as [`set_prior_precision`](Self::set_prior_precision)
    /// and [`set_temperature`](Self::set_temperature) would set them, without setting them.
    pub fn state_at(&self, prior: &PriorPrecision, t: f64) -> Result<QueryState> {
        ensure_positive("temperature", t)?;
        if let PriorPrecision::PerParameter(_) = prior {
            let lam = self.coordinate_lambdas_of(prior)?;
            let mut sums = vec![(0.0, 0usize); self.n_groups];
            for (&g, &l) in self.groups.iter().zip(lam.iter()) {
                sums[g].0 += l;
                sums[g].1 += 1;
            }
            let lambdas = sums.iter().map(|&(s, c)| if c == 0 { 1.0 } else { s / c as f64 }).collect();
            let coordinate = Some(lam.iter().copied().collect());
            return Ok(QueryState { lambdas, coordinate, lam, temperature: t });
        }
        let lambdas = self.resolve(prior)?;
        let lam = self.lam_vector(&lambdas);
        Ok(QueryState { lambdas, coordinate: None, lam, temperature: t })
    }

    /// The posterior's versioned JSON with the λ and `T` of `state` in place of those set (what
    /// [`Persist::to_json`] writes after setting them), without setting them.
    pub fn to_json_in(&self, state: &QueryState) -> std::result::Result<String, fspace_core::PersistError>
    where
        N: Serialize + DeserializeOwned,
    {
        /// `LaplacePosterior`'s fields by reference, λ and `T` replaced (the same names, so
        /// that `from_json` reads it as the posterior itself).
        #[derive(Serialize)]
        struct Saved<'a, N> {
            net: &'a N,
            likelihood: &'a LikelihoodSpec,
            curvature: &'a Curvature,
            indices: &'a [usize],
            groups: &'a [usize],
            n_groups: usize,
            lambdas: &'a [f64],
            coordinate_lambdas: &'a Option<Vec<f64>>,
            temperature: f64,
            log_likelihood: f64,
            n_data: usize,
            predictive: &'a Predictive,
            report: &'a FitReport,
        }
        let saved = Saved {
            net: &self.net,
            likelihood: &self.likelihood,
            curvature: &self.curvature,
            indices: &self.indices,
            groups: &self.groups,
            n_groups: self.n_groups,
            lambdas: &state.lambdas,
            coordinate_lambdas: &state.coordinate,
            temperature: state.temperature,
            log_likelihood: self.log_likelihood,
            n_data: self.n_data,
            predictive: &self.predictive,
            report: &self.report,
        };
        fspace_core::envelope_json(<Self as Persist>::KIND, <Self as Persist>::VERSION, &saved)
    }

    /// λ for every curvature coordinate under `prior`.
    pub(crate) fn coordinate_lambdas_of(&self, prior: &PriorPrecision) -> Result<DVector<f64>> {
        let PriorPrecision::PerParameter(values) = prior else {
            return Ok(self.lam_vector(&self.resolve(prior)?));
        };
        if values.len() != self.indices.len() {
            return Err(LaplaceError::Input(InputError::DimensionMismatch {
                what: "per-parameter prior precisions (one per covered parameter)",
                expected: self.indices.len(),
                found: values.len(),
            }));
        }
        for &v in values {
            ensure_positive("prior precision λ", v)?;
        }
        // values are in ascending flat order; coordinate c covers flat index indices[c].
        let mut order: Vec<usize> = (0..self.indices.len()).collect();
        order.sort_by_key(|&c| self.indices[c]);
        let mut lam = DVector::zeros(self.indices.len());
        for (rank, &c) in order.iter().enumerate() {
            lam[c] = values[rank];
        }
        Ok(lam)
    }

    /// For each of the curvature's [`eigenvalues`](Curvature::eigenvalues), the position, in
    /// ascending flat-parameter order of the covered parameters, of the parameter whose λ
    /// `prior` adds to it; `None` where the structure's eigenbasis does not hold under `prior`
    /// ([`Curvature::eigenvalue_owners`]). A λ the structure cannot take is an error.
    pub fn eigenvalue_owners(&self, prior: &PriorPrecision) -> Result<Option<Vec<usize>>> {
        let lam = self.coordinate_lambdas_of(prior)?;
        let Some(owners) = self.curvature.eigenvalue_owners(&lam)? else { return Ok(None) };
        let mut order: Vec<usize> = (0..self.indices.len()).collect();
        order.sort_by_key(|&c| self.indices[c]);
        let mut rank = vec![0; order.len()];
        for (r, &c) in order.iter().enumerate() {
            rank[c] = r;
        }
        Ok(Some(owners.into_iter().map(|c| rank[c]).collect()))
    }

    /// λ for every curvature coordinate as set now.
    pub(crate) fn current_lambdas(&self) -> DVector<f64> {
        match &self.coordinate_lambdas {
            Some(l) => DVector::from_column_slice(l),
            None => self.lam_vector(&self.lambdas),
        }
    }

    fn resolve(&self, prior: &PriorPrecision) -> Result<Vec<f64>> {
        let l = match prior {
            PriorPrecision::Scalar(l) => vec![*l; self.n_groups],
            PriorPrecision::PerLayer(v) => {
                if v.len() != self.n_groups {
                    return Err(LaplaceError::Input(InputError::DimensionMismatch {
                        what: "per-layer prior precisions",
                        expected: self.n_groups,
                        found: v.len(),
                    }));
                }
                v.clone()
            }
            PriorPrecision::PerParameter(_) => {
                return Err(LaplaceError::Input(InputError::Invalid {
                    what: "prior precision",
                    reason: "a per-parameter prior has no per-layer form".into(),
                }))
            }
        };
        for &v in &l {
            ensure_positive("prior precision λ", v)?;
        }
        Ok(l)
    }

    /// Sets the temperature `T > 0`.
    pub fn set_temperature(&mut self, t: f64) -> Result<()> {
        ensure_positive("temperature", t)?;
        self.temperature = t;
        Ok(())
    }

    /// Chooses the predictive of the `Posterior` methods.
    pub fn set_predictive(&mut self, p: Predictive) -> Result<()> {
        if let Predictive::Nonlinear { samples: 0, .. } = p {
            return Err(LaplaceError::Input(InputError::Invalid {
                what: "nonlinear predictive samples",
                reason: "must be ≥ 1".into(),
            }));
        }
        self.predictive = p;
        Ok(())
    }

    fn lam_vector(&self, lambdas: &[f64]) -> DVector<f64> {
        DVector::from_iterator(self.groups.len(), self.groups.iter().map(|&g| lambdas[g]))
    }
}

/// Saves the network, the likelihood, the curvature, λ, `T` and the predictive mode.
impl<N: Network + Serialize + DeserializeOwned> Persist for LaplacePosterior<N> {
    const KIND: &'static str = "fspace_laplace::LaplacePosterior";
    const VERSION: u32 = 2;

    /// The network checked itself while it was read; here: the likelihood against its outputs,
    /// each curvature coordinate a distinct parameter, the prior groups recomputed from the
    /// network's layers, λ, `T` and the predictive's sample count, and the curvature's shapes
    /// against the network's layers (`curvature::check_loaded`).
    fn validate_loaded(&self) -> std::result::Result<(), fspace_core::PersistError> {
        let check = fspace_core::LoadCheck::new(Self::KIND);
        let p = self.net.n_params();
        check.likelihood("likelihood", &self.likelihood, self.net.output_dim())?;
        check.len("indices", self.indices.len(), self.curvature.dim())?;
        let mut seen = vec![false; p];
        for &i in &self.indices {
            check.ensure(i < p && !std::mem::replace(&mut seen[i], true), "indices", || {
                format!("must be distinct parameter indices below {p} ({i} is not)")
            })?;
        }
        let infos = self.net.layer_infos();
        check.ensure(self.n_groups == infos.len().max(1), "n_groups", || {
            format!("is {}, the network has {} layers", self.n_groups, infos.len())
        })?;
        // `indices` are distinct and below p (checked above), and the network's layer ranges lie
        // in 0..p (it checked itself while it was read).
        check.ensure(self.groups == prior_groups(&infos, p, &self.indices), "groups", || {
            "must be the layer of each curvature coordinate".into()
        })?;
        check.len("lambdas", self.lambdas.len(), self.n_groups)?;
        if let Some(l) = &self.coordinate_lambdas {
            check.len("coordinate_lambdas", l.len(), self.indices.len())?;
            for &v in l {
                check.positive("coordinate_lambdas", v)?;
            }
        }
        for &l in &self.lambdas {
            check.positive("lambdas", l)?;
        }
        check.positive("temperature", self.temperature)?;
        check.finite("log_likelihood", [self.log_likelihood].iter())?;
        check.ensure(self.n_data >= 1, "n_data", || "must be ≥ 1".into())?;
        if let Predictive::Nonlinear { samples, .. } = self.predictive {
            check.ensure(samples >= 1, "predictive.Nonlinear.samples", || "must be ≥ 1".into())?;
        }
        crate::curvature::check_loaded(&self.curvature, &check, p, &infos, &self.indices)
    }
}

fn core_err(e: LaplaceError) -> CoreError {
    match e {
        LaplaceError::Core(c) => c,
        other => CoreError::method("Laplace posterior", other),
    }
}

impl<N: Network + Clone> Posterior for LaplacePosterior<N> {
    fn output_dim(&self) -> usize {
        self.net.output_dim()
    }
    fn predict(&self, x: &DMatrix<f64>) -> fspace_core::Result<FunctionPredictive> {
        match self.predictive {
            Predictive::Glm => self.predict_glm(x).map_err(core_err),
            Predictive::Nonlinear { samples, seed } => {
                self.predict_nonlinear(x, samples, &mut StdRng::seed_from_u64(seed)).map_err(core_err)
            }
        }
    }
    fn predict_joint(&self, x: &DMatrix<f64>) -> fspace_core::Result<(DMatrix<f64>, DMatrix<f64>)> {
        fspace_core::ensure_joint_fits(x.nrows(), fspace_core::Posterior::output_dim(self))?;
        let run = || -> Result<(DMatrix<f64>, DMatrix<f64>)> {
            match self.predictive {
                Predictive::Glm => self.glm_joint_in(&self.state(), x),
                Predictive::Nonlinear { samples, seed } => {
                    let draws = self.nonlinear_samples(x, samples, &mut StdRng::seed_from_u64(seed))?;
                    let (mean, _) = moments(&draws);
                    let nq = mean.len();
                    let mut cov = DMatrix::zeros(nq, nq);
                    for d in &draws {
                        let c = DVector::from_fn(nq, |r, _| {
                            d[(r / mean.ncols(), r % mean.ncols())]
                                - mean[(r / mean.ncols(), r % mean.ncols())]
                        });
                        cov.ger(1.0 / draws.len() as f64, &c, &c, 1.0);
                    }
                    Ok((mean, cov))
                }
            }
        };
        let (mean, cov) = run().map_err(core_err)?;
        fspace_core::checked_joint(mean, cov)
    }
    fn sample_functions(
        &self,
        x: &DMatrix<f64>,
        s: usize,
        rng: &mut dyn RngCore,
    ) -> fspace_core::Result<Vec<DMatrix<f64>>> {
        fspace_core::ensure_samples_fit(s, x.nrows(), fspace_core::Posterior::output_dim(self))?;
        let run = |rng: &mut dyn RngCore| -> Result<Vec<DMatrix<f64>>> {
            match self.predictive {
                // Exact linearised samples f(x; w*) + J(x)(θ − w*): the s JVPs share one
                // forward trace (`Network::jvp_blocks`).
                Predictive::Glm => {
                    let mean = forward_chunked(&self.net, x, 256)?;
                    let w = self.net.params();
                    let thetas = self.sample_weights(s, rng)?;
                    let mut dirs = DMatrix::zeros(w.len(), thetas.len());
                    for (mut col, th) in dirs.column_iter_mut().zip(&thetas) {
                        col.copy_from(&(th - &w));
                    }
                    Ok(self.net.jvp_blocks(x, &dirs)?.into_iter().map(|j| &mean + j).collect())
                }
                Predictive::Nonlinear { .. } => self.nonlinear_samples(x, s, rng),
            }
        };
        fspace_core::finite_samples(run(rng).map_err(core_err)?)
    }
    fn likelihood(&self) -> Option<LikelihoodSpec> {
        Some(self.likelihood)
    }
    fn class_probabilities(&self, x: &DMatrix<f64>, link: &Link) -> fspace_core::Result<DMatrix<f64>> {
        self.class_probabilities_inner(x, link).map_err(core_err)
    }
}
