"""Type stubs of the compiled module (crates/fspace-py/src/lib.rs)."""

from typing import Any, Callable, ClassVar, Dict, Iterable, List, Optional, Sequence, Tuple, Union, final

import numpy as np
import numpy.typing as npt

__all__ = ["Laplace", "NystromFeatures", "NtkKernel", "Posterior", "DataSource", "Network", "Capabilities", "FspLaplace", "FspLaplacePosthoc", "Gfsvi", "Valla", "Ella", "ExactGp", "gram", "rkhs_norm", "regularized_kl", "gfsvi_objective", "classification_sums", "classification_metrics", "regression_sums", "regression_metrics", "ood_metrics", "set_memory_limit", "memory_limit", "NumericalError"]

class NumericalError(RuntimeError): ...

@final
class Laplace:
    def __new__(
        cls,
        *,
        state: Dict[str, Tuple[List[int], npt.NDArray[np.float64], bool]],
        activation_name: str,
        likelihood: str,
        hessian_structure: str = "kron",
        subset_of_weights: str = "all",
        prior_precision: float = 1.0,
        sigma_noise: float = 1.0,
        temperature: float = 1.0,
        kron_bias: str = "folded",
        architecture: Optional[Dict[str, Any]] = None,
        calls: Optional[Any] = None,
        layers: Optional[List[Dict[str, Any]]] = None,
        rank: Optional[int] = None,
        max_basis: Optional[int] = None,
        chunk_points: Optional[int] = None,
        curvature: str = "ggn",
        subnetwork_indices: Optional[Sequence[int]] = None,
    ) -> "Laplace": ...
    def fit(
        self,
        x: npt.NDArray[np.float64],
        y: npt.NDArray[np.float64],
        progress: Optional[Callable[[int, int, Optional[float], Optional[float]], Any]] = None,
        reduce: Optional[Callable[[npt.NDArray[np.float64], bool], npt.NDArray[np.float64]]] = None,
        process: Optional[Tuple[int, int]] = None,
    ) -> None: ...
    def optimize_prior_precision(
        self,
        method: str = "marglik",
        x_val: Optional[npt.NDArray[np.float64]] = None,
        y_val: Optional[npt.NDArray[np.float64]] = None,
        grid: Optional[Sequence[float]] = None,
    ) -> float: ...
    def sample(
        self, n_samples: int, seed: int, prior_precision: Union[float, Sequence[float]], temperature: float
    ) -> npt.NDArray[np.float64]: ...
    def begin_batches(self, override_: bool = True) -> None: ...
    def add_batch(self, x: npt.NDArray[np.float64], y: npt.NDArray[np.float64]) -> None: ...
    def end_batches(self) -> None: ...
    def sums_flat(self) -> npt.NDArray[np.float64]: ...
    def set_sums_flat(self, flat: npt.NDArray[np.float64]) -> None: ...
    @property
    def batch_points(self) -> int: ...
    @property
    def batch_target(self) -> int: ...
    def curvature_eigenvalues(self) -> Optional[npt.NDArray[np.float64]]: ...
    def curvature_eigenvalue_owners(self, prior_precision: List[float]) -> Optional[List[int]]: ...
    def curvature_dense(self) -> npt.NDArray[np.float64]: ...
    def curvature_diagonal(self) -> npt.NDArray[np.float64]: ...
    def fit_summary(self) -> Tuple[float, int, List[int], npt.NDArray[np.float64]]: ...
    def coordinates(self) -> List[int]: ...
    def covariance_solve(
        self, v: npt.NDArray[np.float64], prior_precision: Union[float, Sequence[float]], temperature: float
    ) -> npt.NDArray[np.float64]: ...
    def covariance_diagonal(
        self, prior_precision: Union[float, Sequence[float]], temperature: float
    ) -> Optional[npt.NDArray[np.float64]]: ...
    def glm(
        self, x: npt.NDArray[np.float64], prior_precision: Union[float, Sequence[float]], temperature: float
    ) -> Tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]: ...
    def glm_joint(
        self, x: npt.NDArray[np.float64], prior_precision: Union[float, Sequence[float]], temperature: float
    ) -> Tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]: ...
    def nn_samples(
        self,
        x: npt.NDArray[np.float64],
        n_samples: int,
        seed: int,
        prior_precision: Union[float, Sequence[float]],
        temperature: float,
    ) -> npt.NDArray[np.float64]: ...
    @property
    def prior_precision(self) -> List[float]: ...
    @property
    def report(self) -> Optional[Dict[str, Any]]: ...
    @property
    def output_dim(self) -> int: ...
    @property
    def n_params(self) -> int: ...
    def to_json(
        self, prior_precision: Optional[Union[float, Sequence[float]]] = None, temperature: Optional[float] = None
    ) -> str: ...
    @staticmethod
    def from_json(text: str) -> "Laplace": ...
    @staticmethod
    def support_table() -> List[Tuple[str, str, bool, bool]]: ...

