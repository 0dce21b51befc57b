"""Run-length items on the C kernel's radix path (native/README.md): consecutive points with
one voxel key become one item (the run's first point and its length), and the reduce walks
each run's records. Organized clouds with runs longer than the length field holds, dropped
points inside runs, runs across the edges of the thread blocks and voxels met again in later
runs must still give the NumPy reference's bytes, with one thread and with two: a wrong run
length changes a voxel's count (and its colour means, which are exact), and a dropped point
walked as part of a run turns a mean into NaN.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from bridge.decimate import available_backends, get_decimator
from bridge.decimate.reference import downsample_packed
from tests.unit.test_decimate import LAYOUTS, pack
from tests.unit.test_decimate_paths import XYZRGB

pytestmark = pytest.mark.skipif(
    available_backends()["c"] is not None, reason=f"c backend: {available_backends()['c']}"
)

VOXEL = 1.0
#: more than twice the kernel's points per thread (16384), so two threads split the cloud
POINTS = 90_000
#: the kernel packs, with two threads, 4 blocks per thread of equal point counts
BLOCKS = 8


@pytest.fixture(autouse=True, scope="module")
def radix_path() -> Iterator[None]:
    """Hashing off: every cloud here takes the radix path."""
    from bridge.decimate import _native

    old = _native.hash_voxels_max()
    _native.hash_voxels_max(0)
    yield
    _native.hash_voxels_max(old)


def organized(seed: int, dropped: float) -> np.ndarray:
    """Runs of 1-60 points in one voxel each (about 6 on average, one in ten longer than 16),
    cells drawn from a few thousand so voxels recur in later runs, a fraction `dropped` of the
    points NaN or inf, and a 40-point run across each block edge."""
    rng = np.random.default_rng(seed)
    cells = np.column_stack(
        [
            np.where(rng.random(3000) < 0.5, 0, rng.integers(-1000, 1000, 3000)),
            rng.integers(-1000, 1000, 3000),
            rng.integers(-1000, 1000, 3000),
        ]
    ).astype(np.float64)
    lengths = np.minimum(rng.geometric(1 / 5, POINTS), 16)
    long = rng.random(POINTS) < 0.1
    lengths[long] = rng.integers(17, 61, int(long.sum()))
    lengths = lengths[: int(np.searchsorted(np.cumsum(lengths), POINTS)) + 1]
    cell_of = np.repeat(rng.integers(0, len(cells), len(lengths)), lengths)[:POINTS]
    for b in range(1, BLOCKS):  # a run across each edge of the two-thread blocks
        edge = POINTS * b // BLOCKS
        cell_of[edge - 20 : edge + 20] = rng.integers(0, len(cells))
    frac = rng.random((POINTS, 3)) * 0.999
    xyz = (cells[cell_of] + frac) * VOXEL
    bad = rng.random(POINTS) < dropped
    xyz[bad, rng.integers(0, 3, int(bad.sum()))] = rng.choice(
        [np.nan, np.inf, -np.inf], int(bad.sum())
    )
    return xyz.astype(np.float32)


def c_bytes(name: str, data: bytes, threads: int) -> bytes:
    layout = {**LAYOUTS, "xyzrgb": XYZRGB}[name]
    return get_decimator("c", threads=threads).downsample(layout, data, VOXEL).data


@pytest.mark.parametrize("name", ["xyz32", "xyzrgb", "rich32"])
@pytest.mark.parametrize("dropped", [0.0, 0.03])
@pytest.mark.parametrize("threads", [1, 2])
def test_organized_runs_match_the_reference(name: str, dropped: float, threads: int) -> None:
    """xyz32 and xyzrgb take run-length items, rich32 (more fields) one item per point."""
    layout = {**LAYOUTS, "xyzrgb": XYZRGB}[name]
    xyz = organized(7 + threads, dropped)
    data = pack(layout, xyz, np.random.default_rng(11))
    want, _ = downsample_packed(layout, data, VOXEL)
    assert c_bytes(name, data, threads) == want


@pytest.mark.parametrize("name", ["xyz32", "xyzrgb"])
@pytest.mark.parametrize("threads", [1, 2])
def test_stretches_of_dropped_points_inside_runs_match_the_reference(
    name: str, threads: int
) -> None:
    """Invalid depth comes in stretches (RGB-D frames: 1 to 12 points, often whole groups of
    four, which the pack skips at once): a stretch ends a run even when the voxel goes on."""
    layout = {**LAYOUTS, "xyzrgb": XYZRGB}[name]
    xyz = organized(21 + threads, 0.0)
    rng = np.random.default_rng(5)
    for start in rng.choice(POINTS - 12, POINTS // 40, replace=False):
        xyz[start : start + int(rng.integers(1, 13)), int(rng.integers(0, 3))] = np.nan
    data = pack(layout, xyz, np.random.default_rng(13))
    want, _ = downsample_packed(layout, data, VOXEL)
    assert c_bytes(name, data, threads) == want
