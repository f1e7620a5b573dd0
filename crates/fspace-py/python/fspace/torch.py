"""fspace's function-space priors inside your own PyTorch training loop, on any model.

**FSP-Laplace (Alg. 1).** ``FSPRegularizer(prior, context=…)`` is the regulariser as a
differentiable torch loss term: at context points ``C`` it evaluates the model and returns

    R = ½ (f(C) − μ(C))ᵀ (Σ(C, C) + εI)⁻¹ (f(C) − μ(C)),

with ``ε = jitter × mean prior variance`` (FSP-Laplace's rule, default 1e-3; more only if
``Σ`` still fails to factorise). fspace's Rust core factorises ``Σ(C, C)`` and solves; the
backward pass hands torch ``∂R/∂f(C) = α = (Σ + εI)⁻¹ (f(C) − μ(C))``, and torch's autograd
takes it through the model — any ``nn.Module``, on its device and dtype. The objective of
Alg. 1 is the summed negative log likelihood over the data set plus ``R``, so with a
minibatch of ``b`` out of ``n`` points::

    loss = (n / b) * nll_sum(model(xb), yb) + reg(model)      # or: nll_mean + reg(model) / n

**GFSVI (Cinquin & Bamler, eqs. 6–11).** ``MeanField(model)`` holds ``q(w) = N(m, diag(s))``
over the model's trainable parameters: the model's own weights are the mean ``m``, the module
holds ``ρ = log √s`` (one tensor per parameter). On the network linearised at ``m``, ``q``
induces the Gaussian ``N(f(X; m), J S Jᵀ)`` at any inputs; ``q.linearized(model, x)`` returns
it, differentiable in ``m`` (through ``J`` too, by torch's second derivatives) and in ``ρ``.
``GFSVIRegularizer(prior, context=…)`` is the regularised KL

    D̂_KL^γ = KL(N(f(C), J S Jᵀ + γM·I) ‖ N(μ(C), K(C, C) + γM·I))

at ``M`` measurement points, as a loss term: fspace factorises both Gram matrices and returns
the value with ``∂/∂f(C)`` and ``∂/∂Σ_q = ½((K + γM·I)⁻¹ − (Σ_q + γM·I)⁻¹)``; torch takes
them through ``J S Jᵀ`` into ``m`` and ``ρ``. With the closed-form Gaussian data term (eq. 10,
``expected_log_likelihood``) the negative ELBO of a minibatch is::

    f, var = q.linearized(model, xb, diagonal=True)
    loss = -(n / b) * expected_log_likelihood(f, var, yb, sigma) + kl(model, q)

For classification the data term is by Monte Carlo over linearised logits, as Rust's GFSVI
estimates it (one weight draw ``√s ⊙ ε`` per sample, pushed through ``J`` by a ``jvp``)::

    logits = q.sample_linearized(model, xb, n_samples=10)
    loss = -(n / b) * expected_log_likelihood_categorical(logits, yb) + kl(model, q)

The KL term fits where the
``M·d' × p`` Jacobian at the measurement points fits in memory (``M`` points, ``d'`` outputs,
``p`` parameters: 500 × 1 × 10⁴ doubles is 40 MB; an 11 M-parameter ResNet at 100 points and
10 classes is 44 GB in float32 — use FSP-Laplace there, whose term needs no Jacobian).
``J S Jᵀ`` is accumulated in float64 whatever the model's dtype; a float32 model's Jacobian
carries float32 rounding (≈ 1e-7 relative), which the paper's ``γ = 1e-10`` does not hide:
train in float64 (``model.double()``) when the KL's value matters.

``context`` is either a box — ``(lower, upper)``, fresh uniform points every call as both
algorithms draw them (seeded) — or a fixed ``n_C × d`` array of points. Inputs other than
vectors take ``input_shape``. ``reg(model, x_batch)`` adds the batch's inputs to the points
when ``include_batch`` (FSP-Laplace's ``context_includes_data``; GFSVI's W2 experiment draws
"jointly from a uniform distribution and the minibatch").

**Under DDP** (``torch.nn.parallel.DistributedDataParallel``, which averages the gradients of
its ``world_size`` processes): the prior term must count once per global step and the data
term must be the global batch's. Build the regulariser with the same ``context``,
``n_context`` and ``seed`` on every process — it then draws the same points everywhere (its
first call checks it, an error otherwise), and with ``include_batch`` it gathers every
process's batch, so every process adds the same term and the average is that term once. Scale
each process's data term by the world size and the global batch ``B`` (the sum of the local
batches)::

    loss = world_size * (n / B) * nll_sum(model(xb), yb) + reg(model, xb)

Run the loss inside the DDP module's ``forward`` (a module holding the model, and for GFSVI
the ``MeanField``, so that ``q``'s gradients are averaged too): the parameters then follow the
single-process run on the global batches (``tests/test_distributed.py``, to 1e-10).
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from . import _fspace

__all__ = [
    "FSPRegularizer",
    "GFSVIRegularizer",
    "MeanField",
    "expected_log_likelihood",
    "expected_log_likelihood_categorical",
]


class _RkhsNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, f: torch.Tensor, prior: Dict[str, Any], c: np.ndarray, jitter: float) -> torch.Tensor:  # type: ignore[override]
        value, alpha = _fspace.rkhs_norm(prior=prior, c=c, f=_numpy(f), jitter=jitter)
        ctx.save_for_backward(torch.from_numpy(alpha).to(device=f.device, dtype=f.dtype))
        return torch.tensor(value, dtype=f.dtype, device=f.device)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:  # type: ignore[override]
        (alpha,) = ctx.saved_tensors
        return grad * alpha, None, None, None


class _RegularizedKl(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, f: torch.Tensor, cov: torch.Tensor, prior: Dict[str, Any], c: np.ndarray, gamma: float) -> torch.Tensor:  # type: ignore[override]
        value, grad_f, grad_cov = _fspace.regularized_kl(prior=prior, c=c, f=_numpy(f), cov=_numpy(cov), gamma=gamma)
        ctx.save_for_backward(
            torch.from_numpy(grad_f).to(device=f.device, dtype=f.dtype),
            torch.from_numpy(grad_cov).to(device=cov.device, dtype=cov.dtype),
        )
        return torch.tensor(value, dtype=f.dtype, device=f.device)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:  # type: ignore[override]
        grad_f, grad_cov = ctx.saved_tensors
        return grad * grad_f, grad * grad_cov, None, None, None


def _numpy(t: torch.Tensor) -> np.ndarray:
    return np.ascontiguousarray(t.detach().to("cpu", torch.float64).numpy())


def _checked(f: Any, who: str) -> torch.Tensor:
    if not isinstance(f, torch.Tensor):
        raise TypeError(f"the model returned a {type(f).__name__}; {who} needs one tensor of outputs")
    return f


def _finite(t: torch.Tensor, what: str) -> torch.Tensor:
    """``t`` when every entry is finite; a ``ValueError`` naming ``what`` otherwise (a NaN loss
    term would poison every weight at the next step)."""
    if not bool(torch.isfinite(t.detach()).all()):
        raise ValueError(f"{what} holds a NaN or an infinite value")
    return t


def _outputs(model: Any, x: torch.Tensor, who: str) -> torch.Tensor:
    return _finite(_checked(model(x), who).reshape(x.shape[0], -1), f"the model's outputs at {who}'s context points")


class _Context:
    """Context (measurement) points: a box with fresh seeded uniform draws per call, or fixed
    points; optionally the minibatch's inputs appended."""

    def __init__(self, context: Any, n_context: int, seed: int, input_shape: Optional[Sequence[int]],
                 include_batch: bool, process_group: Any = None) -> None:
        self.include_batch = bool(include_batch)
        self.process_group = process_group
        self._agreed = False
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
        if self._fixed is not None:
            return self._fixed
        u = self._rng.random((self.n_context, self.lower.size))
        return self.lower + u * (self.upper - self.lower)

    def _distributed(self) -> bool:
        """Whether the points must agree across processes: torch.distributed initialised with
        more than one process in ``process_group`` (``None``: its default group)."""
        dist = torch.distributed
        return (dist.is_available() and dist.is_initialized()
                and dist.get_world_size(self.process_group) > 1)

    def draw(self, model: Any, x_batch: Any) -> Tuple[np.ndarray, torch.Tensor]:
        """The next points as rows (for fspace) and as the model's inputs (its device, dtype).

        Under torch.distributed (DDP) every process must evaluate the prior at the same points,
        so that the averaged gradient counts it once: the first call checks that the drawn
        points agree (the same seed and context everywhere), and with ``include_batch`` every
        process's batch is gathered, in rank order, so each adds the global batch."""
        c = self.points()
        param = next(iter(model.parameters()), None)
        if param is None:
            raise ValueError("the model has no parameter: the prior's points go to its parameters' device and dtype")
        distributed = self._distributed()
        if distributed and not self._agreed:
            _check_same_everywhere(c, param.device, self.process_group)
            self._agreed = True
        if self.include_batch and x_batch is not None:
            xb = x_batch.detach().to("cpu", torch.float64).reshape(x_batch.shape[0], -1).numpy()
            if distributed:
                xb = _gather_rows(xb, param.device, self.process_group)
            c = np.concatenate([c, xb])
        shape = self.input_shape if self.input_shape is not None else (c.shape[1],)
        ct = torch.from_numpy(np.ascontiguousarray(c)).to(device=param.device, dtype=param.dtype)
        return c, ct.reshape((c.shape[0],) + shape)


