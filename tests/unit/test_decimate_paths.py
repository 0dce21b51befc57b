"""The C kernel's ways to finish (native/README.md) give the NumPy reference's bytes, and so
do the switches between them.

One thread, float32 x/y/z and few voxels take the hash path (no bounds pass, voxels sorted
rather than points); float64 clouds hash after the bounds pass; a cloud whose voxel count
passes ``hash_voxels_max``, or whose keys leave +-2^20 per axis, gives up and takes the radix
path (or the wide-key path beyond 64 bits). The limit is moved here to put clouds on either
side of each switch, including the sampled estimate that picks the path for clouds larger
than the sample.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from bridge.decimate import VoxelKeyOverflow, available_backends, get_decimator
from bridge.decimate.reference import downsample_packed
from bridge.protocol.cloud import make_layout
from tests.unit.test_decimate import LAYOUTS, SETTINGS, clouds, pack, wide_clouds

pytestmark = pytest.mark.skipif(
    available_backends()["c"] is not None, reason=f"c backend: {available_backends()['c']}"
)

#: float32 x, y, z and one packed colour: the RGB-D frame layout, its own fast loop.
XYZRGB = make_layout(16, [("x", 0, 7), ("y", 4, 7), ("z", 8, 7), ("rgb", 12, 6)])
ALL = {**LAYOUTS, "xyzrgb": XYZRGB}
LIMITS = [0, 1, 2, 3, 7, 64, 1 << 15, 1 << 30]


@pytest.fixture(autouse=True, scope="module")
def restore_limit() -> Iterator[None]:
    """Every check sets the limit it needs; restore the kernel's own at the end."""
    from bridge.decimate import _native

    old = _native.hash_voxels_max()
    yield
    _native.hash_voxels_max(old)


def c_bytes(name: str, data: bytes, voxel: float, hash_max: int, threads: int = 1) -> bytes:
    from bridge.decimate import _native

    _native.hash_voxels_max(hash_max)
    return get_decimator("c", threads=threads).downsample(ALL[name], data, voxel).data


def check(name: str, data: bytes, voxel: float, hash_max: int) -> None:
    layout = ALL[name]
    try:
        want, _ = downsample_packed(layout, data, voxel)
    except VoxelKeyOverflow:
        with pytest.raises(VoxelKeyOverflow):
            c_bytes(name, data, voxel, hash_max)
        return
    assert c_bytes(name, data, voxel, hash_max) == want


@SETTINGS
@given(cloud=clouds(), hash_max=st.sampled_from(LIMITS), rgb=st.booleans())
def test_small_clouds_every_limit(
    cloud: tuple[str, bytes, float], hash_max: int, rgb: bool
) -> None:
    """Hypothesis clouds (NaN, inf, huge, duplicates, faces) at limits below, at and above
    their voxel count: byte-equal to the reference."""
    name, data, voxel = cloud
    if rgb and name == "xyz32":  # same points, RGB-D layout
        xyz = np.frombuffer(data, dtype=np.float32).reshape(-1, 3)
        name, data = "xyzrgb", pack(XYZRGB, xyz, np.random.default_rng(len(data)))
    check(name, data, voxel, hash_max)


@st.composite
def frames(draw: st.DrawFn) -> tuple[str, bytes, float]:
    """Bigger than the estimate's 2048-point sample: an organized-like sweep (runs of points
    sharing a voxel, NaN holes) or scattered points, a few hundred to a few thousand voxels,
    sometimes one far point anywhere in the cloud."""
    name = draw(st.sampled_from(["xyzrgb", "xyz32", "rich32", "rich64"]))
    n = draw(st.integers(2_100, 12_000))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if draw(st.booleans()):
        t = np.linspace(0, draw(st.floats(1, 40)), n)
        xyz = np.stack([np.cos(t) * t, np.sin(t) * t, rng.normal(0, 0.3, n)], axis=1)
    else:
        xyz = rng.normal(0, draw(st.floats(0.5, 20)), (n, 3))
    xyz[rng.random(n) < draw(st.floats(0, 0.3))] = np.nan
    if draw(st.booleans()):  # one point whose key leaves +-2^20: the fused pass gives up
        xyz[draw(st.integers(0, n - 1))] = [0.5, -4e6, 1.0]
    dtype = np.float64 if name == "rich64" else np.float32
    return name, pack(ALL[name], xyz.astype(dtype), rng), draw(st.sampled_from([0.05, 0.2, 1.0]))


