//! Settings a user can get wrong are refused with typed errors that name the setting:
//! the ones that used to be accepted silently, and — table-driven — every numeric field of
//! every serialisable method `Config` set to 0 and to −1, unless the value has a documented
//! meaning listed below. A field added later is covered without being named: it fails here
//! until it is refused or documented.

use fspace::core::{CoreError, Data, LikelihoodSpec, Schedule};
use fspace::fsp_laplace::{FspConfig, FspError};
use fspace::gfsvi::{FviConfig, GfsviConfig, GfsviError, KlPrior, MfviConfig, OptimConfig};
use fspace::input::InputError;
use fspace::kernels::{GpPrior, Rbf};
use fspace::laplace::LaplaceConfig;
use fspace::nn::{Activation, Mlp, MlpConfig};
use fspace::valla::{EllaConfig, VallaConfig, VallaError};
use fspace_testutil::mutate::{apply, Edit, Mutant, Step};
use nalgebra::DMatrix;
use serde::{de::DeserializeOwned, Serialize};
use serde_json::Value;

/// `(config, field path, value)` accepted on purpose, with the documented meaning.
const MEANINGFUL: &[(&str, &str, &str, &str)] = &[
    ("VallaConfig", "patience", "0", "stop at the first worsening evaluation (App. D)"),
    ("VallaConfig", "seed", "0", "a seed"),
    ("EllaConfig", "seed", "0", "a seed"),
    ("GfsviConfig", "class_samples", "0", "unused by Gaussian likelihoods; refused for categorical"),
    ("GfsviConfig", "measurement_from_batch", "0", "measurement points from the box only"),
    ("GfsviConfig", "optim.patience", "0", "early stopping off"),
    ("GfsviConfig", "optim.seed", "0", "a seed"),
    (
        "FviConfig",
        "n_batch",
        "0",
        "measurement points from the box only (n_uniform + n_batch ≥ 1 is checked)",
    ),
    ("FviConfig", "n_uniform", "0", "measurement points from the batch only"),
    ("FviConfig", "prior_jitter", "0", "no jitter on the prior Gram"),
    ("FviConfig", "optim.patience", "0", "early stopping off"),
    ("FviConfig", "optim.seed", "0", "a seed"),
    ("MfviConfig", "optim.patience", "0", "early stopping off"),
    ("MfviConfig", "optim.seed", "0", "a seed"),
];

fn net() -> Mlp {
    Mlp::new(MlpConfig {
        input_dim: 1,
        hidden: vec![4],
        output_dim: 1,
        activation: Activation::Tanh,
        seed: 1,
    })
    .unwrap()
}

fn set() -> (DMatrix<f64>, DMatrix<f64>) {
    let x = DMatrix::from_fn(12, 1, |i, _| i as f64 / 4.0 - 1.5);
    let y = x.map(f64::sin);
    (x, y)
}

fn numeric_fields(v: &Value, path: &mut Vec<Step>, out: &mut Vec<Vec<Step>>) {
    match v {
        Value::Number(_) => out.push(path.clone()),
        Value::Object(m) => {
            for (k, x) in m {
                path.push(Step::Key(k.clone()));
                numeric_fields(x, path, out);
                path.pop();
            }
        }
        Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                path.push(Step::Index(i));
                numeric_fields(x, path, out);
                path.pop();
            }
        }
        _ => {}
    }
}

fn dotted(path: &[Step]) -> String {
    path.iter()
        .map(|s| match s {
            Step::Key(k) => k.clone(),
            Step::Index(i) => i.to_string(),
        })
        .collect::<Vec<_>>()
        .join(".")
}

/// The fields of `base` whose 0 or −1 `fit` accepts without a listed meaning.
fn silent<C: Serialize + DeserializeOwned>(
    name: &str,
    base: &C,
    fit: &dyn Fn(C) -> Result<(), String>,
    out: &mut Vec<String>,
) {
    let doc = serde_json::to_value(base).unwrap();
    let mut fields = Vec::new();
    numeric_fields(&doc, &mut Vec::new(), &mut fields);
    assert!(!fields.is_empty(), "{name} has numeric fields");
    for path in fields {
        for value in [Value::from(0), Value::from(-1.0)] {
            let mut d = doc.clone();
            let edit = Mutant {
                description: String::new(),
                edits: vec![Edit::Replace(path.clone(), value.clone())],
            };
            apply(&mut d, &edit);
            // A value the field's type cannot hold (−1 for a count) is refused by the type.
            let Ok(config) = serde_json::from_value::<C>(d) else { continue };
            let field = dotted(&path);
            let shown = value.to_string();
            let listed = MEANINGFUL.iter().any(|(c, f, v, _)| *c == name && *f == field && *v == shown);
            if fit(config).is_ok() && !listed {
                out.push(format!("{name}.{field} = {value} is accepted"));
            }
        }
    }
}

