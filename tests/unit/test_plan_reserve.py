"""The reserve holds at least one push in flight (issue 29: after a live shrink to a 47 MiB
budget, a forced 2 x 15 MiB push overdrew the budget by 17 MiB and the container was killed)."""

from __future__ import annotations

from bridge.config.settings import Settings
from bridge.resources import from_settings
from bridge.resources.plan import PlanSettings, make_plan
from bridge.server.push_impl import PUSH_COPIES
from tests.unit.test_plan import S, snap

MiB = 1 << 20


def test_the_reserve_covers_one_push_of_the_largest_frame() -> None:
    assert from_settings.PROGRESS_COPIES == PUSH_COPIES
    plan = from_settings.plan_settings(Settings(max_frame_bytes=16 * MiB))
    assert plan.min_reserve_bytes == PUSH_COPIES * 16 * MiB


def test_a_negative_min_reserve_is_refused() -> None:
    try:
        PlanSettings(min_reserve_bytes=-1)
    except ValueError as exc:
        assert "min_reserve_bytes" in str(exc)
    else:
        raise AssertionError("a negative min_reserve_bytes was accepted")


def test_a_small_budget_keeps_one_push_in_its_reserve_up_to_half() -> None:
    s = PlanSettings(
        headroom_bytes=S.headroom_bytes, min_reserve_bytes=32 * MiB, reserve_fraction=0.25
    )
    small = make_plan(snap(mem=256 * MiB, baseline=144 * MiB, streams=1), s)  # budget 48 MiB
    assert small.reserve_bytes == 24 * MiB  # 0.25 x 48 = 12 is less than a push: half
    assert small.ring_budget_bytes == small.data_budget_bytes - 24 * MiB
    assert "min_reserve_bytes" in small.reasons["reserve_bytes"]
    large = make_plan(snap(mem=1024 * MiB, baseline=64 * MiB, streams=1), s)
    assert large.reserve_bytes == large.data_budget_bytes // 4  # a quarter already covers it
