"""What a Hello may cost the sink (issue 32). Before a Welcome that does not resume one of its own
sessions, the bridge asks the sink for the device's watermarks on a stream of its own
(protocol.md §10). Unbounded, an edge saying Hello in a loop with fresh device ids cost the sink
one stream per Hello, and a sink that never answered cost every Hello MARKS_TIMEOUT_SECONDS.

Real bridge and reference sink (loadgen.sink.SinkServer) on 127.0.0.1, port 0; the sink counts
every stream it serves (``push_streams``: the bridge's push stream, then one per query).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from websockets.asyncio.client import connect

from bridge.server import push_impl
from bridge.server.app import BridgeService
from bridge.server.push_impl import MARKS_TIMEOUT_SECONDS, MarksLimits
from bridge.server.session import ROUTING_HEADER
from bridge.v1 import bridge_pb2 as pb
from loadgen.sink import SinkServer
from tests.integration.harness import hello, metric, running_bridge, wait_until, ws_url

QUERIES = "bridge_sink_marks_queries_total"
SKIPPED = "bridge_sink_marks_skipped_total"


class StalledSink(SinkServer):
    """Serves the bridge's push stream; never answers a watermark query (a stream that names a
    device): its handler waits until the bridge cancels the stream."""

    queries = 0

    async def _push(self, requests: Any, context: Any) -> None:
        if any(key == ROUTING_HEADER for key, _ in context.invocation_metadata() or ()):
            self.queries += 1
            await asyncio.Event().wait()
        await super()._push(requests, context)


@asynccontextmanager
async def bridge_and_sink(sink: SinkServer, **overrides: Any) -> AsyncIterator[BridgeService]:
    async with sink, running_bridge(sink_address=sink.address, **overrides) as service:
        assert await wait_until(lambda: metric(service, "bridge_sink_connected") == 1)
        assert sink.push_streams == 1
        yield service
        await sink.stop(grace=0)  # stalled handlers are cancelled, not waited for


async def welcome_after(
    url: str, device: str, **hello_fields: Any
) -> tuple[pb.BridgeMessage, float]:
    """One Hello on a fresh WebSocket: the bridge's first answer, and how long it took."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    async with connect(url, compression=None) as ws:
        await ws.send(hello(device, "s", **hello_fields).SerializeToString())
        answer = pb.BridgeMessage.FromString(await ws.recv(decode=False))
    return answer, loop.time() - start


def queries(service: BridgeService) -> float:
    return sum(metric(service, QUERIES, result=r) for r in ("answered", "timeout", "failed"))


async def test_fresh_device_ids_cost_the_sink_a_bounded_number_of_streams(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """200 Hellos with fresh device ids, 20 at a time, and a well-behaved edge among them: the
    sink serves at most the rate's worth of queries (before: 200, one per Hello), and the
    well-behaved edge is welcomed promptly."""
    limits = MarksLimits(in_flight=4, per_second=10.0, burst=10)
    monkeypatch.setattr(push_impl, "MARKS_LIMITS", limits)
    sink = SinkServer(fsync=False)
    async with bridge_and_sink(sink) as service:
        url = ws_url(service)
        loop = asyncio.get_running_loop()
        devices = iter(range(200))
        welcomed = asyncio.Event()

        async def hostile() -> None:
            for n in devices:
                answer, _ = await welcome_after(url, f"flood-{n}")
                assert answer.HasField("welcome")
                if n >= 50:
                    welcomed.set()

        start = loop.time()
        flood = [asyncio.create_task(hostile()) for _ in range(20)]
        await welcomed.wait()
        answer, took = await welcome_after(url, "well-behaved")
        await asyncio.gather(*flood)
        elapsed = loop.time() - start

        assert answer.HasField("welcome")
        assert took < 2.0, f"the well-behaved edge waited {took:.2f} s for its Welcome"
        asked = sink.push_streams - 1
        assert asked == queries(service)
        assert asked <= limits.burst + limits.per_second * elapsed, (asked, elapsed)
        past_limits = sum(metric(service, SKIPPED, reason=r) for r in ("in_flight", "rate"))
        assert past_limits == 201 - asked


async def test_concurrent_hellos_wait_for_a_stalled_sink_only_up_to_the_cap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """50 Hellos at once against a sink that never answers a query: at most ``in_flight`` of them
    open a stream and wait MARKS_TIMEOUT_SECONDS; the rest are welcomed without asking (before:
    50 streams, every Hello waited)."""
    cap = 4
    monkeypatch.setattr(push_impl, "MARKS_LIMITS", MarksLimits(in_flight=cap))
    sink = StalledSink(fsync=False)
    async with bridge_and_sink(sink) as service:
        url = ws_url(service)
        results = await asyncio.gather(*(welcome_after(url, f"d{n}") for n in range(50)))
        assert all(answer.HasField("welcome") for answer, _ in results)
        # Only the queries' Hellos wait (the others' latency is the machine's, not asserted).
        assert sink.queries <= cap, f"{sink.queries} of 50 Hellos waited for the stalled sink"
        assert metric(service, SKIPPED, reason="in_flight") == 50 - sink.queries


async def test_a_stalled_sink_does_not_hold_hellos_in_series() -> None:
    """One Hello after another against a sink that never answers: the first waits
    MARKS_TIMEOUT_SECONDS, the next ones within the stall period do not ask (before: 20 x 0.5 s,
    every Hello waited)."""
    sink = StalledSink(fsync=False)
    async with bridge_and_sink(sink) as service:
        url = ws_url(service)
        took = []
        for n in range(20):
            answer, seconds = await welcome_after(url, f"d{n}")
            assert answer.HasField("welcome")
            took.append(seconds)
        assert sink.queries == 1, (sink.queries, [round(t, 2) for t in took])
        assert took[0] >= MARKS_TIMEOUT_SECONDS * 0.9  # the one query waited its timeout
        assert sum(took) < len(took) * MARKS_TIMEOUT_SECONDS / 2, [round(t, 2) for t in took]
        assert metric(service, QUERIES, result="timeout") == 1
        assert metric(service, SKIPPED, reason="stalled") == 19


async def test_a_device_saying_hello_again_is_answered_from_the_cache() -> None:
    """The same device, ten Hellos without a resume token of this bridge: one query, nine
    answered from the cache (before: ten sink streams)."""
    sink = SinkServer(fsync=False)
    async with bridge_and_sink(sink) as service:
        url = ws_url(service)
        for _ in range(10):
            answer, _ = await welcome_after(url, "looping", resume_token="another-replica")
            assert answer.HasField("welcome")
        assert sink.push_streams - 1 == queries(service) == 1
        assert metric(service, SKIPPED, reason="cached") == 9


async def test_hellos_that_fail_authentication_never_reach_the_sink() -> None:
    """The query comes after the Hello is authenticated: refused Hellos cost the sink nothing.
    (A guard on the order in bridge/server/ingest.py; it held before the limits.)"""
    sink = SinkServer(fsync=False)
    async with bridge_and_sink(sink, auth_token="secret") as service:
        url = ws_url(service)
        for n in range(20):
            answer, _ = await welcome_after(url, f"intruder-{n}", auth_token="wrong")
            assert answer.error.code == pb.UNAUTHENTICATED
        answer, _ = await welcome_after(url, "robot", auth_token="secret")
        assert answer.HasField("welcome")
        assert sink.push_streams - 1 == queries(service) == 1
