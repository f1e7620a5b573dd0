"""laplace-torch 0.3's ``hessian_structure="gp"`` with ``functional_approximation="variational"``
(its ``VaLLA`` class) against ``fspace.Laplace`` with the same call: the same inducing inputs from
the same seeds (``"random"``, SciPy's ``kmeans2``, explicit), the same Adam path over ``L``, ``λ``,
``σ`` and ``Z``, so the same objective history, learned hyperparameters, predictive and samples;
then what both refuse and what fspace adds."""

from __future__ import annotations

import contextlib
import pickle
import warnings

import pytest

torch = pytest.importorskip("torch")
laplace = pytest.importorskip("laplace", reason="laplace-torch is installed by `cargo xtask test`")
pytest.importorskip("scipy", reason="laplace-torch's kmeans inducing choice runs scipy's kmeans2")

import fspace  # noqa: E402
from test_laplace_parity import _cnn, _Residual, close, data, loader, mlp  # noqa: E402

# laplace-torch factors [Lᵀ J_Z / √λ; I] by QR in p + M rows, fspace B = I + Lᵀ K_Z L / λ by
# Cholesky in M: the same numbers to rounding, carried along the Adam path (measured ≤ 1e-14).
RTOL = 1e-10


@contextlib.contextmanager
def quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _pair(model, lik, positional, options):
    out = []
    for lib in (laplace, fspace):
        if positional:
            # VaLLA's positional order after the structure: inducing_locations, num_inducing,
            # inducing_classes, sigma_noise, prior_precision, prior_mean, temperature, enable_backprop,
            # dict_key_x, dict_key_y, backend, backend_kwargs, seed, alpha, mc_softmax_samples.
            o = dict(options)
            la = lib.Laplace(model, lik, "all", "gp", o.pop("inducing_locations"), o.pop("num_inducing", None), None,
                             o.pop("sigma_noise", 1.0), o.pop("prior_precision", 1.0), 0.0, o.pop("temperature", 1.0),
                             False, "input_ids", "labels", None, None, o.pop("seed", 0), o.pop("alpha", 1.0),
                             o.pop("mc_softmax_samples", 0), functional_approximation="variational", **o)
        else:
            la = lib.Laplace(model, lik, subset_of_weights="all", hessian_structure="gp",
                             functional_approximation="variational", **options)
        out.append(la)
    return out


def _compare(ref, la, xt, what):
    """The fitted state and every predictive of two fitted objects."""
    assert len(la.fit_history_["objective"]) == len(ref.fit_history_["objective"])
    close(torch.tensor(la.fit_history_["objective"]), torch.tensor(ref.fit_history_["objective"]), RTOL, f"{what} objective")
    assert len(la.fit_history_["val_nll"]) == len(ref.fit_history_["val_nll"])
    if ref.fit_history_["val_nll"]:
        close(torch.tensor(la.fit_history_["val_nll"]), torch.tensor(ref.fit_history_["val_nll"]), RTOL, f"{what} val_nll")
    close(la.L, ref.L, RTOL, f"{what} L")
    close(la.prior_precision, ref.prior_precision, RTOL, f"{what} λ")
    close(la.sigma_noise, ref.sigma_noise, RTOL, f"{what} σ")
    close(torch.as_tensor(la.inducing_locations).detach(), torch.as_tensor(ref.inducing_locations).detach(), RTOL,
          f"{what} Z")
    assert torch.equal(la.inducing_classes, ref.inducing_classes)
    assert la.n_data == ref.n_data
    if la.likelihood == "regression":
        for kw in ({}, {"joint": True}, {"diagonal_output": True}):
            for a, b in zip(la(xt, **kw), ref(xt, **kw)):
                close(a, b, RTOL, f"{what} {kw}")
    else:
        for link in ("probit", "bridge", "bridge_norm", "mc"):
            g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
            close(la(xt, link_approx=link, n_samples=20, generator=g1),
                  ref(xt, link_approx=link, n_samples=20, generator=g2), RTOL, f"{what} {link}")
    for joint in (False, True):
        g1, g2 = torch.Generator().manual_seed(4), torch.Generator().manual_seed(4)
        close(la.predictive_samples(xt, n_samples=5, generator=g1, joint=joint),
              ref.predictive_samples(xt, n_samples=5, generator=g2, joint=joint), RTOL, f"{what} samples")


CASES = [
    ("regression", dict(inducing_locations="random", num_inducing=10, sigma_noise=0.3, prior_precision=2.0)),
    ("regression", dict(inducing_locations="kmeans", num_inducing=6, alpha=0.5, temperature=2.0)),
    ("regression", dict(inducing_locations="explicit", alpha=0.0)),
    ("classification", dict(inducing_locations="random", num_inducing=9)),
    ("classification", dict(inducing_locations="random", num_inducing=9, alpha=0.5, mc_softmax_samples=7, seed=3)),
    ("classification", dict(inducing_locations="kmeans", num_inducing=5, alpha=0.0, mc_softmax_samples=4)),
]


