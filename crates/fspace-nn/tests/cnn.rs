//! The CNN: forward against a hand computation, Jacobian against central finite differences,
//! J·u / Jᵀ·V against the Jacobian, the adjoint identity, the papers' architectures, training
//! on the bundled digits, and bad input.

use fspace_core::{Categorical, Likelihood};
use fspace_input::InputError;
use fspace_nn::*;
use fspace_testutil::{assert_mat_close, fd_jacobian, rand_uniform, randn, randn_vec, rng};
use nalgebra::{DMatrix, DVector};
use proptest::prelude::*;

fn small(act: Activation, seed: u64) -> Cnn {
    Cnn::new(CnnConfig {
        input_shape: (2, 7, 6),
        convs: vec![
            ConvBlock { channels: 3, kernel: 3, same_padding: true, pool: true },
            ConvBlock { channels: 4, kernel: 2, same_padding: false, pool: false },
        ],
        hidden: vec![5],
        output_dim: 3,
        activation: act,
        seed,
    })
    .unwrap()
}

#[test]
fn forward_matches_a_hand_computation() {
    // One 3×3 filter on a 3×3 image (valid) is a dot product; tanh; then a 1 → 2 dense layer.
    let mut net = Cnn::new(CnnConfig {
        input_shape: (1, 3, 3),
        convs: vec![ConvBlock { channels: 1, kernel: 3, same_padding: false, pool: false }],
        hidden: vec![],
        output_dim: 2,
        activation: Activation::Tanh,
        seed: 0,
    })
    .unwrap();
    assert_eq!(net.n_params(), 9 + 1 + 2 + 2);
    let w: Vec<f64> = (0..9).map(|i| 0.1 * i as f64 - 0.3).collect();
    let mut p = w.clone();
    p.extend([0.2, 1.5, -0.5, 0.1, 0.3]);
    net.set_params(&DVector::from_vec(p)).unwrap();
    let img: Vec<f64> = (0..9).map(|i| (i as f64 * 0.7).sin()).collect();
    let h = (w.iter().zip(&img).map(|(a, b)| a * b).sum::<f64>() + 0.2).tanh();
    let f = net.forward(&DMatrix::from_row_slice(1, 9, &img)).unwrap();
    assert!((f[(0, 0)] - (1.5 * h + 0.1)).abs() < 1e-14 && (f[(0, 1)] - (-0.5 * h + 0.3)).abs() < 1e-14);
    // Same padding and a 2×2 max-pool: a 1-channel 4×4 image of distinct values, identity-like
    // centre filter, keeps the max of each window.
    let mut pool = Cnn::new(CnnConfig {
        input_shape: (1, 4, 4),
        convs: vec![ConvBlock { channels: 1, kernel: 3, same_padding: true, pool: true }],
        hidden: vec![],
        output_dim: 4,
        activation: Activation::Relu,
        seed: 0,
    })
    .unwrap();
    let mut p = vec![0.0; pool.n_params()];
    p[4] = 1.0; // centre tap
    for o in 0..4 {
        p[10 + o * 4 + o] = 1.0; // dense = identity on the 4 pooled values
    }
    pool.set_params(&DVector::from_vec(p)).unwrap();
    let img: Vec<f64> = (0..16).map(|i| ((i * 7) % 16) as f64).collect();
    let f = pool.forward(&DMatrix::from_row_slice(1, 16, &img)).unwrap();
    let expect = |y: usize, x: usize| {
        [
            img[2 * y * 4 + 2 * x],
            img[2 * y * 4 + 2 * x + 1],
            img[(2 * y + 1) * 4 + 2 * x],
            img[(2 * y + 1) * 4 + 2 * x + 1],
        ]
        .iter()
        .cloned()
        .fold(f64::MIN, f64::max)
    };
    for (o, (y, x)) in [(0, 0), (0, 1), (1, 0), (1, 1)].iter().enumerate() {
        assert_eq!(f[(0, o)], expect(*y, *x));
    }
}

