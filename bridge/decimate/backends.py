"""Backend registry: which decimators exist here, and the one the data plane should use.

Resolved at startup (``get_decimator``), never at import: importing ``bridge.decimate`` must
work on a host without a compiler, the C extension or a GPU.
"""

from __future__ import annotations

import logging
from typing import Final

from bridge.decimate import reference
from bridge.decimate._types import BackendUnavailable, DecimationResult, Decimator
from bridge.decimate.budget import run_with_budget
from bridge.protocol.cloud import CloudLayout

log = logging.getLogger("bridge.decimate")

#: Preference order for "auto".
PREFERENCE: Final = ("cuda", "c", "numpy")


class NumpyDecimator:
    """The reference implementation: always available; only parts of NumPy release the GIL."""

    name = "numpy"

    def downsample(
        self,
        layout: CloudLayout,
        data: bytes | memoryview,
        voxel_size: float,
        max_points: int = 0,
        threads: int = 0,
    ) -> DecimationResult:
        return run_with_budget(
            self.name,
            lambda buf, v: reference.downsample_packed(layout, buf, v),
            layout,
            data,
            voxel_size,
            max_points,
        )


def _c_reason() -> str | None:
    try:
        from bridge.decimate import _native  # noqa: F401
    except ImportError as exc:
        return f"C extension bridge.decimate._native not built ({exc})"
    return None


def _cuda_reason() -> str | None:
    from bridge.decimate import cuda

    return cuda.unavailable_reason()


def available_backends() -> dict[str, str | None]:
    """Backend name -> None when usable here, else the reason it is not."""
    return {"cuda": _cuda_reason(), "c": _c_reason(), "numpy": None}


def _make(name: str, threads: int) -> Decimator:
    if name == "numpy":
        return NumpyDecimator()
    if name == "c":
        from bridge.decimate.native import CDecimator

        return CDecimator(threads=threads)
    from bridge.decimate.cuda import CudaDecimator

    return CudaDecimator()


def get_decimator(name: str = "auto", *, threads: int = 1) -> Decimator:
    """The decimator called ``name``, or the best available one for ``"auto"``.

    ``threads`` splits one cloud across that many C kernel threads (default 1: the bridge runs
    frames in parallel on its worker pool instead, one kernel thread each, and never passes it;
    ``simbridge decimate --threads`` does). An explicitly named
    backend that cannot run here raises :class:`BackendUnavailable` with the reason.
    """
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be an int >= 1, got {threads!r}")
    reasons = available_backends()
    if name == "auto":
        for candidate in PREFERENCE:
            reason = reasons[candidate]
            if reason is None:
                skipped = {k: v for k, v in reasons.items() if v is not None}
                log.info(
                    "decimation backend auto -> %s%s",
                    candidate,
                    "".join(f"; {k} unavailable: {v}" for k, v in skipped.items()),
                )
                return _make(candidate, threads)
    if name not in reasons:
        raise BackendUnavailable(name, f"unknown backend; choose from auto, {', '.join(reasons)}")
    reason = reasons[name]
    if reason is not None:
        raise BackendUnavailable(name, reason)
    return _make(name, threads)
