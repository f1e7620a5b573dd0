//! FSP-Laplace: Alg. 2 against dense linear algebra, the truncation rule, Alg. 1's gradient
//! against finite differences, the posterior's consistency, and bad input.

use fspace_context::{BoundingBox, GridSampler, Sampler};
use fspace_core::{
    Categorical, Data, Fitted, Gaussian, Likelihood, LikelihoodSpec, Persist, Posterior, Progress,
};
use fspace_fsp_laplace::*;
use fspace_input::InputError;
use fspace_kernels::GpPrior;
use fspace_kernels::{gram, Independent, Matern12, Rbf};
use fspace_nn::{Activation, Mlp, MlpConfig, TrainConfig};
use fspace_testutil::{fd_gradient, rand_uniform, rel_err, rel_frob, rng, same_bits, CountingRows};
use nalgebra::{DMatrix, DVector};

fn mlp(d: usize, q: usize, seed: u64) -> Mlp {
    Mlp::new(MlpConfig {
        input_dim: d,
        hidden: vec![8, 8],
        output_dim: q,
        activation: Activation::Tanh,
        seed,
    })
    .unwrap()
}

fn grid(d: usize, n: usize, lo: f64, hi: f64) -> DMatrix<f64> {
    GridSampler::new(BoundingBox::cube(d, lo, hi).unwrap()).sample(n, &mut rng(0)).unwrap()
}

/// Dense reference of Alg. 2 without truncation: `Λ = J_Cᵀ Σ(C,C)⁻¹ J_C + Σᵢ Jᵢᵀ Hᵢ Jᵢ`,
/// `U` an orthonormal basis of `range(J_Cᵀ)`, and the covariance `U (Uᵀ Λ U)⁻¹ Uᵀ`.
fn dense_reference<N: fspace_nn::Network>(
    net: &N,
    jacobian: impl Fn(&DMatrix<f64>) -> DMatrix<f64>,
    lik: &dyn Likelihood,
    prior: &GpPrior,
    x: &DMatrix<f64>,
    y: &DVector<f64>,
    c: &DMatrix<f64>,
) -> (DMatrix<f64>, DMatrix<f64>) {
    let q = net.output_dim();
    let jc = jacobian(c);
    let k = gram(&*prior.kernel, c, c).unwrap();
    let kinv = k.clone().try_inverse().unwrap();
    let jx = jacobian(x);
    let hess = lik.nll_hessian(&net.forward(x).unwrap(), y).unwrap();
    let mut h = DMatrix::zeros(x.nrows() * q, x.nrows() * q);
    for (i, hi) in hess.iter().enumerate() {
        h.view_mut((i * q, i * q), (q, q)).copy_from(hi);
    }
    let lambda = jc.transpose() * kinv * &jc + jx.transpose() * h * &jx;
    let svd = jc.transpose().svd(true, false);
    let u = svd.u.unwrap();
    let smax = svd.singular_values.max();
    let keep: Vec<usize> =
        (0..svd.singular_values.len()).filter(|&i| svd.singular_values[i] > 1e-12 * smax).collect();
    let u = u.select_columns(&keep);
    let a = u.transpose() * &lambda * &u;
    (&u * a.try_inverse().unwrap() * u.transpose(), lambda)
}

fn no_truncation() -> FspLaplaceConfig {
    FspLaplaceConfig { truncate: false, rank_rtol: 1e-14, ..Default::default() }
}

/// `S Sᵀ = U (Uᵀ Λ U)⁻¹ Uᵀ` holds iff `S` spans `range(U)` with `Sᵀ Λ S = I`; the covariance
/// itself is ill-conditioned (precision eigenvalues of a net at initialisation span 10 decades),
/// so the test checks `Sᵀ Λ S = I` and the *function-space* covariance at test points — the
/// quantity the method reports — against the dense reference.
fn assert_matches_dense<N: fspace_nn::Network>(
    post: &FspLaplace<N>,
    jacobian: impl Fn(&DMatrix<f64>) -> DMatrix<f64>,
    reference: &DMatrix<f64>,
    lambda: &DMatrix<f64>,
    xt: &DMatrix<f64>,
) {
    let s = post.covariance_factor();
    let r = s.ncols();
    let id_err = (s.transpose() * lambda * s - DMatrix::<f64>::identity(r, r)).norm() / (r as f64).sqrt();
    let jt = jacobian(xt);
    let cov = &jt * s * s.transpose() * jt.transpose();
    let cov_ref = &jt * reference * jt.transpose();
    let cov_err = rel_frob(&cov, &cov_ref);
    // A backward-stable computation is accurate to O(ε·cond(A)), A = Uᵀ Λ U.
    let ev = &post.report().precision_eigenvalues;
    let cond = ev[ev.len() - 1] / ev[0];
    let tol = 50.0 * f64::EPSILON * cond;
    eprintln!("rank {r}, cond(A) = {cond:.1e} (tolerance {tol:.1e}): ‖SᵀΛS − I‖/√r = {id_err:.2e}; predictive covariance rel. error {cov_err:.2e}");
    assert!(tol < 1e-3, "test set-up too ill-conditioned to be meaningful");
    assert!(id_err < tol, "SᵀΛS − I: {id_err}");
    assert!(cov_err < tol, "predictive covariance: {cov_err}");
}

#[test]
fn alg2_covariance_equals_the_pseudo_inverse_of_the_projected_dense_hessian_regression() {
    // Matérn-1/2 Gram on 12 grid points is well conditioned: Lanczos reaches full rank and
    // S Sᵀ must equal the dense pseudo-inverse of P Λ P.
    let net = mlp(1, 1, 3);
    let x = rand_uniform(20, 1, -1.0, 1.0, &mut rng(1));
    let y = DVector::from_fn(20, |i, _| (6.0 * x[(i, 0)]).sin());
    let c = grid(1, 8, -4.0, 4.0);
    let prior = GpPrior::centered(Matern12::new(1.0, 0.5).unwrap());
    let lik = Gaussian::new(0.3).unwrap();
    let post = laplace(&net, &lik, &prior, &x, &y, &c, &no_truncation()).unwrap();
    let jac = |p: &DMatrix<f64>| net.jacobian(p).unwrap();
    let (reference, lambda) = dense_reference(&net, jac, &lik, &prior, &x, &y, &c);
    assert_eq!(post.report().rank, 8);
    assert_matches_dense(&post, jac, &reference, &lambda, &grid(1, 30, -3.0, 3.0));
}

#[test]
fn alg2_with_more_context_directions_than_weights_equals_the_dense_reference() {
    // 3 outputs at 16 context points: r = 48 prior directions for p = 39 weights, so M = J(C)ᵀL
    // is wide and its range is all of ℝᵖ (taken from the SVD of Mᵀ).
    let net = Mlp::new(MlpConfig {
        input_dim: 2,
        hidden: vec![6],
        output_dim: 3,
        activation: Activation::Tanh,
        seed: 4,
    })
    .unwrap();
    assert_eq!(net.n_params(), 39);
    let x = rand_uniform(12, 2, -1.0, 1.0, &mut rng(3));
    let y = DVector::from_fn(12, |i, _| (i % 3) as f64);
    let c = grid(2, 16, -3.0, 3.0);
    let prior = GpPrior::centered(Independent::new(Matern12::new(1.0, 1.0).unwrap(), 3).unwrap());
    let lik = Categorical::new(3).unwrap();
    let post = laplace(&net, &lik, &prior, &x, &y, &c, &no_truncation()).unwrap();
    let jac = |p: &DMatrix<f64>| net.jacobian(p).unwrap();
    let (reference, lambda) = dense_reference(&net, jac, &lik, &prior, &x, &y, &c);
    let report = post.report();
    assert!(report.lanczos_rank > net.n_params() && report.range_rank <= net.n_params(), "{report:?}");
    assert_matches_dense(&post, jac, &reference, &lambda, &grid(2, 25, -2.0, 2.0));
}

