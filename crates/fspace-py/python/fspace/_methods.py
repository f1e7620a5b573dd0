"""The function-space methods, in the wrapper pattern every fspace method shares (``_base``).

``FSPLaplace``, ``GFSVI``, ``VaLLA``, ``ELLA`` and ``ExactGP``: construct, ``fit(X, y)`` (arrays,
tensors or a loader; ``val=(X_val, y_val)`` for early stopping; ``progress=`` a callable or
``True`` for a tqdm bar; returns ``None``), then ``model(X)`` → ``(f_mean, f_var)``
(regression) or class probabilities (classification), ``predictive_samples(X, n)``,
``state_dict()`` / ``load_state_dict()``, ``pickle``. Each method's remaining settings are
keyword arguments named as the fields of its Rust ``Config`` (``default_config()`` lists them
with the paper's values); an unknown name is a ``TypeError`` that lists the known ones.
"""

from __future__ import annotations

import copy
import threading
from collections import OrderedDict
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import numpy as np

from . import _fspace
from ._backend import network_spec
from ._base import Wrapper
from ._convert import (array2, back, batch_arrays, data_arrays, dataset_size, is_array, is_torch,
                       readable_by_position, reread_weights, tensors, unflatten)
from ._predictive import sample_count
from ._distributed import _group, agree_on, agreed, global_box, sharded_sum, step_reduce, weights_summary
from ._torch import TorchModel
from .kernels import Kernel, MatrixKernel

__all__ = ["GPPrior", "FSPLaplace", "GFSVI", "VaLLA", "ELLA", "ExactGP", "default_config"]

Progress = Union[None, bool, Callable[[int, int, Optional[float], Optional[float]], Any]]

#: ``default_config``'s public names of the methods' compiled classes.
_RUST_CLASSES: Dict[str, Any] = {
    "fsp_laplace": _fspace.FspLaplace, "gfsvi": _fspace.Gfsvi, "valla": _fspace.Valla, "ella": _fspace.Ella,
}


def _changed(base: Any, new: Any) -> Any:
    """The part of the settings ``new`` that differs from ``base`` (dicts compared key by key):
    the settings a fit lays over the ones its compiled object holds."""
    if isinstance(base, dict) and isinstance(new, dict) and set(new) >= set(base):
        out = {}
        for key, value in new.items():
            if key not in base:
                out[key] = value
            elif value != base[key]:
                nested = isinstance(value, dict) and not _is_variant(value)
                out[key] = _changed(base[key], value) if nested else value
        return out
    return new


class GPPrior:
    """A Gaussian-process prior ``GP(mean, kernel)`` over the network's function.

    Parameters
    ----------
    kernel : fspace.kernels.MatrixKernel
        A scalar kernel, or ``Independent`` / ``Helmholtz`` for several outputs.
    mean : float, default 0.0
        A constant prior mean.

    Raises
    ------
    TypeError
        ``kernel`` is not a ``fspace.kernels`` kernel.

    Examples
    --------
    >>> import fspace
    >>> prior = fspace.GPPrior(fspace.kernels.Matern52(1.0, 0.5), mean=0.0)
    >>> prior.output_dim
    1
    """

    def __init__(self, kernel: MatrixKernel, mean: float = 0.0) -> None:
        if not isinstance(kernel, MatrixKernel):
            raise TypeError(f"GPPrior needs a fspace.kernels kernel, got {kernel!r}")
        self.kernel, self.mean = kernel, float(mean)

    @property
    def output_dim(self) -> int:
        """The number of outputs ``d'`` (the kernel's)."""
        return self.kernel.output_dim

    def spec(self) -> Dict[str, Any]:
        """The prior as the dict of fspace's ``GpPrior`` (what crosses to Rust).

        Returns
        -------
        dict
            ``{"kernel": ..., "mean": ...}``.
        """
        mean: Any = "zero" if self.mean == 0.0 else {"constant": self.mean}
        return {"kernel": self.kernel.spec(), "mean": mean}

    def __repr__(self) -> str:
        return f"GPPrior({self.kernel!r}, mean={self.mean})"


