"""Which engine runs a model: fspace's native MLP / CNN (``_convert``) or torch's own derivatives
(``_torch``). Above both, so neither imports the other's caller."""

from __future__ import annotations

from typing import Any

from ._convert import model_state
from ._torch import TorchModel, is_module

__all__ = ["network_spec"]


def network_spec(model: Any, input_shape: Any = None, backend: str = "auto") -> Any:
    """The network of ``model`` on ``backend``: ``"native"`` (a ``ModelSpec``: fspace's own MLP or
    CNN, refusing what it does not implement), ``"torch"`` (a ``TorchModel``: any
    ``nn.Module`` through torch's derivatives) or ``"auto"`` (native where the model converts,
    torch for any other ``nn.Module``)."""
    if backend == "torch":
        return TorchModel(model, input_shape)
    if backend == "native":
        return model_state(model, input_shape)
    if backend != "auto":
        raise ValueError(f"backend {backend!r} is not \"auto\", \"native\" or \"torch\"")
    try:
        spec = model_state(model)
    except (TypeError, ValueError) as native_refusal:
        if is_module(model):
            return TorchModel(model, input_shape, why=str(native_refusal))
        raise
    # A model fspace runs natively stays native: a wrong input_shape is the caller's error, not
    # a reason to take the slower torch engine.
    if input_shape is not None:
        spec.set_input_shape(input_shape)
    return spec
