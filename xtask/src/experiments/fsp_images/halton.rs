//! `fsp-mnist-halton`: the Halton covariance budget on one trained network.

use super::*;

/// `fsp-mnist-halton`: the effect of the number of Halton covariance points (the paper: 25 000;
/// `fsp-mnist`: `n_halton`). One MNIST network trained as in `fsp-mnist` (seed `--seed`), then
/// Alg. 2 at each size of the sweep on that same network, each posterior scored like the table.
pub fn run_halton_sweep(opts: &Options) -> Result<()> {
    let name = "fsp-mnist-halton";
    let budget = Budget { seeds: 1, ..Budget::new(opts) };
    let sizes: &[usize] = if opts.quick { &[50, 100, 200] } else { &[250, 500, 1_000, 2_000, 4_000] };
    let mut run = Run::new(&opts.out, name)?;
    run.log(format!("budget: {}; Halton points {sizes:?}", serde_json::to_string(&budget)?));
    let seed = opts.seed;
    let SeedData { train, val, test, ood, .. } =
        seed_data(ImageSet::Mnist, ImageSet::FashionMnist, &budget, seed)?;
    let (prior, hyper, _) = fit_prior(&mut run, &train, &budget, seed)?;
    let bbox = BoundingBox::from_data(&train.x, 0.5)?;
    let mut lik = Categorical::new(10)?;
    let (net, report, train_seconds) =
        train_fsp(&mut run, &budget, &train, &val, &prior, &bbox, &mut lik, seed)?;
    run.log(format!("  trained: {} epochs in {train_seconds:.1} s", report.epochs));
    let mut rows = Vec::new();
    let mut per_size = Vec::new();
    for &n_halton in sizes {
        let (post, secs) = fsp_posterior(&net, &lik, &prior, &train, &bbox, n_halton, &budget, seed)?;
        let rep = post.report();
        let row =
            evaluate("FSP-Laplace (RND)", Predictor::Samples(&post), &test, &ood, budget.samples, seed)?;
        run.log(format!(
            "  {n_halton} Halton points: Alg. 2 {secs:.1} s, Lanczos rank {} ({}), truncated {}, rank {}; \
             LL {:.4} ACC {:.4} ECE {:.4} OOD-ACC {:.3}",
            rep.lanczos_rank,
            rep.lanczos_stop,
            rep.truncated,
            rep.rank,
            row.metrics[0],
            row.metrics[1],
            row.metrics[2],
            row.metrics[3]
        ));
        let mut cells = vec![format!("{n_halton}")];
        cells.extend(row.metrics.iter().map(|&v| fmt(v)));
        cells.extend([
            format!("{secs:.0}"),
            format!("{} ({})", rep.lanczos_rank, rep.lanczos_stop),
            format!("{}", rep.truncated),
            format!("{}", rep.rank),
        ]);
        rows.push(cells);
        per_size.push(HaltonSize {
            halton_points: n_halton,
            log_likelihood: row.metrics[0],
            accuracy: row.metrics[1],
            ece: row.metrics[2],
            ood_accuracy: row.metrics[3],
            alg2_seconds: secs,
            laplace: serde_json::to_value(rep)?,
        });
        // After every size, so a long sweep leaves its finished rows behind.
        let paper: Vec<String> = (0..4).map(|k| fmt(PAPER_MNIST[k][1].0)).collect();
        let mut md = format!(
            "# {name}{}\n\nFSP-Laplace (RND) on MNIST, seed {seed}: one network trained as in `fsp-mnist` \
             ({} epochs, {train_seconds:.0} s), then Alg. 2 with each number of Halton covariance points \
             (the paper: 25 000; `fsp-mnist`: {}), Lanczos rank ≤ {}, the same data term; each posterior \
             scored on the {} test and {} Fashion-MNIST OOD images from {} function samples. Paper \
             (25 000 points, 5 seeds): LL {}, accuracy {}, ECE {}, OOD accuracy {}.\n\n",
            if opts.quick { " — quick mode" } else { "" },
            report.epochs,
            budget.n_halton,
            budget.max_rank,
            test.x.nrows(),
            ood.x.nrows(),
            budget.samples,
            paper[0],
            paper[1],
            paper[2],
            paper[3]
        );
        md += &markdown_table(
            &[
                "Halton points",
                "log-likelihood",
                "accuracy",
                "ECE",
                "OOD accuracy",
                "Alg. 2 seconds",
                "Lanczos rank (stop)",
                "truncated",
                "rank",
            ],
            &rows,
        );
        md += &format!("\n{}.\n", run.wall_time());
        run.write_table(&md)?;
        run.write_metrics(&HaltonMetrics {
            budget: serde_json::to_value(&budget)?,
            seed,
            prior: hyper.clone(),
            epochs: report.epochs,
            train_seconds,
            per_size: per_size.clone(),
        })?;
    }
    Ok(())
}

/// One number of Halton covariance points.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct HaltonSize {
    /// Halton points of Alg. 2.
    pub halton_points: usize,
    /// Mean log predictive probability of the test label.
    pub log_likelihood: f64,
    /// Test accuracy.
    pub accuracy: f64,
    /// Expected calibration error.
    pub ece: f64,
    /// OOD accuracy.
    pub ood_accuracy: f64,
    /// Seconds of Alg. 2.
    pub alg2_seconds: f64,
    /// FSP-Laplace's report (ranks, Lanczos stop, truncation).
    pub laplace: Value,
}

/// `fsp-mnist-halton`'s `metrics.json`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct HaltonMetrics {
    /// The run's sizes.
    pub budget: Value,
    /// The seed.
    pub seed: u64,
    /// The prior's fitted variance and lengthscale.
    pub prior: Vec<f64>,
    /// Epochs the network trained.
    pub epochs: usize,
    /// Training seconds.
    pub train_seconds: f64,
    /// Per number of Halton points.
    pub per_size: Vec<HaltonSize>,
}