#[test]
fn alg2_covariance_equals_the_dense_reference_for_two_outputs() {
    // Categorical (d' = 2) with an independent-output prior: exercises the point-major layout
    // of Σ(C,C), J(C) and the per-point Hessian blocks (which are singular for a softmax).
    let net = mlp(2, 2, 5);
    let x = rand_uniform(15, 2, -1.0, 1.0, &mut rng(2));
    let y = DVector::from_fn(15, |i, _| (x[(i, 0)] > 0.0) as u8 as f64);
    let c = grid(2, 4, -4.0, 4.0);
    let prior = GpPrior::centered(Independent::new(Matern12::new(2.0, 1.0).unwrap(), 2).unwrap());
    let lik = Categorical::new(2).unwrap();
    let post = laplace(&net, &lik, &prior, &x, &y, &c, &no_truncation()).unwrap();
    let jac = |p: &DMatrix<f64>| net.jacobian(p).unwrap();
    let (reference, lambda) = dense_reference(&net, jac, &lik, &prior, &x, &y, &c);
    assert_eq!(post.report().rank, 8, "{:?}", post.report());
    assert_matches_dense(&post, jac, &reference, &lambda, &grid(2, 25, -3.0, 3.0));
}

#[test]
fn alg2_with_a_helmholtz_prior_and_net_equals_the_dense_reference() {
    // A matrix-valued (curl-free + divergence-free) prior, the Helmholtz network (second-order
    // J), and vector targets through the isotropic Gaussian.
    let net = fspace_nn::HelmholtzNet::new(vec![6], Activation::Tanh, 2).unwrap();
    let x = rand_uniform(10, 2, -1.0, 1.0, &mut rng(12));
    let y = DVector::from_fn(20, |k, _| (x[(k / 2, k % 2)] * 2.0).sin());
    let c = grid(2, 9, -2.0, 2.0);
    let kernel = fspace_kernels::Helmholtz::new(
        Box::new(Rbf::new(1.0, 0.8).unwrap()),
        Box::new(Rbf::new(0.5, 0.8).unwrap()),
    )
    .unwrap();
    let prior = GpPrior::centered(kernel);
    let lik = fspace_core::IsotropicGaussian::new(0.2, 2).unwrap();
    let post = laplace(&net, &lik, &prior, &x, &y, &c, &no_truncation()).unwrap();
    let jac = |p: &DMatrix<f64>| net.jacobian(p).unwrap();
    let (reference, lambda) = dense_reference(&net, jac, &lik, &prior, &x, &y, &c);
    eprintln!("Helmholtz: {:?}", post.report());
    assert_matches_dense(&post, jac, &reference, &lambda, &grid(2, 16, -2.0, 2.0));
    // And the truncated posterior keeps both velocity components below the prior at C.
    let trunc = laplace(&net, &lik, &prior, &x, &y, &c, &FspLaplaceConfig::default()).unwrap();
    let var = trunc.predict(&c).unwrap().var;
    let prior_var = prior.variances(&c).unwrap();
    assert!((0..18).all(|k| var[(k / 2, k % 2)] <= prior_var[k] * (1.0 + 1e-9)));
}

#[test]
fn the_truncation_rule_keeps_every_context_variance_at_or_below_the_prior() {
    // A smooth RBF Gram is numerically low rank; without the rule the tiny precision
    // eigenvalues would blow up the variance. With it every context point obeys the bound.
    let net = mlp(1, 1, 7);
    let x = rand_uniform(30, 1, -1.0, 1.0, &mut rng(3));
    let y = DVector::from_fn(30, |i, _| x[(i, 0)].powi(2));
    let c = grid(1, 40, -2.0, 2.0);
    let prior = GpPrior::centered(Rbf::new(1.5, 0.4).unwrap());
    let lik = Gaussian::new(0.1).unwrap();
    let post = laplace(&net, &lik, &prior, &x, &y, &c, &FspLaplaceConfig::default()).unwrap();
    let var = post.predict(&c).unwrap().var;
    let worst = var.iter().fold(0.0f64, |m, &v| m.max(v / 1.5));
    let rep = post.report();
    eprintln!(
        "truncated {} of {} columns; max var/prior var = {worst:.4}",
        rep.truncated,
        rep.truncated + rep.rank
    );
    assert!(worst <= 1.0 + 1e-9, "a context variance exceeds the prior: ratio {worst}");
    // The rule is minimal: putting back the last dropped column breaks the bound.
    if rep.truncated > 0 {
        let full = laplace(&net, &lik, &prior, &x, &y, &c, &no_truncation()).unwrap();
        let s_full = full.covariance_factor();
        let keep = s_full.columns(rep.truncated - 1, s_full.ncols() - rep.truncated + 1).into_owned();
        let jc = net.jacobian(&c).unwrap() * keep;
        let exceeded = (0..c.nrows()).any(|i| jc.row(i).norm_squared() > 1.5 * (1.0 + 1e-9));
        assert!(exceeded, "one column fewer dropped would also satisfy the bound");
    }
}

#[test]
fn the_data_bound_extension_also_caps_the_variance_at_the_training_inputs() {
    // Coarse context points (5 on [−2, 2]) leave the training inputs between them
    // unconstrained by the paper's rule; `truncate_at_data` adds them to the check.
    let net = mlp(1, 1, 17);
    let x = rand_uniform(40, 1, -1.5, 1.5, &mut rng(9));
    let y = DVector::from_fn(40, |i, _| (3.0 * x[(i, 0)]).sin());
    let c = grid(1, 5, -2.0, 2.0);
    let prior = GpPrior::centered(Matern12::new(1.0, 0.3).unwrap());
    let lik = Gaussian::new(0.5).unwrap();
    let cfg = FspLaplaceConfig { truncate_at_data: true, ..Default::default() };
    let post = laplace(&net, &lik, &prior, &x, &y, &c, &cfg).unwrap();
    let worst_data = post.predict(&x).unwrap().var.max();
    let worst_ctx = post.predict(&c).unwrap().var.max();
    eprintln!(
        "bound at data: max var at data {worst_data:.4}, at context {worst_ctx:.4} (prior 1), {:?}",
        post.report().truncated
    );
    assert!(worst_data <= 1.0 + 1e-9 && worst_ctx <= 1.0 + 1e-9);
}

