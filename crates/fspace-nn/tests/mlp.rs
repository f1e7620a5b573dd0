//! MLP operators against an independent forward pass, central finite differences and each
//! other (JVP and VJP are separate code paths; VJP is dfdx's reverse mode).

use fspace_input::InputError;
use fspace_nn::*;
use fspace_testutil::{assert_mat_close, fd_jacobian, rand_uniform, randn, randn_vec, rng};
use nalgebra::{DMatrix, DVector};
use proptest::prelude::*;

const ACTIVATIONS: [Activation; 5] =
    [Activation::Tanh, Activation::Relu, Activation::Sigmoid, Activation::Softplus, Activation::Gelu];

fn net(activation: Activation, d: usize, q: usize, seed: u64) -> Mlp {
    Mlp::new(MlpConfig { input_dim: d, hidden: vec![7, 5], output_dim: q, activation, seed }).unwrap()
}

/// Independent nalgebra forward pass from the documented parameter layout.
fn reference_forward(net: &Mlp, x: &DMatrix<f64>) -> DMatrix<f64> {
    let p = net.params();
    let c = net.config();
    let mut widths = vec![c.input_dim];
    widths.extend(&c.hidden);
    widths.push(c.output_dim);
    let mut a = x.clone();
    let mut off = 0;
    for l in 0..widths.len() - 1 {
        let (fi, fo) = (widths[l], widths[l + 1]);
        let w = DMatrix::from_row_slice(fo, fi, &p.as_slice()[off..off + fi * fo]);
        let b = DVector::from_column_slice(&p.as_slice()[off + fi * fo..off + fi * fo + fo]);
        off += fi * fo + fo;
        let mut z = &a * w.transpose();
        for mut row in z.row_iter_mut() {
            row += b.transpose();
        }
        a = if l + 2 == widths.len() {
            z
        } else {
            z.map(|v| match c.activation {
                Activation::Tanh => v.tanh(),
                Activation::Relu => v.max(0.0),
                Activation::Sigmoid => 1.0 / (1.0 + (-v).exp()),
                Activation::Softplus => (1.0 + v.exp()).ln(),
                Activation::Gelu => {
                    0.5 * v * (1.0 + (0.7978845608028654 * (v + 0.044715 * v.powi(3))).tanh())
                }
            })
        };
    }
    a
}

fn flat_rows(m: &DMatrix<f64>) -> Vec<f64> {
    (0..m.nrows()).flat_map(|i| m.row(i).iter().cloned().collect::<Vec<_>>()).collect()
}

