//! The call-shape contract, table-driven: every method is fitted through its `fit` on one toy
//! problem per likelihood and put through the same sequence — `predict`, `predict_y`,
//! `class_probabilities` with each `Link`, save → load — with the same assertions:
//!
//! * `predict` is finite with variances ≥ 0;
//! * regression: `predict_y` adds the likelihood's σ² to `f`'s variance and keeps the mean
//!   (the heteroscedastic model: one column, the noise `E[e^η]` added), and class
//!   probabilities are `Unsupported`;
//! * classification: class probabilities are distributions for every link, Monte Carlo is
//!   reproducible from its seed, and `predict_y` is `Unsupported`;
//! * the loaded posterior gives the same bits for every predictive and the same likelihood.

use fspace::core::{CoreError, Data, LikelihoodSpec, Link, Persist, Posterior, Schedule};
use fspace::fsp_laplace::FspConfig;
use fspace::gfsvi::{FviConfig, GfsviConfig, KlPrior, MfviConfig, OptimConfig};
use fspace::gp::{InducingPoints, SparseDirichletConfig, SvgpConfig};
use fspace::kernels::{GpPrior, Rbf};
use fspace::laplace::{LaplaceConfig, Structure};
use fspace::nn::{fit_map, Activation, Mlp, MlpConfig, TrainConfig};
use fspace::valla::{EllaConfig, EllaPrior, VallaConfig};
use fspace_testutil::rng;
use nalgebra::DMatrix;
use rand::Rng;

fn mlp(d: usize, q: usize) -> Mlp {
    Mlp::new(MlpConfig {
        input_dim: d,
        hidden: vec![6],
        output_dim: q,
        activation: Activation::Tanh,
        seed: 3,
    })
    .unwrap()
}

/// `y = sin(2x) + noise` at 30 points of [−2, 2].
fn regression() -> (DMatrix<f64>, DMatrix<f64>) {
    let mut r = rng(1);
    let x: DMatrix<f64> = DMatrix::from_fn(30, 1, |_, _| r.gen_range(-2.0..2.0));
    let y = x.map(|v: f64| (2.0 * v).sin() + 0.1 * r.gen_range(-1.0..1.0));
    (x, y)
}

/// Three classes, one blob each, in 2-D; `binary` keeps labels 0 / 1 of two blobs.
fn classification(binary: bool) -> (DMatrix<f64>, DMatrix<f64>) {
    let mut r = rng(2);
    let classes = if binary { 2 } else { 3 };
    let centres = [(-1.5, 0.0), (1.5, 0.0), (0.0, 1.5)];
    let n = 30;
    let y = DMatrix::from_fn(n, 1, |i, _| (i % classes) as f64);
    let x = DMatrix::from_fn(n, 2, |i, j| {
        let c = centres[i % classes];
        (if j == 0 { c.0 } else { c.1 }) + 0.4 * r.gen_range(-1.0..1.0)
    });
    (x, y)
}

