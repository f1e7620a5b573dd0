//! Exactness tests of the function-space VI crate: divergences against dense evaluations,
//! objective gradients against central finite differences, D_KL^γ → KL as γ → 0, SSGE against
//! an analytic score, MFVI's local reparameterisation against finite differences, bad input.

use fspace_core::{Data, Fitted, LikelihoodSpec, Link, Posterior, Schedule};
use fspace_gfsvi::*;
use fspace_input::InputError;
use fspace_kernels::GpPrior;

/// The paper's likelihood: σ_y learned from 1.
const LEARNED: LikelihoodSpec = LikelihoodSpec::Gaussian { sigma: 1.0, learn: true };
use fspace_kernels::{PriorMean, Rbf};
use fspace_nn::{Activation, Mlp, MlpConfig, Outputs};
use fspace_testutil::{fd_gradient, rand_uniform, randn, randn_vec, rng, spd, three_blobs, ThreadReduce};
use nalgebra::{DMatrix, DVector};
use rand::Rng;
use rand_distr::{Distribution, StandardNormal};

fn data<'a>(
    x: &'a DMatrix<f64>,
    y: &'a DMatrix<f64>,
    validation: Option<(&'a DMatrix<f64>, &'a DMatrix<f64>)>,
) -> Result<Data<'a>> {
    Ok(Data::new(x, y)?.with_optional_validation(validation)?)
}

/// `fit` on borrowed inputs, the form most tests write.
fn fit_g<N: fspace_nn::Network + Clone>(
    net: &N,
    lik: LikelihoodSpec,
    prior: &KlPrior,
    x: &DMatrix<f64>,
    y: &DMatrix<f64>,
    validation: Option<(&DMatrix<f64>, &DMatrix<f64>)>,
    config: &GfsviConfig,
) -> Result<Fitted<LinearizedPosterior<N>, OptimReport>> {
    fit(net.clone(), lik, prior, &data(x, y, validation)?, config)
}

fn fit_fvi_g<N: fspace_nn::Network + Clone>(
    net: &N,
    lik: LikelihoodSpec,
    prior: &GpPrior,
    x: &DMatrix<f64>,
    y: &DMatrix<f64>,
    validation: Option<(&DMatrix<f64>, &DMatrix<f64>)>,
    config: &FviConfig,
) -> Result<Fitted<WeightSamplePosterior<N>, OptimReport>> {
    fvi::fit(net.clone(), lik, prior, &data(x, y, validation)?, config)
}

fn fit_mfvi_g(
    net: &Mlp,
    lik: LikelihoodSpec,
    x: &DMatrix<f64>,
    y: &DMatrix<f64>,
    validation: Option<(&DMatrix<f64>, &DMatrix<f64>)>,
    config: &MfviConfig,
) -> Result<Fitted<WeightSamplePosterior<Mlp>, OptimReport>> {
    mfvi::fit(net.clone(), lik, &data(x, y, validation)?, config)
}

fn small_net(seed: u64) -> Mlp {
    Mlp::new(MlpConfig {
        input_dim: 1,
        hidden: vec![5, 4],
        output_dim: 1,
        activation: Activation::Tanh,
        seed,
    })
    .unwrap()
}

/// `KL(N(a, A) ‖ N(b, B))` from nalgebra's inverse and determinant (independent of the crate).
fn dense_kl(a: &DVector<f64>, aa: &DMatrix<f64>, b: &DVector<f64>, bb: &DMatrix<f64>) -> f64 {
    let binv = bb.clone().try_inverse().unwrap();
    let d = a - b;
    0.5 * ((&binv * aa).trace() - a.len() as f64
        + (d.transpose() * &binv * &d)[(0, 0)]
        + bb.determinant().ln()
        - aa.determinant().ln())
}

#[test]
fn gaussian_kl_and_its_gradients_match_dense_evaluation_and_finite_differences() {
    let mut r = rng(1);
    let n = 5;
    let (a, b) = (randn_vec(n, &mut r), randn_vec(n, &mut r));
    let (aa, bb) = (spd(n, 3.0, 0.2, &mut r), spd(n, 2.0, 0.3, &mut r));
    let kl = gaussian_kl(&a, &aa, &b, &bb, true).unwrap();
    assert!((kl.value - dense_kl(&a, &aa, &b, &bb)).abs() < 1e-12 * kl.value.abs().max(1.0));
    let fd_mean = fd_gradient(|v| dense_kl(&DVector::from_column_slice(v), &aa, &b, &bb), a.as_slice(), 1e-6);
    for k in 0..n {
        assert!((kl.grad_mean[k] - fd_mean[k]).abs() < 1e-7, "mean {k}");
    }
    // Symmetric perturbations E_ij + E_ji: the derivative is 2·G_ij off the diagonal.
    for (which, grad) in [(0, &kl.grad_cov_q), (1, kl.grad_cov_p.as_ref().unwrap())] {
        for i in 0..n {
            for j in 0..=i {
                let f = |h: f64| {
                    let mut e = DMatrix::zeros(n, n);
                    e[(i, j)] += h;
                    if i != j {
                        e[(j, i)] += h;
                    }
                    if which == 0 {
                        dense_kl(&a, &(&aa + &e), &b, &bb)
                    } else {
                        dense_kl(&a, &aa, &b, &(&bb + &e))
                    }
                };
                let fd = (f(1e-6) - f(-1e-6)) / 2e-6;
                let an = if i == j { grad[(i, i)] } else { 2.0 * grad[(i, j)] };
                assert!((an - fd).abs() < 1e-6, "cov {which} ({i},{j}): {an} vs {fd}");
            }
        }
    }
}

#[test]
fn regularized_kl_tends_to_the_kl_of_a_linear_model_as_gamma_vanishes() {
    // f = Φw with p(w) = N(0, I), q(w) = N(m, S): both function-space measures live on range(Φ)
    // (degenerate, rank 3 in 8 dimensions), and their KL equals the weight-space KL.
    let mut r = rng(2);
    let (mpts, p) = (8, 3);
    let phi = randn(mpts, p, &mut r);
    let m = randn_vec(p, &mut r);
    let s = DVector::from_vec(vec![0.3, 0.7, 1.4]);
    let weight_kl: f64 = (0..p).map(|k| 0.5 * (s[k] + m[k] * m[k] - 1.0 - s[k].ln())).sum();
    let cov_q = &phi * DMatrix::from_diagonal(&s) * phi.transpose();
    let cov_p = &phi * phi.transpose();
    let mut errors = Vec::new();
    for gamma in [1e-2, 1e-4, 1e-6, 1e-8] {
        let d =
            regularized_kl(&(&phi * &m), &cov_q, &DVector::zeros(mpts), &cov_p, gamma, mpts, false).unwrap();
        errors.push((d.value - weight_kl).abs());
    }
    assert!(errors.windows(2).all(|w| w[1] < w[0]), "{errors:?}");
    assert!(errors[3] < 1e-5 * weight_kl, "{errors:?} vs {weight_kl}");
    // A non-degenerate pair: D̂^γ is the KL of the shifted covariances.
    let (a, b) = (randn_vec(4, &mut r), randn_vec(4, &mut r));
    let (aa, bb) = (spd(4, 2.0, 0.5, &mut r), spd(4, 2.0, 0.5, &mut r));
    let shift = DMatrix::identity(4, 4) * (1e-3 * 4.0);
    let d = regularized_kl(&a, &aa, &b, &bb, 1e-3, 4, false).unwrap();
    assert!((d.value - dense_kl(&a, &(&aa + &shift), &b, &(&bb + &shift))).abs() < 1e-11);
    // Bad input.
    assert!(matches!(
        regularized_kl(&a, &aa, &b, &bb, 0.0, 4, false),
        Err(GfsviError::Input(InputError::Invalid { .. }))
    ));
    assert!(matches!(
        regularized_kl(&a, &aa, &b, &bb, -1.0, 4, false),
        Err(GfsviError::Input(InputError::Invalid { .. }))
    ));
    assert!(matches!(
        regularized_kl(&a, &aa, &b, &bb, 1e-3, 0, false),
        Err(GfsviError::Input(InputError::Invalid { .. }))
    ));
    let neg = -DMatrix::<f64>::identity(4, 4);
    assert!(matches!(gaussian_kl(&a, &aa, &b, &neg, false), Err(GfsviError::NotPositiveDefinite { .. })));
}

