"""The Python layer against independent numbers: a dense GGN Laplace in numpy, pickling,
error classes, and the GIL released during fit. ``fspace.Laplace`` follows laplace-torch's API,
whose hyperparameters and results are torch tensors, so its tests are marked ``torch`` (skipped
where torch is not installed); the loader-gathering test runs without it."""

import pickle
import threading
import time

import numpy as np
import pytest

import fspace
from mlp_reference import forward, tanh_mlp


def jacobian(state, x, eps=1e-6):
    """∂f/∂θ (n × p) by central differences, θ in state order (weights row-major, then bias)."""
    names = list(state)
    theta = np.concatenate([state[k].ravel() for k in names])

    def f(t):
        s, o = {}, 0
        for k in names:
            s[k] = t[o:o + state[k].size].reshape(state[k].shape)
            o += state[k].size
        return forward(s, x)[:, 0]

    cols = []
    for j in range(theta.size):
        e = np.zeros_like(theta)
        e[j] = eps
        cols.append((f(theta + e) - f(theta - e)) / (2 * eps))
    return np.stack(cols, axis=1)


@pytest.fixture
def toy():
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, size=(40, 1))
    y = np.sin(3 * x) + 0.1 * rng.normal(size=x.shape)
    state = tanh_mlp(rng, [1, 8, 1])
    return state, x, y


@pytest.mark.torch
def test_full_glm_predictive_equals_a_dense_numpy_laplace(toy):
    state, x, y = toy
    sigma, lam = 0.1, 2.0
    la = fspace.Laplace((state, "tanh"), "regression", subset_of_weights="all", hessian_structure="full",
                        prior_precision=lam, sigma_noise=sigma)
    la.fit(x, y)
    xt = np.linspace(-2, 2, 7).reshape(-1, 1)
    mean, var = (np.asarray(t) for t in la(xt))
    var = var[:, :, 0]
    # Independent: GGN = Jᵀ J / σ² + λ I, f-variance = J* Σ J*ᵀ.
    j = jacobian(state, x)
    precision = j.T @ j / sigma**2 + lam * np.eye(j.shape[1])
    jt = jacobian(state, xt)
    want = np.einsum("ip,pq,iq->i", jt, np.linalg.inv(precision), jt)
    np.testing.assert_allclose(mean[:, 0], forward(state, xt)[:, 0], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(var[:, 0], want, rtol=1e-6)
    # The evidence: log p(y | θ) + log p(θ) + p/2 log 2π − ½ log|P|.
    r = y[:, 0] - forward(state, x)[:, 0]
    theta = np.concatenate([v.ravel() for v in state.values()])
    p = theta.size
    loglik = -0.5 * np.sum(r**2) / sigma**2 - x.shape[0] * np.log(sigma * np.sqrt(2 * np.pi))
    logprior = -0.5 * lam * theta @ theta + 0.5 * p * np.log(lam / (2 * np.pi))
    lml = loglik + logprior + 0.5 * p * np.log(2 * np.pi) - 0.5 * np.linalg.slogdet(precision)[1]
    assert float(la.log_marginal_likelihood()) == pytest.approx(lml, rel=1e-8)


@pytest.mark.torch
def test_marglik_and_gridsearch_choose_a_prior_precision(toy):
    state, x, y = toy
    import torch

    la = fspace.Laplace((state, "tanh"), "regression", "all", "kron", 0.1)
    la.fit(x, y)
    before = float(la.log_marginal_likelihood())
    assert la.optimize_prior_precision("glm", "marglik") is None
    lam = float(la.prior_precision)
    assert lam > 0 and float(la.log_marginal_likelihood()) >= before - 1e-9
    # At the optimum the evidence's derivative in log λ is ≈ 0 (100 Adam steps).
    log_lam = torch.tensor(np.log(lam), requires_grad=True, dtype=torch.float64)
    la.log_marginal_likelihood(log_lam.exp()).backward()
    assert abs(float(log_lam.grad)) < 1e-2
    val = [(torch.as_tensor(x), torch.as_tensor(y))]
    la.optimize_prior_precision(method="gridsearch", val_loader=val, log_prior_prec_min=-2, log_prior_prec_max=1, grid_size=4,
                                loss=lambda m, v, t: float(((m - t) ** 2 / (v[:, :, 0] + 0.01) + torch.log(v[:, :, 0] + 0.01)).mean()))
    assert float(la.prior_precision) == pytest.approx(min((0.01, 0.1, 1.0, 10.0), key=lambda v: abs(v - float(la.prior_precision))), rel=1e-6)


@pytest.mark.torch
def test_classification_probabilities_sum_to_one_for_every_link():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(60, 2))
    labels = (x[:, 0] > 0).astype(float) + (x[:, 1] > 0)
    state = tanh_mlp(rng, [2, 6, 3])
    la = fspace.Laplace((state, "tanh"), "classification", "all", hessian_structure="diag")
    la.fit(x, labels)
    for link in ["probit", "bridge", "bridge_norm", "mc"]:
        p = np.asarray(la(x[:5], link_approx=link, n_samples=200))
        assert p.shape == (5, 3)
        np.testing.assert_allclose(p.sum(axis=1), 1.0, rtol=1e-12)
    nn = np.asarray(la(x[:5], pred_type="nn", link_approx="mc", n_samples=50))
    np.testing.assert_allclose(nn.sum(axis=1), 1.0, rtol=1e-12)
    assert la.sample(4).shape == (4, sum(v.size for v in state.values()))


