"""laplace-torch 0.3's function-space structure ``hessian_structure="gp"`` with
``functional_approximation="variational"``: its ``VaLLA`` class, on fspace's NTK blocks.

VaLLA (Ortega et al. 2024) keeps the network as the posterior mean and fits the covariance of
the linearised network's GP — kernel ``κ = J Jᵀ / λ`` — through ``M`` inducing inputs ``Z``,
each with one output ``c_m``. laplace-torch parametrises the weight-space precision
``λ I + J_Zᵀ L Lᵀ J_Z`` by a lower-triangular ``L`` (packed, starting at ``I``); in function
space that is fspace-valla's decoupled form with ``A = L Lᵀ``:

``Σ(x, x') = κ(x, x') − κ(x, Z) L B⁻¹ Lᵀ κ(Z, x')``, ``B = I + Lᵀ κ(Z, Z) L``,
``KL = ½ log|B| − ½ (M − tr B⁻¹)``,

and ``fit`` runs Adam on ``L``, ``log λ``, ``log σ²`` (regression) and ``Z`` (when its inputs are
floating point) over ``iterations`` minibatches, minimising
``−(N / b) · (1/T) · Σᵢ (1/α) log E_q[p(yᵢ | f(xᵢ))^α] + KL`` (α = 0: the ELBO; classification
by the probit approximation, or ``mc_softmax_samples`` draws).

The division of work: Rust (``fspace._fspace.NtkKernel``) runs every network call — ``f(X)``,
the blocks ``J(X) J(Z)ᵀ``, ``J(Z) J(Z)ᵀ`` and ``J(xᵢ) J(xᵢ)ᵀ`` (the MLP's layer-wise rule: no
Jacobian is formed), and the gradient of the objective in ``Z`` pulled back through the blocks
— and this layer keeps ``L``, ``λ``, ``σ`` and ``Z`` as torch parameters and evaluates the
objective on the ``M × M`` and ``b·C × M`` blocks with torch's autograd. laplace-torch forms
``J_Z`` (``M × p``) and factors ``[Lᵀ J_Z / √λ; I]`` by QR in ``p + M`` rows; the two agree to
rounding (float64). The random choices (the inducing inputs by ``torch.randperm`` or SciPy's
``kmeans2``, the MC draws) come from the same seeded generators as laplace-torch's.

``functional_laplace`` is laplace-torch's dispatch of ``hessian_structure="gp"`` to ``ELLA`` or
``VaLLA``.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from ._backend import network_spec
from ._fspace import NtkKernel
from ._ella_laplace import ELLALaplace
from ._functional import (FunctionalSurface, _classification_targets, _integer, _regression_targets,
                          _subset_loader, draw_gaussian, training_indices)
from ._memory import check_budget
from ._predictive import _check_likelihood, _split_batch, _torch
from ._torch import TorchModel, is_module

__all__ = ["VaLLALaplace", "functional_laplace"]


class VaLLALaplace(FunctionalSurface):
    """laplace-torch 0.3's ``VaLLA``: variational linearised Laplace with inducing outputs and
    the trained network as the posterior mean. What ``fspace.Laplace(model, likelihood, "all",
    "gp", functional_approximation="variational", ...)`` returns; the module docs give the maths.

    Parameters
    ----------
    model : torch.nn.Module or tuple
        The trained network (fixed); as ``fspace.Laplace`` takes it.
    likelihood : {"regression", "classification"}
    inducing_locations : tensor, dict or {"random", "kmeans"}
        The inducing inputs, or how ``fit`` picks them from the training loader. Floating-point
        inputs are optimised; integer and dict inputs stay fixed.
    num_inducing : int, optional
        ``M``; required with a strategy, and equal to the inputs' count when both are given.
    inducing_classes : tensor, optional
        The output of each inducing input (default 0; a strategy takes the class labels).
    sigma_noise, prior_precision, prior_mean, temperature : float or tensor
        Initial ``σ`` and ``λ`` (both learned by ``fit``), the zero prior mean, ``T``.
    enable_backprop, dict_key_x, dict_key_y, backend, backend_kwargs
        laplace-torch's; ``backend`` a ``*GGN`` class or fspace's engine name.
    seed : int, default 0
        Seeds the inducing choice and the MC draws.
    alpha : float, default 1.0
        The α of the α-divergence objective, in ``[0, 1]`` (0: the ELBO).
    mc_softmax_samples : int, default 0
        Draws for the classification data term (0: the probit approximation); required for
        classification with ``alpha != 1``.

    Other Parameters
    ----------------
    input_shape : tuple, optional
        ``(C, H, W)`` of a convolutional model fitted on flattened rows.
    optimize_inducing : bool, default True
        fspace's extra: ``False`` keeps floating-point inducing inputs fixed. Moving them needs
        the NTK's gradient in its inputs: the native MLP's layer-wise rule, or torch's
        ``jacrev`` on the torch path (where a convolutional model then runs unless
        ``backend="native"``).

    Raises
    ------
    ValueError
        laplace-torch's checks: a non-scalar or non-positive ``λ``, a non-zero prior mean, ``α``
        outside ``[0, 1]``, classification with ``alpha != 1`` and no MC draws, a bad strategy or
        ``num_inducing``, ``inducing_classes`` of the wrong length.
    NotImplementedError
        ``likelihood="reward_modeling"``, ``enable_backprop=True``, ``backend_kwargs``.

    Examples
    --------
    >>> import torch, fspace
    >>> torch.manual_seed(0)  # doctest: +ELLIPSIS
    <torch._C.Generator object at ...>
    >>> model = torch.nn.Sequential(torch.nn.Linear(1, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)).double()
    >>> x = torch.linspace(-2, 2, 40, dtype=torch.float64).reshape(-1, 1)
    >>> loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, torch.sin(x)), batch_size=10)
    >>> la = fspace.Laplace(model, "regression", "all", "gp", functional_approximation="variational",
    ...                     inducing_locations="random", num_inducing=8, sigma_noise=0.1)
    >>> la.fit(loader, iterations=20, lr=1e-2)
    >>> mean, var = la(x[:3])
    >>> tuple(var.shape)
    (3, 1, 1)
    """

    _transient = ("_kernel",)
    _name = "VaLLA"
    _no_evidence = "VaLLA's variational objective is not a Laplace marginal likelihood."
    _no_log_likelihood = "VaLLA optimizes an alpha-divergence objective."

    def __init__(
        self,
        model: Any,
        likelihood: str,
        inducing_locations: Any,
        num_inducing: Optional[int] = None,
        inducing_classes: Any = None,
        sigma_noise: Any = 1.0,
        prior_precision: Any = 1.0,
        prior_mean: Any = 0.0,
        temperature: float = 1.0,
        enable_backprop: bool = False,
        dict_key_x: str = "input_ids",
        dict_key_y: str = "labels",
        backend: Any = None,
        backend_kwargs: Optional[Dict[str, Any]] = None,
        seed: int = 0,
        alpha: float = 1.0,
        mc_softmax_samples: int = 0,
        *,
        input_shape: Any = None,
        optimize_inducing: bool = True,
    ) -> None:
        torch = _torch()
        if torch.as_tensor(prior_precision).numel() != 1:
            raise ValueError("VaLLA requires scalar prior_precision.")
        if torch.any(torch.as_tensor(prior_mean) != 0):
            raise ValueError("VaLLA currently requires prior_mean=0.")
        if not math.isfinite(temperature) or temperature <= 0:
            raise ValueError("temperature must be positive and finite.")
        if not 0 <= alpha <= 1:
            raise ValueError("alpha must be in [0, 1].")
        if not _integer(mc_softmax_samples) or mc_softmax_samples < 0:
            raise ValueError("mc_softmax_samples must be a nonnegative integer.")
        _check_likelihood(likelihood)
        engine = self._engine(enable_backprop, backend, backend_kwargs, seed, "kernel is")
        spec = network_spec(model, input_shape, engine)
        if engine == "auto" and optimize_inducing and getattr(spec, "is_cnn", False) and is_module(model):
            # fspace's native CNN has no NTK gradient in its inputs, which moving Z needs: torch's.
            spec = network_spec(model, input_shape, "torch")
        self._bind(model, likelihood, dict_key_x, dict_key_y, spec)
        self._kernel: Any = None
        self._temperature = 1.0
        self.temperature = temperature
        self.prior_precision = prior_precision
        self.sigma_noise = sigma_noise
        self.prior_mean = prior_mean
        if likelihood != "regression" and alpha != 1 and mc_softmax_samples == 0:
            raise ValueError(
                "Classification alpha != 1 requires mc_softmax_samples > 0; "
                "the deterministic probit approximation is alpha-independent."
            )
        self.seed = int(seed)
        self.alpha = alpha
        self.mc_softmax_samples = int(mc_softmax_samples)
        self.optimize_inducing = bool(optimize_inducing)
        self.generator = torch.Generator().manual_seed(self.seed)
        self.log_prior_precision = torch.nn.Parameter(self._prior_precision.detach().log().clone())
        self.log_noise_variance = (torch.nn.Parameter(2 * self._sigma_noise.detach().log().clone())
                                   if likelihood == "regression" else None)
        self._inducing_strategy = inducing_locations if isinstance(inducing_locations, str) else None
        if self._inducing_strategy is not None and self._inducing_strategy not in ("random", "kmeans"):
            raise ValueError("inducing_locations must be inputs, 'random', or 'kmeans'.")
        if isinstance(inducing_locations, str):
            if not _integer(num_inducing) or num_inducing <= 0:  # type: ignore[operator]
                raise ValueError("num_inducing must be a positive integer for an inducing strategy.")
            self.num_inducing = int(num_inducing)  # type: ignore[arg-type]
            self.inducing_locations: Any = None
        else:
            self.inducing_locations = self._make_inducing(inducing_locations)
            count = self._count(self.inducing_locations)
            if num_inducing is not None and (not _integer(num_inducing) or num_inducing != count):
                raise ValueError("num_inducing must match inducing_locations.")
            self.num_inducing = count
        if self.num_inducing <= 0:
            raise ValueError("At least one inducing location is required.")
        self.inducing_classes = (torch.zeros(self.num_inducing, dtype=torch.long) if inducing_classes is None
                                 else torch.as_tensor(inducing_classes, dtype=torch.long))
        if self.inducing_classes.shape != (self.num_inducing,):
            raise ValueError("inducing_classes must have one entry per inducing input.")
        self._initial_inducing_locations = (None if self._inducing_strategy is not None
                                            else _clone_fixed(self.inducing_locations))
        self._initial_inducing_classes = self.inducing_classes.detach().clone()
        self._init_variational_factor()
        self.n_data = 0
        self.n_outputs: Optional[int] = None
        self._fitted = False
        self.fit_history_: Dict[str, List[float]] = {"objective": [], "val_nll": []}

    # -- hyperparameters: λ and σ are trainable (their logs are Adam's parameters) ---------------

    @property
    def prior_precision(self) -> Any:
        """``λ = exp(log_prior_precision)``, a one-element tensor (differentiable, as laplace-torch's)."""
        if hasattr(self, "log_prior_precision"):
            return self.log_prior_precision.exp()
        return self._prior_precision

    @prior_precision.setter
    def prior_precision(self, value: Any) -> None:
        torch = _torch()
        self._prior_precision = self._checked_prior_precision(value).detach().clone()
        if hasattr(self, "log_prior_precision"):
            with torch.no_grad():
                self.log_prior_precision.copy_(self._prior_precision.log())

    @property
    def sigma_noise(self) -> Any:
        """``σ = exp(log_noise_variance / 2)`` for regression (learned by ``fit``); 1 otherwise."""
        lnv = getattr(self, "log_noise_variance", None)
        if lnv is not None:
            return (0.5 * lnv).exp()
        return self._sigma_noise

    @sigma_noise.setter
    def sigma_noise(self, value: Any) -> None:
        torch = _torch()
        self._sigma_noise = self._checked_sigma_noise(value).detach().clone()
        lnv = getattr(self, "log_noise_variance", None)
        if lnv is not None:
            with torch.no_grad():
                lnv.copy_(2 * self._sigma_noise.log())

    # -- the inducing inputs and the variational factor -------------------------------------------

    def _count(self, inputs: Any) -> int:
        if isinstance(inputs, Mapping):
            return int(inputs[self.dict_key_x].shape[0])
        return int(inputs.shape[0])

    def _make_inducing(self, inputs: Any) -> Any:
        """laplace-torch's ``_make_inducing``: floating-point inputs become a trainable parameter
        (float64 here), integer tensors and dicts stay fixed copies."""
        torch = _torch()
        if isinstance(inputs, Mapping):
            return _clone_fixed(dict(inputs))
        converted = torch.as_tensor(inputs) if not torch.is_tensor(inputs) else inputs
        if converted.is_floating_point():
            return torch.nn.Parameter(converted.detach().to(self._dtype).clone())
        return converted.detach().clone()

    def _init_variational_factor(self) -> None:
        torch = _torch()
        rows, cols = torch.tril_indices(self.num_inducing, self.num_inducing)
        self.L = torch.nn.Parameter(torch.eye(self.num_inducing, dtype=self._dtype)[rows, cols].clone())

    def _factor_matrix(self) -> Any:
        torch = _torch()
        rows, cols = torch.tril_indices(self.num_inducing, self.num_inducing)
        matrix = torch.zeros(self.num_inducing, self.num_inducing, dtype=self._dtype)
        matrix[rows, cols] = self.L
        return matrix

    def _inducing_rows(self) -> np.ndarray:
        torch = _torch()
        z = self.inducing_locations
        if torch.is_tensor(z):
            z = z.detach()
        return self._inputs(z)

    def _moves_inducing(self) -> bool:
        torch = _torch()
        return self.optimize_inducing and isinstance(self.inducing_locations, torch.nn.Parameter)

    def _gather_inducing(self, loader: Any) -> None:
        """laplace-torch's ``_gather_inducing``: ``"random"`` takes ``M`` training inputs by two
        seeded permutations (of the loader's indices, then of the rows gathered); ``"kmeans"``
        the input nearest each of SciPy's ``kmeans2`` centres (seeded) over every training input.
        Classification takes each input's label as its output, regression output 0."""
        torch = _torch()
        source = loader
        if self._inducing_strategy == "random":
            available_indices = training_indices(loader)
            count = min(len(available_indices), self.num_inducing)
            choices = torch.randperm(len(available_indices), generator=torch.Generator().manual_seed(self.seed))[:count]
            source = _subset_loader(loader, available_indices[choices])
        candidates, classes = [], []
        for batch in source:
            x, y = _split_batch(batch, self._key_x, self.dict_key_y)
            if self.likelihood == "classification":
                labels = _classification_targets(y)
            else:
                labels = torch.zeros(len(y), dtype=torch.long)
            candidates.append(x)
            classes.append(labels)
        if not candidates:
            raise ValueError("Cannot initialize inducing inputs from an empty loader.")
        labels = torch.cat(classes)
        available = labels.shape[0]
        if available < self.num_inducing:
            raise ValueError("num_inducing exceeds available training inputs.")
        if isinstance(candidates[0], Mapping):
            inputs: Any = {k: torch.cat([torch.as_tensor(c[k]) for c in candidates]) for k in candidates[0]}
        else:
            inputs = torch.cat([torch.as_tensor(c) for c in candidates])
        if self._inducing_strategy == "kmeans":
            if isinstance(inputs, Mapping) or not inputs.is_floating_point():
                raise ValueError("kmeans requires floating-point tensor inputs.")
            inputs = inputs.to(self._dtype)  # laplace-torch clusters the inputs in the model's dtype
            try:
                from scipy.cluster.vq import kmeans2
            except ImportError:
                raise ImportError("inducing_locations='kmeans' follows laplace-torch, which runs SciPy's kmeans2: "
                                  "install scipy, or use 'random' or explicit inputs") from None
            flat = inputs.detach().cpu().reshape(available, -1).numpy()
            centers, _ = kmeans2(flat, self.num_inducing, minit="points", seed=self.seed)
            check_budget(available * self.num_inducing * flat.shape[1] * 8,
                         f"k-means distances ({available} × {self.num_inducing} × {flat.shape[1]})",
                         "fewer training inputs, or inducing_locations='random'")
            distances = ((flat[:, None, :] - centers[None, :, :]) ** 2).sum(-1)
            indices = torch.as_tensor(distances.argmin(0))
        else:
            indices = torch.randperm(available, generator=torch.Generator().manual_seed(self.seed))[: self.num_inducing]
        if isinstance(inputs, Mapping):
            chosen: Any = {k: v[indices] for k, v in inputs.items()}
        else:
            chosen = inputs[indices]
        self.inducing_locations = self._make_inducing(chosen)
        self.inducing_classes = labels[indices].long()

    # -- the moments on the NTK blocks ------------------------------------------------------------

    def _ensure_kernel(self) -> Any:
        if self._kernel is None:
            self._kernel = NtkKernel(**self._network())
        return self._kernel

    def _blocks(self, x: Any) -> Tuple[Tuple[np.ndarray, np.ndarray, List[int]], Any, Any, Any, Any]:
        """``(at, f, J(X)J(Z)ᵀ, J(Z)J(Z)ᵀ, [J(xᵢ)J(xᵢ)ᵀ])``: the kernels unscaled, as float64
        tensors, and ``at = (rows of x, rows of Z, Z's outputs)`` where they were taken (the
        pull-back to ``Z`` is taken there too)."""
        torch = _torch()
        at = (self._inputs(x), self._inducing_rows(), self.inducing_classes.tolist())
        f, kxz, kzz, kxx = self._ensure_kernel().blocks(*at)
        return at, torch.from_numpy(f), torch.from_numpy(kxz), torch.from_numpy(kzz), torch.from_numpy(kxx)

    def _reduction(self, kzz: Any) -> Tuple[Any, Any, Any, Any]:
        """``(λ, L, chol B, KL)`` from the unscaled ``J(Z)J(Z)ᵀ``."""
        torch = _torch()
        lam = self.prior_precision.to(self._dtype)
        factor = self._factor_matrix()
        eye = torch.eye(self.num_inducing, dtype=self._dtype)
        b = eye + factor.T @ (kzz / lam) @ factor
        chol = torch.linalg.cholesky((b + b.T) / 2)
        inverse_root = torch.linalg.solve_triangular(chol, eye, upper=False)
        kl = chol.diagonal().log().sum() - 0.5 * (self.num_inducing - inverse_root.square().sum())
        return lam, factor, chol, kl

    def _covariance(self, kxz: Any, kxx: Any, lam: Any, factor: Any, chol: Any, joint: bool) -> Any:
        """``κ(x, x) − κ(x, Z) L B⁻¹ Lᵀ κ(Z, x)``: per point ``B × C × C``, or joint."""
        torch = _torch()
        w = torch.linalg.solve_triangular(chol, (kxz / lam @ factor).T, upper=False)  # M × B·C
        if joint:
            covariance = kxx / lam - w.T @ w
        else:
            batch, outputs = kxx.shape[:2]
            roots = w.T.reshape(batch, outputs, -1)
            covariance = kxx / lam - torch.einsum("bcm,bdm->bcd", roots, roots)
        return (covariance + covariance.transpose(-1, -2)) / 2

    def _objective(self, x: Any, y: Any) -> Tuple[Any, Any, Any, Tuple[np.ndarray, np.ndarray, List[int]]]:
        """laplace-torch's minibatch objective; also the kernel blocks (leaves of the graph, so
        their gradients pull back to ``Z``) and where they were taken (``_blocks``)."""
        torch = _torch()
        at, mean, kxz, kzz, kxx = self._blocks(x)
        if self._moves_inducing():
            kxz.requires_grad_(True)
            kzz.requires_grad_(True)
        lam, factor, chol, kl = self._reduction(kzz)
        covariance = self._covariance(kxz, kxx, lam, factor, chol, joint=False)
        if self.likelihood == "regression":
            y = _regression_targets(y, mean)
            noise_variance = self.sigma_noise.square()
            latent_variance = covariance.diagonal(dim1=-2, dim2=-1)
            squared_error = (y - mean).square()
            if self.alpha == 0:
                energy = (squared_error + latent_variance) / noise_variance
            else:
                energy = (squared_error / (noise_variance + self.alpha * latent_variance)
                          + torch.log1p(self.alpha * latent_variance / noise_variance) / self.alpha)
            log_term = -0.5 * (energy + torch.log(2 * torch.pi * noise_variance)).sum()
        else:
            y = _classification_targets(y)
            if self.mc_softmax_samples:
                draws = draw_gaussian(mean, covariance, self.mc_softmax_samples, self.generator)
                selected = draws.log_softmax(dim=-1).gather(
                    -1, y.long().view(1, -1, 1).expand(self.mc_softmax_samples, -1, 1)).squeeze(-1)
                if self.alpha == 0:
                    log_term = selected.mean(dim=0).sum()
                else:
                    log_term = (torch.logsumexp(self.alpha * selected, dim=0)
                                - torch.log(torch.as_tensor(self.mc_softmax_samples, dtype=self._dtype))).sum() / self.alpha
            else:
                scaled = mean / torch.sqrt(1 + torch.pi / 8 * covariance.diagonal(dim1=-2, dim2=-1))
                log_term = -torch.nn.functional.cross_entropy(scaled, y.long(), reduction="sum")
        objective = -(self.n_data / y.shape[0]) * log_term / self.temperature + kl
        return objective, kxz, kzz, at

    def _pull_back_to_inducing(self, at: Tuple[np.ndarray, np.ndarray, List[int]], kxz: Any, kzz: Any) -> None:
        """Sets ``Z.grad`` from the objective's gradients in the kernel blocks (Rust's pull-back
        through ``J(X)J(Z)ᵀ`` and both sides of ``J(Z)J(Z)ᵀ``)."""
        torch = _torch()
        z = self.inducing_locations
        c_xz = kxz.grad if kxz.grad is not None else torch.zeros_like(kxz)
        c_zz = kzz.grad if kzz.grad is not None else torch.zeros_like(kzz)
        args = (*at, np.ascontiguousarray(c_xz.numpy()), np.ascontiguousarray(c_zz.numpy()))
        if isinstance(self._spec, TorchModel):
            g = self._spec.calls().ntk_pullback_inducing(*args)
        else:
            try:
                g = self._kernel.pullback_z(*args)
            except NotImplementedError as e:
                raise NotImplementedError(
                    f"laplace-torch's VaLLA moves floating-point inducing inputs, which needs the NTK's gradient in "
                    f"its inputs ({e}): fspace's native networks have it for MLPs; pass backend=\"torch\" (or leave "
                    "backend unset) to take it from torch, or optimize_inducing=False to keep the inducing inputs fixed"
                ) from None
        z.grad = torch.from_numpy(g).reshape(z.shape).to(z.dtype)

    # -- fit ------------------------------------------------------------------------------------

    def fit(self, train_loader: Any, *, iterations: int = 100, lr: float = 1e-3, val_loader: Any = None,
            val_steps: Optional[int] = None, progress_bar: bool = False, override: bool = True) -> None:
        """Optimises ``L``, ``λ``, ``σ`` (regression) and ``Z`` by Adam over ``iterations``
        minibatches of ``train_loader`` (cycled), as laplace-torch's ``VaLLA.fit``.

        Parameters
        ----------
        train_loader : DataLoader
            ``(x, y)`` or dict batches; ``N`` is the number of indices its sampler visits.
        iterations : int, default 100
            Adam steps, one minibatch each.
        lr : float, default 1e-3
            Adam's learning rate.
        val_loader : DataLoader, optional
            Scored (predictive NLL) every ``val_steps`` steps and at the end, into
            ``fit_history_["val_nll"]``.
        val_steps : int, optional
        progress_bar : bool, default False
            A tqdm bar over the steps.
        override : bool, default True
            Start again (new inducing inputs and ``L = I``); ``False`` continues the last fit.

        Returns
        -------
        None

        Raises
        ------
        ValueError
            laplace-torch's checks (``iterations``, ``lr``, ``val_steps``, the inducing classes),
            an empty loader.
        NotImplementedError
            Moving the inducing inputs of a CNN with ``backend="native"``.
        """
        torch = _torch()
        if (not _integer(iterations) or iterations <= 0 or not math.isfinite(lr) or lr <= 0):
            raise ValueError("iterations must be a positive integer and lr positive and finite.")
        if val_steps is not None and (not _integer(val_steps) or val_steps <= 0):
            raise ValueError("val_steps must be positive integer when provided.")
        if not 0 <= self.alpha <= 1:
            raise ValueError("alpha must be in [0, 1].")
        if self.likelihood != "regression" and self.alpha != 1 and self.mc_softmax_samples == 0:
            raise ValueError("Classification alpha != 1 requires mc_softmax_samples > 0.")
        with self._lock:
            if hasattr(self.model, "eval"):
                self.model.eval()
            self._kernel = None  # the model's weights as they are now
            self.n_data = len(training_indices(train_loader))
            first = next(iter(train_loader), None)
            if first is None:
                raise ValueError("VaLLA fit requires a nonempty training loader.")
            self._inputs(_split_batch(first, self._key_x, self.dict_key_y)[0])  # a torch model's input layout
            self.n_outputs = int(self._ensure_kernel().output_dim)
            if override or not self._fitted:
                if self._inducing_strategy is not None:
                    self._gather_inducing(train_loader)
                else:
                    self.inducing_locations = self._make_inducing(self._initial_inducing_locations)
                    self.inducing_classes = self._initial_inducing_classes.detach().clone()
                self._init_variational_factor()
                self.fit_history_ = {"objective": [], "val_nll": []}
            if (self.inducing_classes.shape != (self.num_inducing,) or torch.any(self.inducing_classes < 0)
                    or torch.any(self.inducing_classes >= self.n_outputs)):
                raise ValueError("inducing_classes must contain one valid output per inducing input.")
            self._fitted = False
            parameters = [self.L, self.log_prior_precision]
            if self.log_noise_variance is not None:
                parameters.append(self.log_noise_variance)
            if self._moves_inducing():
                parameters.append(self.inducing_locations)
            optimizer = torch.optim.Adam(parameters, lr=lr)
            steps: Any = range(iterations)
            if progress_bar:
                from tqdm import trange

                steps = trange(iterations, desc="Fitting VaLLA")
            batches = iter(train_loader)
            for step in steps:
                try:
                    batch = next(batches)
                except StopIteration:
                    batches = iter(train_loader)
                    batch = next(batches)
                x, y = _split_batch(batch, self._key_x, self.dict_key_y)
                self._check_nonempty(x)
                optimizer.zero_grad()
                objective, kxz, kzz, at = self._objective(x, y)
                objective.backward()
                if self._moves_inducing():
                    self._pull_back_to_inducing(at, kxz, kzz)
                optimizer.step()
                self.fit_history_["objective"].append(float(objective.detach()))
                if val_loader is not None and val_steps and (step + 1) % val_steps == 0:
                    self._fitted = True
                    with torch.no_grad():
                        self.fit_history_["val_nll"].append(float(self._validation_nll(val_loader)))
            self._fitted = True
            if val_loader is not None and (not val_steps or iterations % val_steps):
                with torch.no_grad():
                    self.fit_history_["val_nll"].append(float(self._validation_nll(val_loader)))

    def _check_fitted(self) -> None:
        if not self._fitted:
            raise RuntimeError("Call fit before making functional Laplace predictions.")

    # -- predictions ----------------------------------------------------------------------------

    def _glm_predictive_distribution(self, x: Any, joint: bool = False) -> Tuple[Any, Any]:
        torch = _torch()
        with torch.no_grad():
            at, mean, kxz, kzz, kxx = self._blocks(x)
            if joint:
                side = kxz.shape[0]
                check_budget(3 * side * side * 8, f"a joint predictive covariance ({side} × {side})",
                             "fewer points per call, or joint=False")
                kxx = torch.from_numpy(self._kernel.joint_block(at[0]))
            lam, factor, chol, _ = self._reduction(kzz)
            covariance = self._covariance(kxz, kxx, lam, factor, chol, joint)
        return (mean.flatten() if joint else mean), covariance

    def _validation_nll(self, loader: Any) -> Any:
        """laplace-torch's validation NLL per point: Gaussian with ``σ²`` added (regression), the
        probit-scaled cross-entropy (classification)."""
        torch = _torch()
        total = torch.zeros((), dtype=self._dtype)
        count = 0
        for batch in loader:
            x, y = _split_batch(batch, self._key_x, self.dict_key_y)
            self._check_nonempty(x)
            mean, covariance = self.predictive_moments(x)
            if self.likelihood == "regression":
                y = _regression_targets(y, mean)
                variance = covariance.diagonal(dim1=-2, dim2=-1) + self.sigma_noise.square()
                # laplace-torch's constant, at torch's default dtype, as it writes it.
                total += (0.5 * ((y - mean).square() / variance + variance.log()
                                 + torch.log(torch.as_tensor(2 * torch.pi)))).sum()
            else:
                scale = torch.sqrt(1 + torch.pi / 8 * covariance.diagonal(dim1=-2, dim2=-1))
                total += torch.nn.functional.cross_entropy(mean / scale, _classification_targets(y), reduction="sum")
            count += y.shape[0]
        return total / count

    # -- what VaLLA refuses, as laplace-torch ----------------------------------------------------

    def optimize_prior_precision(self, *args: Any, **kwargs: Any) -> None:
        """Refused, as in laplace-torch: ``fit`` learns ``λ`` with the variational parameters.

        Parameters
        ----------
        *args, **kwargs
            laplace-torch's arguments.

        Returns
        -------
        None
            Never: it raises.

        Raises
        ------
        NotImplementedError
            Always.
        """
        raise NotImplementedError("VaLLA optimizes prior precision during fit.")

    # -- saving ---------------------------------------------------------------------------------

    def state_dict(self) -> Dict[str, Any]:
        """The fitted variational state, laplace-torch's keys: ``L``, ``log_prior_precision``,
        ``log_noise_variance``, the inducing inputs and classes (and their initial values), the
        settings, ``fit_history``, ``seed`` and the MC generator's state.

        Returns
        -------
        dict
            Restore with ``load_state_dict`` on an object built with the same model and arguments.
        """
        torch = _torch()
        with self._lock:
            self._check_fitted()
            z = self.inducing_locations
            return {
                "cls_name": type(self).__name__,
                "n_params": self.n_params,
                "likelihood": self.likelihood,
                "inducing_locations": z.detach().clone() if torch.is_tensor(z) else copy.deepcopy(z),
                "inducing_classes": self.inducing_classes.detach().clone(),
                "inducing_strategy": self._inducing_strategy,
                "initial_inducing_locations": _clone_fixed(self._initial_inducing_locations),
                "initial_inducing_classes": self._initial_inducing_classes.detach().clone(),
                "L": self.L.detach().clone(),
                "log_prior_precision": self.log_prior_precision.detach().clone(),
                "log_noise_variance": None if self.log_noise_variance is None else self.log_noise_variance.detach().clone(),
                "temperature": self.temperature,
                "alpha": self.alpha,
                "mc_softmax_samples": self.mc_softmax_samples,
                "n_data": self.n_data,
                "n_outputs": self.n_outputs,
                "fitted": self._fitted,
                "fit_history": copy.deepcopy(self.fit_history_),
                "seed": self.seed,
                "generator_state": self.generator.get_state().clone(),
                "dict_key_x": self.dict_key_x,
                "dict_key_y": self.dict_key_y,
            }

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Restores a ``state_dict()`` taken from a ``VaLLALaplace`` on the same model.

        Parameters
        ----------
        state_dict : dict
            From ``state_dict()``.

        Raises
        ------
        ValueError
            An unfitted checkpoint, another class, model, likelihood or key names, or a variational
            factor, inducing set or hyperparameter of the wrong shape or not finite.
        """
        torch = _torch()
        self._check_checkpoint(state_dict)
        classes = torch.as_tensor(state_dict["inducing_classes"], dtype=torch.long)
        m = classes.shape[0] if classes.ndim == 1 else -1
        packed = torch.as_tensor(state_dict["L"], dtype=self._dtype)
        if m <= 0 or packed.shape != (m * (m + 1) // 2,) or not torch.all(torch.isfinite(packed)):
            raise ValueError("the checkpoint's L must be the finite packed lower triangle of its inducing set")
        logs = [state_dict["log_prior_precision"]] + ([state_dict["log_noise_variance"]]
                                                      if self.log_noise_variance is not None else [])
        if not all(torch.all(torch.isfinite(torch.as_tensor(v))) for v in logs):
            raise ValueError("the checkpoint's log_prior_precision / log_noise_variance must be finite")
        with self._lock:
            self.seed = int(state_dict["seed"])
            self.generator = torch.Generator()
            self.generator.set_state(state_dict["generator_state"])
            self.num_inducing = m
            self.inducing_locations = self._make_inducing(state_dict["inducing_locations"])
            if self._count(self.inducing_locations) != m:
                raise ValueError("the checkpoint's inducing inputs and classes differ in number")
            self.inducing_classes = classes
            self._inducing_strategy = state_dict["inducing_strategy"]
            self._initial_inducing_locations = _clone_fixed(state_dict["initial_inducing_locations"])
            self._initial_inducing_classes = torch.as_tensor(state_dict["initial_inducing_classes"], dtype=torch.long)
            self._init_variational_factor()
            with torch.no_grad():
                self.L.copy_(packed)
                self.log_prior_precision.copy_(torch.as_tensor(state_dict["log_prior_precision"], dtype=self._dtype))
                if self.log_noise_variance is not None:
                    self.log_noise_variance.copy_(torch.as_tensor(state_dict["log_noise_variance"], dtype=self._dtype))
            self.n_data = int(state_dict["n_data"])
            self.n_outputs = state_dict["n_outputs"]
            self.temperature = state_dict["temperature"]
            self.alpha = state_dict["alpha"]
            self.mc_softmax_samples = int(state_dict["mc_softmax_samples"])
            self.fit_history_ = copy.deepcopy(state_dict["fit_history"])
            self._kernel = None
            self._fitted = True


def _clone_fixed(value: Any) -> Any:
    """laplace-torch's ``_clone_fixed_inputs``: detached copies of tensors, recursively."""
    torch = _torch()
    if torch.is_tensor(value):
        return value.detach().clone()
    if isinstance(value, Mapping):
        return {key: _clone_fixed(item) for key, item in value.items()}
    if isinstance(value, (tuple, list)):
        return type(value)(_clone_fixed(item) for item in value)
    return copy.deepcopy(value)


def functional_laplace(model: Any, likelihood: str, subset_of_weights: str, *args: Any,
                       functional_approximation: str = "sod", **kwargs: Any) -> Any:
    """laplace-torch's ``Laplace(..., hessian_structure="gp", functional_approximation=...)``."""
    if functional_approximation not in ("sod", "nystrom", "variational"):
        raise ValueError("functional_approximation must be 'sod', 'nystrom', or 'variational'.")
    if functional_approximation == "sod":
        raise NotImplementedError(
            "hessian_structure='gp' with functional_approximation='sod' (laplace-torch's FunctionalLaplace, an exact "
            "GP on a subset of the data) is not implemented in fspace: use functional_approximation='nystrom' (ELLA)"
        )
    if subset_of_weights != "all":
        raise ValueError("Nystrom and variational function-space methods require subset_of_weights='all'.")
    if functional_approximation == "variational":
        return VaLLALaplace(model, likelihood, *args, **kwargs)
    return ELLALaplace(model, likelihood, *args, **kwargs)
