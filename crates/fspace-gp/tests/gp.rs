//! GP baselines against dense computations, finite differences and known hyperparameters.

use fspace_core::{class_probabilities, CoreError, Data, LikelihoodSpec, Link, Persist, Posterior, Schedule};
use fspace_gp::*;
use fspace_input::InputError;
use fspace_kernels::*;
use fspace_testutil::{
    assert_mat_close, dense_log_normal, fd_gradient, rand_uniform, randn, randn_vec, rng, three_blobs,
};
use nalgebra::{DMatrix, DVector};

fn zoo() -> Vec<(&'static str, Box<dyn Kernel>)> {
    vec![
        ("rbf", Rbf::ard(1.3, vec![0.6, 1.1]).unwrap().boxed()),
        ("matern12", Matern12::new(0.8, 0.9).unwrap().boxed()),
        ("matern32", Matern32::new(1.1, 0.7).unwrap().boxed()),
        ("matern52", Matern52::ard(0.9, vec![0.5, 1.5]).unwrap().boxed()),
        ("rq", RationalQuadratic::new(1.0, 0.8, 1.7).unwrap().boxed()),
        ("periodic", Periodic::new(0.7, 1.2, 1.5).unwrap().boxed()),
        ("linear", Linear::new(0.4).unwrap().boxed()),
        (
            "composite",
            Rbf::new(1.0, 1.0).unwrap().boxed() * Periodic::new(0.5, 0.8, 2.0).unwrap().boxed()
                + Scaled::new(0.3, Matern52::new(1.0, 0.4).unwrap().boxed()).unwrap().boxed()
                + Constant::new(0.2).unwrap().boxed(),
        ),
    ]
}

/// The exact GP of `GP(mean, k)` with noise variance `s2` (isotropic over several outputs)
/// through its entry point, `exact::fit`.
fn exact_gp<K: MatrixKernel + Clone>(
    k: K,
    mean: PriorMean,
    s2: f64,
    x: &DMatrix<f64>,
    y: &DMatrix<f64>,
) -> fspace_gp::Result<ExactGp<K>> {
    let likelihood = LikelihoodSpec::gaussian_outputs(s2.sqrt(), k.output_dim());
    Ok(fspace_gp::exact::fit(likelihood, &GpPrior::with_kernel(k, mean), &Data::new(x, y)?)?.posterior)
}

/// The SVGP of `GP(mean, k)` with inducing inputs `z` from the noise variance `s2` (learned with
/// the kernel iff `cfg.learn_hyperparameters`) through its entry point, `svgp::fit`.
fn svgp_model<K: Kernel + Clone>(
    (k, mean, s2): (K, PriorMean, f64),
    z: DMatrix<f64>,
    x: &DMatrix<f64>,
    y: &DVector<f64>,
    cfg: &SvgpConfig,
) -> fspace_gp::Result<Svgp<K>> {
    let likelihood = LikelihoodSpec::Gaussian { sigma: s2.sqrt(), learn: cfg.learn_hyperparameters };
    let y = DMatrix::from_column_slice(y.len(), 1, y.as_slice());
    let cfg = SvgpConfig { inducing: InducingPoints::Given(z), ..cfg.clone() };
    Ok(fspace_gp::svgp::fit(likelihood, &GpPrior::with_kernel(k, mean), &Data::new(x, &y)?, &cfg)?.posterior)
}

/// An SVGP at the given hyperparameters after one natural-gradient step (ρ = 0.2) on `q(u)`:
/// the starting point of the step-level tests.
fn svgp_after_one_step<K: Kernel + Clone>(
    prior: (K, PriorMean, f64),
    z: DMatrix<f64>,
    x: &DMatrix<f64>,
    y: &DVector<f64>,
) -> Svgp<K> {
    let cfg = SvgpConfig { schedule: Schedule::steps(1), learn_hyperparameters: false, ..Default::default() };
    svgp_model(prior, z, x, y, &cfg).unwrap()
}

/// The Laplace GP classifier through its entry point, `classification::fit`.
fn gp_classifier<K: Kernel + Clone>(
    k: K,
    x: &DMatrix<f64>,
    labels: &DVector<f64>,
    cfg: &GpClassifierConfig,
) -> fspace_gp::Result<LaplaceGpClassifier<K>> {
    let y = DMatrix::from_column_slice(labels.len(), 1, labels.as_slice());
    let prior = GpPrior::with_kernel(k, PriorMean::Zero);
    Ok(fspace_gp::classification::fit(LikelihoodSpec::Bernoulli, &prior, &Data::new(x, &y)?, cfg)?.posterior)
}

/// The sparse Dirichlet GP with inducing inputs `z` through its entry point,
/// `sparse_dirichlet::fit`.
fn sparse_dirichlet_gp<K: Kernel + Clone>(
    k: K,
    z: DMatrix<f64>,
    x: &DMatrix<f64>,
    labels: &DVector<f64>,
    (classes, alpha_eps): (usize, f64),
) -> fspace_gp::Result<SparseDirichletGp<K>> {
    let y = DMatrix::from_column_slice(labels.len(), 1, labels.as_slice());
    let cfg = SparseDirichletConfig { inducing: InducingPoints::Given(z), alpha_eps, seed: 0 };
    let prior = GpPrior::with_kernel(k, PriorMean::Zero);
    let likelihood = LikelihoodSpec::categorical(classes);
    Ok(fspace_gp::sparse_dirichlet::fit(likelihood, &prior, &Data::new(x, &y)?, &cfg)?.posterior)
}

