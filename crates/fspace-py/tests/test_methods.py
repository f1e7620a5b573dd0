"""FSPLaplace, GFSVI, VaLLA, ELLA, ExactGP and the kernels against independent numbers
(closed-form kernels and GP regression in numpy, a numpy forward pass, the truncation bound),
their pickling, progress reports, the GIL, and a table of bad inputs."""

import pickle
import re
import threading
import time

import numpy as np
import pytest

import fspace
from fspace import kernels as K
from mlp_reference import fitted, forward, tanh_mlp


@pytest.fixture
def toy():
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, size=(50, 1))
    y = np.sin(3 * x) + 0.1 * rng.normal(size=x.shape)
    return tanh_mlp(rng, [1, 12, 12, 1]), x, y


def _no_collection(m, replacement):
    """Replaces ``data_arrays`` wherever the method classes call it (the fitting routes of
    ``_network_method`` and the classes' own in ``_methods``), so that a loader collected into
    arrays is seen."""
    import fspace._methods
    import fspace._network_method

    for module in (fspace._methods, fspace._network_method):
        m.setattr(module, "data_arrays", replacement)


def sqdist(x, y, ell):
    d = (x[:, None, :] - y[None, :, :]) / np.asarray(ell)
    return np.sum(d**2, axis=-1)


def test_kernels_equal_their_closed_forms():
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(7, 2)), rng.normal(size=(5, 2))
    r2 = sqdist(x, y, [0.7, 1.3])
    r = np.sqrt(r2)
    cases = [
        (K.RBF(1.5, [0.7, 1.3]), 1.5 * np.exp(-0.5 * r2)),
        (K.Matern12(1.5, [0.7, 1.3]), 1.5 * np.exp(-r)),
        (K.Matern32(1.5, [0.7, 1.3]), 1.5 * (1 + np.sqrt(3) * r) * np.exp(-np.sqrt(3) * r)),
        (K.Matern52(1.5, [0.7, 1.3]), 1.5 * (1 + np.sqrt(5) * r + 5 * r2 / 3) * np.exp(-np.sqrt(5) * r)),
        (K.RationalQuadratic(1.5, [0.7, 1.3], 2.0), 1.5 * (1 + r2 / 4.0) ** -2.0),
        (K.Linear(0.5), 0.5 * x @ y.T),
        (K.Constant(0.3), np.full((7, 5), 0.3)),
    ]
    for kernel, want in cases:
        np.testing.assert_allclose(kernel(x, y), want, rtol=1e-12, atol=1e-14, err_msg=repr(kernel))
    rbf, m12 = K.RBF(1.5, [0.7, 1.3]), K.Matern12(0.5, 0.4)
    want_m12 = 0.5 * np.exp(-np.sqrt(sqdist(x, y, [0.4, 0.4])))
    np.testing.assert_allclose((rbf + m12)(x, y), 1.5 * np.exp(-0.5 * r2) + want_m12, rtol=1e-12)
    np.testing.assert_allclose((rbf * m12)(x, y), 1.5 * np.exp(-0.5 * r2) * want_m12, rtol=1e-12)
    np.testing.assert_allclose((3.0 * rbf)(x, y), 4.5 * np.exp(-0.5 * r2), rtol=1e-12)
    # Periodic in 1-D: σ² exp(−2 sin²(π|x − y|/p)/ℓ²).
    a, b = rng.normal(size=(6, 1)), rng.normal(size=(4, 1))
    s = np.sin(np.pi * np.abs(a - b.T) / 0.8)
    np.testing.assert_allclose(K.Periodic(2.0, 0.6, 0.8)(a, b), 2.0 * np.exp(-2 * s**2 / 0.36), rtol=1e-12)
    # Matrix-valued kernels: point-major blocks.
    g = K.Independent(rbf, 3)(x)
    np.testing.assert_allclose(g, np.kron(rbf(x), np.eye(3)), rtol=1e-12)
    h = K.Helmholtz(K.RBF(1.0, 0.5), K.RBF(0.5, 0.5))(x)
    assert h.shape == (14, 14)
    np.testing.assert_allclose(h, h.T, atol=1e-12)
    assert np.linalg.eigvalsh(h).min() > -1e-9


