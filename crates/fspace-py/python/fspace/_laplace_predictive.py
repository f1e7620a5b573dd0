"""``fspace.Laplace``, part 4 of 6: the predictive and the draws."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable, Dict, Tuple

import numpy as np

from ._convert import is_torch
from ._predictive import _link, _normal_samples, _torch, sample_count
from ._torch import TorchModel
from ._memory import check_budget
from ._laplace_settings import _LINKS
from ._laplace_evidence import _LaplaceEvidence


class _LaplacePredictive(_LaplaceEvidence):
    """The predictive: the GLM moments and links, draws, the differentiable predictive; λ and T go
    to Rust with each query, which never changes the fitted object."""

    # -- predictions --------------------------------------------------------------------------

    def _query(self) -> Tuple[Any, Tuple[Any, float]]:
        """The fitted Rust object and the λ and temperature of ``T'·C + λ`` (module docs) its
        queries take now (``_rust_state``): Rust's queries take them as arguments and never
        change the object."""
        return self._fitted(), self._rust_state()

    def _x(self, x: Any) -> np.ndarray:
        if isinstance(x, Mapping) and not isinstance(self._spec, TorchModel):
            x = x[self.dict_key_x]
        return self._spec.inputs(x, "x")

    def _seed(self, generator: Any) -> int:
        torch = _torch()
        if generator is not None and not isinstance(generator, torch.Generator):
            raise ValueError("Invalid random generator (check type and device).")
        return int(torch.randint(0, 2**62, (1,), generator=generator).item())

    def _glm(self, x: Any, joint: bool = False) -> Tuple[Any, Any]:
        torch = _torch()
        if self.enable_backprop:
            return self._glm_differentiable(x, joint)
        xa = self._x(x)
        with self._lock:
            la, state = self._query()
        mean, cov = la.glm_joint(xa, *state) if joint else la.glm(xa, *state)
        return torch.as_tensor(mean, dtype=self._dtype), torch.as_tensor(cov, dtype=self._dtype)

    def _glm_differentiable(self, x: Any, joint: bool) -> Tuple[Any, Any]:
        """``enable_backprop=True``: the GLM moments as functions of ``x`` (and of the model's
        weights) for torch's autograd, as laplace-torch gives them. ``f(x)`` and ``J(x)`` come
        from ``torch.func`` at the model's current weights (``J`` with its graph to ``x``), and
        ``J Σ Jᵀ`` applies the posterior covariance by Rust's ``covariance_solve`` inside an
        autograd function whose backward applies ``Σ`` again (it is symmetric); ``Σ`` itself
        (the curvature, λ, T) is fixed, as in laplace-torch."""
        torch = _torch()
        self._check_backprop_input(x)
        model = self.model
        params = {name: p for name, p in model.named_parameters() if p.requires_grad}
        n = x.shape[0]
        check_budget(3 * n * int(self._fitted().output_dim) * sum(p.numel() for p in params.values()) * 8,
                     f"the Jacobian of {n} inputs over every trainable weight (enable_backprop)",
                     "fewer inputs per call")

        def outputs(weights: Dict[str, Any]) -> Tuple[Any, Any]:
            f = torch.func.functional_call(model, weights, (x,)).reshape(n, -1)
            return f, f  # the outputs, and again as jacrev's auxiliary value (one forward pass)

        was_training = model.training
        model.eval()
        try:
            jacobian, f_mu = torch.func.jacrev(outputs, has_aux=True)(params)
        finally:
            model.train(was_training)
        q = f_mu.shape[1]
        with self._lock:
            la, state = self._query()
            cached = getattr(self, "_coordinates", None)
            if cached is None or cached[0] is not la:
                # The curvature's coordinate order (None: the parameters in order), per fitted object.
                coordinates = la.coordinates()
                order = None if coordinates == list(range(len(coordinates))) else \
                    torch.as_tensor(coordinates, dtype=torch.long)
                self._coordinates = cached = (la, order)
            # The diagonal structure's Σ is one vector: applied in torch, no block crosses to Rust.
            variances = la.covariance_diagonal(*state) if self.hessian_structure == "diag" else None
        js = torch.cat([jacobian[name].reshape(n * q, -1) for name in params], dim=1)
        if cached[1] is not None:
            js = js[:, cached[1]]
        js = js.to(self._dtype)
        if variances is not None:
            scaled = js * torch.from_numpy(variances)
            if joint:
                f_var = scaled @ js.T
            else:
                f_var = torch.einsum("bqd,brd->bqr", scaled.reshape(n, q, -1), js.reshape(n, q, -1))
            return f_mu.to(self._dtype), (f_var + f_var.transpose(-1, -2)) / 2
        # Σ v with the object and the λ, T of this query (the autograd function runs outside the
        # lock, where another thread may fit again or set new ones); dim × n·d', column-major.
        f_var = _quadratic_form_function().apply(js, lambda v: la.covariance_solve(v, *state), n, joint)
        return f_mu.to(self._dtype), f_var

    def _nn_samples_differentiable(self, x: Any, n_samples: int, generator: Any) -> Any:
        """``enable_backprop=True``: the network at ``n_samples`` weight draws (every trainable
        weight, the uncovered ones at the MAP), run by torch so that the draws are functions of
        ``x`` — laplace-torch's ``_nn_functional_samples``."""
        torch = _torch()
        self._check_backprop_input(x)
        seed = self._seed(generator)
        with self._lock:
            la, state = self._query()
        draws = torch.as_tensor(np.asarray(la.sample(n_samples, seed, *state)))
        model = self.model
        named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
        was_training = model.training
        model.eval()
        try:
            fs = []
            for w in draws:
                weights, offset = {}, 0
                for name, p in named:
                    weights[name] = w[offset:offset + p.numel()].reshape(p.shape).to(p.dtype)
                    offset += p.numel()
                fs.append(torch.func.functional_call(model, weights, (x,)).reshape(x.shape[0], -1))
        finally:
            model.train(was_training)
        return torch.stack(fs).to(self._dtype)

    def _check_backprop_input(self, x: Any) -> None:
        if self.model is None:
            raise RuntimeError(
                "enable_backprop=True differentiates through the model, which a pickle does not hold: "
                "build Laplace(model, ...) again and load_state_dict(...) into it"
            )
        if not is_torch(x) or not x.is_floating_point():
            raise NotImplementedError(
                "enable_backprop=True differentiates the predictive in a floating-point input tensor; "
                f"got {type(x).__name__}{'' if not is_torch(x) else ' of ' + str(x.dtype)}"
            )

    def _rust_state(self) -> Tuple[Any, float]:
        """What Rust's queries take: λ (one value, or a list per parameter) and the temperature."""
        scale = float(self._H_factor.detach()) * self._unit()
        if len(self._prior_precision) == 1:
            return float(self._prior_precision.detach()[0]), scale
        return self.prior_precision_diag.detach().tolist(), scale

    def __call__(
        self,
        x: Any,
        pred_type: str = "glm",
        joint: bool = False,
        link_approx: str = "probit",
        n_samples: int = 100,
        diagonal_output: bool = False,
        generator: Any = None,
        fitting: bool = False,
        **model_kwargs: Any,
    ) -> Any:
        """The posterior predictive at ``x``.

        Parameters
        ----------
        x : tensor or array
            ``(batch, …)`` inputs (or a dict holding them under ``dict_key_x``).
        pred_type : {"glm", "nn"}
        joint : bool
            Regression with the GLM predictive: the ``(n·d') × (n·d')`` joint covariance.
        link_approx : {"probit", "bridge", "bridge_norm", "mc"}
        n_samples : int
            Draws for ``link_approx="mc"`` and ``pred_type="nn"``.
        diagonal_output : bool
            Regression: ``n × d'`` variances instead of ``n × d' × d'`` covariances; MC: draws
            from the diagonal.
        generator : torch.Generator, optional
            The random numbers of the MC paths.

        Returns
        -------
        tuple of tensors or tensor
            Regression: ``(f_mu, f_var)``; classification: class probabilities ``n × C``.
        """
        torch = _torch()
        if pred_type not in ("glm", "nn"):
            raise ValueError("Only glm and nn supported as prediction types.")
        if link_approx not in _LINKS:
            raise ValueError(f"Unsupported link approximation {link_approx}.")
        if pred_type == "nn" and link_approx != "mc":
            raise ValueError("Only mc link approximation is supported for nn prediction type.")
        if model_kwargs:
            raise NotImplementedError(f"model keyword arguments {sorted(model_kwargs)} are not passed to the network in fspace")
        if generator is not None and not isinstance(generator, torch.Generator):
            raise ValueError("Invalid random generator (check type and device).")
        out_dtype = x.dtype if is_torch(x) and x.is_floating_point() else self._dtype
        if pred_type == "glm":
            regression = self.likelihood == "regression"
            f_mu, f_var = self._glm(x, joint=joint and regression)
            if regression:
                if joint:
                    # laplace-torch's joint predictive: the mean flattened point-major (n·d',).
                    return f_mu.reshape(-1).to(out_dtype), f_var.to(out_dtype)
                if diagonal_output:
                    f_var = torch.diagonal(f_var, dim1=-2, dim2=-1)
                return f_mu.to(out_dtype), f_var.to(out_dtype)
            return _link(f_mu, f_var, link_approx, int(n_samples), diagonal_output, generator).to(out_dtype)
        fs = self._nn_samples(x, int(n_samples), generator)
        if self.likelihood == "regression":
            return fs.mean(dim=0).to(out_dtype), fs.var(dim=0).to(out_dtype)
        return torch.softmax(fs, dim=-1).mean(dim=0).to(out_dtype)

    def predictive(self, x: Any, pred_type: str, link_approx: str, n_samples: int) -> Any:
        """laplace-torch's ``predictive``: ``self(x, pred_type=…, link_approx=…, n_samples=…)``.

        Parameters
        ----------
        x : tensor or array
        pred_type : {"glm", "nn"}
        link_approx : {"probit", "bridge", "bridge_norm", "mc"}
        n_samples : int

        Returns
        -------
        tuple of tensors or tensor
            As ``__call__``.
        """
        return self(x, pred_type=pred_type, link_approx=link_approx, n_samples=n_samples)

    def _nn_samples(self, x: Any, n_samples: int, generator: Any) -> Any:
        torch = _torch()
        n_samples = sample_count(n_samples)
        if self.enable_backprop:
            return self._nn_samples_differentiable(x, n_samples, generator)
        xa = self._x(x)
        seed = self._seed(generator)
        with self._lock:
            la, state = self._query()
        fs = la.nn_samples(xa, n_samples, seed, *state)
        return torch.as_tensor(fs, dtype=self._dtype)

    def functional_samples(self, x: Any, pred_type: str = "glm", n_samples: int = 1, diagonal_output: bool = False,
                           generator: Any = None) -> Any:
        """Draws of ``f`` at ``x`` (GLM: from the per-point Gaussians, as laplace-torch).

        Parameters
        ----------
        x : tensor or array
            ``(batch, …)`` inputs.
        pred_type : {"glm", "nn"}, default "glm"
            Draws from the linearised predictive, or the network at weight draws.
        n_samples : int, default 1
        diagonal_output : bool, default False
            GLM: draw each output independently (the covariance's diagonal).
        generator : torch.Generator, optional
            The random numbers (a seed drawn from it keys fspace's generator).

        Returns
        -------
        torch.Tensor, shape (n_samples, n, d')
        """
        torch = _torch()
        if pred_type not in ("glm", "nn"):
            raise ValueError("Only glm and nn pred types are supported")
        if pred_type == "glm":
            f_mu, f_var = self._glm(x)
            if diagonal_output:
                f_var = torch.diagonal(f_var, dim1=1, dim2=2)
            return _normal_samples(f_mu, f_var, int(n_samples), generator)
        return self._nn_samples(x, int(n_samples), generator)

    def predictive_samples(self, x: Any, pred_type: str = "glm", n_samples: int = 100, diagonal_output: bool = False,
                           generator: Any = None) -> Any:
        """Draws of the predictive at ``x``: ``f`` for regression, its softmax for classification.

        Parameters
        ----------
        x : tensor or array
            ``(batch, …)`` inputs.
        pred_type : {"glm", "nn"}, default "glm"
            Draws from the linearised predictive, or the network at weight draws.
        n_samples : int, default 100
        diagonal_output : bool, default False
            GLM: draw each output independently (the covariance's diagonal).
        generator : torch.Generator, optional
            The random numbers (a seed drawn from it keys fspace's generator).

        Returns
        -------
        torch.Tensor, shape (n_samples, n, d')
        """
        torch = _torch()
        fs = self.functional_samples(x, pred_type, n_samples, diagonal_output, generator)
        return fs if self.likelihood == "regression" else torch.softmax(fs, dim=-1)

    def sample(self, n_samples: int = 100, generator: Any = None) -> Any:
        """Draws of the covered weights from ``N(mean, P⁻¹)`` (subnetwork Laplace: every weight,
        the uncovered ones at the MAP, as laplace-torch).

        Parameters
        ----------
        n_samples : int, default 100
        generator : torch.Generator, optional
            The random numbers (a seed drawn from it keys fspace's generator).

        Returns
        -------
        torch.Tensor, shape (n_samples, n_params)

        Raises
        ------
        MemoryError
            ``n_samples × n_params`` draws past the memory budget (draw in batches).
        """
        torch = _torch()
        n_samples = sample_count(n_samples)
        seed = self._seed(generator)
        with self._lock:
            la, state = self._query()
        draws = la.sample(int(n_samples), seed, *state)
        if self.subset_of_weights == "subnetwork":
            # laplace-torch's assemble_full_samples: every weight, the others at the MAP.
            return torch.as_tensor(np.asarray(draws), dtype=self._dtype)
        idx = self._fitted_summary()["indices"]
        return torch.as_tensor(np.asarray(draws)[:, idx], dtype=self._dtype)