fn setup() -> (Mlp, VariationalParams, DMatrix<f64>, DMatrix<f64>, DMatrix<f64>) {
    let net = small_net(3);
    let mut r = rng(4);
    let p = net.n_params();
    let params = VariationalParams {
        mean: net.params(),
        log_std: DVector::from_fn(p, |_, _| -1.5 + 0.3 * r.gen::<f64>()),
        log_noise_std: -0.7,
    };
    let xb = rand_uniform(6, 1, -1.0, 1.0, &mut r);
    let yb = xb.map(|v| (std::f64::consts::TAU * v).sin());
    let xm = rand_uniform(7, 1, -1.5, 1.5, &mut r);
    (net, params, xb, yb, xm)
}

fn check_objective_gradient(prior: &KlPrior, gamma: f64) {
    let (mut net, params, xb, yb, xm) = setup();
    let p = net.n_params();
    let obj = objective(&mut net, &params, prior, &xb, &yb, 30, &xm, gamma).unwrap();
    let value = |m: &[f64], rho: &[f64], ln: f64| {
        let mut n2 = net.clone();
        let pr = VariationalParams {
            mean: DVector::from_column_slice(m),
            log_std: DVector::from_column_slice(rho),
            log_noise_std: ln,
        };
        objective(&mut n2, &pr, prior, &xb, &yb, 30, &xm, gamma).unwrap().value
    };
    let fd_m = fd_gradient(
        |m| value(m, params.log_std.as_slice(), params.log_noise_std),
        params.mean.as_slice(),
        1e-6,
    );
    let fd_r = fd_gradient(
        |r| value(params.mean.as_slice(), r, params.log_noise_std),
        params.log_std.as_slice(),
        1e-6,
    );
    let fd_n = fd_gradient(
        |l| value(params.mean.as_slice(), params.log_std.as_slice(), l[0]),
        &[params.log_noise_std],
        1e-6,
    );
    let scale = fd_m.iter().chain(&fd_r).fold(1.0f64, |a, v| a.max(v.abs()));
    for k in 0..p {
        assert!(
            (obj.grad.mean[k] - fd_m[k]).abs() < 2e-6 * scale,
            "{prior:?} m[{k}]: {} vs {}",
            obj.grad.mean[k],
            fd_m[k]
        );
        assert!(
            (obj.grad.log_std[k] - fd_r[k]).abs() < 2e-6 * scale,
            "{prior:?} ρ[{k}]: {} vs {}",
            obj.grad.log_std[k],
            fd_r[k]
        );
    }
    assert!((obj.grad.log_noise_std - fd_n[0]).abs() < 1e-6 * fd_n[0].abs().max(1.0));
}

#[test]
fn gfsvi_objective_gradient_matches_finite_differences() {
    let prior = KlPrior::Gp(GpPrior::centered(Rbf::new(1.0, 0.5).unwrap()));
    check_objective_gradient(&prior, 1e-3);
}

#[test]
fn tfsvi_objective_gradient_matches_finite_differences() {
    check_objective_gradient(&KlPrior::WeightPushforward { sigma_p: 0.7 }, 1e-3);
}

#[test]
fn objective_terms_equal_dense_evaluations_with_the_jacobian() {
    let (mut net, params, xb, yb, xm) = setup();
    let kernel = Rbf::new(1.3, 0.4).unwrap();
    let prior = KlPrior::Gp(GpPrior::new(kernel.clone(), PriorMean::Constant(0.2)));
    let gamma = 1e-4;
    let obj = objective(&mut net, &params, &prior, &xb, &yb, 12, &xm, gamma).unwrap();
    let s = params.variances();
    let sigma2 = (2.0 * params.log_noise_std).exp();
    let jb = net.jacobian(&xb).unwrap();
    let fb = net.forward(&xb).unwrap();
    let mut ell = 0.0;
    for i in 0..6 {
        let v: f64 = (0..s.len()).map(|k| jb[(i, k)] * jb[(i, k)] * s[k]).sum();
        ell += -0.5 * (std::f64::consts::TAU * sigma2).ln()
            - ((yb[(i, 0)] - fb[(i, 0)]).powi(2) + v) / (2.0 * sigma2);
    }
    ell *= 12.0 / 6.0;
    assert!((obj.expected_log_lik - ell).abs() < 1e-10 * ell.abs());
    let jm = net.jacobian(&xm).unwrap();
    let shift = DMatrix::identity(7, 7) * (gamma * 7.0);
    let cov_q = &jm * DMatrix::from_diagonal(&s) * jm.transpose() + &shift;
    let k = fspace_kernels::gram(&kernel, &xm, &xm).unwrap() + &shift;
    let mq = net.forward(&xm).unwrap().column(0).into_owned();
    let kl = dense_kl(&mq, &cov_q, &DVector::from_element(7, 0.2), &k);
    assert!((obj.divergence - kl).abs() < 1e-7 * kl.abs(), "{} vs {kl}", obj.divergence);
    // The closed-form ELL equals a Monte-Carlo average over the linearised network.
    let mut r = rng(9);
    let draws = 40_000;
    let mut mc = 0.0;
    for _ in 0..draws {
        let u = DVector::from_fn(s.len(), |k, _| {
            let e: f64 = StandardNormal.sample(&mut r);
            s[k].sqrt() * e
        });
        let fl = &fb + &jb * &u;
        for i in 0..6 {
            mc += -0.5 * (std::f64::consts::TAU * sigma2).ln()
                - (yb[(i, 0)] - fl[(i, 0)]).powi(2) / (2.0 * sigma2);
        }
    }
    mc *= 2.0 / draws as f64;
    assert!((mc - ell).abs() < 0.01 * ell.abs(), "MC {mc} vs closed form {ell}");
}

#[test]
fn ssge_recovers_the_score_of_a_gaussian() {
    let mut r = rng(5);
    let (k, d) = (400, 2);
    let cov = DMatrix::from_row_slice(2, 2, &[1.0, 0.5, 0.5, 0.8]);
    let chol = cov.clone().cholesky().unwrap().l();
    let mu = DVector::from_vec(vec![0.5, -1.0]);
    let z = randn(k, d, &mut r);
    let x = DMatrix::from_fn(k, d, |i, c| mu[c] + (0..d).map(|t| chol[(c, t)] * z[(i, t)]).sum::<f64>());
    let score = Ssge::default().score_at_samples(&x).unwrap();
    let prec = cov.try_inverse().unwrap();
    let (mut err, mut norm, mut used) = (0.0, 0.0, 0);
    for i in 0..k {
        if z.row(i).norm() > 1.5 {
            continue; // SSGE is accurate where q has mass
        }
        let xi = x.row(i).transpose() - &mu;
        let truth = -(&prec * xi);
        err += (score.row(i).transpose() - &truth).norm_squared();
        norm += truth.norm_squared();
        used += 1;
    }
    let rel = (err / norm).sqrt();
    assert!(used > 200 && rel < 0.3, "relative score error {rel} over {used} samples");
    assert!(Ssge::default().score_at_samples(&DMatrix::zeros(1, 3)).is_err());
}