def _check_same_everywhere(c: np.ndarray, device: Any, group: Any) -> None:
    """Refuses context points that differ between processes (each would add its own prior term)."""
    dist = torch.distributed
    summary = torch.tensor([float(c.shape[0]), float(c.sum()), float((c * c).sum())], dtype=torch.float64, device=device)
    low, high = summary.clone(), summary.clone()
    dist.all_reduce(low, op=dist.ReduceOp.MIN, group=group)
    dist.all_reduce(high, op=dist.ReduceOp.MAX, group=group)
    if not torch.equal(low, high):
        raise ValueError(
            "the regulariser's context points differ between the processes: build it with the same context, "
            "n_context and seed on every process, so that the prior is counted once per step"
        )


def _gather_rows(xb: np.ndarray, device: Any, group: Any) -> np.ndarray:
    """Every process's rows of ``xb`` (their counts may differ), in rank order."""
    dist = torch.distributed
    world = dist.get_world_size(group)
    count = torch.tensor([xb.shape[0]], dtype=torch.int64, device=device)
    counts = [torch.zeros_like(count) for _ in range(world)]
    dist.all_gather(counts, count, group=group)
    sizes = [int(n.item()) for n in counts]
    padded = torch.zeros((max(sizes), xb.shape[1]), dtype=torch.float64, device=device)
    padded[: xb.shape[0]] = torch.from_numpy(xb).to(device)
    parts = [torch.zeros_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded, group=group)
    return np.concatenate([part[:n].cpu().numpy() for part, n in zip(parts, sizes)])


