//! fspace-linalg against dense references on matrices with a known spectrum (Q diag Qᵀ).

use fspace_input::InputError;
use fspace_linalg::*;
use fspace_testutil::{
    assert_all_close, assert_mat_close, geometric_spectrum, psd_pinv, randn, randn_vec, rel_frob, rng,
    same_bits, spd, with_spectrum,
};
use nalgebra::{DMatrix, DVector};
use proptest::prelude::*;

fn full_rank_lanczos(a: &DMatrix<f64>, seed: u64) -> LanczosDecomposition {
    let cfg = LanczosConfig { max_rank: a.nrows(), start: StartVector::Random(seed), ..Default::default() };
    lanczos(&DenseOperator::new(a.clone()).unwrap(), &cfg).unwrap()
}

fn orthogonality_error(q: &DMatrix<f64>) -> f64 {
    (q.tr_mul(q) - DMatrix::identity(q.ncols(), q.ncols())).norm()
}

#[test]
fn lanczos_ldlt_gives_the_pseudo_inverse_on_known_spectra() {
    for n in [2usize, 31, 127, 300] {
        // Full rank, condition number 10³.
        let full = geometric_spectrum(n, 1.0, 1e-3);
        // Rank-deficient: half the spectrum exactly zero (rank ≥ 1).
        let rank = n.div_ceil(2);
        let mut deficient = geometric_spectrum(rank, 2.0, 2e-3);
        deficient.resize(n, 0.0);
        for (label, spectrum) in [("full", full), ("deficient", deficient)] {
            let (a, _) = with_spectrum(&spectrum, &mut rng(n as u64));
            let op = DenseOperator::new(a.clone()).unwrap();
            let cfg = LanczosConfig { max_rank: n, start: StartVector::Random(1), ..Default::default() };
            let (f, info) = pinv_factor(&op, &cfg).unwrap();
            let err = rel_frob(&(&f * f.transpose()), &psd_pinv(&a, 1e-9));
            assert!(err < 1e-8, "n={n} {label}: ‖FFᵀ − A†‖/‖A†‖ = {err:.3e} ({info:?})");
            let expected_rank = if label == "full" { n } else { rank };
            assert_eq!(info.rank, expected_rank, "n={n} {label}: {info:?}");
            if label == "full" {
                assert_eq!(info.method, PinvMethod::Ldlt, "n={n}: a regular T uses the embedded LDLᵀ");
            } else {
                // Unprojected random start: the null-space component makes T singular at the
                // invariant subspace, and the eigen fallback must still give A†.
                let raw = LanczosConfig { project_start: false, pivot_tol: 0.0, ..cfg.clone() };
                let (f, info) = pinv_factor(&op, &raw).unwrap();
                let err = rel_frob(&(&f * f.transpose()), &psd_pinv(&a, 1e-9));
                assert!(err < 1e-8, "n={n} unprojected: {err:.3e} ({info:?})");
                assert_eq!((info.method, info.rank), (PinvMethod::Eigen, rank), "n={n}: {info:?}");
            }
            let dec = lanczos(&op, &cfg).unwrap();
            assert!(orthogonality_error(dec.basis()) < 1e-10, "n={n} {label}: QᵀQ − I");
            let t = dec.tridiagonal();
            assert_mat_close(&dec.ldlt().reconstruct(), &t, 1e-10, 0.0);
            assert_mat_close(&(dec.basis().transpose() * &a * dec.basis()), &t, 1e-10, 1e-12);
        }
    }
}

#[test]
fn restarts_recover_the_pseudo_inverse_when_eigenvalues_repeat() {
    // B ⊗ I₃ (an independent-output kernel's Gram) has every eigenvalue at least three times,
    // and B here has only four distinct eigenvalues (a symmetric grid's Gram has many repeats):
    // one Krylov space holds one direction per distinct eigenvalue, so plain Lanczos stops at
    // an invariant subspace after 4 steps; deflated restarts find the rest. Full rank and
    // rank-deficient bases.
    for (n, zeros) in [(20usize, 0usize), (24, 8)] {
        let mut spectrum: Vec<f64> = (0..n - zeros).map(|i| [1.0, 0.5, 0.1, 0.02][i % 4]).collect();
        spectrum.resize(n, 0.0);
        let (base, _) = with_spectrum(&spectrum, &mut rng(n as u64));
        let a = base.kronecker(&DMatrix::<f64>::identity(3, 3));
        let op = DenseOperator::new(a.clone()).unwrap();
        let cfg = LanczosConfig { max_rank: 500, start: StartVector::Random(2), ..Default::default() };
        let (_, single) = pinv_factor(&op, &cfg).unwrap();
        let (f, info) = pinv_factor_restarted(&op, &cfg, 50, 7).unwrap();
        let err = rel_frob(&(&f * f.transpose()), &psd_pinv(&a, 1e-9));
        let true_rank = 3 * (n - zeros);
        eprintln!(
            "n = {n}: single run rank {}, restarted rank {} in {} runs (true {true_rank}), error {err:.2e}",
            single.rank,
            info.rank,
            info.runs.len()
        );
        assert_eq!(single.lanczos.stop, StopReason::InvariantSubspace);
        assert!(single.rank <= 4, "a single Krylov space sees one direction per distinct eigenvalue");
        assert_eq!(info.rank, true_rank);
        assert!(err < 1e-8, "‖FFᵀ − A†‖/‖A†‖ = {err:.2e}");
        // Within the rank budget: max_rank caps the total.
        let capped = LanczosConfig { max_rank: 10, ..cfg.clone() };
        let (f, info) = pinv_factor_restarted(&op, &capped, 50, 7).unwrap();
        assert!(f.ncols() <= 10 && info.rank == f.ncols());
    }
}

