"""fspace for Python: laplace-torch's calls on fspace's Rust core.

``fspace.Laplace(model, "regression" | "classification", ...)`` takes a PyTorch
``nn.Sequential`` of ``Linear`` layers and one activation (``Tanh``, ``ReLU``, ``Sigmoid``,
``Softplus`` or ``GELU(approximate="tanh")``), or a ``state_dict`` of numpy arrays with the
activation named. Anything else (another layer, a custom ``forward``, two different
activations) is a ``TypeError`` / ``ValueError`` that names the module, never a wrong model.
The numbers come from the compiled module ``fspace._fspace`` (the Rust crate ``fspace-py``),
in float64.

Where it differs from laplace-torch: inputs and outputs are numpy arrays (torch tensors are
accepted and converted; results come back as torch tensors when the input was one), there is
no autograd through the evidence (``optimize_prior_precision`` runs fspace's own searches), and
``subset_of_weights="last_layer"`` is the last Linear layer's weights and bias.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Mapping, Optional, Tuple, Union

import numpy as np

from ._fspace import Laplace as _Laplace
from ._fspace import NumericalError

__all__ = ["Laplace", "NumericalError", "convert_sequential"]

# PyTorch activation class name -> fspace activation name.
_ACTIVATIONS = {"Tanh": "tanh", "ReLU": "relu", "Sigmoid": "sigmoid", "Softplus": "softplus"}
_SUPPORTED = "Linear layers with one activation (Tanh, ReLU, Sigmoid, Softplus, GELU(approximate='tanh'))"


def _activation_name(module: Any) -> str:
    kind = type(module).__name__
    if kind == "GELU":
        if getattr(module, "approximate", "none") != "tanh":
            raise ValueError("GELU must be nn.GELU(approximate='tanh'): fspace's GELU is the tanh form")
        return "gelu_tanh"
    if kind == "Softplus" and (getattr(module, "beta", 1) != 1 or getattr(module, "threshold", 20) != 20):
        raise ValueError("Softplus must have beta=1 and threshold=20 (PyTorch's defaults)")
    if kind in _ACTIVATIONS:
        return _ACTIVATIONS[kind]
    raise TypeError(f"module {module!r} is not supported: fspace converts {_SUPPORTED}")


def convert_sequential(model: Any) -> Tuple["OrderedDict[str, np.ndarray]", str]:
    """The ``state_dict`` (float64 numpy arrays) and activation name of an ``nn.Sequential``
    of Linear layers and one activation; ``TypeError`` / ``ValueError`` naming the module
    otherwise."""
    kind = type(model).__name__
    if kind != "Sequential":
        raise TypeError(
            f"{kind} is not an nn.Sequential: fspace converts {_SUPPORTED}; "
            "give the state_dict and activation instead"
        )
    activation: Optional[str] = None
    state: "OrderedDict[str, np.ndarray]" = OrderedDict()
    for name, module in model.named_children():
        mkind = type(module).__name__
        if mkind == "Linear":
            state[f"{name}.weight"] = module.weight.detach().cpu().numpy()
            if module.bias is None:
                raise ValueError(f"layer {name} ({module!r}) has no bias: fspace's Linear layers have one")
            state[f"{name}.bias"] = module.bias.detach().cpu().numpy()
        elif mkind in ("Flatten", "Identity", "Dropout"):
            continue
        else:
            act = _activation_name(module)
            if activation is not None and act != activation:
                raise ValueError(f"layer {name} ({module!r}): fspace's MLP uses one activation, found {activation} and {act}")
            activation = act
    if not state:
        raise ValueError("the model has no Linear layer")
    return state, activation or "tanh"


def _is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch")


def _array2(x: Any, what: str) -> np.ndarray:
    if _is_torch(x):
        x = x.detach().cpu().numpy()
    a = np.asarray(x, dtype=np.float64)
    if a.ndim == 1:
        a = a.reshape(-1, 1)
    if a.ndim != 2:
        raise ValueError(f"{what} must be a 1-D or 2-D array, got shape {a.shape}")
    return a


def _data(data: Any, y: Any = None) -> Tuple[np.ndarray, np.ndarray]:
    """``(X, y)`` from arrays, tensors, or an iterable of ``(x, y)`` batches (a DataLoader)."""
    if y is not None:
        return _array2(data, "X"), _array2(y, "y")
    xs, ys = [], []
    for batch in data:
        bx, by = batch[0], batch[1]
        xs.append(_array2(bx, "X"))
        ys.append(_array2(by, "y"))
    if not xs:
        raise ValueError("the data loader yielded no batch")
    return np.concatenate(xs), np.concatenate(ys)


def _back(result: Any, like_torch: bool) -> Any:
    if not like_torch:
        return result
    import torch

    if isinstance(result, tuple):
        return tuple(torch.from_numpy(r) for r in result)
    return torch.from_numpy(result)


class Laplace:
    """The linearised Laplace approximation of a network, with laplace-torch's arguments.

    ``Laplace(model, likelihood, subset_of_weights="all", hessian_structure="kron",
    prior_precision=1.0, sigma_noise=1.0, temperature=1.0)``; ``model`` is an
    ``nn.Sequential`` of Linear layers and one activation, or ``(state_dict, activation)``
    with numpy arrays. Then ``fit(X, y)`` (or ``fit(loader)``),
    ``optimize_prior_precision(method="marglik" | "gridsearch", ...)``,
    ``la(X, pred_type="glm" | "nn", link_approx="probit" | "mc" | "bridge")``,
    ``log_marginal_likelihood()``, ``sample(n)``. Pickles with bit-identical predictions.
    """

    def __init__(
        self,
        model: Any,
        likelihood: str,
        subset_of_weights: str = "all",
        hessian_structure: str = "kron",
        prior_precision: float = 1.0,
        sigma_noise: float = 1.0,
        temperature: float = 1.0,
    ) -> None:
        if isinstance(model, tuple) and len(model) == 2:
            state, activation = model
        else:
            state, activation = convert_sequential(model)
        tensors = {}
        for name, value in state.items():
            if _is_torch(value):
                value = value.detach().cpu().numpy()
            arr = np.asarray(value)
            if arr.dtype not in (np.float32, np.float64):
                raise ValueError(f"tensor {name} has dtype {arr.dtype}: fspace reads float32 and float64 weights")
            tensors[name] = (list(arr.shape), np.ascontiguousarray(arr, dtype=np.float64).ravel(), arr.dtype == np.float32)
        self._la = _Laplace(
            tensors,
            activation,
            likelihood,
            hessian_structure,
            subset_of_weights,
            float(prior_precision),
            float(sigma_noise),
            float(temperature),
        )
        self.likelihood = likelihood

    @classmethod
    def _wrap(cls, inner: Any, likelihood: str) -> "Laplace":
        obj = cls.__new__(cls)
        obj._la = inner
        obj.likelihood = likelihood
        return obj

    def fit(self, data: Any, y: Any = None) -> None:
        """Fits the curvature on ``(X, y)``, or on every ``(x, y)`` batch of a loader."""
        x, yy = _data(data, y)
        self._la.fit(x, yy)

    def optimize_prior_precision(
        self,
        method: str = "marglik",
        val_loader: Any = None,
        x_val: Any = None,
        y_val: Any = None,
        grid: Optional[list] = None,
    ) -> float:
        """λ by marginal likelihood, or by the validation NLL over ``grid``; returns it."""
        if method == "gridsearch":
            if val_loader is not None:
                x_val, y_val = _data(val_loader)
            if x_val is None or y_val is None:
                raise ValueError("gridsearch needs val_loader or x_val and y_val")
            return self._la.optimize_prior_precision(method, _array2(x_val, "x_val"), _array2(y_val, "y_val"), grid)
        return self._la.optimize_prior_precision(method)

    def __call__(
        self,
        x: Any,
        pred_type: str = "glm",
        link_approx: str = "probit",
        n_samples: int = 100,
        seed: int = 0,
    ) -> Any:
        """Regression: ``(f_mean, f_var)``; classification: class probabilities."""
        out = self._la.predict(_array2(x, "X"), pred_type, link_approx, int(n_samples), int(seed))
        return _back(out, _is_torch(x))

    predictive = __call__

    def log_marginal_likelihood(self) -> float:
        """The Laplace evidence at the current λ."""
        return self._la.log_marginal_likelihood()

    def sample(self, n_samples: int = 100, seed: int = 0) -> np.ndarray:
        """``n_samples × p`` weight draws, in ``named_parameters()`` order."""
        return self._la.sample(int(n_samples), int(seed))

    @property
    def prior_precision(self) -> list:
        return self._la.prior_precision

    def __reduce__(self) -> Any:
        return (_restore, (self._la.to_json(), self.likelihood))


def _restore(text: str, likelihood: str) -> Laplace:
    return Laplace._wrap(_Laplace.from_json(text), likelihood)