class FSPRegularizer:
    """The GP prior's RKHS-norm estimate at context points as a torch loss term (module docs):
    FSP-Laplace's Alg. 1 regulariser ``½ (f(C) − μ)ᵀ Σ(C, C)⁻¹ (f(C) − μ)``, differentiable
    through the model.

    Parameters
    ----------
    prior : fspace.GPPrior or fspace.kernels.MatrixKernel
    context : tuple or array_like
        ``(lower, upper)`` per-dimension bounds (fresh uniform points each call), or an
        ``n_C × d`` array of fixed points.
    n_context : int, default 100
        Points per call for a box (the paper's 100).
    jitter : float, default 1e-3
        Relative jitter of ``Σ(C, C)``.
    seed : int, default 0
        The seed of the draws.
    input_shape : sequence of int, optional
        The model's input shape when it is not a vector (points are drawn flattened).
    include_batch : bool, default False
        Add the batch's inputs to the context points (the library's ``context_includes_data``).
    process_group : torch.distributed.ProcessGroup, optional
        Under torch.distributed (DDP) with more than one process in this group (``None``: the
        default group): the first call checks that every process draws the same points, and
        ``include_batch`` adds every process's batch, so that the averaged gradient counts the
        prior once per global step (module docs, "Under DDP").

    Raises
    ------
    ValueError
        A negative or non-finite jitter, an empty or inverted box, a count below 1.

    Examples
    --------
    >>> import torch, fspace
    >>> from fspace.torch import FSPRegularizer
    >>> model = torch.nn.Sequential(torch.nn.Linear(1, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)).double()
    >>> reg = FSPRegularizer(fspace.kernels.RBF(1.0, 0.3), context=([-2.0], [2.0]), n_context=20)
    >>> loss = reg(model)  # add it to the data term, then loss.backward()
    >>> loss.shape, bool(loss >= 0)
    (torch.Size([]), True)
    """

    def __init__(self, prior: Any, context: Any, n_context: int = 100, jitter: float = 1e-3, seed: int = 0,
                 input_shape: Optional[Sequence[int]] = None, include_batch: bool = False,
                 process_group: Any = None) -> None:
        from ._method_base import _prior

        self.prior = _prior(prior)
        self._prior_spec = self.prior.spec()
        if not (np.isfinite(jitter) and jitter >= 0):
            raise ValueError(f"jitter {jitter} must be finite and ≥ 0")
        self.jitter = float(jitter)
        self._context = _Context(context, n_context, seed, input_shape, include_batch, process_group)

    def points(self) -> np.ndarray:
        """The next call's context points (fresh for a box).

        Returns
        -------
        numpy.ndarray, shape (n_context, d)
        """
        return self._context.points()

    def __call__(self, model: Any, x_batch: Any = None) -> torch.Tensor:
        """The regulariser at this call's context points.

        Parameters
        ----------
        model : torch.nn.Module
            Any model; its outputs at the points are ``f(C)``.
        x_batch : torch.Tensor, optional
            The batch's inputs (added to the points with ``include_batch``).

        Returns
        -------
        torch.Tensor
            A float64 scalar, differentiable in the model's parameters.
        """
        c, ct = self._context.draw(model, x_batch)
        f = _outputs(model, ct, "FSPRegularizer")
        return _RkhsNorm.apply(f, self._prior_spec, c, self.jitter)


