"""The governor as the running bridge exposes and applies it: metrics, /debug/resources, and the C
kernel's per-thread scratch capped from the reserve and charged."""

from __future__ import annotations

import json

import pytest

from bridge.server.governor import Component
from tests.integration.harness import http_get, running_bridge

MiB = 1 << 20


async def test_memory_is_visible_in_metrics_and_debug_resources() -> None:
    async with running_bridge(ring_budget_bytes=64 * MiB) as bridge:
        assert bridge.ports is not None
        status, body = await http_get(bridge.ports.http, "/metrics")
        assert status == 200
        assert "bridge_memory_budget_bytes 6.7108864e+07" in body
        for component in Component:
            assert f'bridge_memory_charged_bytes{{component="{component.value}"}}' in body
        assert "bridge_memory_grants_waiting 0.0" in body
        assert "process_resident_memory_bytes" in body
        status, body = await http_get(bridge.ports.http, "/debug/resources")
        memory = json.loads(body)["memory"]
        assert memory["budget_bytes"] == 64 * MiB and memory["reserve_bytes"] == 16 * MiB
        assert set(memory["charged_by_component"]) == {c.value for c in Component}
        assert memory["resident_bytes"] > 0 and memory["max_frame_bytes_now"] > 0


async def test_c_kernel_scratch_is_capped_from_the_reserve_and_charged() -> None:
    native = pytest.importorskip("bridge.decimate._native")
    async with running_bridge(ring_budget_bytes=64 * MiB, decimate_backend="c") as bridge:
        assert bridge.capacity is not None
        workers = bridge.pool.size
        keep = min(64 * MiB, (16 * MiB) // 4 // workers)
        assert native.scratch_keep(None) == keep
        assert bridge.governor.charged(Component.DECIMATION) == keep * workers
        bridge.capacity.set_memory_budget(16 * MiB, 4 * MiB)
        assert native.scratch_keep(None) == MiB // workers
        assert bridge.governor.charged(Component.DECIMATION) == (MiB // workers) * workers