#[test]
fn ritz_values_recover_the_top_of_the_spectrum() {
    let spectrum: Vec<f64> = (0..127).map(|i| 0.7f64.powi(i)).collect();
    let (a, _) = with_spectrum(&spectrum, &mut rng(2));
    let cfg = LanczosConfig { max_rank: 40, pivot_tol: 0.0, ..Default::default() };
    let dec = lanczos(&DenseOperator::new(a.clone()).unwrap(), &cfg).unwrap();
    assert_eq!(dec.info().stop, StopReason::MaxRank);
    let (values, vectors) = dec.ritz();
    assert_all_close(&values.as_slice()[..10], &spectrum[..10], 1e-10, 0.0);
    // Ritz pairs satisfy A v ≈ θ v for the converged ones.
    for k in 0..10 {
        let v = vectors.column(k);
        assert!((&a * v - v * values[k]).norm() < 1e-8);
    }
}

#[test]
fn top_ritz_pairs_formed_in_the_basis_storage_equal_the_leading_ritz_pairs() {
    // 9 000 rows: two full blocks of 4 096 and a partial one.
    let d = DVector::from_fn(9_000, |i, _| 0.9f64.powi(i as i32 % 200) + 1e-3 * (i % 7) as f64);
    let op = DiagonalOperator::new(d).unwrap();
    let cfg = LanczosConfig { max_rank: 30, pivot_tol: 0.0, ..Default::default() };
    let (values, vectors) = lanczos(&op, &cfg).unwrap().ritz();
    let (top_values, top_vectors) = lanczos(&op, &cfg).unwrap().into_top_ritz(7);
    assert_eq!(top_vectors.shape(), (9_000, 7));
    assert_eq!(top_values.as_slice(), &values.as_slice()[..7]);
    let diff = (&top_vectors - vectors.columns(0, 7)).amax();
    assert!(diff <= 1e-14, "largest difference {diff:.2e}");
    // Asking for more pairs than there are gives all of them.
    let (all_values, all_vectors) = lanczos(&op, &cfg).unwrap().into_top_ritz(100);
    assert_eq!((all_values.len(), all_vectors.ncols()), (values.len(), vectors.ncols()));
}

#[test]
fn an_extended_decomposition_equals_one_run_to_the_larger_rank() {
    let spectrum: Vec<f64> = (0..150).map(|i| 0.8f64.powi(i)).collect();
    let (a, _) = with_spectrum(&spectrum, &mut rng(12));
    let op = DenseOperator::new(a).unwrap();
    let at = |m| LanczosConfig { max_rank: m, pivot_tol: 0.0, ..Default::default() };
    let once = lanczos(&op, &at(60)).unwrap();
    // 25 → 40 → 60 in two extensions.
    let short = lanczos(&op, &at(25)).unwrap();
    assert_eq!((short.info().iterations, short.info().stop), (25, StopReason::MaxRank));
    let grown = short.extend(&op, &at(40)).unwrap().extend(&op, &at(60)).unwrap();
    assert_eq!(grown.info().iterations, 60);
    assert_eq!(grown.info().stop, once.info().stop);
    assert_all_close(grown.alpha(), once.alpha(), 1e-14, 1e-14);
    assert_all_close(grown.beta(), once.beta(), 1e-14, 1e-14);
    assert_all_close(grown.ritz_values().as_slice(), once.ritz_values().as_slice(), 1e-14, 1e-14);
    assert_all_close(grown.ritz_residuals().as_slice(), once.ritz_residuals().as_slice(), 1e-14, 1e-12);
    assert!((grown.basis() - once.basis()).amax() < 1e-12);
    assert!(orthogonality_error(grown.basis()) < 1e-12);
    // The residuals of the top pairs fall as the space grows.
    assert!(grown.ritz_residuals()[5] < lanczos(&op, &at(25)).unwrap().ritz_residuals()[5]);
    // Nothing to extend: a rank not above k, and an iteration that ended in an invariant subspace.
    let same = lanczos(&op, &at(25)).unwrap().extend(&op, &at(20)).unwrap();
    assert_eq!(same.info().iterations, 25);
    let two = DiagonalOperator::new(DVector::from_fn(40, |i, _| if i % 2 == 0 { 1.0 } else { 3.0 })).unwrap();
    let ended = lanczos(&two, &at(10)).unwrap().extend(&two, &at(30)).unwrap();
    assert_eq!((ended.info().iterations, ended.info().stop), (2, StopReason::InvariantSubspace));
    // Another operator's dimension is refused by name.
    let other = DiagonalOperator::identity_scaled(7, 1.0).unwrap();
    let err = lanczos(&op, &at(10)).unwrap().extend(&other, &at(20)).unwrap_err();
    assert!(err.to_string().contains("extending a Lanczos decomposition"), "{err}");
}

#[test]
fn a_singular_pivot_stop_reports_the_true_residual_and_can_be_turned_off() {
    // Ten eigenvalues in [0.5, 1] above 190 at 1e-11: once the top ten are spanned, the next
    // vector lies in the bottom cluster and its pivot (≈ 1e-11) is below pivot_tol.
    let spectrum: Vec<f64> = (0..200).map(|i| if i < 10 { 1.0 - 0.05 * i as f64 } else { 1e-11 }).collect();
    let (a, _) = with_spectrum(&spectrum, &mut rng(21));
    let op = DenseOperator::new(a.clone()).unwrap();
    let cfg = LanczosConfig { max_rank: 40, pivot_tol: 1e-10, ..Default::default() };
    let stopped = lanczos(&op, &cfg).unwrap();
    assert_eq!(stopped.info().stop, StopReason::SingularPivot);
    assert!(stopped.info().residual > 0.0, "the Krylov residual is reported at a singular pivot");
    // The reported residuals are ‖A y − θ y‖ / ‖T‖, checked directly.
    let (theta, y) = stopped.ritz();
    let t_norm = stopped
        .alpha()
        .iter()
        .zip(stopped.beta().iter().chain([&0.0]))
        .fold(0.0f64, |m, (a, b)| m.max(a.abs() + b));
    let reported = stopped.ritz_residuals();
    for j in 0..10 {
        let direct = (&a * y.column(j) - y.column(j) * theta[j]).norm() / t_norm;
        assert!(
            (direct - reported[j]).abs() <= 1e-3 * direct + 1e-14,
            "pair {j}: direct {direct:.3e}, reported {:.3e}",
            reported[j]
        );
    }
    // Without the pivot stop the range's exhaustion still ends it, where β vanishes (here at the
    // same step); the top ten Ritz values agree.
    let on = lanczos(&op, &LanczosConfig { stop_at_singular_pivot: false, ..cfg.clone() }).unwrap();
    assert_eq!(on.info().stop, StopReason::InvariantSubspace);
    assert_eq!(on.info().iterations, stopped.info().iterations);
    assert_all_close(&on.ritz_values().as_slice()[..10], &spectrum[..10], 1e-12, 0.0);
}

