"""``fspace.Laplace``: laplace-torch 0.3's ``Laplace`` on fspace's Rust core.

The calls, positional orders, defaults, argument meanings, attributes and return types are
laplace-torch's (``docs/laplace-torch.md`` lists where they differ and why). The division of
work: Rust sums the curvature over the data and serves the GLM predictive's per-point
covariances ``J Σ Jᵀ``; this layer keeps laplace-torch's hyperparameters — the prior precision
λ, the observation noise σ, the prior mean and laplace-torch's temperature — as tensors and
evaluates laplace-torch's formulas on them (the evidence, differentiable in λ and σ, from the
curvature's eigenvalues; the link approximations from the predictive's mean and covariances),
so ``log_marginal_likelihood`` and ``optimize_prior_precision`` give laplace-torch's numbers.

Temperature: laplace-torch's posterior precision is ``H / (σ²·T) + λ``; fspace's Rust core
writes ``T'·C + λ`` with ``C`` at the fit's σ, so this layer hands Rust ``T' = σ_fit² / (σ²·T)``.
"""

from __future__ import annotations

from typing import Any, List


__all__ = ["Laplace"]
from ._laplace_saving import _LaplaceSaving



class Laplace(_LaplaceSaving):
    """The linearised Laplace approximation of a trained network, with laplace-torch 0.3's calls.

    Parameters
    ----------
    model : torch.nn.Module or tuple
        The trained network. An ``nn.Sequential`` of Linear layers and one activation (optionally
        after Conv2d blocks) runs on fspace's native engine; any other ``nn.Module`` on the torch
        engine. ``(state_dict, activation)`` pairs of numpy arrays are accepted too.
    likelihood : {"regression", "classification"}
    subset_of_weights : {"last_layer", "all", "subnetwork"}, default "last_layer"
        As laplace-torch: the last ``nn.Linear``'s weights and bias, every trainable weight, or
        the flat parameter indices ``subnetwork_indices``.
    hessian_structure : {"kron", "full", "diag", "lowrank", "ekfac", "gp"}, default "kron"
        ``"gp"`` with ``functional_approximation="nystrom"`` returns laplace-torch's ``ELLA``
        (``fspace.ELLALaplace``: ``subsample_size``, ``n_eigenvalues``, ``seed``), with
        ``"variational"`` its ``VaLLA`` (``fspace.VaLLALaplace``: ``inducing_locations``,
        ``num_inducing``, ``alpha``, ``mc_softmax_samples``, ...).
    sigma_noise, prior_precision, prior_mean, temperature : float or tensor
        laplace-torch's hyperparameters (same meanings: the posterior precision is
        ``H / (σ²·T) + λ``).
    enable_backprop : bool, default False
        As laplace-torch: the predictive (GLM moments, links, samples, ``pred_type="nn"`` draws)
        is differentiable in the input tensor and the model's weights — ``f(x)`` and ``J(x)`` from
        ``torch.func`` at the model's current weights, ``J Σ Jᵀ`` with Rust applying the fixed
        posterior covariance (needs an ``nn.Module``; forms each query's ``n·d' × p`` Jacobian).
    dict_key_x, dict_key_y, backend, backend_kwargs, asdl_fisher_kwargs
        laplace-torch's remaining positional arguments. ``backend`` is laplace-torch's curvature
        class (a ``*GGN`` class: the GGN, a ``*EF`` class: the empirical Fisher), or fspace's
        engine name ``"auto"`` / ``"native"`` / ``"torch"``.

    Other Parameters
    ----------------
    subnetwork_indices : sequence of int, optional
        Flat parameter indices (``named_parameters()`` order) for ``subset_of_weights="subnetwork"``.
    kron_bias : {"separate", "folded"}, default "separate"
        KFAC / EKFAC's bias block: laplace-torch's separate block, or folded into the input factor.
    rank, max_basis : int, optional
        ``hessian_structure="lowrank"``'s number of GGN eigenpairs and Krylov-basis bound.
    chunk_points : int, optional
        Points per chunk of network calls (memory bound).
    input_shape : tuple, optional
        ``(C, H, W)`` of a convolutional model fitted on flattened rows.

    Raises
    ------
    ValueError
        An unknown likelihood, structure or subset, ``sigma_noise != 1`` for classification, or
        an invalid hyperparameter.
    NotImplementedError
        A laplace-torch option fspace does not implement (the message names it).

    Examples
    --------
    >>> import torch, fspace
    >>> torch.manual_seed(0)  # doctest: +ELLIPSIS
    <torch._C.Generator object at ...>
    >>> model = torch.nn.Sequential(torch.nn.Linear(1, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)).double()
    >>> x = torch.linspace(-1, 1, 40, dtype=torch.float64).reshape(-1, 1)
    >>> loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, torch.sin(3 * x)), batch_size=10)
    >>> la = fspace.Laplace(model, "regression", sigma_noise=0.1)
    >>> la.fit(loader)
    >>> la.optimize_prior_precision(n_steps=50)
    >>> mean, var = la(x[:3])
    >>> tuple(var.shape)
    (3, 1, 1)
    """

    def __new__(
        cls,
        model: Any = None,
        likelihood: Any = None,
        subset_of_weights: str = "last_layer",
        hessian_structure: str = "kron",
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        # laplace-torch's Laplace(...) picks the class: hessian_structure="gp" is a function-space
        # posterior (ELLA or VaLLA), whose object is not a Laplace (its __init__ is then not run).
        if hessian_structure == "gp":
            from ._variational import functional_laplace

            return functional_laplace(model, likelihood, subset_of_weights, *args, **kwargs)
        return super().__new__(cls)

    def __init__(
        self,
        model: Any,
        likelihood: str,
        subset_of_weights: str = "last_layer",
        hessian_structure: str = "kron",
        *args: Any,
        **kwargs: Any,
    ) -> None:
        # laplace-torch hands the remaining positional arguments to the class it picks, whose
        # orders differ (a subnetwork's first is subnetwork_indices; KFAC has damping, the last
        # layer feature_reduction and last_layer_name): bound here by the same class's order.
        names = _positional_names(subset_of_weights, hessian_structure)
        if len(args) > len(names):
            raise TypeError(
                f"Laplace(..., {subset_of_weights!r}, {hessian_structure!r}) takes at most {len(names)} further "
                f"positional arguments ({', '.join(names)}), got {len(args)}"
            )
        for name, value in zip(names, args):
            if name in kwargs:
                raise TypeError(f"Laplace() got multiple values for argument {name!r}")
            kwargs[name] = value
        self._init(model, likelihood, subset_of_weights, hessian_structure, **kwargs)



def _positional_names(subset: str, structure: str) -> List[str]:
    """The positional parameters after ``hessian_structure`` of the laplace-torch 0.3 class
    ``Laplace(model, likelihood, subset, structure, *args)`` picks, in its order."""
    if subset == "subnetwork":
        return ["subnetwork_indices", "sigma_noise", "prior_precision", "prior_mean", "temperature", "backend",
                "backend_kwargs", "asdl_fisher_kwargs"]
    head = ["sigma_noise", "prior_precision", "prior_mean", "temperature", "enable_backprop"]
    if subset == "last_layer":
        tail = ["feature_reduction", "dict_key_x", "dict_key_y", "backend", "last_layer_name"]
        return head + tail + (["damping"] if structure == "kron" else []) + ["backend_kwargs", "asdl_fisher_kwargs"]
    tail = ["dict_key_x", "dict_key_y", "backend"]
    if structure == "kron":
        return head + tail + ["damping", "backend_kwargs", "asdl_fisher_kwargs"]
    return head + tail + ["backend_kwargs", "asdl_fisher_kwargs"]
