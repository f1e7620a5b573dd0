"""FSP-Laplace's prior inside your own PyTorch training loop.

``FSPRegularizer(prior, context=…)`` is Alg. 1's regulariser as a differentiable torch loss
term: at context points ``C`` it evaluates the model and returns

    R = ½ (f(C) − μ(C))ᵀ (Σ(C, C) + εI)⁻¹ (f(C) − μ(C)),

with ``ε = jitter × mean prior variance`` (FSP-Laplace's rule, default 1e-3; more only if
``Σ`` still fails to factorise). fspace's Rust core factorises ``Σ(C, C)`` and solves; the
backward pass hands torch ``∂R/∂f(C) = α = (Σ + εI)⁻¹ (f(C) − μ(C))``, and torch's autograd
takes it through the model — any ``nn.Module``, on its device and dtype. The objective of
Alg. 1 is the summed negative log likelihood over the data set plus ``R``, so with a
minibatch of ``b`` out of ``n`` points::

    loss = (n / b) * nll_sum(model(xb), yb) + reg(model)      # or: nll_mean + reg(model) / n

``context`` is either a box — ``(lower, upper)``, fresh uniform points every call as Alg. 1
draws them (seeded) — or a fixed ``n_C × d`` array of points. Inputs other than vectors take
``input_shape``.
"""

from __future__ import annotations

import json
from typing import Any, Optional, Sequence

import numpy as np
import torch

from . import _fspace

__all__ = ["FSPRegularizer"]


class _RkhsNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, f: torch.Tensor, prior: str, c: np.ndarray, jitter: float) -> torch.Tensor:  # type: ignore[override]
        value, alpha = _fspace.rkhs_norm(prior, c, f.detach().to("cpu", torch.float64).numpy(), jitter)
        ctx.save_for_backward(torch.from_numpy(alpha).to(device=f.device, dtype=f.dtype))
        return torch.tensor(value, dtype=f.dtype, device=f.device)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:  # type: ignore[override]
        (alpha,) = ctx.saved_tensors
        return grad * alpha, None, None, None


class FSPRegularizer:
    """The GP prior's RKHS-norm estimate at context points as a torch loss term (module docs).

    ``prior``: an ``fspace.GPPrior`` or a kernel; ``context``: ``(lower, upper)`` (per-dimension
    bounds, fresh uniform points each call) or an ``n_C × d`` array (fixed points);
    ``n_context``: points per call for a box (paper: 100); ``jitter``: relative jitter of
    ``Σ(C, C)``; ``seed``: the draws' seed; ``input_shape``: the model's input shape when it
    is not a vector (points are drawn flattened). ``reg(model, x_batch)`` adds the batch's
    inputs to the context points when ``include_batch`` (the library's
    ``context_includes_data``)."""

    def __init__(self, prior: Any, context: Any, n_context: int = 100, jitter: float = 1e-3, seed: int = 0,
                 input_shape: Optional[Sequence[int]] = None, include_batch: bool = False) -> None:
        from ._methods import _prior

        self.prior = _prior(prior)
        self._prior_json = json.dumps(self.prior.spec())
        if not (np.isfinite(jitter) and jitter >= 0):
            raise ValueError(f"jitter {jitter} must be finite and ≥ 0")
        self.jitter = float(jitter)
        self.include_batch = bool(include_batch)
        self.input_shape = None if input_shape is None else tuple(int(s) for s in input_shape)
        self._rng = np.random.default_rng(seed)
        self._fixed: Optional[np.ndarray] = None
        if isinstance(context, tuple) and len(context) == 2:
            lower = np.atleast_1d(np.asarray(context[0], dtype=np.float64))
            upper = np.atleast_1d(np.asarray(context[1], dtype=np.float64))
            if lower.shape != upper.shape or lower.ndim != 1:
                raise ValueError(f"context box bounds of shapes {lower.shape} and {upper.shape} do not match")
            if not (np.all(np.isfinite(lower)) and np.all(np.isfinite(upper)) and np.all(lower < upper)):
                raise ValueError("context box: every lower bound must be finite and below its upper bound")
            if int(n_context) < 1:
                raise ValueError(f"n_context {n_context} must be ≥ 1")
            self.lower, self.upper, self.n_context = lower, upper, int(n_context)
        else:
            points = np.asarray(context, dtype=np.float64)
            if points.ndim != 2 or points.shape[0] < 1 or not np.all(np.isfinite(points)):
                raise ValueError("context must be (lower, upper) or a finite n_C × d array of points")
            self._fixed = points

    def points(self) -> np.ndarray:
        """The next call's context points (fresh for a box)."""
        if self._fixed is not None:
            return self._fixed
        u = self._rng.random((self.n_context, self.lower.size))
        return self.lower + u * (self.upper - self.lower)

    def __call__(self, model: Any, x_batch: Any = None) -> torch.Tensor:
        c = self.points()
        if self.include_batch and x_batch is not None:
            xb = x_batch.detach().to("cpu", torch.float64).reshape(x_batch.shape[0], -1).numpy()
            c = np.concatenate([c, xb])
        param = next(iter(model.parameters()))
        shape = self.input_shape if self.input_shape is not None else (c.shape[1],)
        ct = torch.from_numpy(np.ascontiguousarray(c)).to(device=param.device, dtype=param.dtype).reshape((c.shape[0],) + shape)
        f = model(ct)
        if not isinstance(f, torch.Tensor):
            raise TypeError(f"the model returned a {type(f).__name__}; FSPRegularizer needs one tensor of outputs")
        return _RkhsNorm.apply(f.reshape(c.shape[0], -1), self._prior_json, c, self.jitter)
