"""Each gRPC ingest call's HTTP/2 receive window (``grpc_window_bytes``) is what an edge may send
ahead of the bridge's reads: it is charged to the memory budget while the call is open, and a
call whose window no longer fits is refused with a clear status instead of going uncharged."""

from __future__ import annotations

import grpc
import pytest

from bridge.client import EdgeClient, StreamSpec
from bridge.server.governor import Component
from tests.integration.harness import (
    RawGrpcEdge,
    grpc_target,
    hello,
    metric,
    running_bridge,
    wait_until,
)

MiB = 1 << 20


async def test_an_open_call_is_charged_its_window_until_it_ends() -> None:
    async with running_bridge(ring_budget_bytes=64 * MiB, grpc_window_bytes=2 * MiB) as bridge:
        before = bridge.governor.charged(Component.TRANSPORT)
        edge = RawGrpcEdge(grpc_target(bridge))
        try:
            await edge.send(hello("window-1", "s").SerializeToString())
            reply = await edge.recv()
            assert reply is not None and reply.HasField("welcome")
            assert bridge.governor.charged(Component.TRANSPORT) >= before + 2 * MiB
        finally:
            await edge.close()
        assert await wait_until(lambda: bridge.governor.charged(Component.TRANSPORT) == before)


async def test_a_call_whose_window_does_not_fit_is_refused_and_counted() -> None:
    # 16 MiB budget: 12 MiB admission limit, so two 5 MiB windows fit and a third does not.
    async with running_bridge(ring_budget_bytes=16 * MiB, grpc_window_bytes=5 * MiB) as bridge:
        edges: list[RawGrpcEdge] = []
        try:
            for i in range(2):  # one call at a time: a call starts when its edge is made
                edges.append(RawGrpcEdge(grpc_target(bridge)))
                await edges[i].send(hello(f"window-{i}", "s").SerializeToString())
                reply = await edges[i].recv()
                assert reply is not None and reply.HasField("welcome")
            edges.append(RawGrpcEdge(grpc_target(bridge)))
            assert await edges[2].status() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "receive window" in (await edges[2].call.details() or "")
            rejected = metric(
                bridge,
                "bridge_rejected_messages_total",
                transport="grpc",
                reason="too_many_sessions",
            )
            assert rejected == 1
        finally:
            for edge in edges:
                await edge.close()


async def test_the_sdk_says_why_the_bridge_refused_its_call() -> None:
    # 16 MiB budget, 12 MiB admission: a 16 MiB window never fits.
    async with running_bridge(ring_budget_bytes=16 * MiB, grpc_window_bytes=16 * MiB) as bridge:
        url = f"grpc://{grpc_target(bridge)}"
        edge = EdgeClient(url, device_id="dev", streams=[StreamSpec("s")])
        with pytest.raises(ConnectionError) as info:
            await edge.start(timeout=2.0)
        assert "RESOURCE_EXHAUSTED" in str(info.value)
        assert "receive window" in str(info.value)
