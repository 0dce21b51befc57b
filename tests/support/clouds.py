"""Point clouds the tests and ``benchmarks.decimate.cli`` share: synthetic inputs (a 64-beam lidar
sweep, a uniform cube) and a reader for recorded frames (.pcd/.ply through Open3D, KITTI-style
.bin). Deterministic for a given seed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from bridge.protocol.cloud import CloudLayout, make_layout

XYZI_LAYOUT = make_layout(16, [("x", 0, 7), ("y", 4, 7), ("z", 8, 7), ("intensity", 12, 7)])
XYZ_BIN_LAYOUT = make_layout(12, [("x", 0, 7), ("y", 4, 7), ("z", 8, 7)])
XYZRGB_LAYOUT = make_layout(16, [("x", 0, 7), ("y", 4, 7), ("z", 8, 7), ("rgb", 12, 6)])
BIN_LAYOUTS = {"xyzi": XYZI_LAYOUT, "xyz": XYZ_BIN_LAYOUT}


def lidar_like(n: int, seed: int = 0) -> npt.NDArray[np.float32]:
    """A spinning 64-beam lidar sweep in firing order (beam by beam, azimuth within a beam).

    Downward beams hit the ground 1.8 m below the sensor; the rest hit walls 15-40 m away
    whose distance wanders with azimuth, open sectors return from 50-80 m, a few percent are
    near clutter (1-4 m); 2 cm range noise. Dense near the sensor, sparse far away.
    """
    rng = np.random.default_rng(seed)
    beams = 64
    cols = -(-n // beams)
    elev = np.repeat(np.deg2rad(np.linspace(-25.0, 15.0, beams)), cols)
    az = np.tile(np.linspace(0.0, 2 * np.pi, cols, endpoint=False), beams)
    wall = 27.0 + 8.0 * np.sin(2 * az + 0.3) + 4.0 * np.sin(5 * az + 1.1)
    far = np.sin(3 * az) > 0.7
    wall = np.where(far, rng.uniform(50.0, 80.0, az.shape), wall)
    wall = np.where(rng.random(az.shape) < 0.02, rng.uniform(1.0, 4.0, az.shape), wall)
    ground = np.where(elev < 0, 1.8 / np.maximum(np.sin(-elev), 1e-6), np.inf)
    r = np.clip(np.minimum(wall, ground) + rng.normal(0.0, 0.02, az.shape), 1.0, 80.0)
    xyz = np.stack(
        [r * np.cos(elev) * np.cos(az), r * np.cos(elev) * np.sin(az), r * np.sin(elev)], axis=1
    )
    return xyz[:n].astype(np.float32)


def uniform(n: int, seed: int = 0) -> npt.NDArray[np.float32]:
    """Uniform in a 20 m cube: the worst case (few points share a voxel at small sizes)."""
    return np.random.default_rng(seed).uniform(-10, 10, (n, 3)).astype(np.float32)


def read_frame(
    path: Path, bin_layout: str, o3d: Any
) -> tuple[CloudLayout, bytes, npt.NDArray[np.float32], npt.NDArray[np.uint8] | None] | None:
    """(layout, packed records, finite xyz, finite rgb or None) of a .pcd/.ply (through Open3D,
    packed x, y, z, rgb, NaN points kept) or a KITTI-style .bin (float32 records)."""
    if path.suffix == ".bin":
        layout = BIN_LAYOUTS[bin_layout]
        raw = path.read_bytes()
        raw = raw[: len(raw) - len(raw) % layout.stride]
        xyz = np.frombuffer(raw, dtype="<f4").reshape(-1, layout.stride // 4)[:, :3]
        finite = np.isfinite(xyz).all(axis=1)
        return layout, raw, np.ascontiguousarray(xyz[finite]), None
    if o3d is None:
        return None
    pcd = o3d.t.io.read_point_cloud(str(path))
    xyz = pcd.point.positions.numpy().astype(np.float32)
    rgb = None
    if "colors" in pcd.point:
        colors = pcd.point.colors.numpy()
        scale = 255.0 if colors.dtype.kind == "f" else 1.0
        rgb = np.clip(np.rint(colors * scale), 0, 255).astype(np.uint8)
    rec = np.zeros(len(xyz), dtype=XYZRGB_LAYOUT.structured_dtype)
    for i, a in enumerate("xyz"):
        rec[a] = xyz[:, i]
    if rgb is not None:
        rgba = np.zeros((len(xyz), 4), dtype=np.uint8)
        rgba[:, :3] = rgb
        rec["rgb"] = rgba.view("<u4")[:, 0]
    finite = np.isfinite(xyz).all(axis=1)
    frgb = None if rgb is None else np.ascontiguousarray(rgb[finite])
    return XYZRGB_LAYOUT, rec.tobytes(), np.ascontiguousarray(xyz[finite]), frgb