#[test]
fn kept_kernel_tiles_give_the_matrix_free_posteriors_bits() {
    // 600 context points cross the Gram operator's 512-point tile boundary; two outputs.
    let net = mlp(2, 2, 21);
    let x = rand_uniform(30, 2, -1.0, 1.0, &mut rng(22));
    let y = DVector::from_fn(60, |i, _| (i as f64 * 0.37).sin());
    let c = rand_uniform(600, 2, -2.0, 2.0, &mut rng(23));
    let prior = GpPrior::centered(Independent::new(Rbf::new(1.0, 0.6).unwrap(), 2).unwrap());
    let lik = fspace_core::IsotropicGaussian::new(0.3, 2).unwrap();
    let cfg = FspLaplaceConfig { max_rank: 60, ..Default::default() };
    let kept = laplace(&net, &lik, &prior, &x, &y, &c, &cfg).unwrap();
    let free =
        laplace(&net, &lik, &prior, &x, &y, &c, &FspLaplaceConfig { gram_cache_bytes: 0, ..cfg }).unwrap();
    assert!(same_bits(kept.covariance_factor(), free.covariance_factor()));
    assert_eq!(kept.report(), free.report());
}

#[test]
fn the_training_gradient_equals_finite_differences_of_the_objective() {
    let mut net = mlp(1, 1, 11);
    let xb = rand_uniform(10, 1, -1.0, 1.0, &mut rng(4));
    let yb = DVector::from_fn(10, |i, _| xb[(i, 0)].sin());
    let c = rand_uniform(7, 1, -2.0, 2.0, &mut rng(5));
    let prior = GpPrior::new(Matern12::new(0.8, 0.7).unwrap(), fspace_kernels::PriorMean::Constant(0.3));
    let lik = Gaussian::new(0.2).unwrap();
    let (_, grad) = objective(&net, &lik, &prior, &xb, &yb, 5.0, &c, 1e-10).unwrap();
    let w0 = net.params();
    let fd = fd_gradient(
        |w| {
            let mut n2 = net.clone();
            n2.set_params(&DVector::from_column_slice(w)).unwrap();
            objective(&n2, &lik, &prior, &xb, &yb, 5.0, &c, 1e-10).unwrap().0
        },
        w0.as_slice(),
        1e-5,
    );
    let worst = (0..fd.len()).map(|i| rel_err(grad[i], fd[i], 1e-3)).fold(0.0, f64::max);
    eprintln!("objective gradient vs FD: worst relative error {worst:.2e}");
    assert!(worst < 1e-6, "worst relative error {worst}");
    // The regulariser alone is ½ rᵀ Σ⁻¹ r with r = f(C) − μ.
    let (r, _, jitter) = rkhs_regularizer(&net, &prior, &c, 1e-10).unwrap();
    let resid = net.forward(&c).unwrap().column(0).add_scalar(-0.3);
    let k = gram(&*prior.kernel, &c, &c).unwrap();
    let direct = 0.5 * resid.dot(&(k.try_inverse().unwrap() * &resid));
    assert!(rel_err(r, direct, 1e-12) < 1e-8 && jitter <= 1e-9, "{r} vs {direct} (jitter {jitter})");
    net.set_params(&w0).unwrap();
}

#[test]
fn the_regularizer_with_independent_outputs_equals_the_dense_multi_output_formula() {
    // Σ = K₀ ⊗ I₃ is solved through the scalar Gram; check value and gradient against the dense
    // point-major system and central finite differences.
    let net = mlp(2, 3, 21);
    let c = rand_uniform(9, 2, -2.0, 2.0, &mut rng(8));
    let prior = GpPrior::new(
        Independent::new(Matern12::new(0.8, 0.9).unwrap(), 3).unwrap(),
        fspace_kernels::PriorMean::Constant(0.2),
    );
    let (value, grad, _) = rkhs_regularizer(&net, &prior, &c, 1e-6).unwrap();
    let k = gram(&*prior.kernel, &c, &c).unwrap();
    let eps = 1e-6 * k.diagonal().mean();
    let kj = &k + DMatrix::<f64>::identity(27, 27) * eps;
    let f = net.forward(&c).unwrap();
    let resid = DVector::from_fn(27, |r, _| f[(r / 3, r % 3)] - 0.2);
    let direct = 0.5 * resid.dot(&(kj.try_inverse().unwrap() * &resid));
    assert!(rel_err(value, direct, 1e-12) < 1e-8, "{value} vs {direct}");
    let w0 = net.params();
    let fd = fd_gradient(
        |w| {
            let mut n2 = net.clone();
            n2.set_params(&DVector::from_column_slice(w)).unwrap();
            rkhs_regularizer(&n2, &prior, &c, 1e-6).unwrap().0
        },
        w0.as_slice(),
        1e-5,
    );
    let worst = (0..fd.len()).map(|i| rel_err(grad[i], fd[i], 1e-3)).fold(0.0, f64::max);
    assert!(worst < 1e-6, "worst relative error {worst}");
}

#[test]
fn the_posterior_is_consistent_and_samples_have_its_covariance() {
    let net = mlp(1, 1, 13);
    let x = rand_uniform(25, 1, -1.0, 1.0, &mut rng(6));
    let y = DVector::from_fn(25, |i, _| x[(i, 0)]);
    let c = grid(1, 20, -2.0, 2.0);
    let prior = GpPrior::centered(Matern12::new(1.0, 0.5).unwrap());
    let post = laplace(&net, &Gaussian::new(0.2).unwrap(), &prior, &x, &y, &c, &FspLaplaceConfig::default())
        .unwrap();
    let xt = grid(1, 7, -3.0, 3.0);
    let pred = post.predict(&xt).unwrap();
    let (mean, cov) = post.predict_joint(&xt).unwrap();
    assert!(rel_frob(&pred.mean, &net.forward(&xt).unwrap()) < 1e-14 && rel_frob(&mean, &pred.mean) < 1e-14);
    for i in 0..7 {
        assert!(rel_err(cov[(i, i)], pred.var[(i, 0)], 1e-14) < 1e-10);
    }
    // 20 000 linearised samples: empirical covariance within MC error of the joint covariance.
    let samples = post.sample_functions(&xt, 20_000, &mut rng(7)).unwrap();
    let mut emp = DMatrix::zeros(7, 7);
    for s in &samples {
        let d = s.column(0) - mean.column(0);
        emp += &d * d.transpose();
    }
    emp /= samples.len() as f64;
    let err = rel_frob(&emp, &cov);
    eprintln!("sample covariance rel. error {err:.3}");
    assert!(err < 0.05, "sample covariance off by {err}");
}

