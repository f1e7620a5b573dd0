//! `cargo xtask test`: every test of the project, Rust and Python, in one command.
//!
//! 1. `cargo test --workspace --release` (the Rust suite);
//! 2. beside it, in a second thread, the Python environment: a virtual environment at
//!    `target/python-venv` (`python3 -m venv`, made once), with maturin, numpy, pytest and
//!    mypy from PyPI, then torch (`install_torch`: PyPI's Linux wheel brings its CUDA
//!    libraries; without triton, which only `torch.compile` uses, it is ≈ 4.4 GB installed and
//!    took 105 s on a fresh venv here; once per machine), laplace-torch 0.3, the reference
//!    of `crates/fspace-py/tests/test_laplace_parity.py`, and transformers + peft for the LoRA
//!    test (`crates/fspace-py/tests/test_lora.py`, a GPT-2 built from a config: no download). Making it is mostly download and
//!    unpacking while the Rust suite is mostly compiling and computing, so on a fresh machine
//!    the two overlap instead of adding up; its output goes to `target/python-environment.log`
//!    and is printed when both are done. `--no-torch` leaves torch out, and so does a disk with
//!    less than [`TORCH_DISK_NEED_GIB`] free (plus [`RUST_BUILD_GIB`] when the Rust build is
//!    still to write its files beside it; said loudly): the tests that convert a PyTorch
//!    model are then skipped and pytest lists them; with torch, `$FSPACE_REQUIRE_TORCH` makes a
//!    missing torch a failure rather than a skip;
//! 3. `maturin develop --release` of `crates/fspace-py` into it (the `fspace` package), then
//!    `mypy.stubtest fspace._fspace` (the `.pyi` stubs against the compiled module) and `mypy`
//!    over the Python layer;
//! 4. the Rust API's numbers on a seeded toy problem for every Python class
//!    ([`super::python_reference`], `target/python-reference.json`), then
//!    `python -m pytest crates/fspace-py/tests` with `$FSPACE_RUST_REFERENCE` pointing at them.
//!
//! 5. the wheel (`cargo xtask wheel`, [`build_wheel`]: abi3, manylinux2014) into `target/wheels`, whose path
//!    `$FSPACE_WHEEL` hands to `crates/fspace-py/tests/test_wheel.py`: it installs the wheel into
//!    a fresh virtual environment and runs the README's quickstart there with no Rust toolchain
//!    on `PATH`.
//!
//! 6. the user guide site (`cargo xtask docs`, [`build_site`]) into `target/site`, whose path
//!    `$FSPACE_SITE` hands to `crates/fspace-py/tests/test_site.py`: a headless Chromium
//!    (Debian's `chromium` package, installed with apt-get when missing)
//!    driven by Playwright opens every page; the Python blocks of the guide's pages run in
//!    `crates/fspace-py/tests/test_guide_pages.py`.
//!
//! `$FSPACE_PYTHON` names the interpreter that makes the environment (default `python3`).

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{anyhow, bail, Context, Result};

/// What `cargo xtask test` runs.
#[derive(Debug, Clone, Copy, Default)]
pub struct TestPlan {
    /// Skip the Rust suite.
    pub python_only: bool,
    /// Skip the Python suite.
    pub rust_only: bool,
    /// Install torch into the environment and require it (the PyTorch-model tests).
    pub torch: bool,
}

/// Where a step's announcements and its commands' output go: the terminal, or a log file for
/// the step that runs beside the Rust suite (two interleaved outputs would be unreadable).
enum Console {
    Terminal,
    Log(File),
}

impl Console {
    fn say(&self, line: &str) -> Result<()> {
        match self {
            Console::Terminal => println!("{line}"),
            Console::Log(file) => writeln!(&*file, "{line}").context("could not write the log")?,
        }
        Ok(())
    }

    /// Sends `cmd`'s stdout and stderr where `say` writes.
    fn attach(&self, cmd: &mut Command) -> Result<()> {
        if let Console::Log(file) = self {
            cmd.stdout(Stdio::from(file.try_clone()?)).stderr(Stdio::from(file.try_clone()?));
        }
        Ok(())
    }