#[test]
fn exact_posterior_equals_the_dense_formulas() {
    let mut r = rng(1);
    let x = rand_uniform(30, 2, -2.0, 2.0, &mut r);
    let xs = rand_uniform(7, 2, -3.0, 3.0, &mut r);
    let y = randn(30, 1, &mut r);
    let k = Matern52::new(1.2, 0.8).unwrap();
    let s2 = 0.05;
    let gp = exact_gp(k.clone(), PriorMean::Constant(0.3), s2, &x, &y).unwrap();
    let ky = gram(&k, &x, &x).unwrap() + DMatrix::identity(30, 30) * s2;
    let kinv = ky.clone().try_inverse().unwrap();
    let ksx = gram(&k, &xs, &x).unwrap();
    let mean =
        ksx.clone() * &kinv * (y.column(0) - DVector::from_element(30, 0.3)) + DVector::from_element(7, 0.3);
    let cov = gram(&k, &xs, &xs).unwrap() - &ksx * &kinv * ksx.transpose();
    let (m, c) = gp.predict_joint(&xs).unwrap();
    assert_mat_close(&m, &DMatrix::from_column_slice(7, 1, mean.as_slice()), 1e-10, 1e-12);
    assert_mat_close(&c, &cov, 1e-9, 1e-12);
    let p = gp.predict(&xs).unwrap();
    for i in 0..7 {
        assert!((p.var[(i, 0)] - cov[(i, i)]).abs() < 1e-10);
    }
    let lml = dense_log_normal(&(y.column(0) - DVector::from_element(30, 0.3)), &ky);
    assert!((gp.log_marginal_likelihood() - lml).abs() < 1e-9 * lml.abs());
    assert_eq!(gp.jitter(), 0.0);
}

#[test]
fn lml_gradient_matches_finite_differences_for_every_kernel() {
    let mut r = rng(2);
    let x = rand_uniform(25, 2, -2.0, 2.0, &mut r);
    let y = randn(25, 1, &mut r);
    for (name, k) in zoo() {
        let s2 = 0.1;
        let gp = exact_gp(k.clone(), PriorMean::Zero, s2, &x, &y).unwrap();
        let analytic = gp.lml_gradient().unwrap();
        let mut theta = k.params();
        theta.push(s2.ln());
        let numeric = fd_gradient(
            |t| {
                let mut kk = k.clone();
                kk.set_params(&t[..t.len() - 1]).unwrap();
                exact_gp(kk, PriorMean::Zero, t[t.len() - 1].exp(), &x, &y).unwrap().log_marginal_likelihood()
            },
            &theta,
            1e-5,
        );
        for (i, (a, n)) in analytic.iter().zip(&numeric).enumerate() {
            assert!((a - n).abs() <= 1e-6 * n.abs().max(1.0), "{name} param {i}: {a} vs {n}");
        }
    }
}

fn sample_gp(k: &dyn Kernel, x: &DMatrix<f64>, noise_sd: f64, seed: u64) -> DMatrix<f64> {
    let n = x.nrows();
    let kxx = gram(&k, x, x).unwrap() + DMatrix::identity(n, n) * 1e-8;
    let l = kxx.cholesky().unwrap().l();
    let mut r = rng(seed);
    let f = l * randn_vec(n, &mut r);
    DMatrix::from_fn(n, 1, |i, _| f[i] + noise_sd * randn_vec(1, &mut r)[0])
}

#[test]
fn fitting_recovers_the_lengthscale_of_gp_samples() {
    // n = 500 draws from an RBF GP (ℓ = 0.7, σ² = 1, noise 0.1²); start from ℓ = 2, σ² = 0.5.
    let truth = Rbf::new(1.0, 0.7).unwrap();
    let mut fitted = Vec::new();
    for seed in 0..3 {
        let x = rand_uniform(500, 1, -5.0, 5.0, &mut rng(100 + seed));
        let y = sample_gp(&truth, &x, 0.1, 200 + seed);
        let cfg = FitConfig { iterations: 150, learning_rate: 0.05, restarts: 1, seed, ..Default::default() };
        let report =
            fit_hyperparameters(&Rbf::new(0.5, 2.0).unwrap(), &PriorMean::Zero, 0.05, &x, &y, &cfg).unwrap();
        fitted.push(report.kernel.lengthscales()[0]);
        eprintln!(
            "seed {seed}: ℓ = {:.4}, σ² = {:.4}, noise = {:.5}, lml = {:.2}",
            report.kernel.lengthscales()[0],
            report.kernel.variance(),
            report.noise_variance,
            report.log_marginal_likelihood
        );
        assert!(report.log_marginal_likelihood.is_finite());
    }
    let mean = fitted.iter().sum::<f64>() / fitted.len() as f64;
    assert!((mean - 0.7).abs() < 0.2 * 0.7, "fitted lengthscales {fitted:?}");
}

#[test]
fn minibatch_fitting_runs_and_improves_the_marginal_likelihood() {
    let x = rand_uniform(400, 1, -5.0, 5.0, &mut rng(7));
    let y = sample_gp(&Rbf::new(1.0, 0.7).unwrap(), &x, 0.1, 8);
    let init = Rbf::new(0.5, 3.0).unwrap();
    let before = exact_gp(init.clone(), PriorMean::Zero, 0.3, &x, &y).unwrap().log_marginal_likelihood();
    let cfg = FitConfig { iterations: 150, restarts: 2, batch_size: Some(100), ..Default::default() };
    let report = fit_hyperparameters(&init, &PriorMean::Zero, 0.3, &x, &y, &cfg).unwrap();
    assert_eq!(report.restart_lml.len(), 2);
    assert!(report.log_marginal_likelihood > before + 50.0, "{} vs {before}", report.log_marginal_likelihood);
}

#[test]
fn gp_classification_separates_two_moons() {
    let (train, _) = fspace_data::two_moons(200, 0.1, &mut rng(9)).unwrap();
    let (test, _) = fspace_data::two_moons(500, 0.1, &mut rng(10)).unwrap();
    let clf =
        gp_classifier(Rbf::new(4.0, 0.5).unwrap(), &train.x, &train.y_vec(), &GpClassifierConfig::default())
            .unwrap();
    let pred = clf.predict(&test.x).unwrap();
    let probs = class_probabilities(&pred, &Link::Probit).unwrap();
    let acc = fspace_metrics::accuracy(&probs, test.y.as_slice()).unwrap();
    eprintln!("two-moons test accuracy {acc:.4}");
    assert!(acc >= 0.95, "accuracy {acc}");
    assert!(clf.iterations() < 50 && clf.log_marginal_likelihood().is_finite());
    // Far from the data the latent variance reverts towards the prior variance.
    let far = clf.predict(&DMatrix::from_row_slice(1, 2, &[8.0, 8.0])).unwrap();
    assert!(far.var[(0, 0)] > 0.99 * 4.0 && pred.var.mean() < 2.0, "{} {}", far.var[(0, 0)], pred.var.mean());
    assert!(gp_classifier(
        Rbf::new(1.0, 1.0).unwrap(),
        &train.x,
        &DVector::from_element(200, 2.0),
        &GpClassifierConfig::default()
    )
    .is_err());
}