_QUADRATIC_FORM: Any = None


def _quadratic_form_function() -> Any:
    """The autograd function ``J ↦ J Σ Jᵀ`` (``J`` the ``n·d' × dim`` Jacobian, point-major; the
    ``n`` blocks ``d' × d'``, or the joint ``n·d' × n·d'``) with ``Σ`` applied by a callable on
    numpy blocks. Forward: ``S = Σ Jᵀ`` (one solve), ``J S``; backward: ``J̄ = (Ḡ + Ḡᵀ) Sᵀ`` per
    block (``J Σ = Sᵀ``: no second solve). Made on first use (torch is imported lazily)."""
    global _QUADRATIC_FORM
    if _QUADRATIC_FORM is None:
        torch = _torch()

        class QuadraticForm(torch.autograd.Function):  # type: ignore[name-defined,misc]
            @staticmethod
            def forward(ctx: Any, js: Any, solve: Callable[[np.ndarray], np.ndarray], n: int, joint: bool) -> Any:
                s = torch.from_numpy(solve(js.detach().T.cpu().numpy())).to(js.dtype)  # dim × n·d'
                ctx.save_for_backward(s)
                ctx.n, ctx.joint = n, joint
                if joint:
                    out = js @ s
                    return (out + out.T) / 2
                q = js.shape[0] // n
                out = torch.einsum("bqd,dbr->bqr", js.reshape(n, q, -1), s.reshape(-1, n, q))
                return (out + out.transpose(-1, -2)) / 2

            @staticmethod
            @torch.autograd.function.once_differentiable
            def backward(ctx: Any, grad: Any) -> Any:
                (s,) = ctx.saved_tensors
                if ctx.joint:
                    return (grad + grad.T) @ s.T, None, None, None
                n = ctx.n
                q = grad.shape[-1]
                sym = grad + grad.transpose(-1, -2)
                return torch.einsum("bqr,dbr->bqd", sym, s.reshape(-1, n, q)).reshape(n * q, -1), None, None, None

        _QUADRATIC_FORM = QuadraticForm
    return _QUADRATIC_FORM
