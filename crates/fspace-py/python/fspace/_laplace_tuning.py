"""``fspace.Laplace``, part 5 of 6: the prior precision's search."""

from __future__ import annotations

import math
from typing import Any, List

import numpy as np

from ._convert import is_torch
from ._method_base import _Progress
from ._predictive import _torch
from ._laplace_predictive import _LaplacePredictive


class _LaplaceTuning(_LaplacePredictive):
    """The hyperparameter search: laplace-torch's ``optimize_prior_precision``."""

    # -- hyperparameter search ----------------------------------------------------------------

    def optimize_prior_precision(
        self,
        pred_type: str = "glm",
        method: str = "marglik",
        n_steps: int = 100,
        lr: float = 1e-1,
        init_prior_prec: Any = 1.0,
        prior_structure: str = "scalar",
        val_loader: Any = None,
        loss: Any = None,
        log_prior_prec_min: float = -4,
        log_prior_prec_max: float = 4,
        grid_size: int = 100,
        link_approx: str = "probit",
        n_samples: int = 100,
        verbose: bool = False,
        progress_bar: bool = False,
        log_prior_prec_base: float = 10.0,
    ) -> None:
        """laplace-torch's prior-precision search: Adam on ``log λ`` against the negative log
        marginal likelihood (``method="marglik"``), or the validation loss over a log grid
        (``method="gridsearch"``: mean squared error of the predictive mean for regression,
        mean negative log-likelihood for classification, unless ``loss`` is given).

        Parameters
        ----------
        pred_type : {"glm", "nn"}, default "glm"
            The predictive the grid search scores.
        method : {"marglik", "gridsearch"}, default "marglik"
        n_steps : int, default 100
            Adam steps on ``log λ`` (marglik).
        lr : float, default 0.1
            Adam's learning rate (marglik).
        init_prior_prec : float or torch.Tensor, default 1.0
            The starting λ (marglik).
        prior_structure : {"scalar", "layerwise", "diag"}, default "scalar"
            One λ, one per parameter tensor, or one per parameter.
        val_loader : DataLoader, optional
            The validation data of the grid search (required for it).
        loss : callable, optional
            The grid search's score ``loss(prediction, y)``; laplace-torch's defaults otherwise.
        log_prior_prec_min, log_prior_prec_max : float, default -4, 4
            The grid's bounds in ``log_prior_prec_base`` units.
        grid_size : int, default 100
        link_approx : {"probit", "bridge", "bridge_norm", "mc"}, default "probit"
            The classification predictive the grid search scores.
        n_samples : int, default 100
            Draws of the MC predictives the grid search scores.
        verbose, progress_bar : bool, default False
            Print each step's value; show a progress bar.
        log_prior_prec_base : float, default 10.0

        Returns
        -------
        None
            λ is set on the object (``la.prior_precision``), as in laplace-torch.

        Raises
        ------
        ValueError
            An unknown ``pred_type``, ``method`` or ``prior_structure``, a grid search without
            ``val_loader``, or a call before ``fit``.
        """
        torch = _torch()
        if pred_type not in ("glm", "nn"):
            raise ValueError(f"pred_type {pred_type!r} is not \"glm\" or \"nn\"")
        if prior_structure not in ("scalar", "layerwise", "diag"):
            raise ValueError(f"prior_structure {prior_structure!r} is not \"scalar\", \"layerwise\" or \"diag\"")
        self._fitted()
        if method == "marglik":
            if val_loader is not None:
                import warnings

                warnings.warn("`val_loader` will be ignored when `method` == 'marglik'. Do you mean to set `method = 'gridsearch'`?")
            self.prior_precision = init_prior_prec if is_torch(init_prior_prec) else torch.as_tensor(init_prior_prec)
            if len(self.prior_precision) == 1 and prior_structure != "scalar":
                # laplace-torch's fix_prior_prec_structure: the scalar start spread per tensor or per parameter.
                count = self.n_layers if prior_structure == "layerwise" else self._covered
                self.prior_precision = self.prior_precision.detach() * torch.ones(count, dtype=self._dtype)
            log_prior_prec = self.prior_precision.detach().log().clone()
            log_prior_prec.requires_grad = True
            steps: Any = range(int(n_steps))
            if progress_bar:
                bar = _Progress(True, "Optimizing marginal likelihood")
                steps = _stepping(steps, bar)
            adam = _Adam(log_prior_prec, float(lr))
            for _ in steps:
                log_prior_prec.grad = None
                neg = -self.log_marginal_likelihood(prior_precision=log_prior_prec.exp())
                neg.backward()
                adam.step()
            self.prior_precision = log_prior_prec.detach().exp()
        elif method == "gridsearch":
            if val_loader is None:
                raise ValueError("gridsearch requires a validation set DataLoader")
            # In torch's default dtype, as laplace-torch builds it (float32 grid values).
            interval = torch.logspace(log_prior_prec_min, log_prior_prec_max, int(grid_size), base=log_prior_prec_base)
            results: List[float] = []
            for prior_prec in interval:
                self.prior_precision = prior_prec
                try:
                    results.append(self._validate(val_loader, loss, pred_type, link_approx, n_samples))
                except (np.linalg.LinAlgError, torch.linalg.LinAlgError):
                    results.append(np.inf)
            self.prior_precision = interval[int(np.argmin(results))]
        else:
            raise ValueError("For now only marglik and gridsearch is implemented.")
        if verbose:
            print(f"Optimized prior precision is {self.prior_precision}.")

    def _validate(self, val_loader: Any, loss: Any, pred_type: str, link_approx: str, n_samples: int) -> float:
        torch = _torch()
        means, variances, targets = [], [], []
        for batch in val_loader:
            bx, by = self._batch(batch)
            out = self(bx, pred_type=pred_type, link_approx=link_approx, n_samples=n_samples, fitting=True)
            y = by if is_torch(by) else torch.as_tensor(np.asarray(by))
            if isinstance(out, tuple):
                means.append(out[0])
                variances.append(out[1])
            else:
                means.append(out)
            targets.append(y)
        mean, target = torch.cat(means), torch.cat(targets)
        if loss is None:
            if self.likelihood == "regression":
                # laplace-torch's default: torchmetrics' MeanSquaredError(num_outputs=d) of the
                # predictive mean, summed over the outputs. It does not depend on λ, so every grid
                # value ties and the first is kept (laplace-torch's pick among the ties is decided
                # by rounding in a metric it does not reset between grid values).
                return float(((mean - target.reshape(mean.shape).to(mean.dtype)) ** 2).mean(dim=0).sum())
            probs = mean.reshape(-1, mean.shape[-1])
            return float(torch.nn.functional.nll_loss(probs.log(), target.reshape(-1).long(), reduction="mean"))
        if hasattr(loss, "update") and hasattr(loss, "compute"):
            if hasattr(loss, "reset"):
                loss.reset()
            if variances:
                try:
                    loss.update(mean, torch.cat(variances), target)
                except TypeError:
                    loss.update(mean, target)
            else:
                loss.update(mean, target)
            value = loss.compute()
            if hasattr(loss, "reset"):
                loss.reset()
            return float(value.mean() if is_torch(value) else value)
        if variances:
            return float(loss(mean, torch.cat(variances), target))
        return float(loss(mean, target))