#[test]
fn forward_and_jacobian_match_independent_computations() {
    for act in ACTIVATIONS {
        let mlp = net(act, 3, 2, 1);
        let x = rand_uniform(6, 3, -1.5, 1.5, &mut rng(2));
        assert_mat_close(&mlp.forward(&x).unwrap(), &reference_forward(&mlp, &x), 1e-13, 1e-14);
        let jac = mlp.jacobian(&x).unwrap();
        let fd = fd_jacobian(
            |p| {
                let mut m = mlp.clone();
                m.set_params(&DVector::from_column_slice(p)).unwrap();
                flat_rows(&m.forward(&x).unwrap())
            },
            mlp.params().as_slice(),
            1e-6,
        );
        assert_mat_close(&jac, &fd, 1e-6, 1e-9);
        // J·u and Jᵀ·V against the Jacobian.
        let u = randn_vec(mlp.n_params(), &mut rng(3));
        let ju = jac.clone() * &u;
        let jvp = mlp.jvp(&x, &u).unwrap();
        assert_mat_close(
            &DMatrix::from_column_slice(12, 1, &flat_rows(&jvp)),
            &DMatrix::from_column_slice(12, 1, ju.as_slice()),
            1e-12,
            1e-12,
        );
        let v = randn(6, 2, &mut rng(4));
        let jtv = jac.transpose() * DVector::from_vec(flat_rows(&v));
        let vjp = mlp.vjp(&x, &v).unwrap();
        assert!((vjp - &jtv).norm() <= 1e-12 * jtv.norm().max(1.0), "{act:?}: vjp vs Jᵀv");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn adjoint_identity_holds(act_idx in 0usize..5, n in 1usize..8, seed in 0u64..1000) {
        let mlp = net(ACTIVATIONS[act_idx], 2, 3, seed);
        let x = rand_uniform(n, 2, -2.0, 2.0, &mut rng(seed + 1));
        let u = randn_vec(mlp.n_params(), &mut rng(seed + 2));
        let v = randn(n, 3, &mut rng(seed + 3));
        let lhs = mlp.jvp(&x, &u).unwrap().component_mul(&v).sum();
        let rhs = u.dot(&mlp.vjp(&x, &v).unwrap());
        prop_assert!((lhs - rhs).abs() <= 1e-10 * lhs.abs().max(1.0), "{} vs {}", lhs, rhs);
    }
}

#[test]
fn ntk_and_ggn_products_equal_dense_jacobian_products() {
    let mlp = net(Activation::Tanh, 2, 2, 5);
    let x = rand_uniform(5, 2, -1.0, 1.0, &mut rng(6));
    let z = rand_uniform(3, 2, -1.0, 1.0, &mut rng(7));
    let (jx, jz) = (mlp.jacobian(&x).unwrap(), mlp.jacobian(&z).unwrap());
    assert_mat_close(&mlp.ntk(&x, &z).unwrap(), &(&jx * jz.transpose()), 1e-12, 1e-13);
    // Streaming Jacobian rows: the chunks tile J(X) exactly, the last one short.
    let mut tiled = DMatrix::zeros(jx.nrows(), jx.ncols());
    let q = jx.nrows() / x.nrows();
    let mut calls = 0;
    mlp.jacobian_rows(&x, 2, |start, block| {
        tiled.rows_mut(start * q, block.nrows()).copy_from(&block);
        calls += 1;
        Ok(())
    })
    .unwrap();
    assert_mat_close(&tiled, &jx, 0.0, 0.0);
    assert_eq!(calls, x.nrows().div_ceil(2));
    assert!(mlp.jacobian_rows(&x, 0, |_, _| Ok(())).is_err());
    // Softmax-like PSD Hessian blocks per point.
    let hessians: Vec<DMatrix<f64>> = (0..5)
        .map(|i| {
            let p = 0.2 + 0.1 * i as f64;
            DMatrix::from_row_slice(2, 2, &[p * (1.0 - p), -p * (1.0 - p), -p * (1.0 - p), p * (1.0 - p)])
        })
        .collect();
    let mut h = DMatrix::zeros(10, 10);
    for (i, hi) in hessians.iter().enumerate() {
        h.view_mut((2 * i, 2 * i), (2, 2)).copy_from(hi);
    }
    let ggn = jx.transpose() * h * &jx;
    let v = randn_vec(mlp.n_params(), &mut rng(8));
    let got = mlp.ggn_vector(&x, &hessians, &v).unwrap();
    assert!((got - &ggn * &v).norm() <= 1e-12 * (&ggn * &v).norm());
}

#[test]
fn parameters_are_seeded_flat_and_serialisable() {
    let a = net(Activation::Tanh, 1, 1, 9);
    let b = net(Activation::Tanh, 1, 1, 9);
    assert_eq!(a.params(), b.params());
    assert_ne!(a.params(), net(Activation::Tanh, 1, 1, 10).params());
    assert_eq!(a.n_params(), (1 + 1) * 7 + (7 + 1) * 5 + (5 + 1));
    let blocks = a.param_blocks();
    assert_eq!(blocks.len(), 6);
    assert_eq!(blocks.last().unwrap().1.end, a.n_params());
    let json = serde_json::to_string(&a).unwrap();
    let back: Mlp = serde_json::from_str(&json).unwrap();
    let x = DMatrix::from_row_slice(2, 1, &[0.3, -0.7]);
    assert_eq!(back.forward(&x).unwrap(), a.forward(&x).unwrap());
}

#[test]
fn bad_input_is_a_typed_error() {
    let mut mlp = net(Activation::Relu, 2, 1, 0);
    assert!(matches!(
        mlp.forward(&DMatrix::zeros(3, 3)),
        Err(NnError::Input(InputError::DimensionMismatch { .. }))
    ));
    assert!(matches!(mlp.forward(&DMatrix::zeros(0, 2)), Err(NnError::Input(InputError::Empty { .. }))));
    assert!(matches!(
        mlp.forward(&DMatrix::from_element(1, 2, f64::NAN)),
        Err(NnError::Input(InputError::NonFinite { .. }))
    ));
    assert!(matches!(
        mlp.set_params(&DVector::zeros(3)),
        Err(NnError::Input(InputError::DimensionMismatch { .. }))
    ));
    let x = DMatrix::zeros(2, 2);
    assert!(matches!(
        mlp.jvp(&x, &DVector::zeros(5)),
        Err(NnError::Input(InputError::DimensionMismatch { .. }))
    ));
    assert!(matches!(
        mlp.vjp(&x, &DMatrix::zeros(3, 1)),
        Err(NnError::Input(InputError::DimensionMismatch { .. }))
    ));
    assert!(mlp.ggn_vector(&x, &[DMatrix::identity(1, 1)], &mlp.params()).is_err());
    assert!(Mlp::new(MlpConfig {
        input_dim: 1,
        hidden: vec![0],
        output_dim: 1,
        activation: Activation::Tanh,
        seed: 0
    })
    .is_err());
}

#[test]
fn ggn_diagonal_kfac_and_last_layer_features() {
    let mlp = net(Activation::Tanh, 2, 2, 11);
    let x = rand_uniform(4, 2, -1.0, 1.0, &mut rng(12));
    let factors: Vec<DMatrix<f64>> =
        (0..4).map(|i| DMatrix::from_row_slice(2, 2, &[1.0, 0.0, 0.3 * i as f64, 0.5])).collect();
    let hessians: Vec<DMatrix<f64>> = factors.iter().map(|l| l * l.transpose()).collect();
    let jac = mlp.jacobian(&x).unwrap();
    let mut ggn = DMatrix::zeros(mlp.n_params(), mlp.n_params());
    for (i, h) in hessians.iter().enumerate() {
        let ji = jac.rows(2 * i, 2);
        ggn += ji.transpose() * h * ji;
    }
    let diag = mlp.ggn_diagonal(&x, &hessians).unwrap();
    assert!((diag - ggn.diagonal()).norm() <= 1e-12 * ggn.diagonal().norm());

    // KFAC is exact for a single point: the GGN block of [W | b] equals G ⊗ A.
    let x1 = x.rows(0, 1).into_owned();
    let j1 = mlp.jacobian(&x1).unwrap();
    let ggn1 = j1.transpose() * &hessians[0] * &j1;
    let kfac = mlp.kfac_factors(&x1, &factors[..1]).unwrap();
    let blocks = mlp.param_blocks();
    for (l, (a, g)) in kfac.iter().enumerate() {
        let (wr, br) = (blocks[2 * l].1.clone(), blocks[2 * l + 1].1.clone());
        let (fan_out, fan_in1) = (g.nrows(), a.nrows());
        // Index of entry (r, c) of [W | b] in the flat parameter vector.
        let idx = |r: usize, c: usize| {
            if c + 1 < fan_in1 {
                wr.start + r * (fan_in1 - 1) + c
            } else {
                br.start + r
            }
        };
        for r1 in 0..fan_out {
            for c1 in 0..fan_in1 {
                for r2 in 0..fan_out {
                    for c2 in 0..fan_in1 {
                        let expected = ggn1[(idx(r1, c1), idx(r2, c2))];
                        let got = g[(r1, r2)] * a[(c1, c2)];
                        assert!((got - expected).abs() <= 1e-12 * (1.0 + expected.abs()), "layer {l}");
                    }
                }
            }
        }
    }
    // Last-layer features are the inputs of the final linear layer: f = φ Wᵀ + b.
    let phi = mlp.last_layer_features(&x).unwrap();
    let p = mlp.params();
    let last_w = &blocks[blocks.len() - 2].1;
    let last_b = &blocks[blocks.len() - 1].1;
    let w = DMatrix::from_row_slice(2, phi.ncols(), &p.as_slice()[last_w.clone()]);
    let mut f = &phi * w.transpose();
    for mut row in f.row_iter_mut() {
        row += DVector::from_column_slice(&p.as_slice()[last_b.clone()]).transpose();
    }
    assert_mat_close(&f, &mlp.forward(&x).unwrap(), 1e-13, 1e-14);
    assert!(mlp.kfac_factors(&x, &factors[..2]).is_err());
}

#[test]
fn gradients_through_j_s_jt_match_finite_differences() {
    for act in
        [Activation::Tanh, Activation::Sigmoid, Activation::Softplus, Activation::Relu, Activation::Gelu]
    {
        let mlp = net(act, 2, 2, 21);
        let x = rand_uniform(3, 2, -1.0, 1.0, &mut rng(22));
        let p = mlp.n_params();
        let s = DVector::from_fn(p, |k, _| 0.5 + 0.01 * (k % 7) as f64);
        let g = randn(6, 6, &mut rng(23));
        let c = &g + g.transpose();
        let phi = |m: &Mlp, s: &DVector<f64>| {
            let j = m.jacobian(&x).unwrap();
            let mut js = j.clone();
            for (k, mut col) in js.column_iter_mut().enumerate() {
                col *= s[k];
            }
            c.component_mul(&(js * j.transpose())).sum()
        };
        let (gw, gs) = mlp.jsj_pullback(&x, &s, &c).unwrap();
        let fd_w = fspace_testutil::fd_gradient(
            |w| {
                let mut m = mlp.clone();
                m.set_params(&DVector::from_column_slice(w)).unwrap();
                phi(&m, &s)
            },
            mlp.params().as_slice(),
            1e-6,
        );
        let fd_s =
            fspace_testutil::fd_gradient(|sv| phi(&mlp, &DVector::from_column_slice(sv)), s.as_slice(), 1e-6);
        let scale = fd_w.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        for k in 0..p {
            assert!(
                (gw[k] - fd_w[k]).abs() <= 1e-6 * scale.max(1.0),
                "{act:?} w[{k}]: {} vs {}",
                gw[k],
                fd_w[k]
            );
            assert!((gs[k] - fd_s[k]).abs() <= 1e-6 * fd_s[k].abs().max(1.0), "{act:?} s[{k}]");
        }
    }
}

#[test]
fn ntk_gradient_with_respect_to_inducing_inputs_matches_finite_differences() {
    for act in [Activation::Tanh, Activation::Sigmoid, Activation::Softplus, Activation::Gelu] {
        let mlp = net(act, 2, 2, 31);
        let x = rand_uniform(4, 2, -1.0, 1.0, &mut rng(32));
        let z = rand_uniform(3, 2, -1.0, 1.0, &mut rng(33));
        let c = randn(8, 6, &mut rng(34));
        let analytic = mlp.ntk_pullback_z(&x, &z, &c).unwrap();
        let fd = fspace_testutil::fd_gradient(
            |zv| c.component_mul(&mlp.ntk(&x, &DMatrix::from_row_slice(3, 2, zv)).unwrap()).sum(),
            &flat_rows(&z),
            1e-6,
        );
        let scale = fd.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        for (k, f) in fd.iter().enumerate() {
            assert!(
                (analytic[(k / 2, k % 2)] - f).abs() <= 1e-6 * scale.max(1.0),
                "{act:?} z[{k}]: {} vs {f}",
                analytic[(k / 2, k % 2)]
            );
        }
    }
    let mlp = net(Activation::Tanh, 2, 2, 0);
    assert!(mlp.ntk_pullback_z(&DMatrix::zeros(2, 2), &DMatrix::zeros(3, 2), &DMatrix::zeros(4, 5)).is_err());
}

#[test]
fn ntk_blocks_with_selected_outputs_match_the_jacobian() {
    for act in ACTIVATIONS {
        let mlp = net(act, 3, 4, 41);
        let x = rand_uniform(5, 3, -1.0, 1.0, &mut rng(42));
        let z = rand_uniform(3, 3, -1.0, 1.0, &mut rng(43));
        let (jx, jz) = (mlp.jacobian(&x).unwrap(), mlp.jacobian(&z).unwrap());
        let classes = [2usize, 0, 3];
        let jz_one = DMatrix::from_fn(3, jz.ncols(), |r, c| jz[(r * 4 + classes[r], c)]);
        let got = mlp.ntk_block(&x, Outputs::All, &z, Outputs::One(&classes)).unwrap();
        assert_mat_close(&got, &(&jx * jz_one.transpose()), 1e-12, 1e-13);
        // κ(X, X) from one side (the same matrix on both) equals it from two copies, to the bit.
        let same = mlp.ntk_block(&x, Outputs::All, &x, Outputs::All).unwrap();
        assert_eq!(same, mlp.ntk_block(&x, Outputs::All, &x.clone(), Outputs::All).unwrap());
        assert_mat_close(&same, &(&jx * jx.transpose()), 1e-12, 1e-13);
        // The trait default (via Jacobians) agrees with the layer-wise rule.
        let default = {
            struct Plain<'a>(&'a Mlp);
            impl Network for Plain<'_> {
                fn input_dim(&self) -> usize {
                    self.0.input_dim()
                }
                fn output_dim(&self) -> usize {
                    self.0.output_dim()
                }
                fn n_params(&self) -> usize {
                    self.0.n_params()
                }
                fn params(&self) -> DVector<f64> {
                    self.0.params()
                }
                fn set_params(&mut self, _: &DVector<f64>) -> Result<()> {
                    unreachable!()
                }
                fn forward(&self, x: &DMatrix<f64>) -> Result<DMatrix<f64>> {
                    self.0.forward(x)
                }
                fn vjp(&self, x: &DMatrix<f64>, v: &DMatrix<f64>) -> Result<DVector<f64>> {
                    self.0.vjp(x, v)
                }
                fn jvp(&self, x: &DMatrix<f64>, u: &DVector<f64>) -> Result<DMatrix<f64>> {
                    self.0.jvp(x, u)
                }
            }
            let plain = Plain(&mlp);
            let diag = plain.ntk_diagonal(&x).unwrap();
            for (i, block) in mlp.ntk_diagonal(&x).unwrap().iter().enumerate() {
                assert_mat_close(block, &diag[i], 1e-12, 1e-13);
                let rows = jx.rows(i * 4, 4);
                assert_mat_close(block, &(rows * rows.transpose()), 1e-12, 1e-13);
            }
            assert!(plain
                .ntk_block_pullback_z(&x, Outputs::All, &z, Outputs::All, &DMatrix::zeros(20, 12))
                .is_err());
            plain.ntk_block(&x, Outputs::All, &z, Outputs::One(&classes)).unwrap()
        };
        assert_mat_close(&got, &default, 1e-12, 1e-13);
    }
    let mlp = net(Activation::Tanh, 3, 4, 0);
    let x = DMatrix::zeros(2, 3);
    assert!(matches!(
        mlp.ntk_block(&x, Outputs::One(&[0]), &x, Outputs::All),
        Err(NnError::Input(InputError::DimensionMismatch { .. }))
    ));
    assert!(matches!(
        mlp.ntk_block(&x, Outputs::One(&[0, 4]), &x, Outputs::All),
        Err(NnError::Input(InputError::DimensionMismatch { .. }))
    ));
}

