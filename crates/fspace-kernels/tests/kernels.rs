//! Kernel invariants, checked against independent computations (dense eigendecompositions,
//! central finite differences, closed forms).

use fspace_input::InputError;
use fspace_kernels::*;
use fspace_linalg::LinearOperator;
use fspace_testutil::{assert_all_close, assert_mat_close, fd_gradient, rand_uniform, randn, rng, same_bits};
use nalgebra::{DMatrix, DVector};
use proptest::prelude::*;

/// Every library kernel (and composites) for inputs of dimension `d`, with hyperparameters
/// derived from `h` (five values in [0.3, 3]).
fn zoo(d: usize, h: &[f64]) -> Vec<(&'static str, Box<dyn Kernel>)> {
    let ard: Vec<f64> = (0..d).map(|i| h[(i + 1) % h.len()]).collect();
    vec![
        ("rbf", Rbf::new(h[0], h[1]).unwrap().boxed()),
        ("rbf_ard", Rbf::ard(h[0], ard.clone()).unwrap().boxed()),
        ("matern12", Matern12::new(h[0], h[2]).unwrap().boxed()),
        ("matern32", Matern32::ard(h[1], ard.clone()).unwrap().boxed()),
        ("matern52", Matern52::new(h[2], h[3]).unwrap().boxed()),
        ("rq", RationalQuadratic::ard(h[3], ard.clone(), h[4]).unwrap().boxed()),
        ("periodic", Periodic::ard(h[4], ard.clone(), h[0] + 0.5).unwrap().boxed()),
        ("linear", Linear::new(h[1]).unwrap().boxed()),
        ("constant", Constant::new(h[2]).unwrap().boxed()),
        ("white", White::new(h[3]).unwrap().boxed()),
        (
            "sum_product_scaled",
            Rbf::new(h[0], h[1]).unwrap().boxed() * Periodic::new(h[2], h[3], h[4]).unwrap().boxed()
                + Scaled::new(h[1], Matern52::new(h[4], h[0]).unwrap().boxed()).unwrap().boxed(),
        ),
    ]
}

fn mauna_loa() -> Box<dyn Kernel> {
    // Rasmussen & Williams (2006) §5.4.3, eq. (5.15)–(5.19), with their fitted values.
    Rbf::new(66.0_f64.powi(2), 67.0).unwrap().boxed()
        + Rbf::new(2.4_f64.powi(2), 90.0).unwrap().boxed() * Periodic::new(1.0, 1.3, 1.0).unwrap().boxed()
        + RationalQuadratic::new(0.66_f64.powi(2), 1.2, 0.78).unwrap().boxed()
        + Rbf::new(0.18_f64.powi(2), 1.6).unwrap().boxed()
        + White::new(0.19_f64.powi(2)).unwrap().boxed()
}

fn min_eig(a: &DMatrix<f64>) -> f64 {
    a.clone().symmetric_eigen().eigenvalues.iter().cloned().fold(f64::INFINITY, f64::min)
}