@pytest.mark.torch
def test_pickle_round_trip_gives_bit_identical_predictions(toy):
    state, x, y = toy
    la = fspace.Laplace((state, "tanh"), "regression", sigma_noise=0.1, prior_precision=3.0)
    la.fit(x, y)
    back = pickle.loads(pickle.dumps(la))
    xt = np.linspace(-3, 3, 11).reshape(-1, 1)
    for a, b in zip(la(xt), back(xt)):
        assert np.array_equal(np.asarray(a), np.asarray(b))
    assert float(back.log_marginal_likelihood()) == float(la.log_marginal_likelihood())
    assert float(back.prior_precision) == 3.0 and float(back.sigma_noise) == 0.1


@pytest.mark.torch
@pytest.mark.parametrize("settings", [
    dict(subset_of_weights="all", hessian_structure="kron", kron_bias="separate"),
    dict(subset_of_weights="last_layer", hessian_structure="kron", kron_bias="separate"),
    dict(subset_of_weights="last_layer", hessian_structure="full"),
    dict(subset_of_weights="all", hessian_structure="lowrank", rank=5),
], ids=lambda d: "-".join(str(v) for v in d.values()))
def test_a_loaded_laplace_refits_under_its_own_settings(toy, settings):
    """After pickling (or ``load_state_dict`` into an object built with the same arguments) a
    refit uses the object's settings — the structure's options and the subset of weights — and
    gives the posterior of the first fit, bit for bit."""
    state, x, y = toy
    x2 = np.linspace(-1.2, 1.2, 30).reshape(-1, 1)
    y2 = np.cos(2 * x2)
    la = fspace.Laplace((state, "tanh"), "regression", sigma_noise=0.1, prior_precision=3.0, **settings)
    la.fit(x2, y2)
    la.fit(x, y)
    fresh = fspace.Laplace((state, "tanh"), "regression", sigma_noise=0.1, prior_precision=3.0, **settings)
    fresh.fit(x2, y2)
    fresh.load_state_dict(la.state_dict())
    xt = np.linspace(-3, 3, 11).reshape(-1, 1)
    for back in (pickle.loads(pickle.dumps(la)), fresh):
        back.fit(x2, y2)
        assert back.report["dim"] == la.report["dim"]
        reference = fspace.Laplace((state, "tanh"), "regression", sigma_noise=0.1, prior_precision=3.0, **settings)
        reference.fit(x2, y2)
        for a, b in zip(reference(xt), back(xt)):
            assert np.array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.torch
