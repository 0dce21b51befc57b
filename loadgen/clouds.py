"""Point clouds for the load generator: deterministic synthetic lidar scans and a PCD/PLY loader.

Why synthetic: a load test has to be reproducible (same seed → same bytes → same decimation
output) and must not depend on data files. The scans look like a spinning multi-beam lidar
(beams at fixed elevations, points along each beam's azimuth sweep, ranges 1 to 80 m), so a voxel
grid thins them the way it thins real scans: dense near the sensor, sparse far away.

Every generator returns a :class:`CloudData` — the packed fields for ``bridge.v1.PointCloud``,
the little-endian point bytes and the stride — so callers never repeat layout arithmetic.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from bridge.v1 import bridge_pb2 as pb

#: Range limits of the synthetic sensor in metres.
MIN_RANGE_M = 1.0
MAX_RANGE_M = 80.0
#: Elevation span of the synthetic beams (degrees), like a 32/64-beam automotive lidar.
ELEVATION_DEG = (-25.0, 15.0)
SENSOR_HEIGHT_M = 1.8


class CloudData(NamedTuple):
    """One point cloud ready for the wire: packed fields, point bytes, bytes per point."""

    fields: list[pb.PackedField]
    data: bytes
    stride: int

    @property
    def num_points(self) -> int:
        return len(self.data) // self.stride

    def layout_triples(self) -> list[tuple[str, int, int]]:
        """``(name, offset, type)`` triples, the input of ``bridge.protocol.cloud.make_layout``."""
        return [(f.name, f.offset, f.type) for f in self.fields]

    def to_proto(self, frame_id: str = "lidar") -> pb.PointCloud:
        return pb.PointCloud(
            point_stride=self.stride, fields=self.fields, data=self.data, frame_id=frame_id
        )


class Open3DUnavailable(RuntimeError):
    """Open3D is not installed or cannot be imported (typically the missing libusb)."""


def _fields(*spec: tuple[str, int, int]) -> list[pb.PackedField]:
    return [pb.PackedField(name=n, offset=o, type=t) for n, o, t in spec]  # type: ignore[arg-type]


XYZ_FIELDS = (("x", 0, pb.FLOAT32), ("y", 4, pb.FLOAT32), ("z", 8, pb.FLOAT32))


def _scan(
    num_points: int, seed: int
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Lidar geometry: (n, 3) float32 xyz, ranges and elevations (float64) for ``num_points``.

    Beams at evenly spaced elevations; each sweeps the full azimuth. Downward beams hit a flat
    ground plane ``SENSOR_HEIGHT_M`` below the sensor; the others hit a "skyline" of walls whose
    distance varies smoothly with azimuth (a few random harmonics) or, in open sectors, far
    returns up to ``MAX_RANGE_M``; plus centimetre noise.
    """
    if num_points < 0:
        raise ValueError(f"num_points must be >= 0, got {num_points}")
    rng = np.random.default_rng(seed)
    beams = max(1, min(64, num_points // 256 or 1))
    per_beam = math.ceil(num_points / beams) if num_points else 0
    elev = np.deg2rad(np.linspace(*ELEVATION_DEG, beams))
    az = np.linspace(0.0, 2.0 * np.pi, per_beam, endpoint=False)
    az = (az[None, :] + rng.uniform(0, 2 * np.pi / max(per_beam, 1), (beams, 1))).ravel()
    el = np.repeat(elev, per_beam)
    # Walls: base distance plus a few random harmonics in azimuth.
    harmonics = rng.integers(1, 7, size=4)
    amps = rng.uniform(2.0, 12.0, size=4)
    phases = rng.uniform(0, 2 * np.pi, size=4)
    wall = 25.0 + sum(
        a * np.sin(h * az + p) for h, a, p in zip(harmonics, amps, phases, strict=True)
    )
    # Open sectors (streets, gaps between buildings) return from far away.
    far = np.sin(3.0 * az + phases[0]) > 0.7
    wall = np.where(far, rng.uniform(50.0, MAX_RANGE_M, size=az.shape), wall)
    # Near clutter (poles, the vehicle's own mirrors): a few returns between 1 and 4 m.
    near = rng.random(az.shape) < 0.02
    wall = np.where(near, rng.uniform(MIN_RANGE_M, 4.0, size=az.shape), wall)
    ground = np.where(el < 0, SENSOR_HEIGHT_M / np.maximum(np.sin(-el), 1e-6), np.inf)
    rng_m = np.minimum(wall, ground) + rng.normal(0.0, 0.02, size=el.shape)
    rng_m = np.clip(rng_m, MIN_RANGE_M, MAX_RANGE_M)[:num_points]
    el, az = el[:num_points], az[:num_points]
    cos_el = np.cos(el)
    xyz = np.stack(
        [rng_m * cos_el * np.cos(az), rng_m * cos_el * np.sin(az), rng_m * np.sin(el)], axis=1
    ).astype(np.float32)
    return xyz, rng_m, el


def lidar_xyzi(num_points: int, seed: int = 0) -> CloudData:
    """A lidar-like scan: float32 x, y, z, intensity; stride 16."""
    xyz, ranges, _ = _scan(num_points, seed)
    rng = np.random.default_rng(seed + 0x5EED)
    # Intensity falls with range (inverse square-ish) with per-point reflectivity noise.
    intensity = np.clip(
        (MIN_RANGE_M / np.maximum(ranges, MIN_RANGE_M)) ** 0.5 * rng.uniform(0.5, 1.0, len(ranges)),
        0.0,
        1.0,
    ).astype(np.float32)
    rec = np.empty((len(xyz), 4), dtype="<f4")
    rec[:, :3] = xyz
    rec[:, 3] = intensity
    return CloudData(_fields(*XYZ_FIELDS, ("intensity", 12, pb.FLOAT32)), rec.tobytes(), 16)


def lidar_xyzrgb(num_points: int, seed: int = 0) -> CloudData:
    """The same scan coloured by height: float32 x, y, z + packed ``rgb`` (uint32 0x00RRGGBB)."""
    xyz, _, _ = _scan(num_points, seed)
    t = np.clip((xyz[:, 2].astype(np.float64) + SENSOR_HEIGHT_M) / 10.0, 0.0, 1.0)
    r = (255 * t).astype(np.uint32)
    g = (255 * (1.0 - np.abs(2.0 * t - 1.0))).astype(np.uint32)
    b = (255 * (1.0 - t)).astype(np.uint32)
    rec = np.empty(len(xyz), dtype=[("xyz", "<f4", 3), ("rgb", "<u4")])
    rec["xyz"] = xyz
    rec["rgb"] = (r << 16) | (g << 8) | b
    return CloudData(_fields(*XYZ_FIELDS, ("rgb", 12, pb.UINT32)), rec.tobytes(), 16)


def synthetic(num_points: int, seed: int = 0, *, color: bool = False) -> CloudData:
    """Pick the xyz+intensity (default) or xyz+rgb variant."""
    return lidar_xyzrgb(num_points, seed) if color else lidar_xyzi(num_points, seed)


# ---------------------------------------------------------------------------------------------
# Files through Open3D


def _import_open3d() -> Any:
    """Import Open3D lazily: it is optional and its import can fail on missing system libraries."""
    try:
        import open3d
    except ImportError as exc:  # ModuleNotFoundError or a missing shared library (OSError-ish)
        raise Open3DUnavailable(
            f"Open3D cannot be imported ({exc}). Install it with `pip install 'simbridge[open3d]'`;"
            " its wheel also needs the system library libusb-1.0 (apt-get install libusb-1.0-0)."
        ) from exc
    except OSError as exc:
        raise Open3DUnavailable(
            f"Open3D failed to load a shared library ({exc}); install libusb-1.0-0"
            " (apt-get install libusb-1.0-0)."
        ) from exc
    return open3d


def _colors_u8(colors: npt.NDArray[Any]) -> npt.NDArray[np.uint32]:
    if np.issubdtype(colors.dtype, np.floating):
        return np.clip(np.rint(colors * 255.0), 0, 255).astype(np.uint32)
    if colors.dtype == np.uint16:
        return (colors >> 8).astype(np.uint32)
    return colors.astype(np.uint32)


def load_cloud(path: str | Path, *, drop_nonfinite: bool = False) -> CloudData:
    """Read a PCD/PLY (any format Open3D's tensor I/O reads) into a :class:`CloudData`.

    Layout: float32 x, y, z, then packed ``rgb`` (uint32) if the file has colours, else
    float32 ``intensity`` if it has one, else nothing (stride 12). NaN points of organized
    clouds are kept unless ``drop_nonfinite`` — the bridge must cope with them.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(path)
    o3d = _import_open3d()
    pcd = o3d.t.io.read_point_cloud(str(path))
    if "positions" not in pcd.point:
        raise ValueError(f"{path}: no points (unreadable or empty file)")
    xyz = pcd.point.positions.numpy().astype("<f4", copy=False).reshape(-1, 3)
    extra: tuple[str, npt.NDArray[Any]] | None = None
    if "colors" in pcd.point:
        c = _colors_u8(pcd.point.colors.numpy().reshape(-1, 3))
        extra = ("rgb", ((c[:, 0] << 16) | (c[:, 1] << 8) | c[:, 2]).astype("<u4"))
    elif "intensity" in pcd.point:
        extra = ("intensity", pcd.point["intensity"].numpy().reshape(-1).astype("<f4"))
    if drop_nonfinite:
        keep = np.isfinite(xyz).all(axis=1)
        xyz = xyz[keep]
        if extra is not None:
            extra = (extra[0], extra[1][keep])
    if extra is None:
        return CloudData(_fields(*XYZ_FIELDS), np.ascontiguousarray(xyz).tobytes(), 12)
    name, values = extra
    rec = np.empty(len(xyz), dtype=[("xyz", "<f4", 3), (name, values.dtype)])
    rec["xyz"] = xyz
    rec[name] = values
    ftype = pb.UINT32 if name == "rgb" else pb.FLOAT32
    return CloudData(_fields(*XYZ_FIELDS, (name, 12, ftype)), rec.tobytes(), 16)
