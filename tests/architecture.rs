//! Enforces the dependency invariants of `docs/ARCHITECTURE.md` by reading `cargo metadata`:
//! dependencies point downwards only, a method crate never depends on another method crate,
//! only `fspace-nn` imports dfdx, and `fspace-testutil` is a dev-dependency only.

use std::collections::BTreeMap;
use std::process::Command;

/// Which workspace crates each crate may depend on (normal or build dependencies).
/// A new crate must be added here, and to the code map in docs/ARCHITECTURE.md.
fn allowed() -> BTreeMap<&'static str, Vec<&'static str>> {
    BTreeMap::from([
        ("fspace-linalg", vec!["fspace-input"]),
        ("fspace-context", vec!["fspace-input"]),
        ("fspace-testutil", vec!["fspace-input", "fspace-core"]),
        ("fspace-feature-union", vec![]),
        ("fspace-input", vec![]),
        ("fspace-kernels", vec!["fspace-input", "fspace-linalg"]),
        ("fspace-core", vec!["fspace-input", "fspace-linalg"]),
        ("fspace-metrics", vec!["fspace-input"]),
        ("fspace-data", vec!["fspace-input", "fspace-context"]),
        ("fspace-gp", vec!["fspace-input", "fspace-linalg", "fspace-kernels", "fspace-core"]),
        ("fspace-nn", vec!["fspace-input", "fspace-core", "fspace-linalg"]),
        (
            "fspace-fsp-laplace",
            vec![
                "fspace-input",
                "fspace-linalg",
                "fspace-kernels",
                "fspace-context",
                "fspace-core",
                "fspace-gp",
                "fspace-nn",
            ],
        ),
        ("fspace-laplace", vec!["fspace-input", "fspace-linalg", "fspace-core", "fspace-nn"]),
        ("fspace-interop", vec!["fspace-input", "fspace-core", "fspace-nn"]),
        (
            "fspace-py",
            vec![
                "fspace-input",
                "fspace-linalg",
                "fspace-kernels",
                "fspace-context",
                "fspace-core",
                "fspace-gp",
                "fspace-nn",
                "fspace-fsp-laplace",
                "fspace-laplace",
                "fspace-valla",
                "fspace-gfsvi",
                "fspace-interop",
                "fspace-feature-union",
                "fspace-metrics",
            ],
        ),
        ("fspace-valla", vec!["fspace-input", "fspace-linalg", "fspace-core", "fspace-nn", "fspace-gp"]),
        (
            "fspace-gfsvi",
            vec![
                "fspace-input",
                "fspace-linalg",
                "fspace-kernels",
                "fspace-context",
                "fspace-core",
                "fspace-nn",
            ],
        ),
        (
            "fspace",
            vec![
                "fspace-input",
                "fspace-linalg",
                "fspace-kernels",
                "fspace-context",
                "fspace-core",
                "fspace-metrics",
                "fspace-data",
                "fspace-gp",
                "fspace-nn",
                "fspace-fsp-laplace",
                "fspace-laplace",
                "fspace-valla",
                "fspace-gfsvi",
                "fspace-interop",
            ],
        ),
        (
            "xtask",
            vec![
                "fspace-input",
                "fspace",
                "fspace-linalg",
                "fspace-kernels",
                "fspace-context",
                "fspace-core",
                "fspace-metrics",
                "fspace-data",
                "fspace-gp",
                "fspace-nn",
                "fspace-fsp-laplace",
                "fspace-laplace",
                "fspace-valla",
                "fspace-gfsvi",
                "fspace-interop",
                "fspace-feature-union",
            ],
        ),
    ])
}

