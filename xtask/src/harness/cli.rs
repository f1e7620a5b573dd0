//! The command line (clap, derive): `list`, `reproduce`, `report`, `publish`, `redraw`, `restore`,
//! `test`, `docs`, `wheel`, each with `--help`. The experiment names are checked against the registry by clap itself, and `reproduce --help`
//! prints every experiment with the flags it accepts and its measured full-setting wall time.

use std::path::Path;

use anyhow::{bail, Result};
use clap::builder::PossibleValuesParser;
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};

use super::registry::{check_flags, human_minutes, Experiment, Options};
use super::report;

/// `cargo xtask` — the fspace task runner.
#[derive(Debug, Parser)]
#[command(
    name = "cargo xtask",
    bin_name = "cargo xtask",
    about = "fspace task runner: reproduce the papers' experiments, test, publish results, build the guide and the wheel",
    after_help = "Examples:\n  cargo xtask reproduce                  # the quick default suite (minutes)\n  \
                  cargo xtask reproduce fsp-mauna-loa    # one experiment at its full setting\n  \
                  cargo xtask reproduce --all --resume   # everything, resumable (days on 2 cores)\n  \
                  cargo xtask reproduce --help           # every experiment and the flags it accepts\n  \
                  cargo xtask test                       # every test, Rust and Python (what CI runs)\n  \
                  cargo xtask docs                       # the user guide site in site/ (open site/index.html)\n  \
                  cargo xtask wheel                      # the Python package as a wheel in target/wheels"
)]
pub struct Cli {
    /// The task.
    #[command(subcommand)]
    pub task: Task,
}

/// The tasks.
#[derive(Debug, Subcommand)]
pub enum Task {
    /// List the experiments: name, default suite, flags, full-setting wall time, paper.
    List,
    /// Run experiments and write OUT/NAME/ (table.md, metrics.json, figures, log.txt) and
    /// OUT/README.md. Without a name: the quick default suite.
    Reproduce(ReproduceArgs),
    /// Rebuild the index of OUT/README.md from the tables found under OUT (nothing is run); text
    /// above the file's `<!-- cargo xtask report … -->` line (docs/results' claims) is kept.
    Report {
        /// Output root to index.
        #[arg(long, default_value = "results")]
        out: String,
    },
    /// Every test, Rust and Python: `cargo test --workspace --release`, then the `fspace`
    /// Python package built into target/python-venv and its pytest suite.
    Test {
        /// Only the Python suite.
        #[arg(long, conflicts_with = "rust_only")]
        python_only: bool,
        /// Only the Rust suite.
        #[arg(long)]
        rust_only: bool,
        /// Leave torch out of the environment (it is ≈ 4.4 GB installed, ≈ 105 s from PyPI once
        /// per machine): the tests that convert a PyTorch model are then skipped, and say so.
        #[arg(long)]
        no_torch: bool,
    },
    /// Copy finished runs into docs/results/NAME/ (table, metrics, figures ≤ 300 KB, RUN.md with
    /// commit, date and wall time): the reference results committed with the code.
    Publish {
        /// Experiments to publish.
        #[arg(required = true, value_name = "NAME")]
        names: Vec<String>,
        /// Output root the runs were written to.
        #[arg(long, default_value = "results", value_name = "DIR")]
        from: String,
        /// Where the reference results live.
        #[arg(long, default_value = "docs/results", value_name = "DIR")]
        to: String,
    },
    /// Redraw the figures of finished runs from their metrics.json with the current figure code
    /// (nothing is recomputed); in a published folder the figures are shrunk as `publish` does
    /// and RUN.md records the redraw. Only experiments whose figures the metrics determine.
    Redraw {
        /// Experiments to redraw.
        #[arg(required = true, value_name = "NAME")]
        names: Vec<String>,
        /// Output root holding the runs.
        #[arg(long, default_value = "docs/results", value_name = "DIR")]
        dir: String,
    },
    /// Build the user guide site into OUT: mkdocs-material over docs/ (`mkdocs.yml`), the Python
    /// API pages from the docstrings (mkdocstrings), the Rust API by `cargo doc --workspace
    /// --no-deps` under OUT/rust/. Offline: every asset is in OUT; serve it with
    /// `python3 -m http.server -d OUT` for the search.
    Docs {
        /// Where the site goes.
        #[arg(long, default_value = "site")]
        out: String,
        /// Leave the Rust API out (it takes a `cargo doc` build).
        #[arg(long)]
        no_rustdoc: bool,
    },
    /// Build the `fspace` Python package as a wheel (abi3: one wheel for CPython ≥ 3.9;
    /// manylinux2014: any x86-64 Linux with glibc ≥ 2.17, linked through zig) into OUT, with
    /// maturin from the test environment (made if missing). `pip install OUT/fspace-*.whl` needs
    /// no Rust.
    Wheel {
        /// Where the wheel goes.
        #[arg(long, default_value = "target/wheels")]
        out: String,
    },
    /// Put a published run's checkpoint.json (with its checkpoint-*.json) and log.txt back under OUT/NAME/, so that
    /// `cargo xtask reproduce NAME --resume --out OUT` continues it on another machine (a
    /// partial run committed with its finished units).
    Restore {
        /// Experiments to restore.
        #[arg(required = true, value_name = "NAME")]
        names: Vec<String>,
        /// Where the reference results live.
        #[arg(long, default_value = "docs/results", value_name = "DIR")]
        from: String,
        /// Output root of the run to continue.
        #[arg(long, default_value = "results", value_name = "DIR")]
        out: String,
    },
}

