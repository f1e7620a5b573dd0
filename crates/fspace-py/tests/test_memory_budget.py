"""Requests that cannot fit are refused with ``MemoryError`` before the allocation (which would
abort the interpreter), naming the structure, the size and a cheaper choice; the budget is the
available memory or ``fspace.set_memory_limit``."""

from __future__ import annotations

import time

import numpy as np
import pytest

import fspace
from fspace import kernels as K
from mlp_reference import tanh_mlp

torch = pytest.importorskip("torch")


def test_requests_that_cannot_fit_raise_memory_error_before_allocating():
    torch.manual_seed(0)
    wide = torch.nn.Sequential(torch.nn.Linear(1, 150_000)).double()
    with pytest.raises(MemoryError, match="per-point output-space Hessians.*smaller batches"):
        fspace.Laplace(wide, "regression", "all", "kron").fit(torch.randn(4, 1, dtype=torch.float64),
                                                             torch.randn(4, 150_000, dtype=torch.float64))
    many = torch.nn.Sequential(torch.nn.Linear(2, 8), torch.nn.Tanh(), torch.nn.Linear(8, 60_000)).double()
    with pytest.raises(MemoryError, match="GiB"):
        fspace.Laplace(many, "classification", "last_layer", "full").fit(torch.randn(4, 2, dtype=torch.float64),
                                                                        torch.randint(60_000, (4,)))
    small = torch.nn.Sequential(torch.nn.Linear(2, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)).double()
    la = fspace.Laplace(small, "regression", "all", "diag")
    x = torch.randn(20, 2, dtype=torch.float64)
    la.fit(x, torch.randn(20, 1, dtype=torch.float64))
    with pytest.raises(MemoryError, match="weight draws.*in batches"):
        la.sample(10**9)
    assert la.sample(5).shape == (5, 33)
    rng = np.random.default_rng(0)
    gfsvi = fspace.GFSVI((tanh_mlp(rng, [1, 8, 1]), "tanh"), "regression", fspace.GPPrior(K.RBF(1.0, 0.5)), steps=2,
                         measurement_points=10**6)
    with pytest.raises(MemoryError, match="measurement_points"):
        gfsvi.fit(rng.normal(size=(50, 1)), rng.normal(size=(50, 1)))
    # FSP-Laplace with 10⁷ context points: refused at once, not after minutes of sampling.
    start = time.perf_counter()
    for train, option, name in ((True, "n_context", "Alg. 1"), (False, "n_laplace_context", "Alg. 2")):
        fsp = fspace.FSPLaplace((tanh_mlp(rng, [1, 8, 1]), "tanh"), "regression", fspace.GPPrior(K.RBF(1.0, 0.5)),
                                train=train, sigma_noise=0.1, **{option: 10**7})
        with pytest.raises(MemoryError, match=f"{name}.*{option}"):
            fsp.fit(rng.normal(size=(50, 1)), rng.normal(size=(50, 1)))
    assert time.perf_counter() - start < 2.0


def test_the_memory_limit_is_settable():
    assert fspace.memory_limit() is None or fspace.memory_limit() > 0
    model = torch.nn.Sequential(torch.nn.Linear(2, 50), torch.nn.Tanh(), torch.nn.Linear(50, 3)).double()
    x, y = torch.randn(30, 2, dtype=torch.float64), torch.randint(3, (30,))
    try:
        # The full curvature over 303 parameters is 2·303²·8 ≈ 1.5 MB.
        fspace.set_memory_limit(1_000_000)
        assert fspace.memory_limit() == 1_000_000
        with pytest.raises(MemoryError, match="full curvature.*'kron'"):
            fspace.Laplace(model, "classification", "all", "full").fit(x, y)
        fspace.Laplace(model, "classification", "all", "kron").fit(x, y)
        with pytest.raises(ValueError, match="at least 1 byte"):
            fspace.set_memory_limit(0)
    finally:
        fspace.set_memory_limit(None)
    fspace.Laplace(model, "classification", "all", "full").fit(x, y)



