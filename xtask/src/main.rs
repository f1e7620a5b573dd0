//! `cargo xtask` — the fspace task runner (alias in `.cargo/config.toml`).
//!
//! * `cargo xtask list` — the experiments this checkout can run.
//! * `cargo xtask reproduce [NAME…] [--quick] [--seed N] [--seeds K] [--out DIR] [--resume]
//!   [--gamma G[,G…]] [--sets S[,S…]] [--folds F[,F…]]` —
//!   runs the named experiments (no name: the quick default suite) and writes `results/NAME/`;
//!   `--seeds K` overrides the number of seeds of the multi-seed experiments (the image tables);
//!   `--resume` keeps the finished units of an earlier run of the same settings and computes
//!   only the rest (`fsp-mnist`, `fsp-fmnist`, `fsp-uci`, `gfsvi-uci`, `gfsvi-ood`, `gfsvi-w2`,
//!   `fsp-bayesopt`, `fsp-mauna-loa`:
//!   hours on 2 cores, so a full run can span several sittings); `--gamma` sets GFSVI's and
//!   TFSVI's regulariser in `gfsvi-uci` / `gfsvi-ood` (several values: chosen per fold by the
//!   validation NLL; default {1e-10 (the paper's), 1e-6} chosen so), `--sets` which of their
//!   data sets run and `--folds` which of the five folds (both also for `gfsvi-w2`).

use anyhow::{bail, Result};

mod experiments;
mod plot;
mod report;

use experiments::{Experiment, Options, EXPERIMENTS};

fn parse(args: &[String]) -> Result<Options> {
    let mut opts = Options {
        names: vec![],
        quick: false,
        seed: 0,
        seeds: None,
        out: "results".into(),
        resume: false,
        gammas: None,
        sets: None,
        folds: None,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--quick" => opts.quick = true,
            "--resume" => opts.resume = true,
            "--seed" => {
                let v = it.next().ok_or_else(|| anyhow::anyhow!("--seed needs a value"))?;
                opts.seed = v
                    .parse()
                    .map_err(|e| anyhow::anyhow!("--seed {v:?} is not a non-negative integer: {e}"))?;
            }
            "--seeds" => {
                let v = it.next().ok_or_else(|| anyhow::anyhow!("--seeds needs a value"))?;
                let k: usize =
                    v.parse().map_err(|e| anyhow::anyhow!("--seeds {v:?} is not a positive integer: {e}"))?;
                if k == 0 {
                    bail!("--seeds must be at least 1");
                }
                opts.seeds = Some(k);
            }
            "--out" => opts.out = it.next().ok_or_else(|| anyhow::anyhow!("--out needs a value"))?.clone(),
            "--sets" => {
                let v = it.next().ok_or_else(|| anyhow::anyhow!("--sets needs a value"))?;
                opts.sets = Some(comma_list("--sets", v)?.into_iter().map(String::from).collect());
            }
            "--gamma" => {
                let v = it.next().ok_or_else(|| anyhow::anyhow!("--gamma needs a value"))?;
                opts.gammas = Some(parse_gammas(v)?);
            }
            "--folds" => {
                let v = it.next().ok_or_else(|| anyhow::anyhow!("--folds needs a value"))?;
                opts.folds = Some(parse_folds(v)?);
            }
            flag if flag.starts_with("--") => bail!("unknown option {flag}"),
            name => opts.names.push(name.to_string()),
        }
    }
    if opts.folds.is_some() && opts.seeds.is_some() {
        bail!("--folds and --seeds both choose the folds of the GFSVI tables; give one");
    }
    Ok(opts)
}

