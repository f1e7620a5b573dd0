"""The one wrapper pattern of ``Laplace``, ``FSPLaplace``, ``GFSVI``, ``VaLLA``, ``ELLA`` and
``ExactGP``.

* Built from the model (or prior) and keyword settings; ``fit(...)`` fits in place and returns
  ``None`` (laplace-torch's convention, kept for every method).
* ``state_dict()`` is everything a fit produced — plain values, tensors or arrays and the
  posterior as fspace's checked, versioned JSON — and ``load_state_dict(state)`` restores it into
  an object built with the same arguments (laplace-torch's meaning of the pair). A method's
  trained network weights are ``model_state_dict()``.
* Pickling is the constructor's settings plus ``state_dict()``: a pickle and a saved
  ``state_dict`` hold the same posterior, restored by the same ``load_state_dict``.
* Each object has a lock: a fit, a hyperparameter change and a query from several threads run one
  at a time, and no query changes what ``state_dict()`` or a pickle would save.
"""

from __future__ import annotations

import threading
from typing import Any, Dict, Tuple

__all__ = ["Wrapper"]


class Wrapper:
    """The base of fspace's method classes (see the module's docs)."""

    #: Attributes rebuilt after unpickling (set to ``None``) instead of being saved: the compiled
    #: posterior (saved through ``state_dict``), the user's model.
    _transient: Tuple[str, ...] = ()
    _lock: Any

    def _is_fitted(self) -> bool:
        raise NotImplementedError

    def _check_picklable(self) -> None:
        """Raises ``TypeError`` where the object holds what cannot be saved (a torch model's
        callbacks)."""

    def state_dict(self) -> Dict[str, Any]:  # pragma: no cover - every subclass defines it
        raise NotImplementedError

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:  # pragma: no cover
        raise NotImplementedError

    def __getstate__(self) -> Dict[str, Any]:
        self._check_picklable()
        with self._lock:
            skip = ("_lock",) + self._transient
            state = {k: v for k, v in self.__dict__.items() if k not in skip}
            state["_state_dict"] = self.state_dict() if self._is_fitted() else None
        return state

    def __setstate__(self, state: Dict[str, Any]) -> None:
        saved = state.pop("_state_dict")
        self.__dict__.update(state)
        self._lock = threading.RLock()
        for name in self._transient:
            setattr(self, name, None)
        if saved is not None:
            self.load_state_dict(saved)
