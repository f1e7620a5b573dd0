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


def _close_predictive(got, want, regression, rtol, what):
    """A predictive as the worker writes it: regression ``[mean, covariances]``, compared part
    by part; classification the probabilities."""
    for g, w in zip(got, want) if regression else [(got, want)]:
        _close(g, w, rtol, what)


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
                assert got["lanczos"] == want["lanczos"], key
                for field in ("evidence", "prior_precision"):
                    _close(got[field], want[field], 1e-12, f"{world} processes, {key}, {field}")
                _close_predictive(got["predictive"], want["predictive"], key.startswith("regression"), 1e-12,
                                  f"{world} processes, {key}, predictive")
                # Identical on every process.
                assert got == results[0]["fits"][key], f"{key} differs between processes"


def test_post_hoc_fsp_laplace_shards_to_the_single_process_posterior(tmp_path):
    """Post-hoc FSP-Laplace over 2 and 3 processes (uneven shards of the 1 001 points; the
    context box of all the points; Alg. 2's one sum over the data all-reduced): every process
    gets the single-process predictive to 1e-12 and the same rank, and to 1e-10 when each
    process streams a loader of its shard (the sum's order differs); a process whose data are bad
    raises its error and the others a RuntimeError, not a hang."""
    single = _run("fsp", 1, tmp_path)[0]
    assert "error" not in single, single.get("error")
    for world in (2, 3):
        results = _run("fsp", world, tmp_path)
        for res in results:
            assert "error" not in res, f"rank {res['rank']}: {res.get('error')}"
            for lik, want in single["fsp"].items():
                got = res["fsp"][lik]
                assert got["rank"] == want["rank"], lik
                _close_predictive(got["predictive"], want["predictive"], lik == "regression", 1e-12,
                                  f"{world} processes, FSP-Laplace {lik}")
                _close_predictive(got["loader_predictive"], want["predictive"], lik == "regression", 1e-10,
                                  f"{world} processes, FSP-Laplace {lik} from a loader")
            assert res["fsp"] == results[0]["fsp"], "the processes differ"
    results = _run("fsp_failing", 2, tmp_path)
    assert results[1]["error"][0] == "ValueError" and "non-finite" in results[1]["error"][1], results[1]
    assert results[0]["error"][0] == "RuntimeError" and "another process" in results[0]["error"][1], results[0]


def test_gfsvi_shards_to_the_single_process_posterior(tmp_path):
    """GFSVI over 2 and 3 processes (uneven contiguous shards of the 1 001 points, validation
    points spread over all but the last process): the minibatches and measurement points drawn
    over the global rows from the shared seed, the batch points joining the measurement points
    gathered from their holders, each process's part of the data term all-reduced every step,
    the divergence added once, the validation NLL summed over every process's points — every
    process stops early at the single-process step with its predictive to 1e-10, for regression
    and classification; a process whose data are refused (in Python, or in Rust before its
    first step) raises its error and the others a RuntimeError, not a hang."""
    single = _run("gfsvi", 1, tmp_path)[0]
    assert "error" not in single, single.get("error")
    for lik, want in single["gfsvi"].items():
        assert want["steps"] < 60, f"the test wants an early stop ({lik}: {want})"
    for world in (2, 3):
        results = _run("gfsvi", world, tmp_path)
        for res in results:
            assert "error" not in res, f"rank {res['rank']}: {res.get('error')}"
            for lik, want in single["gfsvi"].items():
                got = res["gfsvi"][lik]
                assert (got["steps"], got["best"]) == (want["steps"], want["best"]), (world, lik, got, want)
                _close_predictive(got["predictive"], want["predictive"], lik == "regression", 1e-10,
                                  f"{world} processes, GFSVI {lik}")
            assert res["gfsvi"] == results[0]["gfsvi"], "the processes differ"
    for case in ("gfsvi_failing_python", "gfsvi_failing_rust"):
        results = _run(case, 2, tmp_path)
        assert results[1]["error"][0] == "ValueError", (case, results[1])
        assert results[0]["error"][0] == "RuntimeError" and "another process" in results[0]["error"][1], \
            (case, results[0])