class MeanField(torch.nn.Module):
    """``q(w) = N(m, diag(s))`` over ``model``'s trainable parameters, GFSVI's variational
    family: ``m`` is the model's own weights, this module holds ``log_std`` (``ρ = log √s``,
    one tensor per parameter in ``named_parameters()`` order, all ``log(init_std)`` at first;
    the paper's ``init_std`` is 1e-2). Train ``model.parameters()`` and ``q.parameters()``
    together.

    Parameters
    ----------
    model : torch.nn.Module
        The network whose trainable parameters ``q`` covers.
    init_std : float, default 1e-2
        The starting standard deviation of every weight.

    Raises
    ------
    ValueError
        A non-positive ``init_std`` or a model without trainable parameters.

    Examples
    --------
    >>> import torch
    >>> from fspace.torch import MeanField
    >>> model = torch.nn.Sequential(torch.nn.Linear(1, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)).double()
    >>> q = MeanField(model)
    >>> f, var = q.linearized(model, torch.zeros(3, 1, dtype=torch.float64), diagonal=True)
    >>> tuple(f.shape), tuple(var.shape)
    ((3, 1), (3, 1))
    """

    def __init__(self, model: Any, init_std: float = 1e-2) -> None:
        super().__init__()
        if not (math.isfinite(init_std) and init_std > 0):
            raise ValueError(f"init_std {init_std} must be finite and > 0")
        trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        if not trainable:
            raise ValueError("the model has no trainable parameters")
        self.names: List[str] = [n for n, _ in trainable]
        self.log_std = torch.nn.ParameterList(
            [torch.nn.Parameter(torch.full_like(p.detach(), math.log(init_std))) for _, p in trainable]
        )

    def variances(self) -> List[torch.Tensor]:
        """The variances ``s = exp(2ρ)``.

        Returns
        -------
        list of torch.Tensor
            One per parameter, shaped as it.
        """
        return [torch.exp(2 * r) for r in self.log_std]

    def _parameters_of(self, model: Any) -> dict:
        params = dict(model.named_parameters())
        missing = [n for n in self.names if n not in params]
        if missing:
            raise ValueError(f"the model has no parameters {missing}: this MeanField was made for another model")
        for name, r in zip(self.names, self.log_std):
            if params[name].shape != r.shape:
                raise ValueError(f"parameter {name} has shape {tuple(params[name].shape)}; q's is {tuple(r.shape)}")
        return {n: params[n] for n in self.names}

    def linearized(self, model: Any, x: torch.Tensor, diagonal: bool = False,
                   chunk_size: Optional[int] = None) -> Tuple[torch.Tensor, torch.Tensor]:
        """The Gaussian ``q`` induces at inputs ``x`` (``n`` points) on the network linearised at
        its weights: the mean ``f(x)`` (``n × d'``, the model's dtype) and, in float64, the
        covariance ``J S Jᵀ`` (``n·d'`` square, point-major) or with ``diagonal`` its diagonal
        (``n × d'``). Differentiable in the weights (through ``J``) and in ``log_std``. Forms
        the ``n·d' × p`` Jacobian.

        Parameters
        ----------
        model : torch.nn.Module
            The model ``q`` was made for.
        x : torch.Tensor
            ``n`` inputs.
        diagonal : bool, default False
            Only the variances.
        chunk_size : int, optional
            torch's ``jacrev`` rows per pass (memory).

        Returns
        -------
        (torch.Tensor, torch.Tensor)
            ``f(x)`` (``n × d'``) and the covariance (``n·d' × n·d'``) or variances (``n × d'``).

        Raises
        ------
        ValueError
            Another model's parameters, or non-finite outputs.
        """
        train = self._parameters_of(model)
        _finite(x, "the inputs x of MeanField.linearized")

        def flat_outputs(p: dict) -> Tuple[torch.Tensor, torch.Tensor]:
            out = _checked(torch.func.functional_call(model, p, (x,)), "MeanField")
            return out.reshape(-1), out.reshape(x.shape[0], -1)

        # One pass gives J and f (the aux output keeps its graph to the weights).
        jac, f = torch.func.jacrev(flat_outputs, has_aux=True, chunk_size=chunk_size)(train)
        _finite(f, "the model's outputs in MeanField.linearized")
        rows = f.numel()
        cov: Optional[torch.Tensor] = None
        for name, s in zip(self.names, self.variances()):
            j = jac[name].reshape(rows, -1).to(torch.float64)
            s64 = s.reshape(1, -1).to(torch.float64)
            term = (j * j * s64).sum(dim=1) if diagonal else (j * s64) @ j.T
            cov = term if cov is None else cov + term
        assert cov is not None
        return f, (cov.reshape(f.shape) if diagonal else cov)

    def sample_linearized(self, model: Any, x: torch.Tensor, n_samples: int = 1,
                          generator: Optional[torch.Generator] = None) -> torch.Tensor:
        """``n_samples`` draws of the linearised outputs ``f(x; m) + J(x; m)(√s ⊙ ε)``,
        ``ε ~ N(0, I)`` one weight-space draw per sample shared by the batch (GFSVI's
        reparameterised categorical data term, as Rust's ``DataTerm::Categorical``), shape
        ``n_samples × n × d'`` in the model's dtype. Differentiable in the weights and in
        ``log_std``; no Jacobian is formed (one ``jvp`` per draw).

        Parameters
        ----------
        model : torch.nn.Module
            The model ``q`` was made for.
        x : torch.Tensor
            ``n`` inputs.
        n_samples : int, default 1
        generator : torch.Generator, optional
            Seeds ``ε`` (drawn in the model's dtype on its device).

        Returns
        -------
        torch.Tensor, shape (n_samples, n, d')

        Raises
        ------
        ValueError
            ``n_samples`` below 1, another model's parameters, or non-finite outputs.
        """
        if isinstance(n_samples, bool) or not isinstance(n_samples, int) or n_samples < 1:
            raise ValueError(f"n_samples {n_samples!r} must be an integer ≥ 1")
        train = self._parameters_of(model)

        def outputs(p: dict) -> torch.Tensor:
            return _checked(torch.func.functional_call(model, p, (x,)), "MeanField").reshape(x.shape[0], -1)

        draws = []
        for _ in range(n_samples):
            tangent = {
                n: torch.exp(r) * torch.randn(r.shape, generator=generator, dtype=r.dtype, device=r.device)
                for n, r in zip(self.names, self.log_std)
            }
            f, jv = torch.func.jvp(outputs, (train,), (tangent,))[:2]
            draws.append(f + jv)
        return torch.stack(draws)