#[test]
fn mfvi_local_reparameterisation_gradient_matches_finite_differences() {
    let net = small_net(6);
    let p = net.n_params();
    let mut r = rng(7);
    let m = net.params();
    let s = DVector::from_fn(p, |_, _| 0.01 + 0.05 * r.gen::<f64>());
    let x = rand_uniform(5, 1, -1.0, 1.0, &mut r);
    let c = randn(5, 1, &mut r);
    let (_, gm, gs) = fspace_gfsvi::mfvi::lrt_output_gradient(&net, &m, &s, &x, &c, 11);
    let val = |mv: &[f64], sv: &[f64]| {
        let (f, _, _) = fspace_gfsvi::mfvi::lrt_output_gradient(
            &net,
            &DVector::from_column_slice(mv),
            &DVector::from_column_slice(sv),
            &x,
            &c,
            11,
        );
        c.component_mul(&f).sum()
    };
    let fd_m = fd_gradient(|mv| val(mv, s.as_slice()), m.as_slice(), 1e-6);
    let fd_s = fd_gradient(|sv| val(m.as_slice(), sv), s.as_slice(), 1e-7);
    for k in 0..p {
        assert!((gm[k] - fd_m[k]).abs() < 1e-6 * fd_m[k].abs().max(1.0), "m[{k}]");
        assert!((gs[k] - fd_s[k]).abs() < 1e-5 * fd_s[k].abs().max(1.0), "s[{k}]: {} vs {}", gs[k], fd_s[k]);
    }
}

/// The reparameterised estimator on a network that is not an MLP (the Helmholtz net: its
/// outputs are derivatives of a potential MLP): with the draw `ε` fixed by the seed,
/// `⟨c, f(x; m + e^ρ ⊙ ε)⟩` is a deterministic function of `(m, ρ)`, so its gradients are
/// checked by central differences.
#[test]
fn mfvi_reparameterised_gradient_matches_finite_differences_on_any_network() {
    let net = fspace_nn::HelmholtzNet::new(vec![6, 5], Activation::Tanh, 3).unwrap();
    let p = net.n_params();
    let mut r = rng(17);
    let m = net.params();
    let rho = DVector::from_fn(p, |_, _| (0.01 + 0.05 * r.gen::<f64>()).ln());
    let x = rand_uniform(4, 2, -1.0, 1.0, &mut r);
    let c = randn(4, 2, &mut r);
    let grad = |mv: &DVector<f64>, rv: &DVector<f64>| {
        fspace_gfsvi::mfvi::reparameterized_output_gradient(&net, mv, rv, &x, &c, 5).unwrap()
    };
    let (_, gm, grho) = grad(&m, &rho);
    let val = |mv: &[f64], rv: &[f64]| {
        let (f, _, _) = grad(&DVector::from_column_slice(mv), &DVector::from_column_slice(rv));
        c.component_mul(&f).sum()
    };
    let fd_m = fd_gradient(|mv| val(mv, rho.as_slice()), m.as_slice(), 1e-6);
    let fd_rho = fd_gradient(|rv| val(m.as_slice(), rv), rho.as_slice(), 1e-6);
    for k in 0..p {
        assert!((gm[k] - fd_m[k]).abs() < 1e-6 * fd_m[k].abs().max(1.0), "m[{k}]: {} vs {}", gm[k], fd_m[k]);
        assert!(
            (grho[k] - fd_rho[k]).abs() < 1e-6 * fd_rho[k].abs().max(1.0),
            "ρ[{k}]: {} vs {}",
            grho[k],
            fd_rho[k]
        );
    }
}

/// MFVI on any network: the reparameterised estimator fits the sine toy about as well as the
/// MLP's local reparameterisation, with a predictive spread of the same size; on a
/// Helmholtz net (not an MLP) `Auto` takes the reparameterised route and fits, and asking it
/// for local reparameterisation is refused by name.
#[test]
fn mfvi_fits_networks_other_than_the_mlp_by_weight_reparameterisation() {
    let toy = fspace_data::sine(120, 0.1, &mut rng(31)).unwrap();
    let net = Mlp::new(MlpConfig {
        input_dim: 1,
        hidden: vec![20],
        output_dim: 1,
        activation: Activation::Tanh,
        seed: 2,
    })
    .unwrap();
    let optim =
        OptimConfig { learning_rate: 1e-2, batch_size: 120, schedule: Schedule::steps(6000), seed: 3 };
    // 20 points on the data's two intervals.
    let xt =
        DMatrix::from_fn(
            20,
            1,
            |i, _| if i < 10 { -1.0 + 0.05 * i as f64 } else { 0.5 + 0.05 * (i - 10) as f64 },
        );
    let truth = xt.map(|v| (std::f64::consts::TAU * v).sin());
    let (mut rmse, mut spread) = (Vec::new(), Vec::new());
    for gradient in [MfviGradient::LocalReparameterization, MfviGradient::Reparameterization] {
        let cfg =
            MfviConfig { optim: optim.clone(), gradient, predictive_samples: 200, ..Default::default() };
        let fit = fit_mfvi_g(&net, LikelihoodSpec::gaussian(0.1), &toy.x, &toy.y, None, &cfg).unwrap();
        let pred = fit.posterior.predict(&xt).unwrap();
        rmse.push((&pred.mean - &truth).norm() / 20f64.sqrt());
        spread.push(pred.var.mean());
    }
    eprintln!(
        "MFVI: on-data RMSE {rmse:?}, mean predictive variance {spread:?} (local, weight reparameterisation)"
    );
    // The weight draw's gradient is noisier (one draw for the whole batch), so it converges
    // more slowly; both are far below the untrained network's ≈ 0.7.
    assert!(rmse[0] < 0.1 && rmse[1] < 0.25, "{rmse:?}");
    // Both estimators are unbiased for the same ELBO gradient: the fitted spreads agree.
    assert!(spread[1] / spread[0] < 3.0 && spread[0] / spread[1] < 3.0, "{spread:?}");

    let helmholtz = fspace_nn::HelmholtzNet::new(vec![16, 16], Activation::Tanh, 4).unwrap();
    let x = rand_uniform(80, 2, -1.0, 1.0, &mut rng(32));
    // A divergence-free field (the curl of ψ = sin x₁ cos x₂), as the Helmholtz net models.
    let y = DMatrix::from_fn(80, 2, |i, o| {
        let (a, b) = (x[(i, 0)], x[(i, 1)]);
        if o == 0 {
            -a.sin() * b.sin()
        } else {
            -a.cos() * b.cos()
        }
    });
    let cfg = MfviConfig {
        optim: OptimConfig { schedule: Schedule::steps(300), ..optim },
        predictive_samples: 20,
        ..Default::default()
    };
    let data = Data::new(&x, &y).unwrap();
    let lik = LikelihoodSpec::IsotropicGaussian { sigma: 0.1, outputs: 2, learn: false };
    let fit = mfvi::fit(helmholtz.clone(), lik, &data, &cfg).unwrap();
    let pred = fit.posterior.predict(&x).unwrap();
    assert!(pred.mean.iter().chain(pred.var.iter()).all(|v| v.is_finite()) && pred.var.min() > 0.0);
    let start = (&helmholtz.forward(&x).unwrap() - &y).norm();
    assert!(
        (&pred.mean - &y).norm() < 0.7 * start,
        "MFVI did not fit: {} from {start}",
        (&pred.mean - &y).norm()
    );
    let local = MfviConfig { gradient: MfviGradient::LocalReparameterization, ..cfg };
    let e = mfvi::fit(helmholtz, lik, &data, &local).unwrap_err();
    assert!(matches!(e, GfsviError::Input(InputError::Invalid { what: "MFVI gradient", .. })), "{e}");
}