/// `cargo metadata --format-version 1 --offline ARGS` of the workspace, parsed.
fn cargo_metadata(args: &[&str]) -> serde_json::Value {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--offline"])
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo metadata runs");
    assert!(out.status.success(), "cargo metadata failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn workspace_dependencies_follow_the_layering() {
    let meta = cargo_metadata(&["--no-deps"]);
    let rules = allowed();
    let members: Vec<&str> =
        meta["packages"].as_array().unwrap().iter().map(|p| p["name"].as_str().unwrap()).collect();
    for pkg in meta["packages"].as_array().unwrap() {
        let name = pkg["name"].as_str().unwrap();
        let allowed = rules.get(name).unwrap_or_else(|| {
            panic!("crate {name} is not in the layering table; add it here and to docs/ARCHITECTURE.md")
        });
        for dep in pkg["dependencies"].as_array().unwrap() {
            let dep_name = dep["name"].as_str().unwrap();
            let is_dev = dep["kind"].as_str() == Some("dev");
            if dep_name == "dfdx" {
                assert!(name == "fspace-nn" || is_dev, "{name} depends on dfdx: only fspace-nn may");
            }
            if dep_name == "fspace-testutil" {
                assert!(is_dev, "{name} depends on fspace-testutil outside dev-dependencies");
                continue;
            }
            if members.contains(&dep_name) && !is_dev {
                assert!(
                    allowed.contains(&dep_name),
                    "{name} may not depend on {dep_name} (allowed: {allowed:?})"
                );
            }
        }
    }
}

/// The features each package of the locked graph is compiled with, as `cargo tree` resolves them
/// for one build (`args` select the packages and the dependency kinds).
fn resolved_features(args: &[&str]) -> BTreeMap<String, std::collections::BTreeSet<String>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["tree", "--offline", "--locked", "--prefix", "none", "--format", "{p}|{f}"])
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo tree runs");
    assert!(out.status.success(), "cargo tree {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    let mut features: BTreeMap<String, std::collections::BTreeSet<String>> = BTreeMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let line = line.trim_end_matches(" (*)");
        let Some((package, list)) = line.rsplit_once('|') else { continue };
        // "name vX.Y.Z (path)" for workspace members: the name and version identify it.
        let package = package.split(" (").next().unwrap().to_string();
        features
            .entry(package)
            .or_default()
            .extend(list.split(',').filter(|f| !f.is_empty()).map(str::to_owned));
    }
    features
}

/// `cargo test --workspace` (with every dev-dependency), `cargo xtask` (`cargo run -p xtask`),
/// maturin's build of `fspace-py` and `cargo doc --workspace` compile each shared package with the
/// same features, so they share one compiled graph (a different feature set recompiles a crate and
/// everything above it). `fspace-feature-union` asks for the union; this names what to add there
/// when a dependency change breaks it.
#[test]
fn one_feature_set_serves_every_build() {
    let everything = resolved_features(&["--workspace", "--edges", "normal,build,dev"]);
    for (build, args) in [
        ("cargo xtask", &["--package", "xtask", "--edges", "normal,build"][..]),
        ("maturin (fspace-py)", &["--package", "fspace-py", "--edges", "normal,build"][..]),
        ("cargo doc --workspace", &["--workspace", "--edges", "normal,build"][..]),
    ] {
        let mut missing = Vec::new();
        for (package, features) in resolved_features(args) {
            let all = &everything[&package];
            if *all != features {
                missing.push(format!("{package}: {:?}", all.difference(&features).collect::<Vec<_>>()));
            }
        }
        assert!(
            missing.is_empty(),
            "{build} compiles these packages without features the test build turns on (add them to \
             crates/fspace-feature-union/Cargo.toml): {missing:?}"
        );
    }
}

/// A library whose unit-test harness is switched off (`[lib] test = false`: a harness for a crate
/// without unit tests only compiles it a second time) has no `#[test]` in its sources, which would
/// otherwise never run.
#[test]
fn no_unit_test_hides_in_a_library_without_a_test_harness() {
    let meta = cargo_metadata(&["--no-deps"]);
    let mut switched_off = 0;
    for pkg in meta["packages"].as_array().unwrap() {
        for target in pkg["targets"].as_array().unwrap() {
            let is_lib = target["kind"].as_array().unwrap().iter().any(|k| k == "lib" || k == "cdylib");
            if !is_lib || target["test"].as_bool() != Some(false) {
                continue;
            }
            switched_off += 1;
            let src = std::path::Path::new(target["src_path"].as_str().unwrap()).parent().unwrap();
            for path in rust_files_below(src) {
                let text = std::fs::read_to_string(&path).unwrap();
                assert!(
                    !text.contains("#[test]"),
                    "{} has a #[test], but {} sets `[lib] test = false`: move it to tests/ or remove that",
                    path.display(),
                    pkg["name"].as_str().unwrap()
                );
            }
        }
    }
    assert!(switched_off >= 10, "{switched_off} libraries without a harness: the metadata field moved?");
}

