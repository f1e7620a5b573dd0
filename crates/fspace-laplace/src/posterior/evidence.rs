//! The evidence and what it selects: the Laplace marginal likelihood, λ by maximising it,
//! λ and T by validation grids, and the validation NLL they score.

use fspace_core::{class_probabilities, FunctionPredictive, Link, Posterior};
use fspace_input::InputError;
use fspace_nn::Network;
use nalgebra::{DMatrix, DVector};

use super::predictive::{forward_chunked, marginals, GLM_CHUNK};
use super::{LaplacePosterior, Predictive};
use crate::config::{MarglikConfig, PriorPrecision};
use crate::curvature::CurvatureApprox;
use crate::error::{ensure_positive, LaplaceError, Result};

impl<N: Network> LaplacePosterior<N> {
    /// The Laplace log marginal likelihood at `λ`, `T` (laplace-torch's
    /// `log_likelihood − ½(log_det_ratio + scatter)`, tempered):
    ///
    /// `log Z = T·log p(D | w*) − ½ Σ λᵢ w*ᵢ² + ½ Σ log λᵢ − ½ log |T·C + Λ|`
    ///
    /// over the weights the structure covers (the last layer for last-layer Laplace).
    pub fn log_marginal_likelihood_at(&self, prior: &PriorPrecision, t: f64) -> Result<f64> {
        ensure_positive("temperature", t)?;
        let lam = self.coordinate_lambdas_of(prior)?;
        let w = self.net.params();
        let scatter: f64 = self.indices.iter().zip(lam.iter()).map(|(&i, l)| l * w[i] * w[i]).sum();
        let log_prior_det: f64 = lam.iter().map(|l| l.ln()).sum();
        let log_det = self.curvature.log_det_precision(t, &lam)?;
        Ok(t * self.log_likelihood - 0.5 * scatter + 0.5 * log_prior_det - 0.5 * log_det)
    }

    /// [`log_marginal_likelihood_at`](Self::log_marginal_likelihood_at) the current λ and T.
    pub fn log_marginal_likelihood(&self) -> Result<f64> {
        let prior = match &self.coordinate_lambdas {
            Some(l) => {
                // Back to ascending flat order, as PerParameter takes it.
                let mut order: Vec<usize> = (0..self.indices.len()).collect();
                order.sort_by_key(|&c| self.indices[c]);
                PriorPrecision::PerParameter(order.iter().map(|&c| l[c]).collect())
            }
            None => PriorPrecision::PerLayer(self.lambdas.clone()),
        };
        self.log_marginal_likelihood_at(&prior, self.temperature)
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
            self.coordinate_lambdas = None;
        } else {
            self.coordinate_lambdas = None;
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
    pub(super) fn shared_glm_predictives(
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
            settings.push((self.current_lambdas(), self.temperature));
        }
        let mut covs = vec![Vec::with_capacity(x.nrows()); settings.len()];
        let chunk = crate::ggn::statistics_chunk(&self.net.layer_infos(), self.net.output_dim(), GLM_CHUNK);
        for s in (0..x.nrows()).step_by(chunk) {
            let xc = x.rows(s, chunk.min(x.nrows() - s)).into_owned();
            // Other structures leave at the first chunk, before any statistics are computed.
            let Some(chunk) = self.layered_covariances(&settings, &xc, None) else {
                return Ok(None);
            };
            for (all, part) in covs.iter_mut().zip(chunk?) {
                all.extend(part);
            }
        }
        let mean = forward_chunked(&self.net, x, GLM_CHUNK)?;
        Ok(Some(covs.iter().map(|c| marginals(mean.clone(), c)).collect::<Result<Vec<_>>>()?))
    }

    pub(super) fn gridsearch(
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
