"""What laplace-torch's function-space posteriors (``hessian_structure="gp"``) share in fspace:
``FunctionalSurface`` — the network, the prior mean and temperature, the linearised predictive,
links and draws, the checkpoint checks and laplace-torch's refusals — under ``ELLALaplace``
(``_ella_laplace``) and ``VaLLALaplace`` (``_variational``), and the loader helpers both use."""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping
from numbers import Integral
from typing import Any, Dict, Optional, Tuple

import numpy as np

from ._base import Wrapper
from ._distributed import ONE_SHARD_EACH, agreed
from ._convert import reread_weights, tensors
from ._predictive import _curvature_source, _link, _refuse_unsupported, _torch
from ._torch import TorchModel
from ._memory import check_budget

__all__ = ["FunctionalSurface"]


_LINKS = ("probit", "bridge", "bridge_norm", "mc")


def _integer(value: Any) -> bool:
    return isinstance(value, Integral) and not isinstance(value, bool)


def training_indices(loader: Any) -> Any:
    """The dataset indices a loader visits, as laplace-torch's ``training_indices`` finds them
    (the whole dataset for sequential and full random samplers, a subset sampler's indices,
    otherwise the sampler's own order)."""
    torch = _torch()
    from torch.utils.data import RandomSampler, SequentialSampler, SubsetRandomSampler

    batch_sampler = getattr(loader, "batch_sampler", None)
    sampler = getattr(batch_sampler, "sampler", None) if batch_sampler is not None else getattr(loader, "sampler", None)
    dataset = getattr(loader, "dataset", None)
    if dataset is None or not hasattr(dataset, "__len__") or not hasattr(dataset, "__getitem__"):
        raise ValueError("ELLA selects its Nyström points by index: the loader needs a sized, indexable dataset")
    if sampler is None:
        if batch_sampler is None:
            raise ValueError("the loader has neither a sampler nor a batch sampler")
        indices = [i for batch in batch_sampler for i in batch]
    elif isinstance(sampler, SequentialSampler):
        indices = list(range(len(dataset)))
        if getattr(batch_sampler, "drop_last", False):
            size = getattr(batch_sampler, "batch_size", None)
            if not isinstance(size, int) or size <= 0:
                raise ValueError("A drop-last batch sampler requires a positive batch size.")
            indices = indices[: len(batch_sampler) * size]  # type: ignore[arg-type]
    elif isinstance(sampler, RandomSampler) and not sampler.replacement and sampler.num_samples == len(dataset):
        indices = list(range(len(dataset)))
    elif isinstance(sampler, SubsetRandomSampler):
        indices = list(sampler.indices)
    else:
        indices = list(sampler)
    result = torch.as_tensor(indices, dtype=torch.long)
    if result.ndim != 1 or result.numel() == 0:
        raise ValueError("A function-space fit requires a nonempty index sampler.")
    if torch.any(result < 0) or torch.any(result >= len(dataset)):
        raise ValueError("The training sampler yielded an invalid dataset index.")
    return result


def _global_indices(loader: Any, group: Any) -> Any:
    """The dataset indices all the processes' loaders visit together, in index order — what
    one process over the whole dataset visits with a sequential or random sampler. Every
    process must hold the whole dataset (its sampler choosing its shard) and the shards must not
    overlap; both are errors on every process."""
    torch = _torch()
    dataset = getattr(loader, "dataset", None)

    def local() -> Any:
        return training_indices(loader).numpy()

    mine = agreed(group, local)
    size = len(dataset)  # type: ignore[arg-type]  # training_indices checked it is sized
    sizes = group.all_reduce(np.array([float(size), -float(size)]), "max")
    if sizes[0] != -sizes[1]:
        raise ValueError(
            "the processes' datasets differ in length: in a sharded ELLA fit every process holds the whole dataset "
            "(its loader's sampler chooses its shard), since the Nyström points are drawn from all of it"
        )
    counts = np.zeros(size)
    np.add.at(counts, mine, 1.0)
    counts = group.all_reduce(counts, "sum")
    if counts.max() > 1:
        raise ValueError(
            "the shards overlap: a point is visited more than once over the processes (a DistributedSampler pads "
            "the shards to equal sizes with repeated points); " + ONE_SHARD_EACH
        )
    return torch.as_tensor(np.flatnonzero(counts), dtype=torch.long)


def _subset_loader(loader: Any, indices: Any) -> Any:
    from torch.utils.data import DataLoader, Subset

    size = loader.batch_size or getattr(loader.batch_sampler, "batch_size", 1)
    return DataLoader(Subset(loader.dataset, indices.cpu().tolist()), batch_size=size,
                      collate_fn=loader.collate_fn, shuffle=False)


