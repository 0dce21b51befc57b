"""A device that moves between bridge replicas (issue 32): two real ``simbridge serve`` processes
push to one sink, and a switchable TCP forwarder plays the load balancer.

The false gap: back on a replica that still holds its detached session, the device carries the
other replica's resume token; the bridge resumed the stale session at its old ``accepted_seq``
while the edge resent from its real ``delivered_seq + 1``, so the first frame announced an
"upstream" gap for frames the other replica had delivered.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import numpy as np
import pytest

from bridge.client import EdgeClient, StreamSpec
from bridge.server.challenge import CHALLENGE_SECONDS
from bridge.v1 import bridge_pb2 as pb
from loadgen.sink import SinkServer
from tests.integration.harness import BridgeProcess, http_get, scraped, serve_process, wait_until
from tests.support.switchproxy import SwitchProxy

CLOUD = np.zeros((4, 3), np.float32)


class Replicas:
    def __init__(self, sink: SinkServer, a: BridgeProcess, b: BridgeProcess) -> None:
        self.sink, self.a, self.b = sink, a, b
        self.gaps: list[pb.Gap] = []


class SlowSink(SinkServer):
    """Makes every batch durable ``delay`` seconds late (or, with ``ack_late``, durable at once
    and acknowledged ``delay`` seconds late): acks trail the frames."""

    delay = 0.0
    ack_late = False

    async def _record_batch(self, batch: list[tuple[pb.ProcessedFrame, int]]) -> int:
        if not self.ack_late:
            await asyncio.sleep(self.delay)
        high = await super()._record_batch(batch)
        if self.ack_late:
            await asyncio.sleep(self.delay)
        return high


@asynccontextmanager
async def two_replicas(
    *args: str, sink_delay: float = 0.0, ack_late: bool = False
) -> AsyncIterator[Replicas]:
    gaps: list[pb.Gap] = []

    def on_frame(frame: pb.ProcessedFrame) -> None:
        if frame.gap.count:
            gaps.append(frame.gap)

    async with AsyncExitStack() as stack:
        sink = SlowSink(fsync=False, on_frame=on_frame)
        sink.delay, sink.ack_late = sink_delay, ack_late
        await stack.enter_async_context(sink)
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


async def test_a_half_open_connection_on_the_old_replica_is_challenged_and_replaced() -> None:
    """Issue 32, what breaks 4: A's connection went half-open (no FIN, no RST) and the device
    went to B. Back on A, its Hello carries B's token: A cannot tell it from a stranger with the
    same device id while the old connection looks alive. A pings the old connection once and,
    with no pong within the challenge deadline (2 s), closes it and welcomes the device, which
    resumes without loss or gap. Before, A refused it (SessionTaken) until its keepalive gave up
    on the old connection: ping interval + ping timeout + the WebSocket close timeout, 7-12 s
    with the 5 s + 5 s pings here (about 42 s with the defaults)."""
    pings = ("--ping-interval-seconds=5", "--ping-timeout-seconds=5")
    async with two_replicas(*pings) as r, SwitchProxy(r.a.ws) as proxy:
        edge = EdgeClient(url_of(proxy, "ws"), device_id="robot", streams=[StreamSpec("s")])
        async with edge:
            await publish(edge, 10)  # on A
            proxy.half_open(r.b.ws)  # A keeps a connection that looks alive
            await publish(edge, 10)  # on B
            proxy.switch(r.a.ws)
            began = asyncio.get_running_loop().time()
            await publish(edge, 10)  # A challenges its old connection, then welcomes the edge
            took = asyncio.get_running_loop().time() - began
        print(f"half-open: accepted again after {took:.2f} s")
        assert took < CHALLENGE_SECONDS + 1.0, f"{took:.2f} s to be accepted again"
        assert edge.stats.errors["UNAUTHENTICATED"] == 0, edge.stats.errors  # never refused
        status, body = await http_get(r.a.http, "/metrics")
        assert status == 200
        assert scraped(body, "bridge_session_challenges_total", result="dead") == [1.0]
        st = r.sink.record.streams[("robot", "s")]
        assert (st.delivered, st.lost, st.duplicates) == (30, 0, 0)
        assert r.gaps == []


async def test_a_drained_device_moves_without_resending_what_was_delivered() -> None:
    """SIGTERM on A: the Drain comes while frames are still on their way to a slow sink. The
    edge reads A's final acks before it moves to B, so it resends nothing A delivered (before:
    it closed at the Drain and resent those frames to B, which pushed them to the sink again:
    11 resent, 10 duplicates)."""
    async with two_replicas(sink_delay=0.3) as r, SwitchProxy(r.a.ws) as proxy:
        edge = EdgeClient(url_of(proxy, "ws"), device_id="robot", streams=[StreamSpec("s")])
        async with edge:
            for _ in range(10):
                await edge.publish("s", CLOUD)
                await asyncio.sleep(0.02)
            proxy.backend_port = r.b.ws  # where the device lands next; nothing is cut
            r.a.signal(signal.SIGTERM)
            for _ in range(40):
                await edge.publish("s", CLOUD)
                await asyncio.sleep(0.02)
            await edge.drain(timeout=10)
        assert edge.stats.drains == 1 and edge.stats.reconnects == 1
        st = r.sink.record.streams[("robot", "s")]
        assert (st.delivered, st.lost, st.highest) == (50, 0, 50)
        assert st.duplicates == 0
        # only frames sent while the Drain was on its way (A neither accepts nor acks them)
        assert edge.stats.resent <= 3
        assert r.gaps == []


@pytest.mark.parametrize("transport", ["ws", "grpc"])
async def test_after_a_sigkill_the_next_replica_asks_the_sink_before_welcoming(
    transport: str,
) -> None:
    """A holds frames the sink made durable but has not acknowledged yet when A is SIGKILLed:
    the edge was never told they were delivered. B asks the sink for the device's watermarks
    before its Welcome, so the edge resends none of them (before: all of them, and the sink
    dropped them as duplicates: 29 resent, 19 duplicates)."""
    async with (
        two_replicas(sink_delay=1.0, ack_late=True) as r,
        SwitchProxy(port_of(r.a, transport)) as proxy,
    ):
        edge = EdgeClient(url_of(proxy, transport), device_id="robot", streams=[StreamSpec("s")])
        async with edge:
            for _ in range(20):
                await edge.publish("s", CLOUD)
                await asyncio.sleep(0.01)
            st = r.sink.record.streams
            assert await wait_until(
                lambda: st.get(("robot", "s")) is not None and st[("robot", "s")].highest == 20
            )
            assert edge.undelivered >= 10  # durable at the sink, not acknowledged
            r.a.kill()
            proxy.switch(port_of(r.b, transport))
            for _ in range(10):
                await edge.publish("s", CLOUD)
            await edge.drain(timeout=10)
        assert edge.stats.reconnects == 1
        rec = r.sink.record.streams[("robot", "s")]
        assert (rec.delivered, rec.lost, rec.highest) == (30, 0, 30)
        assert rec.duplicates == 0
        # only frames sent into the dead connection after the kill (21..30) went out again
        assert edge.stats.resent <= 10
