//! Unit tests of the per-point (heteroscedastic) noise that only the Milios et al. classifiers
//! use, so it is not part of the public entry points (beside the public entry on the same data).

use fspace_core::Posterior;
use fspace_kernels::{gram, Helmholtz, KernelBase, Matern52, PriorMean, Rbf};
use fspace_testutil::{dense_log_normal, fd_gradient, rand_uniform, randn, rng};
use nalgebra::{DMatrix, DVector};

use crate::exact::{ExactGp, Noise};
use crate::{dirichlet_targets, SparseDirichletGp};

#[test]
fn matrix_valued_kernels_and_per_point_noise_work_end_to_end() {
    let mut r = rng(3);
    let x = rand_uniform(12, 2, -1.0, 1.0, &mut r);
    let y = randn(12, 2, &mut r) * 0.3;
    let hk =
        Helmholtz::new(Box::new(Rbf::new(1.0, 0.6).unwrap()), Box::new(Matern52::new(0.5, 0.8).unwrap()))
            .unwrap();
    let noise = DVector::from_fn(24, |i, _| 0.01 + 0.01 * (i % 3) as f64);
    let gp = ExactGp::fit(hk.clone(), PriorMean::Zero, Noise::PerPoint(noise.clone()), &x, &y).unwrap();
    let flat = DVector::from_fn(24, |k, _| y[(k / 2, k % 2)]);
    let ky = gram(&hk, &x, &x).unwrap() + DMatrix::from_diagonal(&noise);
    assert!((gp.log_marginal_likelihood() - dense_log_normal(&flat, &ky)).abs() < 1e-9);
    let analytic = gp.lml_gradient().unwrap();
    assert_eq!(analytic.len(), hk.n_params(), "no noise gradient for fixed per-point noise");
    let numeric = fd_gradient(
        |t| {
            let mut kk = hk.clone();
            kk.set_params(t).unwrap();
            ExactGp::fit(kk, PriorMean::Zero, Noise::PerPoint(noise.clone()), &x, &y)
                .unwrap()
                .log_marginal_likelihood()
        },
        &hk.params(),
        1e-5,
    );
    for (a, n) in analytic.iter().zip(&numeric) {
        assert!((a - n).abs() <= 1e-6 * n.abs().max(1.0), "{a} vs {n}");
    }
    let pred = gp.predict(&rand_uniform(5, 2, -1.0, 1.0, &mut r)).unwrap();
    assert_eq!(pred.mean.shape(), (5, 2));
    // The public entry: the same prior under an isotropic Gaussian likelihood, with σ² as the
    // last hyperparameter.
    let iso = fspace_core::LikelihoodSpec::IsotropicGaussian { sigma: 0.1, outputs: 2, learn: false };
    let prior = fspace_kernels::GpPrior::with_kernel(hk.clone(), PriorMean::Zero);
    let fitted = crate::exact::fit(iso, &prior, &fspace_core::Data::new(&x, &y).unwrap()).unwrap();
    let ky = gram(&hk, &x, &x).unwrap() + DMatrix::identity(24, 24) * (0.1 * 0.1);
    assert!((fitted.report.log_marginal_likelihood - dense_log_normal(&flat, &ky)).abs() < 1e-9);
    assert_eq!(fitted.posterior.lml_gradient().unwrap().len(), hk.n_params() + 1);
}

#[test]
fn sparse_dirichlet_gp_with_all_inputs_inducing_is_the_exact_heteroscedastic_gp() {
    // Z = X: the collapsed optimum is the exact GP of each class's Milios targets with their
    // per-point noise and the class mean as prior mean.
    let x = rand_uniform(25, 2, -2.0, 2.0, &mut rng(41));
    let labels = DVector::from_fn(25, |i, _| ((x[(i, 0)] > 0.0) as u8 + (x[(i, 1)] > 0.5) as u8) as f64);
    let kernel = Rbf::new(1.5, 0.8).unwrap();
    let sparse = SparseDirichletGp::fit(kernel.clone(), x.clone(), &x, &labels, 3, 0.01).unwrap();
    let xs = rand_uniform(7, 2, -3.0, 3.0, &mut rng(42));
    let pred = sparse.predict(&xs).unwrap();
    let (mean_joint, cov_joint) = sparse.predict_joint(&xs).unwrap();
    let (targets, noise) = dirichlet_targets(&labels, 3, 0.01).unwrap();
    for c in 0..3 {
        let mu = targets.column(c).mean();
        let y = DMatrix::from_column_slice(25, 1, targets.column(c).as_slice());
        let exact = ExactGp::fit(
            kernel.clone(),
            PriorMean::Constant(mu),
            Noise::PerPoint(noise.column(c).into_owned()),
            &x,
            &y,
        )
        .unwrap();
        let e = exact.predict(&xs).unwrap();
        let (_, e_cov) = exact.predict_joint(&xs).unwrap();
        for i in 0..7 {
            assert!((pred.mean[(i, c)] - e.mean[(i, 0)]).abs() < 1e-8, "mean class {c} point {i}");
            assert!((pred.var[(i, c)] - e.var[(i, 0)]).abs() < 1e-8, "variance class {c} point {i}");
            assert!((mean_joint[(i, c)] - e.mean[(i, 0)]).abs() < 1e-8);
            for j in 0..7 {
                assert!((cov_joint[(i * 3 + c, j * 3 + c)] - e_cov[(i, j)]).abs() < 1e-8);
                // Classes are independent.
                assert_eq!(cov_joint[(i * 3 + c, j * 3 + (c + 1) % 3)], 0.0);
            }
        }
    }
}
