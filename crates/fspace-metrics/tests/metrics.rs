//! Metrics against values computed by hand or in closed form.

use fspace_input::InputError;
use fspace_metrics::*;
use fspace_testutil::{randn_vec, rng};
use nalgebra::DMatrix;
use proptest::prelude::*;

#[test]
fn normal_functions_match_reference_values() {
    assert!((normal_cdf(0.0) - 0.5).abs() < 1e-16);
    assert!((normal_cdf(1.959963984540054) - 0.975).abs() < 1e-15);
    assert!((normal_quantile(0.975) - 1.959963984540054).abs() < 1e-12);
    assert!((normal_quantile(1e-10) + 6.361340902404056).abs() < 1e-9);
    assert_eq!(normal_quantile(0.5), 0.0);
    assert!(normal_quantile(1.0).is_infinite() && normal_quantile(-0.1).is_nan());
}

proptest! {
    #[test]
    fn quantile_inverts_the_cdf(p in 1e-12f64..(1.0 - 1e-12)) {
        prop_assert!((normal_cdf(normal_quantile(p)) - p).abs() <= 1e-14_f64.max(1e-12 * p));
    }
}

#[test]
fn crps_of_a_standard_normal_at_zero_is_the_closed_form() {
    let c = crps_gaussian(&[0.0], &[1.0], &[0.0]).unwrap();
    assert!((c - (2f64.sqrt() - 1.0) / std::f64::consts::PI.sqrt()).abs() < 1e-15);
    assert!((c - 0.2337).abs() < 1e-4);
    // Zero spread: the absolute error; scaling: CRPS(aY; am, as) = a·CRPS.
    assert_eq!(crps_gaussian(&[1.0], &[0.0], &[3.0]).unwrap(), 2.0);
    let a = crps_gaussian(&[0.3], &[0.7], &[1.1]).unwrap();
    let b = crps_gaussian(&[3.0], &[7.0], &[11.0]).unwrap();
    assert!((b - 10.0 * a).abs() < 1e-12);
}

#[test]
fn gaussian_likelihood_metrics_have_closed_forms() {
    let ell = gaussian_expected_log_likelihood(&[0.0], &[0.5], 1.0, &[1.0]).unwrap();
    assert!((ell - (-0.5 * (2.0 * std::f64::consts::PI).ln() - 0.75)).abs() < 1e-15);
    let nll = gaussian_nll(&[0.0], &[1.0], &[0.0]).unwrap();
    assert!((nll - 0.5 * (2.0 * std::f64::consts::PI).ln()).abs() < 1e-15);
    // Monte-Carlo ELL converges to the closed form.
    let mut r = rng(1);
    let z = randn_vec(200_000, &mut r);
    let samples = DMatrix::from_fn(200_000, 1, |s, _| {
        let f = 0.5f64.sqrt() * z[s];
        -0.5 * (2.0 * std::f64::consts::PI).ln() - (1.0 - f).powi(2) / 2.0
    });
    assert!((mc_expected_log_likelihood(&samples).unwrap() - ell).abs() < 5e-3);
    assert!((rmse(&[1.0, 2.0], &[1.0, 4.0]).unwrap() - 2f64.sqrt()).abs() < 1e-15);
    assert_eq!(mse(&[1.0, 2.0], &[1.0, 4.0]).unwrap(), 2.0);
}

#[test]
fn cqm_is_small_for_calibrated_and_large_for_overconfident_predictions() {
    let mut r = rng(2);
    let y = randn_vec(20_000, &mut r);
    let zeros = vec![0.0; y.len()];
    let (calibrated, curve) = cqm(&zeros, &vec![1.0; y.len()], y.as_slice()).unwrap();
    assert!(calibrated < 0.01, "{calibrated}");
    assert_eq!((curve[0], curve[10]), ((0.0, 0.0), (1.0, 1.0)));
    let (overconfident, _) = cqm(&zeros, &vec![0.1; y.len()], y.as_slice()).unwrap();
    assert!(overconfident > 0.3, "{overconfident}");
    // By hand: two points with |z| = 0.1 and 3. γ(α) = 0 for α ≤ 0.0796, ½ up to 0.9973, 1 at 1.
    let (v, curve) = cqm(&[0.0, 0.0], &[1.0, 1.0], &[0.1, 3.0]).unwrap();
    let gammas: Vec<f64> = curve.iter().map(|c| c.1).collect();
    assert_eq!(gammas, vec![0.0, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 1.0]);
    let by_hand: f64 = (0..10)
        .map(|k| {
            let (a0, a1) = (k as f64 / 10.0, (k + 1) as f64 / 10.0);
            0.05 * ((gammas[k] - a0).abs() + (gammas[k + 1] - a1).abs())
        })
        .sum();
    assert!((v - by_hand).abs() < 1e-15);
}

