"""Covariance functions for GP priors, composable as in Rust.

``RBF(variance, lengthscale)``, ``Matern12`` / ``Matern32`` / ``Matern52``,
``RationalQuadratic(variance, lengthscale, alpha)``, ``Periodic(variance, lengthscale, period)``,
``Linear(variance)``, ``Constant(variance)``, ``White(variance)``: ``k1 + k2`` is their sum,
``k1 * k2`` their product, ``c * k`` the kernel scaled by ``c > 0``. A lengthscale is a number
or one per input dimension (ARD). Hyperparameters are on their natural scale (σ², ℓ), as in the
papers' tables; they are checked when the kernel is built (a ``ValueError`` naming the kernel
and the hyperparameter: finite and > 0). ``k(X, Y)`` evaluates the Gram matrix in Rust.

Matrix-valued kernels for vector outputs: ``Independent(k, outputs)`` (outputs that share
``k``) and ``Helmholtz(phi, psi)`` (2-D vector fields: the gradient of a potential with kernel
``phi`` plus the curl of a stream function with kernel ``psi``).
"""

from __future__ import annotations

from typing import Any, Dict, List, Sequence, Union

import numpy as np

from . import _fspace

__all__ = [
    "Kernel",
    "MatrixKernel",
    "RBF",
    "Matern12",
    "Matern32",
    "Matern52",
    "RationalQuadratic",
    "Periodic",
    "Linear",
    "Constant",
    "White",
    "Independent",
    "Helmholtz",
]

Lengthscale = Union[float, Sequence[float]]


def _positive(owner: str, name: str, value: Any) -> float:
    """``value`` as a float, checked finite and > 0 when the kernel is built (a ``ValueError``
    naming the kernel and the hyperparameter otherwise)."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{owner}: hyperparameter {name} = {value!r} is not a number") from None
    if not (np.isfinite(v) and v > 0):
        shown = "NaN" if v != v else repr(v)
        raise ValueError(f"{owner}: invalid hyperparameter {name} = {shown}: must be finite and > 0")
    return v


def _lengthscales(value: Lengthscale, owner: str = "kernel") -> List[float]:
    if isinstance(value, (int, float, np.floating, np.integer)):
        return [_positive(owner, "lengthscale", value)]
    values = [_positive(owner, "lengthscale", v) for v in value]
    if not values:
        raise ValueError(f"{owner}: lengthscale is an empty sequence: give one number, or one per input dimension")
    return values


class MatrixKernel:
    """A kernel with ``d'`` outputs, the base of every kernel here.

    Examples
    --------
    >>> from fspace import kernels as K
    >>> k = K.Independent(K.RBF(1.0, 0.5), 2)
    >>> k([[0.0], [1.0]]).shape
    (4, 4)
    """

    def spec(self) -> Dict[str, Any]:
        """The kernel as the dict of fspace's ``MatrixKernelSpec`` (what crosses to Rust).

        Returns
        -------
        dict
            ``{"kind": ..., ...}``.
        """
        raise NotImplementedError

    @property
    def output_dim(self) -> int:
        """The number of outputs ``d'``."""
        return 1

    def __call__(self, x: Any, y: Any = None) -> np.ndarray:
        """The Gram matrix ``K(X, Y)``, evaluated in Rust.

        Parameters
        ----------
        x : array_like, shape (n, d)
            The first inputs.
        y : array_like, shape (m, d), optional
            The second inputs; ``x`` when omitted.

        Returns
        -------
        numpy.ndarray, shape (n·d', m·d')
            Point-major: the ``d' × d'`` block of points ``i, j`` at rows ``i·d'…``, columns ``j·d'…``.

        Raises
        ------
        ValueError
            Inputs that are not finite real 2-D arrays, dimensions that disagree, or a
            hyperparameter that is not finite and positive.
        """
        from ._convert import array2

        xa = array2(x, "X")
        ya = xa if y is None else array2(y, "Y")
        return _fspace.gram(kernel=self.spec(), x=xa, y=ya)