fn hyper() -> impl Strategy<Value = Vec<f64>> {
    prop::collection::vec(0.3f64..3.0, 5)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn gram_is_symmetric_and_psd(h in hyper(), d in 1usize..4, n in 2usize..14, seed in 0u64..1000) {
        let x = rand_uniform(n, d, -2.0, 2.0, &mut rng(seed));
        for (name, k) in zoo(d, &h) {
            let g = gram(&k, &x, &x).unwrap();
            prop_assert!((&g - g.transpose()).norm() <= 1e-12 * g.norm(), "{} not symmetric", name);
            let trace = g.trace();
            prop_assert!(min_eig(&g) >= -1e-10 * trace, "{}: min eig {} (trace {})", name, min_eig(&g), trace);
        }
    }

    #[test]
    fn stationary_kernels_have_their_variance_on_the_diagonal(h in hyper(), d in 1usize..4, seed in 0u64..1000) {
        let x = rand_uniform(1, d, -5.0, 5.0, &mut rng(seed));
        let p = x.row(0).iter().cloned().collect::<Vec<_>>();
        let cases: Vec<(Box<dyn Kernel>, f64)> = vec![
            (Rbf::new(h[0], h[1]).unwrap().boxed(), h[0]),
            (Matern12::new(h[1], h[2]).unwrap().boxed(), h[1]),
            (Matern32::new(h[2], h[3]).unwrap().boxed(), h[2]),
            (Matern52::new(h[3], h[4]).unwrap().boxed(), h[3]),
            (RationalQuadratic::new(h[4], h[0], h[1]).unwrap().boxed(), h[4]),
            (Periodic::new(h[0], h[2], h[3]).unwrap().boxed(), h[0]),
        ];
        for (k, var) in cases {
            prop_assert!(k.is_stationary());
            prop_assert!((k.eval(&p, &p) - var).abs() <= 1e-14 * var);
        }
    }

    #[test]
    fn periodic_kernel_is_invariant_under_shifts_by_the_period(
        h in hyper(), d in 1usize..4, shift_dim in 0usize..3, k_periods in -3i32..4, seed in 0u64..1000
    ) {
        let pts = rand_uniform(2, d, -3.0, 3.0, &mut rng(seed));
        let (x, y): (Vec<f64>, Vec<f64>) = (pts.row(0).iter().cloned().collect(), pts.row(1).iter().cloned().collect());
        let period = h[4] + 0.2;
        let k = Periodic::ard(h[0], (0..d).map(|i| h[i % 4 + 1]).collect(), period).unwrap();
        let mut xs = x.clone();
        xs[shift_dim % d] += k_periods as f64 * period;
        prop_assert!((k.eval(&xs, &y) - k.eval(&x, &y)).abs() <= 1e-10 * h[0]);
    }

    #[test]
    fn hyperparameter_gradients_match_finite_differences(h in hyper(), d in 1usize..4, seed in 0u64..1000) {
        let pts = rand_uniform(2, d, -2.0, 2.0, &mut rng(seed));
        let (x, y): (Vec<f64>, Vec<f64>) = (pts.row(0).iter().cloned().collect(), pts.row(1).iter().cloned().collect());
        let mut kernels = zoo(d, &h);
        kernels.push(("mauna_loa", mauna_loa()));
        for (name, k) in kernels {
            for (a, b) in [(&x, &y), (&x, &x)] {
                let theta = k.params();
                let mut analytic = vec![0.0; k.n_params()];
                k.eval_grad(a, b, &mut analytic);
                let numeric = fd_gradient(|t| {
                    let mut kk = k.clone();
                    kk.set_params(t).unwrap();
                    kk.eval(a, b)
                }, &theta, 1e-6);
                // Step 1e-6: a short period (0.3 over distances up to 4) makes the central
                // difference's O(step²) error reach 2e-6 relative at 1e-5, while the rounding
                // error at 1e-6 stays ≈ 1e-10, far inside the tolerance.
                let scale = k.eval(a, a).abs().max(k.eval(b, b).abs()).max(1e-3);
                for (i, (an, nu)) in analytic.iter().zip(&numeric).enumerate() {
                    prop_assert!((an - nu).abs() <= 1e-6 * nu.abs().max(scale),
                        "{} param {} ({}): analytic {} vs fd {}", name, i, k.param_names()[i], an, nu);
                }
            }
        }
    }

    #[test]
    fn input_gradients_match_finite_differences(h in hyper(), d in 1usize..4, seed in 0u64..1000) {
        // ∂k(x, y)/∂x against central differences in x, for every kernel off the diagonal;
        // on it, the derivative of k(x, x) along the diagonal, 2·∂k(x, x)/∂x.
        let pts = rand_uniform(2, d, -2.0, 2.0, &mut rng(seed));
        let (x, y): (Vec<f64>, Vec<f64>) = (pts.row(0).iter().cloned().collect(), pts.row(1).iter().cloned().collect());
        let mut kernels = zoo(d, &h);
        kernels.push(("mauna_loa", mauna_loa()));
        for (name, k) in kernels {
            let mut analytic = vec![f64::NAN; d];
            k.eval_grad_x(&x, &y, &mut analytic).unwrap();
            let numeric = fd_gradient(|p| k.eval(p, &y), &x, 1e-6);
            let scale = k.eval(&x, &x).abs().max(k.eval(&y, &y).abs()).max(1e-3);
            for i in 0..d {
                prop_assert!((analytic[i] - numeric[i]).abs() <= 1e-6 * scale,
                    "{} ∂/∂x[{}]: analytic {} vs fd {}", name, i, analytic[i], numeric[i]);
            }
            k.eval_grad_x(&x, &x, &mut analytic).unwrap();
            let along = fd_gradient(|p| k.eval(p, p), &x, 1e-6);
            for i in 0..d {
                prop_assert!((2.0 * analytic[i] - along[i]).abs() <= 1e-6 * scale,
                    "{} diagonal ∂/∂x[{}]: 2×{} vs fd {}", name, i, analytic[i], along[i]);
            }
        }
    }

    #[test]
    fn helmholtz_gram_is_psd(h in hyper(), n in 2usize..10, seed in 0u64..1000) {
        let x = rand_uniform(n, 2, -1.0, 1.0, &mut rng(seed));
        let hk = Helmholtz::new(
            Box::new(Rbf::new(h[0], h[1]).unwrap()),
            Box::new(Matern52::ard(h[2], vec![h[3], h[4]]).unwrap()),
        ).unwrap();
        let g = gram(&hk, &x, &x).unwrap();
        prop_assert!((&g - g.transpose()).norm() <= 1e-12 * g.norm());
        prop_assert!(min_eig(&g) >= -1e-10 * g.trace(), "min eig {}", min_eig(&g));
    }
}