#[test]
fn bad_input_is_a_typed_error() {
    let net = mlp(1, 1, 0);
    let x = DMatrix::from_row_slice(3, 1, &[0.0, 0.5, 1.0]);
    let y = DVector::from_vec(vec![0.0, 1.0, 0.0]);
    let c = grid(1, 5, -1.0, 1.0);
    let prior = GpPrior::centered(Rbf::new(1.0, 0.5).unwrap());
    let lik = Gaussian::new(0.1).unwrap();
    // Targets vs inputs, context dimension, prior/likelihood outputs, NaN data, bad options.
    assert!(matches!(
        laplace(&net, &lik, &prior, &x, &DVector::zeros(2), &c, &FspLaplaceConfig::default()),
        Err(FspError::Input(InputError::DimensionMismatch { .. }))
    ));
    assert!(laplace(&net, &lik, &prior, &x, &y, &DMatrix::zeros(4, 2), &FspLaplaceConfig::default()).is_err());
    let two = GpPrior::centered(Independent::new(Rbf::new(1.0, 0.5).unwrap(), 2).unwrap());
    assert!(matches!(
        laplace(&net, &lik, &two, &x, &y, &c, &FspLaplaceConfig::default()),
        Err(FspError::Kernel(fspace_kernels::KernelError::Input(InputError::DimensionMismatch {
            expected: 1,
            found: 2,
            ..
        })))
    ));
    assert!(laplace(&net, &Categorical::new(2).unwrap(), &prior, &x, &y, &c, &FspLaplaceConfig::default())
        .is_err());
    let mut bad = x.clone();
    bad[(1, 0)] = f64::NAN;
    assert!(laplace(&net, &lik, &prior, &bad, &y, &c, &FspLaplaceConfig::default()).is_err());
    let cfg = FspLaplaceConfig { rank_rtol: 0.0, ..Default::default() };
    assert!(matches!(
        laplace(&net, &lik, &prior, &x, &y, &c, &cfg),
        Err(FspError::Input(InputError::Invalid { .. }))
    ));
    let cfg = FspLaplaceConfig { max_rank: 0, ..Default::default() };
    assert!(matches!(
        laplace(&net, &lik, &prior, &x, &y, &c, &cfg),
        Err(FspError::Input(InputError::Invalid { .. }))
    ));
    for jitter in [-1e-3, f64::NAN, f64::INFINITY] {
        let cfg = FspLaplaceConfig { prior_jitter: jitter, ..Default::default() };
        assert!(matches!(
            laplace(&net, &lik, &prior, &x, &y, &c, &cfg),
            Err(FspError::Input(InputError::Invalid { what: "prior_jitter", .. }))
        ));
    }
    // A jittered Σ(C, C) is full rank, so Alg. 2 keeps at least as many directions.
    let plain = laplace(&net, &lik, &prior, &x, &y, &c, &FspLaplaceConfig::default()).unwrap();
    let jittered = laplace(
        &net,
        &lik,
        &prior,
        &x,
        &y,
        &c,
        &FspLaplaceConfig { prior_jitter: 1e-3, ..Default::default() },
    )
    .unwrap();
    assert!(jittered.report().rank >= plain.report().rank);
    for scale in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        let cfg = FspLaplaceConfig { ggn_scale: scale, ..Default::default() };
        assert!(matches!(
            laplace(&net, &lik, &prior, &x, &y, &c, &cfg),
            Err(FspError::Input(InputError::Invalid { .. }))
        ));
    }
    // Training: zero context points, bad jitter, context sampler of the wrong dimension.
    let sampler = fspace_context::UniformSampler::new(BoundingBox::cube(1, -2.0, 2.0).unwrap());
    let opts = TrainOptions { n_context: 0, ..Default::default() };
    let mut l2 = lik;
    assert!(train(&mut net.clone(), &mut l2, &prior, &x, &y, None, &sampler, &opts, |_| {}).is_err());
    let opts = TrainOptions { context_jitter: -1.0, ..Default::default() };
    assert!(train(&mut net.clone(), &mut l2, &prior, &x, &y, None, &sampler, &opts, |_| {}).is_err());
    let wide = fspace_context::UniformSampler::new(BoundingBox::cube(2, -2.0, 2.0).unwrap());
    assert!(train(&mut net.clone(), &mut l2, &prior, &x, &y, None, &wide, &TrainOptions::default(), |_| {})
        .is_err());
    // A kernel with the wrong input dimension is caught before any work.
    let ard = GpPrior::centered(Rbf::ard(1.0, vec![0.5, 0.5]).unwrap());
    assert!(laplace(&net, &lik, &ard, &x, &y, &c, &FspLaplaceConfig::default()).is_err());
    // Grid designs need m^d points.
    assert!(context_points(ContextDesign::Grid, &BoundingBox::cube(2, 0.0, 1.0).unwrap(), 10, 0).is_err());
    // The dataset context: design rows first, then the data rows; columns must agree.
    let design = DMatrix::from_row_slice(2, 2, &[0.0, 1.0, 2.0, 3.0]);
    let data = DMatrix::from_row_slice(1, 2, &[4.0, 5.0]);
    assert_eq!(
        with_data_points(&design, &data).unwrap(),
        DMatrix::from_row_slice(3, 2, &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0])
    );
    assert!(matches!(
        with_data_points(&design, &DMatrix::zeros(1, 3)),
        Err(FspError::Input(InputError::DimensionMismatch { .. }))
    ));
    let _ = TrainConfig::default();
}

#[test]
fn training_pulls_the_network_towards_the_prior_away_from_the_data() {
    // Alg. 1 end to end on the sine toy: with the RKHS term the net fits the data and stays
    // much closer to the zero prior mean outside it than the same net trained by plain
    // maximum likelihood, which extrapolates freely.
    let data = fspace_data::sine(100, 0.1, &mut rng(8)).unwrap();
    let prior = GpPrior::centered(Rbf::new(1.0, 0.25).unwrap());
    let sampler = fspace_context::UniformSampler::new(BoundingBox::cube(1, -2.0, 2.0).unwrap());
    let train_cfg = TrainConfig {
        schedule: fspace_core::Schedule::epochs(2500),
        batch_size: 100,
        learning_rate: 1e-2,
        ..Default::default()
    };
    let opts = TrainOptions { train: train_cfg.clone(), ..Default::default() };
    let new_net = || {
        Mlp::new(MlpConfig {
            input_dim: 1,
            hidden: vec![50, 50],
            output_dim: 1,
            activation: Activation::Tanh,
            seed: 0,
        })
        .unwrap()
    };
    let mut net = new_net();
    train(
        &mut net,
        &mut Gaussian::new(0.1).unwrap(),
        &prior,
        &data.x,
        &data.y_vec(),
        None,
        &sampler,
        &opts,
        |_| {},
    )
    .unwrap();
    let mut map = new_net();
    fspace_nn::train_map(
        &mut map,
        &mut Gaussian::new(0.1).unwrap(),
        &data.x,
        &data.y_vec(),
        None,
        None,
        &train_cfg,
        |_| {},
    )
    .unwrap();
    let far =
        DMatrix::from_fn(
            40,
            1,
            |i, _| if i < 20 { -2.0 + 0.04 * i as f64 } else { 1.24 + 0.04 * (i - 20) as f64 },
        );
    let mean_abs = |n: &Mlp| n.forward(&far).unwrap().iter().map(|v| v.abs()).sum::<f64>() / 40.0;
    let rmse = ((net.forward(&data.x).unwrap().column(0) - data.y_vec()).norm_squared() / 100.0).sqrt();
    let (fsp_far, map_far) = (mean_abs(&net), mean_abs(&map));
    eprintln!("FSP fit RMSE {rmse:.3}; mean |f| on |x| ≥ 1.2: FSP {fsp_far:.3}, plain MAP {map_far:.3}");
    assert!(rmse < 0.15, "RMSE {rmse}");
    assert!(fsp_far < 0.25 * map_far, "far field: FSP {fsp_far}, MAP {map_far}");
}

