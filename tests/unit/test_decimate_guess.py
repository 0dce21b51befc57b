"""The radix path's guessed key frame (native/README.md, "Guessed key frame").

A float32 cloud of at least 32,768 points that the sampled estimate sends to the radix path
skips the bounds pass: the key frame comes from the sample's key bounds, padded. The pack
checks that every point fell inside it, and a point outside sends the call back to the bounds
pass. Either way the bytes are the NumPy reference's: a point outside the frame whose offset
spilled into its neighbour's bits, or a miss that went unnoticed, would change voxels.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bridge.decimate import available_backends, get_decimator
from bridge.decimate.reference import downsample_packed
from tests.unit.test_decimate import LAYOUTS, SETTINGS, pack
from tests.unit.test_decimate_paths import XYZRGB
from tests.unit.test_decimate_runs import organized

pytestmark = pytest.mark.skipif(
    available_backends()["c"] is not None, reason=f"c backend: {available_backends()['c']}"
)

ALL = {**LAYOUTS, "xyzrgb": XYZRGB}
#: the kernel's SBV_GUESS_MIN_POINTS is 32,768: above it, two threads still get 16,384 each
POINTS = 40_000
VOXEL = 0.2


@pytest.fixture(autouse=True, scope="module")
def sampled_radix_path() -> Iterator[None]:
    """A hash limit of 2 voxels: the estimate runs (its sample is what the frame is guessed
    from) and sends every cloud here to the radix path. Limit 0 would skip the estimate."""
    from bridge.decimate import _native

    old = _native.hash_voxels_max()
    _native.hash_voxels_max(2)
    yield
    _native.hash_voxels_max(old)


def sweep(seed: int, dropped: float = 0.0, long_tail: bool = False) -> np.ndarray:
    """A lidar-like sweep in firing order: 32 beams per azimuth step, ranges 2-40 m (a
    sensor's range: the sample sees the extremes), or long-tailed (a few far returns the
    sample misses), some points NaN."""
    rng = np.random.default_rng(seed)
    steps = POINTS // 32 + 1
    az = np.repeat(np.linspace(0, 2 * np.pi, steps, endpoint=False), 32)[:POINTS]
    el = np.tile(np.linspace(-0.4, 0.2, 32), steps)[:POINTS]
    r = rng.uniform(2, 40, POINTS)
    if long_tail:  # ten far returns at 300 m in different directions
        r[rng.choice(POINTS, 10, replace=False)] = 300.0
    xyz = np.stack([r * np.cos(el) * np.cos(az), r * np.cos(el) * np.sin(az), r * np.sin(el)], 1)
    xyz[rng.random(POINTS) < dropped] = np.nan
    return xyz.astype(np.float32)


def run(name: str, xyz: np.ndarray, threads: int, voxel: float = VOXEL) -> tuple[int, int]:
    """Decimate with the C kernel, check the bytes, and return (guessed, missed) of this call."""
    from bridge.decimate import _native

    data = pack(ALL[name], xyz, np.random.default_rng(7))
    want, _ = downsample_packed(ALL[name], data, voxel)
    before = _native.frame_guesses(True)  # no back-off left from an earlier miss
    got = get_decimator("c", threads=threads).downsample(ALL[name], data, voxel).data
    after = _native.frame_guesses()
    assert got == want
    return after[0] - before[0], after[1] - before[1]


@pytest.mark.parametrize("name", ["xyz32", "xyzrgb", "rich32"])
@pytest.mark.parametrize("dropped", [0.0, 0.05])
@pytest.mark.parametrize("threads", [1, 2])
def test_a_frame_that_holds_every_point_replaces_the_bounds_pass(
    name: str, dropped: float, threads: int
) -> None:
    assert run(name, sweep(1, dropped), threads) == (1, 0)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("name", ["xyz32", "xyzrgb"])
def test_organized_runs_in_a_guessed_frame(name: str, threads: int) -> None:
    """Run-length items (runs across block edges, dropped points inside runs) packed in a
    guessed frame: the issue-14 frames take this road."""
    xyz = organized(3, 0.03)[:POINTS]
    assert run(name, xyz, threads, voxel=1.0) == (1, 0)


@pytest.mark.parametrize("at", [0, 1, 2, 3, 4, 5001, POINTS - 2, POINTS - 1])
@pytest.mark.parametrize("axis", [0, 1, 2])
@pytest.mark.parametrize("side", [-1, 1])
def test_a_point_outside_the_frame_sends_the_call_back_to_the_bounds_pass(
    at: int, axis: int, side: int
) -> None:
    """One point far beyond the sweep on one side of one axis, in every lane of a group of
    four and in the tail: the pack notices, and the bounds pass gives the reference's bytes."""
    xyz = sweep(2)
    xyz[at, axis] = side * 500.0
    assert run("xyz32", xyz, 1) == (1, 1)


