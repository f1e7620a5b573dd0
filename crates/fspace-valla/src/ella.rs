//! ELLA (Deng, Zhou & Zhu 2022, "Accelerated linearized Laplace approximation"), VaLLA's main
//! scalable baseline: Nyström features of the NTK and the Laplace posterior in that space.
//!
//! From `M` random training points `X_M` (each with one output: the only output for
//! regression, a uniformly drawn class otherwise — the `M·C × M·C` multi-output kernel of
//! MNIST, 20 000², does not fit), the unit NTK `κ̂(X_M, X_M) = U Λ Uᵀ` gives `K` orthonormal
//! parameter directions `v_k = J(X_M)ᵀ u_k / √λ_k` (the top eigenvectors), and the features
//! `φ_k(x) = J(x) v_k` (one JVP each) satisfy `φ(x)ᵀφ(x') = κ̂(x, X_M) κ̂_M⁺ κ̂(X_M, x')` on the
//! kept spectrum. The linearised model `f(x) = g(x) + Φ(x) β`, `β ~ N(0, σ₀² I)`, has the
//! Laplace posterior precision `P = Σᵢ Φᵢᵀ Hᵢ Φᵢ + λ I` (`λ = 1/σ₀²`, `Hᵢ` the likelihood
//! Hessian at the MAP) and predictive covariance `Φ(x) P⁻¹ Φ(x)ᵀ`. With `G = Q D Qᵀ` stored,
//! any `λ` costs `O(K)`: the prior precision is chosen on a validation set (or given).
//!
//! With `M = n` and every eigenvector the features span the data exactly, so ELLA equals the
//! exact linearised-Laplace GP at the training inputs; at a test point it misses exactly the
//! Nyström residual `σ₀² (κ̂(x, x) − κ̂(x, X) κ̂_X⁻¹ κ̂(X, x))` (tested).

use fspace_input::InputError;
use std::time::Instant;

use fspace_core::likelihood::softmax;
use fspace_core::{
    ClassProbMethod, Data, Fitted, FunctionPredictive, LikelihoodSpec, Persist, PersistError, Posterior,
};
use fspace_linalg::sym_eigh;
use fspace_nn::{Network, Outputs};
use nalgebra::{DMatrix, DVector};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::data::{check_data, check_likelihood, marginals, mean_nll_from_blocks, to_core};
use crate::error::{ensure_positive, Result, VallaError};
use crate::objective::VallaLikelihood;

/// How ELLA's prior precision `λ = 1/σ₀²` is set.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum EllaPrior {
    /// A given `λ > 0`.
    Fixed(f64),
    /// The `λ` of a log-spaced grid with the lowest validation NLL (Deng et al. tune it on
    /// validation data).
    Validation {
        /// Smallest λ of the grid.
        min: f64,
        /// Largest λ.
        max: f64,
        /// Grid points (≥ 2).
        points: usize,
    },
}

/// How ELLA evaluates its features `φ(x) = J(x) V` (same numbers, different cost).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FeatureRoute {
    /// The cheaper of the two by the operation counts below.
    Auto,
    /// `K` JVPs along stored directions (`O(K·p)` per point; any network).
    Jvp,
    /// The NTK block against the Nyström points (`O(d'·M·Σ widths)` per point).
    Kernel,
}

/// Options of [`fit_ella`]; `Default` is §5.3's MNIST setting.
///
/// | name | default | purpose |
/// |---|---|---|
/// | `num_points` | 2 000 | `M`, random training points of the Nyström approximation |
/// | `num_eigen` | 20 | `K`, eigenvectors kept (Deng et al.'s default) |
/// | `prior` | validation grid `10⁻⁴ … 10⁴`, 41 points | prior precision |
/// | `seed` | 0 | choice of the points and their outputs |
/// | `route` | `Auto` | feature evaluation ([`FeatureRoute`]) |
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EllaConfig {
    /// Nyström points `M`.
    pub num_points: usize,
    /// Eigenvectors `K` (≤ `M`).
    pub num_eigen: usize,
    /// Prior precision choice.
    pub prior: EllaPrior,
    /// Seed.
    pub seed: u64,
    /// Feature evaluation.
    pub route: FeatureRoute,
}

