"""Any ``torch.nn.Module`` through torch's derivatives (``fspace._torch``): the callbacks'
``J·U`` and ``Jᵀ·L`` against ``torch.autograd.functional.jacobian``, the Laplace predictive of
every structure the path offers against the dense computation from that Jacobian, the same
posteriors as the native path on a convertible ``nn.Sequential``, and the refusals."""

import copy

import numpy as np
import pytest

import fspace
from mlp_reference import fitted

torch = pytest.importorskip("torch")
nn = torch.nn
from fspace._torch import TorchCalls, add_lower_gram, mirror_lower  # noqa: E402  (needs torch)


class ResidualMLP(nn.Module):
    """A custom ``forward`` with a skip connection."""

    def __init__(self, d=2, width=8, q=2):
        super().__init__()
        self.inp, self.mid, self.out = nn.Linear(d, width), nn.Linear(width, width), nn.Linear(width, q)

    def forward(self, x):
        h = torch.tanh(self.inp(x))
        h = h + torch.tanh(self.mid(h))
        return self.out(h)


class BatchNormCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 3, 3, stride=2)
        self.bn = nn.BatchNorm2d(3)
        self.head = nn.Linear(3 * 3 * 3, 2)

    def forward(self, x):
        return self.head(torch.relu(self.bn(self.conv(x))).flatten(1))


class TinyAttention(nn.Module):
    """One self-attention layer over a sequence of 4 tokens of width 3, mean-pooled."""

    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(3, 1, batch_first=True)
        self.head = nn.Linear(3, 2)

    def forward(self, x):
        h, _ = self.attn(x, x, x, need_weights=False)
        return self.head(torch.tanh(h).mean(dim=1))


class BiasFree(nn.Module):
    """A bias-free hidden layer (as a convolution before BatchNorm) under a biased head."""

    def __init__(self, d=2, width=4, q=1):
        super().__init__()
        self.a, self.b = nn.Linear(d, width, bias=False), nn.Linear(width, q)

    def forward(self, x):
        return self.b(torch.tanh(self.a(x)))


def models():
    torch.manual_seed(0)
    res = ResidualMLP().double()
    cnn = BatchNormCNN().double()
    with torch.no_grad():  # running statistics away from (0, 1), so eval mode matters
        cnn.bn.running_mean.uniform_(-0.5, 0.5)
        cnn.bn.running_var.uniform_(0.5, 2.0)
    att = TinyAttention().double()
    return [
        ("residual", res, torch.randn(6, 2, dtype=torch.float64)),
        ("batchnorm-cnn", cnn, torch.randn(5, 1, 7, 7, dtype=torch.float64)),
        ("attention", att, torch.randn(5, 4, 3, dtype=torch.float64)),
        ("bias-free", BiasFree(q=2).double(), torch.randn(6, 2, dtype=torch.float64)),
    ]


def dense_jacobian(model, x):
    """``n·q × p`` (point-major rows, ``named_parameters()`` columns) by torch autograd."""
    names = [n for n, _ in model.named_parameters()]
    params = tuple(p.detach() for _, p in model.named_parameters())

    def f(*flat):
        return torch.func.functional_call(model, dict(zip(names, flat)), (x,)).reshape(x.shape[0], -1)

    model.eval()
    blocks = torch.autograd.functional.jacobian(f, params)
    n, q = blocks[0].shape[:2]
    return torch.cat([b.reshape(n * q, -1) for b in blocks], dim=1).numpy()


@pytest.mark.parametrize("name,model,x", models(), ids=[m[0] for m in models()])
def test_the_callbacks_products_equal_torchs_jacobian(name, model, x):
    calls = TorchCalls(model, x.shape[1:], block=3)
    rows = x.reshape(x.shape[0], -1).numpy()
    jac = dense_jacobian(model, x)
    rng = np.random.default_rng(0)
    u = rng.standard_normal((jac.shape[1], 7))
    l = rng.standard_normal((jac.shape[0], 5))
    # fspace hands the columns over column-major (no copy on either side); a caller's C-order
    # arrays give the same products.
    for order in ("C", "F"):
        uo, lo = np.asarray(u, order=order), np.asarray(l, order=order)
        assert np.max(np.abs(calls.jvp(calls.params, rows, uo) - jac @ u)) <= 1e-10 * max(1.0, np.abs(jac @ u).max())
        assert np.max(np.abs(calls.vjp(calls.params, rows, lo) - jac.T @ l)) <= 1e-10 * max(1.0, np.abs(jac.T @ l).max())
    with torch.no_grad():
        model.eval()
        assert np.max(np.abs(calls.forward(calls.params, rows) - model(x).reshape(x.shape[0], -1).numpy())) <= 1e-12


