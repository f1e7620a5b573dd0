//! The Helmholtz network: outputs are input-derivatives of the scalar nets, the two parts are
//! curl-free and divergence-free, and the second-order parameter Jacobian matches finite
//! differences.

use fspace_nn::*;
use fspace_testutil::{assert_mat_close, fd_jacobian, rand_uniform, randn, rng};
use nalgebra::{DMatrix, DVector};

fn scalar(net: &Mlp, x: f64, y: f64) -> f64 {
    net.forward(&DMatrix::from_row_slice(1, 2, &[x, y])).unwrap()[(0, 0)]
}

#[test]
fn outputs_are_gradient_plus_rotated_gradient() {
    let h = HelmholtzNet::new(vec![16, 16], Activation::Tanh, 3).unwrap();
    let x = rand_uniform(5, 2, -1.0, 1.0, &mut rng(1));
    let f = h.forward(&x).unwrap();
    let e = 1e-6;
    for i in 0..5 {
        let (a, b) = (x[(i, 0)], x[(i, 1)]);
        let d = |net: &Mlp, j: usize| {
            if j == 0 {
                (scalar(net, a + e, b) - scalar(net, a - e, b)) / (2.0 * e)
            } else {
                (scalar(net, a, b + e) - scalar(net, a, b - e)) / (2.0 * e)
            }
        };
        assert!((f[(i, 0)] - (d(h.phi(), 0) + d(h.psi(), 1))).abs() < 1e-7);
        assert!((f[(i, 1)] - (d(h.phi(), 1) - d(h.psi(), 0))).abs() < 1e-7);
    }
}

#[test]
fn the_parts_are_curl_free_and_divergence_free() {
    let h = HelmholtzNet::new(vec![20, 20], Activation::Tanh, 5).unwrap();
    let x = rand_uniform(8, 2, -1.5, 1.5, &mut rng(2));
    let e = 1e-5;
    let shift =
        |j: usize, s: f64| DMatrix::from_fn(8, 2, |i, c| x[(i, c)] + if c == j { s * e } else { 0.0 });
    let cf = |p: &DMatrix<f64>| h.curl_free_part(p).unwrap();
    let df = |p: &DMatrix<f64>| h.divergence_free_part(p).unwrap();
    let scale = h.forward(&x).unwrap().abs().max();
    for i in 0..8 {
        let curl = (cf(&shift(0, 1.0))[(i, 1)] - cf(&shift(0, -1.0))[(i, 1)] - cf(&shift(1, 1.0))[(i, 0)]
            + cf(&shift(1, -1.0))[(i, 0)])
            / (2.0 * e);
        let div = (df(&shift(0, 1.0))[(i, 0)] - df(&shift(0, -1.0))[(i, 0)] + df(&shift(1, 1.0))[(i, 1)]
            - df(&shift(1, -1.0))[(i, 1)])
            / (2.0 * e);
        assert!(
            curl.abs() < 1e-6 * scale.max(1.0) && div.abs() < 1e-6 * scale.max(1.0),
            "curl {curl}, div {div}"
        );
    }
}

#[test]
fn second_order_parameter_jacobian_matches_finite_differences() {
    for act in [Activation::Tanh, Activation::Softplus, Activation::Gelu] {
        let h = HelmholtzNet::new(vec![6, 5], act, 7).unwrap();
        let x = rand_uniform(3, 2, -1.0, 1.0, &mut rng(3));
        let jac = h.jacobian(&x).unwrap();
        let fd = fd_jacobian(
            |p| {
                let mut m = h.clone();
                m.set_params(&DVector::from_column_slice(p)).unwrap();
                let f = m.forward(&x).unwrap();
                (0..3).flat_map(|i| [f[(i, 0)], f[(i, 1)]]).collect()
            },
            h.params().as_slice(),
            1e-6,
        );
        assert_mat_close(&jac, &fd, 1e-6, 1e-9);
        // J·u and Jᵀ·V agree with the Jacobian (adjoint identity on a batch).
        let u = DVector::from_fn(h.n_params(), |k, _| ((k as f64) * 0.7).cos());
        let v = randn(3, 2, &mut rng(4));
        let lhs = h.jvp(&x, &u).unwrap().component_mul(&v).sum();
        let rhs = u.dot(&h.vjp(&x, &v).unwrap());
        assert!((lhs - rhs).abs() < 1e-10 * lhs.abs().max(1.0));
    }
}