#[test]
fn bad_input_gets_typed_errors() {
    let net = small_net(8);
    let mut r = rng(9);
    let x = rand_uniform(10, 1, -1.0, 1.0, &mut r);
    let y = x.map(|v| v.sin());
    let prior = KlPrior::Gp(GpPrior::centered(Rbf::new(1.0, 0.5).unwrap()));
    let invalid = |e: Result<Fitted<LinearizedPosterior<Mlp>, OptimReport>>| {
        matches!(e, Err(GfsviError::Input(InputError::Invalid { .. })))
    };
    assert!(invalid(fit_g(
        &net,
        LEARNED,
        &prior,
        &x,
        &y,
        None,
        &GfsviConfig { gamma: 0.0, ..Default::default() }
    )));
    assert!(invalid(fit_g(
        &net,
        LEARNED,
        &prior,
        &x,
        &y,
        None,
        &GfsviConfig { gamma: -1e-10, ..Default::default() }
    )));
    assert!(invalid(fit_g(
        &net,
        LEARNED,
        &prior,
        &x,
        &y,
        None,
        &GfsviConfig { measurement_points: 0, ..Default::default() }
    )));
    assert!(invalid(fit_g(
        &net,
        LEARNED,
        &KlPrior::WeightPushforward { sigma_p: 0.0 },
        &x,
        &y,
        None,
        &GfsviConfig::default()
    )));
    let mut bad = y.clone();
    bad[(3, 0)] = f64::NAN;
    assert!(matches!(
        fit_g(&net, LEARNED, &prior, &x, &bad, None, &GfsviConfig::default()),
        Err(GfsviError::Input(InputError::NonFinite { .. })
            | GfsviError::Core(fspace_core::CoreError::Input(InputError::NonFinite { .. })))
    ));
    let empty = DMatrix::<f64>::zeros(0, 1);
    assert!(matches!(
        fit_g(&net, LEARNED, &prior, &empty, &empty, None, &GfsviConfig::default()),
        Err(GfsviError::Input(InputError::Empty { .. })
            | GfsviError::Core(fspace_core::CoreError::Input(InputError::Empty { .. })))
    ));
    assert!(matches!(
        fit_g(&net, LEARNED, &prior, &x, &y, Some((&empty, &empty)), &GfsviConfig::default()),
        Err(GfsviError::Input(InputError::Empty { .. })
            | GfsviError::Core(fspace_core::CoreError::Input(InputError::Empty { .. })))
    ));
    assert!(matches!(
        fit_mfvi_g(&net, LEARNED, &x, &y, None, &MfviConfig { prior_std: -0.75, ..Default::default() }),
        Err(GfsviError::Input(InputError::Invalid { .. }))
    ));
    let gp = GpPrior::centered(Rbf::new(1.0, 0.5).unwrap());
    assert!(matches!(
        fit_fvi_g(
            &net,
            LEARNED,
            &gp,
            &x,
            &y,
            None,
            &FviConfig { n_uniform: 0, n_batch: 0, ..Default::default() }
        ),
        Err(GfsviError::Input(InputError::Invalid { .. }))
    ));
    assert!(matches!(
        fit_fvi_g(&net, LEARNED, &gp, &x, &bad, None, &FviConfig::default()),
        Err(GfsviError::Input(InputError::NonFinite { .. })
            | GfsviError::Core(fspace_core::CoreError::Input(InputError::NonFinite { .. })))
    ));
}

#[test]
fn linearized_posterior_predictions_agree_with_its_joint_and_samples() {
    let net = small_net(10);
    let p = net.n_params();
    let s = DVector::from_fn(p, |k, _| 0.01 * (1 + k % 3) as f64);
    let post = LinearizedPosterior::new(net.clone(), s.clone(), 0.1).unwrap();
    let x = rand_uniform(6, 1, -2.0, 2.0, &mut rng(11));
    use fspace_core::Posterior;
    let pred = post.predict(&x).unwrap();
    let (mean, cov) = post.predict_joint(&x).unwrap();
    fspace_testutil::assert_mat_close(&pred.mean, &mean, 1e-14, 1e-14);
    for i in 0..6 {
        assert!((pred.var[(i, 0)] - cov[(i, i)]).abs() < 1e-13);
    }
    let wg = net.weighted_gram(&x, Outputs::All, &s).unwrap();
    fspace_testutil::assert_mat_close(&cov, &wg.gram(), 1e-14, 1e-14);
    let mut r = rng(12);
    let samples = post.sample_functions(&x, 4000, &mut r).unwrap();
    for i in 0..6 {
        let m: f64 = samples.iter().map(|f| f[(i, 0)]).sum::<f64>() / 4000.0;
        let v: f64 = samples.iter().map(|f| (f[(i, 0)] - m).powi(2)).sum::<f64>() / 4000.0;
        assert!((m - mean[(i, 0)]).abs() < 4.0 * (cov[(i, i)] / 4000.0).sqrt() + 1e-12);
        assert!((v - cov[(i, i)]).abs() < 0.1 * cov[(i, i)] + 1e-12);
    }
}