#[test]
fn dirichlet_transform_matches_milios_and_fitting_improves_the_evidence() {
    let (y, var) = dirichlet_targets(&DVector::from_vec(vec![1.0, 0.0]), 2, 0.01).unwrap();
    let (a1, a0) = (1.01f64, 0.01f64);
    assert!(
        (var[(0, 1)] - (1.0 / a1 + 1.0).ln()).abs() < 1e-15
            && (var[(0, 0)] - (1.0 / a0 + 1.0).ln()).abs() < 1e-15
    );
    assert!((y[(0, 1)] - (a1.ln() - var[(0, 1)] / 2.0)).abs() < 1e-15);
    assert!(dirichlet_targets(&DVector::from_vec(vec![2.0]), 2, 0.01).is_err());
    let (moons, _) = fspace_data::two_moons(80, 0.1, &mut rng(11)).unwrap();
    let init = Rbf::new(1.0, 3.0).unwrap();
    let cfg = FitConfig { iterations: 60, learning_rate: 0.1, ..Default::default() };
    let (_, before) = fit_dirichlet_hyperparameters(
        &init,
        &moons.x,
        &moons.y_vec(),
        2,
        0.01,
        &FitConfig { iterations: 1, learning_rate: 1e-9, ..cfg.clone() },
    )
    .unwrap();
    let (fitted, after) =
        fit_dirichlet_hyperparameters(&init, &moons.x, &moons.y_vec(), 2, 0.01, &cfg).unwrap();
    assert!(after > before, "{after} vs {before}");
    assert!(fitted.lengthscales()[0] < 3.0);
}

#[test]
fn svgp_with_inducing_points_at_the_data_is_the_exact_gp() {
    let mut r = rng(12);
    let x = rand_uniform(40, 1, -3.0, 3.0, &mut r);
    let y = DMatrix::from_fn(40, 1, |i, _| x[(i, 0)].sin() + 0.1 * randn_vec(1, &mut r)[0]);
    // Matérn-3/2 keeps K(X, X) well conditioned (≈ 6·10⁵); an RBF Gram here is numerically
    // singular and would need jitter, which changes the model being compared.
    let k = Matern32::new(1.0, 0.8).unwrap();
    let s2 = 0.02;
    let exact = exact_gp(k.clone(), PriorMean::Zero, s2, &x, &y).unwrap();
    let mut svgp =
        svgp_after_one_step((k.clone(), PriorMean::Zero, s2), x.clone(), &x, &y.column(0).into_owned());
    svgp.set_optimal_variational(&x, &y.column(0).into_owned()).unwrap();
    let xs = rand_uniform(9, 1, -4.0, 4.0, &mut r);
    let (pe, ps) = (exact.predict(&xs).unwrap(), svgp.predict(&xs).unwrap());
    assert_mat_close(&ps.mean, &pe.mean, 1e-6, 1e-8);
    assert_mat_close(&ps.var, &pe.var, 1e-5, 1e-8);
    let elbo = svgp.elbo(&x, &y.column(0).into_owned()).unwrap();
    let lml = exact.log_marginal_likelihood();
    assert!((elbo - lml).abs() < 1e-5 * lml.abs(), "Titsias bound is tight at Z = X: {elbo} vs {lml}");

    // M ≪ n: the bound is strict, for any q(u), and the optimal q(u) is the best one.
    let z = kmeans(&x, 5, 50, 0).unwrap();
    let mut small = svgp_after_one_step((k, PriorMean::Zero, s2), z, &x, &y.column(0).into_owned());
    let partial_elbo = small.elbo(&x, &y.column(0).into_owned()).unwrap();
    small.set_optimal_variational(&x, &y.column(0).into_owned()).unwrap();
    let opt_elbo = small.elbo(&x, &y.column(0).into_owned()).unwrap();
    assert!(opt_elbo < lml && partial_elbo < opt_elbo, "{partial_elbo} < {opt_elbo} < {lml}");
}

#[test]
fn svgp_elbo_gradient_matches_finite_differences() {
    let mut r = rng(13);
    let x = rand_uniform(30, 2, -2.0, 2.0, &mut r);
    let y = randn_vec(30, &mut r);
    let k = Rbf::ard(1.2, vec![0.7, 1.1]).unwrap().boxed() + Matern32::new(0.3, 0.5).unwrap().boxed();
    let z = rand_uniform(6, 2, -2.0, 2.0, &mut r);
    let mut svgp = svgp_after_one_step((k.clone(), PriorMean::Constant(0.1), 0.2), z.clone(), &x, &y);
    // A non-trivial q(u), from a partial natural-gradient step on a subset.
    svgp.natural_gradient_step(&x.rows(0, 10).into_owned(), &y.rows(0, 10).into_owned(), 30, 0.7).unwrap();
    let batch = (x.rows(5, 12).into_owned(), y.rows(5, 12).into_owned());
    let analytic = svgp.elbo_gradient(&batch.0, &batch.1, 30).unwrap();
    let mut theta = k.params();
    theta.push(0.2f64.ln());
    // The minibatch ELBO as a function of the hyperparameters at this fixed q(u): set them on
    // a clone and evaluate the n-scaled objective through elbo() on a scaled copy of the batch.
    let numeric = fd_gradient(
        |t| {
            let mut kk = k.clone();
            kk.set_params(&t[..t.len() - 1]).unwrap();
            let mut s = svgp.clone();
            s.set_hyperparameters(kk, t[t.len() - 1].exp()).unwrap();
            s.minibatch_elbo(&batch.0, &batch.1, 30).unwrap()
        },
        &theta,
        1e-5,
    );
    for (i, (a, n)) in analytic.iter().zip(&numeric).enumerate() {
        assert!((a - n).abs() <= 1e-6 * n.abs().max(1.0), "param {i}: {a} vs {n}");
    }
}

