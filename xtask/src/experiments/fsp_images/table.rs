//! One (seed, method) row, its typed record (`metrics.json` and the checkpoint), and the table
//! and figures.

use std::collections::BTreeMap;
use std::path::Path;

use super::*;

/// One method's numbers on one seed.
#[derive(Debug)]
pub(super) struct Row {
    pub(super) method: &'static str,
    /// `[log-likelihood, accuracy, ECE, OOD accuracy]`.
    pub(super) metrics: [f64; 4],
    /// Mean over samples of the per-sample log-likelihood (the literal expectation).
    pub(super) sample_ell: f64,
    pub(super) fit_seconds: f64,
    /// Histogram counts of the predictive entropies of the ID and OOD test images
    /// (`None`: a resumed row written before the histograms were stored).
    pub(super) entropy: Option<EntropyHistograms>,
    pub(super) extra: Value,
}

/// A [`Row`] as `metrics.json`'s `per_seed` entries and the checkpoint's units hold it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RowRecord {
    /// The seed of the data split and the fits.
    pub seed: u64,
    /// One of the methods run (a Table 2 column).
    pub method: String,
    /// Wall seconds of the fit (for Laplace: its MAP's and its own).
    pub fit_seconds: f64,
    /// Mean log predictive probability of the test label.
    #[serde(deserialize_with = "or_nan")]
    pub log_likelihood: f64,
    /// Test accuracy.
    #[serde(deserialize_with = "or_nan")]
    pub accuracy: f64,
    /// Expected calibration error.
    #[serde(deserialize_with = "or_nan")]
    pub ece: f64,
    /// Accuracy of the predictive-entropy threshold between ID and OOD test images.
    #[serde(deserialize_with = "or_nan")]
    pub ood_accuracy: f64,
    /// Mean over samples of the per-sample log-likelihood (the literal expectation).
    #[serde(deserialize_with = "or_nan")]
    pub per_sample_expected_log_likelihood: f64,
    /// The predictive-entropy histograms (`None`: a row from before they were stored).
    pub entropy_histogram: Option<EntropyRecord>,
    /// The method's own details (epochs, chosen prior precision, Lanczos report…).
    pub extra: Value,
}

/// One Table 2 cell: ours over seeds beside the paper's.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CellStats {
    /// Mean over seeds.
    #[serde(deserialize_with = "or_nan")]
    pub mean: f64,
    /// Standard error over seeds (NaN with one seed).
    #[serde(deserialize_with = "or_nan")]
    pub se: f64,
    /// The paper's mean and standard error.
    pub paper: [f64; 2],
    /// Each seed's value.
    #[serde(deserialize_with = "or_nan_vec")]
    pub per_seed: Vec<f64>,
}

/// A Table 2 column we do not run, and why.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct NotRun {
    /// The column.
    pub column: String,
    /// Why.
    pub reason: String,
}

/// `metrics.json` of `fsp-mnist` / `fsp-fmnist`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Metrics {
    /// The run's sizes (epochs, context points, subsets…).
    pub budget: Value,
    /// Per column, per metric.
    pub summary: BTreeMap<String, BTreeMap<String, CellStats>>,
    /// The columns without our numbers.
    pub not_run: Vec<NotRun>,
    /// Every (seed, method) row.
    pub per_seed: Vec<RowRecord>,
}

/// Counts of the ID and OOD predictive entropies on `bins` equal bins of `range`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EntropyRecord {
    /// Number of bins ([`ENTROPY_BINS`]).
    pub bins: usize,
    /// `[0, ln 10]`.
    pub range: [f64; 2],
    /// Counts of the in-distribution test images.
    pub id: Vec<u64>,
    /// Counts of the OOD test images.
    pub ood: Vec<u64>,
}

impl Row {
    pub(super) fn record(&self, seed: u64) -> RowRecord {
        RowRecord {
            seed,
            method: self.method.to_string(),
            fit_seconds: self.fit_seconds,
            log_likelihood: self.metrics[0],
            accuracy: self.metrics[1],
            ece: self.metrics[2],
            ood_accuracy: self.metrics[3],
            per_sample_expected_log_likelihood: self.sample_ell,
            entropy_histogram: self.entropy.as_ref().map(|(id, ood)| EntropyRecord {
                bins: ENTROPY_BINS,
                range: [0.0, 10f64.ln()],
                id: id.clone(),
                ood: ood.clone(),
            }),
            extra: self.extra.clone(),
        }
    }

    /// The inverse of [`Row::record`] (for `--resume`): an unknown method is an error, and
    /// histograms of another binning are dropped (the figure then leaves that row out).
    pub(super) fn from_record(r: RowRecord) -> Result<(u64, Row)> {
        let method = *METHODS
            .iter()
            .find(|m| **m == r.method)
            .ok_or_else(|| anyhow!("unknown method {:?} in a stored row", r.method))?;
        let entropy = r
            .entropy_histogram
            .filter(|h| h.bins == ENTROPY_BINS && h.id.len() == ENTROPY_BINS && h.ood.len() == ENTROPY_BINS)
            .map(|h| (h.id, h.ood));
        let metrics = [r.log_likelihood, r.accuracy, r.ece, r.ood_accuracy];
        let row = Row {
            method,
            metrics,
            sample_ell: r.per_sample_expected_log_likelihood,
            fit_seconds: r.fit_seconds,
            entropy,
            extra: r.extra,
        };
        Ok((r.seed, row))
    }
}