def _jittered_root(covariance: Any, values: Any) -> Any:
    """laplace-torch's differentiable root of a singular covariance (VaLLA's MC objective): the
    Cholesky factor after the smallest of three diagonal jitters (``1, 10, 100`` machine epsilons
    of the largest variance, past any negative eigenvalue) that factors."""
    torch = _torch()
    scale = covariance.diagonal(dim1=-2, dim2=-1).detach().abs().amax(dim=-1)
    scale = torch.where(scale > 0, scale, 1)
    identity = torch.eye(covariance.shape[-1], dtype=covariance.dtype)
    negative_shift = -values.amin(dim=-1).clamp_max(0)
    for multiplier in (1, 10, 100):
        jitter = negative_shift + multiplier * torch.finfo(covariance.dtype).eps * scale
        try:
            return torch.linalg.cholesky(covariance + jitter[..., None, None] * identity)
        except torch.linalg.LinAlgError:
            continue
    raise RuntimeError("Could not factor a differentiable functional covariance.")


def draw_gaussian(mean: Any, covariance: Any, n_samples: int, generator: Any) -> Any:
    """laplace-torch's ``draw_gaussian``: draws from ``N(mean, covariance)`` (per point
    ``B × C × C`` or joint), by Cholesky or, for a singular PSD covariance, by its
    eigendecomposition — the same draws from the same generator state."""
    torch = _torch()
    covariance = (covariance + covariance.transpose(-1, -2)) / 2
    try:
        root = torch.linalg.cholesky(covariance)
    except torch.linalg.LinAlgError:
        values, vectors = torch.linalg.eigh(covariance.detach() if covariance.requires_grad else covariance)
        tolerance = 10 * torch.finfo(covariance.dtype).eps * covariance.shape[-1] * values.abs().amax(dim=-1, keepdim=True)
        if torch.any(values < -tolerance):
            raise
        if covariance.requires_grad:
            root = _jittered_root(covariance, values)
        else:
            root = vectors @ torch.diag_embed(values.clamp_min(0).sqrt())
    # The noise, the draws and their sum with the mean are held at once.
    check_budget(3 * n_samples * mean.numel() * mean.element_size(),
                 f"{n_samples} samples of {tuple(mean.shape)} outputs",
                 "fewer n_samples, x in smaller batches, or link_approx='probit'")
    noise = torch.randn((n_samples, *mean.shape), dtype=mean.dtype, generator=generator)
    if mean.ndim == 1:
        draws = noise @ root.T
    else:
        draws = torch.einsum("bij,sbj->sbi", root, noise)
    return mean.unsqueeze(0) + draws


