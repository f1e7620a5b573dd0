//! `cargo xtask publish NAME… [--from DIR]`: copies a finished run into `docs/results/NAME/`,
//! the reference results committed with the code, so a reader sees the tables and figures
//! without running anything.
//!
//! Copied: `table.md`, `metrics.json`, every PNG (re-encoded at the best PNG compression, and
//! halved in size until it is at most [`MAX_PNG_BYTES`]); written: `RUN.md` with the run's
//! provenance lines from `log.txt` (commit, start date, command; one per part) and its wall
//! time. A run with a `checkpoint.json` (the resumable experiments) also keeps it and its
//! `log.txt`: `cargo xtask restore NAME` ([`restore`]) puts them back, so a partial run
//! committed with its finished units continues with `--resume` on any machine. A run without a
//! table is refused, and nothing else in the folder survives a publish.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use image::codecs::png::{CompressionType, FilterType, PngEncoder};
use image::imageops::FilterType as Resize;
use image::{ImageEncoder, RgbImage};

use super::checkpoint::recorded_wall_time;
use super::report::PROVENANCE;

/// The largest PNG kept in `docs/results/` (the repository's limit, so a clone stays small).
pub const MAX_PNG_BYTES: usize = 300 * 1024;

/// The PNG `img` at the best compression.
fn encode(img: &RgbImage) -> Result<Vec<u8>> {
    let mut bytes = Vec::new();
    PngEncoder::new_with_quality(&mut bytes, CompressionType::Best, FilterType::Adaptive).write_image(
        img.as_raw(),
        img.width(),
        img.height(),
        image::ColorType::Rgb8,
    )?;
    Ok(bytes)
}

/// `path` re-encoded, halved until it fits [`MAX_PNG_BYTES`]; returns the bytes and the scale.
fn small_png(path: &Path) -> Result<(Vec<u8>, u32)> {
    let mut img = image::open(path).with_context(|| format!("reading {}", path.display()))?.to_rgb8();
    let mut scale = 1;
    loop {
        let bytes = encode(&img)?;
        if bytes.len() <= MAX_PNG_BYTES || img.width() < 200 {
            return Ok((bytes, scale));
        }
        img = image::imageops::resize(&img, img.width() / 2, img.height() / 2, Resize::Triangle);
        scale *= 2;
    }
}

/// Writes [`small_png`] of `from` to `to` and returns the figure's label for `RUN.md`: its
/// name, size and, where it was scaled down, the scale.
fn shrink_figure(from: &Path, to: &Path) -> Result<String> {
    let (bytes, scale) = small_png(from)?;
    fs::write(to, &bytes)?;
    let file = to.file_name().expect("a file").to_string_lossy();
    let kb = bytes.len() / 1024;
    Ok(if scale == 1 {
        format!("`{file}` ({kb} KB)")
    } else {
        format!(
            "`{file}` ({kb} KB, drawn at {scale}× this size and scaled down to fit {} KB)",
            MAX_PNG_BYTES / 1024
        )
    })
}

/// The wall-time sentence of a table ("Wall time: N s …"), if it states one.
fn wall_time(table: &str) -> Option<String> {
    let start = table.find("Wall time")?;
    let rest = &table[start..];
    let end = rest.find(['.', '\n']).unwrap_or(rest.len());
    Some(rest[..end].trim().to_string())
}

/// `"Wall time: N s (the log's last stamp)"` from the last `[   N.Ns]` line of a log.
fn last_stamp(log: &str) -> Option<String> {
    let line = log.lines().rev().find(|l| l.trim_start().starts_with('['))?;
    let secs: f64 = line.trim_start().strip_prefix('[')?.split('s').next()?.trim().parse().ok()?;
    Some(format!("Wall time: {secs:.0} s (the log's last stamp)"))
}

