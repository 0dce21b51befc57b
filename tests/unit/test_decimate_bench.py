"""Smoke test of ``simbridge bench decimate`` on a tiny input (figures are not asserted)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bridge.decimate.bench import lidar_like, main, synthetic_case, uniform


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


def test_inputs_are_deterministic() -> None:
    assert (lidar_like(1000, 3) == lidar_like(1000, 3)).all()
    assert lidar_like(1001).shape == (1001, 3)
    assert uniform(10).dtype.name == "float32"
    case = synthetic_case("lidar-shuffled", 2000, 0.2, 0)
    assert case.points == 2000
    with pytest.raises(ValueError, match="shape"):
        synthetic_case("cube", 10, 0.2, 0)


def test_missing_real_frames_directory_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A missing data folder stops the benchmark instead of silently dropping the real frames."""
    missing = tmp_path / "no-such-dir"
    with pytest.raises(SystemExit) as info:
        main(["--sizes", "3k", "--voxels", "0.5", "--shapes", "lidar", "--real", str(missing)])
    assert info.value.code == 2
    assert f"--real {missing}: no such directory" in capsys.readouterr().err