/// `∂²k/∂xᵢ∂yⱼ` by central differences in both arguments.
fn fd_cross_hessian(k: &dyn Kernel, x: &[f64], y: &[f64], h: f64) -> Vec<f64> {
    let d = x.len();
    let mut out = vec![0.0; d * d];
    for i in 0..d {
        for j in 0..d {
            let eval = |si: f64, sj: f64| {
                let (mut xp, mut yp) = (x.to_vec(), y.to_vec());
                xp[i] += si * h;
                yp[j] += sj * h;
                k.eval(&xp, &yp)
            };
            out[i * d + j] =
                (eval(1.0, 1.0) - eval(1.0, -1.0) - eval(-1.0, 1.0) + eval(-1.0, -1.0)) / (4.0 * h * h);
        }
    }
    out
}

fn smooth_kernels() -> Vec<(&'static str, Box<dyn SecondOrderKernel>)> {
    vec![
        ("rbf", Box::new(Rbf::new(1.3, 0.7).unwrap())),
        ("rbf_ard", Box::new(Rbf::ard(0.8, vec![0.5, 1.4]).unwrap())),
        ("matern52", Box::new(Matern52::new(1.1, 0.9).unwrap())),
        ("matern52_ard", Box::new(Matern52::ard(0.6, vec![1.2, 0.4]).unwrap())),
        ("rq_ard", Box::new(RationalQuadratic::ard(0.9, vec![0.8, 1.5], 1.7).unwrap())),
    ]
}

#[test]
fn cross_hessians_match_finite_differences() {
    let mut r = rng(3);
    for (name, k) in smooth_kernels() {
        for _ in 0..10 {
            let p = rand_uniform(2, 2, -1.0, 1.0, &mut r);
            let (x, y) = ([p[(0, 0)], p[(0, 1)]], [p[(1, 0)], p[(1, 1)]]);
            let mut analytic = [0.0; 4];
            k.cross_hessian(&x, &y, &mut analytic);
            let numeric = fd_cross_hessian(k.as_ref(), &x, &y, 1e-4);
            let scale = analytic.iter().fold(0.0f64, |m, v| m.max(v.abs()));
            for i in 0..4 {
                assert!(
                    (analytic[i] - numeric[i]).abs() <= 1e-6 * scale.max(1e-3),
                    "{name}: {analytic:?} vs {numeric:?}"
                );
            }
        }
        // At coincident points H = −∂²κ(0) = (σ²/ℓ²)·c·I with a finite c for smooth kernels.
        let mut at_zero = [0.0; 4];
        k.cross_hessian(&[0.3, -0.2], &[0.3, -0.2], &mut at_zero);
        assert!(
            at_zero.iter().all(|v| v.is_finite()) && at_zero[0] > 0.0 && at_zero[1] == 0.0,
            "{name}: {at_zero:?}"
        );
    }
}

