//! An experiment's output folder: `metrics.json`, `table.md`, PNG plots and `log.txt`, plus
//! a progress bar on the terminal (hidden when stderr is not a terminal).

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};

/// The log line that records where a sitting came from (`cargo xtask publish` reads it).
pub const PROVENANCE: &str = "provenance:";

/// `commit C[ + uncommitted changes], started YYYY-MM-DDTHH:MMZ, `cargo xtask ARGS``.
fn provenance() -> String {
    let repo = env!("CARGO_MANIFEST_DIR");
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .arg("-C")
            .arg(repo)
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let commit = match git(&["rev-parse", "--short=10", "HEAD"]) {
        Some(c) if git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty()) => {
            format!("{c} + uncommitted changes")
        }
        Some(c) => c,
        None => "unknown (no git checkout)".into(),
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    format!("commit {commit}, started {}, `cargo xtask {}`", utc_now(), args.join(" "))
}

/// The current UTC time as `YYYY-MM-DDTHH:MMZ` (civil date from days since 1970, Hinnant's
/// algorithm).
fn utc_now() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}Z", rem / 3_600, rem % 3_600 / 60)
}

/// One experiment's run: its folder and log.
pub struct Run {
    dir: PathBuf,
    log: File,
    started: Instant,
    resumed: bool,
}

impl Run {
    /// Creates (or reuses) `out/name/` and starts `log.txt` there.
    pub fn new(out: &str, name: &str) -> Result<Self> {
        Self::open(out, name, false)
    }

    /// As [`Run::new`], but with `append` the log continues the one already there (a resumed run).
    pub fn open(out: &str, name: &str, append: bool) -> Result<Self> {
        let dir = Path::new(out).join(name);
        fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let log = fs::OpenOptions::new()
            .create(true)
            .write(true)
            .append(append)
            .truncate(!append)
            .open(dir.join("log.txt"))
            .with_context(|| format!("opening {}/log.txt", dir.display()))?;
        let mut run = Self { dir, log, started: Instant::now(), resumed: append };
        run.log(format!("{PROVENANCE} {}", provenance()));
        Ok(run)
    }

    /// A line to the terminal and the log, stamped with the elapsed time.
    pub fn log(&mut self, msg: impl AsRef<str>) {
        let line = format!("[{:7.1}s] {}", self.started.elapsed().as_secs_f64(), msg.as_ref());
        println!("  {line}");
        // A failing log write must not abort an experiment whose results are still written.
        let _ = writeln!(self.log, "{line}");
    }

    /// Seconds since the run started.
    pub fn elapsed_seconds(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// `"Wall time: N s"`, or for a resumed run the time of this sitting, saying so.
    pub fn wall_time(&self) -> String {
        let secs = self.elapsed_seconds();
        if self.resumed {
            format!("Wall time of this sitting (--resume; earlier sittings' results kept): {secs:.0} s")
        } else {
            format!("Wall time: {secs:.0} s")
        }
    }

    /// The path of `file` inside the run folder.
    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }

    /// Writes `metrics.json` (pretty-printed).
    pub fn write_metrics(&mut self, metrics: &serde_json::Value) -> Result<()> {
        let path = self.path("metrics.json");
        write_atomically(&path, &(serde_json::to_string_pretty(metrics)? + "\n"))?;
        self.log(format!("wrote {}", path.display()));
        Ok(())
    }

    /// Writes `table.md`. A table with a missing value ("–" in a cell) must say why in a
    /// footnote that starts `"–":`; one that does not gets a generic footnote (and the log says
    /// so), so a dash never stands unexplained.
    pub fn write_table(&mut self, markdown: &str) -> Result<()> {
        let path = self.path("table.md");
        let text = with_dash_footnote(markdown);
        if text.len() != markdown.len() {
            self.log("table.md has a \"–\" cell without a footnote saying why; added the generic one");
        }
        write_atomically(&path, &text)?;
        self.log(format!("wrote {}", path.display()));
        Ok(())
    }

    /// A progress bar over `len` steps.
    pub fn progress(&self, len: u64, what: &str) -> ProgressBar {
        let bar = ProgressBar::new(len);
        bar.set_style(
            ProgressStyle::with_template("  {prefix} [{bar:30}] {pos}/{len} {msg} ({elapsed})")
                .expect("valid template")
                .progress_chars("=> "),
        );
        bar.set_prefix(what.to_string());
        bar
    }
}