#[test]
fn parameters_have_names_and_the_net_round_trips_through_serde() {
    let h = HelmholtzNet::new(vec![4, 3], Activation::Tanh, 0).unwrap();
    let blocks = h.param_blocks();
    assert_eq!(blocks.first().unwrap().0, "phi.layer0.weight");
    assert_eq!(blocks.last().unwrap().0, "psi.layer2.bias");
    assert_eq!(blocks.last().unwrap().1.end, h.n_params());
    let back: HelmholtzNet = serde_json::from_str(&serde_json::to_string(&h).unwrap()).unwrap();
    let x = rand_uniform(3, 2, -1.0, 1.0, &mut rng(1));
    assert!((back.forward(&x).unwrap() - h.forward(&x).unwrap()).amax() < 1e-14);
}

#[test]
fn bad_input_is_a_typed_error() {
    let mut h = HelmholtzNet::new(vec![4], Activation::Tanh, 0).unwrap();
    assert!(h.forward(&DMatrix::zeros(2, 3)).is_err());
    assert!(h.vjp(&DMatrix::zeros(2, 2), &DMatrix::zeros(3, 2)).is_err());
    assert!(h.set_params(&DVector::zeros(3)).is_err());
    assert!(h.jvp(&DMatrix::zeros(1, 2), &DVector::zeros(2)).is_err());
    let gelu = HelmholtzNet::new(vec![4], Activation::Gelu, 0).unwrap();
    assert!(
        gelu.forward(&DMatrix::zeros(1, 2)).is_ok()
            && gelu.vjp(&DMatrix::zeros(1, 2), &DMatrix::zeros(1, 2)).is_ok()
    );
}

#[test]
fn the_helmholtz_net_fits_ocean_currents_with_train_map() {
    // 20 noisy velocities on the Gulf box; inputs standardised (the field varies on ~1° scales);
    // vector targets through the isotropic Gaussian (targets point-major: u₁, v₁, u₂, …), the
    // noise scale learned jointly.
    let (train, _) = fspace_data::ocean_current(20, 0.02, &mut rng(5)).unwrap();
    let x = fspace_data::Standardizer::fit(&train.x).unwrap().transform(&train.x).unwrap();
    let y = DVector::from_row_slice(train.y.transpose().as_slice());
    let mut net = HelmholtzNet::new(vec![32, 32], Activation::Tanh, 1).unwrap();
    let sq_err = |net: &HelmholtzNet| (net.forward(&x).unwrap() - &train.y).norm_squared();
    let before = sq_err(&net);
    let mut lik = fspace_core::IsotropicGaussian::new(0.5, 2).unwrap();
    let cfg = TrainConfig {
        schedule: fspace_core::Schedule::epochs(1500),
        batch_size: 20,
        learning_rate: 5e-3,
        learn_likelihood: true,
        ..Default::default()
    };
    train_map(&mut net, &mut lik, &x, &y, None, None, &cfg, |_| {}).unwrap();
    let after = sq_err(&net);
    eprintln!(
        "Helmholtz net on ocean currents: squared error {before:.4} → {after:.5}, σ {:.4}",
        lik.sigma()
    );
    assert!(after < 0.02 * before, "{before} → {after}");
    // Targets must be n·d' long.
    let short = DVector::zeros(20);
    assert!(train_map(&mut net, &mut lik, &x, &short, None, None, &cfg, |_| {}).is_err());
}