/// The assertions every row shares; `likelihood` is what the posterior must report.
fn check<P: Posterior + Persist>(name: &str, post: &P, x: &DMatrix<f64>, likelihood: LikelihoodSpec) {
    let f = post.predict(x).unwrap_or_else(|e| panic!("{name}: predict: {e}"));
    assert!(f.mean.iter().chain(f.var.iter()).all(|v| v.is_finite()), "{name}: non-finite predictive");
    assert!(f.var.iter().all(|&v| v >= 0.0), "{name}: negative variance");
    let reported = post.likelihood().unwrap_or_else(|| panic!("{name}: no likelihood"));
    assert_eq!(reported.name(), likelihood.name(), "{name}: likelihood");
    assert_eq!(reported.output_dim(), likelihood.output_dim(), "{name}: likelihood outputs");
    let links = [Link::Probit, Link::LaplaceBridge, Link::MonteCarlo { samples: 64, seed: 9 }];
    let classifier = matches!(likelihood, LikelihoodSpec::Bernoulli | LikelihoodSpec::Categorical { .. });
    if classifier {
        assert!(
            matches!(post.predict_y(x), Err(CoreError::Unsupported { .. })),
            "{name}: predict_y of a classifier"
        );
        for link in &links {
            let p = post.class_probabilities(x, link).unwrap_or_else(|e| panic!("{name}: {link:?}: {e}"));
            let classes = likelihood.output_dim().max(2);
            assert_eq!(p.shape(), (x.nrows(), classes), "{name}: {link:?} shape");
            for i in 0..x.nrows() {
                assert!(
                    (p.row(i).sum() - 1.0).abs() < 1e-9,
                    "{name}: {link:?} row {i} sums to {}",
                    p.row(i).sum()
                );
                assert!(p.row(i).iter().all(|&v| (0.0..=1.0).contains(&v)), "{name}: {link:?} row {i}");
            }
        }
        let mc = links[2];
        assert_eq!(post.class_probabilities(x, &mc).unwrap(), post.class_probabilities(x, &mc).unwrap());
    } else {
        for link in &links {
            assert!(
                matches!(post.class_probabilities(x, link), Err(CoreError::Unsupported { .. })),
                "{name}: class probabilities of a regression model"
            );
        }
        let y = post.predict_y(x).unwrap_or_else(|e| panic!("{name}: predict_y: {e}"));
        match reported {
            LikelihoodSpec::HeteroscedasticGaussian => {
                assert_eq!(y.mean.ncols(), 1, "{name}: heteroscedastic predict_y has the mean column");
                for i in 0..x.nrows() {
                    assert_eq!(y.mean[(i, 0)], f.mean[(i, 0)], "{name}");
                    assert!(y.var[(i, 0)] > f.var[(i, 0)], "{name}: noise added");
                }
            }
            _ => {
                let s2 = reported.noise_std().unwrap().powi(2);
                assert_eq!(y.mean, f.mean, "{name}: predict_y keeps the mean");
                for (vy, vf) in y.var.iter().zip(f.var.iter()) {
                    assert!((vy - vf - s2).abs() <= 1e-12 * (1.0 + vy), "{name}: {vy} ≠ {vf} + σ² {s2}");
                }
            }
        }
    }
    let back = P::from_json(&post.to_json().unwrap()).unwrap_or_else(|e| panic!("{name}: load: {e}"));
    assert_eq!(back.predict(x).unwrap(), f, "{name}: predict after load");
    assert_eq!(back.likelihood(), post.likelihood(), "{name}: likelihood after load");
    if classifier {
        for link in &links {
            assert_eq!(
                back.class_probabilities(x, link).unwrap(),
                post.class_probabilities(x, link).unwrap()
            );
        }
    } else {
        assert_eq!(back.predict_y(x).unwrap(), post.predict_y(x).unwrap(), "{name}: predict_y after load");
    }
}

fn train() -> TrainConfig {
    TrainConfig {
        schedule: Schedule::epochs(60),
        batch_size: 30,
        learning_rate: 1e-2,
        weight_decay: 1e-2,
        ..Default::default()
    }
}

fn optim() -> OptimConfig {
    OptimConfig { schedule: Schedule::steps(20).every_steps(10), batch_size: 30, ..Default::default() }
}

