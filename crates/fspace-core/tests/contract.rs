//! The one-contract pieces: the heteroscedastic likelihood against finite differences and its
//! Fisher against the expected Hessian, the serialisable likelihood description, the versioned
//! save/load envelope, and method errors that keep their source.

use fspace_core::*;
use fspace_input::InputError;
use fspace_testutil::{assert_all_close, fd_gradient, randn, randn_vec, rng};
use nalgebra::{DMatrix, DVector};
use serde::{Deserialize, Serialize};

#[test]
fn heteroscedastic_gradient_matches_finite_differences() {
    let mut r = rng(3);
    let f = randn(6, 2, &mut r);
    let y = randn_vec(6, &mut r);
    let lik = HeteroscedasticGaussian;
    let flat: Vec<f64> = (0..6).flat_map(|i| [f[(i, 0)], f[(i, 1)]]).collect();
    let numeric = fd_gradient(|v| lik.nll(&DMatrix::from_row_slice(6, 2, v), &y).unwrap(), &flat, 1e-6);
    let g = lik.nll_grad(&f, &y).unwrap();
    let analytic: Vec<f64> = (0..6).flat_map(|i| [g[(i, 0)], g[(i, 1)]]).collect();
    assert_all_close(&analytic, &numeric, 1e-7, 1e-9);
    // The NLL is the Gaussian NLL with σ² = e^η, point by point.
    for i in 0..6 {
        let one = Gaussian::new((0.5 * f[(i, 1)]).exp()).unwrap();
        let expected =
            one.nll(&DMatrix::from_element(1, 1, f[(i, 0)]), &DVector::from_element(1, y[i])).unwrap();
        let got = lik
            .nll(&DMatrix::from_row_slice(1, 2, &[f[(i, 0)], f[(i, 1)]]), &DVector::from_element(1, y[i]))
            .unwrap();
        assert!((got - expected).abs() < 1e-12, "{got} vs {expected}");
    }
}

#[test]
fn heteroscedastic_curvature_is_the_expected_hessian() {
    // The finite-difference Hessian at y = μ ± σ (the two points whose average is the
    // expectation of the exact Hessian's entries, which are polynomial of degree ≤ 2 in y − μ)
    // averages to the returned Fisher block, which is PSD while the exact Hessian is not.
    let lik = HeteroscedasticGaussian;
    let (mu, eta) = (0.3, -0.7);
    let sigma = (0.5f64 * eta).exp();
    let f = DMatrix::from_row_slice(1, 2, &[mu, eta]);
    let mut mean_hess = DMatrix::zeros(2, 2);
    for y in [mu - sigma, mu + sigma] {
        let yv = DVector::from_element(1, y);
        for a in 0..2 {
            let row = fd_gradient(
                |v| lik.nll_grad(&DMatrix::from_row_slice(1, 2, v), &yv).unwrap()[(0, a)],
                &[mu, eta],
                1e-5,
            );
            for b in 0..2 {
                mean_hess[(a, b)] += 0.5 * row[b];
            }
        }
        let exact_det = {
            let r = y - mu;
            let p = (-eta).exp();
            p * (0.5 * r * r * p) - (r * p).powi(2)
        };
        assert!(exact_det < 0.0, "the exact Hessian is indefinite off the mode");
    }
    let fisher = &lik.nll_hessian(&f, &DVector::from_element(1, mu + 1.0)).unwrap()[0];
    assert_all_close(fisher.as_slice(), mean_hess.as_slice(), 1e-6, 1e-8);
    assert!((fisher[(0, 0)] - (-eta).exp()).abs() < 1e-14 && fisher[(1, 1)] == 0.5 && fisher[(0, 1)] == 0.0);
}

#[test]
fn heteroscedastic_predictive_adds_the_expected_noise() {
    let mean = DMatrix::from_row_slice(2, 2, &[1.0, 0.0, -1.0, 2.0f64.ln()]);
    let var = DMatrix::from_row_slice(2, 2, &[0.5, 0.0, 0.1, 0.2]);
    let (m, v) = HeteroscedasticGaussian.predictive(&mean, &var).unwrap();
    assert_eq!(m.as_slice(), &[1.0, -1.0]);
    assert!((v[0] - 1.5).abs() < 1e-14);
    assert!((v[1] - (0.1 + 2.0 * 0.1f64.exp())).abs() < 1e-12);
    assert!(matches!(
        HeteroscedasticGaussian.predictive(&DMatrix::zeros(2, 1), &DMatrix::zeros(2, 1)),
        Err(CoreError::Input(InputError::DimensionMismatch { .. }))
    ));
}