/// `cargo xtask reproduce`'s arguments.
#[derive(Debug, Args)]
pub struct ReproduceArgs {
    /// Experiments to run (none: the default suite); the table below lists them.
    #[arg(id = "names", value_name = "NAME")]
    pub names: Vec<String>,
    /// Every experiment at its full setting (the `-quick` budget variants are left to their
    /// originals); prints the expected wall time first. Flags go to the experiments that accept them.
    #[arg(long, conflicts_with = "names")]
    pub all: bool,
    /// Reduced settings: a smoke test whose numbers are not the paper's.
    #[arg(long)]
    pub quick: bool,
    /// Base seed: data, initialisation, context points.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Number of seeds, splits or folds of a multi-seed experiment.
    #[arg(long, value_name = "K", value_parser = clap::value_parser!(u64).range(1..))]
    pub seeds: Option<u64>,
    /// Output root.
    #[arg(long, default_value = "results", value_name = "DIR")]
    pub out: String,
    /// Keep the finished units of an interrupted run of the same settings; compute only the rest.
    #[arg(long)]
    pub resume: bool,
    /// GFSVI's and TFSVI's γ in gfsvi-uci / gfsvi-ood (several: chosen per fold by validation NLL).
    #[arg(long = "gamma", value_name = "G[,G…]", value_parser = parse_gammas)]
    pub gammas: Option<Gammas>,
    /// The UCI sets gfsvi-uci / gfsvi-ood / gfsvi-w2 run.
    #[arg(long, value_name = "S[,S…]", value_parser = parse_sets)]
    pub sets: Option<Sets>,
    /// The folds (1–5) gfsvi-uci / gfsvi-ood / gfsvi-w2 run.
    #[arg(long, value_name = "F[,F…]", value_parser = parse_folds)]
    pub folds: Option<Folds>,
    /// The covariance (Alg. 2) point counts fsp-bayesopt-covariance runs (its default: 500,
    /// 2 000 and the paper's 10 000).
    #[arg(long = "covariance-points", value_name = "N[,N…]", value_parser = parse_counts)]
    pub covariance_points: Option<Counts>,
    /// The table rows valla-mnist / valla-fmnist fit, by their names in the table (quote names
    /// with spaces: --methods "MAP,VaLLA 100"); the MAP network is trained either way.
    #[arg(long, value_name = "M[,M…]", value_parser = parse_methods)]
    pub methods: Option<Methods>,
}

/// `--gamma`'s values.
#[derive(Debug, Clone, PartialEq)]
pub struct Gammas(pub Vec<f64>);
/// `--sets`' values.
#[derive(Debug, Clone, PartialEq)]
pub struct Sets(pub Vec<String>);
/// `--folds`' values, ascending.
#[derive(Debug, Clone, PartialEq)]
pub struct Folds(pub Vec<usize>);
/// `--methods`' values, as given.
#[derive(Debug, Clone, PartialEq)]
pub struct Methods(pub Vec<String>);
/// `--covariance-points`' values, ascending.
#[derive(Debug, Clone, PartialEq)]
pub struct Counts(pub Vec<usize>);

impl ReproduceArgs {
    /// The options the experiments receive.
    pub fn options(&self) -> Options {
        Options {
            quick: self.quick,
            seed: self.seed,
            seeds: self.seeds.map(|k| k as usize),
            out: self.out.clone(),
            resume: self.resume,
            gammas: self.gammas.clone().map(|g| g.0),
            sets: self.sets.clone().map(|s| s.0),
            folds: self.folds.clone().map(|f| f.0),
            covariance_points: self.covariance_points.clone().map(|c| c.0),
            methods: self.methods.clone().map(|m| m.0),
        }
    }
}