impl Default for EllaConfig {
    fn default() -> Self {
        Self {
            num_points: 2000,
            num_eigen: 20,
            prior: EllaPrior::Validation { min: 1e-4, max: 1e4, points: 41 },
            seed: 0,
            route: FeatureRoute::Auto,
        }
    }
}

/// How the features `φ(x) = J(x) V` are evaluated: the same numbers by two routes.
#[derive(Debug, Clone, Serialize, Deserialize)]
enum FeatureMap {
    /// `K` JVPs along stored parameter directions `V = J(X_M)ᵀ U Λ^{-1/2}` (`p × K`): cost
    /// `O(K·p)` per point; any network.
    Directions(DMatrix<f64>),
    /// `κ̂(x, X_M) U Λ^{-1/2}` through the network's NTK block: cost `O(d'·M·Σ widths)` per
    /// point, cheaper when `M` is small against `K·p / Σ widths` (the toy: `M = K = 20`).
    Kernel {
        /// The Nyström points.
        points: DMatrix<f64>,
        /// Their outputs.
        outputs: Vec<usize>,
        /// `U Λ^{-1/2}` (`M × K`).
        coefficients: DMatrix<f64>,
    },
}

impl FeatureMap {
    /// `Φ(X)` (`n·d' × K`, rows point-major).
    fn eval<N: Network>(&self, net: &N, x: &DMatrix<f64>) -> Result<DMatrix<f64>> {
        match self {
            Self::Directions(v) => features(net, x, v),
            Self::Kernel { points, outputs, coefficients } => {
                Ok(net.ntk_block(x, Outputs::All, points, Outputs::One(outputs))? * coefficients)
            }
        }
    }
}

/// A fitted ELLA posterior.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EllaPosterior<N> {
    net: N,
    likelihood: VallaLikelihood,
    /// The features `φ(x) = J(x) V`.
    feature_map: FeatureMap,
    /// Eigenvalues `D` of `G = Σ ΦᵢᵀHᵢΦᵢ` (descending).
    ggn_eigenvalues: DVector<f64>,
    /// Their eigenvectors `Q` (`K × K`).
    ggn_eigenvectors: DMatrix<f64>,
    prior_precision: f64,
    /// Validation NLL per grid λ (empty for a fixed λ).
    grid: Vec<(f64, f64)>,
    seconds: f64,
}

/// Features `Φ(X)` (`n·d' × K`, rows point-major) by one JVP per direction.
fn features<N: Network>(net: &N, x: &DMatrix<f64>, directions: &DMatrix<f64>) -> Result<DMatrix<f64>> {
    let q = net.output_dim();
    let mut phi = DMatrix::zeros(x.nrows() * q, directions.ncols());
    for k in 0..directions.ncols() {
        let f = net.jvp(x, &directions.column(k).into_owned())?;
        for i in 0..x.nrows() {
            for o in 0..q {
                phi[(i * q + o, k)] = f[(i, o)];
            }
        }
    }
    Ok(phi)
}

/// Per-point likelihood Hessians `Hᵢ` at the MAP outputs.
fn hessian(likelihood: VallaLikelihood, g: &[f64]) -> DMatrix<f64> {
    match likelihood {
        VallaLikelihood::Gaussian { noise_std } => DMatrix::from_element(1, 1, 1.0 / (noise_std * noise_std)),
        VallaLikelihood::Categorical => {
            let p = DVector::from_vec(softmax(g));
            DMatrix::from_diagonal(&p) - &p * p.transpose()
        }
    }
}

