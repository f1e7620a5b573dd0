"""``TorchCalls``: the callbacks the compiled module makes into a torch model — ``f(X)``,
``J(X)·U``, ``J(X)ᵀ·L``, the layers' statistics — and the memory bounds of their chunks
(``_torch`` has the module docs)."""

from __future__ import annotations

import threading
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ._torch_layout import InputLayout

__all__ = ["TorchCalls", "add_lower_gram", "mirror_lower"]


def _slice(x: Any, a: int, b: int) -> Any:
    """Points ``a:b`` of a model input (a tensor or a dict of tensors)."""
    if isinstance(x, dict):
        return {k: v[a:b] for k, v in x.items()}
    return x[a:b]


def _unsqueeze(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: v.unsqueeze(0) for k, v in x.items()}
    return x.unsqueeze(0)


def _math_attention() -> Any:
    """Scaled-dot-product attention by its composite (math) kernel: the fused CPU / flash
    kernels have no forward-mode derivative, which ``J·U`` needs."""
    import contextlib

    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:  # torch < 2.3: no kernel choice to make
        return contextlib.nullcontext()
    return sdpa_kernel([SDPBackend.MATH])


# The forward-mode tangents one vmapped ``jvp`` call may carry (``TorchCalls._point_chunks``;
# docs/PERFORMANCE.md shows what one call over all points held on a ResNet-18).
TANGENT_BYTES = 1 << 30

# Bytes of a ``p × c`` float64 block that one ``jvp`` / ``vjp`` call gets or returns: fspace
# sends wider blocks a few columns at a time (``callback.rs``'s ``DEFAULT_COLUMN_BYTES``, read
# from ``TorchCalls.column_bytes`` when the network is made).
COLUMN_BYTES = 256 << 20


# Column width of the blocks in which ``add_lower_gram`` forms a Gram: on a ResNet-18's KFAC
# shapes (2 cores) 256 was as fast as any width from 128 to 768, and 1.5–4× faster than the full
# product (docs/PERFORMANCE.md, "The factor sums' lower triangle").
GRAM_BLOCK = 256


def add_lower_gram(acc: Any, a: Any, block: int = GRAM_BLOCK) -> None:
    """Adds the lower block triangle of ``aᵀa`` (``a``: ``rows × m``) into ``acc`` (``m × m``,
    float64) in place: for each block of ``block`` columns ``[j0, j1)``, ``a[:, j0:]ᵀ a[:, j0:j1]``
    in ``a``'s dtype, added with promotion. About half the products of ``aᵀa`` and no ``m × m``
    temporary; each entry on and below the diagonal is the same dot product the full product
    forms. The strictly upper part of ``acc`` is left partial: ``mirror_lower`` completes it."""
    m = a.shape[1]
    for j0 in range(0, m, block):
        j1 = min(m, j0 + block)
        acc[j0:, j0:j1].add_(a[:, j0:].T @ a[:, j0:j1])


def mirror_lower(acc: Any) -> Any:
    """Makes ``acc`` the symmetric matrix of its lower triangle, in place (one strictly lower
    copy as the only temporary), and returns it."""
    strict = acc.tril(-1)
    acc.tril_()
    return acc.add_(strict.T)


