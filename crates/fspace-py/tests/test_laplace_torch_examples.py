"""laplace-torch's own README and examples, their Laplace calls as printed, run through both
libraries: each example's script body is a function of the ``Laplace`` it imports (and, where it
uses them, ``marglik_training`` and a curvature backend), run once with laplace-torch's and once
with fspace's, and the numbers compared. The examples' datasets (CIFAR-10, a WideResNet, their
toy generators) are replaced by small generated data of the same kind; the calls are not
changed. Where fspace refuses a call the example makes, the error names why.

The scripts run with torch's default dtype set to float64 (as the BayesOpt example sets it), so
both libraries compute in float64: in float32 laplace-torch's own rounding — its float32
eigendecompositions put the README example's evidence 1.2e-4 (relative) off the float64 value,
which fspace's float32 run gives to 1e-13 — would hide a real difference.

Covered elsewhere: the HuggingFace / LoRA recipe (``test_lora.py``), laplace-torch's ELLA
(``test_ella_parity.py``) and VaLLA (``test_valla_parity.py``) beyond their examples, subnetwork
masks and ``marglik_training`` options (``test_laplace_parity.py``), the refused
``"reward_modeling"`` (the parity table's refusals; its example, reward_modeling_example.py, too).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
laplace = pytest.importorskip("laplace")

import fspace  # noqa: E402
from laplace.curvature import AsdlGGN, BackPackGGN  # noqa: E402
from laplace.utils.enums import HessianStructure, Likelihood, PredType, SubsetOfWeights  # noqa: E402

LIBRARIES = {"laplace-torch": laplace, "fspace": fspace}


@pytest.fixture(autouse=True)
def float64_default():
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(before)


def close(a, b, rtol, what, atol=0.0):
    a = torch.as_tensor(a, dtype=torch.float64).detach()
    b = torch.as_tensor(b, dtype=torch.float64).detach()
    assert a.shape == b.shape, (what, a.shape, b.shape)
    err = (a - b).abs().max().item() if a.numel() else 0.0
    scale = b.abs().max().item() if b.numel() else 0.0
    assert err <= rtol * max(scale, 1e-300) + atol, f"{what}: max |Δ| {err:.3e}, scale {scale:.3e}"


def sinusoid(n=150, sigma_noise=0.3, seed=711):
    """The examples' ``get_sinusoid_example``: x ~ U(0, 8), y = sin(x) + noise, one full batch."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.rand(n, generator=g) * 8).unsqueeze(-1)
    y = torch.sin(x) + torch.randn(x.shape, generator=g) * sigma_noise
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=n)
    return x, y, loader, torch.linspace(-5, 13, 50).unsqueeze(-1)


def trained_regressor(loader, epochs=300):
    torch.manual_seed(711)
    model = torch.nn.Sequential(torch.nn.Linear(1, 50), torch.nn.Tanh(), torch.nn.Linear(50, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(epochs):
        for x, y in loader:
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
    return model


def blobs(n, seed, classes=3, shift=0.0):
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % classes
    centres = torch.tensor([[math.cos(2 * math.pi * c / classes), math.sin(2 * math.pi * c / classes)]
                            for c in range(classes)]) * 2 + shift
    return centres[y] + 0.6 * torch.randn(n, 2, generator=g), y


def trained_classifier(x, y, classes=3, epochs=200):
    torch.manual_seed(5)
    model = torch.nn.Sequential(torch.nn.Linear(2, 16), torch.nn.Tanh(), torch.nn.Linear(16, classes))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(epochs):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    return model


def test_readme_post_hoc_prior_precision_tuning_of_a_diagonal_la():
    """README, "Post-hoc prior precision tuning of diagonal LA": all weights, ``diag``, the
    prior precision by the validation search (``method='CV'`` in the README's first versions:
    laplace-torch 0.3 and fspace refuse it alike, naming ``marglik`` / ``gridsearch``), then the
    probit predictive."""
    x, y = blobs(120, seed=1)
    xv, yv = blobs(60, seed=2)
    model = trained_classifier(x, y)
    train_loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=32)
    val_loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(xv, yv), batch_size=32)
    preds = {}
    for name, lib in LIBRARIES.items():
        la = lib.Laplace(model, 'classification',
                         subset_of_weights='all',
                         hessian_structure='diag')
        la.fit(train_loader)
        with pytest.raises(ValueError, match="marglik|gridsearch"):
            la.optimize_prior_precision(method='CV', val_loader=val_loader)
        la.optimize_prior_precision(method='gridsearch', val_loader=val_loader)
        preds[name] = (la(xv[:16], link_approx='probit'), la.prior_precision)
    close(preds["fspace"][1], preds["laplace-torch"][1], 1e-10, "the searched λ")
    close(preds["fspace"][0], preds["laplace-torch"][0], 1e-8, "probit predictive")


