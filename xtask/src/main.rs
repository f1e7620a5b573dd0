//! `cargo xtask` — the fspace task runner (alias in `.cargo/config.toml`).
//!
//! * `cargo xtask list` — the experiments this checkout can run.
//! * `cargo xtask reproduce [NAME…] [--quick] [--seed N] [--seeds K] [--out DIR] [--resume]` —
//!   runs the named experiments (no name: the quick default suite) and writes `results/NAME/`;
//!   `--seeds K` overrides the number of seeds of the multi-seed experiments (the image tables);
//!   `--resume` keeps the finished units of an earlier run of the same settings and computes
//!   only the rest (`fsp-mnist`, `fsp-fmnist`, `fsp-uci`, `gfsvi-uci`, `gfsvi-ood`, `gfsvi-w2`,
//!   `fsp-bayesopt`, `fsp-mauna-loa`:
//!   hours on 2 cores, so a full run can span several sittings).

use anyhow::{bail, Result};

mod experiments;
mod plot;
mod report;

use experiments::{Experiment, Options, EXPERIMENTS};

fn parse(args: &[String]) -> Result<Options> {
    let mut opts =
        Options { names: vec![], quick: false, seed: 0, seeds: None, out: "results".into(), resume: false };
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
            flag if flag.starts_with("--") => bail!("unknown option {flag}"),
            name => opts.names.push(name.to_string()),
        }
    }
    Ok(opts)
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

fn reproduce(opts: &Options) -> Result<()> {
    for name in &opts.names {
        if !EXPERIMENTS.iter().any(|e| e.name == name) {
            bail!("unknown experiment {name:?}; `cargo xtask list` shows the available ones");
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
                "usage: cargo xtask <list | reproduce [NAME…] [--quick] [--seed N] [--seeds K] [--out DIR] [--resume]>"
            );
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let unknown = Options {
            names: vec!["nope".into()],
            quick: true,
            seed: 0,
            seeds: None,
            out: "x".into(),
            resume: false,
        };
        assert!(reproduce(&unknown).is_err());
    }

    #[test]
    fn the_null_space_experiment_runs_end_to_end_in_quick_mode() {
        // The harness end to end on its cheapest experiment: files written, metrics sane.
        let out = std::env::temp_dir().join(format!("fspace-xtask-test-{}", std::process::id()));
        let opts = Options {
            names: vec!["fsp-null-space".into()],
            quick: true,
            seed: 0,
            seeds: None,
            out: out.to_string_lossy().into_owned(),
            resume: false,
        };
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
        let opts = Options {
            names: vec!["valla-regression".into()],
            quick: true,
            seed: 0,
            seeds: None,
            out: out.to_string_lossy().into_owned(),
            resume: false,
        };
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
    fn the_cubic_toy_runs_end_to_end_in_quick_mode() {
        // Generalized Laplace Fig. 2 with every structure: the full GGN's GLM std is the
        // reference (ratio 1), every structure's uncertainty is finite and positive, plots exist.
        let out = std::env::temp_dir().join(format!("fspace-xtask-cubic-{}", std::process::id()));
        let opts = Options {
            names: vec!["gl-cubic-toy".into()],
            quick: true,
            seed: 0,
            seeds: None,
            out: out.to_string_lossy().into_owned(),
            resume: false,
        };
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
