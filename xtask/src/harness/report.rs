//! An experiment's output folder: `metrics.json`, `table.md`, PNG plots and `log.txt`, plus
//! a progress bar on the terminal (hidden when stderr is not a terminal).

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};

/// The log line that records where a part came from (`cargo xtask publish` reads it).
pub const PROVENANCE: &str = "provenance:";

/// `commit C[ + uncommitted changes], started YYYY-MM-DDTHH:MMZ, `cargo xtask ARGS``.
pub(crate) fn provenance() -> String {
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
    let args: Vec<String> = std::env::args().skip(1).map(|a| portable_path(&a)).collect();
    format!("commit {commit}, started {}, `cargo xtask {}`", utc_now(), shell_words(&args))
}

/// A path as a committed file may record it: relative to the checkout when inside it, `DIR` for
/// an absolute path outside it (a folder of one machine means nothing on another, and the
/// published files must not carry it); anything else unchanged.
pub(crate) fn portable_path(arg: &str) -> String {
    let path = Path::new(arg);
    if !path.is_absolute() {
        return arg.to_string();
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap_or(Path::new("/"));
    match path.strip_prefix(root) {
        Ok(rel) if !rel.as_os_str().is_empty() => rel.display().to_string(),
        Ok(_) => ".".into(),
        Err(_) => "DIR".into(),
    }
}

/// The arguments as a shell would need them typed: an argument with a space, a quote or another
/// character the shell reads is put in single quotes (`--methods 'MAP,VaLLA 100'`), so the
/// command a `RUN.md` records can be pasted back.
fn shell_words(args: &[String]) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "-_./,=:+@%".contains(c);
    args.iter()
        .map(|a| {
            if !a.is_empty() && a.chars().all(plain) {
                a.clone()
            } else {
                format!("'{}'", a.replace('\'', "'\\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
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
    pub(crate) started: Instant,
    pub(crate) resumed: bool,
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

    /// `"Wall time: N s"`, or for a resumed run the time of this part, saying so.
    pub fn wall_time(&self) -> String {
        let secs = self.elapsed_seconds();
        if self.resumed {
            format!("Wall time of this part (--resume; earlier parts' results kept): {secs:.0} s")
        } else {
            format!("Wall time: {secs:.0} s")
        }
    }

    /// The path of `file` inside the run folder.
    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }

    /// The run's folder, `OUT/NAME/`.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Writes `metrics.json` (pretty-printed).
    pub fn write_metrics(&mut self, metrics: &impl serde::Serialize) -> Result<()> {
        let path = self.path("metrics.json");
        write_atomically(&path, &(serde_json::to_string_pretty(metrics)? + "\n"))?;
        self.log("wrote metrics.json");
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
        self.log("wrote table.md");
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

/// Writes `path` through a temporary file renamed over it, so an interrupted run (the results
/// `--resume` reads) leaves the previous version, never a truncated one.
pub(crate) fn write_atomically(path: &Path, text: &str) -> Result<()> {
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

/// The line after which a `README.md` is generated: whatever precedes it is written by hand (the
/// claims table of `docs/results/README.md`, a run's own notes in its folder's `README.md`) and
/// kept as it is by [`write_index`].
pub const INDEX_MARKER: &str = "<!-- cargo xtask report: everything below this line is generated -->";

/// How a generated `README.md` begins (a file of `results/` that nobody edited).
const GENERATED_HEADER: &str = "# Results\n\nWritten by `cargo xtask reproduce` after every experiment: one line \
per run found in this folder, linking its `README.md` (the run's table, ours beside the paper's numbers, its figures and \
how it was run; `--quick` runs say so in their title). Regenerate one with `cargo xtask reproduce NAME`.\n";

/// `text` up to and including [`INDEX_MARKER`] (the hand-written part), or `None` when the
/// marker is absent.
fn hand_written(text: &str) -> Option<&str> {
    text.find(INDEX_MARKER).map(|at| &text[..at + INDEX_MARKER.len()])
}

/// Reads `path`, `None` when it does not exist.
fn read_if_present(path: &Path) -> Result<Option<String>> {
    match fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

/// Rewrites the index of `out/README.md` and each run's own `out/NAME/README.md`, for every
/// experiment that has a `table.md` under `out/`, in registry order.
///
/// A run's `README.md` is its page: a title (the name and the paper's figures or tables it
/// reproduces), then its table (ours beside the paper's numbers, with its figures) and a link to
/// its `RUN.md` (commit, command, wall time). The index lists one line per run, linking that page.
///
/// Hand-written text is never lost: an existing file with [`INDEX_MARKER`] keeps everything up
/// to the marker and gets the generated text after it; an existing file that is neither generated
/// nor marked keeps all its text and gets the marker and the generated text appended. Only a
/// missing file or one this function wrote without a marker is replaced whole. A run's first
/// `README.md` puts its title above the marker, so notes written under the title are kept.
pub fn write_index<'a>(out: &str, experiments: impl Iterator<Item = (&'a str, &'a str)>) -> Result<()> {
    let path = Path::new(out).join("README.md");
    let mut md = match read_if_present(&path)? {
        Some(text) => match hand_written(&text) {
            Some(hand) => format!("{hand}\n"),
            None if !text.starts_with(GENERATED_HEADER) => format!("{}\n\n{INDEX_MARKER}\n", text.trim_end()),
            None => String::from(GENERATED_HEADER),
        },
        None => String::from(GENERATED_HEADER),
    };
    let mut lines = Vec::new();
    for (name, paper) in experiments {
        let folder = Path::new(out).join(name);
        let Some(table) = read_if_present(&folder.join("table.md"))? else { continue };
        write_run_readme(&folder, name, paper, &table)?;
        // The table's own title says "quick mode" where so; the index repeats it.
        let title = table.lines().find_map(|l| l.strip_prefix("# ")).unwrap_or(name).trim();
        lines.push(format!("- [{name}]({name}/README.md) — {paper}. *{title}*"));
    }
    if lines.is_empty() {
        md.push_str("\nNo experiment has been run into this folder yet.\n");
    } else {
        md.push_str(&format!("\n{}\n", lines.join("\n")));
    }
    fs::write(&path, md).with_context(|| format!("writing {}", path.display()))
}

/// Writes `folder/README.md` for the run `name`: the hand-written part (or, the first time, a
/// title), then its `table.md` with its subsections demoted below the title, and a link to its
/// `RUN.md` where there is one.
fn write_run_readme(folder: &Path, name: &str, paper: &str, table: &str) -> Result<()> {
    let path = folder.join("README.md");
    let mut md = match read_if_present(&path)? {
        Some(text) => match hand_written(&text) {
            Some(hand) => format!("{hand}\n"),
            None => format!("{}\n\n{INDEX_MARKER}\n", text.trim_end()),
        },
        None => format!("# {name} — {paper}\n\n{INDEX_MARKER}\n"),
    };
    let body: Vec<String> = table
        .lines()
        .map(|l| match l.strip_prefix("# ") {
            Some(title) => format!("*{title}*"),
            None if l.starts_with('#') => format!("#{l}"),
            None => l.to_string(),
        })
        .collect();
    md.push_str(&format!("\n{}\n", body.join("\n").trim_end()));
    if folder.join("RUN.md").is_file() {
        md.push_str(
            "\nHow it was run — the commit, the command, the start and the wall time of each part: \
[RUN.md](RUN.md).\n",
        );
    }
    fs::write(&path, md).with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {

    #[test]
    fn paths_are_recorded_relative_to_the_checkout_or_as_dir() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        assert_eq!(super::portable_path(&root.join("results/quick").display().to_string()), "results/quick");
        assert_eq!(super::portable_path(&root.display().to_string()), ".");
        assert_eq!(super::portable_path("/somewhere/else/runs"), "DIR");
        assert_eq!(super::portable_path("--out"), "--out");
        assert_eq!(super::portable_path("results"), "results");
    }

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
    fn a_recorded_command_quotes_what_the_shell_would_split() {
        let args: Vec<String> = [
            "reproduce",
            "valla-mnist",
            "--methods",
            "MAP,LLA* (last layer)",
            "--out",
            "/tmp/a b",
            "it's",
            "",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(
            shell_words(&args),
            "reproduce valla-mnist --methods 'MAP,LLA* (last layer)' --out '/tmp/a b' 'it'\\''s' ''"
        );
        assert_eq!(shell_words(&["--seeds".into(), "5".into()]), "--seeds 5");
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
    fn the_index_lists_exactly_the_runs_with_a_table_and_each_gets_its_page() {
        let out = std::env::temp_dir().join(format!("fspace-index-{}", std::process::id()));
        fs::create_dir_all(out.join("a")).unwrap();
        fs::create_dir_all(out.join("b")).unwrap();
        fs::write(out.join("a/table.md"), "# a (quick)\n\n| x | y |\n|---|---|\n| 1 | 2 |\n\n## sub\n")
            .unwrap();
        fs::write(out.join("a/RUN.md"), "commit abc\n").unwrap();
        let out_s = out.to_str().unwrap();
        write_index(out_s, [("a", "Paper A"), ("b", "Paper B"), ("c", "Paper C")].into_iter()).unwrap();
        let md = fs::read_to_string(out.join("README.md")).unwrap();
        assert!(md.contains("- [a](a/README.md) — Paper A. *a (quick)*"), "{md}");
        assert!(!md.contains("Paper B") && !md.contains("Paper C") && !md.contains("| 1 | 2 |"));
        let page = fs::read_to_string(out.join("a/README.md")).unwrap();
        assert!(page.starts_with("# a — Paper A\n"), "{page}");
        assert!(page.contains("*a (quick)*") && page.contains("| 1 | 2 |") && page.contains("### sub"));
        assert!(page.contains("[RUN.md](RUN.md)") && !out.join("b/README.md").exists());
        // Rewriting replaces the generated parts whole (no second header or title).
        write_index(out_s, [("a", "Paper A")].into_iter()).unwrap();
        assert_eq!(fs::read_to_string(out.join("README.md")).unwrap(), md);
        assert_eq!(fs::read_to_string(out.join("a/README.md")).unwrap(), page);
        fs::remove_dir_all(&out).unwrap();
    }

    #[test]
    fn the_index_and_the_pages_keep_hand_written_text_above_the_marker() {
        let out = std::env::temp_dir().join(format!("fspace-claims-{}", std::process::id()));
        fs::create_dir_all(out.join("a")).unwrap();
        fs::write(out.join("a/table.md"), "# a\n\n| x | y |\n|---|---|\n| 1 | 2 |\n").unwrap();
        let out_s = out.to_str().unwrap();
        let claims = "# Claims\n\n| # | claim |\n|---|---|\n| F-1 | holds |\n";
        // A hand-written file without the marker keeps all its text; the index follows a marker.
        fs::write(out.join("README.md"), claims).unwrap();
        write_index(out_s, [("a", "Paper A")].into_iter()).unwrap();
        let first = fs::read_to_string(out.join("README.md")).unwrap();
        assert!(first.starts_with(claims), "{first}");
        assert_eq!(first.matches(INDEX_MARKER).count(), 1);
        assert!(first.contains("- [a](a/README.md) — Paper A"));
        assert!(!first.contains("Written by `cargo xtask reproduce`"));
        // Notes written under a run's title survive a regeneration that changes its table.
        let page = fs::read_to_string(out.join("a/README.md")).unwrap();
        let noted = page.replacen(INDEX_MARKER, &format!("Rerun for its figures.\n\n{INDEX_MARKER}"), 1);
        fs::write(out.join("a/README.md"), noted).unwrap();
        fs::write(out.join("a/table.md"), "# a\n\n| x | y |\n|---|---|\n| 3 | 4 |\n").unwrap();
        write_index(out_s, [("a", "Paper A")].into_iter()).unwrap();
        let second = fs::read_to_string(out.join("README.md")).unwrap();
        assert_eq!(second, first);
        let page = fs::read_to_string(out.join("a/README.md")).unwrap();
        assert!(
            page.contains("Rerun for its figures.")
                && page.contains("| 3 | 4 |")
                && !page.contains("| 1 | 2 |")
        );
        assert_eq!(page.matches(INDEX_MARKER).count(), 1);
        fs::remove_dir_all(&out).unwrap();
    }
}