#[test]
fn breakdown_is_an_outcome_not_a_crash() {
    let op = DiagonalOperator::identity_scaled(50, 2.0).unwrap();
    let dec = lanczos(&op, &LanczosConfig::default()).unwrap();
    assert_eq!((dec.info().iterations, dec.info().stop), (1, StopReason::InvariantSubspace));
    assert!((dec.alpha()[0] - 2.0).abs() < 1e-14);
    // Exactly two distinct eigenvalues: invariant subspace after two steps.
    let d = DVector::from_fn(40, |i, _| if i % 2 == 0 { 1.0 } else { 3.0 });
    let dec = lanczos(&DiagonalOperator::new(d).unwrap(), &LanczosConfig::default()).unwrap();
    assert_eq!((dec.info().iterations, dec.info().stop), (2, StopReason::InvariantSubspace));
}

#[test]
fn a_psd_operators_rounding_below_zero_passes_only_within_negative_tol() {
    // A PSD operator as a float32 network computes it: its null direction at −1e-9·λ_max.
    let op = DenseOperator::new(with_spectrum(&[1.0, 0.5, 0.2, -1e-9], &mut rng(4)).0).unwrap();
    let strict = LanczosConfig { max_rank: 4, project_start: false, pivot_tol: 1e-13, ..Default::default() };
    let err = lanczos(&op, &strict).unwrap_err();
    assert!(
        matches!(err, LinalgError::NotPositiveDefinite { value, .. } if (value + 1e-9).abs() < 1e-12),
        "{err:?}"
    );
    let tolerant = LanczosConfig { negative_tol: 1e-6, ..strict.clone() };
    let dec = lanczos(&op, &tolerant).unwrap();
    let (theta, _) = dec.ritz();
    assert!((theta[0] - 1.0).abs() < 1e-12 && (theta[3] + 1e-9).abs() < 1e-12, "{theta:?}");
    // A truly indefinite operator still fails with the tolerant setting.
    let op = DenseOperator::new(with_spectrum(&[1.0, 0.5, 0.2, -1e-3], &mut rng(5)).0).unwrap();
    assert!(matches!(lanczos(&op, &tolerant), Err(LinalgError::NotPositiveDefinite { .. })));
}

#[test]
fn lanczos_rejects_bad_operators_and_options() {
    let indefinite = with_spectrum(&[1.0, -1.0, 0.5, 0.2], &mut rng(3)).0;
    let op = DenseOperator::new(indefinite).unwrap();
    let err = lanczos(&op, &LanczosConfig { max_rank: 4, ..Default::default() }).unwrap_err();
    assert!(matches!(err, LinalgError::NotPositiveDefinite { .. }), "{err:?}");
    let nonsym = DenseOperator::new(DMatrix::from_row_slice(2, 2, &[1.0, 2.0, 0.0, 1.0])).unwrap();
    assert!(matches!(lanczos(&nonsym, &LanczosConfig::default()), Err(LinalgError::NotSymmetric { .. })));
    let nan = FnOperator::new(3, |v: &DVector<f64>| v * f64::NAN);
    assert!(matches!(
        lanczos(&nan, &LanczosConfig::default()),
        Err(LinalgError::Input(InputError::NonFinite { .. }))
    ));
    let good = DenseOperator::new(DMatrix::identity(3, 3)).unwrap();
    let zero_rank = LanczosConfig { max_rank: 0, ..Default::default() };
    assert!(matches!(lanczos(&good, &zero_rank), Err(LinalgError::Input(InputError::Invalid { .. }))));
    let zero_start = LanczosConfig { start: StartVector::Given(DVector::zeros(3)), ..Default::default() };
    assert!(matches!(lanczos(&good, &zero_start), Err(LinalgError::Input(InputError::Invalid { .. }))));
    let short = LanczosConfig { start: StartVector::Given(DVector::zeros(2)), ..Default::default() };
    assert!(matches!(lanczos(&good, &short), Err(LinalgError::Input(InputError::DimensionMismatch { .. }))));
    let bad_tol = LanczosConfig { pivot_tol: f64::NAN, ..Default::default() };
    assert!(matches!(lanczos(&good, &bad_tol), Err(LinalgError::Input(InputError::Invalid { .. }))));
    assert!(DenseOperator::new(DMatrix::zeros(2, 3)).is_err());
}

#[test]
fn cg_reaches_its_tolerance_and_preconditioning_helps() {
    let mut r = rng(4);
    let a = spd(127, 1.0, 1e-4, &mut r);
    let b = randn_vec(127, &mut r);
    let op = DenseOperator::new(a.clone()).unwrap();
    let cfg = CgConfig { tol: 1e-10, max_iter: Some(2000) };
    let (x, info) = cg(&op, &b, None, &cfg).unwrap();
    assert!(info.residual <= 1e-10, "{info:?}");
    assert!((&a * &x - &b).norm() / b.norm() <= 1e-10);
    let exact = a.clone().cholesky().unwrap().solve(&b);
    assert!((&x - &exact).norm() / exact.norm() < 1e-5);

    // K + σ²I with a fast-decaying K: a rank-40 pivoted Cholesky preconditioner cuts iterations.
    let k = with_spectrum(&(0..200).map(|i| 0.8f64.powi(i)).collect::<Vec<_>>(), &mut r).0;
    let sigma2 = 1e-4;
    let shifted = DenseOperator::new(&k + DMatrix::identity(200, 200) * sigma2).unwrap();
    let b = randn_vec(200, &mut r);
    let (_, plain) = cg(&shifted, &b, None, &cfg).unwrap();
    let pc = PivotedCholeskyPreconditioner::new(&k, sigma2, 40).unwrap();
    let (x, pre) = cg(&shifted, &b, Some(&pc), &cfg).unwrap();
    assert!(pre.residual <= 1e-10 && (shifted.matvec(&x) - &b).norm() / b.norm() <= 1e-10);
    assert!(pre.iterations * 2 < plain.iterations, "pcg {} vs cg {}", pre.iterations, plain.iterations);
    let jacobi = DiagonalPreconditioner::new(&shifted.matrix().diagonal()).unwrap();
    assert!(cg(&shifted, &b, Some(&jacobi), &cfg).unwrap().1.residual <= 1e-10);
}