@final
class NystromFeatures:
    def __new__(
        cls,
        *,
        points: Optional[npt.NDArray[np.float64]] = None,
        outputs: Optional[Sequence[int]] = None,
        num_eigen: Optional[int] = None,
        state: Optional[Dict[str, Tuple[List[int], npt.NDArray[np.float64], bool]]] = None,
        activation_name: str = "",
        architecture: Optional[Dict[str, Any]] = None,
        calls: Any = None,
        saved: Optional[str] = None,
    ) -> "NystromFeatures": ...
    def eval(self, x: npt.NDArray[np.float64]) -> Tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]: ...
    @property
    def num_features(self) -> int: ...
    @property
    def kernel_eigenvalues(self) -> npt.NDArray[np.float64]: ...
    def directions(self) -> npt.NDArray[np.float64]: ...
    def to_json(self) -> str: ...

@final
class NtkKernel:
    def __new__(
        cls,
        *,
        state: Optional[Dict[str, Tuple[List[int], npt.NDArray[np.float64], bool]]] = None,
        activation_name: str = "",
        architecture: Optional[Dict[str, Any]] = None,
        calls: Any = None,
    ) -> "NtkKernel": ...
    @property
    def output_dim(self) -> int: ...
    def blocks(
        self, x: npt.NDArray[np.float64], z: npt.NDArray[np.float64], outputs: Sequence[int]
    ) -> Tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], npt.NDArray[np.float64], npt.NDArray[np.float64]]: ...
    def joint_block(self, x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]: ...
    def pullback_z(
        self,
        x: npt.NDArray[np.float64],
        z: npt.NDArray[np.float64],
        outputs: Sequence[int],
        c_xz: npt.NDArray[np.float64],
        c_zz: npt.NDArray[np.float64],
    ) -> npt.NDArray[np.float64]: ...

@final
class Posterior:
    @property
    def method(self) -> str: ...
    @property
    def output_dim(self) -> int: ...
    def predict(
        self, x: npt.NDArray[np.float64], observation_noise: bool = False
    ) -> Tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]: ...
    def class_probabilities(
        self, x: npt.NDArray[np.float64], link_approx: str = "probit", n_samples: int = 100, seed: int = 0
    ) -> npt.NDArray[np.float64]: ...
    def sample_functions(
        self, x: npt.NDArray[np.float64], n_samples: int = 100, seed: int = 0
    ) -> npt.NDArray[np.float64]: ...
    def trained_params(self) -> Optional[npt.NDArray[np.float64]]: ...
    def likelihood(self) -> Optional[Dict[str, Any]]: ...
    def to_json(self) -> str: ...

_RowReader = Callable[[npt.NDArray[np.int64]], Tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]]
_Batches = Callable[[], Iterable[Tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]]]
_Progress = Optional[Callable[[int, int, Optional[float], Optional[float]], Any]]

@final
class DataSource:
    @staticmethod
    def memory(
        x: npt.NDArray[np.float64],
        y: npt.NDArray[np.float64],
        *,
        x_val: Optional[npt.NDArray[np.float64]] = None,
        y_val: Optional[npt.NDArray[np.float64]] = None,
        val_rows: Optional[Tuple[_RowReader, int]] = None,
        reduce: Optional[Callable[..., npt.NDArray[np.float64]]] = None,
        process: Optional[Tuple[int, int]] = None,
    ) -> "DataSource": ...
    @staticmethod
    def rows(
        read: _RowReader,
        n: int,
        *,
        x_val: Optional[npt.NDArray[np.float64]] = None,
        y_val: Optional[npt.NDArray[np.float64]] = None,
        val_rows: Optional[Tuple[_RowReader, int]] = None,
    ) -> "DataSource": ...
    @staticmethod
    def batches(
        make: _Batches,
        *,
        total: int = 0,
        x_val: Optional[npt.NDArray[np.float64]] = None,
        y_val: Optional[npt.NDArray[np.float64]] = None,
        reduce: Optional[Callable[..., npt.NDArray[np.float64]]] = None,
    ) -> "DataSource": ...

