//! Predictions written for Python: every array reads back with its shape and exact values.

use std::path::PathBuf;

use fspace_core::{Data, LikelihoodSpec, Posterior};
use fspace_interop::{
    infer_mlp, write_posterior_npz, LayerNames, NpzWriter, PosteriorExport, SourceDtype, Tensors,
};
use fspace_laplace::{fit, LaplaceConfig, Structure};
use fspace_nn::Activation;
use fspace_testutil::{randn, rng};
use nalgebra::{DMatrix, DVector};
use proptest::prelude::*;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests").join("fixtures").join(name)
}

#[test]
fn npz_writer_arrays_read_back_with_shape_and_values() {
    let mut r = rng(3);
    let m = randn(4, 3, &mut r);
    let v = DVector::from_vec(vec![1.5, -2.0]);
    let samples = vec![randn(4, 2, &mut r), randn(4, 2, &mut r), randn(4, 2, &mut r)];
    let mut w = NpzWriter::new();
    w.matrix("m", &m).unwrap().vector("v", &v).unwrap().scalar("s", 0.25).unwrap();
    w.samples("f", &samples).unwrap().text("method", "LLA KFAC (λ by marglik)").unwrap();
    let back = Tensors::from_npz_bytes(&w.into_bytes().unwrap(), "w").unwrap();
    let m_back = back.get("m").unwrap();
    assert_eq!(m_back.shape, vec![4, 3]);
    assert_eq!(DMatrix::from_row_slice(4, 3, &m_back.data), m);
    assert_eq!(back.get("v").unwrap().data, v.as_slice());
    let s = back.get("s").unwrap();
    assert_eq!((s.shape.clone(), s.data.clone()), (vec![], vec![0.25]));
    let f = back.get("f").unwrap();
    assert_eq!(f.shape, vec![3, 4, 2]);
    for (k, sample) in samples.iter().enumerate() {
        assert_eq!(DMatrix::from_row_slice(4, 2, &f.data[8 * k..8 * (k + 1)]), *sample);
    }
    assert_eq!(back.text("method"), Some("LLA KFAC (λ by marglik)"));
}

#[test]
fn npz_writer_refuses_duplicate_names_and_ragged_samples() {
    let mut w = NpzWriter::new();
    w.scalar("a", 1.0).unwrap();
    assert!(w.scalar("a", 2.0).is_err());
    assert!(w.array("b", &[2, 2], &[1.0, 2.0, 3.0]).is_err());
    assert!(w.samples("c", &[DMatrix::zeros(2, 1), DMatrix::zeros(3, 1)]).is_err());
}

#[test]
fn posterior_export_matches_the_posterior() {
    // The PyTorch network, a Laplace posterior around it, and its predictions written out.
    let net = infer_mlp(
        &Tensors::read(fixture("mlp_f64.safetensors")).unwrap(),
        Activation::Tanh,
        &LayerNames::Natural,
    )
    .unwrap();
    let mut r = rng(5);
    let x = randn(40, 3, &mut r);
    let y = net.forward(&x).unwrap() + 0.1 * randn(40, 2, &mut r);
    let likelihood = LikelihoodSpec::IsotropicGaussian { sigma: 0.1, outputs: 2, learn: false };
    let cfg = LaplaceConfig { structure: Structure::Full(Default::default()), ..LaplaceConfig::default() };
    let post = fit(net, likelihood, &Data::new(&x, &y).unwrap(), &cfg).unwrap().posterior;
    let x_test = randn(6, 3, &mut r);
    let path = std::env::temp_dir().join(format!("fspace-interop-export-{}.npz", std::process::id()));
    let summary = [("prior_precision", post.prior_precision()[0]), ("n_params", 47.0)];
    let export = PosteriorExport { method: "LLA full", x: &x_test, samples: 5, summary: &summary };
    write_posterior_npz(&path, &post, &export, &mut rng(9)).unwrap();

    let back = Tensors::read(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    let p = post.predict(&x_test).unwrap();
    let get = |name: &str| {
        let t = back.get(name).unwrap_or_else(|| panic!("{name}"));
        DMatrix::from_row_slice(t.shape[0], t.shape[1], &t.data)
    };
    assert_eq!(get("x"), x_test);
    assert_eq!(get("mean"), p.mean);
    assert_eq!(get("var"), p.var);
    let samples = back.get("samples").unwrap();
    assert_eq!(samples.shape, vec![5, 6, 2]);
    let expected = post.sample_functions(&x_test, 5, &mut rng(9)).unwrap();
    assert_eq!(
        samples.data,
        expected.iter().flat_map(|s| s.transpose().as_slice().to_vec()).collect::<Vec<_>>()
    );
    assert_eq!(back.get("summary.n_params").unwrap().data, vec![47.0]);
    assert_eq!(back.text("method"), Some("LLA full"));
}

proptest! {
    /// Any set of finite tensors survives both writers and both readers unchanged (f64), and the
    /// f32 safetensors path rounds each value to f32 and nothing else.
    #[test]
    fn tensors_round_trip(shapes in prop::collection::vec(prop::collection::vec(0usize..4, 0..4), 1..5), seed in 0u64..1000) {
        let mut r = rng(seed);
        let mut t = Tensors::new("prop");
        for (k, shape) in shapes.iter().enumerate() {
            let n: usize = shape.iter().product();
            let data = randn(n.max(1), 1, &mut r).as_slice()[..n].to_vec();
            t.insert(format!("t{k}.weight"), fspace_interop::Tensor { shape: shape.clone(), data, dtype: SourceDtype::F64 });
        }
        let st = Tensors::from_safetensors_bytes(&t.to_safetensors_bytes(SourceDtype::F64).unwrap(), "prop").unwrap();
        let npz = Tensors::from_npz_bytes(&t.to_npz_bytes().unwrap(), "prop").unwrap();
        prop_assert_eq!(&st, &t);
        prop_assert_eq!(&npz, &t);
        let st32 = Tensors::from_safetensors_bytes(&t.to_safetensors_bytes(SourceDtype::F32).unwrap(), "prop").unwrap();
        for (name, tensor) in t.iter() {
            let back = st32.get(name).unwrap();
            prop_assert_eq!(&back.shape, &tensor.shape);
            prop_assert_eq!(back.dtype, SourceDtype::F32);
            let rounded: Vec<f64> = tensor.data.iter().map(|&v| v as f32 as f64).collect();
            prop_assert_eq!(&back.data, &rounded);
        }
    }
}