    fn run(&self, what: &str, cmd: &mut Command) -> Result<()> {
        self.say(&format!("== {what}: {cmd:?}"))?;
        self.attach(cmd)?;
        let status = cmd.status().with_context(|| format!("{what}: could not start {cmd:?}"))?;
        if !status.success() {
            bail!("{what} failed ({status})");
        }
        Ok(())
    }
}

/// The workspace root (the parent of `xtask/`).
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask lives in the workspace").to_path_buf()
}

/// The test environment under the workspace's `target/` (`cargo clean` removes it with the build).
fn venv_dir(root: &Path) -> PathBuf {
    root.join("target").join("python-venv")
}

/// Runs the plan from the workspace root.
pub fn test(plan: TestPlan) -> Result<()> {
    let root = root();
    if plan.rust_only {
        return rust_tests(&root);
    }
    if plan.python_only {
        let torch = python_environment(&root, plan.torch, 0.0, &Console::Terminal)?;
        return python_tests(&root, torch);
    }
    let target = root.join("target");
    std::fs::create_dir_all(&target).with_context(|| format!("could not create {}", target.display()))?;
    let log_path = target.join("python-environment.log");
    let log = File::create(&log_path).with_context(|| format!("could not create {}", log_path.display()))?;
    println!("== Python environment: made beside the Rust tests; its output goes to {}", log_path.display());
    let (rust, environment) = std::thread::scope(|scope| {
        let beside =
            scope.spawn(|| python_environment(&root, plan.torch, RUST_BUILD_GIB, &Console::Log(log)));
        let rust = rust_tests(&root);
        let environment =
            beside.join().unwrap_or_else(|_| Err(anyhow!("the Python environment's thread panicked")));
        (rust, environment)
    });
    println!("== Python environment (made beside the Rust tests), from {}:", log_path.display());
    match std::fs::read_to_string(&log_path) {
        Ok(text) => print!("{text}"),
        Err(e) => println!("   (could not read it back: {e})"),
    }
    rust?;
    let torch = environment?;
    python_tests(&root, torch)
}

/// `cargo test --workspace --release`.
fn rust_tests(root: &Path) -> Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    Console::Terminal
        .run("Rust tests", Command::new(&cargo).args(["test", "--workspace", "--release"]).current_dir(root))
}

/// The virtual environment with the test dependencies (and torch when asked and there is disk
/// for it, `reserve_gib` more than torch's own need); returns whether torch is importable.
fn python_environment(root: &Path, torch: bool, reserve_gib: f64, console: &Console) -> Result<bool> {
    let venv = venv_dir(root);
    let bin = venv.join("bin");
    if !bin.join("python").exists() {
        let python = std::env::var("FSPACE_PYTHON").unwrap_or_else(|_| "python3".into());
        console.run(
            "Python environment (needs python3 with venv; Debian: apt install python3-venv)",
            Command::new(python).args(["-m", "venv"]).arg(&venv),
        )?;
    }
    let py = bin.join("python");
    console.run(
        "Python test dependencies",
        Command::new(&py).args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check"]).args([
            "maturin>=1.16,<2",
            "numpy",
            "pytest",
            "mypy",
        ]),
    )?;
    Ok(torch && install_torch(&py, &venv, reserve_gib, console)?)
}

