"""The allocator policy of a bridge process (glibc; a no-op elsewhere, e.g. musl or macOS).

Why two halves: with glibc's defaults every ~1 MB frame is mmapped and unmapped, so each one costs
~280 page faults of fresh memory (measured: ~27 % of the bridge's CPU per 1.2 MB frame).
:func:`tune_allocator` keeps such buffers in the heap instead and stops automatic trimming; but a
heap that never shrinks would defeat the cooperative memory downscale, so after a planned ring
shrink has drained :func:`release_free_heap` hands the free pages back (``malloc_trim(0)``, every
arena) and ``memory.current`` really falls. The same happens when freed frames sitting in the heap
push resident memory past the data budget, or stay unused for a while
(:class:`bridge.server.trimpolicy.HeapTrimPolicy`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
from collections.abc import Callable
from typing import cast

log = logging.getLogger("bridge.server.memtrim")


_M_TRIM_THRESHOLD = -1  # glibc mallopt parameters (malloc.h)
_M_MMAP_THRESHOLD = -3


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        return ctypes.CDLL(name)
    except OSError:
        return None


MMAP_THRESHOLD = 16 << 20  # what tune_allocator sets by default
TRIM_THRESHOLD = 256 << 20


def tune_allocator(
    mmap_threshold: int = MMAP_THRESHOLD, trim_threshold: int = TRIM_THRESHOLD
) -> bool:
    """Serve frames from the heap (no per-frame mmap) and trim only on request.

    Returns True when glibc accepted both settings.
    """
    libc = _libc()
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None:
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    ok = bool(mallopt(_M_MMAP_THRESHOLD, mmap_threshold)) and bool(
        mallopt(_M_TRIM_THRESHOLD, trim_threshold)
    )
    log.debug("allocator tuned: %s", ok)
    return ok


def _load() -> Callable[[int], int] | None:
    libc = _libc()
    trim = getattr(libc, "malloc_trim", None)
    if trim is None:
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return cast(Callable[[int], int], trim)


_TRIM = _load()


def release_free_heap() -> bool:
    """Return free heap pages to the kernel; True when glibc did release something."""
    if _TRIM is None:
        return False
    return bool(_TRIM(0))