#[test]
fn ggn_scale_equals_repeating_the_data() {
    // The data term with `ggn_scale = 3` must equal the term of the data repeated three times:
    // the same precision eigenvalues and factor (independent of how the scale is applied).
    let net = mlp(2, 2, 4);
    let x = rand_uniform(10, 2, -1.0, 1.0, &mut rng(7));
    let y = DVector::from_fn(10, |i, _| (x[(i, 0)] + x[(i, 1)] > 0.0) as u8 as f64);
    let x3 = DMatrix::from_fn(30, 2, |i, j| x[(i % 10, j)]);
    let y3 = DVector::from_fn(30, |i, _| y[i % 10]);
    let c = grid(2, 9, -3.0, 3.0);
    let prior = GpPrior::centered(Independent::new(Matern12::new(2.0, 1.0).unwrap(), 2).unwrap());
    let lik = Categorical::new(2).unwrap();
    let scaled = FspLaplaceConfig { ggn_scale: 3.0, ..no_truncation() };
    let a = laplace(&net, &lik, &prior, &x, &y, &c, &scaled).unwrap();
    let b = laplace(&net, &lik, &prior, &x3, &y3, &c, &no_truncation()).unwrap();
    let plain = laplace(&net, &lik, &prior, &x, &y, &c, &no_truncation()).unwrap();
    let (ea, eb) = (&a.report().precision_eigenvalues, &b.report().precision_eigenvalues);
    assert_eq!(ea.len(), eb.len());
    for (u, v) in ea.iter().zip(eb) {
        assert!((u - v).abs() <= 1e-9 * v.abs().max(1e-12), "{u} vs {v}");
    }
    let (sa, sb) = (a.covariance_factor(), b.covariance_factor());
    let cov_err = rel_frob(&(sa * sa.transpose()), &(sb * sb.transpose()));
    assert!(cov_err < 1e-8, "covariance: {cov_err}");
    // And the scale does something: the unscaled posterior is wider.
    let sp = plain.covariance_factor();
    assert!((sp * sp.transpose()).trace() > (sa * sa.transpose()).trace() * 1.01);
}

#[test]
fn fit_learns_sigma_when_the_spec_says_so_and_the_posterior_round_trips() {
    let data = fspace_data::sine(40, 0.1, &mut rng(3)).unwrap();
    let prior = GpPrior::centered(Rbf::new(1.0, 0.5).unwrap());
    let config = FspConfig {
        schedule: fspace_core::Schedule::epochs(60),
        batch_size: 20,
        learning_rate: 1e-2,
        n_context: 20,
        n_laplace_context: 30,
        ..Default::default()
    };
    let train = Data::new(&data.x, &data.y).unwrap();
    let fixed = fit(mlp(1, 1, 4), LikelihoodSpec::gaussian(0.5), &prior, &train, &config).unwrap().report;
    assert_eq!(fixed.likelihood, LikelihoodSpec::gaussian(0.5));
    // The observer sees every epoch of Alg. 1.
    let mut epochs = Vec::new();
    let Fitted { posterior: post, report: learned } = fit_observed(
        mlp(1, 1, 4),
        LikelihoodSpec::gaussian_learned(0.5),
        &prior,
        &train,
        &config,
        &mut |p: &Progress| epochs.push((p.step, p.total)),
    )
    .unwrap();
    assert_eq!(epochs, (1..=60).map(|e| (e, 60)).collect::<Vec<_>>());
    let sigma = learned.likelihood.noise_std().unwrap();
    assert!(sigma < 0.45, "σ learned from 0.5 on data with noise 0.1: {sigma}");
    assert!(learned.likelihood.learns_noise());
    // A likelihood that does not fit the network is refused before training.
    assert!(fit(mlp(1, 1, 4), LikelihoodSpec::categorical(3), &prior, &train, &config).is_err());

    let path = std::env::temp_dir().join(format!("fspace-fsp-{}.json", std::process::id()));
    post.save(&path).unwrap();
    let back = FspLaplace::<Mlp>::load(&path).unwrap();
    let xt = DMatrix::from_column_slice(4, 1, &[-2.0, 0.0, 1.0, 4.0]);
    assert_eq!(back.predict(&xt).unwrap(), post.predict(&xt).unwrap());
    let draw = |p: &FspLaplace<Mlp>| p.sample_functions(&xt, 2, &mut rng(1)).unwrap();
    assert_eq!(draw(&back), draw(&post));
    std::fs::remove_file(&path).ok();
}

/// The `Dataset` design draws Alg. 2's context from the training inputs: the post-hoc
/// posterior is Alg. 2 at the rows a `DatasetSampler` seeded by `design_seed` draws.
#[test]
fn the_dataset_design_takes_its_context_from_the_training_inputs() {
    use rand::SeedableRng;
    let data = fspace_data::sine(30, 0.1, &mut rng(8)).unwrap();
    let prior = GpPrior::centered(Rbf::new(1.0, 0.5).unwrap());
    let net = mlp(1, 1, 9);
    let lik = LikelihoodSpec::gaussian(0.2);
    let train = Data::new(&data.x, &data.y).unwrap();
    let config = FspConfig {
        design: ContextDesign::Dataset,
        n_laplace_context: 12,
        design_seed: 4,
        ..Default::default()
    };
    let post = fit_posthoc(net.clone(), lik, &prior, &train, &config).unwrap().posterior;
    let mut draw = rand::rngs::StdRng::seed_from_u64(4);
    let rows = fspace_context::DatasetSampler::new(data.x.clone()).unwrap().sample(12, &mut draw).unwrap();
    assert!(rows.row_iter().all(|r| data.x.row_iter().any(|x| x == r)), "context rows are training rows");
    let gauss = Gaussian::new(0.2).unwrap();
    let direct =
        laplace(&net, &gauss, &prior, &data.x, &data.y.column(0).into_owned(), &rows, &config.laplace)
            .unwrap();
    let xt = DMatrix::from_column_slice(5, 1, &[-3.0, -1.0, 0.0, 1.5, 4.0]);
    assert_eq!(post.predict(&xt).unwrap(), direct.predict(&xt).unwrap());
    // More rows than the data hold, and a box alone, are refused.
    let many = FspConfig { n_laplace_context: 31, ..config };
    assert!(fit_posthoc(net, lik, &prior, &train, &many).is_err());
    assert!(context_points(ContextDesign::Dataset, &BoundingBox::cube(1, 0.0, 1.0).unwrap(), 5, 0).is_err());
}