#[test]
fn categorical_objective_gradient_matches_finite_differences_and_fit_runs() {
    // Three classes, independent RBF priors per output; the MC draws are fixed by the seed, so
    // the objective is a smooth deterministic function of (m, ρ).
    let net = Mlp::new(MlpConfig {
        input_dim: 2,
        hidden: vec![5],
        output_dim: 3,
        activation: Activation::Tanh,
        seed: 13,
    })
    .unwrap();
    let mut r = rng(14);
    let p = net.n_params();
    let params = VariationalParams {
        mean: net.params(),
        log_std: DVector::from_fn(p, |_, _| -1.0 + 0.3 * r.gen::<f64>()),
        log_noise_std: 0.0,
    };
    let xb = rand_uniform(6, 2, -1.0, 1.0, &mut r);
    let yb = DMatrix::from_column_slice(6, 1, &[0.0, 2.0, 1.0, 1.0, 0.0, 2.0]);
    let xm = rand_uniform(5, 2, -1.5, 1.5, &mut r);
    let prior = KlPrior::Gp(GpPrior::centered(
        fspace_kernels::Independent::new(Rbf::new(1.0, 0.7).unwrap(), 3).unwrap(),
    ));
    let term = DataTerm::Categorical { samples: 4, seed: 99 };
    let mut n0 = net.clone();
    let obj = objective_with(&mut n0, &params, &prior, &term, &xb, &yb, 20, &xm, 1e-3).unwrap();
    let value = |m: &[f64], rho: &[f64]| {
        let mut n2 = net.clone();
        let pr = VariationalParams {
            mean: DVector::from_column_slice(m),
            log_std: DVector::from_column_slice(rho),
            log_noise_std: 0.0,
        };
        objective_with(&mut n2, &pr, &prior, &term, &xb, &yb, 20, &xm, 1e-3).unwrap().value
    };
    let fd_m = fd_gradient(|m| value(m, params.log_std.as_slice()), params.mean.as_slice(), 1e-6);
    let fd_r = fd_gradient(|rv| value(params.mean.as_slice(), rv), params.log_std.as_slice(), 1e-6);
    let scale = fd_m.iter().chain(&fd_r).fold(1.0f64, |a, v| a.max(v.abs()));
    for k in 0..p {
        assert!(
            (obj.grad.mean[k] - fd_m[k]).abs() < 2e-6 * scale,
            "m[{k}]: {} vs {}",
            obj.grad.mean[k],
            fd_m[k]
        );
        assert!(
            (obj.grad.log_std[k] - fd_r[k]).abs() < 2e-6 * scale,
            "ρ[{k}]: {} vs {}",
            obj.grad.log_std[k],
            fd_r[k]
        );
    }
    // A label outside 0..3 is a typed error; a short fit runs and returns finite predictions.
    let bad = DMatrix::from_column_slice(6, 1, &[0.0, 3.0, 1.0, 1.0, 0.0, 2.0]);
    assert!(matches!(
        objective_with(&mut n0, &params, &prior, &term, &xb, &bad, 20, &xm, 1e-3),
        Err(GfsviError::Input(InputError::Invalid { .. }))
    ));
    let cfg = GfsviConfig {
        measurement_points: 10,
        class_samples: 2,
        optim: OptimConfig { schedule: Schedule::steps(20), ..Default::default() },
        ..Default::default()
    };
    let f = fit_g(&net, LikelihoodSpec::categorical(3), &prior, &xb, &yb, Some((&xb, &yb)), &cfg).unwrap();
    use fspace_core::Posterior;
    let pred = f.posterior.predict(&xm).unwrap();
    assert!(pred.mean.iter().chain(pred.var.iter()).all(|v| v.is_finite()));
}

mod invariants {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]
        /// D̂_KL^γ ≥ 0, = 0 for identical Gaussians, and decreases as γ grows (the shift makes
        /// both covariances more alike).
        #[test]
        fn regularized_kl_is_nonnegative_zero_at_equality_and_shrinks_with_gamma(seed in 0u64..1000, n in 1usize..6) {
            let mut r = rng(seed);
            let (a, b) = (randn_vec(n, &mut r), randn_vec(n, &mut r));
            let (aa, bb) = (spd(n, 2.0, 0.05, &mut r), spd(n, 3.0, 0.1, &mut r));
            let small = regularized_kl(&a, &aa, &b, &bb, 1e-6, n, false).unwrap().value;
            let large = regularized_kl(&a, &aa, &b, &bb, 1.0, n, false).unwrap().value;
            prop_assert!(small >= -1e-10 && large >= -1e-10);
            prop_assert!(large <= small + 1e-10);
            let same = regularized_kl(&a, &aa, &a, &aa, 1e-3, n, false).unwrap().value;
            prop_assert!(same.abs() < 1e-9);
        }
    }
}

#[test]
fn fvi_data_term_gradients_match_finite_differences() {
    // Both likelihoods: ∂/∂f of Σᵢ log p(yᵢ | fᵢ) against central differences of the value.
    let mut r = rng(61);
    let f = randn(6, 3, &mut r) * 2.0;
    let labels = DMatrix::from_fn(6, 1, |i, _| (i % 3) as f64);
    let targets = randn(6, 3, &mut r);
    let gaussian = LikelihoodSpec::IsotropicGaussian { sigma: 1.0, outputs: 3, learn: false };
    for (lik, y) in [(LikelihoodSpec::categorical(3), &labels), (gaussian, &targets)] {
        let (_, grad, _) = sample_data_term(&lik, &f, y, 0.7).unwrap();
        let fd = fd_gradient(
            |v| sample_data_term(&lik, &DMatrix::from_column_slice(6, 3, v), y, 0.7).unwrap().0,
            f.as_slice(),
            1e-5,
        );
        for (k, (a, b)) in grad.iter().zip(&fd).enumerate() {
            assert!((a - b).abs() < 1e-7, "{lik:?} entry {k}: {a} vs {b}");
        }
    }
    // Categorical value: log softmax of the label's logit.
    let (logp, _, sq) = sample_data_term(&LikelihoodSpec::categorical(3), &f, &labels, 1.0).unwrap();
    let direct: f64 = (0..6)
        .map(|i| {
            let z: f64 = (0..3).map(|c| f[(i, c)].exp()).sum();
            (f[(i, i % 3)].exp() / z).ln()
        })
        .sum();
    assert!((logp - direct).abs() < 1e-12 && sq == 0.0);
}

#[test]
fn categorical_fvi_classifies_blobs_and_rejects_bad_labels() {
    // Three Gaussian blobs in 2-D, an independent-output RBF prior on three logits.
    let mut r = rng(62);
    let as_column = |y: DVector<f64>| DMatrix::from_column_slice(y.len(), 1, y.as_slice());
    let (x, y) = three_blobs(150, 0.5, &mut r);
    let (xv, yv) = three_blobs(60, 0.5, &mut r);
    let (y, yv) = (as_column(y), as_column(yv));
    let net = Mlp::new(MlpConfig {
        input_dim: 2,
        hidden: vec![16],
        output_dim: 3,
        activation: Activation::Tanh,
        seed: 3,
    })
    .unwrap();
    let prior = GpPrior::centered(fspace_kernels::Independent::new(Rbf::new(4.0, 1.5).unwrap(), 3).unwrap());
    let config = FviConfig {
        n_uniform: 20,
        n_batch: 30,
        samples: 8,
        optim: OptimConfig {
            learning_rate: 1e-2,
            batch_size: 50,
            schedule: Schedule::steps(600).every_steps(50).patience(4),
            seed: 1,
        },
        ..FviConfig::default()
    };
    let fit =
        fit_fvi_g(&net, LikelihoodSpec::categorical(3), &prior, &x, &y, Some((&xv, &yv)), &config).unwrap();
    let probs = fit.posterior.class_probabilities(&xv, &Link::Probit).unwrap();
    let correct = (0..60).filter(|&i| probs.row(i).transpose().imax() == yv[(i, 0)] as usize).count();
    assert!(correct >= 55, "{correct} of 60 validation points");
    for i in 0..60 {
        assert!((probs.row(i).sum() - 1.0).abs() < 1e-12);
    }
    // Labels outside 0..3, fractional labels, targets with three columns: typed errors.
    for bad in [DMatrix::from_element(150, 1, 3.0), DMatrix::from_element(150, 1, 0.5)] {
        assert!(matches!(
            fit_fvi_g(&net, LikelihoodSpec::categorical(3), &prior, &x, &bad, None, &config),
            Err(GfsviError::Input(InputError::Invalid { .. }))
        ));
    }
    assert!(matches!(
        fit_fvi_g(&net, LikelihoodSpec::categorical(3), &prior, &x, &DMatrix::zeros(150, 3), None, &config),
        Err(GfsviError::Input(InputError::DimensionMismatch { .. })
            | GfsviError::Core(fspace_core::CoreError::Input(InputError::DimensionMismatch { .. })))
    ));
}

