"""loadgen.scenario: parsing, units, validation; bad files fail with every problem named."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadgen.scenario import (
    BUILTINS,
    ResizeStep,
    ScenarioError,
    builtin,
    from_mapping,
    load,
    parse_cpu,
    parse_duration,
    parse_memory,
)

GiB = 1 << 30
MiB = 1 << 20


def test_units() -> None:
    assert parse_duration(10) == 10.0
    assert parse_duration("2.5s") == 2.5
    assert parse_duration("500ms") == 0.5
    assert parse_duration("2m") == 120.0
    assert parse_cpu(0.5) == 0.5
    assert parse_cpu("250m") == 0.25
    assert parse_cpu(2) == 2.0
    assert parse_memory("2Gi") == 2 * GiB
    assert parse_memory("512Mi") == 512 * MiB
    assert parse_memory(64 * MiB) == 64 * MiB
    for bad in ("ten", "-1s", True, "5 parsecs"):
        with pytest.raises(ValueError):
            parse_duration(bad)
    for bad in ("lots", 0, True, "1x"):
        with pytest.raises(ValueError):
            parse_cpu(bad)
    for bad in ("2GB!", "1Ki", False):
        with pytest.raises(ValueError):
            parse_memory(bad)


def test_yaml_file(tmp_path: Path) -> None:
    f = tmp_path / "s.yaml"
    f.write_text(
        """
name: mine
edges: 3
transport: grpc
rate_hz: 20
points: 1000
duration: 12s
initial: {cpu: 1, memory: 1Gi}
resizes:
  - {at: 4s, cpu: 500m}
  - {at: 6s, memory: 2Gi}
  - {at: 8s, cpu: 2, memory: usage}
baseline: none
bridge: {voxel_size: 0.1}
"""
    )
    s = load(f)
    assert (s.name, s.edges, s.transport, s.rate_hz, s.points) == ("mine", 3, "grpc", 20.0, 1000)
    assert s.duration_s == 12.0 and s.baseline == "none"
    assert (s.initial_cpu, s.initial_memory) == (1.0, GiB)
    assert s.resizes == (
        ResizeStep(4.0, cpu=0.5),
        ResizeStep(6.0, memory=2 * GiB),
        ResizeStep(8.0, cpu=2.0, memory_below_usage=True),
    )
    assert s.bridge == {"voxel_size": 0.1}
    assert s.transport_of(0) == "grpc"
    assert s.frames_per_edge == 12 * 20 * 2  # one cloud stream + telemetry


def test_toml_and_json(tmp_path: Path) -> None:
    t = tmp_path / "s.toml"
    t.write_text(
        'edges = 2\nduration = "5s"\n[[resizes]]\nat = "2s"\ncpu = 1\n'
        '[[resizes]]\nat = "3s"\nmemory = "1Gi"\n'
    )
    s = load(t)
    assert s.name == "s" and s.edges == 2 and len(s.resizes) == 2
    j = tmp_path / "j.json"
    j.write_text('{"name": "j", "transport": "mixed", "edges": 4, "duration": 3}')
    s = load(j)
    assert [s.transport_of(i) for i in range(4)] == ["ws", "grpc", "ws", "grpc"]


@pytest.mark.parametrize("name", [b for b in BUILTINS if b != "steady"])
def test_builtins_parse(name: str) -> None:
    s = builtin(name)
    assert s.name == name
    assert len(s.resizes) >= 6
    assert s.baseline == "restart"


def test_steady_builtin_is_load_only() -> None:
    """For an external bridge (``run --target``): whoever runs it resizes the Pod."""
    s = builtin("steady")
    assert s.resizes == () and s.baseline == "none"
    assert {s.transport_of(i) for i in range(s.edges)} == {"ws", "grpc"}


def test_ci_short_covers_the_cases_the_test_needs() -> None:
    s = builtin("ci-short")
    cpus = [r.cpu for r in s.resizes if r.cpu is not None]
    mems = [r.memory for r in s.resizes if r.memory is not None]
    assert any(b < a for a, b in zip([s.initial_cpu, *cpus], cpus, strict=False))  # cpu down
    assert any(b > a for a, b in zip([s.initial_cpu, *cpus], cpus, strict=False))  # cpu up
    assert any(b < a for a, b in zip([s.initial_memory, *mems], mems, strict=False))
    assert any(b > a for a, b in zip([s.initial_memory, *mems], mems, strict=False))
    assert any(r.memory_below_usage for r in s.resizes)
    assert s.duration_s <= 30


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text(
        """
