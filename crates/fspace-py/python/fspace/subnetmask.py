"""Subnetwork masks for ``Laplace(..., subset_of_weights="subnetwork", subnetwork_indices=...)``,
with laplace-torch 0.3's classes and selection rules (``laplace.utils.subnetmask``).

Each mask's ``select(train_loader)`` returns the flat indices (``named_parameters()`` order, as
``torch.nn.utils.parameters_to_vector``) of the chosen parameters as a ``torch.LongTensor``:

* ``LargestMagnitudeSubnetMask(model, n_params_subnet)``: the largest ``|w|``;
* ``LargestVarianceDiagLaplaceSubnetMask(model, n_params_subnet, diag_laplace_model)``: the
  largest marginal variances of a diagonal Laplace over every weight (fitted on the loader);
* ``RandomSubnetMask(model, n_params_subnet)``: uniformly at random (torch's generator);
* ``ParamNameSubnetMask(model, parameter_names)``, ``ModuleNameSubnetMask(model, module_names)``,
  ``LastLayerSubnetMask(model)``: by name.

Ties among scores break as laplace-torch's ``torch.argsort(descending=True)`` breaks them, so
both libraries choose the same indices (``tests/test_laplace_parity.py``).

Examples
--------
>>> import torch, fspace
>>> from fspace.subnetmask import LargestMagnitudeSubnetMask
>>> model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Tanh(), torch.nn.Linear(3, 1))
>>> idx = LargestMagnitudeSubnetMask(model, n_params_subnet=4).select()
>>> idx.shape
torch.Size([4])
"""

from __future__ import annotations

from typing import Any, List, Optional

__all__ = [
    "SubnetMask",
    "RandomSubnetMask",
    "LargestMagnitudeSubnetMask",
    "LargestVarianceDiagLaplaceSubnetMask",
    "ParamNameSubnetMask",
    "ModuleNameSubnetMask",
    "LastLayerSubnetMask",
]


def _torch() -> Any:
    import torch

    return torch


class SubnetMask:
    """The base class: ``select(train_loader)`` → the chosen flat parameter indices.

    Parameters
    ----------
    model : torch.nn.Module
        The trained network.

    Raises
    ------
    TypeError
        ``model`` is not a ``torch.nn.Module``.

    Examples
    --------
    >>> import torch
    >>> from fspace.subnetmask import LastLayerSubnetMask
    >>> model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Tanh(), torch.nn.Linear(3, 1))
    >>> LastLayerSubnetMask(model).select().tolist()
    [9, 10, 11, 12]
    """

    def __init__(self, model: Any) -> None:
        torch = _torch()
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"a subnetwork mask needs a torch.nn.Module, got {type(model).__name__}")
        self.model = model
        self.parameter_vector = torch.nn.utils.parameters_to_vector(model.parameters()).detach()
        self._n_params = len(self.parameter_vector)
        self._indices: Optional[Any] = None

    @property
    def indices(self) -> Any:
        """The selected flat indices (after ``select``)."""
        if self._indices is None:
            raise AttributeError("Subnetwork mask not selected. Run select() first.")
        return self._indices

    @property
    def n_params_subnet(self) -> int:
        """The number of selected parameters (after ``select``)."""
        return int(len(self.indices))

    def select(self, train_loader: Any = None) -> Any:
        """Chooses the parameters.

        Parameters
        ----------
        train_loader : DataLoader, optional
            The data the score needs (``LargestVarianceDiagLaplaceSubnetMask``); unused otherwise.

        Returns
        -------
        torch.LongTensor
            The chosen flat indices, ascending (``named_parameters()`` order).

        Raises
        ------
        ValueError
            A second ``select``, or a loader missing where the score needs one.
        """
        if self._indices is not None:
            raise ValueError("Subnetwork mask already selected.")
        mask = self.get_subnet_mask(train_loader)
        self._indices = mask.nonzero(as_tuple=True)[0]
        return self._indices

    def get_subnet_mask(self, train_loader: Any) -> Any:
        """The boolean mask over the flat parameters (laplace-torch's hook for subclasses).

        Parameters
        ----------
        train_loader : DataLoader or None

        Returns
        -------
        torch.BoolTensor
        """
        raise NotImplementedError