def _prior(prior: Any) -> GPPrior:
    if isinstance(prior, GPPrior):
        return prior
    if isinstance(prior, MatrixKernel):
        return GPPrior(prior)
    raise TypeError(f"prior must be a fspace.GPPrior or a fspace.kernels kernel, got {prior!r}")


def default_config(method: str) -> Dict[str, Any]:
    """The default settings of a method: the paper's values, the fields of its Rust ``Config``.

    Parameters
    ----------
    method : {"fsp_laplace", "gfsvi", "valla", "ella"}

    Returns
    -------
    dict
        Every setting; pass any of them to the method's class as a keyword to change it.

    Raises
    ------
    ValueError
        An unknown method.

    Examples
    --------
    >>> import fspace
    >>> fspace.default_config("valla")["num_inducing"]
    100
    """
    rust = _RUST_CLASSES.get(method)
    if rust is None:
        raise ValueError(f"method {method!r} is not one of {', '.join(map(repr, _RUST_CLASSES))}")
    return rust.defaults()


def _is_variant(value: Dict[str, Any]) -> bool:
    """Whether a dict is a Rust enum's variant (``{"Epochs": 5}``, ``{"Fixed": 1.0}``): replaced
    whole by a setting, where a struct's dict is overlaid field by field."""
    return len(value) == 1 and next(iter(value))[:1].isupper()


def _overlay(base: Dict[str, Any], options: Dict[str, Any], where: str) -> Dict[str, Any]:
    out = dict(base)
    for key, value in options.items():
        if key not in base:
            known = ", ".join(sorted(base))
            raise TypeError(f"{where} has no setting {key!r}; the settings are: {known}")
        if isinstance(base[key], dict) and isinstance(value, dict) and not _is_variant(base[key]):
            out[key] = _overlay(base[key], value, f"{where}.{key}")
        else:
            out[key] = value
    return out