#[test]
fn cross_hessian_hyperparameter_gradients_match_finite_differences() {
    let mut r = rng(4);
    for (name, k) in smooth_kernels() {
        let np = k.n_params();
        for trial in 0..6 {
            let p = rand_uniform(2, 2, -1.0, 1.0, &mut r);
            let x = [p[(0, 0)], p[(0, 1)]];
            let y = if trial == 0 { x } else { [p[(1, 0)], p[(1, 1)]] };
            let mut analytic = vec![0.0; 4 * np];
            k.cross_hessian_grad(&x, &y, &mut analytic);
            let theta = k.params();
            for e in 0..4 {
                let numeric = fd_gradient(
                    |t| {
                        let mut kk = k.clone();
                        kk.set_params(t).unwrap();
                        let mut hb = [0.0; 4];
                        kk.cross_hessian(&x, &y, &mut hb);
                        hb[e]
                    },
                    &theta,
                    1e-5,
                );
                for j in 0..np {
                    let a = analytic[j * 4 + e];
                    assert!(
                        (a - numeric[j]).abs() <= 1e-6 * numeric[j].abs().max(1e-2),
                        "{name} entry {e} param {j}: {a} vs {}",
                        numeric[j]
                    );
                }
            }
        }
    }
}

#[test]
fn helmholtz_blocks_are_curl_free_plus_divergence_free_second_derivatives() {
    let phi = Rbf::new(1.2, 0.6).unwrap();
    let psi = Matern52::new(0.7, 0.9).unwrap();
    let hk = Helmholtz::new(Box::new(phi.clone()), Box::new(psi.clone())).unwrap();
    let mut r = rng(5);
    for _ in 0..20 {
        let p = rand_uniform(2, 2, -1.0, 1.0, &mut r);
        let (x, y) = ([p[(0, 0)], p[(0, 1)]], [p[(1, 0)], p[(1, 1)]]);
        let hp = fd_cross_hessian(&phi, &x, &y, 1e-4);
        let hs = fd_cross_hessian(&psi, &x, &y, 1e-4);
        // rot Ψ = (∂₂Ψ, −∂₁Ψ): Cov = [[H₁₁, −H₁₀], [−H₀₁, H₀₀]] of Ψ.
        let expected = [hp[0] + hs[3], hp[1] - hs[2], hp[2] - hs[1], hp[3] + hs[0]];
        let mut block = [0.0; 4];
        hk.eval_block(&x, &y, &mut block);
        assert_all_close(&block, &expected, 1e-6, 1e-7);
    }
}

#[test]
fn helmholtz_hyperparameter_gradients_match_finite_differences() {
    let hk = Helmholtz::new(
        Box::new(Rbf::ard(1.2, vec![0.6, 0.8]).unwrap()),
        Box::new(RationalQuadratic::new(0.7, 0.9, 2.0).unwrap()),
    )
    .unwrap();
    let (x, y) = ([0.2, -0.4], [-0.3, 0.5]);
    let np = hk.n_params();
    let mut analytic = vec![0.0; 4 * np];
    hk.eval_block_grad(&x, &y, &mut analytic);
    for e in 0..4 {
        let numeric = fd_gradient(
            |t| {
                let mut kk = hk.clone();
                kk.set_params(t).unwrap();
                let mut b = [0.0; 4];
                kk.eval_block(&x, &y, &mut b);
                b[e]
            },
            &hk.params(),
            1e-5,
        );
        for j in 0..np {
            assert!((analytic[j * 4 + e] - numeric[j]).abs() <= 1e-6 * numeric[j].abs().max(1e-3));
        }
    }
}