/// `--folds F[,F…]`: folds of the 5-fold CV, numbered from 1, no repeats; kept in ascending order.
fn parse_folds(v: &str) -> Result<Vec<usize>> {
    let mut folds = Vec::new();
    for part in comma_list("--folds", v)? {
        let f: usize =
            part.parse().map_err(|e| anyhow::anyhow!("--folds {part:?} is not a fold number: {e}"))?;
        if !(1..=5).contains(&f) {
            bail!("--folds {part:?}: the GFSVI tables have folds 1 to 5");
        }
        if folds.contains(&f) {
            bail!("--folds {v:?} names fold {f} twice");
        }
        folds.push(f);
    }
    folds.sort_unstable();
    Ok(folds)
}

/// The items of a comma-separated `flag` value, trimmed; an empty item or a repeat is an error.
fn comma_list<'a>(flag: &str, v: &'a str) -> Result<Vec<&'a str>> {
    let mut items: Vec<&str> = Vec::new();
    for item in v.split(',').map(str::trim) {
        if item.is_empty() {
            bail!("{flag} {v:?}: an item is empty");
        }
        if items.contains(&item) {
            bail!("{flag} {v:?} names {item:?} twice");
        }
        items.push(item);
    }
    Ok(items)
}

/// `--gamma G[,G…]`: one or more regularisers, each finite and positive, no repeats.
fn parse_gammas(v: &str) -> Result<Vec<f64>> {
    let mut gammas: Vec<f64> = Vec::new();
    for part in comma_list("--gamma", v)? {
        let g: f64 = part.parse().map_err(|e| anyhow::anyhow!("--gamma {part:?} is not a number: {e}"))?;
        if !(g.is_finite() && g > 0.0) {
            bail!("--gamma {part:?}: γ must be finite and > 0");
        }
        if gammas.contains(&g) {
            bail!("--gamma {v:?} names {g:e} twice");
        }
        gammas.push(g);
    }
    Ok(gammas)
}

fn list() {
    if EXPERIMENTS.is_empty() {
        println!("No experiments are registered yet: the method crates that provide them");
        println!("(FSP-Laplace, GFSVI, VaLLA, generalised Laplace) have not landed.");
        println!("What this checkout provides today is library code and its tests:");
        println!("  cargo test --workspace --release");
        return;
    }
    println!("{:<28} {:<8} paper", "name", "default");
    for e in EXPERIMENTS {
        println!("{:<28} {:<8} {}", e.name, if e.in_default_suite { "yes" } else { "" }, e.paper);
    }
}

/// The experiments `--gamma` applies to; naming any other with it is an error, not a silent
/// no-op.
const UCI_TABLE_EXPERIMENTS: [&str; 2] = ["gfsvi-uci", "gfsvi-ood"];
/// The experiments `--sets` and `--folds` apply to (the GFSVI tables over the shipped UCI sets).
const SET_EXPERIMENTS: [&str; 3] = ["gfsvi-uci", "gfsvi-ood", "gfsvi-w2"];

fn reproduce(opts: &Options) -> Result<()> {
    for name in &opts.names {
        if !EXPERIMENTS.iter().any(|e| e.name == name) {
            bail!("unknown experiment {name:?}; `cargo xtask list` shows the available ones");
        }
    }
    let only =
        |allowed: &[&str]| !opts.names.is_empty() && opts.names.iter().all(|n| allowed.contains(&n.as_str()));
    for (flag, given, allowed) in [
        ("--gamma", opts.gammas.is_some(), &UCI_TABLE_EXPERIMENTS[..]),
        ("--sets", opts.sets.is_some(), &SET_EXPERIMENTS[..]),
        ("--folds", opts.folds.is_some(), &SET_EXPERIMENTS[..]),
    ] {
        if given && !only(allowed) {
            bail!("{flag} applies only to {allowed:?}; name only those experiments");
        }
    }
    if EXPERIMENTS.is_empty() {
        println!("Nothing to reproduce yet: no experiment is registered (see `cargo xtask list`).");
        println!("(options: quick={}, seed={}, out={})", opts.quick, opts.seed, opts.out);
        return Ok(());
    }
    let selected: Vec<&Experiment> = if opts.names.is_empty() {
        EXPERIMENTS.iter().filter(|e| e.in_default_suite).collect()
    } else {
        EXPERIMENTS.iter().filter(|e| opts.names.iter().any(|n| n == e.name)).collect()
    };
    for e in selected {
        println!("== {} ({})", e.name, e.paper);
        (e.run)(opts)?;
        report::write_index(&opts.out, EXPERIMENTS.iter().map(|e| (e.name, e.paper)))?;
    }
    Ok(())
}