def test_a_diagonal_posterior_precision_needs_no_dense_matrix():
    """``diag``'s ``posterior_precision``, ``H`` and ``log_prob`` read the curvature's diagonal
    (they formed the dense ``p × p`` curvature to take its diagonal: 317 GB for the MNIST MLP);
    under a budget below one ``p × p`` matrix they work, and the dense curvature (``full``'s) is
    refused before it is allocated."""
    model = torch.nn.Sequential(torch.nn.Linear(2, 300), torch.nn.Tanh(), torch.nn.Linear(300, 3)).double()
    x, y = torch.randn(30, 2, dtype=torch.float64), torch.randint(3, (30,))
    la = fspace.Laplace(model, "classification", "all", "diag")
    la.fit(x, y)
    p = la.n_params  # 1 803: one dense curvature is 26 MB
    try:
        fspace.set_memory_limit(5_000_000)
        precision = la.posterior_precision
        assert precision.shape == (p,) and torch.all(precision >= la.prior_precision)
        torch.testing.assert_close(la.H * la._H_factor + la.prior_precision_diag, precision)
        assert torch.isfinite(la.log_prob(la.mean + 0.01))
        with pytest.raises(MemoryError, match="dense curvature.*'diag'"):
            la._la.curvature_dense()
    finally:
        fspace.set_memory_limit(None)

def test_samples_and_joint_predictives_past_the_budget_raise_memory_error():
    """10⁹ Monte Carlo or functional samples and a joint covariance at 10⁵ points — on the
    Python layer's torch draws (laplace-torch's ``predictive_samples``, the MC link, ELLA) and on
    the compiled posteriors' (``la(x, joint=True)``, a method's ``sample_functions``) — are
    ``MemoryError`` before any allocation, and at once."""
    torch.manual_seed(0)
    start = time.perf_counter()
    model = torch.nn.Sequential(torch.nn.Linear(2, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3)).double()
    x = torch.randn(40, 2, dtype=torch.float64)
    y = torch.randint(3, (40,))
    la = fspace.Laplace(model, "classification", "all", "kron")
    la.fit(x, y)
    with pytest.raises(MemoryError, match="Monte Carlo samples.*link_approx='probit'"):
        la(x, link_approx="mc", n_samples=10**9)
    with pytest.raises(MemoryError, match="Monte Carlo samples"):
        la.predictive_samples(x, n_samples=10**9)
    assert tuple(la.predictive_samples(x[:2], n_samples=3).shape) == (3, 2, 3)
    reg = torch.nn.Sequential(torch.nn.Linear(2, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)).double()
    lr = fspace.Laplace(reg, "regression", "all", "kron")
    lr.fit(x, torch.randn(40, 1, dtype=torch.float64))
    with pytest.raises(MemoryError, match="joint predictive covariance.*fewer points"):
        lr(torch.zeros(100_000, 2, dtype=torch.float64), joint=True)
    ella = fspace.Laplace(model, "classification", "all", "gp", functional_approximation="nystrom",
                          subsample_size=20, n_eigenvalues=5)
    ella.fit(torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=20))
    with pytest.raises(MemoryError, match="samples.*fewer n_samples"):
        ella.predictive_samples(x, n_samples=10**9)
    with pytest.raises(MemoryError, match="joint predictive covariance"):
        ella.predictive_moments(torch.zeros(100_000, 2, dtype=torch.float64), joint=True)
    rng = np.random.default_rng(0)
    gp = fspace.ExactGP(K.RBF(1.0, 0.5), sigma_noise=0.1)
    gp.fit(rng.normal(size=(30, 1)), rng.normal(size=(30, 1)))
    with pytest.raises(MemoryError, match="function samples.*fewer n_samples"):
        gp.predictive_samples(rng.normal(size=(5, 1)), n_samples=10**15)
    with pytest.raises(MemoryError, match="joint predictive covariance"):
        gp.predictive_samples(np.zeros((2_000_000, 1)), n_samples=2)
    assert time.perf_counter() - start < 10.0