/// Fits ELLA to a trained network. `validation` is required for [`EllaPrior::Validation`].
/// Errors: bad data or labels, `M > n`, `K = 0` or `K > M`, a non-positive fixed λ, an empty
/// validation set.
///
/// Targets are `n × 1`; the validation set of `data` is used by [`EllaPrior::Validation`].
pub fn fit_ella<N: Network + Clone>(
    net: N,
    likelihood: LikelihoodSpec,
    data: &Data,
    config: &EllaConfig,
) -> Result<Fitted<EllaPosterior<N>, EllaReport>> {
    let (x, y) = (data.x(), &data.y_flat());
    let val_flat = data.validation_flat();
    let validation = val_flat.as_ref().map(|(xv, yv)| (*xv, yv));
    let post = fit_ella_inner(net, likelihood, x, y, validation, config)?;
    let report = EllaReport {
        prior_precision: post.prior_precision,
        num_features: post.num_features(),
        grid: post.grid.clone(),
        seconds: post.seconds,
    };
    Ok(Fitted { posterior: post, report })
}

/// What an ELLA fit did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EllaReport {
    /// The prior precision `λ` chosen (or given).
    pub prior_precision: f64,
    /// Features `K` kept.
    pub num_features: usize,
    /// Validation NLL per grid `λ` (empty for a fixed λ).
    pub grid: Vec<(f64, f64)>,
    /// Wall-clock seconds of the fit.
    pub seconds: f64,
}