/// The input mistakes every crate checks are declared once, in `fspace-input`; no other crate's
/// error enum declares its own variant for them.
#[test]
fn input_errors_are_declared_once() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("crates");
    let banned = [
        "DimensionMismatch {",
        "LengthMismatch {",
        "Empty {",
        "EmptyPoints {",
        "InvalidParameter {",
        "InvalidArgument {",
        "InvalidConfig {",
        "InvalidInput {",
    ];
    let mut offenders = Vec::new();
    let mut stack = vec![root];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                if !path.ends_with("fspace-input") && !path.ends_with("target") {
                    stack.push(path);
                }
                continue;
            }
            if path.extension() != Some(std::ffi::OsStr::new("rs")) {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            let lines: Vec<&str> = text.lines().collect();
            for (i, line) in lines.iter().enumerate() {
                // A variant declaration: four spaces of indentation inside an enum body.
                let decl = line.strip_prefix("    ").filter(|l| !l.starts_with(' '));
                let Some(decl) = decl else { continue };
                let non_finite_what =
                    decl == "NonFinite {" && lines.get(i + 2).is_some_and(|l| l.trim().starts_with("what:"));
                if banned.contains(&decl) || non_finite_what {
                    offenders.push(format!("{}:{}: {decl}", path.display(), i + 1));
                }
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "declare these through fspace_input::InputError:\n{}",
        offenders.join("\n")
    );
}

/// The declared minimum Rust version is true: every workspace package declares it, and no
/// package of the locked build graph (Linux) requires a newer one. Our own code is kept within it
/// by clippy's `incompatible_msrv` lint, which reads the same field (`.ci/run` denies warnings).
#[test]
fn the_declared_rust_version_covers_the_locked_dependencies() {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let info = Command::new(rustc).arg("-vV").output().expect("rustc -vV runs");
    let info = String::from_utf8_lossy(&info.stdout).to_string();
    let host = info.lines().find_map(|l| l.strip_prefix("host: ")).expect("rustc names its host").to_string();
    let meta = cargo_metadata(&["--locked", "--filter-platform", &host]);
    let version = |v: &str| -> Vec<u32> {
        let mut parts: Vec<u32> = v.split('.').map(|x| x.parse().unwrap()).collect();
        parts.resize(3, 0);
        parts
    };
    let members: Vec<&str> =
        meta["workspace_members"].as_array().unwrap().iter().map(|m| m.as_str().unwrap()).collect();
    let built: Vec<&str> =
        meta["resolve"]["nodes"].as_array().unwrap().iter().map(|n| n["id"].as_str().unwrap()).collect();
    let mut declared = None;
    let mut needed = (vec![0, 0, 0], String::new());
    for pkg in meta["packages"].as_array().unwrap() {
        let (id, name) = (pkg["id"].as_str().unwrap(), pkg["name"].as_str().unwrap());
        let rv = pkg["rust_version"].as_str();
        if members.contains(&id) {
            let rv = rv
                .unwrap_or_else(|| panic!("{name} declares no rust-version (rust-version.workspace = true)"));
            assert!(
                declared.is_none_or(|d| d == rv),
                "{name} declares rust-version {rv}, others {declared:?}"
            );
            declared = Some(rv);
        } else if let (Some(rv), true) = (rv, built.contains(&id)) {
            if version(rv) > needed.0 {
                needed = (version(rv), format!("{name} {}", pkg["version"].as_str().unwrap()));
            }
        }
    }
    let declared = declared.expect("workspace members");
    assert!(
        version(declared) >= needed.0,
        "rust-version {declared} is below what {} requires ({:?})",
        needed.1,
        needed.0
    );
}

/// Every crate directory under `crates/` (sorted) with the `.rs` files below its `src/`.
fn crate_sources() -> Vec<(std::path::PathBuf, Vec<std::path::PathBuf>)> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("crates");
    let mut crates: Vec<_> = std::fs::read_dir(&root).unwrap().map(|e| e.unwrap().path()).collect();
    crates.sort();
    crates
        .into_iter()
        .map(|krate| {
            let files = rust_files_below(&krate.join("src"));
            (krate, files)
        })
        .collect()
}