@pytest.mark.parametrize("name,model,x", models(), ids=[m[0] for m in models()])
def test_forward_mode_products_taken_in_point_chunks_are_the_same(monkeypatch, name, model, x):
    # A budget of one byte puts each point in a chunk of its own; the products must not move.
    import fspace._torch_calls as ft

    calls = TorchCalls(model, x.shape[1:], block=3)
    assert calls.activations_per_point > calls.output_dim
    rows = x.reshape(x.shape[0], -1).numpy()
    u = np.random.default_rng(1).standard_normal((calls.params.size, 7))
    whole = calls.jvp(calls.params, rows, u)
    assert len(calls._point_chunks(x.shape[0], 3)) == 1
    monkeypatch.setattr(ft, "TANGENT_BYTES", 1)  # fspace._torch_calls, where TorchCalls reads it
    assert len(calls._point_chunks(x.shape[0], 3)) == x.shape[0]
    jac = dense_jacobian(model, x)
    assert np.max(np.abs(calls.jvp(calls.params, rows, u) - jac @ u)) <= 1e-10 * max(1.0, np.abs(jac @ u).max())
    assert np.max(np.abs(calls.jvp(calls.params, rows, u) - whole)) <= 1e-12 * max(1.0, np.abs(whole).max())


def dense_predictive_variance(model, x, xs, sigma, lam, structure):
    j, js = dense_jacobian(model, x), dense_jacobian(model, xs)
    ggn = j.T @ j / sigma**2
    if structure == "diag":
        cov = np.diag(1.0 / (np.diag(ggn) + lam))
    else:
        cov = np.linalg.inv(ggn + lam * np.eye(ggn.shape[0]))
    return np.einsum("ij,jk,ik->i", js, cov, js).reshape(xs.shape[0], -1)


@pytest.mark.parametrize("structure", ["full", "diag", "lowrank"])
@pytest.mark.parametrize("name,model,x", models(), ids=[m[0] for m in models()])
def test_every_structure_equals_the_dense_computation(structure, name, model, x):
    g = torch.Generator().manual_seed(1)
    xs = torch.randn((3,) + tuple(x.shape[1:]), generator=g, dtype=torch.float64)
    with torch.no_grad():
        model.eval()
        y = model(x) + 0.1 * torch.randn(model(x).shape, generator=g, dtype=torch.float64)
    sigma, lam = 0.3, 1.5
    la = fspace.Laplace(model, "regression", subset_of_weights="all", hessian_structure=structure, prior_precision=lam, sigma_noise=sigma)
    la.fit(x, y)
    mean, var = la(xs, diagonal_output=True)
    with torch.no_grad():
        assert torch.max(torch.abs(mean - model(xs))).item() <= 1e-12
    ref = dense_predictive_variance(model, x, xs, sigma, lam, structure)
    assert np.max(np.abs(var.numpy() - ref) / ref) <= 1e-8


def test_lowrank_keeps_the_ggns_top_rank_eigenpairs():
    # Σ = (V_k Λ_k V_kᵀ + λI)⁻¹ with the GGN's top-k eigenpairs, from torch's dense Jacobian.
    torch.manual_seed(4)
    model = nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Linear(8, 2)).double()
    x = torch.rand(30, 2, dtype=torch.float64) * 2 - 1
    xs = torch.rand(4, 2, dtype=torch.float64) * 2 - 1
    with torch.no_grad():
        y = model(x) + 0.1
    sigma, lam, k = 0.3, 1.5, 7
    steps = {}
    # A basis of k + 2 vectors (thick restart) and 7-point chunks of torch calls change the work
    # done, not the answer.
    for backend, max_basis, chunk_points in [("native", None, None), ("torch", None, None),
                                             ("native", k + 2, None), ("torch", k + 2, 7)]:
        la = fspace.Laplace(model, "regression", subset_of_weights="all", hessian_structure="lowrank", rank=k, prior_precision=lam,
                            sigma_noise=sigma, backend=backend, max_basis=max_basis, chunk_points=chunk_points)
        la.fit(x, y)
        steps[(backend, max_basis)] = la.report["lanczos_iterations"]
        j, js = dense_jacobian(model, x), dense_jacobian(model, xs)
        values, vectors = np.linalg.eigh(j.T @ j / sigma**2)
        v, d = vectors[:, -k:], values[-k:]
        cov = (np.eye(j.shape[1]) - v @ np.diag(d / (d + lam)) @ v.T) / lam
        ref = np.einsum("ij,jk,ik->i", js, cov, js).reshape(4, 2)
        # Both stop once every kept pair's relative Ritz residual is ≤ 1e-8; an eigenvector's
        # error is that over the eigengap. The growing basis checks every 5 steps and so
        # overshoots the tolerance; the restarted one checks every step and stops right at it.
        assert la.report["max_ritz_residual"] <= 1e-8
        tol = 1e-8 if max_basis is None else 1e-6
        assert np.max(np.abs(la(xs, diagonal_output=True)[1].numpy() - ref) / ref) <= tol, (backend, max_basis)
    # The restarted runs took more steps than their basis holds.
    assert min(steps[("native", k + 2)], steps[("torch", k + 2)]) > k + 2, steps
    with pytest.raises(ValueError, match="applies to hessian_structure=\"lowrank\""):
        fspace.Laplace(model, "regression", subset_of_weights="all", hessian_structure="diag", rank=3)
    with pytest.raises(ValueError, match="max_basis 9 applies to hessian_structure=\"lowrank\""):
        fspace.Laplace(model, "regression", subset_of_weights="all", hessian_structure="kron", max_basis=9)
    with pytest.raises(ValueError, match="chunk_points must be ≥ 1"):
        fspace.Laplace(model, "regression", subset_of_weights="all", hessian_structure="lowrank", chunk_points=0)
    with pytest.raises(ValueError, match="max_basis"):
        fitted(fspace.Laplace(model, "regression", subset_of_weights="all", hessian_structure="lowrank", rank=k, max_basis=k + 1), x, y)
    with pytest.raises(ValueError, match="rank must be ≥ 1"):
        fspace.Laplace(model, "regression", subset_of_weights="all", hessian_structure="lowrank", rank=0)