#[test]
fn classification_metrics_on_hand_made_predictions() {
    // Ten points at confidence 0.7 of which exactly seven are right: perfectly calibrated.
    let probs = DMatrix::from_fn(10, 2, |_, k| if k == 0 { 0.7 } else { 0.3 });
    let y: Vec<f64> = (0..10).map(|i| if i < 7 { 0.0 } else { 1.0 }).collect();
    assert!(ece(&probs, &y, 15).unwrap().abs() < 1e-15);
    assert!((accuracy(&probs, &y).unwrap() - 0.7).abs() < 1e-15);
    // Brier: 7 × (0.09 + 0.09) + 3 × (0.49 + 0.49) over 10.
    assert!((brier(&probs, &y).unwrap() - (7.0 * 0.18 + 3.0 * 0.98) / 10.0).abs() < 1e-15);
    // Overconfident: confidence 1.0, accuracy 0.7 → ECE 0.3.
    let sure = DMatrix::from_fn(10, 2, |_, k| if k == 0 { 1.0 } else { 0.0 });
    assert!((ece(&sure, &y, 15).unwrap() - 0.3).abs() < 1e-15);
    let uniform = DMatrix::from_element(2, 4, 0.25);
    assert_eq!(predictive_entropy(&uniform).unwrap(), vec![4f64.ln(); 2]);
    assert!((categorical_nll(&uniform, &[0.0, 3.0]).unwrap() - 4f64.ln()).abs() < 1e-15);
}

#[test]
fn ood_metrics_on_separable_overlapping_and_tied_scores() {
    assert_eq!(roc_auc(&[0.1, 0.2, 0.3], &[0.5, 0.9]).unwrap(), 1.0);
    assert_eq!(roc_auc(&[0.5, 0.9], &[0.1, 0.2, 0.3]).unwrap(), 0.0);
    assert_eq!(roc_auc(&[1.0, 1.0], &[1.0]).unwrap(), 0.5);
    // By hand: pairs (ood > id) among (0.1,0.4,0.6) × (0.3,0.5): 0.3>0.1; 0.5>0.1, 0.5>0.4 → 3/6.
    assert_eq!(roc_auc(&[0.1, 0.4, 0.6], &[0.3, 0.5]).unwrap(), 0.5);
    assert_eq!(stump_accuracy(&[0.1, 0.2, 0.3], &[0.5, 0.9]).unwrap(), 1.0);
    assert_eq!(stump_accuracy(&[0.5, 0.9], &[0.1, 0.2]).unwrap(), 1.0, "either direction");
    // Best single cut on id (0.1, 0.4, 0.6) vs ood (0.3, 0.5): 4 of 5 at best.
    assert_eq!(stump_accuracy(&[0.1, 0.4, 0.6], &[0.3, 0.5]).unwrap(), 0.6);
    assert!(roc_auc(&[], &[1.0]).is_err() && stump_accuracy(&[f64::NAN], &[1.0]).is_err());
}

#[test]
fn wasserstein_and_mean_rank() {
    assert_eq!(w2_gaussian(1.0, 2.0, 1.0, 2.0), 0.0);
    assert_eq!(w2_gaussian(0.0, 1.0, 3.0, 5.0), 5.0);
    assert_eq!(mean_w2(&[0.0, 1.0], &[1.0, 1.0], &[0.0, 1.0], &[1.0, 1.0]).unwrap(), 0.0);
    // Higher is better. A = 1.0 ± 0.1 (best); B = 0.95 ± 0.1 overlaps → 1; C = 0.5 ± 0.05 → 2;
    // D = 0.48 ± 0.01 overlaps C → 2; E = 0.1 ± 0 → 3.
    let r = ranks_with_error_bars(&[1.0, 0.95, 0.5, 0.48, 0.1], &[0.1, 0.1, 0.05, 0.01, 0.0], true).unwrap();
    assert_eq!(r, vec![1, 1, 2, 2, 3]);
    let r = ranks_with_error_bars(&[1.0, 0.95, 0.5], &[0.01, 0.01, 0.01], false).unwrap();
    assert_eq!(r, vec![3, 2, 1]);
    let means = DMatrix::from_row_slice(2, 2, &[1.0, 0.0, 0.0, 1.0]);
    let ses = DMatrix::zeros(2, 2);
    assert_eq!(mean_rank(&means, &ses, true).unwrap(), vec![1.5, 1.5]);
}

