"""``fspace.torch.GFSVIRegularizer`` and ``MeanField``: GFSVI's regularised KL as a torch loss
term. The loss of a torch loop equals Rust's GFSVI objective with its exact gradient (through
``J``, by torch's second derivatives), the KL equals numpy's closed form, its backward passes
``gradcheck``, and a network trained with it in a plain torch loop has the GP's uncertainty:
small at the data, back at the prior's away from it."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import fspace  # noqa: E402
from torch_helpers import spread, tanh_mlp as mlp  # noqa: E402
from mlp_reference import fitted  # noqa: E402
from fspace import _fspace  # noqa: E402
from fspace._convert import convert_sequential, tensors  # noqa: E402
from fspace.torch import GFSVIRegularizer, MeanField, _RegularizedKl, expected_log_likelihood  # noqa: E402


def rbf(a, b, var=1.0, ell=0.5):
    d2 = ((a[:, None, :] - b[None, :, :]) ** 2).sum(-1)
    return var * np.exp(-0.5 * d2 / ell**2)


@pytest.mark.parametrize("d_in,d_out", [(1, 1), (2, 2)])
def test_a_torch_loop_loss_is_rusts_gfsvi_objective_with_its_gradient(d_in, d_out):
    model = mlp(d_in, 7, d_out, seed=d_in)
    q = MeanField(model, init_std=0.1)
    spread(q, seed=3)
    rng = np.random.default_rng(4)
    c = rng.uniform(-2, 2, (9, d_in))
    kernel = fspace.kernels.RBF(1.0, 0.6)
    prior = fspace.GPPrior(kernel if d_out == 1 else fspace.kernels.Independent(kernel, d_out))
    kl = GFSVIRegularizer(prior, context=c, gamma=1e-4)
    xb = torch.from_numpy(rng.uniform(-1, 1, (6, d_in)))
    yb = torch.from_numpy(rng.normal(size=(6, d_out)))
    sigma, n = 0.3, 24
    f, var = q.linearized(model, xb, diagonal=True)
    elbo = (n / 6) * expected_log_likelihood(f, var, yb, sigma) - kl(model, q)
    elbo.backward()

    state, _ = tensors(convert_sequential(model).state)
    mean = np.concatenate([p.detach().numpy().ravel() for p in model.parameters()])
    log_std = np.concatenate([r.detach().numpy().ravel() for r in q.log_std])
    value, _, divergence, grad_m, grad_rho, _ = _fspace.gfsvi_objective(
        state=state, activation_name="tanh", mean=list(mean), log_std=list(log_std), log_noise_std=float(np.log(sigma)),
        prior=kl._prior_spec, x_b=xb.numpy(), y_b=yb.numpy(), n_total=n, x_m=c, gamma=1e-4
    )
    assert abs(elbo.item() - value) <= 1e-11 * abs(value)
    assert divergence > 0
    got_m = np.concatenate([p.grad.numpy().ravel() for p in model.parameters()])
    got_rho = np.concatenate([r.grad.numpy().ravel() for r in q.log_std])
    assert np.max(np.abs(got_m - grad_m)) <= 1e-10 * np.max(np.abs(grad_m))
    assert np.max(np.abs(got_rho - grad_rho)) <= 1e-10 * np.max(np.abs(grad_rho))


def test_the_value_is_the_closed_form_kl_of_the_jittered_gaussians():
    model = mlp(2, 5, 1, seed=7)
    q = MeanField(model, init_std=0.2)
    spread(q, seed=8)
    c = np.random.default_rng(9).uniform(-1, 1, (12, 2))
    gamma = 1e-3
    kl = GFSVIRegularizer(fspace.kernels.RBF(1.0, 0.5), context=c, gamma=gamma)
    value = kl(model, q).item()
    # Independently: torch's dense Jacobian, numpy's algebra.
    params = dict(model.named_parameters())
    names = list(params)
    ct = torch.from_numpy(c)

    def out(*ps):
        return torch.func.functional_call(model, dict(zip(names, ps)), (ct,)).reshape(-1)

    jac = torch.autograd.functional.jacobian(out, tuple(params.values()))
    j = np.concatenate([a.reshape(12, -1).numpy() for a in jac], axis=1)
    s = np.concatenate([torch.exp(2 * r).detach().numpy().ravel() for r in q.log_std])
    shift = gamma * 12 * np.eye(12)
    sq, sp = j @ np.diag(s) @ j.T + shift, rbf(c, c) + shift
    with torch.no_grad():
        delta = model(ct).numpy().ravel()
    expected = 0.5 * (np.trace(np.linalg.solve(sp, sq)) - 12 + delta @ np.linalg.solve(sp, delta)
                      + np.linalg.slogdet(sp)[1] - np.linalg.slogdet(sq)[1])
    assert abs(value - expected) <= 1e-9 * abs(expected)
    f, cov = q.linearized(model, ct)
    assert np.max(np.abs(cov.detach().numpy() - (sq - shift))) <= 1e-13


def test_the_backward_passes_gradcheck():
    rng = np.random.default_rng(0)
    c = rng.uniform(-1, 1, (4, 1))
    prior = fspace.GPPrior(fspace.kernels.Matern32(1.0, 0.7), mean=0.2)
    spec = prior.spec()
    a = rng.normal(size=(4, 4))
    cov = torch.from_numpy(a @ a.T + 0.1 * np.eye(4)).requires_grad_()
    f = torch.from_numpy(rng.normal(size=(4, 1))).requires_grad_()
    assert torch.autograd.gradcheck(lambda f, cov: _RegularizedKl.apply(f, cov, spec, c, 1e-2), (f, cov), eps=1e-6, atol=1e-7)


def test_a_float32_model_gives_float32_gradients_and_the_float64_value():
    model = mlp(1, 6, 1, seed=11)
    model32 = mlp(1, 6, 1, seed=11).float()
    q, q32 = MeanField(model, init_std=0.3), MeanField(model32, init_std=0.3)
    c = np.linspace(-1, 1, 6)[:, None]
    kl = GFSVIRegularizer(fspace.kernels.RBF(1.0, 0.5), context=c, gamma=1e-2)
    v64, v32 = kl(model, q), kl(model32, q32)
    assert v32.dtype == torch.float64
    v32.backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 and bool(torch.isfinite(p.grad).all())
               for p in list(model32.parameters()) + list(q32.parameters()))
    assert abs(v32.item() - v64.item()) <= 1e-4 * abs(v64.item())


def test_a_network_trained_with_it_in_a_torch_loop_has_the_gps_uncertainty(one_torch_thread):
    torch.manual_seed(0)
    x = torch.rand(60, 1, dtype=torch.float64) * 2 - 1
    y = torch.sin(3 * x) + 0.05 * torch.randn_like(x)
    sigma = 0.1
    model = torch.nn.Sequential(torch.nn.Linear(1, 20), torch.nn.Tanh(), torch.nn.Linear(20, 20), torch.nn.Tanh(),
                                torch.nn.Linear(20, 1)).double()
    q = MeanField(model)
    kernel = fspace.kernels.RBF(1.0, 0.3)
    kl = GFSVIRegularizer(kernel, context=([-3.0], [3.0]), n_context=50, seed=0)
    opt = torch.optim.Adam(list(model.parameters()) + list(q.parameters()), lr=1e-2)
    for _ in range(600):
        opt.zero_grad()
        f, var = q.linearized(model, x, diagonal=True)
        loss = -expected_log_likelihood(f, var, y, sigma) + kl(model, q)
        loss.backward()
        opt.step()
    grid = torch.linspace(-3, 3, 61, dtype=torch.float64)[:, None]
    f, var = q.linearized(model, grid, diagonal=True)
    mean, sd = f.detach().numpy().ravel(), var.sqrt().detach().numpy().ravel()
    xs = grid.numpy().ravel()
    near, far = np.abs(xs) <= 0.9, np.abs(xs) >= 1.5
    gp = fitted(fspace.ExactGP(kernel, sigma_noise=sigma), x.numpy(), y.numpy())
    gp_sd = np.sqrt(gp(grid.numpy())[1].ravel())
    with torch.no_grad():
        rmse = torch.sqrt(((model(x) - torch.sin(3 * x)) ** 2).mean()).item()
    assert rmse < 0.05, rmse
    # Measured: 0.049 at the data (GP 0.041), 0.88 away from it (GP 0.99).
    assert sd[near].mean() < 1.5 * gp_sd[near].mean(), (sd[near].mean(), gp_sd[near].mean())
    assert 0.7 * gp_sd[far].mean() < sd[far].mean() < 1.4 * gp_sd[far].mean(), (sd[far].mean(), gp_sd[far].mean())
    # Where the GP's mean is back at the prior's 0 (|x| ≥ 2), the network's lies inside its
    # own two-sigma band (measured: |mean| ≤ 1.14 where sd ≥ 0.78).
    out = np.abs(xs) >= 2
    assert np.max(np.abs(gp(grid.numpy())[0].ravel()[out])) < 0.01
    bad = np.abs(mean[out]) >= 2 * sd[out]
    assert not bad.any(), (xs[out][bad], mean[out][bad], sd[out][bad])


def test_bad_inputs_are_clear_exceptions():
    k = fspace.kernels.RBF(1.0, 0.5)
    model = mlp(1, 4, 1, seed=0)
    q = MeanField(model)
    c = np.linspace(-1, 1, 5)[:, None]
    cases = [
        (lambda: GFSVIRegularizer(k, context=c, gamma=0.0), ValueError, "gamma"),
        (lambda: GFSVIRegularizer(k, context=c, gamma=float("nan")), ValueError, "gamma"),
        (lambda: GFSVIRegularizer(k, context=([1.0], [0.0])), ValueError, "lower bound"),
        (lambda: MeanField(model, init_std=0.0), ValueError, "init_std"),
        (lambda: MeanField(torch.nn.Linear(1, 1).requires_grad_(False)), ValueError, "no trainable"),
        (lambda: GFSVIRegularizer(k, context=c)(model, "q"), TypeError, "MeanField"),
        (lambda: GFSVIRegularizer(k, context=c)(mlp(1, 5, 1, seed=0), q), ValueError, "shape"),
        (lambda: GFSVIRegularizer(fspace.kernels.Independent(k, 2), context=c)(model, q), ValueError, "prior outputs"),
        (lambda: expected_log_likelihood(torch.zeros(3, 1), torch.zeros(3, 1), torch.zeros(3), 1.0), ValueError, "one shape"),
        (lambda: _RegularizedKl.apply(torch.zeros(5, 1, dtype=torch.float64), torch.eye(4, dtype=torch.float64),
                                      GFSVIRegularizer(k, context=c)._prior_spec, c, 1e-3), ValueError, "square"),
        (lambda: _RegularizedKl.apply(torch.zeros(5, 1, dtype=torch.float64), -torch.eye(5, dtype=torch.float64),
                                      GFSVIRegularizer(k, context=c)._prior_spec, c, 1e-3), fspace.NumericalError, "positive definite"),
    ]

    class Pair(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(1, 1).double()

        def forward(self, x):
            return self.lin(x), x

    pair = Pair()
    cases.append((lambda: GFSVIRegularizer(k, context=c)(pair, MeanField(pair)), TypeError, "tuple"))
    for make, exc, text in cases:
        with pytest.raises(exc, match=text):
            make()


def test_any_module_a_residual_net_with_frozen_batchnorm_matches_finite_differences():
    class Residual(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inp, self.hid, self.out = torch.nn.Linear(2, 6), torch.nn.Linear(6, 6), torch.nn.Linear(6, 2)
            self.bn = torch.nn.BatchNorm1d(6)

        def forward(self, x):
            h = torch.tanh(self.inp(x))
            return self.out(h + torch.tanh(self.bn(self.hid(h))))

    torch.manual_seed(5)
    model = Residual().double().eval()
    model.bn.requires_grad_(False)
    with torch.no_grad():
        model.bn.running_mean.normal_()
        model.bn.running_var.uniform_(0.5, 2.0)
    q = MeanField(model, init_std=0.2)
    spread(q, seed=6)
    assert q.names == ["inp.weight", "inp.bias", "hid.weight", "hid.bias", "out.weight", "out.bias"]
    c = np.random.default_rng(7).uniform(-1, 1, (7, 2))
    kl = GFSVIRegularizer(fspace.kernels.Independent(fspace.kernels.RBF(1.0, 0.8), 2), context=c, gamma=1e-3)
    kl(model, q).backward()
    h = 1e-6
    for tensor, index in [(model.hid.weight, (1, 2)), (model.inp.bias, (3,)), (q.log_std[2], (4, 0)), (q.log_std[5], (1,))]:
        with torch.no_grad():
            tensor[index] += h
            up = kl(model, q).item()
            tensor[index] -= 2 * h
            down = kl(model, q).item()
            tensor[index] += h
        fd = (up - down) / (2 * h)
        assert abs(tensor.grad[index].item() - fd) <= 1e-6 * max(1.0, abs(fd)), (index, tensor.grad[index].item(), fd)


def test_the_torch_loop_helpers_refuse_nan_and_a_non_positive_sigma():
    """A NaN input, σ ≤ 0 (a negative σ used to be squared into a valid one) or a negative
    variance is a ValueError naming it, not a NaN loss that poisons the weights."""
    import fspace.torch as ft

    f = torch.zeros(4, 1, dtype=torch.float64)
    var = torch.full((4, 1), 0.1, dtype=torch.float64)
    y = torch.ones(4, 1, dtype=torch.float64)
    assert torch.isfinite(ft.expected_log_likelihood(f, var, y, 0.5))
    for sigma in (0.0, -0.5, float("nan"), torch.tensor(-1.0)):
        with pytest.raises(ValueError, match="sigma_noise"):
            ft.expected_log_likelihood(f, var, y, sigma)
    with pytest.raises(ValueError, match="f holds a NaN"):
        ft.expected_log_likelihood(torch.full_like(f, float("nan")), var, y, 0.5)
    with pytest.raises(ValueError, match="negative variance"):
        ft.expected_log_likelihood(f, -var, y, 0.5)
    with pytest.raises(ValueError, match="logits"):
        ft.expected_log_likelihood_categorical(torch.full((2, 4, 3), float("nan"), dtype=torch.float64),
                                               torch.zeros(4, dtype=torch.int64))
    model = torch.nn.Sequential(torch.nn.Linear(1, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1)).double()
    with torch.no_grad():
        model[0].weight.fill_(float("nan"))
    reg = ft.FSPRegularizer(fspace.kernels.RBF(1.0, 0.5), (np.array([-1.0]), np.array([1.0])), n_context=5)
    with pytest.raises(ValueError, match="outputs at FSPRegularizer"):
        reg(model)