#[test]
fn cg_reports_failures_as_typed_errors() {
    let mut r = rng(5);
    let a = spd(60, 1.0, 1e-6, &mut r);
    let b = randn_vec(60, &mut r);
    let op = DenseOperator::new(a).unwrap();
    match cg(&op, &b, None, &CgConfig { tol: 1e-12, max_iter: Some(3) }) {
        Err(LinalgError::NoConvergence { iterations: 3, residual, .. }) => {
            assert!(residual > 1e-12 && residual.is_finite())
        }
        other => panic!("expected NoConvergence, got {other:?}"),
    }
    let indefinite = DenseOperator::new(with_spectrum(&[1.0, -2.0, 3.0], &mut r).0).unwrap();
    let b3 = DVector::from_vec(vec![1.0, 1.0, 1.0]);
    assert!(matches!(
        cg(&indefinite, &b3, None, &CgConfig::default()),
        Err(LinalgError::NotPositiveDefinite { .. })
    ));
    assert!(matches!(
        cg(&op, &DVector::zeros(5), None, &CgConfig::default()),
        Err(LinalgError::Input(InputError::DimensionMismatch { .. }))
    ));
    let (x, info) = cg(&op, &DVector::zeros(60), None, &CgConfig::default()).unwrap();
    assert_eq!((x.norm(), info.iterations), (0.0, 0));
    assert!(DiagonalPreconditioner::new(&DVector::from_vec(vec![1.0, 0.0])).is_err());
}

#[test]
fn cg_columns_matches_per_column_solves_and_warm_starts() {
    let mut r = rng(6);
    let a = spd(90, 1.0, 1e-4, &mut r);
    let mut b = randn(90, 5, &mut r);
    b.column_mut(3).fill(0.0);
    let apply = |v: &DMatrix<f64>| -> Result<DMatrix<f64>> { Ok(&a * v) };
    let cfg = CgConfig { tol: 1e-10, max_iter: Some(2000) };
    let (x, info) = cg_columns(apply, None, &b, None, &cfg).unwrap();
    let exact = a.clone().cholesky().unwrap().solve(&b);
    assert!(rel_frob(&x, &exact) < 1e-5, "{}", rel_frob(&x, &exact));
    assert!(info.residual <= 1e-10 && info.iterations[3] == 0 && x.column(3).norm() == 0.0);
    for j in [0, 1, 2, 4] {
        let res = (&a * x.column(j) - b.column(j)).norm() / b.column(j).norm();
        assert!(res <= 1e-10, "column {j}: {res}");
    }
    // Each column runs the recurrence of the single-vector CG (same iteration counts ± 1).
    let single =
        cg(&DenseOperator::new(a.clone()).unwrap(), &b.column(0).into_owned(), None, &cfg).unwrap().1;
    assert!(single.iterations.abs_diff(info.iterations[0]) <= 1, "{single:?} {info:?}");

    // A Jacobi preconditioner, and a warm start at a nearby solution, cut the iterations.
    let d = a.diagonal().map(|v| 1.0 / v);
    let mut jacobi = |v: &DMatrix<f64>| -> Result<DMatrix<f64>> {
        Ok(DMatrix::from_fn(v.nrows(), v.ncols(), |i, j| d[i] * v[(i, j)]))
    };
    let (xp, pre) = cg_columns(apply, Some(&mut jacobi), &b, None, &cfg).unwrap();
    assert!(rel_frob(&xp, &exact) < 1e-5 && pre.residual <= 1e-10);
    let near = &exact + randn(90, 5, &mut r) * 1e-6;
    let (xw, warm) = cg_columns(apply, None, &b, Some(&near), &cfg).unwrap();
    assert!(rel_frob(&xw, &exact) < 1e-5);
    assert!(warm.products < info.products, "warm {} vs cold {}", warm.products, info.products);

    // Typed errors: no convergence, indefinite operator, shapes, non-finite input.
    match cg_columns(apply, None, &b, None, &CgConfig { tol: 1e-12, max_iter: Some(3) }) {
        Err(LinalgError::NoConvergence { iterations: 3, residual, .. }) => assert!(residual > 1e-12),
        other => panic!("expected NoConvergence, got {other:?}"),
    }
    let ind = with_spectrum(&[1.0, -2.0, 3.0], &mut r).0;
    let bad = cg_columns(
        |v: &DMatrix<f64>| -> Result<DMatrix<f64>> { Ok(&ind * v) },
        None,
        &randn(3, 2, &mut r),
        None,
        &cfg,
    );
    assert!(matches!(bad, Err(LinalgError::NotPositiveDefinite { .. })), "{bad:?}");
    assert!(matches!(
        cg_columns(apply, None, &b, Some(&DMatrix::zeros(90, 4)), &cfg),
        Err(LinalgError::Input(InputError::DimensionMismatch { .. }))
    ));
    let mut nan = b.clone();
    nan[(0, 0)] = f64::NAN;
    assert!(matches!(
        cg_columns(apply, None, &nan, None, &cfg),
        Err(LinalgError::Input(InputError::NonFinite { .. }))
    ));
}

