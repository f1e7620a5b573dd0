"""Arguments from Python to the compiled module: PyTorch models, arrays, loaders."""

from __future__ import annotations

import re
from collections import OrderedDict
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

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


def is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch")


def array2(x: Any, what: str) -> np.ndarray:
    if is_torch(x):
        x = x.detach().cpu().numpy()
    a = np.asarray(x, dtype=np.float64)
    if a.ndim == 1:
        a = a.reshape(-1, 1)
    if a.ndim != 2:
        raise ValueError(f"{what} must be a 1-D or 2-D array, got shape {a.shape}")
    return a


def data_arrays(data: Any, y: Any = None) -> Tuple[np.ndarray, np.ndarray]:
    """``(X, y)`` from arrays, tensors, or an iterable of ``(x, y)`` batches (a DataLoader)."""
    if y is not None:
        return array2(data, "X"), array2(y, "y")
    xs, ys = [], []
    for batch in data:
        bx, by = batch[0], batch[1]
        xs.append(array2(bx, "X"))
        ys.append(array2(by, "y"))
    if not xs:
        raise ValueError("the data loader yielded no batch")
    return np.concatenate(xs), np.concatenate(ys)


def back(result: Any, like_torch: bool) -> Any:
    if not like_torch:
        return result
    import torch

    if isinstance(result, tuple):
        return tuple(torch.from_numpy(r) for r in result)
    return torch.from_numpy(result)



def tensors(state: Any) -> Tuple[Dict[str, Tuple[List[int], np.ndarray, bool]], List[Tuple[str, Tuple[int, ...]]]]:
    """A state_dict as the compiled module takes it (name → shape, float64 values, was float32),
    and its names and shapes in order (to rebuild a state_dict from flat weights)."""
    out: Dict[str, Tuple[List[int], np.ndarray, bool]] = {}
    layout: List[Tuple[str, Tuple[int, ...]]] = []
    for name, value in state.items():
        if is_torch(value):
            value = value.detach().cpu().numpy()
        arr = np.asarray(value)
        if arr.dtype not in (np.float32, np.float64):
            raise ValueError(f"tensor {name} has dtype {arr.dtype}: fspace reads float32 and float64 weights")
        out[name] = (list(arr.shape), np.ascontiguousarray(arr, dtype=np.float64).ravel(), arr.dtype == np.float32)
        layout.append((name, tuple(arr.shape)))
    return out, layout


def model_state(model: Any) -> Tuple[Any, str]:
    """``(state_dict, activation)`` of an ``nn.Sequential`` or of a ``(state_dict, activation)`` pair."""
    if isinstance(model, tuple) and len(model) == 2:
        return model[0], model[1]
    return convert_sequential(model)


def _natural(text: str) -> List[Any]:
    return [(0, int(t), "") if t.isdigit() else (1, 0, t) for t in re.split(r"(\d+)", text) if t]


def parameter_order(layout: List[Tuple[str, Tuple[int, ...]]]) -> List[Tuple[str, Tuple[int, ...]]]:
    """The tensors in fspace's parameter order, PyTorch's ``named_parameters()`` order of a
    Sequential: layers by their name's prefix with digit runs compared as numbers (``2`` before
    ``10``), the weight before the bias."""

    def key(entry: Tuple[str, Tuple[int, ...]]) -> Any:
        prefix, _, leaf = entry[0].rpartition(".")
        return (_natural(prefix), 0 if leaf == "weight" else 1)

    return sorted(layout, key=key)


def unflatten(flat: np.ndarray, layout: List[Tuple[str, Tuple[int, ...]]]) -> "OrderedDict[str, np.ndarray]":
    """Flat weights in fspace's parameter order as a state_dict of float64 arrays, in
    ``layout``'s order."""
    parts: Dict[str, np.ndarray] = {}
    offset = 0
    for name, shape in parameter_order(layout):
        size = int(np.prod(shape)) if shape else 1
        parts[name] = flat[offset:offset + size].reshape(shape).copy()
        offset += size
    if offset != flat.size:
        raise ValueError(f"{flat.size} weights do not fill the state_dict's {offset}")
    return OrderedDict((name, parts[name]) for name, _ in layout)
