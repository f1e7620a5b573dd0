"""What ``fspace.Laplace`` and ``fspace.ELLALaplace`` share: torch on demand, laplace-torch's
``likelihood``, ``backend`` and refused arguments, its loader batches, and its link
approximations and Gaussian draws on a GLM predictive ``N(f_mu, f_var)``."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Dict, Optional, Tuple

import numpy as np

from ._convert import count
from ._memory import check_budget

__all__ = ["_torch", "_curvature_source", "_check_likelihood", "_refuse_unsupported", "_split_batch",
           "_normal_samples", "_link"]


def _torch() -> Any:
    try:
        import torch
    except ImportError:  # pragma: no cover - exercised only without torch
        raise ImportError(
            "fspace.Laplace follows laplace-torch's API, whose hyperparameters and results are torch "
            "tensors: install torch (pip install torch)"
        ) from None
    return torch


def _curvature_source(backend: Any) -> Tuple[str, str]:
    """``(engine, curvature)`` from laplace-torch's ``backend`` (a curvature class such as
    ``CurvlinopsGGN`` / ``AsdlEF``, or None) or fspace's engine name."""
    if backend is None:
        return "auto", "ggn"
    if isinstance(backend, str):
        if backend in ("auto", "native", "torch"):
            return backend, "ggn"
        raise ValueError(
            f"backend {backend!r}: laplace-torch's backend is a curvature class (CurvlinopsGGN, AsdlEF, ...); "
            "fspace also takes \"auto\", \"native\" or \"torch\" to choose where the network runs"
        )
    name = getattr(backend, "__name__", type(backend).__name__)
    if name.endswith("EF"):
        return "auto", "ef"
    if name.endswith("GGN"):
        return "auto", "ggn"
    raise NotImplementedError(
        f"backend {name}: fspace computes the generalised Gauss-Newton (laplace-torch's *GGN backends) or the "
        "empirical Fisher (*EF); the exact Hessian and stochastic curvature are not implemented"
    )


def _check_likelihood(likelihood: Any) -> None:
    """laplace-torch's likelihood names that fspace serves; its pairwise ``"reward_modeling"`` is
    refused by name."""
    if likelihood not in ("regression", "classification"):
        if likelihood == "reward_modeling":
            raise NotImplementedError("likelihood 'reward_modeling' (laplace-torch's pairwise preferences) is not implemented in fspace")
        raise ValueError(f"Invalid likelihood type {likelihood!r}: \"regression\" or \"classification\"")


def _refuse_unsupported(enable_backprop: bool, backend_kwargs: Optional[Dict[str, Any]]) -> None:
    """laplace-torch options fspace does not have: a differentiable predictive of the
    function-space structures (ELLA, VaLLA; ``fspace.Laplace``'s other structures have it),
    stochastic curvature backends."""
    if enable_backprop:
        raise NotImplementedError(
            "enable_backprop=True with hessian_structure='gp' (ELLA, VaLLA): their predictive is not differentiable "
            "in fspace; the weight-space structures (full, kron, diag, ...) take enable_backprop=True"
        )
    if backend_kwargs:
        raise NotImplementedError(
            f"backend_kwargs {sorted(backend_kwargs)}: fspace's curvature and Jacobians are exact (no MC samples)"
        )


def _split_batch(batch: Any, dict_key_x: Optional[str], dict_key_y: str) -> Tuple[Any, Any]:
    """``(x, y)`` of a loader's batch: an ``(x, y)`` pair, or a dict (HuggingFace) whose targets
    are under ``dict_key_y`` and whose inputs are the whole dict (``dict_key_x`` ``None``: a torch
    model takes it as laplace-torch hands it over) or the array under ``dict_key_x`` (a native
    network)."""
    if isinstance(batch, Mapping):
        for key in (dict_key_y,) if dict_key_x is None else (dict_key_x, dict_key_y):
            if key not in batch:
                raise ValueError(f"a dict batch has no key {key!r} (its keys: {sorted(batch)}); set dict_key_x / dict_key_y")
        return (batch if dict_key_x is None else batch[dict_key_x]), batch[dict_key_y]
    if isinstance(batch, (tuple, list)) and len(batch) == 2:
        return batch[0], batch[1]
    raise ValueError(
        "each batch of the loader must be an (x, y) pair or a dict with the keys dict_key_x / dict_key_y, "
        f"got {type(batch).__name__}"
    )


def sample_count(n_samples: Any) -> int:
    """A number of draws: a whole number ≥ 1 (laplace-torch turns ``n_samples=0`` into NaN
    probabilities and a negative one into torch's shape error; fspace names it)."""
    return count(n_samples, "n_samples")


def _normal_samples(mean: Any, var: Any, n_samples: int, generator: Any) -> Any:
    """laplace-torch's ``normal_samples``: the same draws from the same generator state."""
    torch = _torch()
    n_samples = sample_count(n_samples)
    batch, output_dim = mean.shape
    # ``scaled``, the sum and a softmax of it (the MC link) are held at once.
    check_budget(3 * n_samples * batch * output_dim * mean.element_size(),
                 f"{n_samples} Monte Carlo samples of {batch} × {output_dim} outputs",
                 "fewer n_samples, x in smaller batches, or link_approx='probit'")
    randn = torch.randn((output_dim, n_samples), dtype=mean.dtype, generator=generator)
    if mean.shape == var.shape:
        scaled = var.sqrt().unsqueeze(-1) * randn.unsqueeze(0)
    else:
        scaled = torch.matmul(torch.linalg.cholesky(var), randn.unsqueeze(0))
    return (mean.unsqueeze(-1) + scaled).permute((2, 0, 1))


def _link(f_mu: Any, f_var: Any, link_approx: str, n_samples: int, diagonal_output: bool, generator: Any) -> Any:
    """laplace-torch's link approximations on the GLM predictive ``N(f_mu, f_var)``."""
    torch = _torch()
    if link_approx == "mc":
        var = torch.diagonal(f_var, dim1=1, dim2=2) if diagonal_output else f_var
        return torch.softmax(_normal_samples(f_mu, var, n_samples, generator), dim=-1).mean(dim=0)
    if link_approx == "probit":
        kappa = 1 / torch.sqrt(1.0 + np.pi / 8 * f_var.diagonal(dim1=1, dim2=2))
        return torch.softmax(kappa * f_mu, dim=-1)
    # The Laplace bridge (laplace-torch's "bridge" and "bridge_norm").
    f_mu = f_mu - f_var.sum(-1) * f_mu.sum(-1).reshape(-1, 1) / f_var.sum(dim=(1, 2)).reshape(-1, 1)
    f_var = f_var - torch.einsum("bi,bj->bij", f_var.sum(-1), f_var.sum(-2)) / f_var.sum(dim=(1, 2)).reshape(-1, 1, 1)
    k = f_mu.size(-1)
    f_var_diag = torch.diagonal(f_var, dim1=1, dim2=2)
    if link_approx == "bridge_norm":
        mean_diag = f_var_diag.mean(dim=1) / math.sqrt(k / 2)
        f_mu = f_mu / mean_diag.sqrt().unsqueeze(-1)
        f_var_diag = f_var_diag / mean_diag.unsqueeze(-1)
    sum_exp = torch.exp(-f_mu).sum(dim=1).unsqueeze(-1)
    alpha = (1 - 2 / k + f_mu.exp() / k**2 * sum_exp) / f_var_diag
    return torch.nan_to_num(alpha / alpha.sum(dim=1).unsqueeze(-1), nan=1.0)
