"""The process plan (bridge/resources/processes.py, issue 31): one test per rule, each with the
case that breaks it."""

from __future__ import annotations

import pytest

from bridge.resources.processes import (
    ProcessesSetting,
    ProcessPlan,
    parse_processes_setting,
    plan_processes,
)

MiB = 1 << 20
GiB = 1 << 30
PER = 80 * MiB
BASE = 100 * MiB


def plan(
    quota: float | None,
    cpus: int = 16,
    limit: int | None = None,
    setting: str | int = "auto",
    baseline: int = BASE,
    per: int = PER,
) -> ProcessPlan:
    return plan_processes(quota, cpus, limit, baseline, per, setting)


# -- N follows the CPU quota and the affinity set ----------------------------------------------


@pytest.mark.parametrize(
    ("quota", "cpus", "expected"),
    [
        (4.0, 16, 4),  # the quota
        (2.5, 16, 2),  # whole cores only: a third loop would share the 2.5 cores
        (0.5, 16, 1),  # never fewer than one
        (12.0, 8, 8),  # the affinity set caps the quota
        (None, 6, 6),  # no quota: the affinity set
    ],
)
def test_auto_follows_quota_and_affinity(quota: float | None, cpus: int, expected: int) -> None:
    p = plan(quota, cpus)
    assert p.processes == expected
    assert not p.refused
    assert "cpu" in p.reasons and "processes=auto" in p.reasons["processes"]


def test_affinity_may_be_the_set_itself() -> None:
    assert plan_processes(8.0, {0, 1, 2}, None, BASE, PER).processes == 3
    with pytest.raises(ValueError, match="at least one CPU"):
        plan_processes(8.0, set(), None, BASE, PER)


def test_max_caps_auto_and_never_raises_it() -> None:
    assert plan(8.0, setting="max:3").processes == 3
    assert plan(2.0, setting="max:6").processes == 2  # the cap is not a target
    assert "max:3" in plan(8.0, setting="max:3").reasons["processes"]


def test_explicit_count_wins_over_cpu_and_says_so() -> None:
    p = plan(2.0, setting=4)
    assert p.processes == 4
    assert "share" in p.reasons["processes"]  # more loops than whole cores: stated
    assert plan(8.0, setting="3").processes == 3


# -- memory: never plan a process the limit cannot hold -----------------------------------------


def test_memory_limit_caps_processes_and_names_the_refused_ones() -> None:
    # 100 MiB baseline + 3 x 80 MiB = 340 MiB <= 400 MiB < 420 MiB (4 processes)
    p = plan(8.0, limit=400 * MiB)
    assert p.memory_holds == 3
    assert p.processes == 3
    assert "5 refused" in p.reasons["processes"]
    assert "holds 3" in p.reasons["memory"]
    # one byte short of the fourth process: still 3; exactly enough: 4
    assert plan(8.0, limit=BASE + 4 * PER - 1).processes == 3
    assert plan(8.0, limit=BASE + 4 * PER).processes == 4


def test_memory_caps_an_explicit_count_too() -> None:
    p = plan(8.0, limit=BASE + 2 * PER, setting=6)
    assert p.processes == 2
    assert "4 refused" in p.reasons["processes"]


def test_a_limit_that_cannot_hold_one_process_is_refused_not_planned() -> None:
    p = plan(4.0, limit=BASE + PER - 1)
    assert p.processes == 0 and p.refused
    assert p.workers_per_process == 0
    assert p.reasons["processes"].startswith("refused")
    assert "cannot hold one process" in p.reasons["processes"]
    # below the baseline itself
    assert plan(4.0, limit=BASE // 2).refused


def test_no_memory_limit_no_cap() -> None:
    p = plan(None, 64)
    assert p.processes == 64 and p.memory_holds is None
    assert "no memory limit" in p.reasons["memory"]


# -- workers: processes x workers <= cores -----------------------------------------------------


@pytest.mark.parametrize(
    ("quota", "cpus", "setting", "procs", "workers"),
    [
        (8.0, 16, "auto", 8, 1),  # 8 processes x 1 worker on 8 cores
        (8.0, 16, "max:2", 2, 4),  # 2 x 4
        (8.0, 16, "max:3", 3, 2),  # 3 x 2 = 6 <= 8 (not 3 x 3)
        (2.5, 16, "auto", 2, 1),  # ceil(2.5) = 3 worker cores over 2 processes: 1 each
        (1.0, 16, "auto", 1, 1),
        (None, 4, "max:1", 1, 4),  # one process keeps plan.py's count
    ],
)
def test_workers_times_processes_within_cores(
    quota: float | None, cpus: int, setting: str, procs: int, workers: int
) -> None:
    p = plan(quota, cpus, setting=setting)
    assert (p.processes, p.workers_per_process) == (procs, workers)
    total = min(cpus, -(-(quota or cpus) // 1))
    assert p.processes * p.workers_per_process <= total


def test_more_processes_than_cores_get_one_worker_each_and_it_is_said() -> None:
    p = plan(2.0, setting=4)
    assert p.workers_per_process == 1
    assert "1 each" in p.reasons["workers"]


# -- the setting and bad inputs ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("auto", ProcessesSetting()),
        (" AUTO ", ProcessesSetting()),
        ("3", ProcessesSetting(exact=3)),
        (5, ProcessesSetting(exact=5)),
        ("max:4", ProcessesSetting(maximum=4)),
    ],
)
def test_parse_setting(text: str | int, expected: ProcessesSetting) -> None:
    assert parse_processes_setting(text) == expected
    assert parse_processes_setting(str(expected)) == expected  # round trip


@pytest.mark.parametrize("bad", ["", "0", "-1", "max:0", "max:", "min:3", "many", 0, True, "2.5"])
def test_parse_setting_rejects(bad: str | int) -> None:
    with pytest.raises(ValueError):
        parse_processes_setting(bad)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"cpu_quota_cores": 0.0},
        {"cpu_quota_cores": -1.0},
        {"memory_limit_bytes": 0},
        {"per_process_bytes": 0},
        {"baseline_bytes": -1},
    ],
)
def test_impossible_inputs_raise(kwargs: dict[str, float | int]) -> None:
    args: dict[str, object] = {
        "cpu_quota_cores": 2.0,
        "affinity_cpus": 4,
        "memory_limit_bytes": GiB,
        "baseline_bytes": BASE,
        "per_process_bytes": PER,
    }
    args.update(kwargs)
    with pytest.raises(ValueError):
        plan_processes(**args)  # type: ignore[arg-type]


def test_plan_as_dict_carries_the_reasons() -> None:
    d = plan(4.0, limit=GiB).as_dict()
    assert d["processes"] == 4 and d["refused"] is False
    assert set(d["reasons"]) == {"cpu", "memory", "processes", "workers"}