/// Builds the `fspace` package into the environment, checks its types and runs pytest.
fn python_tests(root: &Path, torch: bool) -> Result<()> {
    let console = Console::Terminal;
    let venv = venv_dir(root);
    let bin = venv.join("bin");
    let py = bin.join("python");
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    console.run(
        "fspace Python package (maturin develop --release)",
        Command::new(bin.join("maturin"))
            .args(["develop", "--release", "--quiet"])
            .current_dir(root.join("crates").join("fspace-py"))
            .env("VIRTUAL_ENV", &venv)
            .env("PATH", &path),
    )?;
    console.run(
        "Type stubs against the compiled module (mypy.stubtest)",
        Command::new(&py).args(["-m", "mypy.stubtest", "fspace._fspace"]).current_dir(root.join("target")),
    )?;
    console.run(
        "Types of the Python layer (mypy)",
        Command::new(&py)
            .args(["-m", "mypy", "--ignore-missing-imports", "-p", "fspace"])
            .current_dir(root.join("crates").join("fspace-py").join("python")),
    )?;
    let reference = root.join("target").join("python-reference.json");
    println!("== Rust reference numbers for the Python tests: {}", reference.display());
    super::python_reference::write(&reference)?;
    let wheel = build_wheel(&root.join("target").join("wheels"))?;
    let site = build_site(&root.join("target").join("site"), true)?;
    let chromium = ensure_chromium(&console)?;
    let mut pytest = Command::new(&py);
    pytest
        .args(["-m", "pytest", "-q", "-rs", "crates/fspace-py/tests"])
        .env("FSPACE_RUST_REFERENCE", &reference)
        .env("FSPACE_WHEEL", &wheel)
        .env("FSPACE_SITE", &site)
        .env("FSPACE_CHROMIUM", &chromium);
    if torch {
        pytest.env("FSPACE_REQUIRE_TORCH", "1");
    } else {
        pytest.env_remove("FSPACE_REQUIRE_TORCH");
    }
    console.run("Python tests", pytest.current_dir(root))
}

/// The glibc floor of the wheel: `manylinux2014` (glibc 2.17), which every Linux distribution
/// of the last decade meets (CentOS 7, the clusters' usual floor, included); a plain build would
/// carry the build machine's glibc (2.35 here) and refuse to install on older systems.
pub const WHEEL_COMPATIBILITY: &str = "manylinux2014";

/// `cargo xtask wheel`: `maturin build --release` of `crates/fspace-py` into `out` (relative to
/// the workspace root unless absolute) with the test environment's maturin (the environment is
/// made, without torch, if missing); returns the wheel's path. pyo3's `abi3-py39` feature makes
/// it one wheel for every CPython from 3.9; linking through zig (`--zig`, the `ziglang` wheel
/// from PyPI in the environment) against [`WHEEL_COMPATIBILITY`]'s glibc makes it install on
/// any x86-64 Linux from glibc 2.17. Where `ziglang` cannot be installed the wheel is built for
/// this machine's glibc, said loudly.
pub fn build_wheel(out: &Path) -> Result<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().context("the workspace root")?.to_path_buf();
    let out = if out.is_absolute() { out.to_path_buf() } else { root.join(out) };
    let venv = venv_dir(&root);
    let bin = venv.join("bin");
    if !bin.join("maturin").exists() {
        python_environment(&root, false, 0.0, &Console::Terminal)?;
    }
    std::fs::create_dir_all(&out).with_context(|| format!("could not create {}", out.display()))?;
    // An earlier build's wheel of another version would be ambiguous: the folder holds one.
    for entry in std::fs::read_dir(&out)?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with("fspace-") && name.ends_with(".whl") {
            std::fs::remove_file(entry.path())?;
        }
    }
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let py = bin.join("python");
    let zig = Command::new(&py).args(["-c", "import ziglang"]).output().is_ok_and(|o| o.status.success())
        || Console::Terminal
            .run(
                "zig, the linker of a portable wheel (the ziglang wheel from PyPI)",
                Command::new(&py).args([
                    "-m",
                    "pip",
                    "install",
                    "--quiet",
                    "--disable-pip-version-check",
                    "ziglang",
                ]),
            )
            .is_ok();
    let mut maturin = Command::new(bin.join("maturin"));
    maturin.args(["build", "--release", "--quiet", "--out"]).arg(&out);
    if zig {
        maturin.args(["--zig", "--compatibility", WHEEL_COMPATIBILITY]);
    } else {
        println!(
            "!! ziglang could not be installed: the wheel is built for this machine's glibc, not {WHEEL_COMPATIBILITY}"
        );
    }
    Console::Terminal.run(
        "fspace wheel (maturin build --release)",
        maturin
            .current_dir(root.join("crates").join("fspace-py"))
            .env("VIRTUAL_ENV", &venv)
            .env("PATH", &path),
    )?;
    std::fs::read_dir(&out)?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("fspace-")))
        .ok_or_else(|| anyhow!("maturin wrote no fspace wheel into {}", out.display()))
}