#[test]
fn likelihood_spec_builds_and_round_trips() {
    let specs = [
        LikelihoodSpec::gaussian(0.1),
        LikelihoodSpec::gaussian_learned(1.0),
        LikelihoodSpec::IsotropicGaussian { sigma: 0.2, outputs: 2, learn: false },
        LikelihoodSpec::Bernoulli,
        LikelihoodSpec::categorical(10),
        LikelihoodSpec::HeteroscedasticGaussian,
    ];
    let dims = [(1, 1), (1, 1), (2, 2), (1, 1), (10, 1), (2, 1)];
    for (spec, (d_out, d_t)) in specs.iter().zip(dims) {
        let built = spec.build().unwrap();
        assert_eq!((built.output_dim(), built.target_dim()), (d_out, d_t), "{spec:?}");
        assert_eq!((spec.output_dim(), spec.target_dim()), (d_out, d_t));
        let text = serde_json::to_string(spec).unwrap();
        assert_eq!(&serde_json::from_str::<LikelihoodSpec>(&text).unwrap(), spec);
    }
    assert_eq!(serde_json::to_string(&specs[0]).unwrap(), r#"{"type":"gaussian","sigma":0.1,"learn":false}"#);
    assert!(specs[1].learns_noise() && !specs[0].learns_noise());
    assert_eq!(specs[1].with_noise_std(0.3).noise_std(), Some(0.3));
    assert_eq!(specs[3].with_noise_std(0.3), specs[3]);
    assert_eq!(LikelihoodSpec::gaussian_outputs(0.1, 1), specs[0]);
    assert_eq!(LikelihoodSpec::gaussian_outputs(0.2, 2), specs[2]);
    for bad in [
        LikelihoodSpec::gaussian(0.0),
        LikelihoodSpec::gaussian(f64::NAN),
        LikelihoodSpec::IsotropicGaussian { sigma: 1.0, outputs: 0, learn: false },
        LikelihoodSpec::categorical(1),
    ] {
        assert!(bad.validate().is_err(), "{bad:?} accepted");
    }
    let e = LikelihoodSpec::Bernoulli.unsupported("GFSVI");
    assert_eq!(e.to_string(), "GFSVI does not support the Bernoulli likelihood");
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct Saved {
    values: Vec<f64>,
    spec: LikelihoodSpec,
}

impl Persist for Saved {
    const KIND: &'static str = "test::Saved";
    const VERSION: u32 = 2;
    fn validate_loaded(&self) -> Result<(), PersistError> {
        let check = LoadCheck::new(Self::KIND);
        check.finite("values", &self.values)?;
        check.likelihood("spec", &self.spec, self.spec.output_dim())
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct Other {
    values: Vec<f64>,
}

impl Persist for Other {
    const KIND: &'static str = "test::Other";
    const VERSION: u32 = 1;
    fn validate_loaded(&self) -> Result<(), PersistError> {
        LoadCheck::new(Self::KIND).finite("values", &self.values)
    }
}

#[test]
fn persist_round_trips_bit_for_bit_and_refuses_other_files() {
    let mut r = rng(9);
    let values: Vec<f64> = randn_vec(50, &mut r).iter().map(|v| v * 1e-7 + 1.0 / 3.0).collect();
    let saved = Saved { values, spec: LikelihoodSpec::HeteroscedasticGaussian };
    let dir = std::env::temp_dir().join(format!("fspace-core-persist-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("saved.json");
    saved.save(&path).unwrap();
    let back = Saved::load(&path).unwrap();
    assert_eq!(back, saved);
    assert!(back.values.iter().zip(&saved.values).all(|(a, b)| a.to_bits() == b.to_bits()));

    assert!(matches!(Other::load(&path), Err(PersistError::WrongType { expected: "test::Other", .. })));
    let text = std::fs::read_to_string(&path).unwrap();
    let newer = text.replace(r#""version":2"#, r#""version":3"#);
    assert!(matches!(
        Saved::from_json(&newer),
        Err(PersistError::WrongVersion { expected: 2, found: 3, .. })
    ));
    let foreign = text.replace(r#""format":"fspace""#, r#""format":"other""#);
    assert!(matches!(Saved::from_json(&foreign), Err(PersistError::NotFspace { .. })));
    let truncated = &text[..text.len() / 2];
    let e = Saved::from_json(truncated).unwrap_err();
    assert!(matches!(e, PersistError::Json { .. }) && std::error::Error::source(&e).is_some());
    let bad_payload = text.replace(r#""values":["#, r#""valuez":["#);
    assert!(matches!(Saved::from_json(&bad_payload), Err(PersistError::Json { .. })));
    assert!(matches!(Saved::load(dir.join("missing.json")), Err(PersistError::Io { .. })));
    // JSON has no NaN: serde_json writes `null`, and loading such a file is an error.
    let nan = Saved { values: vec![f64::NAN], spec: LikelihoodSpec::Bernoulli }.to_json().unwrap();
    assert!(matches!(Saved::from_json(&nan), Err(PersistError::Json { .. })));
    // validate_loaded runs on every load and names the field.
    let one_class =
        text.replacen(r#"{"type":"heteroscedastic_gaussian"}"#, r#"{"type":"categorical","classes":1}"#, 1);
    assert_ne!(one_class, text);
    match Saved::from_json(&one_class) {
        Err(PersistError::Invalid { kind: "test::Saved", field, .. }) => assert_eq!(field, "spec"),
        other => panic!("{other:?}"),
    }
    // A file longer than the caller's limit is refused before it is read.
    let limits = LoadLimits { max_bytes: text.len() as u64 - 1 };
    match Saved::load_with_limits(&path, &limits) {
        Err(PersistError::TooLarge { bytes, limit, .. }) => {
            assert_eq!((bytes, limit), (text.len() as u64, limits.max_bytes))
        }
        other => panic!("{other:?}"),
    }
    let exact = LoadLimits { max_bytes: text.len() as u64 };
    assert_eq!(Saved::load_with_limits(&path, &exact).unwrap(), saved);
    assert_eq!(LoadLimits::default().max_bytes, 2 << 30);
    std::fs::remove_dir_all(&dir).ok();
}

#[derive(Debug, thiserror::Error)]
#[error("inner failure {0}")]
struct Inner(u32);

#[test]
fn method_errors_keep_their_source() {
    let e = CoreError::method("Laplace posterior", Inner(7));
    assert_eq!(e.to_string(), "Laplace posterior: inner failure 7");
    let source = std::error::Error::source(&e).expect("a source");
    assert_eq!(source.to_string(), "inner failure 7");
    match &e {
        CoreError::Method { source, .. } => assert_eq!(source.downcast_ref::<Inner>().map(|i| i.0), Some(7)),
        other => panic!("{other:?}"),
    }
    assert_eq!(e.clone(), e);
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct WithMatrix {
    m: DMatrix<f64>,
}

impl Persist for WithMatrix {
    const KIND: &'static str = "test::WithMatrix";
    const VERSION: u32 = 1;
    fn validate_loaded(&self) -> Result<(), PersistError> {
        LoadCheck::new(Self::KIND).finite("m", self.m.iter())
    }
}

/// nalgebra multiplies a matrix's declared dimensions without an overflow check: a saved
/// `[[], 2^32, 2^32]` would be a 2^32 × 2^32 matrix holding nothing. The envelope refuses every
/// matrix whose dimensions do not multiply to its data before the payload is parsed.
#[test]
fn a_matrix_whose_dimensions_overflow_or_disagree_with_its_data_is_refused() {
    let ok = WithMatrix { m: DMatrix::from_row_slice(2, 3, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]) };
    let text = ok.to_json().unwrap();
    assert_eq!(WithMatrix::from_json(&text).unwrap(), ok);
    let payload = |m: &str| {
        format!(r#"{{"format":"fspace","type":"test::WithMatrix","version":1,"payload":{{"m":{m}}}}}"#)
    };
    for bad in [
        "[[], 4294967296, 4294967296]",
        "[[1.0], 9223372036854775808, 2]",
        "[[1.0, 2.0], 3, 1]",
        r#"[[1.0, "x\"]", 2.5e-3], 1, 2]"#,
    ] {
        match WithMatrix::from_json(&payload(bad)) {
            Err(PersistError::Invalid { reason, .. }) => {
                assert!(reason.contains("a matrix declares"), "{reason}")
            }
            other => panic!("{bad}: {other:?}"),
        }
    }
}

/// `checked_joint` passes a covariance and refuses NaN, ∞, a shape mismatch and a variance
/// below zero beyond rounding; `clip_rounding` clips rounding to 0 but keeps a NaN for the
/// predictive's finite check to refuse.
#[test]
fn joint_predictives_are_checked_and_nan_variances_are_not_clipped_away() {
    use fspace_core::{checked_joint, clip_rounding, FunctionPredictive};
    let mean = DMatrix::from_row_slice(2, 1, &[0.5, -1.0]);
    let cov = DMatrix::from_row_slice(2, 2, &[2.0, 0.5, 0.5, -1e-12]);
    assert!(checked_joint(mean.clone(), cov.clone()).is_ok());
    let mut bad = cov.clone();
    bad[(1, 1)] = -0.1;
    assert!(matches!(checked_joint(mean.clone(), bad), Err(CoreError::NotPsd { .. })));
    let mut nan = cov.clone();
    nan[(0, 1)] = f64::NAN;
    assert!(checked_joint(mean.clone(), nan).is_err());
    assert!(checked_joint(mean.clone(), DMatrix::from_element(2, 2, f64::INFINITY)).is_err());
    assert!(checked_joint(mean, DMatrix::identity(3, 3)).is_err());
    assert_eq!(clip_rounding(-1e-15), 0.0);
    assert_eq!(clip_rounding(0.25), 0.25);
    assert!(clip_rounding(f64::NAN).is_nan());
    let var = DMatrix::from_element(1, 1, clip_rounding(f64::NAN));
    assert!(FunctionPredictive::new(DMatrix::zeros(1, 1), var).is_err());
}
