"""How `make bench-decimate` measures a method: repeated timings within a budget, the
resident high-water mark of one call, and the C kernel's key-frame guesses
(benchmarks/decimate/cli.py keeps the cases, the table and the command line)."""

from __future__ import annotations

import contextlib
import ctypes
import gc
from collections.abc import Callable
from pathlib import Path

from benchmarks.decimate.peers import CLOCK
from bridge.decimate.backends import available_backends

#: one call of a method on a case: returns the output point count
Runner = Callable[[], int]


def _status_kb(key: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def _trim_heap() -> None:
    """Give freed heap pages back to the OS, so a rerun has to fault them in again."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).malloc_trim(0)


def peak_mb(run: Runner) -> float | None:
    """Resident high-water mark above the current RSS while ``run`` executes (Linux)."""
    _release_scratch()
    _trim_heap()
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return None
    before = _status_kb("VmRSS")
    run()
    after = _status_kb("VmHWM")
    if before is None or after is None:
        return None
    return max(0.0, (after - before) / 1024.0)


def _release_scratch() -> None:
    try:
        from bridge.decimate import _native
    except ImportError:
        return
    _native.release_scratch()


def time_runs(run: Runner, repeats: int, budget_s: float) -> list[float]:
    times: list[float] = []
    now = CLOCK["now"]
    deadline = now() + budget_s
    while len(times) < repeats or (len(times) < 3 * repeats and now() < deadline):
        start = now()
        run()
        times.append(now() - start)
        if len(times) >= 3 and now() > deadline:
            break
    return times


def key_frame_guesses() -> tuple[int, int]:
    """The C kernel's key-frame guesses and misses on this thread so far ((0, 0) without it)."""
    if available_backends()["c"] is not None:
        return (0, 0)
    from bridge.decimate import _native

    return _native.frame_guesses()