/// `Independent` with its `K₀ ⊗ I` structure hidden: forces FVI's dense prior solve.
#[derive(Debug)]
struct Opaque(fspace_kernels::Independent<Rbf>);

impl fspace_kernels::KernelBase for Opaque {
    fn input_dim(&self) -> Option<usize> {
        self.0.input_dim()
    }
    fn n_params(&self) -> usize {
        self.0.n_params()
    }
    fn params(&self) -> Vec<f64> {
        self.0.params()
    }
    fn set_params(&mut self, p: &[f64]) -> fspace_kernels::Result<()> {
        self.0.set_params(p)
    }
    fn param_names(&self) -> Vec<String> {
        self.0.param_names()
    }
}

impl fspace_kernels::MatrixKernel for Opaque {
    fn output_dim(&self) -> usize {
        self.0.output_dim()
    }
    fn eval_block(&self, x: &[f64], y: &[f64], out: &mut [f64]) {
        self.0.eval_block(x, y, out)
    }
    fn eval_block_grad(&self, x: &[f64], y: &[f64], out: &mut [f64]) {
        self.0.eval_block_grad(x, y, out)
    }
    fn matrix_spec(&self) -> Option<fspace_kernels::MatrixKernelSpec> {
        None
    }
}

#[test]
fn fvi_with_a_shared_output_kernel_equals_the_dense_prior_solve() {
    use fspace_kernels::{Independent, MatrixKernel};
    let mut r = rng(63);
    let x = randn(40, 2, &mut r);
    let y = DMatrix::from_fn(40, 1, |i, _| (i % 3) as f64);
    let net = Mlp::new(MlpConfig {
        input_dim: 2,
        hidden: vec![6],
        output_dim: 3,
        activation: Activation::Tanh,
        seed: 4,
    })
    .unwrap();
    let kernel = Independent::new(Rbf::new(2.0, 1.0).unwrap(), 3).unwrap();
    assert!(Opaque(kernel.clone()).shared_output_kernel().is_none());
    let config = FviConfig {
        n_uniform: 10,
        n_batch: 10,
        samples: 4,
        optim: OptimConfig { batch_size: 20, schedule: Schedule::steps(15), ..OptimConfig::default() },
        ..FviConfig::default()
    };
    let a = fit_fvi_g(
        &net,
        LikelihoodSpec::categorical(3),
        &GpPrior::centered(kernel.clone()),
        &x,
        &y,
        None,
        &config,
    )
    .unwrap();
    let b = fit_fvi_g(
        &net,
        LikelihoodSpec::categorical(3),
        &GpPrior::centered(Opaque(kernel)),
        &x,
        &y,
        None,
        &config,
    )
    .unwrap();
    let diff =
        (a.posterior.mean() - b.posterior.mean()).amax() + (a.posterior.std() - b.posterior.std()).amax();
    assert!(diff < 1e-9, "shared vs dense prior solve: {diff}");
}

#[test]
fn the_likelihood_spec_sets_sigma_y_and_refuses_what_a_method_lacks() {
    let net = small_net(70);
    let mut r = rng(71);
    let x = rand_uniform(20, 1, -1.0, 1.0, &mut r);
    let y = x.map(|v| v.sin());
    let prior = KlPrior::Gp(GpPrior::centered(Rbf::new(1.0, 0.5).unwrap()));
    let cfg = GfsviConfig {
        measurement_points: 5,
        optim: OptimConfig { schedule: Schedule::steps(5), ..Default::default() },
        ..Default::default()
    };
    // A fixed σ stays where it is; a learned one moves.
    let fixed = fit_g(&net, LikelihoodSpec::gaussian(0.3), &prior, &x, &y, None, &cfg).unwrap();
    assert_eq!(fixed.posterior.noise_std(), 0.3);
    let learned = fit_g(&net, LikelihoodSpec::gaussian_learned(0.3), &prior, &x, &y, None, &cfg).unwrap();
    assert!(learned.posterior.noise_std() != 0.3);
    for spec in [LikelihoodSpec::HeteroscedasticGaussian, LikelihoodSpec::Bernoulli] {
        let e = fit_g(&net, spec, &prior, &x, &y, None, &cfg).unwrap_err();
        // The heteroscedastic one has two outputs (a shape error); Bernoulli is unsupported.
        assert!(
            matches!(
                e,
                GfsviError::Input(InputError::DimensionMismatch { .. })
                    | GfsviError::Core(fspace_core::CoreError::Unsupported { method: "GFSVI / TFSVI", .. })
            ),
            "{e}"
        );
    }
    let e =
        fit_mfvi_g(&net, LikelihoodSpec::categorical(2), &x, &y, None, &MfviConfig::default()).unwrap_err();
    assert!(matches!(e, GfsviError::Input(InputError::DimensionMismatch { .. })), "{e}");
}

