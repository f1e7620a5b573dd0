//! Mean-field VI (Bayes by Backprop, Blundell et al. 2015) for any [`Network`]:
//! `q(w) = N(m, diag(σ²))`, `σ = e^ρ`, prior `N(0, σ_p² I)`, maximising
//! `(N/B) Σ log N(yᵢ | f(xᵢ), σ_y²) − KL(q ‖ p)` with the closed-form Gaussian KL
//! `Σ_k ½[(σ_k² + m_k²)/σ_p² − 1 − log(σ_k²/σ_p²)]`. Two unbiased gradient estimators
//! ([`MfviGradient`]):
//!
//! * **local reparameterisation** (Kingma et al. 2015; [`Mlp`] only): each step samples every
//!   layer's pre-activations `h = a M_Wᵀ + m_b + √(a² S_Wᵀ + s_b) ⊙ ε` independently per
//!   example — lower variance; forward and backward are explicit nalgebra GEMMs on the MLP's
//!   documented parameter layout;
//! * **reparameterisation** (any network): one weight draw `w = m + σ ⊙ ε` per step, the
//!   network's own `forward_vjp` at `w` gives `g = ∂ELL/∂w`, and `∂/∂m = g`,
//!   `∂/∂ρ = g ⊙ ε ⊙ σ`.

use std::any::Any;

use fspace_core::{Data, Fitted, LikelihoodSpec, Observer, Silent};
use fspace_nn::{Activation, Mlp, Network};
use nalgebra::{DMatrix, DVector};
use rand::rngs::StdRng;
use rand_distr::{Distribution, StandardNormal};
use serde::{Deserialize, Serialize};

use crate::error::{invalid, Result};
use crate::observation::{observation, Observation};
use crate::optim::OptimConfig;
use crate::optim::OptimReport;
use crate::sampled::{check_regression, fit_mean_field, pack, unpack, WeightSamplePosterior};

/// MFVI settings; `Default` holds the paper's values (σ_p = 0.75, App. A.2.1).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MfviConfig {
    /// Prior standard deviation `σ_p`.
    pub prior_std: f64,
    /// Initial weight standard deviation.
    pub init_std: f64,
    /// Weight samples kept for predictions (100, as the paper's MC predictive).
    pub predictive_samples: usize,
    /// Adam, minibatches, early stopping.
    pub optim: OptimConfig,
    /// The gradient estimator.
    #[serde(default)]
    pub gradient: MfviGradient,
}

impl Default for MfviConfig {
    fn default() -> Self {
        Self {
            prior_std: 0.75,
            init_std: 1e-2,
            predictive_samples: 100,
            optim: OptimConfig::default(),
            gradient: MfviGradient::Auto,
        }
    }
}

/// MFVI's gradient estimator (module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum MfviGradient {
    /// Local reparameterisation for an [`Mlp`], weight reparameterisation for any other network.
    #[default]
    Auto,
    /// Pre-activations sampled per example (an [`Mlp`] only; any other network is refused).
    LocalReparameterization,
    /// One weight draw per step through the network's own `forward_vjp` (any network).
    Reparameterization,
}

/// Layers of an MLP as `(weight offset, bias offset, fan_in, fan_out)`.
fn layout(net: &Mlp) -> Vec<(usize, usize, usize, usize)> {
    let c = net.config();
    let mut widths = vec![c.input_dim];
    widths.extend(&c.hidden);
    widths.push(c.output_dim);
    let mut off = 0;
    (0..widths.len() - 1)
        .map(|l| {
            let (fi, fo) = (widths[l], widths[l + 1]);
            let t = (off, off + fi * fo, fi, fo);
            off += (fi + 1) * fo;
            t
        })
        .collect()
}

