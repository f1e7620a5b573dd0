"""The shared ground of the function-space method classes (``_methods``): the GP prior, the
settings (each method's Rust ``Config`` as a dict: defaults, overlays, the schedule's
shortcuts), the progress bar, and ``_Fitted`` — the queries and saving every fitted method
shares. The fitting routes are ``_network_method``'s."""

from __future__ import annotations

import copy
from typing import Any, Callable, Dict, Optional, Tuple, Union

import numpy as np

from . import _fspace
from ._base import Wrapper
from ._convert import array2, back, count, is_torch
from ._predictive import sample_count
from .kernels import MatrixKernel

__all__ = ["GPPrior", "default_config"]


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


def _span(value: Any, unit: str) -> Dict[str, int]:
    if isinstance(value, dict):
        return value
    return {unit: count(value, "evaluate_every")}


def _schedule(base: Dict[str, Any], epochs: Optional[int], steps: Optional[int],
              evaluate_every: Optional[int], patience: Any) -> Dict[str, Any]:
    """The Rust ``Schedule`` with the shortcuts: a length in epochs or steps, an evaluation
    interval in the same unit, and the patience (evaluations without improvement; ``None``: off)."""
    out = dict(base)
    if epochs is not None and steps is not None:
        raise ValueError("give epochs or steps, not both")
    unit = "Epochs" if epochs is not None else "Steps" if steps is not None else next(iter(base["length"]))
    if epochs is not None:
        out["length"] = {"Epochs": count(epochs, "epochs")}
    if steps is not None:
        out["length"] = {"Steps": count(steps, "steps")}
    if evaluate_every is not None:
        out["evaluate_every"] = _span(evaluate_every, unit)
    elif epochs is not None or steps is not None:
        # A length in another unit than the default's: evaluate at its end (and every unit).
        every_unit = next(iter(base["evaluate_every"]))
        if every_unit != unit:
            out["evaluate_every"] = {unit: 1}
    if patience != "default":
        out["patience"] = None if patience is None else count(patience, "patience")
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