@SETTINGS
@given(cloud=frames(), where=st.floats(0.0, 3.0))
def test_limit_around_the_voxel_count(cloud: tuple[str, bytes, float], where: float) -> None:
    """The limit set near the true voxel count (estimate above or below it, the table giving
    up mid-pass): same bytes as the reference and as the radix path (limit 0)."""
    name, data, voxel = cloud
    want, m = downsample_packed(ALL[name], data, voxel)
    got = c_bytes(name, data, voxel, int(where * m))
    assert got == want
    assert c_bytes(name, data, voxel, 0) == want


@SETTINGS
@given(
    name=st.sampled_from(["xyz32", "xyzrgb"]),
    xyz=hnp.arrays(
        np.float32,
        (6, 3),
        elements=st.sampled_from(
            [-1048577.0, -1048576.0, -1048575.5, 0.0, 1048575.0, 1048575.5, 1048576.0, 3.0]
        ),
    ),
    voxel=st.sampled_from([1.0, 0.5, 2.0]),
)
def test_fused_key_range_edges(name: str, xyz: np.ndarray, voxel: float) -> None:
    """Keys at and just past +-2^20 (the hash path's packed range without a bounds pass):
    inside it hashes, outside it falls back; the bytes never change."""
    check(name, pack(ALL[name], xyz, np.random.default_rng(0)), voxel, 1 << 30)


@pytest.mark.parametrize("far", [0, 1, 2, 3, 1003, 2003, 3003, 4003, 5000, 5001, 5002])
@pytest.mark.parametrize("name", ["xyz32", "xyzrgb"])
def test_one_far_point_anywhere(name: str, far: int) -> None:
    """Keys are computed four points at a time: a point out of the fused range must stop the
    hash path in every lane and in the 3-point tail (a miss once let lane 3 through). 5003
    points: more than the estimate samples, so most of these far points go unsampled."""
    xyz = np.random.default_rng(far).uniform(-2, 2, (5003, 3)).astype(np.float32)
    xyz[far] = [0.5, -4e6, 1.0]
    check(name, pack(ALL[name], xyz, np.random.default_rng(1)), 1.0, 1 << 30)


@SETTINGS
@given(cloud=wide_clouds())
def test_keys_spanning_more_than_2_63_with_hashing_on(cloud: tuple[str, bytes, float]) -> None:
    """Keys spanning more than 2^63: the hash path must step aside (wide path), in order."""
    name, data, voxel = cloud
    want, _ = downsample_packed(ALL[name], data, voxel)
    assert c_bytes(name, data, voxel, 1 << 30) == want


def test_hash_limit_controls() -> None:
    from bridge.decimate import _native

    old = _native.hash_voxels_max(5)
    assert _native.hash_voxels_max(None) == 5
    assert _native.hash_voxels_max(old) == 5
    with pytest.raises(ValueError):
        _native.hash_voxels_max(-1)


def test_real_frames_take_either_path_to_the_same_bytes() -> None:
    """The vendored organized frames (the hash path's target) byte-equal to the reference on
    the hash path and on the radix path, one and two threads."""
    o3d = pytest.importorskip("open3d")
    from tests.support.clouds import read_frame
    from tests.unit.test_decimate_open3d import PCL_DATA

    for path in sorted(PCL_DATA.glob("*.pcd"))[:3]:
        got = read_frame(path, "xyzi", o3d)
        assert got is not None
        layout, data = got[0], got[1]
        want, _ = downsample_packed(layout, data, 0.02)
        for hash_max, threads in [(1 << 30, 1), (0, 1), (1 << 30, 2)]:
            from bridge.decimate import _native

            _native.hash_voxels_max(hash_max)
            out = get_decimator("c", threads=threads).downsample(layout, data, 0.02)
            assert out.data == want, (path.name, hash_max, threads)
