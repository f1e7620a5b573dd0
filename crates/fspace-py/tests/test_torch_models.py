"""PyTorch models into fspace: convolutional ``nn.Sequential``s and float32 weights against
torch's own forward, a CNN's Laplace posterior against a dense computation from torch's
Jacobian, and every unsupported layout refused with the module's name.

Needs torch (``cargo xtask test`` installs it; ``--no-torch`` skips these, and then
``$FSPACE_REQUIRE_TORCH`` is unset)."""

import os
import pickle
import re

import numpy as np
import pytest

import fspace
from mlp_reference import fitted


def test_torch_is_present_where_the_suite_requires_it():
    if os.environ.get("FSPACE_REQUIRE_TORCH"):
        import torch  # noqa: F401  (fails the suite rather than skipping the torch tests)
    else:
        pytest.skip("torch is optional here ($FSPACE_REQUIRE_TORCH unset)")


torch = pytest.importorskip("torch")
nn = torch.nn


def small_cnn(act=nn.Tanh, outputs=3, dtype=torch.float64):
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(2, 4, 3, padding=1), act(), nn.MaxPool2d(2),
        nn.Conv2d(4, 5, 3), act(),
        nn.Flatten(), nn.Linear(5 * 2 * 2, 7), act(), nn.Linear(7, outputs),
    ).to(dtype)


def images(n, dtype=torch.float64, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 2, 8, 8, generator=g, dtype=dtype)


def fspace_forward(model, x, **kwargs):
    """fspace's network output at ``x``: the Laplace GLM predictive's mean is ``f(x)``."""
    la = fspace.Laplace(model, "regression", subset_of_weights="all", hessian_structure="diag", **kwargs)
    with torch.no_grad():
        y = model(x).double()
    la.fit(x, y)
    return la(x)[0]


@pytest.mark.parametrize("act", [nn.Tanh, nn.ReLU, nn.Sigmoid, nn.Softplus, lambda: nn.GELU(approximate="tanh")])
def test_a_convolutional_sequential_equals_torchs_forward_in_float64(act):
    model = small_cnn(act)
    x = images(12)
    mean = fspace_forward(model, x)
    assert isinstance(mean, torch.Tensor)
    with torch.no_grad():
        assert torch.max(torch.abs(mean - model(x))).item() <= 1e-12


def test_same_and_valid_padding_and_string_padding_convert():
    torch.manual_seed(3)
    model = nn.Sequential(
        nn.Conv2d(1, 3, 5, padding="same"), nn.ReLU(), nn.MaxPool2d(2, 2),
        nn.Conv2d(3, 2, 2, padding="valid"), nn.ReLU(), nn.Flatten(), nn.Linear(2 * 4 * 4, 2),
    ).double()
    x = torch.randn(6, 1, 10, 10, dtype=torch.float64)
    with torch.no_grad():
        assert torch.max(torch.abs(fspace_forward(model, x) - model(x))).item() <= 1e-12


def test_float32_weights_match_torchs_float32_forward():
    for model, x in [
        (small_cnn(dtype=torch.float32), images(10, torch.float32)),
        (nn.Sequential(nn.Linear(3, 20), nn.Tanh(), nn.Linear(20, 2)), torch.randn(15, 3)),
    ]:
        mean = fspace_forward(model, x)
        with torch.no_grad():
            ref = model(x).double()
        # fspace evaluates the float32 weights exactly in float64; torch rounds each
        # operation to float32.
        assert torch.max(torch.abs(mean - ref)).item() <= 1e-5


def test_flattened_rows_need_the_input_shape():
    model = small_cnn()
    x = images(5)
    rows = x.reshape(5, -1).numpy()
    with pytest.raises(ValueError, match="input_shape"):
        fitted(fspace.Laplace(model, "regression", subset_of_weights="all"), rows, np.zeros((5, 3)))
    la = fspace.Laplace(model, "regression", subset_of_weights="all", hessian_structure="diag", input_shape=(2, 8, 8))
    with torch.no_grad():
        y = model(x).numpy()
    la.fit(rows, y)
    assert np.max(np.abs(np.asarray(la(rows)[0]) - y)) <= 1e-12
    with pytest.raises(ValueError, match="do not match"):
        la(torch.randn(2, 2, 9, 9, dtype=torch.float64))


def dense_laplace_variance(model, x_train, hessian_rows, x_test, prior_precision):
    """``diag(J* (Jᵀ H J + λ I)⁻¹ J*ᵀ)`` per output with ``J`` from torch's Jacobian."""
    params = {k: v.detach() for k, v in model.named_parameters()}
    names = list(params)

    def jac(x):
        def f(*flat):
            return torch.func.functional_call(model, dict(zip(names, flat)), (x,))

        blocks = torch.autograd.functional.jacobian(f, tuple(params[k] for k in names))
        n, q = x.shape[0], blocks[0].shape[1]
        return torch.cat([b.reshape(n * q, -1) for b in blocks], dim=1).numpy()

    j = jac(x_train)
    ggn = j.T @ hessian_rows @ j
    cov = np.linalg.inv(ggn + prior_precision * np.eye(ggn.shape[0]))
    js = jac(x_test)
    return np.einsum("ij,jk,ik->i", js, cov, js).reshape(x_test.shape[0], -1)


