//! No tracked file names a folder of the machine it was written on — the results' `RUN.md` and
//! `log.txt` record run folders as `DIR` (or relative to the checkout), docs and code cite
//! commands and relative paths — and none speaks in a work log's terms (a resumed run's pieces
//! are its parts; a measurement is cited by its commit or docs section). Reads `git ls-files`;
//! skipped outside a git checkout.

use std::path::Path;
use std::process::Command;

/// Home and work folders of one machine (a `/tmp/…` in an example command is the reader's own).
const MACHINE_ROOTS: [&str; 3] = ["/home/", "/root/", "/work/"];

#[test]
fn no_tracked_file_names_a_machine_folder_or_speaks_like_a_work_log() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let Ok(out) = Command::new("git").arg("-C").arg(root).args(["ls-files", "-z"]).output() else {
        eprintln!("no git: skipped");
        return;
    };
    if !out.status.success() {
        eprintln!("not a git checkout: skipped");
        return;
    }
    let this = "xtask/tests/no_machine_paths.rs";
    let mut found = Vec::new();
    for name in out.stdout.split(|&b| b == 0).filter(|n| !n.is_empty()) {
        let name = String::from_utf8_lossy(name).into_owned();
        if name == this {
            continue;
        }
        let Ok(bytes) = std::fs::read(root.join(&name)) else { continue };
        if bytes.contains(&0) {
            continue; // binary
        }
        let text = String::from_utf8_lossy(&bytes);
        for (n, line) in text.lines().enumerate() {
            let lower = line.to_lowercase();
            for word in lower.split(|c: char| !c.is_alphanumeric()) {
                // The checkpoint files' old key is read as the quoted "sittings"; no bare word.
                if (word == "sitting" || word == "sittings") && !line.contains(&format!("\"{word}\"")) {
                    found.push(format!("{name}:{}: {}", n + 1, line.trim()));
                }
            }
            for ordinal in
                ["second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth", "this", "next"]
            {
                if lower.contains(&format!("speed-up, {ordinal} round"))
                    || lower.contains(&format!("{ordinal} round of"))
                {
                    found.push(format!("{name}:{}: {}", n + 1, line.trim()));
                }
            }
            for prefix in MACHINE_ROOTS {
                let mut from = 0;
                while let Some(at) = line[from..].find(prefix) {
                    let start = from + at;
                    // A path of its own, not the tail of a relative one (`docs/work/…`).
                    let before = line[..start].chars().next_back();
                    if before.is_none_or(|c| !(c.is_alphanumeric() || "._-/~".contains(c))) {
                        found.push(format!("{name}:{}: {}", n + 1, line.trim()));
                    }
                    from = start + prefix.len();
                }
            }
        }
    }
    assert!(found.is_empty(), "machine folders or work-log wording in tracked files:\n{}", found.join("\n"));
}