/// `K(X, X)` of a kernel that says it is symmetric bit for bit fills one triangle and mirrors
/// it: every kernel of the zoo must give the bits of the full evaluation (`X` against a copy of
/// itself), across row blocks and in 1 and 3 dimensions.
#[test]
fn mirrored_gram_matrices_have_the_bits_of_the_full_evaluation() {
    let mut r = rng(11);
    for d in [1, 3] {
        let x = rand_uniform(150, d, -2.0, 2.0, &mut r);
        let copy = x.clone();
        // The zoo's combination holds a periodic factor (not declared exactly symmetric);
        // this one is all stationary, so it takes the mirrored path.
        let stationary_combination = Rbf::new(0.7, 1.3).unwrap().boxed()
            * Scaled::new(0.4, Matern52::new(2.1, 0.9).unwrap().boxed()).unwrap().boxed()
            + RationalQuadratic::new(0.5, 0.8, 1.7).unwrap().boxed();
        let mut kernels = zoo(d, &[0.7, 1.3, 0.4, 2.1, 0.9]);
        kernels.push(("stationary_combination", stationary_combination));
        for (name, k) in kernels {
            let (mirrored, full) = (gram(&k, &x, &x).unwrap(), gram(&k, &x, &copy).unwrap());
            assert!(
                same_bits(&mirrored, &full),
                "{name}, d = {d} (exactly_symmetric: {})",
                k.exactly_symmetric()
            );
        }
    }
    assert!(Rbf::new(1.0, 1.0).unwrap().exactly_symmetric());
    assert!(
        (Rbf::new(1.0, 1.0).unwrap().boxed() * Matern12::new(1.0, 1.0).unwrap().boxed()).exactly_symmetric()
    );
    assert!(!Periodic::new(1.0, 1.0, 1.0).unwrap().exactly_symmetric());
}

#[test]
fn gram_operator_equals_dense_gram_times_vectors() {
    let mut r = rng(6);
    // 700 points cross both tile boundaries (64-point row blocks, 512-point column blocks).
    let x = rand_uniform(700, 3, -1.0, 1.0, &mut r);
    let k = Matern32::ard(1.5, vec![0.4, 0.9, 1.3]).unwrap();
    let dense = gram(&k, &x, &x).unwrap();
    let op = GramOperator::new(k, &x).unwrap().with_shift(0.1).unwrap();
    let shifted = &dense + DMatrix::identity(700, 700) * 0.1;
    let v = randn(700, 3, &mut r);
    assert_mat_close(&op.apply_block(&v).unwrap(), &(&shifted * &v), 1e-12, 0.0);
    let v1 = DVector::from_column_slice(v.column(0).as_slice());
    assert_mat_close(
        &DMatrix::from_column_slice(700, 1, op.apply(&v1).unwrap().as_slice()),
        &DMatrix::from_column_slice(700, 1, (&shifted * &v1).as_slice()),
        1e-12,
        0.0,
    );
    assert_all_close(op.diagonal().as_slice(), shifted.diagonal().as_slice(), 1e-14, 0.0);
    assert_all_close(op.column(123).as_slice(), shifted.column(123).clone_owned().as_slice(), 1e-14, 0.0);

    // Matrix-valued: Helmholtz, point-major ordering.
    let x2 = rand_uniform(90, 2, -1.0, 1.0, &mut r);
    let hk =
        Helmholtz::new(Box::new(Rbf::new(1.0, 0.5).unwrap()), Box::new(Rbf::new(0.5, 0.7).unwrap())).unwrap();
    let dense = gram(&hk, &x2, &x2).unwrap();
    let mut block = [0.0; 4];
    hk.eval_block(&[x2[(3, 0)], x2[(3, 1)]], &[x2[(7, 0)], x2[(7, 1)]], &mut block);
    assert!((dense[(2 * 3 + 1, 2 * 7)] - block[2]).abs() <= 1e-14 * block[2].abs());
    let op = GramOperator::new(hk, &x2).unwrap();
    let v = randn(180, 2, &mut r);
    assert_mat_close(&op.apply_block(&v).unwrap(), &(&dense * &v), 1e-12, 0.0);
}

