"""A bridge that refuses the SDK for good (a wrong token) ends its attempts at once, with the
bridge's own reason, on both transports: no retries, no "last connection ended CANCELLED"."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from bridge.client import BridgeRefused, EdgeClient, StreamSpec
from bridge.server.app import BridgeService
from tests.integration.harness import grpc_target, running_bridge, ws_url

REASON = "missing or wrong bearer token"  # what the bridge says (bridge/server/ingest.py)


def url(service: BridgeService, transport: str) -> str:
    return ws_url(service) if transport == "ws" else f"grpc://{grpc_target(service)}"


@pytest.mark.parametrize("transport", ["ws", "grpc"])
async def test_a_wrong_token_ends_start_at_once_with_the_bridges_reason(transport: str) -> None:
    async with running_bridge(auth_token="right") as service:
        edge = EdgeClient(
            url(service, transport), device_id="dev", streams=[StreamSpec("s")], token="wrong"
        )
        loop = asyncio.get_running_loop()
        began = loop.time()
        with pytest.raises(BridgeRefused) as refused:
            await edge.start(timeout=10)
        took = loop.time() - began
        assert took < 1.5, f"{took:.2f} s to give up"
        assert REASON in str(refused.value)
        assert refused.value.code == "UNAUTHENTICATED"
        assert edge.stats.connect_failures == 1  # one attempt, no retries
        with pytest.raises(BridgeRefused):  # and publishing says why too
            await edge.publish("s", np.zeros((4, 3), np.float32))


@pytest.mark.parametrize("transport", ["ws", "grpc"])
async def test_a_live_session_is_named_and_retried_until_it_ends(transport: str) -> None:
    """A second client of one device id (no resume token) is refused while the first is
    connected: it keeps trying (that passes once the old connection is gone), and a start that
    times out names the bridge's reason instead of a bare CANCELLED."""
    async with running_bridge() as service:
        target = url(service, transport)
        first = EdgeClient(target, device_id="dev", streams=[StreamSpec("s")])
        await first.start()
        twin = EdgeClient(target, device_id="dev", streams=[StreamSpec("s")])
        with pytest.raises(ConnectionError, match="has a live session") as refused:
            await twin.start(timeout=1)
        assert not isinstance(refused.value, BridgeRefused)
        await first.close()
        async with EdgeClient(target, device_id="dev", streams=[StreamSpec("s")]) as again:
            assert again.connected


async def test_a_wrong_websocket_path_ends_start_at_once() -> None:
    """The bridge answers the upgrade with HTTP 404: no retry will change that."""
    async with running_bridge() as service:
        wrong = ws_url(service).replace("/v1/ingest", "/v1/ingets")
        edge = EdgeClient(wrong, device_id="dev", streams=[StreamSpec("s")])
        with pytest.raises(BridgeRefused, match="HTTP 404"):
            await asyncio.wait_for(edge.start(timeout=10), 1.5)
