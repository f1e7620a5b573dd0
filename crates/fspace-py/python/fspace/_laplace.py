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

import math
import threading
from collections.abc import Mapping
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from ._backend import network_spec
from ._base import Wrapper
from ._convert import ModelSpec, array2, dataset_size, gathered, is_array, is_torch, reread_weights, tensors
from ._distributed import ONE_SHARD_EACH, _group, agree_on, agreed, step_reduce, weights_summary
from ._methods import Progress, _Progress
from ._predictive import (_check_likelihood, _curvature_source, _link, _normal_samples, _refuse_unsupported,
                          _split_batch, _torch, sample_count)
from ._torch import TorchModel, is_module
from ._memory import check_budget
from ._fspace import Laplace as _Laplace

__all__ = ["Laplace"]

_STRUCTURES = ("full", "kron", "diag", "lowrank", "ekfac", "gp")
_SUBSETS = ("all", "last_layer", "subnetwork")
_LINKS = ("probit", "bridge", "bridge_norm", "mc")
# The structures whose curvature is one sum over the data: fit streams them batch by batch.
_STREAMED = ("diag", "kron", "full")
# The structures that pass over the data more than once and shard by an all-reduce per sum.
_SHARDED = ("lowrank", "ekfac")


class Laplace(Wrapper):
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

    def _init(
        self,
        model: Any,
        likelihood: str,
        subset_of_weights: str,
        hessian_structure: str,
        sigma_noise: Any = 1.0,
        prior_precision: Any = 1.0,
        prior_mean: Any = 0.0,
        temperature: float = 1.0,
        enable_backprop: bool = False,
        dict_key_x: str = "input_ids",
        dict_key_y: str = "labels",
        backend: Any = None,
        backend_kwargs: Optional[Dict[str, Any]] = None,
        asdl_fisher_kwargs: Optional[Dict[str, Any]] = None,
        feature_reduction: Any = None,
        last_layer_name: Optional[str] = None,
        functional_approximation: str = "sod",
        subnetwork_indices: Any = None,
        damping: bool = False,
        kron_bias: str = "separate",
        input_shape: Any = None,
        rank: Optional[int] = None,
        max_basis: Optional[int] = None,
        chunk_points: Optional[int] = None,
    ) -> None:
        _check_likelihood(likelihood)
        if hessian_structure not in _STRUCTURES:
            raise ValueError(f"hessian_structure {hessian_structure!r} is not one of {', '.join(map(repr, _STRUCTURES))}")
        if subset_of_weights not in _SUBSETS:
            raise ValueError(f"subset_of_weights {subset_of_weights!r} is not one of {', '.join(map(repr, _SUBSETS))}")
        if subset_of_weights == "subnetwork" and hessian_structure not in ("full", "diag"):
            raise ValueError("Subnetwork Laplace requires a full or diagonal Hessian approximation!")
        if subset_of_weights == "last_layer" and hessian_structure == "lowrank":
            raise ValueError(f"Unsupported Laplace combination: {subset_of_weights}, {hessian_structure}.")
        if functional_approximation != "sod" and hessian_structure != "gp":
            raise ValueError("functional_approximation requires hessian_structure='gp'.")
        _refuse_unsupported(False, backend_kwargs)
        if enable_backprop and not is_module(model):
            raise NotImplementedError(
                "enable_backprop=True differentiates the predictive through the torch model (torch.func's Jacobian): "
                "give an nn.Module, not a state_dict"
            )
        if feature_reduction is not None:
            raise NotImplementedError(
                f"feature_reduction={feature_reduction!r} (laplace-torch's reduction of sequence features before the "
                "last layer) is not implemented"
            )
        if last_layer_name is not None:
            torch_mod = _torch()
            linears = [n for n, m in model.named_modules() if isinstance(m, torch_mod.nn.Linear)] \
                if isinstance(model, torch_mod.nn.Module) else []
            if not linears or linears[-1] != last_layer_name:
                raise NotImplementedError(
                    f"last_layer_name={last_layer_name!r}: fspace's last layer is the model's last nn.Linear "
                    f"({linears[-1] if linears else 'none found'!r})"
                )
        if damping:
            raise NotImplementedError("damping=True (laplace-torch's damped KFAC eigendecomposition) is not implemented")
        if asdl_fisher_kwargs:
            raise NotImplementedError(f"asdl_fisher_kwargs {sorted(asdl_fisher_kwargs)} apply to laplace-torch's ASDL backend")
        engine, curvature = _curvature_source(backend)
        torch = _torch()
        self.model = model
        self.likelihood = likelihood
        self.subset_of_weights = subset_of_weights
        self.hessian_structure = hessian_structure
        self.dict_key_x, self.dict_key_y = dict_key_x, dict_key_y
        self.enable_backprop = bool(enable_backprop)
        self._dtype = torch.float64
        self._lock = threading.RLock()
        self._spec = network_spec(model, input_shape, engine)
        if isinstance(self._spec, TorchModel):
            self._spec.skip_keys = (dict_key_y,)
        self._all_sizes = _parameter_sizes(model)
        on_torch = isinstance(self._spec, TorchModel)
        if subnetwork_indices is not None:
            if is_torch(subnetwork_indices):
                subnetwork_indices = subnetwork_indices.detach().cpu().numpy()
            idx = np.asarray(subnetwork_indices)
            if idx.ndim != 1 or not np.issubdtype(idx.dtype, np.integer):
                raise ValueError("subnetwork_indices must be a 1-D array of integer parameter indices")
            if idx.size and idx.min() < 0:
                raise ValueError(f"subnetwork_indices holds the negative index {int(idx.min())}")
            subnetwork_indices = [int(i) for i in idx]
        elif subset_of_weights == "subnetwork":
            raise ValueError("subset_of_weights='subnetwork' needs subnetwork_indices (laplace-torch: SubnetLaplace)")
        self._args = dict(
            state=tensors({} if on_torch else self._spec.state)[0],
            activation_name="" if on_torch else self._spec.activation,
            likelihood=likelihood,
            hessian_structure=hessian_structure,
            subset_of_weights=subset_of_weights,
            sigma_noise=self._positive_scalar(sigma_noise, "sigma_noise"),
            kron_bias=kron_bias,
            rank=_optional_count(rank, "rank"),
            max_basis=_optional_count(max_basis, "max_basis"),
            chunk_points=_optional_count(chunk_points, "chunk_points"),
            curvature=curvature,
            subnetwork_indices=subnetwork_indices,
        )
        self._layers: Optional[str] = None
        self._layers_required = True
        if on_torch and subset_of_weights == "last_layer":
            self._layers = "last"
        elif on_torch:
            self._layers = "all"
            self._layers_required = hessian_structure in ("kron", "ekfac")
        if likelihood != "regression" and float(self._as_tensor(sigma_noise).reshape(-1)[0]) != 1.0:
            raise ValueError("Sigma noise != 1 only available for regression.")
        t = float(temperature)
        if not (math.isfinite(t) and t > 0):
            raise ValueError(f"temperature {temperature} must be finite and > 0")
        self.temperature = t
        self._la: Any = None
        # Whether ``_la`` was read from a saved posterior (``load_state_dict``, unpickling).
        self._loaded = False
        self._fit: Optional[Dict[str, Any]] = None
        self._report: Optional[Dict[str, Any]] = None
        self.sigma_noise = sigma_noise
        self.prior_precision = prior_precision
        self.prior_mean = prior_mean
        # Built and checked now where the input shape is known (an MLP, or a CNN or torch model
        # given input_shape); otherwise at fit, from the inputs' shape.
        if self._spec.architecture_known():
            self._build()

    # -- construction -------------------------------------------------------------------------

    @staticmethod
    def _positive_scalar(value: Any, what: str) -> float:
        v = value.detach().reshape(-1)[0].item() if is_torch(value) else np.asarray(value, dtype=np.float64).reshape(-1)[0]
        v = float(v)
        if not (math.isfinite(v) and v > 0):
            raise ValueError(f"{what} {v} must be finite and > 0")
        return v

    def _as_tensor(self, value: Any) -> Any:
        torch = _torch()
        if is_torch(value):
            return value.to(dtype=self._dtype)
        return torch.as_tensor(np.asarray(value, dtype=np.float64), dtype=self._dtype)

    def _build(self) -> Any:
        if self._la is None:
            a = self._args
            common = dict(
                kron_bias=a["kron_bias"], rank=a["rank"], max_basis=a["max_basis"], chunk_points=a["chunk_points"],
                curvature=a["curvature"], subnetwork_indices=a["subnetwork_indices"],
            )
            settings = dict(state=a["state"], activation_name=a["activation_name"], likelihood=a["likelihood"],
                            hessian_structure=a["hessian_structure"], subset_of_weights=a["subset_of_weights"],
                            sigma_noise=a["sigma_noise"])
            if isinstance(self._spec, TorchModel):
                calls = self._spec.calls()
                if self.likelihood == "classification":
                    calls.check_classifier()
                try:
                    layers = None if self._layers is None else calls.layer_infos(self._layers)
                except ValueError as e:
                    if not self._layers_required:
                        layers = None
                    else:
                        structure = ("subset_of_weights='last_layer'" if self._layers == "last"
                                     else f"hessian_structure={a['hessian_structure']!r}")
                        raise ValueError(f"{structure} on the torch path: {e}") from None
                self._la = _Laplace(calls=calls, layers=layers, **settings, **common)
            else:
                self._la = _Laplace(architecture=self._spec.architecture_dict(), **settings, **common)
            self._loaded = False
        return self._la

    def _fitted(self) -> Any:
        if self._la is None or self._fit is None:
            raise AttributeError("Laplace not fitted. Run fit() first.")
        return self._la

    # -- data -----------------------------------------------------------------------------------

    def _batch(self, batch: Any) -> Tuple[Any, Any]:
        # laplace-torch hands a dict batch to the model whole (a HuggingFace model reads
        # input_ids, attention_mask, ...): so does the torch path, without the targets; a native
        # network takes the array under dict_key_x.
        on_torch = isinstance(self._spec, TorchModel)
        return _split_batch(batch, None if on_torch else self.dict_key_x, self.dict_key_y)

    def _loader_arrays(self, loader: Any) -> Tuple[np.ndarray, np.ndarray]:
        xs, ys = [], []
        for batch in loader:
            bx, by = self._batch(batch)
            xs.append(self._spec.inputs(bx, "X"))
            ys.append(self._targets(by))
        if not xs:
            raise ValueError("the data loader yielded no batch")
        return np.concatenate(xs), np.concatenate(ys)

    def _targets(self, y: Any) -> np.ndarray:
        a = array2(y, "y")
        if self.likelihood == "classification" and a.shape[1] > 1:
            raise ValueError(
                f"classification targets are class indices (n,), got an array of shape {a.shape}: for one-hot "
                "targets pass y.argmax(-1); per-position (token) targets are not implemented — reduce the sequence "
                "inside the model so that it returns (batch, classes)"
            )
        return a

    # -- fit --------------------------------------------------------------------------------------

    def fit(self, train_loader: Any, override: Any = True, progress_bar: bool = False, *,
            progress: Progress = None, process_group: Any = None) -> None:
        """Fits the curvature at the model's weights on every batch of ``train_loader``.

        Parameters
        ----------
        train_loader : DataLoader or iterable
            Batches ``(x, y)`` or dicts with the keys ``dict_key_x`` / ``dict_key_y``. fspace
            also takes ``fit(X, y)`` with arrays or tensors.
        override : bool, default True
            ``False`` adds this loader's curvature sums to the earlier fit's (``diag``, ``kron``,
            ``full``; also over the last layer, where laplace-torch refuses it).
        progress_bar : bool, default False
            A tqdm bar over the passes of the fit.
        process_group : torch.distributed group or mpi4py communicator, optional
            Sharded fitting: each process passes its own shard of the data, the float64 partial
            sums are all-reduced (``SUM``) over the group — once for ``diag``, ``kron`` and
            ``full``; per sum over the data for ``ekfac`` (factors, then eigenvalues) and
            ``lowrank`` (one ``p``-vector per Lanczos product, whose shard is held in memory) —
            and every process ends with the same posterior, the single-process one up to the
            order of the additions. The default is the default group when ``torch.distributed`` is
            initialised with more than one process; ``False`` fits each process on its own.
            ``len(train_loader.dataset)`` must be the number of points all shards hold together
            (a padding ``DistributedSampler`` is refused).

        Returns
        -------
        None
        """
        if isinstance(override, bool) and is_array(train_loader):
            raise ValueError("fit(X) without targets: give fit(X, y), or a loader of (x, y) batches")
        bar = _Progress(progress if progress is not None else progress_bar, "Laplace", unit="point")
        with self._lock:
            if override is False and not self._is_fitted():
                # laplace-torch's curvature starts at zero: adding to it is a first fit (its
                # continual-learning example fits every task with override=False).
                override = True
            previous, was_loaded = self._la, getattr(self, "_loaded", False)
            try:
                if override is not False and was_loaded:
                    # A loaded posterior is refitted from this object's settings (the
                    # structure's options, the subset of weights), never from the file's.
                    self._la = None
                self._take_current_weights(keep_sums=override is False)
                if not isinstance(override, bool):
                    # fspace's fit(X, y): the arrays are in memory already.
                    x, yy = self._spec.inputs(train_loader, "X"), self._targets(override)
                    la = self._build()
                    la.fit(x, yy, bar.callback)
                elif self.hessian_structure in _STREAMED:
                    la = self._stream(train_loader, override, bar, _group(process_group))
                elif _group(process_group) is not None:
                    la = self._fit_sharded(train_loader, override, bar, _group(process_group))
                else:
                    if not override:
                        raise NotImplementedError(
                            f"fit(override=False) with hessian_structure={self.hessian_structure!r}: only the structures "
                            f"that sum over the data in one pass ({', '.join(_STREAMED)}) accumulate over several fits"
                        )
                    # EKFAC and low rank pass over the data several times: collected in memory.
                    x, yy = self._loader_arrays(train_loader)
                    self._check_count(train_loader, x.shape[0])
                    la = self._build()
                    la.fit(x, yy, bar.callback)
            except BaseException:
                # A failed or interrupted fit leaves the earlier posterior.
                self._la, self._loaded = previous, was_loaded
                raise
            finally:
                bar.close()
            self._report = la.report
            self._summarise(la)

    def _take_current_weights(self, keep_sums: bool) -> None:
        """The model's weights as they are now (laplace-torch reads them when it fits, so a
        model trained after this object was made — its continual-learning example — is fitted
        at its trained weights): the native engine's copy is taken again and the Rust object
        rebuilt on it; with ``keep_sums`` (``override=False``) the earlier streamed sums move to
        the new object, to which the new batches, at the new weights, are added."""
        if not reread_weights(self._spec, self.model):
            return
        self._args["state"] = tensors(self._spec.state)[0]
        earlier = None
        if keep_sums and self._la is not None:
            try:
                earlier = np.array(self._la.sums_flat())
            except RuntimeError:  # no streamed sums (an in-memory fit): nothing to carry
                earlier = None
        self._la = None
        if earlier is not None:
            la = self._build()
            la.begin_batches(True)
            la.set_sums_flat(earlier)

    def _fit_sharded(self, loader: Any, override: bool, bar: Any, group: Any) -> Any:
        """The structures that pass over the data more than once (``lowrank``, ``ekfac``) over
        shards: each process holds its own shard's arrays and every sum over the data — the
        factor sums, EKFAC's eigenvalues, each Lanczos product — is all-reduced as the fit
        forms it (``fspace_laplace::fit_sharded``)."""
        if self.hessian_structure not in _SHARDED:
            raise NotImplementedError(
                f"sharded fitting with hessian_structure={self.hessian_structure!r}; the structures that shard are "
                f"{', '.join(_STREAMED + _SHARDED)}"
            )
        if not override:
            raise NotImplementedError(
                f"fit(override=False) with hessian_structure={self.hessian_structure!r}: only the structures that "
                f"sum over the data in one pass ({', '.join(_STREAMED)}) accumulate over several fits"
            )
        agree_on(group, self._shard_fingerprint(),
                 "the processes disagree on the model or the Laplace settings (hessian_structure, subset_of_weights, "
                 "rank, max_basis, sigma_noise, ...): give every process the same ones")
        x, yy = agreed(group, lambda: self._loader_arrays(loader))
        seen = int(group.all_reduce(np.array([float(x.shape[0])]), "sum")[0])
        self._check_count(loader, seen, sharded=True)
        la = self._build()
        la.fit(x, yy, bar.callback, reduce=step_reduce(group), process=(group.rank, group.size))
        return la

    def _shard_fingerprint(self) -> List[float]:
        """What every process of a sharded fit must share: a summary of the model's weights
        and the settings (their JSON, hashed)."""
        import hashlib
        import json

        a = self._args
        if isinstance(self._spec, TorchModel):
            weights = [self._spec.calls().params]
        else:
            weights = [values for _, values, _ in a["state"].values()]
        text = json.dumps({k: v for k, v in a.items() if k != "state"}, sort_keys=True, default=str)
        digest = hashlib.sha256(text.encode()).digest()
        return [*weights_summary(weights), *[float(int.from_bytes(digest[i:i + 6], "little")) for i in range(0, 24, 6)]]

    @staticmethod
    def _check_count(loader: Any, seen: int, sharded: bool = False) -> None:
        """laplace-torch scales by ``len(train_loader.dataset)``: a loader that visits fewer or
        more points than its dataset holds would scale wrongly, so it is refused (sharded: the
        points of every shard together)."""
        size = dataset_size(loader)
        if sharded and size is not None and size != seen:
            raise ValueError(
                f"the shards hold {seen} points together but the dataset has {size}: a DistributedSampler "
                "pads the shards to equal sizes with repeated points (or drops the tail with drop_last=True); "
                + ONE_SHARD_EACH
            )
        if not sharded and size is not None and size != seen:
            raise ValueError(
                f"the loader yielded {seen} points but its dataset has {size}: laplace-torch scales by "
                "len(train_loader.dataset); use a loader that visits every point once (drop_last=False, no sampler "
                "that repeats or skips points)"
            )

    def _stream(self, loader: Any, override: bool, bar: Any, group: Any = None) -> Any:
        """Sums the curvature batch by batch in Rust (``LaplaceSums``): one batch in memory at a
        time; with ``override=False`` the sums of the earlier streamed fit are added to. With a
        process ``group`` each process sums its own shard and the partial sums are all-reduced."""
        total = dataset_size(loader) or 0
        la: Any = None
        earlier: Optional[np.ndarray] = None
        if group is not None:
            # Every process takes part in the all-reduce, a shard without points included; the
            # earlier sums (override=False) are added once, after the reduction.
            la = self._build()
            if not override:
                la.begin_batches(False)
                earlier = np.array(la.sums_flat())
            la.begin_batches(True)
        seen = 0

        def converted() -> Any:
            nonlocal la, seen
            for batch in loader:
                bx, by = self._batch(batch)
                x = self._spec.inputs(bx, "X")
                y = self._targets(by)
                if la is None:
                    la = self._build()
                    la.begin_batches(override)
                seen += x.shape[0]
                if bar.callback is not None:
                    bar.callback(seen, max(total, seen), None, None)
                yield x, y

        failure: Optional[BaseException] = None
        try:
            # Batches smaller than a chunk per thread are gathered up to that many points
            # (`batch_target`, 512 by default on two threads) before they cross to Rust.
            for x, y in gathered(converted(), lambda: la.batch_target):
                la.add_batch(x, y)
            if la is None:
                raise ValueError("the data loader yielded no batch")
        except BaseException as e:  # noqa: BLE001 - re-raised below, after the other processes hear of it
            if group is None:
                raise
            failure = e
        if group is not None:
            seen = _all_reduce_sums(la, group, failure, earlier)
        self._check_count(loader, seen, sharded=group is not None)
        la.end_batches()
        return la

    def _summarise(self, la: Any) -> None:
        torch = _torch()
        log_lik, n_data, idx, weights = la.fit_summary()
        eig = la.curvature_eigenvalues()
        n_outputs = int(la.output_dim)
        sigma_fit = self._args["sigma_noise"]
        if self.likelihood == "regression":
            # laplace-torch's loss: ½ Σ (f − y)², from log p = −loss/σ² − n·d·log(σ√(2π)).
            loss = -(log_lik + n_data * n_outputs * math.log(sigma_fit * math.sqrt(2 * math.pi))) * sigma_fit**2
            unit = sigma_fit**2  # the curvature at σ = 1
        else:
            loss = -log_lik
            unit = 1.0
        self._fit = dict(
            loss=torch.as_tensor(loss, dtype=self._dtype),
            n_data=int(n_data),
            n_outputs=n_outputs,
            indices=np.asarray(idx, dtype=np.int64),
            mean=torch.as_tensor(np.asarray(weights)[np.asarray(idx, dtype=np.int64)], dtype=self._dtype),
            weights=torch.as_tensor(np.asarray(weights), dtype=self._dtype),
            eigenvalues=None if eig is None else torch.as_tensor(np.asarray(eig) * unit, dtype=self._dtype),
            sigma_fit=sigma_fit,
        )

    # -- hyperparameters ----------------------------------------------------------------------

    @property
    def n_params(self) -> int:
        """The number of parameters the posterior covers (subnetwork Laplace: all the model's,
        as laplace-torch counts them; ``n_params_subnet`` the covered ones)."""
        if self.subset_of_weights == "subnetwork":
            return int(self._fitted_summary()["weights"].shape[0])
        if self._last_layer_unfitted():
            return None  # type: ignore[return-value]  # laplace-torch's value before fit
        return self._covered

    @property
    def _covered(self) -> int:
        if self._fit is None and self._prior_state():
            return int(sum(self._all_sizes))
        return int(len(self._fitted_summary()["indices"]))

    def _prior_state(self) -> bool:
        """Whether, before ``fit``, the object is laplace-torch's zero-curvature posterior (the
        prior): over all weights with a ``diag``, ``full`` or ``kron`` curvature, whose covered
        parameters are known before any data (laplace-torch's continual-learning example reads
        ``H``, ``mean``, ``posterior_precision`` and ``log_prob`` before its first fit; ``kron``'s
        ``mean`` and ``log_det_posterior_precision`` are there too, its operators are not)."""
        return self.subset_of_weights == "all" and self.hessian_structure in ("diag", "full", "kron")

    def _last_layer_unfitted(self) -> bool:
        """laplace-torch's last-layer classes before ``fit``: the last layer is found by the first
        fit, so ``mean``, ``H`` and ``n_params`` are ``None`` until then."""
        return self._fit is None and self.subset_of_weights == "last_layer"

    @property
    def n_params_subnet(self) -> int:
        """Subnetwork Laplace: the number of covered parameters."""
        if self.subset_of_weights != "subnetwork":
            raise AttributeError("n_params_subnet belongs to subset_of_weights='subnetwork'")
        return self._covered

    @property
    def n_layers(self) -> int:
        """laplace-torch's number of parameter tensors (the lengths a layer-wise prior precision takes)."""
        if self.subset_of_weights == "last_layer":
            return 2
        return len(self._all_sizes)

    @property
    def n_data(self) -> int:
        """The number of training points the fit summed over (0 before a fit)."""
        return 0 if self._fit is None else self._fit["n_data"]

    @property
    def n_outputs(self) -> int:
        """The model's number of outputs ``d'`` (0 before a fit)."""
        return 0 if self._fit is None else self._fit["n_outputs"]

    def _fitted_summary(self) -> Dict[str, Any]:
        if self._fit is None:
            raise AttributeError("Laplace not fitted. Run fit() first.")
        return self._fit

    @property
    def mean(self) -> Any:
        """The MAP weights of the covered parameters (``named_parameters()`` order); subnetwork
        Laplace: all the model's weights, as laplace-torch (``mean_subnet`` the covered ones).
        Before ``fit`` (all weights, ``diag`` / ``full`` / ``kron``): the prior mean; over the
        last layer: ``None``, as laplace-torch."""
        if self._fit is None and self._prior_state():
            return self.prior_mean
        if self._last_layer_unfitted():
            return None
        f = self._fitted_summary()
        return f["weights"] if self.subset_of_weights == "subnetwork" else f["mean"]

    @property
    def mean_subnet(self) -> Any:
        """Subnetwork Laplace: the MAP weights of the covered parameters."""
        if self.subset_of_weights != "subnetwork":
            raise AttributeError("mean_subnet belongs to subset_of_weights='subnetwork'")
        return self._fitted_summary()["mean"]

    @property
    def loss(self) -> Any:
        """laplace-torch's training loss at the MAP: ½Σ(f − y)² (regression) or Σ cross-entropy."""
        return self._fitted_summary()["loss"]

    @property
    def prior_precision(self) -> Any:
        """λ as a 1-D tensor: one value, one per parameter tensor (layer-wise) or one per
        parameter; settable (a float or a tensor), checked finite and > 0."""
        return self._prior_precision

    @prior_precision.setter
    def prior_precision(self, prior_precision: Any) -> None:
        torch = _torch()
        if is_torch(prior_precision):
            t = prior_precision.to(dtype=self._dtype)
            if t.ndim == 0:
                t = t.reshape(-1)
            elif t.ndim != 1:
                raise ValueError("Prior precision needs to be at most one-dimensional tensor.")
        elif _real_scalar(prior_precision) is not None:
            t = torch.as_tensor([_real_scalar(prior_precision)], dtype=self._dtype)
        else:
            raise ValueError("Prior precision either scalar or torch.Tensor up to 1-dim.")
        values = t.detach()
        # Over all weights the parameter tensors are known when the object is made, so a length
        # that fits no layout is refused then, as laplace-torch refuses it; over a subset, once
        # fitted.
        known = self._fit is not None or (self.subset_of_weights == "all" and bool(self._all_sizes))
        if len(values) != 1 and known:
            covered = self._covered if self._fit is not None else int(sum(self._all_sizes))
            n_layers = self.n_layers if self._fit is not None else len(self._all_sizes)
            if self.subset_of_weights in ("subnetwork", "last_layer") and len(values) != covered:
                # laplace-torch's last-layer and subnetwork Laplace take a scalar or diagonal prior.
                raise ValueError("Mismatch of prior and model. Diagonal or scalar prior.")
            if len(values) not in (n_layers, covered):
                raise ValueError("Length of prior precision does not align with architecture.")
            if self.hessian_structure in ("kron", "ekfac") and len(values) != n_layers:
                raise ValueError("Prior precision for Kron either scalar or per-layer.")
        if not bool(torch.isfinite(values).all()) or bool((values <= 0).any()):
            raise ValueError(f"prior_precision {values.tolist()} must be finite and > 0")
        self._prior_precision = t

    @property
    def prior_precision_diag(self) -> Any:
        """λ for every covered parameter (from one λ, one per parameter tensor, or one per parameter)."""
        torch = _torch()
        lam = self._prior_precision
        if len(lam) == 1:
            return lam * torch.ones(self._covered, dtype=self._dtype)
        if len(lam) == self._covered:
            return lam
        sizes = self._tensor_sizes()
        if len(lam) == len(sizes):
            return torch.cat([l * torch.ones(n, dtype=self._dtype) for l, n in zip(lam, sizes)])
        raise ValueError("Mismatch of prior and model. Diagonal, scalar, or per-layer prior.")

    def _tensor_sizes(self) -> List[int]:
        """The sizes of the covered parameter tensors, in ``named_parameters()`` order."""
        if self.subset_of_weights == "last_layer":
            d = self.n_outputs
            return [self._covered - d, d]
        if self.subset_of_weights == "subnetwork":
            return [self._covered]
        return list(self._all_sizes)

    @property
    def sigma_noise(self) -> Any:
        """The observation noise σ as a 0-d tensor; settable, checked finite and > 0."""
        return self._sigma_noise

    @sigma_noise.setter
    def sigma_noise(self, sigma_noise: Any) -> None:
        torch = _torch()
        if is_torch(sigma_noise):
            if sigma_noise.ndim == 0:
                s = sigma_noise.to(dtype=self._dtype)
            elif sigma_noise.ndim == 1:
                if len(sigma_noise) > 1:
                    raise ValueError("Only homoscedastic output noise supported.")
                s = sigma_noise[0].to(dtype=self._dtype)
            else:
                raise ValueError("Sigma noise needs to be scalar or 1-dimensional.")
        elif _real_scalar(sigma_noise) is not None:
            s = torch.as_tensor(_real_scalar(sigma_noise), dtype=self._dtype)
        else:
            raise ValueError("Invalid type: sigma noise needs to be torch.Tensor or scalar.")
        v = float(s.detach())
        if not (math.isfinite(v) and v > 0):
            raise ValueError(f"sigma_noise {v} must be finite and > 0")
        self._sigma_noise = s

    @property
    def prior_mean(self) -> Any:
        """The prior's mean of the weights (a scalar or one per covered parameter); settable."""
        return self._prior_mean

    @prior_mean.setter
    def prior_mean(self, prior_mean: Any) -> None:
        torch = _torch()
        if is_torch(prior_mean):
            if prior_mean.ndim > 1:
                raise ValueError("Prior mean has too many dimensions!")
            m = prior_mean.reshape(-1).to(dtype=self._dtype) if prior_mean.ndim == 0 else prior_mean.to(dtype=self._dtype)
        elif _real_scalar(prior_mean) is not None:
            m = torch.as_tensor(_real_scalar(prior_mean), dtype=self._dtype)
        else:
            raise ValueError("Invalid argument type of prior mean.")
        if not bool(torch.isfinite(m.detach()).all()):
            raise ValueError("prior_mean must be finite")
        self._prior_mean = m

    @property
    def _H_factor(self) -> Any:
        return 1 / self.sigma_noise.square() / self.temperature

    # -- the evidence -------------------------------------------------------------------------

    @property
    def log_likelihood(self) -> Any:
        """laplace-torch's ``log_likelihood``: ``−loss/(σ²T) − n·d·log(σ√(2π))`` (regression) or
        ``−loss/T`` (classification), differentiable in σ."""
        torch = _torch()
        f = self._fitted_summary()
        factor = -self._H_factor
        if self.likelihood == "regression":
            c = f["n_data"] * f["n_outputs"] * torch.log(self.sigma_noise * math.sqrt(2 * math.pi))
            return factor * f["loss"] - c
        return factor * f["loss"]

    @property
    def scatter(self) -> Any:
        """``(θ* − μ₀)ᵀ Λ (θ* − μ₀)``: the prior's quadratic term at the MAP weights."""
        delta = self._fitted_summary()["mean"] - self.prior_mean
        return (delta * self.prior_precision_diag) @ delta

    @property
    def log_det_prior_precision(self) -> Any:
        """``log |Λ|`` of the prior precision over the covered parameters."""
        return self.prior_precision_diag.log().sum()

    @property
    def log_det_posterior_precision(self) -> Any:
        """``log |H/(σ²T) + λI|`` from the curvature's eigenvalues (before ``fit``, over all
        weights with ``diag`` / ``full`` / ``kron``: ``log |λI|``, laplace-torch's zero curvature)."""
        if self._fit is None and self._prior_state():
            return self.prior_precision_diag.log().sum()
        f = self._fitted_summary()
        eig = f["eigenvalues"]
        if eig is None:
            raise NotImplementedError(
                f"hessian_structure={self.hessian_structure!r} with these options stores no eigenvalues (a low-rank "
                "curvature with a diagonal remainder, or the sampled structure): its evidence is not available"
            )
        if len(self._prior_precision) == 1:
            lam = self._prior_precision[0]
            missing = self._covered - eig.shape[0]
            return (eig * self._H_factor + lam).log().sum() + missing * lam.log()
        # A prior per parameter tensor or per parameter: Σ log(f·eᵢ + λ_owner(i)) where the
        # structure's eigenbasis holds (diag; KFAC with one λ per weight and per bias tensor),
        # the dense log-determinant (as laplace-torch) on a full or subnetwork curvature.
        owners = self._eigenvalue_owners()
        if owners is not None:
            return (eig * self._H_factor + self.prior_precision_diag[owners]).log().sum()
        if self.hessian_structure == "full":
            torch = _torch()
            return torch.logdet(self._H_factor * self._dense_curvature() + torch.diag(self.prior_precision_diag))
        raise NotImplementedError(
            f"a prior precision per parameter tensor or per parameter with hessian_structure={self.hessian_structure!r}: "
            "fspace takes it on diag and full, and one λ per parameter tensor on kron / ekfac (with kron_bias='separate')"
        )

    def _eigenvalue_owners(self) -> Any:
        """For each curvature eigenvalue, the covered parameter whose λ it pairs with (a tensor
        of indices), or ``None`` where the eigenbasis does not hold under a prior of this
        length; cached per fit and length. Rust checks the structure against a λ that differs
        between every parameter tensor (or parameter), so one check covers every value."""
        torch = _torch()
        f = self._fitted_summary()
        cache = f.setdefault("owners", {})
        count = len(self._prior_precision)
        if count not in cache:
            if count == self._covered:
                pattern = [float(i + 1) for i in range(count)]
            else:
                pattern = [float(t + 1) for t, n in enumerate(self._tensor_sizes()) for _ in range(n)]
            owners = self._la.curvature_eigenvalue_owners(pattern)
            cache[count] = None if owners is None else torch.as_tensor(owners, dtype=torch.long)
        return cache[count]

    def _dense_curvature(self) -> Any:
        """The curvature at σ = 1 as a dense tensor (ascending flat order), cached per fit."""
        torch = _torch()
        if self._fit is None and self._prior_state():
            return torch.zeros(self._covered, self._covered, dtype=self._dtype)
        f = self._fitted_summary()
        if f.get("dense") is None:
            f["dense"] = torch.as_tensor(self._la.curvature_dense(), dtype=self._dtype) * self._unit()
        return f["dense"]

    def _diagonal_curvature(self) -> Any:
        """``diag``: the curvature at σ = 1 as its diagonal (ascending flat order; no ``p × p``
        matrix), cached per fit."""
        torch = _torch()
        if self._fit is None and self._prior_state():
            return torch.zeros(self._covered, dtype=self._dtype)
        f = self._fitted_summary()
        if f.get("diagonal") is None:
            f["diagonal"] = torch.as_tensor(self._la.curvature_diagonal(), dtype=self._dtype) * self._unit()
        return f["diagonal"]

    @property
    def H(self) -> Any:  # noqa: N802 - laplace-torch's name
        """laplace-torch's summed curvature at σ = 1 and T = 1 (``posterior_precision`` is
        ``H/(σ²T) + λ``): the diagonal (``diag``) or the matrix (``full``, ``subnetwork``);
        zeros before ``fit`` over all weights, as laplace-torch initialises it.

        Raises
        ------
        NotImplementedError
            ``kron``, ``ekfac``, ``lowrank``: laplace-torch returns its own Kronecker / low-rank
            types, which fspace does not mirror.
        """
        if self._last_layer_unfitted():
            return None
        if self.hessian_structure == "diag":
            return self._diagonal_curvature()
        if self.hessian_structure == "full":
            return self._dense_curvature()
        raise NotImplementedError(
            f"H of hessian_structure={self.hessian_structure!r}: laplace-torch returns its own Kronecker / low-rank "
            "operator type, which fspace does not mirror"
        )

    @property
    def log_det_ratio(self) -> Any:
        """``log |posterior precision| − log |prior precision|``."""
        return self.log_det_posterior_precision - self.log_det_prior_precision

    def log_marginal_likelihood(self, prior_precision: Any = None, sigma_noise: Any = None) -> Any:
        """The Laplace log marginal likelihood, differentiable in ``prior_precision`` and
        ``sigma_noise`` (which, when given, replace the current values, as laplace-torch does).

        Parameters
        ----------
        prior_precision : float or torch.Tensor, optional
            A new λ (one value, one per parameter tensor, or one per parameter).
        sigma_noise : float or torch.Tensor, optional
            A new σ (regression only).

        Returns
        -------
        torch.Tensor
            ``log_likelihood − ½(log_det_ratio + scatter)``.
        """
        if prior_precision is not None:
            self.prior_precision = prior_precision
        if sigma_noise is not None:
            if self.likelihood != "regression":
                raise ValueError("Can only change sigma_noise for regression.")
            self.sigma_noise = sigma_noise
        return self.log_likelihood - 0.5 * (self.log_det_ratio + self.scatter)

    def log_prob(self, value: Any, normalized: bool = True) -> Any:
        """laplace-torch's log density of the Gaussian weight posterior at ``value``,
        ``−p/2 log 2π + ½ log|P| − ½ ΔᵀPΔ`` with ``Δ = value − mean`` (only the last term without
        ``normalized``), differentiable in ``value``, λ and σ.

        Parameters
        ----------
        value : torch.Tensor
            Weights of the covered parameters (``mean``'s shape).
        normalized : bool, default True
            With the normalising constant.

        Returns
        -------
        torch.Tensor

        Raises
        ------
        NotImplementedError
            ``kron``, ``ekfac``, ``lowrank`` (their precision is an operator fspace does not
            expose) and subnetwork Laplace.
        """
        torch = _torch()
        if self.hessian_structure not in ("diag", "full") or self.subset_of_weights == "subnetwork":
            raise NotImplementedError(
                f"log_prob with hessian_structure={self.hessian_structure!r}, subset_of_weights="
                f"{self.subset_of_weights!r}: fspace forms the posterior precision for diag and full over all "
                "weights or the last layer"
            )
        value = torch.as_tensor(value)
        delta = value.to(dtype=self.mean.dtype) - self.mean
        precision = self.posterior_precision
        square = delta @ (delta * precision) if self.hessian_structure == "diag" else delta @ precision @ delta
        if not normalized:
            return -square / 2
        return -self.n_params / 2 * math.log(2 * math.pi) + self.log_det_posterior_precision / 2 - square / 2

    @property
    def posterior_precision(self) -> Any:
        """``H/(σ²T) + λI``: a vector for ``diag``, a matrix for ``full`` / ``subnetwork``."""
        torch = _torch()
        if self.hessian_structure == "diag":
            return self._diagonal_curvature() * self._H_factor + self.prior_precision_diag
        if self.hessian_structure == "full":
            return self._H_factor * self._dense_curvature() + torch.diag(self.prior_precision_diag)
        raise NotImplementedError(
            f"posterior_precision of hessian_structure={self.hessian_structure!r}: laplace-torch returns its own "
            "Kronecker / low-rank operator type, which fspace does not mirror"
        )

    def _unit(self) -> float:
        return self._fitted_summary()["sigma_fit"] ** 2 if self.likelihood == "regression" else 1.0

    @property
    def posterior_covariance(self) -> Any:
        """``full``: the posterior covariance, the inverse of ``posterior_precision``."""
        torch = _torch()
        if self.hessian_structure != "full":
            raise NotImplementedError(f"posterior_covariance of hessian_structure={self.hessian_structure!r}")
        return torch.linalg.inv(self.posterior_precision)

    @property
    def posterior_variance(self) -> Any:
        """``diag``: the posterior variance of each covered parameter."""
        if self.hessian_structure != "diag":
            raise NotImplementedError(f"posterior_variance of hessian_structure={self.hessian_structure!r}")
        return 1 / self.posterior_precision

    # -- hyperparameter search ----------------------------------------------------------------

    def optimize_prior_precision(
        self,
        pred_type: str = "glm",
        method: str = "marglik",
        n_steps: int = 100,
        lr: float = 1e-1,
        init_prior_prec: Any = 1.0,
        prior_structure: str = "scalar",
        val_loader: Any = None,
        loss: Any = None,
        log_prior_prec_min: float = -4,
        log_prior_prec_max: float = 4,
        grid_size: int = 100,
        link_approx: str = "probit",
        n_samples: int = 100,
        verbose: bool = False,
        progress_bar: bool = False,
        log_prior_prec_base: float = 10.0,
    ) -> None:
        """laplace-torch's prior-precision search: Adam on ``log λ`` against the negative log
        marginal likelihood (``method="marglik"``), or the validation loss over a log grid
        (``method="gridsearch"``: mean squared error of the predictive mean for regression,
        mean negative log-likelihood for classification, unless ``loss`` is given).

        Parameters
        ----------
        pred_type : {"glm", "nn"}, default "glm"
            The predictive the grid search scores.
        method : {"marglik", "gridsearch"}, default "marglik"
        n_steps : int, default 100
            Adam steps on ``log λ`` (marglik).
        lr : float, default 0.1
            Adam's learning rate (marglik).
        init_prior_prec : float or torch.Tensor, default 1.0
            The starting λ (marglik).
        prior_structure : {"scalar", "layerwise", "diag"}, default "scalar"
            One λ, one per parameter tensor, or one per parameter.
        val_loader : DataLoader, optional
            The validation data of the grid search (required for it).
        loss : callable, optional
            The grid search's score ``loss(prediction, y)``; laplace-torch's defaults otherwise.
        log_prior_prec_min, log_prior_prec_max : float, default -4, 4
            The grid's bounds in ``log_prior_prec_base`` units.
        grid_size : int, default 100
        link_approx : {"probit", "bridge", "bridge_norm", "mc"}, default "probit"
            The classification predictive the grid search scores.
        n_samples : int, default 100
            Draws of the MC predictives the grid search scores.
        verbose, progress_bar : bool, default False
            Print each step's value; show a progress bar.
        log_prior_prec_base : float, default 10.0

        Returns
        -------
        None
            λ is set on the object (``la.prior_precision``), as in laplace-torch.

        Raises
        ------
        ValueError
            An unknown ``pred_type``, ``method`` or ``prior_structure``, a grid search without
            ``val_loader``, or a call before ``fit``.
        """
        torch = _torch()
        if pred_type not in ("glm", "nn"):
            raise ValueError(f"pred_type {pred_type!r} is not \"glm\" or \"nn\"")
        if prior_structure not in ("scalar", "layerwise", "diag"):
            raise ValueError(f"prior_structure {prior_structure!r} is not \"scalar\", \"layerwise\" or \"diag\"")
        self._fitted()
        if method == "marglik":
            if val_loader is not None:
                import warnings

                warnings.warn("`val_loader` will be ignored when `method` == 'marglik'. Do you mean to set `method = 'gridsearch'`?")
            self.prior_precision = init_prior_prec if is_torch(init_prior_prec) else torch.as_tensor(init_prior_prec)
            if len(self.prior_precision) == 1 and prior_structure != "scalar":
                # laplace-torch's fix_prior_prec_structure: the scalar start spread per tensor or per parameter.
                count = self.n_layers if prior_structure == "layerwise" else self._covered
                self.prior_precision = self.prior_precision.detach() * torch.ones(count, dtype=self._dtype)
            log_prior_prec = self.prior_precision.detach().log().clone()
            log_prior_prec.requires_grad = True
            steps: Any = range(int(n_steps))
            if progress_bar:
                bar = _Progress(True, "Optimizing marginal likelihood")
                steps = _stepping(steps, bar)
            adam = _Adam(log_prior_prec, float(lr))
            for _ in steps:
                log_prior_prec.grad = None
                neg = -self.log_marginal_likelihood(prior_precision=log_prior_prec.exp())
                neg.backward()
                adam.step()
            self.prior_precision = log_prior_prec.detach().exp()
        elif method == "gridsearch":
            if val_loader is None:
                raise ValueError("gridsearch requires a validation set DataLoader")
            # In torch's default dtype, as laplace-torch builds it (float32 grid values).
            interval = torch.logspace(log_prior_prec_min, log_prior_prec_max, int(grid_size), base=log_prior_prec_base)
            results: List[float] = []
            for prior_prec in interval:
                self.prior_precision = prior_prec
                try:
                    results.append(self._validate(val_loader, loss, pred_type, link_approx, n_samples))
                except (np.linalg.LinAlgError, torch.linalg.LinAlgError):
                    results.append(np.inf)
            self.prior_precision = interval[int(np.argmin(results))]
        else:
            raise ValueError("For now only marglik and gridsearch is implemented.")
        if verbose:
            print(f"Optimized prior precision is {self.prior_precision}.")

    def _validate(self, val_loader: Any, loss: Any, pred_type: str, link_approx: str, n_samples: int) -> float:
        torch = _torch()
        means, variances, targets = [], [], []
        for batch in val_loader:
            bx, by = self._batch(batch)
            out = self(bx, pred_type=pred_type, link_approx=link_approx, n_samples=n_samples, fitting=True)
            y = by if is_torch(by) else torch.as_tensor(np.asarray(by))
            if isinstance(out, tuple):
                means.append(out[0])
                variances.append(out[1])
            else:
                means.append(out)
            targets.append(y)
        mean, target = torch.cat(means), torch.cat(targets)
        if loss is None:
            if self.likelihood == "regression":
                # laplace-torch's default: torchmetrics' MeanSquaredError(num_outputs=d) of the
                # predictive mean, summed over the outputs. It does not depend on λ, so every grid
                # value ties and the first is kept (laplace-torch's pick among the ties is decided
                # by rounding in a metric it does not reset between grid values).
                return float(((mean - target.reshape(mean.shape).to(mean.dtype)) ** 2).mean(dim=0).sum())
            probs = mean.reshape(-1, mean.shape[-1])
            return float(torch.nn.functional.nll_loss(probs.log(), target.reshape(-1).long(), reduction="mean"))
        if hasattr(loss, "update") and hasattr(loss, "compute"):
            if hasattr(loss, "reset"):
                loss.reset()
            if variances:
                try:
                    loss.update(mean, torch.cat(variances), target)
                except TypeError:
                    loss.update(mean, target)
            else:
                loss.update(mean, target)
            value = loss.compute()
            if hasattr(loss, "reset"):
                loss.reset()
            return float(value.mean() if is_torch(value) else value)
        if variances:
            return float(loss(mean, torch.cat(variances), target))
        return float(loss(mean, target))

    # -- predictions --------------------------------------------------------------------------

    def _query(self) -> Tuple[Any, Tuple[Any, float]]:
        """The fitted Rust object and the λ and temperature of ``T'·C + λ`` (module docs) its
        queries take now (``_rust_state``): Rust's queries take them as arguments and never
        change the object."""
        return self._fitted(), self._rust_state()

    def _x(self, x: Any) -> np.ndarray:
        if isinstance(x, Mapping) and not isinstance(self._spec, TorchModel):
            x = x[self.dict_key_x]
        return self._spec.inputs(x, "x")

    def _seed(self, generator: Any) -> int:
        torch = _torch()
        if generator is not None and not isinstance(generator, torch.Generator):
            raise ValueError("Invalid random generator (check type and device).")
        return int(torch.randint(0, 2**62, (1,), generator=generator).item())

    def _glm(self, x: Any, joint: bool = False) -> Tuple[Any, Any]:
        torch = _torch()
        if self.enable_backprop:
            return self._glm_differentiable(x, joint)
        xa = self._x(x)
        with self._lock:
            la, state = self._query()
        mean, cov = la.glm_joint(xa, *state) if joint else la.glm(xa, *state)
        return torch.as_tensor(mean, dtype=self._dtype), torch.as_tensor(cov, dtype=self._dtype)

    def _glm_differentiable(self, x: Any, joint: bool) -> Tuple[Any, Any]:
        """``enable_backprop=True``: the GLM moments as functions of ``x`` (and of the model's
        weights) for torch's autograd, as laplace-torch gives them. ``f(x)`` and ``J(x)`` come
        from ``torch.func`` at the model's current weights (``J`` with its graph to ``x``), and
        ``J Σ Jᵀ`` applies the posterior covariance by Rust's ``covariance_solve`` inside an
        autograd function whose backward applies ``Σ`` again (it is symmetric); ``Σ`` itself
        (the curvature, λ, T) is fixed, as in laplace-torch."""
        torch = _torch()
        self._check_backprop_input(x)
        model = self.model
        params = {name: p for name, p in model.named_parameters() if p.requires_grad}
        n = x.shape[0]
        check_budget(3 * n * int(self._fitted().output_dim) * sum(p.numel() for p in params.values()) * 8,
                     f"the Jacobian of {n} inputs over every trainable weight (enable_backprop)",
                     "fewer inputs per call")

        def outputs(weights: Dict[str, Any]) -> Tuple[Any, Any]:
            f = torch.func.functional_call(model, weights, (x,)).reshape(n, -1)
            return f, f  # the outputs, and again as jacrev's auxiliary value (one forward pass)

        was_training = model.training
        model.eval()
        try:
            jacobian, f_mu = torch.func.jacrev(outputs, has_aux=True)(params)
        finally:
            model.train(was_training)
        q = f_mu.shape[1]
        with self._lock:
            la, state = self._query()
            cached = getattr(self, "_coordinates", None)
            if cached is None or cached[0] is not la:
                # The curvature's coordinate order (None: the parameters in order), per fitted object.
                coordinates = la.coordinates()
                order = None if coordinates == list(range(len(coordinates))) else \
                    torch.as_tensor(coordinates, dtype=torch.long)
                self._coordinates = cached = (la, order)
            # The diagonal structure's Σ is one vector: applied in torch, no block crosses to Rust.
            variances = la.covariance_diagonal(*state) if self.hessian_structure == "diag" else None
        js = torch.cat([jacobian[name].reshape(n * q, -1) for name in params], dim=1)
        if cached[1] is not None:
            js = js[:, cached[1]]
        js = js.to(self._dtype)
        if variances is not None:
            scaled = js * torch.from_numpy(variances)
            if joint:
                f_var = scaled @ js.T
            else:
                f_var = torch.einsum("bqd,brd->bqr", scaled.reshape(n, q, -1), js.reshape(n, q, -1))
            return f_mu.to(self._dtype), (f_var + f_var.transpose(-1, -2)) / 2
        # Σ v with the object and the λ, T of this query (the autograd function runs outside the
        # lock, where another thread may fit again or set new ones); dim × n·d', column-major.
        f_var = _quadratic_form_function().apply(js, lambda v: la.covariance_solve(v, *state), n, joint)
        return f_mu.to(self._dtype), f_var

    def _nn_samples_differentiable(self, x: Any, n_samples: int, generator: Any) -> Any:
        """``enable_backprop=True``: the network at ``n_samples`` weight draws (every trainable
        weight, the uncovered ones at the MAP), run by torch so that the draws are functions of
        ``x`` — laplace-torch's ``_nn_functional_samples``."""
        torch = _torch()
        self._check_backprop_input(x)
        seed = self._seed(generator)
        with self._lock:
            la, state = self._query()
        draws = torch.as_tensor(np.asarray(la.sample(n_samples, seed, *state)))
        model = self.model
        named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
        was_training = model.training
        model.eval()
        try:
            fs = []
            for w in draws:
                weights, offset = {}, 0
                for name, p in named:
                    weights[name] = w[offset:offset + p.numel()].reshape(p.shape).to(p.dtype)
                    offset += p.numel()
                fs.append(torch.func.functional_call(model, weights, (x,)).reshape(x.shape[0], -1))
        finally:
            model.train(was_training)
        return torch.stack(fs).to(self._dtype)

    def _check_backprop_input(self, x: Any) -> None:
        if self.model is None:
            raise RuntimeError(
                "enable_backprop=True differentiates through the model, which a pickle does not hold: "
                "build Laplace(model, ...) again and load_state_dict(...) into it"
            )
        if not is_torch(x) or not x.is_floating_point():
            raise NotImplementedError(
                "enable_backprop=True differentiates the predictive in a floating-point input tensor; "
                f"got {type(x).__name__}{'' if not is_torch(x) else ' of ' + str(x.dtype)}"
            )

    def _rust_state(self) -> Tuple[Any, float]:
        """What Rust's queries take: λ (one value, or a list per parameter) and the temperature."""
        scale = float(self._H_factor.detach()) * self._unit()
        if len(self._prior_precision) == 1:
            return float(self._prior_precision.detach()[0]), scale
        return self.prior_precision_diag.detach().tolist(), scale

    def __call__(
        self,
        x: Any,
        pred_type: str = "glm",
        joint: bool = False,
        link_approx: str = "probit",
        n_samples: int = 100,
        diagonal_output: bool = False,
        generator: Any = None,
        fitting: bool = False,
        **model_kwargs: Any,
    ) -> Any:
        """The posterior predictive at ``x``.

        Parameters
        ----------
        x : tensor or array
            ``(batch, …)`` inputs (or a dict holding them under ``dict_key_x``).
        pred_type : {"glm", "nn"}
        joint : bool
            Regression with the GLM predictive: the ``(n·d') × (n·d')`` joint covariance.
        link_approx : {"probit", "bridge", "bridge_norm", "mc"}
        n_samples : int
            Draws for ``link_approx="mc"`` and ``pred_type="nn"``.
        diagonal_output : bool
            Regression: ``n × d'`` variances instead of ``n × d' × d'`` covariances; MC: draws
            from the diagonal.
        generator : torch.Generator, optional
            The random numbers of the MC paths.

        Returns
        -------
        tuple of tensors or tensor
            Regression: ``(f_mu, f_var)``; classification: class probabilities ``n × C``.
        """
        torch = _torch()
        if pred_type not in ("glm", "nn"):
            raise ValueError("Only glm and nn supported as prediction types.")
        if link_approx not in _LINKS:
            raise ValueError(f"Unsupported link approximation {link_approx}.")
        if pred_type == "nn" and link_approx != "mc":
            raise ValueError("Only mc link approximation is supported for nn prediction type.")
        if model_kwargs:
            raise NotImplementedError(f"model keyword arguments {sorted(model_kwargs)} are not passed to the network in fspace")
        if generator is not None and not isinstance(generator, torch.Generator):
            raise ValueError("Invalid random generator (check type and device).")
        out_dtype = x.dtype if is_torch(x) and x.is_floating_point() else self._dtype
        if pred_type == "glm":
            regression = self.likelihood == "regression"
            f_mu, f_var = self._glm(x, joint=joint and regression)
            if regression:
                if joint:
                    # laplace-torch's joint predictive: the mean flattened point-major (n·d',).
                    return f_mu.reshape(-1).to(out_dtype), f_var.to(out_dtype)
                if diagonal_output:
                    f_var = torch.diagonal(f_var, dim1=-2, dim2=-1)
                return f_mu.to(out_dtype), f_var.to(out_dtype)
            return _link(f_mu, f_var, link_approx, int(n_samples), diagonal_output, generator).to(out_dtype)
        fs = self._nn_samples(x, int(n_samples), generator)
        if self.likelihood == "regression":
            return fs.mean(dim=0).to(out_dtype), fs.var(dim=0).to(out_dtype)
        return torch.softmax(fs, dim=-1).mean(dim=0).to(out_dtype)

    def predictive(self, x: Any, pred_type: str, link_approx: str, n_samples: int) -> Any:
        """laplace-torch's ``predictive``: ``self(x, pred_type=…, link_approx=…, n_samples=…)``.

        Parameters
        ----------
        x : tensor or array
        pred_type : {"glm", "nn"}
        link_approx : {"probit", "bridge", "bridge_norm", "mc"}
        n_samples : int

        Returns
        -------
        tuple of tensors or tensor
            As ``__call__``.
        """
        return self(x, pred_type=pred_type, link_approx=link_approx, n_samples=n_samples)

    def _nn_samples(self, x: Any, n_samples: int, generator: Any) -> Any:
        torch = _torch()
        n_samples = sample_count(n_samples)
        if self.enable_backprop:
            return self._nn_samples_differentiable(x, n_samples, generator)
        xa = self._x(x)
        seed = self._seed(generator)
        with self._lock:
            la, state = self._query()
        fs = la.nn_samples(xa, n_samples, seed, *state)
        return torch.as_tensor(fs, dtype=self._dtype)

    def functional_samples(self, x: Any, pred_type: str = "glm", n_samples: int = 1, diagonal_output: bool = False,
                           generator: Any = None) -> Any:
        """Draws of ``f`` at ``x`` (GLM: from the per-point Gaussians, as laplace-torch).

        Parameters
        ----------
        x : tensor or array
            ``(batch, …)`` inputs.
        pred_type : {"glm", "nn"}, default "glm"
            Draws from the linearised predictive, or the network at weight draws.
        n_samples : int, default 1
        diagonal_output : bool, default False
            GLM: draw each output independently (the covariance's diagonal).
        generator : torch.Generator, optional
            The random numbers (a seed drawn from it keys fspace's generator).

        Returns
        -------
        torch.Tensor, shape (n_samples, n, d')
        """
        torch = _torch()
        if pred_type not in ("glm", "nn"):
            raise ValueError("Only glm and nn pred types are supported")
        if pred_type == "glm":
            f_mu, f_var = self._glm(x)
            if diagonal_output:
                f_var = torch.diagonal(f_var, dim1=1, dim2=2)
            return _normal_samples(f_mu, f_var, int(n_samples), generator)
        return self._nn_samples(x, int(n_samples), generator)

    def predictive_samples(self, x: Any, pred_type: str = "glm", n_samples: int = 100, diagonal_output: bool = False,
                           generator: Any = None) -> Any:
        """Draws of the predictive at ``x``: ``f`` for regression, its softmax for classification.

        Parameters
        ----------
        x : tensor or array
            ``(batch, …)`` inputs.
        pred_type : {"glm", "nn"}, default "glm"
            Draws from the linearised predictive, or the network at weight draws.
        n_samples : int, default 100
        diagonal_output : bool, default False
            GLM: draw each output independently (the covariance's diagonal).
        generator : torch.Generator, optional
            The random numbers (a seed drawn from it keys fspace's generator).

        Returns
        -------
        torch.Tensor, shape (n_samples, n, d')
        """
        torch = _torch()
        fs = self.functional_samples(x, pred_type, n_samples, diagonal_output, generator)
        return fs if self.likelihood == "regression" else torch.softmax(fs, dim=-1)

    def sample(self, n_samples: int = 100, generator: Any = None) -> Any:
        """Draws of the covered weights from ``N(mean, P⁻¹)`` (subnetwork Laplace: every weight,
        the uncovered ones at the MAP, as laplace-torch).

        Parameters
        ----------
        n_samples : int, default 100
        generator : torch.Generator, optional
            The random numbers (a seed drawn from it keys fspace's generator).

        Returns
        -------
        torch.Tensor, shape (n_samples, n_params)

        Raises
        ------
        MemoryError
            ``n_samples × n_params`` draws past the memory budget (draw in batches).
        """
        torch = _torch()
        n_samples = sample_count(n_samples)
        seed = self._seed(generator)
        with self._lock:
            la, state = self._query()
        draws = la.sample(int(n_samples), seed, *state)
        if self.subset_of_weights == "subnetwork":
            # laplace-torch's assemble_full_samples: every weight, the others at the MAP.
            return torch.as_tensor(np.asarray(draws), dtype=self._dtype)
        idx = self._fitted_summary()["indices"]
        return torch.as_tensor(np.asarray(draws)[:, idx], dtype=self._dtype)

    # -- saving ---------------------------------------------------------------------------------

    def _hyper(self) -> Dict[str, Any]:
        return dict(
            prior_precision=self._prior_precision.detach().clone(),
            sigma_noise=self._sigma_noise.detach().clone(),
            prior_mean=self._prior_mean.detach().clone(),
            temperature=self.temperature,
        )

    def state_dict(self) -> Dict[str, Any]:
        """laplace-torch's keys (``mean``, ``loss``, ``prior_mean``, ``prior_precision``,
        ``sigma_noise``, ``n_data``, ``n_outputs``, ``likelihood``, ``temperature``,
        ``enable_backprop``, ``cls_name``) with the curvature as fspace's checked JSON under
        ``fspace_posterior`` in place of ``H``.

        Returns
        -------
        dict
            Load it with ``load_state_dict`` on a ``Laplace`` built with the same arguments.

        Raises
        ------
        NotImplementedError
            A Laplace on the torch engine (its network lives in torch: save the model, refit).
        """
        if isinstance(self._spec, TorchModel):
            raise NotImplementedError(
                "state_dict of a Laplace on the torch engine: its network lives in torch; save the model and refit"
            )
        with self._lock:
            la, query = self._query()
            posterior = la.to_json(*query)
        f = self._fitted_summary()
        state = dict(
            mean=self.mean.clone(), loss=f["loss"].clone(), n_data=f["n_data"], n_outputs=f["n_outputs"],
            likelihood=self.likelihood, enable_backprop=self.enable_backprop, cls_name=self._cls_name(),
            fspace_posterior=posterior, sigma_fit=f["sigma_fit"],
        )
        state.update(self._hyper())
        return state

    def _cls_name(self) -> str:
        subset = {"all": "", "last_layer": "LL", "subnetwork": "Subnet"}[self.subset_of_weights]
        structure = {"full": "Full", "kron": "Kron", "diag": "Diag", "lowrank": "LowRank", "ekfac": "EKFAC"}[self.hessian_structure]
        return f"{structure}{subset}Laplace"

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Restores a ``state_dict`` taken from a Laplace of the same class and likelihood.

        Parameters
        ----------
        state_dict : dict
            From ``state_dict()``; its posterior is checked as every fspace load is.

        Raises
        ------
        ValueError
            Another class, likelihood or model, or a tampered posterior (the message names the field).
        """
        if self._cls_name() != state_dict.get("cls_name"):
            raise ValueError("Loading a wrong Laplace type. Make sure `subset_of_weights` and `hessian_structure` are correct!")
        if self.likelihood != state_dict.get("likelihood"):
            raise ValueError("Different likelihoods detected!")
        if self.temperature != state_dict.get("temperature"):
            import warnings

            warnings.warn("Different `temperature` parameters detected. Some calculation might be off!")
        if "fspace_posterior" not in state_dict:
            raise ValueError("the state_dict holds no fspace_posterior: it was not saved by fspace.Laplace.state_dict")
        inner = _Laplace.from_json(state_dict["fspace_posterior"])
        if self._la is not None and getattr(self._la, "n_params", None) not in (None, inner.n_params):
            raise ValueError("the saved posterior is of a network with another number of parameters")
        self._la = inner
        self._loaded = True
        self._args["sigma_noise"] = float(state_dict["sigma_fit"])
        self._summarise(inner)
        self.prior_precision = state_dict["prior_precision"]
        self.sigma_noise = state_dict["sigma_noise"]
        self.prior_mean = state_dict["prior_mean"]
        self.temperature = float(state_dict["temperature"])

    @property
    def report(self) -> Dict[str, Any]:
        """What the last ``fit`` did, from Rust's ``FitReport`` (``dim``, ``seconds``; for
        ``"lowrank"`` the Lanczos iterations, the largest Ritz residual and the kept rank); ``{}``
        before a fit and on a loaded posterior."""
        return {} if self._report is None else dict(self._report)

    # Pickling (``Wrapper``): the settings and ``state_dict()``; the user's model is not saved.
    _transient = ("_la", "model", "_fit", "_coordinates")

    def _is_fitted(self) -> bool:
        return self._la is not None and self._fit is not None

    def _check_picklable(self) -> None:
        if isinstance(self._spec, TorchModel):
            raise TypeError("a Laplace on a torch model's callbacks cannot be pickled: save the model with torch and refit")


def _optional_count(value: Any, what: str) -> Optional[int]:
    """``None``, or a whole number ≥ 1 (a negative, fractional or NaN setting is named here,
    not left to the integer conversion at the boundary)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{what} must be ≥ 1 (a whole number), got {value!r}")
    return int(value)


