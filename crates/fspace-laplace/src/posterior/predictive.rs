//! The posterior's predictives: GLM covariances per structure, weight samples, the nonlinear
//! Monte-Carlo predictive and class probabilities.

use fspace_core::{class_probabilities, mean_class_probabilities, FunctionPredictive, Link};
use fspace_nn::Network;
use nalgebra::{DMatrix, DVector};
use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};

use super::{LaplacePosterior, Predictive, QueryState};
use crate::curvature::{Curvature, CurvatureApprox};
use fspace_input::InputError;

use crate::error::{LaplaceError, Result};

impl<N: Network> LaplacePosterior<N> {
    /// Per-point `d' × d'` GLM covariances `J(xᵢ) Σ J(xᵢ)ᵀ` at the current λ, T.
    pub fn glm_covariances(&self, x: &DMatrix<f64>) -> Result<Vec<DMatrix<f64>>> {
        self.glm_covariances_in(&self.state(), x)
    }

    /// [`glm_covariances`](Self::glm_covariances) at the λ and T of `state`.
    pub fn glm_covariances_in(&self, state: &QueryState, x: &DMatrix<f64>) -> Result<Vec<DMatrix<f64>>> {
        self.glm_covariances_with(state, x, None)
    }

    /// `Σ V = (T·C + Λ)⁻¹ V` at the current λ and T for a `dim × m` block `V` whose rows are the
    /// curvature's coordinates ([`indices`](Self::indices): row `c` is parameter `indices[c]`):
    /// the posterior covariance applied without forming it, for a caller that holds its own
    /// Jacobians (a predictive differentiated in the inputs: `J(x) Σ J(x)ᵀ` with `J` from an
    /// autodiff framework).
    pub fn covariance_solve(&self, v: &DMatrix<f64>) -> Result<DMatrix<f64>> {
        self.covariance_solve_in(&self.state(), v)
    }

    /// [`covariance_solve`](Self::covariance_solve) at the λ and T of `state`.
    pub fn covariance_solve_in(&self, state: &QueryState, v: &DMatrix<f64>) -> Result<DMatrix<f64>> {
        if v.nrows() != self.indices.len() {
            return Err(LaplaceError::Input(InputError::DimensionMismatch {
                what: "rows of the block Σ is applied to (the curvature's coordinates)",
                expected: self.indices.len(),
                found: v.nrows(),
            }));
        }
        if v.iter().any(|e| !e.is_finite()) {
            return Err(LaplaceError::Input(InputError::NonFinite { what: "the block Σ is applied to" }));
        }
        self.curvature.solve(state.temperature, &state.lam, v)
    }

    /// The diagonal structure's `Σ` at the current λ and T — `1 / (T·cᵢ + λᵢ)` per coordinate,
    /// in [`indices`](Self::indices) order — or `None` for the other structures, whose `Σ` is
    /// not diagonal (apply it with [`covariance_solve`](Self::covariance_solve)).
    pub fn covariance_diagonal(&self) -> Option<DVector<f64>> {
        self.covariance_diagonal_in(&self.state())
    }

    /// [`covariance_diagonal`](Self::covariance_diagonal) at the λ and T of `state`.
    pub fn covariance_diagonal_in(&self, state: &QueryState) -> Option<DVector<f64>> {
        match &self.curvature {
            Curvature::Diag(d) => {
                let (lam, t) = (&state.lam, state.temperature);
                Some(DVector::from_fn(d.diag.len(), |i, _| 1.0 / (t * d.diag[i] + lam[i])))
            }
            _ => None,
        }
    }

    /// The GLM mean `f(x; w*)` (`n × d'`) and the per-point covariances of
    /// [`glm_covariances`](Self::glm_covariances) together. For a curvature over the last
    /// layer alone, each chunk's outputs and last-layer inputs come from one pass
    /// ([`Network::forward_with_last_layer_features`]) where the two would take two.
    pub fn glm_mean_and_covariances(&self, x: &DMatrix<f64>) -> Result<(DMatrix<f64>, Vec<DMatrix<f64>>)> {
        self.glm_mean_and_covariances_in(&self.state(), x)
    }

