"""fspace for Python: Bayesian deep learning with function-space priors on a Rust core.

* ``fspace.Laplace(model, "regression" | "classification", ...)``: laplace-torch's calls (fit,
  ``optimize_prior_precision``, the GLM / sampled predictive, the evidence, weight samples).
* ``fspace.FSPLaplace``, ``fspace.GFSVI``, ``fspace.VaLLA``, ``fspace.ELLA``,
  ``fspace.ExactGP``: the function-space methods, with a ``fspace.GPPrior`` built from
  ``fspace.kernels`` (``Matern12(1.0, 0.5) + RBF(...)``, ``Periodic``, ``Helmholtz``, ...).

``model`` is a PyTorch ``nn.Sequential`` of ``Linear`` layers and one activation (``Tanh``,
``ReLU``, ``Sigmoid``, ``Softplus`` or ``GELU(approximate="tanh")``), optionally after
``Conv2d`` blocks (stride 1, no or "same" padding, then the activation and an optional
``MaxPool2d(2)``) and a ``Flatten``; or a ``(state_dict, activation)`` pair with numpy arrays
(``(state_dict, activation, architecture)`` for a CNN). A CNN takes ``N × C × H × W`` images
(or flattened rows with ``input_shape=(C, H, W)``). Anything else (another layer, a custom
``forward``, two different activations) is a ``TypeError`` / ``ValueError`` that names the
module with ``backend="native"``, never a wrong model; the default ``backend="auto"`` takes any
other ``torch.nn.Module`` through torch's own derivatives (``fspace._torch``) for the
structures and methods that need only ``f``, ``J·U`` and ``Jᵀ·L``. The numbers come from the compiled module ``fspace._fspace`` (the
Rust crate ``fspace-py``), in float64; float32 weights are read exactly.

Where it differs from laplace-torch: inputs and outputs are numpy arrays (torch tensors are
accepted and converted; results come back as torch tensors when the input was one), there is
no autograd through the evidence (``optimize_prior_precision`` runs fspace's own searches), and
``subset_of_weights="last_layer"`` is the last Linear layer's weights and bias.

Errors: bad input → ``ValueError``, an unsupported request → ``NotImplementedError``, a
curvature over its size limit → ``MemoryError``, a numerical failure →
``fspace.NumericalError``; the message is the Rust error's text.
"""

from __future__ import annotations

from . import kernels
from ._convert import ModelSpec, convert_sequential
from ._fspace import NumericalError
from ._laplace import Laplace
from ._methods import ELLA, GFSVI, FSPLaplace, ExactGP, GPPrior, VaLLA, default_config

__all__ = [
    "Laplace",
    "FSPLaplace",
    "GFSVI",
    "VaLLA",
    "ELLA",
    "ExactGP",
    "GPPrior",
    "kernels",
    "default_config",
    "NumericalError",
    "convert_sequential",
    "ModelSpec",
]