class _ScoreBased(SubnetMask):
    def __init__(self, model: Any, n_params_subnet: int) -> None:
        super().__init__(model)
        if n_params_subnet is None:
            raise ValueError("Need to pass number of subnetwork parameters when using subnetwork Laplace.")
        n = int(n_params_subnet)
        if n < 1:
            raise ValueError(f"n_params_subnet {n_params_subnet} must be ≥ 1")
        if n > self._n_params:
            raise ValueError(f"Subnetwork ({n}) cannot be larger than model ({self._n_params}).")
        self._n_select = n

    def compute_param_scores(self, train_loader: Any) -> Any:
        """One score per flat parameter; the largest are chosen.

        Parameters
        ----------
        train_loader : DataLoader or None

        Returns
        -------
        torch.Tensor
        """
        raise NotImplementedError

    def get_subnet_mask(self, train_loader: Any) -> Any:
        torch = _torch()
        scores = self.compute_param_scores(train_loader)
        if scores.shape != self.parameter_vector.shape:
            raise ValueError("Parameter scores need to be of same shape as parameter vector.")
        idx = torch.argsort(scores, descending=True)[: self._n_select].sort()[0]
        mask = torch.zeros_like(self.parameter_vector).bool()
        mask[idx] = True
        return mask


class RandomSubnetMask(_ScoreBased):
    """Parameters drawn uniformly at random (torch's global generator).

    Parameters
    ----------
    model : torch.nn.Module
        The trained network.
    n_params_subnet : int
        How many parameters to choose (1 … the model's count).

    Raises
    ------
    ValueError
        ``n_params_subnet`` missing, below 1 or above the model's parameter count.

    Examples
    --------
    >>> import torch
    >>> from fspace.subnetmask import RandomSubnetMask
    >>> model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Tanh(), torch.nn.Linear(3, 1))
    >>> len(RandomSubnetMask(model, 5).select())
    5
    """

    def compute_param_scores(self, train_loader: Any) -> Any:
        """Uniform random scores.

        Parameters
        ----------
        train_loader : DataLoader or None
            Unused.

        Returns
        -------
        torch.Tensor
        """
        return _torch().rand_like(self.parameter_vector)


class LargestMagnitudeSubnetMask(_ScoreBased):
    """The parameters of largest magnitude.

    Parameters
    ----------
    model : torch.nn.Module
        The trained network.
    n_params_subnet : int
        How many parameters to choose (1 … the model's count).

    Raises
    ------
    ValueError
        ``n_params_subnet`` missing, below 1 or above the model's parameter count.

    Examples
    --------
    >>> import torch
    >>> from fspace.subnetmask import LargestMagnitudeSubnetMask
    >>> model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Tanh(), torch.nn.Linear(3, 1))
    >>> len(LargestMagnitudeSubnetMask(model, 3).select())
    3
    """

    def compute_param_scores(self, train_loader: Any) -> Any:
        """``|w|``.

        Parameters
        ----------
        train_loader : DataLoader or None
            Unused.

        Returns
        -------
        torch.Tensor
        """
        return self.parameter_vector.abs()


class LargestVarianceDiagLaplaceSubnetMask(_ScoreBased):
    """The parameters of largest marginal variance under a diagonal Laplace over every weight
    (``diag_laplace_model``: ``fspace.Laplace(model, lik, "all", "diag", ...)``, fitted on
    ``train_loader`` by ``select``).

    Parameters
    ----------
    model : torch.nn.Module
        The trained network.
    n_params_subnet : int
        How many parameters to choose (1 … the model's count).
    diag_laplace_model : fspace.Laplace
        A diagonal Laplace over every weight of ``model``.

    Raises
    ------
    ValueError
        ``n_params_subnet`` out of range, or a ``diag_laplace_model`` of another structure or subset.

    Examples
    --------
    >>> import torch, fspace
    >>> from fspace.subnetmask import LargestVarianceDiagLaplaceSubnetMask
    >>> model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Tanh(), torch.nn.Linear(3, 1)).double()
    >>> x = torch.randn(20, 2, dtype=torch.float64)
    >>> loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x[:, :1]), batch_size=10)
    >>> diag = fspace.Laplace(model, "regression", "all", "diag")
    >>> len(LargestVarianceDiagLaplaceSubnetMask(model, 4, diag).select(loader))
    4
    """

    def __init__(self, model: Any, n_params_subnet: int, diag_laplace_model: Any) -> None:
        super().__init__(model, n_params_subnet)
        structure = getattr(diag_laplace_model, "hessian_structure", None)
        subset = getattr(diag_laplace_model, "subset_of_weights", None)
        if (structure, subset) != ("diag", "all"):
            raise ValueError(
                "diag_laplace_model must be a Laplace with hessian_structure='diag' over subset_of_weights='all', "
                f"got {structure!r} over {subset!r}"
            )
        self.diag_laplace_model = diag_laplace_model

    def compute_param_scores(self, train_loader: Any) -> Any:
        """The diagonal Laplace's marginal variances, fitted on ``train_loader``.

        Parameters
        ----------
        train_loader : DataLoader

        Returns
        -------
        torch.Tensor

        Raises
        ------
        ValueError
            No loader.
        """
        if train_loader is None:
            raise ValueError("Need to pass train loader for subnet selection.")
        self.diag_laplace_model.fit(train_loader)
        return self.diag_laplace_model.posterior_variance.to(self.parameter_vector.dtype)