#[test]
fn jittered_cholesky_reports_the_jitter_it_used() {
    let mut r = rng(6);
    let a = spd(31, 2.0, 0.1, &mut r);
    let c = cholesky_jitter(&a, &JitterConfig::default()).unwrap();
    assert_eq!(c.jitter(), 0.0);
    assert_mat_close(&(c.l() * c.l().transpose()), &a, 1e-13, 0.0);
    let eig_logdet: f64 = a.clone().symmetric_eigen().eigenvalues.iter().map(|v| v.ln()).sum();
    assert!((c.log_det() - eig_logdet).abs() < 1e-10 * eig_logdet.abs().max(1.0));
    let b = randn(31, 2, &mut r);
    assert_mat_close(&(&a * c.solve(&b).unwrap()), &b, 1e-11, 0.0);
    let lb = c.solve_lower(&b).unwrap();
    assert_mat_close(&(c.l() * lb), &b, 1e-12, 0.0);

    // Singular PSD: the jitter-free attempt fails, a small reported jitter succeeds.
    let (singular, _) = with_spectrum(&[1.0, 0.5, 0.0, 0.0], &mut r);
    let c = cholesky_jitter(&singular, &JitterConfig::default()).unwrap();
    assert!(c.jitter() > 0.0 && c.jitter() <= 1e-3);
    let shifted = &singular + DMatrix::identity(4, 4) * c.jitter();
    assert_mat_close(&(c.l() * c.l().transpose()), &shifted, 1e-10, 0.0);

    let indefinite = with_spectrum(&[1.0, -0.5, 0.3], &mut r).0;
    assert!(matches!(
        cholesky_jitter(&indefinite, &JitterConfig::default()),
        Err(LinalgError::CholeskyFailed { .. })
    ));
    let nonsym = DMatrix::from_row_slice(2, 2, &[2.0, 1.0, 0.0, 2.0]);
    assert!(matches!(
        cholesky_jitter(&nonsym, &JitterConfig::default()),
        Err(LinalgError::NotSymmetric { .. })
    ));
    let nan = DMatrix::from_element(2, 2, f64::NAN);
    assert!(matches!(
        cholesky_jitter(&nan, &JitterConfig::default()),
        Err(LinalgError::Input(InputError::NonFinite { .. }))
    ));
    // The owned variant refuses the same inputs with the same errors.
    for bad in [indefinite, nonsym, nan, DMatrix::zeros(0, 0), DMatrix::zeros(2, 3)] {
        let borrowed = cholesky_jitter(&bad, &JitterConfig::default()).unwrap_err();
        let owned = cholesky_jitter_owned(bad, &JitterConfig::default()).unwrap_err();
        assert_eq!(owned.to_string(), borrowed.to_string());
    }
}

#[test]
fn the_owned_eigendecomposition_refuses_what_the_borrowed_one_refuses() {
    let nonsym = DMatrix::from_row_slice(2, 2, &[2.0, 1.0, 0.0, 2.0]);
    let mut nan = DMatrix::from_element(3, 3, 1.0);
    nan[(2, 1)] = f64::NAN;
    for bad in [nonsym, nan, DMatrix::zeros(2, 3)] {
        let borrowed = sym_eigh(&bad).unwrap_err();
        let owned = sym_eigh_owned(bad).unwrap_err();
        assert_eq!(owned.to_string(), borrowed.to_string());
    }
}

#[test]
fn thin_svd_eigh_and_pinv_sqrt_reconstruct() {
    let mut r = rng(7);
    for (p, k) in [(200usize, 13usize), (31, 31), (500, 2)] {
        let m = randn(p, k, &mut r);
        let svd = thin_svd(&m).unwrap();
        let rec = &svd.u * DMatrix::from_diagonal(&svd.s) * svd.v.transpose();
        assert_mat_close(&rec, &m, 1e-10, 0.0);
        assert!(orthogonality_error(&svd.u) < 1e-10 && orthogonality_error(&svd.v) < 1e-10);
        assert!(svd.s.as_slice().windows(2).all(|w| w[0] >= w[1]));
    }
    assert!(thin_svd(&DMatrix::zeros(2, 3)).is_err());

    let (a, _) = with_spectrum(&[3.0, 1.0, 0.25, 0.0, 0.0], &mut r);
    let (values, vectors) = sym_eigh(&a).unwrap();
    assert_all_close(values.as_slice(), &[3.0, 1.0, 0.25, 0.0, 0.0], 0.0, 1e-12);
    assert_mat_close(&(&vectors * DMatrix::from_diagonal(&values) * vectors.transpose()), &a, 1e-12, 0.0);
    let f = psd_pinv_sqrt(&a, 1e-10).unwrap();
    assert_eq!(f.ncols(), 3);
    assert_mat_close(&(&f * f.transpose()), &psd_pinv(&a, 1e-10), 1e-10, 0.0);
    let indefinite = with_spectrum(&[1.0, -1.0], &mut r).0;
    assert!(matches!(psd_pinv_sqrt(&indefinite, 1e-10), Err(LinalgError::NotPositiveDefinite { .. })));
}

/// `sym_eigh` (faer) against a known spectrum and nalgebra's independent solver, across sizes
/// below and above faer's blocking and divide-and-conquer thresholds, with repeated eigenvalues.
#[test]
fn sym_eigh_matches_a_known_spectrum_and_nalgebra() {
    let mut r = rng(21);
    for n in [1usize, 2, 17, 64, 129, 400] {
        let mut spectrum = geometric_spectrum(n, 50.0, 1e-3);
        // A repeated eigenvalue and a zero block (KFAC factors of rank-deficient batches).
        if n >= 17 {
            spectrum[3] = spectrum[2];
            for v in spectrum.iter_mut().rev().take(n / 5) {
                *v = 0.0;
            }
            spectrum.sort_by(|a, b| b.total_cmp(a));
        }
        let (a, _) = with_spectrum(&spectrum, &mut r);
        let (values, vectors) = sym_eigh(&a).unwrap();
        assert_all_close(values.as_slice(), &spectrum, 0.0, 1e-11 * 50.0);
        let mut reference: Vec<f64> = a.clone().symmetric_eigen().eigenvalues.iter().cloned().collect();
        reference.sort_by(|a, b| b.total_cmp(a));
        assert_all_close(values.as_slice(), &reference, 0.0, 1e-11 * 50.0);
        assert!(orthogonality_error(&vectors) < 1e-12 * n as f64, "n = {n}");
        let rebuilt = &vectors * DMatrix::from_diagonal(&values) * vectors.transpose();
        assert!(rel_frob(&rebuilt, &a) < 1e-13 * n as f64, "n = {n}");
    }
    let (values, vectors) = sym_eigh(&DMatrix::zeros(0, 0)).unwrap();
    assert_eq!((values.len(), vectors.shape()), (0, (0, 0)));
    let mut bad = DMatrix::identity(3, 3);
    bad[(1, 2)] = f64::NAN;
    assert!(matches!(sym_eigh(&bad), Err(LinalgError::Input(InputError::NonFinite { .. }))));
    assert!(matches!(
        sym_eigh(&DMatrix::zeros(2, 3)),
        Err(LinalgError::Input(InputError::DimensionMismatch { .. }))
    ));
}