edges: 0
transport: carrier-pigeon
rate_hz: "fast"
duration: 10s
colour: true
resizes:
  - {at: 20s, cpu: 1}
  - {cpu: 2}
  - {at: 3s, memory: 1GB!}
  - {at: 2s, cpu: 1, disk: 5Gi}
bridge: {ws_port: 1, nonsense: 2}
"""
    )
    with pytest.raises(ScenarioError) as ei:
        load(f)
    text = str(ei.value)
    assert str(f) in text
    for expected in (
        "unknown key 'colour'",
        "rate_hz: expected a number",
        "resizes[1]: missing 'at'",
        "resizes[2].memory",
        "resizes[3]: unknown key 'disk'",
        "bridge.ws_port: set by the runner",
        "bridge.nonsense: not a bridge setting",
    ):
        assert expected in text, (expected, text)


def test_semantic_checks() -> None:
    with pytest.raises(ScenarioError) as ei:
        from_mapping(
            {
                "edges": 0,
                "transport": "carrier-pigeon",
                "duration": 10,
                "resizes": [{"at": 20, "cpu": 1}, {"at": 5, "cpu": 1}, {"at": 4, "cpu": 2}],
            }
        )
    text = str(ei.value)
    assert "edges: must be >= 1" in text
    assert "transport: 'carrier-pigeon' is not one of" in text
    assert "outside the measured window" in text
    assert "increasing time order" in text


def test_unreadable_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="cannot read"):
        load(tmp_path / "missing.yaml")
    f = tmp_path / "broken.toml"
    f.write_text("edges = [")
    with pytest.raises(ScenarioError, match="not valid TOML"):
        load(f)
    f = tmp_path / "list.yaml"
    f.write_text("- 1\n- 2\n")
    with pytest.raises(ScenarioError, match="expected a mapping at the top level"):
        load(f)
    with pytest.raises(ScenarioError, match="no built-in scenario 'nope'"):
        builtin("nope")


def test_memory_usage_keyword_only_in_steps() -> None:
    with pytest.raises(ScenarioError, match=r"initial\.memory"):
        from_mapping({"initial": {"memory": "usage"}})


def test_cloud_files_without_open3d_fall_back_visibly(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Files present but no Open3D: synthetic clouds, and the report says SKIPPED."""
    from loadgen import steps
    from loadgen.clouds import Open3DUnavailable

    def no_open3d(path: object) -> None:
        raise Open3DUnavailable("Open3D cannot be imported (test)")

    (tmp_path / "a.pcd").write_bytes(b"not read")
    s = from_mapping({"clouds": [str(tmp_path / "*.pcd")], "points": 100})
    monkeypatch.setattr(steps, "load_cloud", no_open3d)
    payloads, note = steps.prepare_clouds(s)
    assert len(payloads) == 4
    assert note.startswith("SKIPPED cloud files (Open3D unavailable") and "synthetic" in note


def test_missing_cloud_files_are_an_error(tmp_path: Path) -> None:
    """A glob that matches nothing (e.g. a data folder that is not there) stops the run."""
    from loadgen import steps

    pattern = str(tmp_path / "absent" / "frame_*.pcd")
    s = from_mapping({"name": "replay", "clouds": [pattern], "points": 100})
    with pytest.raises(FileNotFoundError, match="no cloud file at") as err:
        steps.prepare_clouds(s)
    assert pattern in str(err.value)


def test_pcd_replay_scenario_names_vendored_frames(monkeypatch: pytest.MonkeyPatch) -> None:
    """The shipped replay scenario points at the frames in this repository (run from its root)."""
    from importlib import resources

    repo = Path(__file__).resolve().parents[2]
    monkeypatch.chdir(repo)
    s = load(Path(str(resources.files("loadgen").joinpath("scenarios", "pcd-replay.yaml"))))
    files = s.cloud_files()
    assert len(files) == 3
    for f in files:
        path = (repo / f).resolve()
        assert path.is_file() and path.is_relative_to(repo / "tests" / "data" / "pcl"), f


def test_shipped_example_files_parse() -> None:
    from importlib import resources

    folder = resources.files("loadgen").joinpath("scenarios")
    names = sorted(p.name for p in folder.iterdir() if p.name.endswith(".yaml"))
    assert {"demo.yaml", "ci-short.yaml", "long.yaml", "pcd-replay.yaml"} <= set(names)
    for name in names:
        s = load(Path(str(folder.joinpath(name))))
        assert s.resizes or name == "steady.yaml", name
