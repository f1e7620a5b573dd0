"""``fspace.marglik_training``: laplace-torch 0.3's online marginal-likelihood training (Immer et
al. 2021, Alg. 1) with ``fspace.Laplace`` as its Laplace approximation.

Each epoch trains the network on the negative log joint ``loss(f, y) + ½ θᵀ diag(δ) θ / (N·c)``
(``c = T / (2σ²)`` for regression, ``T`` for classification; δ the prior precision expanded over
the trainable parameters), then every ``marglik_frequency`` epochs after the burn-in fits
``Laplace(model, likelihood, "all", hessian_structure)`` on the loader and takes
``n_hypersteps`` Adam steps on ``log λ`` (and ``log σ`` for regression) against the negative log
marginal likelihood; the epoch with the best evidence is kept. Calls, defaults and returns are
laplace-torch's.
"""

from __future__ import annotations

import copy
from collections.abc import MutableMapping
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from ._laplace import Laplace
from ._laplace_tuning import _Adam
from ._method_base import _Progress
from ._predictive import _torch

__all__ = ["marglik_training"]


def _expand(prior_prec: Any, params: List[Any]) -> Any:
    """δ over the trainable parameters from one λ, one per tensor, or one per parameter."""
    torch = _torch()
    total = sum(int(p.numel()) for p in params)
    if len(prior_prec) == 1:
        return prior_prec * torch.ones(total, dtype=params[0].dtype)
    if len(prior_prec) == total:
        return prior_prec
    return torch.cat([d * torch.ones_like(p).flatten() for d, p in zip(prior_prec, params)])


