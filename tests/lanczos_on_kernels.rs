//! Matrix-free linear algebra on kernel Gram operators, against dense references.

use fspace::context::{BoundingBox, GridSampler, Sampler};
use fspace::kernels::{gram, GramOperator, Kernel, Matern12, Rbf};
use fspace::linalg::*;
use fspace_testutil::{psd_pinv, rand_uniform, randn_vec, rel_frob, rng};
use nalgebra::DMatrix;

fn pinv_error(k: &DMatrix<f64>, f: &DMatrix<f64>, rtol: f64) -> f64 {
    rel_frob(&(f * f.transpose()), &psd_pinv(k, rtol))
}

#[test]
fn lanczos_ldlt_inverts_full_rank_gram_operators() {
    let x = rand_uniform(150, 2, -3.0, 3.0, &mut rng(1));
    // RBF with a short lengthscale (well-conditioned) and Matérn-1/2 (always well-conditioned).
    let kernels: Vec<(&str, Box<dyn Kernel>)> = vec![
        ("rbf", Rbf::new(1.0, 0.15).unwrap().boxed()),
        ("matern12", Matern12::new(1.0, 1.0).unwrap().boxed()),
    ];
    for (name, kernel) in kernels {
        let dense = gram(&kernel, &x, &x).unwrap();
        let op = GramOperator::new(&kernel, &x).unwrap();
        let (f, info) = pinv_factor(&op, &LanczosConfig { max_rank: 150, ..Default::default() }).unwrap();
        assert_eq!(info.rank, 150, "{name}: {info:?}");
        let err = pinv_error(&dense, &f, 1e-12);
        assert!(err < 1e-8, "{name}: ‖FFᵀ − K⁻¹‖/‖K⁻¹‖ = {err:.3e}");
    }
}

#[test]
fn lanczos_finds_the_rank_of_a_singular_gram_matrix() {
    // 40 distinct points, each twice: K has rank 40 exactly.
    let distinct = rand_uniform(40, 1, -3.0, 3.0, &mut rng(2));
    let x = DMatrix::from_fn(80, 1, |i, _| distinct[(i % 40, 0)]);
    let k = Matern12::new(1.0, 0.7).unwrap();
    let dense = gram(&k, &x, &x).unwrap();
    let op = GramOperator::new(k, &x).unwrap();
    let (f, info) = pinv_factor(&op, &LanczosConfig { max_rank: 80, ..Default::default() }).unwrap();
    assert_eq!(info.rank, 40, "{info:?}");
    assert!(pinv_error(&dense, &f, 1e-10) < 1e-8);
}

#[test]
fn fsp_toy_context_gram_gives_a_valid_pseudo_inverse_factor() {
    // FSP-Laplace's toy setup: 100 grid context points on [−2, 2], RBF prior. K is numerically
    // low-rank; the factor must satisfy the pseudo-inverse identity K F Fᵀ K = K.
    let c = GridSampler::new(BoundingBox::cube(1, -2.0, 2.0).unwrap()).sample(100, &mut rng(0)).unwrap();
    let kernel = Rbf::new(1.0, 0.5).unwrap();
    let dense = gram(&kernel, &c, &c).unwrap();
    let op = GramOperator::new(kernel, &c).unwrap();
    let (f, info) = pinv_factor(&op, &LanczosConfig::default()).unwrap();
    eprintln!("FSP toy context Gram: {info:?}, ‖KFFᵀK − K‖/‖K‖ = {:.2e}", {
        let kffk = &dense * &f * f.transpose() * &dense;
        rel_frob(&kffk, &dense)
    });
    assert!(info.rank < 100 && info.rank > 10, "numerical rank detected: {info:?}");
    let kffk = &dense * &f * f.transpose() * &dense;
    assert!(rel_frob(&kffk, &dense) < 1e-6, "‖K F Fᵀ K − K‖/‖K‖ = {:.3e}", rel_frob(&kffk, &dense));
    // F spans directions of the range only: F Fᵀ is symmetric PSD with rank r.
    assert_eq!(f.ncols(), info.rank);
}

#[test]
fn pivoted_cholesky_preconditioning_speeds_up_cg_on_a_gram_operator() {
    let x = rand_uniform(400, 2, -2.0, 2.0, &mut rng(3));
    let kernel = Rbf::new(1.0, 0.8).unwrap();
    let sigma2 = 1e-2;
    let op = GramOperator::new(kernel.clone(), &x).unwrap().with_shift(sigma2).unwrap();
    let entries = GramOperator::new(kernel, &x).unwrap(); // entries of K, without σ²
    let y = randn_vec(400, &mut rng(4));
    let cfg = CgConfig { tol: 1e-8, max_iter: Some(2000) };
    let (_, plain) = cg(&op, &y, None, &cfg).unwrap();
    let pc = PivotedCholeskyPreconditioner::new(&entries, sigma2, 30).unwrap();
    let (x_pcg, pre) = cg(&op, &y, Some(&pc), &cfg).unwrap();
    assert!(pre.residual <= 1e-8);
    eprintln!("cg {} iterations, pcg (rank 30) {} iterations", plain.iterations, pre.iterations);
    assert!(pre.iterations * 3 < plain.iterations, "pcg {} vs cg {}", pre.iterations, plain.iterations);
    let dense = op.apply_block(&DMatrix::identity(400, 400)).unwrap();
    let exact = dense.cholesky().unwrap().solve(&y);
    assert!((&x_pcg - &exact).norm() / exact.norm() < 1e-6);
}

#[test]
fn slq_log_determinant_of_a_2000_point_kernel_matrix_is_within_one_percent() {
    let x = rand_uniform(2000, 3, -2.0, 2.0, &mut rng(5));
    let kernel = Matern12::new(1.0, 0.5).unwrap();
    let k = gram(&kernel, &x, &x).unwrap() + DMatrix::identity(2000, 2000) * 0.1;
    let exact = cholesky_jitter(&k, &JitterConfig::default()).unwrap();
    assert_eq!(exact.jitter(), 0.0);
    let est = slq_logdet(&DenseOperator::new(k).unwrap(), &SlqConfig::default()).unwrap();
    let rel = (est.value - exact.log_det()).abs() / exact.log_det().abs();
    eprintln!(
        "slq {:.2} ± {:.2}, exact {:.2}, relative error {rel:.2e}",
        est.value,
        est.std_error,
        exact.log_det()
    );
    assert!(rel < 0.01, "slq {} ± {} vs exact {} (rel {rel:.2e})", est.value, est.std_error, exact.log_det());
}