@SETTINGS
@given(
    seed=st.integers(0, 2**16),
    beyond=st.lists(
        st.tuples(
            st.integers(0, POINTS - 1), st.integers(0, 2), st.floats(0.9, 1.4), st.booleans()
        ),
        min_size=1,
        max_size=3,
    ),
    threads=st.sampled_from([1, 2]),
)
def test_points_around_the_edges_of_the_frame(
    seed: int, beyond: list[tuple[int, int, float, bool]], threads: int
) -> None:
    """Points at 0.9-1.4 times the sweep's extent on either side of an axis: inside the padded
    frame, at its edges or just beyond. Hit or miss, the reference's bytes."""
    xyz = sweep(seed)
    lo, hi = np.nanmin(xyz, 0), np.nanmax(xyz, 0)
    for at, axis, factor, high in beyond:
        centre, half = (lo[axis] + hi[axis]) / 2, (hi[axis] - lo[axis]) / 2
        xyz[at, axis] = centre + (1 if high else -1) * half * factor
    guessed, _ = run("xyz32", xyz, threads)
    assert guessed == 1


def test_no_guess_without_the_estimate_or_below_the_size() -> None:
    """Hashing off (no estimate, so no sample) or a cloud below 32,768 points: the bounds pass."""
    from bridge.decimate import _native

    assert run("xyz32", sweep(4)[:30_000], 1) == (0, 0)
    _native.hash_voxels_max(0)
    try:
        assert run("xyz32", sweep(4), 1) == (0, 0)
    finally:
        _native.hash_voxels_max(2)


def test_misses_back_off_and_a_hit_guesses_again() -> None:
    """A long-tailed sweep misses in every call; after a miss the next calls take the bounds
    pass at once (1, then 3, then 7 of them), so a stream that always misses wastes a pack
    in at most one call of 64 once the back-off is full. The bytes never change."""
    from bridge.decimate import _native

    layout = ALL["xyz32"]
    data = pack(layout, sweep(5, long_tail=True), np.random.default_rng(7))
    want, _ = downsample_packed(layout, data, VOXEL)
    decimator = get_decimator("c", threads=1)
    _native.frame_guesses(True)
    outcomes = []
    for _ in range(14):
        before = _native.frame_guesses()
        assert decimator.downsample(layout, data, VOXEL).data == want
        after = _native.frame_guesses()
        outcomes.append((after[0] - before[0], after[1] - before[1]))
    missed, skipped = (1, 1), (0, 0)
    assert outcomes == [missed, skipped, missed] + [skipped] * 3 + [missed] + [skipped] * 7
    hit = pack(layout, sweep(5), np.random.default_rng(7))
    for _ in range(7):  # the rest of the back-off, then a hit
        decimator.downsample(layout, hit, VOXEL)
    before = _native.frame_guesses()
    decimator.downsample(layout, hit, VOXEL)
    assert _native.frame_guesses() == (before[0] + 1, before[1])