def test_a_convertible_sequential_gives_the_same_posterior_on_both_paths():
    torch.manual_seed(2)
    model = nn.Sequential(nn.Linear(2, 10), nn.Tanh(), nn.Linear(10, 10), nn.Tanh(), nn.Linear(10, 1)).double()
    x = torch.rand(40, 2, dtype=torch.float64) * 2 - 1
    with torch.no_grad():
        y = torch.sin(3 * x[:, :1]) + model(x)
    xs = torch.rand(7, 2, dtype=torch.float64) * 4 - 2
    for structure in ["full", "diag", "lowrank"]:
        got = []
        for backend in ["native", "torch"]:
            la = fspace.Laplace(model, "regression", subset_of_weights="all", hessian_structure=structure, sigma_noise=0.2,
                                prior_precision=0.7, backend=backend)
            la.fit(x, y)
            fixed = (la(xs, diagonal_output=True)[1].numpy(), la.log_marginal_likelihood())
            la.optimize_prior_precision()
            got.append(fixed + (la.prior_precision[0],))
        (va, ea, la_), (vb, eb, lb) = got
        assert np.max(np.abs(va - vb) / va) <= 1e-10, structure
        assert abs(ea - eb) <= 1e-10 * abs(ea), structure
        # The evidence search stops at its tolerance: rounding-level differences in the
        # curvature move its end point by far less than that.
        assert abs(la_ - lb) <= 1e-6 * la_, structure
    prior = fspace.GPPrior(fspace.kernels.Matern12(1.0, 0.5))
    post = []
    for backend in ["native", "torch"]:
        m = fspace.FSPLaplace(model, "regression", prior, train=False, sigma_noise=0.2, n_laplace_context=36, backend=backend)
        post.append(fitted(m, x, y)(xs))
    assert np.max(np.abs(post[0][0].numpy() - post[1][0].numpy())) <= 1e-12
    assert np.max(np.abs(post[0][1].numpy() - post[1][1].numpy()) / post[0][1].numpy()) <= 1e-10


def test_float32_models_run_in_float32_and_accumulate_in_float64():
    torch.manual_seed(3)
    model = ResidualMLP()
    x = torch.randn(10, 2)
    la = fspace.Laplace(model, "regression", subset_of_weights="all", hessian_structure="full", sigma_noise=0.3)
    la.fit(x, torch.zeros(10, 2))
    mean, var = la(x, diagonal_output=True)
    with torch.no_grad():
        assert torch.max(torch.abs(mean - model(x).double())).item() <= 1e-6
    ref = dense_predictive_variance(model.double(), x.double(), x.double(), 0.3, 1.0, "full")
    assert np.max(np.abs(var.numpy() - ref) / ref) <= 1e-4


class ReturnsTuple(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 1)

    def forward(self, x):
        return self.lin(x), x


class InPlace(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 1)

    def forward(self, x):
        w = self.lin.weight
        w.mul_(1.0)  # in place on a parameter: torch.func refuses it
        return x @ w.t()


def test_models_the_path_cannot_take_are_refused_with_torchs_or_fspaces_message():
    x, y = torch.randn(5, 2, dtype=torch.float64), torch.randn(5, 1, dtype=torch.float64)
    with pytest.raises(TypeError, match="returned a tuple"):
        fitted(fspace.Laplace(ReturnsTuple().double(), "regression", subset_of_weights="all", hessian_structure="diag"), x, y)
    with pytest.raises(RuntimeError):
        fitted(fspace.Laplace(InPlace().double(), "regression", subset_of_weights="all", hessian_structure="diag"), x, y)
    mixed = ResidualMLP().double()
    mixed.out.float()
    with pytest.raises(ValueError, match="one dtype"):
        fitted(fspace.Laplace(mixed, "regression", subset_of_weights="all", hessian_structure="diag"), torch.randn(5, 2, dtype=torch.float64), torch.randn(5, 2, dtype=torch.float64))
    with pytest.raises(ValueError, match="backend"):
        fspace.Laplace(ResidualMLP(), "regression", subset_of_weights="all", backend="jax")
    with pytest.raises(TypeError, match="not a torch.nn.Module"):
        fspace.Laplace(object(), "regression", subset_of_weights="all", backend="torch")
    for shape in [(-2,), (0,), (2, 0), (2.5,), ()]:
        with pytest.raises(ValueError, match="input_shape .* must be one input's shape: whole numbers ≥ 1"):
            fspace.Laplace(ResidualMLP().double(), "regression", "all", "diag", backend="torch", input_shape=shape)
    la = fspace.Laplace(ResidualMLP().double(), "regression", subset_of_weights="all", hessian_structure="diag")
    la.fit(torch.randn(5, 2, dtype=torch.float64), torch.randn(5, 2, dtype=torch.float64))
    with pytest.raises(ValueError, match="fitted on"):
        la(torch.randn(3, 3, dtype=torch.float64))
    import pickle

    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(la)