/// The site's builders and the browser test's driver, pinned: mkdocs with the Material theme,
/// mkdocstrings' Python handler (API pages from the docstrings, read statically by griffe) and
/// Playwright (the browser test; it drives the system's Chromium, it downloads no browser).
const DOCS_REQUIREMENTS: [&str; 4] =
    ["mkdocs==1.6.1", "mkdocs-material==9.8.2", "mkdocstrings-python==2.0.11", "playwright==1.65.2"];

/// `cargo xtask docs`: the user guide site into `out` (relative to the workspace root unless
/// absolute): `mkdocs build --strict` over `docs/` by `mkdocs.yml` (a broken link, a page
/// outside the nav or a bad docstring section fails the build) with the test environment's
/// mkdocs (installed if missing), then, with `rustdoc`, `cargo doc --workspace --no-deps`
/// copied to `out/rust/`, where the Rust API page links. Returns the site's path.
pub fn build_site(out: &Path, rustdoc: bool) -> Result<PathBuf> {
    let root = root();
    let out = if out.is_absolute() { out.to_path_buf() } else { root.join(out) };
    let venv = venv_dir(&root);
    let bin = venv.join("bin");
    if !bin.join("python").exists() {
        python_environment(&root, false, 0.0, &Console::Terminal)?;
    }
    let py = bin.join("python");
    let importable = |module: &str| {
        Command::new(&py).args(["-c", &format!("import {module}")]).output().is_ok_and(|o| o.status.success())
    };
    if !(importable("material") && importable("mkdocstrings_handlers.python") && importable("playwright")) {
        Console::Terminal.run(
            "the guide's builders (mkdocs-material, mkdocstrings) and Playwright",
            Command::new(&py)
                .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check"])
                .args(DOCS_REQUIREMENTS),
        )?;
    }
    Console::Terminal.run(
        "the user guide site (mkdocs build --strict)",
        Command::new(bin.join("mkdocs"))
            .args(["build", "--strict", "--quiet", "--site-dir"])
            .arg(&out)
            .current_dir(&root)
            .env("NO_MKDOCS_2_WARNING", "1"),
    )?;
    if rustdoc {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        Console::Terminal.run(
            "the Rust API (cargo doc --workspace --no-deps)",
            Command::new(&cargo)
                .args(["doc", "--release", "--workspace", "--no-deps", "--quiet"])
                .current_dir(&root),
        )?;
        copy_tree(&root.join("target").join("doc"), &out.join("rust"))?;
    }
    Ok(out)
}

/// Copies the folder `from` into `to` (made if missing), files and subfolders.
fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to).with_context(|| format!("could not create {}", to.display()))?;
    for entry in std::fs::read_dir(from).with_context(|| format!("could not read {}", from.display()))? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_tree(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target).with_context(|| {
                format!("could not copy {} to {}", entry.path().display(), target.display())
            })?;
        }
    }
    Ok(())
}

/// The headless browser of the site's test: `$FSPACE_CHROMIUM`, else Debian's `chromium`
/// package at `/usr/bin/chromium`, installed with `apt-get` when missing (as the test command
/// installs torch; Playwright's own browser builds download themselves, which an offline
/// machine cannot).
fn ensure_chromium(console: &Console) -> Result<PathBuf> {
    if let Some(path) = std::env::var_os("FSPACE_CHROMIUM") {
        return Ok(PathBuf::from(path));
    }
    let path = PathBuf::from("/usr/bin/chromium");
    if path.exists() {
        return Ok(path);
    }
    let install = || {
        Command::new("apt-get")
            .args(["install", "-y", "--no-install-recommends", "--quiet", "chromium"])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .is_ok_and(|s| s.success())
    };
    console.say("== Chromium for the site's browser test (Debian's package, apt-get install chromium)")?;
    if !install() {
        // A fresh machine's package lists may be empty or stale.
        let updated = Command::new("apt-get").args(["update", "--quiet"]).status().is_ok_and(|s| s.success());
        if !(updated && install()) {
            bail!(
                "the site's browser test needs Chromium: install Debian's package `chromium` (apt-get install \
                 chromium, as root) or name a Chromium binary in $FSPACE_CHROMIUM"
            );
        }
    }
    Ok(path)
}