_QUADRATIC_FORM: Any = None


def _quadratic_form_function() -> Any:
    """The autograd function ``J ↦ J Σ Jᵀ`` (``J`` the ``n·d' × dim`` Jacobian, point-major; the
    ``n`` blocks ``d' × d'``, or the joint ``n·d' × n·d'``) with ``Σ`` applied by a callable on
    numpy blocks. Forward: ``S = Σ Jᵀ`` (one solve), ``J S``; backward: ``J̄ = (Ḡ + Ḡᵀ) Sᵀ`` per
    block (``J Σ = Sᵀ``: no second solve). Made on first use (torch is imported lazily)."""
    global _QUADRATIC_FORM
    if _QUADRATIC_FORM is None:
        torch = _torch()

        class QuadraticForm(torch.autograd.Function):  # type: ignore[name-defined,misc]
            @staticmethod
            def forward(ctx: Any, js: Any, solve: Callable[[np.ndarray], np.ndarray], n: int, joint: bool) -> Any:
                s = torch.from_numpy(solve(js.detach().T.cpu().numpy())).to(js.dtype)  # dim × n·d'
                ctx.save_for_backward(s)
                ctx.n, ctx.joint = n, joint
                if joint:
                    out = js @ s
                    return (out + out.T) / 2
                q = js.shape[0] // n
                out = torch.einsum("bqd,dbr->bqr", js.reshape(n, q, -1), s.reshape(-1, n, q))
                return (out + out.transpose(-1, -2)) / 2

            @staticmethod
            @torch.autograd.function.once_differentiable
            def backward(ctx: Any, grad: Any) -> Any:
                (s,) = ctx.saved_tensors
                if ctx.joint:
                    return (grad + grad.T) @ s.T, None, None, None
                n = ctx.n
                q = grad.shape[-1]
                sym = grad + grad.transpose(-1, -2)
                return torch.einsum("bqr,dbr->bqd", sym, s.reshape(-1, n, q)).reshape(n * q, -1), None, None, None

        _QUADRATIC_FORM = QuadraticForm
    return _QUADRATIC_FORM


