//! Settings that used to be accepted silently where a user had made a mistake are typed errors
//! that name the setting.

use fspace::core::{CoreError, Data, LikelihoodSpec};
use fspace::fsp_laplace::{FspConfig, FspError};
use fspace::gfsvi::{FviConfig, GfsviError, MfviConfig, OptimConfig};
use fspace::input::InputError;
use fspace::kernels::{GpPrior, Rbf};
use fspace::nn::{Activation, Mlp, MlpConfig};
use fspace::valla::{EllaConfig, VallaError};
use nalgebra::DMatrix;

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

#[test]
fn zero_predictive_samples_in_fvi_and_mfvi_are_refused() {
    let (x, y) = set();
    let data = Data::new(&x, &y).unwrap();
    let optim = OptimConfig { max_steps: 2, batch_size: 6, ..Default::default() };
    let prior = GpPrior::centered(Rbf::new(1.0, 0.5).unwrap());
    let fvi = FviConfig {
        n_uniform: 3,
        n_batch: 3,
        optim: optim.clone(),
        predictive_samples: 0,
        ..Default::default()
    };
    let e = fspace::gfsvi::fit_fvi(net(), LikelihoodSpec::gaussian(0.1), &prior, &data, &fvi).unwrap_err();
    assert!(matches!(e, GfsviError::Input(InputError::Invalid { what: "predictive_samples", .. })), "{e}");
    let mfvi = MfviConfig { optim, predictive_samples: 0, ..Default::default() };
    let e = fspace::gfsvi::fit_mfvi(net(), LikelihoodSpec::gaussian(0.1), &data, &mfvi).unwrap_err();
    assert!(matches!(e, GfsviError::Input(InputError::Invalid { what: "predictive_samples", .. })), "{e}");
}

#[test]
fn ella_refuses_to_learn_sigma_instead_of_ignoring_it() {
    let (x, y) = set();
    let data = Data::new(&x, &y).unwrap().with_validation(&x, &y).unwrap();
    let cfg = EllaConfig { num_points: 6, num_eigen: 3, ..Default::default() };
    let e = fspace::valla::fit_ella(net(), LikelihoodSpec::gaussian_learned(0.1), &data, &cfg).unwrap_err();
    assert!(matches!(e, VallaError::Input(InputError::Invalid { what: "likelihood", .. })), "{e}");
    assert!(fspace::valla::fit_ella(net(), LikelihoodSpec::gaussian(0.1), &data, &cfg).is_ok());
}

#[test]
fn fsp_laplace_with_zero_epochs_is_refused() {
    let (x, y) = set();
    let data = Data::new(&x, &y).unwrap();
    let prior = GpPrior::centered(Rbf::new(1.0, 0.5).unwrap());
    let cfg = FspConfig { epochs: 0, n_context: 4, n_laplace_context: 6, ..Default::default() };
    let e = fspace::fsp_laplace::fit(net(), LikelihoodSpec::gaussian(0.1), &prior, &data, &cfg).unwrap_err();
    assert!(matches!(e, FspError::Input(InputError::Invalid { what: "epochs", .. })), "{e}");
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