#[test]
fn bad_input_is_a_typed_error() {
    assert!(matches!(
        rmse(&[1.0], &[1.0, 2.0]),
        Err(MetricsError::Input(InputError::DimensionMismatch { .. }))
    ));
    assert!(matches!(rmse(&[], &[]), Err(MetricsError::Input(InputError::Empty { .. }))));
    assert!(matches!(
        crps_gaussian(&[0.0], &[-1.0], &[0.0]),
        Err(MetricsError::InvalidValue { index: 0, .. })
    ));
    assert!(matches!(gaussian_nll(&[0.0], &[0.0], &[0.0]), Err(MetricsError::InvalidValue { .. })));
    assert!(matches!(
        gaussian_expected_log_likelihood(&[0.0], &[1.0], 0.0, &[0.0]),
        Err(MetricsError::Input(InputError::Invalid { .. }))
    ));
    let probs = DMatrix::from_row_slice(1, 2, &[0.6, 0.6]);
    assert!(matches!(accuracy(&probs, &[0.0]), Err(MetricsError::NotProbabilities { row: 0, .. })));
    let ok = DMatrix::from_row_slice(1, 2, &[0.4, 0.6]);
    assert!(matches!(ece(&ok, &[2.0], 15), Err(MetricsError::InvalidLabel { .. })));
    assert!(matches!(ece(&ok, &[1.0], 0), Err(MetricsError::Input(InputError::Invalid { .. }))));
    assert!(matches!(cqm(&[f64::NAN], &[1.0], &[0.0]), Err(MetricsError::InvalidValue { .. })));
    assert!(ranks_with_error_bars(&[1.0], &[-0.1], true).is_err());
}

#[test]
fn empirical_w2_of_large_gaussian_samples_matches_the_closed_form() {
    use rand_distr::{Distribution, Normal};
    let mut r = fspace_testutil::rng(3);
    let (a, b) = (Normal::new(0.3, 1.2).unwrap(), Normal::new(-0.5, 0.7).unwrap());
    let sa: Vec<f64> = (0..20_000).map(|_| a.sample(&mut r)).collect();
    let sb: Vec<f64> = (0..20_000).map(|_| b.sample(&mut r)).collect();
    let w = fspace_metrics::w2_empirical_1d(&sa, &sb).unwrap();
    let exact = fspace_metrics::w2_gaussian(0.3, 1.2, -0.5, 0.7);
    assert!((w - exact).abs() < 0.02 * exact, "{w} vs {exact}");
    assert!(fspace_metrics::w2_empirical_1d(&sa, &sb[..10]).is_err());
    assert!(fspace_metrics::w2_empirical_1d(&[], &[]).is_err());
}

/// `n × c` probability rows and labels from a seeded stream (a softmax of normal logits).
fn classification_set(n: usize, c: usize, seed: u64) -> (DMatrix<f64>, Vec<f64>) {
    let mut r = fspace_testutil::rng(seed);
    let logits = fspace_testutil::randn(n, c, &mut r) * 2.0;
    let mut probs = logits.map(f64::exp);
    for mut row in probs.row_iter_mut() {
        let s: f64 = row.sum();
        row /= s;
    }
    let labels = (0..n).map(|i| ((i * 7 + seed as usize) % c) as f64).collect();
    (probs, labels)
}

