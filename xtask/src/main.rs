//! `cargo xtask` — the fspace task runner (alias in `.cargo/config.toml`).
//!
//! * `cargo xtask list` — the experiments, their measured full-setting wall time and papers.
//! * `cargo xtask reproduce [NAME…|--all] [--quick] [--seed N] [--out DIR] […]` — runs them and
//!   writes `results/NAME/` and `results/README.md`; `cargo xtask reproduce --help` lists every
//!   experiment with the flags it accepts.
//! * `cargo xtask report [--out DIR]` — rebuilds `results/README.md` (the index) and each run's
//!   `README.md` page from the tables there.
//! * `cargo xtask test [--python-only|--rust-only] [--no-torch]` — every test, Rust and Python
//!   (what `.ci/run` runs).
//! * `cargo xtask publish NAME… [--from DIR] [--to docs/results]` — copies finished runs into the
//!   committed reference results (table, metrics, figures, `RUN.md`).
//! * `cargo xtask redraw NAME… [--dir DIR]` — redraws finished runs' figures from their
//!   `metrics.json`.
//! * `cargo xtask restore NAME… [--from docs/results] [--out DIR]` — puts a published run's
//!   checkpoint back to continue it with `--resume`.
//! * `cargo xtask docs [--out DIR] [--no-rustdoc]` — the user guide site (mkdocs-material over
//!   `docs/`, the Python API from the docstrings, the Rust API by rustdoc) into `site/`.
//! * `cargo xtask wheel [--out DIR]` — the `fspace` Python package as an abi3 wheel.
//!
//! The harness, protocols and experiments are the `xtask` library (`src/lib.rs`); this binary
//! parses the command line and dispatches.

use anyhow::Result;

use xtask::{harness, EXPERIMENTS};

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
    fn the_help_and_the_module_docs_name_every_subcommand() {
        use clap::CommandFactory;
        let mut cli = harness::cli::Cli::command();
        let help = cli.render_long_help().to_string();
        let module_docs = include_str!("main.rs");
        let names: Vec<String> =
            cli.get_subcommands().map(|c| c.get_name().to_string()).filter(|n| n != "help").collect();
        for name in ["list", "reproduce", "report", "test", "publish", "redraw", "restore", "docs", "wheel"] {
            assert!(names.iter().any(|n| n == name), "no subcommand {name}");
        }
        for name in &names {
            assert!(
                help.contains(&format!("  {name}")),
                "`cargo xtask --help` does not list {name}:\n{help}"
            );
            assert!(
                module_docs.contains(&format!("//! * `cargo xtask {name}")),
                "main.rs's docs do not list {name}"
            );
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
        let counts = |v: &str| opts(&["--covariance-points", v]).map(|o| o.covariance_points);
        assert_eq!(counts("10000, 500").unwrap(), Some(vec![500, 10_000]));
        for bad in ["1", "0", "x", "500,500", "500,"] {
            assert!(counts(bad).is_err(), "--covariance-points {bad:?} was accepted");
        }
        let methods = |v: &str| opts(&["valla-mnist", "--methods", v]).map(|o| o.methods);
        assert_eq!(
            methods("MAP, VaLLA 100").unwrap(),
            Some(vec!["MAP".to_string(), "VaLLA 100".to_string()])
        );
        for bad in ["MAP,", "MAP,MAP", ""] {
            assert!(methods(bad).is_err(), "--methods {bad:?} was accepted");
        }
        assert!(
            parse_err(&["reproduce", "fsp-mnist", "--methods", "MAP"]).contains("--methods does not apply")
        );
        let err = parse_err(&["reproduce", "fsp-bayesopt", "--covariance-points", "10000"]);
        assert!(
            err.contains("does not apply to fsp-bayesopt ") && err.contains("fsp-bayesopt-covariance"),
            "{err}"
        );
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
        assert!(chosen.iter().all(|e| e.budget_of.is_none()) && chosen.len() + 3 == EXPERIMENTS.len());
        let opts = args.options();
        for e in chosen {
            let own = opts.restricted_to(e);
            assert_eq!(own.resume, e.flags.contains(&harness::registry::Flag::Resume), "{}", e.name);
            assert_eq!(own.seeds.is_some(), e.flags.contains(&harness::registry::Flag::Seeds), "{}", e.name);
        }
    }

    #[test]
    fn redraw_refuses_an_experiment_whose_figures_its_metrics_do_not_determine() {
        let err = parse_err(&["redraw", "gfsvi-lengthscale", "--dir", "nowhere"]);
        assert!(err.contains("rerun it") && err.contains("valla-fmnist"), "{err}");
        let err = parse_err(&["redraw", "valla-fmnist", "--dir", "nowhere"]);
        assert!(err.contains("no metrics.json"), "{err}");
        assert!(parse_err(&["redraw", "no-such-run"]).contains("no-such-run"));
    }
}