def test_readme_differentiating_the_log_marginal_likelihood():
    """README: the library default (last-layer KFAC), ``log_marginal_likelihood(prior_prec,
    obs_noise)`` and ``backward()``. The evidence and its gradient in λ agree; the gradient in σ
    of laplace-torch's ``kron`` is not exact (docs/laplace-torch.md, "Where fspace differs"), so
    fspace's is checked against a central difference of its own evidence."""
    _, _, train_loader, _ = sinusoid()
    model = trained_regressor(train_loader)
    out = {}
    for name, lib in LIBRARIES.items():
        la = lib.Laplace(model, likelihood='regression')
        la.fit(train_loader)
        prior_prec = torch.tensor([0.7], requires_grad=True)
        obs_noise = torch.tensor([0.4], requires_grad=True)
        ml = la.log_marginal_likelihood(prior_prec, obs_noise)
        ml.backward()
        out[name] = (ml.detach(), prior_prec.grad, obs_noise.grad, la)
    close(out["fspace"][0], out["laplace-torch"][0], 1e-10, "evidence")
    close(out["fspace"][1], out["laplace-torch"][1], 1e-8, "∂ evidence / ∂λ")
    la, h = out["fspace"][3], 1e-5
    lam = torch.tensor([0.7], dtype=torch.float64)
    central = (la.log_marginal_likelihood(lam, torch.tensor([0.4 + h], dtype=torch.float64))
               - la.log_marginal_likelihood(lam, torch.tensor([0.4 - h], dtype=torch.float64))) / (2 * h)
    close(out["fspace"][2].reshape(-1), central.reshape(-1), 1e-5, "∂ evidence / ∂σ against a central difference")


def test_calibration_example():
    """examples/calibration_example.py: last-layer KFAC on a classifier, λ by the evidence,
    the predictive of each test batch under ``torch.no_grad()`` (a loop over a loader with the
    Laplace object in the model's place)."""
    x, y = blobs(200, seed=3)
    xt, yt = blobs(80, seed=4)
    model = trained_classifier(x, y).eval()
    train_loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=32)
    test_loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(xt, yt), batch_size=32)

    @torch.no_grad()
    def predict(dataloader, model, laplace=False):
        py = []
        for x, _ in dataloader:
            if laplace:
                py.append(model(x))
            else:
                py.append(torch.softmax(model(x), dim=-1))
        return torch.cat(py).cpu()

    probs = {}
    for name, lib in LIBRARIES.items():
        la = lib.Laplace(model, 'classification',
                         subset_of_weights='last_layer',
                         hessian_structure='kron')
        la.fit(train_loader)
        la.optimize_prior_precision(method='marglik')
        probs[name] = predict(test_loader, la, laplace=True)
    assert probs["fspace"].shape == (80, 3)
    close(probs["fspace"], probs["laplace-torch"], 1e-8, "calibration example's probabilities")
    nll = -torch.distributions.Categorical(probs["fspace"]).log_prob(yt).mean()
    assert torch.isfinite(nll)