@pytest.mark.parametrize("lik,options", CASES, ids=["random", "kmeans, α=0.5, T=2", "explicit, α=0",
                                                     "random, probit", "MC, α=0.5", "kmeans, MC, α=0"])
@pytest.mark.parametrize("positional", [False, True], ids=["keyword", "positional"])
def test_valla_gives_laplace_torchs_numbers(lik, options, positional):
    """The objective history, L, λ, σ, Z, validation NLLs, predictive (joint, diagonal, every link) and samples after Adam on the same minibatches, ≤ 1e-10."""
    d_out = 2 if lik == "regression" else 3
    model = mlp(2, d_out, 11)
    x, y = data(lik, 60, 12, d_out)
    xt, _ = data(lik, 7, 13, d_out)
    options = dict(options)
    if options["inducing_locations"] == "explicit":
        options["inducing_locations"] = x[:8].clone()
    ref, la = _pair(model, lik, positional, options)
    assert type(la).__name__ == "VaLLALaplace" and type(ref).__name__ == "VaLLA"
    with quiet():
        for obj in (ref, la):
            obj.fit(loader(x, y, 16), iterations=25, lr=1e-2, val_loader=loader(*data(lik, 30, 14, d_out)), val_steps=10)
    _compare(ref, la, xt, f"{lik} {options}")
    # override=False continues both from where they stopped.
    with quiet():
        for obj in (ref, la):
            obj.fit(loader(x, y, 16), iterations=5, lr=1e-2, override=False)
    _compare(ref, la, xt, f"{lik} continued")


@pytest.mark.parametrize("name,make,shape", [("residual", _Residual, (2,)), ("cnn", _cnn, (1, 4, 4))])
def test_valla_on_a_cnn_and_a_non_sequential_model_gives_laplace_torchs_numbers(name, make, shape):
    """A residual module and a CNN (both on the torch path: the NTK's input gradient by `jacrev`), inducing inputs moving, ≤ 1e-10."""
    model = make(3).double()
    g = torch.Generator().manual_seed(5)
    x = torch.randn(40, *shape, generator=g, dtype=torch.float64)
    y = torch.randint(3, (40,), generator=g)
    ref, la = _pair(model, "classification", False, dict(inducing_locations="random", num_inducing=6))
    with quiet():
        for obj in (ref, la):
            obj.fit(loader(x, y, 10), iterations=8, lr=1e-2)
    _compare(ref, la, x[:5], name)


def test_valla_saves_refuses_and_checks_as_laplace_torch():
    """state_dict / load_state_dict and pickling give the same predictive; the refusals (evidence, prior tuning, bad settings) are laplace-torch's."""
    model = mlp(2, 2, 21)
    x, y = data("regression", 40, 22, 2)
    la = fspace.Laplace(model, "regression", "all", "gp", functional_approximation="variational",
                        inducing_locations="kmeans", num_inducing=7, sigma_noise=0.5)
    with pytest.raises(RuntimeError, match="Call fit"):
        la(x[:3])
    la.fit(loader(x, y, 10), iterations=12, lr=2e-2)
    again = fspace.Laplace(model, "regression", "all", "gp", functional_approximation="variational",
                           inducing_locations="kmeans", num_inducing=7, sigma_noise=0.5)
    again.load_state_dict(la.state_dict())
    back = pickle.loads(pickle.dumps(la))
    for other in (again, back):
        for a, b in zip(other(x[:5], joint=True), la(x[:5], joint=True)):
            assert torch.equal(a, b)
        assert torch.equal(other.L, la.L) and float(other.sigma_noise) == float(la.sigma_noise)
    ref = laplace.Laplace(model, "regression", "all", "gp", functional_approximation="variational",
                          inducing_locations="kmeans", num_inducing=7)
    for call in (lambda o: o.optimize_prior_precision(), lambda o: o.log_marginal_likelihood(), lambda o: o.log_likelihood):
        errors = []
        for obj in (ref, la):
            with pytest.raises(NotImplementedError) as info:
                call(obj)
            errors.append(str(info.value))
        assert errors[0] == errors[1]
    bad = [dict(inducing_locations="grid", num_inducing=3), dict(inducing_locations="random"),
           dict(inducing_locations=x[:4], num_inducing=5), dict(inducing_locations="random", num_inducing=3, alpha=1.5),
           dict(inducing_locations="random", num_inducing=3, prior_precision=[1.0, 2.0]),
           dict(inducing_locations="random", num_inducing=3, prior_mean=1.0),
           dict(inducing_locations=x[:4], inducing_classes=[0, 1])]
    for options in bad:
        messages = []
        for lib in (laplace, fspace):
            with pytest.raises(ValueError) as info:
                lib.Laplace(model, "regression", "all", "gp", functional_approximation="variational", **options)
            messages.append(str(info.value))
        assert messages[0] == messages[1], options
    with pytest.raises(ValueError, match="alpha != 1 requires mc_softmax_samples"):
        fspace.Laplace(mlp(2, 3, 1), "classification", "all", "gp", functional_approximation="variational",
                       inducing_locations="random", num_inducing=3, alpha=0.5)
    for bad_fit in (dict(iterations=0), dict(lr=float("nan")), dict(val_steps=0)):
        with pytest.raises(ValueError):
            la.fit(loader(x, y, 10), **bad_fit)
    with pytest.raises(ValueError, match="nonempty"):
        la.fit(loader(x[:0], y[:0], 10))