/// The items of a comma-separated value, trimmed; an empty item or a repeat is an error.
fn comma_list(v: &str) -> Result<Vec<&str>, String> {
    let mut items: Vec<&str> = Vec::new();
    for item in v.split(',').map(str::trim) {
        if item.is_empty() {
            return Err("an item is empty".into());
        }
        if items.contains(&item) {
            return Err(format!("{item:?} is named twice"));
        }
        items.push(item);
    }
    Ok(items)
}

/// `--gamma G[,G…]`: each finite and positive.
fn parse_gammas(v: &str) -> Result<Gammas, String> {
    let mut gammas: Vec<f64> = Vec::new();
    for part in comma_list(v)? {
        let g: f64 = part.parse().map_err(|e| format!("{part:?} is not a number: {e}"))?;
        if !(g.is_finite() && g > 0.0) {
            return Err(format!("{part:?}: γ must be finite and > 0"));
        }
        if gammas.contains(&g) {
            return Err(format!("{g:e} is named twice"));
        }
        gammas.push(g);
    }
    Ok(Gammas(gammas))
}

/// `--sets S[,S…]` (the experiment checks the names against its sets).
fn parse_sets(v: &str) -> Result<Sets, String> {
    Ok(Sets(comma_list(v)?.into_iter().map(String::from).collect()))
}

/// `--methods M[,M…]` (the experiment checks the names against its rows).
fn parse_methods(v: &str) -> Result<Methods, String> {
    Ok(Methods(comma_list(v)?.into_iter().map(String::from).collect()))
}

/// `--folds F[,F…]`: folds of the 5-fold CV numbered from 1, kept in ascending order.
fn parse_folds(v: &str) -> Result<Folds, String> {
    let mut folds = Vec::new();
    for part in comma_list(v)? {
        let f: usize = part.parse().map_err(|e| format!("{part:?} is not a fold number: {e}"))?;
        if !(1..=5).contains(&f) {
            return Err(format!("{part:?}: the tables have folds 1 to 5"));
        }
        folds.push(f);
    }
    folds.sort_unstable();
    Ok(Folds(folds))
}

/// `--covariance-points N[,N…]`: point counts ≥ 2, kept in ascending order.
fn parse_counts(v: &str) -> Result<Counts, String> {
    let mut counts = Vec::new();
    for part in comma_list(v)? {
        let n: usize = part.parse().map_err(|e| format!("{part:?} is not a point count: {e}"))?;
        if n < 2 {
            return Err(format!("{part:?}: Alg. 2 needs at least 2 points"));
        }
        if counts.contains(&n) {
            return Err(format!("{n} is named twice"));
        }
        counts.push(n);
    }
    counts.sort_unstable();
    Ok(Counts(counts))
}

/// The command with the registry's names and table filled in.
pub fn command(experiments: &[Experiment]) -> clap::Command {
    let names: Vec<&'static str> = experiments.iter().map(|e| e.name).collect();
    Cli::command().mut_subcommand("reproduce", |c| {
        c.mut_arg("names", |a| a.value_parser(PossibleValuesParser::new(names)).hide_possible_values(true))
            .after_help(experiment_table(experiments))
    })
}

/// Parses `args` (without the program name) against the registry.
pub fn parse<I, T>(experiments: &[Experiment], args: I) -> Result<Cli, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let argv =
        std::iter::once(std::ffi::OsString::from("cargo xtask")).chain(args.into_iter().map(Into::into));
    let matches = command(experiments).try_get_matches_from(argv)?;
    Cli::from_arg_matches(&matches)
}

fn wall(e: &Experiment) -> String {
    e.full_minutes.map_or_else(|| "not timed".into(), human_minutes)
}

/// The experiments as a text table: name, default suite, flags, full wall time.
pub fn experiment_table(experiments: &[Experiment]) -> String {
    let mut s = format!("Experiments:\n  {:<25} {:<8} {:<45} {}\n", "NAME", "DEFAULT", "FLAGS", "FULL RUN");
    for e in experiments {
        s += &format!(
            "  {:<25} {:<8} {:<45} {}\n",
            e.name,
            if e.in_default_suite { "yes" } else { "" },
            e.flags_line(),
            wall(e)
        );
    }
    s += "\nFULL RUN: measured wall time of the full setting on 2 cores. --quick, --seed and --out apply to\nevery experiment; `cargo xtask list` also says what each reproduces.";
    s
}

/// `cargo xtask list`.
pub fn list(experiments: &[Experiment]) {
    println!("{:<25} {:<8} {:<12} paper", "name", "default", "full");
    for e in experiments {
        println!(
            "{:<25} {:<8} {:<12} {}",
            e.name,
            if e.in_default_suite { "yes" } else { "" },
            wall(e),
            e.paper
        );
    }
}