def test_the_function_space_methods_take_any_model():
    torch.manual_seed(4)
    model = ResidualMLP(d=1, q=1).double()
    x = torch.linspace(-1, 1, 30, dtype=torch.float64).reshape(-1, 1)
    with torch.no_grad():
        y = torch.sin(3 * x) + 0.05 * model(x)
    prior = fspace.GPPrior(fspace.kernels.RBF(1.0, 0.5))
    fsp = fitted(fspace.FSPLaplace(model, "regression", prior, train=False, sigma_noise=0.1, n_laplace_context=25), x, y)
    mean, var = fsp(torch.tensor([[0.0], [1.4]], dtype=torch.float64))
    with torch.no_grad():
        assert abs(mean[0, 0].item() - model(torch.zeros(1, 1, dtype=torch.float64)).item()) <= 1e-12
    assert 0 < var[0, 0].item() < var[1, 0].item() <= 1.0 + 1e-9
    assert set(fsp.model_state_dict()) == {n for n, _ in model.named_parameters()}
    ella = fitted(fspace.ELLA(model, "regression", num_points=20, num_eigen=8, prior={"Fixed": 1.0}, sigma_noise=0.1), x, y)
    assert bool((ella(x)[1] > 0).all())
    valla = fitted(fspace.VaLLA(model, "regression", num_inducing=5, sigma_noise=0.1, steps=20), x, y)
    assert bool((valla(x)[1] > 0).all())


def test_blocks_sent_a_column_at_a_time_give_the_same_posterior(monkeypatch):
    # fspace sends p × r blocks to jvp and takes p × r blocks from vjp in column chunks of
    # COLUMN_BYTES; one byte makes every chunk a single column. Post-hoc FSP-Laplace takes both
    # (J(C)ᵀL, the data term, the truncation and the predictive), ELLA's projections jvp.
    import fspace._torch_calls as ft

    torch.manual_seed(5)
    model = ResidualMLP(d=1, q=1).double()
    x = torch.linspace(-1, 1, 30, dtype=torch.float64).reshape(-1, 1)
    with torch.no_grad():
        y = torch.sin(3 * x) + 0.05 * model(x)
    xs = torch.linspace(-1.5, 1.5, 7, dtype=torch.float64).reshape(-1, 1)
    prior = fspace.GPPrior(fspace.kernels.RBF(1.0, 0.5))

    def fit():
        fsp = fitted(fspace.FSPLaplace(model, "regression", prior, train=False, sigma_noise=0.1, n_laplace_context=25), x, y)
        ella = fitted(fspace.ELLA(model, "regression", num_points=20, num_eigen=8, prior={"Fixed": 1.0}, sigma_noise=0.1), x, y)
        return fsp(xs)[1].numpy(), ella(xs)[1].numpy()

    widths = []
    for name in ("jvp", "vjp"):
        original = getattr(TorchCalls, name)

        def counted(self, w, x, m, original=original):
            widths.append(m.shape[1])
            return original(self, w, x, m)

        monkeypatch.setattr(TorchCalls, name, counted)
    whole = fit()
    assert max(widths) > 1
    widths.clear()
    monkeypatch.setattr(ft, "COLUMN_BYTES", 1)  # fspace._torch_calls, where TorchCalls reads it
    chunked = fit()
    assert widths and max(widths) == 1
    for a, b in zip(whole, chunked):
        assert np.max(np.abs(a - b)) <= 1e-12 * np.abs(a).max()


