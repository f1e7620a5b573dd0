"""``fspace.torch.FSPRegularizer``: FSP-Laplace's prior as a torch loss term — its value against
numpy, its gradient against finite differences (``torch.autograd.gradcheck``), and a network
trained with it in a plain torch loop reverting to the prior away from the data."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import fspace  # noqa: E402
from fspace.torch import FSPRegularizer  # noqa: E402


def rbf(a, b, var=1.0, ell=0.5):
    d2 = ((a[:, None, :] - b[None, :, :]) ** 2).sum(-1)
    return var * np.exp(-0.5 * d2 / ell**2)


def test_the_value_is_the_jittered_rkhs_norm_at_the_context_points():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(2, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)).double()
    c = np.random.default_rng(1).uniform(-2, 2, (15, 2))
    reg = FSPRegularizer(fspace.kernels.RBF(1.0, 0.5), context=c, jitter=1e-3)
    value = reg(model)
    k = rbf(c, c)
    k += 1e-3 * np.mean(np.diag(k)) * np.eye(15)
    with torch.no_grad():
        f = model(torch.from_numpy(c)).numpy()
    assert abs(value.item() - 0.5 * (f.T @ np.linalg.solve(k, f)).item()) <= 1e-10 * value.item()


def test_the_gradient_matches_finite_differences():
    torch.manual_seed(1)
    c = np.random.default_rng(2).uniform(-1, 1, (10, 1))
    reg = FSPRegularizer(fspace.GPPrior(fspace.kernels.Matern32(1.0, 0.7), mean=0.3), context=c)
    f = torch.randn(10, 1, dtype=torch.float64, requires_grad=True)
    from fspace.torch import _RkhsNorm

    assert torch.autograd.gradcheck(lambda t: _RkhsNorm.apply(t, reg._prior_spec, c, reg.jitter), (f,), eps=1e-6, atol=1e-8)
    # Through a model: the weight gradient equals J(C)ᵀ α, checked by finite differences on one weight.
    model = torch.nn.Sequential(torch.nn.Linear(1, 6), torch.nn.Tanh(), torch.nn.Linear(6, 1)).double()
    loss = reg(model)
    loss.backward()
    w = model[0].weight
    g = w.grad[2, 0].item()
    h = 1e-6
    with torch.no_grad():
        w[2, 0] += h
        up = reg(model).item()
        w[2, 0] -= 2 * h
        down = reg(model).item()
        w[2, 0] += h
    assert abs(g - (up - down) / (2 * h)) <= 1e-6 * max(1.0, abs(g))


def test_a_network_trained_with_it_in_a_torch_loop_reverts_to_the_prior_away_from_the_data(one_torch_thread):
    torch.manual_seed(0)
    x = torch.rand(60, 1, dtype=torch.float64) * 2 - 1
    y = torch.sin(3 * x) + 0.05 * torch.randn_like(x)
    sigma, n = 0.1, x.shape[0]
    model = torch.nn.Sequential(torch.nn.Linear(1, 50), torch.nn.Tanh(), torch.nn.Linear(50, 50), torch.nn.Tanh(),
                                torch.nn.Linear(50, 1)).double()
    reg = FSPRegularizer(fspace.kernels.RBF(1.0, 0.3), context=([-4.0], [4.0]), n_context=100, seed=0)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(1500):
        opt.zero_grad()
        nll = ((model(x) - y) ** 2).sum() / (2 * sigma**2)
        loss = nll + reg(model)
        loss.backward()
        opt.step()
    with torch.no_grad():
        rmse = torch.sqrt(((model(x) - torch.sin(3 * x)) ** 2).mean()).item()
        far = model(torch.tensor([[-3.0], [3.0]], dtype=torch.float64)).abs().max().item()
    assert rmse < 0.1, rmse
    # The prior's mean is 0 and its lengthscale 0.3: two lengthscales from the data the GP
    # posterior mean is back at 0, and so is the regularised network.
    assert far < 0.15, far


def test_bad_settings_are_value_errors():
    k = fspace.kernels.RBF(1.0, 0.5)
    model = torch.nn.Linear(2, 1).double()
    for make in [
        lambda: FSPRegularizer(k, context=([0.0], [0.0])),
        lambda: FSPRegularizer(k, context=([0.0, 1.0], [1.0])),
        lambda: FSPRegularizer(k, context=np.array([[np.nan, 0.0]])),
        lambda: FSPRegularizer(k, context=([0.0], [1.0]), jitter=-1.0),
        lambda: FSPRegularizer(k, context=([0.0], [1.0]), n_context=0),
    ]:
        with pytest.raises(ValueError):
            make()
    with pytest.raises(RuntimeError, match="shapes"):  # torch's own message: 1-D points, 2 inputs
        FSPRegularizer(k, context=([0.0], [1.0]))(model)
