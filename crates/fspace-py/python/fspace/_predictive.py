"""What ``fspace.Laplace`` and ``fspace.ELLALaplace`` share: torch on demand, laplace-torch's
``backend`` argument, and laplace-torch's link approximations and Gaussian draws on a GLM
predictive ``N(f_mu, f_var)``."""

from __future__ import annotations

import math
from typing import Any, Tuple

import numpy as np

__all__ = ["_torch", "_curvature_source", "_normal_samples", "_link"]


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


def _normal_samples(mean: Any, var: Any, n_samples: int, generator: Any) -> Any:
    """laplace-torch's ``normal_samples``: the same draws from the same generator state."""
    torch = _torch()
    _, output_dim = mean.shape
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
