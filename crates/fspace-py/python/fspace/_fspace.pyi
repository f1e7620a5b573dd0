"""Type stubs of the compiled module (crates/fspace-py/src/lib.rs)."""

from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import numpy.typing as npt

class NumericalError(RuntimeError): ...

class Laplace:
    def __init__(
        self,
        state: Dict[str, Tuple[List[int], npt.NDArray[np.float64], bool]],
        activation_name: str,
        likelihood: str,
        hessian_structure: str = "kron",
        subset_of_weights: str = "all",
        prior_precision: float = 1.0,
        sigma_noise: float = 1.0,
        temperature: float = 1.0,
    ) -> None: ...
    def fit(self, x: npt.NDArray[np.float64], y: npt.NDArray[np.float64]) -> None: ...
    def optimize_prior_precision(
        self,
        method: str = "marglik",
        x_val: Optional[npt.NDArray[np.float64]] = None,
        y_val: Optional[npt.NDArray[np.float64]] = None,
        grid: Optional[Sequence[float]] = None,
    ) -> float: ...
    def predict(
        self,
        x: npt.NDArray[np.float64],
        pred_type: str = "glm",
        link_approx: str = "probit",
        n_samples: int = 100,
        seed: int = 0,
    ) -> Union[npt.NDArray[np.float64], Tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]]: ...
    def log_marginal_likelihood(self) -> float: ...
    def sample(self, n_samples: int = 100, seed: int = 0) -> npt.NDArray[np.float64]: ...
    @property
    def prior_precision(self) -> List[float]: ...
    @property
    def is_fitted(self) -> bool: ...
    def to_json(self) -> str: ...
    @staticmethod
    def from_json(text: str) -> "Laplace": ...