#[test]
fn explicit_ntk_input_gradient_matches_finite_differences_and_the_taped_rule() {
    for act in ACTIVATIONS {
        let mlp = net(act, 2, 3, 51);
        let x = rand_uniform(4, 2, -1.0, 1.0, &mut rng(52));
        let z = rand_uniform(3, 2, -1.0, 1.0, &mut rng(53));
        let classes = [1usize, 2, 0];
        for (zo, cols) in [(Outputs::All, 9), (Outputs::One(&classes), 3)] {
            let c = randn(12, cols, &mut rng(54));
            let analytic = mlp.ntk_block_pullback_z(&x, Outputs::All, &z, zo, &c).unwrap();
            let fd = fspace_testutil::fd_gradient(
                |zv| {
                    let zz = DMatrix::from_row_slice(3, 2, zv);
                    c.component_mul(&mlp.ntk_block(&x, Outputs::All, &zz, zo).unwrap()).sum()
                },
                &flat_rows(&z),
                1e-6,
            );
            let scale = fd.iter().fold(0.0f64, |m, v| m.max(v.abs())).max(1.0);
            for (k, f) in fd.iter().enumerate() {
                // ReLU's kinks make finite differences exact only away from them; the points
                // are random, so a kink inside ±1e-6 has probability ~1e-6.
                assert!((analytic[(k / 2, k % 2)] - f).abs() <= 1e-6 * scale, "{act:?} z[{k}]");
            }
            // The pair rule: ⟨C, κ(X, Z)⟩ + ⟨C₂, κ(Z, Z)⟩ in one pass equals the separate pullbacks.
            let c2 = randn(cols, cols, &mut rng(55));
            let pair = mlp.ntk_pair_pullback_z(&x, Outputs::All, &z, zo, &c, &c2).unwrap();
            let separate = &analytic
                + mlp.ntk_block_pullback_z(&z, zo, &z, zo, &c2).unwrap()
                + mlp.ntk_block_pullback_z(&z, zo, &z, zo, &c2.transpose()).unwrap();
            assert_mat_close(&pair, &separate, 1e-11, 1e-12);
            let (kxz, kzz) = mlp.ntk_pair(&x, Outputs::All, &z, zo).unwrap();
            assert_mat_close(&kxz, &mlp.ntk_block(&x, Outputs::All, &z, zo).unwrap(), 1e-14, 0.0);
            assert_mat_close(&kzz, &mlp.ntk_block(&z, zo, &z, zo).unwrap(), 1e-14, 0.0);
            // Through the trait: the cached pair's pull-back can be applied repeatedly.
            let cached = fspace_nn::Network::ntk_pair_with_pullback(&mlp, &x, Outputs::All, &z, zo).unwrap();
            assert_mat_close(&cached.kxz, &kxz, 1e-14, 0.0);
            for _ in 0..2 {
                assert_mat_close(&cached.pullback_z(&c, &c2).unwrap(), &pair, 1e-14, 0.0);
            }
            if zo == Outputs::All && act != Activation::Relu {
                assert_mat_close(&analytic, &mlp.ntk_pullback_z(&x, &z, &c).unwrap(), 1e-9, 1e-10);
            }
        }
    }
    let mlp = net(Activation::Tanh, 2, 3, 0);
    let z = DMatrix::zeros(3, 2);
    let bad = DMatrix::from_element(6, 9, f64::NAN);
    assert!(matches!(
        mlp.ntk_block_pullback_z(&DMatrix::zeros(2, 2), Outputs::All, &z, Outputs::All, &bad),
        Err(NnError::Input(InputError::NonFinite { .. }))
    ));
    assert!(mlp
        .ntk_block_pullback_z(&DMatrix::zeros(2, 2), Outputs::All, &z, Outputs::All, &DMatrix::zeros(6, 8))
        .is_err());
}

