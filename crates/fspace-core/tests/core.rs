//! Likelihoods against finite differences and closed forms; the posterior helpers against
//! Monte Carlo; training pieces against their definitions.

use fspace_core::*;
use fspace_input::InputError;
use fspace_testutil::{assert_all_close, fd_gradient, randn, randn_vec, rng};
use nalgebra::{DMatrix, DVector};
use proptest::prelude::*;

fn flat(m: &DMatrix<f64>) -> Vec<f64> {
    // Row-major (point-major) flattening of an n × d' matrix.
    (0..m.nrows()).flat_map(|i| m.row(i).iter().cloned().collect::<Vec<_>>()).collect()
}

fn unflat(v: &[f64], n: usize, q: usize) -> DMatrix<f64> {
    DMatrix::from_row_slice(n, q, v)
}

fn check_derivatives(lik: &dyn Likelihood, f: &DMatrix<f64>, y: &DVector<f64>) {
    let (n, q) = f.shape();
    let grad = lik.nll_grad(f, y).unwrap();
    let numeric = fd_gradient(|v| lik.nll(&unflat(v, n, q), y).unwrap(), &flat(f), 1e-6);
    assert_all_close(&flat(&grad), &numeric, 1e-6, 1e-8);
    // Per-point Hessian blocks: finite differences of the gradient of point i.
    let hess = lik.nll_hessian(f, y).unwrap();
    for i in 0..n {
        for a in 0..q {
            let numeric = fd_gradient(
                |v| {
                    let mut fp = f.clone();
                    for b in 0..q {
                        fp[(i, b)] = v[b];
                    }
                    lik.nll_grad(&fp, y).unwrap()[(i, a)]
                },
                &f.row(i).iter().cloned().collect::<Vec<_>>(),
                1e-6,
            );
            let analytic: Vec<f64> = hess[i].row(a).iter().cloned().collect();
            assert_all_close(&analytic, &numeric, 1e-6, 1e-8);
        }
        let min_eig = hess[i].clone().symmetric_eigen().eigenvalues.min();
        assert!(min_eig >= -1e-12, "Hessian block must be PSD");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    #[test]
    fn likelihood_gradients_and_hessians_match_finite_differences(seed in 0u64..1000, n in 1usize..6) {
        let mut r = rng(seed);
        let f1 = randn(n, 1, &mut r) * 2.0;
        let y_reg = DVector::from_fn(n, |i, _| f1[(i, 0)] + 0.3 * (i as f64 - 1.0));
        check_derivatives(&Gaussian::new(0.7).unwrap(), &f1, &y_reg);
        let y_bin = DVector::from_fn(n, |i, _| (i % 2) as f64);
        check_derivatives(&Bernoulli, &f1, &y_bin);
        let f4 = randn(n, 4, &mut r) * 2.0;
        let y_cat = DVector::from_fn(n, |i, _| (i % 4) as f64);
        check_derivatives(&Categorical::new(4).unwrap(), &f4, &y_cat);
    }
}

#[test]
fn the_isotropic_gaussian_is_a_sum_of_scalar_gaussians_with_exact_derivatives() {
    let lik = IsotropicGaussian::new(0.3, 2).unwrap();
    let f = randn(4, 2, &mut rng(40));
    let y = randn_vec(8, &mut rng(41)); // point-major: y[2i], y[2i+1] for point i
    let scalar = Gaussian::new(0.3).unwrap();
    let flat_f = DMatrix::from_row_slice(8, 1, f.transpose().as_slice());
    assert!((lik.nll(&f, &y).unwrap() - scalar.nll(&flat_f, &y).unwrap()).abs() < 1e-12);
    let g = lik.nll_grad(&f, &y).unwrap();
    let fd = fd_gradient(
        |v| lik.nll(&DMatrix::from_row_slice(4, 2, v), &y).unwrap(),
        f.transpose().as_slice(),
        1e-6,
    );
    assert_all_close(g.transpose().as_slice(), &fd, 1e-6, 1e-8);
    let h = lik.nll_hessian(&f, &y).unwrap();
    assert!(h.len() == 4 && (h[0][(0, 0)] - 1.0 / 0.09).abs() < 1e-12 && h[0][(0, 1)] == 0.0);
    let fd_sigma = fd_gradient(
        |v| IsotropicGaussian::new(v[0].exp(), 2).unwrap().nll(&f, &y).unwrap(),
        &[0.3f64.ln()],
        1e-6,
    );
    assert!((lik.nll_param_grad(&f, &y).unwrap()[0] - fd_sigma[0]).abs() < 1e-6);
    assert_eq!(lik.target_dim(), 2);
    assert!(lik.nll(&f, &randn_vec(4, &mut rng(42))).is_err(), "n targets for n·d' values");
    assert!(IsotropicGaussian::new(0.3, 0).is_err() && IsotropicGaussian::new(-1.0, 2).is_err());
}

#[test]
fn likelihoods_have_their_closed_forms() {
    let f = DMatrix::from_row_slice(2, 1, &[0.0, 1.0]);
    let y = DVector::from_vec(vec![0.5, 1.0]);
    let g = Gaussian::new(0.5).unwrap();
    let expected = 2.0 * 0.5 * (std::f64::consts::TAU * 0.25).ln() + 0.25 / 0.5;
    assert!((g.nll(&f, &y).unwrap() - expected).abs() < 1e-14);
    // d/dlog σ by finite differences.
    let fd = (Gaussian::new(0.5 * 1e-6f64.exp()).unwrap().nll(&f, &y).unwrap()
        - Gaussian::new(0.5 * (-1e-6f64).exp()).unwrap().nll(&f, &y).unwrap())
        / 2e-6;
    assert!((g.nll_grad_log_sigma(&f, &y).unwrap() - fd).abs() < 1e-6);
    // The generic learnable-parameter interface is the same derivative, round-trips log σ, and
    // rejects a wrong length; likelihoods without parameters take only the empty vector.
    assert!((g.nll_param_grad(&f, &y).unwrap()[0] - fd).abs() < 1e-6);
    let mut g2 = Gaussian::new(1.0).unwrap();
    g2.set_params(&g.params()).unwrap();
    assert!((g2.sigma() - 0.5).abs() < 1e-15);
    assert!(g2.set_params(&DVector::zeros(2)).is_err());
    assert!(Bernoulli.params().is_empty() && Bernoulli.clone().set_params(&DVector::zeros(1)).is_err());
    let (m, v) = g.predictive(&DVector::from_vec(vec![1.0]), &DVector::from_vec(vec![0.1])).unwrap();
    assert_eq!((m[0], v[0]), (1.0, 0.35));
    // Bernoulli at f = 0 is log 2 per point; stable at huge logits.
    let nll = Bernoulli.nll(&DMatrix::from_row_slice(1, 1, &[0.0]), &DVector::from_vec(vec![1.0])).unwrap();
    assert!((nll - 2f64.ln()).abs() < 1e-15);
    let big = Bernoulli
        .nll(&DMatrix::from_row_slice(2, 1, &[800.0, -800.0]), &DVector::from_vec(vec![1.0, 0.0]))
        .unwrap();
    assert!(big.is_finite() && big < 1e-300);
    let cat = Categorical::new(3).unwrap();
    let nll =
        cat.nll(&DMatrix::from_row_slice(1, 3, &[1000.0, 0.0, 0.0]), &DVector::from_vec(vec![1.0])).unwrap();
    assert!((nll - 1000.0).abs() < 1e-9, "logsumexp must not overflow: {nll}");
}

#[test]
fn likelihoods_reject_bad_input() {
    assert!(Gaussian::new(0.0).is_err() && Gaussian::new(f64::NAN).is_err());
    assert!(Categorical::new(1).is_err());
    let f = DMatrix::from_row_slice(2, 1, &[0.0, 1.0]);
    assert!(matches!(
        Bernoulli.nll(&f, &DVector::from_vec(vec![0.0, 0.5])),
        Err(CoreError::InvalidTarget { index: 1, .. })
    ));
    assert!(matches!(
        Bernoulli.nll(&f, &DVector::from_vec(vec![0.0])),
        Err(CoreError::Input(InputError::DimensionMismatch { .. }))
    ));
    let cat = Categorical::new(3).unwrap();
    assert!(matches!(
        cat.nll(&f, &DVector::from_vec(vec![0.0, 1.0])),
        Err(CoreError::Input(InputError::DimensionMismatch { .. }))
    ));
    let f3 = DMatrix::from_row_slice(1, 3, &[0.0, f64::NAN, 1.0]);
    assert!(matches!(
        cat.nll(&f3, &DVector::from_vec(vec![0.0])),
        Err(CoreError::Input(InputError::NonFinite { .. }))
    ));
    let g = Gaussian::new(1.0).unwrap();
    assert!(matches!(
        g.nll(&DMatrix::zeros(0, 1), &DVector::zeros(0)),
        Err(CoreError::Input(InputError::Empty { .. }))
    ));
    assert!(matches!(
        g.nll(&f, &DVector::from_vec(vec![0.0, f64::INFINITY])),
        Err(CoreError::Input(InputError::NonFinite { .. }))
    ));
}

#[test]
fn class_probabilities_agree_with_monte_carlo_and_closed_forms() {
    let mean = DMatrix::from_row_slice(3, 1, &[0.0, 1.5, -3.0]);
    let var = DMatrix::from_row_slice(3, 1, &[0.0, 2.0, 0.5]);
    let pred = FunctionPredictive::new(mean.clone(), var).unwrap();
    let mc = class_probabilities(&pred, &Link::MonteCarlo { samples: 200_000, seed: 1 }).unwrap();
    // The seed fixes the draws: the same call gives the same bits, the running-RNG form agrees.
    let mc_small = class_probabilities(&pred, &Link::MonteCarlo { samples: 500, seed: 7 }).unwrap();
    assert_eq!(mc_small, class_probabilities(&pred, &Link::MonteCarlo { samples: 500, seed: 7 }).unwrap());
    assert_eq!(mc_small, mc_class_probabilities(&pred, 500, &mut rng(7)).unwrap());
    let probit = class_probabilities(&pred, &Link::Probit).unwrap();
    let bridge = class_probabilities(&pred, &Link::LaplaceBridge).unwrap();
    for i in 0..3 {
        assert!((mc[(i, 0)] + mc[(i, 1)] - 1.0).abs() < 1e-12);
        // The probit approximation of E[σ(f)] is accurate to ~0.02 (MacKay 1992).
        assert!(
            (probit[(i, 1)] - mc[(i, 1)]).abs() < 0.02,
            "row {i}: probit {} vs mc {}",
            probit[(i, 1)],
            mc[(i, 1)]
        );
        assert!((bridge.row(i).sum() - 1.0).abs() < 1e-12);
    }
    // Zero variance: probit is the plug-in sigmoid.
    assert!((probit[(0, 1)] - 0.5).abs() < 1e-15);
    assert!((probit[(1, 1)] - sigmoid(1.5 / (1.0 + std::f64::consts::PI * 2.0 / 8.0).sqrt())).abs() < 1e-15);
    // Multi-class: uncertainty pulls the prediction towards uniform, ordering is preserved.
    let m3 = DMatrix::from_row_slice(1, 3, &[2.0, 0.0, -1.0]);
    let certain = FunctionPredictive::new(m3.clone(), DMatrix::from_element(1, 3, 1e-9)).unwrap();
    let unsure = FunctionPredictive::new(m3, DMatrix::from_element(1, 3, 5.0)).unwrap();
    for method in [Link::Probit, Link::MonteCarlo { samples: 50_000, seed: 3 }] {
        let p_c = class_probabilities(&certain, &method).unwrap();
        let p_u = class_probabilities(&unsure, &method).unwrap();
        let plugin = softmax(&[2.0, 0.0, -1.0]);
        assert!((p_c[(0, 0)] - plugin[0]).abs() < 1e-3);
        assert!(p_u[(0, 0)] < p_c[(0, 0)] && p_u[(0, 0)] > p_u[(0, 1)] && p_u[(0, 1)] > p_u[(0, 2)]);
    }
    // Laplace bridge with equal variances and equal means is uniform.
    let eq = FunctionPredictive::new(DMatrix::zeros(1, 4), DMatrix::from_element(1, 4, 1.0)).unwrap();
    let p = class_probabilities(&eq, &Link::LaplaceBridge).unwrap();
    assert_all_close(p.row(0).iter().cloned().collect::<Vec<_>>().as_slice(), &[0.25; 4], 0.0, 1e-15);
    assert!(class_probabilities(&eq, &Link::MonteCarlo { samples: 0, seed: 0 }).is_err());
    assert!(FunctionPredictive::new(DMatrix::zeros(1, 1), DMatrix::from_element(1, 1, -1.0)).is_err());
}

/// A posterior with a fixed joint Gaussian, to test the contract's default sampler.
struct FixedGaussian {
    mean: DMatrix<f64>,
    cov: DMatrix<f64>,
}

impl Posterior for FixedGaussian {
    fn output_dim(&self) -> usize {
        self.mean.ncols()
    }
    fn predict(&self, _x: &DMatrix<f64>) -> Result<FunctionPredictive> {
        let q = self.mean.ncols();
        let var = DMatrix::from_fn(self.mean.nrows(), q, |i, a| self.cov[(i * q + a, i * q + a)]);
        FunctionPredictive::new(self.mean.clone(), var)
    }
    fn predict_joint(&self, _x: &DMatrix<f64>) -> Result<(DMatrix<f64>, DMatrix<f64>)> {
        Ok((self.mean.clone(), self.cov.clone()))
    }
}

#[test]
fn default_function_samples_have_the_joint_moments() {
    // A singular (rank-2) covariance over 2 points × 2 outputs.
    let l = DMatrix::from_row_slice(4, 2, &[1.0, 0.0, 0.5, 0.2, 0.0, 1.0, -0.3, 0.4]);
    let cov = &l * l.transpose();
    let post =
        FixedGaussian { mean: DMatrix::from_row_slice(2, 2, &[1.0, -1.0, 0.0, 2.0]), cov: cov.clone() };
    let samples = post.sample_functions(&DMatrix::zeros(2, 1), 40_000, &mut rng(2)).unwrap();
    let flat_samples: Vec<DVector<f64>> = samples.iter().map(|s| DVector::from_vec(flat(s))).collect();
    let mean = flat_samples.iter().fold(DVector::zeros(4), |a, s| a + s) / samples.len() as f64;
    let emp_cov =
        flat_samples.iter().fold(DMatrix::zeros(4, 4), |a, s| a + (s - &mean) * (s - &mean).transpose())
            / (samples.len() - 1) as f64;
    assert_all_close(mean.as_slice(), &[1.0, -1.0, 0.0, 2.0], 0.0, 0.03);
    assert!((emp_cov - &cov).abs().max() < 0.04);
    // Deterministic under a seed.
    let a = post.sample_functions(&DMatrix::zeros(2, 1), 3, &mut rng(5)).unwrap();
    let b = post.sample_functions(&DMatrix::zeros(2, 1), 3, &mut rng(5)).unwrap();
    assert_eq!(a, b);
    let indefinite = FixedGaussian {
        mean: DMatrix::zeros(1, 2),
        cov: DMatrix::from_row_slice(2, 2, &[1.0, 0.0, 0.0, -1.0]),
    };
    assert!(matches!(
        indefinite.sample_functions(&DMatrix::zeros(1, 1), 1, &mut rng(0)),
        Err(CoreError::NotPsd { .. })
    ));
}

#[test]
fn minibatches_cover_each_row_once_per_epoch_and_early_stopping_keeps_patience() {
    let mb = Minibatches::new(10, 3, false).unwrap();
    let epoch = mb.epoch(&mut rng(3));
    assert_eq!(epoch.len(), 4);
    let mut all: Vec<usize> = epoch.concat();
    all.sort();
    assert_eq!(all, (0..10).collect::<Vec<_>>());
    assert_eq!(Minibatches::new(10, 3, true).unwrap().epoch(&mut rng(3)).len(), 3);
    assert_ne!(mb.epoch(&mut rng(3)), mb.epoch(&mut rng(4)));
    assert!(Minibatches::new(0, 3, false).is_err() && Minibatches::new(5, 0, false).is_err());
}

#[test]
fn a_schedule_evaluates_every_interval_and_at_the_end_and_stops_at_the_patienceth_bad_evaluation() {
    // 10 epochs of 4 steps, evaluated every 3 epochs (steps 12, 24, 36) and at the last step 40.
    let run = ScheduleRun::new(&Schedule::epochs(10).every_epochs(3), 4, false).unwrap();
    assert_eq!(run.total_steps(), 40);
    let evaluated: Vec<usize> = (1..=40).filter(|&s| run.evaluates_after(s)).collect();
    assert_eq!(evaluated, vec![12, 24, 36, 40]);
    let run = ScheduleRun::new(&Schedule::steps(250).every_steps(100), 7, false).unwrap();
    assert_eq!((1..=250).filter(|&s| run.evaluates_after(s)).collect::<Vec<_>>(), vec![100, 200, 250]);
    assert!(run.is_last(250) && !run.is_last(249));

    // Patience 2: stops at the second evaluation in a row without improvement; NaN never improves.
    let mut run = ScheduleRun::new(&Schedule::steps(100).every_steps(1).patience(2), 1, true).unwrap();
    let decisions: Vec<StopDecision> =
        [3.0, 2.0, 2.5, 1.0, f64::NAN, 1.5].iter().enumerate().map(|(i, &l)| run.record(i + 1, l)).collect();
    use StopDecision::*;
    assert_eq!(decisions, vec![Improved, Improved, Continue, Improved, Continue, Stop]);
    assert_eq!((run.best(), run.best_step()), (1.0, Some(4)));
    assert!(run.restores_best());
    // Without patience it never stops; keep_last or no validation set keeps the last state.
    let mut run = ScheduleRun::new(&Schedule::steps(10).every_steps(1), 1, true).unwrap();
    assert!((0..50).all(|i| run.record(i, 5.0 + i as f64) != Stop));
    let mut last = ScheduleRun::new(&Schedule::steps(10).keep_last(), 1, true).unwrap();
    last.record(1, 1.0);
    assert!(!last.restores_best());
    assert!(!ScheduleRun::new(&Schedule::steps(10), 1, false).unwrap().restores_best());

    // Refused: zero length, zero interval, zero patience, patience without validation data.
    for bad in [Schedule::steps(0), Schedule::epochs(3).every_steps(0), Schedule::epochs(3).patience(0)] {
        assert!(matches!(ScheduleRun::new(&bad, 1, true), Err(CoreError::Input(_))), "{bad:?}");
    }
    let err = ScheduleRun::new(&Schedule::epochs(3).patience(2), 1, false).unwrap_err();
    assert!(err.to_string().contains("validation"), "{err}");
    assert!(ScheduleRun::new(&Schedule::epochs(3), 0, true).is_err());
}

#[test]
fn mean_class_probabilities_average_the_draws_sigmoid_or_softmax() {
    // One logit: columns [1 − σ(f), σ(f)], averaged over the two draws.
    let draws = [DMatrix::from_row_slice(2, 1, &[0.0, 2.0]), DMatrix::from_row_slice(2, 1, &[1.0, -2.0])];
    let p = mean_class_probabilities(&draws).unwrap();
    for i in 0..2 {
        let want = (sigmoid(draws[0][(i, 0)]) + sigmoid(draws[1][(i, 0)])) / 2.0;
        assert!((p[(i, 1)] - want).abs() < 1e-15 && (p[(i, 0)] - (1.0 - want)).abs() < 1e-15);
    }
    // Three logits: the mean of the softmaxes, not the softmax of the mean.
    let draws =
        [DMatrix::from_row_slice(1, 3, &[2.0, 0.0, -1.0]), DMatrix::from_row_slice(1, 3, &[-1.0, 0.5, 0.0])];
    let p = mean_class_probabilities(&draws).unwrap();
    let (a, b) = (softmax(&[2.0, 0.0, -1.0]), softmax(&[-1.0, 0.5, 0.0]));
    for k in 0..3 {
        assert!((p[(0, k)] - (a[k] + b[k]) / 2.0).abs() < 1e-15);
    }
    assert!(mean_class_probabilities(&[]).is_err());
}

/// 64-bit FNV-1a over bytes, written from the published definition, for the fingerprint test.
fn fnv1a_bytes(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3))
}

