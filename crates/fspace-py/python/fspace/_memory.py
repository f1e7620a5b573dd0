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
