"""Smoke test of ``make bench-decimate`` (``python -m benchmarks.decimate.cli``) on a tiny input
(figures are not asserted)."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from benchmarks.decimate import peers as decimate_peers
from benchmarks.decimate.cli import main, synthetic_case
from benchmarks.decimate.peers import pcl_harness, pcl_timed
from bridge.decimate import available_backends
from tests.support.clouds import lidar_like, uniform


def test_help_names_the_command_a_user_types() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.decimate.cli", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: python -m benchmarks.decimate.cli")
    assert "--quick" in proc.stdout


def test_json_report_has_every_method(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--sizes", "3k", "--voxels", "0.5", "--shapes", "lidar", "--no-real"]
    assert main([*argv, "--repeats", "1", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    methods = {r["method"] for r in report["results"]}
    assert "numpy" in methods
    if report["env"]["backends"]["c"] is None:
        assert "c x1" in methods
    counts = {r["out_points"] for r in report["results"] if r["method"] != "o3d legacy"}
    assert len(counts) == 1, "every method except Open3D legacy bins identically"
    assert {g["method"] for g in report["gil"]} >= {"numpy"}
    assert all(r["mpts_per_s"] > 0 for r in report["results"])
    assert report["env"]["cpu"], "figures are only comparable on the same kind of CPU"


def test_inputs_are_deterministic() -> None:
    assert (lidar_like(1000, 3) == lidar_like(1000, 3)).all()
    assert lidar_like(1001).shape == (1001, 3)
    assert uniform(10).dtype.name == "float32"
    case = synthetic_case("lidar-shuffled", 2000, 0.2, 0)
    assert case.points == 2000
    with pytest.raises(ValueError, match="shape"):
        synthetic_case("cube", 10, 0.2, 0)


def test_real_bin_frames_and_in_service_rows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--real DIR adds KITTI-style .bin frames; 'service' times the worker's whole job."""
    rng = np.random.default_rng(0)
    xyzi = rng.normal(0, 5, (4000, 4)).astype("<f4")
    (tmp_path / "scan.bin").write_bytes(xyzi.tobytes())
    argv = ["--sizes", "2k", "--voxels", "0.5", "--shapes", "lidar", "--methods", "numpy,c,service"]
    argv += ["--real", str(tmp_path), "--bin-layout", "xyzi", "--no-gil", "--repeats", "1"]
    assert main([*argv, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    scan = [r for r in report["results"] if r["case"].startswith("scan")]
    assert {r["points"] for r in scan} == {4000}
    assert len({r["out_points"] for r in scan}) == 1  # service and bare agree
    if report["env"]["backends"]["c"] is None:
        assert {"c x1", "c x1 service"} <= {r["method"] for r in scan}
        # the in-service overhead, timed with the bare kernel call by call: a plain ratio
        ratio = report["service_vs_bare"][scan[0]["case"]]
        assert 0.2 < ratio < 20


def test_report_says_when_the_kernel_guessed_its_key_frame(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The 100k-point lidar case takes the radix path's guessed key frame (native/README.md);
    the report counts the guesses and misses per case, so a figure can be read with it."""
    if available_backends()["c"] is not None:
        pytest.skip("no C backend")
    argv = ["--sizes", "100k", "--voxels", "0.2", "--shapes", "lidar", "--methods", "c"]
    assert main([*argv, "--no-real", "--no-gil", "--repeats", "1", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    [(case, (guessed, missed))] = report["c_key_frame_guessed_missed"].items()
    assert case.startswith("lidar 100k")
    assert guessed > 0 and missed == 0


def test_pcl_harness_builds_or_says_why() -> None:
    harness, why = pcl_harness()
    if harness is None:
        assert "PCL" in why or "compiler" in why
        return
    rng = np.random.default_rng(1)
    xyz = rng.normal(0, 2, (5000, 3)).astype(np.float32)
    seconds, count = pcl_timed(harness, xyz, None, 0.5, 3)()
    ours = synthetic_xyz_count(xyz, 0.5)
    assert seconds > 0 and abs(count - ours) <= max(3, ours // 100)  # float32 1/v on faces


def test_pcl_input_is_written_once_and_removed_with_its_runner(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Interleaved rounds call the runner many times: the cloud goes to disk once."""
    harness, why = pcl_harness()
    if harness is None:
        pytest.skip(why)
    made: list[str] = []
    real = tempfile.NamedTemporaryFile

    def spy(*args: Any, **kwargs: Any) -> Any:
        handle = real(*args, **kwargs)
        made.append(handle.name)
        return handle

    monkeypatch.setattr(decimate_peers.tempfile, "NamedTemporaryFile", spy)
    xyz = np.random.default_rng(2).normal(0, 2, (3000, 3)).astype(np.float32)
    run = pcl_timed(harness, xyz, None, 0.5, 3)
    assert run()[1] == run()[1] > 0
    assert len(made) == 1 and Path(made[0]).exists()
    del run
    gc.collect()
    assert not Path(made[0]).exists()


def synthetic_xyz_count(xyz: np.ndarray, voxel: float) -> int:
    from bridge.decimate import downsample_arrays

    return len(downsample_arrays(xyz, voxel))


def test_missing_real_frames_directory_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A missing data folder stops the benchmark instead of silently dropping the real frames."""
    missing = tmp_path / "no-such-dir"
    with pytest.raises(SystemExit) as info:
        main(["--sizes", "3k", "--voxels", "0.5", "--shapes", "lidar", "--real", str(missing)])
    assert info.value.code == 2
    assert f"--real {missing}: no such directory" in capsys.readouterr().err


def test_c_vs_its_peers_is_also_measured_in_alternation(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The ratios the targets are judged by: C and each peer timed round by round, not rows
    apart (PCL in its own process, Open3D's best in this one)."""
    if pcl_harness()[0] is None:
        pytest.skip(f"PCL harness unavailable: {pcl_harness()[1]}")
    argv = ["--sizes", "3k", "--voxels", "0.5", "--shapes", "lidar", "--no-real", "--no-gil"]
    assert main([*argv, "--methods", "c,pcl,open3d", "--repeats", "1", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    if report["env"]["backends"]["c"] is not None:
        pytest.skip("C extension not built")
    peers = report["c_vs_peers_interleaved"]
    (pcl,) = peers["pcl"].values()
    assert 0.05 < pcl < 100
    if report["env"]["open3d"] is not None:
        (o3d,) = peers["o3d best"].values()
        assert 0.05 < o3d < 1000


def test_cpu_time_runs_print_no_thread_speed_up() -> None:
    """Under ``--cpu-time`` a two-thread call's time is both threads' CPU time, so "c x2 / c x1"
    would read as a slow-down (0.5 for a perfect speed-up): the summary says n/a instead; wall
    time still gives the ratio."""
    from benchmarks.decimate.cli import Row

    def row(method: str, mpts: float) -> Row:
        return Row("lidar 1M v0.2", "lidar", 1_000_000, 0.2, method, mpts, 1 / mpts, 1, None)

    rows = [row("c x1", 40.0), row("c x2", 41.0)]
    try:
        decimate_peers.use_cpu_time(True)
        line = decimate_peers.ratio_summary(rows)
        assert "c x2 / c x1 n/a" in line and "1.02" not in line
    finally:
        decimate_peers.use_cpu_time(False)
    assert "c x2 / c x1 1.02" in decimate_peers.ratio_summary(rows)