def expected_log_likelihood(f: torch.Tensor, var: torch.Tensor, y: torch.Tensor, sigma_noise: Any) -> torch.Tensor:
    """GFSVI's Gaussian data term in closed form (eq. 10), summed over the batch:
    ``Σ_i E_{N(f_i, var_i)}[log N(y_i | ·, σ²)] = Σ_i −½ log(2πσ²) − ((y_i − f_i)² + var_i) / 2σ²``.
    ``sigma_noise`` may be a tensor (learned ``σ``).

    Parameters
    ----------
    f : torch.Tensor
        The predictive means, ``n × d'``.
    var : torch.Tensor
        Their variances, ``n × d'`` (``MeanField.linearized(..., diagonal=True)``).
    y : torch.Tensor
        The targets, ``n × d'``.
    sigma_noise : float or torch.Tensor
        σ > 0.

    Returns
    -------
    torch.Tensor
        A float64 scalar.

    Raises
    ------
    ValueError
        Shapes that differ, a non-finite value, a negative variance, or σ ≤ 0.

    Examples
    --------
    >>> import torch
    >>> from fspace.torch import expected_log_likelihood
    >>> f = torch.zeros(2, 1, dtype=torch.float64)
    >>> round(float(expected_log_likelihood(f, torch.zeros_like(f), f, 1.0)), 6)  # 2 · (−½ log 2π)
    -1.837877
    """
    if f.shape != y.shape or var.shape != f.shape:
        raise ValueError(f"f {tuple(f.shape)}, var {tuple(var.shape)} and y {tuple(y.shape)} must have one shape")
    sigma = torch.as_tensor(sigma_noise, dtype=torch.float64, device=f.device)
    if not bool(torch.all(torch.isfinite(sigma.detach()) & (sigma.detach() > 0))):
        raise ValueError(f"sigma_noise {sigma.detach().cpu().tolist()} must be finite and > 0 (learn log σ to keep it so)")
    for t, what in ((f, "f"), (var, "var"), (y, "y")):
        _finite(t, what)
    if bool((var.detach() < 0).any()):
        raise ValueError("var holds a negative variance")
    s2 = sigma**2
    sq = (y.to(torch.float64) - f.to(torch.float64)) ** 2 + var.to(torch.float64)
    return (-0.5 * torch.log(2 * math.pi * s2) - sq / (2 * s2)).sum()