#[test]
fn fingerprint_is_fnv1a_over_the_little_endian_bits_of_each_value() {
    // The reference against the published test vectors (empty, "a", "foobar").
    assert_eq!(fnv1a_bytes(b""), 0xcbf2_9ce4_8422_2325);
    assert_eq!(fnv1a_bytes(b"a"), 0xaf63_dc4c_8601_ec8c);
    assert_eq!(fnv1a_bytes(b"foobar"), 0x8594_4171_f739_67e8);
    // The fingerprint hashes every value's eight bytes in order.
    let values = [0.0, -0.0, 1.0, -2.5, f64::MIN_POSITIVE, 1e300, std::f64::consts::PI];
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_bits().to_le_bytes()).collect();
    assert_eq!(fingerprint(values), format!("{:016x}", fnv1a_bytes(&bytes)));
    assert_eq!(fingerprint([]), "cbf29ce484222325");
    // Order and sign bits matter; the output is always 16 hex digits.
    assert_ne!(fingerprint([1.0, 2.0]), fingerprint([2.0, 1.0]));
    assert_ne!(fingerprint([0.0]), fingerprint([-0.0]));
    assert!(values.iter().all(|&v| fingerprint([v]).len() == 16));
}

/// `sample_gaussian` on a covariance whose spectrum nalgebra 0.33's `symmetric_eigen` gets wrong
/// (the softmax Hessian `diag(p) − ppᵀ` at near-uniform logits: its `V Λ Vᵀ` was 6.6e-2 off):
/// the draws' second moment is the covariance, within the sampling error.
#[test]
#[allow(clippy::excessive_precision)] // the logits as printed with 17 digits: these exact bits
fn samples_of_a_near_degenerate_covariance_have_it() {
    let logits = [
        -8.57150033405157386e-02,
        1.34122773440324861e-01,
        -3.95452081588568150e-03,
        1.59239466678930991e-01,
        -1.99170411918241308e-01,
        2.00093703747225016e-02,
        -5.62877084888412094e-03,
        4.69175574236582599e-02,
        -9.33833040845309936e-02,
        -9.57413032152359122e-02,
    ];
    let p = DVector::from_vec(softmax(&logits));
    let cov = DMatrix::from_diagonal(&p) - &p * p.transpose();
    let mean = DMatrix::zeros(1, 10);
    let draws = sample_gaussian(&mean, &cov, 40_000, &mut rng(5)).unwrap();
    let mut second = DMatrix::<f64>::zeros(10, 10);
    for d in &draws {
        let v = d.row(0).transpose();
        second += &v * v.transpose();
    }
    second /= draws.len() as f64;
    // Entries are ≈ 0.1 on the diagonal, ≈ 0.01 off it; 40 000 draws: standard error ≈ 7e-4.
    let err = (&second - &cov).abs().max();
    assert!(err < 4e-3, "second moment off the covariance by {err:e}");
}

