"""Arguments from Python to the compiled module: PyTorch models, arrays, loaders."""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Tuple

import numpy as np

# PyTorch activation class name -> fspace activation name.
_ACTIVATIONS = {"Tanh": "tanh", "ReLU": "relu", "Sigmoid": "sigmoid", "Softplus": "softplus"}
_SUPPORTED = (
    "an nn.Sequential of Linear layers with one activation (Tanh, ReLU, Sigmoid, Softplus, "
    "GELU(approximate='tanh')), optionally after Conv2d blocks (Conv2d with stride 1 and no or "
    "'same' padding, the activation, an optional MaxPool2d(2)) and a Flatten"
)



def is_count(value: Any) -> bool:
    """Whether ``value`` is a whole number ≥ 1 (a bool, a float — NaN included — or a number
    below 1 is not)."""
    return not isinstance(value, bool) and isinstance(value, (int, np.integer)) and bool(value >= 1)


def count(value: Any, what: str) -> int:
    """``value`` as a whole number ≥ 1 (epochs, steps, draws, …), else a ``ValueError`` naming
    ``what`` and the value."""
    if not is_count(value):
        raise ValueError(f"{what} {value!r} must be a whole number ≥ 1")
    return int(value)

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


def _pair(value: Any) -> Tuple[int, int]:
    return (value, value) if isinstance(value, int) else (int(value[0]), int(value[1]))


