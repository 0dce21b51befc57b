"""Two bridges, one sink (issue 32): each push stream names its bridge, and the sinks report each
bridge's ``bridge_seq`` apart instead of one max across unrelated sequence spaces.

Real bridges (in-process, 127.0.0.1 port 0), real SDK edges, and as the sink either the
reference sink (``loadgen.sink.SinkServer``) or a real ``simbridge view`` process, whose
``/api/status`` is read over HTTP.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import numpy as np
import pytest

from bridge.client import EdgeClient, StreamSpec
from bridge.server.app import BridgeService
from loadgen.sink import SinkServer
from tests.integration.harness import running_bridge, wait_until, ws_url

#: Frames each bridge gets: different, so a max across them would show.
FRAMES = {"replica-a": 5, "replica-b": 12}


@asynccontextmanager
async def two_bridges(sink_address: str) -> AsyncIterator[dict[str, BridgeService]]:
    async with AsyncExitStack() as stack:
        yield {
            name: await stack.enter_async_context(
                running_bridge(sink_address=sink_address, bridge_id=name, passthrough=True)
            )
            for name in FRAMES
        }


async def publish_to_each(bridges: dict[str, BridgeService]) -> None:
    """FRAMES[name] frames from one device on each bridge, every one delivered to the sink."""
    cloud = np.zeros((10, 3), np.float32)
    for name, service in bridges.items():
        edge = EdgeClient(ws_url(service), device_id=f"dev-{name}", streams=[StreamSpec("s")])
        async with edge:
            for _ in range(FRAMES[name]):
                await edge.publish("s", cloud)
            assert await edge.wait_delivered(10)


def by_name(reported: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {b["bridge_id"]: b for b in reported}


async def test_the_reference_sink_sees_each_bridges_name_and_seq() -> None:
    async with SinkServer(fsync=False) as sink, two_bridges(sink.address) as bridges:
        assert await wait_until(lambda: sink.active_push_streams >= 2)
        await publish_to_each(bridges)
        got = by_name(sink.report()["server"]["bridges"])
    assert set(got) == set(FRAMES)
    for name, frames in FRAMES.items():
        assert got[name]["acked_bridge_seq"] == frames, got
        assert got[name]["frames_received"] == frames
        assert got[name]["connected"] is True and got[name]["push_streams"] == 1
        assert got[name]["marks_queries"] == 1  # the new device's watermark query, named too


async def test_the_view_reports_status_per_bridge() -> None:
    pytest.importorskip("mcap", reason="mcap not installed (pip install simbridge[view])")
    from tests.integration.viewproc import ViewProcess

    view = await ViewProcess.start("--foxglove-port", "off", "--web-port", "0")
    try:
        async with two_bridges(view.sink_address) as bridges:
            await publish_to_each(bridges)
            status = (await view.status())["bridge"]
        logs = view.logs()
    finally:
        view.kill()
    got = by_name(status["bridges"])
    assert set(got) == set(FRAMES)
    for name, frames in FRAMES.items():
        assert got[name]["acked_bridge_seq"] == frames, got
        assert got[name]["frames_received"] == frames
    assert status["frames_recorded"] == sum(FRAMES.values())
    assert "acked_bridge_seq" not in status  # the max across bridges is gone
    assert "push stream from bridge replica-a opened" in logs
