//! The fitted Laplace posterior: GLM and nonlinear predictives, the marginal likelihood and
//! its optimisation, grid searches, sampling, save/load.

use fspace_input::InputError;
use std::time::Instant;

use fspace_core::{
    class_probabilities, CoreError, Data, Fitted, FunctionPredictive, Likelihood, LikelihoodSpec, Link,
    Persist, Posterior,
};
use fspace_nn::Network;
use nalgebra::{DMatrix, DVector};
use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::curvature::{Curvature, CurvatureApprox};
use crate::error::{ensure_positive, LaplaceError, Result};
use crate::fit::{build, data_for, CurvatureSource, FitReport, KronBias, Structure, Weights};

/// The prior precision λ of `N(0, λ⁻¹ I)` on the weights: one value, or one per layer (in
/// [`Network::layer_infos`] order).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum PriorPrecision {
    /// One λ for every weight.
    Scalar(f64),
    /// One λ per layer.
    PerLayer(Vec<f64>),
}

/// How [`Posterior::predict`] and [`Posterior::sample_functions`] predict.
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

/// Options of [`fit`].
///
/// | name | default | purpose |
/// |---|---|---|
/// | `structure` | `Kfac` | curvature structure |
/// | `curvature` | `Ggn` | the GGN, or the empirical Fisher (`CurvatureSource`) |
/// | `weights` | `All` | which weights the posterior covers (`LastLayer`: laplace-torch's `'last_layer'`) |
/// | `kron_bias` | `Folded` | KFAC / EKFAC: bias folded into the input factor, or a separate block (laplace-torch) |
/// | `prior_precision` | `Scalar(1.0)` | λ (laplace-torch's default) |
/// | `temperature` | 1.0 | `T` of the generalised posterior (`T = 1`: Bayes) |
/// | `chunk_points` | 256 | points per Jacobian / statistics chunk (memory `chunk·d'·p`) |
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

/// A fitted (generalised) Laplace approximation `N(w*, (T·C + Λ)⁻¹)` around a network's MAP
/// weights. Conventions (as laplace-torch): the GGN `C` is **summed** over the data, λ is a
/// **precision**, and [`Posterior::predict`] returns the distribution of `f` **without** the
/// observation noise (add σ² with [`predict_y`](Self::predict_y)).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LaplacePosterior<N> {
    net: N,
    likelihood: LikelihoodSpec,
    curvature: Curvature,
    /// Flat network index of each curvature coordinate.
    indices: Vec<usize>,
    /// Prior group (layer) of each curvature coordinate.
    groups: Vec<usize>,
    n_groups: usize,
    lambdas: Vec<f64>,
    temperature: f64,
    /// `log p(D | w*)` (untempered).
    log_likelihood: f64,
    n_data: usize,
    predictive: Predictive,
    report: FitReport,
}

/// The prior group (layer) of each curvature coordinate: the layer whose weight or bias range
/// holds its flat index (group 0 for a network without layer structure).
fn prior_groups(infos: &[fspace_nn::LayerInfo], p: usize, indices: &[usize]) -> Vec<usize> {
    let mut group_of_flat = vec![0usize; p];
    for (g, info) in infos.iter().enumerate() {
        for i in info.weight.clone().chain(info.bias.clone()) {
            group_of_flat[i] = g;
        }
    }
    indices.iter().map(|&i| group_of_flat[i]).collect()
}

