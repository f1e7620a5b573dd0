//! One (seed, method) row, its resumable storage in `metrics.json`, and the table and figures.

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

impl Row {
    pub(super) fn to_json(&self, seed: u64) -> Value {
        json!({
            "seed": seed, "method": self.method, "fit_seconds": self.fit_seconds,
            "log_likelihood": self.metrics[0], "accuracy": self.metrics[1], "ece": self.metrics[2],
            "ood_accuracy": self.metrics[3], "per_sample_expected_log_likelihood": self.sample_ell,
            "entropy_histogram": self.entropy.as_ref().map(|(id, ood)| json!({
                "bins": ENTROPY_BINS, "range": [0.0, 10f64.ln()], "id": id, "ood": ood,
            })),
            "extra": self.extra,
        })
    }

    /// The inverse of [`Row::to_json`] (for `--resume`).
    pub(super) fn from_json(v: &Value) -> Result<(u64, Row)> {
        let name = v["method"].as_str().ok_or_else(|| anyhow!("a per_seed row without a method"))?;
        let method = *METHODS
            .iter()
            .find(|m| **m == name)
            .ok_or_else(|| anyhow!("unknown method {name:?} in a per_seed row"))?;
        let num = |k: &str| v[k].as_f64().ok_or_else(|| anyhow!("the {name} row has no number {k:?}"));
        let seed = v["seed"].as_u64().ok_or_else(|| anyhow!("the {name} row has no seed"))?;
        let counts = |k: &str| -> Option<Vec<u64>> {
            let a = v["entropy_histogram"][k].as_array()?;
            let c: Vec<u64> = a.iter().filter_map(Value::as_u64).collect();
            (c.len() == ENTROPY_BINS && c.len() == a.len()).then_some(c)
        };
        let row = Row {
            method,
            metrics: [num("log_likelihood")?, num("accuracy")?, num("ece")?, num("ood_accuracy")?],
            sample_ell: num("per_sample_expected_log_likelihood")?,
            fit_seconds: num("fit_seconds")?,
            entropy: counts("id").zip(counts("ood")),
            extra: v["extra"].clone(),
        };
        Ok((seed, row))
    }
}

/// The rows of an earlier run's `metrics.json` (none if it does not exist); an error if it was
/// written with another budget (other than the number of seeds).
pub(super) fn load_rows(path: &std::path::Path, budget: &Budget) -> Result<Vec<(u64, Row)>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let old: Value = serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    let without_seeds = |b: &Value| {
        let mut b = b.clone();
        if let Some(o) = b.as_object_mut() {
            o.remove("seeds");
        }
        b
    };
    if without_seeds(&old["budget"]) != without_seeds(&serde_json::to_value(budget)?) {
        bail!(
            "{} was written with another budget ({}); --resume only continues a run of the same settings",
            path.display(),
            old["budget"]
        );
    }
    old["per_seed"]
        .as_array()
        .ok_or_else(|| anyhow!("{} has no per_seed rows", path.display()))?
        .iter()
        .map(Row::from_json)
        .collect()
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

pub(super) fn report(
    run: &mut Run,
    (name, title, ood_title): (&str, &str, &str),
    paper: &PaperTable,
    rows: &[(u64, Row)],
    budget: &Budget,
) -> Result<()> {
    let seeds: Vec<u64> = {
        let mut s: Vec<u64> = rows.iter().map(|r| r.0).collect();
        s.sort_unstable();
        s.dedup();
        s
    };
    let mut summary = serde_json::Map::new();
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
                    .or_insert_with(|| json!({}))
                    .as_object_mut()
                    .expect("object")
                    .insert(
                        metric.to_string(),
                        json!({ "mean": m, "se": se, "paper": [pm, pse], "per_seed": ours }),
                    );
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
        "\n{} (so far).\n\nFigure: `entropy.png` (Fig. C.10: predictive entropy of ID and OOD test images, all seeds).\n",
        run.wall_time()
    );

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
    line_panels(&run.path("entropy.png"), &panels, 2)?;
    run.write_table(&md)?;
    let per_seed: Vec<Value> = rows.iter().map(|(seed, r)| r.to_json(*seed)).collect();
    run.write_metrics(&json!({
        "budget": budget,
        "summary": summary,
        "not_run": NOT_RUN.iter().map(|(c, w)| json!({ "column": c, "reason": w })).collect::<Vec<_>>(),
        "per_seed": per_seed,
    }))?;
    Ok(())
}