def test_valla_shards_to_the_single_process_posterior(tmp_path):
    """VaLLA over 2 and 3 processes (uneven contiguous shards of the 1 001 points, validation
    points on the first process only): the k-means start over every process's points, each
    step's data term all-reduced and the KL added once, early stopping on the validation NLL of
    all the processes' validation points — every process gets the single-process predictive to
    1e-10 after the same iterations, for regression and classification; a process whose labels
    are refused raises its error and the others a RuntimeError."""
    single = _run("valla", 1, tmp_path)[0]
    assert "error" not in single, single.get("error")
    for world in (2, 3):
        results = _run("valla", world, tmp_path)
        for res in results:
            assert "error" not in res, f"rank {res['rank']}: {res.get('error')}"
            for lik, want in single["valla"].items():
                got = res["valla"][lik]
                assert (got["iterations"], got["best"]) == (want["iterations"], want["best"]), lik
                _close_predictive(got["predictive"], want["predictive"], lik == "regression", 1e-10,
                                  f"{world} processes, VaLLA {lik}")
            assert res["valla"] == results[0]["valla"], "the processes differ"
    results = _run("valla_failing", 2, tmp_path)
    assert results[1]["error"][0] == "ValueError", results[1]
    assert results[0]["error"][0] == "RuntimeError" and "another process" in results[0]["error"][1], results[0]


def test_fsp_laplace_training_shards_to_the_single_process_fit(tmp_path):
    """FSP-Laplace with Alg. 1 over 2 and 3 processes (uneven contiguous shards, σ learned,
    validation points on the first process only, Alg. 2's prior factor jittered): every
    process trains the single-process weights and σ to 1e-10 in the same steps and gets the
    single-process predictive to 1e-10 (2e-12 here), the same on every process. Without the
    jitter Alg. 2 moves by up to 1e-4 for a one-ulp change of the weights, which the sums' order
    gives; the Rust test `a_sharded_fsp_laplace_fit_is_the_single_process_one` compares it at the
    weights it was taken at."""
    single = _run("fsp_training", 1, tmp_path)[0]
    assert "error" not in single, single.get("error")
    want = single["fsp_training"]
    for world in (2, 3):
        results = _run("fsp_training", world, tmp_path)
        for res in results:
            assert "error" not in res, f"rank {res['rank']}: {res.get('error')}"
            got = res["fsp_training"]
            assert (got["steps"], got["best"]) == (want["steps"], want["best"])
            for g, w in zip(got["weights"], want["weights"]):
                _close(g, w, 1e-10, f"{world} processes, weights")
            _close(got["sigma"], want["sigma"], 1e-10, f"{world} processes, σ")
            _close_predictive(got["predictive"], want["predictive"], True, 1e-10, f"{world} processes, predictive")
            assert got == results[0]["fsp_training"], "the processes differ"


def test_ella_shards_to_the_single_process_posterior(tmp_path):
    """ELLA over 2 and 3 processes (uneven shards of 800 training and 201 validation points):
    the Nyström points drawn from all the shards in index order, ``G`` all-reduced and the
    validation NLL scored over every process's points give every process the single-process
    ``G``, validation NLL, grid-searched λ and predictive to 1e-12; a padding sampler and a
    process that fails are errors on every process."""
    single = _run("ella", 1, tmp_path)[0]
    assert "error" not in single, single.get("error")
    for world in (2, 3):
        results = _run("ella", world, tmp_path)
        for res in results:
            assert "error" not in res, f"rank {res['rank']}: {res.get('error')}"
            for lik, want in single["ella"].items():
                got = res["ella"][lik]
                assert got["n_data"] == want["n_data"] == 800, lik
                for field in ("gram", "val_nll", "prior_precision"):
                    _close(got[field], want[field], 1e-12, f"{world} processes, ELLA {lik}, {field}")
                _close_predictive(got["predictive"], want["predictive"], lik == "regression", 1e-12,
                                  f"{world} processes, ELLA {lik}, predictive")
            assert res["ella"] == results[0]["ella"], "the processes differ"
    for res in _run("ella_padded", 2, tmp_path):
        kind, message = res["error"]
        assert kind == "ValueError" and "DistributedSampler pads" in message, message
    results = _run("ella_failing", 2, tmp_path)
    assert results[1]["error"][0] == "ValueError", results[1]
    assert results[0]["error"][0] == "RuntimeError" and "another process" in results[0]["error"][1], results[0]


def _same_metrics(got, want, what):
    for kind, values in want.items():
        for name, value in values.items():
            _close(got[kind][name], value, 1e-12, f"{what}, {kind} {name}")