/// The layout round on two "processes" whose all-reduce adds a fixed other part: each
/// process's counts land in its slots, offsets and totals follow, the sums are added; a rank
/// outside the world, a local failure and a reduce that returns no counts are errors.
#[test]
fn the_layout_round_places_every_process_counts_and_adds_the_sums() {
    // Process 1 of 2 holds 4 training and 0 validation rows; process 0 sent 3 and 2, and 1.5.
    let other = DVector::from_vec(vec![3.0, 0.0, 2.0, 0.0, 1.5]);
    let mut seen = Vec::new();
    let mut reduce = |part: DVector<f64>, failed: bool| -> std::result::Result<DVector<f64>, CoreError> {
        seen.push((part.clone(), failed));
        Ok(part + &other)
    };
    let mut shard = ProcessShard { rank: 1, world: 2, reduce: &mut reduce };
    let layout = shard.exchange_layout(Ok(()), &[4, 0], DVector::from_element(1, 0.25)).unwrap();
    assert_eq!(layout.counts, vec![vec![3, 4], vec![2, 0]]);
    assert_eq!((layout.offset(0, 1), layout.total(0), layout.offset(1, 1), layout.total(1)), (3, 7, 2, 2));
    assert_eq!(layout.sums.as_slice(), &[1.75]);
    let refused = ProcessShard { rank: 2, world: 2, reduce: &mut reduce }.exchange_layout(
        Ok(()),
        &[4, 0],
        DVector::from_element(1, 0.25),
    );
    assert!(refused.unwrap_err().to_string().contains("rank 2 of 2"));
    let failed = ProcessShard { rank: 1, world: 2, reduce: &mut reduce }.exchange_layout(
        Err(CoreError::Input(InputError::Empty { what: "here" })),
        &[4, 0],
        DVector::zeros(1),
    );
    assert!(failed.unwrap_err().to_string().contains("here"));
    // The failing calls still sent the round's width, flagged, so no process waits.
    assert_eq!(
        seen.iter().map(|(p, f)| (p.len(), *f)).collect::<Vec<_>>(),
        vec![(5, false), (5, true), (5, true)]
    );
    let mut broken = |_: DVector<f64>, _: bool| -> std::result::Result<DVector<f64>, CoreError> {
        Ok(DVector::from_element(5, 0.5))
    };
    let not_counts = ProcessShard { rank: 0, world: 2, reduce: &mut broken }.exchange_layout(
        Ok(()),
        &[1, 0],
        DVector::zeros(1),
    );
    assert!(not_counts.unwrap_err().to_string().contains("not a count"));
}