#[test]
fn svgp_inducing_gradient_matches_finite_differences() {
    // Every kernel with an input gradient. The linear kernel alone has a rank-2 K_mm for five
    // points in 2-d (then the jitter, not the model, moves with Z), so it enters plus an RBF:
    // there ∂k(z, z)/∂z ≠ 0 exercises the diagonal of K_mm.
    let mut r = rng(15);
    let x = rand_uniform(25, 2, -2.0, 2.0, &mut r);
    let y = randn_vec(25, &mut r);
    let z = rand_uniform(5, 2, -2.0, 2.0, &mut r);
    for (name, k) in zoo() {
        let k = if name == "linear" { k + Rbf::new(0.5, 0.9).unwrap().boxed() } else { k };
        let mut svgp = svgp_after_one_step((k.clone(), PriorMean::Constant(0.1), 0.3), z.clone(), &x, &y);
        svgp.natural_gradient_step(&x.rows(0, 10).into_owned(), &y.rows(0, 10).into_owned(), 25, 0.6)
            .unwrap();
        let batch = (x.rows(8, 12).into_owned(), y.rows(8, 12).into_owned());
        let analytic = svgp.elbo_gradient_inducing(&batch.0, &batch.1, 25).unwrap();
        let numeric = fd_gradient(
            |zv| {
                let mut s = svgp.clone();
                s.set_inducing_points(DMatrix::from_column_slice(5, 2, zv)).unwrap();
                s.minibatch_elbo(&batch.0, &batch.1, 25).unwrap()
            },
            z.as_slice(),
            1e-6,
        );
        let scale = numeric.iter().fold(1.0f64, |m, v| m.max(v.abs()));
        for (i, (a, n)) in analytic.as_slice().iter().zip(&numeric).enumerate() {
            assert!((a - n).abs() <= 1e-5 * scale, "{name} z entry {i}: {a} vs {n}");
        }
    }
}

#[test]
fn learned_inducing_points_tighten_the_collapsed_bound() {
    // Six inducing points bunched at one end of the data: the optimal q(u) for them explains
    // little, and moving Z (kernel fixed) must raise the collapsed bound and bring the
    // predictive towards the exact GP's.
    let mut r = rng(16);
    let n = 300;
    let x = rand_uniform(n, 1, -3.0, 3.0, &mut r);
    let y = DVector::from_fn(n, |i, _| (2.0 * x[(i, 0)]).sin() + 0.1 * randn_vec(1, &mut r)[0]);
    let k = Rbf::new(1.0, 0.6).unwrap();
    let s2 = 0.01;
    let z0 = DMatrix::from_fn(6, 1, |i, _| -3.0 + 0.1 * i as f64);
    let mut fixed = svgp_after_one_step((k.clone(), PriorMean::Zero, s2), z0.clone(), &x, &y);
    fixed.set_optimal_variational(&x, &y).unwrap();
    let fixed_bound = fixed.elbo(&x, &y).unwrap();
    let cfg = SvgpConfig {
        batch_size: n,
        schedule: Schedule::steps(400),
        natural_step: 1.0,
        learning_rate: 0.05,
        learn_hyperparameters: false,
        learn_inducing_points: true,
        seed: 3,
        ..Default::default()
    };
    let mut learned = svgp_model((k.clone(), PriorMean::Zero, s2), z0.clone(), &x, &y, &cfg).unwrap();
    learned.set_optimal_variational(&x, &y).unwrap();
    let learned_bound = learned.elbo(&x, &y).unwrap();
    let exact =
        exact_gp(k, PriorMean::Zero, s2, &x, &DMatrix::from_column_slice(n, 1, y.as_slice())).unwrap();
    let lml = exact.log_marginal_likelihood();
    assert!(fixed_bound < learned_bound && learned_bound <= lml, "{fixed_bound} < {learned_bound} ≤ {lml}");
    assert!(learned_bound - fixed_bound > 1000.0, "{fixed_bound} → {learned_bound}");
    let spread = learned
        .inducing_points()
        .column(0)
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| (lo.min(*v), hi.max(*v)));
    assert!(spread.0 < -1.5 && spread.1 > 1.5, "Z spread over the data: {spread:?}");
    let xs = DMatrix::from_fn(13, 1, |i, _| -3.0 + 0.5 * i as f64);
    let (pe, pl, pf) =
        (exact.predict(&xs).unwrap(), learned.predict(&xs).unwrap(), fixed.predict(&xs).unwrap());
    let err = |p: &fspace_core::FunctionPredictive| (&p.mean - &pe.mean).norm();
    assert!(
        err(&pl) < 0.5 * err(&pf),
        "mean error to the exact GP: learned {} vs fixed {}",
        err(&pl),
        err(&pf)
    );
}

#[test]
fn svgp_training_improves_the_elbo() {
    let mut r = rng(14);
    let x = rand_uniform(600, 1, -4.0, 4.0, &mut r);
    let y = DVector::from_fn(600, |i, _| (1.5 * x[(i, 0)]).sin() + 0.1 * randn_vec(1, &mut r)[0]);
    let z = kmeans(&x, 20, 50, 1).unwrap();
    let prior = (Rbf::new(0.5, 2.0).unwrap(), PriorMean::Zero, 0.5);
    // One natural-gradient step at the initial hyperparameters, against 300 steps that learn
    // the kernel and the noise.
    let before = svgp_after_one_step(prior.clone(), z.clone(), &x, &y).elbo(&x, &y).unwrap();
    let cfg = SvgpConfig {
        batch_size: 100,
        schedule: Schedule::steps(300),
        learning_rate: 0.03,
        ..Default::default()
    };
    let svgp = svgp_model(prior, z, &x, &y, &cfg).unwrap();
    let after = svgp.elbo(&x, &y).unwrap();
    assert!(after > before + 100.0, "{before} → {after}");
    assert!(svgp.noise_variance() < 0.1, "noise learned: {}", svgp.noise_variance());
    let pred = svgp.predict(&DMatrix::from_row_slice(3, 1, &[-1.0, 0.0, 1.0])).unwrap();
    for (i, t) in [-1.0f64, 0.0, 1.0].iter().enumerate() {
        assert!((pred.mean[(i, 0)] - (1.5 * t).sin()).abs() < 0.1);
    }
}

