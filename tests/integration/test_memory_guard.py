"""The bridge's memory guard (bridge.app + bridge.pressure): resident memory past the pressure
line holds admission back (edges are paused) until it falls back under the line."""

from __future__ import annotations

import pytest

from bridge import app as app_mod
from bridge.app import BridgeService
from tests.integration.harness import metric, running_bridge, wait_until

MiB = 1 << 20
LIMIT = 1024 * MiB


async def test_resident_memory_past_the_line_holds_admission_until_it_falls(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    resident = [512 * MiB]
    monkeypatch.setattr(app_mod, "_rss_bytes", lambda: resident[0])
    monkeypatch.setattr(BridgeService, "_planned_memory_limit", lambda self: LIMIT)
    async with running_bridge(max_frame_bytes=4 * MiB) as bridge:
        governor = bridge.governor
        line = LIMIT - LIMIT // 10  # 10 % of 1 GiB is more than two 4 MiB frames
        assert not await wait_until(lambda: governor.pressure_bytes > 0, timeout=0.4)
        resident[0] = line + 30 * MiB
        assert await wait_until(lambda: governor.pressure_bytes == 30 * MiB, timeout=2)
        assert metric(bridge, "bridge_memory_pressure_bytes") == 30 * MiB
        assert bridge.governor.describe()["pressure_bytes"] == 30 * MiB
        resident[0] = line - MiB
        assert await wait_until(lambda: governor.pressure_bytes == 0, timeout=2)
        assert metric(bridge, "bridge_memory_pressure_bytes") == 0
