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
from typing import Any, Dict

import numpy as np

from . import _fspace
from ._convert import data_arrays, dataset_size, is_array
from ._method_base import GPPrior, Progress, _Fitted, _Progress, _prior, _widened_box, default_config
from ._network_method import _NetworkMethod

__all__ = ["GPPrior", "FSPLaplace", "GFSVI", "VaLLA", "ELLA", "ExactGP", "default_config"]


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