@final
class Network:
    @staticmethod
    def native(
        state: Dict[str, Tuple[List[int], npt.NDArray[np.float64], bool]],
        activation_name: str,
        architecture: Optional[Dict[str, Any]] = None,
    ) -> "Network": ...
    @staticmethod
    def torch(calls: Any) -> "Network": ...
    @property
    def input_dim(self) -> int: ...
    @property
    def output_dim(self) -> int: ...

@final
class Capabilities:
    @property
    def rows(self) -> bool: ...
    @property
    def batches(self) -> bool: ...
    @property
    def shards_each_step(self) -> bool: ...
    @property
    def shards_one_sum(self) -> bool: ...
    @property
    def shards(self) -> bool: ...

@final
class FspLaplace:
    capabilities: ClassVar[Capabilities]
    name: ClassVar[str]
    def __new__(
        cls,
        *,
        likelihood: str,
        prior: Optional[Dict[str, Any]] = None,
        settings: Optional[Dict[str, Any]] = None,
        sigma_noise: float = 1.0,
        learn_sigma: bool = False,
    ) -> "FspLaplace": ...
    @staticmethod
    def defaults() -> Dict[str, Any]: ...
    @property
    def settings(self) -> Dict[str, Any]: ...
    def fit(
        self,
        source: DataSource,
        *,
        network: Optional[Network] = None,
        settings: Optional[Dict[str, Any]] = None,
        progress: _Progress = None,
    ) -> Tuple[Posterior, Dict[str, Any]]: ...
    @staticmethod
    def load_posterior(text: str) -> Posterior: ...

@final
class FspLaplacePosthoc:
    capabilities: ClassVar[Capabilities]
    name: ClassVar[str]
    def __new__(
        cls,
        *,
        likelihood: str,
        prior: Optional[Dict[str, Any]] = None,
        settings: Optional[Dict[str, Any]] = None,
        sigma_noise: float = 1.0,
        learn_sigma: bool = False,
    ) -> "FspLaplacePosthoc": ...
    @staticmethod
    def defaults() -> Dict[str, Any]: ...
    @property
    def settings(self) -> Dict[str, Any]: ...
    def fit(
        self,
        source: DataSource,
        *,
        network: Optional[Network] = None,
        settings: Optional[Dict[str, Any]] = None,
        progress: _Progress = None,
    ) -> Tuple[Posterior, Dict[str, Any]]: ...
    @staticmethod
    def load_posterior(text: str) -> Posterior: ...

@final
class Gfsvi:
    capabilities: ClassVar[Capabilities]
    name: ClassVar[str]
    def __new__(
        cls,
        *,
        likelihood: str,
        prior: Optional[Dict[str, Any]] = None,
        settings: Optional[Dict[str, Any]] = None,
        sigma_noise: float = 1.0,
        learn_sigma: bool = False,
    ) -> "Gfsvi": ...
    @staticmethod
    def defaults() -> Dict[str, Any]: ...
    @property
    def settings(self) -> Dict[str, Any]: ...
    def fit(
        self,
        source: DataSource,
        *,
        network: Optional[Network] = None,
        settings: Optional[Dict[str, Any]] = None,
        progress: _Progress = None,
    ) -> Tuple[Posterior, Dict[str, Any]]: ...
    @staticmethod
    def load_posterior(text: str) -> Posterior: ...