/// Free disk below which `install_torch` leaves torch out: the lean install measured ≈ 4.6 GB
/// of disk with the downloaded wheels, laplace-torch's dependencies ≈ 1.3 GB more (triton
/// among them), transformers and peft with theirs ≈ 0.25 GB, plus room for pip's unpacking and
/// the test run, Ray Train with its dependencies (pyarrow, pandas) ≈ 0.5 GB.
pub const TORCH_DISK_NEED_GIB: f64 = 9.3;

/// What the Rust build may still write while torch installs beside it: `target/` without the
/// venv after a run from empty build folders (7.4 GB − 4.5 GB measured, rounded up). Asked for
/// even when the build is already there (the check cannot tell), so on a disk with less than
/// ≈ 10 GiB free a first `cargo xtask test` leaves torch out (saying why) where a
/// `--python-only` run after the build would install it.
pub const RUST_BUILD_GIB: f64 = 3.0;

/// The torch requirement: ≥ 2.1 for `torch.func` and string padding in `Conv2d`.
const TORCH: &str = "torch>=2.1";

/// Prints torch's runtime requirements for this interpreter, one per line, without triton
/// (the `torch.compile` back-end, ≈ 1 GB, which no test uses) and without optional extras.
const TORCH_DEPENDENCIES: &str = r#"
import importlib.metadata as md
from pip._vendor.packaging.requirements import Requirement
for line in md.requires("torch") or []:
    r = Requirement(line)
    if r.name.lower() == "triton":
        continue
    if r.marker is not None and not r.marker.evaluate({"extra": ""}):
        continue
    extras = "[" + ",".join(sorted(r.extras)) + "]" if r.extras else ""
    print(f"{r.name}{extras}{r.specifier}")
"#;

/// Makes torch importable in the environment; `Ok(false)` when it is left out for lack of disk
/// (unless `$FSPACE_REQUIRE_TORCH` is set, which makes that an error).
///
/// torch is installed without its dependencies, then with every dependency but triton, and
/// without pip's cache (CI machines start empty; the cache would double the footprint).
fn install_torch(py: &Path, venv: &Path, reserve_gib: f64, console: &Console) -> Result<bool> {
    let importable =
        Command::new(py).args(["-c", "import torch"]).output().map(|o| o.status.success()).unwrap_or(false);
    if importable {
        return install_references(py, console).map(|()| true);
    }
    if let Some(free) = free_disk_gib(venv) {
        if let Some(short) = disk_shortfall(free, reserve_gib) {
            let why = format!("{short} at {}", venv.display());
            if std::env::var_os("FSPACE_REQUIRE_TORCH").is_some() {
                bail!("torch is required ($FSPACE_REQUIRE_TORCH) and cannot be installed: {why}");
            }
            console
                .say(&format!("== torch NOT installed: {why}. The PyTorch-model tests will be SKIPPED;"))?;
            console.say("   free disk space and rerun to include them, or pass --no-torch to say so.")?;
            return Ok(false);
        }
    }
    let pip = ["-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-cache-dir"];
    console.run("torch (without its dependencies)", Command::new(py).args(pip).args(["--no-deps", TORCH]))?;
    let listed = Command::new(py)
        .args(["-c", TORCH_DEPENDENCIES])
        .output()
        .context("could not list torch's dependencies")?;
    if !listed.status.success() {
        bail!("listing torch's dependencies failed: {}", String::from_utf8_lossy(&listed.stderr));
    }
    let dependencies: Vec<String> =
        String::from_utf8_lossy(&listed.stdout).lines().map(str::to_owned).collect();
    console
        .say("   (pip then reports triton as a missing requirement of torch: it is left out on purpose)")?;
    console.run("torch's dependencies (all but triton)", Command::new(py).args(pip).args(&dependencies))?;
    console.run("torch imports", Command::new(py).args(["-c", "import torch"]))?;
    install_references(py, console)?;
    Ok(true)
}