#[test]
fn jacobian_matches_central_finite_differences() {
    for act in [Activation::Tanh, Activation::Sigmoid, Activation::Softplus, Activation::Gelu] {
        let net = small(act, 3);
        let x = rand_uniform(3, 84, -1.0, 1.0, &mut rng(4));
        let jac = net.jacobian(&x).unwrap();
        let w0 = net.params();
        let fd = fd_jacobian(
            |w| {
                let mut n2 = net.clone();
                n2.set_params(&DVector::from_column_slice(w)).unwrap();
                let f = n2.forward(&x).unwrap();
                (0..f.nrows())
                    .flat_map(|i| (0..f.ncols()).map(move |o| (i, o)))
                    .map(|(i, o)| f[(i, o)])
                    .collect()
            },
            w0.as_slice(),
            1e-6,
        );
        let scale = fd.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        let worst = (&jac - &fd).iter().fold(0.0f64, |m, v| m.max(v.abs())) / scale;
        eprintln!("{act:?}: p = {}, ‖J − J_FD‖_max/‖J‖_max = {worst:.2e}", net.n_params());
        assert!(worst < 1e-6, "{act:?}: {worst}");
        // J·u and Jᵀ·V against the Jacobian.
        let u = randn_vec(net.n_params(), &mut rng(5));
        let ju = net.jvp(&x, &u).unwrap();
        let ju_ref = &jac * &u;
        assert_mat_close(&ju, &DMatrix::from_row_slice(3, 3, ju_ref.as_slice()), 1e-10, 1e-12);
        let v = randn(3, 3, &mut rng(6));
        let v_flat = DVector::from_row_slice(v.transpose().as_slice());
        let jtv = net.vjp(&x, &v).unwrap();
        let jtv_ref = jac.transpose() * v_flat;
        fspace_testutil::assert_all_close(jtv.as_slice(), jtv_ref.as_slice(), 1e-10, 1e-12);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]
    #[test]
    fn adjoint_identity_holds(seed in 0u64..1000) {
        let net = small(Activation::Relu, seed);
        let x = rand_uniform(2, 84, -1.0, 1.0, &mut rng(seed + 1));
        let u = randn_vec(net.n_params(), &mut rng(seed + 2));
        let v = randn(2, 3, &mut rng(seed + 3));
        let lhs = net.jvp(&x, &u).unwrap().component_mul(&v).sum();
        let rhs = net.vjp(&x, &v).unwrap().dot(&u);
        prop_assert!((lhs - rhs).abs() <= 1e-10 * lhs.abs().max(1.0), "{} vs {}", lhs, rhs);
    }
}

#[test]
fn ggn_products_equal_the_dense_jacobian_product() {
    let net = small(Activation::Tanh, 9);
    let x = rand_uniform(3, 84, -1.0, 1.0, &mut rng(10));
    let f = net.forward(&x).unwrap();
    let y = DVector::from_vec(vec![0.0, 2.0, 1.0]);
    let hess = Categorical::new(3).unwrap().nll_hessian(&f, &y).unwrap();
    let jac = net.jacobian(&x).unwrap();
    let mut h = DMatrix::zeros(9, 9);
    for (i, hi) in hess.iter().enumerate() {
        h.view_mut((3 * i, 3 * i), (3, 3)).copy_from(hi);
    }
    let v = randn_vec(net.n_params(), &mut rng(11));
    let dense = jac.transpose() * h * &jac * &v;
    let prod = net.ggn_vector_product(&x, &hess, &v).unwrap();
    fspace_testutil::assert_all_close(prod.as_slice(), dense.as_slice(), 1e-10, 1e-12);
    // The GGN diagonal, and last-layer features: the dense head's input reproduces f.
    let ggn = jac.transpose()
        * {
            let mut h = DMatrix::zeros(9, 9);
            for (i, hi) in hess.iter().enumerate() {
                h.view_mut((3 * i, 3 * i), (3, 3)).copy_from(hi);
            }
            h
        }
        * &jac;
    fspace_testutil::assert_all_close(
        net.ggn_diagonal(&x, &hess).unwrap().as_slice(),
        ggn.diagonal().as_slice(),
        1e-10,
        1e-12,
    );
    let phi = net.last_layer_features(&x).unwrap();
    assert_eq!(phi.shape(), (3, 5));
    let p = net.params();
    let (w0, b0) = (p.len() - 3 * 5 - 3, p.len() - 3);
    let head = DMatrix::from_row_slice(3, 5, &p.as_slice()[w0..b0]);
    let f_head = &phi * head.transpose() + DMatrix::from_fn(3, 3, |_, o| p[b0 + o]);
    assert_mat_close(&f_head, &f, 1e-12, 1e-12);
}

