"""A device that moves between bridge replicas (issue 32): two real ``simbridge serve`` processes
push to one sink, and a switchable TCP forwarder plays the load balancer.

The false gap: back on a replica that still holds its detached session, the device carries the
other replica's resume token; the bridge resumed the stale session at its old ``accepted_seq``
while the edge resent from its real ``delivered_seq + 1``, so the first frame announced an
"upstream" gap for frames the other replica had delivered.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import numpy as np
import pytest

from benchmarks.replicas_proxy import SwitchProxy
from bridge.client import EdgeClient, StreamSpec
from bridge.v1 import bridge_pb2 as pb
from loadgen.sink import SinkServer
from tests.integration.harness import BridgeProcess, serve_process

CLOUD = np.zeros((4, 3), np.float32)


class Replicas:
    def __init__(self, sink: SinkServer, a: BridgeProcess, b: BridgeProcess) -> None:
        self.sink, self.a, self.b = sink, a, b
        self.gaps: list[pb.Gap] = []


@asynccontextmanager
async def two_replicas(*args: str) -> AsyncIterator[Replicas]:
    gaps: list[pb.Gap] = []

    def on_frame(frame: pb.ProcessedFrame) -> None:
        if frame.gap.count:
            gaps.append(frame.gap)

    async with AsyncExitStack() as stack:
        sink = await stack.enter_async_context(SinkServer(fsync=False, on_frame=on_frame))
        flags = (f"--sink-address={sink.address}", *args)
        a = await stack.enter_async_context(serve_process(*flags))
        b = await stack.enter_async_context(serve_process(*flags))
        replicas = Replicas(sink, a, b)
        replicas.gaps = gaps
        yield replicas


def port_of(bridge: BridgeProcess, transport: str) -> int:
    return bridge.ws if transport == "ws" else bridge.grpc


def url_of(proxy: SwitchProxy, transport: str) -> str:
    if transport == "ws":
        return f"ws://127.0.0.1:{proxy.port}/v1/ingest"
    return f"grpc://127.0.0.1:{proxy.port}"


async def publish(edge: EdgeClient, n: int) -> None:
    for _ in range(n):
        await edge.publish("s", CLOUD)
    await edge.drain(timeout=10)


@pytest.mark.parametrize("transport", ["ws", "grpc"])
async def test_back_on_a_replica_with_a_stale_session_no_false_gap(transport: str) -> None:
    """A -> B -> A within the session TTL: every frame delivered once, no gap announced."""
    async with two_replicas() as r, SwitchProxy(port_of(r.a, transport)) as proxy:
        edge = EdgeClient(url_of(proxy, transport), device_id="robot", streams=[StreamSpec("s")])
        async with edge:
            await publish(edge, 20)  # on A
            proxy.switch(port_of(r.b, transport))
            await publish(edge, 20)  # on B
            proxy.switch(port_of(r.a, transport))  # A still holds the detached session
            await publish(edge, 20)
        assert edge.stats.reconnects == 2
        st = r.sink.record.streams[("robot", "s")]
        assert (st.delivered, st.lost, st.highest) == (60, 0, 60)
        assert st.duplicates == 0  # nothing was resent: all was delivered before each move
        assert r.gaps == [], f"false gaps announced: {r.gaps}"
        assert st.gap_markers == 0