def _count(value: Any, what: str) -> int:
    """A positive whole number of epochs, steps or evaluations."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{what} {value!r} must be a whole number ≥ 1")
    return int(value)


def _span(value: Any, unit: str) -> Dict[str, int]:
    if isinstance(value, dict):
        return value
    return {unit: _count(value, "evaluate_every")}


def _schedule(base: Dict[str, Any], epochs: Optional[int], steps: Optional[int],
              evaluate_every: Optional[int], patience: Any) -> Dict[str, Any]:
    """The Rust ``Schedule`` with the shortcuts: a length in epochs or steps, an evaluation
    interval in the same unit, and the patience (evaluations without improvement; ``None``: off)."""
    out = dict(base)
    if epochs is not None and steps is not None:
        raise ValueError("give epochs or steps, not both")
    unit = "Epochs" if epochs is not None else "Steps" if steps is not None else next(iter(base["length"]))
    if epochs is not None:
        out["length"] = {"Epochs": _count(epochs, "epochs")}
    if steps is not None:
        out["length"] = {"Steps": _count(steps, "steps")}
    if evaluate_every is not None:
        out["evaluate_every"] = _span(evaluate_every, unit)
    elif epochs is not None or steps is not None:
        # A length in another unit than the default's: evaluate at its end (and every unit).
        every_unit = next(iter(base["evaluate_every"]))
        if every_unit != unit:
            out["evaluate_every"] = {unit: 1}
    if patience != "default":
        out["patience"] = None if patience is None else _count(patience, "patience")
    return out


def _widened_box(lo: np.ndarray, hi: np.ndarray, config: Dict[str, Any]) -> Dict[str, Any]:
    """The data's box ``[lo, hi]`` widened by ``widen`` times its range on each side, as Rust
    widens it (``BoundingBox::from_data``)."""
    widen = float(config.get("widen", 0.5))
    return {"lower": (lo - widen * (hi - lo)).tolist(), "upper": (hi + widen * (hi - lo)).tolist()}


def _schedule_holder(config: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """The dict of ``config`` that holds its ``schedule`` (top level, or GFSVI's ``optim``)."""
    if "schedule" in config:
        return config
    optim = config.get("optim")
    if isinstance(optim, dict) and "schedule" in optim:
        return optim
    return None


def _holds_torch(x: Any) -> bool:
    """Whether results go back as torch tensors: ``x`` is one, or a dict batch holding one."""
    from collections.abc import Mapping

    if isinstance(x, Mapping):
        return any(is_torch(v) for v in x.values())
    return is_torch(x)


class _Progress:
    """A fit's progress reports: a user callable, a tqdm bar (``True``, when tqdm is
    installed; otherwise a line per report on stderr) or nothing."""

    def __init__(self, progress: Progress, title: str, unit: str = "step") -> None:
        self.callback: Optional[Callable[..., Any]] = None
        self.bar: Any = None
        self.title = title
        self.passes = 1
        if callable(progress):
            self.callback = progress
        elif progress:
            try:
                from tqdm.auto import tqdm

                self.bar = tqdm(desc=title, unit=unit)
                self.callback = self._tqdm
            except ImportError:
                import sys

                def line(step: int, total: int, loss: Optional[float], val: Optional[float]) -> None:
                    print(f"{title}: {step}/{total} loss {loss} validation {val}", file=sys.stderr)

                self.callback = line

    def _tqdm(self, step: int, total: int, loss: Optional[float], val: Optional[float]) -> None:
        if step < self.bar.n:
            # A new pass over the data (the Laplace fit counts each pass from 0).
            self.passes += 1
            self.bar.reset(total=total)
            self.bar.set_description(f"{self.title} (pass {self.passes})")
        if self.bar.total != total:
            self.bar.total = total
        self.bar.update(step - self.bar.n)
        post = {}
        if loss is not None:
            post["loss"] = f"{loss:.4g}"
        if val is not None:
            post["val"] = f"{val:.4g}"
        self.bar.set_postfix(post)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class _Fitted(Wrapper):
    """The calls every function-space method shares once fitted."""

    #: The method's compiled class (``fspace._fspace.FspLaplace``, …): its settings, what it
    #: reads (``capabilities``) and its fit.
    _rust: Any = None
    _title = ""
    _transient: Tuple[str, ...] = ("_post",)
    likelihood: str
    _post: Any
    _report: Dict[str, Any]

    def _is_fitted(self) -> bool:
        return getattr(self, "_post", None) is not None

    def _rust_class(self) -> Any:
        """The compiled class this object fits with."""
        return self._rust

    def _inputs(self, x: Any, what: str) -> np.ndarray:
        return array2(x, what)

    def _ensure(self) -> Any:
        if getattr(self, "_post", None) is None:
            raise RuntimeError(f"call fit(X, y) first: this {type(self).__name__} is not fitted")
        return self._post

    def __call__(self, x: Any, pred_type: str = "glm", link_approx: str = "probit",
                 n_samples: int = 100, seed: int = 0) -> Any:
        """The predictive at ``x`` (the linearised one).

        Parameters
        ----------
        x : array_like or torch.Tensor
            ``n`` inputs.
        pred_type : {"glm"}, default "glm"
        link_approx : {"probit", "bridge", "mc"}, default "probit"
            Classification: how class probabilities are taken from the Gaussian over logits.
        n_samples : int, default 100
            Draws of ``link_approx="mc"``.
        seed : int, default 0
            The seed of those draws.

        Returns
        -------
        tuple or array
            Regression ``(f_mean, f_var)``, ``n × d'`` each; classification the class
            probabilities ``n × C``. Torch in, torch out; numpy otherwise.

        Raises
        ------
        RuntimeError
            Before ``fit``.
        ValueError
            Inputs that are not finite or of the wrong width.
        """
        post = self._ensure()
        if pred_type != "glm":
            raise ValueError(f"pred_type {pred_type!r}: {type(self).__name__} has the linearised (\"glm\") predictive only")
        xa = self._inputs(x, "X")
        if self.likelihood == "classification":
            out = post.class_probabilities(xa, link_approx, sample_count(n_samples), int(seed))
        else:
            out = post.predict(xa)
        return back(out, _holds_torch(x))

    predictive = __call__

    def predictive_samples(self, x: Any, n_samples: int = 100, seed: int = 0) -> Any:
        """Joint draws of ``f`` at the rows of ``x``.

        Parameters
        ----------
        x : array_like or torch.Tensor
            ``n`` inputs.
        n_samples : int, default 100
        seed : int, default 0

        Returns
        -------
        array or torch.Tensor, shape (n_samples, n, d')
        """
        out = self._ensure().sample_functions(self._inputs(x, "X"), sample_count(n_samples), int(seed))
        return back(out, _holds_torch(x))

    @property
    def report(self) -> Dict[str, Any]:
        """What the fit did (iterations, timings, chosen hyperparameters), from Rust's report."""
        self._ensure()
        return self._report

    def _check_picklable(self) -> None:
        if getattr(self, "_torch", False):
            raise TypeError(
                f"a {type(self).__name__} on a torch model's callbacks cannot be pickled: save the model with torch and refit"
            )

    def state_dict(self) -> Dict[str, Any]:
        """What the fit produced: ``cls_name``, ``method``, ``likelihood``, ``report`` and the
        posterior as fspace's checked, versioned JSON under ``fspace_posterior`` (the network's
        weights inside it).

        Returns
        -------
        dict
            Restore with ``load_state_dict`` on an object built with the same arguments; the
            trained weights as a model ``state_dict`` are ``model_state_dict()``.
        """
        post = self._ensure()
        with self._lock:
            return dict(cls_name=type(self).__name__, method=post.method, likelihood=self.likelihood,
                        report=copy.deepcopy(self._report), fspace_posterior=post.to_json())

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Restores a ``state_dict()`` taken from a fitted object of the same class and likelihood.

        Parameters
        ----------
        state_dict : dict
            From ``state_dict()``; the posterior is checked as every fspace load is.

        Raises
        ------
        ValueError
            Another class or likelihood, or a tampered posterior (the message names the field).
        """
        if state_dict.get("cls_name") != type(self).__name__:
            raise ValueError(f"the state_dict is of a {state_dict.get('cls_name')!r}, not of a {type(self).__name__}")
        if state_dict.get("likelihood") != self.likelihood:
            raise ValueError(f"the state_dict's likelihood {state_dict.get('likelihood')!r} is not {self.likelihood!r}")
        if "fspace_posterior" not in state_dict:
            raise ValueError("the state_dict holds no fspace_posterior: it was not saved by state_dict()")
        post = self._rust_class().load_posterior(state_dict["fspace_posterior"])
        with self._lock:
            self._post = post
            self._report = copy.deepcopy(state_dict.get("report", {}))


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


class FSPLaplace(_NetworkMethod):
    """FSP-Laplace (Cinquin et al. 2024): trains the network under the GP ``prior`` (Alg. 1:
    the negative log likelihood plus the prior's RKHS norm at context points), then the
    matrix-free Laplace approximation of the same objective (Alg. 2). ``train=False`` skips
    Alg. 1 and runs Alg. 2 at the given weights (post hoc). ``model_state_dict()`` returns the
    trained weights. Settings: ``epochs``/``steps``, ``batch_size``, ``learning_rate``,
    ``n_context``, ``n_laplace_context``, ``design``, ``laplace={"max_rank": …}``,
    ``context_box={"lower": […], "upper": […]}``, ``widen``, … (the fields of Rust's
    ``FspConfig``).

    The prior acts at context points in a box (default: the data's box widened by half its
    range on each side): inside it the variance reverts to the prior's away from the data;
    outside it nothing bounds the linearised network's variance. Set ``context_box`` or
    ``widen`` to cover every input you will predict at.

    The Laplace step's context points (``design``) are a regular grid for inputs of one or
    two dimensions (the paper's toys) and the Halton sequence otherwise (the paper's MNIST
    runs; a grid of ``n_laplace_context`` points exists only for perfect powers of the
    dimension), unless ``design`` is given; ``design="Dataset"`` draws them from the training
    inputs (seeded by ``design_seed``), for inputs where a box means nothing (token ids).
    Dict batches (HuggingFace) are read as by ``fspace.Laplace``: a torch model gets the dict
    without ``dict_key_y``. Post hoc, ``fit(loader)`` holds one batch at a time: Alg. 2 meets
    the data only in a ``k × k`` sum, to which each batch is added as it comes.

    Parameters
    ----------
    model : torch.nn.Module or tuple
        The trained network: an ``nn.Sequential`` of Linear layers and one activation (after
        optional Conv2d blocks) on fspace's native engine, any other ``nn.Module`` on the torch
        engine, or a ``(state_dict, activation)`` pair of numpy arrays.
    likelihood : {"regression", "classification"}
    prior : GPPrior or fspace.kernels.MatrixKernel
        The GP prior (a kernel is a zero-mean prior).
    train : bool, default True
        Run Alg. 1 (train under the prior) before Alg. 2; ``False``: post hoc.

    Other Parameters
    ----------------
    sigma_noise : float, default 1.0
        The observation noise σ (regression).
    learn_sigma : bool, optional
        Learn σ from ``sigma_noise`` (the method's default otherwise).
    epochs, steps, evaluate_every : int, optional
        The training schedule (the paper's by default); ``patience`` its early stopping.
    input_shape : tuple, optional
        ``(C, H, W)`` of a CNN fitted on flattened rows.
    backend : {"auto", "native", "torch"}, default "auto"
    dict_key_x, dict_key_y : str, default "input_ids", "labels"
        The keys of dict batches (HuggingFace).
    **options
        Any field of the method's Rust ``Config`` (``fspace.default_config``), nested dicts merged.

    Raises
    ------
    TypeError
        A model fspace cannot run with ``backend="native"``, or an unknown setting.
    ValueError
        An invalid setting (the message names it).

    Examples
    --------
    >>> import torch, fspace
    >>> _ = torch.manual_seed(0)
    >>> x = torch.rand(40, 1, dtype=torch.float64) * 2 - 1
    >>> y = torch.sin(3 * x)
    >>> model = torch.nn.Sequential(torch.nn.Linear(1, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)).double()
    >>> fsp = fspace.FSPLaplace(model, "regression", fspace.kernels.RBF(1.0, 0.3), sigma_noise=0.1, epochs=50)
    >>> fsp.fit(x, y)
    >>> mean, var = fsp(x[:3])
    >>> tuple(var.shape)
    (3, 1)
    """

    _rust = _fspace.FspLaplace
    _box_setting = "context_box"

    def _adapt(self, config: Dict[str, Any], x: np.ndarray, has_val: bool) -> None:
        if "design" not in self._given and x.shape[1] > 2:
            config["design"] = "Halton"

    def _box(self, lo: np.ndarray, hi: np.ndarray, config: Dict[str, Any]) -> Dict[str, Any]:
        # FSP-Laplace widens the data's box (``widen``).
        return _widened_box(lo, hi, config)

    def __init__(self, model: Any, likelihood: str, prior: Any, train: bool = True, **kwargs: Any) -> None:
        if prior is None:
            raise TypeError("FSPLaplace needs a prior: fspace.GPPrior(kernel) or a kernel")
        self.train = bool(train)
        super().__init__(model, likelihood, prior, **kwargs)

    def _rust_class(self) -> Any:
        return _fspace.FspLaplace if self.train else _fspace.FspLaplacePosthoc


class GFSVI(_NetworkMethod):
    """Generalised function-space VI (Cinquin & Bamler): ``q(w) = N(m, diag(s²))`` on the
    weights, linearised, fitted by the regularised KL to the GP ``prior`` at measurement
    points. σ is learned from ``sigma_noise`` as in the paper (``learn_sigma=False`` fixes it).
    ``model_state_dict()`` returns the variational mean. Settings: the fields of Rust's
    ``GfsviConfig`` (``measurement_points``, ``gamma``, ``optim={"schedule": …}``, …).

    Parameters
    ----------
    model : torch.nn.Module or tuple
        The trained network: an ``nn.Sequential`` of Linear layers and one activation (after
        optional Conv2d blocks) on fspace's native engine, any other ``nn.Module`` on the torch
        engine, or a ``(state_dict, activation)`` pair of numpy arrays.
    likelihood : {"regression", "classification"}
    prior : GPPrior or fspace.kernels.MatrixKernel
        The GP prior of the regularised KL.

    Other Parameters
    ----------------
    sigma_noise : float, default 1.0
        The observation noise σ (regression).
    learn_sigma : bool, optional
        Learn σ from ``sigma_noise`` (the method's default otherwise).
    epochs, steps, evaluate_every : int, optional
        The training schedule (the paper's by default); ``patience`` its early stopping.
    input_shape : tuple, optional
        ``(C, H, W)`` of a CNN fitted on flattened rows.
    backend : {"auto", "native", "torch"}, default "auto"
    dict_key_x, dict_key_y : str, default "input_ids", "labels"
        The keys of dict batches (HuggingFace).
    **options
        Any field of the method's Rust ``Config`` (``fspace.default_config``), nested dicts merged.

    Raises
    ------
    TypeError
        A model fspace cannot run with ``backend="native"``, or an unknown setting.
    ValueError
        An invalid setting (the message names it).

    Examples
    --------
    >>> import torch, fspace
    >>> _ = torch.manual_seed(0)
    >>> x = torch.rand(40, 1, dtype=torch.float64) * 2 - 1
    >>> model = torch.nn.Sequential(torch.nn.Linear(1, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)).double()
    >>> vi = fspace.GFSVI(model, "regression", fspace.kernels.RBF(1.0, 0.3), steps=50, measurement_points=20)
    >>> vi.fit(x, torch.sin(3 * x))
    >>> tuple(vi(x[:2])[1].shape)
    (2, 1)
    """

    _rust = _fspace.Gfsvi
    _box_setting = "measurement_box"
    _learn_sigma_default = True

    def __init__(self, model: Any, likelihood: str, prior: Any, **kwargs: Any) -> None:
        if prior is None:
            raise TypeError("GFSVI needs a prior: fspace.GPPrior(kernel) or a kernel")
        super().__init__(model, likelihood, prior, **kwargs)


class VaLLA(_NetworkMethod):
    """Variational linearised Laplace (Ortega et al. 2024): a sparse variational GP whose
    prior is the network's linearisation, fitted to the trained network's weights (which stay
    its mean). Early stopping on ``val`` as the paper; without ``val`` the whole schedule runs.
    Settings: the fields of Rust's ``VallaConfig`` (``num_inducing``, ``alpha``, ``batch_size``,
    ``learning_rate``, …). On the torch path the inducing inputs stay at their k-means
    positions (``optimize_inducing=False``: moving them needs the NTK's input gradient).

    Parameters
    ----------
    model : torch.nn.Module or tuple
        The trained network: an ``nn.Sequential`` of Linear layers and one activation (after
        optional Conv2d blocks) on fspace's native engine, any other ``nn.Module`` on the torch
        engine, or a ``(state_dict, activation)`` pair of numpy arrays.
    likelihood : {"regression", "classification"}

    Other Parameters
    ----------------
    sigma_noise : float, default 1.0
        The observation noise σ (regression).
    learn_sigma : bool, optional
        Learn σ from ``sigma_noise`` (the method's default otherwise).
    epochs, steps, evaluate_every : int, optional
        The training schedule (the paper's by default); ``patience`` its early stopping.
    input_shape : tuple, optional
        ``(C, H, W)`` of a CNN fitted on flattened rows.
    backend : {"auto", "native", "torch"}, default "auto"
    dict_key_x, dict_key_y : str, default "input_ids", "labels"
        The keys of dict batches (HuggingFace).
    **options
        Any field of the method's Rust ``Config`` (``fspace.default_config``), nested dicts merged.

    Raises
    ------
    TypeError
        A model fspace cannot run with ``backend="native"``, or an unknown setting.
    ValueError
        An invalid setting (the message names it).

    Examples
    --------
    >>> import torch, fspace
    >>> _ = torch.manual_seed(0)
    >>> x = torch.rand(60, 1, dtype=torch.float64) * 2 - 1
    >>> model = torch.nn.Sequential(torch.nn.Linear(1, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)).double()
    >>> valla = fspace.VaLLA(model, "regression", num_inducing=5, steps=50)
    >>> valla.fit(x, torch.sin(3 * x))
    >>> mean, var = valla(x[:2])
    >>> bool(torch.allclose(mean, model(x[:2])))  # the network is the predictive mean
    True
    """

    _rust = _fspace.Valla

    def _adapt(self, config: Dict[str, Any], x: np.ndarray, has_val: bool) -> None:
        if getattr(self, "_torch", False) and "optimize_inducing" not in self._given:
            # Moving Z needs the NTK's input gradient, which the torch path does not compute.
            config["optimize_inducing"] = False

    def __init__(self, model: Any, likelihood: str, **kwargs: Any) -> None:
        super().__init__(model, likelihood, **kwargs)


class ELLA(_NetworkMethod):
    """ELLA (Deng et al. 2022): the linearised Laplace approximation through a Nyström
    approximation of the NTK on ``num_points`` points with ``num_eigen`` features. Settings:
    the fields of Rust's ``EllaConfig``. Early stopping (``early_stopping``) scores on ``val``;
    without ``val`` it is off unless given.

    Parameters
    ----------
    model : torch.nn.Module or tuple
        The trained network: an ``nn.Sequential`` of Linear layers and one activation (after
        optional Conv2d blocks) on fspace's native engine, any other ``nn.Module`` on the torch
        engine, or a ``(state_dict, activation)`` pair of numpy arrays.
    likelihood : {"regression", "classification"}

    Other Parameters
    ----------------
    sigma_noise : float, default 1.0
        The observation noise σ (regression).
    learn_sigma : bool, optional
        Learn σ from ``sigma_noise`` (the method's default otherwise).
    epochs, steps, evaluate_every : int, optional
        The training schedule (the paper's by default); ``patience`` its early stopping.
    input_shape : tuple, optional
        ``(C, H, W)`` of a CNN fitted on flattened rows.
    backend : {"auto", "native", "torch"}, default "auto"
    dict_key_x, dict_key_y : str, default "input_ids", "labels"
        The keys of dict batches (HuggingFace).
    **options
        Any field of the method's Rust ``Config`` (``fspace.default_config``), nested dicts merged.

    Raises
    ------
    TypeError
        A model fspace cannot run with ``backend="native"``, or an unknown setting.
    ValueError
        An invalid setting (the message names it).

    Examples
    --------
    >>> import torch, fspace
    >>> _ = torch.manual_seed(0)
    >>> x = torch.randn(80, 2, dtype=torch.float64)
    >>> y = (x[:, 0] > 0).long()
    >>> model = torch.nn.Sequential(torch.nn.Linear(2, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2)).double()
    >>> ella = fspace.ELLA(model, "classification", num_points=40, num_eigen=5, prior={"Fixed": 1.0})
    >>> ella.fit(x, y)
    >>> tuple(ella(x[:3]).shape)
    (3, 2)
    """

    _rust = _fspace.Ella

    def _adapt(self, config: Dict[str, Any], x: np.ndarray, has_val: bool) -> None:
        if not has_val and "early_stopping" not in self._given:
            config["early_stopping"] = None

    def _fit_streamed(self, data: Any, y: Any, val: Any, group: Any, progress: Progress) -> bool:
        """A loader that can be iterated again, without early stopping (it scores prefixes of a
        seeded random order of the whole training set): Rust pulls its batches — a pass that
        gathers the ``num_points`` Nyström rows at the positions an in-memory fit draws among
        ``len(loader.dataset)`` points (counted in a pass before when the dataset has no
        length), a second that adds each batch to ``G`` — the in-memory fit up to the order of
        the additions, with one batch (and the Nyström rows) in memory. Validation data, for the
        prior's grid, are held."""
        config = copy.deepcopy(self._config)
        self._adapt(config, np.zeros((0, 0)), val is not None)
        if (y is not None or is_array(data) or config.get("early_stopping") is not None
                or iter(data) is data):
            return False
        xv = yv = None
        if val is not None:
            xv, yv = (data_arrays(val[0], val[1], self._spec.inputs) if isinstance(val, tuple)
                      else data_arrays(val, None, self._spec.inputs, self._dict_keys))

        def batches() -> Any:
            return self._loader_batches(data)

        if self._torch and self.likelihood == "classification":
            self._spec.calls().check_classifier()
        bar = _Progress(progress, type(self).__name__, unit="point")
        source = _fspace.DataSource.batches(batches, total=dataset_size(data) or 0, x_val=xv, y_val=yv)
        self._keep_fit(bar, lambda: self._fit_with(source, config, bar.callback))
        return True

    def __init__(self, model: Any, likelihood: str, **kwargs: Any) -> None:
        super().__init__(model, likelihood, **kwargs)


class ExactGP(_Fitted):
    """The exact GP regression posterior of ``prior`` given ``(X, y)`` and noise ``sigma_noise``
    (hyperparameters as given): the reference every network method is compared with.

    Parameters
    ----------
    prior : GPPrior or fspace.kernels.MatrixKernel
    sigma_noise : float, default 1.0
        The observation noise σ.

    Examples
    --------
    >>> import numpy as np, fspace
    >>> x = np.linspace(-1, 1, 20).reshape(-1, 1)
    >>> gp = fspace.ExactGP(fspace.kernels.RBF(1.0, 0.3), sigma_noise=0.1)
    >>> gp.fit(x, np.sin(3 * x))
    >>> mean, var = gp(np.array([[0.0], [3.0]]))
    >>> bool(var[1, 0] > var[0, 0])
    True
    """

    _rust = _fspace.ExactGp

    def __init__(self, prior: Any, sigma_noise: float = 1.0) -> None:
        self._prior = _prior(prior)
        self.sigma_noise = float(sigma_noise)
        self.likelihood = "regression"
        self._lock = threading.RLock()
        self._post = None
        self._report: Dict[str, Any] = {}
        self._gp()  # σ and the prior checked now

    def _gp(self) -> Any:
        return _fspace.ExactGp(likelihood="regression", prior=self._prior.spec(), sigma_noise=self.sigma_noise)

    def fit(self, data: Any, y: Any = None) -> None:
        """Conditions the prior on the training data.

        Parameters
        ----------
        data : array_like or torch.Tensor
            The inputs ``X`` (``n × d``), or a loader of ``(x, y)`` batches.
        y : array_like or torch.Tensor, optional
            The targets ``n × d'``.

        Returns
        -------
        None

        Raises
        ------
        ValueError
            Inputs or targets that are not finite, empty or of the wrong shape.
        """
        x, yy = data_arrays(data, y)
        with self._lock:
            self._post, self._report = self._gp().fit(_fspace.DataSource.memory(x, yy))

    def log_marginal_likelihood(self) -> float:
        """The log marginal likelihood of the training targets.

        Returns
        -------
        float
            ``log p(y | X)`` under the prior and the noise.
        """
        return float(self.report["log_marginal_likelihood"])
