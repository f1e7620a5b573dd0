"""The papers' evaluation metrics, exact over shards.

``classification_metrics`` (NLL, accuracy, Brier score, ECE), ``regression_metrics`` (Gaussian
NLL, RMSE, CRPS, CQM) and ``ood_metrics`` (ROC-AUC and the decision stump's accuracy of
out-of-distribution detection) take a predictive and its targets as numpy arrays or torch
tensors and return a ``dict`` of floats. They are the Rust crate ``fspace-metrics``'s
definitions (the numbers of ``cargo xtask reproduce``).

With ``process_group=`` (a ``torch.distributed`` group or an mpi4py communicator; by default
the default group when ``torch.distributed`` is initialised with more than one process) each
process passes its own test points and every process gets the metrics of all of them: the
averaged and binned metrics are sums (``fspace_metrics::ClassificationSums`` /
``RegressionSums``: one all-reduce of ``4 + 3·bins`` or 15 numbers), and the rank metrics of
OOD detection gather every process's scores (the mean of per-shard AUCs is not the AUC).
``docs/scaling-out.md``, "Metrics over shards".
"""

from __future__ import annotations

from typing import Any, Dict, Tuple

import numpy as np

from . import _fspace
from ._distributed import _group, agree_on, agreed

__all__ = ["classification_metrics", "regression_metrics", "ood_metrics"]


def _numbers(a: Any, what: str) -> np.ndarray:
    """``a`` (numpy, torch or a sequence) as a float64 array; complex and non-numeric input
    refused by name."""
    if hasattr(a, "detach"):
        a = a.detach().cpu().numpy()
    arr = np.asarray(a)
    if arr.dtype.kind == "c":
        raise ValueError(f"{what} is complex: the metrics take real numbers")
    if arr.dtype.kind not in "biuf":
        raise ValueError(f"{what} must be numbers, got an array of dtype {arr.dtype}")
    return np.ascontiguousarray(arr, dtype=np.float64)


def _bins(bins: Any) -> int:
    if isinstance(bins, bool) or not isinstance(bins, (int, np.integer)) or bins < 1:
        raise ValueError(f"bins must be a whole number ≥ 1, got {bins!r}")
    return int(bins)


def _summed(group: Any, local: Any, width: int, settings: Any, message: str) -> np.ndarray:
    """``local()``'s sums, all-reduced over ``group`` when there is one (after the processes
    agree on the ``settings``; a process whose own sums fail raises its error, the others a
    ``RuntimeError``)."""
    if group is None:
        return np.asarray(local(), dtype=np.float64)
    agree_on(group, settings, message)
    flat = agreed(group, lambda: np.asarray(local(), dtype=np.float64))
    if flat.size != width:  # a layout every process computes alike; checked, not assumed
        raise ValueError(f"partial sums of {flat.size} values where {width} were expected")
    return group.all_reduce(flat, "sum")


def classification_metrics(probs: Any, y: Any, *, bins: int = 15, process_group: Any = None) -> Dict[str, float]:
    """NLL, accuracy, Brier score and expected calibration error of class probabilities.

    Parameters
    ----------
    probs : array or tensor, shape (n, C)
        Predictive class probabilities (rows sum to 1).
    y : array or tensor, shape (n,)
        Class labels in ``0 .. C − 1``.
    bins : int, default 15
        Equal-width confidence bins of the ECE (the papers use 15).
    process_group : torch.distributed group or mpi4py communicator, optional
        Each process passes its own points (a process may hold none) and every process gets
        the metrics of all of them; ``False`` evaluates each process on its own.

    Returns
    -------
    dict
        ``nll`` (mean ``−log p(y)``), ``accuracy``, ``brier`` (mean ``Σₖ (pₖ − 1[y = k])²``),
        ``ece`` and ``n`` (the points evaluated).

    Raises
    ------
    ValueError
        Shapes that disagree, a label out of range, a row that is not a probability vector,
        NaN, no points at all.

    Examples
    --------
    >>> import numpy as np
    >>> import fspace.metrics
    >>> probs = np.array([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4], [0.3, 0.7]])
    >>> m = fspace.metrics.classification_metrics(probs, np.array([0, 1, 1, 1]))
    >>> round(m["accuracy"], 2), m["n"]
    (0.75, 4)
    """
    bins = _bins(bins)
    p, labels = _numbers(probs, "probs"), _numbers(y, "y").reshape(-1)
    if p.ndim != 2:
        raise ValueError(f"probs must be n × C, got shape {p.shape}")
    if p.shape[0] != labels.shape[0]:
        raise ValueError(f"probs has {p.shape[0]} rows but y has {labels.shape[0]} labels")
    width = 4 + 3 * bins
    group = _group(process_group)

    def local() -> Any:
        return np.zeros(width) if p.shape[0] == 0 else _fspace.classification_sums(probs=p, y=labels, bins=bins)

    flat = _summed(group, local, width, [float(bins), float(p.shape[1])],
                   "the processes disagree on bins or on the number of classes")
    return dict(_fspace.classification_metrics(bins=bins, flat=[float(v) for v in flat]))


