//! The numbers the Python package must reproduce: each method fitted through the Rust API on
//! one seeded toy problem, written as JSON for `crates/fspace-py/tests/test_rust_reference.py`
//! (`cargo xtask test` writes it to `target/python-reference.json` and points
//! `$FSPACE_RUST_REFERENCE` at it).
//!
//! Each case records the Python call that should give the same posterior — the class, its
//! keyword arguments and the `fit` arguments — next to the Rust results (predictive mean and
//! variance at test inputs, class probabilities, the evidence, trained weights), so the test
//! compares the Python layer's conversions (state_dict, kernels, settings overlay, schedules)
//! with the Rust configuration written here by hand.

use std::path::Path;

use anyhow::{Context, Result};
use fspace_core::{Data, LikelihoodSpec, Link, Posterior, Span};
use fspace_fsp_laplace::FspConfig;
use fspace_gfsvi::{GfsviConfig, KlPrior};
use fspace_kernels::{GpPrior, Kernel, Matern12, Rbf};
use fspace_laplace::{KronBias, LaplaceConfig, PriorPrecision, Structure};
use fspace_nn::{Activation, Cnn, CnnConfig, ConvBlock, Mlp, MlpConfig};
use fspace_valla::{EllaConfig, EllaPrior, VallaConfig};
use nalgebra::DMatrix;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

fn rows(m: &DMatrix<f64>) -> Value {
    json!((0..m.nrows()).map(|i| (0..m.ncols()).map(|j| m[(i, j)]).collect::<Vec<_>>()).collect::<Vec<_>>())
}

fn tensors(t: &fspace_interop::Tensors) -> Value {
    json!(t
        .iter()
        .map(|(name, t)| json!({"name": name, "shape": t.shape, "data": t.data}))
        .collect::<Vec<_>>())
}

fn state(net: &Mlp) -> Value {
    tensors(&fspace_interop::mlp_tensors(net))
}

fn predictive(post: &dyn Posterior, xt: &DMatrix<f64>) -> Result<Value> {
    let f = post.predict(xt)?;
    Ok(json!({"mean": rows(&f.mean), "var": rows(&f.var)}))
}

fn mlp(output_dim: usize, seed: u64) -> Result<Mlp> {
    Ok(Mlp::new(MlpConfig {
        input_dim: 1,
        hidden: vec![12, 12],
        output_dim,
        activation: Activation::Tanh,
        seed,
    })?)
}

/// The prior every GP-prior case uses: `Matern12(1, 0.5) + RBF(0.5, 0.3)`; its Python spelling
/// is in the JSON (`"prior"`).
fn prior() -> Result<GpPrior> {
    Ok(GpPrior::centered(Matern12::new(1.0, 0.5)?.boxed() + Rbf::new(0.5, 0.3)?.boxed()))
}