@pytest.mark.parametrize("structure", ["full", "kron", "diag", "lowrank"])
def test_queries_never_write_to_the_fitted_object(toy, structure):
    """λ, σ and the temperature are arguments of Rust's queries: the predictive, draws, the
    evidence and state_dict at a new λ leave the compiled object as the fit left it, and give
    what a fresh object fitted at that λ gives."""
    state, x, y = toy
    kwargs = dict(subset_of_weights="all", hessian_structure=structure, sigma_noise=0.1)
    if structure == "lowrank":
        kwargs["rank"] = 5
    la = fspace.Laplace((state, "tanh"), "regression", prior_precision=1.0, **kwargs)
    la.fit(x, y)
    held = la._la.to_json()
    la.prior_precision = 4.0
    la.temperature = 0.5
    xt = np.linspace(-2, 2, 5).reshape(-1, 1)
    queried = [la(xt), la(xt, joint=True), la.predictive_samples(xt, n_samples=3),
               la.sample(3, generator=__import__("torch").Generator().manual_seed(1)), la.log_marginal_likelihood()]
    saved = la.state_dict()
    assert la._la.to_json() == held, "a query wrote λ or T into the compiled object"
    fresh = fspace.Laplace((state, "tanh"), "regression", prior_precision=4.0, temperature=0.5, **kwargs)
    fresh.fit(x, y)
    for a, b in zip(la(xt), fresh(xt)):
        assert np.array_equal(np.asarray(a), np.asarray(b))
    assert float(la.log_marginal_likelihood()) == float(fresh.log_marginal_likelihood())
    # The saved posterior holds the λ and T it was saved at, as Rust reads it back (all but the
    # fit's timings).
    import json

    def payload(text):
        p = json.loads(text)["payload"]
        p.pop("report")
        return p

    assert payload(saved["fspace_posterior"]) == payload(fresh.state_dict()["fspace_posterior"])
    assert len(queried) == 5


@pytest.mark.torch
def test_a_tampered_saved_posterior_is_refused_when_loaded(toy):
    """A Kronecker eigenvector entry of −1e308 and a network weight of 1e308 pass a finiteness
    check; fspace refuses both when the state is loaded (the columns of an orthonormal basis
    have no entry above 1; a weight whose square overflows makes every product overflow), as
    a pickle holding them is refused when unpickled — never served as infinite or zero
    variances."""
    import json

    state, x, y = toy
    la = fspace.Laplace((state, "tanh"), "regression", "all", "kron", sigma_noise=0.1)
    la.fit(x, y)
    def eigenvector_entry(payload):
        payload["curvature"]["Kron"]["layers"][0]["g_vectors"][0][0] = -1e308  # [data, rows, cols]

    def weight(payload):
        payload["net"]["Mlp"]["params"][3] = 1e308

    for tamper, field in [(eigenvector_entry, "g_vectors"), (weight, "weight 3")]:
        saved = la.state_dict()
        doc = json.loads(saved["fspace_posterior"])
        tamper(doc["payload"])
        saved["fspace_posterior"] = json.dumps(doc)
        fresh = fspace.Laplace((state, "tanh"), "regression", "all", "kron", sigma_noise=0.1)
        with pytest.raises(ValueError, match=field):
            fresh.load_state_dict(saved)


