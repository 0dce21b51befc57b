"""The reserve holds at least one push in flight (issue 29: after a live shrink to a 47 MiB
budget, a forced 2 x 15 MiB push overdrew the budget by 17 MiB and the container was killed)."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from bridge.config.settings import Settings
from bridge.resources import from_settings
from bridge.resources.plan import PlanSettings, make_plan
from bridge.server.governor import Charge, Component, Governor
from bridge.server.metrics import BridgeMetrics
from bridge.server.push_impl import SinkPusher
from tests.unit.test_plan import S, snap

MiB = 1 << 20


class Sent:
    async def write(self, _data: bytes) -> None:
        pass


@pytest.mark.parametrize(("frame", "batch"), [(16 * MiB, 256 * 1024), (1 * MiB, 4 * MiB)])
async def test_a_full_ring_and_the_largest_push_stay_within_the_budget(
    frame: int, batch: int
) -> None:
    """Admission holds all it may; the pusher then forces its largest message (one frame, or a
    batch of up to sink_batch_bytes): the reserve the plan keeps covers what the pusher really
    charges, so the budget is never overdrawn."""
    settings = Settings(sink_address="127.0.0.1:1", max_frame_bytes=frame, sink_batch_bytes=batch)
    reserve = from_settings.plan_settings(settings).min_reserve_bytes
    governor = Governor(4 * reserve, reserve)
    full = governor.request(Component.RING, governor.admission_limit, lambda _: None)
    assert isinstance(full, Charge)
    pusher = SinkPusher(
        delivery=Any,  # type: ignore[arg-type]  # _write never touches delivery
        settings=settings,
        metrics=BridgeMetrics(CollectorRegistry()),
        governor=governor,
    )
    largest = max(frame, batch)
    await pusher._write(Sent(), [bytes(largest)], largest, 1)
    assert governor.stats.overdraft_peak_bytes == 0
    full.release()


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