/// Publishes `from/name` into `to/name`.
pub fn publish(from: &Path, to: &Path, name: &str) -> Result<PathBuf> {
    let src = from.join(name);
    let table = fs::read_to_string(src.join("table.md")).with_context(|| {
        format!("{} has no table.md: run `cargo xtask reproduce {name}` first", src.display())
    })?;
    let log = fs::read_to_string(src.join("log.txt")).unwrap_or_default();
    let parts: Vec<&str> =
        log.lines().filter_map(|l| l.split_once(PROVENANCE).map(|(_, rest)| rest.trim())).collect();
    if parts.is_empty() {
        bail!("{}/log.txt names no commit (a run from before runs recorded their provenance)", src.display());
    }
    let dst = to.join(name);
    if dst.exists() {
        fs::remove_dir_all(&dst).with_context(|| format!("clearing {}", dst.display()))?;
    }
    fs::create_dir_all(&dst)?;
    fs::write(dst.join("table.md"), &table)?;
    if src.join("metrics.json").exists() {
        fs::copy(src.join("metrics.json"), dst.join("metrics.json"))?;
    }
    let mut figures = Vec::new();
    let mut pngs: Vec<PathBuf> = fs::read_dir(&src)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "png"))
        .collect();
    pngs.sort();
    for png in pngs {
        let file = png.file_name().expect("a file");
        figures.push(shrink_figure(&png, &dst.join(file))?);
    }
    let resumable = src.join(CHECKPOINT).exists();
    let mut kept = Vec::new();
    if resumable {
        for file in checkpoint_files(&src)? {
            let name = file.file_name().expect("a file").to_string_lossy().into_owned();
            fs::copy(&file, dst.join(&name))?;
            kept.push(format!("`{name}`"));
        }
        fs::write(dst.join("log.txt"), &log)?;
    }
    let run_md = format!(
        "# {name}: the committed reference run\n\n\
         Written by `cargo xtask publish {name}` from `{}/{name}`.\n\n\
         - Parts (commit, start, command):\n{}\n\
         - {}\n\
         - Files: `table.md`, `metrics.json`{}{}{}\n",
        super::report::portable_path(&from.display().to_string()),
        parts.iter().map(|s| format!("  - {s}")).collect::<Vec<_>>().join("\n"),
        wall_time(&table)
            .or_else(|| fs::read_to_string(src.join(CHECKPOINT)).ok().and_then(|c| recorded_wall_time(&c)))
            .or_else(|| last_stamp(&log))
            .unwrap_or_else(|| "Wall time: not recorded".into()),
        if figures.is_empty() { "" } else { ", " },
        figures.join(", "),
        if resumable {
            format!(
                "\n- {} and `log.txt`: the finished units{} and the log; `cargo xtask restore {name}` \
                 then `cargo xtask reproduce {name} --resume` continues or redraws the run",
                kept.join(", "),
                if kept.len() > 1 { " (and the progress of unfinished ones)" } else { "" }
            )
        } else {
            String::new()
        },
    );
    fs::write(dst.join("RUN.md"), run_md)?;
    Ok(dst)
}

/// `dir/metrics.json` read as `name`'s metrics (the redraw functions' one reader): an error
/// names the file, and for a file of another shape also the experiment it was read for.
pub fn read_metrics<T: serde::de::DeserializeOwned>(dir: &Path, name: &str) -> Result<T> {
    let path = dir.join("metrics.json");
    let text = fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{} is not a {name} metrics.json", path.display()))
}

/// Redraws the figures of the finished run `dir/name` from its `metrics.json` with `draw` (the
/// experiment's [`super::registry::Experiment::redraw`]): a change to the figure code then
/// reaches a published run without recomputing it. In a published folder (one with `RUN.md`)
/// the figures are shrunk as [`publish`] shrinks them and `RUN.md` gains a line naming the
/// commit, date and command of the redraw. Returns the figures written.
pub fn redraw(dir: &Path, name: &str, draw: super::registry::Redraw) -> Result<Vec<PathBuf>> {
    let folder = dir.join(name);
    if !folder.join("metrics.json").exists() {
        bail!("{} has no metrics.json: only a finished run can be redrawn", folder.display());
    }
    // Before drawing: the new figures would otherwise count as uncommitted changes.
    let provenance = super::report::provenance();
    let pngs = draw(&folder)?;
    let run_md = folder.join("RUN.md");
    if run_md.exists() {
        let mut sizes = Vec::new();
        for png in &pngs {
            sizes.push(shrink_figure(png, png)?);
        }
        let mut text = fs::read_to_string(&run_md)?;
        if !text.ends_with('\n') {
            text.push('\n');
        }
        text += &format!(
            "- Figures redrawn from `metrics.json` with the figure code of that commit (no number \
             recomputed): {}; now {}\n",
            provenance,
            sizes.join(", ")
        );
        fs::write(&run_md, text)?;
    }
    Ok(pngs)
}

/// The file a resumable run keeps its finished units in (`super::checkpoint`).
const CHECKPOINT: &str = "checkpoint.json";

/// `checkpoint.json` and the `checkpoint-*.json` files beside it (the progress a long unit
/// records inside itself, such as Sampled LLA's EM steps), sorted: what publish and restore
/// carry.
fn checkpoint_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = fs::read_dir(dir)
        .with_context(|| format!("listing {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let name = p.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
            p.is_file()
                && (name == CHECKPOINT || (name.starts_with("checkpoint-") && name.ends_with(".json")))
        })
        .collect();
    files.sort();
    Ok(files)
}

