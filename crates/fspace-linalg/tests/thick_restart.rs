//! Thick-restart Lanczos against known spectra (Q diag Qᵀ), dense eigendecompositions and plain
//! Lanczos.

use fspace_input::InputError;
use fspace_linalg::*;
use fspace_testutil::{geometric_spectrum, rng, with_spectrum};
use nalgebra::{DMatrix, DVector};
use proptest::prelude::*;

fn op(a: &DMatrix<f64>) -> DenseOperator {
    DenseOperator::new(a.clone()).unwrap()
}

/// `‖A yᵢ − θᵢ yᵢ‖ / max|θ|` computed directly.
fn direct_residuals(a: &DMatrix<f64>, top: &TopEigenpairs) -> Vec<f64> {
    let scale = top.values.iter().fold(0.0f64, |m, t| m.max(t.abs()));
    (0..top.values.len())
        .map(|i| {
            let y = top.vectors.column(i);
            (a * y - y * top.values[i]).norm() / scale
        })
        .collect()
}

#[test]
fn a_small_basis_finds_the_top_eigenpairs_of_a_known_spectrum_with_restarts() {
    // A Gauss–Newton-like spectrum: six decades, geometric.
    let n = 300;
    let spectrum = geometric_spectrum(n, 1.0, 1e-6);
    let (a, eigvecs) = with_spectrum(&spectrum, &mut rng(7));
    let k = 10;
    let mut products = Vec::new();
    for max_basis in [12, 16, 25, 40, n] {
        let cfg = ThickRestartConfig { k, max_basis, tol: 1e-10, ..Default::default() };
        let top = thick_restart_lanczos(&op(&a), &cfg).unwrap();
        let info = &top.info;
        assert_eq!(info.stop, ThickRestartStop::Converged, "m={max_basis}: {info:?}");
        assert_eq!(top.vectors.shape(), (n, k));
        assert_eq!(info.basis_columns, max_basis);
        for i in 0..k {
            let err = (top.values[i] - spectrum[i]).abs() / spectrum[0];
            assert!(
                err < 1e-12,
                "m={max_basis}: θ{i} = {} vs λ{i} = {} ({err:.2e})",
                top.values[i],
                spectrum[i]
            );
            // The eigenvector, up to sign.
            let cos = top.vectors.column(i).dot(&eigvecs.column(i)).abs();
            assert!((1.0 - cos).abs() < 1e-10, "m={max_basis}: |cos| of eigenvector {i} = {cos}");
        }
        let orth = (top.vectors.tr_mul(&top.vectors) - DMatrix::identity(k, k)).norm();
        assert!(orth < 1e-12, "m={max_basis}: ‖VᵀV − I‖ = {orth:.2e}");
        // The reported residuals are the true ones (to rounding) and below the tolerance.
        for (i, direct) in direct_residuals(&a, &top).into_iter().enumerate() {
            assert!(top.residuals[i] <= 1e-10, "m={max_basis}: residual {i} = {:.2e}", top.residuals[i]);
            assert!(
                (top.residuals[i] - direct).abs() < 1e-13,
                "m={max_basis}: {i}: reported {:.3e}, direct {direct:.3e}",
                top.residuals[i]
            );
        }
        if max_basis < 25 {
            assert!(info.restarts > 0, "m={max_basis} must restart: {info:?}");
        }
        if max_basis == n {
            assert_eq!(info.restarts, 0);
        }
        products.push(info.products);
    }
    // The price of a small basis is more products, not a wrong answer.
    assert!(products[0] > products[products.len() - 1], "products by basis size: {products:?}");
}

