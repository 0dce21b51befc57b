"""Give freed heap memory back to the kernel after a planned shrink (glibc ``malloc_trim``).

Why: the cooperative memory downscale only helps if usage (``memory.current``) really falls once
the rings hold less. Freed frames go back to glibc's free lists, not necessarily to the kernel;
``malloc_trim(0)`` releases free pages from every arena. Elsewhere (musl, macOS) this is a no-op.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
from collections.abc import Callable

log = logging.getLogger("bridge.memtrim")


def _load() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


_TRIM = _load()


def release_free_heap() -> bool:
    """Return free heap pages to the kernel; True when glibc did release something."""
    if _TRIM is None:
        return False
    return bool(_TRIM(0))
