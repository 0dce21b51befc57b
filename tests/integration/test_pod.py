"""A pod: ``simbridge serve --processes N`` as a real supervisor with real ingest processes on one
port pair, real edges over both transports, one real sink (issue 31).

The kernel hands each connection to any process, so every reconnect below may land on another
process than the one holding the device: the ownership table moves the device (the owner lets
it go after delivering what it buffered) and the sink must see every frame exactly once, in
order, with no gap announced, whatever the landing.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import numpy as np

from bridge.client import EdgeClient, StreamSpec
from bridge.v1 import bridge_pb2 as pb
from loadgen.sink import SinkServer
from tests.integration.harness import BridgeProcess, http_get, scraped, wait_until
from tests.integration.harness import hello as harness_hello
from tests.support.switchproxy import SwitchProxy

CLOUD = np.zeros((4, 3), np.float32)
DEVICES = 8
ROUNDS = 4
FRAMES = 15


class Pod:
    def __init__(self, proc: BridgeProcess, sink: DelayedSink, gaps: list[pb.Gap]) -> None:
        self.proc, self.sink, self.gaps = proc, sink, gaps

    async def debug(self) -> dict[str, Any]:
        status, body = await http_get(self.proc.http, "/debug/resources")
        assert status == 200, body
        return dict(json.loads(body))

    async def workers(self) -> list[dict[str, Any]]:
        info = await self.debug()
        return list(info["workers"])

    async def running(self) -> int:
        return sum(1 for w in await self.workers() if w["state"] == "up")


class DelayedSink(SinkServer):
    """Makes every batch durable ``delay`` seconds late (a stalled sink, when large)."""

    delay = 0.0

    async def _record_batch(self, batch: list[tuple[pb.ProcessedFrame, int]]) -> int:
        await asyncio.sleep(self.delay)
        return await super()._record_batch(batch)


@asynccontextmanager
async def pod(
    *args: str, sink_delay: float = 0.0, env: dict[str, str] | None = None
) -> AsyncIterator[Pod]:
    gaps: list[pb.Gap] = []

    def on_frame(frame: pb.ProcessedFrame) -> None:
        if frame.gap.count:
            gaps.append(frame.gap)

    async with AsyncExitStack() as stack:
        sink = DelayedSink(fsync=False, on_frame=on_frame)
        sink.delay = sink_delay
        await stack.enter_async_context(sink)
        proc = await BridgeProcess.start(
            "--ws-port=0",
            "--grpc-port=0",
            "--http-port=0",
            f"--sink-address={sink.address}",
            *args,
            env=env,
        )
        stack.callback(proc.kill)
        yield Pod(proc, sink, gaps)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def url(port: int, transport: str) -> str:
    return f"ws://127.0.0.1:{port}/v1/ingest" if transport == "ws" else f"grpc://127.0.0.1:{port}"


async def device_life(pod: Pod, n: int, port: int, rounds: int = ROUNDS) -> EdgeClient:
    """One device: FRAMES frames, then its connection is cut (the reconnect lands wherever the
    kernel puts it), ``rounds`` times."""
    transport = "ws" if n % 2 else "grpc"
    async with SwitchProxy(port if transport == "ws" else pod.proc.grpc) as proxy:
        edge = EdgeClient(
            url(proxy.port, transport), device_id=f"robot-{n}", streams=[StreamSpec("s")]
        )
        async with edge:
            for _ in range(rounds):
                for _ in range(FRAMES):
                    await edge.publish("s", CLOUD)
                    await asyncio.sleep(0.005)
                await edge.drain(timeout=15)
                proxy.cut()
        return edge


def assert_exactly_once(pod: Pod, devices: int, frames: int) -> None:
    for n in range(devices):
        st = pod.sink.record.streams[(f"robot-{n}", "s")]
        assert (st.delivered, st.lost, st.highest) == (frames, 0, frames), (n, st.report())
        assert st.duplicates == 0, (n, st.report())
    assert pod.gaps == [], f"gaps announced: {pod.gaps[:5]}"


async def test_reconnects_landing_on_any_process_deliver_exactly_once_without_gaps() -> None:
    async with pod("--processes=2") as p:
        assert await p.running() == 2
        edges = await asyncio.gather(*(device_life(p, n, p.proc.ws) for n in range(DEVICES)))
        assert all(e.stats.reconnects >= ROUNDS - 1 for e in edges)
        assert_exactly_once(p, DEVICES, ROUNDS * FRAMES)
        status, body = await http_get(p.proc.http, "/metrics")
        assert status == 200
        # Some of the 8 x 3 reconnects moved a device between the processes (each lands on the
        # other process with probability 1/2: none moving has probability 2^-24).
        moved = sum(scraped(body, "bridge_pod_claims_total", result="released"))
        assert moved >= 1, body[-2000:]


async def test_two_hellos_for_one_device_at_once_one_is_welcomed() -> None:
    async with pod("--processes=2") as p:
        results = await asyncio.gather(
            *(_hello_only(p.proc.ws, "twin") for _ in range(6)), return_exceptions=True
        )
        welcomed = [r for r in results if r == "welcome"]
        assert len(welcomed) == 1, results
        taken = [r for r in results if isinstance(r, str) and r.startswith("UNAUTHENTICATED")]
        assert len(taken) == 5 and all("live session" in r for r in taken), results


async def _hello_only(port: int, device: str) -> str:
    """A raw WebSocket edge that says Hello and holds the connection a moment: its answer."""
    import websockets

    hello = harness_hello(device, "s")
    async with websockets.connect(f"ws://127.0.0.1:{port}/v1/ingest") as ws:
        await ws.send(hello.SerializeToString())
        raw = await asyncio.wait_for(ws.recv(), 10)
        assert isinstance(raw, bytes)
        reply = pb.BridgeMessage.FromString(raw)
        kind = reply.WhichOneof("kind")
        if kind == "error":
            return f"{pb.ErrorCode.Name(reply.error.code)}: {reply.error.message}"
        await asyncio.sleep(1.0)  # hold it while the others ask
        return str(kind)


async def test_a_sigkilled_process_is_restarted_and_its_devices_resume_elsewhere() -> None:
    async with pod("--processes=2", "--pod-restart-backoff-max-seconds=1") as p:
        before = {w["index"]: w["pid"] for w in await p.workers()}
        task = asyncio.gather(*(device_life(p, n, p.proc.ws, rounds=3) for n in range(DEVICES)))
        await asyncio.sleep(0.5)
        os.kill(before[0], signal.SIGKILL)
        await task
        assert await _restarted(p, 0, before[0])
        assert_exactly_once(p, DEVICES, 3 * FRAMES)


async def _restarted(p: Pod, index: int, old_pid: int, timeout: float = 15.0) -> bool:  # noqa: ASYNC109
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        for w in await p.workers():
            if w["index"] == index and w["state"] == "up" and w["pid"] != old_pid:
                return True
        await asyncio.sleep(0.1)
    return False


async def test_sigterm_drains_every_process_and_exits_0() -> None:
    async with pod("--processes=2") as p:
        await asyncio.gather(*(device_life(p, n, p.proc.ws, rounds=1) for n in range(4)))
        pids = [w["pid"] for w in await p.workers()]
        p.proc.signal(signal.SIGTERM)
        assert await p.proc.wait(30) == 0
        assert not [pid for pid in pids if _alive(pid)]
        assert_exactly_once(p, 4, FRAMES)


async def _request(port: int, method: str, path: str, token: str = "") -> tuple[int, str]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    writer.write(f"{method} {path} HTTP/1.1\r\nHost: x\r\n{auth}Content-Length: 0\r\n\r\n".encode())
    raw = await reader.read()
    writer.close()
    head, _, body = raw.decode().partition("\r\n\r\n")
    return int(head.split()[1]), body


async def test_rebalance_on_the_pod_drains_every_process_s_edges_and_sums_them() -> None:
    """``POST /admin/rebalance`` on the pod's ops port reaches every process's own route (issue
    32's scale-up spread), with the route's auth rules; before, the pod answered 405."""
    token = "pod-token"
    async with pod("--processes=2", f"--auth-token={token}") as p:
        edges = [
            EdgeClient(
                url(p.proc.ws if n % 2 else p.proc.grpc, "ws" if n % 2 else "grpc"),
                device_id=f"robot-{n}",
                streams=[StreamSpec("s")],
                token=token,
            )
            for n in range(6)
        ]
        for edge in edges:
            await edge.__aenter__()
            await edge.publish("s", CLOUD)
            await edge.drain(timeout=10)
        assert (await _request(p.proc.http, "POST", "/admin/rebalance"))[0] == 401
        status, body = await _request(
            p.proc.http, "POST", "/admin/rebalance?spread_seconds=0.5", token
        )
        assert status == 202, body
        answer = json.loads(body)
        assert answer["edges"] == 6 and len(answer["processes"]) == 2, answer
        status, body = await _request(p.proc.http, "POST", "/admin/rebalance", token)
        assert status == 409, body  # one at a time, in each process
        assert await wait_until(lambda: sum(e.stats.drains for e in edges) >= 6, timeout=10)
        for edge in edges:
            await edge.publish("s", CLOUD)
            await edge.drain(timeout=10)
            await edge.__aexit__(None, None, None)
        assert [e.stats.drains for e in edges] == [1] * 6
        assert_exactly_once(p, 6, 2)


async def test_rebalance_on_a_pod_without_a_token_is_refused() -> None:
    async with pod("--processes=2") as p:
        assert (await _request(p.proc.http, "POST", "/admin/rebalance"))[0] == 403