#[test]
fn without_a_restart_it_is_plain_lanczos() {
    let n = 200;
    let spectrum = geometric_spectrum(n, 3.0, 1e-5);
    let (a, _) = with_spectrum(&spectrum, &mut rng(11));
    let k = 8;
    let cfg = ThickRestartConfig {
        k,
        max_basis: n,
        tol: 1e-9,
        start: StartVector::Random(5),
        ..Default::default()
    };
    let top = thick_restart_lanczos(&op(&a), &cfg).unwrap();
    assert_eq!(top.info.restarts, 0);
    // The same start (A·v₀) and the same number of steps in plain Lanczos.
    let steps = top.info.products - 1;
    let plain = lanczos(
        &op(&a),
        &LanczosConfig {
            max_rank: steps,
            start: StartVector::Random(5),
            stop_at_singular_pivot: false,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(plain.info().iterations, steps);
    for i in 0..k {
        let (ours, theirs) = (top.values[i], plain.ritz_values()[i]);
        assert!((ours - theirs).abs() <= 1e-13 * spectrum[0], "θ{i}: {ours} vs plain {theirs}");
    }
    let (_, v) = plain.into_top_ritz(k);
    for i in 0..k {
        let cos = top.vectors.column(i).dot(&v.column(i)).abs();
        assert!((1.0 - cos).abs() < 1e-10, "Ritz vector {i}: |cos| = {cos}");
    }
}

#[test]
fn a_rank_deficient_operator_stops_at_its_range() {
    // Rank 6, ten pairs wanted: the null space's pairs need not converge.
    let n = 60;
    let mut spectrum = geometric_spectrum(6, 2.0, 0.1);
    spectrum.resize(n, 0.0);
    let (a, _) = with_spectrum(&spectrum, &mut rng(3));
    let cfg = ThickRestartConfig { k: 10, max_basis: 14, ..Default::default() };
    let top = thick_restart_lanczos(&op(&a), &cfg).unwrap();
    assert!(
        matches!(top.info.stop, ThickRestartStop::InvariantSubspace | ThickRestartStop::Converged),
        "{:?}",
        top.info
    );
    for i in 0..6 {
        assert!((top.values[i] - spectrum[i]).abs() < 1e-12 * spectrum[0], "θ{i} = {}", top.values[i]);
    }
    for i in 6..top.values.len() {
        assert!(top.values[i].abs() < 1e-10 * spectrum[0], "null-space θ{i} = {}", top.values[i]);
    }
}

#[test]
fn bad_options_and_operators_are_typed_errors() {
    let (a, _) = with_spectrum(&geometric_spectrum(30, 1.0, 1e-3), &mut rng(1));
    let dense = op(&a);
    let invalid_what = |r: Result<TopEigenpairs>| match r {
        Err(LinalgError::Input(InputError::Invalid { what, .. })) => what,
        other => panic!("expected Invalid, got {:?}", other.map(|t| t.info)),
    };
    let run = |cfg: ThickRestartConfig| thick_restart_lanczos(&dense, &cfg);
    assert_eq!(
        invalid_what(run(ThickRestartConfig { k: 0, ..Default::default() })),
        "thick-restart Lanczos k"
    );
    assert_eq!(
        invalid_what(run(ThickRestartConfig { k: 5, max_basis: 6, ..Default::default() })),
        "thick-restart Lanczos max_basis"
    );
    assert_eq!(
        invalid_what(run(ThickRestartConfig { tol: f64::NAN, ..Default::default() })),
        "thick-restart Lanczos tol"
    );
    assert_eq!(
        invalid_what(run(ThickRestartConfig { zero_tol: -1.0, ..Default::default() })),
        "thick-restart Lanczos zero_tol"
    );
    // A basis as large as the dimension is fine whatever k is.
    let top = run(ThickRestartConfig { k: 30, max_basis: 30, ..Default::default() }).unwrap();
    assert!(
        matches!(top.info.stop, ThickRestartStop::FullDimension | ThickRestartStop::InvariantSubspace),
        "{:?}",
        top.info
    );
    // Too few products for the tolerance.
    match run(ThickRestartConfig { k: 5, max_basis: 8, max_products: 10, tol: 1e-14, ..Default::default() }) {
        Err(LinalgError::NoConvergence { iterations, residual, .. }) => {
            assert_eq!(iterations, 10);
            assert!(residual > 1e-14);
        }
        other => panic!("expected NoConvergence, got {:?}", other.map(|t| t.info)),
    }
    // A product that turns NaN.
    let nan = FnOperator::new(30, |v: &DVector<f64>| {
        let mut w = &a * v;
        w[3] = f64::NAN;
        w
    });
    assert!(matches!(
        thick_restart_lanczos(&nan, &ThickRestartConfig::default()),
        Err(LinalgError::Input(InputError::NonFinite { .. }))
    ));
    // The zero operator: A·v₀ = 0.
    let zero = FnOperator::new(30, |v: &DVector<f64>| DVector::zeros(v.len()));
    assert_eq!(
        invalid_what(thick_restart_lanczos(&zero, &ThickRestartConfig::default())),
        "thick-restart Lanczos start vector"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    /// Whatever the basis size, the top `k` Ritz values are the top `k` eigenvalues.
    #[test]
    fn the_top_values_do_not_depend_on_the_basis_size(
        n in 8usize..50, k in 1usize..5, room in 2usize..8, seed in 0u64..1000,
    ) {
        let mut r = rng(seed);
        let mut spectrum: Vec<f64> = (0..n).map(|_| rand::Rng::gen_range(&mut r, 0.0..1.0f64).powi(3)).collect();
        spectrum.sort_by(|x, y| y.total_cmp(x));
        // Thick restart converges at a rate set by the gap between the k-th and (k+1)-th
        // eigenvalues; uniform cubes can put them almost together (n = 40, k = 3, room = 2,
        // seed = 932 met the iteration cap at a residual of 4.7e-8), which says nothing about
        // the basis size. Keep λ_{k+1} ≤ 0.8 λ_k by scaling the unwanted tail down.
        let shrink = (0.8 * spectrum[k - 1] / spectrum[k]).min(1.0);
        spectrum[k..].iter_mut().for_each(|s| *s *= shrink);
        let (a, _) = with_spectrum(&spectrum, &mut r);
        let cfg = ThickRestartConfig { k, max_basis: k + room, tol: 1e-11, start: StartVector::Random(seed), ..Default::default() };
        let top = thick_restart_lanczos(&op(&a), &cfg).unwrap();
        prop_assert!(top.info.basis_columns <= k + room);
        for i in 0..top.values.len() {
            prop_assert!((top.values[i] - spectrum[i]).abs() <= 1e-9 * spectrum[0],
                "θ{} = {} vs λ = {} ({:?})", i, top.values[i], spectrum[i], top.info);
        }
    }
}
