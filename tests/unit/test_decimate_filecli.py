"""``simbridge decimate IN OUT``: round trip through Open3D files, errors as exit status 1."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bridge.decimate import available_backends
from bridge.decimate.filecli import main
from bridge.decimate.reference import downsample_arrays

o3d: Any = pytest.importorskip("open3d", reason="open3d cannot be imported (libusb-1.0-0?)")


@pytest.fixture
def cloud_file(tmp_path: Path) -> tuple[Path, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(2)
    xyz = rng.uniform(-3, 3, (5000, 3)).astype(np.float32)
    xyz[::10] = np.nan
    rgb = rng.integers(0, 256, (5000, 3), dtype=np.uint8)
    pcd = o3d.t.geometry.PointCloud(o3d.core.Tensor(xyz))
    pcd.point.colors = o3d.core.Tensor(rgb)
    path = tmp_path / "in.pcd"
    assert o3d.t.io.write_point_cloud(str(path), pcd)
    return path, xyz, rgb


@pytest.mark.parametrize("suffix", [".pcd", ".ply"])
def test_round_trip_matches_reference(
    cloud_file: tuple[Path, np.ndarray, np.ndarray],
    tmp_path: Path,
    suffix: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    src, xyz, _ = cloud_file
    out = tmp_path / f"out{suffix}"
    assert main([str(src), str(out), "--voxel", "0.5", "--backend", "numpy"]) == 0
    assert "points" in capsys.readouterr().out
    got = o3d.t.io.read_point_cloud(str(out))
    want = downsample_arrays(xyz, 0.5)
    np.testing.assert_allclose(got.point.positions.numpy(), want, rtol=1e-6)
    assert got.point.colors.numpy().dtype == np.uint8


def test_point_budget(cloud_file: tuple[Path, np.ndarray, np.ndarray], tmp_path: Path) -> None:
    src, _, _ = cloud_file
    out = tmp_path / "out.pcd"
    assert main([str(src), str(out), "--voxel", "0.1", "--max-points", "300", "-q"]) == 0
    assert len(o3d.t.io.read_point_cloud(str(out)).point.positions) <= 300


def test_errors_exit_1(
    cloud_file: tuple[Path, np.ndarray, np.ndarray],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    src, _, _ = cloud_file
    assert main([str(tmp_path / "missing.pcd"), str(tmp_path / "o.pcd"), "--voxel", "1"]) == 1
    assert "no such file" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:  # a usage error, named by its flag
        main([str(src), str(tmp_path / "o.pcd"), "--voxel", "0"])
    assert info.value.code == 2
    assert "argument --voxel: must be a finite number > 0" in capsys.readouterr().err
    reason = available_backends()["cuda"]
    if reason is not None:
        assert main([str(src), str(tmp_path / "o.pcd"), "--voxel", "1", "--backend", "cuda"]) == 1
        assert reason in capsys.readouterr().err


def test_help_and_usage(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    assert "Voxel-downsample" in capsys.readouterr().out
    with pytest.raises(SystemExit) as info:
        main(["only-one-arg"])
    assert info.value.code == 2


def test_errors_name_the_flags_not_library_arguments(
    cloud_file: tuple[Path, np.ndarray, np.ndarray],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    src, _, _ = cloud_file
    # A voxel so small the keys overflow int64: the decimator's error, in the command's words.
    assert main([str(src), str(tmp_path / "o.pcd"), "--voxel", "1e-30", "--backend", "numpy"]) == 1
    err = capsys.readouterr().err
    assert "--voxel" in err and "voxel_size" not in err
    for argv, flag in (
        (["--voxel", "nan"], "--voxel"),
        (["--voxel", "1", "--threads", "0"], "--threads"),
        (["--voxel", "1", "--max-points", "-1"], "--max-points"),
    ):
        with pytest.raises(SystemExit) as info:
            main([str(src), str(tmp_path / "o.pcd"), *argv])
        assert info.value.code == 2
        assert f"argument {flag}:" in capsys.readouterr().err


def test_missing_directory_is_named(
    cloud_file: tuple[Path, np.ndarray, np.ndarray],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    src, _, _ = cloud_file
    out = tmp_path / "no-such-dir" / "o.pcd"
    assert main([str(src), str(out), "--voxel", "1"]) == 1
    err = capsys.readouterr().err
    assert f"no such directory: {out.parent}" in err and "suffix" not in err
    assert main([str(tmp_path / "nope" / "in.pcd"), str(tmp_path / "o.pcd"), "--voxel", "1"]) == 1
    assert "no such directory" in capsys.readouterr().err
    assert main([str(src), str(tmp_path / "o.las"), "--voxel", "1"]) == 1
    assert "unknown output format '.las'; use one of .pcd, .ply" in capsys.readouterr().err


def test_xyz_output_refuses_to_drop_fields(
    cloud_file: tuple[Path, np.ndarray, np.ndarray],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    src, xyz, _ = cloud_file
    out = tmp_path / "o.xyz"
    assert main([str(src), str(out), "--voxel", "0.5", "--backend", "numpy"]) == 1
    err = capsys.readouterr().err
    assert ".xyz files store only positions" in err and "colors would be lost" in err
    assert not out.exists()
    assert main([str(src), str(out), "--voxel", "0.5", "--backend", "numpy", "--drop-fields"]) == 0
    got = o3d.t.io.read_point_cloud(str(out)).point.positions.numpy()
    np.testing.assert_allclose(got, downsample_arrays(xyz, 0.5), rtol=1e-5)
    # .xyzrgb keeps the colours: nothing would be lost, so nothing is refused for that reason
    # (Open3D's own .xyzrgb writer may still reject uint8 colours; that is a separate message).
    main([str(src), str(tmp_path / "o.xyzrgb"), "--voxel", "0.5", "-q"])
    assert "would be lost" not in capsys.readouterr().err


def test_no_open3d_console_noise(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """Open3D's own coloured "[Open3D WARNING]" lines (printed by its C++ code) stay out."""
    bad = tmp_path / "garbage.pcd"
    bad.write_bytes(b"this is not a point cloud\n")
    assert main([str(bad), str(tmp_path / "o.pcd"), "--voxel", "1"]) == 1
    out, err = capfd.readouterr()
    assert "no points read" in err
    assert "[Open3D" not in out + err and "\x1b[" not in out + err