def test_fsp_laplace_training_takes_the_same_steps_on_both_paths():
    # Alg. 1 on the torch path: MAP training under the GP prior (forward and reverse passes
    # through torch), then the Laplace step; on a convertible Sequential both paths take the
    # same seeded steps, so the trained weights and the predictive agree to rounding.
    torch.manual_seed(5)
    model = nn.Sequential(nn.Linear(1, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 1)).double()
    x = torch.linspace(-1, 1, 24, dtype=torch.float64).reshape(-1, 1)
    y = torch.sin(3 * x)
    xs = torch.tensor([[0.0], [2.5]], dtype=torch.float64)
    prior = fspace.GPPrior(fspace.kernels.RBF(1.0, 0.5))
    results = []
    for backend in ["native", "torch"]:
        m = fspace.FSPLaplace(model, "regression", prior, sigma_noise=0.1, epochs=15, batch_size=8,
                              n_context=10, n_laplace_context=16, backend=backend)
        m.fit(x, y)
        results.append((m.model_state_dict(), m(xs)))
    (sa, (ma, va)), (sb, (mb, vb)) = results
    assert set(sa) == set(sb) == {n for n, _ in model.named_parameters()}
    for name in sa:
        a, b = np.asarray(sa[name]), np.asarray(sb[name])
        assert np.max(np.abs(a - b)) <= 1e-9 * max(1.0, np.max(np.abs(a))), name
    # The weights moved: training happened on both paths.
    start = dict(model.named_parameters())
    assert max(np.max(np.abs(np.asarray(sa[n]) - start[n].detach().numpy())) for n in sa) > 1e-3
    np.testing.assert_allclose(mb.numpy(), ma.numpy(), rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(vb.numpy(), va.numpy(), rtol=1e-6)


class TokenMLP(nn.Module):
    """Linear layers applied to every token of a sequence (weights shared over positions)."""

    def __init__(self):
        super().__init__()
        self.embed, self.head = nn.Linear(3, 5), nn.Linear(5, 2)

    def forward(self, x):
        return self.head(torch.tanh(self.embed(x)).mean(dim=1))


def layered_models():
    _, cnn, xc = models()[1]
    for p in cnn.bn.parameters():  # BatchNorm frozen: it keeps its weights and leaves the posterior
        p.requires_grad_(False)
    torch.manual_seed(4)
    return [
        ("residual", models()[0][1], models()[0][2]),
        ("frozen-batchnorm-cnn", cnn, xc),
        ("tokens", TokenMLP().double(), torch.randn(5, 4, 3, dtype=torch.float64)),
        ("bias-free", BiasFree(q=2).double(), torch.randn(6, 2, dtype=torch.float64)),
    ]


@pytest.mark.parametrize("name,model,x", layered_models(), ids=[m[0] for m in layered_models()])
def test_the_hooks_layer_statistics_rebuild_torchs_jacobian(name, model, x):
    """Σ_t δ_{i,c,t} ã_{i,t}ᵀ of every layer equals row (i, c) of the dense Jacobian on that
    layer's weight and bias columns, and the layers cover every trainable parameter."""
    calls = TorchCalls(model, x.shape[1:])
    infos = calls.layer_infos("all")
    rows = x.reshape(x.shape[0], -1).numpy()
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    jac = dense_jacobian(model, x)
    if len(names) < len(list(model.parameters())):  # dense_jacobian covers every parameter: keep the trainable ones
        keep = np.concatenate([np.full(p.numel(), p.requires_grad) for p in model.parameters()])
        jac = jac[:, keep]
    n, q = x.shape[0], calls.output_dim
    stats = calls.kfac_statistics(calls.params, rows, np.tile(np.eye(q), (n, 1)), infos)
    covered = np.zeros(jac.shape[1], dtype=bool)
    for info, (a, d) in zip(infos, stats):
        t, fi, fo = info["positions"], info["fan_in"], info["fan_out"]
        a = a.reshape(n, t, fi)
        d = d.reshape(n, q, t, fo)
        w0, w1 = info["weight"]
        b0, b1 = info["bias"]
        covered[w0:w1] = covered[b0:b1] = True
        for i in range(n):
            for c in range(q):
                grad_w = d[i, c].T @ a[i]
                assert np.max(np.abs(grad_w.reshape(-1) - jac[i * q + c, w0:w1])) <= 1e-10
                if b1 > b0:
                    assert np.max(np.abs(d[i, c].sum(axis=0) - jac[i * q + c, b0:b1])) <= 1e-10
    assert covered.all()
    assert calls.layer_infos("last")[0]["name"] == infos[-1]["name"]
    np.testing.assert_allclose(
        calls.last_layer_features(calls.params, rows, infos[-1:]) @ model.get_submodule(infos[-1]["name"]).weight.detach().numpy().T
        + model.get_submodule(infos[-1]["name"]).bias.detach().numpy(),
        calls.forward(calls.params, rows), atol=1e-12)


@pytest.mark.parametrize("name,model,x", layered_models(), ids=[m[0] for m in layered_models()])
def test_the_factor_sums_torch_forms_equal_the_statistics_summed(name, model, x):
    """``kfac_factor_sums`` (torch sums each chunk on its side) equals Σ aaᵀ, Σ a, the row count
    and Σ δδᵀ of ``kfac_statistics`` over all points: to rounding for a float64 model, to
    float32's GEMM rounding (≈ 1e-7 relative per chunk) for a float32 one."""
    n = x.shape[0]
    rng = np.random.default_rng(9)
    for dtype, tol in [(torch.float64, 1e-12), (torch.float32, 1e-5)]:
        m = copy.deepcopy(model).to(dtype)
        calls = TorchCalls(m, x.shape[1:])
        infos = calls.layer_infos("all")
        rows = x.reshape(n, -1).to(dtype).double().numpy()
        l = rng.standard_normal((n * calls.output_dim, 2))
        stats = calls.kfac_statistics(calls.params, rows, l, infos)
        sums = calls.kfac_factor_sums(calls.params, rows, l, infos, 2)
        assert len(sums) == len(infos)
        for info, (a, d), (aa, sa, count, gg) in zip(infos, stats, sums):
            assert count == n * info["positions"] and sa.shape == (info["fan_in"],)
            for got, ref in [(aa, a.T @ a), (sa, a.sum(0)), (gg, d.T @ d)]:
                assert got.dtype == np.float64
                assert np.max(np.abs(got - ref)) <= tol * np.max(np.abs(ref)), (name, dtype, info["name"])



@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-14), (torch.float32, 1e-6)])
def test_the_lower_block_gram_completes_to_the_full_product(dtype, tol):
    """``add_lower_gram`` sums ``aᵀa`` block column by block column below the diagonal (block
    widths that divide the width, that do not, of one column and wider than the matrix), twice
    into one accumulator; ``mirror_lower`` completes it to the exact symmetric ``2·aᵀa``."""
    g = torch.Generator().manual_seed(4)
    a = torch.randn(37, 11, generator=g, dtype=dtype)
    ref = 2.0 * (a.double().T @ a.double())
    for block in (1, 3, 4, 11, 256):
        acc = torch.zeros(11, 11, dtype=torch.float64)
        add_lower_gram(acc, a, block)
        add_lower_gram(acc, a, block)
        full = mirror_lower(acc)
        assert torch.equal(full, full.T) and full.dtype == torch.float64
        assert torch.max(torch.abs(full - ref)) <= tol * torch.max(torch.abs(ref)), block