#[test]
fn the_tile_cache_gives_the_matrix_free_products_bits() {
    let mut r = rng(16);
    // 700 points cross both tile boundaries; a sum kernel fills its tile in two passes.
    let x = rand_uniform(700, 3, -1.0, 1.0, &mut r);
    let sum = Matern52::ard(1.5, vec![0.4, 0.9, 1.3]).unwrap().boxed() + Rbf::new(0.3, 0.2).unwrap().boxed();
    let plain = GramOperator::new(&sum, &x).unwrap().with_shift(0.1).unwrap();
    let cached = plain.clone().with_tile_cache(700 * 700 * 8);
    assert!(cached.is_tile_cached() && !plain.is_tile_cached());
    for cols in [1, 3] {
        let v = randn(700, cols, &mut r);
        assert!(
            same_bits(&cached.apply_block(&v).unwrap(), &plain.apply_block(&v).unwrap()),
            "{cols} columns"
        );
    }
    // One byte short of the tiles: stays matrix-free.
    assert!(!plain.clone().with_tile_cache(700 * 700 * 8 - 1).is_tile_cached());
    // Matrix-valued (Helmholtz, point-major rows).
    let x2 = rand_uniform(90, 2, -1.0, 1.0, &mut r);
    let hk =
        Helmholtz::new(Box::new(Rbf::new(1.0, 0.5).unwrap()), Box::new(Rbf::new(0.5, 0.7).unwrap())).unwrap();
    let plain = GramOperator::new(hk, &x2).unwrap();
    let cached = plain.clone().with_tile_cache(usize::MAX);
    let v = randn(180, 2, &mut r);
    assert!(
        cached.is_tile_cached()
            && same_bits(&cached.apply_block(&v).unwrap(), &plain.apply_block(&v).unwrap())
    );
}

#[test]
fn gram_gradients_equal_finite_differences_of_the_gram_matrix() {
    let mut r = rng(7);
    let x = rand_uniform(6, 2, -1.0, 1.0, &mut r);
    let y = rand_uniform(4, 2, -1.0, 1.0, &mut r);
    let k = mauna_like_2d();
    let grads = gram_grad(&k, &x, &y).unwrap();
    let theta = k.params();
    for (j, g) in grads.iter().enumerate() {
        let step = 1e-5;
        let mut kp = k.clone();
        let mut tp = theta.clone();
        tp[j] += step;
        kp.set_params(&tp).unwrap();
        let mut km = k.clone();
        tp[j] -= 2.0 * step;
        km.set_params(&tp).unwrap();
        let fd = (gram(&kp, &x, &y).unwrap() - gram(&km, &x, &y).unwrap()) / (2.0 * step);
        assert_mat_close(g, &fd, 1e-6, 1e-10);
    }
}

fn mauna_like_2d() -> Box<dyn Kernel> {
    Rbf::ard(1.0, vec![0.5, 2.0]).unwrap().boxed() * Periodic::new(0.5, 1.0, 0.7).unwrap().boxed()
        + RationalQuadratic::new(0.3, 0.4, 1.5).unwrap().boxed()
}

#[test]
fn mauna_loa_kernel_is_one_expression_with_named_log_parameters() {
    let k = mauna_loa();
    // 13 = R&W's 11 plus the period and the periodic factor's own variance (both fixed there).
    assert_eq!(k.n_params(), 13);
    let names = k.param_names();
    assert_eq!(names[0], "term0.term0.term0.term0.variance");
    assert!(names.iter().any(|n| n.ends_with("factor1.period")));
    assert!(names.last().unwrap().ends_with("variance"));
    // Log-space parameters: variance of the first term is 66².
    assert!((k.params()[0] - (66.0f64 * 66.0).ln()).abs() < 1e-12);
}