/// One local-reparameterisation pass: returns the sampled outputs and a closure-free gradient
/// of `Σ ⟨ȳ, f⟩` with respect to `(m, s)` given the output cotangent.
fn lrt_forward_backward(
    layers: &[(usize, usize, usize, usize)],
    act: Activation,
    m: &DVector<f64>,
    s: &DVector<f64>,
    x: &DMatrix<f64>,
    rng: &mut StdRng,
    cotangent: impl FnOnce(&DMatrix<f64>) -> DMatrix<f64>,
) -> (DMatrix<f64>, DVector<f64>, DVector<f64>) {
    let n = x.nrows();
    let depth = layers.len();
    let mat = |v: &DVector<f64>, off: usize, fo: usize, fi: usize| {
        DMatrix::from_row_slice(fo, fi, &v.as_slice()[off..off + fo * fi])
    };
    let mut a = vec![x.clone()];
    let mut pre = Vec::with_capacity(depth);
    let mut eps = Vec::with_capacity(depth);
    let mut sd = Vec::with_capacity(depth);
    for (l, &(ow, ob, fi, fo)) in layers.iter().enumerate() {
        let (wm, ws) = (mat(m, ow, fo, fi), mat(s, ow, fo, fi));
        let mut mu = &a[l] * wm.transpose();
        let mut var = a[l].map(|v| v * v) * ws.transpose();
        for o in 0..fo {
            mu.column_mut(o).add_scalar_mut(m[ob + o]);
            var.column_mut(o).add_scalar_mut(s[ob + o]);
        }
        let e = DMatrix::from_fn(n, fo, |_, _| StandardNormal.sample(rng));
        let st = var.map(|v| v.max(1e-300).sqrt());
        let h = &mu + st.component_mul(&e);
        if l + 1 < depth {
            a.push(h.map(|z| act.value(z)));
        }
        pre.push(h);
        eps.push(e);
        sd.push(st);
    }
    let f = pre[depth - 1].clone();
    let mut hbar = cotangent(&f);
    let (mut gm, mut gs) = (DVector::zeros(m.len()), DVector::zeros(m.len()));
    for l in (0..depth).rev() {
        let (ow, ob, fi, fo) = layers[l];
        // h = μ + √v ε: μ̄ = h̄, v̄ = h̄ ε / (2√v).
        let vbar = DMatrix::from_fn(n, fo, |i, o| hbar[(i, o)] * eps[l][(i, o)] / (2.0 * sd[l][(i, o)]));
        let a2 = a[l].map(|v| v * v);
        let gwm = hbar.transpose() * &a[l];
        let gws = vbar.transpose() * &a2;
        for o in 0..fo {
            for k in 0..fi {
                gm[ow + o * fi + k] = gwm[(o, k)];
                gs[ow + o * fi + k] = gws[(o, k)];
            }
            gm[ob + o] = hbar.column(o).sum();
            gs[ob + o] = vbar.column(o).sum();
        }
        if l > 0 {
            let (wm, ws) = (mat(m, ow, fo, fi), mat(s, ow, fo, fi));
            let abar = &hbar * wm + (vbar * ws).component_mul(&a[l]) * 2.0;
            hbar = DMatrix::from_fn(n, fi, |i, k| abar[(i, k)] * act.slope(pre[l - 1][(i, k)]));
        }
    }
    (f, gm, gs)
}

/// Fits MFVI to a regression set (`Gaussian` / `IsotropicGaussian` likelihood: `σ_y` starts at
/// its σ and is learned if it says so) on any network, starting the means at its current
/// weights; the gradient estimator is `config.gradient`'s.
pub fn fit<N: Network + Clone + 'static>(
    net: N,
    likelihood: LikelihoodSpec,
    data: &Data,
    config: &MfviConfig,
) -> Result<Fitted<WeightSamplePosterior<N>, OptimReport>> {
    fit_observed(net, likelihood, data, config, &mut Silent)
}