def expected_log_likelihood_categorical(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """GFSVI's categorical data term by Monte Carlo, summed over the batch:
    ``Σ_i (1/K) Σ_k log softmax(f_k(x_i))[y_i]`` in float64, for ``K × n × d'`` draws of the
    logits (``MeanField.sample_linearized``) and ``n`` integer labels in ``0..d'``. An unbiased
    estimate of ``Σ_i E_{N(f_i, (J S Jᵀ)_i)}[log p(y_i | ·)]``, the expectation Rust's GFSVI
    estimates the same way.

    Parameters
    ----------
    logits : torch.Tensor
        ``K × n × d'`` draws of the logits.
    y : torch.Tensor
        ``n`` class indices in ``0..d'``.

    Returns
    -------
    torch.Tensor
        A float64 scalar.

    Raises
    ------
    ValueError
        Logits not 3-D, a label count that differs from ``n``, labels out of range or not
        integers, non-finite logits.

    Examples
    --------
    >>> import torch
    >>> from fspace.torch import expected_log_likelihood_categorical
    >>> logits = torch.zeros(4, 3, 2, dtype=torch.float64)  # even odds
    >>> round(float(expected_log_likelihood_categorical(logits, torch.tensor([0, 1, 0]))), 6)  # 3 · log ½
    -2.079442
    """
    if logits.ndim != 3:
        raise ValueError(f"logits of shape {tuple(logits.shape)}: expected K × n × d' draws")
    k, n, classes = logits.shape
    labels = y.reshape(-1)
    if labels.numel() != n:
        raise ValueError(f"{labels.numel()} labels for {n} points")
    if labels.dtype.is_floating_point:
        if not bool(torch.all(labels == torch.round(labels))):
            raise ValueError("labels must be integers")
        labels = labels.to(torch.int64)
    if n and (int(labels.min()) < 0 or int(labels.max()) >= classes):
        raise ValueError(f"labels must lie in 0..{classes}; got {int(labels.min())}..{int(labels.max())}")
    _finite(logits, "logits")
    log_p = torch.log_softmax(logits.to(torch.float64), dim=-1)
    picked = log_p.gather(-1, labels.to(logits.device).reshape(1, n, 1).expand(k, n, 1))
    return picked.sum() / k


class GFSVIRegularizer:
    """GFSVI's regularised KL ``D̂_KL^γ`` between ``q``'s linearised Gaussian and the GP
    ``prior`` at measurement points, as a torch loss term (module docs).

    ``prior``: an ``fspace.GPPrior`` or a kernel; ``context``: ``(lower, upper)`` (fresh uniform
    points each call) or an ``M × d`` array; ``n_context``: ``M`` for a box (paper: 500);
    ``gamma``: the regulariser ``γ`` (paper: 1e-10 on the toy; ``γM`` is added to both
    covariances); ``seed``, ``input_shape``, ``include_batch`` as ``FSPRegularizer``'s;
    ``chunk_size``: ``jacrev``'s rows per pass. ``kl(model, q, x_batch)`` returns a float64
    scalar.

    Parameters
    ----------
    prior : fspace.GPPrior or fspace.kernels.MatrixKernel
    context : tuple or array_like
        ``(lower, upper)`` (fresh uniform points each call) or an ``M × d`` array.
    n_context : int, default 500
        ``M`` for a box (the paper's 500).
    gamma : float, default 1e-10
        The regulariser γ (``γM`` is added to both covariances).
    seed : int, default 0
    input_shape : sequence of int, optional
    include_batch : bool, default False
        As ``FSPRegularizer``'s.
    chunk_size : int, optional
        ``jacrev``'s rows per pass.
    process_group : torch.distributed.ProcessGroup, optional
        As ``FSPRegularizer``'s.

    Raises
    ------
    ValueError
        γ not finite and > 0, an empty or inverted box, a count below 1.

    Examples
    --------
    >>> import torch, fspace
    >>> from fspace.torch import GFSVIRegularizer, MeanField
    >>> model = torch.nn.Sequential(torch.nn.Linear(1, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)).double()
    >>> kl = GFSVIRegularizer(fspace.kernels.RBF(1.0, 0.3), context=([-2.0], [2.0]), n_context=10)
    >>> value = kl(model, MeanField(model))
    >>> value.dtype, bool(torch.isfinite(value))
    (torch.float64, True)
    """

    def __init__(self, prior: Any, context: Any, n_context: int = 500, gamma: float = 1e-10, seed: int = 0,
                 input_shape: Optional[Sequence[int]] = None, include_batch: bool = False,
                 chunk_size: Optional[int] = None, process_group: Any = None) -> None:
        from ._method_base import _prior

        self.prior = _prior(prior)
        self._prior_spec = self.prior.spec()
        if not (math.isfinite(gamma) and gamma > 0):
            raise ValueError(f"gamma {gamma} must be finite and > 0")
        self.gamma = float(gamma)
        self.chunk_size = chunk_size
        self._context = _Context(context, n_context, seed, input_shape, include_batch, process_group)

    def points(self) -> np.ndarray:
        """The next call's measurement points (fresh for a box).

        Returns
        -------
        numpy.ndarray, shape (n_context, d)
        """
        return self._context.points()

    def __call__(self, model: Any, q: MeanField, x_batch: Any = None) -> torch.Tensor:
        """The regularised KL at this call's measurement points.

        Parameters
        ----------
        model : torch.nn.Module
            The network (its weights are ``q``'s mean).
        q : MeanField
            The variational distribution over its weights.
        x_batch : torch.Tensor, optional
            The batch's inputs (added to the points with ``include_batch``).

        Returns
        -------
        torch.Tensor
            A float64 scalar, differentiable in the weights and in ``q``.

        Raises
        ------
        TypeError
            ``q`` is not a ``MeanField``.
        ValueError
            Non-finite outputs or covariance at the points.
        """
        if not isinstance(q, MeanField):
            raise TypeError(f"q is a {type(q).__name__}; GFSVIRegularizer takes fspace.torch.MeanField(model)")
        c, ct = self._context.draw(model, x_batch)
        f, cov = q.linearized(model, ct, chunk_size=self.chunk_size)
        _finite(f, "the model's outputs at GFSVIRegularizer's measurement points")
        _finite(cov, "the linearised covariance at GFSVIRegularizer's measurement points")
        return _RegularizedKl.apply(f.to(torch.float64), cov, self._prior_spec, c, self.gamma)
