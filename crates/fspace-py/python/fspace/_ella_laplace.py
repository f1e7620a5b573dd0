"""laplace-torch 0.3's function-space structure ``hessian_structure="gp"`` with
``functional_approximation="nystrom"``: its ``ELLA`` class, on fspace's Nyström features.

ELLA (Deng et al. 2022) linearises the network and restricts the Laplace posterior to ``K``
Nyström features of the neural tangent kernel: from ``M = subsample_size`` training inputs, each
with one output (a class drawn at random), the unit kernel ``J Jᵀ = U Λ Uᵀ`` gives the
parameter directions ``V = Jᵀ U_K Λ_K^{-1/2}`` and the features ``φ(x) = J(x) V``. The posterior
precision in feature space is ``G / (σ²·T) + λ I`` with ``G = Σᵢ Φᵢᵀ Hᵢ Φᵢ`` (``σ²`` for
regression only), and the predictive covariance at ``x`` is ``Φ(x) P⁻¹ Φ(x)ᵀ``.

The division of work: Rust (``fspace._fspace.NystromFeatures``) runs every network call — the
kernel at the Nyström points, the ``K`` directions, the features of each batch — and this
layer keeps ``G`` (``K × K``), ``λ``, ``σ`` and ``T`` as tensors and evaluates laplace-torch's
formulas on them. The random choices (the Nyström points by ``torch.randperm`` and their
outputs by ``torch.randint``, seeded by ``seed`` and ``seed + 1``) are made with torch's
generator exactly as laplace-torch makes them, so the same script gives the same posterior.
"""

from __future__ import annotations

import copy
import math
from collections import deque
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from ._backend import network_spec
from ._distributed import _group, agree_on, agreed, weights_summary
from ._predictive import _check_likelihood, _split_batch, _torch
from ._fspace import NystromFeatures
from ._functional import (FunctionalSurface, _classification_targets, _global_indices, _integer, _regression_targets,
                          _subset_loader, training_indices)
from ._memory import check_budget

__all__ = ["ELLALaplace"]