#[test]
fn weighted_gram_and_its_pullback_match_the_taped_rule_and_finite_differences() {
    for act in
        [Activation::Tanh, Activation::Sigmoid, Activation::Softplus, Activation::Relu, Activation::Gelu]
    {
        let mlp = net(act, 2, 2, 41);
        let x = rand_uniform(4, 2, -1.0, 1.0, &mut rng(42));
        let p = mlp.n_params();
        let s = DVector::from_fn(p, |k, _| 0.3 + 0.02 * (k % 11) as f64);
        let g = randn(8, 8, &mut rng(43));
        let c = &g + g.transpose();
        let wg = mlp.weighted_gram(&x, Outputs::All, &s).unwrap();
        // Value against the dense Jacobian.
        let j = mlp.jacobian(&x).unwrap();
        let mut js = j.clone();
        for (k, mut col) in js.column_iter_mut().enumerate() {
            col *= s[k];
        }
        let dense = &js * j.transpose();
        assert_mat_close(&wg.gram(), &dense, 1e-12, 1e-13);
        let diag = wg.diagonal();
        for r in 0..8 {
            assert!((diag[r] - dense[(r, r)]).abs() <= 1e-12 * dense[(r, r)].abs().max(1.0));
        }
        // Full cotangent: the explicit rule equals dfdx's taped rule (itself checked by FD above).
        let (gw, gs) = wg.pullback(GramCotangent::Dense(&c)).unwrap();
        let (tw, ts) = mlp.jsj_pullback(&x, &s, &c).unwrap();
        let scale = tw.amax().max(1.0);
        assert!((&gw - &tw).amax() <= 1e-10 * scale, "{act:?}: {}", (&gw - &tw).amax());
        assert!((&gs - &ts).amax() <= 1e-10 * ts.amax().max(1.0));
        // Diagonal cotangent against central finite differences of Σ_r c_r (J S Jᵀ)_rr.
        let cd = randn_vec(8, &mut rng(44));
        let (dw, ds) = wg.pullback(GramCotangent::Diagonal(&cd)).unwrap();
        let phi = |m: &Mlp, s: &DVector<f64>| -> f64 {
            let d = m.weighted_gram(&x, Outputs::All, s).unwrap().diagonal();
            d.dot(&cd)
        };
        let fd_w = fspace_testutil::fd_gradient(
            |w| {
                let mut m = mlp.clone();
                m.set_params(&DVector::from_column_slice(w)).unwrap();
                phi(&m, &s)
            },
            mlp.params().as_slice(),
            1e-6,
        );
        let fd_s =
            fspace_testutil::fd_gradient(|sv| phi(&mlp, &DVector::from_column_slice(sv)), s.as_slice(), 1e-6);
        let scale = fd_w.iter().fold(1.0f64, |m, v| m.max(v.abs()));
        for k in 0..p {
            assert!((dw[k] - fd_w[k]).abs() <= 2e-6 * scale, "{act:?} diag w[{k}]: {} vs {}", dw[k], fd_w[k]);
            assert!((ds[k] - fd_s[k]).abs() <= 1e-6 * fd_s[k].abs().max(1.0), "{act:?} diag s[{k}]");
        }
    }
}