class FunctionalSurface(Wrapper):
    """What laplace-torch 0.3's ``ELLA`` and ``VaLLA`` share (its ``BaseFunctionalLaplace``): the
    network (native or a torch model's calls), the hyperparameters ``prior_mean`` and
    ``temperature``, and the predictive — ``__call__``, ``predictive_moments``,
    ``functional_samples``, ``predictive_samples`` — from a subclass's latent moments
    (``_glm_predictive_distribution``)."""

    #: The laplace-torch class this surface is, for messages.
    _name = ""
    model: Any
    likelihood: str
    dict_key_x: str
    dict_key_y: str
    _spec: Any
    _dtype: Any
    _fitted: bool
    _prior_mean: Any
    _temperature: float

    def _hyperparameters_changed(self) -> None:
        """Called when λ, σ or T is set (ELLA refactors its precision on the next query)."""

    def _check_fitted(self) -> None:  # pragma: no cover - every subclass defines it
        raise NotImplementedError

    def _glm_predictive_distribution(self, x: Any, joint: bool = False) -> Tuple[Any, Any]:  # pragma: no cover
        raise NotImplementedError

    def _tensor(self, value: Any) -> Any:
        torch = _torch()
        return torch.as_tensor(value, dtype=self._dtype) if not torch.is_tensor(value) else value.to(self._dtype)

    # -- construction and hyperparameter checks (laplace-torch's, shared by ELLA and VaLLA) ---------

    def _engine(self, enable_backprop: bool, backend: Any, backend_kwargs: Optional[Dict[str, Any]], seed: Any,
                jacobians_are: str) -> str:
        """The engine ``backend`` names after laplace-torch's checks of the options (refused ones,
        a ``*GGN`` backend — ``jacobians_are`` what the method takes from the Jacobians — and an
        integer seed)."""
        _refuse_unsupported(enable_backprop, backend_kwargs)
        engine, curvature = _curvature_source(backend)
        if curvature != "ggn":
            raise ValueError(f"{self._name}'s {jacobians_are} the network's Jacobians: give a *GGN backend (or none)")
        if not _integer(seed):
            raise ValueError(f"seed {seed!r} must be an integer")
        return engine

    def _bind(self, model: Any, likelihood: str, dict_key_x: str, dict_key_y: str, spec: Any) -> None:
        """The model, its network on the chosen engine, the batch keys, float64, the lock."""
        torch = _torch()
        self.model = model
        self.likelihood = likelihood
        self.enable_backprop = False
        self.dict_key_x, self.dict_key_y = dict_key_x, dict_key_y
        self._dtype = torch.float64
        self._lock = threading.RLock()
        self._spec = spec
        if isinstance(spec, TorchModel):
            spec.skip_keys = (dict_key_y,)

    def _checked_prior_precision(self, value: Any) -> Any:
        """``λ`` as a one-element float64 tensor, after laplace-torch's check (positive, finite, scalar)."""
        torch = _torch()
        if isinstance(value, (str, bytes)):
            raise ValueError(f"prior_precision {value!r} is not a number")
        candidate = self._tensor(value)
        if candidate.numel() != 1 or not torch.all(torch.isfinite(candidate) & (candidate > 0)):
            raise ValueError(f"{self._name} requires positive finite scalar prior_precision.")
        return candidate.reshape(-1)

    def _checked_sigma_noise(self, value: Any) -> Any:
        """``σ`` as a 0-d float64 tensor, after laplace-torch's checks (positive, finite, one value,
        1 unless regression)."""
        torch = _torch()
        if isinstance(value, (str, bytes)):
            raise ValueError(f"sigma_noise {value!r} is not a number")
        candidate = self._tensor(value)
        if not torch.all(torch.isfinite(candidate) & (candidate > 0)):
            raise ValueError("sigma_noise must be positive and finite.")
        if self.likelihood != "regression" and torch.any(candidate != 1):
            raise ValueError("sigma_noise != 1 is only available for regression.")
        if candidate.ndim == 1 and candidate.numel() == 1:
            candidate = candidate[0]
        if candidate.ndim != 0:
            raise ValueError("Only homoscedastic output noise supported.")
        return candidate

    @property
    def prior_mean(self) -> Any:
        """The prior mean: zero."""
        return self._prior_mean

    @prior_mean.setter
    def prior_mean(self, value: Any) -> None:
        torch = _torch()
        if torch.any(torch.as_tensor(value) != 0):
            raise ValueError(f"{self._name} currently requires prior_mean=0.")
        self._prior_mean = self._tensor(value)

    @property
    def temperature(self) -> float:
        """``T``, the likelihood's temperature."""
        return self._temperature

    @temperature.setter
    def temperature(self, value: float) -> None:
        v = float(value)
        if not math.isfinite(v) or v <= 0:
            raise ValueError("temperature must be positive and finite.")
        self._temperature = v
        self._hyperparameters_changed()

    @property
    def n_params(self) -> int:
        """The network's parameters."""
        if isinstance(self._spec, TorchModel):
            return int(sum(p.numel() for p in self.model.parameters() if p.requires_grad))
        return int(sum(np.asarray(v).size for v in self._spec.state.values()))

    # -- the network ----------------------------------------------------------------------------

    def _network(self) -> Dict[str, Any]:
        reread_weights(self._spec, self.model)  # the model's weights as they are now
        if isinstance(self._spec, TorchModel):
            return dict(calls=self._spec.calls())
        return dict(state=tensors(self._spec.state)[0], activation_name=self._spec.activation,
                    architecture=self._spec.architecture_dict())

    @property
    def _key_x(self) -> Optional[str]:
        """The dict-batch key of the inputs: none for a torch model (it takes the dict whole)."""
        return None if isinstance(self._spec, TorchModel) else self.dict_key_x

    def _output_dim(self) -> int:
        if isinstance(self._spec, TorchModel):
            return int(self._spec.calls().output_dim)
        if self._spec.architecture is not None:
            return int(self._spec.architecture["output_dim"])
        weights = [np.asarray(v) for v in self._spec.state.values() if np.asarray(v).ndim == 2]
        return int(weights[-1].shape[0])

    def _inputs(self, x: Any) -> np.ndarray:
        if isinstance(x, Mapping) and not isinstance(self._spec, TorchModel):
            x = x[self.dict_key_x]
        return self._spec.inputs(x, "x")

    def _check_nonempty(self, x: Any) -> None:
        inputs = x[self.dict_key_x] if isinstance(x, Mapping) else x
        if len(inputs) == 0:
            raise ValueError("Function-space predictions require at least one input.")

    def predictive_moments(self, x: Any, *, joint: bool = False) -> Tuple[Any, Any]:
        """The latent predictive's moments, without observation noise.

        Parameters
        ----------
        x : tensor or dict
            ``B`` inputs (a dict holds them under ``dict_key_x``).
        joint : bool, default False
            The covariance between inputs too.

        Returns
        -------
        (torch.Tensor, torch.Tensor)
            The mean ``B × C`` and covariance ``B × C × C``; ``joint``: the flattened mean
            ``B·C`` and the ``B·C × B·C`` covariance.
        """
        with self._lock:
            self._check_fitted()
            self._check_nonempty(x)
            return self._glm_predictive_distribution(x, joint=joint)

    def __call__(self, x: Any, pred_type: str = "gp", joint: bool = False, link_approx: str = "probit",
                 n_samples: int = 100, diagonal_output: bool = False, generator: Any = None,
                 fitting: bool = False, **model_kwargs: Any) -> Any:
        """The predictive at ``x``, as laplace-torch's ``ELLA`` and ``VaLLA``.

        Parameters
        ----------
        x : tensor or dict
            ``B`` inputs.
        pred_type : {"gp"}, default "gp"
        joint : bool, default False
            Regression: the flattened mean and the joint covariance between inputs.
        link_approx : {"probit", "bridge", "bridge_norm", "mc"}, default "probit"
        n_samples : int, default 100
            Draws of ``link_approx="mc"``.
        diagonal_output : bool, default False
            Regression: variances ``B × C``; MC: draws from the diagonal.
        generator : torch.Generator, optional
            The random numbers of the MC path.
        fitting : bool, default False
            laplace-torch's flag; ignored.

        Returns
        -------
        tuple of tensors or tensor
            Regression ``(f_mu, f_var)`` (``B × C`` and ``B × C × C``); classification the class
            probabilities ``B × C``.
        """
        torch = _torch()
        if pred_type != "gp":
            raise ValueError("Only gp is supported as a functional prediction type.")
        if link_approx not in _LINKS:
            raise ValueError(f"Unsupported link approximation {link_approx}.")
        if generator is not None and not isinstance(generator, torch.Generator):
            raise ValueError("Invalid random generator (check type and device).")
        if model_kwargs:
            raise NotImplementedError(f"model keyword arguments {sorted(model_kwargs)} are not passed to the network in fspace")
        out_dtype = x.dtype if torch.is_tensor(x) and x.is_floating_point() else self._dtype
        if self.likelihood == "classification" and link_approx == "mc":
            return self.predictive_samples(x, n_samples=n_samples, diagonal_output=diagonal_output,
                                           generator=generator).mean(dim=0).to(out_dtype)
        regression = self.likelihood == "regression"
        f_mu, f_var = self.predictive_moments(x, joint=joint and regression)
        if regression:
            if diagonal_output and not joint:
                f_var = torch.diagonal(f_var, dim1=-2, dim2=-1)
            return f_mu.to(out_dtype), f_var.to(out_dtype)
        return _link(f_mu, f_var, link_approx, int(n_samples), diagonal_output, generator).to(out_dtype)

    predictive = __call__

    def functional_samples(self, x: Any, pred_type: str = "glm", n_samples: int = 100, diagonal_output: bool = False,
                           generator: Any = None, joint: bool = False) -> Any:
        """Draws of the latent function at ``x`` (laplace-torch's ``draw_gaussian``).

        Parameters
        ----------
        x : tensor or dict
            ``B`` inputs.
        pred_type : {"glm", "nn", "gp"}, default "glm"
            laplace-torch's argument; every value draws from the GP predictive.
        n_samples : int, default 100
        diagonal_output : bool, default False
            Draw each output independently.
        generator : torch.Generator, optional
        joint : bool, default False
            With the covariance between inputs.

        Returns
        -------
        torch.Tensor, shape (n_samples, B, C)
        """
        torch = _torch()
        if pred_type not in ("glm", "nn", "gp"):
            raise ValueError(f"Unsupported functional sampling type {pred_type}.")
        if int(n_samples) <= 0:
            raise ValueError("n_samples must be positive.")
        mean, covariance = self.predictive_moments(x, joint=joint)
        if joint:
            batch = len(x[self.dict_key_x] if isinstance(x, Mapping) else x)
            outputs = mean.numel() // batch
            if diagonal_output:
                ids = torch.arange(mean.numel()) % outputs
                covariance = covariance * (ids[:, None] == ids[None, :])
            return draw_gaussian(mean, covariance, int(n_samples), generator).reshape(int(n_samples), batch, outputs)
        if diagonal_output:
            covariance = torch.diag_embed(covariance.diagonal(dim1=-2, dim2=-1))
        return draw_gaussian(mean, covariance, int(n_samples), generator)

    def predictive_samples(self, x: Any, pred_type: str = "glm", n_samples: int = 100, diagonal_output: bool = False,
                           generator: Any = None, fitting: bool = False, joint: bool = False) -> Any:
        """Draws of the predictive: the latent function (regression) or its softmax.

        Parameters
        ----------
        x : tensor or dict
            ``B`` inputs.
        pred_type : {"glm", "nn", "gp"}, default "glm"
            laplace-torch's argument; every value draws from the GP predictive.
        n_samples : int, default 100
        diagonal_output : bool, default False
            Draw each output independently.
        generator : torch.Generator, optional
        fitting : bool, default False
            laplace-torch's flag; ignored.
        joint : bool, default False
            With the covariance between inputs.

        Returns
        -------
        torch.Tensor, shape (n_samples, B, C)
        """
        samples = self.functional_samples(x, pred_type, n_samples, diagonal_output, generator, joint)
        return samples.softmax(dim=-1) if self.likelihood == "classification" else samples

    def _is_fitted(self) -> bool:
        return self._fitted

    def _check_picklable(self) -> None:
        if isinstance(self._spec, TorchModel):
            raise TypeError(f"an {type(self).__name__} on a torch model's callbacks cannot be pickled: save the model "
                            "with torch and refit")

    def _check_checkpoint(self, state_dict: Dict[str, Any]) -> None:
        """laplace-torch's checks of a ``state_dict`` before ``load_state_dict`` reads it: fitted,
        the same class and model size, likelihood and dict keys."""
        if not state_dict.get("fitted", False):
            raise ValueError(f"{self._name} checkpoint must contain a fitted posterior.")
        if state_dict.get("cls_name") != type(self).__name__ or state_dict.get("n_params") != self.n_params:
            raise ValueError(f"Checkpoint requires the same {self._name} type and pretrained model.")
        if state_dict.get("likelihood") != self.likelihood:
            raise ValueError("Checkpoint likelihood does not match.")
        for key in ("dict_key_x", "dict_key_y"):
            if state_dict.get(key) != getattr(self, key):
                raise ValueError(f"Checkpoint {key} {state_dict.get(key)!r} does not match {getattr(self, key)!r}.")

    #: laplace-torch's messages refusing the evidence and the training log likelihood.
    _no_evidence = ""
    _no_log_likelihood = ""

    def log_marginal_likelihood(self, *args: Any, **kwargs: Any) -> Any:
        """Refused, as in laplace-torch: ELLA and VaLLA have no marginal likelihood (ELLA tunes
        λ by validation, VaLLA learns it in ``fit``).

        Parameters
        ----------
        *args, **kwargs
            laplace-torch's arguments.

        Returns
        -------
        torch.Tensor
            Never: it raises.

        Raises
        ------
        NotImplementedError
            Always.
        """
        raise NotImplementedError(self._no_evidence)

    @property
    def log_likelihood(self) -> Any:
        """Refused, as in laplace-torch: the fit does not track the training log likelihood."""
        raise NotImplementedError(self._no_log_likelihood)


def _regression_targets(targets: Any, outputs: Any) -> Any:
    """laplace-torch's ``regression_targets``: ``[B]`` for one output, otherwise the outputs' shape."""
    torch = _torch()
    targets = torch.as_tensor(targets, dtype=outputs.dtype)
    if targets.ndim == 1 and outputs.ndim == 2 and outputs.shape[-1] == 1:
        targets = targets.unsqueeze(-1)
    if targets.shape != outputs.shape:
        raise ValueError(f"Regression targets have shape {tuple(targets.shape)}; expected {tuple(outputs.shape)}.")
    return targets


def _classification_targets(targets: Any) -> Any:
    """laplace-torch's ``classification_targets``: labels, column labels or one-hot rows."""
    torch = _torch()
    targets = torch.as_tensor(targets)
    if targets.ndim == 2:
        targets = targets[:, 0] if targets.shape[1] == 1 else targets.argmax(-1)
    if targets.ndim != 1:
        raise ValueError("Classification targets must have shape [B] or [B, C].")
    return targets.long()