#[test]
fn woodbury_and_cholesky_updates_equal_recomputation() {
    let mut r = rng(8);
    let (n, k) = (127, 9);
    let u = randn(n, k, &mut r);
    let mut c = DVector::from_fn(k, |i, _| 0.5 + i as f64);
    c[3] = 0.0; // zero weights are allowed
    let delta = DVector::from_fn(n, |i, _| 0.1 + (i % 7) as f64 * 0.3);
    let lr = LowRankPlusDiagonal::new(u.clone(), c.clone(), delta.clone()).unwrap();
    let dense = lr.to_dense();
    assert_mat_close(
        &dense,
        &(DMatrix::from_diagonal(&delta) + &u * DMatrix::from_diagonal(&c) * u.transpose()),
        1e-13,
        0.0,
    );
    let b = randn_vec(n, &mut r);
    let x = lr.solve(&b).unwrap();
    assert!((&dense * &x - &b).norm() / b.norm() < 1e-10);
    let chol = dense.clone().cholesky().unwrap();
    let exact_logdet = 2.0 * chol.l().diagonal().iter().map(|v| v.ln()).sum::<f64>();
    assert!((lr.log_det() - exact_logdet).abs() < 1e-10 * exact_logdet.abs());
    assert_mat_close(&lr.matmat(&randn(n, 1, &mut rng(1))), &(&dense * randn(n, 1, &mut rng(1))), 1e-13, 0.0);
    assert!(LowRankPlusDiagonal::new(u.clone(), c.clone(), -delta.clone()).is_err());
    assert!(LowRankPlusDiagonal::new(u.clone(), -c.clone(), delta.clone()).is_err());
    assert!(LowRankPlusDiagonal::new(u.clone(), DVector::zeros(k + 1), delta).is_err());

    // Rank-k update and downdate of a Cholesky factor.
    let a = spd(n, 2.0, 0.5, &mut r);
    let v = randn(n, 4, &mut r) * 0.3;
    let mut l = a.clone().cholesky().unwrap().l();
    cholesky_rank_update(&mut l, &v, UpdateSign::Update).unwrap();
    let updated = &a + &v * v.transpose();
    assert_mat_close(&l, &updated.clone().cholesky().unwrap().l(), 1e-11, 0.0);
    cholesky_rank_update(&mut l, &v, UpdateSign::Downdate).unwrap();
    assert_mat_close(&l, &a.clone().cholesky().unwrap().l(), 1e-10, 0.0);
    // A downdate past positive definiteness fails and leaves L untouched.
    let before = l.clone();
    let big = DMatrix::from_fn(n, 1, |i, _| if i == 0 { 10.0 } else { 0.0 });
    assert!(matches!(
        cholesky_rank_update(&mut l, &big, UpdateSign::Downdate),
        Err(LinalgError::NotPositiveDefinite { .. })
    ));
    assert_eq!(l, before);
}

#[test]
fn slq_log_determinant_is_within_one_percent() {
    let mut r = rng(9);
    let spectrum: Vec<f64> = (0..500).map(|i| 1e-2 + 5.0 * 0.97f64.powi(i)).collect();
    let (a, _) = with_spectrum(&spectrum, &mut r);
    let exact: f64 = spectrum.iter().map(|v| v.ln()).sum();
    // This spread-out spectrum makes Hutchinson's variance large (≈ 47 per probe): 100 probes
    // put 1% of |log det| at ≈ 3.4 standard errors. Kernel matrices (facade tests) need fewer.
    let cfg = SlqConfig { probes: 100, ..Default::default() };
    let est = slq_logdet(&DenseOperator::new(a).unwrap(), &cfg).unwrap();
    assert!((est.value - exact).abs() < 0.01 * exact.abs(), "slq {} vs exact {exact}", est.value);
    assert!(est.std_error > 0.0 && (est.value - exact).abs() < 5.0 * est.std_error + 1e-9);
    let indefinite = DenseOperator::new(with_spectrum(&[1.0, -1.0, 2.0], &mut r).0).unwrap();
    assert!(slq_logdet(&indefinite, &SlqConfig { steps: 3, ..Default::default() }).is_err());
    assert!(slq_logdet(&indefinite, &SlqConfig { probes: 1, ..Default::default() }).is_err());
}

#[test]
fn operators_compose_and_check_their_inputs() {
    let mut r = rng(10);
    let a = spd(5, 2.0, 0.5, &mut r);
    let d = DVector::from_vec(vec![1.0, 2.0, 3.0, 4.0, 5.0]);
    let sum =
        SumOperator::new(DenseOperator::new(a.clone()).unwrap(), DiagonalOperator::new(d.clone()).unwrap())
            .unwrap();
    let scaled = ScaledOperator::new(-2.0, sum).unwrap();
    let expected = (&a + DMatrix::from_diagonal(&d)) * -2.0;
    assert_mat_close(&to_dense(&scaled), &expected, 1e-14, 0.0);
    assert!(SumOperator::new(
        DenseOperator::new(a.clone()).unwrap(),
        DiagonalOperator::identity_scaled(4, 1.0).unwrap()
    )
    .is_err());
    let op = DenseOperator::new(a).unwrap();
    let mut v = DVector::from_element(5, 1.0);
    v[2] = f64::INFINITY;
    assert!(matches!(op.apply(&v), Err(LinalgError::Input(InputError::NonFinite { .. }))));
    assert!(matches!(
        op.apply_block(&DMatrix::zeros(4, 2)),
        Err(LinalgError::Input(InputError::DimensionMismatch { .. }))
    ));
}