class _Adam:
    """``torch.optim.Adam(lr=lr)``'s update on one tensor (betas 0.9, 0.999, eps 1e-8, no weight
    decay), in the same operations: laplace-torch's search gives the same λ to rounding. Written
    out because torch's optimizer spends ≈ 2 s on its first step in a process where torch had
    not optimised before (its compiler hooks load), twenty times the search itself."""

    def __init__(self, param: Any, lr: float) -> None:
        torch = _torch()
        self.param, self.lr, self.t = param, lr, 0
        self.m = torch.zeros_like(param)
        self.v = torch.zeros_like(param)

    def step(self) -> None:
        torch = _torch()
        (beta1, beta2), eps = (0.9, 0.999), 1e-8
        with torch.no_grad():
            g = self.param.grad
            self.t += 1
            self.m.lerp_(g, 1 - beta1)
            self.v.mul_(beta2).addcmul_(g, g.conj(), value=1 - beta2)
            bias1 = 1 - beta1**self.t
            bias2 = 1 - beta2**self.t
            denom = (self.v.sqrt() / math.sqrt(bias2)).add_(eps)
            self.param.addcdiv_(self.m, denom, value=-self.lr / bias1)


def _stepping(steps: Any, bar: Any) -> Any:
    total = len(steps)
    for i in steps:
        yield i
        if bar.callback is not None:
            bar.callback(i + 1, total, None, None)
    bar.close()