/// A σ whose square or precision leaves f64, and data whose square overflows, are refused by
/// name at the boundary instead of failing later inside a factorisation as "non-finite input".
#[test]
fn values_whose_squares_leave_f64_are_refused_by_name() {
    use fspace_core::{Data, Gaussian, SIGMA_RANGE};
    for bad in [1e-151, 1e-300, 1e151, 1e300] {
        let e = Gaussian::new(bad).unwrap_err().to_string();
        assert!(e.contains("Gaussian noise σ") && e.contains("outside"), "{bad}: {e}");
    }
    assert!(Gaussian::new(SIGMA_RANGE.0).is_ok() && Gaussian::new(SIGMA_RANGE.1).is_ok());
    let y = nalgebra::DMatrix::zeros(2, 1);
    let x = nalgebra::DMatrix::from_row_slice(2, 1, &[0.0, 3e300]);
    let e = Data::new(&x, &y).unwrap_err().to_string();
    assert!(e.contains("training inputs") && e.contains("3e300") && e.contains("entry 1"), "{e}");
    let x = nalgebra::DMatrix::from_row_slice(2, 1, &[0.0, 1e150]);
    let big_y = nalgebra::DMatrix::from_row_slice(2, 1, &[0.0, -2e151]);
    let e = Data::new(&x, &big_y).unwrap_err().to_string();
    assert!(e.contains("training targets") && e.contains("-2e151"), "{e}");
    assert!(Data::new(&x, &y).is_ok(), "1e150 itself is allowed");
}
