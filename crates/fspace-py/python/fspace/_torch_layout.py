"""``InputLayout``: how a batch of inputs — one tensor, or a dict of tensors (a HuggingFace
batch) — crosses to fspace as float64 rows and back to the model's shapes and dtypes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Dict, Optional, Sequence, Tuple

import numpy as np

from ._convert import is_torch

__all__ = ["InputLayout"]


class InputLayout:
    """How a model's inputs travel as float64 rows: ``fields`` is a list of ``(key, shape,
    kind)`` — ``key`` ``None`` for a plain tensor input, the dict key otherwise; ``shape`` the
    per-point shape; ``kind`` ``"float"`` (cast to the model's dtype), ``"int"`` (``torch.long``)
    or ``"bool"``."""

    def __init__(self, fields: Sequence[Tuple[Optional[str], Tuple[int, ...], str]]) -> None:
        self.fields = [(k, tuple(int(d) for d in shape), kind) for k, shape, kind in fields]
        self.sizes = [int(np.prod(shape)) if shape else 1 for _, shape, _ in self.fields]
        self.width = int(sum(self.sizes))
        self.is_dict = self.fields[0][0] is not None

    @staticmethod
    def _kind(value: Any) -> str:
        dtype = np.asarray(value).dtype if not is_torch(value) else value.detach().cpu().numpy().dtype
        if dtype == np.bool_:
            return "bool"
        if np.issubdtype(dtype, np.integer):
            return "int"
        if np.issubdtype(dtype, np.complexfloating):
            raise ValueError("complex inputs are not supported: fspace's inputs are real")
        return "float"

    @classmethod
    def of(cls, x: Any, skip: Sequence[str] = ()) -> "InputLayout":
        """The layout of a batch ``x`` (a tensor / array, or a dict of them; the keys in
        ``skip`` — the targets — and non-array values are left out)."""
        if isinstance(x, Mapping):
            fields = []
            for key in x:
                value = x[key]
                if key in skip or not (is_torch(value) or isinstance(value, np.ndarray)):
                    continue
                shape = tuple(value.shape)
                if len(shape) < 1:
                    raise ValueError(f"the batch's {key!r} has no batch dimension")
                fields.append((str(key), shape[1:], cls._kind(value)))
            if not fields:
                raise ValueError(f"a dict batch with no tensor besides {list(skip)}: nothing to give the model")
            return cls(fields)
        a = x if is_torch(x) else np.asarray(x)
        if len(a.shape) < 1:
            raise ValueError(f"inputs must have a batch dimension, got shape {tuple(a.shape)}")
        shape = tuple(a.shape[1:]) if len(a.shape) > 1 else (1,)
        return cls([(None, shape, cls._kind(a))])

    def rows(self, x: Any) -> int:
        first = x[self.fields[0][0]] if self.is_dict else x
        return int(first.shape[0])

    def pack(self, x: Any, what: str = "X") -> np.ndarray:
        """``x`` as ``n × width`` float64 rows (checked against the layout)."""
        parts = []
        for (key, shape, kind), size in zip(self.fields, self.sizes):
            if self.is_dict:
                if not isinstance(x, Mapping) or key not in x:
                    raise ValueError(f"{what} lacks the field {key!r} the model was fitted with")
                value = x[key]
            else:
                if isinstance(x, Mapping):
                    raise ValueError(f"{what} is a dict; the model was fitted on plain tensors")
                value = x
            if is_torch(value):
                value = value.detach().cpu().numpy()
            a = np.asarray(value)
            if a.dtype == object or np.issubdtype(a.dtype, np.complexfloating):
                raise ValueError(f"{what}{'' if key is None else f'[{key!r}]'} must be real numbers, got {a.dtype}")
            a = a.astype(np.float64)
            if a.ndim == 1 and not self.is_dict:
                a = a.reshape(-1, 1)
            n = a.shape[0] if a.ndim else 0
            if a.ndim < 1 or (tuple(a.shape[1:]) != shape and not (a.ndim == 2 and a.shape[1] == size)):
                where = "" if key is None else f"[{key!r}]"
                raise ValueError(f"{what}{where} has inputs of shape {tuple(a.shape[1:])}; the model was fitted on {shape}")
            if not np.all(np.isfinite(a)):
                raise ValueError(f"{what} has a non-finite value")
            parts.append(a.reshape(n, size))
        counts = {p.shape[0] for p in parts}
        if len(counts) != 1:
            raise ValueError(f"{what}'s fields have different numbers of rows: {sorted(counts)}")
        return np.ascontiguousarray(parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1))

    def unpack(self, rows: np.ndarray, device: Any, dtype: Any) -> Any:
        """The model's input for ``rows``: a tensor, or a dict of tensors."""
        import torch

        t = torch.from_numpy(np.ascontiguousarray(rows))
        n = rows.shape[0]
        out: Dict[str, Any] = {}
        start = 0
        for (key, shape, kind), size in zip(self.fields, self.sizes):
            part = t[:, start:start + size].reshape((n,) + shape)
            start += size
            target = dtype if kind == "float" else torch.long if kind == "int" else torch.bool
            value = part.to(device=device, dtype=target)
            if key is None:
                return value
            out[key] = value
        return out
