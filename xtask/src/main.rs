//! `cargo xtask` — the fspace task runner (alias in `.cargo/config.toml`).
//!
//! * `cargo xtask list` — the experiments, their measured full-setting wall time and papers.
//! * `cargo xtask reproduce [NAME…|--all] [--quick] [--seed N] [--out DIR] […]` — runs them and
//!   writes `results/NAME/` and `results/README.md`; `cargo xtask reproduce --help` lists every
//!   experiment with the flags it accepts.
//! * `cargo xtask report [--out DIR]` — rebuilds `results/README.md` from the tables there.
//!
//! Layout: [`harness`] (CLI, registry types, run folder / log / checkpoint, plots),
//! [`protocols`] (data, splits and evaluation shared by experiments), `experiments` (one file
//! per experiment and the registry).

use anyhow::Result;

mod experiments;
mod harness;
mod protocols;

use experiments::EXPERIMENTS;

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
    let cli = match harness::cli::parse(EXPERIMENTS, std::env::args_os().skip(1)) {
        Ok(cli) => cli,
        // `--help` and `--version` print and succeed; a usage error prints and fails.
        Err(e) => e.exit(),
    };
    harness::cli::dispatch(EXPERIMENTS, cli)
}
#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `cargo xtask ARGS…` in process (parse + dispatch).
    fn xtask(args: &[&str]) -> Result<()> {
        let cli =
            harness::cli::parse(EXPERIMENTS, args.iter().copied()).map_err(|e| anyhow::anyhow!("{e}"))?;
        harness::cli::dispatch(EXPERIMENTS, cli)
    }

    /// `reproduce --quick NAME --out OUT` plus `extra`.
    fn quick(name: &str, out: &std::path::Path, extra: &[&str]) -> Result<()> {
        let out = out.to_string_lossy().into_owned();
        let mut args = vec!["reproduce", name, "--quick", "--out", out.as_str()];
        args.extend_from_slice(extra);
        xtask(&args)
    }

    fn parse_err(args: &[&str]) -> String {
        match harness::cli::parse(EXPERIMENTS, args.iter().copied()) {
            Ok(cli) => harness::cli::dispatch(EXPERIMENTS, cli).unwrap_err().to_string(),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn the_command_line_parses_and_refuses_bad_input() {
        let cli = harness::cli::parse(
            EXPERIMENTS,
            ["reproduce", "fsp-null-space", "--quick", "--seed", "3", "--out", "x"],
        )
        .unwrap();
        let harness::cli::Task::Reproduce(args) = cli.task else { panic!("not reproduce") };
        let o = args.options();
        assert_eq!((args.names.len(), o.quick, o.seed, o.out.as_str()), (1, true, 3, "x"));
        let opts = |a: &[&str]| {
            let mut argv = vec!["reproduce"];
            argv.extend_from_slice(a);
            match harness::cli::parse(EXPERIMENTS, argv).map(|c| c.task) {
                Ok(harness::cli::Task::Reproduce(r)) => Ok(r.options()),
                Ok(_) => panic!("not reproduce"),
                Err(e) => Err(e.to_string()),
            }
        };
        assert!(opts(&["--seed", "-1"]).is_err());
        assert!(opts(&["--seeds", "0"]).is_err());
        assert_eq!(opts(&["--seeds", "2"]).unwrap().seeds, Some(2));
        assert!(opts(&["--resume"]).unwrap().resume);
        assert!(opts(&["--bogus"]).is_err());
        assert!(opts(&["nope"]).unwrap_err().contains("invalid value 'nope'"));
        assert!(opts(&["--all", "fsp-uci"]).is_err(), "--all and names are exclusive");
        let gamma = |v: &str| opts(&["--gamma", v]).map(|o| o.gammas);
        assert_eq!(gamma("1e-10, 1e-6").unwrap(), Some(vec![1e-10, 1e-6]));
        assert_eq!(gamma("0.5").unwrap(), Some(vec![0.5]));
        for bad in ["0", "-1e-6", "nan", "inf", "1e-6,", "x", "1e-6,1e-6"] {
            assert!(gamma(bad).is_err(), "--gamma {bad:?} was accepted");
        }
        assert!(opts(&["--gamma"]).is_err());
        let sets = |v: &str| opts(&["--sets", v]).map(|o| o.sets);
        assert_eq!(sets("yacht, boston").unwrap(), Some(vec!["yacht".to_string(), "boston".to_string()]));
        assert!(sets("yacht,").is_err());
        assert!(sets("yacht,yacht").is_err());
        let folds = |v: &str| opts(&["--folds", v]).map(|o| o.folds);
        assert_eq!(folds("5, 4").unwrap(), Some(vec![4, 5]));
        for bad in ["0", "6", "4,4", "x", "4,"] {
            assert!(folds(bad).is_err(), "--folds {bad:?} was accepted");
        }
        // A flag an experiment does not declare is refused, naming the experiment and the ones
        // that accept it (also for the default suite).
        for args in [vec!["--gamma", "1e-6"], vec!["gfsvi-uci", "gfsvi-toy", "--gamma", "1e-6"]] {
            let mut argv = vec!["reproduce"];
            argv.extend(args);
            assert!(parse_err(&argv).contains("--gamma does not apply to"), "{argv:?}");
        }
        let err = parse_err(&["reproduce", "fsp-uci", "--folds", "4"]);
        assert!(err.contains("--folds does not apply to fsp-uci") && err.contains("gfsvi-w2"), "{err}");
        assert!(
            parse_err(&["reproduce", "fsp-toy-regression", "--resume"]).contains("--resume does not apply")
        );
        assert!(parse_err(&["reproduce", "gfsvi-w2", "--folds", "4", "--seeds", "2"]).contains("give one"));
        // --help lists every experiment and its flags; clap reports it as a DisplayHelp "error".
        let help =
            harness::cli::command(EXPERIMENTS).try_get_matches_from(["cargo xtask", "reproduce", "--help"]);
        let text = help.unwrap_err().to_string();
        for e in EXPERIMENTS {
            assert!(text.contains(e.name), "--help misses {}", e.name);
        }
        assert!(text.contains("--resume --gamma --sets --folds"), "{text}");
        // An unknown set is named by the experiment before anything runs.
        let out = std::env::temp_dir().join(format!("fspace-xtask-sets-{}", std::process::id()));
        let err = quick("gfsvi-uci", &out, &["--sets", "energy"]).unwrap_err().to_string();
        assert!(err.contains("unknown set \"energy\""), "{err}");
        let _ = std::fs::remove_dir_all(&out);
    }

    #[test]
    fn the_layers_import_only_downwards() {
        // harness ← protocols ← experiments: the harness knows no protocol or experiment, a
        // protocol no experiment, and an experiment no other experiment (`super::` from an
        // experiment file reaches the registry or a sibling; only a test module's `use super::*`
        // and a folder experiment's own submodules may use it).
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = Vec::new();
        let mut dirs = vec![src.clone()];
        while let Some(d) = dirs.pop() {
            for entry in std::fs::read_dir(&d).unwrap() {
                let p = entry.unwrap().path();
                if p.is_dir() {
                    dirs.push(p);
                } else if p.extension().is_some_and(|e| e == "rs") {
                    files.push(p);
                }
            }
        }
        let mut checked = 0;
        for f in files {
            let rel = f.strip_prefix(&src).unwrap().to_string_lossy().replace('\\', "/");
            let text = std::fs::read_to_string(&f).unwrap();
            let forbidden: &[&str] = if rel.starts_with("harness/") {
                &["crate::protocols", "crate::experiments"]
            } else if rel.starts_with("protocols/")
                || (rel.starts_with("experiments/") && rel != "experiments/mod.rs")
            {
                &["crate::experiments"]
            } else {
                &[]
            };
            for bad in forbidden {
                assert!(!text.contains(bad), "{rel} names {bad}");
            }
            let top_level_experiment = rel.starts_with("experiments/")
                && rel != "experiments/mod.rs"
                && (rel.matches('/').count() == 1 || rel.ends_with("/mod.rs"));
            if top_level_experiment {
                for line in text.lines().filter(|l| l.contains("super::")) {
                    assert_eq!(line.trim(), "use super::*;", "{rel} reaches up: {line}");
                }
            }
            checked += 1;
        }
        assert!(checked > 30, "only {checked} files found");
    }

    #[test]
    fn all_restricts_each_experiment_to_the_flags_it_accepts() {
        let cli =
            harness::cli::parse(EXPERIMENTS, ["reproduce", "--all", "--resume", "--seeds", "2"]).unwrap();
        let harness::cli::Task::Reproduce(args) = cli.task else { panic!("not reproduce") };
        let chosen = harness::cli::selected(EXPERIMENTS, &args);
        assert!(chosen.iter().all(|e| e.budget_of.is_none()) && chosen.len() + 2 == EXPERIMENTS.len());
        let opts = args.options();
        for e in chosen {
            let own = opts.restricted_to(e);
            assert_eq!(own.resume, e.flags.contains(&harness::registry::Flag::Resume), "{}", e.name);
            assert_eq!(own.seeds.is_some(), e.flags.contains(&harness::registry::Flag::Seeds), "{}", e.name);
        }
    }

    #[test]
    fn the_null_space_experiment_runs_end_to_end_in_quick_mode() {
        // The harness end to end on its cheapest experiment: files written, metrics sane.
        let out = std::env::temp_dir().join(format!("fspace-xtask-test-{}", std::process::id()));
        quick("fsp-null-space", &out, &[]).unwrap();
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
        quick("valla-regression", &out, &[]).unwrap();
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
        // The calibration curves behind CQM: 11 levels, coverage non-decreasing from 0 to 1.
        assert!(dir.join("calibration.png").exists());
        for row in metrics["per_seed"].as_array().unwrap() {
            let curve: Vec<(f64, f64)> = serde_json::from_value(row["cqm_curve"].clone()).unwrap();
            assert_eq!(curve.len(), 11);
            assert!(
                curve.windows(2).all(|w| w[1].1 >= w[0].1) && curve[0].1 == 0.0 && curve[10].1 == 1.0,
                "{curve:?}"
            );
        }
        let _ = std::fs::remove_dir_all(&out);
    }

    #[test]
    fn the_gfsvi_tables_choose_gamma_by_validation_and_resume_with_the_choice() {
        // `--gamma` with two values on one quick yacht fold (the second, by `--folds`): GFSVI
        // and TFSVI each fit once per γ, the table names the γ with the lower validation NLL in
        // the log, every score is finite, a resume keeps every unit and choice, and another grid
        // is refused.
        let out = std::env::temp_dir().join(format!("fspace-xtask-gamma-{}", std::process::id()));
        let flags = ["--gamma", "1e-10,1e-6", "--sets", "yacht", "--folds", "2"];
        quick("gfsvi-uci", &out, &flags).unwrap();
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
        let resumed = [&flags[..], &["--resume"]].concat();
        quick("gfsvi-uci", &out, &resumed).unwrap();
        assert!(read("log.txt").contains("yacht fold 2: every method in checkpoint.json"));
        assert_eq!(chosen(&read("table.md")), expected.join("; "));
        let other = ["--gamma", "1e-6", "--sets", "yacht", "--folds", "2", "--resume"];
        assert!(quick("gfsvi-uci", &out, &other).is_err(), "a resume under another γ grid must be refused");
        let _ = std::fs::remove_dir_all(&out);
    }

    #[test]
    fn the_cubic_toy_runs_end_to_end_in_quick_mode() {
        // Generalized Laplace Fig. 2 with every structure: the full GGN's GLM std is the
        // reference (ratio 1), every structure's uncertainty is finite and positive, plots exist.
        let out = std::env::temp_dir().join(format!("fspace-xtask-cubic-{}", std::process::id()));
        quick("gl-cubic-toy", &out, &[]).unwrap();
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