    /// [`glm_mean_and_covariances`](Self::glm_mean_and_covariances) at the λ and T of `state`.
    pub fn glm_mean_and_covariances_in(
        &self,
        state: &QueryState,
        x: &DMatrix<f64>,
    ) -> Result<(DMatrix<f64>, Vec<DMatrix<f64>>)> {
        if !self.covariances_from_last_layer_features() {
            return Ok((forward_chunked(&self.net, x, GLM_CHUNK)?, self.glm_covariances_in(state, x)?));
        }
        let q = self.net.output_dim();
        let chunk = crate::ggn::statistics_chunk(&self.net.layer_infos(), q, GLM_CHUNK);
        let mut mean = DMatrix::zeros(x.nrows(), q);
        let mut covs = Vec::with_capacity(x.nrows());
        for s in (0..x.nrows()).step_by(chunk) {
            let l = chunk.min(x.nrows() - s);
            let xc = x.rows(s, l).into_owned();
            let (f, phi) = forward_and_features_chunked(&self.net, &xc, chunk)?;
            mean.rows_mut(s, l).copy_from(&f);
            covs.extend(self.glm_covariances_with(state, &xc, Some(&phi))?);
        }
        Ok((mean, covs))
    }

    /// Whether the GLM covariances are formed from the last layer's inputs alone: last-layer
    /// KFAC / EKFAC, the `last_layer` structure, or a diagonal over the last layer.
    fn covariances_from_last_layer_features(&self) -> bool {
        let layers = self.net.layer_infos().len();
        layers > 0
            && match &self.curvature {
                Curvature::Kron(k) => k.covers_last_layer_only(layers),
                Curvature::Eigen(e) => e.label == "last_layer",
                Curvature::Diag(_) => self.covers_last_layer(),
                _ => false,
            }
    }