class Kernel(MatrixKernel):
    """A scalar kernel; ``k1 + k2``, ``k1 * k2`` and ``c * k`` compose them.

    Examples
    --------
    >>> from fspace import kernels as K
    >>> k = K.RBF(1.0, 0.3) + 0.5 * K.Periodic(1.0, 1.0, period=2.0)
    >>> round(float(k([[0.0]])[0, 0]), 6)
    1.5
    """

    def scalar_spec(self) -> Dict[str, Any]:
        """The kernel as the dict of fspace's ``KernelSpec``.

        Returns
        -------
        dict
            ``{"type": ..., hyperparameters...}``.
        """
        raise NotImplementedError

    def spec(self) -> Dict[str, Any]:
        """The kernel as a one-output ``MatrixKernelSpec``.

        Returns
        -------
        dict
            ``{"kind": "scalar", ...}``.
        """
        return {"kind": "scalar", **self.scalar_spec()}

    def __add__(self, other: "Kernel") -> "Kernel":
        if not isinstance(other, Kernel):
            return NotImplemented
        return _Composite("sum", "terms", [self, other])

    def __mul__(self, other: Union["Kernel", float]) -> "Kernel":
        if isinstance(other, Kernel):
            return _Composite("product", "factors", [self, other])
        if isinstance(other, (int, float, np.floating, np.integer)) and not isinstance(other, bool):
            return _Scaled(_positive("a scaled kernel", "scale", other), self)
        return NotImplemented

    __rmul__ = __mul__

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.scalar_spec()})"


class _Stationary(Kernel):
    _type = ""

    def __init__(self, variance: float = 1.0, lengthscale: Lengthscale = 1.0) -> None:
        name = type(self).__name__
        self.variance = _positive(name, "variance", variance)
        self.lengthscale = _lengthscales(lengthscale, name)

    def scalar_spec(self) -> Dict[str, Any]:
        return {"type": self._type, "variance": self.variance, "lengthscales": self.lengthscale}


class RBF(_Stationary):
    """``σ² exp(−r²/2)``, ``r = ‖(x − y)/ℓ‖``: infinitely smooth paths.

    Parameters
    ----------
    variance : float, default 1.0
        The marginal variance σ² (> 0).
    lengthscale : float or sequence of float, default 1.0
        ℓ (> 0), one number or one per input dimension (ARD).

    Examples
    --------
    >>> from fspace import kernels as K
    >>> K.RBF(1.0, 0.5).lengthscale
    [0.5]
    """

    _type = "rbf"


class Matern12(_Stationary):
    """``σ² exp(−r)``: continuous, nowhere-differentiable paths (Ornstein–Uhlenbeck).

    Parameters
    ----------
    variance : float, default 1.0
        The marginal variance σ² (> 0).
    lengthscale : float or sequence of float, default 1.0
        ℓ (> 0), one number or one per input dimension (ARD).

    Examples
    --------
    >>> from fspace import kernels as K
    >>> K.Matern12(1.0, 0.5).lengthscale
    [0.5]
    """

    _type = "matern12"


class Matern32(_Stationary):
    """``σ² (1 + √3 r) exp(−√3 r)``: once-differentiable paths.

    Parameters
    ----------
    variance : float, default 1.0
        The marginal variance σ² (> 0).
    lengthscale : float or sequence of float, default 1.0
        ℓ (> 0), one number or one per input dimension (ARD).

    Examples
    --------
    >>> from fspace import kernels as K
    >>> K.Matern32(1.0, [0.5, 2.0]).lengthscale
    [0.5, 2.0]
    """

    _type = "matern32"


class Matern52(_Stationary):
    """``σ² (1 + √5 r + 5r²/3) exp(−√5 r)``: twice-differentiable paths.

    Parameters
    ----------
    variance : float, default 1.0
        The marginal variance σ² (> 0).
    lengthscale : float or sequence of float, default 1.0
        ℓ (> 0), one number or one per input dimension (ARD).

    Examples
    --------
    >>> from fspace import kernels as K
    >>> K.Matern52(2.0, 1.0).lengthscale
    [1.0]
    """

    _type = "matern52"


