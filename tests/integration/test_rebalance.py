"""Drain on request (issue 32): after a scale-up, ``POST /admin/rebalance?spread_seconds=S`` on the
old replica sends its edges a Drain each, spaced over S seconds, and they reconnect through the
balancer to where their key now maps, with nothing lost.

Two real ``simbridge serve`` processes push to one sink (``loadgen.sink.SinkServer``); a switchable
TCP forwarder per transport plays the load balancer: after the "scale-up" it sends new
connections to replica B and leaves the open ones on A, as a consistent-hash balancer does for
the keys that moved. Real SDK edges over WebSocket and gRPC publish throughout.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import numpy as np

from bridge.client import EdgeClient, StreamSpec
from bridge.v1 import bridge_pb2 as pb
from loadgen.sink import SinkServer
from tests.integration.harness import BridgeProcess, scraped, serve_process, wait_until
from tests.support.switchproxy import SwitchProxy

TOKEN = "rebalance-test-token"
CLOUD = np.zeros((4, 3), np.float32)
SPREAD_S = 2.0
DEVICES = 8  # half over each transport


async def http(
    port: int, method: str, path: str, token: str | None = None
) -> tuple[int, dict[str, object] | str]:
    """One request on the ops port: status, and the body (JSON when it is)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    auth = f"Authorization: Bearer {token}\r\n" if token is not None else ""
    writer.write(f"{method} {path} HTTP/1.1\r\nHost: x\r\n{auth}Content-Length: 0\r\n\r\n".encode())
    await writer.drain()
    raw = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    head, _, body = raw.decode().partition("\r\n\r\n")
    with contextlib.suppress(ValueError):
        return int(head.split()[1]), json.loads(body)
    return int(head.split()[1]), body


async def sessions(bridge: BridgeProcess) -> float:
    _, body = await http(bridge.http, "GET", "/metrics", TOKEN)
    assert isinstance(body, str)
    return sum(scraped(body, "bridge_sessions"))


@asynccontextmanager
async def scaled_up() -> AsyncIterator[
    tuple[SinkServer, BridgeProcess, BridgeProcess, list[SwitchProxy]]
]:
    async with AsyncExitStack() as stack:
        sink = await stack.enter_async_context(SinkServer(fsync=False))
        flags = (f"--sink-address={sink.address}", f"--auth-token={TOKEN}")
        a = await stack.enter_async_context(serve_process(*flags))
        b = await stack.enter_async_context(serve_process(*flags))
        proxies = [
            await stack.enter_async_context(SwitchProxy(a.ws)),
            await stack.enter_async_context(SwitchProxy(a.grpc)),
        ]
        yield sink, a, b, proxies


async def publish(edge: EdgeClient, stop: asyncio.Event, count: list[int]) -> None:
    while not stop.is_set():
        await edge.publish("lidar", CLOUD)
        count[0] += 1
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.05)


async def test_rebalance_drains_spread_out_and_devices_move_without_loss() -> None:
    gaps: list[pb.Gap] = []
    async with scaled_up() as (sink, a, b, (ws_proxy, grpc_proxy)):
        sink._on_frame = lambda f: gaps.append(f.gap) if f.gap.count else None
        edges = [
            EdgeClient(
                f"ws://127.0.0.1:{ws_proxy.port}/v1/ingest"
                if i % 2 == 0
                else f"grpc://127.0.0.1:{grpc_proxy.port}",
                device_id=f"robot-{i}",
                streams=[StreamSpec("lidar")],
                token=TOKEN,
            )
            for i in range(DEVICES)
        ]
        stop = asyncio.Event()
        counts = [[0] for _ in edges]
        try:
            await asyncio.gather(*(e.start() for e in edges))
            tasks = [
                asyncio.create_task(publish(e, stop, c)) for e, c in zip(edges, counts, strict=True)
            ]
            assert await wait_until(lambda: all(c[0] >= 5 for c in counts))
            assert await sessions(a) == DEVICES and await sessions(b) == 0

            # The scale-up: the balancer sends new connections to B, open ones stay on A.
            ws_proxy.backend_port, grpc_proxy.backend_port = b.ws, b.grpc
            loop = asyncio.get_running_loop()
            started = loop.time()
            status, body = await http(
                a.http, "POST", f"/admin/rebalance?spread_seconds={SPREAD_S:g}", TOKEN
            )
            assert (status, body) == (
                202,
                {"edges": DEVICES, "spread_seconds": SPREAD_S, "reconnect_ms": 100},
            )
            status, body = await http(a.http, "POST", "/admin/rebalance", TOKEN)
            assert status == 409 and isinstance(body, dict), body  # one at a time
            assert body["error"] == "a rebalance is running"

            drained_at: dict[int, float] = {}

            def note_drains() -> bool:
                for i, e in enumerate(edges):
                    if e.stats.drains and i not in drained_at:
                        drained_at[i] = loop.time() - started
                return len(drained_at) == DEVICES

            assert await wait_until(note_drains, timeout=SPREAD_S + 5)
            times = sorted(drained_at.values())
            # Evenly spaced: the k-th of n at k*S/n (the last at 1.75 s), not all at once.
            assert times[-1] - times[0] >= 0.6 * SPREAD_S * (DEVICES - 1) / DEVICES, times
            assert times[-1] <= SPREAD_S + 1.0, times

            async def all_on_b() -> bool:
                return await sessions(b) == DEVICES and await sessions(a) == 0

            deadline = loop.time() + 10
            while not await all_on_b():
                assert loop.time() < deadline, (await sessions(a), await sessions(b))
                await asyncio.sleep(0.05)
            assert all(e.stats.drains == 1 for e in edges)

            stop.set()
            await asyncio.gather(*tasks)
            assert all(await asyncio.gather(*(e.wait_delivered(15) for e in edges)))
        finally:
            stop.set()
            for e in edges:
                await e.close()
        # Once it ended, a rebalance may run again (A has nobody left to drain).
        status, body = await http(a.http, "POST", "/admin/rebalance?spread_seconds=0", TOKEN)
        assert (status, body) == (202, {"edges": 0, "spread_seconds": 0.0, "reconnect_ms": 100})
    for i, count in enumerate(counts):
        st = sink.record.streams[(f"robot-{i}", "lidar")]
        assert (st.delivered, st.lost, st.reorders) == (count[0], 0, 0)
    assert gaps == []


async def test_rebalance_needs_the_token_and_is_refused_without_one() -> None:
    async with serve_process(f"--auth-token={TOKEN}") as guarded, serve_process() as open_:
        assert (await http(guarded.http, "POST", "/admin/rebalance"))[0] == 401
        assert (await http(guarded.http, "POST", "/admin/rebalance", "wrong"))[0] == 401
        # No token configured: refused whatever is sent (secure by default).
        status, body = await http(open_.http, "POST", "/admin/rebalance", "anything")
        assert status == 403 and body == "no auth_token set\n"
        status, body = await http(
            guarded.http, "POST", "/admin/rebalance?spread_seconds=601", TOKEN
        )
        assert status == 400 and isinstance(body, dict) and "spread_seconds" in str(body["error"])
        assert (await http(guarded.http, "GET", "/admin/rebalance", TOKEN))[0] == 404