class ELLALaplace(FunctionalSurface):
    """laplace-torch 0.3's ``ELLA``: the linearised Laplace approximation in ``n_eigenvalues``
    Nyström features of the neural tangent kernel (Deng et al. 2022). What
    ``fspace.Laplace(model, likelihood, "all", "gp", functional_approximation="nystrom", ...)``
    returns; the module docs give the maths.

    Parameters
    ----------
    model : torch.nn.Module or tuple
        The trained network (fixed); as ``fspace.Laplace`` takes it.
    likelihood : {"regression", "classification"}
    subsample_size : int
        ``M``, training inputs of the Nyström basis.
    n_eigenvalues : int
        ``K ≤ M``, kernel directions kept.
    sigma_noise, prior_precision, prior_mean, temperature : float or tensor
        laplace-torch's hyperparameters: the feature-space precision is
        ``G / (σ²·T) + λ I``; ``λ`` is a positive scalar, the prior mean zero.
    enable_backprop, dict_key_x, dict_key_y, backend, backend_kwargs
        laplace-torch's; ``backend`` a ``*GGN`` class or fspace's engine name.
    seed : int, default 1234
        Seeds the choice of the Nyström points (``seed``) and of their outputs (``seed + 1``).

    Other Parameters
    ----------------
    input_shape : tuple, optional
        ``(C, H, W)`` of a convolutional model fitted on flattened rows.

    Raises
    ------
    ValueError
        ``n_eigenvalues`` not in ``1..subsample_size``, a non-scalar or non-positive ``λ``, a
        non-zero prior mean, ``sigma_noise != 1`` for classification.
    NotImplementedError
        ``likelihood="reward_modeling"``, ``enable_backprop=True``, ``backend_kwargs``.

    Examples
    --------
    >>> import torch, fspace
    >>> torch.manual_seed(0)  # doctest: +ELLIPSIS
    <torch._C.Generator object at ...>
    >>> model = torch.nn.Sequential(torch.nn.Linear(2, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3)).double()
    >>> x = torch.randn(60, 2, dtype=torch.float64)
    >>> loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, torch.randint(3, (60,))), batch_size=20)
    >>> la = fspace.Laplace(model, "classification", "all", "gp", functional_approximation="nystrom",
    ...                     subsample_size=30, n_eigenvalues=10)
    >>> la.fit(loader)
    >>> tuple(la(x[:4]).shape)
    (4, 3)
    """

    _transient = ("_features", "_group")
    _name = "ELLA"
    _no_evidence = "ELLA does not use FunctionalLaplace's subset-of-data marginal likelihood."
    _no_log_likelihood = "ELLA does not accumulate a training log likelihood."

    def __init__(
        self,
        model: Any,
        likelihood: str,
        subsample_size: int,
        n_eigenvalues: int,
        sigma_noise: Any = 1.0,
        prior_precision: Any = 1.0,
        prior_mean: Any = 0.0,
        temperature: float = 1.0,
        enable_backprop: bool = False,
        dict_key_x: str = "input_ids",
        dict_key_y: str = "labels",
        backend: Any = None,
        backend_kwargs: Optional[Dict[str, Any]] = None,
        seed: int = 1234,
        *,
        input_shape: Any = None,
    ) -> None:
        torch = _torch()
        _check_likelihood(likelihood)
        if (not _integer(subsample_size) or not _integer(n_eigenvalues) or subsample_size <= 0
                or n_eigenvalues <= 0 or n_eigenvalues > subsample_size):
            raise ValueError("Require 0 < n_eigenvalues <= subsample_size.")
        if torch.as_tensor(prior_precision).numel() != 1:
            raise ValueError("ELLA requires scalar prior_precision.")
        if torch.any(torch.as_tensor(prior_mean) != 0):
            raise ValueError("ELLA currently requires prior_mean=0.")
        engine = self._engine(enable_backprop, backend, backend_kwargs, seed, "features are")
        self._bind(model, likelihood, dict_key_x, dict_key_y, network_spec(model, input_shape, engine))
        self.subsample_size = int(subsample_size)
        self.n_eigenvalues = int(n_eigenvalues)
        self.seed = int(seed)
        self._features: Any = None
        self._group: Any = None  # the process group of a sharded fit (not saved)
        self._saved_features: Optional[str] = None
        self.feature_gram: Any = None
        self.chol_precision: Any = None
        self.n_data = 0
        self.n_outputs: Optional[int] = None
        self._fitted = False
        self._posterior_dirty = False
        self.fit_history_: Dict[str, List[Any]] = {"processed_examples": [], "val_nll": [], "tuning": []}
        self._temperature = 1.0
        self.temperature = temperature
        self.prior_precision = prior_precision
        self.sigma_noise = sigma_noise
        self.prior_mean = prior_mean

    # -- hyperparameters (laplace-torch's setters and their checks) -------------------------------

    @property
    def prior_precision(self) -> Any:
        """``λ``, a one-element tensor."""
        return self._prior_precision

    @prior_precision.setter
    def prior_precision(self, value: Any) -> None:
        self._prior_precision = self._checked_prior_precision(value)
        self._hyperparameters_changed()

    @property
    def sigma_noise(self) -> Any:
        """``σ``, a 0-d tensor."""
        return self._sigma_noise

    @sigma_noise.setter
    def sigma_noise(self, value: Any) -> None:
        self._sigma_noise = self._checked_sigma_noise(value)
        self._hyperparameters_changed()

    def _map(self) -> Any:
        if self._features is None:
            if self._saved_features is None:
                raise RuntimeError("Call fit before making functional Laplace predictions.")
            self._features = NystromFeatures(saved=self._saved_features, **self._network())
        return self._features

    def _eval(self, x: Any) -> Tuple[Any, Any]:
        """``(Φ, f)``: features ``B × C × K`` and outputs ``B × C`` as float64 tensors."""
        torch = _torch()
        phi, f = self._map().eval(self._inputs(x))
        return torch.from_numpy(phi), torch.from_numpy(f)

    @property
    def dual_directions(self) -> Any:
        """The parameter directions ``V`` (``n_params × n_eigenvalues``), or None before fit."""
        if not self._fitted:
            return None
        return _torch().from_numpy(self._map().directions())

    # -- fit --------------------------------------------------------------------------------------

    def _indices(self, loader: Any, balanced: bool, group: Any = None) -> Any:
        torch = _torch()
        available = training_indices(loader) if group is None else _global_indices(loader, group)
        n = len(available)
        if self.subsample_size > n:
            raise ValueError("subsample_size cannot exceed the training set size.")
        generator = torch.Generator().manual_seed(self.seed)
        if not balanced:
            return available[torch.randperm(n, generator=generator)[: self.subsample_size]]
        if self.likelihood == "regression":
            raise ValueError("balanced sampling is only defined for classification.")
        labels = []
        for index in available:
            _, target = _split_batch(loader.dataset[int(index)], self._key_x, self.dict_key_y)
            t = torch.as_tensor(target)
            labels.append(int(t.argmax() if t.numel() > 1 else t))
        label_tensor = torch.tensor(labels)
        queues = []
        for cls in label_tensor.unique(sorted=True):
            candidates = torch.where(label_tensor == cls)[0]
            order = torch.randperm(len(candidates), generator=generator)
            queues.append(deque(candidates[order].tolist()))
        selected: List[int] = []
        while len(selected) < self.subsample_size and any(queues):
            for queue in queues:
                if queue and len(selected) < self.subsample_size:
                    selected.append(queue.popleft())
        if len(selected) != self.subsample_size:
            raise ValueError("Not enough examples for balanced subsampling.")
        return available[torch.tensor(selected[: self.subsample_size])]

    def _build_basis(self, loader: Any, indices: Any) -> None:
        torch = _torch()
        generator = torch.Generator().manual_seed(self.seed + 1)
        rows: List[np.ndarray] = []
        outputs: List[int] = []
        q: Optional[int] = None
        for batch in _subset_loader(loader, indices):
            x, _ = _split_batch(batch, self._key_x, self.dict_key_y)
            xa = self._inputs(x)
            if q is None:
                q = self._output_dim()
            choices = torch.randint(q, (xa.shape[0],), generator=generator)
            rows.append(xa)
            outputs.extend(int(c) for c in choices)
        assert q is not None
        self.n_outputs = q
        points = np.ascontiguousarray(np.concatenate(rows))
        self._features = NystromFeatures(points=points, outputs=outputs, num_eigen=self.n_eigenvalues, **self._network())

    def fit(self, train_loader: Any, *, val_loader: Any = None, val_steps: Optional[int] = None,
            balanced: bool = False, progress_bar: bool = False, process_group: Any = None) -> None:
        """Builds the Nyström basis and sums the projected curvature ``G`` over ``train_loader``,
        one batch at a time.

        Parameters
        ----------
        train_loader : DataLoader
            ``(x, y)`` or dict batches over a sized, indexable dataset (the Nyström points are
            chosen by index).
        val_loader : DataLoader, optional
            Scored (predictive NLL) every ``val_steps`` batches and at the end, into
            ``fit_history_["val_nll"]``.
        val_steps : int, optional
        balanced : bool, default False
            Classification: draw the Nyström points round-robin over the classes.
        progress_bar : bool, default False
            A tqdm bar over the batches.
        process_group : torch.distributed group or mpi4py communicator, optional
            Sharded fitting: each process passes its own shard of the data (its loader's
            sampler choosing it from the whole dataset, which every process holds); the
            Nyström points are drawn from all the shards' indices together, in index order, as
            one process over the whole dataset draws them, and the ``K × K`` sums ``G`` are
            all-reduced, so every process ends with the single-process posterior up to the
            order of the additions. The default is the default group when ``torch.distributed``
            is initialised with more than one process; ``False`` fits each process on its own.
            A validation loader is then scored over every process's together; ``val_steps`` is
            refused.

        Returns
        -------
        None

        Raises
        ------
        ValueError
            An empty loader, ``subsample_size`` past the training points, a bad batch; sharded:
            shards that overlap (a padding ``DistributedSampler``) or processes whose models or
            settings differ, on every process.
        RuntimeError
            Sharded: another process failed (its own error is raised there).
        """
        torch = _torch()
        if val_steps is not None and (not _integer(val_steps) or val_steps <= 0):
            raise ValueError("val_steps must be positive integer when provided.")
        group = _group(process_group)
        if group is not None and val_steps is not None:
            raise NotImplementedError(
                "val_steps with sharded fitting: the shards' batch counts differ, so the processes cannot score "
                "together mid-pass; pass val_loader alone (scored once, after the pass)"
            )
        with self._lock:
            self.fit_history_ = {"processed_examples": [], "val_nll": [], "tuning": []}
            self._fitted = False
            self.n_data = 0
            self._group = group
            if group is None:
                indices = self._indices(train_loader, balanced)
                self._build_basis(train_loader, indices)
            else:
                agree_on(group, self._fingerprint(balanced),
                         "the processes disagree on the model or the ELLA settings (subsample_size, n_eigenvalues, "
                         "seed, likelihood, balanced): give every process the same ones")
                indices = self._indices(train_loader, balanced, group)
                agreed(group, lambda: self._build_basis(train_loader, indices))
            self._saved_features = None
            k = self.n_eigenvalues
            gram = torch.zeros(k, k, dtype=self._dtype)
            iterator = train_loader
            if progress_bar:
                from tqdm import tqdm

                iterator = tqdm(train_loader, desc="Fitting ELLA")
            step = 0

            def one_pass() -> None:
                nonlocal step
                for step, batch in enumerate(iterator, start=1):
                    x, y = _split_batch(batch, self._key_x, self.dict_key_y)
                    features, output = self._eval(x)
                    if self.likelihood == "regression":
                        _regression_targets(y, output)
                        gram.add_(torch.einsum("bck,bcl->kl", features, features))
                    else:
                        probs = output.softmax(dim=-1)
                        hessian = torch.diag_embed(probs) - probs.unsqueeze(-1) * probs.unsqueeze(-2)
                        gram.add_(torch.einsum("bck,bcd,bdl->kl", features, hessian, features))
                    self.n_data += output.shape[0]
                    self.fit_history_["processed_examples"].append(float(self.n_data))
                    if val_loader is not None and val_steps and step % val_steps == 0:
                        self.feature_gram = gram.clone()
                        self._build_precision()
                        self._fitted = True
                        self.fit_history_["val_nll"].append(float(self._validation_nll(val_loader)))

            if group is None:
                one_pass()
            else:
                agreed(group, one_pass)
                total = group.all_reduce(np.concatenate([gram.numpy().reshape(-1), [float(self.n_data)]]), "sum")
                gram = torch.from_numpy(total[:-1].reshape(k, k).copy())
                self.n_data = int(total[-1])
            if self.n_data == 0:
                raise ValueError("ELLA fit requires a nonempty training loader.")
            self.feature_gram = gram
            self._build_precision()
            self._fitted = True
            if val_loader is not None and (not val_steps or step % val_steps):
                self.fit_history_["val_nll"].append(float(self._validation_nll(val_loader)))

    def _hyperparameters_changed(self) -> None:
        self._posterior_dirty = getattr(self, "feature_gram", None) is not None

    def _fingerprint(self, balanced: bool) -> List[float]:
        """What every process of a sharded fit must share: the settings and a summary of the
        model's parameters."""
        weights = [p.detach().double().numpy() for p in self.model.parameters()] \
            if hasattr(self.model, "parameters") else []
        summary = weights_summary(weights)
        return [float(self.subsample_size), float(self.n_eigenvalues), float(self.seed),
                float(self.likelihood == "regression"), float(balanced), *summary]

    def _build_precision(self) -> None:
        torch = _torch()
        if self.feature_gram is None:
            return
        precision = self.feature_gram / self.temperature
        if self.likelihood == "regression":
            precision = precision / self.sigma_noise.square()
        precision = precision + self.prior_precision * torch.eye(self.n_eigenvalues, dtype=self._dtype)
        self.chol_precision = torch.linalg.cholesky(precision)
        self._posterior_dirty = False

    def _check_fitted(self) -> None:
        if not self._fitted:
            raise RuntimeError("Call fit before making functional Laplace predictions.")
        if self._posterior_dirty:
            self._build_precision()

    # -- predictions --------------------------------------------------------------------------

    def _glm_predictive_distribution(self, x: Any, joint: bool = False) -> Tuple[Any, Any]:
        torch = _torch()
        features, mean = self._eval(x)
        if joint:
            flat = features.reshape(-1, self.n_eigenvalues)
            side = flat.shape[0]
            check_budget(2 * side * side * flat.element_size(), f"a joint predictive covariance ({side} × {side})",
                         "fewer points per call, or joint=False")
            covariance = flat @ torch.cholesky_solve(flat.T, self.chol_precision)
            return mean.flatten(), covariance
        return mean, features @ torch.cholesky_solve(features.transpose(1, 2), self.chol_precision)

    # -- hyperparameters by validation ------------------------------------------------------------

    def _validation_batches(self, loader: Any) -> List[Tuple[Any, Any, Any]]:
        """Each validation batch's features, network outputs and targets: they do not depend on
        the hyperparameters, so a grid search computes them once."""
        out = []
        for batch in loader:
            x, y = _split_batch(batch, self._key_x, self.dict_key_y)
            self._check_nonempty(x)
            features, mean = self._eval(x)
            out.append((features, mean, y))
        return out

    def _validation_nll(self, loader: Any, batches: Optional[List[Tuple[Any, Any, Any]]] = None) -> Any:
        """The validation NLL per point; after a sharded fit, over every process's validation
        points together (each process scores its own loader)."""
        torch = _torch()
        self._check_fitted()
        if batches is None:
            batches = self._validation_batches(loader) if self._group is None else \
                agreed(self._group, lambda: self._validation_batches(loader))
        total = torch.zeros((), dtype=self._dtype)
        count = 0
        for features, mean, y in batches:
            covariance = features @ torch.cholesky_solve(features.transpose(1, 2), self.chol_precision)
            if self.likelihood == "regression":
                y = _regression_targets(y, mean)
                variance = covariance.diagonal(dim1=-2, dim2=-1) + self.sigma_noise.square()
                total += (0.5 * ((y - mean).square() / variance + variance.log() + math.log(2 * math.pi))).sum()
            else:
                scale = torch.sqrt(1 + math.pi / 8 * covariance.diagonal(dim1=-2, dim2=-1))
                total += torch.nn.functional.cross_entropy(mean / scale, _classification_targets(y), reduction="sum")
            count += y.shape[0]
        if self._group is not None:
            both = self._group.all_reduce(np.array([float(total), float(count)]), "sum")
            return torch.as_tensor(both[0] / both[1], dtype=self._dtype)
        return total / count

    def optimize_prior_precision(self, pred_type: str = "gp", method: str = "gridsearch", n_steps: int = 100,
                                 lr: float = 1e-1, init_prior_prec: Any = 1.0, prior_structure: str = "scalar",
                                 val_loader: Any = None, loss: Any = None, log_prior_prec_min: float = -4,
                                 log_prior_prec_max: float = 4, grid_size: int = 100, link_approx: str = "probit",
                                 n_samples: int = 100, verbose: bool = False, progress_bar: bool = False) -> None:
        """laplace-torch's ELLA tuning: ``λ`` on ``grid_size`` log-spaced values in
        ``10^[log_prior_prec_min, log_prior_prec_max]`` by the validation NLL; the other
        arguments are accepted at their defaults only (as laplace-torch).

        Parameters
        ----------
        pred_type : {"gp"}, default "gp"
        method : {"gridsearch"}, default "gridsearch"
        n_steps, lr, init_prior_prec, prior_structure, loss, link_approx, n_samples, verbose, progress_bar
            laplace-torch's marginal-likelihood options, accepted at their defaults only.
        val_loader : DataLoader
            The validation data (required).
        log_prior_prec_min, log_prior_prec_max : float, default -4, 4
            The grid's bounds (powers of ten).
        grid_size : int, default 100

        Returns
        -------
        None
            λ is set on the object.

        Raises
        ------
        NotImplementedError
            A marginal-likelihood option, as laplace-torch's ELLA.
        ValueError
            No ``val_loader``, or a grid size below 1.
        """
        torch = _torch()
        self._check_fitted()
        if pred_type != "gp":
            raise ValueError("ELLA supports only pred_type='gp'.")
        init = torch.as_tensor(init_prior_prec)
        if (n_steps != 100 or lr != 1e-1 or init.numel() != 1 or init.item() != 1.0 or prior_structure != "scalar"
                or loss is not None or link_approx != "probit" or n_samples != 100 or verbose or progress_bar):
            raise NotImplementedError("ELLA supports validation grid search without marginal-likelihood options.")
        if method != "gridsearch":
            raise NotImplementedError("ELLA supports validation grid search, not marginal likelihood.")
        if val_loader is None:
            raise ValueError("gridsearch requires val_loader.")
        if not _integer(grid_size) or grid_size <= 0:
            raise ValueError("grid_size must be positive integer.")
        self.optimize_hyperparameters(val_loader, torch.logspace(log_prior_prec_min, log_prior_prec_max, grid_size))

    def optimize_hyperparameters(self, val_loader: Any, grid: Any) -> None:
        """Sets ``λ`` (or ``(λ, σ)`` pairs, regression) to the grid's value of lowest validation
        NLL; the scores go to ``fit_history_["tuning"]``.

        Parameters
        ----------
        val_loader : DataLoader
            The validation data.
        grid : iterable
            Values of λ, or ``(λ, σ)`` pairs.

        Raises
        ------
        ValueError
            An empty grid, or no finite validation NLL on it (λ and σ are then left as they were).
        """
        with self._lock:
            self._check_fitted()
            initial = (self.prior_precision.detach().clone(), self.sigma_noise.detach().clone())
            batches = self._validation_batches(val_loader) if self._group is None else \
                agreed(self._group, lambda: self._validation_batches(val_loader))
            best_score, best = float("inf"), None
            has_candidates = False
            for candidate in grid:
                has_candidates = True
                if isinstance(candidate, (tuple, list)):
                    self.prior_precision, self.sigma_noise = candidate
                else:
                    self.prior_precision = candidate
                score = float(self._validation_nll(val_loader, batches))
                self.fit_history_["tuning"].append(dict(prior_precision=float(self.prior_precision),
                                                        sigma_noise=float(self.sigma_noise), val_nll=score))
                if math.isfinite(score) and score < best_score:
                    best_score, best = score, candidate
            if best is None:
                self.prior_precision, self.sigma_noise = initial
                self._build_precision()
                if not has_candidates:
                    raise ValueError("Hyperparameter grid is empty.")
                raise ValueError("No finite validation NLL was found in the grid.")
            if isinstance(best, (tuple, list)):
                self.prior_precision, self.sigma_noise = best
            else:
                self.prior_precision = best
            self._build_precision()

    # -- saving ---------------------------------------------------------------------------------

    def state_dict(self) -> Dict[str, Any]:
        """The fitted posterior: the Nyström feature map (fspace's JSON, under
        ``fspace_feature_map``), ``feature_gram``, the hyperparameters, ``n_data``,
        ``n_outputs``, ``fit_history`` and ``seed``.

        Returns
        -------
        dict
            Restore with ``load_state_dict`` on an object built with the same model and arguments.
        """
        with self._lock:
            self._check_fitted()
            return {
                "cls_name": type(self).__name__,
                "n_params": self.n_params,
                "likelihood": self.likelihood,
                "subsample_size": self.subsample_size,
                "n_eigenvalues": self.n_eigenvalues,
                "fspace_feature_map": self._map().to_json(),
                "feature_gram": self.feature_gram.detach().clone(),
                "prior_precision": self.prior_precision.detach().clone(),
                "sigma_noise": self.sigma_noise.detach().clone(),
                "temperature": self.temperature,
                "n_data": self.n_data,
                "n_outputs": self.n_outputs,
                "fitted": self._fitted,
                "fit_history": copy.deepcopy(self.fit_history_),
                "seed": self.seed,
                "dict_key_x": self.dict_key_x,
                "dict_key_y": self.dict_key_y,
            }

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Restores a ``state_dict()`` taken from an ``ELLALaplace`` on the same model.

        Parameters
        ----------
        state_dict : dict
            From ``state_dict()``; the feature map is checked as every fspace load is.

        Raises
        ------
        ValueError
            Another class, model, likelihood or key names, or a tampered feature map.
        """
        torch = _torch()
        self._check_checkpoint(state_dict)
        gram = torch.as_tensor(state_dict["feature_gram"], dtype=self._dtype)
        k = int(state_dict["n_eigenvalues"])
        if gram.shape != (k, k) or not torch.all(torch.isfinite(gram)) or not torch.allclose(gram, gram.T):
            raise ValueError(f"the checkpoint's feature_gram must be a finite symmetric {k} × {k} matrix")
        features = NystromFeatures(saved=str(state_dict["fspace_feature_map"]), **self._network())
        if features.num_features != k:
            raise ValueError(f"the checkpoint's feature map has {features.num_features} features, not n_eigenvalues={k}")
        with self._lock:
            self._features = features
            self._saved_features = str(state_dict["fspace_feature_map"])
            self.seed = int(state_dict["seed"])
            self.subsample_size = int(state_dict["subsample_size"])
            self.n_eigenvalues = k
            self.feature_gram = gram
            self.prior_precision = state_dict["prior_precision"]
            self.sigma_noise = state_dict["sigma_noise"]
            self.temperature = state_dict["temperature"]
            self.n_data = int(state_dict["n_data"])
            self.n_outputs = state_dict["n_outputs"]
            self.fit_history_ = copy.deepcopy(state_dict["fit_history"])
            self._build_precision()
            self._fitted = True