def test_a_cnns_full_laplace_variance_equals_the_dense_computation_from_torchs_jacobian():
    model = small_cnn(outputs=2)
    x, xs = images(16), images(5, seed=7)
    with torch.no_grad():
        y = (model(x) + 0.1 * torch.randn(16, 2, generator=torch.Generator().manual_seed(2), dtype=torch.float64))
    sigma, lam = 0.3, 2.0
    la = fspace.Laplace(model, "regression", subset_of_weights="all", hessian_structure="full", prior_precision=lam, sigma_noise=sigma)
    la.fit(x, y)
    _, var = la(xs, diagonal_output=True)
    ref = dense_laplace_variance(model, x, np.eye(32) / sigma**2, xs, lam)
    assert np.max(np.abs(var.numpy() - ref) / ref) <= 1e-8
    # The posterior pickles with its architecture and predicts the same numbers.
    back = pickle.loads(pickle.dumps(la))
    assert np.array_equal(back(xs, diagonal_output=True)[1].numpy(), var.numpy())


def test_a_cnn_runs_every_structure_and_the_function_space_methods():
    model = small_cnn()
    x = images(24)
    labels = torch.randint(0, 3, (24,), generator=torch.Generator().manual_seed(4))
    for structure in ["full", "kron", "ekfac", "diag", "lowrank"]:
        la = fspace.Laplace(model, "classification", subset_of_weights="all", hessian_structure=structure)
        la.fit(x, labels)
        probs = la(images(4, seed=9)).numpy()
        assert np.allclose(probs.sum(axis=1), 1.0, atol=1e-12), structure
    last = fspace.Laplace(model, "classification", subset_of_weights="last_layer", hessian_structure="full")
    last.fit(x, labels)
    assert last(images(3, seed=9)).shape == (3, 3)
    # Post-hoc FSP-Laplace keeps the weights: its mean is torch's forward.
    prior = fspace.GPPrior(fspace.kernels.Independent(fspace.kernels.RBF(1.0, 8.0), 3))
    post = fspace.FSPLaplace(model, "regression", prior, train=False, n_laplace_context=16)
    with torch.no_grad():
        y = model(x)
    post.fit(x, y)
    mean, var = post(x[:4])
    with torch.no_grad():
        assert torch.max(torch.abs(mean - model(x[:4]))).item() <= 1e-12
    assert bool((var > 0).all())
    # From a loader of images, each batch added to Alg. 2's sum as it comes: the same posterior.
    streamed = fspace.FSPLaplace(model, "regression", prior, train=False, n_laplace_context=16,
                                 laplace={"data_batch": 4})
    streamed.fit(torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=5))
    assert torch.allclose(streamed(x[:4])[1], var, rtol=1e-10, atol=0)
    sd = post.model_state_dict()
    assert list(sd) == list(model.state_dict())
    ella = fitted(fspace.ELLA(model, "classification", num_points=12, num_eigen=6, prior={"Fixed": 1.0}), x, labels)
    assert np.allclose(ella(x[:3]).numpy().sum(axis=1), 1.0, atol=1e-12)
    # GFSVI differentiates J S Jᵀ through the network, which the CNN does not implement.
    with pytest.raises(NotImplementedError, match="J S Jᵀ"):
        fitted(fspace.GFSVI(model, "regression", prior, epochs=1), x, y)