/// Writes the reference file.
pub fn write(path: &Path) -> Result<()> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let n = 48;
    let x = DMatrix::from_fn(n, 1, |_, _| rng.gen_range(-1.0f64..1.0));
    let y = DMatrix::from_fn(n, 1, |i, _| (3.0 * x[(i, 0)]).sin() + 0.1 * rng.gen_range(-1.0..1.0));
    let labels = DMatrix::from_fn(n, 1, |i, _| if x[(i, 0)] > 0.0 { 1.0 } else { 0.0 });
    let xt = DMatrix::from_fn(9, 1, |i, _| -2.0 + 0.5 * i as f64);
    let data = Data::new(&x, &y)?;
    let net = mlp(1, 0)?;
    let classifier = mlp(2, 1)?;
    let sigma = 0.1;
    let gaussian = LikelihoodSpec::gaussian(sigma);
    let mut cases = Vec::new();

    // laplace-torch's Laplace: three structures, regression, λ = 2.
    for (structure, name) in
        [(Structure::Full(Default::default()), "full"), (Structure::Kfac, "kron"), (Structure::Diag, "diag")]
    {
        let config =
            LaplaceConfig { structure, prior_precision: PriorPrecision::Scalar(2.0), ..Default::default() };
        let post = fspace_laplace::fit(net.clone(), gaussian, &data, &config)?.posterior;
        cases.push(json!({
            "name": format!("laplace_{name}"), "class": "Laplace", "net": "regression",
            "kwargs": {"hessian_structure": name, "subset_of_weights": "all", "kron_bias": "folded",
                       "prior_precision": 2.0, "sigma_noise": sigma},
            "likelihood": "regression",
            "predictive": predictive(&post, &xt)?,
            "log_marginal_likelihood": post.log_marginal_likelihood()?,
        }));
    }
    // KFAC with laplace-torch's separate bias block.
    {
        let config = LaplaceConfig {
            structure: Structure::Kfac,
            kron_bias: KronBias::Separate,
            prior_precision: PriorPrecision::Scalar(2.0),
            ..Default::default()
        };
        let post = fspace_laplace::fit(net.clone(), gaussian, &data, &config)?.posterior;
        cases.push(json!({
            "name": "laplace_kron_separate_bias", "class": "Laplace", "net": "regression",
            "kwargs": {"hessian_structure": "kron", "subset_of_weights": "all", "kron_bias": "separate",
                       "prior_precision": 2.0, "sigma_noise": sigma},
            "likelihood": "regression",
            "predictive": predictive(&post, &xt)?,
            "log_marginal_likelihood": post.log_marginal_likelihood()?,
        }));
    }
    // Classification: KFAC, probit and bridge.
    {
        let config = LaplaceConfig { structure: Structure::Kfac, ..Default::default() };
        let data = Data::new(&x, &labels)?;
        let post = fspace_laplace::fit(classifier.clone(), LikelihoodSpec::categorical(2), &data, &config)?
            .posterior;
        cases.push(json!({
            "name": "laplace_kron_classification", "class": "Laplace", "net": "classification",
            "kwargs": {"hessian_structure": "kron", "subset_of_weights": "all", "kron_bias": "folded"},
            "likelihood": "classification",
            "probit": rows(&post.class_probabilities(&xt, &Link::Probit)?),
            "bridge": rows(&post.class_probabilities(&xt, &Link::LaplaceBridge)?),
        }));
    }

    // A CNN on 1 × 6 × 6 images (conv 3@3×3 same + pool, dense 8, 2 outputs): Laplace
    // kron (classification) and diag (regression on two outputs), so that the Python layer's
    // image layout, architecture description and CNN state_dict are checked too.
    let cnn = Cnn::new(CnnConfig {
        input_shape: (1, 6, 6),
        convs: vec![ConvBlock { channels: 3, kernel: 3, same_padding: true, pool: true }],
        hidden: vec![8],
        output_dim: 2,
        activation: Activation::Tanh,
        seed: 3,
    })?;
    let images = DMatrix::from_fn(30, 36, |_, _| rng.gen_range(-1.0f64..1.0));
    let image_labels = DMatrix::from_fn(30, 1, |i, _| if images.row(i).sum() > 0.0 { 1.0 } else { 0.0 });
    let image_targets =
        DMatrix::from_fn(30, 2, |i, j| images[(i, 7 * j + 7)] + 0.1 * rng.gen_range(-1.0..1.0));
    let images_test = DMatrix::from_fn(5, 36, |_, _| rng.gen_range(-1.0f64..1.0));
    {
        let config = LaplaceConfig { structure: Structure::Kfac, ..Default::default() };
        let data = Data::new(&images, &image_labels)?;
        let post =
            fspace_laplace::fit(cnn.clone(), LikelihoodSpec::categorical(2), &data, &config)?.posterior;
        cases.push(json!({
            "name": "laplace_cnn_kron_classification", "class": "Laplace", "net": "cnn", "data": "images",
            "kwargs": {"hessian_structure": "kron", "subset_of_weights": "all", "kron_bias": "folded"},
            "likelihood": "classification",
            "probit": rows(&post.class_probabilities(&images_test, &Link::Probit)?),
            "bridge": rows(&post.class_probabilities(&images_test, &Link::LaplaceBridge)?),
        }));
        let config = LaplaceConfig {
            structure: Structure::Diag,
            prior_precision: PriorPrecision::Scalar(2.0),
            ..Default::default()
        };
        let data = Data::new(&images, &image_targets)?;
        let post = fspace_laplace::fit(
            cnn.clone(),
            LikelihoodSpec::IsotropicGaussian { sigma: 0.2, outputs: 2, learn: false },
            &data,
            &config,
        )?
        .posterior;
        cases.push(json!({
            "name": "laplace_cnn_diag_regression", "class": "Laplace", "net": "cnn", "data": "images",
            "kwargs": {"hessian_structure": "diag", "subset_of_weights": "all", "prior_precision": 2.0, "sigma_noise": 0.2},
            "likelihood": "regression",
            "predictive": predictive(&post, &images_test)?,
            "log_marginal_likelihood": post.log_marginal_likelihood()?,
        }));
    }

    // FSP-Laplace: Alg. 1 (30 epochs) + Alg. 2, and Alg. 2 alone.
    let fsp = {
        let d = FspConfig::default();
        FspConfig {
            schedule: fspace_core::Schedule { length: Span::Epochs(30), ..d.schedule },
            batch_size: 16,
            learning_rate: 5e-3,
            n_context: 20,
            n_laplace_context: 25,
            ..d
        }
    };
    let fitted = fspace_fsp_laplace::fit(net.clone(), gaussian, &prior()?, &data, &fsp)?;
    cases.push(json!({
        "name": "fsp_laplace", "class": "FSPLaplace", "net": "regression", "likelihood": "regression",
        "kwargs": {"epochs": 30, "batch_size": 16, "learning_rate": 5e-3, "n_context": 20,
                   "n_laplace_context": 25, "sigma_noise": sigma},
        "predictive": predictive(&fitted.posterior, &xt)?,
        "trained_state": state(fitted.posterior.network()),
    }));
    let post = fspace_fsp_laplace::fit_posthoc(net.clone(), gaussian, &prior()?, &data, &fsp)?.posterior;
    cases.push(json!({
        "name": "fsp_laplace_posthoc", "class": "FSPLaplace", "net": "regression", "likelihood": "regression",
        "kwargs": {"train": false, "n_laplace_context": 25, "sigma_noise": sigma},
        "predictive": predictive(&post, &xt)?,
    }));

    // GFSVI: 200 steps, M = 40, σ learned from 0.1.
    let gfsvi = {
        let d = GfsviConfig::default();
        let mut optim = d.optim.clone();
        optim.schedule.length = Span::Steps(200);
        GfsviConfig { measurement_points: 40, optim, ..d }
    };
    let post = fspace_gfsvi::fit(
        net.clone(),
        LikelihoodSpec::gaussian_learned(sigma),
        &KlPrior::Gp(prior()?),
        &data,
        &gfsvi,
    )?
    .posterior;
    cases.push(json!({
        "name": "gfsvi", "class": "GFSVI", "net": "regression", "likelihood": "regression",
        "kwargs": {"steps": 200, "measurement_points": 40, "sigma_noise": sigma},
        "predictive": predictive(&post, &xt)?,
        "trained_state": state(post.network()),
    }));

    // VaLLA: 300 steps, M = 10, no validation (so no early stopping).
    let valla = {
        let d = VallaConfig::default();
        VallaConfig {
            num_inducing: 10,
            schedule: fspace_core::Schedule { length: Span::Steps(300), patience: None, ..d.schedule },
            ..d
        }
    };
    let post = fspace_valla::fit(net.clone(), gaussian, &data, &valla)?.posterior;
    cases.push(json!({
        "name": "valla", "class": "VaLLA", "net": "regression", "likelihood": "regression",
        "kwargs": {"steps": 300, "num_inducing": 10, "sigma_noise": sigma},
        "predictive": predictive(&post, &xt)?,
    }));

    // ELLA: M = 40 points, K = 8 features, λ = 1.
    let ella = EllaConfig {
        num_points: 40,
        num_eigen: 8,
        prior: EllaPrior::Fixed(1.0),
        early_stopping: None,
        ..Default::default()
    };
    let post = fspace_valla::ella::fit(net.clone(), gaussian, &data, &ella)?.posterior;
    cases.push(json!({
        "name": "ella", "class": "ELLA", "net": "regression", "likelihood": "regression",
        "kwargs": {"num_points": 40, "num_eigen": 8, "prior": {"Fixed": 1.0}, "early_stopping": null, "sigma_noise": sigma},
        "predictive": predictive(&post, &xt)?,
    }));

    // The exact GP.
    let fitted = fspace_gp::exact::fit(gaussian, &prior()?, &data)?;
    cases.push(json!({
        "name": "exact_gp", "class": "ExactGP", "likelihood": "regression",
        "kwargs": {"sigma_noise": sigma},
        "predictive": predictive(&fitted.posterior, &xt)?,
        "log_marginal_likelihood": fitted.report.log_marginal_likelihood,
    }));

    let out = json!({
        "x": rows(&x), "y": rows(&y), "labels": rows(&labels), "x_test": rows(&xt),
        "networks": {"regression": state(&net), "classification": state(&classifier),
                     "cnn": tensors(&fspace_interop::cnn_tensors(&cnn))},
        "cnn_architecture": {"input_shape": [1, 6, 6], "hidden": [8], "output_dim": 2,
                             "convs": [{"channels": 3, "kernel": 3, "same_padding": true, "pool": true}]},
        "images": {"x": rows(&images), "y": rows(&image_targets), "labels": rows(&image_labels),
                   "x_test": rows(&images_test)},
        "prior": "Matern12(1.0, 0.5) + RBF(0.5, 0.3)",
        "cases": cases,
    });
    std::fs::write(path, serde_json::to_string(&out)?).with_context(|| format!("writing {}", path.display()))
}