#[test]
fn weighted_gram_with_one_output_per_point_and_tangent_pullback_match_finite_differences() {
    let mlp = net(Activation::Tanh, 2, 3, 51);
    let x = rand_uniform(5, 2, -1.0, 1.0, &mut rng(52));
    let picks = [0usize, 2, 1, 1, 0];
    let p = mlp.n_params();
    let s = DVector::from_fn(p, |k, _| 0.1 + 0.05 * (k % 5) as f64);
    let wg = mlp.weighted_gram(&x, Outputs::One(&picks), &s).unwrap();
    let j = mlp.jacobian(&x).unwrap();
    let jsel = DMatrix::from_fn(5, p, |r, k| j[(r * 3 + picks[r], k)]);
    let mut js = jsel.clone();
    for (k, mut col) in js.column_iter_mut().enumerate() {
        col *= s[k];
    }
    assert_mat_close(&wg.gram(), &(&js * jsel.transpose()), 1e-12, 1e-13);
    // ∂/∂w ⟨c, J(w) u⟩ at fixed u (TFSVI's pushed-forward prior mean uses u = w).
    let u = randn_vec(p, &mut rng(53));
    let c = randn_vec(5, &mut rng(54));
    let umat = &u * c.transpose();
    let g = wg.tangent_pullback(&umat).unwrap();
    let fd = fspace_testutil::fd_gradient(
        |w| {
            let mut m = mlp.clone();
            m.set_params(&DVector::from_column_slice(w)).unwrap();
            let ju = m.jvp(&x, &u).unwrap();
            (0..5).map(|r| c[r] * ju[(r, picks[r])]).sum()
        },
        mlp.params().as_slice(),
        1e-6,
    );
    let scale = fd.iter().fold(1.0f64, |m, v| m.max(v.abs()));
    for k in 0..p {
        assert!((g[k] - fd[k]).abs() <= 2e-6 * scale, "w[{k}]: {} vs {}", g[k], fd[k]);
    }
    // Bad input: wrong length or negative variances, wrong cotangent shapes.
    assert!(mlp.weighted_gram(&x, Outputs::All, &DVector::zeros(p - 1)).is_err());
    assert!(mlp.weighted_gram(&x, Outputs::All, &DVector::from_element(p, -1.0)).is_err());
    assert!(wg.pullback(GramCotangent::Dense(&DMatrix::zeros(4, 4))).is_err());
    assert!(wg.pullback(GramCotangent::Diagonal(&DVector::from_element(5, f64::NAN))).is_err());
}