def test_kron_asks_torch_for_factor_sums_not_for_statistics(monkeypatch):
    torch.manual_seed(5)
    model = ResidualMLP(d=2, q=3).double()
    x, y = torch.randn(20, 2, dtype=torch.float64), torch.randint(0, 3, (20,))
    seen = []
    for method in ("kfac_statistics", "kfac_factor_sums"):
        original = getattr(TorchCalls, method)

        def counted(self, *a, original=original, method=method):
            seen.append(method)
            return original(self, *a)

        monkeypatch.setattr(TorchCalls, method, counted)
    la = fspace.Laplace(model, "classification", subset_of_weights="all", hessian_structure="kron", backend="torch")
    la.fit(x, y)
    assert seen == ["kfac_factor_sums"]
    probs = la(x[:4]).numpy()
    # Without the method, fspace sums the hooks' statistics itself: the same posterior.
    monkeypatch.delattr(TorchCalls, "kfac_factor_sums")
    seen.clear()
    ref = fspace.Laplace(model, "classification", subset_of_weights="all", hessian_structure="kron", backend="torch")
    ref.fit(x, y)
    assert seen == ["kfac_statistics"]
    assert np.max(np.abs(probs - ref(x[:4]).numpy())) <= 1e-12


def test_a_last_layer_fit_makes_one_torch_pass_per_chunk(monkeypatch):
    """laplace-torch's default (last-layer kron) runs the model once over the data: fspace asks
    for the outputs and the last layer's inputs from one hooked pass (``forward_with_features``),
    in memory and from a loader, and without that method it makes the two calls and agrees."""
    torch.manual_seed(5)
    model = ResidualMLP(d=2, q=3).double()
    x, y = torch.randn(20, 2, dtype=torch.float64), torch.randint(0, 3, (20,))
    seen = []
    for method in ("forward", "last_layer_features", "forward_with_features"):
        original = getattr(TorchCalls, method)

        def counted(self, *a, original=original, method=method):
            seen.append(method)
            return original(self, *a)

        monkeypatch.setattr(TorchCalls, method, counted)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)
    probs = []
    for data in [(x, y), (loader,)]:  # the loader's batches may be gathered into fewer calls
        la = fspace.Laplace(model, "classification", backend="torch")
        seen.clear()
        la.fit(*data)
        assert seen and set(seen) == {"forward_with_features"}, seen
        probs.append(la(x[:4]).numpy())
    monkeypatch.delattr(TorchCalls, "forward_with_features")
    ref = fspace.Laplace(model, "classification", backend="torch")
    seen.clear()
    ref.fit(x, y)
    assert seen == ["forward", "last_layer_features"]
    for p in probs:
        assert np.max(np.abs(p - ref(x[:4]).numpy())) <= 1e-12