def test_valla_keeps_fixed_inducing_inputs_fixed():
    """Integer inducing inputs stay put in both libraries, and fspace's `optimize_inducing=False` keeps floating-point ones where they started (the other parameters still learn)."""
    model = mlp(2, 2, 31)
    x, y = data("regression", 40, 32, 2)
    z = x[:6].clone()
    la = fspace.Laplace(model, "regression", "all", "gp", functional_approximation="variational",
                        inducing_locations=z, optimize_inducing=False)
    la.fit(loader(x, y, 10), iterations=10, lr=5e-2)
    assert torch.equal(la.inducing_locations.detach(), z)
    assert not torch.equal(la.L.detach(), torch.eye(6)[tuple(torch.tril_indices(6, 6))])
    assert float(la.prior_precision) != 1.0


def test_the_kernel_blocks_and_their_inducing_gradient_are_independent_checks():
    """`NtkKernel`'s blocks equal `J Jᵀ` of torch.func's Jacobian, and the pull-back to `Z` (the MLP's layer-wise rule, and the torch path's `jacrev`) equals a central difference of `⟨C_xz, J(X)J(Z)ᵀ⟩ + ⟨C_zz, J(Z)J(Z)ᵀ⟩` (≤ 1e-7 relative)."""
    from fspace._fspace import NtkKernel

    model = mlp(2, 3, 41)
    g = torch.Generator().manual_seed(42)
    x = torch.randn(5, 2, generator=g, dtype=torch.float64)
    z = torch.randn(4, 2, generator=g, dtype=torch.float64)
    classes = [0, 2, 1, 2]
    c_xz = torch.randn(15, 4, generator=g, dtype=torch.float64).numpy()
    c_zz = torch.randn(4, 4, generator=g, dtype=torch.float64).numpy()
    native = fspace.Laplace(model, "classification", "all", "gp", functional_approximation="variational",
                            inducing_locations=z, inducing_classes=classes)
    on_torch = fspace.Laplace(model, "classification", "all", "gp", functional_approximation="variational",
                              inducing_locations=z, inducing_classes=classes, backend="torch")
    kernel = native._ensure_kernel()
    f, kxz, kzz, kxx = kernel.blocks(x.numpy(), z.numpy(), classes)
    params = dict(model.named_parameters())

    def jacobian(inputs):
        jac = torch.func.jacrev(lambda p: torch.func.functional_call(model, p, (inputs,)))(params)
        return torch.cat([j.reshape(inputs.shape[0] * 3, -1) for j in jac.values()], dim=1).detach()

    jx, jz = jacobian(x), jacobian(z)[torch.arange(4) * 3 + torch.tensor(classes)]
    close(torch.from_numpy(f), model(x).detach(), 1e-12, "f")
    close(torch.from_numpy(kxz), jx @ jz.T, 1e-12, "K_xz")
    close(torch.from_numpy(kzz), jz @ jz.T, 1e-12, "K_zz")
    close(torch.from_numpy(kxx), torch.stack([jx[3 * i:3 * i + 3] @ jx[3 * i:3 * i + 3].T for i in range(5)]), 1e-12,
          "K_xx blocks")

    def value(zz):
        _, a, b, _ = kernel.blocks(x.numpy(), zz, classes)
        return float((c_xz * a).sum() + (c_zz * b).sum())

    grad = kernel.pullback_z(x.numpy(), z.numpy(), classes, c_xz, c_zz)
    on_torch._inputs(x)
    grad_torch = on_torch._spec.calls().ntk_pullback_inducing(x.numpy(), z.numpy(), classes, c_xz, c_zz)
    h = 1e-5
    fd = torch.zeros(4, 2, dtype=torch.float64)
    for i in range(4):
        for j in range(2):
            up, down = z.numpy().copy(), z.numpy().copy()
            up[i, j] += h
            down[i, j] -= h
            fd[i, j] = (value(up) - value(down)) / (2 * h)
    close(torch.from_numpy(grad), fd, 1e-7, "native pull-back")
    close(torch.from_numpy(grad_torch), fd, 1e-7, "torch pull-back")
    with pytest.raises(ValueError, match="one output index per input"):
        kernel.blocks(x.numpy(), z.numpy(), classes[:3])
    with pytest.raises(ValueError, match="not below"):
        kernel.blocks(x.numpy(), z.numpy(), [0, 1, 2, 3])
    with pytest.raises(ValueError, match="columns"):
        kernel.blocks(x.numpy()[:, :1], z.numpy(), classes)
    with pytest.raises(ValueError, match="cotangents"):
        kernel.pullback_z(x.numpy(), z.numpy(), classes, c_xz[:3], c_zz)