    /// [`glm_covariances`](Self::glm_covariances); `features`, when given, are the last layer's
    /// inputs at `x` (`n × fan_in`), used instead of asking the network for them.
    fn glm_covariances_with(
        &self,
        state: &QueryState,
        x: &DMatrix<f64>,
        features: Option<&DMatrix<f64>>,
    ) -> Result<Vec<DMatrix<f64>>> {
        let lam = state.lam.clone();
        let t = state.temperature;
        let q = self.net.output_dim();
        let infos = self.net.layer_infos();
        let chunk = crate::ggn::statistics_chunk(&infos, q, GLM_CHUNK);
        let layered = !infos.is_empty();
        let all_params = self.indices.len() == self.net.n_params()
            && self.indices.iter().enumerate().all(|(a, &b)| a == b);
        let iso = state.isotropic();
        let mut out = Vec::with_capacity(x.nrows());
        for s in (0..x.nrows()).step_by(chunk) {
            fspace_input::interrupt::check("the linearised predictive")?;
            let l = chunk.min(x.nrows() - s);
            let xc = x.rows(s, l).into_owned();
            let phi = features.map(|f| f.rows(s, l).into_owned());
            let last_layer_inputs = |phi: Option<DMatrix<f64>>| match phi {
                Some(phi) => Ok::<_, LaplaceError>(phi),
                None => Ok(self.net.last_layer_features(&xc)?),
            };
            if let Some(covs) = self.layered_covariances(&[(lam.clone(), t)], &xc, phi.as_ref()) {
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
                    let l = state.lambdas[0];
                    let c = e.values.map(|s| 1.0 / (t * s.max(0.0) + l) - 1.0 / l);
                    out.extend(crate::predict::eigen_covariances(&self.net, &e.vectors, &c, l, &xc)?)
                }
                Curvature::Eigen(e) if e.label == "last_layer" && iso && e.remainder.is_none() => {
                    let l = state.lambdas[0];
                    let c = e.values.map(|s| 1.0 / (t * s.max(0.0) + l) - 1.0 / l);
                    out.extend(crate::predict::last_layer_covariances(
                        &last_layer_inputs(phi)?,
                        q,
                        &e.vectors,
                        &c,
                        l,
                    ))
                }
                Curvature::Diag(d) if self.covers_last_layer() => {
                    out.extend(crate::predict::last_layer_diag_covariances(
                        &last_layer_inputs(phi)?,
                        q,
                        &d.diag,
                        t,
                        &lam,
                    ))
                }
                Curvature::Eigen(e) if e.label == "last_layer" => {
                    let js = crate::predict::last_layer_jacobian(&last_layer_inputs(phi)?, q);
                    out.extend(crate::predict::blocks(
                        &js,
                        &self.curvature.solve(t, &lam, &js.transpose())?,
                        q,
                    ));
                }
                _ if !layered => out.extend(self.per_point_covariances(&xc, t, &lam, all_params)?),
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

    /// `J(xᵢ) Σ J(xᵢ)ᵀ` for a network without layer statistics (a torch model, the Helmholtz
    /// net), Jacobian-free: the columns `J(xᵢ)ᵀ` of a group of points come from
    /// [`Network::per_point_vjp`] over identity cotangents (`p × g·d'`, `8·p·g·d'` ≤
    /// [`PER_POINT_BLOCK_BYTES`](crate::construct::PER_POINT_BLOCK_BYTES)), then one solve with
    /// the curvature and a `d' × d'` product per point on contiguous columns. No `n·d' × p`
    /// Jacobian, nor its transpose, is formed.
    fn per_point_covariances(
        &self,
        x: &DMatrix<f64>,
        t: f64,
        lam: &DVector<f64>,
        all_params: bool,
    ) -> Result<Vec<DMatrix<f64>>> {
        let (p, q) = (self.net.n_params(), self.net.output_dim());
        let group = (crate::construct::PER_POINT_BLOCK_BYTES / (8 * p.max(1) * q.max(1))).max(1);
        let eye = DMatrix::<f64>::identity(q, q);
        let mut out = Vec::with_capacity(x.nrows());
        for g in (0..x.nrows()).step_by(group) {
            let m = group.min(x.nrows() - g);
            let rows = self.net.per_point_vjp(&x.rows(g, m).into_owned(), &vec![eye.clone(); m])?;
            let rows = if all_params { rows } else { rows.select_rows(&self.indices) };
            let solved = self.curvature.solve(t, lam, &rows)?;
            out.extend((0..m).map(|i| {
                let c = rows.columns(i * q, q).transpose() * solved.columns(i * q, q);
                (&c + c.transpose()) * 0.5
            }));
        }
        Ok(out)
    }

    /// Covariances from layer statistics (KFAC, EKFAC, the layered diagonal structure) for each
    /// `(λ, T)` of `settings`, sharing the statistics; `None` for the other structures.
    /// `features`: the last layer's inputs at `x` when the caller has them (last-layer KFAC
    /// uses them instead of a pass).
    pub(super) fn layered_covariances(
        &self,
        settings: &[(DVector<f64>, f64)],
        x: &DMatrix<f64>,
        features: Option<&DMatrix<f64>>,
    ) -> Option<Result<Vec<Vec<DMatrix<f64>>>>> {
        match &self.curvature {
            Curvature::Kron(k) => Some(crate::predict::kron_covariances(&self.net, k, settings, x, features)),
            Curvature::Diag(d) if !self.net.layer_infos().is_empty() && self.covers_all_in_order() => {
                Some(crate::predict::diag_covariances(&self.net, &d.diag, settings, x))
            }
            _ => None,
        }
    }

    /// Whether the curvature covers every parameter, coordinate `i` being parameter `i`.
    fn covers_all_in_order(&self) -> bool {
        self.indices.len() == self.net.n_params() && self.indices.iter().enumerate().all(|(a, &b)| a == b)
    }

    /// Whether the curvature covers exactly the last layer, in its `[W | b]` coordinates.
    fn covers_last_layer(&self) -> bool {
        self.net.layer_infos().last().is_some_and(|l| self.indices == l.kron_order())
    }

    /// The joint GLM predictive at the λ and T of `state`: the mean `f(x; w*)` (`n × d'`) and
    /// the covariance `J Σ Jᵀ` (`n·d'` square, point-major).
    pub fn glm_joint_in(&self, state: &QueryState, x: &DMatrix<f64>) -> Result<(DMatrix<f64>, DMatrix<f64>)> {
        let mean = forward_chunked(&self.net, x, 256)?;
        let js = crate::predict::subset_jacobian(&self.net, &self.curvature, &self.indices, x)?;
        let sj = self.curvature.solve(state.temperature, &state.lam, &js.transpose())?;
        let cov = &js * sj;
        Ok((mean, (&cov + cov.transpose()) * 0.5))
    }

    /// The GLM predictive of `f` (mean `f(x; w*)`, marginal variances).
    pub fn predict_glm(&self, x: &DMatrix<f64>) -> Result<FunctionPredictive> {
        let (mean, covs) = self.glm_mean_and_covariances(x)?;
        marginals(mean, &covs)
    }

    /// `s` weight draws `θ ~ N(w*, Σ)` as flat parameter vectors.
    pub fn sample_weights(&self, s: usize, rng: &mut dyn RngCore) -> Result<Vec<DVector<f64>>> {
        self.sample_weights_in(&self.state(), s, rng)
    }

    /// [`sample_weights`](Self::sample_weights) at the λ and T of `state`.
    pub fn sample_weights_in(
        &self,
        state: &QueryState,
        s: usize,
        rng: &mut dyn RngCore,
    ) -> Result<Vec<DVector<f64>>> {
        if s == 0 {
            return Err(LaplaceError::Input(InputError::Invalid {
                what: "number of samples",
                reason: "must be ≥ 1".into(),
            }));
        }
        fspace_input::budget::ensure(
            "the weight draws (2·S·p values)",
            fspace_input::budget::matrix_bytes(s, self.net.n_params()).saturating_mul(2),
            "fewer samples: draw them in batches",
        )?;
        let z = self.curvature.sample(state.temperature, &state.lam, s, rng)?;
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
        self.nonlinear_samples_in(&self.state(), x, s, rng)
    }

    /// [`nonlinear_samples`](Self::nonlinear_samples) at the λ and T of `state`.
    pub fn nonlinear_samples_in(
        &self,
        state: &QueryState,
        x: &DMatrix<f64>,
        s: usize,
        rng: &mut dyn RngCore,
    ) -> Result<Vec<DMatrix<f64>>>
    where
        N: Clone,
    {
        fspace_input::budget::ensure(
            "the network's outputs at the weight draws (S·n·d' values)",
            fspace_input::budget::matrix_bytes(s, x.nrows() * self.net.output_dim()),
            "fewer samples or points: draw them in batches",
        )?;
        let mut net = self.net.clone();
        let mut out = Vec::with_capacity(s);
        for th in self.sample_weights_in(state, s, rng)? {
            fspace_input::interrupt::check("the network at the weight draws")?;
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
    pub(super) fn class_probabilities_inner(&self, x: &DMatrix<f64>, link: &Link) -> Result<DMatrix<f64>>
    where
        N: Clone,
    {
        fspace_core::ensure_classifier(Some(self.likelihood))?;
        match self.predictive {
            Predictive::Glm => Ok(class_probabilities(&self.predict_glm(x)?, link)?),
            Predictive::Nonlinear { samples, seed } => {
                let draws = self.nonlinear_samples(x, samples, &mut StdRng::seed_from_u64(seed))?;
                Ok(mean_class_probabilities(&draws)?)
            }
        }
    }
}

/// Forward pass in chunks (bounded memory for CNNs on large sets).
pub(crate) fn forward_chunked<N: Network>(net: &N, x: &DMatrix<f64>, chunk: usize) -> Result<DMatrix<f64>> {
    let mut f = DMatrix::zeros(x.nrows(), net.output_dim());
    for s in (0..x.nrows()).step_by(chunk) {
        // A fit's first pass over many points takes seconds: Ctrl-C between chunks.
        fspace_input::interrupt::check("the network's forward pass")?;
        let l = chunk.min(x.nrows() - s);
        f.rows_mut(s, l).copy_from(&net.forward(&x.rows(s, l).into_owned())?);
    }
    Ok(f)
}

/// [`forward_chunked`] with the last layer's inputs from the same passes
/// ([`Network::forward_with_last_layer_features`]): `n × d'` and `n × fan_in`.
pub(crate) fn forward_and_features_chunked<N: Network>(
    net: &N,
    x: &DMatrix<f64>,
    chunk: usize,
) -> Result<(DMatrix<f64>, DMatrix<f64>)> {
    let mut out: Option<(DMatrix<f64>, DMatrix<f64>)> = None;
    for s in (0..x.nrows()).step_by(chunk) {
        fspace_input::interrupt::check("the network's forward pass")?;
        let l = chunk.min(x.nrows() - s);
        let (f, phi) = net.forward_with_last_layer_features(&x.rows(s, l).into_owned())?;
        let (f_all, phi_all) = out.get_or_insert_with(|| {
            (DMatrix::zeros(x.nrows(), f.ncols()), DMatrix::zeros(x.nrows(), phi.ncols()))
        });
        if f.shape() != (l, f_all.ncols()) || phi.shape() != (l, phi_all.ncols()) {
            return Err(fspace_nn::NnError::Callback(format!(
                "forward_with_last_layer_features returned {:?} and {:?} for {l} points; expected {l} rows of {} \
                 and {} columns",
                f.shape(),
                phi.shape(),
                f_all.ncols(),
                phi_all.ncols()
            ))
            .into());
        }
        f_all.rows_mut(s, l).copy_from(&f);
        phi_all.rows_mut(s, l).copy_from(&phi);
    }
    Ok(out.unwrap_or_else(|| (DMatrix::zeros(0, net.output_dim()), DMatrix::zeros(0, 0))))
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
pub(super) const GLM_CHUNK: usize = 256;

/// The GLM predictive from the mean and the per-point covariances: their diagonals, clamped at 0.
pub(super) fn marginals(mean: DMatrix<f64>, covs: &[DMatrix<f64>]) -> Result<FunctionPredictive> {
    let var =
        DMatrix::from_fn(mean.nrows(), mean.ncols(), |i, o| fspace_core::clip_rounding(covs[i][(o, o)]));
    Ok(FunctionPredictive::new(mean, var)?)
}
