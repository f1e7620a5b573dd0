//! The fits of one seed: budget, data, prior, FSP-Laplace training and posterior, the baselines' predictors.

use super::*;

/// Sizes of one run.
#[derive(Debug, Clone, serde::Serialize)]
pub(super) struct Budget {
    pub(super) seeds: usize,
    /// Training / validation / test (and OOD) images kept (`None`: all).
    pub(super) n_train: Option<usize>,
    pub(super) n_val: Option<usize>,
    pub(super) n_test: Option<usize>,
    /// Maximum epochs and early-stopping patience (epochs) of both trainings.
    pub(super) epochs: usize,
    pub(super) patience: usize,
    /// Images of the Milios marginal-likelihood fit, and its Adam iterations.
    pub(super) n_prior: usize,
    pub(super) prior_iterations: usize,
    /// Halton points of Alg. 2 (paper: 25 000) and its Lanczos rank cap (paper: 500).
    pub(super) n_halton: usize,
    pub(super) max_rank: usize,
    /// Training images of Alg. 2's data term and of the KFAC statistics.
    pub(super) ggn_points: usize,
    pub(super) kfac_points: usize,
    /// Validation images of the Laplace prior-precision search.
    pub(super) lambda_val: usize,
    /// Inducing points of the sparse GP.
    pub(super) inducing: usize,
    /// FVI: epochs at most, function samples per step.
    pub(super) fvi_epochs: usize,
    pub(super) fvi_samples: usize,
    /// Posterior function samples per prediction (paper: 10).
    pub(super) samples: usize,
}

impl Budget {
    pub(super) fn new(opts: &Options) -> Self {
        let b = if opts.quick {
            Budget {
                seeds: 1,
                n_train: Some(2_000),
                n_val: Some(500),
                n_test: Some(500),
                epochs: 3,
                patience: 2,
                n_prior: 300,
                prior_iterations: 60,
                n_halton: 200,
                max_rank: 40,
                ggn_points: 300,
                kfac_points: 300,
                lambda_val: 200,
                inducing: 100,
                fvi_epochs: 1,
                fvi_samples: 3,
                samples: 10,
            }
        } else {
            Budget {
                seeds: 5,
                n_train: None,
                n_val: None,
                n_test: None,
                epochs: 10,
                patience: 2,
                n_prior: 500,
                prior_iterations: 60,
                n_halton: 1_000,
                max_rank: 150,
                ggn_points: 2_000,
                kfac_points: 3_000,
                lambda_val: 1_000,
                inducing: 500,
                fvi_epochs: 1,
                fvi_samples: 5,
                samples: 10,
            }
        };
        Budget { seeds: opts.seeds.unwrap_or(b.seeds), ..b }
    }
}