class TorchCalls:
    """The callbacks of one model (module docs). ``block`` columns are vmapped at a time."""

    def __init__(self, model: Any, layout: Any, block: int = 32, probe: Optional[np.ndarray] = None) -> None:
        import torch

        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"{type(model).__name__} is not a torch.nn.Module")
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        if not named:
            raise ValueError("the model has no trainable parameter")
        dtypes = {p.dtype for _, p in named}
        devices = {p.device for _, p in named}
        if len(dtypes) != 1 or next(iter(dtypes)) not in (torch.float32, torch.float64):
            raise ValueError(f"the model's parameters must share one dtype, float32 or float64 (found {sorted(map(str, dtypes))})")
        if len(devices) != 1:
            raise ValueError(f"the model's parameters must live on one device (found {sorted(map(str, devices))})")
        self.model = model
        self.names: List[str] = [n for n, _ in named]
        self.shapes: List[Tuple[int, ...]] = [tuple(p.shape) for _, p in named]
        self.sizes: List[int] = [int(p.numel()) for _, p in named]
        ends = np.cumsum(self.sizes)
        # Each parameter's [start, end) in the flat vector.
        self.offsets: Dict[str, Tuple[int, int]] = {
            n: (int(e - s), int(e)) for n, s, e in zip(self.names, self.sizes, ends)
        }
        self.dtype = next(iter(dtypes))
        self.device = next(iter(devices))
        if not isinstance(layout, InputLayout):
            layout = InputLayout([(None, tuple(int(s) for s in layout), "float")])
        self.layout = layout
        self.input_dim = layout.width
        # Rows of real inputs for the probes below (a model of token ids needs valid ones);
        # zeros for a plain float input without them.
        self.probe = np.zeros((2, self.input_dim)) if probe is None else np.asarray(probe, dtype=np.float64)[:2]
        self.block = int(block)
        # fspace calls back from several worker threads; torch.func's transforms must not
        # interleave (torch releases the GIL inside its kernels), so one call runs at a time
        # — torch parallelises inside each call.
        self._lock = threading.Lock()
        self.params = np.concatenate([p.detach().double().cpu().reshape(-1).numpy() for _, p in named])
        # The probe also counts the elements every module outputs for one input: a forward-mode
        # product vmapped over r directions carries r such tangents per point, so ``jvp`` takes
        # the points in chunks that keep them near ``TANGENT_BYTES``.
        counted = [0]

        def count(module: Any, inp: Any, out: Any) -> None:
            counted[0] += sum(int(t.numel()) for t in (out if isinstance(out, (tuple, list)) else (out,)) if isinstance(t, torch.Tensor))

        handles = [m.register_forward_hook(count) for m in model.modules()]
        try:
            with torch.no_grad():
                probe = self._call(self._unflatten(self.params), self._inputs(self.probe[:1]))
        finally:
            for h in handles:
                h.remove()
        self.output_dim = int(probe.shape[1])
        # Each input's outputs as the model shapes them (a sequence model: positions × classes).
        self.output_shape: Tuple[int, ...] = self._output_shape
        self.activations_per_point = max(1, counted[0])

    @property
    def column_bytes(self) -> int:
        """``COLUMN_BYTES`` (module constant, read by fspace when it makes the network)."""
        return COLUMN_BYTES

    # -- helpers ---------------------------------------------------------------------------

    def _unflatten(self, w: np.ndarray) -> Dict[str, Any]:
        import torch

        flat = torch.from_numpy(np.ascontiguousarray(w)).to(device=self.device, dtype=self.dtype)
        return {n: t.view(s) for n, t, s in zip(self.names, torch.split(flat, self.sizes), self.shapes)}

    def _columns(self, m: np.ndarray) -> Dict[str, Any]:
        """The columns of a ``p × r`` matrix as parameter dicts with a leading ``r`` axis."""
        import torch

        # fspace hands the columns over column-major, so ``m.T`` is C-contiguous and shared, not
        # copied: only this block's conversion to the model's dtype and device allocates.
        t = torch.from_numpy(m.T).to(device=self.device, dtype=self.dtype)
        return {n: c.reshape((m.shape[1],) + s) for n, c, s in zip(self.names, torch.split(t, self.sizes, dim=1), self.shapes)}

    def _inputs(self, x: np.ndarray) -> Any:
        return self.layout.unpack(x, self.device, self.dtype)

    def _call(self, params: Dict[str, Any], x: Any) -> Any:
        import torch

        was_training = self.model.training
        self.model.eval()
        try:
            with _math_attention():
                out = torch.func.functional_call(self.model, params, (x,), strict=False)
        finally:
            self.model.train(was_training)
        if not isinstance(out, torch.Tensor):
            raise TypeError(
                f"the model returned a {type(out).__name__}; fspace needs one tensor of outputs per input "
                "(wrap the model to return it)"
            )
        n = self.layout.rows(x)
        if out.shape[0] != n:
            raise ValueError(f"the model returned {out.shape[0]} rows for {n} inputs")
        self._output_shape = tuple(int(s) for s in out.shape[1:])
        return out.reshape(n, -1)

    def check_classifier(self) -> None:
        """Refuses a classifier whose outputs per input are not one vector of logits: a
        ``(batch, sequence, classes)`` output would otherwise be read as one softmax over
        ``sequence × classes`` classes."""
        if len(self.output_shape) > 1:
            raise ValueError(
                f"the model returns (batch, {', '.join(map(str, self.output_shape))}) logits: fspace's classification likelihood is "
                "one softmax per input over (batch, classes) logits, and per-position (token) classification is not "
                "implemented (laplace-torch 0.3 fails on it too: CurvlinopsGGN's CrossEntropyLoss wants the classes "
                "in dimension 1, AsdlGGN's shapes disagree). Reduce the sequence inside the model (pool, or take one "
                "position) so that it returns (batch, classes)"
            )

    @staticmethod
    def _numpy(t: Any) -> np.ndarray:
        import torch

        return t.detach().to("cpu", dtype=torch.float64).numpy()

    # -- the callbacks -----------------------------------------------------------------------

    def forward(self, w: np.ndarray, x: np.ndarray) -> np.ndarray:
        """``f(X)``: ``n × d'``."""
        import torch

        with self._lock, torch.no_grad():
            return self._numpy(self._call(self._unflatten(w), self._inputs(x)))

    def ntk_pullback_inducing(self, x: np.ndarray, z: np.ndarray, outputs: Sequence[int], c_xz: np.ndarray,
                              c_zz: np.ndarray) -> np.ndarray:
        """The gradient in ``Z`` (rows, ``M × d``) of ``⟨C_xz, J(X)J(Z)ᵀ⟩ + ⟨C_zz, J(Z)J(Z)ᵀ⟩``
        with output ``outputs[m]`` of inducing input ``m`` (VaLLA moving its inducing inputs), at
        the model's current weights: both Jacobians by ``torch.func.jacrev`` (as laplace-torch
        forms them), ``J(Z)``'s kept differentiable in ``Z``, then one reverse pass."""
        import torch

        from ._memory import check_budget

        n, m = x.shape[0], z.shape[0]
        q = c_xz.shape[0] // max(n, 1)
        p = int(sum(self.sizes))
        check_budget((n * q + 2 * m * q) * p * torch.finfo(self.dtype).bits // 8,
                     f"the Jacobians at {n} points and {m} inducing inputs ({p} parameters)",
                     "smaller batches or fewer inducing inputs, or optimize_inducing=False")
        with self._lock:
            params = self._unflatten(self.params)

            def flat(jac: Dict[str, Any], rows: int) -> Any:
                return torch.cat([jac[name].reshape(rows, -1) for name in self.names], dim=1)

            jx = flat(torch.func.jacrev(self._call)(params, self._inputs(x)), n * q).detach()
            inducing = self._inputs(z).detach().requires_grad_(True)
            jz = flat(torch.func.jacrev(self._call)(params, inducing), m * q)
            jz = jz.reshape(m, q, -1)[torch.arange(m), torch.as_tensor(list(outputs), dtype=torch.long)]
            cxz = torch.from_numpy(np.ascontiguousarray(c_xz)).to(self.device, self.dtype)
            czz = torch.from_numpy(np.ascontiguousarray(c_zz)).to(self.device, self.dtype)
            total = ((cxz.T @ jx) * jz).sum() + (czz * (jz @ jz.T)).sum()
            (grad,) = torch.autograd.grad(total, inducing)
        return self._numpy(grad.reshape(m, -1))

    def jvp(self, w: np.ndarray, x: np.ndarray, u: np.ndarray) -> np.ndarray:
        """``J(X)·U`` for the ``r`` columns of ``U`` (``p × r``): ``n·d' × r``, point-major."""
        import torch

        params, inputs = self._unflatten(w), self._inputs(x)

        def one(t: Dict[str, Any], chunk: Any) -> Any:
            return torch.func.jvp(lambda p: self._call(p, chunk), (params,), (t,))[1]

        n, q = x.shape[0], self.output_dim
        out = np.empty((n * q, u.shape[1]))
        with self._lock:
            for start in range(0, u.shape[1], self.block):
                cols = u[:, start:start + self.block]
                tangents = self._columns(cols)
                for p0, p1 in self._point_chunks(n, cols.shape[1]):
                    ju = torch.func.vmap(one, in_dims=(0, None))(tangents, _slice(inputs, p0, p1))  # r × (p1 − p0) × d'
                    out[p0 * q:p1 * q, start:start + cols.shape[1]] = self._numpy(ju.reshape(cols.shape[1], -1)).T
        return out

    def _point_chunks(self, n: int, directions: int) -> List[Tuple[int, int]]:
        """``[start, end)`` chunks of ``n`` points whose ``directions`` tangents of every
        module output take about ``TANGENT_BYTES`` (at least one point a chunk)."""
        import torch

        itemsize = torch.finfo(self.dtype).bits // 8
        size = max(1, TANGENT_BYTES // (directions * self.activations_per_point * itemsize))
        return [(s, min(n, s + size)) for s in range(0, n, size)]

    def vjp(self, w: np.ndarray, x: np.ndarray, l: np.ndarray) -> np.ndarray:
        """``J(X)ᵀ·L`` for the ``r`` point-major cotangent columns of ``L`` (``n·d' × r``): ``p × r``."""
        import torch

        params, xs = self._unflatten(w), self._inputs(x)
        n, q = x.shape[0], self.output_dim
        out = np.empty((int(sum(self.sizes)), l.shape[1]), order="F")
        with self._lock:
            pullback = torch.func.vjp(lambda p: self._call(p, xs), params)[1]
            for start in range(0, l.shape[1], self.block):
                cols = l[:, start:start + self.block]
                cot = torch.from_numpy(np.ascontiguousarray(cols.T)).to(device=self.device, dtype=self.dtype)
                (grads,) = torch.func.vmap(pullback)(cot.reshape(cols.shape[1], n, q))
                self._write_rows(out, start, [grads[name].reshape(cols.shape[1], -1) for name in self.names])
                del grads
        return out

    def _write_rows(self, out: np.ndarray, start: int, blocks: Sequence[Any]) -> None:
        """Writes ``k × size`` per-parameter blocks (model dtype, any device) transposed into
        rows ``offset:offset + size`` and columns ``start:start + k`` of the float64 ``out``
        (column-major), one parameter at a time: numpy widens float32 in buffered chunks, so no
        ``k × p`` copy is formed beside ``out`` (fspace reads ``out`` with one ``memcpy``)."""
        offset = 0
        for block in blocks:
            size = block.shape[1]
            out[offset:offset + size, start:start + block.shape[0]] = block.detach().cpu().numpy().T
            offset += size

    def per_point_vjp(self, w: np.ndarray, x: np.ndarray, l: np.ndarray) -> np.ndarray:
        """Per-sample reverse passes: ``l`` stacks one ``d' × k`` cotangent block per point
        (``n·d' × k``); column ``i·k + c`` of the ``p × n·k`` result is ``Lᵢ[:, c]ᵀ J(xᵢ)``.
        One single-point ``vjp``, vmapped over the block's columns and then over the points,
        in groups of ``block`` points."""
        import torch

        params, xs = self._unflatten(w), self._inputs(x)
        n, q = x.shape[0], self.output_dim
        k = l.shape[1]

        def one(xi: Any, li: Any) -> Any:
            pullback = torch.func.vjp(lambda p: self._call(p, _unsqueeze(xi)), params)[1]
            (grads,) = torch.func.vmap(pullback)(li.T.reshape(k, 1, q))
            return torch.cat([grads[name].reshape(k, -1) for name in self.names], dim=1)  # k × p

        out = np.empty((int(sum(self.sizes)), n * k), order="F")
        cot = torch.from_numpy(np.ascontiguousarray(l.reshape(n, q, k))).to(device=self.device, dtype=self.dtype)
        with self._lock:
            for start in range(0, n, self.block):
                stop = min(n, start + self.block)
                rows = torch.func.vmap(one)(_slice(xs, start, stop), cot[start:stop])  # m × k × p
                self._write_rows(out, start * k, [rows.reshape((stop - start) * k, -1)])
                del rows
        return out

    # -- layer structure (Kronecker factors, last-layer features) ----------------------------

    def layer_infos(self, which: str = "all") -> List[Dict[str, Any]]:
        """The weight layers for Kronecker-factored curvature (``which="all"``) or for the
        last-layer Laplace (``which="last"``), found by forward hooks on one probe input, in the
        order ``forward`` calls them. Each is a dict: ``name``, ``positions`` (1 for a Linear on
        rows; a Linear applied over extra axes shares its weights over them, as a convolution
        over its output positions), ``weight`` / ``bias`` (``[start, end)`` in the flat
        parameters), ``fan_in``, ``fan_out``.

        ``"all"``: every trainable parameter must belong to an ``nn.Linear`` or ``nn.Conv2d``
        called once per ``forward`` (with or without a bias; a frozen bias keeps its value and
        leaves the coordinates, an empty ``bias`` range); a convolution must have ``groups=1``
        and zero padding. Anything else is a ``ValueError`` naming the modules. ``"last"``: the
        ``nn.Linear`` called last, with a trainable bias, whose output must be the model's
        output."""
        import torch

        if which not in ("all", "last"):
            raise ValueError(f"which={which!r} is not 'all' or 'last'")
        offsets = self.offsets
        candidates = {
            name: m for name, m in self.model.named_modules() if isinstance(m, (torch.nn.Linear, torch.nn.Conv2d))
        }
        calls: Dict[str, List[Tuple[Tuple[int, ...], Any]]] = {name: [] for name in candidates}
        order: List[str] = []

        def hook(name: str) -> Any:
            def record(module: Any, inp: Tuple[Any, ...], out: Any) -> None:
                if not calls[name]:
                    order.append(name)
                calls[name].append((tuple(inp[0].shape), out.detach()))

            return record

        handles = [m.register_forward_hook(hook(name)) for name, m in candidates.items()]
        try:
            if self.layout.is_dict or self.layout.fields[0][2] != "float" or np.any(self.probe):
                probe = self._inputs(self.probe)
            else:
                # A random probe: zeros could hide a layer behind a ReLU or a branch.
                shape = (2,) + self.layout.fields[0][1]
                probe = torch.randn(shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
                probe = probe.to(device=self.device, dtype=self.dtype)
            with self._lock, torch.no_grad():
                out = self._call(self._unflatten(self.params), probe)
        finally:
            for h in handles:
                h.remove()

        def qualified(module: str, param: str) -> str:
            return f"{module}.{param}" if module else param

        def info(name: str) -> Dict[str, Any]:
            m = candidates[name]
            (in_shape, layer_out), = calls[name]
            w, b = qualified(name, "weight"), qualified(name, "bias")
            kind = type(m).__name__
            if w not in offsets:
                raise ValueError(
                    f"layer {name or '(model)'} ({kind}) has a frozen weight and a trainable bias: freeze whole layers or none"
                )
            # A layer without a trainable bias (none, or a frozen one, which keeps its value)
            # has the coordinates W alone: an empty bias range.
            bias_range = list(offsets[b]) if b in offsets else [offsets[w][1], offsets[w][1]]
            if isinstance(m, torch.nn.Conv2d):
                if m.groups != 1 or m.padding_mode != "zeros" or isinstance(m.padding, str) and m.padding != "valid":
                    raise ValueError(
                        f"convolution {name} has groups={m.groups}, padding={m.padding!r}, padding_mode={m.padding_mode!r}: "
                        "Kronecker factors need groups=1 and explicit zero padding"
                    )
                positions = int(layer_out.shape[2] * layer_out.shape[3])
                fan_in = int(m.in_channels * m.kernel_size[0] * m.kernel_size[1])
                fan_out = int(m.out_channels)
            else:
                positions = int(np.prod(in_shape[1:-1])) if len(in_shape) > 2 else 1
                fan_in, fan_out = int(m.in_features), int(m.out_features)
            return {"name": name, "positions": positions, "weight": list(offsets[w]), "bias": bias_range,
                    "fan_in": fan_in, "fan_out": fan_out}

        def trainable(name: str) -> bool:
            return qualified(name, "weight") in offsets or qualified(name, "bias") in offsets

        order = [name for name in order if trainable(name)]
        for name in order:
            if len(calls[name]) > 1:
                raise ValueError(
                    f"layer {name} ({type(candidates[name]).__name__}) is called {len(calls[name])} times per forward: "
                    "Kronecker factors need each weight layer applied once"
                )
        if which == "last":
            linears = [n for n in order if isinstance(candidates[n], torch.nn.Linear)]
            if not linears:
                raise ValueError("subset_of_weights='last_layer' needs an nn.Linear as the model's last layer; the model calls none")
            last = linears[-1]
            (in_shape, layer_out), = calls[last]
            if len(in_shape) != 2 or layer_out.shape != out.shape or not torch.equal(layer_out, out):
                raise ValueError(
                    f"subset_of_weights='last_layer': the model's output is not the output of its last nn.Linear ({last}) "
                    "on rows of features"
                )
            if qualified(last, "bias") not in offsets:
                raise ValueError(f"subset_of_weights='last_layer': the last nn.Linear ({last}) has no trainable bias")
            return [info(last)]
        covered = set()
        infos = []
        for name in order:
            infos.append(info(name))
            covered.update({qualified(name, "weight"), qualified(name, "bias")})
        loose: Dict[str, List[str]] = {}
        for pname in self.names:
            if pname not in covered:
                module, _, leaf = pname.rpartition(".")
                loose.setdefault(module, []).append(leaf)
        if loose:
            modules = dict(self.model.named_modules())
            what = "; ".join(
                f"{m or '(model)'} ({type(modules[m]).__name__ if m in modules else '?'}: {', '.join(ps)})"
                + (" — not called by forward" if m in candidates else "")
                for m, ps in loose.items()
            )
            raise ValueError(
                "Kronecker-factored curvature needs every trainable parameter in an nn.Linear or nn.Conv2d that forward "
                f"calls; these are not: {what}. Freeze them (p.requires_grad_(False): they keep their trained values and "
                "leave the posterior), or use hessian_structure 'diag', 'lowrank' or 'full'"
            )
        return infos

    def _layer_modules(self, infos: Sequence[Dict[str, Any]]) -> List[Any]:
        modules = dict(self.model.named_modules())
        return [modules[i["name"]] for i in infos]

    @staticmethod
    def _patches(module: Any, a: Any) -> Any:
        """A layer's input per output position: ``n × T × fan_in`` (im2col for a convolution)."""
        import torch

        if isinstance(module, torch.nn.Conv2d):
            padding: Any = (0, 0) if module.padding == "valid" else module.padding  # layer_infos refused other strings
            cols = torch.nn.functional.unfold(a, module.kernel_size, module.dilation, padding, module.stride)
            return cols.transpose(1, 2)
        return a.reshape(a.shape[0], -1, a.shape[-1])

    @staticmethod
    def _positions_last(module: Any, g: Any) -> Any:
        """A layer's output (or its gradient) per output position: ``n × T × fan_out``."""
        import torch

        if isinstance(module, torch.nn.Conv2d):
            return g.flatten(2).transpose(1, 2)
        return g.reshape(g.shape[0], -1, g.shape[-1])

    def _statistics(self, params: Dict[str, Any], x: np.ndarray, l: np.ndarray, modules: Sequence[Any], infos: Sequence[Dict[str, Any]]) -> List[Tuple[Any, Any]]:
        """Per layer: its inputs (``n·T × fan_in``) and output gradients (``n·k·T ×
        fan_out``) as torch tensors in the model's dtype, on its device (``kfac_statistics``).
        The caller holds the lock."""
        import torch

        n, q, k = x.shape[0], self.output_dim, l.shape[1]
        inputs: List[Any] = [None] * len(modules)
        outputs: List[Any] = [None] * len(modules)

        def hook(j: int) -> Any:
            def record(module: Any, inp: Tuple[Any, ...], out: Any) -> None:
                inputs[j] = self._patches(module, inp[0].detach())
                outputs[j] = out

            return record

        cot = torch.from_numpy(np.ascontiguousarray(l.reshape(n, q, k))).to(device=self.device, dtype=self.dtype)
        handles = [m.register_forward_hook(hook(j)) for j, m in enumerate(modules)]
        try:
            with torch.enable_grad():
                f = self._call(params, self._inputs(x))
                grads: List[List[Any]] = [[] for _ in modules]
                for c in range(k):
                    gs = torch.autograd.grad(f, outputs, cot[:, :, c], retain_graph=c + 1 < k, allow_unused=True)
                    for j, (m, g) in enumerate(zip(modules, gs)):
                        g = torch.zeros_like(outputs[j]) if g is None else g
                        grads[j].append(self._positions_last(m, g))
        finally:
            for h in handles:
                h.remove()
        return [
            (inputs[j].reshape(-1, info["fan_in"]), torch.stack(grads[j], dim=1).reshape(-1, info["fan_out"]))  # (i, c, t) row-major
            for j, info in enumerate(infos)
        ]

    def kfac_statistics(self, w: np.ndarray, x: np.ndarray, l: np.ndarray, infos: List[Dict[str, Any]]) -> List[Tuple[np.ndarray, np.ndarray]]:
        """Per layer of ``infos``: its inputs (``n·T × fan_in``, row ``i·T + t``) and the
        gradients at its outputs (``n·k·T × fan_out``, row ``(i·k + c)·T + t``) of
        ``Σᵢ Lᵢ[:, c]ᵀ f(xᵢ)`` for each column ``c`` of the stacked per-point cotangent blocks
        ``l`` (``n·d' × k``). One forward with hooks, one reverse pass per column."""
        params = {name: t.detach().requires_grad_(True) for name, t in self._unflatten(w).items()}
        with self._lock:
            stats = self._statistics(params, x, l, self._layer_modules(infos), infos)
        return [(self._numpy(a), self._numpy(d)) for a, d in stats]

    def kfac_factor_sums(self, w: np.ndarray, x: np.ndarray, l: np.ndarray, infos: List[Dict[str, Any]], chunk: int) -> List[Tuple[np.ndarray, np.ndarray, int, np.ndarray]]:
        """Per layer of ``infos``: ``(Σ a aᵀ, Σ a, rows, Σ δ δᵀ)`` over the rows of
        ``kfac_statistics`` for all of ``x``, ``chunk`` points at a time. Each chunk's sums are
        formed by torch in the model's dtype on its device (for a float32 model, float32 GEMMs
        over the chunk's ``chunk·T`` rows, as laplace-torch forms its factors: ≈ 1e-7 relative
        error per chunk; only their lower block triangles, ``add_lower_gram``) and added up in
        float64; only the sums come back."""
        import torch

        params = {name: t.detach().requires_grad_(True) for name, t in self._unflatten(w).items()}
        modules = self._layer_modules(infos)
        q = self.output_dim

        def zeros(*shape: int) -> Any:
            return torch.zeros(*shape, device=self.device, dtype=torch.float64)

        sums = [[zeros(i["fan_in"], i["fan_in"]), zeros(i["fan_in"]), 0, zeros(i["fan_out"], i["fan_out"])] for i in infos]
        step = max(1, int(chunk))
        with self._lock:
            for s in range(0, x.shape[0], step):
                e = min(x.shape[0], s + step)
                stats = self._statistics(params, x[s:e], l[s * q : e * q], modules, infos)
                for acc, (a, d) in zip(sums, stats):
                    add_lower_gram(acc[0], a)
                    acc[1] += a.sum(0, dtype=torch.float64)
                    acc[2] += int(a.shape[0])
                    add_lower_gram(acc[3], d)
                del stats
        # Only the lower triangles were summed; the factors come back exactly symmetric (a
        # float32 GEMM's full `aᵀa` is symmetric only to its rounding on some shapes, which the
        # factors' eigendecomposition refuses as asymmetric input).
        return [(self._numpy(mirror_lower(aa)), self._numpy(sa), rows, self._numpy(mirror_lower(gg)))
                for aa, sa, rows, gg in sums]

    def forward_with_features(self, w: np.ndarray, x: np.ndarray, infos: List[Dict[str, Any]]) -> Tuple[np.ndarray, np.ndarray]:
        """``f(X)`` (``n × d'``) and the input of the last layer of ``infos`` (``n × fan_in``),
        from one forward pass with a hook on that layer."""
        return self._hooked_forward(w, x, infos)

    def last_layer_features(self, w: np.ndarray, x: np.ndarray, infos: List[Dict[str, Any]]) -> np.ndarray:
        """The input of the last layer of ``infos`` (``n × fan_in``)."""
        return self._hooked_forward(w, x, infos)[1]

    def _hooked_forward(self, w: np.ndarray, x: np.ndarray, infos: List[Dict[str, Any]]) -> Tuple[np.ndarray, np.ndarray]:
        import torch

        (module,) = self._layer_modules(infos[-1:])
        feats: List[Any] = []
        with self._lock, torch.no_grad():
            handle = module.register_forward_hook(lambda m, inp, out: feats.append(inp[0].detach()))
            try:
                f = self._call(self._unflatten(w), self._inputs(x))
            finally:
                handle.remove()
        return self._numpy(f), self._numpy(feats[-1].reshape(x.shape[0], -1))

    def state_dict(self, w: np.ndarray) -> Dict[str, np.ndarray]:
        """Flat weights as the model's named parameters (float64 arrays)."""
        return {
            name: np.asarray(w[slice(*self.offsets[name])]).reshape(shape).copy()
            for name, shape in zip(self.names, self.shapes)
        }