def _parameter_sizes(model: Any) -> List[int]:
    """The sizes of the model's trainable parameter tensors in ``named_parameters()`` order
    (laplace-torch's layers of a layer-wise prior precision)."""
    if isinstance(model, tuple):
        from ._convert import parameter_order

        layout = [(k, tuple(np.shape(v))) for k, v in model[0].items()]
        return [int(np.prod(shape)) if shape else 1 for _, shape in parameter_order(layout)]
    return [int(p.numel()) for p in model.parameters() if p.requires_grad]


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


class _Adam:
    """``torch.optim.Adam(lr=lr)``'s update on one tensor (betas 0.9, 0.999, eps 1e-8, no weight
    decay), in the same operations: laplace-torch's search gives the same λ to rounding. Written
    out because torch's optimizer spends ≈ 2 s on its first step in a process where torch had
    not optimised before (its compiler hooks load), twenty times the search itself."""

    def __init__(self, param: Any, lr: float) -> None:
        torch = _torch()
        self.param, self.lr, self.t = param, lr, 0
        self.m = torch.zeros_like(param)
        self.v = torch.zeros_like(param)

    def step(self) -> None:
        torch = _torch()
        (beta1, beta2), eps = (0.9, 0.999), 1e-8
        with torch.no_grad():
            g = self.param.grad
            self.t += 1
            self.m.lerp_(g, 1 - beta1)
            self.v.mul_(beta2).addcmul_(g, g.conj(), value=1 - beta2)
            bias1 = 1 - beta1**self.t
            bias2 = 1 - beta2**self.t
            denom = (self.v.sqrt() / math.sqrt(bias2)).add_(eps)
            self.param.addcdiv_(self.m, denom, value=-self.lr / bias1)


