"""``fspace.Laplace``: laplace-torch's ``Laplace`` on fspace's Rust core."""

from __future__ import annotations

import json
from typing import Any, Dict, Optional

import numpy as np

from ._convert import ModelSpec, array2, back, data_arrays, is_torch, network_spec, tensors
from ._methods import Progress, _Progress
from ._torch import TorchModel
from ._fspace import Laplace as _Laplace

__all__ = ["Laplace"]


class Laplace:
    """The linearised Laplace approximation of a network, with laplace-torch's arguments.

    ``Laplace(model, likelihood, subset_of_weights="all", hessian_structure="kron",
    prior_precision=1.0, sigma_noise=1.0, temperature=1.0, kron_bias="folded")``; ``model`` is an
    ``nn.Sequential`` of Linear layers and one activation, or ``(state_dict, activation)``
    with numpy arrays. Then ``fit(X, y)`` (or ``fit(loader)``),
    ``optimize_prior_precision(method="marglik" | "gridsearch", ...)``,
    ``la(X, pred_type="glm" | "nn", link_approx="probit" | "mc" | "bridge")``,
    ``log_marginal_likelihood()``, ``sample(n)``. Pickles with bit-identical predictions.
    ``kron_bias="separate"`` gives KFAC / EKFAC laplace-torch's separate bias block (fspace's
    default folds the bias into the input factor). ``rank`` sets ``hessian_structure="lowrank"``'s
    number of GGN eigenpairs (default 100; laplace-torch has no such argument): the fit holds
    Lanczos' basis, ``p × m`` doubles with ``m`` from ``1.5·rank + 10`` up to the steps the top
    pairs need to converge (``report["lanczos_iterations"]``), and keeps ``p × rank``;
    ``max_basis`` bounds ``m`` (≥ ``rank + 2``): thick-restart Lanczos restarts from the best
    Ritz vectors when the basis is full, trading more GGN products for memory.
    ``chunk_points`` (default 256): points per chunk of network calls and layer statistics; a
    torch model holds one chunk's activations at a time, so fewer points use less memory.

    Any other ``torch.nn.Module`` takes the torch path (``backend="auto"`` or ``"torch"``):
    ``kron`` / ``ekfac`` collect each ``nn.Linear`` / ``nn.Conv2d`` layer's statistics by module
    hooks (every trainable parameter must sit in such a layer: freeze the others),
    ``last_layer`` the last ``nn.Linear``'s input (it must give the model's output).
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
        kron_bias: str = "folded",
        input_shape: Any = None,
        backend: str = "auto",
        rank: Optional[int] = None,
        max_basis: Optional[int] = None,
        chunk_points: Optional[int] = None,
    ) -> None:
        self._spec = network_spec(model, input_shape, backend)
        self._rank = None if rank is None else int(rank)
        self._max_basis = None if max_basis is None else int(max_basis)
        self._chunk_points = None if chunk_points is None else int(chunk_points)
        on_torch = isinstance(self._spec, TorchModel)
        self._args = (
            tensors({} if on_torch else self._spec.state)[0],
            "" if on_torch else self._spec.activation,
            likelihood,
            hessian_structure,
            subset_of_weights,
            float(prior_precision),
            float(sigma_noise),
            float(temperature),
            kron_bias,
        )
        self.likelihood = likelihood
        # On the torch path the model's layers come from module hooks: the last Linear for
        # last_layer, every Linear / Conv2d for kron / ekfac (required) and for the other
        # structures (when they cover every trainable parameter; otherwise those take the
        # Jacobian-free per-point route).
        self._layers: Optional[str] = None
        self._layers_required = True
        if on_torch and subset_of_weights == "last_layer":
            self._layers = "last"
        elif on_torch:
            self._layers = "all"
            self._layers_required = hessian_structure in ("kron", "ekfac")
        self._la: Any = None
        # Built and checked now where the input shape is known (an MLP, or a CNN or torch model
        # given input_shape); otherwise at fit, from the inputs' shape.
        if self._spec.architecture_known():
            self._build()

    def _build(self) -> Any:
        if self._la is None:
            if isinstance(self._spec, TorchModel):
                calls = self._spec.calls()
                try:
                    layers = None if self._layers is None else calls.layer_infos(self._layers)
                except ValueError as e:
                    if not self._layers_required:
                        layers = None
                    else:
                        structure = "subset_of_weights='last_layer'" if self._layers == "last" else f"hessian_structure={self._args[3]!r}"
                        raise ValueError(f"{structure} on the torch path: {e}") from None
                self._la = _Laplace(*self._args, None, calls, layers, rank=self._rank, max_basis=self._max_basis,
                                   chunk_points=self._chunk_points)
            else:
                self._la = _Laplace(*self._args, self._spec.architecture_json(), rank=self._rank,
                                   max_basis=self._max_basis, chunk_points=self._chunk_points)
        return self._la

    def _fitted(self) -> Any:
        if self._la is None:
            raise RuntimeError("call fit(X, y) first")
        return self._la

    @classmethod
    def _wrap(cls, inner: Any, likelihood: str, spec: Optional[ModelSpec]) -> "Laplace":
        obj = cls.__new__(cls)
        obj._la = inner
        obj.likelihood = likelihood
        obj._spec = spec if spec is not None else ModelSpec({}, "")
        return obj

    def fit(self, data: Any, y: Any = None, progress: Progress = None, progress_bar: bool = False) -> None:
        """Fits the curvature on ``(X, y)``, or on every ``(x, y)`` batch of a loader.

        ``progress``: a callable ``(step, total, None, None)`` told after every chunk of each
        pass over the data (``step`` of ``total`` points; each pass counts from 0 again: one for
        diag / full / kron, two for EKFAC, one per Lanczos product for lowrank; a torch model's
        KFAC factor pass reports each tenth of the data, as torch sums the factors in ten
        calls), or ``True`` for
        a tqdm bar (a line per report on stderr without tqdm). ``progress_bar=True`` is
        laplace-torch's spelling of ``progress=True``.
        """
        x, yy = data_arrays(data, y, self._spec.inputs)
        bar = _Progress(progress if progress is not None else progress_bar, "Laplace", unit="point")
        try:
            self._build().fit(x, yy, bar.callback)
        finally:
            bar.close()

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
                x_val, y_val = data_arrays(val_loader, None, self._spec.inputs)
            if x_val is None or y_val is None:
                raise ValueError("gridsearch needs val_loader or x_val and y_val")
            return self._fitted().optimize_prior_precision(
                method, self._spec.inputs(x_val, "x_val"), array2(y_val, "y_val"), grid
            )
        return self._fitted().optimize_prior_precision(method)

    def __call__(
        self,
        x: Any,
        pred_type: str = "glm",
        link_approx: str = "probit",
        n_samples: int = 100,
        seed: int = 0,
    ) -> Any:
        """Regression: ``(f_mean, f_var)``; classification: class probabilities."""
        out = self._fitted().predict(self._spec.inputs(x, "X"), pred_type, link_approx, int(n_samples), int(seed))
        return back(out, is_torch(x))

    predictive = __call__

    def log_marginal_likelihood(self) -> float:
        """The Laplace evidence at the current λ."""
        return self._fitted().log_marginal_likelihood()

    def sample(self, n_samples: int = 100, seed: int = 0) -> np.ndarray:
        """``n_samples × p`` weight draws, in ``named_parameters()`` order."""
        return self._fitted().sample(int(n_samples), int(seed))

    @property
    def prior_precision(self) -> list:
        return self._fitted().prior_precision

    @property
    def report(self) -> Dict[str, Any]:
        """What the last ``fit`` did, from Rust's ``FitReport``: ``dim`` (parameters covered),
        ``seconds``; for ``"lowrank"`` the Lanczos ``lanczos_iterations``, the largest relative
        Ritz residual of the kept pairs (``max_ritz_residual``) and the ``rank`` kept. ``{}``
        before a fit and on an unpickled posterior."""
        text = None if self._la is None else self._la.report_json
        return {} if text is None else json.loads(text)

    def __reduce__(self) -> Any:
        if isinstance(self._spec, TorchModel):
            raise TypeError("a Laplace on a torch model's callbacks cannot be pickled: save the model with torch and refit")
        arch = None if self._spec.architecture is None else dict(self._spec.architecture)
        return (_restore, (self._fitted().to_json(), self.likelihood, arch))


def _restore(text: str, likelihood: str, architecture: Optional[Dict[str, Any]] = None) -> Laplace:
    spec = ModelSpec({}, "", architecture)
    return Laplace._wrap(_Laplace.from_json(text), likelihood, spec)
