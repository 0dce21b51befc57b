"""The point-budget ladder: coarsen the voxel until the output fits ``max_points``.

Why a fixed ladder (voxel x 1, 1.5, 2, 3, 4, 6, 8, ...) rather than a search for the exact
size: the effective voxel size is reported to viewers and shows up in metrics, so it should
take few, recognisable values; and each rung is a full decimation of the original points
(averaging an already-averaged cloud again would weight voxels, not points).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

#: Hard stop, far beyond any useful rung (the extent test below ends real ladders sooner).
MAX_RUNGS = 160
#: Decimation passes per frame at most (the first included): bounds the CPU a stream with a tiny
#: voxel and a small point budget can cost.
MAX_PASSES = 8


def rungs(voxel_size: float) -> Iterator[float]:
    """voxel x 1, 1.5, 2, 3, 4, 6, 8, 12, 16, ... (alternately x1.5 and x4/3)."""
    base = 1.0
    for i in range(MAX_RUNGS):
        yield voxel_size * base * (1.5 if i % 2 else 1.0)
        if i % 2:
            base *= 2.0


def fit_budget(
    run: Callable[[float], tuple[bytes, int]],
    voxel_size: float,
    max_points: int,
    extent: Callable[[], float],
) -> tuple[bytes, int, float]:
    """Run ``run(v)`` up the ladder until it returns at most ``max_points`` points.

    ``extent()`` is the largest |coordinate| of a finite point: once a voxel is wider than
    that, every point sits in one of the (at most 8) voxels around the origin and coarser
    rungs cannot help, so the coarsest result so far is returned even if over budget.

    CPU per frame is bounded: each pass estimates the voxel that would fit, assuming the count
    falls no faster than ``v**-3`` (a filled volume; surfaces and lines fall slower), and skips
    the rungs below it, so no rung that would fit is skipped; at most ``MAX_PASSES`` passes run.
    """
    data, count = run(voxel_size)
    if max_points <= 0 or count <= max_points:
        return data, count, voxel_size
    limit = extent()
    v, passes = voxel_size, 1
    for rung in rungs(voxel_size):
        if rung <= v:
            continue
        if not math.isfinite(rung):
            break
        needed = v * (count / max_points) ** (1 / 3)
        if rung < needed and rung <= limit:
            continue
        v = rung
        data, count = run(v)
        passes += 1
        if count <= max_points or v > limit or passes >= MAX_PASSES:
            break
    return data, count, v