def regression_metrics(mean: Any, var: Any, y: Any, *, process_group: Any = None) -> Dict[str, Any]:
    """Gaussian NLL, RMSE, CRPS and CQM of predictives ``N(mean, var)``.

    Parameters
    ----------
    mean, var : array or tensor
        Predictive means and total predictive variances (> 0, the observation noise included),
        of ``y``'s shape; every entry is one Gaussian.
    y : array or tensor
        The targets.
    process_group : torch.distributed group or mpi4py communicator, optional
        As in ``classification_metrics``.

    Returns
    -------
    dict
        ``nll`` (mean ``½ log 2πv + (y − m)² / 2v``), ``rmse`` (of the means), ``crps``,
        ``cqm`` (the calibration quality, 0 for a calibrated predictive), ``coverage`` (the
        ``(α, γ)`` pairs of the CQM curve: the fraction ``γ`` of targets inside the central
        ``α`` interval) and ``n``.

    Raises
    ------
    ValueError
        Shapes that disagree, NaN, a variance ≤ 0, no points at all.

    Examples
    --------
    >>> import numpy as np
    >>> import fspace.metrics
    >>> m = fspace.metrics.regression_metrics(np.zeros(3), np.ones(3), np.array([0.0, 1.0, -1.0]))
    >>> round(m["rmse"], 4), m["n"]
    (0.8165, 3)
    """
    m, v, t = (_numbers(a, what).reshape(-1) for a, what in ((mean, "mean"), (var, "var"), (y, "y")))
    if not (m.shape == v.shape == t.shape):
        raise ValueError(f"mean, var and y must have one entry each per target, got {m.size}, {v.size}, {t.size}")
    group = _group(process_group)

    def local() -> Any:
        return np.zeros(15) if t.size == 0 else _fspace.regression_sums(mean=m, var=v, y=t)

    flat = _summed(group, local, 15, [15.0], "the processes disagree on the regression sums' layout")
    return dict(_fspace.regression_metrics([float(x) for x in flat]))


def _gathered(group: Any, parts: Tuple[np.ndarray, ...]) -> Tuple[np.ndarray, ...]:
    """Every process's ``parts`` concatenated in process order, on every process: one
    all-reduce of the counts, then one of a vector where each process fills its own slots."""
    counts = np.zeros((group.size, len(parts)))
    counts[group.rank] = [a.size for a in parts]
    counts = group.all_reduce(counts.reshape(-1), "sum").reshape(group.size, len(parts)).astype(np.int64)
    totals = counts.sum(axis=0)
    out = np.zeros(int(totals.sum()))
    start = 0
    for j, a in enumerate(parts):
        at = start + int(counts[: group.rank, j].sum())
        out[at:at + a.size] = a
        start += int(totals[j])
    out = group.all_reduce(out, "sum")
    bounds = np.concatenate([[0], np.cumsum(totals)])
    return tuple(out[bounds[j]:bounds[j + 1]] for j in range(len(parts)))


def ood_metrics(id_scores: Any, ood_scores: Any, *, process_group: Any = None) -> Dict[str, float]:
    """ROC-AUC and decision-stump accuracy of separating out-of-distribution points from
    in-distribution ones by a score (e.g. the predictive entropy).

    Parameters
    ----------
    id_scores, ood_scores : array or tensor, 1-D
        The scores of in-distribution and of out-of-distribution points.
    process_group : torch.distributed group or mpi4py communicator, optional
        Each process passes its own scores; every process's are gathered (these metrics rank
        all the points together) and every process gets the same numbers.

    Returns
    -------
    dict
        ``roc_auc`` (``P(s_ood > s_id) + ½ P(s_ood = s_id)``) and ``stump_accuracy`` (the best
        one-threshold classifier's accuracy on these points, FSP-Laplace App. B.2).

    Raises
    ------
    ValueError
        NaN or ±∞ scores, no ID or no OOD score at all.

    Examples
    --------
    >>> import numpy as np
    >>> import fspace.metrics
    >>> fspace.metrics.ood_metrics(np.array([0.1, 0.2, 0.3]), np.array([0.25, 0.9]))["roc_auc"]
    0.8333333333333334
    """
    a, b = _numbers(id_scores, "id_scores").reshape(-1), _numbers(ood_scores, "ood_scores").reshape(-1)
    group = _group(process_group)
    if group is not None:
        def finite() -> None:
            for s, what in ((a, "id_scores"), (b, "ood_scores")):
                if not np.isfinite(s).all():
                    raise ValueError(f"{what} holds NaN or ±∞ at index {int(np.flatnonzero(~np.isfinite(s))[0])}")

        agreed(group, finite)
        a, b = _gathered(group, (a, b))
    return dict(_fspace.ood_metrics(id_scores=a, ood_scores=b))