def test_regression_example():
    """examples/regression_example.py: all weights, ``full``; the README loop on (log λ, log σ)
    (fewer steps than the example's 1 000), ``la.sigma_noise.item()``,
    ``la.prior_precision.item()``, ``f_mu, f_var = la(X_test)``; then ``marglik_training`` with
    the example's arguments (BackPACK's GGN, Adam at 1e-2, a scalar prior). ``full`` agrees to
    1e-7, laplace-torch's full-GGN error (docs/laplace-torch.md) carried through the steps."""
    X_train, y_train, train_loader, X_test = sinusoid()
    model = trained_regressor(train_loader)
    out = {}
    for name, lib in LIBRARIES.items():
        la = lib.Laplace(model, 'regression', subset_of_weights='all', hessian_structure='full')
        la.fit(train_loader)
        log_prior, log_sigma = torch.ones(1, requires_grad=True), torch.ones(1, requires_grad=True)
        hyper_optimizer = torch.optim.Adam([log_prior, log_sigma], lr=1e-1)
        for i in range(100):
            hyper_optimizer.zero_grad()
            neg_marglik = - la.log_marginal_likelihood(log_prior.exp(), log_sigma.exp())
            neg_marglik.backward()
            hyper_optimizer.step()
        f_mu, f_var = la(X_test)
        f_mu = f_mu.squeeze().detach().cpu().numpy()
        f_sigma = f_var.squeeze().sqrt().cpu().numpy()
        pred_std = np.sqrt(f_sigma**2 + la.sigma_noise.item()**2)
        out[name] = (la.sigma_noise.item(), la.prior_precision.item(), f_mu, pred_std)
    for i, what in enumerate(("σ", "λ", "f_mu", "predictive std")):
        close(out["fspace"][i], out["laplace-torch"][i], 1e-7, f"regression example: {what}")

    trained = {}
    for name, lib in LIBRARIES.items():
        torch.manual_seed(711)
        model = torch.nn.Sequential(torch.nn.Linear(1, 50), torch.nn.Tanh(), torch.nn.Linear(50, 1))
        la, model, margliks, losses = lib.marglik_training(
            model=model, train_loader=train_loader, likelihood='regression',
            hessian_structure='full', backend=BackPackGGN, n_epochs=20,
            optimizer_kwargs={'lr': 1e-2}, prior_structure='scalar'
        )
        f_mu, f_var = la(X_test)
        trained[name] = (la.sigma_noise.item(), la.prior_precision.numpy(), f_mu.detach(), f_var.detach(),
                         torch.as_tensor(margliks), torch.as_tensor(losses))
    for i, what in enumerate(("σ", "λ", "f_mu", "f_var", "evidences", "losses")):
        close(trained["fspace"][i], trained["laplace-torch"][i], 1e-7, f"marglik_training: {what}")