fn random_psd(n: usize, zeros: usize, seed: u64) -> DMatrix<f64> {
    let mut spectrum = geometric_spectrum(n - zeros.min(n - 1), 1.0, 1e-2);
    spectrum.resize(n, 0.0);
    with_spectrum(&spectrum, &mut rng(seed)).0
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// Symmetrising in place gives the factor of the symmetrised copy bit for bit, with and
    /// without jitter (singular matrices), for inputs asymmetric within the tolerance.
    #[test]
    fn the_owned_jittered_cholesky_is_the_borrowed_one(n in 1usize..40, zeros in 0usize..10, seed in 0u64..1000) {
        let mut a = random_psd(n, zeros.min(n - 1), seed);
        let mut r = rng(seed + 7);
        let noise = randn(n, n, &mut r) * (1e-13 * a.norm() / n as f64);
        a += noise;
        let borrowed = cholesky_jitter(&a, &JitterConfig::default()).unwrap();
        let owned = cholesky_jitter_owned(a, &JitterConfig::default()).unwrap();
        prop_assert_eq!(owned.jitter().to_bits(), borrowed.jitter().to_bits());
        prop_assert!(same_bits(&owned.l(), &borrowed.l()));
    }

    #[test]
    fn the_owned_eigendecomposition_is_the_borrowed_one(n in 0usize..40, zeros in 0usize..10, seed in 0u64..1000) {
        // Asymmetric within the tolerance, as sums of float products are.
        let mut a = random_psd(n.max(1), zeros.min(n.max(1) - 1), seed).resize(n, n, 0.0);
        let mut r = rng(seed + 11);
        let noise = randn(n, n, &mut r) * (1e-13 * a.norm().max(1.0) / n.max(1) as f64);
        a += noise;
        let (bv, bq) = sym_eigh(&a).unwrap();
        let (ov, oq) = sym_eigh_owned(a).unwrap();
        prop_assert!(same_bits(&DMatrix::from_column_slice(n, 1, ov.as_slice()), &DMatrix::from_column_slice(n, 1, bv.as_slice())));
        prop_assert!(same_bits(&oq, &bq));
    }

    #[test]
    fn lanczos_invariants_hold_on_random_psd_matrices(n in 2usize..40, zeros in 0usize..10, seed in 0u64..1000) {
        let a = random_psd(n, zeros, seed);
        // The start seed differs from the matrix seed: the same StdRng stream would make the
        // start vector the top eigenvector (the first Gaussian column of Q).
        let dec = full_rank_lanczos(&a, seed + 100_000);
        prop_assert!(orthogonality_error(dec.basis()) < 1e-10);
        let (f, _) = pinv_factor_from(&dec).unwrap();
        let err = rel_frob(&(&f * f.transpose()), &psd_pinv(&a, 1e-9));
        prop_assert!(err < 1e-8, "err {}", err);
    }

    #[test]
    fn cg_residual_is_below_tolerance(n in 1usize..60, seed in 0u64..1000) {
        let mut r = rng(seed);
        let a = spd(n, 1.0, 1e-3, &mut r);
        let b = randn_vec(n, &mut r);
        let (x, info) = cg(&DenseOperator::new(a.clone()).unwrap(), &b, None, &CgConfig::default()).unwrap();
        prop_assert!(info.residual <= 1e-10);
        prop_assert!((&a * x - &b).norm() <= 1e-10 * b.norm() * 1.0001);
    }

    #[test]
    fn cg_columns_residuals_are_below_tolerance(n in 1usize..50, cols in 1usize..6, seed in 0u64..1000) {
        let mut r = rng(seed);
        let a = spd(n, 1.0, 1e-3, &mut r);
        let b = randn(n, cols, &mut r);
        let apply = |v: &DMatrix<f64>| -> Result<DMatrix<f64>> { Ok(&a * v) };
        let (x, info) = cg_columns(apply, None, &b, None, &CgConfig::default()).unwrap();
        prop_assert!(info.residual <= 1e-10);
        for j in 0..cols {
            prop_assert!((&a * x.column(j) - b.column(j)).norm() <= 1e-10 * b.column(j).norm() * 1.0001);
        }
    }

    #[test]
    fn woodbury_matches_dense_solve(n in 1usize..40, k in 1usize..8, seed in 0u64..1000) {
        let mut r = rng(seed);
        let u = randn(n, k, &mut r);
        let c = DVector::from_fn(k, |i, _| (i as f64) * 0.3);
        let delta = DVector::from_fn(n, |i, _| 0.2 + (i % 3) as f64);
        let lr = LowRankPlusDiagonal::new(u, c, delta).unwrap();
        let b = randn_vec(n, &mut r);
        let dense = lr.to_dense();
        prop_assert!((&dense * lr.solve(&b).unwrap() - &b).norm() <= 1e-9 * b.norm());
    }

    #[test]
    fn cholesky_update_then_downdate_is_the_identity(n in 1usize..30, k in 1usize..5, seed in 0u64..1000) {
        let mut r = rng(seed);
        let a = spd(n, 2.0, 0.2, &mut r);
        let v = randn(n, k, &mut r);
        let l0 = a.cholesky().unwrap().l();
        let mut l = l0.clone();
        cholesky_rank_update(&mut l, &v, UpdateSign::Update).unwrap();
        cholesky_rank_update(&mut l, &v, UpdateSign::Downdate).unwrap();
        prop_assert!(rel_frob(&l, &l0) < 1e-8);
    }
}

