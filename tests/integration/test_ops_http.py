"""The operations endpoint over real HTTP: metrics, liveness, readiness, resource debug."""

from __future__ import annotations

import json

from tests.integration.harness import http_get, running_bridge


async def test_metrics_health_ready_and_debug() -> None:
    async with running_bridge() as bridge:
        assert bridge.ports is not None
        port = bridge.ports.http
        status, body = await http_get(port, "/metrics")
        assert status == 200
        assert bridge.capacity is not None
        name = bridge.capacity.decimator.name
        assert f'bridge_decimate_backend{{backend="{name}"}} 1.0' in body
        for name in (
            "bridge_frames_accepted_total",
            "bridge_ring_capacity_bytes",
            "bridge_decimation_seconds",
            "bridge_ready 1.0",
        ):
            assert name in body, name
        assert (await http_get(port, "/healthz"))[0] == 200
        assert (await http_get(port, "/readyz"))[0] == 200
        status, body = await http_get(port, "/debug/resources")
        assert status == 200 and json.loads(body)["workers"] == 2
        assert (await http_get(port, "/nope"))[0] == 404
        bridge.ready = False
        assert (await http_get(port, "/readyz"))[0] == 503