fn check_data<N: Network>(net: &N, lik: &dyn Likelihood, x: &DMatrix<f64>, y: &DVector<f64>) -> Result<()> {
    if x.nrows() == 0 {
        return Err(LaplaceError::Input(InputError::Empty { what: "training inputs" }));
    }
    if x.ncols() != net.input_dim() {
        return Err(LaplaceError::Input(InputError::DimensionMismatch {
            what: "input columns",
            expected: net.input_dim(),
            found: x.ncols(),
        }));
    }
    if x.iter().any(|v| !v.is_finite()) {
        return Err(LaplaceError::Input(InputError::NonFinite { what: "training inputs" }));
    }
    if y.len() != x.nrows() * lik.target_dim() {
        return Err(LaplaceError::Input(InputError::DimensionMismatch {
            what: "targets (rows × target_dim)",
            expected: x.nrows() * lik.target_dim(),
            found: y.len(),
        }));
    }
    if y.iter().any(|v| !v.is_finite()) {
        return Err(LaplaceError::Input(InputError::NonFinite { what: "targets" }));
    }
    if lik.output_dim() != net.output_dim() {
        return Err(LaplaceError::Input(InputError::DimensionMismatch {
            what: "likelihood outputs vs network outputs",
            expected: net.output_dim(),
            found: lik.output_dim(),
        }));
    }
    if net.params().iter().any(|v| !v.is_finite()) {
        return Err(LaplaceError::Input(InputError::NonFinite { what: "network weights" }));
    }
    Ok(())
}

/// Forward pass in chunks (bounded memory for CNNs on large sets).
fn forward_chunked<N: Network>(net: &N, x: &DMatrix<f64>, chunk: usize) -> Result<DMatrix<f64>> {
    let mut f = DMatrix::zeros(x.nrows(), net.output_dim());
    for s in (0..x.nrows()).step_by(chunk) {
        let l = chunk.min(x.nrows() - s);
        f.rows_mut(s, l).copy_from(&net.forward(&x.rows(s, l).into_owned())?);
    }
    Ok(f)
}

/// Fits the Laplace approximation around `net`'s current (MAP) weights on `data`'s training
/// set (targets `n × t`, `t` the likelihood's targets per point). The report is also kept in
/// the posterior. Refused with a typed error rather than ignored: a validation set in `data`
/// (pass it to [`LaplacePosterior::gridsearch_prior_precision`] or
/// [`LaplacePosterior::select_temperature`]) and a likelihood that learns σ (the
/// approximation takes σ as given: learn it in MAP training, `fspace_nn::fit_map`).
pub fn fit<N: Network>(
    net: N,
    likelihood: LikelihoodSpec,
    data: &Data,
    config: &LaplaceConfig,
) -> Result<Fitted<LaplacePosterior<N>, FitReport>> {
    let (x, y) = (data.x(), &data.y_flat());
    let start = Instant::now();
    if data.validation().is_some() {
        return Err(LaplaceError::Input(InputError::Invalid {
            what: "validation data",
            reason: "the Laplace fit does not use a validation set; pass it to \
                     gridsearch_prior_precision or select_temperature after the fit"
                .into(),
        }));
    }
    if likelihood.learns_noise() {
        return Err(LaplaceError::Input(InputError::Invalid {
            what: "likelihood",
            reason: "the Laplace approximation takes σ as given (learn: false); learn it with the \
                     network in fspace_nn::fit_map, whose report holds the learned likelihood"
                .into(),
        }));
    }
    ensure_positive("temperature", config.temperature)?;
    if config.chunk_points == 0 {
        return Err(LaplaceError::Input(InputError::Invalid {
            what: "chunk_points",
            reason: "must be ≥ 1".into(),
        }));
    }
    let lik = likelihood.build()?;
    check_data(&net, lik.as_ref(), x, y)?;
    // The sampled structure starts EM from one λ and draws at one (T, λ).
    let lambda0 = match (&config.structure, &config.prior_precision) {
        (Structure::Sampled(_), PriorPrecision::PerLayer(_)) => {
            return Err(LaplaceError::Unsupported {
                structure: "sampled",
                reason: "EM sets one prior precision; pass PriorPrecision::Scalar (its start)".into(),
            })
        }
        (_, PriorPrecision::Scalar(l)) => {
            ensure_positive("prior precision λ", *l)?;
            *l
        }
        (_, PriorPrecision::PerLayer(_)) => 1.0,
    };
    let f = forward_chunked(&net, x, config.chunk_points)?;
    let log_likelihood = -lik.nll(&f, y)?;
    let data = data_for(x, &f, y, lik.as_ref(), config.chunk_points, config.curvature)?;
    let mut report = FitReport::default();
    let (curvature, indices) = build(
        &net,
        &data,
        &config.structure,
        &config.weights,
        config.kron_bias,
        lambda0,
        config.temperature,
        &mut report,
    )?;
    let infos = net.layer_infos();
    let n_groups = infos.len().max(1);
    let groups = prior_groups(&infos, net.n_params(), &indices);
    report.dim = curvature.dim();
    if report.rank == 0 {
        report.rank = curvature.dim();
    }
    report.seconds = start.elapsed().as_secs_f64();
    let mut post = LaplacePosterior {
        net,
        likelihood,
        curvature,
        indices,
        groups,
        n_groups,
        lambdas: vec![1.0; n_groups],
        temperature: config.temperature,
        log_likelihood,
        n_data: x.nrows(),
        predictive: config.predictive.clone(),
        report,
    };
    post.set_prior_precision(config.prior_precision.clone())?;
    if let Curvature::Samples(s) = &post.curvature {
        post.lambdas = vec![s.prior_precision; post.n_groups];
    }
    post.set_predictive(config.predictive.clone())?;
    Ok(Fitted { report: post.report.clone(), posterior: post })
}

