"""cgroup parsers (strings in) and the reader/finder on named fixture trees (automaxprocs-style).

Each tree under tests/fixtures/cgroups/<case>/ holds ``proc/self/{cgroup,mountinfo}`` and the cgroup
files at the paths the mountinfo points to, re-rooted under the tree.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from bridge.resources import cgroup_parse as cp
from bridge.resources.cgroup import CgroupReader, find_cgroup, open_cgroup
from bridge.resources.poller import Poller
from bridge.resources.snapshot import CgroupReading

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "cgroups"
GiB = 1 << 30


def read_tree(case: str) -> CgroupReading:
    tree = FIXTURES / case
    return find_cgroup(proc_root=str(tree / "proc"), fs_root=str(tree)).read()


# ------------------------------------------------------------------------- pure parsers


@pytest.mark.parametrize(
    ("text", "quota", "period", "cores"),
    [
        ("max 100000\n", None, 100000, None),
        ("200000 100000\n", 200000, 100000, 2.0),
        ("25000 100000", 25000, 100000, 0.25),
        ("50000 50000", 50000, 50000, 1.0),
        ("150000", 150000, 100000, 1.5),  # the kernel keeps the default period for a lone quota
        ("max", None, 100000, None),
    ],
)
def test_parse_cpu_max(text: str, quota: int | None, period: int, cores: float | None) -> None:
    got = cp.parse_cpu_max(text)
    assert (got.quota_us, got.period_us, got.cores) == (quota, period, cores)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("asdf 100000", "not an integer"),
        ("250000 0", "period must be > 0"),
        ("250000 100000 100", "3 fields"),
        ("", "expected one line"),
        ("100 100000\n200 100000\n", "expected one line"),
        ("0 100000", "quota must be > 0"),
        ("-1 100000", "quota must be > 0"),
        ("max -5", "period must be > 0"),
    ],
)
def test_parse_cpu_max_errors(text: str, match: str) -> None:
    with pytest.raises(cp.CgroupParseError, match=match):
        cp.parse_cpu_max(text)


@pytest.mark.parametrize(
    ("quota", "period", "expected"),
    [("-1", "100000", None), ("150000", "100000", 1.5), ("50000\n", "100000\n", 0.5)],
)
def test_parse_v1_cpu(quota: str, period: str, expected: float | None) -> None:
    assert cp.parse_v1_cpu(quota, period).cores == expected


@pytest.mark.parametrize(("quota", "period"), [("100", "0"), ("-2", "100000"), ("x", "1")])
def test_parse_v1_cpu_errors(quota: str, period: str) -> None:
    with pytest.raises(cp.CgroupParseError):
        cp.parse_v1_cpu(quota, period)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("max\n", None), ("8589934592\n", 8 * GiB), ("0", 0)],
)
def test_parse_bytes_or_max(text: str, expected: int | None) -> None:
    assert cp.parse_bytes_or_max(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("9223372036854771712\n", None),  # x86-64 page-counter max
        ("9223372036854775807", None),
        (str(1 << 60), None),
        (str((1 << 60) - 1), (1 << 60) - 1),
        ("-1", None),
        ("4294967296", 4 * GiB),
    ],
)
def test_parse_v1_bytes(text: str, expected: int | None) -> None:
    assert cp.parse_v1_bytes(text) == expected


@pytest.mark.parametrize("text", ["lots", "-5", "1 2", ""])
def test_parse_bytes_errors(text: str) -> None:
    with pytest.raises(cp.CgroupParseError):
        cp.parse_bytes_or_max(text)


def test_parse_cpu_weight_range() -> None:
    assert cp.parse_cpu_weight("100\n") == 100
    for bad in ("0", "10001", "x"):
        with pytest.raises(cp.CgroupParseError):
            cp.parse_cpu_weight(bad)


def test_parse_memory_events_and_psi() -> None:
    assert cp.parse_flat_keyed("low 0\nmax 3\noom_kill 1\n") == {"low": 0, "max": 3, "oom_kill": 1}
    with pytest.raises(cp.CgroupParseError, match="malformed"):
        cp.parse_flat_keyed("max three four\n")
    psi = cp.parse_psi(
        "some avg10=1.50 avg60=0.75 avg300=0.20 total=123\n"
        "full avg10=0.25 avg60=0.00 avg300=0.00 total=9\n"
    )
    assert (psi.some_avg10, psi.some_total_us, psi.full_avg10, psi.full_total_us) == (
        1.5,
        123,
        0.25,
        9,
    )
    cpu_only = cp.parse_psi("some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
    assert cpu_only.full_avg10 is None
    with pytest.raises(cp.CgroupParseError):
        cp.parse_psi("full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
    with pytest.raises(cp.CgroupParseError):
        cp.parse_psi("some avg10=x\n")


def test_mountinfo_unescapes_and_skips_optional_fields() -> None:
    text = (
        "40 31 0:38 /a\\040b /sys/fs/cgroup/with\\040space rw shared:1 master:2 - cgroup2 none rw\n"
    )
    (m,) = cp.parse_mountinfo(text)
    assert (m.root, m.mount_point, m.fstype) == ("/a b", "/sys/fs/cgroup/with space", "cgroup2")
    with pytest.raises(cp.CgroupParseError):
        cp.parse_mountinfo("1 2 3 4 5 6 no separator here\n")


def test_locate_bind_mounted_root_and_escaped_namespace() -> None:
    mounts = [cp.Mount("/kubepods/pod1", "/sys/fs/cgroup", "cgroup2", ("rw",))]
    inside = [cp.ProcCgroupEntry(0, (), "/kubepods/pod1/ctr")]
    assert cp.locate_cgroup(inside, mounts).v2_dir == "/sys/fs/cgroup/ctr"
    outside = [cp.ProcCgroupEntry(0, (), "/../../other")]
    assert cp.locate_cgroup(outside, mounts).v2_dir == "/sys/fs/cgroup"
    with pytest.raises(cp.CgroupParseError):
        cp.locate_cgroup([cp.ProcCgroupEntry(0, (), "/")], [])


# ------------------------------------------------------------------------- fixture trees


def test_v2_set() -> None:
    r = read_tree("v2-set")
    assert r.version == "v2"
    assert r.cpu_limit_cores == 2.5
    assert r.memory_limit_bytes == 8 * GiB
    assert r.cpu_weight is not None and r.cpu_weight.value == 174
    assert r.memory_high is not None and r.memory_high.value is None
    assert r.memory_current is not None and r.memory_current.value == GiB
    assert r.memory_events is not None and r.memory_events.value["max"] == 3
    assert r.cpu_pressure is not None and r.cpu_pressure.value.some_avg10 == 1.5
    assert r.problems == ()
    assert r.cpu_max is not None
    assert r.cpu_max.source == str(FIXTURES / "v2-set" / "sys/fs/cgroup/cpu.max")


def test_v2_max_is_unlimited() -> None:
    r = read_tree("v2-max")
    assert r.cpu_max is not None and r.cpu_max.value.quota_us is None
    assert r.cpu_limit_cores is None
    assert r.memory_max is not None and r.memory_max.value is None
    assert r.problems == ()


@pytest.mark.parametrize(
    ("case", "fragment"),
    [
        ("v2-invalid-max", "not an integer"),
        ("v2-zero-period", "period must be > 0"),
        ("v2-too-many-fields", "3 fields"),
    ],
)
def test_malformed_cpu_max_is_a_problem_not_a_crash(case: str, fragment: str) -> None:
    r = read_tree(case)
    assert r.cpu_max is None
    assert any("cpu.max" in p and fragment in p for p in r.problems), r.problems
    # the other files are still read
    assert r.memory_current is not None


def test_invalid_memory_max_is_reported() -> None:
    r = read_tree("v2-invalid-max")
    assert r.memory_max is None
    assert any("memory.max" in p and "'lots'" in p for p in r.problems)


def test_v2_nested_path() -> None:
    r = read_tree("v2-nested-path")
    assert r.version == "v2"
    assert r.location.endswith(
        "kubepods.slice/kubepods-pod5f1c2b7e.slice/cri-containerd-8c3f6a0b.scope"
    )
    assert (r.cpu_limit_cores, r.memory_limit_bytes) == (4.0, 12 * GiB)


def test_v1_with_bind_mounted_memory_root() -> None:
    r = read_tree("v1")
    assert r.version == "v1"
    assert r.cpu_limit_cores == 1.5
    assert r.memory_limit_bytes == 4 * GiB
    assert r.memory_current is not None and r.memory_current.value == 512 << 20
    assert r.memory_max is not None and r.memory_max.source.endswith(
        "memory/c0ffee/memory.limit_in_bytes"
    )
    assert r.cpu_pressure is not None  # from the unified (v2) tree in hybrid mode
    assert r.problems == ()


def test_v1_unlimited_like_this_host() -> None:
    r = read_tree("v1-unlimited")
    assert r.version == "v1"
    assert r.cpu_max is not None and r.cpu_limit_cores is None
    assert r.memory_max is not None and r.memory_max.value is None
    assert r.problems == ()


def test_missing_proc_files_give_version_none(tmp_path: Path) -> None:
    r = find_cgroup(proc_root=str(tmp_path), fs_root=str(tmp_path)).read()
    assert r.version == "none" and r.problems


# ------------------------------------------------------------------------- injected root


def test_env_root_v2_and_v1_layouts(tmp_path: Path) -> None:
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "cpu.max").write_text("300000 100000\n")
    (v2 / "memory.max").write_text("max\n")
    reader = open_cgroup(str(v2))
    assert reader.version == "v2"
    assert reader.read().cpu_limit_cores == 3.0

    v1 = tmp_path / "v1"
    (v1 / "cpu,cpuacct").mkdir(parents=True)
    (v1 / "memory").mkdir()
    (v1 / "cpu,cpuacct" / "cpu.cfs_quota_us").write_text("-1\n")
    (v1 / "cpu,cpuacct" / "cpu.cfs_period_us").write_text("100000\n")
    (v1 / "memory" / "memory.limit_in_bytes").write_text("1073741824\n")
    r = open_cgroup(str(v1)).read()
    assert (r.version, r.cpu_limit_cores, r.memory_limit_bytes) == ("v1", None, GiB)


def test_env_root_missing_dir_is_reported(tmp_path: Path) -> None:
    r = open_cgroup(str(tmp_path / "nope")).read()
    assert r.version == "none" and r.problems


def test_unreadable_file_is_a_problem(tmp_path: Path) -> None:
    (tmp_path / "cpu.max").mkdir()  # reading a directory fails with EISDIR
    r = CgroupReader.v2(str(tmp_path)).read()
    assert r.cpu_max is None
    assert any("cpu.max" in p for p in r.problems)


def test_real_host_cgroup_reads_without_problems() -> None:
    """The machine the tests run on: whatever its layout, the finder locates something readable."""
    r = open_cgroup().read()
    if r.version == "none":
        pytest.skip(f"no cgroup visible here: {r.problems}")
    assert r.cpu_max is not None or r.memory_max is not None, r


# ------------------------------------------------------------------------- poller


async def test_poller_calls_back_only_on_relevant_change(tmp_path: Path) -> None:
    (tmp_path / "cpu.max").write_text("100000 100000\n")
    (tmp_path / "memory.current").write_text("1\n")
    reader = CgroupReader.v2(str(tmp_path))
    seen: list[tuple[float | None, float]] = []

    async def on_change(r: CgroupReading, detected_at: float) -> None:
        seen.append((r.cpu_limit_cores, detected_at))

    poller = Poller(reader.read, on_change, interval=0.01)
    assert await poller.poll_once()
    (tmp_path / "memory.current").write_text("2\n")  # usage moves: not a re-plan
    assert not await poller.poll_once()
    (tmp_path / "cpu.max").write_text("200000 100000\n")
    assert await poller.poll_once()
    assert [c for c, _ in seen] == [1.0, 2.0]
    assert seen[0][1] <= seen[1][1]


async def test_poller_run_detects_a_live_change_and_survives_callback_errors(
    tmp_path: Path,
) -> None:
    (tmp_path / "memory.max").write_text("1000\n")
    reader = CgroupReader.v2(str(tmp_path))
    got: asyncio.Queue[int | None] = asyncio.Queue()
    calls = 0

    def on_change(r: CgroupReading, _t: float) -> None:
        nonlocal calls
        calls += 1
        got.put_nowait(r.memory_limit_bytes)
        if calls == 1:
            raise RuntimeError("consumer bug")  # must be logged, not kill the poller

    poller = Poller(reader.read, on_change, interval=0.005)
    task = asyncio.create_task(poller.run())
    try:
        assert await asyncio.wait_for(got.get(), 1) == 1000
        tmp = tmp_path / "memory.max.tmp"
        tmp.write_text("2000\n")
        os.replace(tmp, tmp_path / "memory.max")
        assert await asyncio.wait_for(got.get(), 1) == 2000
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


def test_poller_rejects_bad_interval() -> None:
    with pytest.raises(ValueError):
        Poller(lambda: CgroupReading("none", ""), lambda r, t: None, interval=0)


def test_detail_files_are_refreshed_every_nth_read_limits_always(tmp_path: Path) -> None:
    (tmp_path / "memory.max").write_text("1000\n")
    (tmp_path / "memory.current").write_text("10\n")
    reader = CgroupReader.v2(str(tmp_path))
    reader.detail_every = 3
    first = reader.read()
    assert first.memory_current is not None and first.memory_current.value == 10
    (tmp_path / "memory.current").write_text("20\n")
    (tmp_path / "memory.max").write_text("2000\n")
    second = reader.read()
    assert second.memory_limit_bytes == 2000  # limits: every read
    assert second.memory_current is not None and second.memory_current.value == 10  # cached
    reader.read()
    fourth = reader.read()
    assert fourth.memory_current is not None and fourth.memory_current.value == 20