def test_continual_learning_example():
    """examples/continual_learning_example.py on two generated tasks (five epochs each): a
    ``diag`` Laplace over all weights with λ = 1e-4 and ASDL's GGN, read before its first fit
    (``la.H.clone()``, ``la.log_prob(mean)`` in the training loss: laplace-torch's zero-curvature
    posterior), refitted after each task with ``fit(train_loader, override=False)``, and the
    hyper-Laplace whose prior is the running posterior (``prior_mean=la.mean``,
    ``prior_precision=la.posterior_precision``) optimised on its evidence. The two libraries
    train the same network: predictive, evidences, ``H`` and weights within 1e-8."""
    from torch.nn.utils import parameters_to_vector

    tasks = []
    for t in range(2):
        x, y = blobs(200, seed=10 + t, classes=2, shift=3.0 * t)
        tasks.append(torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=50))
    grid = torch.stack(torch.meshgrid(torch.linspace(-4, 7, 12), torch.linspace(-4, 7, 12), indexing="ij"), -1)
    test_loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(grid.reshape(-1, 2), torch.zeros(144)),
                                              batch_size=48)

    def run(lib):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(2, 20), torch.nn.Sigmoid(), torch.nn.Linear(20, 20),
                                    torch.nn.Sigmoid(), torch.nn.Linear(20, 2))
        la = lib.Laplace(
            model, 'classification',
            subset_of_weights='all',
            hessian_structure='diag',
            prior_precision=1e-4,
            backend=AsdlGGN)
        margliks = []

        def train(task_id, model, la, train_loader):
            loss_fn = torch.nn.CrossEntropyLoss()
            optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
            log_prior_prec = np.log(1e-4) * torch.ones(1)
            log_prior_prec.requires_grad = True
            hyper_optimizer = torch.optim.Adam([log_prior_prec], lr=0.01)
            prior_prec_offset = la.H.clone()
            N = len(train_loader.dataset)
            model.train()
            for epoch in range(5):
                for X, y in train_loader:
                    f = model(X)
                    mean = parameters_to_vector(model.parameters())
                    loss = loss_fn(f, y) - la.log_prob(mean) / N
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
            hyper_la = lib.Laplace(
                model, 'classification',
                subset_of_weights='all',
                hessian_structure='diag',
                prior_mean=la.mean,
                prior_precision=la.posterior_precision,
                backend=AsdlGGN)
            hyper_la.fit(train_loader)
            for _ in range(20):
                hyper_optimizer.zero_grad()
                prior_prec_init = torch.exp(log_prior_prec)
                prior_prec = prior_prec_init + prior_prec_offset
                marglik = -hyper_la.log_marginal_likelihood(prior_prec)
                marglik.backward()
                hyper_optimizer.step()
            margliks.append(marglik.item() / N)

        for task_id, train_loader in enumerate(tasks):
            train(task_id, model, la, train_loader)
            la.fit(train_loader, override=False)
        cl_outputs = torch.cat([la(X) for X, _ in test_loader], dim=0)
        return cl_outputs.detach(), torch.tensor(margliks), la.H.detach(), parameters_to_vector(model.parameters()).detach()

    ref, got = run(laplace), run(fspace)
    assert got[0].shape == (144, 2)
    for i, what in enumerate(("predictive", "negative evidences", "H after both tasks", "trained weights")):
        close(got[i], ref[i], 1e-8, f"continual learning: {what}")


def test_expectation_example():
    """examples/expectation_example.py: laplace-torch's enums for every name, ``kron`` over all
    weights with ``enable_backprop=True``, ``optimize_prior_precision(PredType.GLM)``, then
    Thompson samples and Monte-Carlo expected improvement differentiated in the inputs. The GLM
    draws come from the same global generator state in both libraries: the samples, EI and their
    gradients in ``x_test`` agree (≤ 1e-10); the ``nn`` draws (fspace's weight samples come from
    its own generator) give laplace-torch's shapes and a finite, non-vanishing gradient."""
    torch.manual_seed(123)
    model = torch.nn.Sequential(torch.nn.Linear(2, 10), torch.nn.GELU(), torch.nn.Linear(10, 1))
    X, Y = torch.randn(5, 2), torch.randn(5, 1)
    train_loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, Y), batch_size=3)
    out = {}
    for name, lib in LIBRARIES.items():
        la = lib.Laplace(model, Likelihood.REGRESSION, subset_of_weights=SubsetOfWeights.ALL,
                         hessian_structure=HessianStructure.KRON, enable_backprop=True)
        la.fit(train_loader)
        la.optimize_prior_precision(PredType.GLM)
        results = [la.prior_precision.detach()]
        f_best = torch.tensor(0.123)
        for pred_type in (PredType.GLM, PredType.NN):
            torch.manual_seed(7)
            x_test = torch.randn(10, 2)
            x_test.requires_grad = True
            f_sample = la.functional_samples(x_test, pred_type=pred_type, n_samples=1).squeeze(0)
            assert f_sample.requires_grad and f_sample.shape == (10, 1)
            grad_ts = torch.autograd.grad(f_sample.sum(), x_test)[0]
            f_samples = la.functional_samples(x_test, pred_type=pred_type, n_samples=10)
            ei = (f_samples - f_best.reshape(1, 1, 1)).clamp(0.0).mean(0)
            grad_ei = torch.autograd.grad(ei.sum(), x_test)[0]
            assert ei.shape == (10, 1) and torch.isfinite(grad_ei).all() and not torch.allclose(grad_ts, torch.tensor(0.0))
            results.append((f_sample.detach(), grad_ts, ei.detach(), grad_ei))
        out[name] = results
    close(out["fspace"][0], out["laplace-torch"][0], 1e-10, "λ from the enum-named search")
    for k, what in enumerate(("Thompson sample", "its gradient in x", "MC-EI", "its gradient in x")):
        close(out["fspace"][1][k], out["laplace-torch"][1][k], 1e-10, f"GLM {what}")