def _conv_block(name: str, module: Any) -> Dict[str, Any]:
    """A ``Conv2d``'s block (``pool`` is set when a MaxPool2d follows its activation)."""
    kh, kw = _pair(module.kernel_size)
    problems = []
    if kh != kw:
        problems.append(f"a {kh}×{kw} kernel (fspace's are square)")
    if _pair(module.stride) != (1, 1):
        problems.append(f"stride {module.stride} (fspace's is 1)")
    if _pair(module.dilation) != (1, 1):
        problems.append(f"dilation {module.dilation}")
    if module.groups != 1:
        problems.append(f"groups={module.groups}")
    if module.padding_mode != "zeros":
        problems.append(f"padding_mode={module.padding_mode!r}")
    if module.bias is None:
        problems.append("no bias")
    padding = module.padding
    if padding == "same" or (not isinstance(padding, str) and _pair(padding) == (kh // 2, kh // 2) and kh % 2 == 1 and kh > 1):
        same = True
        if kh % 2 == 0:
            problems.append("'same' padding with an even kernel")
    elif padding == "valid" or (not isinstance(padding, str) and _pair(padding) == (0, 0)):
        same = False
    else:
        problems.append(f"padding {padding} (fspace pads by 0 or by kernel // 2 for an odd kernel)")
    if problems:
        raise ValueError(f"layer {name} ({module!r}) has " + ", ".join(problems) + f": fspace converts {_SUPPORTED}")
    return {"channels": int(module.out_channels), "kernel": kh, "same_padding": same, "pool": False}


def _check_pool(name: str, module: Any) -> None:
    size = _pair(module.kernel_size)
    stride = _pair(module.stride if module.stride is not None else module.kernel_size)
    if size != (2, 2) or stride != (2, 2) or _pair(module.padding) != (0, 0) or _pair(module.dilation) != (1, 1) \
            or module.ceil_mode or module.return_indices:
        raise ValueError(
            f"layer {name} ({module!r}): fspace's pooling is MaxPool2d(2) (2×2 windows, stride 2, no padding, floor)"
        )


class ModelSpec:
    """A network as the compiled module takes it.

    Parameters
    ----------
    state : dict of numpy.ndarray
        The ``state_dict``: ``{i}.weight`` / ``{i}.bias`` arrays, float64.
    activation : str
        ``"tanh"``, ``"relu"``, ``"sigmoid"``, ``"softplus"`` or ``"gelu_tanh"``.
    architecture : dict, optional
        A CNN's layout (``convs``, ``hidden``, ``output_dim`` and ``input_shape`` ``(C, H, W)``,
        which the first 4-D input sets when the model did not say); ``None`` for an MLP.

    Examples
    --------
    >>> import torch, fspace
    >>> spec = fspace.convert_sequential(torch.nn.Sequential(torch.nn.Linear(2, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1)))
    >>> spec.activation, spec.is_cnn, sorted(spec.state)
    ('tanh', False, ['0.bias', '0.weight', '2.bias', '2.weight'])
    """

    def __init__(self, state: Any, activation: str, architecture: Optional[Dict[str, Any]] = None) -> None:
        self.state = state
        self.activation = activation
        self.architecture = None if architecture is None else dict(architecture)

    @property
    def is_cnn(self) -> bool:
        """Whether the network has convolutional blocks."""
        return self.architecture is not None

    def set_input_shape(self, shape: Any) -> None:
        """Sets a CNN's input shape (an MLP accepts only its own width).

        Parameters
        ----------
        shape : sequence of int
            ``(C, H, W)``.

        Raises
        ------
        ValueError
            A shape that is not ``(C, H, W)``, differs from the known one, or is given to an MLP.
        """
        shape = tuple(int(s) for s in shape)
        if self.architecture is None:
            first = next(np.asarray(v) for v in self.state.values() if np.asarray(v).ndim == 2)
            if shape == (first.shape[1],):
                return
            raise ValueError(
                f"input_shape {shape} applies to a convolutional model; this one is an MLP taking {first.shape[1]} inputs"
            )
        if len(shape) != 3 or min(shape) < 1:
            raise ValueError(f"input_shape {shape} is not (channels, height, width)")
        known = self.architecture.get("input_shape")
        if known is not None and tuple(known) != shape:
            raise ValueError(f"inputs of shape {shape} do not match the model's input_shape {tuple(known)}")
        self.architecture["input_shape"] = list(shape)

    def inputs(self, x: Any, what: str = "X") -> np.ndarray:
        """Inputs as float64 rows.

        Parameters
        ----------
        x : array_like or torch.Tensor
            MLP: ``N × d``; CNN: ``N × C × H × W`` images (flattened channel-major, as
            ``torch.flatten``), or rows of ``C·H·W`` values once its input shape is known.
        what : str, default "X"
            The name error messages use.

        Returns
        -------
        numpy.ndarray, shape (N, d)

        Raises
        ------
        ValueError
            Inputs that are not finite real numbers, or of a shape the model does not take.
        """
        if not self.is_cnn:
            return array2(x, what)
        a = real_array(x, what)
        if a.ndim == 4:
            self.set_input_shape(a.shape[1:])
            return np.ascontiguousarray(a.reshape(a.shape[0], -1))
        assert self.architecture is not None
        if self.architecture.get("input_shape") is None:
            raise ValueError(
                f"{what} has shape {a.shape}: a convolutional model takes N × C × H × W images "
                "(or give input_shape=(C, H, W) to pass flattened rows)"
            )
        return array2(a, what)

    def architecture_known(self) -> bool:
        """Whether the network can be built: an MLP, or a CNN whose input shape is known.

        Returns
        -------
        bool
        """
        return self.architecture is None or self.architecture.get("input_shape") is not None

    def architecture_dict(self) -> Optional[Dict[str, Any]]:
        """A CNN's layout as the Rust ``CnnArchitecture``'s dict.

        Returns
        -------
        dict or None
            ``None`` for an MLP.

        Raises
        ------
        ValueError
            A CNN whose input shape is not known yet.
        """
        if self.architecture is None:
            return None
        if self.architecture.get("input_shape") is None:
            raise ValueError("the convolutional model's input_shape is unknown: give input_shape=(C, H, W) or 4-D inputs")
        return dict(self.architecture)


def convert_sequential(model: Any) -> ModelSpec:
    """The ``state_dict`` (float64 numpy arrays), activation and (for a CNN) architecture of an
    ``nn.Sequential`` fspace's native engine runs.

    Parameters
    ----------
    model : torch.nn.Sequential
        Linear layers and one activation (Tanh, ReLU, Sigmoid, Softplus, GELU(tanh)), after
        optional Conv2d blocks (stride 1, no or "same" padding, the activation, an optional
        MaxPool2d(2)) and a Flatten.

    Returns
    -------
    ModelSpec

    Raises
    ------
    TypeError
        Not an ``nn.Sequential``, or a layer the native engine does not run (named).
    ValueError
        Two different activations, or a layer's settings it does not run (named).

    Examples
    --------
    >>> import torch, fspace
    >>> spec = fspace.convert_sequential(torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)))
    >>> spec.activation, spec.state["0.weight"].shape
    ('relu', (8, 3))
    """
    kind = type(model).__name__
    if kind != "Sequential":
        raise TypeError(
            f"{kind} is not an nn.Sequential: fspace converts {_SUPPORTED}; "
            "give (state_dict, activation) or (state_dict, activation, architecture) instead"
        )
    frozen = [name for name, param in model.named_parameters() if not param.requires_grad]
    if frozen:
        raise ValueError(
            f"parameters {frozen} are frozen (requires_grad=False): fspace's native network covers every weight, so "
            "this model runs on the torch engine, which covers the trainable ones as laplace-torch does"
        )
    activation: Optional[str] = None
    state: "OrderedDict[str, np.ndarray]" = OrderedDict()
    convs: List[Dict[str, Any]] = []
    dense: List[int] = []
    flattened = False
    # What the previous module was: "conv", "conv_act", "pool", "dense", "dense_act", "flatten".
    last = "start"
    for name, module in model.named_children():
        mkind = type(module).__name__
        if mkind == "Conv2d":
            if flattened or dense:
                raise ValueError(f"layer {name} ({module!r}): fspace's CNN has its Conv2d blocks before Flatten and the Linear layers")
            if last == "conv":
                raise ValueError(f"layer {name} ({module!r}): fspace's CNN applies the activation after every Conv2d")
            convs.append(_conv_block(name, module))
            state[f"{name}.weight"] = module.weight.detach().cpu().numpy()
            state[f"{name}.bias"] = module.bias.detach().cpu().numpy()
            last = "conv"
        elif mkind == "MaxPool2d":
            if last != "conv_act":
                raise ValueError(f"layer {name} ({module!r}): fspace pools once, after a Conv2d's activation")
            _check_pool(name, module)
            convs[-1]["pool"] = True
            last = "pool"
        elif mkind == "Flatten":
            if getattr(module, "start_dim", 1) != 1 or getattr(module, "end_dim", -1) != -1:
                raise ValueError(f"layer {name} ({module!r}): fspace flattens all but the batch dimension (Flatten())")
            if convs and last == "conv":
                raise ValueError(f"layer {name} ({module!r}): fspace's CNN applies the activation after every Conv2d")
            flattened = True
            last = "flatten"
        elif mkind == "Linear":
            if convs and not flattened:
                raise ValueError(f"layer {name} ({module!r}): a Linear after Conv2d blocks needs an nn.Flatten() before it")
            if last == "dense":
                raise ValueError(f"layer {name} ({module!r}): fspace applies the activation between Linear layers")
            if module.bias is None:
                raise ValueError(f"layer {name} ({module!r}) has no bias: fspace's Linear layers have one")
            state[f"{name}.weight"] = module.weight.detach().cpu().numpy()
            state[f"{name}.bias"] = module.bias.detach().cpu().numpy()
            dense.append(int(module.out_features))
            last = "dense"
        elif mkind in ("Identity", "Dropout"):
            continue
        else:
            act = _activation_name(module)
            if activation is not None and act != activation:
                raise ValueError(f"layer {name} ({module!r}): fspace's networks use one activation, found {activation} and {act}")
            if last not in ("conv", "dense"):
                raise ValueError(f"layer {name} ({module!r}): an activation follows a Conv2d or a Linear layer")
            activation = act
            last = "conv_act" if last == "conv" else "dense_act"
    if not dense:
        raise ValueError("the model has no Linear layer (fspace's networks end in one)")
    if last != "dense":
        raise ValueError("the model ends in an activation or a pooling: fspace's networks end in a Linear layer")
    if not convs:
        return ModelSpec(state, activation or "tanh")
    architecture = {"input_shape": None, "convs": convs, "hidden": dense[:-1], "output_dim": dense[-1]}
    return ModelSpec(state, activation or "tanh", architecture)


def is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch")


def is_array(x: Any) -> bool:
    """A numpy array or a torch tensor (not a loader or a dataset, which are torch objects too)."""
    return isinstance(x, np.ndarray) or (is_torch(x) and hasattr(x, "detach") and hasattr(x, "shape"))


def real_array(x: Any, what: str) -> np.ndarray:
    """``x`` (an array, a tensor, nested lists) as float64, refusing what is not real numbers
    (complex values would lose their imaginary part, strings and objects are not numbers)."""
    if is_torch(x):
        x = x.detach().cpu().numpy()
    a = np.asarray(x)
    if np.iscomplexobj(a):
        raise ValueError(f"{what} is complex ({a.dtype}): fspace computes with real numbers")
    if a.dtype.kind not in "biuf":
        raise ValueError(f"{what} must hold real numbers, got an array of {a.dtype}")
    return a.astype(np.float64, copy=False)


def array2(x: Any, what: str) -> np.ndarray:
    a = real_array(x, what)
    if a.ndim == 1:
        a = a.reshape(-1, 1)
    if a.ndim != 2:
        raise ValueError(f"{what} must be a 1-D or 2-D array, got shape {a.shape}")
    return a


def gathered(batches: Iterable[Tuple[np.ndarray, np.ndarray]],
             target: Callable[[], int]) -> Iterator[Tuple[np.ndarray, np.ndarray]]:
    """Consecutive ``(X, y)`` batches joined into blocks of at least ``target()`` rows (the last
    block may hold fewer), so that a loader's small batches cross to Rust in the chunks an
    in-memory fit would use. ``target`` is read after each batch is drawn, so it may come from
    an object the first batch creates."""
    held: List[Tuple[np.ndarray, np.ndarray]] = []
    rows = 0

    def joined() -> Tuple[np.ndarray, np.ndarray]:
        if len(held) == 1:
            return held[0]
        return np.concatenate([h[0] for h in held]), np.concatenate([h[1] for h in held])

    for x, y in batches:
        held.append((x, y))
        rows += x.shape[0]
        if rows >= target():
            yield joined()
            held, rows = [], 0
    if held:
        yield joined()


def dataset_size(loader: Any) -> Optional[int]:
    """``len(loader.dataset)`` (laplace-torch's N), or ``None`` for a loader without a sized
    dataset."""
    dataset = getattr(loader, "dataset", None)
    return len(dataset) if dataset is not None and hasattr(dataset, "__len__") else None


def readable_by_position(loader: Any) -> bool:
    """Whether a loader's rows can be read by their position in its data set, as its own fetcher
    reads them, each pass covering the data set once: a torch ``DataLoader`` over a map-style
    data set (``__getitem__``, ``__len__``) with its default batching — a sequential or
    random-permutation sampler, the last partial batch kept."""
    dataset = getattr(loader, "dataset", None)
    if dataset is None or not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
        return False
    try:
        from torch.utils.data import BatchSampler, IterableDataset, RandomSampler, SequentialSampler
    except ImportError:
        return False
    if isinstance(dataset, IterableDataset) or getattr(loader, "drop_last", True):
        return False
    if type(getattr(loader, "batch_sampler", None)) is not BatchSampler:
        return False
    sampler: Any = getattr(loader, "sampler", None)
    if type(sampler) is SequentialSampler:
        return True
    return (type(sampler) is RandomSampler and not sampler.replacement
            and sampler.num_samples == len(dataset))


def batch_arrays(batch: Any, to_x: Callable[[Any, str], np.ndarray],
                 dict_keys: Optional[Tuple[Optional[str], str]] = None) -> Tuple[np.ndarray, np.ndarray]:
    """One loader batch as ``(X, y)`` arrays: an ``(x, y)`` pair, or a dict batch
    (``dict_keys = (key_x, key_y)``: the targets under ``key_y``, the inputs under ``key_x`` —
    or, with ``key_x`` ``None``, the whole dict, for a model that takes one)."""
    from collections.abc import Mapping

    if isinstance(batch, Mapping):
        if dict_keys is None:
            raise ValueError("a dict batch needs dict_key_x / dict_key_y")
        key_x, key_y = dict_keys
        for key in (key_y,) if key_x is None else (key_x, key_y):
            if key not in batch:
                raise ValueError(f"a dict batch has no key {key!r} (its keys: {sorted(batch)}); set dict_key_x / dict_key_y")
        bx, by = (batch if key_x is None else batch[key_x]), batch[key_y]
    elif isinstance(batch, (tuple, list)) and len(batch) == 2:
        bx, by = batch[0], batch[1]
    else:
        raise ValueError(
            "each batch of the loader must be an (x, y) pair or a dict with the keys dict_key_x / dict_key_y, "
            f"got {type(batch).__name__}"
        )
    return to_x(bx, "X"), array2(by, "y")


def data_arrays(data: Any, y: Any = None, inputs: Optional[Callable[[Any, str], np.ndarray]] = None,
                dict_keys: Optional[Tuple[Optional[str], str]] = None) -> Tuple[np.ndarray, np.ndarray]:
    """``(X, y)`` from arrays, tensors, or an iterable of ``(x, y)`` batches (a DataLoader) or
    of dict batches (``batch_arrays``); ``inputs`` converts ``X`` (default: a 1-D or 2-D array;
    a CNN's ``ModelSpec.inputs`` takes images)."""
    to_x = array2 if inputs is None else inputs
    if y is not None:
        return to_x(data, "X"), array2(y, "y")
    if is_array(data):
        raise ValueError("fit(X) without targets: give fit(X, y), or a loader of (x, y) batches")
    xs, ys = [], []
    for batch in data:
        bx, by = batch_arrays(batch, to_x, dict_keys)
        xs.append(bx)
        ys.append(by)
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


def model_state(model: Any, input_shape: Any = None) -> ModelSpec:
    """The network of an ``nn.Sequential``, of a ``(state_dict, activation)`` pair (an MLP) or
    of a ``(state_dict, activation, architecture)`` triple (a CNN: ``architecture`` holds
    ``convs`` — ``{"channels", "kernel", "same_padding", "pool"}`` per Conv2d —, ``hidden``,
    ``output_dim`` and optionally ``input_shape``)."""
    if isinstance(model, tuple) and len(model) == 2:
        spec = ModelSpec(model[0], model[1])
    elif isinstance(model, tuple) and len(model) == 3:
        arch = dict(model[2])
        unknown = set(arch) - {"input_shape", "convs", "hidden", "output_dim"}
        if unknown:
            raise ValueError(f"architecture keys {sorted(unknown)} are unknown: it has input_shape, convs, hidden, output_dim")
        arch.setdefault("input_shape", None)
        spec = ModelSpec(model[0], model[1], arch)
    else:
        spec = convert_sequential(model)
    if input_shape is not None:
        spec.set_input_shape(input_shape)
    return spec


def reread_weights(spec: Any, model: Any) -> bool:
    """Re-reads the weights of a torch model fspace runs natively into ``spec.state`` (its
    layout kept); returns whether it did. laplace-torch reads a model's parameters when it
    fits, so a model trained or loaded after the object that wraps it was made is fitted at its
    current weights; the native engine hands Rust a copy, taken again at each fit. A
    ``(state_dict, activation)`` pair is the caller's own copy and a torch-engine model is
    called as it is: neither is re-read, nor is an unpickled object's (which holds no model)."""
    if not isinstance(spec, ModelSpec) or model is None or isinstance(model, tuple):
        return False
    spec.state = convert_sequential(model).state
    return True


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
