"""What every backend runs around its kernel: the shared argument checks and the point-budget
ladder (why a module of its own: the backends import it, and the registry in ``backends`` imports
the backends, so it cannot live there without an import cycle)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from bridge.decimate import reference
from bridge.decimate._types import (
    DecimationResult,
    check_layout,
    check_max_points,
    check_voxel_size,
    keys_in_float32,
)
from bridge.decimate.ladder import fit_budget
from bridge.protocol.cloud import XYZ, CloudLayout, field_view, point_count


def _extent(layout: CloudLayout, data: bytes | memoryview) -> Callable[[], float]:
    def largest() -> float:
        biggest = 0.0
        for axis in XYZ:
            col = field_view(layout, data, axis).astype(np.float64)
            col = np.abs(col[np.isfinite(col)])
            if len(col):
                biggest = max(biggest, float(col.max()))
        return biggest

    return largest


def run_with_budget(
    name: str,
    run: Callable[[bytes | memoryview, float], tuple[bytes, int]],
    layout: CloudLayout,
    data: bytes | memoryview,
    voxel_size: float,
    max_points: int,
) -> DecimationResult:
    """Shared argument checks and the budget ladder around one backend's ``run``."""
    check_layout(layout)
    buf = reference.as_byte_buffer(data)
    check_voxel_size(voxel_size, keys_in_float32(layout))
    check_max_points(max_points)
    point_count(layout, len(buf))
    out, count, v = fit_budget(
        lambda v: run(buf, v), float(voxel_size), max_points, _extent(layout, buf)
    )
    return DecimationResult(data=out, points=count, voxel_size=v, backend=name)
