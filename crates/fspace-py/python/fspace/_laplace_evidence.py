"""``fspace.Laplace``, part 3 of 6: the marginal likelihood and the posterior precision."""

from __future__ import annotations

import math
from typing import Any

from ._predictive import _torch
from ._laplace_fit import _LaplaceFit


class _LaplaceEvidence(_LaplaceFit):
    """The evidence: laplace-torch's formulas on the curvature's eigenvalues, differentiable in λ
    and σ."""

    # -- the evidence -------------------------------------------------------------------------

    @property
    def log_likelihood(self) -> Any:
        """laplace-torch's ``log_likelihood``: ``−loss/(σ²T) − n·d·log(σ√(2π))`` (regression) or
        ``−loss/T`` (classification), differentiable in σ."""
        torch = _torch()
        f = self._fitted_summary()
        factor = -self._H_factor
        if self.likelihood == "regression":
            c = f["n_data"] * f["n_outputs"] * torch.log(self.sigma_noise * math.sqrt(2 * math.pi))
            return factor * f["loss"] - c
        return factor * f["loss"]

    @property
    def scatter(self) -> Any:
        """``(θ* − μ₀)ᵀ Λ (θ* − μ₀)``: the prior's quadratic term at the MAP weights."""
        delta = self._fitted_summary()["mean"] - self.prior_mean
        return (delta * self.prior_precision_diag) @ delta

    @property
    def log_det_prior_precision(self) -> Any:
        """``log |Λ|`` of the prior precision over the covered parameters."""
        return self.prior_precision_diag.log().sum()

    @property
    def log_det_posterior_precision(self) -> Any:
        """``log |H/(σ²T) + λI|`` from the curvature's eigenvalues (before ``fit``, over all
        weights with ``diag`` / ``full`` / ``kron``: ``log |λI|``, laplace-torch's zero curvature)."""
        if self._fit is None and self._prior_state():
            return self.prior_precision_diag.log().sum()
        f = self._fitted_summary()
        eig = f["eigenvalues"]
        if eig is None:
            raise NotImplementedError(
                f"hessian_structure={self.hessian_structure!r} with these options stores no eigenvalues (a low-rank "
                "curvature with a diagonal remainder, or the sampled structure): its evidence is not available"
            )
        if len(self._prior_precision) == 1:
            lam = self._prior_precision[0]
            missing = self._covered - eig.shape[0]
            return (eig * self._H_factor + lam).log().sum() + missing * lam.log()
        # A prior per parameter tensor or per parameter: Σ log(f·eᵢ + λ_owner(i)) where the
        # structure's eigenbasis holds (diag; KFAC with one λ per weight and per bias tensor),
        # the dense log-determinant (as laplace-torch) on a full or subnetwork curvature.
        owners = self._eigenvalue_owners()
        if owners is not None:
            return (eig * self._H_factor + self.prior_precision_diag[owners]).log().sum()
        if self.hessian_structure == "full":
            torch = _torch()
            return torch.logdet(self._H_factor * self._dense_curvature() + torch.diag(self.prior_precision_diag))
        raise NotImplementedError(
            f"a prior precision per parameter tensor or per parameter with hessian_structure={self.hessian_structure!r}: "
            "fspace takes it on diag and full, and one λ per parameter tensor on kron / ekfac (with kron_bias='separate')"
        )

    def _eigenvalue_owners(self) -> Any:
        """For each curvature eigenvalue, the covered parameter whose λ it pairs with (a tensor
        of indices), or ``None`` where the eigenbasis does not hold under a prior of this
        length; cached per fit and length. Rust checks the structure against a λ that differs
        between every parameter tensor (or parameter), so one check covers every value."""
        torch = _torch()
        f = self._fitted_summary()
        cache = f.setdefault("owners", {})
        count = len(self._prior_precision)
        if count not in cache:
            if count == self._covered:
                pattern = [float(i + 1) for i in range(count)]
            else:
                pattern = [float(t + 1) for t, n in enumerate(self._tensor_sizes()) for _ in range(n)]
            owners = self._la.curvature_eigenvalue_owners(pattern)
            cache[count] = None if owners is None else torch.as_tensor(owners, dtype=torch.long)
        return cache[count]

    def _dense_curvature(self) -> Any:
        """The curvature at σ = 1 as a dense tensor (ascending flat order), cached per fit."""
        torch = _torch()
        if self._fit is None and self._prior_state():
            return torch.zeros(self._covered, self._covered, dtype=self._dtype)
        f = self._fitted_summary()
        if f.get("dense") is None:
            f["dense"] = torch.as_tensor(self._la.curvature_dense(), dtype=self._dtype) * self._unit()
        return f["dense"]

    def _diagonal_curvature(self) -> Any:
        """``diag``: the curvature at σ = 1 as its diagonal (ascending flat order; no ``p × p``
        matrix), cached per fit."""
        torch = _torch()
        if self._fit is None and self._prior_state():
            return torch.zeros(self._covered, dtype=self._dtype)
        f = self._fitted_summary()
        if f.get("diagonal") is None:
            f["diagonal"] = torch.as_tensor(self._la.curvature_diagonal(), dtype=self._dtype) * self._unit()
        return f["diagonal"]

    @property
    def H(self) -> Any:  # noqa: N802 - laplace-torch's name
        """laplace-torch's summed curvature at σ = 1 and T = 1 (``posterior_precision`` is
        ``H/(σ²T) + λ``): the diagonal (``diag``) or the matrix (``full``, ``subnetwork``);
        zeros before ``fit`` over all weights, as laplace-torch initialises it.

        Raises
        ------
        NotImplementedError
            ``kron``, ``ekfac``, ``lowrank``: laplace-torch returns its own Kronecker / low-rank
            types, which fspace does not mirror.
        """
        if self._last_layer_unfitted():
            return None
        if self.hessian_structure == "diag":
            return self._diagonal_curvature()
        if self.hessian_structure == "full":
            return self._dense_curvature()
        raise NotImplementedError(
            f"H of hessian_structure={self.hessian_structure!r}: laplace-torch returns its own Kronecker / low-rank "
            "operator type, which fspace does not mirror"
        )

    @property
    def log_det_ratio(self) -> Any:
        """``log |posterior precision| − log |prior precision|``."""
        return self.log_det_posterior_precision - self.log_det_prior_precision

    def log_marginal_likelihood(self, prior_precision: Any = None, sigma_noise: Any = None) -> Any:
        """The Laplace log marginal likelihood, differentiable in ``prior_precision`` and
        ``sigma_noise`` (which, when given, replace the current values, as laplace-torch does).

        Parameters
        ----------
        prior_precision : float or torch.Tensor, optional
            A new λ (one value, one per parameter tensor, or one per parameter).
        sigma_noise : float or torch.Tensor, optional
            A new σ (regression only).

        Returns
        -------
        torch.Tensor
            ``log_likelihood − ½(log_det_ratio + scatter)``.
        """
        if prior_precision is not None:
            self.prior_precision = prior_precision
        if sigma_noise is not None:
            if self.likelihood != "regression":
                raise ValueError("Can only change sigma_noise for regression.")
            self.sigma_noise = sigma_noise
        return self.log_likelihood - 0.5 * (self.log_det_ratio + self.scatter)

    def log_prob(self, value: Any, normalized: bool = True) -> Any:
        """laplace-torch's log density of the Gaussian weight posterior at ``value``,
        ``−p/2 log 2π + ½ log|P| − ½ ΔᵀPΔ`` with ``Δ = value − mean`` (only the last term without
        ``normalized``), differentiable in ``value``, λ and σ.

        Parameters
        ----------
        value : torch.Tensor
            Weights of the covered parameters (``mean``'s shape).
        normalized : bool, default True
            With the normalising constant.

        Returns
        -------
        torch.Tensor

        Raises
        ------
        NotImplementedError
            ``kron``, ``ekfac``, ``lowrank`` (their precision is an operator fspace does not
            expose) and subnetwork Laplace.
        """
        torch = _torch()
        if self.hessian_structure not in ("diag", "full") or self.subset_of_weights == "subnetwork":
            raise NotImplementedError(
                f"log_prob with hessian_structure={self.hessian_structure!r}, subset_of_weights="
                f"{self.subset_of_weights!r}: fspace forms the posterior precision for diag and full over all "
                "weights or the last layer"
            )
        value = torch.as_tensor(value)
        delta = value.to(dtype=self.mean.dtype) - self.mean
        precision = self.posterior_precision
        square = delta @ (delta * precision) if self.hessian_structure == "diag" else delta @ precision @ delta
        if not normalized:
            return -square / 2
        return -self.n_params / 2 * math.log(2 * math.pi) + self.log_det_posterior_precision / 2 - square / 2

    @property
    def posterior_precision(self) -> Any:
        """``H/(σ²T) + λI``: a vector for ``diag``, a matrix for ``full`` / ``subnetwork``."""
        torch = _torch()
        if self.hessian_structure == "diag":
            return self._diagonal_curvature() * self._H_factor + self.prior_precision_diag
        if self.hessian_structure == "full":
            return self._H_factor * self._dense_curvature() + torch.diag(self.prior_precision_diag)
        raise NotImplementedError(
            f"posterior_precision of hessian_structure={self.hessian_structure!r}: laplace-torch returns its own "
            "Kronecker / low-rank operator type, which fspace does not mirror"
        )

    def _unit(self) -> float:
        return self._fitted_summary()["sigma_fit"] ** 2 if self.likelihood == "regression" else 1.0

    @property
    def posterior_covariance(self) -> Any:
        """``full``: the posterior covariance, the inverse of ``posterior_precision``."""
        torch = _torch()
        if self.hessian_structure != "full":
            raise NotImplementedError(f"posterior_covariance of hessian_structure={self.hessian_structure!r}")
        return torch.linalg.inv(self.posterior_precision)

    @property
    def posterior_variance(self) -> Any:
        """``diag``: the posterior variance of each covered parameter."""
        if self.hessian_structure != "diag":
            raise NotImplementedError(f"posterior_variance of hessian_structure={self.hessian_structure!r}")
        return 1 / self.posterior_precision
