"""The ``Examples`` sections of the package's docstrings run as doctests."""

import doctest
import importlib

import pytest

pytest.importorskip("torch")

MODULES = ["fspace", "fspace._convert", "fspace._functional", "fspace._ella_laplace", "fspace._laplace", "fspace._laplace_settings",
           "fspace._laplace_fit", "fspace._laplace_evidence", "fspace._laplace_predictive", "fspace._laplace_tuning",
           "fspace._laplace_saving", "fspace._marglik", "fspace._memory", "fspace._method_base", "fspace._network_method",
           "fspace._methods", "fspace._torch", "fspace._torch_calls", "fspace._torch_layout", "fspace._variational", "fspace.kernels",
           "fspace.metrics", "fspace.subnetmask", "fspace.torch"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name, one_torch_thread):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE, verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} docstring examples of {name} failed"


def public_objects():
    """Every public class and function of the package, and the public methods and properties
    each class defines (``__call__`` included), as ``(qualified name, object, kind)``."""
    import inspect

    import fspace
    import fspace.kernels
    import fspace.metrics
    import fspace.subnetmask
    import fspace.torch

    out = []
    for mod, names in ((fspace, [n for n in fspace.__all__ if n not in ("kernels", "metrics", "subnetmask")]),
                       (fspace.kernels, fspace.kernels.__all__), (fspace.metrics, fspace.metrics.__all__),
                       (fspace.subnetmask, fspace.subnetmask.__all__), (fspace.torch, fspace.torch.__all__)):
        for name in names:
            obj = getattr(mod, name)
            kind = "exception" if inspect.isclass(obj) and issubclass(obj, BaseException) else \
                "class" if inspect.isclass(obj) else "function"
            out.append((f"{mod.__name__}.{name}", obj, kind))
            if kind != "class":
                continue
            # Its own and the inherited members of fspace's (private) base classes.
            members = {}
            for base in reversed(obj.__mro__):
                if base.__module__.startswith("fspace"):
                    members.update(vars(base))
            for attr, value in members.items():
                if attr.startswith("_") and attr != "__call__":
                    continue
                if isinstance(value, property):
                    out.append((f"{mod.__name__}.{name}.{attr}", value, "property"))
                elif inspect.isfunction(value):
                    out.append((f"{mod.__name__}.{name}.{attr}", value, "method"))
    return out


def _section(doc: str, title: str) -> bool:
    return f"\n{title}\n{'-' * len(title)}\n" in f"\n{doc}"


def _numpydoc_problems(name, obj, kind):
    import inspect

    doc = inspect.getdoc(obj) or ""
    if not doc.strip():
        return [f"{name}: no docstring"]
    if kind in ("property", "exception"):
        return []
    problems = []
    signature = inspect.signature(obj)
    params = [p for p in signature.parameters.values() if p.name != "self"]
    if params and not _section(doc, "Parameters"):
        problems.append(f"{name}: no Parameters section")
    if kind in ("function", "method") and signature.return_annotation not in (None, "None", inspect.Signature.empty) \
            and not _section(doc, "Returns"):
        problems.append(f"{name}: no Returns section")
    if kind in ("class", "function") and not _section(doc, "Examples"):
        problems.append(f"{name}: no Examples section")
    return problems


def test_every_public_object_has_its_numpydoc_sections():
    """numpydoc on the public API: every class and function has Parameters (when it takes any)
    and Examples (run above as doctests), every function and method Returns (when it returns
    something) and Parameters (when it takes any), every property a docstring."""
    pytest.importorskip("torch")
    problems = [p for name, obj, kind in public_objects() for p in _numpydoc_problems(name, obj, kind)]
    assert not problems, f"{len(problems)} docstrings lack numpydoc sections:\n" + "\n".join(problems)