/// The finished units of a long experiment (a fold's method, say) in `out/NAME/checkpoint.json`,
/// saved as each finishes: with `--resume`, a rerun of the same settings keeps them and computes
/// only the rest, so a run of many hours can span several sittings.
pub struct Checkpoint {
    path: PathBuf,
    settings: serde_json::Value,
    done: serde_json::Map<String, serde_json::Value>,
    /// Wall seconds of the earlier sittings that stored units (`None`: a file from before the
    /// time was stored), and how many sittings there were.
    earlier: (Option<f64>, u64),
    /// Whether this sitting stored a unit (a `--resume` that only redraws counts no sitting).
    stored: bool,
    /// The start of this sitting (its [`Run`]'s).
    started: Instant,
}

impl Checkpoint {
    /// The run's checkpoint. A fresh run ([`Run::new`]) starts empty (an old file is replaced at
    /// the first [`Checkpoint::put_numbers`]); a resumed one ([`Run::open`] with `append`) keeps
    /// the units an earlier run stored under equal `settings`, says how many in the log, and
    /// refuses a file of other settings with an error that names both.
    pub fn open(run: &mut Run, settings: serde_json::Value) -> Result<Self> {
        let path = run.path("checkpoint.json");
        let mut done = serde_json::Map::new();
        let mut earlier = (Some(0.0), 0);
        if run.resumed {
            match fs::read_to_string(&path) {
                Ok(text) => {
                    let old: serde_json::Value =
                        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
                    if old["settings"] != settings {
                        anyhow::bail!(
                            "{} was written with settings {} but this run has {}; --resume only continues \
                             a run of the same settings",
                            path.display(),
                            old["settings"],
                            settings
                        );
                    }
                    done = old["done"]
                        .as_object()
                        .with_context(|| format!("{} has no \"done\" object", path.display()))?
                        .clone();
                    // Files from before the wall time was stored: one sitting of unknown time.
                    earlier = (old["seconds"].as_f64(), old["sittings"].as_u64().unwrap_or(1));
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
            }
            run.log(format!("--resume: {} finished units kept from checkpoint.json", done.len()));
        }
        Ok(Self { path, settings, done, earlier, stored: false, started: run.started })
    }

    /// Wall seconds of every sitting so far, this one included (`None` when an earlier
    /// sitting's time was not recorded).
    pub fn total_seconds(&self) -> Option<f64> {
        self.earlier.0.map(|s| s + self.started.elapsed().as_secs_f64())
    }

    /// `"Wall time: N s"` for a run of one sitting; for one built over several, their sum and
    /// this sitting's share (the time between sittings not counted). A `--resume` sitting that
    /// computed nothing is not counted as one; an earlier sitting whose time the file does not
    /// hold (written before the time was stored) is named as unrecorded, never counted as 0 s.
    pub fn wall_time(&self) -> String {
        let this = self.started.elapsed().as_secs_f64();
        let (earlier, n) = self.earlier;
        match (n, self.stored, earlier) {
            (0, _, _) => format!("Wall time: {this:.0} s"),
            (1, false, Some(e)) => format!("Wall time: {e:.0} s (this --resume computed nothing new)"),
            (n, false, Some(e)) => {
                format!("Wall time: {e:.0} s summed over {n} sittings (this --resume computed nothing new)")
            }
            (n, true, Some(e)) => {
                format!("Wall time: {:.0} s summed over {} sittings (--resume; this one {this:.0} s)", e + this, n + 1)
            }
            (n, stored, None) => format!(
                "Wall time: not recorded for the {n} earlier sitting(s) (checkpoint from before it was stored){}",
                if stored { format!("; this --resume sitting {this:.0} s") } else { String::new() }
            ),
        }
    }

    /// The numbers stored under `key`, if that unit is finished (NaN is stored as `null`).
    pub fn get_numbers(&self, key: &str) -> Result<Option<Vec<f64>>> {
        let Some(v) = self.done.get(key) else { return Ok(None) };
        let bad =
            || anyhow::anyhow!("{}: unit {key:?} holds {v}, not a list of numbers", self.path.display());
        v.as_array()
            .ok_or_else(bad)?
            .iter()
            .map(|x| if x.is_null() { Ok(f64::NAN) } else { x.as_f64().ok_or_else(bad) })
            .collect::<Result<Vec<f64>>>()
            .map(Some)
    }

    /// The `N` numbers stored under `key`, if that unit is finished; another count is an error.
    pub fn get_array<const N: usize>(&self, key: &str) -> Result<Option<[f64; N]>> {
        self.get_numbers(key)?
            .map(|v| {
                <[f64; N]>::try_from(v.as_slice()).map_err(|_| {
                    anyhow::anyhow!(
                        "{}: unit {key:?} holds {} numbers, not {N}",
                        self.path.display(),
                        v.len()
                    )
                })
            })
            .transpose()
    }

    /// Whether `key` is finished.
    pub fn has(&self, key: &str) -> bool {
        self.done.contains_key(key)
    }

    /// Number of finished units.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.done.len()
    }