#[test]
fn the_papers_architectures_have_their_parameter_counts() {
    let lenet = Cnn::new(CnnConfig::lenet5(10, Activation::Tanh, 0)).unwrap();
    assert_eq!(lenet.n_params(), 61_706); // LeCun et al. 1998 with a padded first layer
    let fsp = Cnn::new(CnnConfig::fsp_mnist(10, Activation::Tanh, 0)).unwrap();
    assert_eq!(fsp.n_params(), 160 + 4_640 + 18_496 + (64 * 49 * 128 + 128) + (128 * 10 + 10));
    let names: Vec<String> = fsp.param_blocks().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names[0], "conv0.weight");
    assert_eq!(names.last().unwrap(), "dense1.bias");
    let x = rand_uniform(2, 784, 0.0, 1.0, &mut rng(0));
    assert_eq!(fsp.forward(&x).unwrap().shape(), (2, 10));
    // serde round trip.
    let back: Cnn =
        serde_json::from_str::<Cnn>(&serde_json::to_string(&lenet).unwrap()).unwrap().validated().unwrap();
    // (serde_json's default float parser may differ in the last ulp.)
    assert!((back.params() - lenet.params()).amax() <= 1e-15);
    assert_eq!(back.forward(&rand_uniform(1, 784, 0.0, 1.0, &mut rng(1))).unwrap().ncols(), 10);
}

#[test]
fn a_small_cnn_learns_the_bundled_digits() {
    let digits = fspace_data::digits().unwrap();
    let x = digits.x.map(|v| v / 16.0);
    let y = digits.y_vec();
    let (train, test): (Vec<usize>, Vec<usize>) = (0..x.nrows()).partition(|i| i % 5 != 0);
    let (xtr, ytr) =
        (x.select_rows(&train), DVector::from_iterator(train.len(), train.iter().map(|&i| y[i])));
    let (xte, yte) = (x.select_rows(&test), DVector::from_iterator(test.len(), test.iter().map(|&i| y[i])));
    let mut net = Cnn::new(CnnConfig {
        input_shape: (1, 8, 8),
        convs: vec![ConvBlock { channels: 8, kernel: 3, same_padding: true, pool: true }],
        hidden: vec![32],
        output_dim: 10,
        activation: Activation::Relu,
        seed: 0,
    })
    .unwrap();
    let cfg = TrainConfig {
        schedule: fspace_core::Schedule::epochs(15),
        batch_size: 64,
        learning_rate: 3e-3,
        ..Default::default()
    };
    let mut lik = Categorical::new(10).unwrap();
    train_map(&mut net, &mut lik, &xtr, &ytr, None, None, &cfg, |_| {}).unwrap();
    let f = net.forward(&xte).unwrap();
    let correct = (0..f.nrows()).filter(|&i| f.row(i).transpose().argmax().0 as f64 == yte[i]).count();
    let acc = correct as f64 / f.nrows() as f64;
    eprintln!("digits CNN test accuracy {acc:.3} (NLL {:.3})", lik.nll(&f, &yte).unwrap() / f.nrows() as f64);
    assert!(acc > 0.9, "accuracy {acc}");
}

#[test]
fn bad_input_is_a_typed_error() {
    let mut net = small(Activation::Tanh, 0);
    assert!(net.forward(&DMatrix::zeros(2, 83)).is_err());
    assert!(net.forward(&DMatrix::zeros(0, 84)).is_err());
    let mut bad = DMatrix::zeros(1, 84);
    bad[(0, 5)] = f64::NAN;
    assert!(matches!(net.forward(&bad), Err(NnError::Input(InputError::NonFinite { .. }))));
    assert!(net.set_params(&DVector::zeros(3)).is_err());
    assert!(net.jvp(&DMatrix::zeros(1, 84), &DVector::zeros(2)).is_err());
    assert!(net.vjp(&DMatrix::zeros(1, 84), &DMatrix::zeros(1, 2)).is_err());
    let mut cfg = small(Activation::Tanh, 0).config().clone();
    cfg.convs[0].kernel = 2; // even kernel with same padding
    assert!(Cnn::new(cfg.clone()).is_err());
    cfg.convs[0].kernel = 9; // does not fit 7×6 (valid padding)
    cfg.convs[0].same_padding = false;
    assert!(Cnn::new(cfg).is_err());
}