/// Context-point counts no machine could hold are refused at once with
/// `InputError::TooLarge` naming the structure and a cheaper setting — before Alg. 1 trains or
/// Alg. 2 draws a single point (10⁹ points would take minutes to sample).
#[test]
fn context_sizes_past_the_memory_budget_are_refused_before_any_work() {
    // Where the machine's available memory is unknown (not Linux) there is no budget: set one.
    if fspace_input::budget::limit().is_none() {
        fspace_input::budget::set_limit(Some(1 << 40));
    }
    let mut r = rng(3);
    let x = rand_uniform(20, 1, -1.0, 1.0, &mut r);
    let y = x.map(|v| v.sin());
    let data = fspace_core::Data::new(&x, &y).unwrap();
    let prior = GpPrior::centered(Rbf::new(1.0, 0.5).unwrap());
    let lik = fspace_core::LikelihoodSpec::gaussian(0.1);
    let start = std::time::Instant::now();
    let config = FspConfig { n_laplace_context: 1_000_000_000, ..Default::default() };
    let err = fit_posthoc(mlp(1, 1, 0), lik, &prior, &data, &config).unwrap_err();
    match &err {
        FspError::Input(InputError::TooLarge { what, cheaper, .. }) => {
            assert!(what.contains("Alg. 2") && cheaper.contains("n_laplace_context"), "{err}");
        }
        other => panic!("expected TooLarge, got {other}"),
    }
    let config = FspConfig { n_context: 10_000_000, ..Default::default() };
    let err = fit(mlp(1, 1, 0), lik, &prior, &data, &config).unwrap_err();
    assert!(
        matches!(&err, FspError::Input(InputError::TooLarge { what, .. }) if what.contains("Alg. 1")),
        "{err}"
    );
    assert!(start.elapsed().as_secs_f64() < 1.0, "refused only after {:?}", start.elapsed());
}

/// Post-hoc FSP-Laplace over two shards of the data, the parts of Alg. 2's sum added by the
/// reduce step, is the single-process posterior (to rounding: the sum's order differs), and
/// the reduce step sees the same basis fingerprint on both shards.
#[test]
fn a_sharded_posthoc_fit_is_the_single_process_one() {
    let mut r = rng(11);
    let x = rand_uniform(60, 1, -1.0, 1.0, &mut r);
    let y = x.map(|v| (3.0 * v).sin());
    let prior = GpPrior::centered(Rbf::new(1.0, 0.4).unwrap());
    let lik = fspace_core::LikelihoodSpec::gaussian(0.1);
    let bbox = BoundingBox::from_data(&x, 0.5).unwrap();
    let config = FspConfig { context_box: Some(bbox), n_laplace_context: 40, ..Default::default() };
    let net = mlp(1, 1, 4);
    let whole =
        fit_posthoc(net.clone(), lik, &prior, &fspace_core::Data::new(&x, &y).unwrap(), &config).unwrap();
    let shard = |rows: std::ops::Range<usize>| {
        let xs = x.rows(rows.start, rows.len()).into_owned();
        let ys = y.rows(rows.start, rows.len()).into_owned();
        (xs, ys)
    };
    let (xa, ya) = shard(0..37);
    let (xb, yb) = shard(37..60);
    // Shard A's part, recorded by a reduce step that returns it unchanged.
    let mut part_a = None;
    let mut fingerprint_a = Vec::new();
    let mut record = |a: DMatrix<f64>, f: &[f64]| {
        part_a = Some(a.clone());
        fingerprint_a = f.to_vec();
        Ok(a)
    };
    fit_posthoc_sharded(
        net.clone(),
        lik,
        &prior,
        &fspace_core::Data::new(&xa, &ya).unwrap(),
        &config,
        &mut record,
    )
    .unwrap();
    let part_a = part_a.unwrap();
    let mut add_a = |b: DMatrix<f64>, f: &[f64]| {
        assert_eq!(f, fingerprint_a.as_slice(), "the basis differs between the shards");
        Ok(b + &part_a)
    };
    let sharded = fit_posthoc_sharded(
        net.clone(),
        lik,
        &prior,
        &fspace_core::Data::new(&xb, &yb).unwrap(),
        &config,
        &mut add_a,
    )
    .unwrap();
    let grid = DMatrix::from_fn(9, 1, |i, _| -1.5 + 0.375 * i as f64);
    let (m1, c1) = fspace_core::Posterior::predict_joint(&whole.posterior, &grid).unwrap();
    let (m2, c2) = fspace_core::Posterior::predict_joint(&sharded.posterior, &grid).unwrap();
    assert!(
        rel_frob(&m2, &m1) < 1e-12 && rel_frob(&c2, &c1) < 1e-12,
        "{} {}",
        rel_frob(&m2, &m1),
        rel_frob(&c2, &c1)
    );
    // What a sharded fit cannot share is refused.
    let data = fspace_core::Data::new(&xa, &ya).unwrap();
    let mut identity = |a: DMatrix<f64>, _: &[f64]| Ok(a);
    for (bad, what) in [
        (FspConfig { context_box: None, ..config.clone() }, "context_box"),
        (FspConfig { context_includes_data: true, ..config.clone() }, "context points"),
    ] {
        let err = fit_posthoc_sharded(net.clone(), lik, &prior, &data, &bad, &mut identity).unwrap_err();
        assert!(err.to_string().contains(what), "{err}");
    }
    let bad = FspConfig {
        laplace: FspLaplaceConfig { truncate_at_data: true, ..config.laplace.clone() },
        ..config.clone()
    };
    assert!(fit_posthoc_sharded(net, lik, &prior, &data, &bad, &mut identity).is_err());
}