def test_metrics_over_shards_are_the_whole_test_sets(tmp_path):
    """``fspace.metrics`` over 2 and 3 processes (uneven shards of 1 001 points): the sums of
    NLL, accuracy, Brier, ECE, RMSE, CRPS and CQM all-reduced, the OOD scores gathered — the
    single-process numbers to 1e-12, identical on every process; a process with a bad label
    raises its error, the others a RuntimeError."""
    single = _run("metrics", 1, tmp_path)[0]
    assert "error" not in single, single.get("error")
    for world in (2, 3):
        results = _run("metrics", world, tmp_path)
        for res in results:
            assert "error" not in res, f"rank {res['rank']}: {res.get('error')}"
            _same_metrics(res["metrics"], single["metrics"], f"{world} processes")
            assert res["metrics"] == results[0]["metrics"], "the processes' metrics differ"
        assert results[0]["metrics"]["classification"]["n"] == 1001
    results = _run("metrics_failing", 2, tmp_path)
    assert results[1]["error"][0] == "ValueError" and "label" in results[1]["error"][1], results[1]
    assert results[0]["error"][0] == "RuntimeError" and "another process" in results[0]["error"][1], results[0]


def test_a_padded_sampler_and_a_failing_process_are_errors_everywhere(tmp_path):
    for res in _run("padded", 2, tmp_path):
        kind, message = res["error"]
        assert kind == "ValueError" and "DistributedSampler pads" in message, message
    results = _run("failing", 2, tmp_path)
    assert results[1]["error"][0] == "ValueError", results[1]
    assert results[0]["error"][0] == "RuntimeError" and "another process" in results[0]["error"][1], results[0]
    # Low rank (an all-reduce per Lanczos product): labels refused by one process's Rust
    # checks reach the other through the first all-reduce; a model that differs is refused
    # on every process before any work.
    results = _run("lowrank_failing_labels", 2, tmp_path)
    assert results[1]["error"][0] == "ValueError" and "label" in results[1]["error"][1], results[1]
    assert results[0]["error"][0] == "RuntimeError" and "another process" in results[0]["error"][1], results[0]
    for res in _run("lowrank_failing_model", 2, tmp_path):
        kind, message = res["error"]
        assert kind == "ValueError" and "disagree on the model" in message, message


def test_the_torch_loop_regularisers_under_ddp_follow_the_single_process_run(tmp_path):
    """FSPRegularizer, and GFSVIRegularizer with MeanField, in a DDP training loop over 2 and 3
    processes (uneven shards of each global batch, the batch added to the context points): the
    parameters after four SGD steps equal the single-process run on the global batches, on every
    process — the prior counted once per step, the data term the global batch's."""
    single = _run("ddp", 1, tmp_path)[0]
    assert "error" not in single, single.get("error")
    for world in (2, 3):
        for res in _run("ddp", world, tmp_path):
            assert "error" not in res, f"rank {res['rank']}: {res.get('error')}"
            for method in ("fsp", "gfsvi"):
                _close(res["ddp"][method], single["ddp"][method], 1e-10, f"{world} processes, {method}")
    for res in _run("seeds", 2, tmp_path):
        kind, message = res["error"]
        assert kind == "ValueError" and "differ between the processes" in message, message


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


def _doc_block(heading):
    import re

    doc = pathlib.Path(__file__).resolve().parents[3] / "docs" / "scaling-out.md"
    return re.search(rf"## {heading}.*?```python\n(.*?)```", doc.read_text(encoding="utf-8"), re.S).group(1)


def _same_line_on_both(stdout, pattern):
    import re

    # The processes print concurrently: their lines may interleave on one line of the output.
    lines = dict(re.findall(rf"rank (\d): ({pattern})", stdout))
    assert sorted(lines) == ["0", "1"] and lines["0"] == lines["1"], stdout


def test_the_metrics_example_of_the_docs_runs(tmp_path):
    """docs/scaling-out.md's sharded evaluation, run by torchrun with two processes: both print
    the metrics of all 1 001 points, the same on both."""
    script = tmp_path / "evaluate_sharded.py"
    script.write_text(_doc_block("Metrics over shards"))
    env = dict(os.environ, OMP_NUM_THREADS="1", RAYON_NUM_THREADS="1")
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                          f"--master_port={_free_port()}", str(script)], env=env, capture_output=True, text=True,
                         timeout=240)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    _same_line_on_both(run.stdout, r"n = 1001, nll = [0-9.]+, ece = [0-9.]+, auc = [0-9.]+")


