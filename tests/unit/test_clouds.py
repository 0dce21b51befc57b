"""Synthetic clouds are deterministic, valid on the wire and lidar-shaped; files load via Open3D."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from bridge.protocol.cloud import field_view, make_layout, xyz_view
from bridge.v1 import bridge_pb2 as pb
from loadgen import clouds
from loadgen.clouds import CloudData, Open3DUnavailable, lidar_xyzi, lidar_xyzrgb, load_cloud


def xyz_of(c: CloudData) -> np.ndarray:
    return np.asarray(xyz_view(make_layout(c.stride, c.layout_triples()), c.data), np.float64)


@pytest.mark.parametrize("make", [lidar_xyzi, lidar_xyzrgb])
def test_same_seed_same_bytes_other_seed_other_bytes(make: object) -> None:
    gen = make  # type: ignore[assignment]
    assert gen(5000, seed=7) == gen(5000, seed=7)  # type: ignore[operator]
    assert gen(5000, seed=7).data != gen(5000, seed=8).data  # type: ignore[operator]


@pytest.mark.parametrize("n", [0, 1, 255, 1000, 100_001])
@pytest.mark.parametrize("make", [lidar_xyzi, lidar_xyzrgb])
def test_layout_is_valid_and_point_count_exact(make: object, n: int) -> None:
    c = make(n, seed=1)  # type: ignore[operator]
    layout = make_layout(c.stride, c.layout_triples())
    assert c.stride == layout.stride == 16
    assert len(c.data) == 16 * n and c.num_points == n
    assert [f.name for f in layout.fields][:3] == ["x", "y", "z"]
    msg = c.to_proto("sensor")
    assert pb.PointCloud.FromString(msg.SerializeToString()) == msg
    assert msg.frame_id == "sensor" and msg.point_stride == 16


def test_lidar_geometry_rings_and_ranges() -> None:
    n = 64 * 1000
    c = lidar_xyzi(n, seed=3)
    xyz = xyz_of(c)
    r = np.linalg.norm(xyz, axis=1)
    assert r.min() >= clouds.MIN_RANGE_M - 1e-4 and r.max() <= clouds.MAX_RANGE_M + 1e-3
    assert (r < 5).any() and (r > 50).any()  # near clutter and far open sectors both present
    elev_deg = np.degrees(np.arcsin(xyz[:, 2] / r))
    beams = np.unique(np.round(elev_deg, 2))
    assert len(beams) == 64  # range noise moves points along their beam, never across beams
    assert beams.min() == pytest.approx(-25.0, abs=0.01)
    assert beams.max() == pytest.approx(15.0, abs=0.01)
    lay = make_layout(c.stride, c.layout_triples())
    intensity = np.asarray(field_view(lay, c.data, "intensity"))
    assert intensity.dtype == np.float32
    assert intensity.min() >= 0.0 and intensity.max() <= 1.0


def test_rgb_variant_has_the_same_geometry_and_packed_colours() -> None:
    a, b = lidar_xyzi(3000, seed=5), lidar_xyzrgb(3000, seed=5)
    assert np.array_equal(xyz_of(a), xyz_of(b))
    lay = make_layout(b.stride, b.layout_triples())
    assert lay.field("rgb").is_packed_color
    rgb = np.asarray(field_view(lay, b.data, "rgb"))
    assert (rgb >> 24 == 0).all() and len(np.unique(rgb)) > 10


def test_negative_count_is_rejected() -> None:
    with pytest.raises(ValueError, match="num_points"):
        lidar_xyzi(-1)


def test_missing_open3d_gives_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    path = tmp_path / "a.pcd"
    path.write_text("not really a pcd")
    monkeypatch.setitem(sys.modules, "open3d", None)  # makes `import open3d` raise ImportError
    with pytest.raises(Open3DUnavailable, match="libusb"):
        load_cloud(path)


def test_missing_file() -> None:
    with pytest.raises(FileNotFoundError):
        load_cloud("/nonexistent/cloud.pcd")


def _o3d() -> object:
    try:
        return clouds._import_open3d()
    except Open3DUnavailable as exc:
        pytest.skip(f"Open3D unavailable: {exc}")


@pytest.mark.parametrize("suffix", [".pcd", ".ply"])
def test_loader_roundtrips_xyz_and_colours(tmp_path: Path, suffix: str) -> None:
    o3d = _o3d()
    src = lidar_xyzrgb(2000, seed=9)
    xyz = xyz_of(src).astype(np.float32)
    rgb = np.asarray(field_view(make_layout(16, src.layout_triples()), src.data, "rgb"))
    cols = np.stack([(rgb >> 16) & 255, (rgb >> 8) & 255, rgb & 255], axis=1) / 255.0
    pcd = o3d.t.geometry.PointCloud()  # type: ignore[attr-defined]
    pcd.point.positions = o3d.core.Tensor(xyz)  # type: ignore[attr-defined]
    pcd.point.colors = o3d.core.Tensor(cols.astype(np.float32))  # type: ignore[attr-defined]
    path = tmp_path / f"cloud{suffix}"
    assert o3d.t.io.write_point_cloud(str(path), pcd)  # type: ignore[attr-defined]
    back = load_cloud(path)
    assert back.num_points == 2000 and back.stride == 16
    assert np.array_equal(xyz_of(back), xyz.astype(np.float64))
    lay = make_layout(back.stride, back.layout_triples())
    assert np.array_equal(np.asarray(field_view(lay, back.data, "rgb")), rgb)


def test_loader_keeps_or_drops_nan_points(tmp_path: Path) -> None:
    o3d = _o3d()
    xyz = xyz_of(lidar_xyzi(100, seed=2)).astype(np.float32)
    xyz[::4] = np.nan  # an organized depth image has holes like these
    pcd = o3d.t.geometry.PointCloud()  # type: ignore[attr-defined]
    pcd.point.positions = o3d.core.Tensor(xyz)  # type: ignore[attr-defined]
    path = tmp_path / "holes.pcd"
    o3d.t.io.write_point_cloud(str(path), pcd)  # type: ignore[attr-defined]
    kept = load_cloud(path)
    assert kept.num_points == 100 and kept.stride == 12
    assert np.isnan(xyz_of(kept)).any()
    dropped = load_cloud(path, drop_nonfinite=True)
    assert dropped.num_points == 75 and np.isfinite(xyz_of(dropped)).all()


def test_loader_reads_a_real_capture_when_present() -> None:
    data = Path(__file__).resolve().parents[1] / "data" / "pcl"
    files = sorted(data.glob("*.pcd")) if data.is_dir() else []
    if not files:
        pytest.skip(f"no real clouds under {data}")
    _o3d()
    c = load_cloud(files[0])
    assert c.num_points == 640 * 480
    make_layout(c.stride, c.layout_triples())