class RationalQuadratic(Kernel):
    """``σ² (1 + r²/(2α))^(−α)``: a scale mixture of RBFs.

    Parameters
    ----------
    variance : float, default 1.0
        The marginal variance σ² (> 0).
    lengthscale : float or sequence of float, default 1.0
        ℓ (> 0), one number or one per input dimension (ARD).
    alpha : float, default 1.0
        The mixture's shape α (> 0); α → ∞ is the RBF.

    Examples
    --------
    >>> from fspace import kernels as K
    >>> K.RationalQuadratic(1.0, 1.0, alpha=2.0).alpha
    2.0
    """

    def __init__(self, variance: float = 1.0, lengthscale: Lengthscale = 1.0, alpha: float = 1.0) -> None:
        self.variance = _positive("RationalQuadratic", "variance", variance)
        self.lengthscale = _lengthscales(lengthscale, "RationalQuadratic")
        self.alpha = _positive("RationalQuadratic", "alpha", alpha)

    def scalar_spec(self) -> Dict[str, Any]:
        """See ``Kernel.scalar_spec``.

        Returns
        -------
        dict
        """
        return {"type": "rational_quadratic", "variance": self.variance, "lengthscales": self.lengthscale, "alpha": self.alpha}


class Periodic(Kernel):
    """``σ² exp(−2 Σ sin²(π|x − y|/p)/ℓ²)``: periodic functions of period ``p``.

    Parameters
    ----------
    variance : float, default 1.0
        The marginal variance σ² (> 0).
    lengthscale : float or sequence of float, default 1.0
        ℓ (> 0), one number or one per input dimension (ARD).
    period : float, default 1.0
        The period ``p`` (> 0).

    Examples
    --------
    >>> from fspace import kernels as K
    >>> k = K.Periodic(1.0, 1.0, period=2.0)
    >>> bool(abs(k([[0.0]], [[2.0]])[0, 0] - 1.0) < 1e-12)  # one period apart: fully correlated
    True
    """

    def __init__(self, variance: float = 1.0, lengthscale: Lengthscale = 1.0, period: float = 1.0) -> None:
        self.variance = _positive("Periodic", "variance", variance)
        self.lengthscale = _lengthscales(lengthscale, "Periodic")
        self.period = _positive("Periodic", "period", period)

    def scalar_spec(self) -> Dict[str, Any]:
        """See ``Kernel.scalar_spec``.

        Returns
        -------
        dict
        """
        return {"type": "periodic", "variance": self.variance, "lengthscales": self.lengthscale, "period": self.period}


class _Variance(Kernel):
    _type = ""

    def __init__(self, variance: float = 1.0) -> None:
        self.variance = _positive(type(self).__name__, "variance", variance)

    def scalar_spec(self) -> Dict[str, Any]:
        return {"type": self._type, "variance": self.variance}


class Linear(_Variance):
    """``σ² xᵀy``: linear functions through the origin.

    Parameters
    ----------
    variance : float, default 1.0
        σ² (> 0).

    Examples
    --------
    >>> from fspace import kernels as K
    >>> float(K.Linear(2.0)([[1.0]])[0, 0])
    2.0
    """

    _type = "linear"


class Constant(_Variance):
    """``σ²``: constant functions.

    Parameters
    ----------
    variance : float, default 1.0
        σ² (> 0).

    Examples
    --------
    >>> from fspace import kernels as K
    >>> float(K.Constant(2.0)([[1.0]])[0, 0])
    2.0
    """

    _type = "constant"


class White(_Variance):
    """``σ² [x = y]``: independent noise.

    Parameters
    ----------
    variance : float, default 1.0
        σ² (> 0).

    Examples
    --------
    >>> from fspace import kernels as K
    >>> float(K.White(2.0)([[1.0]])[0, 0])
    2.0
    """

    _type = "white"