BAD = [
    (lambda s: fspace.Laplace((s, "swish"), "regression"), ValueError, 'activation "swish" is not supported'),
    (lambda s: fspace.Laplace((s, "tanh"), "poisson"), ValueError, "Invalid likelihood type 'poisson'"),
    (lambda s: fspace.Laplace((s, "tanh"), "regression", hessian_structure="kronecker"), ValueError, "'kronecker' is not one of"),
    (lambda s: fspace.Laplace((s, "tanh"), "regression", subset_of_weights="subnetwork"), ValueError, 'Subnetwork Laplace requires'),
    (lambda s: fspace.Laplace((s, "tanh"), "regression", prior_precision=-1.0), ValueError, 'prior_precision \\[-1.0\\] must be finite and > 0'),
    (lambda s: fspace.Laplace((s, "tanh"), "regression", prior_precision=float("nan")), ValueError, 'prior_precision \\[nan\\]'),
    (lambda s: fspace.Laplace((s, "tanh"), "regression", sigma_noise=0.0), ValueError, 'sigma_noise 0.0 must be'),
    (lambda s: fspace.Laplace((s, "tanh"), "regression", temperature=0.0), ValueError, 'temperature 0.0 must be'),
    (lambda s: fspace.Laplace((s, "tanh"), "classification"), ValueError, 'one output per class'),  # one output
    (lambda s: fspace.Laplace(({**s, "0.weight": np.zeros((5, 1))}, "tanh"), "regression"), ValueError, '`2.weight` takes 8 inputs'),
    (lambda s: fspace.Laplace(({**s, "9.weight": np.zeros((1, 1))}, "tanh"), "regression"), ValueError, '`9.bias` is missing'),
    (lambda s: fspace.Laplace(({k: v.astype(np.int64) for k, v in s.items()}, "tanh"), "regression"), ValueError, 'dtype int64'),
    (lambda s: fspace.Laplace(object(), "regression"), TypeError, 'not an nn.Sequential'),
    (lambda s: fspace.Laplace((s, "tanh"), "regression", kron_bias="both"), ValueError, 'kron_bias "both"'),
    # Counts are whole numbers ≥ 1, named (not pyo3's OverflowError at the boundary).
    (lambda s: fspace.Laplace((s, "tanh"), "regression", "all", "lowrank", rank=-1), ValueError, 'rank must be ≥ 1 .a whole number., got -1'),
    (lambda s: fspace.Laplace((s, "tanh"), "regression", "all", "lowrank", rank=float("nan")), ValueError, 'rank must be ≥ 1 .a whole number., got nan'),
    (lambda s: fspace.Laplace((s, "tanh"), "regression", "all", "lowrank", max_basis=-2), ValueError, 'max_basis must be ≥ 1 .a whole number., got -2'),
    (lambda s: fspace.Laplace((s, "tanh"), "regression", chunk_points=-1), ValueError, 'chunk_points must be ≥ 1 .a whole number., got -1'),
    # A σ whose square or precision leaves float64, inputs whose squares overflow: named, not
    # "non-finite value in eigh input" from inside the fit.
    (lambda s: fspace.Laplace((s, "tanh"), "regression", sigma_noise=1e-300), ValueError, 'sigma_noise 1e-300 is outside'),
    (lambda s: fspace.Laplace((s, "tanh"), "regression", sigma_noise=1e300), ValueError, 'sigma_noise 1e.300 is outside'),
    (lambda s: fspace.Laplace((s, "tanh"), "regression", "all", "kron").fit(np.full((3, 1), 1e300), np.zeros((3, 1))),
     ValueError, 'training inputs: 1e300 .entry 0, column-major. is beyond'),
    # A prior precision whose length fits no layout over all weights: refused when made, as laplace-torch does.
    (lambda s: fspace.Laplace((s, "tanh"), "regression", "all", "kron", prior_precision=__import__("torch").ones(49)), ValueError, 'does not align with architecture'),
]


@pytest.mark.torch
@pytest.mark.parametrize("make,error,message", BAD)
def test_bad_construction_raises_the_documented_exception(toy, make, error, message):
    """The documented exception, with a message naming the problem (a regular expression)."""
    state, _, _ = toy
    with pytest.raises(error, match=message):
        make(state)


@pytest.mark.torch
def test_bad_data_and_calls_raise_the_documented_exception(toy):
    state, x, y = toy
    la = fspace.Laplace((state, "tanh"), "regression")
    with pytest.raises(AttributeError, match="fit"):  # laplace-torch's "Laplace not fitted"
        la(x)
    with pytest.raises(AttributeError, match="fit"):
        la.log_marginal_likelihood()
    bad_inputs = [
        (x, y[:10]),  # row mismatch
        (np.hstack([x, x]), y),  # input width
        (x, np.hstack([y, y])),  # output width
        (np.full_like(x, np.nan), y),
        (x, np.full_like(y, np.inf)),
        (np.zeros((0, 1)), np.zeros((0, 1))),
        (np.zeros((2, 2, 2)), y),
    ]
    for bx, by in bad_inputs:
        with pytest.raises(ValueError):
            la.fit(bx, by)
    la.fit(x, y)
    with pytest.raises(ValueError):
        la(np.hstack([x, x]))
    with pytest.raises(ValueError):
        la(x, pred_type="laplace")
    with pytest.raises(ValueError):
        la(x, link_approx="sigmoid")
    with pytest.raises(ValueError):
        la.optimize_prior_precision("gridsearch")
    with pytest.raises(ValueError):
        la.optimize_prior_precision("evidence")
    clf = fspace.Laplace((tanh_mlp(np.random.default_rng(3), [1, 4, 2]), "tanh"), "classification")
    with pytest.raises(ValueError):
        clf.fit(x, np.full(40, 2.5))  # not a class label
    with pytest.raises(ValueError):
        fspace._fspace.Laplace.from_json("{}")
    with pytest.raises(ValueError, match="n_samples -1 must be a whole number ≥ 1"):
        la.predictive_samples(x, n_samples=-1)
    clf.fit(x, (x[:, 0] > 0).astype(np.int64))
    with pytest.raises(ValueError, match="n_samples 0 must be a whole number ≥ 1"):
        clf(x, link_approx="mc", n_samples=0)  # laplace-torch: NaN probabilities


