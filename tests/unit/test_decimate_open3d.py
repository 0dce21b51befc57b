"""Parity of the decimators with Open3D's tensor ``voxel_down_sample`` (docs/design.md §3).

Open3D orders voxels by hash, so both outputs are put in voxel-key order before comparing:
same voxel count, same keys, centroids within Open3D's float32-accumulation error, colours
within 1/255. Open3D does not drop NaN points (they land in a junk voxel), so it is given
the finite points only, while our backends get the raw cloud.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bridge.decimate import available_backends, get_decimator
from bridge.protocol.cloud import make_layout

o3d: Any = pytest.importorskip("open3d", reason="open3d cannot be imported (libusb-1.0-0?)")

REPO = Path(__file__).resolve().parents[2]
PCL_DATA = Path(os.environ.get("BRIDGE_PCL_DATA") or REPO / "tests" / "data" / "pcl")
REAL = sorted(PCL_DATA.glob("*.pcd")) if PCL_DATA.is_dir() else []
LAYOUT = make_layout(16, [("x", 0, 7), ("y", 4, 7), ("z", 8, 7), ("rgb", 12, 6)])
#: Backends to compare; cuda (marked gpu) only where it can run — test_decimate.py already
#: reports its skip visibly.
BACKENDS = [
    pytest.param(b, marks=[pytest.mark.gpu] if b == "cuda" else [])
    for b in ("numpy", "c", "cuda")
    if available_backends()[b] is None
]


def pack(xyz: np.ndarray, rgb: np.ndarray) -> bytes:
    rec = np.zeros(len(xyz), dtype=LAYOUT.structured_dtype)
    for i, a in enumerate("xyz"):
        rec[a] = xyz[:, i]
    rgba = np.zeros((len(xyz), 4), dtype=np.uint8)
    rgba[:, :3] = rgb
    rec["rgb"] = rgba.view("<u4")[:, 0]
    return rec.tobytes()


def open3d_reference(
    xyz: np.ndarray, rgb: np.ndarray, voxel: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Open3D's output plus, per output point, the voxel key its points had.

    The key rides along as a float64 attribute that Open3D averages like the others: it comes
    back integral only if Open3D grouped exactly the points we consider one voxel, which
    makes the comparison independent of where float32 rounding puts a centroid.
    """
    finite = np.isfinite(xyz).all(axis=1)
    pts = np.ascontiguousarray(xyz[finite])
    pcd = o3d.t.geometry.PointCloud(o3d.core.Tensor(pts))
    pcd.point.colors = o3d.core.Tensor(np.ascontiguousarray(rgb[finite]))
    keys = np.floor(pts / np.float32(voxel)).astype(np.float64)
    pcd.point.voxel_key = o3d.core.Tensor(keys)
    out = pcd.voxel_down_sample(voxel)
    k = out.point.voxel_key.numpy()
    np.testing.assert_array_equal(k, np.round(k), "Open3D merged points we keep apart")
    return out.point.positions.numpy(), out.point.colors.numpy(), k.astype(np.int64)


def check_parity(backend: str, xyz: np.ndarray, rgb: np.ndarray, voxel: float) -> None:
    result = get_decimator(backend, threads=2).downsample(LAYOUT, pack(xyz, rgb), voxel)
    rec = np.frombuffer(result.data, dtype=LAYOUT.structured_dtype)
    ours = np.stack([rec[a] for a in "xyz"], axis=1)
    ours_rgb = np.ascontiguousarray(rec["rgb"]).view(np.uint8).reshape(-1, 4)[:, :3]
    theirs, theirs_rgb, keys = open3d_reference(xyz, rgb, voxel)
    assert result.points == len(theirs), "voxel count differs from Open3D"
    order = np.lexsort((keys[:, 2], keys[:, 1], keys[:, 0]))
    theirs, theirs_rgb = theirs[order], theirs_rgb[order]
    scale = max(1.0, float(np.abs(theirs).max()))
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=2e-5 * scale)
    diff = np.abs(ours_rgb.astype(int) - theirs_rgb.astype(int))
    assert diff.max() <= 1, f"colours differ by up to {diff.max()}/255"


def lidar_like(n: int, rng: np.random.Generator) -> np.ndarray:
    beams = 64
    elev = np.deg2rad(np.linspace(-25, 15, beams))[:, None]
    az = np.linspace(0, 2 * np.pi, n // beams, endpoint=False)[None, :]
    rng_m = np.where(
        elev < 0, np.minimum(1.8 / np.sin(-elev + 1e-9), 80.0), 20 + 10 * np.sin(3 * az)
    )
    r = rng_m + rng.normal(0, 0.02, (beams, n // beams))
    xyz = np.stack(
        [r * np.cos(elev) * np.cos(az), r * np.cos(elev) * np.sin(az), r * np.sin(elev)], -1
    )
    return xyz.reshape(-1, 3).astype(np.float32)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("voxel", [0.05, 0.2, 1.0])
@pytest.mark.parametrize("shape", ["uniform", "lidar"])
def test_synthetic_parity(backend: str, voxel: float, shape: str) -> None:
    rng = np.random.default_rng(11)
    n = 60_000
    xyz = (
        rng.uniform(-20, 20, (n, 3)).astype(np.float32)
        if shape == "uniform"
        else lidar_like(n, rng)
    )
    rgb = rng.integers(0, 256, (len(xyz), 3), dtype=np.uint8)
    check_parity(backend, xyz, rgb, voxel)


@pytest.mark.skipif(not REAL, reason=f"no real clouds under {PCL_DATA} (set BRIDGE_PCL_DATA)")
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("path", REAL, ids=[p.stem for p in REAL])
def test_real_cloud_parity(backend: str, path: Path) -> None:
    pcd = o3d.t.io.read_point_cloud(str(path))
    xyz = pcd.point.positions.numpy()
    rgb = pcd.point.colors.numpy()
    assert np.isnan(xyz).any(), "organized clouds carry NaN points"
    for voxel in (0.01, 0.05):
        check_parity(backend, xyz, rgb, voxel)