/// Options of [`LaplacePosterior::optimize_prior_precision`].
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

/// Maximises `f(log λ)` on `[lo, hi]`: the best point of a log-spaced grid, then golden-section
/// search between its neighbours (the Laplace evidence is unimodal in λ for every structure
/// here, and the grid guards against a poor bracket otherwise).
fn maximise_log(f: &mut dyn FnMut(f64) -> Result<f64>, lo: f64, hi: f64, grid: usize) -> Result<f64> {
    let (a, b) = (lo.ln(), hi.ln());
    let pts: Vec<f64> = (0..grid).map(|i| a + (b - a) * i as f64 / (grid - 1) as f64).collect();
    let mut vals = Vec::with_capacity(grid);
    for &t in &pts {
        vals.push(f(t.exp())?);
    }
    let best = (0..grid).max_by(|&i, &j| vals[i].total_cmp(&vals[j])).expect("grid ≥ 3");
    let (mut l, mut r) = (pts[best.saturating_sub(1)], pts[(best + 1).min(grid - 1)]);
    let g = (5f64.sqrt() - 1.0) / 2.0;
    let (mut c, mut d) = (r - g * (r - l), l + g * (r - l));
    let (mut fc, mut fd) = (f(c.exp())?, f(d.exp())?);
    while r - l > 1e-7 {
        if fc > fd {
            r = d;
            d = c;
            fd = fc;
            c = r - g * (r - l);
            fc = f(c.exp())?;
        } else {
            l = c;
            c = d;
            fc = fd;
            d = l + g * (r - l);
            fd = f(d.exp())?;
        }
    }
    let m = 0.5 * (l + r);
    Ok(if f(m.exp())? >= vals[best] { m.exp() } else { pts[best].exp() })
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

    /// Sets λ (scalar, or one per layer); errors on λ ≤ 0 or a wrong count.
    pub fn set_prior_precision(&mut self, prior: PriorPrecision) -> Result<()> {
        self.lambdas = self.resolve(&prior)?;
        Ok(())
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

    /// The Laplace log marginal likelihood at `λ`, `T` (laplace-torch's
    /// `log_likelihood − ½(log_det_ratio + scatter)`, tempered):
    ///
    /// `log Z = T·log p(D | w*) − ½ Σ λᵢ w*ᵢ² + ½ Σ log λᵢ − ½ log |T·C + Λ|`
    ///
    /// over the weights the structure covers (the last layer for last-layer Laplace).
    pub fn log_marginal_likelihood_at(&self, prior: &PriorPrecision, t: f64) -> Result<f64> {
        ensure_positive("temperature", t)?;
        let lambdas = self.resolve(prior)?;
        let lam = self.lam_vector(&lambdas);
        let w = self.net.params();
        let scatter: f64 = self.indices.iter().zip(lam.iter()).map(|(&i, l)| l * w[i] * w[i]).sum();
        let log_prior_det: f64 = lam.iter().map(|l| l.ln()).sum();
        let log_det = self.curvature.log_det_precision(t, &lam)?;
        Ok(t * self.log_likelihood - 0.5 * scatter + 0.5 * log_prior_det - 0.5 * log_det)
    }

    /// [`log_marginal_likelihood_at`](Self::log_marginal_likelihood_at) the current λ and T.
    pub fn log_marginal_likelihood(&self) -> Result<f64> {
        self.log_marginal_likelihood_at(&PriorPrecision::PerLayer(self.lambdas.clone()), self.temperature)
    }

    /// Sets λ to the maximiser of the log marginal likelihood (laplace-torch's
    /// `optimize_prior_precision(method='marglik')`). Each candidate costs one
    /// `log |T·C + Λ|`: `O(#eigenvalues)` for every structure with a scalar λ (full, last-layer,
    /// low-rank: the GGN's eigenvalues; KFAC/EKFAC: the Kronecker eigenvalues; diagonal,
    /// B-Diag: the stored eigenvalues), `O(dim·k²)` through Woodbury otherwise.
    /// Returns the log marginal likelihood at the optimum.
    pub fn optimize_prior_precision(&mut self, config: &MarglikConfig) -> Result<f64> {
        let (lo, hi) = config.bounds;
        ensure_positive("λ search lower bound", lo)?;
        if !(hi > lo && hi.is_finite()) {
            return Err(LaplaceError::Input(InputError::Invalid {
                what: "λ search bounds",
                reason: format!("need 0 < lo < hi, got ({lo}, {hi})"),
            }));
        }
        if config.grid_points < 3 {
            return Err(LaplaceError::Input(InputError::Invalid {
                what: "marglik grid_points",
                reason: "must be ≥ 3".into(),
            }));
        }
        let t = self.temperature;
        if !config.per_layer || self.n_groups == 1 {
            let best = maximise_log(
                &mut |l| self.log_marginal_likelihood_at(&PriorPrecision::Scalar(l), t),
                lo,
                hi,
                config.grid_points,
            )?;
            self.lambdas = vec![best; self.n_groups];
        } else {
            for _ in 0..config.sweeps.max(1) {
                for g in 0..self.n_groups {
                    let current = self.lambdas.clone();
                    let best = maximise_log(
                        &mut |l| {
                            let mut v = current.clone();
                            v[g] = l;
                            self.log_marginal_likelihood_at(&PriorPrecision::PerLayer(v), t)
                        },
                        lo,
                        hi,
                        config.grid_points,
                    )?;
                    self.lambdas[g] = best;
                }
            }
        }
        self.log_marginal_likelihood()
    }

    /// Per-point `d' × d'` GLM covariances `J(xᵢ) Σ J(xᵢ)ᵀ` at the current λ, T.
    pub fn glm_covariances(&self, x: &DMatrix<f64>) -> Result<Vec<DMatrix<f64>>> {
        let lam = self.lam_vector(&self.lambdas);
        let t = self.temperature;
        let q = self.net.output_dim();
        let chunk = GLM_CHUNK;
        let layered = !self.net.layer_infos().is_empty();
        let all_params = self.indices.len() == self.net.n_params()
            && self.indices.iter().enumerate().all(|(a, &b)| a == b);
        let iso = self.lambdas.iter().all(|&l| l == self.lambdas[0]);
        let mut out = Vec::with_capacity(x.nrows());
        for s in (0..x.nrows()).step_by(chunk) {
            let l = chunk.min(x.nrows() - s);
            let xc = x.rows(s, l).into_owned();
            if let Some(covs) = self.layered_covariances(&[(lam.clone(), t)], &xc) {
                out.extend(covs?.swap_remove(0));
                continue;
            }
            match &self.curvature {
                Curvature::Samples(sc) => {
                    sc.check(t, &lam)?;
                    // J(xᵢ) Z Zᵀ J(xᵢ)ᵀ / K from the draws' JVPs.
                    let jz = self.net.jvp_columns(&xc, &sc.samples)?;
                    let k = sc.samples.ncols() as f64;
                    out.extend((0..l).map(|i| {
                        let r = jz.rows(i * q, q);
                        r * r.transpose() / k
                    }));
                }
                Curvature::Eigen(e) if layered && all_params && iso && e.remainder.is_none() => {
                    let l = self.lambdas[0];
                    let c = e.values.map(|s| 1.0 / (t * s.max(0.0) + l) - 1.0 / l);
                    out.extend(crate::predict::eigen_covariances(&self.net, &e.vectors, &c, l, &xc)?)
                }
                Curvature::Eigen(e) if e.label == "last_layer" && iso && e.remainder.is_none() => {
                    let l = self.lambdas[0];
                    let c = e.values.map(|s| 1.0 / (t * s.max(0.0) + l) - 1.0 / l);
                    out.extend(crate::predict::last_layer_covariances(&self.net, &e.vectors, &c, l, &xc)?)
                }
                Curvature::Eigen(e) if e.label == "last_layer" => {
                    let js = crate::predict::last_layer_jacobian(&self.net, &xc)?;
                    out.extend(crate::predict::blocks(
                        &js,
                        &self.curvature.solve(t, &lam, &js.transpose())?,
                        q,
                    ));
                }
                _ => {
                    let jac = self.net.jacobian(&xc)?;
                    let js = if all_params { jac } else { jac.select_columns(&self.indices) };
                    out.extend(crate::predict::blocks(
                        &js,
                        &self.curvature.solve(t, &lam, &js.transpose())?,
                        q,
                    ));
                }
            }
        }
        Ok(out)
    }

    /// Covariances from layer statistics (KFAC, EKFAC, the layered diagonal structure) for each
    /// `(λ, T)` of `settings`, sharing the statistics; `None` for the other structures.
    fn layered_covariances(
        &self,
        settings: &[(DVector<f64>, f64)],
        x: &DMatrix<f64>,
    ) -> Option<Result<Vec<Vec<DMatrix<f64>>>>> {
        match &self.curvature {
            Curvature::Kron(k) => Some(crate::predict::kron_covariances(&self.net, k, settings, x)),
            Curvature::Diag(d) if !self.net.layer_infos().is_empty() => {
                Some(crate::predict::diag_covariances(&self.net, &d.diag, settings, x))
            }
            _ => None,
        }
    }

    /// The GLM predictive of `f` (mean `f(x; w*)`, marginal variances).
    pub fn predict_glm(&self, x: &DMatrix<f64>) -> Result<FunctionPredictive> {
        let mean = forward_chunked(&self.net, x, GLM_CHUNK)?;
        marginals(mean, &self.glm_covariances(x)?)
    }

    /// `s` weight draws `θ ~ N(w*, Σ)` as flat parameter vectors.
    pub fn sample_weights(&self, s: usize, rng: &mut dyn RngCore) -> Result<Vec<DVector<f64>>> {
        if s == 0 {
            return Err(LaplaceError::Input(InputError::Invalid {
                what: "number of samples",
                reason: "must be ≥ 1".into(),
            }));
        }
        let lam = self.lam_vector(&self.lambdas);
        let z = self.curvature.sample(self.temperature, &lam, s, rng)?;
        let w = self.net.params();
        Ok((0..s)
            .map(|j| {
                let mut th = w.clone();
                for (c, &i) in self.indices.iter().enumerate() {
                    th[i] += z[(c, j)];
                }
                th
            })
            .collect())
    }

    /// Function values of the network at `s` weight samples (the nonlinear predictive's draws).
    pub fn nonlinear_samples(
        &self,
        x: &DMatrix<f64>,
        s: usize,
        rng: &mut dyn RngCore,
    ) -> Result<Vec<DMatrix<f64>>>
    where
        N: Clone,
    {
        let mut net = self.net.clone();
        let mut out = Vec::with_capacity(s);
        for th in self.sample_weights(s, rng)? {
            net.set_params(&th)?;
            out.push(forward_chunked(&net, x, 256)?);
        }
        Ok(out)
    }

    /// The nonlinear Monte-Carlo predictive's moments from `s` weight samples.
    pub fn predict_nonlinear(
        &self,
        x: &DMatrix<f64>,
        s: usize,
        rng: &mut dyn RngCore,
    ) -> Result<FunctionPredictive>
    where
        N: Clone,
    {
        let draws = self.nonlinear_samples(x, s, rng)?;
        let (mean, var) = moments(&draws);
        Ok(FunctionPredictive::new(mean, var)?)
    }

    /// Class probabilities (`n × C`): GLM with the given link approximation (laplace-torch's
    /// `link_approx`: probit, Laplace bridge, MC), or — in the nonlinear mode — the average of
    /// the softmax (sigmoid) over the weight samples.
    fn class_probabilities_inner(&self, x: &DMatrix<f64>, link: &Link) -> Result<DMatrix<f64>>
    where
        N: Clone,
    {
        fspace_core::ensure_classifier(Some(self.likelihood))?;
        match self.predictive {
            Predictive::Glm => Ok(class_probabilities(&self.predict_glm(x)?, link)?),
            Predictive::Nonlinear { samples, seed } => {
                let draws = self.nonlinear_samples(x, samples, &mut StdRng::seed_from_u64(seed))?;
                let zero = DMatrix::zeros(x.nrows(), draws[0].ncols());
                let mut acc: Option<DMatrix<f64>> = None;
                for d in &draws {
                    let p = class_probabilities(
                        &FunctionPredictive { mean: d.clone(), var: zero.clone() },
                        &Link::Probit,
                    )?;
                    acc = Some(match acc {
                        Some(a) => a + p,
                        None => p,
                    });
                }
                Ok(acc.expect("samples ≥ 1") / draws.len() as f64)
            }
        }
    }

    /// The negative log predictive density per point of `(x, y)` (mean over points): Gaussian
    /// `−log N(y; μ, v + σ²)`; classification `−log p(y)` with probit class probabilities (or the
    /// nonlinear mode's MC average).
    pub fn predictive_nll(&self, x: &DMatrix<f64>, y: &DVector<f64>) -> Result<f64>
    where
        N: Clone,
    {
        if x.nrows() == 0 {
            return Err(LaplaceError::Input(InputError::Empty { what: "validation inputs" }));
        }
        if self.is_regression() {
            gaussian_nll(&Posterior::predict_y(self, x)?, y)
        } else {
            check_label_count(x, y)?;
            categorical_nll(&self.class_probabilities_inner(x, &Link::Probit)?, y)
        }
    }

    /// Sets λ to the grid value with the lowest validation NLL (laplace-torch's
    /// `optimize_prior_precision(method='gridsearch')`); returns `(λ, NLL)` per candidate.
    /// Under the GLM predictive with a KFAC, EKFAC or diagonal curvature, the candidates share
    /// one forward pass and one set of layer statistics at `x_val` (each NLL is still the one
    /// [`predictive_nll`](Self::predictive_nll) gives at that λ).
    pub fn gridsearch_prior_precision(
        &mut self,
        grid: &[f64],
        x_val: &DMatrix<f64>,
        y_val: &DVector<f64>,
    ) -> Result<Vec<(f64, f64)>>
    where
        N: Clone,
    {
        self.gridsearch(grid, x_val, y_val, |post, v| post.set_prior_precision(PriorPrecision::Scalar(v)))
    }

    /// Sets `T` to the grid value with the lowest validation NLL; returns `(T, NLL)` per
    /// candidate (sharing the statistics as
    /// [`gridsearch_prior_precision`](Self::gridsearch_prior_precision)).
    pub fn select_temperature(
        &mut self,
        grid: &[f64],
        x_val: &DMatrix<f64>,
        y_val: &DVector<f64>,
    ) -> Result<Vec<(f64, f64)>>
    where
        N: Clone,
    {
        self.gridsearch(grid, x_val, y_val, |post, v| post.set_temperature(v))
    }

    /// The GLM predictives of `f` at `x` under every grid value (`set` applies one), for
    /// `gridsearch`: with a Kronecker or layered diagonal curvature, only the inverse precisions
    /// depend on `(λ, T)`, so the forward pass, the layer statistics and their projections are
    /// computed once for all candidates, each candidate's numbers those of its own
    /// [`predict_glm`](Self::predict_glm). `None` for the other structures and the nonlinear mode.
    fn shared_glm_predictives(
        &mut self,
        grid: &[f64],
        x: &DMatrix<f64>,
        set: &impl Fn(&mut Self, f64) -> Result<()>,
    ) -> Result<Option<Vec<FunctionPredictive>>> {
        if self.predictive != Predictive::Glm || x.nrows() == 0 {
            return Ok(None);
        }
        let mut settings = Vec::with_capacity(grid.len());
        for &v in grid {
            set(self, v)?;
            settings.push((self.lam_vector(&self.lambdas), self.temperature));
        }
        let mut covs = vec![Vec::with_capacity(x.nrows()); settings.len()];
        for s in (0..x.nrows()).step_by(GLM_CHUNK) {
            let xc = x.rows(s, GLM_CHUNK.min(x.nrows() - s)).into_owned();
            // Other structures leave at the first chunk, before any statistics are computed.
            let Some(chunk) = self.layered_covariances(&settings, &xc) else {
                return Ok(None);
            };
            for (all, part) in covs.iter_mut().zip(chunk?) {
                all.extend(part);
            }
        }
        let mean = forward_chunked(&self.net, x, GLM_CHUNK)?;
        Ok(Some(covs.iter().map(|c| marginals(mean.clone(), c)).collect::<Result<Vec<_>>>()?))
    }

    fn gridsearch(
        &mut self,
        grid: &[f64],
        x_val: &DMatrix<f64>,
        y_val: &DVector<f64>,
        set: impl Fn(&mut Self, f64) -> Result<()>,
    ) -> Result<Vec<(f64, f64)>>
    where
        N: Clone,
    {
        if grid.is_empty() {
            return Err(LaplaceError::Input(InputError::Empty { what: "grid" }));
        }
        if !self.is_regression() {
            check_label_count(x_val, y_val)?;
        }
        let mut out = Vec::with_capacity(grid.len());
        match self.shared_glm_predictives(grid, x_val, &set)? {
            Some(predictives) => {
                for (&v, p) in grid.iter().zip(predictives) {
                    let nll = if self.is_regression() {
                        gaussian_nll(&fspace_core::observation_predictive(&self.likelihood, p)?, y_val)?
                    } else {
                        let probs = class_probabilities(&p, &Link::Probit)?;
                        categorical_nll(&probs, y_val)?
                    };
                    out.push((v, nll));
                }
            }
            None => {
                for &v in grid {
                    set(self, v)?;
                    out.push((v, self.predictive_nll(x_val, y_val)?));
                }
            }
        }
        let best = out.iter().filter(|(_, n)| n.is_finite()).min_by(|a, b| a.1.total_cmp(&b.1)).ok_or(
            LaplaceError::Input(InputError::NonFinite { what: "validation NLL of every grid value" }),
        )?;
        set(self, best.0)?;
        Ok(out)
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

/// Sample mean and (biased) variance of function draws, summed in draw order.
pub(crate) fn moments(draws: &[DMatrix<f64>]) -> (DMatrix<f64>, DMatrix<f64>) {
    let s = draws.len() as f64;
    let mean = draws.iter().fold(DMatrix::zeros(draws[0].nrows(), draws[0].ncols()), |a, d| a + d) / s;
    let var =
        draws.iter().fold(DMatrix::zeros(mean.nrows(), mean.ncols()), |a, d| a + (d - &mean).map(|v| v * v))
            / s;
    (mean, var)
}

/// Points per chunk of the GLM predictive (forward pass and layer statistics).
const GLM_CHUNK: usize = 256;

/// The GLM predictive from the mean and the per-point covariances: their diagonals, clamped at 0.
fn marginals(mean: DMatrix<f64>, covs: &[DMatrix<f64>]) -> Result<FunctionPredictive> {
    let var = DMatrix::from_fn(mean.nrows(), mean.ncols(), |i, o| covs[i][(o, o)].max(0.0));
    Ok(FunctionPredictive::new(mean, var)?)
}

/// `−log N(y; μ, v)` per point (mean over points) of a predictive of `y` (`n × q`, `y`
/// point-major).
fn gaussian_nll(p: &FunctionPredictive, y: &DVector<f64>) -> Result<f64> {
    let (n, q) = p.mean.shape();
    if y.len() != n * q {
        return Err(LaplaceError::Input(InputError::DimensionMismatch {
            what: "validation targets",
            expected: n * q,
            found: y.len(),
        }));
    }
    let mut total = 0.0;
    for i in 0..n {
        for o in 0..q {
            let (m, v) = (p.mean[(i, o)], p.var[(i, o)]);
            total += 0.5 * ((2.0 * std::f64::consts::PI * v).ln() + (y[i * q + o] - m).powi(2) / v);
        }
    }
    Ok(total / n as f64)
}

/// One validation label per input row (checked before any prediction is computed).
fn check_label_count(x: &DMatrix<f64>, y: &DVector<f64>) -> Result<()> {
    if y.len() != x.nrows() {
        return Err(LaplaceError::Input(InputError::DimensionMismatch {
            what: "validation labels",
            expected: x.nrows(),
            found: y.len(),
        }));
    }
    Ok(())
}

/// `−log p(y)` per point (mean over points) from class probabilities (`n × C`, one label per
/// row: [`check_label_count`]).
fn categorical_nll(probs: &DMatrix<f64>, y: &DVector<f64>) -> Result<f64> {
    let n = probs.nrows();
    let mut total = 0.0;
    for i in 0..n {
        let c = y[i] as usize;
        if c >= probs.ncols() {
            return Err(LaplaceError::Input(InputError::Invalid {
                what: "validation label",
                reason: format!("{} is not a class index", y[i]),
            }));
        }
        total -= probs[(i, c)].max(1e-300).ln();
    }
    Ok(total / n as f64)
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
        let run = || -> Result<(DMatrix<f64>, DMatrix<f64>)> {
            match self.predictive {
                Predictive::Glm => {
                    let mean = forward_chunked(&self.net, x, 256)?;
                    let js = crate::predict::subset_jacobian(&self.net, &self.curvature, &self.indices, x)?;
                    let lam = self.lam_vector(&self.lambdas);
                    let sj = self.curvature.solve(self.temperature, &lam, &js.transpose())?;
                    let cov = &js * sj;
                    Ok((mean, (&cov + cov.transpose()) * 0.5))
                }
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
        run().map_err(core_err)
    }
    fn sample_functions(
        &self,
        x: &DMatrix<f64>,
        s: usize,
        rng: &mut dyn RngCore,
    ) -> fspace_core::Result<Vec<DMatrix<f64>>> {
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