/// The GEMM rules (`forward`, `jvp`, `vjp`, `forward_vjp`) on a batch and widths large enough
/// for the packed, row-split kernel, against dfdx's tensor passes and the independent forward.
#[test]
fn batched_gemm_passes_match_the_dfdx_reference_on_wide_batches() {
    for act in ACTIVATIONS {
        let mlp = Mlp::new(MlpConfig {
            input_dim: 12,
            hidden: vec![40, 30],
            output_dim: 7,
            activation: act,
            seed: 5,
        })
        .unwrap();
        let x = rand_uniform(300, 12, -2.0, 2.0, &mut rng(6));
        let f = mlp.forward(&x).unwrap();
        assert_mat_close(&f, &reference_forward(&mlp, &x), 1e-12, 1e-13);
        let u = randn_vec(mlp.n_params(), &mut rng(7));
        assert_mat_close(&mlp.jvp(&x, &u).unwrap(), &mlp.jvp_taped(&x, &u).unwrap(), 1e-11, 1e-12);
        let v = randn(300, 7, &mut rng(8));
        let (g, g_ref) = (mlp.vjp(&x, &v).unwrap(), mlp.vjp_taped(&x, &v).unwrap());
        assert!((&g - &g_ref).norm() <= 1e-11 * g_ref.norm(), "{act:?}: GEMM vjp vs dfdx");
        let (f2, g2) = mlp.forward_vjp(&x, &mut |out: &DMatrix<f64>| Ok(out * 0.0 + &v)).unwrap();
        assert_eq!((f2, g2), (f.clone(), g.clone()), "{act:?}: fused pass");
        // Through the trait (training's entry point) and a bad cotangent.
        let r = Network::forward_vjp(&mlp, &x, &mut |_: &DMatrix<f64>| Ok(DMatrix::zeros(3, 7)));
        assert!(matches!(r, Err(NnError::Input(InputError::DimensionMismatch { .. }))));
    }
}

