//! Experiments run end to end through the harness (in process, quick budgets), their outputs
//! read back through the experiments' own typed metrics (`metrics.json` deserialised into the
//! structs that wrote it), so a renamed or missing field fails here rather than downstream.

use std::path::{Path, PathBuf};

use anyhow::Result;
use xtask::experiments::{fsp_null_space, gfsvi_uci, gl_cubic, valla_images, valla_regression};
use xtask::harness::cli;
use xtask::EXPERIMENTS;

/// `cargo xtask reproduce NAME --quick --out OUT` plus `extra`, in process.
fn quick(name: &str, out: &Path, extra: &[&str]) -> Result<()> {
    let out = out.to_string_lossy().into_owned();
    let mut args = vec!["reproduce", name, "--quick", "--out", out.as_str()];
    args.extend_from_slice(extra);
    let parsed = cli::parse(EXPERIMENTS, args).map_err(|e| anyhow::anyhow!("{e}"))?;
    cli::dispatch(EXPERIMENTS, parsed)
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("fspace-e2e-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn read(dir: &Path, file: &str) -> String {
    std::fs::read_to_string(dir.join(file)).unwrap_or_else(|e| panic!("{}: {e}", dir.join(file).display()))
}

/// `dir/metrics.json` as the experiment's metrics type.
fn metrics<T: serde::de::DeserializeOwned>(dir: &Path) -> T {
    serde_json::from_str(&read(dir, "metrics.json")).expect("metrics.json has the experiment's typed shape")
}

#[test]
fn the_null_space_experiment_runs_end_to_end_in_quick_mode() {
    // The harness end to end on its cheapest experiment: files written, metrics sane.
    let out = scratch("null-space");
    quick("fsp-null-space", &out, &[]).unwrap();
    let dir = out.join("fsp-null-space");
    let m: fsp_null_space::Metrics = metrics(&dir);
    assert_eq!(m.keys().map(String::as_str).collect::<Vec<_>>(), ["matern12", "rbf"]);
    for (kernel, r) in &m {
        for (task, v) in [("regression", r.regression), ("classification", r.classification)] {
            assert!((0.0..0.1).contains(&v), "{kernel}/{task}: {v}");
        }
    }
    assert_eq!(m["rbf"].paper_regression, 1.026e-7);
    assert!(read(&dir, "table.md").contains("Table C.2"));
    assert!(dir.join("log.txt").exists());
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn the_valla_regression_table_runs_end_to_end_in_quick_mode() {
    // Every method of VaLLA Fig. 2 (left) on Boston: finite metrics, and the last-layer KFAC
    // of a one-output Gaussian head equals the dense last-layer Laplace (its output factor is
    // 1 × 1, so the Kronecker product is exact).
    let out = scratch("valla-regression");
    quick("valla-regression", &out, &[]).unwrap();
    let dir = out.join("valla-regression");
    let m: valla_regression::Metrics = metrics(&dir);
    assert!(m.quick);
    let boston = |method: &str| &m.summary[method]["boston"];
    let methods =
        ["MAP", "LLA Diag", "LLA KFAC", "LLA* (last layer)", "LLA* KFAC", "ELLA", "VaLLA 100", "VaLLA 200"];
    assert_eq!(m.summary.len(), methods.len());
    for method in methods {
        let s = boston(method);
        for (k, v) in [("NLL", s.nll.mean), ("CRPS", s.crps.mean), ("CQM", s.cqm.mean)] {
            assert!(v.is_finite(), "{method}/{k}: {v}");
        }
        assert!((0.0..=0.5).contains(&s.cqm.mean), "{method}: CQM {}", s.cqm.mean);
        assert_eq!(s.fit_seconds.len(), m.seeds);
    }
    assert!((boston("LLA* (last layer)").nll.mean - boston("LLA* KFAC").nll.mean).abs() < 1e-8);
    assert!(read(&dir, "table.md").contains("Not the paper's data"));
    // The calibration curves behind CQM: 11 levels, coverage non-decreasing from 0 to 1.
    assert!(dir.join("calibration.png").exists());
    assert_eq!(m.per_seed.len(), methods.len() * m.seeds);
    for row in &m.per_seed {
        let curve = &row.cqm_curve;
        assert_eq!(curve.len(), 11);
        assert!(
            curve.windows(2).all(|w| w[1].1 >= w[0].1) && curve[0].1 == 0.0 && curve[10].1 == 1.0,
            "{}: {curve:?}",
            row.method
        );
    }
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn the_gfsvi_tables_choose_gamma_by_validation_and_resume_with_the_choice() {
    // `--gamma` with two values on one quick yacht fold (the second, by `--folds`): GFSVI and
    // TFSVI each fit once per γ, the table names the γ with the lower validation NLL in the
    // log, every score is finite, a resume keeps every unit and choice, and another grid is
    // refused.
    let out = scratch("gamma");
    let flags = ["--gamma", "1e-10,1e-6", "--sets", "yacht", "--folds", "2"];
    quick("gfsvi-uci", &out, &flags).unwrap();
    let dir = out.join("gfsvi-uci");
    let (log, table) = (read(&dir, "log.txt"), read(&dir, "table.md"));
    assert!(log.contains("yacht: fold 2 (") && !log.contains("yacht: fold 1 ("), "{log}");
    assert!(table.starts_with("# gfsvi-uci: fold 2 of 5-fold CV"), "{table}");
    let chosen = |table: &str| {
        table.split("Chosen, fold by fold: ").nth(1).unwrap().split(". ").next().unwrap().to_string()
    };
    let mut expected = Vec::new();
    for method in ["GFSVI", "TFSVI"] {
        let nll = |g: &str| -> f64 {
            let tag = format!("yacht {method} γ = {g}: best validation NLL ");
            let rest = log.split(&tag).nth(1).unwrap_or_else(|| panic!("no {tag:?} in the log"));
            rest.split_whitespace().next().unwrap().parse().unwrap()
        };
        let best = if nll("1e-6") < nll("1e-10") { "1e-6" } else { "1e-10" };
        expected.push(format!("yacht {method} {best}"));
    }
    assert_eq!(chosen(&table), expected.join("; "));
    let m: gfsvi_uci::Metrics = metrics(&dir);
    for method in ["GFSVI", "FVI", "TFSVI", "MFVI", "Laplace", "SVGP", "GP"] {
        for j in 0..3 {
            let stats = &m[&format!("yacht/{method}/{j}")];
            assert!(stats.mean.is_finite() && stats.folds.len() == 1, "{method}/{j}: {stats:?}");
            assert!(stats.seconds[0] > 0.0, "{method}: every unit is timed");
        }
    }
    let resumed = [&flags[..], &["--resume"]].concat();
    quick("gfsvi-uci", &out, &resumed).unwrap();
    assert!(read(&dir, "log.txt").contains("yacht fold 2: every method in checkpoint.json"));
    assert_eq!(chosen(&read(&dir, "table.md")), expected.join("; "));
    let again: gfsvi_uci::Metrics = metrics(&dir);
    for (key, stats) in &m {
        assert_eq!((&stats.folds, &stats.seconds), (&again[key].folds, &again[key].seconds), "{key}");
    }
    let other = ["--gamma", "1e-6", "--sets", "yacht", "--folds", "2", "--resume"];
    assert!(quick("gfsvi-uci", &out, &other).is_err(), "a resume under another γ grid must be refused");
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn the_cubic_toy_runs_end_to_end_in_quick_mode() {
    // Generalized Laplace Fig. 2 with every structure, from the empirical Fisher (the paper's)
    // and from the GGN: the full curvature's GLM std is each source's reference (ratio 1),
    // every structure's uncertainty is finite and positive, the two sources differ, plots exist.
    let out = scratch("cubic");
    quick("gl-cubic-toy", &out, &[]).unwrap();
    let dir = out.join("gl-cubic-toy");
    let m: gl_cubic::Metrics = metrics(&dir);
    for (source, sm) in [("empirical Fisher", &m.empirical_fisher), ("GGN", &m.ggn)] {
        assert_eq!(sm.structures["full"].std_in_over_full, 1.0);
        assert_eq!(sm.structures.len(), 5);
        for (name, s) in &sm.structures {
            for (key, v) in [
                ("std_in", s.std_in),
                ("std_out", s.std_out),
                ("mc_std_in", s.mc_std_in),
                ("marglik_lambda", s.marglik_lambda),
            ] {
                assert!(v.is_finite() && v > 0.0, "{source} {name}/{key}: {v}");
            }
        }
        assert_eq!(sm.order_glm_std_in.len(), 4);
    }
    let (ef, ggn) = (&m.empirical_fisher.structures["diag"], &m.ggn.structures["diag"]);
    assert!((ef.std_in / ggn.std_in - 1.0).abs() > 1e-6, "the two curvatures give the same diagonal");
    assert_eq!(m.order_paper, ["kfac", "diag", "ekfac", "block_diag"]);
    for png in ["predictive.png", "predictive_mc.png", "predictive_ggn.png"] {
        assert!(dir.join(png).exists(), "{png}");
    }
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn methods_fits_a_subset_and_a_resumed_subset_keeps_the_rows_already_fitted() {
    // valla-mnist's quick budget with two cheap rows, then --resume with another: the MAP is
    // retrained to the same fingerprint, the first run's row is kept, and the caption names the
    // rows no run has fitted.
    let out = scratch("valla-methods");
    quick("valla-mnist", &out, &["--methods", "MAP,LLA* KFAC"]).unwrap();
    let dir = out.join("valla-mnist");
    let first: valla_images::Metrics = metrics(&dir);
    assert_eq!(first.summary.keys().map(String::as_str).collect::<Vec<_>>(), ["LLA* KFAC", "MAP"]);
    quick("valla-mnist", &out, &["--methods", "LLA Diag", "--resume"]).unwrap();
    let m: valla_images::Metrics = metrics(&dir);
    assert_eq!(m.summary.keys().map(String::as_str).collect::<Vec<_>>(), ["LLA Diag", "LLA* KFAC", "MAP"]);
    assert_eq!(m.summary["LLA* KFAC"].nll.mean, first.summary["LLA* KFAC"].nll.mean);
    let table = read(&dir, "table.md");
    assert!(
        table.contains(
            "Not in this run: LLA KFAC, LLA* (last layer), ELLA, Sampled LLA, VaLLA 100, VaLLA 200."
        ),
        "{table}"
    );
    // A row the table does not have is refused before anything runs.
    let err = quick("valla-mnist", &out, &["--methods", "VaLLA 300"]).unwrap_err().to_string();
    assert!(err.contains("has no row \"VaLLA 300\""), "{err}");
    let _ = std::fs::remove_dir_all(&out);
}