#[test]
fn save_load_round_trips_predict_bit_for_bit() {
    use fspace_core::{Persist, Posterior};
    use rand::SeedableRng;
    let net = small_net(80);
    let mut r = rng(81);
    let x = rand_uniform(20, 1, -1.0, 1.0, &mut r);
    let y = x.map(|v| v.sin());
    let xt = rand_uniform(7, 1, -2.0, 2.0, &mut r);
    let optim = OptimConfig { schedule: Schedule::steps(5), ..Default::default() };
    let dir = std::env::temp_dir().join(format!("fspace-gfsvi-persist-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    fn same<P: Posterior>(a: &P, b: &P, xt: &DMatrix<f64>) {
        assert_eq!(a.predict(xt).unwrap(), b.predict(xt).unwrap());
        let draw = |p: &P| p.sample_functions(xt, 3, &mut rand::rngs::StdRng::seed_from_u64(5)).unwrap();
        assert_eq!(draw(a), draw(b));
    }

    let prior = KlPrior::Gp(GpPrior::centered(Rbf::new(1.0, 0.5).unwrap()));
    let cfg = GfsviConfig { measurement_points: 5, optim: optim.clone(), ..Default::default() };
    let g = fit_g(&net, LEARNED, &prior, &x, &y, None, &cfg).unwrap().posterior;
    g.save(dir.join("gfsvi.json")).unwrap();
    let back = LinearizedPosterior::<Mlp>::load(dir.join("gfsvi.json")).unwrap();
    same(&g, &back, &xt);
    assert_eq!(g.noise_std().to_bits(), back.noise_std().to_bits());

    let gp = GpPrior::centered(Rbf::new(1.0, 0.5).unwrap());
    let fcfg = FviConfig {
        n_uniform: 5,
        n_batch: 5,
        optim: optim.clone(),
        predictive_samples: 4,
        ..Default::default()
    };
    let f = fit_fvi_g(&net, LEARNED, &gp, &x, &y, None, &fcfg).unwrap().posterior;
    f.save(dir.join("fvi.json")).unwrap();
    let back = WeightSamplePosterior::<Mlp>::load(dir.join("fvi.json")).unwrap();
    same(&f, &back, &xt);

    let m = fit_mfvi_g(
        &net,
        LEARNED,
        &x,
        &y,
        None,
        &MfviConfig { optim, predictive_samples: 4, ..Default::default() },
    )
    .unwrap()
    .posterior;
    m.save(dir.join("mfvi.json")).unwrap();
    same(&m, &WeightSamplePosterior::<Mlp>::load(dir.join("mfvi.json")).unwrap(), &xt);

    // The other type's file is refused by name.
    assert!(matches!(
        LinearizedPosterior::<Mlp>::load(dir.join("fvi.json")),
        Err(fspace_core::PersistError::WrongType { .. })
    ));
    std::fs::remove_dir_all(&dir).ok();
}

/// Runs `fit_sharded` on `world` threads, thread `r` holding the training rows
/// `bounds[r]..bounds[r + 1]` and the validation rows `val_bounds[r]..val_bounds[r + 1]` (none
/// where that span is empty); `prior_of(rank)` is each thread's prior.
#[allow(clippy::too_many_arguments)]
fn sharded_fits<'p>(
    net: &Mlp,
    lik: LikelihoodSpec,
    prior_of: impl Fn(usize) -> &'p KlPrior + Sync,
    (x, y): (&DMatrix<f64>, &DMatrix<f64>),
    validation: Option<(&DMatrix<f64>, &DMatrix<f64>)>,
    config: &GfsviConfig,
    bounds: &[usize],
    val_bounds: &[usize],
) -> Vec<Result<Fitted<LinearizedPosterior<Mlp>, OptimReport>>> {
    let world = bounds.len() - 1;
    let reducer = ThreadReduce::new(world);
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..world)
            .map(|rank| {
                let (reducer, prior_of) = (&reducer, &prior_of);
                scope.spawn(move || {
                    let rows: Vec<usize> = (bounds[rank]..bounds[rank + 1]).collect();
                    let (xs, ys) = (x.select_rows(&rows), y.select_rows(&rows));
                    let val: Vec<usize> = (val_bounds[rank]..val_bounds[rank + 1]).collect();
                    let own_val = validation
                        .filter(|_| !val.is_empty())
                        .map(|(xv, yv)| (xv.select_rows(&val), yv.select_rows(&val)));
                    let data = Data::new(&xs, &ys).unwrap();
                    let data = data.with_optional_validation(own_val.as_ref().map(|(a, b)| (a, b))).unwrap();
                    let mut reduce = |part, failed| reducer.sum::<GfsviError>(rank, part, failed);
                    let shard = fspace_core::ProcessShard { rank, world, reduce: &mut reduce };
                    fit_sharded(
                        net.clone(),
                        lik,
                        prior_of(rank),
                        &data,
                        config,
                        shard,
                        &mut fspace_core::Silent,
                    )
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Uneven contiguous cuts of `n` rows into `world` shards.
fn cuts(n: usize, world: usize) -> Vec<usize> {
    (0..=world).map(|k| (n * k * 2 / world).div_ceil(2).min(n)).collect()
}

/// `fit_sharded` over 2 and 3 "processes" (threads, uneven contiguous shards of 101 points):
/// every process ends with the single-process posterior — mean and variances to 1e-8, the
/// same early stop — for the Gaussian data term with a learned σ_y and for the categorical
/// one with batch points joining the measurement points, each with validation rows spread
/// unevenly (the last process holding none).
#[test]
fn sharded_gfsvi_is_the_single_process_fit() {
    let mut r = rng(11);
    let (n, nv) = (101, 37);
    let x = rand_uniform(n, 1, -2.0, 2.0, &mut r);
    let y_reg = x.map(|v| (2.0 * v).sin()) + randn(n, 1, &mut r) * 0.1;
    let y_cls = x.map(|v| if v > 0.3 { 1.0 } else { 0.0 });
    let xv = rand_uniform(nv, 1, -2.0, 2.0, &mut r);
    let yv_reg = xv.map(|v| (2.0 * v).sin()) + randn(nv, 1, &mut r) * 0.1;
    let yv_cls = xv.map(|v| if v > 0.3 { 1.0 } else { 0.0 });
    let prior = KlPrior::Gp(GpPrior::centered(Rbf::new(1.0, 0.5).unwrap()));
    let bbox = fspace_context::BoundingBox::from_data(&x, 0.0).unwrap();
    let config = GfsviConfig {
        measurement_points: 8,
        measurement_box: Some(bbox),
        optim: OptimConfig {
            batch_size: 16,
            schedule: Schedule::steps(60).every_steps(3).patience(2),
            learning_rate: 5e-2,
            seed: 3,
        },
        class_samples: 4,
        ..Default::default()
    };
    let class_prior = KlPrior::Gp(GpPrior::centered(
        fspace_kernels::Independent::new(Rbf::new(1.0, 0.5).unwrap(), 2).unwrap(),
    ));
    let class_config = GfsviConfig { measurement_from_batch: 5, ..config.clone() };
    for (lik, (y, yv), outputs, prior, config) in [
        (LEARNED, (&y_reg, &yv_reg), 1, &prior, &config),
        (LikelihoodSpec::Categorical { classes: 2 }, (&y_cls, &yv_cls), 2, &class_prior, &class_config),
    ] {
        let net = Mlp::new(MlpConfig {
            input_dim: 1,
            hidden: vec![6],
            output_dim: outputs,
            activation: Activation::Tanh,
            seed: 2,
        })
        .unwrap();
        let whole = Data::new(&x, y).unwrap().with_validation(&xv, yv).unwrap();
        let single = fit(net.clone(), lik, prior, &whole, config).unwrap();
        assert!(single.report.steps < 60, "the test wants an early stop: {:?}", single.report);
        // 1e-8, not 1e-10: Adam divides by √v̂, so the reduce's other order of additions
        // (ulps) grows in near-zero gradient components — 2.7e-10 in the validation NLL
        // within six steps at this learning rate.
        for world in [2usize, 3] {
            let mut val_bounds = cuts(nv, world - 1);
            val_bounds.push(nv);
            let fits = sharded_fits(
                &net,
                lik,
                |_| prior,
                (&x, y),
                Some((&xv, yv)),
                config,
                &cuts(n, world),
                &val_bounds,
            );
            for fitted in fits {
                let fitted = fitted.unwrap();
                assert_eq!(fitted.report.steps, single.report.steps, "{world} processes");
                assert_eq!(fitted.report.best_step, single.report.best_step, "{world} processes");
                for ((s, a), (_, b)) in fitted.report.validation.iter().zip(&single.report.validation) {
                    assert!((a - b).abs() <= 1e-8 * b.abs(), "{world} processes, step {s}: {a} vs {b}");
                }
                let (a, b) = (fitted.posterior.variances(), single.posterior.variances());
                let rel = (a - b).amax() / b.amax();
                assert!(rel < 1e-8, "{world} processes: variances differ by {rel:e}");
                let (ma, mb) = (fitted.posterior.network().params(), single.posterior.network().params());
                let rel = (&ma - &mb).amax() / mb.amax();
                assert!(rel < 1e-8, "{world} processes: means differ by {rel:e}");
                let rel = (fitted.posterior.noise_std() - single.posterior.noise_std()).abs();
                assert!(rel < 1e-8, "{world} processes: σ_y differs by {rel:e}");
            }
        }
    }
}

/// A process whose own work fails fails every process, none waits: bad targets (before the
/// first reduce: the layout's), and a prior whose outputs differ from the network's on one
/// process only (its divergence fails inside the first step, before that step's reduce) —
/// the failing process returns its own error, the others the reduce's.
#[test]
fn a_sharded_gfsvi_fit_fails_on_every_process_when_one_fails() {
    let mut r = rng(12);
    let n = 60;
    let x = rand_uniform(n, 1, -2.0, 2.0, &mut r);
    let y = x.map(|v| (2.0 * v).sin());
    let wide = DMatrix::from_fn(n, 2, |i, _| y[(i, 0)]);
    let prior = KlPrior::Gp(GpPrior::centered(Rbf::new(1.0, 0.5).unwrap()));
    let two_outputs = KlPrior::Gp(GpPrior::centered(
        fspace_kernels::Independent::new(Rbf::new(1.0, 0.5).unwrap(), 2).unwrap(),
    ));
    let config = GfsviConfig {
        measurement_points: 8,
        measurement_box: Some(fspace_context::BoundingBox::from_data(&x, 0.0).unwrap()),
        optim: OptimConfig { batch_size: 16, schedule: Schedule::steps(5), learning_rate: 1e-2, seed: 3 },
        ..Default::default()
    };
    let net = small_net(1);
    let lik = LikelihoodSpec::gaussian(0.3);
    let bounds = [0, 30, n];
    // Process 1's targets have two columns for a one-output network.
    let reducer = ThreadReduce::new(2);
    let results: Vec<_> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..2)
            .map(|rank| {
                let (reducer, net, prior, config, x) = (&reducer, &net, &prior, &config, &x);
                let y = if rank == 0 { &y } else { &wide };
                scope.spawn(move || {
                    let rows: Vec<usize> = (bounds[rank]..bounds[rank + 1]).collect();
                    let (xs, ys) = (x.select_rows(&rows), y.select_rows(&rows));
                    let mut reduce = |part, failed| reducer.sum::<GfsviError>(rank, part, failed);
                    let shard = fspace_core::ProcessShard { rank, world: 2, reduce: &mut reduce };
                    let data = Data::new(&xs, &ys).unwrap();
                    fit_sharded(net.clone(), lik, prior, &data, config, shard, &mut fspace_core::Silent)
                        .map(|_| ())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let e1 = results[1].as_ref().unwrap_err().to_string();
    assert!(e1.contains("dimension"), "{e1}");
    let e0 = results[0].as_ref().unwrap_err().to_string();
    assert!(e0.contains("another process failed"), "{e0}");

    // Process 1's prior has two outputs: its divergence fails in the first step.
    let fits = sharded_fits(
        &net,
        lik,
        |rank| if rank == 1 { &two_outputs } else { &prior },
        (&x, &y),
        None,
        &config,
        &bounds,
        &[0, 0, 0],
    );
    let e1 = fits[1].as_ref().map(|_| ()).unwrap_err().to_string();
    assert!(e1.contains("prior outputs"), "{e1}");
    let e0 = fits[0].as_ref().map(|_| ()).unwrap_err().to_string();
    assert!(e0.contains("another process failed"), "{e0}");
}

/// GFSVI over rows read by position (`fit_rows`) is the in-memory fit: the same minibatches give
/// the same variational parameters and so the same posterior, to the bit (regression with σ
/// learned, and three classes with points taken from the batch); no read is larger than one
/// minibatch; with a validation set read in chunks the early stopping picks the same step.
/// A corrupt row is a typed error naming the set, and a missing measurement box is refused
/// before any read.
#[test]
fn a_fit_over_rows_read_by_position_is_the_in_memory_fit() {
    use fspace_testutil::CountingRows;
    let mut r = rng(31);
    let x = rand_uniform(60, 2, -1.0, 1.0, &mut r);
    let xv = rand_uniform(25, 2, -1.0, 1.0, &mut r);
    let f = |x: &DMatrix<f64>| DMatrix::from_fn(x.nrows(), 1, |i, _| (3.0 * x[(i, 0)]).sin() + x[(i, 1)]);
    let classes = |x: &DMatrix<f64>| {
        DMatrix::from_fn(x.nrows(), 1, |i, _| if x[(i, 0)] > 0.3 { 2.0 } else { f64::from(x[(i, 1)] > 0.0) })
    };
    let test = rand_uniform(6, 2, -1.5, 1.5, &mut r);
    for (lik, y, yv, q, from_batch) in [
        (LikelihoodSpec::gaussian_learned(0.5), f(&x), f(&xv), 1, 0),
        (LikelihoodSpec::categorical(3), classes(&x), classes(&xv), 3, 4),
    ] {
        let net = Mlp::new(MlpConfig {
            input_dim: 2,
            hidden: vec![6],
            output_dim: q,
            activation: Activation::Tanh,
            seed: 4,
        })
        .unwrap();
        let prior = KlPrior::Gp(GpPrior::centered(
            fspace_kernels::Independent::new(Rbf::new(1.0, 0.7).unwrap(), q).unwrap(),
        ));
        let config = GfsviConfig {
            measurement_points: 8,
            measurement_from_batch: from_batch,
            measurement_box: Some(fspace_context::BoundingBox::from_data(&x, 0.0).unwrap()),
            optim: OptimConfig { batch_size: 16, schedule: Schedule::steps(30), ..Default::default() },
            ..Default::default()
        };
        let whole = fit_g(&net, lik, &prior, &x, &y, None, &config).unwrap();
        let mut rows = CountingRows::new(&x, &y);
        let read =
            fit_rows(net.clone(), lik, &prior, &mut rows, None, &config, &mut fspace_core::Silent).unwrap();
        let (a, b) = (whole.posterior.predict(&test).unwrap(), read.posterior.predict(&test).unwrap());
        assert!(a.mean.iter().zip(b.mean.iter()).all(|(u, v)| u.to_bits() == v.to_bits()));
        assert!(a.var.iter().zip(b.var.iter()).all(|(u, v)| u.to_bits() == v.to_bits()));
        // 60 rows: epochs of batches of 16, 16, 16 and 12; seven epochs and two batches.
        assert_eq!((rows.largest_read, rows.read), (16, 7 * 60 + 2 * 16));

        // Early stopping on a validation set read in chunks: the same steps.
        let early = GfsviConfig {
            optim: OptimConfig {
                schedule: Schedule::steps(60).every_steps(5).patience(2),
                ..config.optim.clone()
            },
            ..config.clone()
        };
        let whole = fit_g(&net, lik, &prior, &x, &y, Some((&xv, &yv)), &early).unwrap();
        let (mut rows, mut val) = (CountingRows::new(&x, &y), CountingRows::new(&xv, &yv));
        let read =
            fit_rows(net.clone(), lik, &prior, &mut rows, Some(&mut val), &early, &mut fspace_core::Silent)
                .unwrap();
        assert!(whole.report.validation.len() >= 2);
        assert_eq!((whole.report.steps, whole.report.best_step), (read.report.steps, read.report.best_step));
        for ((s1, v1), (s2, v2)) in whole.report.validation.iter().zip(&read.report.validation) {
            assert_eq!(s1, s2);
            assert!((v1 - v2).abs() <= 1e-12 * v1.abs(), "{v1} {v2}");
        }
        assert!(val.largest_read <= 16);

        // A corrupt row, and a missing box.
        let mut rows = CountingRows::new(&x, &y);
        rows.bad = Some((41, if q == 1 { f64::NAN } else { 7.0 }));
        let err = fit_rows(net.clone(), lik, &prior, &mut rows, None, &config, &mut fspace_core::Silent)
            .unwrap_err();
        let says = if q == 1 { "training targets" } else { "class label" };
        assert!(err.to_string().contains(says), "{err}");
        let unboxed = GfsviConfig { measurement_box: None, ..config.clone() };
        let mut rows = CountingRows::new(&x, &y);
        let err = fit_rows(net.clone(), lik, &prior, &mut rows, None, &unboxed, &mut fspace_core::Silent)
            .unwrap_err();
        assert!(err.to_string().contains("measurement box"), "{err}");
        assert_eq!(rows.read, 0);
    }
}