def test_kron_ekfac_and_last_layer_give_the_same_posterior_on_both_paths():
    torch.manual_seed(5)
    mlp = nn.Sequential(nn.Linear(2, 10), nn.Tanh(), nn.Linear(10, 10), nn.Tanh(), nn.Linear(10, 3)).double()
    cnn = nn.Sequential(nn.Conv2d(1, 3, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(12, 3)).double()
    cases = [(mlp, torch.rand(40, 2, dtype=torch.float64) * 2 - 1, torch.rand(7, 2, dtype=torch.float64)),
             (cnn, torch.randn(30, 1, 6, 6, dtype=torch.float64), torch.randn(7, 1, 6, 6, dtype=torch.float64))]
    for model, x, xs in cases:
        with torch.no_grad():
            labels = model(x).argmax(1)
        for structure, subset in [("kron", "all"), ("ekfac", "all"), ("kron", "last_layer"), ("full", "last_layer")]:
            for likelihood, y in [("classification", labels), ("regression", torch.randn(x.shape[0], 3, dtype=torch.float64))]:
                got = []
                for backend in ["native", "torch"]:
                    la = fspace.Laplace(model, likelihood, hessian_structure=structure, subset_of_weights=subset,
                                        prior_precision=0.7, sigma_noise=0.3 if likelihood == "regression" else 1.0,
                                        kron_bias="separate" if structure == "ekfac" else "folded", backend=backend)
                    la.fit(x, y)
                    out = la(xs, diagonal_output=True)
                    got.append((out[1].numpy() if likelihood == "regression" else out.numpy(), float(la.log_marginal_likelihood())))
                (a, ea), (b, eb) = got
                what = (type(model[0]).__name__, structure, subset, likelihood)
                assert np.max(np.abs(a - b) / np.abs(a)) <= 1e-10, what
                assert abs(ea - eb) <= 1e-10 * abs(ea), what


class SharedLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(2, 2), nn.Linear(2, 1)

    def forward(self, x):
        return self.b(torch.tanh(self.a(torch.tanh(self.a(x)))))


class SquashedOutput(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(2, 1)

    def forward(self, x):
        return torch.tanh(self.a(x))


@pytest.mark.parametrize("model,structure,subset,message", [
    (BatchNormCNN, "kron", "all", r"bn \(BatchNorm2d: weight, bias\).*requires_grad_\(False\)"),
    (TinyAttention, "ekfac", "all", r"attn \(MultiheadAttention: in_proj_weight, in_proj_bias\)"),
    (SharedLayer, "kron", "all", r"layer a \(Linear\) is called 2 times"),
    (SquashedOutput, "full", "last_layer", r"not the output of its last nn.Linear \(a\)"),
    (lambda: nn.Sequential(nn.Linear(2, 3), nn.Tanh(), nn.Linear(3, 1, bias=False)), "kron", "last_layer",
     r"last nn.Linear \(2\) has no trainable bias"),
])
def test_layered_structures_refuse_what_their_factors_cannot_hold(model, structure, subset, message):
    shapes = {BatchNormCNN: (1, 7, 7), TinyAttention: (4, 3)}
    x = torch.randn((5,) + shapes.get(model, (2,)), dtype=torch.float64)
    la = fspace.Laplace(model().double(), "regression", hessian_structure=structure, subset_of_weights=subset)
    with pytest.raises(ValueError, match=message):
        la.fit(x, torch.randn(5, 2 if model in (BatchNormCNN, TinyAttention) else 1, dtype=torch.float64))


def test_kron_on_a_bias_free_layer_equals_the_factors_written_out():
    """f = W₂ tanh(W₁x) + b₂ with W₁ bias-free: KFAC by hand — A₁ = Σ x xᵀ (no 1 appended),
    G₁ = Σᵢ Σ_c δδᵀ / n with δ = (1 − h²) ⊙ W₂ᵀe_c / σ; A₂ = Σ h̃h̃ᵀ with h̃ = [h; 1], G₂ = I/σ² —
    and the predictive variance Σ_l J_l (G_l ⊗ A_l + λ)⁻¹ J_lᵀ, against the torch path."""
    torch.manual_seed(6)
    model = BiasFree(d=3, width=5, q=2).double()
    x = torch.randn(30, 3, dtype=torch.float64)
    xs = torch.randn(4, 3, dtype=torch.float64)
    sigma, lam = 0.4, 0.8
    with torch.no_grad():
        y = model(x) + 0.1 * torch.randn(30, 2, dtype=torch.float64)
    la = fspace.Laplace(model, "regression", subset_of_weights="all", hessian_structure="kron", sigma_noise=sigma, prior_precision=lam,
                        kron_bias="folded")
    la.fit(x, y)
    var = la(xs, diagonal_output=True)[1].numpy()
    w1, w2 = model.a.weight.detach().numpy(), model.b.weight.detach().numpy()
    q, n = 2, x.shape[0]

    def hidden(z):
        return np.tanh(z @ w1.T)

    xn, h = x.numpy(), hidden(x.numpy())
    a1 = xn.T @ xn
    g1 = sum(np.outer(d, d) for hi in h for c in range(q) for d in [(1 - hi**2) * w2[c] / sigma]) / n
    ht = np.hstack([h, np.ones((n, 1))])
    a2, g2 = ht.T @ ht, np.eye(q) / sigma**2
    cov1 = np.linalg.inv(np.kron(g1, a1) + lam * np.eye(a1.shape[0] * g1.shape[0]))
    cov2 = np.linalg.inv(np.kron(g2, a2) + lam * np.eye(a2.shape[0] * q))
    hs = hidden(xs.numpy())
    ref = np.empty((xs.shape[0], q))
    for i, (xi, hi) in enumerate(zip(xs.numpy(), hs)):
        for o in range(q):
            j1 = np.outer((1 - hi**2) * w2[o], xi).reshape(-1)
            j2 = np.outer(np.eye(q)[o], np.append(hi, 1.0)).reshape(-1)
            ref[i, o] = j1 @ cov1 @ j1 + j2 @ cov2 @ j2
    assert np.max(np.abs(var - ref) / ref) <= 1e-10


def test_sequence_logits_are_refused_with_what_to_do():
    """A model returning ``(batch, sequence, classes)`` logits would otherwise be one softmax over
    ``sequence × classes`` classes: every classifier refuses it, naming laplace-torch's own failure
    and the fix; per-position targets get the same advice."""
    torch.manual_seed(0)
    x = torch.randn(12, 5, 3, dtype=torch.float64)
    model = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 4)).double()
    per_sequence = torch.randint(4, (12,))
    for make in (lambda: fspace.Laplace(model, "classification", "all", "diag", backend="torch"),
                 lambda: fspace.Laplace(model, "classification", "last_layer", "kron", backend="torch"),
                 lambda: fspace.VaLLA(model, "classification", steps=2, num_inducing=3, backend="torch")):
        with pytest.raises(ValueError, match=r"\(batch, 5, 4\) logits.*Reduce the sequence"):
            make().fit(x, per_sequence)
    with pytest.raises(ValueError, match="per-position .token. targets"):
        fspace.Laplace(model, "classification", "all", "diag", backend="torch").fit(x, torch.randint(4, (12, 5)))
    # The same model on (batch, features) rows is a classifier as usual.
    fspace.Laplace(model, "classification", "all", "diag", backend="torch").fit(x[:, 0], per_sequence)