#[test]
fn specs_round_trip_through_json() {
    let k = mauna_loa();
    let json = serde_json::to_string_pretty(&k.spec().unwrap()).unwrap();
    let rebuilt = serde_json::from_str::<KernelSpec>(&json).unwrap().build().unwrap();
    let x = DMatrix::from_fn(12, 1, |i, _| 1960.0 + i as f64 * 0.7);
    assert_mat_close(&gram(&rebuilt, &x, &x).unwrap(), &gram(&k, &x, &x).unwrap(), 1e-15, 0.0);
    assert_eq!(rebuilt.param_names(), k.param_names());

    let hk =
        Helmholtz::new(Box::new(Rbf::new(1.0, 0.5).unwrap()), Box::new(Matern52::new(0.5, 0.7).unwrap()))
            .unwrap();
    let spec = hk.matrix_spec().unwrap();
    let back: MatrixKernelSpec = serde_json::from_str(&serde_json::to_string(&spec).unwrap()).unwrap();
    assert_eq!(back, spec);
    let rebuilt = back.build().unwrap();
    let x2 = DMatrix::from_row_slice(3, 2, &[0.0, 0.1, 0.5, -0.2, 1.0, 1.0]);
    assert_mat_close(&gram(&rebuilt, &x2, &x2).unwrap(), &gram(&hk, &x2, &x2).unwrap(), 1e-15, 0.0);
    // Scalar and independent-output specs round-trip too (a `type` tag on both levels once
    // made the scalar one unreadable).
    for spec in [
        Rbf::new(1.0, 0.5).unwrap().matrix_spec().unwrap(),
        Independent::new(Rbf::new(1.0, 0.5).unwrap(), 3).unwrap().matrix_spec().unwrap(),
    ] {
        let text = serde_json::to_string(&spec).unwrap();
        assert_eq!(serde_json::from_str::<MatrixKernelSpec>(&text).unwrap(), spec, "{text}");
    }
    // A Helmholtz spec with a rough kernel is rejected with a clear error, not a NaN.
    let rough = MatrixKernelSpec::Helmholtz {
        phi: KernelSpec::Matern12 { variance: 1.0, lengthscales: vec![1.0] },
        psi: KernelSpec::Rbf { variance: 1.0, lengthscales: vec![1.0] },
    };
    assert!(matches!(rough.build(), Err(KernelError::Unsupported(_))));
}

#[test]
fn independent_outputs_give_block_diagonal_structure() {
    let k = Independent::new(Rbf::new(2.0, 0.5).unwrap(), 3).unwrap();
    let x = DMatrix::from_row_slice(2, 1, &[0.0, 0.3]);
    let g = gram(&k, &x, &x).unwrap();
    let k01 = Rbf::new(2.0, 0.5).unwrap().eval(&[0.0], &[0.3]);
    assert_eq!(g.shape(), (6, 6));
    assert!((g[(0, 3)] - k01).abs() < 1e-15 && g[(0, 4)] == 0.0 && (g[(2, 5)] - k01).abs() < 1e-15);
    assert_eq!(gram_diag(&k, &x).unwrap().as_slice(), &[2.0; 6]);
    // The shared scalar kernel: K = K₀ ⊗ I₃ in point-major order.
    let k0 = gram(k.shared_output_kernel().expect("independent outputs"), &x, &x).unwrap();
    assert_eq!(k0.shape(), (2, 2));
    assert_eq!(g, k0.kronecker(&DMatrix::<f64>::identity(3, 3)));
    assert!(Rbf::new(1.0, 1.0).unwrap().shared_output_kernel().is_none());
    let helm =
        Helmholtz::new(Box::new(Rbf::new(1.0, 1.0).unwrap()), Box::new(Rbf::new(1.0, 1.0).unwrap())).unwrap();
    assert!(helm.shared_output_kernel().is_none());
}

#[test]
fn prior_means_evaluate_point_major() {
    let x = DMatrix::from_row_slice(2, 2, &[1.0, 2.0, 3.0, 4.0]);
    assert_eq!(PriorMean::Zero.evaluate(&x, 2).unwrap().as_slice(), &[0.0; 4]);
    assert_eq!(PriorMean::Constant(1.5).evaluate(&x, 1).unwrap().as_slice(), &[1.5, 1.5]);
    let f = PriorMean::Function(std::sync::Arc::new(|p: &[f64], out: &mut [f64]| {
        out[0] = p[0] + p[1];
        out[1] = p[0] * p[1];
    }));
    assert_eq!(f.evaluate(&x, 2).unwrap().as_slice(), &[3.0, 2.0, 7.0, 12.0]);
    let bad = PriorMean::Function(std::sync::Arc::new(|_: &[f64], out: &mut [f64]| out[0] = f64::NAN));
    assert!(matches!(bad.evaluate(&x, 1), Err(KernelError::Input(InputError::NonFinite { .. }))));
}