    /// Stores `key` as finished with its numbers and rewrites the file (a temporary file
    /// renamed over it, so an interrupted write leaves the previous version).
    pub fn put_numbers(&mut self, key: &str, values: &[f64]) -> Result<()> {
        self.done.insert(key.to_string(), serde_json::json!(values));
        self.stored = true;
        let text = serde_json::to_string_pretty(&serde_json::json!({
            "settings": self.settings, "done": self.done,
            "seconds": self.total_seconds(), "sittings": self.earlier.1 + 1,
        }))?;
        write_atomically(&self.path, &(text + "\n"))
    }
}

/// Writes `path` through a temporary file renamed over it, so an interrupted run (the results
/// `--resume` reads) leaves the previous version, never a truncated one.
fn write_atomically(path: &Path, text: &str) -> Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    fs::write(&tmp, text).with_context(|| format!("writing {}", tmp.display()))?;
    fs::rename(&tmp, path).with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))
}

/// The footnote that explains the "–" cells of a table.
pub const DASH_FOOTNOTE: &str = "\"–\":";

/// Whether a markdown table row has a cell that is, or starts with, "–".
fn has_dash_cell(line: &str) -> bool {
    let t = line.trim();
    t.starts_with('|')
        && t.trim_matches('|').split('|').any(|c| c.trim() == "–" || c.trim().starts_with("– "))
}

/// `markdown`, with a generic footnote appended when a table cell is "–" and no `"–":` footnote
/// says why.
fn with_dash_footnote(markdown: &str) -> String {
    if markdown.lines().any(has_dash_cell) && !markdown.contains(DASH_FOOTNOTE) {
        format!(
            "{}\n\n{DASH_FOOTNOTE} a value this run did not produce (not defined for that method, or not computed);              `metrics.json` and `log.txt` have the details.\n",
            markdown.trim_end()
        )
    } else {
        markdown.to_string()
    }
}

/// A markdown table from a header and rows.
pub fn markdown_table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut s = format!("| {} |\n|{}\n", header.join(" | "), "---|".repeat(header.len()));
    for r in rows {
        s += &format!("| {} |\n", r.join(" | "));
    }
    s
}

/// Compact number formatting for tables; a missing value (NaN) prints as "–", never as `NaN`
/// (the table's notes say why it is missing).
pub fn fmt(v: f64) -> String {
    if v.is_nan() {
        "–".to_string()
    } else if v == 0.0 || (1e-3..1e4).contains(&v.abs()) {
        format!("{v:.4}")
    } else {
        format!("{v:.3e}")
    }
}

/// `(mean, sample std)` of a list; the std is 0 for fewer than two values.
pub fn mean_std(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    let m = v.iter().sum::<f64>() / n;
    let sd =
        if v.len() > 1 { (v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (n - 1.0)).sqrt() } else { 0.0 };
    (m, sd)
}

/// `(mean, standard error)` of a list; the standard error is NaN for fewer than two values.
pub fn mean_se(v: &[f64]) -> (f64, f64) {
    let (m, sd) = mean_std(v);
    (m, if v.len() < 2 { f64::NAN } else { sd / (v.len() as f64).sqrt() })
}

/// A `"mean ± spread"` table cell (just the mean when the spread is NaN).
pub fn pm_cell((mean, spread): (f64, f64)) -> String {
    if spread.is_nan() {
        fmt(mean)
    } else {
        format!("{} ± {}", fmt(mean), fmt(spread))
    }
}