#[test]
fn every_method_follows_the_call_shape_and_the_predictive_contract() {
    let prior = GpPrior::centered(Rbf::new(1.0, 0.7).unwrap());
    let fsp_cfg = FspConfig {
        schedule: Schedule::epochs(10),
        batch_size: 30,
        n_context: 8,
        n_laplace_context: 16,
        ..Default::default()
    };
    let valla_cfg =
        VallaConfig { num_inducing: 6, schedule: Schedule::steps(30), batch_size: 30, ..Default::default() };
    let ella_cfg = EllaConfig {
        num_points: 10,
        num_eigen: 4,
        prior: EllaPrior::Fixed(1.0),
        early_stopping: None,
        ..Default::default()
    };
    let gfsvi_cfg = GfsviConfig { measurement_points: 8, optim: optim(), ..Default::default() };
    let fvi_cfg =
        FviConfig { n_uniform: 6, n_batch: 6, optim: optim(), predictive_samples: 10, ..Default::default() };

    // Regression, one output, σ given or learned.
    let (x, y) = regression();
    let data = Data::new(&x, &y).unwrap();
    let (g, learned) = (LikelihoodSpec::gaussian(0.2), LikelihoodSpec::gaussian_learned(0.3));
    let map = fit_map(mlp(1, 1), learned, &data, &train()).unwrap();
    assert!(!map.report.likelihood.learns_noise() && map.report.likelihood.noise_std() != Some(0.3));
    for (name, structure) in [
        ("full", Structure::full()),
        ("kfac", Structure::Kfac),
        ("diag", Structure::Diag),
        ("last-layer", Structure::last_layer()),
        ("low-rank", Structure::low_rank(4)),
    ] {
        let cfg = LaplaceConfig { structure, ..Default::default() };
        let la = fspace::laplace::fit(map.posterior.clone(), map.report.likelihood, &data, &cfg).unwrap();
        check(&format!("Laplace {name}"), &la.posterior, &x, map.report.likelihood);
    }
    let fsp = fspace::fsp_laplace::fit(mlp(1, 1), learned, &prior, &data, &fsp_cfg).unwrap();
    assert_eq!(fsp.posterior.likelihood(), Some(fsp.report.likelihood));
    check("FSP-Laplace", &fsp.posterior, &x, g);
    let posthoc = fspace::fsp_laplace::fit_posthoc(
        map.posterior.clone(),
        map.report.likelihood,
        &prior,
        &data,
        &fsp_cfg,
    )
    .unwrap();
    check("FSP-Laplace post-hoc", &posthoc.posterior, &x, g);
    let valla = fspace::valla::fit(map.posterior.clone(), learned, &data, &valla_cfg).unwrap();
    check("VaLLA", &valla.posterior, &x, g);
    let ella = fspace::valla::ella::fit(map.posterior.clone(), g, &data, &ella_cfg).unwrap();
    check("ELLA", &ella.posterior, &x, g);
    let gfsvi =
        fspace::gfsvi::fit(mlp(1, 1), learned, &KlPrior::Gp(prior.clone()), &data, &gfsvi_cfg).unwrap();
    assert_eq!(gfsvi.posterior.likelihood().unwrap().noise_std(), Some(gfsvi.posterior.noise_std()));
    check("GFSVI", &gfsvi.posterior, &x, g);
    let tfsvi =
        fspace::gfsvi::fit(mlp(1, 1), g, &KlPrior::WeightPushforward { sigma_p: 0.5 }, &data, &gfsvi_cfg)
            .unwrap();
    check("TFSVI", &tfsvi.posterior, &x, g);
    let fvi = fspace::gfsvi::fvi::fit(mlp(1, 1), learned, &prior, &data, &fvi_cfg).unwrap();
    check("FVI", &fvi.posterior, &x, g);
    let mfvi_cfg = MfviConfig { optim: optim(), predictive_samples: 10, ..Default::default() };
    let mfvi = fspace::gfsvi::mfvi::fit(mlp(1, 1), g, &data, &mfvi_cfg).unwrap();
    check("MFVI", &mfvi.posterior, &x, g);
    let exact = fspace::gp::exact::fit(g, &prior, &data).unwrap();
    check("exact GP", &exact.posterior, &x, g);
    let svgp_cfg = SvgpConfig {
        schedule: Schedule::steps(20),
        batch_size: 30,
        inducing: InducingPoints::KMeans { points: 6, iterations: 10 },
        ..Default::default()
    };
    let svgp = fspace::gp::svgp::fit(learned, &prior, &data, &svgp_cfg).unwrap();
    check("SVGP", &svgp.posterior, &x, g);

    // Heteroscedastic regression: the network outputs a mean and a log-variance.
    let het = LikelihoodSpec::HeteroscedasticGaussian;
    let map_h = fit_map(mlp(1, 2), het, &data, &train()).unwrap();
    let la_h = fspace::laplace::fit(map_h.posterior, het, &data, &LaplaceConfig::default()).unwrap();
    check("Laplace heteroscedastic", &la_h.posterior, &x, het);

    // Three classes.
    let (xc, yc) = classification(false);
    let cdata = Data::new(&xc, &yc).unwrap();
    let cat = LikelihoodSpec::categorical(3);
    let cprior =
        GpPrior::centered(fspace::kernels::Independent::new(Rbf::new(1.0, 1.0).unwrap(), 3).unwrap());
    let map_c = fit_map(mlp(2, 3), cat, &cdata, &train()).unwrap();
    for (name, structure) in
        [("full", Structure::full()), ("kfac", Structure::Kfac), ("diag", Structure::Diag)]
    {
        let cfg = LaplaceConfig { structure, ..Default::default() };
        let la = fspace::laplace::fit(map_c.posterior.clone(), cat, &cdata, &cfg).unwrap();
        check(&format!("Laplace categorical {name}"), &la.posterior, &xc, cat);
    }
    let fsp_c = fspace::fsp_laplace::fit(mlp(2, 3), cat, &cprior, &cdata, &fsp_cfg).unwrap();
    check("FSP-Laplace categorical", &fsp_c.posterior, &xc, cat);
    let valla_c = fspace::valla::fit(map_c.posterior.clone(), cat, &cdata, &valla_cfg).unwrap();
    check("VaLLA categorical", &valla_c.posterior, &xc, cat);
    let ella_c = fspace::valla::ella::fit(map_c.posterior.clone(), cat, &cdata, &ella_cfg).unwrap();
    check("ELLA categorical", &ella_c.posterior, &xc, cat);
    let gfsvi_c =
        fspace::gfsvi::fit(mlp(2, 3), cat, &KlPrior::Gp(cprior.clone()), &cdata, &gfsvi_cfg).unwrap();
    check("GFSVI categorical", &gfsvi_c.posterior, &xc, cat);
    let fvi_c = fspace::gfsvi::fvi::fit(mlp(2, 3), cat, &cprior, &cdata, &fvi_cfg).unwrap();
    check("FVI categorical", &fvi_c.posterior, &xc, cat);
    let dirichlet_cfg = SparseDirichletConfig {
        inducing: InducingPoints::KMeans { points: 8, iterations: 10 },
        ..Default::default()
    };
    let sparse = fspace::gp::sparse_dirichlet::fit(cat, &prior, &cdata, &dirichlet_cfg).unwrap();
    check("sparse Dirichlet GP", &sparse.posterior, &xc, cat);

    // Two classes through one logit.
    let (xb, yb) = classification(true);
    let bdata = Data::new(&xb, &yb).unwrap();
    let bern = LikelihoodSpec::Bernoulli;
    let map_b = fit_map(mlp(2, 1), bern, &bdata, &train()).unwrap();
    let la_b =
        fspace::laplace::fit(map_b.posterior.clone(), bern, &bdata, &LaplaceConfig::default()).unwrap();
    check("Laplace Bernoulli", &la_b.posterior, &xb, bern);
    let fsp_b = fspace::fsp_laplace::fit(mlp(2, 1), bern, &prior, &bdata, &fsp_cfg).unwrap();
    check("FSP-Laplace Bernoulli", &fsp_b.posterior, &xb, bern);
    let gpc = fspace::gp::classification::fit(bern, &prior, &bdata, &Default::default()).unwrap();
    check("GP classifier", &gpc.posterior, &xb, bern);
}