/// [`fit`], reporting at every evaluation of the schedule to `observer`.
pub fn fit_observed<N: Network + Clone + 'static>(
    net: N,
    likelihood: LikelihoodSpec,
    data: &Data,
    config: &MfviConfig,
    observer: &mut dyn Observer,
) -> Result<Fitted<WeightSamplePosterior<N>, OptimReport>> {
    let (x, y, validation) = (data.x(), data.y(), data.validation());
    let net = &net;
    let q = net.output_dim();
    let (_, init_noise_std, learn_noise) = observation(&likelihood, q, "MFVI", false)?;
    check_regression(x, y, net.input_dim(), q, "training inputs")?;
    if let Some((xv, yv)) = validation {
        check_regression(xv, yv, net.input_dim(), q, "validation inputs")?;
    }
    for (what, v) in [("MFVI prior scale σ_p", config.prior_std), ("initial weight std", config.init_std)] {
        if !(v.is_finite() && v > 0.0) {
            return Err(invalid(what, format!("{v} (must be > 0)")));
        }
    }
    let p = net.n_params();
    let n = x.nrows();
    let prior_var = config.prior_std * config.prior_std;
    let mlp = (net as &dyn Any).downcast_ref::<Mlp>();
    let local = match (config.gradient, mlp) {
        (MfviGradient::Auto | MfviGradient::LocalReparameterization, Some(mlp)) => Some(mlp),
        (MfviGradient::LocalReparameterization, None) => {
            return Err(invalid(
                "MFVI gradient",
                "local reparameterisation needs an Mlp (it samples each layer's pre-activations); \
                 use MfviGradient::Reparameterization or Auto for any other network",
            ))
        }
        _ => None,
    };
    // The objective from `(m, s = σ², σ_y²)` and the likelihood part's gradients in `m` and in
    // `ρ = log σ`, both estimators sharing the KL, the noise term and the packing.
    // One step's unpacked parameters and minibatch, shared by both estimators.
    let draw = |theta: &DVector<f64>, batch: &[usize]| {
        let (m, sd, log_noise) = unpack(theta, p);
        let s = sd.map(|v| v * v);
        StepInputs {
            m,
            sd,
            s,
            sigma2: (2.0 * log_noise).exp(),
            xb: x.select_rows(batch),
            yb: y.select_rows(batch),
            scale: n as f64 / batch.len() as f64,
        }
    };
    let assemble = |d: &StepInputs, sq: f64, gm: DVector<f64>, grho: DVector<f64>| {
        let StepInputs { m, s, sigma2, scale, .. } = d;
        let (sigma2, scale) = (*sigma2, *scale);
        let count = (d.xb.nrows() * q) as f64;
        let ell = scale * (-0.5 * count * (std::f64::consts::TAU * sigma2).ln() - sq / (2.0 * sigma2));
        let kl: f64 =
            (0..p).map(|k| 0.5 * ((s[k] + m[k] * m[k]) / prior_var - 1.0 - (s[k] / prior_var).ln())).sum();
        let mut g = DVector::zeros(2 * p + 1);
        for k in 0..p {
            g[k] = gm[k] - m[k] / prior_var;
            // ∂KL/∂ρ = 2s ∂KL/∂s = s/σ_p² − 1.
            g[p + k] = grho[k] - (s[k] / prior_var - 1.0);
        }
        if learn_noise {
            g[2 * p] = scale * (-count + sq / sigma2);
        }
        (ell - kl, g)
    };
    let residual_cotangent = |yb: &DMatrix<f64>, f: &DMatrix<f64>, scale: f64, sigma2: f64, sq: &mut f64| {
        let r = yb - f;
        *sq = r.iter().map(|v| v * v).sum();
        r * (scale / sigma2)
    };
    let theta0 = pack(&net.params(), config.init_std.ln(), init_noise_std.ln());
    let fit = |step: &mut StepFn<'_>, observer: &mut dyn Observer| {
        fit_mean_field(
            net,
            theta0.clone(),
            n,
            &config.optim,
            validation,
            config.predictive_samples,
            Observation::Gaussian,
            likelihood,
            step,
            observer,
        )
    };
    match local {
        Some(mlp) => {
            let (layers, act) = (layout(mlp), mlp.config().activation);
            let mut step = |theta: &DVector<f64>, batch: &[usize], rng: &mut StdRng| {
                let d = draw(theta, batch);
                let mut sq = 0.0;
                let (_, gm, gs) = lrt_forward_backward(&layers, act, &d.m, &d.s, &d.xb, rng, |f| {
                    residual_cotangent(&d.yb, f, d.scale, d.sigma2, &mut sq)
                });
                // ∂/∂ρ = 2s ∂/∂s.
                let grho = DVector::from_fn(p, |k, _| 2.0 * d.s[k] * gs[k]);
                Ok(assemble(&d, sq, gm, grho))
            };
            fit(&mut step, observer)
        }
        None => {
            let mut work = net.clone();
            let mut step = |theta: &DVector<f64>, batch: &[usize], rng: &mut StdRng| {
                let d = draw(theta, batch);
                let (gw, eps, sq) = reparameterized_pass(&mut work, &d.m, &d.sd, &d.xb, rng, |f, sq| {
                    residual_cotangent(&d.yb, f, d.scale, d.sigma2, sq)
                })?;
                let grho = DVector::from_fn(p, |k, _| gw[k] * eps[k] * d.sd[k]);
                Ok(assemble(&d, sq, gw, grho))
            };
            fit(&mut step, observer)
        }
    }
}

