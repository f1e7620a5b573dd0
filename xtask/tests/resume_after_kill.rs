//! `--resume` after `kill -9`: a run killed between its units and resumed gives the same table
//! as one that ran straight through (wall time aside).
//!
//! The binary itself is run: a quick `fsp-uci` (one yacht fold, six methods; ≈ 60 s in release,
//! most of it the sparse GP, which comes last), killed with SIGKILL (`Child::kill`) as soon as
//! its checkpoint holds two of the six methods, then resumed. (`gfsvi-uci`'s resume, with its
//! γ choices, is covered in process by `end_to_end.rs`.)

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use xtask::experiments::fsp_uci;

const NAME: &str = "fsp-uci";
const ARGS: [&str; 3] = ["reproduce", NAME, "--quick"];
/// Units of the quick run: one per method on the one fold.
const UNITS: usize = 6;

fn xtask(out: &Path, extra: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_xtask"));
    cmd.args(ARGS).arg("--out").arg(out).args(extra).stdout(Stdio::null()).stderr(Stdio::null());
    cmd
}

/// Units in `checkpoint.json` (0 while it does not exist or is being replaced).
fn units(checkpoint: &Path) -> usize {
    std::fs::read_to_string(checkpoint)
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .and_then(|v| v["done"].as_object().map(|d| d.len()))
        .unwrap_or(0)
}

/// The table without its wall-time sentence.
fn table(out: &Path) -> String {
    let text = std::fs::read_to_string(out.join(NAME).join("table.md")).unwrap();
    let start = text.find("Wall time").expect("the table states its wall time");
    let end = start + text[start..].find('.').unwrap();
    format!("{}{}", &text[..start], &text[end..])
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("fspace-kill-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[test]
fn a_run_killed_between_units_and_resumed_gives_the_uninterrupted_table() {
    let (straight, killed) = (scratch("straight"), scratch("killed"));
    assert!(xtask(&straight, &[]).status().unwrap().success());

    let mut child = xtask(&killed, &[]).spawn().unwrap();
    let checkpoint = killed.join(NAME).join("checkpoint.json");
    let started = Instant::now();
    while units(&checkpoint) < 2 {
        assert!(child.try_wait().unwrap().is_none(), "the run finished before it could be killed");
        assert!(started.elapsed() < Duration::from_secs(600), "no unit finished in 10 minutes");
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let kept = units(&checkpoint);
    assert!((2..UNITS).contains(&kept), "killed with {kept} of {UNITS} units done");
    assert!(!killed.join(NAME).join("table.md").exists(), "the killed run wrote its table");

    assert!(xtask(&killed, &["--resume"]).status().unwrap().success());
    let log = std::fs::read_to_string(killed.join(NAME).join("log.txt")).unwrap();
    assert!(log.contains("finished units kept from checkpoint.json"), "{log}");
    assert_eq!(table(&killed), table(&straight));
    // The typed metrics agree score for score (the seconds are the parts' own).
    let metrics = |out: &Path| -> fsp_uci::Metrics {
        serde_json::from_str(&std::fs::read_to_string(out.join(NAME).join("metrics.json")).unwrap()).unwrap()
    };
    let (a, b) = (metrics(&straight), metrics(&killed));
    assert_eq!(a.len(), b.len());
    assert!(a.len() >= UNITS, "{} metrics", a.len());
    for (key, stats) in &a {
        let (x, y) = (&stats.folds, &b[key].folds);
        assert!(x.iter().zip(y).all(|(x, y)| x == y || (x.is_nan() && y.is_nan())), "{key}: {x:?} vs {y:?}");
    }
    let _ = std::fs::remove_dir_all(&straight);
    let _ = std::fs::remove_dir_all(&killed);
}