/// How a method turns images into class probabilities.
pub(super) enum Predictor<'a> {
    /// Softmax of the network's logits.
    Map(&'a Cnn),
    /// Mean softmax of joint posterior function samples.
    Samples(&'a dyn Posterior),
    /// Mean softmax of samples of the per-point marginals (the sparse GP).
    Marginals(&'a dyn Posterior),
}

/// Metrics of one method on the ID test images and the OOD images.
pub(super) fn evaluate(
    method: &'static str,
    predictor: Predictor<'_>,
    test: &Images,
    ood: &Images,
    samples: usize,
    seed: u64,
) -> Result<Row> {
    let probs = |x: &DMatrix<f64>, s: u64| -> Result<(DMatrix<f64>, Vec<DMatrix<f64>>)> {
        match predictor {
            Predictor::Map(net) => Ok((crate::protocols::images::map_probs(net, x)?, Vec::new())),
            Predictor::Samples(p) => sampled_class_probs(p, x, samples, seed + s),
            Predictor::Marginals(p) => Ok(marginal_sampled_class_probs(&p.predict(x)?, samples, seed + s)),
        }
    };
    let (p_test, per_sample) = probs(&test.x, 0)?;
    let (p_ood, _) = probs(&ood.x, 1)?;
    let m = crate::protocols::images::class_metrics(&p_test, &test.y)?;
    let ent_id = fspace_metrics::predictive_entropy(&p_test)?;
    let ent_ood = fspace_metrics::predictive_entropy(&p_ood)?;
    let ood_acc = fspace_metrics::stump_accuracy(ent_id.as_slice(), ent_ood.as_slice())?;
    let entropy = Some((entropy_counts(ent_id.as_slice()), entropy_counts(ent_ood.as_slice())));
    // The literal expectation E_s log p_s(y) over the function samples (≤ the log predictive).
    let sample_ell = if per_sample.is_empty() {
        -m.nll
    } else {
        let ll = |p: &DMatrix<f64>| {
            (0..p.nrows()).map(|i| p[(i, test.y[i] as usize)].max(1e-300).ln()).sum::<f64>()
        };
        per_sample.iter().map(ll).sum::<f64>() / (per_sample.len() * test.y.len()) as f64
    };
    Ok(Row {
        method,
        metrics: [-m.nll, m.accuracy, m.ece, ood_acc],
        sample_ell,
        fit_seconds: 0.0,
        entropy,
        extra: json!({ "nll": m.nll, "brier": m.brier }),
    })
}

pub(super) fn cnn(seed: u64) -> Result<Cnn> {
    Ok(Cnn::new(CnnConfig::fsp_mnist(10, Activation::Tanh, seed))?)
}

pub(super) fn train_config(budget: &Budget, weight_decay: f64, seed: u64) -> TrainConfig {
    TrainConfig {
        schedule: Schedule::epochs(budget.epochs).patience(budget.patience),
        batch_size: 100,
        learning_rate: 1e-3,
        weight_decay,
        seed,
        ..TrainConfig::default()
    }
}

/// One seed's images, cut to the budget.
pub(super) struct SeedData {
    pub(super) train: Images,
    pub(super) val: Images,
    pub(super) test: Images,
    pub(super) ood: Images,
    /// The standardised value of a black pixel (the background of rotated images).
    pub(super) black: f64,
}

pub(super) fn seed_data(set: ImageSet, ood_set: ImageSet, budget: &Budget, seed: u64) -> Result<SeedData> {
    let (train, val, test, stats) = train_val_test(set, seed)?;
    let ood = test_with(ood_set, stats)?;
    let keep = |imgs: Images, n: Option<usize>, s: u64| match n {
        Some(n) => imgs.subset(n, s),
        None => imgs,
    };
    Ok(SeedData {
        train: keep(train, budget.n_train, seed),
        val: keep(val, budget.n_val, seed + 1),
        test: keep(test, budget.n_test, seed + 2),
        ood: keep(ood, budget.n_test, seed + 3),
        black: -stats.0 / stats.1,
    })
}

/// The prior: RBF hyperparameters by the Milios et al. marginal likelihood on a seeded subset;
/// `(prior, [variance, lengthscale], seconds)`.
pub(super) fn fit_prior(
    run: &mut Run,
    train: &Images,
    budget: &Budget,
    seed: u64,
) -> Result<(GpPrior, Vec<f64>, f64)> {
    let t0 = Instant::now();
    let sub = train.subset(budget.n_prior, seed + 5);
    let init = Rbf::new(1.0, (784f64).sqrt())?;
    let fit_cfg =
        FitConfig { iterations: budget.prior_iterations, restarts: 1, seed, ..FitConfig::default() };
    let prior: GpPrior = fit_classification_prior(&init, &sub.x, &sub.y, 10, 0.01, &fit_cfg)?;
    let hyper: Vec<f64> = prior.kernel.params().iter().map(|p| p.exp()).collect();
    let secs = t0.elapsed().as_secs_f64();
    run.log(format!(
        "  prior: RBF on {} images, (variance, lengthscale) = {hyper:.4?} in {secs:.1} s",
        sub.x.nrows()
    ));
    Ok((prior, hyper, secs))
}

/// Alg. 1: the CNN trained under the function-space prior with RND context points, its report
/// and seconds.
#[allow(clippy::too_many_arguments)]
pub(super) fn train_fsp(
    run: &mut Run,
    budget: &Budget,
    train: &Images,
    val: &Images,
    prior: &GpPrior,
    bbox: &BoundingBox,
    lik: &mut Categorical,
    seed: u64,
) -> Result<(Cnn, TrainReport, f64)> {
    let mut net = cnn(seed)?;
    let options = TrainOptions { train: train_config(budget, 0.0, seed), ..TrainOptions::default() };
    let t0 = Instant::now();
    let bar = run.progress(budget.epochs as u64, "FSP-Laplace epochs");
    let mut epoch_log = Vec::new();
    let report = fsp_train(
        &mut net,
        lik,
        prior,
        &train.x,
        &train.y,
        Some((&val.x, &val.y)),
        &UniformSampler::new(bbox.clone()),
        &options,
        |p| {
            bar.inc(1);
            epoch_log.push(format!(
                "{}: {:.1}/{:.4}",
                p.epoch,
                p.train_loss,
                p.validation_loss.unwrap_or(f64::NAN)
            ))
        },
    )?;
    bar.finish_and_clear();
    run.log(format!("  FSP-Laplace epochs (train objective / validation NLL): {}", epoch_log.join(", ")));
    Ok((net, report, t0.elapsed().as_secs_f64()))
}

/// Alg. 2 at `n_halton` Halton points of the widened box, the data term on a seeded subset
/// scaled by `N/m`; the posterior and its seconds.
#[allow(clippy::too_many_arguments)]
pub(super) fn fsp_posterior(
    net: &Cnn,
    lik: &Categorical,
    prior: &GpPrior,
    train: &Images,
    bbox: &BoundingBox,
    n_halton: usize,
    budget: &Budget,
    seed: u64,
) -> Result<(FspLaplace<Cnn>, f64)> {
    let t1 = Instant::now();
    let context = context_points(ContextDesign::Halton, bbox, n_halton, seed)?;
    let ggn = train.subset(budget.ggn_points, seed + 6);
    let cfg = FspLaplaceConfig {
        max_rank: budget.max_rank,
        ggn_scale: train.x.nrows() as f64 / ggn.x.nrows() as f64,
        ..FspLaplaceConfig::default()
    };
    let post = fsp_laplace(net, lik, prior, &ggn.x, &ggn.y, &context, &cfg)?;
    Ok((post, t1.elapsed().as_secs_f64()))
}

/// A KFAC Laplace fit, the marginal likelihood's λ and the validation NLL of each λ tried.
pub(super) type KfacFit = (fspace_laplace::LaplacePosterior<Cnn>, f64, Vec<(f64, f64)>);

/// Laplace (KFAC) around the MAP `map`: the GGN on a seeded subset of `kfac_points` training
/// images at temperature `N/m`, λ by the marginal likelihood, then the best of ×1 … ×10⁴ by the
/// (probit) NLL of `lambda_val` validation images. Returns the posterior, the marginal
/// likelihood's λ and the validation NLL of each λ tried.
pub(super) fn kfac_laplace(
    map: &Cnn,
    train: &Images,
    val: &Images,
    budget: &Budget,
    seed: u64,
) -> Result<KfacFit> {
    let n = train.x.nrows();
    let curv = train.subset(budget.kfac_points, seed + 7);
    let mut lap = laplace_fit(
        map.clone(),
        LikelihoodSpec::Categorical { classes: 10 },
        &Data::new(&curv.x, &crate::protocols::targets(&curv.y, 1))?,
        &LaplaceConfig {
            structure: Structure::Kfac,
            prior_precision: PriorPrecision::Scalar(1.0),
            temperature: n as f64 / curv.x.nrows() as f64,
            ..LaplaceConfig::default()
        },
    )?
    .posterior;
    lap.optimize_prior_precision(&MarglikConfig::default())?;
    let marglik_lambda = lap.prior_precision()[0];
    // The paper tunes the prior scale on validation ELL; the marginal likelihood's λ alone
    // leaves the KFAC predictive underconfident here (measured: ECE 0.083 at λ = 12.7 on
    // MNIST seed 0). So λ is picked by validation NLL from the marginal likelihood's value
    // upwards (×10 steps).
    let vsub = val.subset(budget.lambda_val, seed + 9);
    let grid: Vec<f64> = (0..5).map(|k| marglik_lambda * 10f64.powi(k)).collect();
    let scores = lap.gridsearch_prior_precision(&grid, &vsub.x, &vsub.y)?;
    Ok((lap, marglik_lambda, scores))
}