def test_exact_gp_equals_numpy_gp_regression(toy):
    _, x, y = toy
    prior = fspace.GPPrior(K.Matern32(1.2, 0.4) + K.RBF(0.3, 1.0))
    sigma = 0.2
    gp = fitted(fspace.ExactGP(prior, sigma_noise=sigma), x, y)
    xt = np.linspace(-2, 2, 13).reshape(-1, 1)
    kxx = prior.kernel(x) + sigma**2 * np.eye(len(x))
    kxt = prior.kernel(x, xt)
    alpha = np.linalg.solve(kxx, y)
    mean = kxt.T @ alpha
    var = np.diag(prior.kernel(xt)) - np.einsum("ij,ij->j", kxt, np.linalg.solve(kxx, kxt))
    got_mean, got_var = gp(xt)
    np.testing.assert_allclose(got_mean, mean, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(got_var[:, 0], var, rtol=1e-8, atol=1e-12)
    lml = -0.5 * y[:, 0] @ alpha[:, 0] - 0.5 * np.linalg.slogdet(kxx)[1] - 0.5 * len(x) * np.log(2 * np.pi)
    assert gp.log_marginal_likelihood() == pytest.approx(lml, rel=1e-9)


def test_fsp_laplace_mean_is_the_trained_network_and_respects_the_prior_variance(toy):
    state, x, y = toy
    prior = fspace.GPPrior(K.Matern12(1.0, 0.5))
    la = fspace.FSPLaplace((state, "tanh"), "regression", prior, sigma_noise=0.1, epochs=40, batch_size=25,
                           learning_rate=5e-3, n_laplace_context=25)
    la.fit(x, y)
    trained = la.model_state_dict()
    assert list(trained) == list(state)
    assert any(not np.array_equal(trained[k], state[k]) for k in state), "Alg. 1 trained the weights"
    xt = np.linspace(-3, 3, 31).reshape(-1, 1)
    mean, var = la(xt)
    np.testing.assert_allclose(mean, forward(trained, xt), rtol=1e-12, atol=1e-12)
    # The truncation rule: var f(c) ≤ Σ(c, c) = 1 at the 25 grid context points of the data box
    # widened by half its range on each side.
    lo, hi = x.min(), x.max()
    c = np.linspace(lo - 0.5 * (hi - lo), hi + 0.5 * (hi - lo), 25).reshape(-1, 1)
    _, var_c = la(c)
    assert var_c.max() <= 1.0 + 1e-9
    # Far from the data the posterior is wider than on it.
    assert var[0, 0] > 10 * var[15, 0]
    # Post hoc at the given weights: the mean is the given network.
    post = fitted(fspace.FSPLaplace((state, "tanh"), "regression", prior, train=False, sigma_noise=0.1), x, y)
    np.testing.assert_allclose(post(xt)[0], forward(state, xt), rtol=1e-12, atol=1e-12)
    assert all(np.array_equal(v, state[k]) for k, v in post.model_state_dict().items())


class Batches:
    """A re-iterable loader of ``(x, y)`` (or dict) batches that counts its passes."""

    def __init__(self, x, y, size, as_dict=False):
        self.parts = [(x[i:i + size], y[i:i + size]) for i in range(0, len(x), size)]
        self.as_dict, self.passes = as_dict, 0

    def __iter__(self):
        self.passes += 1
        for bx, by in self.parts:
            yield {"input_ids": bx, "labels": by} if self.as_dict else (bx, by)


def test_posthoc_fsp_laplace_streams_a_loader_to_the_in_memory_posterior(toy, monkeypatch):
    """``FSPLaplace(train=False).fit(loader)`` adds each batch to Alg. 2's ``k × k`` sum in Rust
    (``FspLaplaceBatches``) instead of concatenating the loader: a pass for the data's box, one
    for the sum (one pass with ``context_box`` given), dict batches too, and the posterior of
    ``fit(X, y)`` to rounding. A one-shot iterator, which cannot be read twice, is collected."""
    state, x, y = toy
    prior = K.RBF(1.0, 0.5)
    xt = np.linspace(-2, 2, 9).reshape(-1, 1)

    def method(**kw):
        return fspace.FSPLaplace((state, "tanh"), "regression", prior, train=False, sigma_noise=0.1, **kw)

    whole = fitted(method(), x, y)
    mean, var = whole(xt)

    def collected(*a, **k):
        raise AssertionError("the loader was collected into arrays")

    # Batches of 7 gathered to Alg. 2's chunk of 256 points (one call to Rust here), and to 16
    # (four calls).
    for as_dict, chunk in ((False, 256), (True, 16)):
        loader = Batches(x, y, 7, as_dict)
        with monkeypatch.context() as m:
            _no_collection(m, collected)
            streamed = fitted(method(laplace={"data_batch": chunk}), loader)
        assert loader.passes == 2
        m2, v2 = streamed(xt)
        np.testing.assert_array_equal(m2, mean)
        np.testing.assert_allclose(v2, var, rtol=1e-10)
        assert streamed.report["rank"] == whole.report["rank"]
    box = {"lower": [-3.0], "upper": [3.0]}
    loader = Batches(x, y, 16)
    boxed = fitted(method(context_box=box), loader)
    assert loader.passes == 1
    np.testing.assert_allclose(boxed(xt)[1], fitted(method(context_box=box), x, y)(xt)[1], rtol=1e-10)
    # A generator is read once, in memory: the same posterior.
    np.testing.assert_allclose(fitted(method(), iter(Batches(x, y, 7)))(xt)[1], var, rtol=1e-10)
    # A batch Rust refuses is the documented error, and the object keeps its earlier fit.
    bad = Batches(x, y, 7)
    bad.parts[3] = (bad.parts[3][0], np.full_like(bad.parts[3][1], np.nan))
    with pytest.raises(ValueError, match="non-finite"):
        streamed.fit(bad)
    np.testing.assert_allclose(streamed(xt)[1], var, rtol=1e-10)
    with pytest.raises(ValueError, match="no batch"):
        method().fit(Batches(x[:0], y[:0], 7))



@pytest.mark.torch
def test_fsp_laplace_trains_from_a_loader_reading_its_rows_by_position(toy, monkeypatch):
    """``FSPLaplace(train=True).fit(loader)`` over a map-style data set never collects the loader:
    after a pass for the data's box, Rust reads each training step's minibatch by position
    through the loader's data set and collate function (``fspace_fsp_laplace::fit_rows``) — the
    positions an in-memory fit draws, so the weights and the posterior of ``fit(X, y)`` to the
    bit, whatever the loader's own shuffling — and Alg. 2's chunks the same way; no read holds
    more than one minibatch or one chunk. A validation loader is read likewise (the same early
    stopping as ``val=(X, y)``). Dict items are read as dict batches. A corrupt row is the
    documented error, the object keeping its earlier fit; the data set's own exception (a
    ``KeyError``, Ctrl-C) comes through unchanged. A loader that does not cover its data set
    once per pass (``drop_last``, another sampler) is collected, as before."""
    import torch
    from torch.utils.data import DataLoader, Dataset, SubsetRandomSampler, TensorDataset


    state, x, y = toy
    rng = np.random.default_rng(3)
    xv = rng.uniform(-1, 1, size=(20, 1))
    yv = np.sin(3 * xv)
    prior = K.RBF(1.0, 0.5)
    xt = np.linspace(-2, 2, 9).reshape(-1, 1)

    class Rows(Dataset):
        """A map-style data set that records every read and can hold a corrupt row."""

        def __init__(self, x, y, bad=None, as_dict=False):
            self.x, self.y, self.bad, self.reads = torch.from_numpy(x), torch.from_numpy(y), bad, []
            self.as_dict = as_dict

        def __len__(self):
            return len(self.x)

        def __getitem__(self, i):
            self.reads.append(i)
            if self.bad is not None and i == self.bad[0]:
                if isinstance(self.bad[1], BaseException):
                    raise self.bad[1]
                return self.x[i], torch.full_like(self.y[i], self.bad[1])
            return {"input_ids": self.x[i], "labels": self.y[i]} if self.as_dict else (self.x[i], self.y[i])

    def method(**kw):
        settings = dict(sigma_noise=0.1, epochs=4, batch_size=8, n_context=10, laplace={"data_batch": 16})
        return fspace.FSPLaplace((state, "tanh"), "regression", prior, **{**settings, **kw})

    whole = fitted(method(), x, y)
    mean, var = whole(xt)

    def collected(*a, **k):
        raise AssertionError("the loader was collected into arrays")

    for shuffle, as_dict in ((False, False), (True, True)):
        rows = Rows(x, y, as_dict=as_dict)
        with monkeypatch.context() as m:
            _no_collection(m, collected)
            streamed = fitted(method(), DataLoader(rows, batch_size=5, shuffle=shuffle))
        for name, w in whole.model_state_dict().items():
            np.testing.assert_array_equal(streamed.model_state_dict()[name], w)
        m2, v2 = streamed(xt)
        np.testing.assert_array_equal(m2, mean)
        np.testing.assert_array_equal(v2, var)
        # The box pass (loader batches of 5), four epochs of 8-row minibatches, Alg. 2's pass.
        assert len(rows.reads) == 50 + 4 * 50 + 50

    # Early stopping on a validation loader read by position: the steps of val=(X, y).
    early = dict(epochs=30, patience=2)
    held = fitted(method(**early), x, y, val=(xv, yv))
    with monkeypatch.context() as m:
        _no_collection(m, collected)
        read = fitted(method(**early), DataLoader(Rows(x, y), batch_size=5),
                      val=DataLoader(Rows(xv, yv), batch_size=7))
    assert held.report["train"]["stopped_early"]
    assert read.report["train"]["best_step"] == held.report["train"]["best_step"]
    assert read.report["train"]["steps"] == held.report["train"]["steps"]
    np.testing.assert_allclose(read(xt)[1], held(xt)[1], rtol=1e-10)

    # A corrupt row: the documented error, and the earlier fit kept.
    with pytest.raises(ValueError, match="non-finite value in training targets"):
        streamed.fit(DataLoader(Rows(x, y, bad=(17, float("nan"))), batch_size=5))
    np.testing.assert_array_equal(streamed(xt)[1], var)
    with pytest.raises(KeyError, match="row 23 is gone"):
        streamed.fit(DataLoader(Rows(x, y, bad=(23, KeyError("row 23 is gone"))), batch_size=5))
    np.testing.assert_array_equal(streamed(xt)[1], var)
    # Ctrl-C while Rust waits on a read (the data set's own code runs it): raised, the fit kept.
    with pytest.raises(KeyboardInterrupt):
        streamed.fit(DataLoader(Rows(x, y, bad=(23, KeyboardInterrupt())), batch_size=5))
    np.testing.assert_array_equal(streamed(xt)[1], var)

    # Collected as before: a loader that drops its last batch trains on the rows it yields.
    dropped = fitted(method(), DataLoader(TensorDataset(torch.from_numpy(x), torch.from_numpy(y)), batch_size=8,
                                          drop_last=True))
    np.testing.assert_array_equal(dropped(xt)[1], fitted(method(), x[:48], y[:48])(xt)[1])
    subset = DataLoader(TensorDataset(torch.from_numpy(x), torch.from_numpy(y)), batch_size=8,
                        sampler=SubsetRandomSampler(range(30)))
    assert fspace._convert.readable_by_position(subset) is False
    fitted(method(), subset)


@pytest.mark.torch
def test_gfsvi_trains_from_a_loader_reading_its_rows_by_position(monkeypatch):
    """``GFSVI.fit(loader)`` over a map-style data set reads each step's minibatch by position
    (after a pass for the measurement box), never collecting the loader: the posterior of
    ``fit(X, y)`` to the bit, for regression (σ learned) and classification, and the early
    stopping of ``val=(X, y)`` from a validation loader; a corrupt label is the documented error."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset


    rng = np.random.default_rng(5)
    x = rng.uniform(-1, 1, size=(60, 2))
    xv = rng.uniform(-1, 1, size=(20, 2))
    xt = rng.uniform(-1.5, 1.5, size=(6, 2))
    regression = (np.sin(3 * x[:, :1]) + x[:, 1:], np.sin(3 * xv[:, :1]) + xv[:, 1:])
    classes = ((x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 0.3), (xv[:, 0] > 0).astype(np.int64) + (xv[:, 1] > 0.3))

    def collected(*a, **k):
        raise AssertionError("the loader was collected into arrays")

    def loader(x, y, **kw):
        return DataLoader(TensorDataset(torch.from_numpy(x), torch.from_numpy(y)), batch_size=7, **kw)

    for likelihood, (y, yv), q in (("regression", regression, 1), ("classification", classes, 3)):
        state = tanh_mlp(np.random.default_rng(2), [2, 8, q])

        def method(**kw):
            return fspace.GFSVI((state, "tanh"), likelihood, K.Independent(K.RBF(1.0, 0.7), q), measurement_points=10,
                                **{**dict(steps=25, optim={"batch_size": 16}), **kw})

        whole = fitted(method(), x, y)
        with monkeypatch.context() as m:
            _no_collection(m, collected)
            read = fitted(method(), loader(x, y, shuffle=True))
        for a, b in zip(whole(xt), read(xt)):
            np.testing.assert_array_equal(a, b)
        early = dict(steps=60, evaluate_every=5, patience=2)
        held = fitted(method(**early), x, y, val=(xv, yv))
        with monkeypatch.context() as m:
            _no_collection(m, collected)
            streamed = fitted(method(**early), loader(x, y), val=loader(xv, yv))
        assert len(held.report["validation"]) >= 2
        assert (streamed.report["steps"], streamed.report["best_step"]) == (held.report["steps"],
                                                                            held.report["best_step"])
    bad = classes[0].copy()
    bad[11] = 5
    with pytest.raises(ValueError, match="class label"):
        read.fit(loader(x, bad))
    np.testing.assert_array_equal(read(xt), whole(xt))


def test_ella_streams_a_loader_to_the_in_memory_posterior(toy, monkeypatch):
    """``ELLA(..., early_stopping=None).fit(loader)`` adds each batch to ``G``'s ``K × K`` sum in
    Rust (``EllaBatches``) instead of concatenating the loader: a pass gathers the Nyström rows
    at the in-memory fit's positions (after a counting pass when the loader's dataset has no
    length), a second adds the batches; the posterior, the validation grid and λ are
    ``fit(X, y)``'s to rounding, for regression and for a three-class classifier (dict
    batches too). A loader that visits fewer points than its dataset is refused; early stopping
    collects the loader, as before."""

    def collected(*a, **k):
        raise AssertionError("the loader was collected into arrays")

    class Sized(Batches):
        def __init__(self, x, y, size, as_dict=False, dataset=None):
            super().__init__(x, y, size, as_dict)
            self.dataset = x if dataset is None else dataset

    state, x, y = toy
    xt = np.linspace(-2, 2, 9).reshape(-1, 1)

    def regression(**kw):
        return fspace.ELLA((state, "tanh"), "regression", num_points=30, num_eigen=5, sigma_noise=0.1,
                           early_stopping=None, **kw)

    whole = fitted(regression(prior={"Fixed": 1.0}), x, y)
    mean, var = whole(xt)
    for loader, passes in ((Batches(x, y, 7), 3), (Sized(x, y, 7, as_dict=True), 2)):
        with monkeypatch.context() as m:
            _no_collection(m, collected)
            streamed = fitted(regression(prior={"Fixed": 1.0}), loader)
        assert loader.passes == passes
        m2, v2 = streamed(xt)
        np.testing.assert_allclose(m2, mean, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(v2, var, rtol=1e-10)
        assert streamed.report["points_used"] == 50 and streamed.report["num_features"] == 5

    rng = np.random.default_rng(3)
    net = tanh_mlp(rng, [2, 10, 3])
    xc = rng.uniform(-2, 2, size=(90, 2))
    yc = (xc[:, 0] > 0).astype(int) + (xc[:, 1] > 0.5).astype(int)
    xv = rng.uniform(-2, 2, size=(30, 2))
    yv = (xv[:, 0] > 0).astype(int) + (xv[:, 1] > 0.5).astype(int)

    def classifier():
        return fspace.ELLA((net, "tanh"), "classification", num_points=40, num_eigen=6, early_stopping=None)

    memory = fitted(classifier(), xc, yc, val=(xv, yv))
    real = fspace._network_method.data_arrays
    with monkeypatch.context() as m:
        # The validation pair is held (converted as before); the loader is not collected.
        _no_collection(m, lambda *a, **k: real(*a, **k) if a[0] is xv else collected())
        streamed = fitted(classifier(), Sized(xc, yc, 16), val=(xv, yv))
    assert streamed.report["prior_precision"] == memory.report["prior_precision"]
    np.testing.assert_allclose([g[1] for g in streamed.report["grid"]], [g[1] for g in memory.report["grid"]],
                               rtol=1e-10)
    np.testing.assert_allclose(streamed(xv), memory(xv), rtol=1e-10, atol=1e-14)
    # A loader that skips points (drop_last) would draw other Nyström points: refused, and the
    # object keeps its fit.
    with pytest.raises(ValueError, match="visited 80 points but its dataset holds 90"):
        streamed.fit(Sized(xc[:80], yc[:80], 16, dataset=xc))
    np.testing.assert_allclose(streamed(xv), memory(xv), rtol=1e-10, atol=1e-14)
    # Early stopping scores prefixes of a seeded random order of all the data: collected.
    early = fitted(fspace.ELLA((net, "tanh"), "classification", num_points=40, num_eigen=6), Sized(xc, yc, 16),
                   val=(xv, yv))
    np.testing.assert_array_equal(
        early(xv), fitted(fspace.ELLA((net, "tanh"), "classification", num_points=40, num_eigen=6), xc, yc,
                          val=(xv, yv))(xv))

def test_every_method_pickles_with_bit_identical_predictions_and_samples(toy):
    state, x, y = toy
    prior = K.RBF(1.0, 0.5)
    models = [
        fspace.FSPLaplace((state, "tanh"), "regression", prior, sigma_noise=0.1, epochs=5),
        fspace.GFSVI((state, "tanh"), "regression", prior, steps=50, measurement_points=20),
        fspace.VaLLA((state, "tanh"), "regression", steps=50, num_inducing=8, sigma_noise=0.1),
        fspace.ELLA((state, "tanh"), "regression", num_points=30, num_eigen=5, prior={"Fixed": 1.0},
                    early_stopping=None, sigma_noise=0.1),
        fspace.ExactGP(prior, sigma_noise=0.1),
    ]
    xt = np.linspace(-2, 2, 9).reshape(-1, 1)
    for m in models:
        with pytest.raises(RuntimeError, match="fit"):
            m(xt)
        assert m.fit(x, y) is None  # as laplace-torch's fit, for every method
        back = pickle.loads(pickle.dumps(m))
        for a, b in zip(m(xt), back(xt)):
            assert np.array_equal(a, b), type(m).__name__
        s1, s2 = m.predictive_samples(xt, 4, seed=3), back.predictive_samples(xt, 4, seed=3)
        assert s1.shape == (4, 9, 1) and np.array_equal(s1, s2)
        assert not np.array_equal(s1, m.predictive_samples(xt, 4, seed=4))


def test_every_method_has_one_state_dict_meaning_and_a_query_never_changes_it(toy):
    """``state_dict()`` is the posterior (laplace-torch's meaning), restored by
    ``load_state_dict`` into an object built with the same arguments; a pickle is the settings
    plus the same ``state_dict``; queries leave it as it was."""
    state, x, y = toy
    prior = K.RBF(1.0, 0.5)
    makers = {
        "FSPLaplace": lambda lik="regression": fspace.FSPLaplace((state, "tanh"), lik, prior, sigma_noise=0.1, epochs=3),
        "VaLLA": lambda lik="regression": fspace.VaLLA((state, "tanh"), lik, steps=20, num_inducing=6, sigma_noise=0.1),
        "ExactGP": lambda lik="regression": fspace.ExactGP(prior, sigma_noise=0.1),
    }
    xt = np.linspace(-2, 2, 7).reshape(-1, 1)
    for name, make in makers.items():
        m = make()
        m.fit(x, y)
        saved = m.state_dict()
        assert saved["cls_name"] == name and saved["likelihood"] == "regression"
        pickled = pickle.dumps(m)
        m(xt)
        m.predictive_samples(xt, 3, seed=1)
        assert m.state_dict() == saved and pickle.dumps(m) == pickled, name
        fresh = make()
        fresh.load_state_dict(saved)
        for a, b in zip(m(xt), fresh(xt)):
            assert np.array_equal(a, b), name
        assert fresh.report == m.report
    with pytest.raises(ValueError, match="not of a FSPLaplace"):
        makers["FSPLaplace"]().load_state_dict(dict(saved))  # the ExactGP's
    with pytest.raises(ValueError, match="likelihood"):
        fspace.ExactGP(prior).load_state_dict(dict(saved, likelihood="classification"))
    with pytest.raises(ValueError, match="posterior"):
        fspace.ExactGP(prior).load_state_dict(dict(saved, fspace_posterior="{}"))


def test_arguments_cross_to_rust_by_keyword():
    """Every compiled entry point of more than one argument takes keywords only (no positional
    multi-argument calls, no settings as JSON text)."""
    from fspace import _fspace

    calls = [getattr(_fspace, n) for n in ("gram", "rkhs_norm", "regularized_kl", "gfsvi_objective",
                                           "classification_sums", "classification_metrics", "regression_sums",
                                           "ood_metrics")]
    methods = [_fspace.FspLaplace, _fspace.FspLaplacePosthoc, _fspace.Gfsvi, _fspace.Valla, _fspace.Ella,
               _fspace.ExactGp]
    for call in calls + [_fspace.Laplace] + methods + [m.fit for m in methods]:
        signature = call.__text_signature__
        assert "*," in signature, (call, signature)
    assert isinstance(fspace.default_config("valla"), dict)


def test_the_package_has_no_import_cycle():
    """The modules of ``fspace`` import one another (at the top or inside a function) without a
    cycle: each layer only uses the ones below it."""
    import ast
    import pathlib

    root = pathlib.Path(fspace.__file__).parent
    graph = {}
    for path in root.glob("*.py"):
        tree = ast.parse(path.read_text())
        graph[path.stem] = {
            (node.module or "").split(".")[0] or alias.name
            for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level == 1
            for alias in node.names
        } - {"_fspace"}
    seen, done = set(), set()

    def visit(module, trail):
        assert module not in seen or module in done, f"import cycle: {' -> '.join(trail + [module])}"
        if module in done:
            return
        seen.add(module)
        for dep in sorted(graph.get(module, ())):
            visit(dep, trail + [module])
        done.add(module)

    for module in sorted(graph):
        visit(module, [])


def test_classification_methods_give_probabilities():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(60, 2))
    labels = (x[:, 0] * x[:, 1] > 0).astype(float)
    state = tanh_mlp(rng, [2, 8, 2])
    prior = fspace.GPPrior(K.Independent(K.RBF(1.0, 1.0), 2))
    for m in [
        fspace.FSPLaplace((state, "tanh"), "classification", prior, epochs=5, n_laplace_context=36),
        fspace.GFSVI((state, "tanh"), "classification", prior, steps=30, measurement_points=20),
        fspace.VaLLA((state, "tanh"), "classification", steps=30, num_inducing=8),
    ]:
        m.fit(x, labels)
        for link in ["probit", "bridge", "mc"]:
            p = m(x[:7], link_approx=link, n_samples=64)
            assert p.shape == (7, 2)
            np.testing.assert_allclose(p.sum(axis=1), 1.0, rtol=1e-12)


def test_progress_reports_every_evaluation_and_a_raising_callback_surfaces(toy, capsys):
    state, x, y = toy
    seen = []
    m = fspace.FSPLaplace((state, "tanh"), "regression", K.RBF(), sigma_noise=0.1, epochs=12, batch_size=25)
    m.fit(x, y, progress=lambda step, total, loss, val: seen.append((step, total, loss, val)))
    assert [s[0] for s in seen] == list(range(1, 13)) and all(s[1] == 12 for s in seen)
    assert all(np.isfinite(s[2]) and s[3] is None for s in seen)

    def boom(*_):
        raise KeyError("stop")

    with pytest.raises(KeyError, match="stop"):
        m.fit(x, y, progress=boom)
    v = fspace.VaLLA((state, "tanh"), "regression", steps=200, num_inducing=8, evaluate_every=50, sigma_noise=0.1)
    v.fit(x, y, val=(x[:10], y[:10]), progress=True)
    err = capsys.readouterr().err
    if "it/s" not in err and "step/s" not in err:  # no tqdm: a line per report
        assert err.count("VaLLA:") == 4, err
    # laplace-torch's name for it.
    v.fit(x, y, val=(x[:10], y[:10]), progress_bar=True)
    err = capsys.readouterr().err
    assert "VaLLA" in err, err


def test_settings_overlay_the_papers_defaults_and_unknown_names_are_refused():
    d = fspace.default_config("fsp_laplace")
    assert d["schedule"]["length"] == {"Epochs": 5000} and d["n_context"] == 100 and d["laplace"]["max_rank"] == 500
    assert fspace.default_config("valla")["schedule"]["patience"] == 1
    state = tanh_mlp(np.random.default_rng(0), [1, 4, 1])
    with pytest.raises(TypeError, match="n_context"):
        fspace.FSPLaplace((state, "tanh"), "regression", K.RBF(), n_contexts=10)
    with pytest.raises(TypeError, match="max_rank"):
        fspace.FSPLaplace((state, "tanh"), "regression", K.RBF(), laplace={"max_ranks": 10})


def test_the_gil_is_free_during_fit_and_concurrent_fits_equal_sequential_ones():
    """While one thread fits, another keeps running Python; two fits on two threads give the
    sequential fits' numbers. (Two threads are not asserted faster than one: one fit already
    uses every core through rayon.) Sixty epochs keep one fit near 0.2 s on two cores, well above
    the 0.05 s floor below (three epochs can finish in 0.046 s on a faster machine)."""
    rng = np.random.default_rng(4)
    x = rng.uniform(-1, 1, size=(1500, 2))
    y = np.sin(x.sum(axis=1, keepdims=True))
    state = tanh_mlp(rng, [2, 32, 32, 1])
    xt = rng.uniform(-2, 2, size=(20, 2))

    def one(out=None):
        m = fitted(fspace.FSPLaplace((state, "tanh"), "regression", K.RBF(1.0, 0.5), sigma_noise=0.1, epochs=60,
                              n_laplace_context=100), x, y)
        if out is not None:
            out.append(m(xt))
        return m(xt)

    sequential = one()
    ticks, done = [], threading.Event()

    def tick():
        while not done.is_set():
            ticks.append(time.perf_counter())
            time.sleep(0.001)

    t = threading.Thread(target=tick)
    t.start()
    start = time.perf_counter()
    one()
    elapsed = time.perf_counter() - start
    done.set()
    t.join()
    assert elapsed > 0.05, "the fit is too short to tell"
    assert sum(start < s < start + elapsed for s in ticks) >= 10
    results: list = []
    threads = [threading.Thread(target=one, args=(results,)) for _ in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert len(results) == 2
    for mean, var in results:
        assert np.array_equal(mean, sequential[0]) and np.array_equal(var, sequential[1])


STATE = tanh_mlp(np.random.default_rng(9), [1, 6, 1])
X = np.linspace(-1, 1, 20).reshape(-1, 1)
Y = np.sin(3 * X)
NET = (STATE, "tanh")


def fit_gp(kernel, x=X, y=Y, sigma=0.1):
    return fitted(fspace.ExactGP(kernel, sigma_noise=sigma), x, y)


# (what, call, exception): every call must raise exactly the documented class.
BAD_METHOD_CALLS = [
    ("negative kernel variance", lambda: fit_gp(K.RBF(-1.0, 1.0)), ValueError,
     'RBF: invalid hyperparameter variance = -1.0: must be finite and > 0'),
    ("zero lengthscale", lambda: fit_gp(K.RBF(1.0, 0.0)), ValueError,
     'lengthscale = 0'),
    ("NaN lengthscale", lambda: fit_gp(K.Matern52(1.0, float("nan"))), ValueError,
     'lengthscale = NaN'),
    ("zero period", lambda: fit_gp(K.Periodic(1.0, 1.0, 0.0)), ValueError,
     'period = 0'),
    ("negative RQ alpha", lambda: fit_gp(K.RationalQuadratic(1.0, 1.0, -2.0)), ValueError,
     'alpha = -2'),
    ("ARD lengthscales vs input width", lambda: fit_gp(K.RBF(1.0, [1.0, 2.0])), ValueError,
     'kernel input dimension: expected 2, found 1'),
    ("zero GP noise", lambda: fit_gp(K.RBF(), sigma=0.0), ValueError,
     'noise σ: 0 must be > 0'),
    ("GP targets with NaN", lambda: fit_gp(K.RBF(), y=np.full_like(Y, np.nan)), ValueError,
     'non-finite value in training targets'),
    ("GP rows mismatch", lambda: fit_gp(K.RBF(), y=Y[:5]), ValueError,
     'training targets .* expected 20, found 5'),
    ("Helmholtz on 1-D inputs", lambda: fit_gp(K.Helmholtz(K.RBF(), K.RBF()), y=np.hstack([Y, Y])), ValueError,
     'kernel input dimension: expected 2, found 1'),
    ("Independent with zero outputs", lambda: fit_gp(K.Independent(K.RBF(), 0)), ValueError,
     'outputs = 0 must be a whole number'),
    ("kernel plus a number", lambda: K.RBF() + 3.0, TypeError,
     'unsupported operand'),
    ("a prior that is not a kernel", lambda: fspace.GPPrior("rbf"), TypeError,
     'GPPrior needs a fspace.kernels kernel'),
    ("FSPLaplace without a prior", lambda: fspace.FSPLaplace(NET, "regression", None), TypeError,
     'FSPLaplace needs a prior'),
    ("unknown setting", lambda: fspace.FSPLaplace(NET, "regression", K.RBF(), n_contexts=5), TypeError,
     "no setting 'n_contexts'"),
    ("epochs and steps", lambda: fspace.FSPLaplace(NET, "regression", K.RBF(), epochs=3, steps=3), ValueError,
     'epochs or steps, not both'),
    ("zero batch size", lambda: fitted(fspace.FSPLaplace(NET, "regression", K.RBF(), batch_size=0, epochs=2), X, Y), ValueError,
     'batch_size: must be ≥ 1'),
    ("negative learning rate", lambda: fitted(fspace.FSPLaplace(NET, "regression", K.RBF(), learning_rate=-1.0, epochs=2), X, Y), ValueError,
     'learning_rate: -1'),
    ("unknown context design", lambda: fitted(fspace.FSPLaplace(NET, "regression", K.RBF(), design="Spiral", epochs=2), X, Y), ValueError,
     'unknown variant `Spiral`'),
    ("zero Laplace context points", lambda: fitted(fspace.FSPLaplace(NET, "regression", K.RBF(), n_laplace_context=0, epochs=2), X, Y), ValueError,
     'n = 0 points'),
    ("two-output prior for one output", lambda: fitted(fspace.FSPLaplace(NET, "regression", K.Independent(K.RBF(), 2), epochs=2), X, Y), ValueError,
     'prior outputs vs. network outputs: expected 1, found 2'),
    ("inverted context box", lambda: fitted(fspace.FSPLaplace(NET, "regression", K.RBF(), context_box={"lower": [1.0], "upper": [-1.0]}, epochs=2), X, Y), ValueError,
     'inverted box in dimension 0'),
    ("inverted context box, post hoc", lambda: fitted(fspace.FSPLaplace(NET, "regression", K.RBF(), train=False, context_box={"lower": [1.0], "upper": [-1.0]}), X, Y), ValueError,
     'inverted box in dimension 0'),
    ("inverted measurement box", lambda: fitted(fspace.GFSVI(NET, "regression", K.RBF(), measurement_box={"lower": [1.0], "upper": [-1.0]}, steps=2), X, Y), ValueError,
     'inverted box in dimension 0'),
    ("FSP inputs with NaN", lambda: fitted(fspace.FSPLaplace(NET, "regression", K.RBF(), epochs=2), np.full_like(X, np.nan), Y), ValueError,
     'non-finite value in training inputs'),
    ("classification with one output", lambda: fitted(fspace.FSPLaplace(NET, "classification", K.RBF(), epochs=2), X, Y), ValueError,
     'one output per class'),
    ("unknown likelihood", lambda: fitted(fspace.GFSVI(NET, "poisson", K.RBF(), steps=2), X, Y), ValueError,
     '"poisson" is not "regression" or "classification"'),
    ("negative gamma", lambda: fitted(fspace.GFSVI(NET, "regression", K.RBF(), gamma=-1.0, steps=2), X, Y), ValueError,
     'regulariser γ: -1'),
    ("zero measurement points", lambda: fitted(fspace.GFSVI(NET, "regression", K.RBF(), measurement_points=0, steps=2), X, Y), ValueError,
     'measurement points M: must be ≥ 1'),
    ("more inducing points than data", lambda: fitted(fspace.VaLLA(NET, "regression", num_inducing=50, steps=2), X, Y), ValueError,
     '50 points requested but the data has only 20'),
    ("patience without validation data", lambda: fitted(fspace.VaLLA(NET, "regression", patience=3, steps=2), X, Y), ValueError,
     'validation data .early stopping needs it'),
    ("ELLA with more features than points", lambda: fitted(fspace.ELLA(NET, "regression", num_points=10, num_eigen=12, prior={"Fixed": 1.0}, early_stopping=None), X, Y), ValueError,
     '12 points requested but the data has only 10'),
    ("ELLA's validated prior without validation data", lambda: fitted(fspace.ELLA(NET, "regression", num_points=10, num_eigen=4), X, Y), ValueError,
     "validation data .ELLA's prior precision"),
    ("sampled predictive of a linearised method", lambda: fit_gp(K.RBF())(X, pred_type="nn"), ValueError,
     'linearised ."glm". predictive only'),
    ("unknown link", lambda: fitted(fspace.VaLLA((tanh_mlp(np.random.default_rng(1), [1, 4, 2]), "tanh"), "classification", steps=2, num_inducing=4), X, (X[:, 0] > 0).astype(float))(X, link_approx="sigmoid"), ValueError,
     '"sigmoid" is not "probit", "bridge" or "mc"'),
    ("a saved posterior of another method", lambda: fspace._fspace.Valla.load_posterior(fit_gp(K.RBF())._post.to_json()), ValueError,
     'the file holds an ExactGP posterior, not a VaLLA posterior'),
    ("an unknown method", lambda: fspace.default_config("svgp"), ValueError,
     "method 'svgp' is not one of"),
    ("prediction inputs of the wrong width", lambda: fit_gp(K.RBF())(np.zeros((3, 2))), ValueError,
     'expected 1, found 2'),
    ("inputs whose squares overflow", lambda: fit_gp(K.RBF(), x=X * 1e300), ValueError,
     r'training inputs: -1e300 .entry 0, column-major. is beyond ±1e150'),
    ("a noise whose precision overflows", lambda: fspace.ExactGP(K.RBF(), sigma_noise=1e-300), ValueError,
     r'Gaussian noise σ: 1e-300 is outside \[1e-150, 1e150\]'),
    ("a negative number of draws", lambda: fit_gp(K.RBF()).predictive_samples(X, -1), ValueError,
     'n_samples -1 must be a whole number ≥ 1'),
    ("no Monte Carlo draw", lambda: fitted(fspace.VaLLA((tanh_mlp(np.random.default_rng(1), [1, 4, 2]), "tanh"), "classification", steps=2, num_inducing=4), X, (X[:, 0] > 0).astype(float))(X, link_approx="mc", n_samples=0), ValueError,
     'n_samples 0 must be a whole number ≥ 1'),
]


@pytest.mark.parametrize("what,call,error,message", BAD_METHOD_CALLS, ids=[b[0] for b in BAD_METHOD_CALLS])
def test_bad_input_raises_the_documented_exception(what, call, error, message):
    with pytest.raises(error, match=message) as info:
        call()
    assert type(info.value) is error or issubclass(type(info.value), error)
    # No Rust type path in a Python message.
    assert not re.search(r"\bfspace_\w+::", str(info.value)), str(info.value)
    assert str(info.value), f"{what}: the exception has no message"


def test_a_wide_network_on_a_batch_with_a_thin_last_block_runs_in_a_subprocess():
    """GFSVI on a 20-128-128-10 MLP with 20 measurement points: the forward pass's 20 × 128
    product was split over two threads into blocks of 16 and 4 rows, and nalgebra's loop for
    the 4-row block wrote past the output (heap corruption, the interpreter aborted). Run in a
    subprocess so that a regression fails the test instead of the suite."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent("""
        import numpy as np, fspace
        rng = np.random.default_rng(0)
        sizes = [20, 128, 128, 10]
        state = {}
        for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
            state[f"{2 * i}.weight"] = rng.normal(size=(b, a)) / np.sqrt(a)
            state[f"{2 * i}.bias"] = np.zeros(b)
        x, y = rng.uniform(size=(300, 20)), rng.integers(10, size=300).astype(float)
        prior = fspace.kernels.Independent(fspace.kernels.RBF(1.0, 10.0), 10)
        method = fspace.GFSVI((state, "tanh"), "classification", prior, steps=3, measurement_points=20,
                              class_samples=2, optim={"batch_size": 64})
        method.fit(x, y)
        print("FIT_OK", method(x[:21]).shape)
    """)
    env = dict(__import__("os").environ, RAYON_NUM_THREADS="2")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0 and "FIT_OK" in run.stdout, run.stdout[-2000:] + run.stderr[-2000:]