/// The `.rs` files below `dir`, sorted.
fn rust_files_below(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let (mut stack, mut files) = (vec![dir.to_path_buf()], Vec::new());
    while let Some(path) = stack.pop() {
        if path.is_dir() {
            stack.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
        } else if path.extension().and_then(|e| e.to_str()) == Some("rs") {
            files.push(path);
        }
    }
    files.sort();
    files
}

/// No two crates export a public type of the same name (a user who imports from several crates
/// never has to rename one); each crate's `Result` alias is the one shared exception.
#[test]
fn public_type_names_are_unique_across_crates() {
    let mut seen: BTreeMap<String, String> = BTreeMap::new();
    let mut clashes = Vec::new();
    for (krate, files) in crate_sources() {
        let name = krate.file_name().unwrap().to_string_lossy().to_string();
        for path in files {
            for line in std::fs::read_to_string(&path).unwrap().lines() {
                let Some(rest) = ["pub struct ", "pub enum ", "pub trait ", "pub type "]
                    .iter()
                    .find_map(|p| line.strip_prefix(p))
                else {
                    continue;
                };
                let ty: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                if ty == "Result" {
                    continue;
                }
                match seen.get(&ty) {
                    Some(other) if *other != name => clashes.push(format!("{ty}: {other} and {name}")),
                    _ => {
                        seen.insert(ty, name.clone());
                    }
                }
            }
        }
    }
    assert!(clashes.is_empty(), "public types sharing a name across crates: {clashes:?}");
}

/// Every method's report serialises (experiment logs and the Python layer write them as JSON).
#[test]
fn every_report_is_serialisable() {
    fn serialisable<T: serde::Serialize + serde::de::DeserializeOwned>() {}
    serialisable::<fspace::laplace::FitReport>();
    serialisable::<fspace::fsp_laplace::FitSummary>();
    serialisable::<fspace::fsp_laplace::LaplaceReport>();
    serialisable::<fspace::valla::VallaReport>();
    serialisable::<fspace::valla::EllaReport>();
    serialisable::<fspace::gfsvi::OptimReport>();
    serialisable::<fspace::gp::ExactGpReport>();
    serialisable::<fspace::gp::SvgpReport>();
    serialisable::<fspace::gp::HyperparameterReport<fspace::kernels::Rbf>>();
    serialisable::<fspace::nn::TrainReport>();
    serialisable::<fspace::nn::MapReport>();
    serialisable::<fspace::gp::GpClassifierReport>();
    serialisable::<fspace::gp::SparseDirichletReport>();
}

/// The top-level modules a file of `src/` refers to through `crate::…` paths (`use` items,
/// grouped imports and inline paths; comments are skipped).
fn module_references(text: &str) -> std::collections::BTreeSet<String> {
    let mut out = std::collections::BTreeSet::new();
    let ident = |s: &str| -> String { s.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect() };
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(at) = rest.find("crate::") {
            rest = &rest[at + "crate::".len()..];
            if let Some(group) = rest.strip_prefix('{') {
                // `crate::{a, b::c, D}`: the lowercase first segments are modules.
                let inner = group.split('}').next().unwrap_or("");
                for item in inner.split(',') {
                    let first = ident(item.trim());
                    if first.starts_with(|c: char| c.is_ascii_lowercase())
                        && item.trim()[first.len()..].starts_with("::")
                    {
                        out.insert(first);
                    }
                }
            } else {
                let first = ident(rest);
                if first.starts_with(|c: char| c.is_ascii_lowercase())
                    && rest[first.len()..].starts_with("::")
                {
                    out.insert(first);
                }
            }
        }
    }
    out
}