/// The checkpoint key of one (seed, method) row.
pub(super) fn row_key(seed: u64, method: &str) -> String {
    format!("seed {seed}/{method}")
}

/// The settings a stored row depends on: the budget, less the number of seeds (another seed
/// count is the same run continued).
pub(super) fn checkpoint_settings(budget: &Budget) -> Result<Value> {
    let mut b = serde_json::to_value(budget)?;
    if let Some(o) = b.as_object_mut() {
        o.remove("seeds");
    }
    Ok(b)
}

/// The rows of `seeds` an earlier part stored in the checkpoint, in (seed, method) order.
pub(super) fn stored_rows(
    ck: &Checkpoint<Timed<RowRecord>>,
    seeds: impl Iterator<Item = u64>,
) -> Result<Vec<(u64, Row)>> {
    let mut rows = Vec::new();
    for seed in seeds {
        for method in METHODS {
            if let Some(unit) = ck.get(&row_key(seed, method))? {
                rows.push(Row::from_record(unit.value)?);
            }
        }
    }
    Ok(rows)
}

pub(super) fn log_row(run: &mut Run, row: &Row) {
    run.log(format!(
        "  {:<18} fit {:8.1} s  LL {:.4}  ACC {:.4}  ECE {:.4}  OOD-ACC {:.3}  (E_s log p_s {:.4})",
        row.method,
        row.fit_seconds,
        row.metrics[0],
        row.metrics[1],
        row.metrics[2],
        row.metrics[3],
        row.sample_ell
    ));
}

/// Counts of the entropies `v` on [`ENTROPY_BINS`] equal bins of `[0, ln 10]` (the last bin
/// takes anything above).
pub(super) fn entropy_counts(v: &[f64]) -> Vec<u64> {
    let width = 10f64.ln() / ENTROPY_BINS as f64;
    let mut counts = vec![0u64; ENTROPY_BINS];
    for &e in v {
        counts[((e / width) as usize).min(ENTROPY_BINS - 1)] += 1;
    }
    counts
}

/// Histogram densities `(bin centre, density)` of summed [`entropy_counts`].
pub(super) fn density(counts: &[u64]) -> Vec<(f64, f64)> {
    let width = 10f64.ln() / counts.len() as f64;
    let total = counts.iter().sum::<u64>().max(1) as f64;
    counts.iter().enumerate().map(|(b, &c)| ((b as f64 + 0.5) * width, c as f64 / (total * width))).collect()
}

