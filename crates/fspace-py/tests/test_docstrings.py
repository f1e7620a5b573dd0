"""The ``Examples`` sections of the package's docstrings run as doctests."""

import doctest
import importlib

import pytest

pytest.importorskip("torch")

MODULES = ["fspace", "fspace._functional", "fspace._laplace", "fspace._marglik", "fspace._methods", "fspace.kernels",
           "fspace.subnetmask", "fspace.torch"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name, one_torch_thread):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE, verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} docstring examples of {name} failed"
