"""Any ``torch.nn.Module`` as an fspace network: torch computes ``f(X)``, ``J(X)·U`` and
``J(X)ᵀ·L``, fspace does the rest.

``TorchCalls(model, layout)`` is the object the compiled module calls back
(``crates/fspace-py/src/callback.rs``). Every call gets the flat float64 parameters ``w`` (in
``model.named_parameters()`` order, trainable ones only) and float64 inputs as rows; it runs
``torch.func.functional_call`` on the model's device and dtype, with ``jvp`` / ``vjp`` vmapped
over a block of columns (one Python call per block, so the GIL is taken once per block, not
per column), and returns float64 numpy arrays. A float32 model is evaluated in float32 by torch;
fspace accumulates the products in float64, so a float32 model's Jacobian products carry
float32 rounding (relative ≈ 1e-7) and nothing more.

Layer structure comes from module hooks (``layer_infos``, ``kfac_statistics``,
``last_layer_features``, ``forward_with_features``): each ``nn.Linear`` / ``nn.Conv2d`` layer's inputs (im2col patches for a
convolution; a Linear applied over extra axes counts them as positions) and the gradients at its
outputs, from one forward and one reverse pass per cotangent column — what laplace-torch's
curvature back-ends collect. ``fspace.Laplace`` asks for them for ``kron``, ``ekfac`` and
``last_layer`` (required) and for the other structures (used when every trainable parameter sits
in such a layer: then the GGN products, the diagonal and the predictive come from
them instead of one reverse pass per point).

Inputs cross to fspace as float64 rows (``InputLayout``): one tensor per batch, or a dict of
tensors — a HuggingFace batch, ``{"input_ids": …, "attention_mask": …}``, handed to the model
whole as laplace-torch does — each field flattened side by side and restored to its shape and
dtype (integer and boolean fields travel exactly: float64 holds every integer below 2⁵³).

The model is put in ``eval()`` mode for each call (BatchNorm uses its running statistics,
Dropout is off) and returned to its mode after; its buffers are used as they are. Attention
runs on torch's composite kernel (the fused kernels have no forward-mode derivative).
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import numpy as np

from ._convert import is_count
from ._torch_calls import TorchCalls, add_lower_gram, mirror_lower
from ._torch_layout import InputLayout

__all__ = ["InputLayout", "TorchCalls", "TorchModel", "add_lower_gram", "is_module", "mirror_lower"]


class TorchModel:
    """A model on the torch path, with ``ModelSpec``'s input handling: inputs are ``N × …``
    arrays or tensors in the model's own input shape (learned from the first ``fit``), rows of
    its flattened size, or dicts of tensors (``InputLayout``; the keys in ``skip_keys`` — the
    targets — stay out)."""

    def __init__(self, model: Any, input_shape: Any = None, block: int = 32, why: str = "") -> None:
        import torch

        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"{type(model).__name__} is not a torch.nn.Module (backend='torch' needs one)")
        self.model = model
        self.block = int(block)
        self.layout: Optional[InputLayout] = None
        if input_shape is not None:
            self.layout = InputLayout([(None, _input_shape(input_shape), "float")])
        self.skip_keys: Tuple[str, ...] = ()
        self._probe: Optional[np.ndarray] = None
        self._calls: Any = None
        self.architecture = None
        self.is_cnn = False
        # Why the model is not one of fspace's native networks ("" when the torch path was asked for).
        self.why = why

    @property
    def input_shape(self) -> Optional[Tuple[int, ...]]:
        """The per-point shape of a plain tensor input (``None`` for dict inputs or before the
        first inputs)."""
        if self.layout is None or self.layout.is_dict:
            return None
        return self.layout.fields[0][1]

    def architecture_known(self) -> bool:
        return self.layout is not None

    def inputs(self, x: Any, what: str = "X") -> np.ndarray:
        if self.layout is None:
            self.layout = InputLayout.of(x, self.skip_keys)
        rows = self.layout.pack(x, what)
        if self._probe is None and rows.shape[0] > 0:
            self._probe = rows[:2].copy()
        return rows

    def calls(self) -> TorchCalls:
        if self._calls is None:
            if self.layout is None:
                raise ValueError("the model's input shape is unknown before fit")
            self._calls = TorchCalls(self.model, self.layout, self.block, self._probe)
        return self._calls

    def __getstate__(self) -> Dict[str, Any]:
        raise TypeError("a posterior on a torch model's callbacks cannot be pickled: save the model with torch and refit")


def _input_shape(input_shape: Any) -> Tuple[int, ...]:
    """One input's shape: positive whole numbers (the model's, without the batch axis)."""
    try:
        shape = tuple(input_shape)
    except TypeError:
        shape = (input_shape,)
    if not shape or not all(is_count(s) for s in shape):
        raise ValueError(f"input_shape {input_shape!r} must be one input's shape: whole numbers ≥ 1, without the "
                         "batch axis")
    return tuple(int(s) for s in shape)


def is_module(model: Any) -> bool:
    try:
        import torch
    except ImportError:
        return False
    return isinstance(model, torch.nn.Module)