/// Post-hoc FSP-Laplace over batches — steps 1–3 from the context points alone
/// (`posthoc_basis`), step 4's sum added batch by batch and merged across two "loaders", steps
/// 5–6 on the total — is `fit_posthoc` over all the points (to rounding: the sum's order
/// differs), classification included; sums taken in another basis and batches the likelihood
/// does not take are refused, and a refused batch leaves the sum as it was.
#[test]
fn a_posthoc_fit_over_batches_is_the_fit_over_all_the_points() {
    let mut r = rng(12);
    let x = rand_uniform(70, 2, -1.0, 1.0, &mut r);
    let regression = DMatrix::from_fn(70, 1, |i, _| (3.0 * x[(i, 0)]).sin() + x[(i, 1)]);
    let classes = DMatrix::from_fn(70, 1, |i, _| if x[(i, 0)] + x[(i, 1)] > 0.0 { 1.0 } else { 0.0 });
    let prior = |q| GpPrior::centered(Independent::new(Rbf::new(1.0, 0.6).unwrap(), q).unwrap());
    for (lik, y, q) in
        [(LikelihoodSpec::gaussian(0.1), &regression, 1), (LikelihoodSpec::categorical(2), &classes, 2)]
    {
        let prior = prior(q);
        let net = mlp(2, q, 5);
        let config = FspConfig {
            context_box: Some(BoundingBox::from_data(&x, 0.5).unwrap()),
            design: ContextDesign::Halton,
            n_laplace_context: 30,
            laplace: FspLaplaceConfig { data_batch: 16, ..Default::default() },
            ..Default::default()
        };
        let whole = fit_posthoc(net.clone(), lik, &prior, &Data::new(&x, y).unwrap(), &config).unwrap();
        let built = lik.build().unwrap();
        let basis = posthoc_basis(&net, &prior, &config).unwrap();
        let mut sums = [basis.zero_sum(), basis.zero_sum()];
        for (s0, s1, which) in [(0, 9, 0), (9, 40, 1), (40, 41, 0), (41, 70, 1)] {
            let xb = x.rows(s0, s1 - s0).into_owned();
            let yb = DVector::from_column_slice(y.rows(s0, s1 - s0).into_owned().as_slice());
            basis.add(&mut sums[which], built.as_ref(), &xb, &yb).unwrap();
        }
        let [mut first, second] = sums;
        // Batches the likelihood refuses (a target count that differs; class 5 of 2) leave the
        // sum as it was.
        let before = first.clone();
        let x3 = x.rows(0, 3).into_owned();
        assert!(basis.add(&mut first, built.as_ref(), &x3, &DVector::zeros(2)).is_err());
        assert_eq!(first, before);
        if q == 2 {
            assert!(basis.add(&mut first, built.as_ref(), &x3, &DVector::from_element(3, 5.0)).is_err());
            assert_eq!(first, before);
        }
        first.merge(&second).unwrap();
        assert_eq!(first.points(), 70);
        let streamed = basis.clone().finish(&prior, &first, None).unwrap().with_likelihood(lik).unwrap();
        let test = rand_uniform(7, 2, -1.5, 1.5, &mut r);
        let (m1, c1) = Posterior::predict_joint(&whole.posterior, &test).unwrap();
        let (m2, c2) = Posterior::predict_joint(&streamed, &test).unwrap();
        assert_eq!(m1, m2);
        assert!(rel_frob(&c2, &c1) < 1e-11, "{}", rel_frob(&c2, &c1));
        let (a, b) = (streamed.report(), whole.posterior.report());
        assert_eq!(
            (a.range_rank, a.rank, a.truncated, a.lanczos_rank),
            (b.range_rank, b.rank, b.truncated, b.lanczos_rank)
        );
        for (ea, eb) in a.precision_eigenvalues.iter().zip(&b.precision_eigenvalues) {
            assert!(rel_err(*ea, *eb, 1e-300) < 1e-10, "{ea} {eb}");
        }

        // Sums from another basis (other weights) neither merge nor finish.
        let other = posthoc_basis(&mlp(2, q, 6), &prior, &config).unwrap();
        let mut foreign = other.zero_sum();
        assert!(foreign.merge(&first).is_err());
        assert!(basis
            .add(&mut foreign, built.as_ref(), &x, &DVector::from_column_slice(y.as_slice()))
            .is_err());
        assert!(basis.clone().finish(&prior, &other.zero_sum(), None).is_err());
        // What needs the data whole is refused up front.
        for (bad, what) in [
            (FspConfig { context_box: None, ..config.clone() }, "context_box"),
            (FspConfig { design: ContextDesign::Dataset, ..config.clone() }, "context points"),
            (FspConfig { context_includes_data: true, ..config.clone() }, "context points"),
        ] {
            let err = posthoc_basis(&net, &prior, &bad).unwrap_err();
            assert!(err.to_string().contains(what), "{err}");
        }
    }
}