#[test]
fn faer_cholesky_and_solves_equal_nalgebras() {
    use fspace_linalg::fast::{cholesky_lower, solve_lower, solve_upper_of_lower};
    let mut r = rng(11);
    // Sizes around faer's recursion threshold (64) and block size (128).
    for n in [1usize, 2, 63, 64, 65, 129, 300] {
        let a = spd(n, 3.0, 1e-3, &mut r);
        let l = cholesky_lower(&a).unwrap();
        let reference = a.clone().cholesky().unwrap().l();
        assert_mat_close(&l, &reference, 1e-10, 0.0);
        assert!((0..n).all(|i| (i + 1..n).all(|j| l[(i, j)] == 0.0)), "upper triangle is zero");
        for cols in [1usize, 63, 65, 130] {
            let b = randn(n, cols, &mut r);
            let x = solve_lower(&l, &b);
            assert_mat_close(&(&l * &x), &b, 1e-10, 1e-12);
            let y = solve_upper_of_lower(&l, &b);
            assert_mat_close(&(l.transpose() * &y), &b, 1e-10, 1e-12);
        }
    }
    // Indefinite and singular matrices are rejected, in the first block or a later one, and so
    // are non-finite and non-square ones.
    for n in [5usize, 150] {
        let mut spectrum = geometric_spectrum(n, 1.0, 0.1);
        spectrum[n - 1] = -0.5;
        assert!(cholesky_lower(&with_spectrum(&spectrum, &mut r).0).is_none(), "n={n}");
    }
    let mut nan = DMatrix::<f64>::identity(3, 3);
    nan[(1, 1)] = f64::NAN;
    assert!(cholesky_lower(&nan).is_none());
    assert!(cholesky_lower(&DMatrix::<f64>::zeros(3, 2)).is_none());
    assert!(cholesky_lower(&DMatrix::<f64>::zeros(3, 3)).is_none(), "singular");
}

#[test]
fn faer_products_and_spd_inverse_match_plain_nalgebra() {
    use fspace_linalg::fast::{
        gram, gram_serial, matmul, matmul_serial, matmul_tn_serial, spd_inverse_and_logdet,
    };
    let mut r = fspace_testutil::rng(79);
    for (p, n) in [(3, 1), (40, 7), (300, 257), (2_000, 40)] {
        let a = fspace_testutil::randn(p, n, &mut r);
        let g = gram(&a);
        fspace_testutil::assert_mat_close(&g, &(a.transpose() * &a), 1e-12, 1e-12);
        assert_eq!(g, g.transpose(), "AᵀA is exactly symmetric");
        assert_eq!(gram_serial(&a), g, "the serial AᵀA has the parallel one's bits");
        let b = fspace_testutil::randn(n, n + 3, &mut r);
        fspace_testutil::assert_mat_close(&matmul(&a, &b), &(&a * &b), 1e-12, 1e-12);
        assert_eq!(matmul_serial(&a, &b), matmul(&a, &b), "the serial AB has the parallel one's bits");
        let c = fspace_testutil::randn(p, n + 2, &mut r);
        fspace_testutil::assert_mat_close(&matmul_tn_serial(&a, &c), &(a.transpose() * &c), 1e-12, 1e-12);
    }
    for n in [1, 50, 250] {
        let s = fspace_testutil::spd(n, 10.0, 0.01, &mut r);
        let (inv, logdet) = spd_inverse_and_logdet(&s).unwrap();
        assert_eq!(inv, inv.transpose());
        fspace_testutil::assert_mat_close(&(&s * &inv), &nalgebra::DMatrix::identity(n, n), 1e-9, 1e-9);
        assert!((logdet - s.determinant().ln()).abs() < 1e-9 * logdet.abs().max(1.0));
    }
    assert!(spd_inverse_and_logdet(&(-nalgebra::DMatrix::<f64>::identity(4, 4))).is_none());
    let mut nan = nalgebra::DMatrix::<f64>::identity(3, 3);
    nan[(2, 1)] = f64::NAN;
    assert!(spd_inverse_and_logdet(&nan).is_none());
    assert!(spd_inverse_and_logdet(&nalgebra::DMatrix::<f64>::zeros(3, 2)).is_none());
    // An empty depth gives zeros.
    let empty = nalgebra::DMatrix::<f64>::zeros(0, 4);
    assert_eq!(gram(&empty), nalgebra::DMatrix::zeros(4, 4));
    assert_eq!(matmul(&empty.transpose(), &empty), nalgebra::DMatrix::zeros(4, 4));
    assert_eq!(matmul_tn_serial(&empty, &empty), nalgebra::DMatrix::zeros(4, 4));
}

/// faer splits a product's output, never its sums, and blocks its Cholesky factor the same way
/// on any thread count: no number of the workspace may depend on the machine's core count.
#[test]
fn faer_routines_give_the_same_bits_on_any_number_of_threads() {
    use fspace_linalg::fast::{
        cholesky_lower, gram, matmul, solve_lower, solve_upper_of_lower, spd_inverse_and_logdet,
    };
    let mut r = fspace_testutil::rng(78);
    let a = fspace_testutil::randn(1_500, 301, &mut r);
    let b = fspace_testutil::randn(301, 257, &mut r);
    let s = fspace_testutil::spd(301, 10.0, 0.01, &mut r);
    let run = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        pool.install(|| (gram(&a), matmul(&a, &b), spd_inverse_and_logdet(&s).unwrap()))
    };
    let big = fspace_testutil::spd(700, 10.0, 0.01, &mut r);
    let rhs = fspace_testutil::randn(700, 300, &mut r);
    let solves = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        pool.install(|| {
            let l = cholesky_lower(&big).unwrap();
            let x = solve_upper_of_lower(&l, &solve_lower(&l, &rhs));
            (l, x)
        })
    };
    let (one, one_solves) = (run(1), solves(1));
    for threads in [2, 3] {
        let other = run(threads);
        let other_solves = solves(threads);
        assert_eq!(one_solves.0, other_solves.0, "Cholesky factor on {threads} threads");
        assert_eq!(one_solves.1, other_solves.1, "Cholesky solves on {threads} threads");
        assert_eq!(one.0, other.0, "AᵀA on {threads} threads");
        assert_eq!(one.1, other.1, "AB on {threads} threads");
        assert_eq!(one.2 .0, other.2 .0, "SPD inverse on {threads} threads");
        assert_eq!(one.2 .1.to_bits(), other.2 .1.to_bits(), "log-determinant on {threads} threads");
    }
}
