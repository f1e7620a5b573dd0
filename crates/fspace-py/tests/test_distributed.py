"""Sharded fitting over torch.distributed (gloo over loopback, spawned processes): world sizes
1, 2 and 3 on N = 1 001 points (uneven shards) give every process the single-process posterior
— evidence, optimised λ and predictive equal to 1e-12 relative and identical on every process —
for every streamable structure and subset; a padding DistributedSampler and a process that
fails are errors on every process, not a hang."""

from __future__ import annotations

import json
import os
import pathlib
import socket
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("torch")
import torch  # noqa: E402

if not torch.distributed.is_available():  # pragma: no cover
    pytest.skip("torch.distributed is not available", allow_module_level=True)

WORKER = pathlib.Path(__file__).with_name("distributed_worker.py")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(case, world, tmp_path):
    out = tmp_path / f"{case}-{world}"
    out.mkdir()
    port = str(_free_port())
    env = dict(os.environ, OMP_NUM_THREADS="1", RAYON_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, str(WORKER), case, str(world), str(r), port, str(out)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for r in range(world)]
    logs = []
    for p in procs:
        try:
            logs.append(p.communicate(timeout=240)[0].decode(errors="replace"))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail(f"{case} with {world} processes hung")
    results = []
    for r, p in enumerate(procs):
        path = out / f"rank{r}.json"
        assert path.exists(), f"process {r} wrote nothing (exit {p.returncode}):\n{logs[r][-3000:]}"
        results.append(json.loads(path.read_text()))
    return results


def _close(a, b, rtol, what):
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    assert a.shape == b.shape, what
    scale = max(np.abs(b).max(), 1e-300)
    err = np.abs(a - b).max() / scale
    assert err <= rtol, f"{what}: relative difference {err:.2e}"


def test_every_process_gets_the_single_process_posterior(tmp_path):
    single = _run("fits", 1, tmp_path)[0]
    assert "error" not in single, single.get("error")
    for world in (2, 3):
        results = _run("fits", world, tmp_path)
        for res in results:
            assert "error" not in res, f"rank {res['rank']}: {res.get('error')}"
        for key, want in single["fits"].items():
            for res in results:
                got = res["fits"][key]
                assert got["n_data"] == want["n_data"] == 1001, key
                for field in ("evidence", "prior_precision"):
                    _close(got[field], want[field], 1e-12, f"{world} processes, {key}, {field}")
                # Classification: probabilities; regression: (mean, covariances).
                parts = (got["predictive"], want["predictive"]) if key.startswith("classification") else None
                for g, w in [parts] if parts else zip(got["predictive"], want["predictive"]):
                    _close(g, w, 1e-12, f"{world} processes, {key}, predictive")
                # Identical on every process.
                assert got == results[0]["fits"][key], f"{key} differs between processes"


def test_a_padded_sampler_and_a_failing_process_are_errors_everywhere(tmp_path):
    for res in _run("padded", 2, tmp_path):
        kind, message = res["error"]
        assert kind == "ValueError" and "DistributedSampler pads" in message, message
    results = _run("failing", 2, tmp_path)
    assert results[1]["error"][0] == "ValueError", results[1]
    assert results[0]["error"][0] == "RuntimeError" and "another process" in results[0]["error"][1], results[0]


def test_the_torchrun_example_of_the_docs_runs(tmp_path):
    """docs/scaling-out.md's torchrun block, run by torchrun with two processes: both print
    the same λ and probabilities."""
    import re

    doc = pathlib.Path(__file__).resolve().parents[3] / "docs" / "scaling-out.md"
    code = re.search(r"## With torchrun.*?```python\n(.*?)```", doc.read_text(encoding="utf-8"), re.S).group(1)
    script = tmp_path / "fit_sharded.py"
    script.write_text(code)
    env = dict(os.environ, OMP_NUM_THREADS="1", RAYON_NUM_THREADS="1")
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                          f"--master_port={_free_port()}", str(script)], env=env, capture_output=True, text=True,
                         timeout=240)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    # The processes print concurrently: their lines may interleave on one line of the output.
    lines = dict(re.findall(r"rank (\d): (λ = [^\]]*\])", run.stdout))
    assert sorted(lines) == ["0", "1"] and lines["0"] == lines["1"], run.stdout


def test_mpi_is_a_second_engine_with_the_same_posterior(tmp_path):
    """``mpiexec -n 2`` with ``process_group=MPI.COMM_WORLD`` (mpi4py and the mpich wheel, no
    system packages): the single-process posterior on both processes."""
    pytest.importorskip("mpi4py.MPI", reason="mpi4py and mpich are installed by `cargo xtask test`")
    mpiexec = pathlib.Path(sys.executable).with_name("mpiexec")
    if not mpiexec.exists():
        pytest.skip("no mpiexec beside the interpreter (the mpich wheel provides one)")
    single = _run("fits", 1, tmp_path)[0]
    out = tmp_path / "mpi"
    out.mkdir()
    env = dict(os.environ, OMP_NUM_THREADS="1", RAYON_NUM_THREADS="1")
    run = subprocess.run([str(mpiexec), "-n", "2", sys.executable, str(WORKER), "mpi", str(out)], env=env,
                         capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    results = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    for key, want in single["fits"].items():
        for res in results:
            got = res["fits"][key]
            assert got["n_data"] == 1001
            _close(got["evidence"], want["evidence"], 1e-12, f"MPI, {key}, evidence")
            _close(got["prior_precision"], want["prior_precision"], 1e-12, f"MPI, {key}, λ")
        assert results[0]["fits"][key] == results[1]["fits"][key], key


def test_the_mpi_example_of_the_docs_runs(tmp_path):
    """docs/scaling-out.md's MPI block under ``mpiexec -n 2``: both processes print the same λ and
    variances."""
    import re

    pytest.importorskip("mpi4py.MPI", reason="mpi4py and mpich are installed by `cargo xtask test`")
    mpiexec = pathlib.Path(sys.executable).with_name("mpiexec")
    if not mpiexec.exists():
        pytest.skip("no mpiexec beside the interpreter (the mpich wheel provides one)")
    doc = pathlib.Path(__file__).resolve().parents[3] / "docs" / "scaling-out.md"
    code = re.search(r"## With MPI.*?```python\n(.*?)```", doc.read_text(encoding="utf-8"), re.S).group(1)
    script = tmp_path / "fit_mpi.py"
    script.write_text(code)
    env = dict(os.environ, OMP_NUM_THREADS="1", RAYON_NUM_THREADS="1")
    run = subprocess.run([str(mpiexec), "-n", "2", sys.executable, str(script)], env=env, capture_output=True,
                         text=True, timeout=240)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    # The processes print concurrently: their lines may interleave on one line of the output.
    lines = dict(re.findall(r"rank (\d): (λ = [^\]]*\])", run.stdout))
    assert sorted(lines) == ["0", "1"] and lines["0"] == lines["1"], run.stdout
