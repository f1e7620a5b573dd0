"""laplace-torch's HuggingFace recipe on a LoRA'd language model, offline: a small GPT-2
(transformers, built from a config) with LoRA adapters (peft), fine-tuned briefly on a
generated task (``lora_model.py``); Laplace over the LoRA weights only (the ``requires_grad``
subset, dict batches) equals laplace-torch's, and FSP-Laplace runs post hoc on the same model."""

import warnings

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers", reason="transformers is installed by `cargo xtask test`")
pytest.importorskip("peft", reason="peft is installed by `cargo xtask test`")
laplace = pytest.importorskip("laplace", reason="laplace-torch is installed by `cargo xtask test`")

import fspace  # noqa: E402
from lora_model import Sequences, fine_tune, lora_gpt2  # noqa: E402


def close(a, b, rtol, what):
    a, b = torch.as_tensor(a).detach().double(), torch.as_tensor(b).detach().double()
    assert a.shape == b.shape, f"{what}: shapes {tuple(a.shape)} vs {tuple(b.shape)}"
    err = float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))
    assert err <= rtol, f"{what}: relative difference {err:.2e} > {rtol:.0e}"


@pytest.fixture(scope="module")
def tuned():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = lora_gpt2()
        loader = torch.utils.data.DataLoader(Sequences(96, 8, 32, seed=1), batch_size=16)
        fine_tune(model, loader)
    test = next(iter(torch.utils.data.DataLoader(Sequences(12, 8, 32, seed=2), batch_size=12)))
    return model, loader, test


@pytest.mark.parametrize("structure", ["kron", "diag"])
def test_laplace_on_the_lora_weights_equals_laplace_torch(tuned, structure):
    """laplace-torch's HuggingFace recipe on a LoRA'd GPT-2 (dict batches, the `requires_grad` subset): evidence, its gradient, the layer-wise search and the predictive equal laplace-torch's."""
    model, loader, test = tuned
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = laplace.Laplace(model, "classification", subset_of_weights="all", hessian_structure=structure)
        ref.fit(loader)
    got = fspace.Laplace(model, "classification", subset_of_weights="all", hessian_structure=structure)
    got.fit(loader)
    assert got.n_params == ref.n_params == trainable  # the LoRA adapters and the head only
    for lam in (0.3, 1.0, 20.0):
        lg = torch.tensor(lam, dtype=torch.float64, requires_grad=True)
        lr = torch.tensor(lam, dtype=torch.float64, requires_grad=True)
        eg, er = got.log_marginal_likelihood(lg), ref.log_marginal_likelihood(lr)
        close(eg, er, 1e-10, f"evidence at λ={lam}")
        eg.backward()
        er.backward()
        close(lg.grad, lr.grad, 1e-8, f"its gradient at λ={lam}")
    got.optimize_prior_precision(prior_structure="layerwise", n_steps=20)
    ref.optimize_prior_precision(prior_structure="layerwise", n_steps=20)
    close(got.prior_precision, ref.prior_precision, 1e-8, "layer-wise λ")
    for link in ("probit", "bridge"):
        p = got(test, link_approx=link)
        assert torch.is_tensor(p) and p.shape == (12, 2)
        close(p, ref(test, link_approx=link), 1e-8, f"{link} predictive")


def test_fsp_laplace_runs_post_hoc_on_the_lora_model(tuned):
    """FSP-Laplace post hoc on the same model, its context drawn from the training sequences (fspace only)."""
    model, loader, test = tuned
    K = fspace.kernels
    prior = fspace.GPPrior(K.Independent(K.RBF(1.0, 20.0), 2))
    fsp = fspace.FSPLaplace(model, "classification", prior, train=False, design="Dataset", n_laplace_context=32)
    fsp.fit(loader)
    probs = fsp(test)
    assert torch.is_tensor(probs) and probs.shape == (12, 2)
    assert torch.allclose(probs.sum(1), torch.ones(12, dtype=torch.float64))
    # The probit predictive scales each logit by 1/√(1 + π/8·varᵢ): less confident than the MAP
    # on average (per point it need not be, when two logits are close and their variances differ).
    with torch.no_grad():
        map_probs = torch.softmax(model(test), dim=1)
    assert float((probs - 0.5).abs().mean()) < float((map_probs - 0.5).abs().mean())
    draws = fsp.predictive_samples(test, 2000, seed=3)
    f_mean, f_var = draws.mean(0), draws.var(0)
    close(f_mean, model(test).detach(), 0.1, "the sampled functions' mean is the MAP network's output")
    assert bool((f_var > 0).all())
    # The weights are the model's own (post hoc).
    trained = fsp.model_state_dict()
    for name, p in model.named_parameters():
        if p.requires_grad:
            assert torch.equal(torch.as_tensor(trained[name]), p.detach())
