"""How many threads attend's kernels use."""

from __future__ import annotations

import os
import sys

_override: int | None = None


def set_num_threads(n: int) -> None:
    """Use ``n`` threads for every following call (``None`` restores the default).

    By default attend follows ``torch.get_num_threads()`` when torch has been
    imported, so it uses the cores PyTorch uses; otherwise every core this process
    may run on.
    """
    global _override
    if n is None:
        _override = None
        return
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"set_num_threads takes an int, got {type(n).__name__}")
    if not 1 <= n <= 1024:
        raise ValueError(f"set_num_threads: n must be between 1 and 1024, got {n}")
    _override = n


def get_num_threads() -> int:
    """The number of threads the next call will use."""
    if _override is not None:
        return _override
    torch = sys.modules.get("torch")
    if torch is not None:
        return torch.get_num_threads()
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)
