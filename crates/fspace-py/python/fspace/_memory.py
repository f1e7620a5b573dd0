"""The memory budget, from Python (the compiled module's ``set_memory_limit`` / ``memory_limit``)."""

from __future__ import annotations

from typing import Optional

from . import _fspace


def set_memory_limit(bytes: Optional[int]) -> None:  # noqa: A002 - the compiled function's name
    """Sets the memory budget every fit, predictive and sampler checks before its large allocations.

    A request past the budget raises ``MemoryError`` naming the structure, the size and a
    cheaper choice, instead of an allocation failure that would abort the interpreter.

    Parameters
    ----------
    bytes : int or None
        The budget in bytes (≥ 1); ``None`` returns to ``$FSPACE_MEMORY_LIMIT`` or the
        machine's available memory, read at each check.

    Raises
    ------
    ValueError
        A budget of 0 bytes.
    TypeError, OverflowError
        A value that is not a whole number of bytes ≥ 0.

    Examples
    --------
    >>> import fspace
    >>> fspace.set_memory_limit(8 << 30)  # 8 GiB
    >>> fspace.memory_limit()
    8589934592
    >>> fspace.set_memory_limit(None)
    """
    _fspace.set_memory_limit(bytes)


def memory_limit() -> Optional[int]:
    """The memory budget now.

    Returns
    -------
    int or None
        In bytes: ``set_memory_limit``'s, else ``$FSPACE_MEMORY_LIMIT``'s, else the machine's
        available memory; ``None`` where none is known (no limit).

    Examples
    --------
    >>> import fspace
    >>> limit = fspace.memory_limit()
    >>> limit is None or limit > 0
    True
    """
    return _fspace.memory_limit()


def _gib(n: float) -> str:
    return f"{n / 1073741824.0:.1f} GiB"


def check_budget(nbytes: int, what: str, cheaper: str) -> None:
    """Refuses, before the allocation, a tensor the memory budget cannot hold.

    The Python layer's twin of the compiled module's check (the same message): a torch
    allocation past the machine's memory raises torch's ``RuntimeError`` or, worse, is killed
    by the kernel; this raises ``MemoryError`` naming ``what``, its size and ``cheaper``.

    Parameters
    ----------
    nbytes : int
        The bytes the allocation will hold.
    what : str
        What would be allocated (``"4 × 10⁹ predictive samples"``).
    cheaper : str
        A cheaper request, said to the user.

    Raises
    ------
    MemoryError
        ``nbytes`` past ``memory_limit()``.

    Examples
    --------
    >>> import fspace
    >>> from fspace._memory import check_budget
    >>> fspace.set_memory_limit(1 << 30)
    >>> check_budget(8, "one float64", "none")
    >>> check_budget(1 << 40, "a terabyte", "ask for less")
    Traceback (most recent call last):
    ...
    MemoryError: a terabyte needs 1024.0 GiB but the memory budget is 1.0 GiB (...): ask for less
    >>> fspace.set_memory_limit(None)
    """
    limit = memory_limit()
    if limit is not None and nbytes > limit:
        raise MemoryError(f"{what} needs {_gib(nbytes)} but the memory budget is {_gib(limit)} (the available "
                          f"memory, or FSPACE_MEMORY_LIMIT / fspace.set_memory_limit): {cheaper}")