#[test]
fn bad_input_is_a_typed_error() {
    let x = DMatrix::from_row_slice(3, 1, &[0.0, 1.0, 2.0]);
    let y = DMatrix::from_row_slice(3, 1, &[0.0, f64::NAN, 1.0]);
    let k = Rbf::new(1.0, 1.0).unwrap();
    assert!(matches!(
        exact_gp(k.clone(), PriorMean::Zero, 0.1, &x, &y),
        Err(GpError::Core(CoreError::Input(InputError::NonFinite { .. } | InputError::Invalid { .. })))
    ));
    let y = DMatrix::from_row_slice(3, 1, &[0.0, 0.5, 1.0]);
    assert!(exact_gp(k.clone(), PriorMean::Zero, -0.1, &x, &y).is_err());
    assert!(exact_gp(k.clone(), PriorMean::Zero, 0.1, &x, &DMatrix::zeros(2, 1)).is_err());
    // Duplicated inputs with negligible noise: recovered by reported jitter.
    let dup = DMatrix::from_row_slice(4, 1, &[0.0, 0.0, 1.0, 1.0]);
    let gp = exact_gp(
        k.clone(),
        PriorMean::Zero,
        1e-18,
        &dup,
        &DMatrix::from_row_slice(4, 1, &[0.0, 0.0, 1.0, 1.0]),
    )
    .unwrap();
    assert!(gp.jitter() > 0.0);
    assert!(kmeans(&x, 4, 10, 0).is_err() && kmeans(&x, 0, 10, 0).is_err());
    let y0 = y.column(0).into_owned();
    let five = rand_uniform(5, 1, 0.0, 2.0, &mut rng(0));
    assert!(
        matches!(
            svgp_model((k.clone(), PriorMean::Zero, 0.1), five, &x, &y0, &SvgpConfig::default()),
            Err(GpError::Input(InputError::Invalid { .. }))
        ),
        "more inducing points than data"
    );
    assert!(
        svgp_model((k.clone(), PriorMean::Zero, 0.0), x.clone(), &x, &y0, &SvgpConfig::default()).is_err()
    );
    // Learning Z with a kernel that has no input gradient is refused before any step.
    let cfg = SvgpConfig { learn_inducing_points: true, schedule: Schedule::steps(5), ..Default::default() };
    assert!(matches!(
        svgp_model(
            (NoInputGradient(k.clone()), PriorMean::Zero, 0.1),
            x.rows(0, 2).into_owned(),
            &x,
            &y0,
            &cfg
        ),
        Err(GpError::Kernel(KernelError::Unsupported(_)))
    ));
    let mut svgp = svgp_after_one_step((k.clone(), PriorMean::Zero, 0.1), x.rows(0, 2).into_owned(), &x, &y0);
    assert!(svgp.set_inducing_points(DMatrix::zeros(2, 1)).is_ok(), "the same shape, finite");
    assert!(svgp.set_inducing_points(DMatrix::zeros(3, 1)).is_err());
    assert!(svgp.set_inducing_points(DMatrix::from_element(2, 1, f64::NAN)).is_err());
    let cfg = FitConfig { restarts: 0, ..Default::default() };
    assert!(fit_hyperparameters(&k, &PriorMean::Zero, 0.1, &x, &y, &cfg).is_err());
    let cfg = FitConfig { batch_size: Some(10), ..Default::default() };
    assert!(fit_hyperparameters(&k, &PriorMean::Zero, 0.1, &x, &y, &cfg).is_err());
}

#[test]
fn sparse_dirichlet_gp_classifies_and_rejects_bad_input() {
    // Three well-separated blobs, 12 k-means inducing points: MC class probabilities of the
    // latent marginals put the right class first almost everywhere, and far away the prior returns.
    let n = 90;
    let (x, labels) = three_blobs(n, 0.5, &mut rng(43));
    let z = kmeans(&x, 12, 50, 0).unwrap();
    let gp = sparse_dirichlet_gp(Rbf::new(2.0, 1.0).unwrap(), z, &x, &labels, (3, 0.01)).unwrap();
    let pred = gp.predict(&x).unwrap();
    let probs = class_probabilities(&pred, &Link::MonteCarlo { samples: 200, seed: 44 }).unwrap();
    let correct = (0..n).filter(|&i| probs.row(i).transpose().imax() == labels[i] as usize).count();
    assert!(correct as f64 / n as f64 > 0.95, "{correct} of {n}");
    let far = gp.predict(&DMatrix::from_row_slice(1, 2, &[20.0, -20.0])).unwrap();
    // Far away the prior variance (2) comes back; on the data the heavy Milios noise on the
    // other classes' points (log 101) still leaves it well below (measured 0.43).
    assert!((far.var[(0, 0)] - 2.0).abs() < 1e-9 && pred.var.column(0).mean() < 0.3 * 2.0);
    assert!((far.mean[(0, 0)] - far.mean[(0, 1)]).abs() < 1e-9, "far away: the prior means");
    // Bad input: labels out of range, mismatched shapes, no inducing points, more inducing
    // points than data, α_ε ≤ 0.
    let k = Rbf::new(1.0, 1.0).unwrap();
    let z = x.rows(0, 5).into_owned();
    let mut bad = labels.clone();
    bad[3] = 3.0;
    assert!(sparse_dirichlet_gp(k.clone(), z.clone(), &x, &bad, (3, 0.01)).is_err());
    assert!(
        sparse_dirichlet_gp(k.clone(), z.clone(), &x, &labels.rows(0, 10).into_owned(), (3, 0.01)).is_err()
    );
    assert!(sparse_dirichlet_gp(k.clone(), DMatrix::zeros(0, 2), &x, &labels, (3, 0.01)).is_err());
    assert!(sparse_dirichlet_gp(k.clone(), DMatrix::zeros(4, 3), &x, &labels, (3, 0.01)).is_err());
    let too_many = DMatrix::from_fn(x.nrows() + 1, 2, |i, j| (i + j) as f64);
    let err = sparse_dirichlet_gp(k.clone(), too_many, &x, &labels, (3, 0.01)).unwrap_err();
    assert!(err.to_string().contains("inducing points"), "{err}");
    assert!(sparse_dirichlet_gp(k.clone(), z.clone(), &x, &labels, (3, 0.0)).is_err());
    assert!(gp.predict(&DMatrix::zeros(2, 3)).is_err());
}