/// The experiments `reproduce` runs with these arguments.
pub fn selected<'a>(experiments: &'a [Experiment], args: &ReproduceArgs) -> Vec<&'a Experiment> {
    if args.all {
        experiments.iter().filter(|e| e.budget_of.is_none()).collect()
    } else if args.names.is_empty() {
        experiments.iter().filter(|e| e.in_default_suite).collect()
    } else {
        experiments.iter().filter(|e| args.names.iter().any(|n| n == e.name)).collect()
    }
}

/// `cargo xtask reproduce`: checks every flag against the experiments it names (with `--all`,
/// each experiment gets the flags it accepts), prints the expected wall time of a full run, then
/// runs them in registry order, rewriting `OUT/README.md` after each.
pub fn reproduce(experiments: &[Experiment], args: &ReproduceArgs) -> Result<()> {
    let opts = args.options();
    let chosen = selected(experiments, args);
    if !args.all {
        check_flags(&opts, &chosen, experiments)?;
    } else if opts.folds.is_some() && opts.seeds.is_some() {
        bail!("--folds and --seeds both choose the folds; give one");
    }
    if !args.quick && (args.all || chosen.len() > 1) {
        let known: f64 = chosen.iter().filter_map(|e| e.full_minutes).sum();
        let untimed: Vec<&str> = chosen.iter().filter(|e| e.full_minutes.is_none()).map(|e| e.name).collect();
        println!(
            "Expected wall time on 2 cores: {}{} (--resume continues an interrupted run)",
            human_minutes(known),
            if untimed.is_empty() {
                String::new()
            } else {
                format!(", plus {} never timed", untimed.join(", "))
            }
        );
    }
    for e in chosen {
        let own = if args.all { opts.restricted_to(e) } else { opts.clone() };
        println!("== {} ({})", e.name, e.paper);
        (e.run)(&own)?;
        report::write_index(&opts.out, experiments.iter().map(|e| (e.name, e.paper)))?;
    }
    Ok(())
}

/// Runs the parsed command line.
pub fn dispatch(experiments: &[Experiment], cli: Cli) -> Result<()> {
    match cli.task {
        Task::List => {
            list(experiments);
            Ok(())
        }
        Task::Reproduce(args) => reproduce(experiments, &args),
        Task::Publish { names, from, to } => {
            for name in names {
                if !experiments.iter().any(|e| e.name == name) {
                    bail!("unknown experiment {name:?}; `cargo xtask list` shows them");
                }
                let dst = super::publish::publish(Path::new(&from), Path::new(&to), &name)?;
                println!("published {}", dst.display());
            }
            // The index below the claims follows the published tables.
            report::write_index(&to, experiments.iter().map(|e| (e.name, e.paper)))?;
            println!("rewrote the index of {to}/README.md");
            Ok(())
        }
        Task::Redraw { names, dir } => {
            for name in names {
                let Some(e) = experiments.iter().find(|e| e.name == name) else {
                    bail!("unknown experiment {name:?}; `cargo xtask list` shows them");
                };
                let Some(draw) = e.redraw else {
                    let able: Vec<&str> =
                        experiments.iter().filter(|e| e.redraw.is_some()).map(|e| e.name).collect();
                    bail!(
                        "{name}'s figures need data its metrics.json does not hold; rerun it \
                         (`cargo xtask reproduce {name}`). Redrawable: {}",
                        able.join(", ")
                    );
                };
                for png in super::publish::redraw(Path::new(&dir), &name, draw)? {
                    println!("redrew {}", png.display());
                }
            }
            Ok(())
        }
        Task::Restore { names, from, out } => {
            for name in names {
                if !experiments.iter().any(|e| e.name == name) {
                    bail!("unknown experiment {name:?}; `cargo xtask list` shows them");
                }
                let dst = super::publish::restore(Path::new(&from), Path::new(&out), &name)?;
                println!(
                    "restored {} (continue with `cargo xtask reproduce {name} --resume --out {out}`)",
                    dst.display()
                );
            }
            Ok(())
        }
        Task::Docs { out, no_rustdoc } => {
            let site = super::test::build_site(Path::new(&out), !no_rustdoc)?;
            println!(
                "built {} (open {}/index.html; the search needs `python3 -m http.server -d {}`)",
                site.display(),
                site.display(),
                site.display()
            );
            Ok(())
        }
        Task::Wheel { out } => {
            let wheel = super::test::build_wheel(Path::new(&out))?;
            println!("built {} (install: pip install {})", wheel.display(), wheel.display());
            Ok(())
        }
        Task::Test { python_only, rust_only, no_torch } => {
            super::test::test(super::test::TestPlan { python_only, rust_only, torch: !no_torch })
        }
        Task::Report { out } => {
            report::write_index(&out, experiments.iter().map(|e| (e.name, e.paper)))?;
            println!("wrote {}/README.md", out);
            Ok(())
        }
    }
}