/// Inside every crate the top-level modules import each other without a cycle (a module's own
/// children — `posterior/evidence.rs` under `posterior` — count as the module), so each file can
/// be read knowing only what it imports. Multi-line grouped imports are read line by line, which
/// sees every `crate::module::` path they contain.
#[test]
fn modules_inside_a_crate_import_each_other_without_a_cycle() {
    let mut cycles = Vec::new();
    for (krate, files) in crate_sources() {
        let src = krate.join("src");
        let mut graph: BTreeMap<String, std::collections::BTreeSet<String>> = BTreeMap::new();
        for path in files {
            let rel = path.strip_prefix(&src).unwrap();
            let top = rel
                .components()
                .next()
                .unwrap()
                .as_os_str()
                .to_string_lossy()
                .trim_end_matches(".rs")
                .to_string();
            if top == "lib" || top == "main" {
                continue;
            }
            let refs = module_references(&std::fs::read_to_string(&path).unwrap());
            graph.entry(top).or_default().extend(refs);
        }
        let modules: Vec<String> = graph.keys().cloned().collect();
        for g in graph.values_mut() {
            g.retain(|m| modules.contains(m));
        }
        // A module is on a cycle if it reaches itself.
        for start in &modules {
            let mut stack: Vec<(&String, Vec<&String>)> =
                graph[start].iter().filter(|m| *m != start).map(|m| (m, vec![start, m])).collect();
            let mut seen = std::collections::BTreeSet::new();
            while let Some((m, path)) = stack.pop() {
                if m == start {
                    cycles.push(format!(
                        "{}: {}",
                        krate.file_name().unwrap().to_string_lossy(),
                        path.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(" → ")
                    ));
                    break;
                }
                if !seen.insert(m.clone()) {
                    continue;
                }
                for next in graph[m].iter().filter(|n| *n != m) {
                    let mut p = path.clone();
                    p.push(next);
                    stack.push((next, p));
                }
            }
        }
    }
    assert!(cycles.is_empty(), "import cycles between modules:\n{}", cycles.join("\n"));
}

#[test]
fn the_module_reference_reader_sees_paths_and_groups() {
    let refs = module_references(
        "use crate::a::X;\nuse crate::{b::Y, Z, c::{d, e}};\nlet v = crate::f::g(); // crate::h::i\n",
    );
    assert_eq!(refs.into_iter().collect::<Vec<_>>(), ["a", "b", "c", "f"]);
}

/// The Python boundary dispatches on types, not on method names: every function-space method
/// is its own compiled class (`crates/fspace-py/src/methods/classes.rs`) whose capabilities the
/// Python layer asks, so neither side compares a method's name as a string — no
/// `method == "gfsvi"`, no `method in ("valla", …)` in the Python package, no `"gfsvi" =>` arm
/// in the binding — and the one `fit(method, …)` entry is gone.
#[test]
fn the_python_boundary_dispatches_on_types_not_on_method_names() {
    const NAMES: [&str; 6] = ["fsp_laplace", "fsp_laplace_posthoc", "gfsvi", "valla", "ella", "exact_gp"];
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("crates").join("fspace-py");
    let mut offences = Vec::new();
    let python = root.join("python").join("fspace");
    let mut files: Vec<_> = std::fs::read_dir(&python)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().and_then(|e| e.to_str()) == Some("py"))
        .collect();
    files.sort();
    assert!(files.len() > 5, "no Python sources found under {}", python.display());
    for path in &files {
        let text = std::fs::read_to_string(path).unwrap();
        for (n, line) in text.lines().enumerate() {
            let code = line.split('#').next().unwrap_or("");
            let compared = NAMES.iter().any(|name| {
                let quoted = [format!("\"{name}\""), format!("'{name}'")];
                quoted.iter().any(|q| {
                    code.contains(&format!("== {q}"))
                        || code.contains(&format!("!= {q}"))
                        || code.contains(&format!("in ({q}"))
                        || code.contains(&format!(", {q})"))
                })
            });
            if compared || code.contains("_fspace.fit(") {
                offences.push(format!("{}:{}: {}", path.display(), n + 1, line.trim()));
            }
        }
    }
    for path in rust_files_below(&root.join("src")) {
        let text = std::fs::read_to_string(&path).unwrap();
        for (n, line) in text.lines().enumerate() {
            let code = line.trim_start();
            let arm = NAMES.iter().any(|name| {
                code.starts_with(&format!("\"{name}\" =>")) || code.starts_with(&format!("\"{name}\" |"))
            });
            if arm || code.contains("fn fit(method") {
                offences.push(format!("{}:{}: {}", path.display(), n + 1, line.trim()));
            }
        }
    }
    assert!(
        offences.is_empty(),
        "method names compared as strings across the boundary:\n{}",
        offences.join("\n")
    );
}