/// A user kernel without an input gradient (the trait's default `eval_grad_x`).
#[derive(Debug, Clone)]
struct NoInputGradient(Rbf);

impl KernelBase for NoInputGradient {
    fn input_dim(&self) -> Option<usize> {
        self.0.input_dim()
    }
    fn n_params(&self) -> usize {
        self.0.n_params()
    }
    fn params(&self) -> Vec<f64> {
        self.0.params()
    }
    fn param_names(&self) -> Vec<String> {
        self.0.param_names()
    }
    fn set_params(&mut self, p: &[f64]) -> std::result::Result<(), KernelError> {
        self.0.set_params(p)
    }
}

impl Kernel for NoInputGradient {
    fn eval(&self, x: &[f64], y: &[f64]) -> f64 {
        self.0.eval(x, y)
    }
    fn eval_grad(&self, x: &[f64], y: &[f64], out: &mut [f64]) {
        self.0.eval_grad(x, y, out)
    }
    fn clone_box(&self) -> Box<dyn Kernel> {
        Box::new(self.clone())
    }
}

#[test]
fn every_gp_posterior_round_trips_through_save_and_load_bit_for_bit() {
    use fspace_core::{Persist, PersistError};
    use rand::SeedableRng;
    let dir = std::env::temp_dir().join(format!("fspace-gp-persist-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut r = rng(90);
    let x = rand_uniform(25, 1, -2.0, 2.0, &mut r);
    let y = x.map(|v| v.sin());
    let xt = rand_uniform(6, 1, -3.0, 3.0, &mut r);
    fn same<P: Posterior>(a: &P, b: &P, xt: &DMatrix<f64>) {
        assert_eq!(a.predict(xt).unwrap(), b.predict(xt).unwrap());
        let draw = |p: &P| p.sample_functions(xt, 2, &mut rand::rngs::StdRng::seed_from_u64(3)).unwrap();
        assert_eq!(draw(a), draw(b));
    }
    fn round_trip<P: Persist>(p: &P, path: &std::path::Path) -> P {
        p.save(path).unwrap();
        P::load(path).unwrap()
    }

    let exact = exact_gp(Rbf::new(1.0, 0.5).unwrap(), PriorMean::Constant(0.2), 0.01, &x, &y).unwrap();
    same(&exact, &round_trip(&exact, &dir.join("exact.json")), &xt);
    // A composite kernel (Rasmussen & Williams' shape) is saved through its spec.
    let sum = Rbf::new(1.0, 1.5).unwrap().boxed() + Periodic::new(0.5, 1.0, 1.3).unwrap().boxed();
    let composite = exact_gp(sum, PriorMean::Zero, 0.02, &x, &y).unwrap();
    same(&composite, &round_trip(&composite, &dir.join("composite.json")), &xt);

    let svgp = svgp_model(
        (Rbf::new(1.0, 0.5).unwrap(), PriorMean::Zero, 0.05),
        x.rows(0, 8).into_owned(),
        &x,
        &y.column(0).into_owned(),
        &SvgpConfig { schedule: Schedule::steps(5), ..Default::default() },
    )
    .unwrap();
    same(&svgp, &round_trip(&svgp, &dir.join("svgp.json")), &xt);

    let labels = DVector::from_fn(25, |i, _| if x[(i, 0)] > 0.0 { 1.0 } else { 0.0 });
    let clf = gp_classifier(Rbf::new(2.0, 1.0).unwrap(), &x, &labels, &Default::default()).unwrap();
    same(&clf, &round_trip(&clf, &dir.join("classifier.json")), &xt);

    let (xb, yb) = three_blobs(30, 0.4, &mut r);
    let xbt = rand_uniform(5, 2, -2.0, 2.0, &mut r);
    let sparse =
        sparse_dirichlet_gp(Rbf::new(1.0, 1.0).unwrap(), xb.rows(0, 10).into_owned(), &xb, &yb, (3, 0.01))
            .unwrap();
    same(&sparse, &round_trip(&sparse, &dir.join("sparse.json")), &xbt);

    // Another type's file and a tampered hyperparameter are refused with typed errors.
    assert!(matches!(
        Svgp::<Rbf>::load(dir.join("exact.json")),
        Err(PersistError::WrongType { expected: "fspace_gp::Svgp", .. })
    ));
    let text = std::fs::read_to_string(dir.join("exact.json")).unwrap();
    let tampered = text.replacen("\"variance\":1.0", "\"variance\":-1.0", 1);
    assert_ne!(tampered, text);
    assert!(matches!(ExactGp::<Rbf>::from_json(&tampered), Err(PersistError::Invalid { .. })));
    // A closure mean has no saved form: an error, not a panic.
    let f: MeanFn = std::sync::Arc::new(|_x: &[f64], out: &mut [f64]| out[0] = 0.0);
    let closure = exact_gp(Rbf::new(1.0, 0.5).unwrap(), PriorMean::Function(f), 0.01, &x, &y).unwrap();
    assert!(matches!(closure.to_json(), Err(PersistError::Unserialisable { .. })));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn exact_fit_is_the_exact_gp_in_the_workspace_call_shape() {
    use fspace_core::Persist;
    let mut r = rng(95);
    let x = rand_uniform(30, 1, -2.0, 2.0, &mut r);
    let y = x.map(|v| v.sin());
    let xt = rand_uniform(7, 1, -3.0, 3.0, &mut r);
    let kernel = Rbf::new(1.2, 0.6).unwrap();
    let prior = GpPrior::new(kernel.clone(), PriorMean::Constant(0.1));
    let data = Data::new(&x, &y).unwrap();
    let fitted = fspace_gp::exact::fit(LikelihoodSpec::gaussian(0.1), &prior, &data).unwrap();
    // A prior that keeps the kernel's type gives the same numbers, and the posterior holds that type.
    let typed = GpPrior::with_kernel(kernel.clone(), PriorMean::Constant(0.1));
    let direct: ExactGp<Rbf> =
        fspace_gp::exact::fit(LikelihoodSpec::gaussian(0.1), &typed, &data).unwrap().posterior;
    assert_eq!(direct.kernel().lengthscales(), kernel.lengthscales());
    assert_eq!(fitted.posterior.predict(&xt).unwrap(), direct.predict(&xt).unwrap());
    assert_eq!(fitted.report.log_marginal_likelihood, direct.log_marginal_likelihood());
    // It saves and loads through the kernel's spec, and the prior itself serialises.
    let text = fitted.posterior.to_json().unwrap();
    let back = ExactGp::<SharedKernel>::from_json(&text).unwrap();
    assert_eq!(back.predict(&xt).unwrap(), direct.predict(&xt).unwrap());
    let prior_back: GpPrior = serde_json::from_str(&serde_json::to_string(&prior).unwrap()).unwrap();
    assert_eq!(prior_back.gram(&xt).unwrap(), prior.gram(&xt).unwrap());
    // Learning σ, a classification likelihood and mismatched outputs are typed errors.
    assert!(matches!(
        fspace_gp::exact::fit(LikelihoodSpec::gaussian_learned(0.1), &prior, &data),
        Err(GpError::Input(InputError::Invalid { .. }))
    ));
    assert!(matches!(
        fspace_gp::exact::fit(LikelihoodSpec::Bernoulli, &prior, &data),
        Err(GpError::Core(CoreError::Unsupported { .. }))
    ));
    let iso = LikelihoodSpec::IsotropicGaussian { sigma: 0.1, outputs: 2, learn: false };
    assert!(matches!(
        fspace_gp::exact::fit(iso, &prior, &data),
        Err(GpError::Input(InputError::Invalid { .. }))
    ));
}

#[test]
fn svgp_fit_is_the_svgp_in_the_workspace_call_shape() {
    let mut r = rng(96);
    let x = rand_uniform(300, 1, -4.0, 4.0, &mut r);
    let y = DMatrix::from_fn(300, 1, |i, _| (1.5 * x[(i, 0)]).sin() + 0.1 * randn_vec(1, &mut r)[0]);
    let xt = rand_uniform(7, 1, -3.0, 3.0, &mut r);
    let kernel = Rbf::new(0.5, 2.0).unwrap();
    let data = Data::new(&x, &y).unwrap();
    let cfg = SvgpConfig {
        batch_size: 100,
        schedule: Schedule::steps(100),
        learning_rate: 0.03,
        inducing: InducingPoints::KMeans { points: 15, iterations: 30 },
        seed: 4,
        ..Default::default()
    };
    // σ learned, on a prior that keeps the kernel's type: the k-means centres of the config
    // are the centres given by hand.
    let typed = GpPrior::with_kernel(kernel.clone(), PriorMean::Zero);
    let fitted = fspace_gp::svgp::fit(LikelihoodSpec::gaussian_learned(0.7), &typed, &data, &cfg).unwrap();
    let z = kmeans(&x, 15, 30, 4).unwrap();
    let given = SvgpConfig { inducing: InducingPoints::Given(z), ..cfg.clone() };
    let direct: Svgp<Rbf> =
        fspace_gp::svgp::fit(LikelihoodSpec::gaussian_learned(0.7), &typed, &data, &given).unwrap().posterior;
    assert_eq!(fitted.posterior.predict(&xt).unwrap(), direct.predict(&xt).unwrap());
    assert_eq!(fitted.report.elbo, direct.elbo(&x, &y.column(0).into_owned()).unwrap());
    assert_eq!(fitted.report.inducing_points, 15);
    assert_eq!(fitted.report.noise_sigma, direct.noise_variance().sqrt());
    assert!(fitted.report.noise_sigma < 0.3, "σ learned: {}", fitted.report.noise_sigma);
    assert_ne!(direct.kernel().lengthscales(), kernel.lengthscales(), "the kernel trained");
    // Through a shared prior: the kernel is rebuilt from its spec, the same numbers.
    let prior = GpPrior::centered(kernel.clone());
    let via_prior = fspace_gp::svgp::fit(LikelihoodSpec::gaussian_learned(0.7), &prior, &data, &cfg).unwrap();
    assert_eq!(via_prior.posterior.predict(&xt).unwrap(), direct.predict(&xt).unwrap());
    assert_eq!(via_prior.posterior.kernel().params(), direct.kernel().params());
    // A shared kernel without a spec, or matrix-valued, cannot be copied: the error says what to do.
    let opaque = GpPrior::centered(NoInputGradient(kernel.clone()));
    let err = fspace_gp::svgp::fit(LikelihoodSpec::gaussian(0.7), &opaque, &data, &cfg).unwrap_err();
    assert!(err.to_string().contains("GpPrior::with_kernel"), "{err}");
    let helmholtz =
        GpPrior::centered(Helmholtz::new(Box::new(kernel.clone()), Box::new(kernel.clone())).unwrap());
    let err = fspace_gp::svgp::fit(LikelihoodSpec::gaussian(0.7), &helmholtz, &data, &cfg).unwrap_err();
    assert!(err.to_string().contains("matrix-valued"), "{err}");
    // The typed route takes the spec-less kernel.
    let no_spec = GpPrior::with_kernel(NoInputGradient(kernel.clone()), PriorMean::Zero);
    assert!(fspace_gp::svgp::fit(LikelihoodSpec::gaussian(0.7), &no_spec, &data, &cfg).is_ok());
    // A validation set is refused, not ignored.
    let xv = x.rows(0, 10).into_owned();
    let yv = y.rows(0, 10).into_owned();
    let with_val = Data::new(&x, &y).unwrap().with_validation(&xv, &yv).unwrap();
    assert!(matches!(
        fspace_gp::svgp::fit(LikelihoodSpec::gaussian(0.7), &prior, &with_val, &cfg),
        Err(GpError::Input(InputError::Invalid { what: "validation data", .. }))
    ));

    // σ fixed by the likelihood: the kernel still learns, the noise stays where it was put.
    let fixed = fspace_gp::svgp::fit(LikelihoodSpec::gaussian(0.7), &typed, &data, &given).unwrap();
    assert!((fixed.report.noise_sigma - 0.7).abs() < 1e-15);
    assert_ne!(fixed.posterior.kernel().params(), kernel.params());
    // Kernel fixed, σ learned.
    let kernel_fixed = SvgpConfig { learn_hyperparameters: false, ..given };
    let only_noise =
        fspace_gp::svgp::fit(LikelihoodSpec::gaussian_learned(0.7), &typed, &data, &kernel_fixed).unwrap();
    assert_eq!(only_noise.posterior.kernel().params(), kernel.params());
    assert!(only_noise.report.noise_sigma < 0.7);

    // A classification likelihood and multi-column targets are typed errors.
    assert!(matches!(
        fspace_gp::svgp::fit(LikelihoodSpec::Bernoulli, &typed, &data, &cfg),
        Err(GpError::Core(CoreError::Unsupported { .. }))
    ));
    let y2 = DMatrix::zeros(300, 2);
    let data2 = Data::new(&x, &y2).unwrap();
    assert!(matches!(
        fspace_gp::svgp::fit(LikelihoodSpec::gaussian(0.1), &typed, &data2, &cfg),
        Err(GpError::Input(InputError::Invalid { .. }))
    ));
}

/// Settings that cannot run are refused (a classifier with no Newton step or a NaN tolerance),
/// and a saved sparse GP whose variational covariance is not a covariance does not load.
#[test]
fn impossible_settings_and_non_psd_saved_covariances_are_refused() {
    let (train, _) = fspace_data::two_moons(40, 0.1, &mut rng(19)).unwrap();
    for config in [
        GpClassifierConfig { max_iter: 0, ..Default::default() },
        GpClassifierConfig { tol: f64::NAN, ..Default::default() },
        GpClassifierConfig { tol: -1.0, ..Default::default() },
    ] {
        let err = gp_classifier(Rbf::new(1.0, 1.0).unwrap(), &train.x, &train.y_vec(), &config).unwrap_err();
        assert!(err.to_string().contains("GpClassifierConfig"), "{err}");
    }
    let x = rand_uniform(30, 1, -2.0, 2.0, &mut rng(20));
    let y = x.map(|v| v.sin());
    let z = x.rows(0, 5).into_owned();
    let svgp = svgp_model(
        (Rbf::new(1.0, 0.5).unwrap(), PriorMean::Zero, 0.1),
        z,
        &x,
        &y.column(0).into_owned(),
        &SvgpConfig { schedule: Schedule::steps(5), ..Default::default() },
    )
    .unwrap();
    let text = svgp.to_json().unwrap();
    assert!(Svgp::<Rbf>::from_json(&text).is_ok());
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    // S's first diagonal entry (column-major data of [data, rows, cols]) made negative.
    v["payload"]["s"][0][0] = serde_json::json!(-3.0);
    let err = Svgp::<Rbf>::from_json(&v.to_string()).unwrap_err();
    assert!(err.to_string().contains("positive semi-definite"), "{err}");
}

/// A joint predictive or a sample request past the memory budget is `InputError::TooLarge`
/// naming the quantity and a cheaper request, before any allocation (2·10⁶ points would need a
/// 32 TB covariance; an allocation failure would abort the process).
#[test]
fn joint_predictives_and_samples_past_the_memory_budget_are_refused() {
    // Where the machine's available memory is unknown (not Linux) there is no budget: set one.
    if fspace_input::budget::limit().is_none() {
        fspace_input::budget::set_limit(Some(1 << 40));
    }
    let mut r = rng(4);
    let x = rand_uniform(20, 1, -1.0, 1.0, &mut r);
    let y = randn(20, 1, &mut r);
    let gp = exact_gp(Rbf::new(1.0, 0.5).unwrap(), PriorMean::Zero, 0.1, &x, &y).unwrap();
    let many = DMatrix::zeros(2_000_000, 1);
    for err in [gp.predict_joint(&many).unwrap_err(), gp.sample_functions(&many, 3, &mut r).unwrap_err()] {
        match err {
            fspace_core::CoreError::Input(InputError::TooLarge { what, cheaper, .. }) => {
                assert!(what.contains("joint predictive covariance"), "{what}");
                assert!(cheaper.contains("fewer points"), "{cheaper}");
            }
            other => panic!("expected TooLarge, got {other:?}"),
        }
    }
    let few = DMatrix::zeros(3, 1);
    match gp.sample_functions(&few, 1 << 50, &mut r).unwrap_err() {
        fspace_core::CoreError::Input(InputError::TooLarge { what, cheaper, .. }) => {
            assert!(what.contains("function samples"), "{what}");
            assert!(cheaper.contains("n_samples"), "{cheaper}");
        }
        other => panic!("expected TooLarge, got {other:?}"),
    }
    // Within the budget both are served.
    assert!(gp.sample_functions(&few, 4, &mut r).is_ok());
}
