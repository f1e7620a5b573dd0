"""Ctrl-C stops a long native fit between two of its steps: ``KeyboardInterrupt`` within a
fraction of a second of the signal, and the object keeps what it had before the call."""

from __future__ import annotations

import _thread
import threading
import time

import numpy as np
import pytest

import fspace
from fspace import kernels as K
from mlp_reference import tanh_mlp

try:  # imported before any simulated Ctrl-C: an import of torch cut short cannot be retried
    import torch  # noqa: F401
except ImportError:  # pragma: no cover - the native tests run without torch
    pass

# The signal arrives after this long; the fit would take far longer.
DELAY = 0.5
# What a user may wait after it on an otherwise idle machine (the loops poll every 50 ms).
BOUND = 1.0


def _bound():
    """``BOUND`` stretched by how oversubscribed the cores were meanwhile: with ``L`` runnable
    tasks on ``C`` cores (the 1-minute load average) each gets about ``C / L`` of a core, so a
    chunk of the fit takes ``L / C`` times as long — a build beside the tests doubled it."""
    import os

    return BOUND * max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))


@pytest.fixture(autouse=True)
def _sigint_raises_keyboard_interrupt():
    """Python's own SIGINT handler for each test: a runner started with SIGINT ignored
    (``nohup … &``, some CI shells) inherits ``SIG_IGN``, under which the simulated Ctrl-C
    (``_thread.interrupt_main``) does nothing and the fits would run to their end."""
    import signal

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _interrupted(call):
    """Runs ``call`` with a simulated Ctrl-C ``DELAY`` s in; returns the seconds from the signal
    to the ``KeyboardInterrupt``."""
    sent = []

    def ctrl_c():
        sent.append(time.perf_counter())
        _thread.interrupt_main()

    timer = threading.Timer(DELAY, ctrl_c)
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            call()
    finally:
        timer.cancel()
    assert sent, "the fit ended before the signal: make it longer"
    return time.perf_counter() - sent[0]


def _data(n, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-2, 2, size=(n, 1))
    return x, np.sin(2 * x) + 0.1 * rng.normal(size=(n, 1))


def test_ctrl_c_stops_the_function_space_fits_and_keeps_the_object():
    x, y = _data(400)
    state = tanh_mlp(np.random.default_rng(1), [1, 32, 32, 1])
    prior = fspace.GPPrior(K.RBF(1.0, 0.5))
    for make in (
        lambda: fspace.FSPLaplace((state, "tanh"), "regression", prior, epochs=100_000, sigma_noise=0.1),
        lambda: fspace.GFSVI((state, "tanh"), "regression", prior, steps=10_000_000, measurement_points=20),
        lambda: fspace.VaLLA((state, "tanh"), "regression", steps=10_000_000, num_inducing=10, sigma_noise=0.1),
    ):
        method = make()
        waited = _interrupted(lambda: method.fit(x, y))
        assert waited < _bound(), f"{type(method).__name__} stopped {waited:.2f} s after Ctrl-C"
        with pytest.raises(RuntimeError, match="not fitted"):
            method(x[:2])


def test_ctrl_c_stops_the_passes_over_a_large_data_set():
    """Post-hoc FSP-Laplace's pass over the data (Alg. 2's step 4: seconds at a million points)
    and VaLLA's outputs and NTK diagonal before its first step poll between their chunks."""
    x, y = _data(1_000_000, 3)
    state = tanh_mlp(np.random.default_rng(1), [1, 32, 32, 1])
    for make in (
        lambda: fspace.FSPLaplace((state, "tanh"), "regression", fspace.GPPrior(K.RBF(1.0, 0.5)), train=False,
                                  sigma_noise=0.1),
        lambda: fspace.VaLLA((state, "tanh"), "regression", steps=10, num_inducing=10, sigma_noise=0.1),
    ):
        # A small fit first, so that the signal lands in the pass over the data, not in what the
        # first call sets up.
        make().fit(x[:100], y[:100])
        method = make()
        waited = _interrupted(lambda: method.fit(x, y))
        assert waited < _bound(), f"{type(method).__name__} stopped {waited:.2f} s after Ctrl-C"
        with pytest.raises(RuntimeError, match="not fitted"):
            method(x[:2])


