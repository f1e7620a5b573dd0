"""``fspace.Laplace``, part 1 of 6: construction and settings (``_laplace.py`` holds the public
class and the module docs; each part extends the one before: settings → fit → evidence →
predictive → tuning → saving)."""

from __future__ import annotations

import math
import threading
from typing import Any, Dict, List, Optional

import numpy as np

from ._backend import network_spec
from ._base import Wrapper
from ._convert import is_count, is_torch, tensors
from ._predictive import _check_likelihood, _curvature_source, _refuse_unsupported, _torch
from ._torch import TorchModel, is_module
from ._fspace import Laplace as _Laplace


_STRUCTURES = ("full", "kron", "diag", "lowrank", "ekfac", "gp")
_SUBSETS = ("all", "last_layer", "subnetwork")
_LINKS = ("probit", "bridge", "bridge_norm", "mc")
# Which structure exists over which weights, whether it streams (one pass over the data into sums
# that merge: a loader batch by batch, processes by adding) and whether fspace_laplace's sharded
# fit takes it (a reduce per sum over the data): Rust's one support table.
_SUPPORT = {(structure, subset): (streams, shards)
            for structure, subset, streams, shards in _Laplace.support_table()}


def _streams(structure: str, subset: str) -> bool:
    return _SUPPORT.get((structure, subset), (False, False))[0]


def _shards(structure: str, subset: str) -> bool:
    return _SUPPORT.get((structure, subset), (False, False))[1]


def _structures_that(which: int, subset: str) -> List[str]:
    """The structures that stream (``which`` 0) or shard (1) over ``subset``, for messages."""
    return [s for (s, sub), row in _SUPPORT.items() if sub == subset and row[which]]


class _LaplaceSettings(Wrapper):
    """``fspace.Laplace``'s construction and settings: the arguments checked and kept, the Rust
    object built from them, and laplace-torch's hyperparameters (λ, σ, the prior mean, the
    temperature) with the sizes they are checked against."""

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
        if not _SIGMA_RANGE[0] <= v <= _SIGMA_RANGE[1]:
            raise ValueError(f"sigma_noise {v:g} is outside [{_SIGMA_RANGE[0]:g}, {_SIGMA_RANGE[1]:g}]: σ² or its "
                             "precision 1/σ² would overflow or vanish in float64")
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



# fspace_core::SIGMA_RANGE: the σ within which σ², 1/σ² and their products stay finite and non-zero.
_SIGMA_RANGE = (1e-150, 1e150)


def _optional_count(value: Any, what: str) -> Optional[int]:
    """``None``, or a whole number ≥ 1 (a negative, fractional or NaN setting is named here,
    not left to the integer conversion at the boundary)."""
    if value is None:
        return None
    if not is_count(value):
        raise ValueError(f"{what} must be ≥ 1 (a whole number), got {value!r}")
    return int(value)


def _parameter_sizes(model: Any) -> List[int]:
    """The sizes of the model's trainable parameter tensors in ``named_parameters()`` order
    (laplace-torch's layers of a layer-wise prior precision)."""
    if isinstance(model, tuple):
        from ._convert import parameter_order

        layout = [(k, tuple(np.shape(v))) for k, v in model[0].items()]
        return [int(np.prod(shape)) if shape else 1 for _, shape in parameter_order(layout)]
    return [int(p.numel()) for p in model.parameters() if p.requires_grad]


def _real_scalar(value: Any) -> Optional[float]:
    """``value`` as a float when it is a real Python or numpy scalar (not a string, not complex)."""
    if isinstance(value, (str, bytes)) or not np.isscalar(value) or not np.isreal(value):
        return None
    number: Any = value
    return float(number)
