"""The pod's plan (bridge/pod/podplan.py): N from the CPU, capped by what the memory limit holds,
and each process's share, whose sum with the supervisor's reserve never exceeds the limit."""

from __future__ import annotations

import pytest

from bridge.config.settings import Settings
from bridge.pod.podplan import plan_pod

MiB = 1 << 20
GiB = 1 << 30
SUPERVISOR = 48 * MiB


def test_two_cores_and_room_give_two_processes_with_half_the_rest_each() -> None:
    plan = plan_pod(Settings(processes="auto"), 2.0, 2, 2 * GiB, SUPERVISOR)
    assert plan.count == 2
    assert plan.share.workers == 1 and plan.share.cpu_cores == pytest.approx(1.0)
    assert plan.share.memory_limit_bytes == (2 * GiB - plan.reserve_bytes) // 2
    assert plan.reserve_bytes + 2 * plan.share.memory_limit_bytes <= 2 * GiB


def test_a_resize_that_needs_more_processes_than_the_memory_holds_is_cut_and_says_why() -> None:
    settings = Settings(processes="auto")
    need = plan_pod(settings, 8.0, 8, None, SUPERVISOR).per_process_bytes
    limit = SUPERVISOR + 16 * MiB + 3 * need + need // 2  # room for 3 processes, not 8
    plan = plan_pod(settings, 8.0, 8, limit, SUPERVISOR)
    assert plan.count == 3
    assert "memory limit holds no more" in plan.processes.reasons["processes"]
    assert plan.share.memory_limit_bytes is not None
    assert plan.share.memory_limit_bytes >= need  # each one gets at least what it needs


def test_a_small_limit_still_runs_one_process_at_the_smallest_budget() -> None:
    """As a single bridge does at 256 MiB: only the extra processes need a whole share."""
    plan = plan_pod(Settings(processes="auto"), 2.0, 2, 256 * MiB, SUPERVISOR)
    assert plan.count == 1 and plan.share.workers == 2
    assert plan.share.memory_limit_bytes == 256 * MiB - plan.reserve_bytes
    assert "smallest data budget" in plan.processes.reasons["processes"]


def test_a_limit_that_cannot_hold_one_interpreter_is_refused() -> None:
    plan = plan_pod(Settings(processes="auto"), 2.0, 2, 128 * MiB, SUPERVISOR)
    assert plan.count == 0 and plan.processes.refused
    assert plan.share.memory_limit_bytes is None
    assert "refused" in plan.processes.reasons["processes"]


def test_a_fractional_quota_gives_whole_loops_and_the_workers_are_pod_wide() -> None:
    plan = plan_pod(Settings(processes="auto"), 2.5, 4, 4 * GiB, SUPERVISOR)
    assert plan.count == 2 and plan.share.workers == 1  # ceil(2.5) = 3 worker cores // 2
    assert plan.count * plan.share.workers <= 3


def test_a_larger_max_frame_needs_more_per_process() -> None:
    small = plan_pod(Settings(processes="auto", max_frame_bytes=1 * MiB), 2.0, 2, None, SUPERVISOR)
    large = plan_pod(Settings(processes="auto"), 2.0, 2, None, SUPERVISOR)
    assert large.per_process_bytes - small.per_process_bytes == 5 * 15 * MiB


def test_explicit_and_maximum_settings() -> None:
    assert plan_pod(Settings(processes="3"), 1.0, 2, None, SUPERVISOR).count == 3
    assert plan_pod(Settings(processes="max:2"), 6.0, 8, None, SUPERVISOR).count == 2
    assert plan_pod(Settings(processes="max:2"), 1.0, 8, None, SUPERVISOR).count == 1