/// The packages the torch tests compare with or build on, pinned, with the module each
/// provides: laplace-torch (the parity suite, `crates/fspace-py/tests/test_laplace_parity.py`,
/// runs the same scripts through it) and transformers + peft (the LoRA model of
/// `crates/fspace-py/tests/test_lora.py`), and mpi4py with the `mpich` wheel (MPI without system
/// packages: the sharded fit's second engine, `crates/fspace-py/tests/test_distributed.py`; the
/// `mpich` wheel is what makes `mpi4py.MPI` importable), and Ray Train (the scaling-out page's
/// `TorchTrainer` example, run by the same test file).
const REFERENCES: [(&str, &str); 6] = [
    ("laplace-torch==0.3", "laplace"),
    ("transformers==5.25.0", "transformers"),
    ("peft==0.21.2", "peft"),
    ("mpi4py==4.1.2", "mpi4py"),
    ("mpich==5.0.2", "mpi4py.MPI"),
    ("ray[train]==2.60.0", "ray.train"),
];

/// Makes the [`REFERENCES`] importable beside torch (with their dependencies: laplace-torch's
/// curvlinops, BackPACK, ASDL and torchvision — whose torch pin brings triton, ≈ 1 GB — and
/// transformers' tokenizers and safetensors, counted in [`TORCH_DISK_NEED_GIB`]).
fn install_references(py: &Path, console: &Console) -> Result<()> {
    let missing: Vec<&str> = REFERENCES
        .iter()
        .filter(|(_, module)| {
            !Command::new(py)
                .args(["-c", &format!("import {module}")])
                .output()
                .is_ok_and(|o| o.status.success())
        })
        .map(|(requirement, _)| *requirement)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let pip = ["-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-cache-dir"];
    console.run(
        &format!("the torch tests' references ({})", missing.join(", ")),
        Command::new(py).args(pip).args(&missing),
    )
}

/// Why `free_gib` of free disk is too little for torch with `reserve_gib` kept for the Rust build
/// beside it; `None` when it suffices.
fn disk_shortfall(free_gib: f64, reserve_gib: f64) -> Option<String> {
    let need = TORCH_DISK_NEED_GIB + reserve_gib;
    if free_gib >= need {
        return None;
    }
    let beside = if reserve_gib > 0.0 {
        format!(" (of which {reserve_gib} GiB for the Rust build running beside it)")
    } else {
        String::new()
    };
    Some(format!("{free_gib:.1} GiB free but torch needs ≈ {need} GiB{beside}"))
}

/// Free space in GiB on the file system holding `path` (or its nearest existing parent), from
/// POSIX `df -Pk`; `None` where that cannot be read, in which case the install is attempted.
fn free_disk_gib(path: &Path) -> Option<f64> {
    let out = Command::new("df").arg("-Pk").arg(path).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let available_kib: f64 = text.lines().nth(1)?.split_whitespace().nth(3)?.parse().ok()?;
    Some(available_kib / (1024.0 * 1024.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn torch_beside_the_rust_build_asks_for_the_build_s_room_too() {
        let roomy = TORCH_DISK_NEED_GIB + 0.5;
        assert_eq!(disk_shortfall(roomy, 0.0), None);
        assert_eq!(disk_shortfall(TORCH_DISK_NEED_GIB, 0.0), None);
        let alone = disk_shortfall(6.9, 0.0).expect("below torch's own need");
        assert!(alone.contains("6.9 GiB free") && !alone.contains("Rust build"), "{alone}");
        let beside = disk_shortfall(roomy, RUST_BUILD_GIB).expect("torch and the build do not both fit");
        let need = format!("≈ {} GiB", TORCH_DISK_NEED_GIB + RUST_BUILD_GIB);
        assert!(beside.contains(&need) && beside.contains("3 GiB for the Rust build"), "{beside}");
        assert_eq!(disk_shortfall(TORCH_DISK_NEED_GIB + RUST_BUILD_GIB, RUST_BUILD_GIB), None);
    }
}