fn fit_ella_inner<N: Network + Clone>(
    net: N,
    likelihood: LikelihoodSpec,
    x: &DMatrix<f64>,
    y: &DVector<f64>,
    validation: Option<(&DMatrix<f64>, &DVector<f64>)>,
    config: &EllaConfig,
) -> Result<EllaPosterior<N>> {
    let start = Instant::now();
    let likelihood = VallaLikelihood::from_spec(&likelihood, net.output_dim())?;
    check_data(&net, likelihood, x, y, "training data")?;
    let (n, q) = (x.nrows(), net.output_dim());
    let m = config.num_points;
    if m == 0 || config.num_eigen == 0 {
        return Err(VallaError::Input(InputError::Invalid {
            what: "ELLA num_points / num_eigen",
            reason: "must be ≥ 1".into(),
        }));
    }
    if m > n {
        return Err(VallaError::TooManyPoints { what: "ELLA Nyström points", requested: m, available: n });
    }
    if config.num_eigen > m {
        return Err(VallaError::TooManyPoints {
            what: "ELLA eigenvectors (K ≤ M)",
            requested: config.num_eigen,
            available: m,
        });
    }
    match &config.prior {
        EllaPrior::Fixed(l) => ensure_positive("ELLA prior precision", *l)?,
        EllaPrior::Validation { min, max, points } => {
            ensure_positive("ELLA grid min", *min)?;
            ensure_positive("ELLA grid max", *max)?;
            if *points < 2 || min >= max {
                return Err(VallaError::Input(InputError::Invalid {
                    what: "ELLA grid",
                    reason: "need min < max and ≥ 2 points".into(),
                }));
            }
            match validation {
                None => {
                    return Err(VallaError::Input(InputError::Empty {
                        what: "validation data (ELLA's prior precision is chosen on it)",
                    }))
                }
                Some((xv, yv)) => check_data(&net, likelihood, xv, yv, "validation data")?,
            }
        }
    }
    let mut rng = StdRng::seed_from_u64(config.seed);
    let mut idx = rand::seq::index::sample(&mut rng, n, m).into_vec();
    idx.sort_unstable();
    let outputs: Vec<usize> = (0..m).map(|_| if q == 1 { 0 } else { rng.gen_range(0..q) }).collect();
    let xm = x.select_rows(&idx);
    let sel = Outputs::One(&outputs);
    let km = net.ntk_block(&xm, sel, &xm, sel)?;
    let (lam, u) = sym_eigh(&((&km + km.transpose()) * 0.5))?;
    let top = lam[0].max(0.0);
    let k = (0..config.num_eigen).take_while(|&j| lam[j] > 1e-10 * top).count();
    if k == 0 {
        return Err(VallaError::NotPositiveDefinite {
            what: "ELLA's NTK at the Nyström points (all eigenvalues ≈ 0)",
        });
    }
    // Per point: the kernel route costs ~d'·M·Σ widths, K JVPs ~2·K·p (`Σ widths` from the
    // layer structure; networks without it take the JVP route).
    let widths: usize = net.layer_infos().iter().map(|l| l.fan_in + l.fan_out).sum();
    let kernel_route = match config.route {
        FeatureRoute::Auto => widths > 0 && q * m * widths <= 2 * k * net.n_params(),
        FeatureRoute::Jvp => false,
        FeatureRoute::Kernel => true,
    };
    let feature_map = if kernel_route {
        let coefficients = DMatrix::from_fn(m, k, |r, j| u[(r, j)] / lam[j].sqrt());
        FeatureMap::Kernel { points: xm, outputs, coefficients }
    } else {
        let mut directions = DMatrix::zeros(net.n_params(), k);
        for j in 0..k {
            let cot =
                DMatrix::from_fn(m, q, |r, o| if o == outputs[r] { u[(r, j)] / lam[j].sqrt() } else { 0.0 });
            directions.set_column(j, &net.vjp(&xm, &cot)?);
        }
        FeatureMap::Directions(directions)
    };
    let mut ggn = DMatrix::zeros(k, k);
    for s in (0..n).step_by(512) {
        let len = 512.min(n - s);
        let xs = x.rows(s, len).into_owned();
        let g = net.forward(&xs)?;
        let phi = feature_map.eval(&net, &xs)?;
        for i in 0..len {
            let h = hessian(likelihood, g.row(i).transpose().as_slice());
            let pi = phi.rows(i * q, q);
            ggn += pi.transpose() * h * pi;
        }
    }
    let (d, qv) = sym_eigh(&((&ggn + ggn.transpose()) * 0.5))?;
    let mut post = EllaPosterior {
        net,
        likelihood,
        feature_map,
        ggn_eigenvalues: d.map(|v| v.max(0.0)),
        ggn_eigenvectors: qv,
        prior_precision: 1.0,
        grid: Vec::new(),
        seconds: 0.0,
    };
    match config.prior {
        EllaPrior::Fixed(l) => post.prior_precision = l,
        EllaPrior::Validation { min, max, points } => {
            let (xv, yv) = validation.expect("checked above");
            let g = post.net.forward(xv)?;
            let phi = post.feature_map.eval(&post.net, xv)?;
            let rot = phi * &post.ggn_eigenvectors; // n·q × K, in G's eigenbasis
            let mut best = (f64::INFINITY, 1.0);
            for t in 0..points {
                let lam = (min.ln() + (max.ln() - min.ln()) * t as f64 / (points - 1) as f64).exp();
                post.prior_precision = lam;
                let nll = post.nll_from_rotated(&g, &rot, yv)?;
                post.grid.push((lam, nll));
                if nll < best.0 {
                    best = (nll, lam);
                }
            }
            post.prior_precision = best.1;
        }
    }
    post.seconds = start.elapsed().as_secs_f64();
    Ok(post)
}

impl<N: Network + Clone> EllaPosterior<N> {
    /// The prior precision `λ = 1/σ₀²` in use.
    pub fn prior_precision(&self) -> f64 {
        self.prior_precision
    }
    /// Number of features `K` kept.
    pub fn num_features(&self) -> usize {
        self.ggn_eigenvalues.len()
    }
    /// Validation NLL per grid `λ` (empty for a fixed λ).
    pub fn grid(&self) -> &[(f64, f64)] {
        &self.grid
    }
    /// Wall-clock seconds of the fit.
    pub fn seconds(&self) -> f64 {
        self.seconds
    }
    /// Replaces the prior precision (`λ > 0`).
    pub fn set_prior_precision(&mut self, lambda: f64) -> Result<()> {
        ensure_positive("ELLA prior precision", lambda)?;
        self.prior_precision = lambda;
        Ok(())
    }