/// Keeps large freed blocks in the heap for reuse (glibc only).
///
/// The experiments allocate and free Jacobians and Gram matrices of tens of MB every step.
/// Above glibc's mmap threshold (dynamic, at most 32 MiB) each one is a fresh `mmap` that is
/// page-faulted in, zeroed and unmapped again: measured, 25–35 % of a GFSVI step
/// (`gfsvi_step/gfsvi_2x100/500` 293 → 195 ms, `gfsvi_2x30/500` 55 → 41 ms with the same
/// setting through `MALLOC_MMAP_THRESHOLD_`). Numbers are unaffected; the process keeps its
/// peak heap instead of returning it. A setting already made by the user's environment wins.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
fn keep_large_allocations_in_heap() {
    if std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_some() || std::env::var_os("GLIBC_TUNABLES").is_some() {
        return;
    }
    // SAFETY: `mallopt` only sets allocator parameters; it is called once, before any thread
    // exists, with parameters and values glibc documents (values in bytes, ≤ i32::MAX).
    let ok = unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 30) == 1
            && libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX) == 1
    };
    if !ok {
        eprintln!("note: glibc refused the mallopt settings; large temporaries stay mmap-backed (slower, same numbers)");
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn keep_large_allocations_in_heap() {}

fn main() -> std::process::ExitCode {
    keep_large_allocations_in_heap();
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("list") => {
            list();
            Ok(())
        }
        Some("reproduce") => reproduce(&parse(&args[1..])?),
        Some(other) => bail!("unknown task {other:?}; tasks: list, reproduce"),
        None => {
            println!(
                "usage: cargo xtask <list | reproduce [NAME…] [--quick] [--seed N] [--seeds K] [--out DIR] [--resume] [--gamma G[,G…]] [--sets S[,S…]] [--folds F[,F…]]>"
            );
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The options of a quick run of `name` writing under `out` (fields as the command line's
    /// defaults otherwise).
    fn quick(name: &str, out: &std::path::Path) -> Options {
        Options {
            names: vec![name.into()],
            quick: true,
            seed: 0,
            seeds: None,
            out: out.to_string_lossy().into_owned(),
            resume: false,
            gammas: None,
            sets: None,
            folds: None,
        }
    }

    #[test]
    fn options_parse_and_bad_input_is_an_error() {
        let args: Vec<String> = ["fsp-null-space", "--quick", "--seed", "3", "--out", "x"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let o = parse(&args).unwrap();
        assert_eq!((o.names.len(), o.quick, o.seed, o.out.as_str()), (1, true, 3, "x"));
        assert!(parse(&["--seed".to_string(), "-1".to_string()]).is_err());
        assert!(parse(&["--seeds".to_string(), "0".to_string()]).is_err());
        assert_eq!(parse(&["--seeds".to_string(), "2".to_string()]).unwrap().seeds, Some(2));
        assert!(parse(&["--resume".to_string()]).unwrap().resume);
        assert!(parse(&["--bogus".to_string()]).is_err());
        let gamma = |v: &str| parse(&["--gamma".to_string(), v.to_string()]).map(|o| o.gammas);
        assert_eq!(gamma("1e-10, 1e-6").unwrap(), Some(vec![1e-10, 1e-6]));
        assert_eq!(gamma("0.5").unwrap(), Some(vec![0.5]));
        for bad in ["0", "-1e-6", "nan", "inf", "1e-6,", "x", "1e-6,1e-6"] {
            assert!(gamma(bad).is_err(), "--gamma {bad:?} was accepted");
        }
        assert!(parse(&["--gamma".to_string()]).is_err());
        let unknown = quick("nope", std::path::Path::new("x"));
        assert!(reproduce(&unknown).is_err());
        // --gamma with an experiment that has no γ (or with the default suite) is refused.
        for names in [vec![], vec!["gfsvi-uci".to_string(), "gfsvi-toy".to_string()]] {
            let o = Options { names: names.clone(), gammas: Some(vec![1e-6]), ..unknown.clone() };
            assert!(reproduce(&o).unwrap_err().to_string().contains("--gamma applies only"));
            let o = Options { names, sets: Some(vec!["yacht".into()]), ..unknown.clone() };
            assert!(reproduce(&o).unwrap_err().to_string().contains("--sets applies only"));
        }
        let sets = |v: &str| parse(&["--sets".to_string(), v.to_string()]).map(|o| o.sets);
        assert_eq!(sets("yacht, boston").unwrap(), Some(vec!["yacht".to_string(), "boston".to_string()]));
        assert!(sets("yacht,").is_err());
        assert!(sets("yacht,yacht").is_err());
        let folds = |v: &str| parse(&["--folds".to_string(), v.to_string()]).map(|o| o.folds);
        assert_eq!(folds("5, 4").unwrap(), Some(vec![4, 5]));
        for bad in ["0", "6", "4,4", "x", "4,", "-1"] {
            assert!(folds(bad).is_err(), "--folds {bad:?} was accepted");
        }
        let both = ["--folds", "4", "--seeds", "2"].map(String::from);
        assert!(parse(&both).unwrap_err().to_string().contains("give one"));
        let o = Options { names: vec!["fsp-uci".into()], folds: Some(vec![4]), ..unknown.clone() };
        assert!(reproduce(&o).unwrap_err().to_string().contains("--folds applies only"));
        // An unknown set is named by the experiment before anything runs.
        let out = std::env::temp_dir().join(format!("fspace-xtask-sets-{}", std::process::id()));
        let o = Options {
            names: vec!["gfsvi-uci".into()],
            sets: Some(vec!["energy".into()]),
            out: out.to_string_lossy().into_owned(),
            ..unknown.clone()
        };
        assert!(reproduce(&o).unwrap_err().to_string().contains("unknown set \"energy\""));
        let _ = std::fs::remove_dir_all(&out);
    }

    #[test]
    fn the_null_space_experiment_runs_end_to_end_in_quick_mode() {
        // The harness end to end on its cheapest experiment: files written, metrics sane.
        let out = std::env::temp_dir().join(format!("fspace-xtask-test-{}", std::process::id()));
        let opts = quick("fsp-null-space", &out);
        reproduce(&opts).unwrap();
        let dir = out.join("fsp-null-space");
        let metrics: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("metrics.json")).unwrap()).unwrap();
        for kernel in ["rbf", "matern12"] {
            for task in ["regression", "classification"] {
                let r = metrics[kernel][task].as_f64().unwrap();
                assert!((0.0..0.1).contains(&r), "{kernel}/{task}: {r}");
            }
        }
        assert!(std::fs::read_to_string(dir.join("table.md")).unwrap().contains("Table C.2"));
        assert!(dir.join("log.txt").exists());
        let _ = std::fs::remove_dir_all(&out);
    }

    #[test]
    fn the_valla_regression_table_runs_end_to_end_in_quick_mode() {
        // Every method of VaLLA Fig. 2 (left) on Boston: finite metrics, and the last-layer KFAC
        // of a one-output Gaussian head equals the dense last-layer Laplace (its output factor is
        // 1 × 1, so the Kronecker product is exact).
        let out = std::env::temp_dir().join(format!("fspace-xtask-vreg-{}", std::process::id()));
        let opts = quick("valla-regression", &out);
        reproduce(&opts).unwrap();
        let dir = out.join("valla-regression");
        let metrics: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("metrics.json")).unwrap()).unwrap();
        let get = |m: &str, k: &str| metrics["summary"][m]["boston"][k]["mean"].as_f64().unwrap();
        for m in [
            "MAP",
            "LLA Diag",
            "LLA KFAC",
            "LLA* (last layer)",
            "LLA* KFAC",
            "ELLA",
            "VaLLA 100",
            "VaLLA 200",
        ] {
            for k in ["NLL", "CRPS", "CQM"] {
                assert!(get(m, k).is_finite(), "{m}/{k}");
            }
            assert!((0.0..=0.5).contains(&get(m, "CQM")), "{m}: CQM {}", get(m, "CQM"));
        }
        assert!((get("LLA* (last layer)", "NLL") - get("LLA* KFAC", "NLL")).abs() < 1e-8);
        assert!(std::fs::read_to_string(dir.join("table.md")).unwrap().contains("Not the paper's data"));
        let _ = std::fs::remove_dir_all(&out);
    }

    #[test]
    fn the_gfsvi_tables_choose_gamma_by_validation_and_resume_with_the_choice() {
        // `--gamma` with two values on one quick yacht fold (the second, by `--folds`): GFSVI
        // and TFSVI each fit once per γ, the table names the γ with the lower validation NLL in
        // the log, every score is finite, a resume keeps every unit and choice, and another grid
        // is refused.
        let out = std::env::temp_dir().join(format!("fspace-xtask-gamma-{}", std::process::id()));
        let mut opts = Options {
            gammas: Some(vec![1e-10, 1e-6]),
            sets: Some(vec!["yacht".into()]),
            folds: Some(vec![2]),
            ..quick("gfsvi-uci", &out)
        };
        reproduce(&opts).unwrap();
        let dir = out.join("gfsvi-uci");
        let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap();
        let (log, table) = (read("log.txt"), read("table.md"));
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
        let metrics: serde_json::Value = serde_json::from_str(&read("metrics.json")).unwrap();
        for method in ["GFSVI", "FVI", "TFSVI", "MFVI", "Laplace", "SVGP", "GP"] {
            for j in 0..3 {
                let m = metrics[format!("yacht/{method}/{j}")]["mean"].as_f64().unwrap();
                assert!(m.is_finite(), "{method}/{j}: {m}");
            }
        }
        opts.resume = true;
        reproduce(&opts).unwrap();
        assert!(read("log.txt").contains("yacht fold 2: every method in checkpoint.json"));
        assert_eq!(chosen(&read("table.md")), expected.join("; "));
        opts.gammas = Some(vec![1e-6]);
        assert!(reproduce(&opts).is_err(), "a resume under another γ grid must be refused");
        let _ = std::fs::remove_dir_all(&out);
    }

    #[test]
    fn the_cubic_toy_runs_end_to_end_in_quick_mode() {
        // Generalized Laplace Fig. 2 with every structure: the full GGN's GLM std is the
        // reference (ratio 1), every structure's uncertainty is finite and positive, plots exist.
        let out = std::env::temp_dir().join(format!("fspace-xtask-cubic-{}", std::process::id()));
        let opts = quick("gl-cubic-toy", &out);
        reproduce(&opts).unwrap();
        let dir = out.join("gl-cubic-toy");
        let metrics: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("metrics.json")).unwrap()).unwrap();
        assert_eq!(metrics["full"]["std_in_over_full"].as_f64(), Some(1.0));
        for s in ["diag", "kfac", "ekfac", "block_diag", "full"] {
            for key in ["std_in", "std_out", "mc_std_in", "marglik_lambda"] {
                let v = metrics[s][key].as_f64().unwrap();
                assert!(v.is_finite() && v > 0.0, "{s}/{key}: {v}");
            }
        }
        assert!(dir.join("predictive.png").exists() && dir.join("predictive_mc.png").exists());
        let _ = std::fs::remove_dir_all(&out);
    }
}