/// `fit_sharded` on `world` threads: process `r` holds the training rows `bounds[r]..bounds[r+1]`
/// and, if `r == 0`, the validation set.
#[allow(clippy::too_many_arguments)]
fn sharded_fsp(
    net: &Mlp,
    lik: fspace_core::LikelihoodSpec,
    prior: &GpPrior,
    (x, y): (&DMatrix<f64>, &DMatrix<f64>),
    (xv, yv): (&DMatrix<f64>, &DMatrix<f64>),
    bounds: &[usize],
    config: &FspConfig,
    bad_targets_on: Option<usize>,
) -> Vec<Result<Fitted<FspLaplace<Mlp>, FitSummary>>> {
    let world = bounds.len() - 1;
    let reducer = fspace_testutil::ThreadReduce::new(world);
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..world)
            .map(|rank| {
                let reducer = &reducer;
                scope.spawn(move || {
                    let (s, e) = (bounds[rank], bounds[rank + 1]);
                    let xs = x.rows(s, e - s).into_owned();
                    let mut ys = y.rows(s, e - s).into_owned();
                    if bad_targets_on == Some(rank) {
                        ys.fill(f64::NAN);
                    }
                    let mut reduce = |part, failed| reducer.sum::<FspError>(rank, part, failed);
                    let shard = fspace_core::ProcessShard { rank, world, reduce: &mut reduce };
                    // A NaN target is refused by Data::new: the process tells the others itself.
                    let data = match fspace_core::Data::new(&xs, &ys) {
                        Ok(d) => d,
                        Err(e) => {
                            let _ = (shard.reduce)(DVector::zeros(2 * world), true);
                            return Err(e.into());
                        }
                    };
                    let data = if rank == 0 { data.with_validation(xv, yv)? } else { data };
                    fit_sharded(net.clone(), lik, prior, &data, config, shard, &mut fspace_core::Silent)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// FSP-Laplace (Alg. 1 then Alg. 2) over 2 and 3 "processes" (threads; uneven contiguous
/// shards of 61 points, validation on one process, σ learned, early stopping): every process
/// trains the single-process weights and σ (to 1e-10: the sums' order) after the same steps,
/// and its posterior is the single-process Alg. 2 at those weights (to 1e-10); the processes'
/// posteriors are the same bits. (Alg. 2 itself moves by 1e-4 for a one-ulp change of the
/// weights at these settings — the prior's pseudo-inverse at 30 context points — so the
/// sharded posterior is compared at the weights it was taken at.) A process with bad data
/// fails with its error and the others with the reduce's.
#[test]
fn a_sharded_fsp_laplace_fit_is_the_single_process_one() {
    let mut r = rng(31);
    let x = rand_uniform(61, 1, -1.0, 1.0, &mut r);
    let y = x.map(|v| (3.0 * v).sin()) + rand_uniform(61, 1, -0.1, 0.1, &mut r);
    let xv = rand_uniform(17, 1, -1.0, 1.0, &mut r);
    let yv = xv.map(|v| (3.0 * v).sin());
    let prior = GpPrior::centered(Rbf::new(1.0, 0.4).unwrap());
    let lik = fspace_core::LikelihoodSpec::gaussian_learned(0.3);
    let config = FspConfig {
        context_box: Some(BoundingBox::from_data(&x, 0.5).unwrap()),
        n_context: 12,
        n_laplace_context: 30,
        batch_size: 16,
        learning_rate: 1e-2,
        schedule: fspace_core::Schedule::steps(60).every_steps(10).patience(2),
        ..Default::default()
    };
    let net = mlp(1, 1, 32);
    let data = fspace_core::Data::new(&x, &y).unwrap().with_validation(&xv, &yv).unwrap();
    let whole = fit(net.clone(), lik, &prior, &data, &config).unwrap();
    let sigma = |s: &FitSummary| s.likelihood.noise_std().unwrap();
    let grid = DMatrix::from_fn(9, 1, |i, _| -1.5 + 0.375 * i as f64);
    for bounds in [vec![0, 30, 61], vec![0, 5, 40, 61]] {
        let what = format!("{} processes", bounds.len() - 1);
        let fits: Vec<_> = sharded_fsp(&net, lik, &prior, (&x, &y), (&xv, &yv), &bounds, &config, None)
            .into_iter()
            .map(Result::unwrap)
            .collect();
        for got in &fits {
            assert_eq!(got.report.train.steps, whole.report.train.steps, "{what}");
            assert_eq!(got.report.train.best_step, whole.report.train.best_step, "{what}");
            let (w1, w2) = (whole.posterior.network().params(), got.posterior.network().params());
            assert!((&w2 - &w1).amax() < 1e-10 * w1.amax(), "{what}: weights differ");
            assert!((sigma(&got.report) - sigma(&whole.report)).abs() < 1e-10, "{what}: σ differs");
            // Alg. 2 in one process at the weights and σ the sharded training gave.
            let at_these = fit_posthoc(
                got.posterior.network().clone(),
                fspace_core::LikelihoodSpec::gaussian(sigma(&got.report)),
                &prior,
                &fspace_core::Data::new(&x, &y).unwrap(),
                &config,
            )
            .unwrap();
            let (m1, c1) = fspace_core::Posterior::predict_joint(&at_these.posterior, &grid).unwrap();
            let (m2, c2) = fspace_core::Posterior::predict_joint(&got.posterior, &grid).unwrap();
            let (em, ec) = (rel_frob(&m2, &m1), rel_frob(&c2, &c1));
            assert!(em < 1e-10 && ec < 1e-10, "{what}: mean {em:e}, covariance {ec:e}");
            let (_, c0) = fspace_core::Posterior::predict_joint(&fits[0].posterior, &grid).unwrap();
            assert!(same_bits(&c2, &c0), "{what}: the processes' posteriors differ");
        }
    }
    let results = sharded_fsp(&net, lik, &prior, (&x, &y), (&xv, &yv), &[0, 30, 61], &config, Some(1));
    assert!(results[0].as_ref().err().unwrap().to_string().contains("another process failed"));
    assert!(!results[1].as_ref().err().unwrap().to_string().contains("another process"));
    // What the processes cannot share is refused on every process, none waiting.
    let bad = FspConfig { context_box: None, ..config.clone() };
    for result in sharded_fsp(&net, lik, &prior, (&x, &y), (&xv, &yv), &[0, 30, 61], &bad, None) {
        assert!(result.err().unwrap().to_string().contains("context_box"));
    }
}

/// FSP-Laplace (Alg. 1 and Alg. 2) over rows read by position is the in-memory fit: the same
/// minibatches give the same weights to the bit, Alg. 2's sum over `data_batch` chunks in order
/// is the in-memory sum, so the posterior is the same to the bit; no read is larger than one
/// minibatch or one of Alg. 2's chunks. With a validation set (read in chunks) the early
/// stopping picks the same step. A corrupt row (a NaN target, a class out of range) is a typed
/// error naming it, and what needs the data whole is refused.
#[test]
fn a_fit_over_rows_read_by_position_is_the_in_memory_fit() {
    let mut r = rng(21);
    let x = rand_uniform(90, 2, -1.0, 1.0, &mut r);
    let xv = rand_uniform(25, 2, -1.0, 1.0, &mut r);
    let f = |x: &DMatrix<f64>| DMatrix::from_fn(x.nrows(), 1, |i, _| (3.0 * x[(i, 0)]).sin() + x[(i, 1)]);
    let classes =
        |x: &DMatrix<f64>| DMatrix::from_fn(x.nrows(), 1, |i, _| f64::from(x[(i, 0)] + x[(i, 1)] > 0.0));
    let prior = |q| GpPrior::centered(Independent::new(Rbf::new(1.0, 0.6).unwrap(), q).unwrap());
    for (lik, y, yv, q) in [
        (LikelihoodSpec::gaussian_learned(0.3), f(&x), f(&xv), 1),
        (LikelihoodSpec::categorical(2), classes(&x), classes(&xv), 2),
    ] {
        let prior = prior(q);
        let net = mlp(2, q, 5);
        let config = FspConfig {
            schedule: fspace_core::Schedule::epochs(6),
            batch_size: 16,
            n_context: 20,
            context_box: Some(BoundingBox::from_data(&x, 0.5).unwrap()),
            design: ContextDesign::Halton,
            n_laplace_context: 30,
            laplace: FspLaplaceConfig { data_batch: 32, ..Default::default() },
            ..Default::default()
        };
        let test = rand_uniform(7, 2, -1.5, 1.5, &mut r);
        let data = Data::new(&x, &y).unwrap();
        let whole = fit(net.clone(), lik, &prior, &data, &config).unwrap();
        let mut rows = CountingRows::new(&x, &y);
        let streamed =
            fit_rows(net.clone(), lik, &prior, &mut rows, None, &config, &mut fspace_core::Silent).unwrap();
        let (w1, w2) = (whole.posterior.network().params(), streamed.posterior.network().params());
        assert!(w1.iter().zip(w2.iter()).all(|(a, b)| a.to_bits() == b.to_bits()));
        let (m1, c1) = Posterior::predict_joint(&whole.posterior, &test).unwrap();
        let (m2, c2) = Posterior::predict_joint(&streamed.posterior, &test).unwrap();
        assert!(same_bits(&c1, &c2), "{}", rel_frob(&c2, &c1));
        assert!(m1.iter().zip(m2.iter()).all(|(a, b)| a.to_bits() == b.to_bits()));
        assert_eq!(whole.report.likelihood, streamed.report.likelihood);
        assert_eq!(rows.largest_read, 32, "one minibatch (16) or one of Alg. 2's chunks (32) at a time");
        assert_eq!(rows.read, 6 * 90 + 90, "six epochs and Alg. 2's pass");

        // Early stopping on a validation set read in chunks: the same steps as the one-pass sum.
        let early =
            FspConfig { schedule: fspace_core::Schedule::epochs(8).with_patience(Some(2)), ..config.clone() };
        let whole = fit(net.clone(), lik, &prior, &data.with_validation(&xv, &yv).unwrap(), &early).unwrap();
        let mut rows = CountingRows::new(&x, &y);
        let mut val = CountingRows::new(&xv, &yv);
        let streamed =
            fit_rows(net.clone(), lik, &prior, &mut rows, Some(&mut val), &early, &mut fspace_core::Silent)
                .unwrap();
        assert_eq!(whole.report.train.best_step, streamed.report.train.best_step);
        assert_eq!(whole.report.train.steps, streamed.report.train.steps);
        for (a, b) in whole.report.train.history.iter().zip(&streamed.report.train.history) {
            let (va, vb) = (a.validation_loss.unwrap(), b.validation_loss.unwrap());
            assert!(rel_err(va, vb, 1e-300) < 1e-12, "{va} {vb}");
        }
        assert!(val.largest_read <= 16);

        // A corrupt row is refused with the set and the reason named.
        let (value, says) = if q == 1 { (f64::NAN, "training targets") } else { (5.0, "invalid target") };
        let mut rows = CountingRows::new(&x, &y);
        rows.bad = Some((37, value));
        let err = fit_rows(net.clone(), lik, &prior, &mut rows, None, &config, &mut fspace_core::Silent)
            .unwrap_err();
        assert!(err.to_string().contains(says), "{err}");
        // What needs the data whole is refused before any read.
        for (bad, what) in [
            (FspConfig { context_box: None, ..config.clone() }, "context_box"),
            (FspConfig { design: ContextDesign::Dataset, ..config.clone() }, "context points"),
            (FspConfig { context_includes_data: true, ..config.clone() }, "context points"),
        ] {
            let mut rows = CountingRows::new(&x, &y);
            let err = fit_rows(net.clone(), lik, &prior, &mut rows, None, &bad, &mut fspace_core::Silent)
                .unwrap_err();
            assert!(err.to_string().contains(what), "{err}");
            assert_eq!(rows.read, 0);
        }
    }
}
