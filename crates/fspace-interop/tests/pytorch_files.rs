//! Files written by PyTorch / numpy (`scripts/interop/make_fixtures.py`): fspace's forward pass
//! reproduces PyTorch's logits, the round trip through fspace's writers is exact, and every
//! malformed case gets its typed error.

use std::path::PathBuf;

use fspace_interop::{
    cnn_tensors, infer_mlp, infer_mlp_config, load_cnn, load_mlp, mlp_tensors, InteropError, LayerNames,
    SourceDtype, Tensor, Tensors,
};
use fspace_nn::{Activation, Cnn, CnnConfig, ConvBlock, MlpConfig};
use nalgebra::DMatrix;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests").join("fixtures").join(name)
}

fn read(name: &str) -> Tensors {
    Tensors::read(fixture(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn matrix(t: &Tensor) -> DMatrix<f64> {
    assert_eq!(t.shape.len(), 2);
    DMatrix::from_row_slice(t.shape[0], t.shape[1], &t.data)
}

/// `(x, logits)` that PyTorch computed, from `<stem>_io.npz`.
fn io(stem: &str) -> (DMatrix<f64>, DMatrix<f64>) {
    let t = read(&format!("{stem}_io.npz"));
    (matrix(t.get("x").unwrap()), matrix(t.get("logits").unwrap()))
}

fn max_abs_diff(a: &DMatrix<f64>, b: &DMatrix<f64>) -> f64 {
    assert_eq!(a.shape(), b.shape());
    a.iter().zip(b.iter()).map(|(u, v)| (u - v).abs()).fold(0.0, f64::max)
}

fn small_cnn_config() -> CnnConfig {
    CnnConfig {
        input_shape: (2, 8, 8),
        convs: vec![
            ConvBlock { channels: 3, kernel: 3, same_padding: true, pool: true },
            ConvBlock { channels: 4, kernel: 3, same_padding: false, pool: false },
        ],
        hidden: vec![6],
        output_dim: 3,
        activation: Activation::Tanh,
        seed: 0,
    }
}

#[test]
fn mlp_forward_reproduces_pytorch_logits() {
    let cases = [
        ("mlp_f64.safetensors", "mlp_f64", Activation::Tanh, SourceDtype::F64, 1e-12),
        ("mlp_f32.safetensors", "mlp_f32", Activation::Tanh, SourceDtype::F32, 1e-6),
        ("mlp_f64.npz", "mlp_f64_npz", Activation::Tanh, SourceDtype::F64, 1e-12),
        ("mlp_f32_compressed.npz", "mlp_f32_compressed", Activation::Tanh, SourceDtype::F32, 1e-6),
        ("mlp_gelu_f64.safetensors", "mlp_gelu_f64", Activation::Gelu, SourceDtype::F64, 1e-12),
    ];
    for (file, stem, activation, dtype, tol) in cases {
        let tensors = read(file);
        assert!(tensors.iter().all(|(_, t)| t.dtype == dtype), "{file}");
        let config = infer_mlp_config(&tensors, activation, &LayerNames::Natural).unwrap();
        assert_eq!(
            (config.input_dim, config.hidden.clone(), config.output_dim),
            (3, vec![5, 4], 2),
            "{file}"
        );
        let net = infer_mlp(&tensors, activation, &LayerNames::Natural).unwrap();
        let (x, logits) = io(stem);
        let err = max_abs_diff(&net.forward(&x).unwrap(), &logits);
        eprintln!("{file}: max |Δlogit| = {err:.1e}");
        assert!(err < tol, "{file}: max |Δlogit| = {err:e} (tolerance {tol:e})");
    }
}

#[test]
fn cnn_forward_reproduces_pytorch_logits() {
    for (tag, tol) in [("f64", 1e-12), ("f32", 1e-6)] {
        let tensors = read(&format!("cnn_{tag}.safetensors"));
        // "classifier.*" sorts before "features.*"; the convolutions still come first.
        let net = load_cnn(&tensors, &small_cnn_config(), &LayerNames::Natural).unwrap();
        let (x, logits) = io(&format!("cnn_{tag}"));
        let err = max_abs_diff(&net.forward(&x).unwrap(), &logits);
        eprintln!("cnn_{tag}.safetensors: max |Δlogit| = {err:.1e}");
        assert!(err < tol, "cnn {tag}: max |Δlogit| = {err:e} (tolerance {tol:e})");
        let explicit = LayerNames::Explicit(
            ["features.0", "features.3", "classifier.0", "classifier.2"].map(String::from).to_vec(),
        );
        let same = load_cnn(&tensors, &small_cnn_config(), &explicit).unwrap();
        assert_eq!(same.params(), net.params());
    }
}

#[test]
fn weights_round_trip_through_fspace_writers_bit_for_bit() {
    let net = infer_mlp(&read("mlp_f64.safetensors"), Activation::Tanh, &LayerNames::Natural).unwrap();
    let exported = mlp_tensors(&net);
    let from_st =
        Tensors::from_safetensors_bytes(&exported.to_safetensors_bytes(SourceDtype::F64).unwrap(), "st")
            .unwrap();
    let from_npz = Tensors::from_npz_bytes(&exported.to_npz_bytes().unwrap(), "npz").unwrap();
    for back in [from_st, from_npz] {
        let again = load_mlp(&back, net.config(), &LayerNames::Natural).unwrap();
        assert_eq!(again.params(), net.params());
    }
    // f32 export rounds each weight to the nearest f32 and nothing else.
    let f32_back =
        Tensors::from_safetensors_bytes(&exported.to_safetensors_bytes(SourceDtype::F32).unwrap(), "st32")
            .unwrap();
    let rounded = load_mlp(&f32_back, net.config(), &LayerNames::Natural).unwrap();
    let expected = net.params().map(|v| v as f32 as f64);
    assert_eq!(rounded.params(), expected);

    let cnn = load_cnn(&read("cnn_f64.safetensors"), &small_cnn_config(), &LayerNames::Natural).unwrap();
    let back = Tensors::from_safetensors_bytes(
        &cnn_tensors(&cnn).to_safetensors_bytes(SourceDtype::F64).unwrap(),
        "c",
    )
    .unwrap();
    let again: Cnn = load_cnn(&back, &small_cnn_config(), &LayerNames::Natural).unwrap();
    assert_eq!(again.params(), cnn.params());
}

fn mlp_config(hidden: Vec<usize>) -> MlpConfig {
    MlpConfig { input_dim: 3, hidden, output_dim: 2, activation: Activation::Tanh, seed: 0 }
}

#[test]
fn missing_tensor_is_named() {
    let mut t = read("mlp_f64.safetensors");
    t.remove("2.bias");
    match load_mlp(&t, &mlp_config(vec![5, 4]), &LayerNames::Natural) {
        Err(InteropError::MissingTensor { name, available, .. }) => {
            assert_eq!(name, "2.bias");
            assert!(available.contains("2.weight"), "{available}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn shape_mismatch_names_tensor_and_both_shapes() {
    let t = read("mlp_f64.safetensors");
    match load_mlp(&t, &mlp_config(vec![6, 4]), &LayerNames::Natural) {
        Err(InteropError::ShapeMismatch { name, expected, found, .. }) => {
            assert_eq!((name.as_str(), expected, found), ("0.weight", vec![6, 3], vec![5, 3]));
        }
        other => panic!("{other:?}"),
    }
    // Explicit names in the wrong order: the 4 × 5 layer offered where 5 × 3 is needed.
    let swapped = LayerNames::Explicit(["2", "0", "4"].map(String::from).to_vec());
    assert!(matches!(
        load_mlp(&t, &mlp_config(vec![5, 4]), &swapped),
        Err(InteropError::ShapeMismatch { name, .. }) if name == "2.weight"
    ));
}

#[test]
fn unsupported_dtypes_are_refused_with_the_dtype() {
    match Tensors::read(fixture("mlp_f16.safetensors")) {
        Err(InteropError::UnsupportedDtype { dtype, .. }) => assert_eq!(dtype, "F16"),
        other => panic!("{other:?}"),
    }
    match Tensors::read(fixture("mlp_int.npz")) {
        Err(InteropError::UnsupportedDtype { dtype, .. }) => assert_eq!(dtype, "<i8"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn unknown_and_unused_names_are_refused() {
    let extra = |name: &str, shape: Vec<usize>| {
        let mut t = read("mlp_f64.safetensors");
        let n = shape.iter().product();
        t.insert(name, Tensor { shape, data: vec![0.0; n], dtype: SourceDtype::F64 });
        t
    };
    // A buffer such as batch-norm's running mean is not a weight or a bias.
    let t = extra("norm.running_mean", vec![4]);
    assert!(matches!(
        infer_mlp(&t, Activation::Tanh, &LayerNames::Natural),
        Err(InteropError::UnknownName { name, .. }) if name == "norm.running_mean"
    ));
    // A 1-d weight (layer norm) is no dense layer, and nothing takes it.
    let t = extra("norm.weight", vec![4]);
    assert!(matches!(
        load_mlp(&t, &mlp_config(vec![5, 4]), &LayerNames::Natural),
        Err(InteropError::UnusedTensors { names, .. }) if names == "norm.weight"
    ));
    // A fourth dense layer for a three-layer network.
    let t = extra("6.weight", vec![2, 2]);
    assert!(matches!(
        load_mlp(&t, &mlp_config(vec![5, 4]), &LayerNames::Natural),
        Err(InteropError::LayerCount { expected: 3, found: 4, .. })
    ));
    // Explicit names leave the third layer's tensors unused when the network has two layers.
    let t = read("mlp_f64.safetensors");
    let two =
        MlpConfig { input_dim: 3, hidden: vec![5], output_dim: 4, activation: Activation::Tanh, seed: 0 };
    let names = LayerNames::Explicit(["0", "2"].map(String::from).to_vec());
    assert!(matches!(
        load_mlp(&t, &two, &names),
        Err(InteropError::UnusedTensors { names, .. }) if names == "4.bias, 4.weight"
    ));
}

#[test]
fn truncated_and_corrupt_files_are_refused() {
    let dir = std::env::temp_dir().join(format!("fspace-interop-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for name in ["mlp_f64.safetensors", "mlp_f64.npz", "mlp_f32_compressed.npz"] {
        let bytes = std::fs::read(fixture(name)).unwrap();
        for keep in [4, bytes.len() / 2, bytes.len() - 1] {
            let path = dir.join(name);
            std::fs::write(&path, &bytes[..keep]).unwrap();
            match Tensors::read(&path) {
                Err(InteropError::Truncated { file, .. }) => assert!(file.ends_with(name)),
                other => panic!("{name} cut to {keep} bytes: {other:?}"),
            }
        }
    }
    let garbage = dir.join("garbage.npz");
    std::fs::write(&garbage, b"this is not a zip archive at all").unwrap();
    assert!(matches!(Tensors::read(&garbage), Err(InteropError::Corrupt { format: "npz", .. })));
    // A header that is valid JSON but not a safetensors header.
    let mut st = 2u64.to_le_bytes().to_vec();
    st.extend(b"[]");
    let bad = dir.join("bad.safetensors");
    std::fs::write(&bad, st).unwrap();
    assert!(matches!(Tensors::read(&bad), Err(InteropError::Corrupt { format: "safetensors", .. })));
    assert!(matches!(Tensors::read(dir.join("weights.pt")), Err(InteropError::UnknownFormat { .. })));
    assert!(matches!(Tensors::read(dir.join("absent.npz")), Err(InteropError::Io { .. })));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn non_finite_weights_are_refused() {
    let mut t = read("mlp_f64.safetensors");
    let mut w = t.get("2.weight").unwrap().clone();
    w.data[3] = f64::NAN;
    t.insert("2.weight", w);
    assert!(matches!(
        infer_mlp(&t, Activation::Tanh, &LayerNames::Natural),
        Err(InteropError::NonFinite { name, .. }) if name == "2.weight"
    ));
}

#[test]
fn architecture_inference_refuses_a_broken_chain() {
    let mut t = read("mlp_f64.safetensors");
    let w = Tensor { shape: vec![2, 7], data: vec![0.0; 14], dtype: SourceDtype::F64 };
    t.insert("4.weight", w);
    assert!(matches!(
        infer_mlp_config(&t, Activation::Tanh, &LayerNames::Natural),
        Err(InteropError::Ambiguous { reason, .. }) if reason.contains("`4.weight` takes 7 inputs")
    ));
    assert!(matches!(
        infer_mlp_config(&Tensors::new("empty"), Activation::Tanh, &LayerNames::Natural),
        Err(InteropError::Ambiguous { .. })
    ));
}