def marglik_training(
    model: Any,
    train_loader: Any,
    likelihood: str = "classification",
    hessian_structure: str = "kron",
    backend: Any = None,
    optimizer_cls: Any = None,
    optimizer_kwargs: Optional[Dict[str, Any]] = None,
    scheduler_cls: Any = None,
    scheduler_kwargs: Optional[Dict[str, Any]] = None,
    n_epochs: int = 300,
    lr_hyp: float = 1e-1,
    prior_structure: str = "layerwise",
    n_epochs_burnin: int = 0,
    n_hypersteps: int = 10,
    marglik_frequency: int = 1,
    prior_prec_init: float = 1.0,
    sigma_noise_init: float = 1.0,
    temperature: float = 1.0,
    fix_sigma_noise: bool = False,
    progress_bar: bool = False,
    enable_backprop: bool = False,
    dict_key_x: str = "input_ids",
    dict_key_y: str = "labels",
) -> Tuple[Laplace, Any, List[float], List[float]]:
    """Trains ``model`` and its prior precision (and σ) jointly by the Laplace evidence.

    Parameters
    ----------
    model : torch.nn.Module
        The network (logits for classification), trained in place.
    train_loader : DataLoader
        ``(x, y)`` batches or dicts with ``dict_key_x`` / ``dict_key_y``;
        ``len(train_loader.dataset)`` is N.
    likelihood : {"classification", "regression"}
    hessian_structure : {"kron", "diag", "full", ...}, default "kron"
        The structure of each epoch's ``fspace.Laplace`` (over all weights).
    backend : curvature class, optional
        laplace-torch's backend (a ``*GGN`` class: the GGN; ``*EF``: the empirical Fisher).
    optimizer_cls, optimizer_kwargs, scheduler_cls, scheduler_kwargs
        The network's optimizer (default ``torch.optim.Adam``) and an optional scheduler,
        stepped after every batch. A ``weight_decay`` is set to 0: the prior is the decay.
    n_epochs, lr_hyp, n_epochs_burnin, n_hypersteps, marglik_frequency
        Epochs; Adam's step on the log hyperparameters; epochs before the first evidence step;
        hyperparameter steps per evidence fit; epochs between evidence fits.
    prior_structure : {"layerwise", "scalar", "diag"}, default "layerwise"
        One λ per parameter tensor, one λ, or one per parameter (kron takes scalar or
        layerwise).
    prior_prec_init, sigma_noise_init, temperature, fix_sigma_noise
        The starting λ and σ, laplace-torch's temperature, and whether σ stays fixed.
    progress_bar : bool
        A tqdm bar over the epochs.
    enable_backprop : bool
        The returned Laplace approximation's predictive is differentiable (as ``fspace.Laplace``'s).
    dict_key_x, dict_key_y : str
        The keys of dict batches.

    Returns
    -------
    (Laplace, torch.nn.Module, list of float, list of float)
        The Laplace approximation at the best evidence, the model with those weights, the
        negative log marginal likelihood after every hyperparameter step, the mean training
        loss of every epoch.

    Examples
    --------
    >>> import torch, fspace
    >>> _ = torch.manual_seed(0)
    >>> x = torch.randn(64, 2, dtype=torch.float64)
    >>> y = (x[:, 0] > 0).long()
    >>> model = torch.nn.Sequential(torch.nn.Linear(2, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2)).double()
    >>> loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16)
    >>> la, model, margliks, losses = fspace.marglik_training(model, loader, n_epochs=3, n_hypersteps=2)
    >>> len(margliks), len(losses), tuple(la.prior_precision.shape)
    (6, 3, (4,))
    """
    torch = _torch()
    if likelihood not in ("classification", "regression"):
        raise ValueError(f"likelihood {likelihood!r} is not \"classification\" or \"regression\"")
    for name, value in (("n_epochs", n_epochs), ("n_hypersteps", n_hypersteps), ("marglik_frequency", marglik_frequency)):
        if int(value) != value or value < (0 if name == "n_epochs" else 1):
            raise ValueError(f"{name} {value} must be an integer ≥ {0 if name == 'n_epochs' else 1}")
    if optimizer_kwargs is not None and "weight_decay" in optimizer_kwargs:
        import warnings

        warnings.warn("Weight decay is handled and optimized. Will be set to 0.")
        optimizer_kwargs["weight_decay"] = 0.0
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("the model has no trainable parameter")
    dtype = params[0].dtype
    n = len(train_loader.dataset)
    counts = {"scalar": 1, "layerwise": len(params), "diag": sum(int(p.numel()) for p in params)}
    if prior_structure not in counts:
        raise ValueError(f"prior_structure {prior_structure!r} is not \"scalar\", \"layerwise\" or \"diag\"")
    log_prior_prec = torch.full((counts[prior_structure],), float(np.log(temperature * prior_prec_init)), dtype=dtype)
    log_prior_prec.requires_grad = True
    hypers = [_Adam(log_prior_prec, float(lr_hyp))]
    log_sigma_noise: Any = None
    if likelihood == "classification":
        criterion = torch.nn.CrossEntropyLoss(reduction="mean")
    else:
        criterion = torch.nn.MSELoss(reduction="mean")
        log_sigma_noise = torch.full((1,), float(np.log(sigma_noise_init)), dtype=dtype)
        log_sigma_noise.requires_grad = True
        hypers.append(_Adam(log_sigma_noise, float(lr_hyp)))
    optimizer = (optimizer_cls or torch.optim.Adam)(model.parameters(), **(optimizer_kwargs or {}))
    scheduler = None if scheduler_cls is None else scheduler_cls(optimizer, **(scheduler_kwargs or {}))
    common = dict(hessian_structure=hessian_structure, temperature=temperature, backend=backend,
                  subset_of_weights="all", dict_key_x=dict_key_x, dict_key_y=dict_key_y)

    best_marglik = np.inf
    best: Optional[Tuple[Any, Any, Any]] = None
    margliks: List[float] = []
    losses: List[float] = []
    bar = _Progress(progress_bar, "marglik_training", unit="epoch")
    for epoch in range(1, int(n_epochs) + 1):
        epoch_loss = 0.0
        for batch in train_loader:
            if isinstance(batch, MutableMapping):
                x, y = batch, batch[dict_key_y]
            else:
                x, y = batch
            optimizer.zero_grad()
            if likelihood == "regression":
                sigma = sigma_noise_init if fix_sigma_noise else torch.exp(log_sigma_noise).detach()
                factor = temperature / (2 * sigma**2)
            else:
                factor = temperature
            delta = _expand(torch.exp(log_prior_prec).detach(), params)
            theta = torch.cat([p.reshape(-1) for p in params])
            f = model(x)
            loss = criterion(f, y) + (0.5 * (delta * theta) @ theta) / n / factor
            loss.backward()
            optimizer.step()
            epoch_loss += loss.detach().item() * len(y)
            if scheduler is not None:
                scheduler.step()
        losses.append(epoch_loss / n)
        if bar.callback is not None:
            bar.callback(epoch, int(n_epochs), losses[-1], None)
        if epoch % marglik_frequency != 0 or epoch < n_epochs_burnin:
            continue
        sigma_fit: Any = 1.0 if likelihood == "classification" else (
            sigma_noise_init if fix_sigma_noise else torch.exp(log_sigma_noise))
        la = Laplace(model, likelihood, sigma_noise=sigma_fit, prior_precision=torch.exp(log_prior_prec), **common)
        la.fit(train_loader)
        for _ in range(int(n_hypersteps)):
            for h in hypers:
                h.param.grad = None
            sigma_arg = None if likelihood == "classification" or fix_sigma_noise else torch.exp(log_sigma_noise)
            lam = torch.exp(log_prior_prec)
            marglik = -la.log_marginal_likelihood(lam, sigma_arg)
            marglik.backward()
            for h in hypers:
                if h.param.grad is not None:
                    h.step()
            margliks.append(marglik.item())
        if margliks[-1] < best_marglik:
            # The hyperparameters the best evidence was evaluated at (before the last step).
            best_sigma: Any = 1.0 if sigma_arg is None and likelihood == "classification" else (
                sigma_noise_init if sigma_arg is None else sigma_arg.detach().clone())
            best = (copy.deepcopy(model.state_dict()), lam.detach().clone(), best_sigma)
            best_marglik = margliks[-1]
    bar.close()

    if best is not None:
        model.load_state_dict(best[0])
        prior_prec, sigma_noise = best[1], best[2]
    else:
        prior_prec = torch.exp(log_prior_prec).detach()
        sigma_noise = 1.0 if likelihood == "classification" else (
            sigma_noise_init if fix_sigma_noise else torch.exp(log_sigma_noise).detach())
    la = Laplace(model, likelihood, sigma_noise=sigma_noise, prior_precision=prior_prec,
                 enable_backprop=enable_backprop, **common)
    la.fit(train_loader)
    return la, model, margliks, losses