/// Rewrites `out/README.md`: one section per experiment that has a `table.md` under `out/`, in
/// registry order — its paper reference, a link to its folder and its table (ours beside the
/// paper's numbers), so one file indexes every run and its headline numbers.
pub fn write_index<'a>(out: &str, experiments: impl Iterator<Item = (&'a str, &'a str)>) -> Result<()> {
    let mut md = String::from(
        "# Results\n\nWritten by `cargo xtask reproduce` after every experiment: each section is the `table.md` of a run \
found in this folder (ours beside the paper's numbers; `--quick` runs say so in their title). Regenerate one with \
`cargo xtask reproduce NAME`.\n",
    );
    let mut found = 0;
    for (name, paper) in experiments {
        let table = Path::new(out).join(name).join("table.md");
        let Ok(text) = fs::read_to_string(&table) else { continue };
        found += 1;
        // The table's own title becomes an emphasised line (it says "quick mode" where so);
        // its subsections are demoted below ours.
        let body: Vec<String> = text
            .lines()
            .map(|l| match l.strip_prefix("# ") {
                Some(title) => format!("*{title}*"),
                None if l.starts_with('#') => format!("##{l}"),
                None => l.to_string(),
            })
            .collect();
        md.push_str(&format!("\n## [{name}]({name}/) — {paper}\n\n{}\n", body.join("\n").trim_end()));
    }
    if found == 0 {
        md.push_str("\nNo experiment has been run into this folder yet.\n");
    }
    let path = Path::new(out).join("README.md");
    fs::write(&path, md).with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_records_its_commit_and_start_in_the_log() {
        let now = utc_now();
        let out = std::env::temp_dir().join(format!("fspace-provenance-{}", std::process::id()));
        let mut run = Run::new(out.to_str().unwrap(), "exp").unwrap();
        run.log("x");
        let log = fs::read_to_string(out.join("exp/log.txt")).unwrap();
        let line = log.lines().next().unwrap();
        assert!(
            line.contains(PROVENANCE) && line.contains("commit ") && line.contains("cargo xtask"),
            "{line}"
        );
        // The date agrees with the system's `date -u` where it exists.
        if let Ok(o) = std::process::Command::new("date").args(["-u", "+%Y-%m-%dT%H"]).output() {
            let hour = String::from_utf8_lossy(&o.stdout).trim().to_string();
            assert!(
                hour.is_empty() || now.starts_with(&hour) || utc_now().starts_with(&hour),
                "{now} vs {hour}"
            );
        }
        fs::remove_dir_all(&out).unwrap();
    }

    #[test]
    fn missing_values_print_as_a_dash_never_nan() {
        assert_eq!(fmt(f64::NAN), "–");
        assert_eq!(pm_cell((f64::NAN, f64::NAN)), "–");
        assert_eq!(pm_cell((0.5, f64::NAN)), "0.5000");
        assert_eq!(fmt(0.25), "0.2500");
    }

    #[test]
    fn a_dash_in_a_table_always_has_a_footnote() {
        let table = markdown_table(&["m", "x"], &[vec!["MAP".into(), fmt(f64::NAN)]]);
        let generic = with_dash_footnote(&table);
        assert!(generic.contains("\"–\": a value this run did not produce"), "{generic}");
        let own = format!("{table}\n\"–\": MAP has no variance.\n");
        assert_eq!(with_dash_footnote(&own), own);
        let none = markdown_table(&["m", "x"], &[vec!["MAP".into(), fmt(0.5)]]);
        assert_eq!(with_dash_footnote(&none), none);
        // A dash inside prose or a range ("C.1–C.4") is not a missing value.
        let prose = "Fig. C.1–C.4\n\n| a | b |\n|---|---|\n| 1–2 | 3 |\n";
        assert_eq!(with_dash_footnote(prose), prose);
    }

    #[test]
    fn the_index_lists_exactly_the_runs_with_a_table() {
        let out = std::env::temp_dir().join(format!("fspace-index-{}", std::process::id()));
        fs::create_dir_all(out.join("a")).unwrap();
        fs::create_dir_all(out.join("b")).unwrap();
        fs::write(out.join("a/table.md"), "# a\n\n| x | y |\n|---|---|\n| 1 | 2 |\n\n## sub\n").unwrap();
        let out_s = out.to_str().unwrap();
        write_index(out_s, [("a", "Paper A"), ("b", "Paper B"), ("c", "Paper C")].into_iter()).unwrap();
        let md = fs::read_to_string(out.join("README.md")).unwrap();
        assert!(md.contains("## [a](a/) — Paper A") && md.contains("| 1 | 2 |") && md.contains("#### sub"));
        assert!(md.contains("*a*") && !md.contains("# a\n"));
        assert!(!md.contains("Paper B") && !md.contains("Paper C"));
        fs::remove_dir_all(&out).unwrap();
    }

    #[test]
    fn a_checkpoint_keeps_units_across_sittings_of_the_same_settings_only() {
        let out = std::env::temp_dir().join(format!("fspace-checkpoint-{}", std::process::id()));
        let out_s = out.to_str().unwrap();
        let settings = serde_json::json!({ "steps": 10 });
        {
            let mut run = Run::new(out_s, "exp").unwrap();
            let mut ck = Checkpoint::open(&mut run, settings.clone()).unwrap();
            ck.put_numbers("set/fold 1/A", &[-0.5, 0.1 + 0.2, f64::NAN]).unwrap();
            ck.put_numbers("set/fold 1/B", &[1.0]).unwrap();
        }
        let mut resumed = Run::open(out_s, "exp", true).unwrap();
        let mut ck = Checkpoint::open(&mut resumed, settings.clone()).unwrap();
        assert_eq!(ck.len(), 2);
        // A resume that computes nothing counts no sitting; one that stores a unit does.
        assert!(ck.wall_time().ends_with(" s (this --resume computed nothing new)"), "{}", ck.wall_time());
        let stored: serde_json::Value =
            serde_json::from_str(&fs::read_to_string(resumed.path("checkpoint.json")).unwrap()).unwrap();
        assert_eq!(stored["sittings"], 1);
        assert!(stored["seconds"].as_f64().unwrap() <= ck.total_seconds().unwrap());
        ck.put_numbers("set/fold 1/C", &[2.0]).unwrap();
        assert!(ck.wall_time().contains("summed over 2 sittings"), "{}", ck.wall_time());
        let stored: serde_json::Value =
            serde_json::from_str(&fs::read_to_string(resumed.path("checkpoint.json")).unwrap()).unwrap();
        assert_eq!(stored["sittings"], 2);
        let a = ck.get_numbers("set/fold 1/A").unwrap().unwrap();
        // Exact round trip (0.1 + 0.2 is not 0.3), NaN kept as NaN.
        assert_eq!((a[0], a[1]), (-0.5, 0.1 + 0.2));
        assert!(a[2].is_nan());
        assert!(ck.has("set/fold 1/B") && !ck.has("set/fold 2/B"));
        assert!(ck.get_numbers("set/fold 2/B").unwrap().is_none());
        assert_eq!(ck.get_array::<1>("set/fold 1/B").unwrap(), Some([1.0]));
        let err = ck.get_array::<2>("set/fold 1/B").err().unwrap().to_string();
        assert!(err.contains("holds 1 numbers, not 2"), "{err}");
        // Without --resume the old units and sittings are not used.
        let fresh = Checkpoint::open(&mut Run::new(out_s, "exp").unwrap(), settings.clone()).unwrap();
        assert_eq!(fresh.len(), 0);
        assert!(fresh.wall_time().starts_with("Wall time: ") && !fresh.wall_time().contains("sittings"));
        // A file from before the time was stored: the earlier time is named as unrecorded.
        let legacy = serde_json::json!({ "settings": settings, "done": { "set/fold 1/A": [1.0] } });
        fs::write(resumed.path("checkpoint.json"), legacy.to_string()).unwrap();
        let mut old =
            Checkpoint::open(&mut Run::open(out_s, "exp", true).unwrap(), settings.clone()).unwrap();
        assert_eq!(old.total_seconds(), None);
        assert!(old.wall_time().contains("not recorded for the 1 earlier sitting"), "{}", old.wall_time());
        old.put_numbers("set/fold 1/B", &[1.0]).unwrap();
        assert!(old.wall_time().contains("this --resume sitting"), "{}", old.wall_time());
        // Other settings are refused, naming both.
        let err =
            Checkpoint::open(&mut resumed, serde_json::json!({ "steps": 20 })).err().unwrap().to_string();
        assert!(err.contains("\"steps\":10") && err.contains("\"steps\":20"), "{err}");
        fs::remove_dir_all(&out).unwrap();
    }
}