#[test]
fn per_point_vjp_rows_are_the_whitened_jacobian_rows_and_bad_blocks_are_refused() {
    let net = net(Activation::Tanh, 3, 2, 7);
    let mut r = rng(8);
    let x = randn(4, 3, &mut r);
    let blocks: Vec<DMatrix<f64>> = (0..4).map(|_| randn(2, 3, &mut r)).collect();
    let rows = net.per_point_vjp(&x, &blocks).unwrap();
    assert_eq!(rows.shape(), (net.n_params(), 4 * 3));
    // Independent: column i·k + c = (Lᵢ[:, c]ᵀ J(xᵢ))ᵀ from the dense Jacobian.
    let jac = net.jacobian(&x).unwrap();
    for (i, l) in blocks.iter().enumerate() {
        let want = jac.rows(i * 2, 2).transpose() * l;
        assert_mat_close(&rows.columns(i * 3, 3).into_owned(), &want, 1e-12, 1e-14);
    }
    // One block per point, each d' × k with one k, finite.
    assert!(net.per_point_vjp(&x, &blocks[..3]).is_err());
    let mut ragged = blocks.clone();
    ragged[2] = randn(2, 2, &mut r);
    assert!(net.per_point_vjp(&x, &ragged).is_err());
    let mut nan = blocks.clone();
    nan[1][(0, 0)] = f64::NAN;
    assert!(matches!(net.per_point_vjp(&x, &nan), Err(NnError::Input(InputError::NonFinite { .. }))));
}