def _real_scalar(value: Any) -> Optional[float]:
    """``value`` as a float when it is a real Python or numpy scalar (not a string, not complex)."""
    if isinstance(value, (str, bytes)) or not np.isscalar(value) or not np.isreal(value):
        return None
    number: Any = value
    return float(number)


def _stepping(steps: Any, bar: Any) -> Any:
    total = len(steps)
    for i in steps:
        yield i
        if bar.callback is not None:
            bar.callback(i + 1, total, None, None)
    bar.close()


def _all_reduce_sums(la: Any, group: Any, failure: Optional[BaseException], earlier: Optional[np.ndarray]) -> int:
    """All-reduces the partial sums over ``group`` and returns the points of every shard
    together. First the processes agree: a process whose pass failed, or sums of another layout
    (another model or settings), make every process raise instead of one of them waiting
    forever in the reduction."""
    flat = None if la is None or failure is not None else np.array(la.sums_flat())
    size = -1 if flat is None else flat.size
    # [failed, size, −size] reduced by MAX: failure anywhere, and min/max of the sizes.
    status = group.all_reduce(np.array([1.0 if flat is None else 0.0, float(size), float(-size)]), "max")
    if failure is not None:
        raise failure
    if status[0] > 0:
        raise RuntimeError("another process of the group failed during the sharded fit (its error is raised there)")
    if status[1] != size or -status[2] != size:
        raise ValueError(
            "the processes' partial sums differ in layout: every process must fit the same model with the same "
            "hessian_structure, subset_of_weights and settings"
        )
    assert flat is not None
    total = group.all_reduce(flat, "sum")
    seen = int(total[-1])
    if earlier is not None:
        total = total + earlier
    la.set_sums_flat(np.ascontiguousarray(total))
    return seen