#[test]
fn bad_input_is_a_typed_error() {
    assert!(matches!(Rbf::new(1.0, 0.0), Err(KernelError::InvalidHyperparameter { .. })));
    assert!(matches!(Rbf::new(-1.0, 1.0), Err(KernelError::InvalidHyperparameter { .. })));
    assert!(matches!(Matern52::new(f64::NAN, 1.0), Err(KernelError::InvalidHyperparameter { .. })));
    assert!(matches!(Periodic::new(1.0, 1.0, 0.0), Err(KernelError::InvalidHyperparameter { .. })));
    assert!(matches!(RationalQuadratic::new(1.0, 1.0, -2.0), Err(KernelError::InvalidHyperparameter { .. })));
    assert!(matches!(Rbf::ard(1.0, vec![]), Err(KernelError::Input(InputError::DimensionMismatch { .. }))));
    let k = Rbf::ard(1.0, vec![1.0, 2.0]).unwrap();
    let x3 = DMatrix::from_element(4, 3, 0.5);
    assert!(matches!(gram(&k, &x3, &x3), Err(KernelError::Input(InputError::DimensionMismatch { .. }))));
    let mut xn = DMatrix::from_element(4, 2, 0.5);
    xn[(2, 1)] = f64::NAN;
    assert!(matches!(gram(&k, &xn, &xn), Err(KernelError::Input(InputError::NonFinite { .. }))));
    let empty = DMatrix::<f64>::zeros(0, 2);
    assert!(matches!(gram(&k, &empty, &empty), Err(KernelError::Input(InputError::Empty { .. }))));
    assert!(matches!(GramOperator::new(&k, &empty), Err(KernelError::Input(InputError::Empty { .. }))));
    let x2 = DMatrix::from_element(4, 2, 0.5);
    assert!(matches!(
        gram(&k, &x2, &DMatrix::from_element(4, 1, 0.5)),
        Err(KernelError::Input(InputError::DimensionMismatch { .. }))
    ));
    // Conflicting ARD dimensions inside a composite are reported, not indexed out of bounds.
    let conflict =
        Rbf::ard(1.0, vec![1.0, 2.0]).unwrap().boxed() + Rbf::ard(1.0, vec![1.0; 3]).unwrap().boxed();
    assert!(matches!(
        gram(&conflict, &x2, &x2),
        Err(KernelError::Input(InputError::DimensionMismatch { .. }))
    ));
    // set_params: wrong length, and values whose exponential overflows; the kernel is unchanged.
    let mut k2 = mauna_loa();
    let before = k2.params();
    assert!(matches!(
        k2.set_params(&[0.0; 3]),
        Err(KernelError::Input(InputError::DimensionMismatch { .. }))
    ));
    let mut huge = before.clone();
    huge[7] = 1e4;
    assert!(matches!(k2.set_params(&huge), Err(KernelError::InvalidHyperparameter { .. })));
    assert_eq!(k2.params(), before);
    assert!(GramOperator::new(&k, &x2).unwrap().with_shift(-1.0).is_err());
    assert!(Helmholtz::new(
        Box::new(Rbf::ard(1.0, vec![1.0; 3]).unwrap()),
        Box::new(Rbf::new(1.0, 1.0).unwrap())
    )
    .is_err());
    assert!(Independent::new(Rbf::new(1.0, 1.0).unwrap(), 0).is_err());
    // Operator products with a wrong-sized vector are errors.
    let op = GramOperator::new(&k, &x2).unwrap();
    assert!(op.apply(&DVector::zeros(5)).is_err());
}

#[test]
fn matern_kernels_are_ordered_by_smoothness_near_zero() {
    // Closed forms at r = 1 (ℓ = 1, σ² = 1).
    let (x, y) = ([0.0], [1.0]);
    assert!((Matern12::new(1.0, 1.0).unwrap().eval(&x, &y) - (-1.0f64).exp()).abs() < 1e-15);
    let s3 = 3.0f64.sqrt();
    assert!((Matern32::new(1.0, 1.0).unwrap().eval(&x, &y) - (1.0 + s3) * (-s3).exp()).abs() < 1e-15);
    let s5 = 5.0f64.sqrt();
    assert!(
        (Matern52::new(1.0, 1.0).unwrap().eval(&x, &y) - (1.0 + s5 + 5.0 / 3.0) * (-s5).exp()).abs() < 1e-15
    );
    assert!((Rbf::new(1.0, 1.0).unwrap().eval(&x, &y) - (-0.5f64).exp()).abs() < 1e-15);
    assert!((RationalQuadratic::new(1.0, 1.0, 2.0).unwrap().eval(&x, &y) - 1.25f64.powf(-2.0)).abs() < 1e-15);
}
