"""``_NetworkMethod``: the construction and the fitting routes of the network methods
(FSP-Laplace, GFSVI, VaLLA, ELLA) — arrays in memory, rows read by position, batches, a process
group — each chosen by what the method's compiled class reads (its ``capabilities``)."""

from __future__ import annotations

import copy
import threading
from collections import OrderedDict
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from . import _fspace
from ._backend import network_spec
from ._convert import (batch_arrays, data_arrays, dataset_size, is_array, readable_by_position, reread_weights, tensors,
                       unflatten)
from ._distributed import _group, agree_on, agreed, global_box, sharded_sum, step_reduce, weights_summary
from ._torch import TorchModel
from ._method_base import (Progress, _changed, _Fitted, _overlay, _Progress, _prior, _schedule,
                           _schedule_holder)


class _NetworkMethod(_Fitted):
    _learn_sigma_default = False
    _transient = ("_post", "_model", "_fitter", "_fitter_key")

    def __init__(self, model: Any, likelihood: str, gp_prior: Any = None, sigma_noise: float = 1.0,
                 learn_sigma: Optional[bool] = None, epochs: Optional[int] = None,
                 steps: Optional[int] = None, evaluate_every: Optional[int] = None,
                 patience: Any = "default", input_shape: Any = None, backend: str = "auto",
                 dict_key_x: str = "input_ids", dict_key_y: str = "labels", **options: Any) -> None:
        self._spec = network_spec(model, input_shape, backend)
        self._model = model
        self._torch = isinstance(self._spec, TorchModel)
        # Dict batches (HuggingFace): a torch model gets the dict without the targets, as
        # laplace-torch hands it over; a native network the array under dict_key_x.
        self.dict_key_x, self.dict_key_y = dict_key_x, dict_key_y
        if self._torch:
            self._spec.skip_keys = (dict_key_y,)
        self._tensors, self._layout = tensors({} if self._torch else self._spec.state)
        self._prior = None if gp_prior is None else _prior(gp_prior)
        self.likelihood = likelihood
        self.sigma_noise = float(sigma_noise)
        self.learn_sigma = self._learn_sigma_default if learn_sigma is None else bool(learn_sigma)
        config = _overlay(self._rust.defaults(), options, type(self).__name__)
        holder = _schedule_holder(config)
        if holder is not None:
            holder["schedule"] = _schedule(holder["schedule"], epochs, steps, evaluate_every, patience)
        elif any(v is not None for v in (epochs, steps, evaluate_every)) or patience != "default":
            raise TypeError(f"{type(self).__name__} has no training schedule (epochs, steps, evaluate_every, patience)")
        given = options.get("schedule", options.get("optim", {}).get("schedule", {}))
        self._patience_given = patience != "default" or (isinstance(given, dict) and "patience" in given)
        self._config = config
        self._given = set(options)
        self._lock = threading.RLock()
        self._post = None
        self._report: Dict[str, Any] = {}
        self._fitter: Any = None
        self._fitter_key: Any = None
        self._compiled()

    def _compiled(self) -> Any:
        """The compiled method object, made from the settings (read and checked, each error
        naming its setting, when the object is made) and made again only where a public
        attribute it was made from (``train``, ``likelihood``, ``sigma_noise``, ``learn_sigma``)
        has changed since, or after unpickling."""
        key = (self._rust_class(), self.likelihood, self.sigma_noise, self.learn_sigma)
        if getattr(self, "_fitter", None) is None or self._fitter_key != key:
            self._fitter = self._rust_class()(
                likelihood=self.likelihood, prior=None if self._prior is None else self._prior.spec(),
                settings=self._config, sigma_noise=self.sigma_noise, learn_sigma=self.learn_sigma,
            )
            self._fitter_key = key
        return self._fitter

    def _fit_with(self, source: Any, config: Dict[str, Any], progress: Any) -> Any:
        """``(posterior, report)`` of the compiled fit of ``source`` at the model's weights now,
        with the settings that ``config`` changes for this fit."""
        return self._compiled().fit(source, network=self._network(), settings=_changed(self._config, config),
                                    progress=progress)

    def _adapt(self, config: Dict[str, Any], x: np.ndarray, has_val: bool) -> None:
        """Settings that depend on the data, where the user left them at their default."""

    def _inputs(self, x: Any, what: str) -> np.ndarray:
        return self._spec.inputs(x, what)

    def fit(self, data: Any, y: Any = None, val: Any = None, progress: Progress = None,
            progress_bar: bool = False, process_group: Any = None) -> None:
        """Fits the method.

        Parameters
        ----------
        data : array_like, torch.Tensor or DataLoader
            The inputs ``X`` (with ``y``), or a loader of ``(x, y)`` or dict batches. Post-hoc
            FSP-Laplace streams a loader (each batch added to Alg. 2's ``k × k`` sum in Rust,
            after a pass for the data's box unless ``context_box`` is given), and so does ELLA
            without early stopping (each batch added to ``G``'s ``K × K`` sum, after a pass that
            gathers the Nyström rows). FSP-Laplace's and GFSVI's training read a ``DataLoader``
            over a map-style data set by position (each step's minibatch through the data set
            and the loader's ``collate_fn``, after a pass for the box): the fit of the same rows
            in memory, to the bit. VaLLA, a one-shot iterator, a loader that does not cover its
            data set once per pass, a sharded training, context points taken from the data and
            ELLA's early stopping collect it in memory.
        y : array_like or torch.Tensor, optional
            The targets: ``n × d'`` (regression) or class indices ``n`` (classification).
        val : tuple or DataLoader, optional
            ``(X_val, y_val)`` or a loader: early stopping as the paper (without it the whole
            schedule runs).
        progress : bool or callable, optional
            ``True`` for a progress bar, or ``progress(step, total, loss, validation)``.
        progress_bar : bool, default False
            laplace-torch's name for ``progress=True``.
        process_group : torch.distributed group or mpi4py communicator, optional
            FSP-Laplace, GFSVI and VaLLA shard over it: each process passes its own points and
            every process ends with the posterior of all the points (``docs/scaling-out.md``).
            Post-hoc FSP-Laplace all-reduces its one sum over the data; FSP-Laplace's training
            all-reduces every step's data term (the prior's term is the same on every process
            and counted once) and early-stops on every process's ``val`` points together;
            GFSVI all-reduces every step's data term, its minibatches drawn over the
            global rows — the processes' rows in process order, so contiguous shards give the
            single-process run — and early-stops on every process's ``val`` points together (a
            process may have none). VaLLA clusters its inducing points over
            every process's points, all-reduces every step's data term (the same global rows and
            order as GFSVI) and early-stops on every process's ``val`` points together (a
            process may have none). ``None``: torch.distributed's default group when it is
            initialised with more than one process; ``False``: this process alone. ``ELLA`` and
            ``ExactGP`` fit on one process (laplace-torch's ELLA, ``Laplace(..., "gp")``, shards).

        Returns
        -------
        None

        Raises
        ------
        ValueError
            Inputs or targets that are not finite, of the wrong shape, empty, or a loader whose
            batches are not ``(x, y)`` pairs.
        MemoryError
            A setting past the memory budget (the message names a cheaper choice).
        KeyboardInterrupt
            Ctrl-C: the object keeps its earlier state.
        """
        group = _group(process_group)
        reads = self._rust_class().capabilities
        if reread_weights(self._spec, self._model):
            # The model's weights as they are now (a model trained after this object was made).
            self._tensors, self._layout = tensors(self._spec.state)
        if group is not None and not reads.shards:
            raise NotImplementedError(
                f"{type(self).__name__} fits on one process, and torch.distributed (or the given group) has "
                "several: shard FSP-Laplace, GFSVI, VaLLA or Laplace, or pass process_group=False to fit this "
                "process's data alone"
            )
        if self._fit_streamed(data, y, val, group, True if progress_bar and progress is None else progress):
            return
        # The trained methods early-stop on every process's validation points: they do when any
        # process has some.
        val_anywhere = val is not None
        if group is not None and reads.shards_each_step:
            val_anywhere = bool(group.all_reduce(np.array([float(val is not None)]), "max")[0] > 0)

        def prepare() -> Any:
            keys = self._dict_keys
            x, yy = data_arrays(data, y, self._spec.inputs, keys)
            config = copy.deepcopy(self._config)
            xv = yv = None
            if val is not None:
                if isinstance(val, tuple):
                    xv, yv = data_arrays(val[0], val[1], self._spec.inputs)
                else:
                    xv, yv = data_arrays(val, None, self._spec.inputs, keys)
            elif not val_anywhere:
                self._without_validation(config)
            self._adapt(config, x, val is not None)
            if group is not None:
                # Checked before the processes exchange the data's box, which a NaN would spoil
                # on every process.
                for what, values in (("training inputs", x), ("training targets", yy)):
                    if not np.all(np.isfinite(values)):
                        raise ValueError(f"non-finite value in {what}")
            return x, yy, config, xv, yv

        # Sharded: a process whose data are refused here tells the others before they wait.
        x, yy, config, xv, yv = prepare() if group is None else agreed(group, prepare)
        process = None
        key = self._box_setting
        if group is not None and key is not None and config.get(key) is None:
            # The context / measurement box of every process's points, as one process over all
            # of them draws in; first, so that the agreement below covers the settings with it.
            lo, hi = global_box(group, x)
            config[key] = self._box(lo, hi, config)
        if group is not None and reads.shards_each_step:
            agree_on(group, self._fingerprint(config, x.shape[1]),
                     f"the processes disagree on the model, the prior or the {self._rust_class().name} settings: "
                     "give every process the same ones")
            process = (group.rank, group.size)
        if self._torch and self.likelihood == "classification":
            self._spec.calls().check_classifier()
        if progress_bar and progress is None:
            progress = True
        bar = _Progress(progress, type(self).__name__)

        def compute(reduce: Any = None) -> Any:
            source = _fspace.DataSource.memory(x, yy, x_val=xv, y_val=yv, reduce=reduce, process=process)
            return self._fit_with(source, config, bar.callback)

        def run() -> Any:
            if group is None:
                return compute()
            if process is not None:
                # Every step's data term is all-reduced (a failure flag with it).
                return compute(step_reduce(group))
            return sharded_sum(group, compute)

        self._keep_fit(bar, run)

    def _fit_streamed(self, data: Any, y: Any, val: Any, group: Any, progress: Progress) -> bool:
        """Fits from a loader one batch at a time where the method can (post-hoc FSP-Laplace
        over its batches, FSP-Laplace's and GFSVI's training over its rows read by position;
        ``ELLA`` overrides it); returns whether it did."""
        reads = self._rust_class().capabilities
        if reads.batches and self._streams(data, y, val):
            self._fit_batches(data, group, progress)
            return True
        if (reads.rows and group is None and self._streams(data, y, None)
                and readable_by_position(data) and (val is None or isinstance(val, tuple)
                                                    or readable_by_position(val))):
            self._fit_rows(data, val, progress)
            return True
        return False

    def _keep_fit(self, bar: "_Progress", compute: Callable[[], Tuple[Any, Any]]) -> None:
        """Runs ``compute()`` under the object's lock and keeps the ``(posterior, report)`` it
        returns; the progress bar is closed either way, and a failure leaves the earlier fit."""
        with self._lock:
            try:
                post, report = compute()
            finally:
                bar.close()
            self._post, self._report = post, report

    def _without_validation(self, config: Dict[str, Any]) -> None:
        """The paper's early stopping needs validation data; without it the whole schedule runs
        (unless the user set a patience)."""
        holder = _schedule_holder(config)
        if holder is not None and not self._patience_given and holder["schedule"].get("patience") is not None:
            holder["schedule"] = dict(holder["schedule"], patience=None)

    def _row_reader(self, loader: Any) -> Tuple[Callable[[np.ndarray], Tuple[np.ndarray, np.ndarray]], int]:
        """``(read, n)``: ``read(positions)`` reads those rows of the loader's data set as its own
        fetcher does (``__getitems__`` where the data set has it, else one ``dataset[i]`` per
        row, then the loader's ``collate_fn``) and converts the batch as a loader batch."""
        dataset, collate = loader.dataset, loader.collate_fn
        many = getattr(dataset, "__getitems__", None)

        def read(positions: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
            at = positions.tolist()
            items = many(at) if many else [dataset[i] for i in at]
            return batch_arrays(collate(items), self._spec.inputs, self._dict_keys)

        return read, len(dataset)

    def _fit_rows(self, loader: Any, val: Any, progress: Progress) -> None:
        """FSP-Laplace (Alg. 1 and Alg. 2) or GFSVI from a loader over a map-style data set with
        one minibatch in memory: a pass for the data's box (unless ``context_box`` /
        ``measurement_box`` is given), then Rust reads each training step's minibatch — the
        positions an in-memory fit of the same rows draws, so the same weights and posterior —
        and FSP-Laplace's Alg. 2 its chunks, by position (``fspace_fsp_laplace::fit_rows``,
        ``fspace_gfsvi::fit_rows``). A validation loader is read the same way, ``batch_size`` rows
        at a time; ``(X_val, y_val)`` are held."""
        read, n = self._row_reader(loader)
        if n == 0:
            raise ValueError("the data loader's data set is empty")
        config = copy.deepcopy(self._config)
        key = self._box_setting
        assert key is not None  # the methods that read rows by position have a box
        if config.get(key) is None:
            config[key] = self._box(*self._loader_box(loader), config)
        else:
            read(np.zeros(1, dtype=np.int64))  # a torch model learns its input layout from a row
        self._adapt(config, np.zeros((0, len(config[key]["lower"]))), val is not None)
        xv = yv = val_rows = None
        if isinstance(val, tuple):
            xv, yv = data_arrays(val[0], val[1], self._spec.inputs)
        elif val is not None:
            val_rows = self._row_reader(val)
        else:
            self._without_validation(config)
        if self._torch and self.likelihood == "classification":
            self._spec.calls().check_classifier()
        bar = _Progress(progress, type(self).__name__)
        self._keep_fit(bar, lambda: self._fit_with(
            _fspace.DataSource.rows(read, n, x_val=xv, y_val=yv, val_rows=val_rows), config, bar.callback))

    def _loader_box(self, loader: Any) -> Tuple[np.ndarray, np.ndarray]:
        """The box ``[lo, hi]`` of a loader's inputs, in one pass with one batch in memory."""
        lo: Optional[np.ndarray] = None
        hi: Optional[np.ndarray] = None
        for k, (x, _) in enumerate(self._loader_batches(loader), 1):
            if not np.all(np.isfinite(x)):
                raise ValueError("non-finite value in training inputs")
            if x.shape[0] == 0:
                continue
            if lo is not None and x.shape[1] != lo.shape[0]:
                raise ValueError(f"batch {k} of the data loader has {x.shape[1]} input columns; the batches before it "
                                 f"had {lo.shape[0]}: every batch must have the same widths")
            lo = x.min(axis=0) if lo is None else np.minimum(lo, x.min(axis=0))
            hi = x.max(axis=0) if hi is None else np.maximum(hi, x.max(axis=0))
        if lo is None or hi is None:
            raise ValueError("the data loader yielded no batch")
        return lo, hi

    def _loader_batches(self, loader: Any) -> Any:
        """A pass over ``loader``: each ``(x, y)`` or dict batch as arrays (a torch model takes a
        dict batch whole, a native network the array under ``dict_key_x``)."""
        for batch in loader:
            yield batch_arrays(batch, self._spec.inputs, self._dict_keys)

    @property
    def _dict_keys(self) -> Tuple[Optional[str], str]:
        """How a dict batch is read: the inputs under ``dict_key_x`` (``None`` for a torch model,
        which takes the dict whole) and the targets under ``dict_key_y``."""
        return (None if self._torch else self.dict_key_x, self.dict_key_y)

    def _network(self) -> Any:
        """The network as the compiled module takes it: a torch model's callbacks, or a native
        network's tensors, activation and architecture."""
        if self._torch:
            return _fspace.Network.torch(self._spec.calls())
        return _fspace.Network.native(self._tensors, self._spec.activation, self._spec.architecture_dict())

    #: The setting that holds the box the method draws its points in (FSP-Laplace's context
    #: points, GFSVI's measurement points), taken from the data where it is not given.
    _box_setting: Optional[str] = None

    def _box(self, lo: np.ndarray, hi: np.ndarray, config: Dict[str, Any]) -> Dict[str, Any]:
        """The ``_box_setting`` of the data's box ``[lo, hi]``."""
        return {"lower": lo.tolist(), "upper": hi.tolist()}

    def _streams(self, data: Any, y: Any, val: Any) -> bool:
        """Whether post-hoc FSP-Laplace takes ``data`` batch by batch: a loader that can be
        iterated again (a first pass finds the data's box unless ``context_box`` is given),
        with context points that do not come from the data (``context_includes_data``,
        ``design="Dataset"`` and ``truncate_at_data`` need all of it in memory)."""
        config = self._config
        return (
            y is None and val is None and not is_array(data) and iter(data) is not data
            and not config.get("context_includes_data") and config.get("design") != "Dataset"
            and not config.get("laplace", {}).get("truncate_at_data")
        )

    def _fit_batches(self, loader: Any, group: Any, progress: Progress) -> None:
        """Post-hoc FSP-Laplace over a loader with one batch in memory: a pass for the data's
        box (unless ``context_box`` is given), steps 1–3 of Alg. 2 from the context points, one
        pass adding each batch to step 4's ``k × k`` sum in Rust, and steps 5–6 — the posterior
        of the fit over all the points, up to the order of the additions. Over a process group
        each process streams its own loader and the sums are all-reduced before steps 5–6."""
        def batches() -> Any:
            return self._loader_batches(loader)

        def box() -> Tuple[np.ndarray, np.ndarray]:
            return self._loader_box(loader)

        config = copy.deepcopy(self._config)
        key = self._box_setting
        assert key is not None  # the methods that read batches (post-hoc FSP-Laplace) have a box
        if config.get(key) is None:
            lo, hi = box() if group is None else agreed(group, box)
            if group is not None:
                lo, hi = global_box(group, np.stack([lo, hi]))
            config[key] = self._box(lo, hi, config)
        dim = len(config[key]["lower"])
        self._adapt(config, np.zeros((0, dim)), False)
        if group is not None:
            agree_on(group, self._fingerprint(config, dim),
                     "the processes disagree on the model, the prior or the FSP-Laplace settings: give every process "
                     "the same ones")
        if self._torch and self.likelihood == "classification":
            self._spec.calls().check_classifier()
        total = dataset_size(loader) or 0
        bar = _Progress(progress, type(self).__name__, unit="point")

        def compute(reduce: Any = None) -> Any:
            # Rust pulls the batches and gathers the small ones to Alg. 2's chunk
            # (``laplace.data_batch`` points), so it multiplies in the in-memory fit's chunks.
            return self._fit_with(_fspace.DataSource.batches(batches, total=total, reduce=reduce), config,
                                  bar.callback)

        self._keep_fit(bar, lambda: compute() if group is None else sharded_sum(group, compute))

    def _fingerprint(self, config: Dict[str, Any], dim: int) -> List[float]:
        """What every process of a sharded fit must share: the network's weights (a summary),
        the settings and the prior (their canonical JSON, hashed) and the input dimension."""
        import hashlib
        import json

        weights = [v[1] for v in self._tensors.values()] if not self._torch else [self._spec.calls().params]
        text = json.dumps([self._rust_class().name, self.likelihood, self.sigma_noise, self.learn_sigma, config,
                           None if self._prior is None else self._prior.spec()], sort_keys=True, default=str)
        digest = hashlib.sha256(text.encode()).digest()
        return [float(dim), *weights_summary(weights),
                *[float(int.from_bytes(digest[i:i + 6], "little")) for i in range(0, 24, 6)]]

    def model_state_dict(self) -> "OrderedDict[str, np.ndarray]":
        """The network's weights after the fit (float64), under the model's parameter names.

        Returns
        -------
        collections.OrderedDict of numpy.ndarray
            The trained weights where the method trains them (FSP-Laplace, GFSVI's mean), the
            given ones otherwise. Load them with
            ``model.load_state_dict({k: torch.from_numpy(v) for k, v in ...})``.
        """
        trained = self._ensure().trained_params()
        if self._torch:
            calls = self._spec.calls()
            return OrderedDict(calls.state_dict(calls.params if trained is None else trained))
        if trained is None:
            return OrderedDict((name, self._tensors[name][1].reshape(shape).copy()) for name, shape in self._layout)
        return unflatten(trained, self._layout)