/// Copies the published `from/name`'s `checkpoint.json` and `checkpoint-*.json` files and log into
/// `out/name`, for `--resume`.
/// Refuses a published run without a checkpoint, and an `out/name` that already holds one
/// (that run's units would be lost).
pub fn restore(from: &Path, out: &Path, name: &str) -> Result<PathBuf> {
    let src = from.join(name);
    if !src.join(CHECKPOINT).exists() {
        bail!(
            "{} has no {CHECKPOINT}: only runs published with their finished units can be continued",
            src.display()
        );
    }
    let dst = out.join(name);
    if dst.join(CHECKPOINT).exists() {
        bail!(
            "{} exists: its units would be overwritten; continue it with --resume, or move it away first",
            dst.join(CHECKPOINT).display()
        );
    }
    fs::create_dir_all(&dst).with_context(|| format!("creating {}", dst.display()))?;
    for file in checkpoint_files(&src)? {
        fs::copy(&file, dst.join(file.file_name().expect("a file")))?;
    }
    fs::copy(src.join("log.txt"), dst.join("log.txt"))
        .with_context(|| format!("{} has a checkpoint but no log.txt", src.display()))?;
    Ok(dst)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::checkpoint::{Checkpoint, Timed};
    use crate::harness::report::Run;

    #[test]
    fn a_published_run_keeps_its_table_provenance_and_small_figures() {
        let root = std::env::temp_dir().join(format!("fspace-publish-{}", std::process::id()));
        let (from, to) = (root.join("results"), root.join("docs"));
        let src = from.join("exp");
        fs::create_dir_all(&src).unwrap();
        fs::write(src.join("table.md"), "# exp\n\n| a |\n|---|\n| 1 |\n\nWall time: 12 s.\n").unwrap();
        let stamp = last_stamp("[    0.0s] a\n[   41.6s] wrote x\n");
        assert_eq!(stamp.as_deref(), Some("Wall time: 42 s (the log's last stamp)"));
        // A resumable run's checkpoint sums its parts; the log's last stamp is only the last one's.
        let summed = recorded_wall_time(r#"{"done": {}, "seconds": 3264.2, "parts": 2}"#);
        assert_eq!(
            summed.as_deref(),
            Some("Wall time: 3264 s summed over the 2 parts that stored units (checkpoint.json)")
        );
        let one = recorded_wall_time(r#"{"done": {}, "seconds": 41.6, "parts": 1}"#);
        assert_eq!(one.as_deref(), Some("Wall time: 42 s (checkpoint.json)"));
        assert_eq!(
            recorded_wall_time(r#"{"done": {}}"#),
            None,
            "a checkpoint from before the time was stored"
        );
        fs::write(
            src.join("log.txt"),
            format!("[    0.0s] {PROVENANCE} abc123, 2026-11-25T21:00Z, `reproduce exp`\n"),
        )
        .unwrap();
        // Noise compresses badly: 1 200 × 900 random pixels are ≈ 3 MB even at the best level.
        let mut state = 7u64;
        let img = RgbImage::from_fn(1200, 900, |_, _| {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            image::Rgb([(state >> 56) as u8, (state >> 48) as u8, (state >> 40) as u8])
        });
        img.save(src.join("noise.png")).unwrap();
        let dst = publish(&from, &to, "exp").unwrap();
        assert!(fs::metadata(dst.join("noise.png")).unwrap().len() as usize <= MAX_PNG_BYTES);
        let run = fs::read_to_string(dst.join("RUN.md")).unwrap();
        assert!(run.contains("abc123, 2026-11-25T21:00Z") && run.contains("Wall time: 12 s"), "{run}");
        assert!(run.contains("scaled down"), "{run}");
        // A run without a table, or without provenance, is refused.
        fs::create_dir_all(from.join("empty")).unwrap();
        assert!(publish(&from, &to, "empty").unwrap_err().to_string().contains("no table.md"));
        // A run without a checkpoint publishes none, and cannot be restored.
        assert!(!dst.join(CHECKPOINT).exists() && !dst.join("log.txt").exists());
        assert!(restore(&to, &root.join("again"), "exp")
            .unwrap_err()
            .to_string()
            .contains("no checkpoint.json"));
        fs::write(src.join("log.txt"), "no provenance\n").unwrap();
        assert!(publish(&from, &to, "exp").unwrap_err().to_string().contains("names no commit"));
        fs::remove_dir_all(&root).unwrap();
    }

    /// A unit's value (`Timed` flattens it, so a struct).
    #[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
    struct Unit {
        v: f64,
    }

    #[test]
    fn a_resumable_run_travels_with_its_units_and_continues_elsewhere() {
        let root = std::env::temp_dir().join(format!("fspace-restore-{}", std::process::id()));
        let (from, to, elsewhere) = (root.join("results"), root.join("docs"), root.join("other"));
        let mut run = Run::new(from.to_str().unwrap(), "exp").unwrap();
        let mut ck = Checkpoint::<Timed<Unit>>::open(&mut run, &"settings").unwrap();
        ck.unit(&mut run, "unit 1", |_| Ok(Unit { v: 1.5 })).unwrap();
        run.write_table("# exp (1 of 2 units)\n").unwrap();
        // The progress an unfinished unit records inside itself travels too; other JSON does not.
        fs::write(run.path("checkpoint-em-seed0-abc.json"), "{\"prior_precisions\": [2.5]}").unwrap();
        fs::write(run.path("scratch.json"), "{}").unwrap();
        drop(run);
        let dst = publish(&from, &to, "exp").unwrap();
        let run_md = fs::read_to_string(dst.join("RUN.md")).unwrap();
        assert!(run_md.contains("cargo xtask restore exp"), "{run_md}");
        // The folder of this machine is not recorded: the run came from outside the checkout.
        let machine = root.display().to_string();
        assert!(run_md.contains("from `DIR/exp`") && !run_md.contains(&machine), "{run_md}");
        assert!(!fs::read_to_string(dst.join("log.txt")).unwrap().contains(&machine));
        assert!(
            run_md.contains("`checkpoint-em-seed0-abc.json`, `checkpoint.json` and `log.txt`"),
            "{run_md}"
        );
        assert!(dst.join("checkpoint-em-seed0-abc.json").exists() && !dst.join("scratch.json").exists());
        // Another machine: the published units come back, and --resume keeps them.
        restore(&to, &elsewhere, "exp").unwrap();
        assert_eq!(
            fs::read_to_string(elsewhere.join("exp/checkpoint-em-seed0-abc.json")).unwrap(),
            "{\"prior_precisions\": [2.5]}"
        );
        let mut run = Run::open(elsewhere.to_str().unwrap(), "exp", true).unwrap();
        let mut ck = Checkpoint::<Timed<Unit>>::open(&mut run, &"settings").unwrap();
        let kept = ck.unit(&mut run, "unit 1", |_| panic!("a restored unit is not recomputed")).unwrap();
        assert_eq!(kept.value, Unit { v: 1.5 });
        ck.unit(&mut run, "unit 2", |_| Ok(Unit { v: 2.5 })).unwrap();
        drop(run);
        let log = fs::read_to_string(elsewhere.join("exp/log.txt")).unwrap();
        assert_eq!(log.matches(PROVENANCE).count(), 2, "both parts' provenance: {log}");
        // A second restore would overwrite the continued run's units: refused.
        assert!(restore(&to, &elsewhere, "exp").unwrap_err().to_string().contains("would be overwritten"));
        fs::remove_dir_all(&root).unwrap();
    }

    /// Draws 1 200 × 900 pixels of noise into `dir/fig.png` (a figure too large to keep as is).
    fn draw_noise(dir: &Path) -> Result<Vec<PathBuf>> {
        let mut state = 11u64;
        let img = RgbImage::from_fn(1200, 900, |_, _| {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            image::Rgb([(state >> 56) as u8, (state >> 48) as u8, (state >> 40) as u8])
        });
        let path = dir.join("fig.png");
        img.save(&path)?;
        Ok(vec![path])
    }

    #[test]
    fn a_redrawn_published_run_keeps_its_figures_small_and_says_when_they_were_redrawn() {
        let root = std::env::temp_dir().join(format!("fspace-redraw-{}", std::process::id()));
        let dir = root.join("exp");
        fs::create_dir_all(&dir).unwrap();
        // No metrics.json: not a finished run.
        let err = redraw(&root, "exp", draw_noise).unwrap_err().to_string();
        assert!(err.contains("no metrics.json"), "{err}");
        fs::write(dir.join("metrics.json"), "{}").unwrap();
        // An unpublished run's figure is left as drawn, and nothing else is written.
        assert_eq!(redraw(&root, "exp", draw_noise).unwrap(), vec![dir.join("fig.png")]);
        assert!(fs::metadata(dir.join("fig.png")).unwrap().len() as usize > MAX_PNG_BYTES);
        assert!(!dir.join("RUN.md").exists());
        // A published one: shrunk, and RUN.md gains the redraw's provenance.
        fs::write(dir.join("RUN.md"), "# exp: the committed reference run\n\n- Files: `fig.png` (9 KB)")
            .unwrap();
        redraw(&root, "exp", draw_noise).unwrap();
        assert!(fs::metadata(dir.join("fig.png")).unwrap().len() as usize <= MAX_PNG_BYTES);
        let run_md = fs::read_to_string(dir.join("RUN.md")).unwrap();
        assert!(run_md.starts_with("# exp: the committed reference run"), "{run_md}");
        let line = run_md.lines().last().unwrap();
        assert!(
            line.starts_with("- Figures redrawn from `metrics.json`") && line.contains("commit "),
            "{run_md}"
        );
        assert!(line.contains("`fig.png` ("), "{run_md}");
        fs::remove_dir_all(&root).unwrap();
    }
}