/// One MFVI step's inputs: the means, deviations `σ` and variances `s = σ²`, `σ_y²`, the
/// minibatch and the `N/B` scale of its data term.
struct StepInputs {
    m: DVector<f64>,
    sd: DVector<f64>,
    s: DVector<f64>,
    sigma2: f64,
    xb: DMatrix<f64>,
    yb: DMatrix<f64>,
    scale: f64,
}

/// One step's objective and gradient from `(θ, minibatch rows, RNG)`.
type StepFn<'a> = dyn FnMut(&DVector<f64>, &[usize], &mut StdRng) -> Result<(f64, DVector<f64>)> + 'a;

/// One reparameterised pass: draws `ε ~ N(0, I)`, sets `work`'s weights to `w = m + σ ⊙ ε`
/// and runs its `forward_vjp` with the cotangent from `cotangent(f, &mut sq)`; returns
/// `(Jᵀ·cotangent, ε, sq)`.
fn reparameterized_pass<N: Network>(
    work: &mut N,
    m: &DVector<f64>,
    sd: &DVector<f64>,
    x: &DMatrix<f64>,
    rng: &mut StdRng,
    cotangent: impl Fn(&DMatrix<f64>, &mut f64) -> DMatrix<f64>,
) -> Result<(DVector<f64>, DVector<f64>, f64)> {
    let eps = DVector::from_fn(m.len(), |_, _| StandardNormal.sample(rng));
    work.set_params(&(m + sd.component_mul(&eps)))?;
    let mut sq = 0.0;
    let (_, g) = work.forward_vjp(x, &mut |f| Ok(cotangent(f, &mut sq)))?;
    Ok((g, eps, sq))
}

/// The reparameterised estimator's gradient of `⟨c, f(x; m + σ ⊙ ε)⟩` in `(m, ρ = log σ)` for one
/// draw `ε` from `seed`, for tests: returns `(f, ∂/∂m, ∂/∂ρ)` on any network.
pub fn reparameterized_output_gradient<N: Network + Clone>(
    net: &N,
    m: &DVector<f64>,
    log_sd: &DVector<f64>,
    x: &DMatrix<f64>,
    c: &DMatrix<f64>,
    seed: u64,
) -> Result<(DMatrix<f64>, DVector<f64>, DVector<f64>)> {
    use rand::SeedableRng;
    let mut rng = StdRng::seed_from_u64(seed);
    let (mut work, sd) = (net.clone(), log_sd.map(f64::exp));
    let (g, eps, _) = reparameterized_pass(&mut work, m, &sd, x, &mut rng, |_, _| c.clone())?;
    let f = work.forward(x)?;
    let grho = DVector::from_fn(m.len(), |k, _| g[k] * eps[k] * sd[k]);
    Ok((f, g, grho))
}

/// The MFVI minibatch objective's gradient from one LRT pass, for tests: returns
/// `(f, ∂⟨c, f⟩/∂m, ∂⟨c, f⟩/∂s)` with the noise drawn from `seed`.
pub fn lrt_output_gradient(
    net: &Mlp,
    m: &DVector<f64>,
    s: &DVector<f64>,
    x: &DMatrix<f64>,
    c: &DMatrix<f64>,
    seed: u64,
) -> (DMatrix<f64>, DVector<f64>, DVector<f64>) {
    use rand::SeedableRng;
    let mut rng = StdRng::seed_from_u64(seed);
    lrt_forward_backward(&layout(net), net.config().activation, m, s, x, &mut rng, |_| c.clone())
}
