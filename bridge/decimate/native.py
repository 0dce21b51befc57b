"""The C backend: the packed-buffer kernel in native/ through the ``_native`` extension.

Imported only once ``_native`` is known to import (see ``backends.available_backends``).

The extension releases the GIL for the whole kernel, so several pool threads decimate in
parallel; ``threads`` additionally splits one cloud across that many kernel threads.
"""

from __future__ import annotations

from bridge.decimate import _native
from bridge.decimate._types import DecimationResult, VoxelKeyOverflow, check_layout
from bridge.decimate.budget import run_with_budget
from bridge.decimate.native_table import field_table
from bridge.protocol.cloud import CloudLayout


class CDecimator:
    """Thread-safe: holds only immutable settings."""

    name = "c"

    def __init__(self, threads: int = 1) -> None:
        self.threads = threads

    def downsample(
        self,
        layout: CloudLayout,
        data: bytes | memoryview,
        voxel_size: float,
        max_points: int = 0,
        threads: int = 0,
    ) -> DecimationResult:
        table = field_table(check_layout(layout))
        threads = threads or self.threads

        def run(buf: bytes | memoryview, v: float) -> tuple[bytes, int]:
            try:
                return _native.downsample(buf, layout.stride, table, v, threads)
            except OverflowError as exc:
                raise VoxelKeyOverflow(str(exc)) from None

        return run_with_budget(self.name, run, layout, data, voxel_size, max_points)
