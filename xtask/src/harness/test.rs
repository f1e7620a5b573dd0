//! `cargo xtask test`: every test of the project, Rust and Python, in one command.
//!
//! 1. `cargo test --workspace --release` (the Rust suite);
//! 2. a virtual environment at `target/python-venv` (`python3 -m venv`, made once), with
//!    maturin, numpy, pytest, mypy and torch from PyPI (torch is ≈ 5 GB installed — PyPI's
//!    Linux wheel brings its CUDA libraries — and took 80 s on a fresh venv here; once per
//!    machine). `--no-torch` leaves it out: the tests that convert a PyTorch model are then
//!    skipped and pytest lists them; with torch, `$FSPACE_REQUIRE_TORCH` makes a missing torch a
//!    failure rather than a skip;
//! 3. `maturin develop --release` of `crates/fspace-py` into it (the `fspace` package), then
//!    `mypy.stubtest fspace._fspace` (the `.pyi` stubs against the compiled module) and `mypy`
//!    over the Python layer;
//! 4. the Rust API's numbers on a seeded toy problem for every Python class
//!    ([`super::python_reference`], `target/python-reference.json`), then
//!    `python -m pytest crates/fspace-py/tests` with `$FSPACE_RUST_REFERENCE` pointing at them.
//!
//! `$FSPACE_PYTHON` names the interpreter that makes the environment (default `python3`).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

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

fn run(what: &str, cmd: &mut Command) -> Result<()> {
    println!("== {what}: {cmd:?}");
    let status = cmd.status().with_context(|| format!("{what}: could not start {cmd:?}"))?;
    if !status.success() {
        bail!("{what} failed ({status})");
    }
    Ok(())
}

/// The workspace root (the parent of `xtask/`).
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask lives in the workspace").to_path_buf()
}

/// Runs the plan from the workspace root.
pub fn test(plan: TestPlan) -> Result<()> {
    let root = root();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    if !plan.python_only {
        run(
            "Rust tests",
            Command::new(&cargo).args(["test", "--workspace", "--release"]).current_dir(&root),
        )?;
    }
    if plan.rust_only {
        return Ok(());
    }
    let venv = root.join("target").join("python-venv");
    let bin = venv.join("bin");
    if !bin.join("python").exists() {
        let python = std::env::var("FSPACE_PYTHON").unwrap_or_else(|_| "python3".into());
        run(
            "Python environment (needs python3 with venv; Debian: apt install python3-venv)",
            Command::new(python).args(["-m", "venv"]).arg(&venv),
        )?;
    }
    let py = bin.join("python");
    let mut packages = vec!["maturin>=1.16,<2", "numpy", "pytest", "mypy"];
    // torch ≥ 2.1 for `torch.func` and string padding in Conv2d.
    if plan.torch {
        packages.push("torch>=2.1");
    }
    run(
        "Python test dependencies",
        Command::new(&py)
            .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check"])
            .args(&packages),
    )?;
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    run(
        "fspace Python package (maturin develop --release)",
        Command::new(bin.join("maturin"))
            .args(["develop", "--release", "--quiet"])
            .current_dir(root.join("crates").join("fspace-py"))
            .env("VIRTUAL_ENV", &venv)
            .env("PATH", &path),
    )?;
    run(
        "Type stubs against the compiled module (mypy.stubtest)",
        Command::new(&py).args(["-m", "mypy.stubtest", "fspace._fspace"]).current_dir(root.join("target")),
    )?;
    run(
        "Types of the Python layer (mypy)",
        Command::new(&py)
            .args(["-m", "mypy", "--ignore-missing-imports", "-p", "fspace"])
            .current_dir(root.join("crates").join("fspace-py").join("python")),
    )?;
    let reference = root.join("target").join("python-reference.json");
    println!("== Rust reference numbers for the Python tests: {}", reference.display());
    super::python_reference::write(&reference)?;
    let mut pytest = Command::new(&py);
    pytest
        .args(["-m", "pytest", "-q", "-rs", "crates/fspace-py/tests"])
        .env("FSPACE_RUST_REFERENCE", &reference);
    if plan.torch {
        pytest.env("FSPACE_REQUIRE_TORCH", "1");
    } else {
        pytest.env_remove("FSPACE_REQUIRE_TORCH");
    }
    run("Python tests", pytest.current_dir(&root))
}