def test_the_ray_example_of_the_docs_runs(tmp_path):
    """docs/scaling-out.md's Ray Train block (``TorchTrainer``, two CPU workers): both workers
    print the same λ and probabilities. Skipped where Ray is not installed (``cargo xtask test``
    installs it) or does not start within the test's time."""
    pytest.importorskip("ray.train", reason="ray[train] is installed by `cargo xtask test`")
    script = tmp_path / "fit_ray.py"
    script.write_text(_doc_block("With Ray Train"))
    env = dict(os.environ, OMP_NUM_THREADS="1", RAYON_NUM_THREADS="1", RAY_USAGE_STATS_ENABLED="0")
    try:
        run = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=240,
                             cwd=tmp_path)
    except subprocess.TimeoutExpired:
        pytest.skip("Ray did not finish within 240 s on this machine")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    _same_line_on_both(run.stdout + run.stderr, r"λ = [^\]]*\]")


def test_the_ddp_example_of_the_docs_runs(tmp_path):
    """docs/scaling-out.md's DDP training loop under torchrun with two processes: both end with
    the same weights."""
    script = tmp_path / "train_ddp.py"
    script.write_text(_doc_block("Your own training loop under DDP"))
    env = dict(os.environ, OMP_NUM_THREADS="1", RAYON_NUM_THREADS="1")
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                          f"--master_port={_free_port()}", str(script)], env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    _same_line_on_both(run.stdout, r"checksum = [-\d.]+")


def test_the_slurm_example_of_the_docs_runs(tmp_path):
    """docs/scaling-out.md's SLURM job: the batch script is valid bash, and its Python part runs
    as ``srun`` starts it — two processes with SLURM_PROCID / SLURM_NTASKS and the first node's
    address — each printing the same λ."""
    import re

    doc = (pathlib.Path(__file__).resolve().parents[3] / "docs" / "scaling-out.md").read_text(encoding="utf-8")
    sbatch = re.search(r"## With SLURM.*?```sh\n(.*?)```", doc, re.S).group(1)
    assert "srun python fit_slurm.py" in sbatch
    assert subprocess.run(["bash", "-n"], input=sbatch, text=True).returncode == 0
    script = tmp_path / "fit_slurm.py"
    script.write_text(_doc_block("With SLURM"))
    port = str(_free_port())
    procs = []
    for rank in range(2):
        env = dict(os.environ, OMP_NUM_THREADS="1", RAYON_NUM_THREADS="1", SLURM_PROCID=str(rank), SLURM_NTASKS="2",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        procs.append(subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outputs = [p.communicate(timeout=240)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(o[-2000:] for o in outputs)
    _same_line_on_both("".join(outputs), r"λ = [^\]]*\]")


def test_mpi_is_a_second_engine_with_the_same_posterior(tmp_path):
    """``mpiexec -n 2`` with ``process_group=MPI.COMM_WORLD`` (mpi4py and the mpich wheel, no
    system packages): the single-process posterior on both processes, Laplace's and post-hoc
    FSP-Laplace's."""
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
    single_fsp = _run("fsp", 1, tmp_path)[0]["fsp"]
    for lik, want in single_fsp.items():
        for res in results:
            _close_predictive(res["fsp"][lik]["predictive"], want["predictive"], lik == "regression", 1e-12,
                              f"MPI, FSP-Laplace {lik}")
    single_gfsvi = _run("gfsvi", 1, tmp_path)[0]["gfsvi"]
    for lik, want in single_gfsvi.items():
        for res in results:
            assert res["gfsvi"][lik]["steps"] == want["steps"], (lik, res["gfsvi"][lik], want)
            _close_predictive(res["gfsvi"][lik]["predictive"], want["predictive"], lik == "regression", 1e-10,
                              f"MPI, GFSVI {lik}")
    single_metrics = _run("metrics", 1, tmp_path)[0]["metrics"]
    for res in results:
        _same_metrics(res["metrics"], single_metrics, "MPI")
    single_valla = _run("valla", 1, tmp_path)[0]["valla"]
    for lik, want in single_valla.items():
        for res in results:
            _close_predictive(res["valla"][lik]["predictive"], want["predictive"], lik == "regression", 1e-10,
                              f"MPI, VaLLA {lik}")
    single_training = _run("fsp_training", 1, tmp_path)[0]["fsp_training"]
    for res in results:
        _close(res["fsp_training"]["sigma"], single_training["sigma"], 1e-10, "MPI, FSP-Laplace training, σ")
        _close_predictive(res["fsp_training"]["predictive"], single_training["predictive"], True, 1e-10,
                          "MPI, FSP-Laplace training")
    single_ella = _run("ella", 1, tmp_path)[0]["ella"]
    for lik, want in single_ella.items():
        for res in results:
            _close(res["ella"][lik]["gram"], want["gram"], 1e-12, f"MPI, ELLA {lik}, G")
            _close(res["ella"][lik]["prior_precision"], want["prior_precision"], 1e-12, f"MPI, ELLA {lik}, λ")


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
