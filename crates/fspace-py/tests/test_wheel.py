"""The wheel `cargo xtask wheel` builds (`$FSPACE_WHEEL`, set by `cargo xtask test`) installs into
a fresh virtual environment and runs the README's Python quickstart there, with no Rust
toolchain on `PATH`: what a user without Rust gets from `pip install fspace-*.whl`."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
import sysconfig

import pytest

WHEEL = os.environ.get("FSPACE_WHEEL")


@pytest.mark.skipif(not WHEEL, reason="$FSPACE_WHEEL names the wheel (cargo xtask test builds it)")
def test_the_wheel_installs_without_rust_and_runs_the_quickstart(tmp_path):
    pytest.importorskip("torch")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    # No Rust on PATH: only the fresh environment and the system's own directories.
    env = dict(os.environ, PATH=f"{venv / 'bin'}:/usr/bin:/bin")
    for key in ("CARGO", "RUSTUP_HOME", "CARGO_HOME", "VIRTUAL_ENV", "PYTHONPATH"):
        env.pop(key, None)
    run = subprocess.run([str(py), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", WHEEL], env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    assert subprocess.run(["which", "cargo"], env=env, capture_output=True).returncode != 0
    readme = pathlib.Path(__file__).resolve().parents[3] / "README.md"
    text = readme.read_text(encoding="utf-8")
    code = re.search(r"```python\n(.*?)```", text[text.index("## Python"):], re.S).group(1)
    script = tmp_path / "quickstart.py"
    script.write_text("import fspace, sys\nprint('FSPACE_FROM', fspace.__file__)\n" + code + "\nprint('QUICKSTART_OK')\n")
    # torch from this test environment, after the fresh environment's own packages: a
    # PYTHONPATH entry is searched before site-packages, and this one holds no `fspace` (the
    # editable install is a .pth file, which PYTHONPATH does not read), so the wheel's is used.
    here = sysconfig.get_paths()["purelib"]
    assert not (pathlib.Path(here) / "fspace").exists()
    env["PYTHONPATH"] = here
    run = subprocess.run([str(py), str(script)], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "QUICKSTART_OK" in run.stdout
    origin = re.search(r"FSPACE_FROM (\S+)", run.stdout).group(1)
    assert origin.startswith(str(venv)), f"fspace came from {origin}, not the wheel"


@pytest.mark.skipif(not WHEEL, reason="$FSPACE_WHEEL names the wheel (cargo xtask test builds it)")
def test_the_wheel_is_abi3_and_needs_no_glibc_past_2_17():
    """One wheel for every CPython ≥ 3.9 and every x86-64 Linux of the last decade: the tags say
    abi3 and manylinux2014, and the compiled module asks for no glibc symbol version past 2.17
    (its version-requirement strings, read from the ELF file)."""
    import zipfile

    name = pathlib.Path(WHEEL).name
    assert "-cp39-abi3-" in name and "manylinux_2_17_x86_64" in name, name
    with zipfile.ZipFile(WHEEL) as wheel:
        module = next(n for n in wheel.namelist() if n.endswith(".so"))
        binary = wheel.read(module)
    versions = {tuple(int(p) for p in m.groups()) for m in re.finditer(rb"GLIBC_(\d+)\.(\d+)(?:\.\d+)?\x00", binary)}
    assert versions and max(versions) <= (2, 17), sorted(versions)