class ParamNameSubnetMask(SubnetMask):
    """The parameters named in ``parameter_names`` (``model.named_parameters()`` names).

    Parameters
    ----------
    model : torch.nn.Module
        The trained network.
    parameter_names : list of str

    Raises
    ------
    ValueError
        An empty list or a name the model does not have.

    Examples
    --------
    >>> import torch
    >>> from fspace.subnetmask import ParamNameSubnetMask
    >>> model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Tanh(), torch.nn.Linear(3, 1))
    >>> ParamNameSubnetMask(model, ["2.bias"]).select().tolist()
    [12]
    """

    def __init__(self, model: Any, parameter_names: List[str]) -> None:
        super().__init__(model)
        self._parameter_names = list(parameter_names)
        if not self._parameter_names:
            raise ValueError("Parameter name list cannot be empty.")
        known = {name for name, _ in model.named_parameters()}
        missing = [n for n in self._parameter_names if n not in known]
        if missing:
            raise ValueError(f"Parameters {missing} do not exist in model.")

    def get_subnet_mask(self, train_loader: Any) -> Any:
        """The named parameters' entries set.

        Parameters
        ----------
        train_loader : DataLoader or None
            Unused.

        Returns
        -------
        torch.BoolTensor
        """
        torch = _torch()
        parts = [(torch.ones_like if name in self._parameter_names else torch.zeros_like)(p.detach().reshape(-1))
                 for name, p in self.model.named_parameters()]
        return torch.cat(parts).bool()


class ModuleNameSubnetMask(SubnetMask):
    """The parameters of the leaf modules named in ``module_names``.

    Parameters
    ----------
    model : torch.nn.Module
        The trained network.
    module_names : list of str
        ``model.named_modules()`` names of leaf modules with parameters (checked by ``select``).

    Examples
    --------
    >>> import torch
    >>> from fspace.subnetmask import ModuleNameSubnetMask
    >>> model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Tanh(), torch.nn.Linear(3, 1))
    >>> ModuleNameSubnetMask(model, ["0"]).select().tolist()
    [0, 1, 2, 3, 4, 5, 6, 7, 8]
    """

    def __init__(self, model: Any, module_names: List[str]) -> None:
        super().__init__(model)
        self._module_names = list(module_names)

    def _check_module_names(self) -> None:
        if not self._module_names:
            raise ValueError("Module name list cannot be empty.")
        remaining = list(self._module_names)
        for name, module in self.model.named_modules():
            if name in remaining:
                if len(list(module.children())) > 0:
                    raise ValueError(f'Module "{name}" has children, which is not supported.')
                if len(list(module.parameters())) == 0:
                    raise ValueError(f'Module "{name}" does not have any parameters.')
                remaining.remove(name)
        if remaining:
            raise ValueError(f"Modules {remaining} do not exist in model.")

    def get_subnet_mask(self, train_loader: Any) -> Any:
        """The named modules' parameters set.

        Parameters
        ----------
        train_loader : DataLoader or None
            Unused.

        Returns
        -------
        torch.BoolTensor

        Raises
        ------
        ValueError
            An empty list, a module that does not exist, has children or has no parameters.
        """
        torch = _torch()
        self._check_module_names()
        parts = []
        for name, module in self.model.named_modules():
            if len(list(module.children())) > 0 or len(list(module.parameters())) == 0:
                continue
            vec = torch.nn.utils.parameters_to_vector(module.parameters()).detach()
            parts.append(torch.ones_like(vec) if name in self._module_names else torch.zeros_like(vec))
        return torch.cat(parts).bool()


class LastLayerSubnetMask(ModuleNameSubnetMask):
    """The last ``nn.Linear`` layer's parameters (or the module ``last_layer_name``).

    Parameters
    ----------
    model : torch.nn.Module
        The trained network.
    last_layer_name : str, optional
        The module to take; the last ``nn.Linear`` by default.

    Raises
    ------
    ValueError
        No ``nn.Linear`` in the model and no name given.

    Examples
    --------
    >>> import torch
    >>> from fspace.subnetmask import LastLayerSubnetMask
    >>> model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Tanh(), torch.nn.Linear(3, 1))
    >>> LastLayerSubnetMask(model).select().tolist()
    [9, 10, 11, 12]
    """

    def __init__(self, model: Any, last_layer_name: Optional[str] = None) -> None:
        super().__init__(model, [] if last_layer_name is None else [last_layer_name])
        if last_layer_name is None:
            torch = _torch()
            linears = [name for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
            if not linears:
                raise ValueError("the model has no nn.Linear layer: give last_layer_name")
            self._module_names = [linears[-1]]