def test_bayesopt_example_differentiates_its_acquisition_through_the_joint_predictive():
    """examples/bayesopt_example.py: a 2 × 50 ReLU regressor, ``kron`` over all weights with
    ``enable_backprop=True``, ``optimize_prior_precision(n_steps=50)`` and the joint predictive
    ``bnn(test_x, joint=True)`` with the example's 1e-4 jitter, then BoTorch's analytic expected
    improvement (written out: BoTorch is not installed) and its gradient in the candidates, which
    ``optimize_acqf`` follows — equal to laplace-torch's (≤ 1e-8: laplace-torch's KFAC)."""
    torch.manual_seed(1)
    train_x = torch.rand(20, 2) * 15 - torch.tensor([5.0, 0.0])
    train_y = (train_x[:, 1:] - 0.13 * train_x[:, :1] ** 2 + 1.6 * train_x[:, :1] - 6) ** 2 / 100
    net = torch.nn.Sequential(torch.nn.Linear(2, 50), torch.nn.ReLU(), torch.nn.Linear(50, 50), torch.nn.ReLU(),
                              torch.nn.Linear(50, 1))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(train_x, train_y), batch_size=1024)
    test_x = torch.rand(6, 2) * 15
    best_f = float(train_y.min())
    out = {}
    for name, lib in LIBRARIES.items():
        bnn = lib.Laplace(net, "regression", subset_of_weights="all", hessian_structure="kron", enable_backprop=True)
        bnn.fit(loader)
        bnn.optimize_prior_precision(n_steps=50)
        x = test_x.clone().requires_grad_(True)
        mean_y, cov_y = bnn(x, joint=True)
        cov_y = cov_y + 1e-4 * torch.eye(6)
        sigma = cov_y.diagonal().sqrt()
        u = (best_f - mean_y) / sigma
        normal = torch.distributions.Normal(0.0, 1.0)
        ei = sigma * (normal.log_prob(u).exp() + u * normal.cdf(u))
        (grad,) = torch.autograd.grad(ei.sum(), x)
        out[name] = (mean_y.detach(), cov_y.detach(), ei.detach(), grad)
    assert out["fspace"][1].shape == (6, 6)
    for k, what in enumerate(("joint mean", "joint covariance", "expected improvement", "its gradient in x")):
        close(out["fspace"][k], out["laplace-torch"][k], 1e-8, what)


def test_ella_example():
    """examples/ella.py: laplace-torch's ELLA through the factory (``hessian_structure="gp"``,
    ``functional_approximation="nystrom"``) on a bare ``Linear(2, 1)`` and four points, then the
    joint predictive."""
    out = {}
    for name, lib in LIBRARIES.items():
        torch.manual_seed(7)
        inputs = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
        targets = inputs.sum(dim=-1, keepdim=True)
        loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(inputs, targets), batch_size=2)
        ella = lib.Laplace(
            torch.nn.Linear(2, 1),
            "regression",
            subset_of_weights="all",
            hessian_structure="gp",
            functional_approximation="nystrom",
            subsample_size=2,
            n_eigenvalues=1,
            sigma_noise=0.2,
        )
        ella.fit(loader)
        mean, latent_covariance = ella(inputs[:2], joint=True)
        out[name] = (mean.detach(), latent_covariance.detach())
    assert out["fspace"][1].shape == out["laplace-torch"][1].shape
    close(out["fspace"][0], out["laplace-torch"][0], 1e-10, "ELLA example's mean")
    close(out["fspace"][1], out["laplace-torch"][1], 1e-9, "ELLA example's joint covariance")