BAD_MODELS = [
    ("stride", lambda: nn.Sequential(nn.Conv2d(1, 2, 3, stride=2), nn.Tanh(), nn.Flatten(), nn.Linear(18, 1)), ValueError, "stride"),
    ("dilation", lambda: nn.Sequential(nn.Conv2d(1, 2, 3, dilation=2), nn.Tanh(), nn.Flatten(), nn.Linear(8, 1)), ValueError, "dilation"),
    ("groups", lambda: nn.Sequential(nn.Conv2d(2, 2, 3, groups=2), nn.Tanh(), nn.Flatten(), nn.Linear(8, 1)), ValueError, "groups"),
    ("padding", lambda: nn.Sequential(nn.Conv2d(1, 2, 3, padding=2), nn.Tanh(), nn.Flatten(), nn.Linear(8, 1)), ValueError, "padding"),
    ("reflect", lambda: nn.Sequential(nn.Conv2d(1, 2, 3, padding=1, padding_mode="reflect"), nn.Tanh(), nn.Flatten(), nn.Linear(8, 1)), ValueError, "padding_mode"),
    ("rectangular", lambda: nn.Sequential(nn.Conv2d(1, 2, (3, 1)), nn.Tanh(), nn.Flatten(), nn.Linear(8, 1)), ValueError, "square"),
    ("no bias", lambda: nn.Sequential(nn.Conv2d(1, 2, 3, bias=False), nn.Tanh(), nn.Flatten(), nn.Linear(8, 1)), ValueError, "no bias"),
    ("pool 3", lambda: nn.Sequential(nn.Conv2d(1, 2, 3), nn.Tanh(), nn.MaxPool2d(3), nn.Flatten(), nn.Linear(8, 1)), ValueError, "MaxPool2d"),
    ("pool before act", lambda: nn.Sequential(nn.Conv2d(1, 2, 3), nn.MaxPool2d(2), nn.Tanh(), nn.Flatten(), nn.Linear(8, 1)), ValueError, "pools once"),
    ("avgpool", lambda: nn.Sequential(nn.Conv2d(1, 2, 3), nn.Tanh(), nn.AvgPool2d(2), nn.Flatten(), nn.Linear(8, 1)), TypeError, "AvgPool2d"),
    ("batchnorm", lambda: nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.Tanh(), nn.Flatten(), nn.Linear(8, 1)), TypeError, "BatchNorm2d"),
    ("no flatten", lambda: nn.Sequential(nn.Conv2d(1, 2, 3), nn.Tanh(), nn.Linear(8, 1)), ValueError, "Flatten"),
    ("conv after linear", lambda: nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Conv2d(1, 2, 3)), ValueError, "before Flatten"),
    ("no activation after conv", lambda: nn.Sequential(nn.Conv2d(1, 2, 3), nn.Flatten(), nn.Linear(8, 1)), ValueError, "activation after every Conv2d"),
    ("two activations", lambda: nn.Sequential(nn.Conv2d(1, 2, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8, 4), nn.Tanh(), nn.Linear(4, 1)), ValueError, "one activation"),
    ("ends in activation", lambda: nn.Sequential(nn.Linear(2, 3), nn.Tanh()), ValueError, "end in a Linear"),
    ("custom module", lambda: nn.Module(), TypeError, "not an nn.Sequential"),
]


@pytest.mark.parametrize("label,make,error,match", BAD_MODELS, ids=[b[0] for b in BAD_MODELS])
def test_an_unsupported_model_is_refused_naming_the_module(label, make, error, match):
    # backend="native": fspace's own networks only (the default "auto" would take these
    # models through torch's derivatives instead; test_torch_path.py).
    with pytest.raises(error, match=match):
        fspace.Laplace(make(), "regression", subset_of_weights="all", backend="native")
    if label != "custom module":
        # "auto" takes the model through torch's derivatives instead, keeping the reason.
        la = fspace.Laplace(make(), "regression", subset_of_weights="all", hessian_structure="kron")
        assert re.search(match, la._spec.why), la._spec.why


def test_images_of_the_wrong_size_are_a_value_error():
    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.Tanh(), nn.Flatten(), nn.Linear(8, 1)).double()
    la = fspace.Laplace(model, "regression", subset_of_weights="all", hessian_structure="diag")
    # 5×5 images give 2·3·3 = 18 features, not the Linear layer's 8.
    with pytest.raises(ValueError):
        la.fit(torch.randn(4, 1, 5, 5, dtype=torch.float64), torch.randn(4, 1, dtype=torch.float64))


def test_the_function_space_methods_fit_a_model_at_its_weights_when_fit_is_called():
    """``FSPLaplace``, ``ELLA`` and laplace-torch's ELLA (``Laplace(..., "gp")``) made before a
    float32 ``nn.Sequential`` is trained fit the trained weights (as laplace-torch reads the
    model when it fits): the same posterior as an object made after training."""
    torch.manual_seed(0)
    x = torch.randn(60, 2)
    y = (x[:, 0] * x[:, 1] > 0).long()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=20)

    def makers(model):
        prior = fspace.kernels.Independent(fspace.kernels.RBF(1.0, 1.0), 2)
        return [
            lambda: fspace.FSPLaplace(model, "classification", prior, train=False, n_laplace_context=25),
            lambda: fspace.ELLA(model, "classification", num_points=30, num_eigen=5, prior={"Fixed": 1.0},
                                early_stopping=None),
            lambda: fspace.Laplace(model, "classification", "all", "gp", functional_approximation="nystrom",
                                   subsample_size=30, n_eigenvalues=5),
        ]

    model = nn.Sequential(nn.Linear(2, 12), nn.Tanh(), nn.Linear(12, 2))
    early = [make() for make in makers(model)]
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    for _ in range(50):
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    late = [make() for make in makers(model)]
    for before, after in zip(early, late):
        before.fit(loader)
        after.fit(loader)
        np.testing.assert_allclose(np.asarray(before(x[:7])), np.asarray(after(x[:7])), rtol=1e-12, atol=1e-14,
                                   err_msg=type(before).__name__)