    /// Per-point covariances from features rotated into `G`'s eigenbasis.
    fn blocks_from_rotated(&self, rot: &DMatrix<f64>) -> Vec<DMatrix<f64>> {
        let q = self.net.output_dim();
        let scale = self.ggn_eigenvalues.map(|d| 1.0 / (d + self.prior_precision).sqrt());
        let mut scaled = rot.clone();
        for (j, s) in scale.iter().enumerate() {
            scaled.column_mut(j).scale_mut(*s);
        }
        (0..rot.nrows() / q)
            .map(|i| {
                let r = scaled.rows(i * q, q);
                r * r.transpose()
            })
            .collect()
    }

    fn nll_from_rotated(&self, g: &DMatrix<f64>, rot: &DMatrix<f64>, y: &DVector<f64>) -> Result<f64> {
        let noise = match self.likelihood {
            VallaLikelihood::Gaussian { noise_std } => noise_std * noise_std,
            VallaLikelihood::Categorical => 1.0,
        };
        mean_nll_from_blocks(self.likelihood, noise, g, &self.blocks_from_rotated(rot), y)
    }

    /// Predictive mean `g(X)` and per-point `d' × d'` covariances.
    pub fn predict_blocks(&self, x: &DMatrix<f64>) -> Result<(DMatrix<f64>, Vec<DMatrix<f64>>)> {
        let g = self.net.forward(x)?;
        let rot = self.feature_map.eval(&self.net, x)? * &self.ggn_eigenvectors;
        Ok((g, self.blocks_from_rotated(&rot)))
    }

    /// Mean NLL of `y` (Gaussian: `N(g, σ² + Σ)`; categorical: probit).
    pub fn predictive_nll(&self, x: &DMatrix<f64>, y: &DVector<f64>) -> Result<f64> {
        check_data(&self.net, self.likelihood, x, y, "evaluation data")?;
        let g = self.net.forward(x)?;
        let rot = self.feature_map.eval(&self.net, x)? * &self.ggn_eigenvectors;
        self.nll_from_rotated(&g, &rot, y)
    }

    /// Class probabilities (`n × C`).
    pub fn class_probabilities(
        &self,
        x: &DMatrix<f64>,
        method: ClassProbMethod,
        seed: u64,
    ) -> Result<DMatrix<f64>> {
        let pred = Posterior::predict(self, x).map_err(VallaError::Core)?;
        let mut rng = StdRng::seed_from_u64(seed);
        Ok(fspace_core::class_probabilities(&pred, method, &mut rng)?)
    }
}

/// Saves the network, the likelihood, the feature map and the curvature's eigenpairs.
impl<N: Network + Clone + Serialize + DeserializeOwned> Persist for EllaPosterior<N> {
    const KIND: &'static str = "fspace_valla::EllaPosterior";
    const VERSION: u32 = 2;

    fn validate_loaded(&self) -> std::result::Result<(), PersistError> {
        check_likelihood(&self.net, self.likelihood)
            .map_err(|e| PersistError::Invalid { kind: Self::KIND, reason: e.to_string() })
    }
}

fn core_err(e: VallaError) -> fspace_core::CoreError {
    to_core(e, "ELLA posterior")
}

impl<N: Network + Clone> Posterior for EllaPosterior<N> {
    fn output_dim(&self) -> usize {
        self.net.output_dim()
    }

    fn predict(&self, x: &DMatrix<f64>) -> fspace_core::Result<FunctionPredictive> {
        let (g, blocks) = self.predict_blocks(x).map_err(core_err)?;
        marginals(g, &blocks)
    }

    fn predict_joint(&self, x: &DMatrix<f64>) -> fspace_core::Result<(DMatrix<f64>, DMatrix<f64>)> {
        let run = || -> Result<(DMatrix<f64>, DMatrix<f64>)> {
            let g = self.net.forward(x)?;
            let mut rot = self.feature_map.eval(&self.net, x)? * &self.ggn_eigenvectors;
            for (j, d) in self.ggn_eigenvalues.iter().enumerate() {
                rot.column_mut(j).scale_mut(1.0 / (d + self.prior_precision).sqrt());
            }
            Ok((g, &rot * rot.transpose()))
        };
        run().map_err(core_err)
    }
}