def test_valla_example():
    """examples/valla.py: laplace-torch's VaLLA through the factory (``hessian_structure="gp"``,
    ``functional_approximation="variational"``, random inducing inputs) on a bare ``Linear(2, 1)``
    and four points, two Adam steps, then the joint predictive."""
    out = {}
    for name, lib in LIBRARIES.items():
        torch.manual_seed(7)
        inputs = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
        targets = inputs.sum(dim=-1, keepdim=True)
        loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(inputs, targets), batch_size=2)
        valla = lib.Laplace(
            torch.nn.Linear(2, 1),
            "regression",
            subset_of_weights="all",
            hessian_structure="gp",
            functional_approximation="variational",
            inducing_locations="random",
            num_inducing=2,
            sigma_noise=0.2,
        )
        valla.fit(loader, iterations=2, lr=1e-3)
        mean, latent_covariance = valla(inputs[:2], joint=True)
        out[name] = (mean.detach(), latent_covariance.detach())
    assert out["fspace"][1].shape == out["laplace-torch"][1].shape
    close(out["fspace"][0], out["laplace-torch"][0], 1e-10, "VaLLA example's mean")
    close(out["fspace"][1], out["laplace-torch"][1], 1e-10, "VaLLA example's joint covariance")


def test_calibration_gp_example_and_lm_example_targets_are_refused_by_name():
    """examples/calibration_gp_example.py fits a subset-of-data functional Laplace
    (``hessian_structure="gp"`` with ``num_data=m``, ``diagonal_kernel=True``: keywords of
    another laplace-torch release, which 0.3 refuses with a ``TypeError``; its spelling,
    ``n_subset``, runs there). fspace does not have that approximation: refused, naming the
    Nyström (ELLA) route it has. examples/lm_example.py's call runs (``enable_backprop=True``
    included); its per-token regression targets ``(B, L, 1)`` are refused by shape, where
    laplace-torch 0.3 fits them and fails in its predictive."""
    x, y = blobs(60, seed=21)
    model = trained_classifier(x, y)
    train_loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=25)
    with pytest.raises(TypeError, match="diagonal_kernel"):
        laplace.Laplace(model, "classification", subset_of_weights="all", hessian_structure="gp",
                        diagonal_kernel=True, num_data=20, prior_precision=1.0)
    ref = laplace.Laplace(model, "classification", subset_of_weights="all", hessian_structure="gp", n_subset=20,
                          prior_precision=1.0)
    ref.fit(train_loader)
    assert ref(x[:3]).shape == (3, 3)
    for kwargs in (dict(diagonal_kernel=True, num_data=20), dict(n_subset=20)):
        with pytest.raises(NotImplementedError, match="nystrom"):
            fspace.Laplace(model, "classification", subset_of_weights="all", hessian_structure="gp",
                           prior_precision=1.0, **kwargs)
    # lm_example.py: a frozen attention block and a trainable last layer, dict batches of per-token
    # regression targets (B, L, 1). fspace takes its Laplace call (enable_backprop included) and
    # refuses the targets by shape when it fits; laplace-torch 0.3 fits and then fails in its
    # predictive on the same batches.
    seq, embed = 6, 8

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = torch.nn.MultiheadAttention(embed, num_heads=1)
            self.final_layer = torch.nn.Linear(embed, 1)

        def forward(self, x):
            x = x["input"].view(-1, seq, embed)
            return self.final_layer(self.attn(x, x, x, need_weights=False)[0])

    inputs, outputs = torch.randn(20, seq, embed), torch.randn(20, seq, 1)
    dl = torch.utils.data.DataLoader([{"input": inputs[i], "output": outputs[i]} for i in range(20)], batch_size=4)
    lm = Model()
    for mod_name, mod in lm.named_modules():
        for p in mod.parameters():
            p.requires_grad = mod_name == "final_layer"
    for lib, error, message in ((fspace, ValueError, r"y must be a 1-D or 2-D array, got shape \(4, 6, 1\)"),
                                (laplace, ValueError, "Einstein sum")):
        la = lib.Laplace(lm, "regression", hessian_structure="full", subset_of_weights="all", backend=AsdlGGN,
                         dict_key_x="input", dict_key_y="output", enable_backprop=True)
        with pytest.raises(error, match=message):
            la.fit(dl)
            la(next(iter(dl)), pred_type="glm", joint=False)