class _Composite(Kernel):
    kind: str
    key: str
    parts: List[Kernel]

    def __init__(self, kind: str, key: str, parts: List[Kernel]) -> None:
        flat: List[Kernel] = []
        for p in parts:  # (a + b) + c is one sum of three terms, as in Rust's builders
            flat.extend(p.parts if isinstance(p, _Composite) and p.kind == kind else [p])
        self.kind, self.key, self.parts = kind, key, flat

    def scalar_spec(self) -> Dict[str, Any]:
        return {"type": self.kind, self.key: [p.scalar_spec() for p in self.parts]}

    def __repr__(self) -> str:
        op = " + " if self.kind == "sum" else " * "
        return "(" + op.join(repr(p) for p in self.parts) + ")"


class _Scaled(Kernel):
    def __init__(self, scale: float, kernel: Kernel) -> None:
        self.scale, self.kernel = scale, kernel

    def scalar_spec(self) -> Dict[str, Any]:
        return {"type": "scaled", "scale": self.scale, "kernel": self.kernel.scalar_spec()}

    def __repr__(self) -> str:
        return f"{self.scale} * {self.kernel!r}"


class Independent(MatrixKernel):
    """``outputs`` independent outputs that share the scalar kernel ``kernel``.

    Parameters
    ----------
    kernel : Kernel
        The scalar kernel of every output.
    outputs : int
        The number of outputs ``d'``.

    Raises
    ------
    TypeError
        ``kernel`` is not a scalar kernel.

    Examples
    --------
    >>> from fspace import kernels as K
    >>> K.Independent(K.RBF(1.0, 1.0), 10).output_dim
    10
    """

    def __init__(self, kernel: Kernel, outputs: int) -> None:
        if not isinstance(kernel, Kernel):
            raise TypeError(f"Independent needs a scalar kernel, got {kernel!r}")
        if isinstance(outputs, bool) or not isinstance(outputs, (int, np.integer)) or outputs < 1:
            raise ValueError(f"Independent: outputs = {outputs!r} must be a whole number ≥ 1")
        self.kernel, self.outputs = kernel, int(outputs)

    @property
    def output_dim(self) -> int:
        """The number of outputs ``d'``."""
        return self.outputs

    def spec(self) -> Dict[str, Any]:
        """See ``MatrixKernel.spec``.

        Returns
        -------
        dict
        """
        return {"kind": "independent", "kernel": self.kernel.scalar_spec(), "outputs": self.outputs}


class Helmholtz(MatrixKernel):
    """2-D vector fields ``∇Φ + rot Ψ`` with ``Φ ~ GP(0, phi)``, ``Ψ ~ GP(0, psi)`` (FSP-Laplace's
    ocean currents): divergence-free where ``phi`` vanishes, curl-free where ``psi`` does.

    Parameters
    ----------
    phi : Kernel
        The kernel of the potential Φ (needs second derivatives: RBF, Matérn-5/2, …).
    psi : Kernel
        The kernel of the stream function Ψ.

    Raises
    ------
    TypeError
        ``phi`` or ``psi`` is not a scalar kernel.

    Examples
    --------
    >>> from fspace import kernels as K
    >>> k = K.Helmholtz(K.RBF(1.0, 1.0), K.RBF(1.0, 1.0))
    >>> k([[0.0, 0.0], [1.0, 0.5]]).shape
    (4, 4)
    """

    def __init__(self, phi: Kernel, psi: Kernel) -> None:
        if not (isinstance(phi, Kernel) and isinstance(psi, Kernel)):
            raise TypeError("Helmholtz needs two scalar kernels (phi, psi)")
        self.phi, self.psi = phi, psi

    @property
    def output_dim(self) -> int:
        """2: the field's two components."""
        return 2

    def spec(self) -> Dict[str, Any]:
        """See ``MatrixKernel.spec``.

        Returns
        -------
        dict
        """
        return {"kind": "helmholtz", "phi": self.phi.scalar_spec(), "psi": self.psi.scalar_spec()}