def test_a_float32_model_fits_kron_on_the_torch_path():
    """torch's float32 GEMM ``δᵀδ`` is not symmetric to the bit on small shapes (a 10-class
    head over a few dozen rows: ≈ 1e-8 relative), which the factors' eigendecomposition
    refused; the factor sums come back symmetric and the fit runs."""
    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 10))
    x = torch.randn(12, 6)
    y = model(x).argmax(1).detach()
    calls = TorchCalls(model, (6,))
    infos = calls.layer_infos("all")
    q = calls.output_dim
    l = np.random.default_rng(0).standard_normal((12 * q, q))
    for aa, _, _, gg in calls.kfac_factor_sums(calls.params, x.double().numpy(), l, infos, 12):
        assert np.array_equal(aa, aa.T) and np.array_equal(gg, gg.T)
    la = fspace.Laplace(model, "classification", subset_of_weights="all", hessian_structure="kron", backend="torch")
    la.fit(x, y)
    probs = la(x[:3])
    assert probs.shape == (3, 10) and torch.allclose(probs.sum(1), torch.ones(3, dtype=probs.dtype))


def test_post_hoc_fsp_laplace_streams_a_loader_on_the_torch_path():
    """A module fspace cannot convert (a residual block) runs Alg. 2 through torch's
    derivatives; from a loader each batch is added to its ``k × k`` sum as it comes, and the
    posterior is the in-memory one to rounding."""
    torch.manual_seed(6)
    model = ResidualMLP(d=2, q=3).double()
    x = torch.randn(40, 2, dtype=torch.float64)
    y = torch.randint(0, 3, (40,))
    prior = fspace.kernels.Independent(fspace.kernels.RBF(1.0, 1.0), 3)
    whole = fspace.FSPLaplace(model, "classification", prior, train=False, n_laplace_context=25, backend="torch")
    whole.fit(x, y)
    streamed = fspace.FSPLaplace(model, "classification", prior, train=False, n_laplace_context=25, backend="torch",
                                 laplace={"data_batch": 8})
    streamed.fit(torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=6))
    xs = torch.randn(5, 2, dtype=torch.float64)
    assert torch.allclose(streamed(xs), whole(xs), rtol=1e-10, atol=1e-14)


def test_fsp_laplace_trains_from_a_loader_read_by_position_on_the_torch_path():
    """Alg. 1 and Alg. 2 through torch's derivatives, the rows read by position from a loader's
    data set (classification, a residual block the native path cannot take): the weights and the
    predictive of the in-memory fit to the bit, with the context box given (the torch model learns
    its input layout from a first row) or found in a pass."""
    torch.manual_seed(7)
    model = ResidualMLP(d=2, q=3).double()
    x = torch.randn(40, 2, dtype=torch.float64)
    y = torch.randint(0, 3, (40,))
    prior = fspace.kernels.Independent(fspace.kernels.RBF(1.0, 1.0), 3)
    xs = torch.randn(5, 2, dtype=torch.float64)
    for box in (None, {"lower": [-4.0, -4.0], "upper": [4.0, 4.0]}):
        settings = dict(steps=12, batch_size=8, n_context=10, n_laplace_context=25, backend="torch",
                        laplace={"data_batch": 16}, context_box=box)
        whole = fspace.FSPLaplace(model, "classification", prior, **settings)
        whole.fit(x, y)
        read = fspace.FSPLaplace(model, "classification", prior, **settings)
        read.fit(torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=6, shuffle=True))
        for name, w in whole.model_state_dict().items():
            np.testing.assert_array_equal(read.model_state_dict()[name], w)
        assert torch.equal(read(xs), whole(xs))