#[test]
fn zero_or_negative_settings_are_refused_unless_documented() {
    let (x, y) = set();
    let data = Data::new(&x, &y).unwrap().with_validation(&x, &y).unwrap();
    let g = LikelihoodSpec::gaussian(0.1);
    let prior = GpPrior::centered(Rbf::new(1.0, 0.5).unwrap());
    let kl = KlPrior::Gp(prior.clone());
    let optim = OptimConfig { schedule: Schedule::steps(2), batch_size: 6, ..Default::default() };
    let mut out = Vec::new();
    silent(
        "LaplaceConfig",
        &LaplaceConfig::default(),
        &|c| {
            fspace::laplace::fit(net(), g, &Data::new(&x, &y).unwrap(), &c)
                .map(|_| ())
                .map_err(|e| e.to_string())
        },
        &mut out,
    );
    let valla = VallaConfig {
        num_inducing: 3,
        schedule: Schedule::steps(4).every_steps(2).patience(1),
        batch_size: 6,
        ..Default::default()
    };
    silent(
        "VallaConfig",
        &valla,
        &|c| fspace::valla::fit(net(), g, &data, &c).map(|_| ()).map_err(|e| e.to_string()),
        &mut out,
    );
    let ella = EllaConfig { num_points: 6, num_eigen: 3, ..Default::default() };
    silent(
        "EllaConfig",
        &ella,
        &|c| fspace::valla::ella::fit(net(), g, &data, &c).map(|_| ()).map_err(|e| e.to_string()),
        &mut out,
    );
    let gfsvi = GfsviConfig { measurement_points: 3, optim: optim.clone(), ..Default::default() };
    silent(
        "GfsviConfig",
        &gfsvi,
        &|c| fspace::gfsvi::fit(net(), g, &kl, &data, &c).map(|_| ()).map_err(|e| e.to_string()),
        &mut out,
    );
    let fvi = FviConfig {
        n_uniform: 3,
        n_batch: 3,
        optim: optim.clone(),
        predictive_samples: 3,
        ..Default::default()
    };
    silent(
        "FviConfig",
        &fvi,
        &|c| fspace::gfsvi::fvi::fit(net(), g, &prior, &data, &c).map(|_| ()).map_err(|e| e.to_string()),
        &mut out,
    );
    let mfvi = MfviConfig { optim, predictive_samples: 3, ..Default::default() };
    silent(
        "MfviConfig",
        &mfvi,
        &|c| fspace::gfsvi::mfvi::fit(net(), g, &data, &c).map(|_| ()).map_err(|e| e.to_string()),
        &mut out,
    );
    assert!(out.is_empty(), "settings accepted without a documented meaning:\n{}", out.join("\n"));
}

#[test]
fn zero_predictive_samples_in_fvi_and_mfvi_are_refused() {
    let (x, y) = set();
    let data = Data::new(&x, &y).unwrap();
    let optim = OptimConfig { schedule: Schedule::steps(2), batch_size: 6, ..Default::default() };
    let prior = GpPrior::centered(Rbf::new(1.0, 0.5).unwrap());
    let fvi = FviConfig {
        n_uniform: 3,
        n_batch: 3,
        optim: optim.clone(),
        predictive_samples: 0,
        ..Default::default()
    };
    let e = fspace::gfsvi::fvi::fit(net(), LikelihoodSpec::gaussian(0.1), &prior, &data, &fvi).unwrap_err();
    assert!(matches!(e, GfsviError::Input(InputError::Invalid { what: "predictive_samples", .. })), "{e}");
    let mfvi = MfviConfig { optim, predictive_samples: 0, ..Default::default() };
    let e = fspace::gfsvi::mfvi::fit(net(), LikelihoodSpec::gaussian(0.1), &data, &mfvi).unwrap_err();
    assert!(matches!(e, GfsviError::Input(InputError::Invalid { what: "predictive_samples", .. })), "{e}");
}

#[test]
fn ella_refuses_to_learn_sigma_instead_of_ignoring_it() {
    let (x, y) = set();
    let data = Data::new(&x, &y).unwrap().with_validation(&x, &y).unwrap();
    let cfg = EllaConfig { num_points: 6, num_eigen: 3, ..Default::default() };
    let e = fspace::valla::ella::fit(net(), LikelihoodSpec::gaussian_learned(0.1), &data, &cfg).unwrap_err();
    assert!(matches!(e, VallaError::Input(InputError::Invalid { what: "likelihood", .. })), "{e}");
    assert!(fspace::valla::ella::fit(net(), LikelihoodSpec::gaussian(0.1), &data, &cfg).is_ok());
}

#[test]
fn fsp_laplace_with_a_zero_length_schedule_is_refused() {
    let (x, y) = set();
    let data = Data::new(&x, &y).unwrap();
    let prior = GpPrior::centered(Rbf::new(1.0, 0.5).unwrap());
    for length in [Schedule::epochs(0), Schedule::steps(0)] {
        let cfg = FspConfig { schedule: length, n_context: 4, n_laplace_context: 6, ..Default::default() };
        let e =
            fspace::fsp_laplace::fit(net(), LikelihoodSpec::gaussian(0.1), &prior, &data, &cfg).unwrap_err();
        assert!(matches!(e, FspError::Input(InputError::Invalid { what: "schedule length", .. })), "{e}");
    }
}

#[test]
fn inputs_without_columns_are_refused() {
    let x = DMatrix::<f64>::zeros(5, 0);
    let y = DMatrix::<f64>::zeros(5, 1);
    let e = Data::new(&x, &y).unwrap_err();
    assert!(matches!(e, CoreError::Input(InputError::Invalid { what: "training inputs", .. })), "{e}");
    let (xt, yt) = set();
    let e = Data::new(&xt, &yt).unwrap().with_validation(&x, &y).unwrap_err();
    assert!(matches!(e, CoreError::Input(InputError::Invalid { .. })), "{e}");
}