@pytest.mark.torch
def test_fit_reports_each_pass_over_the_data_and_a_raising_callback_surfaces(toy, capsys):
    state, x, y = toy  # 40 points; fspace's chunks hold 256, so one report per pass
    for structure, passes in [("diag", 1), ("full", 1), ("kron", 1), ("ekfac", 2)]:
        seen = []
        la = fspace.Laplace((state, "tanh"), "regression", "all", structure, sigma_noise=0.1)
        la.fit(x, y, progress=lambda *report: seen.append(report))
        assert seen == [(40, 40, None, None)] * passes, structure
        plain = fspace.Laplace((state, "tanh"), "regression", "all", structure, sigma_noise=0.1)
        plain.fit(x, y)
        xt = np.linspace(-2, 2, 5).reshape(-1, 1)
        np.testing.assert_array_equal(la(xt)[1], plain(xt)[1])
    seen = []
    la = fspace.Laplace((state, "tanh"), "regression", "all", "lowrank", sigma_noise=0.1)
    la.fit(x, y, progress=lambda *report: seen.append(report))
    assert len(seen) >= 2 and set(seen) == {(40, 40, None, None)}

    def boom(*_):
        raise KeyError("stop")

    with pytest.raises(KeyError, match="stop"):
        la.fit(x, y, progress=boom)
    la.fit(x, y, progress_bar=True)
    err = capsys.readouterr().err
    if "it/s" not in err and "point/s" not in err:  # no tqdm: a line per report
        assert err.count("Laplace:") == len(seen), err


@pytest.mark.torch
def test_the_fit_report_says_what_lowrank_lanczos_did(toy):
    state, x, y = toy
    la = fspace.Laplace((state, "tanh"), "regression", "all", "lowrank", rank=3, sigma_noise=0.1)
    assert la.report == {}
    seen = []
    la.fit(x, y, progress=lambda *r: seen.append(r))
    r = la.report
    # A pass of progress reports per GGN product (the projected start and each Lanczos step),
    # besides the pass that caches the layer statistics.
    assert r["rank"] == 3 and 3 <= r["lanczos_iterations"] < len(seen)
    assert 0.0 <= r["max_ritz_residual"] <= 1e-8 and r["dim"] == la.sample(1).shape[1] and r["seconds"] > 0
    assert pickle.loads(pickle.dumps(la)).report == r


@pytest.mark.torch
def test_fit_releases_the_gil():
    """While one thread fits, another thread keeps running Python (it could not if the GIL
    were held for the whole fit)."""
    rng = np.random.default_rng(5)
    x = rng.uniform(-1, 1, size=(100000, 4))  # ≈ 0.4 s here: well above the 0.05 s floor
    y = np.sin(x.sum(axis=1, keepdims=True))
    la = fspace.Laplace((tanh_mlp(rng, [4, 32, 32, 1]), "tanh"), "regression", hessian_structure="kron", sigma_noise=0.1)
    ticks = []
    done = threading.Event()

    def tick():
        while not done.is_set():
            ticks.append(time.perf_counter())
            time.sleep(0.001)

    t = threading.Thread(target=tick)
    t.start()
    start = time.perf_counter()
    la.fit(x, y)
    elapsed = time.perf_counter() - start
    done.set()
    t.join()
    during = [s for s in ticks if start < s < start + elapsed]
    assert elapsed > 0.05, "the fit is too short to tell"
    assert len(during) >= 10, f"{len(during)} ticks during a {elapsed:.3f} s fit"




