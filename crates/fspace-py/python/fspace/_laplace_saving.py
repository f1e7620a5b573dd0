"""``fspace.Laplace``, part 6 of 6: ``state_dict``, ``load_state_dict``, pickling."""

from __future__ import annotations

from typing import Any, Dict

from ._torch import TorchModel
from ._fspace import Laplace as _Laplace
from ._laplace_tuning import _LaplaceTuning


class _LaplaceSaving(_LaplaceTuning):
    """Saving: laplace-torch's ``state_dict`` keys with fspace's checked JSON, and pickling."""

    # -- saving ---------------------------------------------------------------------------------

    def _hyper(self) -> Dict[str, Any]:
        return dict(
            prior_precision=self._prior_precision.detach().clone(),
            sigma_noise=self._sigma_noise.detach().clone(),
            prior_mean=self._prior_mean.detach().clone(),
            temperature=self.temperature,
        )

    def state_dict(self) -> Dict[str, Any]:
        """laplace-torch's keys (``mean``, ``loss``, ``prior_mean``, ``prior_precision``,
        ``sigma_noise``, ``n_data``, ``n_outputs``, ``likelihood``, ``temperature``,
        ``enable_backprop``, ``cls_name``) with the curvature as fspace's checked JSON under
        ``fspace_posterior`` in place of ``H``.

        Returns
        -------
        dict
            Load it with ``load_state_dict`` on a ``Laplace`` built with the same arguments.

        Raises
        ------
        NotImplementedError
            A Laplace on the torch engine (its network lives in torch: save the model, refit).
        """
        if isinstance(self._spec, TorchModel):
            raise NotImplementedError(
                "state_dict of a Laplace on the torch engine: its network lives in torch; save the model and refit"
            )
        with self._lock:
            la, query = self._query()
            posterior = la.to_json(*query)
        f = self._fitted_summary()
        state = dict(
            mean=self.mean.clone(), loss=f["loss"].clone(), n_data=f["n_data"], n_outputs=f["n_outputs"],
            likelihood=self.likelihood, enable_backprop=self.enable_backprop, cls_name=self._cls_name(),
            fspace_posterior=posterior, sigma_fit=f["sigma_fit"],
        )
        state.update(self._hyper())
        return state

    def _cls_name(self) -> str:
        subset = {"all": "", "last_layer": "LL", "subnetwork": "Subnet"}[self.subset_of_weights]
        structure = {"full": "Full", "kron": "Kron", "diag": "Diag", "lowrank": "LowRank", "ekfac": "EKFAC"}[self.hessian_structure]
        return f"{structure}{subset}Laplace"

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Restores a ``state_dict`` taken from a Laplace of the same class and likelihood.

        Parameters
        ----------
        state_dict : dict
            From ``state_dict()``; its posterior is checked as every fspace load is.

        Raises
        ------
        ValueError
            Another class, likelihood or model, or a tampered posterior (the message names the field).
        """
        if self._cls_name() != state_dict.get("cls_name"):
            raise ValueError("Loading a wrong Laplace type. Make sure `subset_of_weights` and `hessian_structure` are correct!")
        if self.likelihood != state_dict.get("likelihood"):
            raise ValueError("Different likelihoods detected!")
        if self.temperature != state_dict.get("temperature"):
            import warnings

            warnings.warn("Different `temperature` parameters detected. Some calculation might be off!")
        if "fspace_posterior" not in state_dict:
            raise ValueError("the state_dict holds no fspace_posterior: it was not saved by fspace.Laplace.state_dict")
        inner = _Laplace.from_json(state_dict["fspace_posterior"])
        if self._la is not None and getattr(self._la, "n_params", None) not in (None, inner.n_params):
            raise ValueError("the saved posterior is of a network with another number of parameters")
        self._la = inner
        self._loaded = True
        self._args["sigma_noise"] = float(state_dict["sigma_fit"])
        self._summarise(inner)
        self.prior_precision = state_dict["prior_precision"]
        self.sigma_noise = state_dict["sigma_noise"]
        self.prior_mean = state_dict["prior_mean"]
        self.temperature = float(state_dict["temperature"])

    @property
    def report(self) -> Dict[str, Any]:
        """What the last ``fit`` did, from Rust's ``FitReport`` (``dim``, ``seconds``; for
        ``"lowrank"`` the Lanczos iterations, the largest Ritz residual and the kept rank); ``{}``
        before a fit and on a loaded posterior."""
        return {} if self._report is None else dict(self._report)

    # Pickling (``Wrapper``): the settings and ``state_dict()``; the user's model is not saved.
    _transient = ("_la", "model", "_fit", "_coordinates")

    def _is_fitted(self) -> bool:
        return self._la is not None and self._fit is not None

    def _check_picklable(self) -> None:
        if isinstance(self._spec, TorchModel):
            raise TypeError("a Laplace on a torch model's callbacks cannot be pickled: save the model with torch and refit")
