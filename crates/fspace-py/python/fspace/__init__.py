"""fspace for Python: Bayesian deep learning with function-space priors on a Rust core.

* ``fspace.Laplace(model, "regression" | "classification", ...)``: laplace-torch 0.3's calls,
  positional order and defaults (``subset_of_weights="last_layer"``, ``hessian_structure="kron"``;
  fit, ``optimize_prior_precision``, the GLM / sampled predictive, the evidence, weight samples);
  ``fspace.marglik_training``, laplace-torch's online evidence training, on it;
  ``hessian_structure="gp"`` with ``functional_approximation="nystrom"`` returns laplace-torch's
  ``ELLA`` (``fspace.ELLALaplace``), with ``"variational"`` its ``VaLLA``
  (``fspace.VaLLALaplace``).
* ``fspace.FSPLaplace``, ``fspace.GFSVI``, ``fspace.VaLLA``, ``fspace.ELLA``,
  ``fspace.ExactGP``: the function-space methods, with a ``fspace.GPPrior`` built from
  ``fspace.kernels`` (``Matern12(1.0, 0.5) + RBF(...)``, ``Periodic``, ``Helmholtz``, ...).
* ``fspace.metrics``: the papers' evaluation metrics (NLL, accuracy, ECE, Brier, RMSE, CRPS,
  CQM, OOD ROC-AUC), exact over the shards of a process group.

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

``fspace.Laplace`` takes laplace-torch 0.3's calls and gives its numbers (``docs/laplace-torch.md``
lists the parity suite's checks and every difference): the hyperparameters are torch tensors,
``log_marginal_likelihood(prior_precision, sigma_noise)`` is differentiable in both, results
come back as torch tensors, and ``fit(loader)`` sums each batch's curvature in Rust as it comes.
The function-space methods take numpy arrays or tensors and return what they were given.

Errors: bad input → ``ValueError``, an unsupported request → ``NotImplementedError``, a
curvature over its size limit or a request over the memory budget → ``MemoryError`` (checked
before the allocation: the budget is the available memory, or ``fspace.set_memory_limit(bytes)``
/ ``FSPACE_MEMORY_LIMIT``), a numerical failure → ``fspace.NumericalError``, Ctrl-C during a
fit → ``KeyboardInterrupt`` (the object keeps its earlier state); the message is the Rust
error's text.
"""

from __future__ import annotations

from . import kernels, metrics, subnetmask
from ._convert import ModelSpec, convert_sequential
from ._fspace import NumericalError
from ._ella_laplace import ELLALaplace
from ._laplace import Laplace
from ._variational import VaLLALaplace
from ._marglik import marglik_training
from ._memory import memory_limit, set_memory_limit
from ._methods import ELLA, GFSVI, FSPLaplace, ExactGP, GPPrior, VaLLA, default_config

__all__ = [
    "Laplace",
    "ELLALaplace",
    "VaLLALaplace",
    "marglik_training",
    "FSPLaplace",
    "GFSVI",
    "VaLLA",
    "ELLA",
    "ExactGP",
    "GPPrior",
    "kernels",
    "metrics",
    "subnetmask",
    "default_config",
    "NumericalError",
    "set_memory_limit",
    "memory_limit",
    "convert_sequential",
    "ModelSpec",
]
