"""The engines a fit shards over: a torch.distributed process group or an mpi4py communicator,
behind one ``all_reduce`` of float64 vectors (``docs/scaling-out.md``)."""

from __future__ import annotations

from typing import Any, List

import numpy as np


def _torch() -> Any:
    import torch

    return torch


def _group(process_group: Any) -> Any:
    """The engine a fit shards over (``_TorchGroup`` or ``_MpiGroup``): the given process group
    or mpi4py communicator, the default torch group when ``torch.distributed`` is initialised
    with more than one process (``None`` given), or none (``False``, or a single process)."""
    if process_group is False:
        return None
    if type(process_group).__module__.startswith("mpi4py"):
        return _MpiGroup(process_group) if process_group.Get_size() > 1 else None
    try:
        torch = _torch()
    except ImportError:  # no torch: no torch.distributed to shard over
        if process_group is None:
            return None
        raise
    dist = torch.distributed
    if process_group is None:
        if not (dist.is_available() and dist.is_initialized()):
            return None
        process_group = dist.group.WORLD
    if dist.get_world_size(process_group) <= 1:
        return None
    return _TorchGroup(process_group)


class _TorchGroup:
    """All-reduces of float64 vectors over a torch.distributed process group."""

    def __init__(self, group: Any) -> None:
        self.group = group
        dist = _torch().distributed
        self.rank, self.size = dist.get_rank(group), dist.get_world_size(group)

    def all_reduce(self, values: np.ndarray, op: str) -> np.ndarray:
        torch = _torch()
        dist = torch.distributed
        t = torch.from_numpy(np.ascontiguousarray(values, dtype=np.float64).copy())
        dist.all_reduce(t, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX, group=self.group)
        return t.numpy()


class _MpiGroup:
    """All-reduces of float64 vectors over an mpi4py communicator (CPU clusters)."""

    def __init__(self, comm: Any) -> None:
        self.comm = comm
        self.rank, self.size = comm.Get_rank(), comm.Get_size()

    def all_reduce(self, values: np.ndarray, op: str) -> np.ndarray:
        from mpi4py import MPI

        out = np.empty_like(np.asarray(values, dtype=np.float64))
        self.comm.Allreduce(np.ascontiguousarray(values, dtype=np.float64), out, op=MPI.SUM if op == "sum" else MPI.MAX)
        return out


def sharded_sum(group: Any, compute: Any) -> Any:
    """Runs ``compute(reduce)`` — a fit whose one sum over the data goes through ``reduce(part,
    fingerprint)`` — so that no process waits forever for another: ``reduce`` first all-reduces
    a status and the basis fingerprint (a process that failed before its sum sends status 1, and
    every other process raises a ``RuntimeError``; fingerprints that differ are a ``ValueError``
    on every process), then the sum of the parts."""
    called = [False]
    width = 7  # status, then the fingerprint (3 values) as max and as −min

    def reduce(part: np.ndarray, fingerprint: Any) -> np.ndarray:
        called[0] = True
        f = np.asarray(fingerprint, dtype=np.float64)
        top = group.all_reduce(np.concatenate([[0.0], f, -f]), "max")
        if top[0] > 0:
            raise RuntimeError("another process failed during the sharded fit: its error is raised there")
        if not np.array_equal(top[1:4], -top[4:7]):
            raise ValueError(
                "the processes disagree on the curvature basis: give every process the same model, prior, "
                "settings and context box"
            )
        return group.all_reduce(np.ascontiguousarray(part).reshape(-1), "sum").reshape(part.shape)

    try:
        return compute(reduce)
    except BaseException:
        if not called[0]:
            # Release the processes waiting in the status all-reduce.
            status = np.zeros(width)
            status[0] = 1.0
            group.all_reduce(status, "max")
        raise


def agreed(group: Any, local: Any) -> Any:
    """Runs ``local()`` — a step of a sharded fit that may fail on one process (its own data) —
    then all-reduces the failure status, so that a collective that follows never waits forever:
    the failing process raises its own error, every other one a ``RuntimeError``."""
    failure: Any = None
    result: Any = None
    try:
        result = local()
    except BaseException as e:  # noqa: BLE001 - re-raised below, after the other processes hear of it
        failure = e
    status = group.all_reduce(np.array([0.0 if failure is None else 1.0]), "max")
    if failure is not None:
        raise failure
    if status[0] > 0:
        raise RuntimeError("another process failed during the sharded fit: its error is raised there")
    return result


def agree_on(group: Any, values: Any, message: str) -> None:
    """Every process holds the same ``values`` (a fingerprint of the model and the settings),
    else a ``ValueError`` with ``message`` on every process."""
    v = np.asarray(values, dtype=np.float64).reshape(-1)
    width = group.all_reduce(np.array([float(v.size), -float(v.size)]), "max")
    if width[0] != -width[1]:
        raise ValueError(message)
    top = group.all_reduce(np.concatenate([v, -v]), "max")
    if not np.array_equal(top[: v.size], -top[v.size:]):
        raise ValueError(message)


def step_reduce(group: Any) -> Any:
    """The per-step reduce of a sharded training loop (GFSVI): ``reduce(part, failed)``
    all-reduces a failure flag with the part; a process that did not fail raises a
    ``RuntimeError`` when another did (the failing one returns and raises its own error)."""

    def reduce(part: np.ndarray, failed: bool) -> np.ndarray:
        total = group.all_reduce(np.concatenate([[1.0 if failed else 0.0], np.asarray(part, dtype=np.float64)]), "sum")
        if total[0] > 0 and not failed:
            raise RuntimeError("another process failed during the sharded fit: its error is raised there")
        return np.ascontiguousarray(total[1:])

    return reduce


# How to shard a loader so that every point is on exactly one process (the advice of the
# errors for overlapping or padded shards).
ONE_SHARD_EACH = ("give each process its own points once, e.g. DataLoader(dataset, sampler=list(range(rank, "
                  "len(dataset), world_size)))")


def global_box(group: Any, x: np.ndarray) -> Any:
    """The per-feature ``(lower, upper)`` bounds of every process's rows ``x`` together, in
    one all-reduce (MAX of the negated minima and of the maxima)."""
    d = x.shape[1]
    top = group.all_reduce(np.concatenate([-x.min(axis=0), x.max(axis=0)]), "max")
    return -top[:d], top[d:]


def weights_summary(arrays: Any) -> List[float]:
    """``[count, sum, sum of squares]`` of the float64 weights in ``arrays``: a fingerprint
    the processes of a sharded fit compare to find a model that differs."""
    flat = np.concatenate([np.asarray(a, dtype=np.float64).reshape(-1) for a in arrays]) if arrays else np.zeros(0)
    return [float(flat.size), float(flat.sum()), float(np.square(flat).sum())]