/// The fit returned an error that names the unusable input (the validation set or `learn`).
fn refused<T, E: std::fmt::Display>(r: Result<T, E>, what: &str) {
    let Err(e) = r else { panic!("{what}: accepted") };
    let e = e.to_string();
    assert!(e.contains("validation") || e.contains("learn"), "{what}: {e}");
}

#[test]
fn data_a_method_cannot_use_is_refused_not_ignored() {
    let (x, y) = regression();
    let with_val = Data::new(&x, &y).unwrap().with_validation(&x, &y).unwrap();
    let data = Data::new(&x, &y).unwrap();
    let prior = GpPrior::centered(Rbf::new(1.0, 0.7).unwrap());
    let g = LikelihoodSpec::gaussian(0.2);
    let learned = LikelihoodSpec::gaussian_learned(0.2);
    let la = LaplaceConfig::default();
    refused(fspace::laplace::fit(mlp(1, 1), g, &with_val, &la), "Laplace, validation");
    refused(fspace::laplace::fit(mlp(1, 1), learned, &data, &la), "Laplace, learn");
    let fsp = FspConfig::default();
    refused(
        fspace::fsp_laplace::fit_posthoc(mlp(1, 1), g, &prior, &with_val, &fsp),
        "post-hoc FSP-Laplace, validation",
    );
    refused(
        fspace::fsp_laplace::fit_posthoc(mlp(1, 1), learned, &prior, &data, &fsp),
        "post-hoc FSP-Laplace, learn",
    );
    refused(fspace::gp::exact::fit(g, &prior, &with_val), "exact GP, validation");
    refused(fspace::gp::exact::fit(learned, &prior, &data), "exact GP, learn");
    refused(fspace::gp::svgp::fit(g, &prior, &with_val, &SvgpConfig::default()), "SVGP, validation");
    let (xb, yb) = classification(true);
    let bval = Data::new(&xb, &yb).unwrap().with_validation(&xb, &yb).unwrap();
    let bern = LikelihoodSpec::Bernoulli;
    refused(
        fspace::gp::classification::fit(bern, &prior, &bval, &Default::default()),
        "GP classifier, validation",
    );
    refused(
        fspace::gp::sparse_dirichlet::fit(LikelihoodSpec::categorical(2), &prior, &bval, &Default::default()),
        "sparse Dirichlet GP, validation",
    );
    // fit_map: the spec decides whether σ is learned; a config that asks for it against the
    // spec is refused.
    let asks = TrainConfig { learn_likelihood: true, ..train() };
    refused(fit_map(mlp(1, 1), g, &data, &asks), "fit_map, learn");
    // With a validation set fit_map keeps the best-validation weights.
    let fitted = fit_map(
        mlp(1, 1),
        g,
        &with_val,
        &TrainConfig { schedule: Schedule::epochs(60).patience(5), ..train() },
    )
    .unwrap();
    assert!(fitted.report.train.history.iter().all(|p| p.validation_loss.is_some()));
}