/// Writes the table, `metrics.json` and the entropy figure of `rows`; `finished` marks the
/// run's last write (before it, the wall-time line says "(so far)").
pub(super) fn report(
    run: &mut Run,
    (name, title, ood_title): (&str, &str, &str),
    paper: &PaperTable,
    rows: &[(u64, Row)],
    budget: &Budget,
    finished: bool,
) -> Result<()> {
    let seeds: Vec<u64> = {
        let mut s: Vec<u64> = rows.iter().map(|r| r.0).collect();
        s.sort_unstable();
        s.dedup();
        s
    };
    let mut summary: BTreeMap<String, BTreeMap<String, CellStats>> = BTreeMap::new();
    let mut table = Vec::new();
    for (k, metric) in METRICS.iter().enumerate() {
        let mut cells = vec![metric.to_string()];
        for (c, column) in COLUMNS.iter().enumerate() {
            let (pm, pse) = paper[k][c];
            let ours: Vec<f64> =
                rows.iter().filter(|r| r.1.method == *column).map(|r| r.1.metrics[k]).collect();
            let mine = if ours.is_empty() {
                "—".to_string()
            } else {
                let (m, se) = mean_se(&ours);
                summary
                    .entry(column.to_string())
                    .or_default()
                    .insert(metric.to_string(), CellStats { mean: m, se, paper: [pm, pse], per_seed: ours });
                pm_cell((m, se))
            };
            cells.push(format!("{mine} ({} ± {})", fmt(pm), fmt(pse)));
        }
        table.push(cells);
    }
    let mut header = vec!["metric"];
    header.extend(COLUMNS.iter());
    let mut md = format!(
        "# {name}\n\nFSP-Laplace Table 2, {title}: ours as mean ± standard error over {} seed(s) \
         ({seeds:?}), the paper's (5 seeds, GPU) in parentheses. Every entry from {} posterior \
         function samples; log-likelihood = mean log predictive probability of the test label.\n\n",
        seeds.len(),
        budget.samples
    );
    md += &markdown_table(&header, &table);
    md += "\n## Columns without our numbers\n\n";
    for (column, why) in NOT_RUN {
        md += &format!("* **{column}**: {why}.\n");
    }
    // The must-show: FSP-Laplace (RND) accuracy and ECE within two standard errors of the paper.
    let fsp: Vec<&Row> = rows.iter().filter(|r| r.1.method == "FSP-Laplace (RND)").map(|r| &r.1).collect();
    if !fsp.is_empty() {
        md += "\n## FSP-Laplace (RND) against the paper\n\n";
        for (k, metric) in [(1, "accuracy"), (2, "ECE")] {
            let (m, se) = mean_se(&fsp.iter().map(|r| r.metrics[k]).collect::<Vec<_>>());
            let (pm, pse) = paper[k][1];
            // Two standard errors of the difference (both SEs; the paper's are rounded to 3 d.p.).
            let se_diff = (se.max(0.0).powi(2) + pse.powi(2)).sqrt();
            let verdict = if se.is_nan() {
                "one seed: no standard error".to_string()
            } else if (m - pm).abs() <= 2.0 * se_diff {
                format!("within 2 SE ({} ≤ {})", fmt((m - pm).abs()), fmt(2.0 * se_diff))
            } else {
                format!("**outside** 2 SE ({} > {})", fmt((m - pm).abs()), fmt(2.0 * se_diff))
            };
            md += &format!("* {metric}: ours {} vs paper {} — {verdict}\n", fmt(m), fmt(pm));
        }
    }
    let mut times = Vec::new();
    for column in METHODS {
        let secs: Vec<f64> = rows.iter().filter(|r| r.1.method == column).map(|r| r.1.fit_seconds).collect();
        if !secs.is_empty() {
            times.push(vec![column.to_string(), fmt(mean_se(&secs).0)]);
        }
    }
    md += &format!(
        "\n## Budget and fit times\n\nSettings (the paper's in brackets): Halton covariance points {} [25 000], \
         Lanczos rank ≤ {} [500], Alg. 2's data term on {} training images scaled by N/m [all], KFAC statistics \
         on {} images scaled by N/m [all], at most {} epochs with patience {} [early stopping], prior fitted on \
         {} images [minibatches of all], MAP prior precision 1, Laplace λ by marginal likelihood then validation NLL on {} images, \
         sparse GP with {} random training images as inducing inputs, FVI at most {} epochs with {} function \
         samples per step [early stopping; samples not stated].\n\n",
        budget.n_halton,
        budget.max_rank,
        budget.ggn_points,
        budget.kfac_points,
        budget.epochs,
        budget.patience,
        budget.n_prior,
        budget.lambda_val,
        budget.inducing,
        budget.fvi_epochs,
        budget.fvi_samples
    );
    md += &markdown_table(&["method", "fit seconds (mean over seeds, 2 cores)"], &times);
    md += &format!(
        "\n{}{}.\n\nFigure: `entropy.png` (Fig. C.10: predictive entropy of ID and OOD test images, all seeds).\n",
        run.wall_time(),
        if finished { "" } else { " (so far)" }
    );

    draw_entropy(&run.path("entropy.png"), (title, ood_title), rows)?;
    run.write_table(&md)?;
    let per_seed: Vec<RowRecord> = rows.iter().map(|(seed, r)| r.record(*seed)).collect();
    run.write_metrics(&Metrics {
        budget: serde_json::to_value(budget)?,
        summary,
        not_run: NOT_RUN
            .iter()
            .map(|(c, w)| NotRun { column: c.to_string(), reason: w.to_string() })
            .collect(),
        per_seed,
    })?;
    Ok(())
}

/// `entropy.png` (Fig. C.10): per method, the density of the predictive entropies of the ID
/// and OOD test images, summed over the seeds whose rows hold histograms.
pub(super) fn draw_entropy(path: &Path, (title, ood_title): (&str, &str), rows: &[(u64, Row)]) -> Result<()> {
    let panels: Vec<LinePanel> = ["FSP-Laplace (RND)", "FVI (RND)", "Laplace", "MAP", "Sparse GP"]
        .iter()
        .filter_map(|column| {
            let mine: Vec<&EntropyHistograms> =
                rows.iter().filter(|r| r.1.method == *column).filter_map(|r| r.1.entropy.as_ref()).collect();
            if mine.is_empty() {
                return None;
            }
            let sum = |part: fn(&EntropyHistograms) -> &Vec<u64>| {
                (0..ENTROPY_BINS).map(|b| mine.iter().map(|h| part(h)[b]).sum()).collect::<Vec<u64>>()
            };
            let (id, ood) = (sum(|h| &h.0), sum(|h| &h.1));
            Some(LinePanel {
                title: format!("{column}: predictive entropy ({} seed(s))", mine.len()),
                labels: ("entropy (nats; max ln 10 ≈ 2.30)".into(), "density".into()),
                series: vec![
                    (format!("ID ({title} test)"), density(&id)),
                    (format!("OOD ({ood_title} test)"), density(&ood)),
                ],
                log_x: false,
            })
        })
        .collect();
    line_panels(path, &panels, 2)
}
