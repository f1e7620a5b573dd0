"""``fspace.metrics`` against the metrics' definitions written out in numpy, and its refusals.
The sharded evaluation (2 and 3 processes) is in ``test_distributed.py``."""

import math

import numpy as np
import pytest

import fspace.metrics as metrics


def _probs(n, c, seed):
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(n, c)) * 2
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    return p / p.sum(axis=1, keepdims=True), rng.integers(0, c, size=n)


def _ece(p, y, bins):
    conf, pred = p.max(axis=1), p.argmax(axis=1)
    b = np.clip(np.ceil(conf * bins).astype(int), 1, bins) - 1
    return sum(abs((pred[b == k] == y[b == k]).sum() - conf[b == k].sum()) / len(y) for k in range(bins))


def test_classification_metrics_are_their_definitions():
    p, y = _probs(503, 4, 1)
    got = metrics.classification_metrics(p, y, bins=10)
    assert got["n"] == 503
    assert math.isclose(got["nll"], -np.log(p[np.arange(503), y]).mean(), rel_tol=1e-13)
    assert math.isclose(got["accuracy"], (p.argmax(axis=1) == y).mean(), rel_tol=1e-15)
    assert math.isclose(got["brier"], ((p - np.eye(4)[y]) ** 2).sum(axis=1).mean(), rel_tol=1e-13)
    assert math.isclose(got["ece"], _ece(p, y, 10), rel_tol=1e-12)
    # torch tensors and float labels are the same call.
    torch = pytest.importorskip("torch")
    again = metrics.classification_metrics(torch.from_numpy(p), torch.from_numpy(y.astype(np.float64)), bins=10)
    assert again == got


def test_regression_metrics_are_their_definitions():
    rng = np.random.default_rng(2)
    m, y = rng.normal(size=(301, 2)), rng.normal(size=(301, 2))
    v = rng.uniform(0.2, 2.0, size=(301, 2))
    got = metrics.regression_metrics(m, v, y)
    assert got["n"] == 602
    nll = (0.5 * np.log(2 * np.pi * v) + (y - m) ** 2 / (2 * v)).mean()
    assert math.isclose(got["nll"], nll, rel_tol=1e-13)
    assert math.isclose(got["rmse"], math.sqrt(((y - m) ** 2).mean()), rel_tol=1e-13)
    s = np.sqrt(v)
    z = (y - m) / s
    phi = np.exp(-0.5 * z**2) / math.sqrt(2 * math.pi)
    cdf = 0.5 * (1 + np.vectorize(math.erf)(z / math.sqrt(2)))
    crps = (s * (z * (2 * cdf - 1) + 2 * phi - 1 / math.sqrt(math.pi))).mean()
    assert math.isclose(got["crps"], crps, rel_tol=1e-12)
    from statistics import NormalDist

    alphas = [k / 10 for k in range(11)]
    gammas = [float((np.abs(y - m) < s * NormalDist().inv_cdf((1 + a) / 2)).mean()) if a < 1 else 1.0
              for a in alphas]
    assert [a for a, _ in got["coverage"]] == pytest.approx(alphas)
    assert [g for _, g in got["coverage"]] == pytest.approx(gammas, abs=1e-15)
    cqm = sum(0.05 * (abs(gammas[k] - alphas[k]) + abs(gammas[k + 1] - alphas[k + 1])) for k in range(10))
    assert math.isclose(got["cqm"], cqm, rel_tol=1e-12, abs_tol=1e-15)


def test_ood_metrics_are_their_definitions():
    rng = np.random.default_rng(3)
    a, b = rng.normal(size=97), rng.normal(0.8, 1.0, size=41)
    a[:5] = b[:5]  # ties count one half
    got = metrics.ood_metrics(a, b)
    pairs = (b[None, :] > a[:, None]).mean() + 0.5 * (b[None, :] == a[:, None]).mean()
    assert math.isclose(got["roc_auc"], pairs, rel_tol=1e-13)
    scores = np.concatenate([a, b])
    is_ood = np.concatenate([np.zeros(97, bool), np.ones(41, bool)])
    best = max(max(((scores > t) == is_ood).mean(), ((scores <= t) == is_ood).mean())
               for t in np.concatenate([[-np.inf], scores]))
    assert math.isclose(got["stump_accuracy"], best, rel_tol=1e-13)


@pytest.mark.parametrize("call, message", [
    (lambda: metrics.classification_metrics(np.full((3, 2), 0.5), [0, 1]), "3 rows but y has 2"),
    (lambda: metrics.classification_metrics(np.full((2, 2), 0.5), [0, 2]), "invalid label 2"),
    (lambda: metrics.classification_metrics(np.array([[0.5, 0.6]]), [0]), "not a probability vector"),
    (lambda: metrics.classification_metrics(np.full((2, 2), 0.5), [0, 1], bins=0), "bins must be"),
    (lambda: metrics.classification_metrics(np.full((2, 2), 0.5), [0, 1], bins=-3), "bins must be"),
    (lambda: metrics.classification_metrics(np.full(4, 0.5), [0, 1, 0, 1]), "n × C"),
    (lambda: metrics.classification_metrics(np.zeros((0, 2)), []), "empty"),
    (lambda: metrics.classification_metrics(np.full((1, 2), 0.5 + 0j), [0]), "complex"),
    (lambda: metrics.regression_metrics([0.0], [0.0], [1.0]), "invalid value"),
    (lambda: metrics.regression_metrics([0.0, 1.0], [1.0], [1.0]), "one entry each"),
    (lambda: metrics.regression_metrics([np.nan], [1.0], [1.0]), "invalid value"),
    (lambda: metrics.regression_metrics(["a"], [1.0], [1.0]), "must be numbers"),
    (lambda: metrics.ood_metrics([], [1.0]), "empty"),
    (lambda: metrics.ood_metrics([np.inf], [1.0]), "invalid value"),
])
def test_bad_input_is_a_value_error_that_names_it(call, message):
    with pytest.raises(ValueError) as info:
        call()
    assert message in str(info.value).lower() or message in str(info.value), str(info.value)
