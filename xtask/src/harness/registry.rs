//! What an experiment is to the harness: its name, what it reproduces, the flags it accepts, its
//! expected wall time and the function that runs it; and the options it receives.

use anyhow::{bail, Result};

/// Options every experiment receives (parsed by [`super::cli`]).
#[derive(Debug, Clone)]
pub struct Options {
    /// Reduced settings (a smoke test; numbers are not the paper's).
    pub quick: bool,
    /// Base seed: data, initialisation, context points.
    pub seed: u64,
    /// `--seeds`: seeds, splits or folds of the multi-seed experiments (`None`: the experiment's own).
    pub seeds: Option<usize>,
    /// Output root (`results`).
    pub out: String,
    /// Keep the finished units of an earlier run of the same settings and compute only the rest.
    pub resume: bool,
    /// `--gamma`: the regularisers GFSVI and TFSVI try in `gfsvi-uci` / `gfsvi-ood` (one value
    /// fixes γ; several are chosen per fold by the validation NLL; `None`: the paper's 1e-10 and
    /// 1e-6).
    pub gammas: Option<Vec<f64>>,
    /// `--sets`: the UCI sets `gfsvi-uci` / `gfsvi-ood` / `gfsvi-w2` run (`None`: all four).
    pub sets: Option<Vec<String>>,
    /// `--folds`: the folds (1–5, ascending) those three run (`None`: the first `--seeds`, or all).
    pub folds: Option<Vec<usize>>,
    /// `--covariance-points`: the point counts `fsp-bayesopt-covariance` runs (`None`: its own).
    pub covariance_points: Option<Vec<usize>>,
    /// `--methods`: the table rows `valla-mnist` / `valla-fmnist` fit (`None`: every row); the
    /// MAP network is trained either way.
    pub methods: Option<Vec<String>>,
}

impl Options {
    /// These options for `e` alone, without the flags it does not accept (`--all`).
    pub fn restricted_to(&self, e: &Experiment) -> Options {
        let accepts = |f: Flag| e.flags.contains(&f);
        Options {
            seeds: self.seeds.filter(|_| accepts(Flag::Seeds)),
            resume: self.resume && accepts(Flag::Resume),
            gammas: self.gammas.clone().filter(|_| accepts(Flag::Gamma)),
            sets: self.sets.clone().filter(|_| accepts(Flag::Sets)),
            folds: self.folds.clone().filter(|_| accepts(Flag::Folds)),
            covariance_points: self.covariance_points.clone().filter(|_| accepts(Flag::CovariancePoints)),
            methods: self.methods.clone().filter(|_| accepts(Flag::Methods)),
            ..self.clone()
        }
    }

    /// The experiment-specific flags these options set.
    pub fn flags_given(&self) -> Vec<Flag> {
        let mut given = Vec::new();
        for (flag, set) in [
            (Flag::Seeds, self.seeds.is_some()),
            (Flag::Resume, self.resume),
            (Flag::Gamma, self.gammas.is_some()),
            (Flag::Sets, self.sets.is_some()),
            (Flag::Folds, self.folds.is_some()),
            (Flag::CovariancePoints, self.covariance_points.is_some()),
            (Flag::Methods, self.methods.is_some()),
        ] {
            if set {
                given.push(flag);
            }
        }
        given
    }
}

/// A flag only some experiments accept (`--quick`, `--seed` and `--out` apply to every one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flag {
    /// `--seeds K`: seeds, splits or folds.
    Seeds,
    /// `--resume`: keep the finished units of an interrupted run.
    Resume,
    /// `--gamma G[,G…]`: GFSVI's / TFSVI's γ grid.
    Gamma,
    /// `--sets S[,S…]`: which UCI sets.
    Sets,
    /// `--folds F[,F…]`: which of the five folds.
    Folds,
    /// `--covariance-points N[,N…]`: FSP-Laplace's covariance point counts.
    CovariancePoints,
    /// `--methods M[,M…]`: which rows of a table are fitted.
    Methods,
}

impl Flag {
    /// The flag as typed.
    pub fn name(self) -> &'static str {
        match self {
            Flag::Seeds => "--seeds",
            Flag::Resume => "--resume",
            Flag::Gamma => "--gamma",
            Flag::Sets => "--sets",
            Flag::Folds => "--folds",
            Flag::CovariancePoints => "--covariance-points",
            Flag::Methods => "--methods",
        }
    }
}

/// Draws a finished run's figures into its folder from its `metrics.json`; returns the files.
pub type Redraw = fn(&std::path::Path) -> Result<Vec<std::path::PathBuf>>;

/// An experiment the harness can run.
pub struct Experiment {
    /// `cargo xtask reproduce NAME`.
    pub name: &'static str,
    /// What it reproduces.
    pub paper: &'static str,
    /// Part of `cargo xtask reproduce` without names.
    pub in_default_suite: bool,
    /// The experiment-specific flags it accepts.
    pub flags: &'static [Flag],
    /// Measured wall time of the full setting on 2 cores, in minutes (`None`: never timed).
    pub full_minutes: Option<f64>,
    /// The experiment this one runs at a smaller budget (`valla-toy-quick` → `valla-toy`);
    /// `--all` skips it and runs the original.
    pub budget_of: Option<&'static str>,
    /// Runs it, writing `results/NAME/`.
    pub run: fn(&Options) -> Result<()>,
    /// Redraws the figures of a finished run's folder from its `metrics.json` alone and returns
    /// the files written (`cargo xtask redraw NAME`); `None` where the figures need data the metrics do not hold
    /// (samples, predictive bands, histograms), so that only a rerun redraws them.
    pub redraw: Option<Redraw>,
}

impl Experiment {
    /// The flags as one line for `--help` (`—` for none).
    pub fn flags_line(&self) -> String {
        if self.flags.is_empty() {
            "—".into()
        } else {
            self.flags.iter().map(|f| f.name()).collect::<Vec<_>>().join(" ")
        }
    }
}

/// Refuses a flag that one of `selected` does not accept, naming the experiments that do.
pub fn check_flags(opts: &Options, selected: &[&Experiment], all: &[Experiment]) -> Result<()> {
    for flag in opts.flags_given() {
        if let Some(e) = selected.iter().find(|e| !e.flags.contains(&flag)) {
            let accepting: Vec<&str> =
                all.iter().filter(|e| e.flags.contains(&flag)).map(|e| e.name).collect();
            bail!(
                "{} does not apply to {} (it applies to {}); name only experiments that accept it",
                flag.name(),
                e.name,
                accepting.join(", ")
            );
        }
    }
    if opts.folds.is_some() && opts.seeds.is_some() {
        bail!("--folds and --seeds both choose the folds; give one");
    }
    Ok(())
}

/// `"≈ 8 h 10 min"`-style rendering of minutes.
pub fn human_minutes(minutes: f64) -> String {
    if minutes < 1.0 {
        format!("≈ {:.0} s", minutes * 60.0)
    } else if minutes < 90.0 {
        format!("≈ {minutes:.0} min")
    } else {
        let (h, m) = ((minutes / 60.0).floor(), (minutes % 60.0).round());
        if m == 0.0 {
            format!("≈ {h:.0} h")
        } else {
            format!("≈ {h:.0} h {m:.0} min")
        }
    }
}