fn close(a: f64, b: f64, what: &str) {
    assert!((a - b).abs() <= 1e-12 * b.abs().max(1e-300) + 1e-15, "{what}: {a} vs {b}");
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]

    /// Cut a test set into shards anywhere: the merged partial sums — merged directly, or
    /// through their flat vectors summed as an all-reduce sums them — give the metrics of the
    /// whole set.
    #[test]
    fn partial_metrics_over_any_shards_are_the_whole_sets(
        n in 2usize..60, c in 2usize..5, seed in 0u64..1000,
        cuts in proptest::collection::vec(0.0f64..1.0, 0..4),
    ) {
        let (probs, y) = classification_set(n, c, seed);
        let mut bounds: Vec<usize> = cuts.iter().map(|f| (f * n as f64) as usize).collect();
        bounds.extend([0, n]);
        bounds.sort_unstable();
        let mut merged = ClassificationSums::new(15).unwrap();
        let mut flat = vec![0.0; 4 + 3 * 15];
        let mut reg = RegressionSums::new();
        let mut reg_flat = vec![0.0; 15];
        let mean: Vec<f64> = (0..n).map(|i| probs[(i, 0)] * 3.0 - 1.0).collect();
        let var: Vec<f64> = (0..n).map(|i| 0.05 + probs[(i, 1)]).collect();
        let target: Vec<f64> = (0..n).map(|i| y[i] - 0.5).collect();
        for w in bounds.windows(2) {
            let (lo, hi) = (w[0], w[1]);
            if lo == hi { continue; }
            let mut part = ClassificationSums::new(15).unwrap();
            part.add(&probs.rows(lo, hi - lo).into_owned(), &y[lo..hi]).unwrap();
            merged.merge(&part).unwrap();
            for (a, b) in flat.iter_mut().zip(part.to_flat()) { *a += b; }
            let mut rpart = RegressionSums::new();
            rpart.add(&mean[lo..hi], &var[lo..hi], &target[lo..hi]).unwrap();
            reg.merge(&rpart).unwrap();
            for (a, b) in reg_flat.iter_mut().zip(rpart.to_flat()) { *a += b; }
        }
        let reduced = ClassificationSums::from_flat(15, &flat).unwrap();
        for sums in [&merged, &reduced] {
            proptest::prop_assert_eq!(sums.points(), n);
            close(sums.nll().unwrap(), categorical_nll(&probs, &y).unwrap(), "NLL");
            close(sums.accuracy().unwrap(), accuracy(&probs, &y).unwrap(), "accuracy");
            close(sums.brier().unwrap(), brier(&probs, &y).unwrap(), "Brier");
            close(sums.ece().unwrap(), ece(&probs, &y, 15).unwrap(), "ECE");
        }
        let reg_reduced = RegressionSums::from_flat(&reg_flat).unwrap();
        let std: Vec<f64> = var.iter().map(|v| v.sqrt()).collect();
        for sums in [&reg, &reg_reduced] {
            close(sums.nll().unwrap(), gaussian_nll(&mean, &var, &target).unwrap(), "Gaussian NLL");
            close(sums.rmse().unwrap(), rmse(&mean, &target).unwrap(), "RMSE");
            close(sums.crps().unwrap(), crps_gaussian(&mean, &std, &target).unwrap(), "CRPS");
            let (a, curve) = sums.cqm().unwrap();
            let (b, want) = cqm(&mean, &std, &target).unwrap();
            close(a, b, "CQM");
            proptest::prop_assert_eq!(curve, want);
        }
    }
}

/// The rank metrics gather: the merged scores' AUC is the whole set's, while the mean of the
/// shards' AUCs — what a sum-and-divide would give — is not.
#[test]
fn ood_scores_gather_and_the_mean_of_shard_aucs_is_not_the_auc() {
    let id = [0.1, 0.2, 0.35, 0.5, 0.9, 0.05];
    let ood = [0.3, 0.8, 0.95, 0.4];
    let (mut a, mut b) = (Scores::new(), Scores::new());
    a.add_in_distribution(&id[..3]).unwrap();
    a.add_out_of_distribution(&ood[..1]).unwrap();
    b.add_in_distribution(&id[3..]).unwrap();
    b.add_out_of_distribution(&ood[1..]).unwrap();
    let shard_mean = (a.roc_auc().unwrap() + b.roc_auc().unwrap()) / 2.0;
    a.merge(&b);
    let whole = roc_auc(&id, &ood).unwrap();
    assert_eq!(a.roc_auc().unwrap(), whole);
    assert_eq!(a.stump_accuracy().unwrap(), stump_accuracy(&id, &ood).unwrap());
    assert!((shard_mean - whole).abs() > 0.05, "{shard_mean} vs {whole}");
}

#[test]
fn partials_refuse_what_they_cannot_hold() {
    assert!(ClassificationSums::new(0).is_err());
    let empty = ClassificationSums::new(10).unwrap();
    assert!(matches!(empty.accuracy(), Err(MetricsError::Input(InputError::Empty { .. }))));
    let mut ten = ClassificationSums::new(10).unwrap();
    assert!(ten.merge(&ClassificationSums::new(15).unwrap()).is_err());
    assert!(ClassificationSums::from_flat(10, &[0.0; 5]).is_err());
    assert!(ClassificationSums::from_flat(1, &[1.0, f64::NAN, 0.0, 0.0, 1.0, 0.5, 1.0]).is_err());
    let mut reg = RegressionSums::new();
    assert!(reg.add(&[0.0], &[0.0], &[1.0]).is_err()); // a zero variance
    assert!(reg.add(&[0.0, 1.0], &[1.0], &[1.0, 2.0]).is_err());
    assert!(RegressionSums::from_flat(&[0.0; 3]).is_err());
    assert!(Scores::new().roc_auc().is_err());
    assert!(Scores::new().add_in_distribution(&[f64::INFINITY]).is_err());
}