def test_an_nn_sequential_converts_and_its_mean_is_torchs_forward():
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(2, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3)).double()
    x = torch.randn(20, 2, dtype=torch.float64)
    labels = torch.randint(0, 3, (20,)).double()
    la = fspace.Laplace(model, "regression", sigma_noise=0.5)
    la.fit(x, torch.randn(20, 3, dtype=torch.float64))
    mean, _ = la(x)
    assert isinstance(mean, torch.Tensor)
    assert torch.max(torch.abs(mean - model(x))).item() <= 1e-12
    clf = fspace.Laplace(model, "classification")
    clf.fit(x, labels)
    with pytest.raises(TypeError, match="BatchNorm"):
        fspace.Laplace(torch.nn.Sequential(torch.nn.Linear(2, 4), torch.nn.BatchNorm1d(4)), "regression", backend="native")
    with pytest.raises(ValueError, match="one activation"):
        fspace.Laplace(torch.nn.Sequential(torch.nn.Linear(2, 4), torch.nn.Tanh(), torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1)), "regression", backend="native")


def test_the_readme_python_quickstart_runs_as_printed():
    """The README's Python quickstart (the guide's pages run in ``test_guide_pages.py``)."""
    pytest.importorskip("torch")
    import pathlib
    import re

    root = pathlib.Path(__file__).resolve().parents[3]
    for doc in (root / "README.md",):
        text = doc.read_text(encoding="utf-8")
        section = text[text.index("## Python"):]
        code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
        exec(compile(code, f"{doc.name} (Python quickstart)", "exec"), {})


def test_bad_inputs_name_the_problem():
    """Complex or non-numeric inputs, targets missing or one-hot, counts that are not whole
    numbers ≥ 1: a ValueError that says so. A native model stays native when given its own
    input_shape, and a Sequential with frozen parameters covers the trainable ones only (the
    torch engine), as laplace-torch."""
    torch = pytest.importorskip("torch")
    from fspace import kernels as K
    from fspace._torch import TorchModel

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(2, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3)).double()
    x, y = torch.randn(30, 2, dtype=torch.float64), torch.randint(3, (30,))
    with pytest.raises(ValueError, match="complex"):
        fspace.Laplace(model, "classification").fit(x.to(torch.complex128), y)
    with pytest.raises(ValueError, match="real numbers"):
        fspace.ExactGP(fspace.GPPrior(K.RBF(1.0, 1.0))).fit(np.array([["a"], ["b"]]), np.ones((2, 1)))
    with pytest.raises(ValueError, match="without targets"):
        fspace.Laplace(model, "classification").fit(x)
    with pytest.raises(ValueError, match="without targets"):
        fspace.ExactGP(fspace.GPPrior(K.RBF(1.0, 1.0))).fit(np.ones((3, 1)))
    with pytest.raises(ValueError, match="one-hot"):
        fspace.Laplace(model, "classification").fit(x, torch.nn.functional.one_hot(y, 3))
    prior = fspace.GPPrior(K.Independent(K.RBF(1.0, 1.0), 3))
    for bad in (dict(epochs=-1), dict(epochs=2.5), dict(steps=0), dict(epochs=3, patience=0)):
        with pytest.raises(ValueError, match="whole number"):
            fspace.FSPLaplace(model, "classification", prior, **bad)
    assert not isinstance(fspace.Laplace(model, "classification", input_shape=(2,))._spec, TorchModel)
    with pytest.raises(ValueError, match="MLP taking 2 inputs"):
        fspace.Laplace(model, "classification", input_shape=(1, 2, 1))
    model[0].weight.requires_grad_(False)
    la = fspace.Laplace(model, "classification", "all", "diag")
    la.fit(x, y)
    assert la.n_params == sum(p.numel() for p in model.parameters() if p.requires_grad) == 35
    with pytest.raises(ValueError, match="frozen"):
        fspace.Laplace(model, "classification", "all", "diag", backend="native")


def test_a_loaders_small_batches_cross_to_rust_in_blocks_of_the_target():
    """The streamed fits gather consecutive batches into blocks of at least the target's rows,
    in order (an empty batch included, the last block smaller); a batch at the target crosses
    as it is, and an empty loader gives no block."""
    from fspace._convert import gathered

    sizes = [3, 0, 4, 6, 1, 2]
    batches = [(np.full((n, 2), i, float), np.full((n, 1), i, float)) for i, n in enumerate(sizes)]
    blocks = list(gathered(iter(batches), lambda: 5))
    assert [b[0].shape[0] for b in blocks] == [7, 6, 3]
    for k in (0, 1):
        np.testing.assert_array_equal(np.concatenate([b[k] for b in blocks]), np.concatenate([b[k] for b in batches]))
    assert blocks[1][0] is batches[3][0]
    assert list(gathered(iter([]), lambda: 5)) == []