def test_ctrl_c_stops_a_laplace_fit_and_the_earlier_posterior_stays():
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1, 200), torch.nn.Tanh(), torch.nn.Linear(200, 200), torch.nn.Tanh(),
                                torch.nn.Linear(200, 1)).double()
    x, y = _data(200)
    la = fspace.Laplace(model, "regression", "all", "lowrank", rank=5)
    la.fit(torch.from_numpy(x), torch.from_numpy(y))
    before = la(torch.from_numpy(x[:3]))[1]
    # A full GGN over 40 000 + parameters from 400 000 points: minutes without a signal.
    xb, yb = _data(400_000, 1)
    slow = fspace.Laplace(model, "regression", "all", "diag")
    waited = _interrupted(lambda: slow.fit(torch.from_numpy(xb), torch.from_numpy(yb)))
    assert waited < _bound(), f"the Laplace fit stopped {waited:.2f} s after Ctrl-C"
    waited = _interrupted(lambda: la.fit(torch.from_numpy(xb), torch.from_numpy(yb)))
    assert waited < _bound()
    assert torch.equal(la(torch.from_numpy(x[:3]))[1], before)


def test_ctrl_c_stops_the_dense_factorisation_of_a_full_ggn():
    """The full GGN's one dense factorisation — here the thin SVD of the 2 201 × 1 000 whitened
    Jacobian, seconds with no step inside to check between — is heard too: the fit returns at
    the signal (it returned when the SVD ended, 3.6 s later, before the factorisation ran
    beside the poll) and the earlier posterior stays."""
    pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    state = tanh_mlp(rng, [3, 44, 44, 1])
    x = rng.uniform(-1, 1, (1000, 3))
    y = np.sin(x[:, :1])
    la = fspace.Laplace((state, "tanh"), "regression", "all", "full", sigma_noise=0.1)
    la.fit(x[:50], y[:50])
    before = la(x[:3])[1]
    waited = _interrupted(lambda: la.fit(x, y))
    assert waited < _bound(), f"the full GGN stopped {waited:.2f} s after Ctrl-C"
    assert np.array_equal(np.asarray(la(x[:3])[1]), np.asarray(before))


def test_a_progress_callback_that_raises_stops_the_fit():
    x, y = _data(200)
    state = tanh_mlp(np.random.default_rng(1), [1, 16, 1])
    calls = []

    def progress(step, total, loss, validation):
        calls.append(step)
        raise RuntimeError("stop here")

    method = fspace.FSPLaplace((state, "tanh"), "regression", fspace.GPPrior(K.RBF(1.0, 0.5)), epochs=100_000)
    start = time.perf_counter()
    with pytest.raises(RuntimeError, match="stop here"):
        method.fit(x, y, progress=progress)
    assert calls == [1] and time.perf_counter() - start < 5.0


def test_ctrl_c_stops_the_long_queries():
    """The sampled (``pred_type="nn"``) and linearised predictives and function draws check for
    the signal between draws and chunks of points, as the fits do."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1, 200), torch.nn.Tanh(), torch.nn.Linear(200, 200), torch.nn.Tanh(),
                                torch.nn.Linear(200, 1)).double()
    x, y = _data(200)
    la = fspace.Laplace(model, "regression", "all", "diag")
    la.fit(torch.from_numpy(x), torch.from_numpy(y))
    many = torch.from_numpy(_data(200_000, 2)[0])
    for name, query in (("the sampled predictive", lambda: la(many, pred_type="nn", link_approx="mc", n_samples=1000)),
                        ("the linearised predictive", lambda: la(many))):
        waited = _interrupted(query)
        assert waited < _bound(), f"{name} stopped {waited:.2f} s after Ctrl-C"
    state = tanh_mlp(np.random.default_rng(1), [1, 64, 64, 1])
    fsp = fspace.FSPLaplace((state, "tanh"), "regression", fspace.GPPrior(K.RBF(1.0, 0.5)), train=False,
                            sigma_noise=0.1)
    fsp.fit(x, y)
    waited = _interrupted(lambda: fsp(_data(2_000_000, 3)[0]))
    assert waited < _bound(), f"FSP-Laplace's predictive stopped {waited:.2f} s after Ctrl-C"