@final
class Valla:
    capabilities: ClassVar[Capabilities]
    name: ClassVar[str]
    def __new__(
        cls,
        *,
        likelihood: str,
        prior: Optional[Dict[str, Any]] = None,
        settings: Optional[Dict[str, Any]] = None,
        sigma_noise: float = 1.0,
        learn_sigma: bool = False,
    ) -> "Valla": ...
    @staticmethod
    def defaults() -> Dict[str, Any]: ...
    @property
    def settings(self) -> Dict[str, Any]: ...
    def fit(
        self,
        source: DataSource,
        *,
        network: Optional[Network] = None,
        settings: Optional[Dict[str, Any]] = None,
        progress: _Progress = None,
    ) -> Tuple[Posterior, Dict[str, Any]]: ...
    @staticmethod
    def load_posterior(text: str) -> Posterior: ...

@final
class Ella:
    capabilities: ClassVar[Capabilities]
    name: ClassVar[str]
    def __new__(
        cls,
        *,
        likelihood: str,
        prior: Optional[Dict[str, Any]] = None,
        settings: Optional[Dict[str, Any]] = None,
        sigma_noise: float = 1.0,
        learn_sigma: bool = False,
    ) -> "Ella": ...
    @staticmethod
    def defaults() -> Dict[str, Any]: ...
    @property
    def settings(self) -> Dict[str, Any]: ...
    def fit(
        self,
        source: DataSource,
        *,
        network: Optional[Network] = None,
        settings: Optional[Dict[str, Any]] = None,
        progress: _Progress = None,
    ) -> Tuple[Posterior, Dict[str, Any]]: ...
    @staticmethod
    def load_posterior(text: str) -> Posterior: ...

@final
class ExactGp:
    capabilities: ClassVar[Capabilities]
    name: ClassVar[str]
    def __new__(
        cls,
        *,
        likelihood: str,
        prior: Optional[Dict[str, Any]] = None,
        settings: Optional[Dict[str, Any]] = None,
        sigma_noise: float = 1.0,
        learn_sigma: bool = False,
    ) -> "ExactGp": ...
    @staticmethod
    def defaults() -> Dict[str, Any]: ...
    @property
    def settings(self) -> Dict[str, Any]: ...
    def fit(
        self,
        source: DataSource,
        *,
        network: Optional[Network] = None,
        settings: Optional[Dict[str, Any]] = None,
        progress: _Progress = None,
    ) -> Tuple[Posterior, Dict[str, Any]]: ...
    @staticmethod
    def load_posterior(text: str) -> Posterior: ...


def classification_sums(*, probs: npt.NDArray[np.float64], y: npt.NDArray[np.float64], bins: int) -> List[float]: ...
def classification_metrics(*, bins: int, flat: List[float]) -> Dict[str, Any]: ...
def regression_sums(
    *, mean: npt.NDArray[np.float64], var: npt.NDArray[np.float64], y: npt.NDArray[np.float64]
) -> List[float]: ...
def regression_metrics(flat: List[float]) -> Dict[str, Any]: ...
def ood_metrics(*, id_scores: npt.NDArray[np.float64], ood_scores: npt.NDArray[np.float64]) -> Dict[str, Any]: ...
def set_memory_limit(bytes: Optional[int]) -> None: ...
def memory_limit() -> Optional[int]: ...
def gram(*, kernel: Dict[str, Any], x: npt.NDArray[np.float64], y: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]: ...
def rkhs_norm(
    *, prior: Dict[str, Any], c: npt.NDArray[np.float64], f: npt.NDArray[np.float64], jitter: float
) -> Tuple[float, npt.NDArray[np.float64]]: ...
def regularized_kl(
    *, prior: Dict[str, Any], c: npt.NDArray[np.float64], f: npt.NDArray[np.float64], cov: npt.NDArray[np.float64], gamma: float
) -> Tuple[float, npt.NDArray[np.float64], npt.NDArray[np.float64]]: ...
def gfsvi_objective(
    *,
    state: Dict[str, Tuple[List[int], npt.NDArray[np.float64], bool]],
    activation_name: str,
    mean: List[float],
    log_std: List[float],
    log_noise_std: float,
    prior: Dict[str, Any],
    x_b: npt.NDArray[np.float64],
    y_b: npt.NDArray[np.float64],
    n_total: int,
    x_m: npt.NDArray[np.float64],
    gamma: float,
) -> Tuple[float, float, float, npt.NDArray[np.float64], npt.NDArray[np.float64], float]: ...
