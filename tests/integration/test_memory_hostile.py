"""Hostile and heavy load against a real ``simbridge serve`` process: its RSS growth must stay
within the data budget plus the documented overhead (the plan's headroom, see README "Memory
model"), while a well-behaved edge alongside loses nothing.

Each case sizes its load to take a few seconds; ``SIMBRIDGE_HEAVY=1`` (``make test-memory-heavy``)
runs the full-size versions (2,000 idle sessions, longer floods).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import numpy as np
import pytest
from websockets.asyncio.client import connect

from bridge.resources.from_settings import memory_headroom_bytes
from bridge.v1 import bridge_pb2 as pb
from loadgen.edge import EdgeClient, PreparedPayload, StreamConfig
from loadgen.sink import SinkServer
from tests.integration.harness import BridgeProcess, RawGrpcEdge, hello, http_get, rss, xyz_cloud

MiB = 1 << 20
HEAVY = os.environ.get("SIMBRIDGE_HEAVY") == "1"
BUDGET = 64 * MiB
MAX_FRAME = 4 * MiB
OVERHEAD = memory_headroom_bytes(MAX_FRAME)  # 64 MiB + 2 frames: what nothing charges
FLOOD_SECONDS = 8.0 if HEAVY else 2.5


@dataclass
class Peak:
    """RSS of the bridge process sampled every 20 ms."""

    pid: int
    budget: int = BUDGET
    baseline: int = 0
    peak: int = 0
    samples: list[int] = field(default_factory=list)

    async def run(self) -> None:
        while True:
            value = rss(self.pid)
            self.samples.append(value)
            self.peak = max(self.peak, value)
            await asyncio.sleep(0.02)

    @property
    def growth(self) -> int:
        return self.peak - self.baseline

    def report(self, name: str) -> str:
        return (
            f"{name}: baseline {self.baseline / MiB:.0f} MiB, peak {self.peak / MiB:.0f} MiB, "
            f"growth {self.growth / MiB:.0f} MiB <= budget {self.budget / MiB:.0f} + overhead "
            f"{OVERHEAD / MiB:.0f} MiB"
        )


def cloud_bytes(points: int, stream: str, seq: int) -> bytes:
    xyz = np.random.default_rng(seq).uniform(-5, 5, (points, 3))
    frame = pb.Frame(stream_id=stream, seq=seq, point_cloud=xyz_cloud(xyz))
    return pb.EdgeMessage(frame=frame).SerializeToString()


BIG_POINTS = (MAX_FRAME - 4096) // 12  # just under max_frame_bytes on the wire


@asynccontextmanager
async def bridge(
    sink_port: int, *extra: str, env: dict[str, str] | None = None
) -> AsyncIterator[tuple[BridgeProcess, Peak]]:
    proc = await BridgeProcess.start(
        "--ring-budget-bytes",
        str(BUDGET),
        "--max-frame-bytes",
        str(MAX_FRAME),
        "--sink-address",
        f"127.0.0.1:{sink_port}",
        "--passthrough",
        "--workers",
        "1",
        "--ws-port",
        "0",
        "--grpc-port",
        "0",
        "--http-port",
        "0",
        "--sink-backoff-max-seconds",
        "0.2",
        *extra,
        env=env,
    )
    peak = Peak(proc.proc.pid)
    await asyncio.sleep(0.3)
    peak.baseline = rss(proc.proc.pid)
    sampler = asyncio.create_task(peak.run())
    try:
        yield proc, peak
    finally:
        sampler.cancel()
        proc.kill()


class Received:
    """What the sink got, per (device, stream)."""

    def __init__(self) -> None:
        self.seqs: dict[tuple[str, str], list[int]] = {}

    def __call__(self, frame: pb.ProcessedFrame) -> None:
        self.seqs.setdefault((frame.device_id, frame.stream_id), []).append(frame.seq)

    def exactly(self, device: str, stream: str, count: int) -> bool:
        return self.seqs.get((device, stream), []) == list(range(1, count + 1))


async def ws_flood(url: str, device: str, stream: str) -> None:
    """An edge that ignores PAUSE and never reads: frames as fast as TCP takes them."""
    async with connect(
        url, max_size=None, compression=None, ping_interval=None, close_timeout=0.2
    ) as ws:
        await ws.send(hello(device, stream).SerializeToString())
        seq = 0
        while True:
            seq += 1
            await ws.send(cloud_bytes(BIG_POINTS, stream, seq))


async def grpc_flood(target: str, device: str, stream: str) -> None:
    edge = RawGrpcEdge(target)
    try:
        await edge.send(hello(device, stream).SerializeToString())
        seq = 0
        while True:
            seq += 1
            await edge.send(cloud_bytes(BIG_POINTS, stream, seq))
    finally:
        await edge.close()


async def good_edge_delivers(
    transport: str, url: str, frames: int, sink: Callable[[], Awaitable[SinkServer]]
) -> tuple[EdgeClient, SinkServer]:
    edge = EdgeClient(transport, url, "good", [StreamConfig("cam")])  # type: ignore[arg-type]
    await edge.start()
    cloud = np.random.default_rng(7).uniform(-5, 5, (60_000, 3))
    for _ in range(frames):
        await edge.publish("cam", xyz_cloud(cloud))
    return edge, await sink()


async def run_flood_case(
    name: str, flood: Callable[[BridgeProcess], list[Awaitable[None]]], free_port: int
) -> None:
    received = Received()
    async with bridge(free_port) as (proc, peak):
        floods = [asyncio.ensure_future(f) for f in flood(proc)]
        await asyncio.sleep(0.5)
        edge = EdgeClient("ws", proc.ws_url, "good", [StreamConfig("cam")])
        await edge.start()
        cloud = xyz_cloud(np.random.default_rng(7).uniform(-5, 5, (60_000, 3)))
        for _ in range(20):
            await edge.publish("cam", cloud)
        await asyncio.sleep(FLOOD_SECONDS)  # the sink is down: everything stays buffered
        async with SinkServer(listen=f"127.0.0.1:{free_port}", fsync=False, on_frame=received):
            await asyncio.sleep(1.0)  # drains while the flood goes on
            for task in floods:
                task.cancel()
            await asyncio.gather(*floods, return_exceptions=True)
            t0 = asyncio.get_running_loop().time()
            assert await edge.wait_delivered(30)
            print(f"delivered in {asyncio.get_running_loop().time() - t0:.1f} s")
        await edge.close()
        status, body = await http_get(proc.http, "/metrics")
        assert status == 200
    print(peak.report(name))
    assert received.exactly("good", "cam", 20), "the well-behaved edge lost or repeated frames"
    assert edge.stats.disconnects == 0
    assert "bridge_memory_budget_bytes" in body and "process_resident_memory_bytes" in body
    assert peak.growth <= BUDGET + OVERHEAD, peak.report(name)


async def test_websocket_edges_that_ignore_pause_stay_within_the_budget(free_port: int) -> None:
    await run_flood_case(
        "ws ignoring PAUSE x3",
        lambda proc: [ws_flood(proc.ws_url, f"bad{i}", "s") for i in range(3)],
        free_port,
    )


async def test_grpc_edges_that_ignore_pause_stay_within_the_budget(free_port: int) -> None:
    await run_flood_case(
        "grpc ignoring PAUSE x3",
        lambda proc: [grpc_flood(f"127.0.0.1:{proc.grpc}", f"bad{i}", "s") for i in range(3)],
        free_port,
    )


async def test_subscribers_that_never_read_get_gaps_not_memory(free_port: int) -> None:
    received = Received()
    async with (
        SinkServer(listen=f"127.0.0.1:{free_port}", fsync=False, on_frame=received),
        bridge(free_port) as (proc, peak),
    ):
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{proc.grpc}")
        subscribe = channel.unary_stream(
            "/bridge.v1.Visualization/Subscribe",
            request_serializer=pb.SubscribeRequest.SerializeToString,
            response_deserializer=pb.ProcessedFrame.FromString,
        )
        calls = [subscribe(pb.SubscribeRequest()) for _ in range(4)]  # never read
        frames = 150 if HEAVY else 60
        # The edge keeps every frame until delivered (its resend buffer holds them all): this
        # case is about the bridge, and an open-loop edge that outruns its own link evicts
        # frames, which a fast machine did at 150 frames (the sink then saw announced gaps).
        edge = EdgeClient(
            "ws",
            proc.ws_url,
            "good",
            [StreamConfig("cam")],
            resend_buffer_bytes=(frames + 1) * MAX_FRAME,
        )
        await edge.start()
        cloud = xyz_cloud(np.random.default_rng(7).uniform(-5, 5, (BIG_POINTS, 3)))
        for _ in range(frames):
            await edge.publish("cam", cloud)
        assert await edge.wait_delivered(60)
        _, body = await http_get(proc.http, "/metrics")
        for call in calls:
            call.cancel()
        await channel.close()
        await edge.close()
    print(peak.report("4 subscribers never reading"))
    assert edge.stats.dropped == 0, "the edge evicted frames from its own buffer"
    assert received.exactly("good", "cam", frames)
    dropped = [ln for ln in body.splitlines() if ln.startswith("bridge_subscriber_dropped_total")]
    assert dropped and float(dropped[0].split()[1]) > 0, "slow subscribers got no gaps"
    assert peak.growth <= BUDGET + OVERHEAD, peak.report("subscribers")


async def test_64_streams_of_maximum_frames_on_one_edge(free_port: int) -> None:
    received = Received()
    streams = [f"s{i}" for i in range(64)]
    per_stream = 3 if HEAVY else 1
    async with bridge(free_port, "--max-streams-per-session", "64") as (proc, peak):
        # Room for every frame at the edge: with the sink down it holds them all (the default
        # 256 MiB evicted the oldest unsent ones past 64 frames: announced gaps, not exactly-once)
        edge = EdgeClient(
            "ws",
            proc.ws_url,
            "wide",
            [StreamConfig(s) for s in streams],
            resend_buffer_bytes=(len(streams) * per_stream + 1) * MAX_FRAME,
        )
        await edge.start()
        # max_frame_bytes in the Welcome follows the plan: 48 MiB admission, 4 MiB configured
        cloud = xyz_cloud(np.random.default_rng(3).uniform(-5, 5, (BIG_POINTS, 3)))
        for _ in range(per_stream):
            for s in streams:
                await edge.publish(s, cloud)
        await asyncio.sleep(FLOOD_SECONDS)  # sink down: 64 x 4 MiB wanted, 48 MiB admitted
        async with SinkServer(listen=f"127.0.0.1:{free_port}", fsync=False, on_frame=received):
            assert await edge.wait_delivered(90)
        await edge.close()
    print(peak.report("64 streams x 4 MiB frames"))
    assert edge.stats.dropped == 0, "the edge evicted frames from its own buffer"
    for s in streams:
        assert received.exactly("wide", s, per_stream)
    assert edge.stats.pauses > 0
    assert peak.growth <= BUDGET + OVERHEAD, peak.report("64 streams")


async def test_idle_sessions_are_charged_and_bounded(free_port: int) -> None:
    count = 2000 if HEAVY else 300
    # 2,000 sessions x ~25 KiB need ~50 MB of the admission limit: a 96 MiB budget (72 MiB
    # admission) holds them; 64 MiB would refuse the last few with TOO_MANY_SESSIONS.
    budget = 96 * MiB if HEAVY else BUDGET
    extra = ("--max-sessions", str(count + 10), "--ring-budget-bytes", str(budget))
    async with bridge(free_port, *extra) as (proc, peak):
        peak.budget = budget
        conns = []
        try:
            for i in range(count):
                ws = await connect(proc.ws_url, compression=None, ping_interval=None)
                await ws.send(hello(f"idle{i}", "s").SerializeToString())
                welcome = pb.BridgeMessage.FromString(await ws.recv())
                assert welcome.HasField("welcome")
                conns.append(ws)
            status, body = await http_get(proc.http, "/debug/resources")
            assert status == 200
            await asyncio.sleep(0.3)
        finally:
            for ws in conns:
                with contextlib.suppress(Exception):
                    await ws.close()
    memory = json.loads(body)["memory"]
    sessions = memory["charged_by_component"]["sessions"]
    per_session = peak.growth / count
    print(peak.report(f"{count} idle sessions") + f"; {per_session / 1024:.0f} KiB per session")
    assert sessions == count * (24 + 1) * 1024  # each charged: 24 KiB + 1 KiB for its stream
    assert peak.growth <= budget + OVERHEAD, peak.report("idle sessions")


def write_cgroup(root: Path, memory: int) -> None:
    (root / "memory.max").write_text(f"{memory}\n")


async def test_memory_shrink_to_a_quarter_under_full_load(free_port: int, tmp_path: Path) -> None:
    """The bridge reads its limit from a cgroup directory (BRIDGE_CGROUP_ROOT); the limit falls
    to 1/4 while the sink is down and every ring is full: admission pauses, and once the sink
    is back the data drains under the new budget, the heap is trimmed and RSS falls below the
    new limit minus headroom; raised again, admission resumes; the edge loses nothing."""
    cg = tmp_path / "cg"
    cg.mkdir()
    big = 1024 * MiB
    write_cgroup(cg, big)
    (cg / "cpu.max").write_text("max 100000\n")
    received = Received()
    env = {"BRIDGE_ADAPT": "true", "BRIDGE_CGROUP_ROOT": str(cg)}
    async with bridge(free_port, "--cgroup-poll-seconds", "0.05", env=env) as (proc, _):
        edge = EdgeClient("ws", proc.ws_url, "good", [StreamConfig(f"s{i}") for i in range(4)])
        await edge.start()
        cloud = PreparedPayload.of(
            xyz_cloud(np.random.default_rng(5).uniform(-5, 5, (BIG_POINTS, 3)))
        )
        published = 0

        async def publish_for(seconds: float, until: Callable[[], bool] = lambda: False) -> None:
            nonlocal published
            end = asyncio.get_running_loop().time() + seconds
            while asyncio.get_running_loop().time() < end and not until():
                if edge.stats.published - edge.stats.acked_accepted > 24:
                    await asyncio.sleep(0.02)  # paused, or acks lag: do not pile up here
                    continue
                await edge.publish(f"s{published % 4}", cloud)
                published += 1

        small = big // 4
        # the sink is down: the rings fill towards the 1 GiB plan, past what 1/4 allows
        await publish_for(60.0, until=lambda: rss(proc.proc.pid) > small + 32 * MiB)
        full = rss(proc.proc.pid)
        write_cgroup(cg, small)
        limit_after = small - memory_headroom_bytes(MAX_FRAME)
        await asyncio.sleep(0.3)
        _, body = await http_get(proc.http, "/debug/resources")
        memory = json.loads(body)["memory"]
        assert memory["budget_bytes"] < memory["charged_bytes"], "admission must pause"
        async with SinkServer(listen=f"127.0.0.1:{free_port}", fsync=False, on_frame=received):
            await publish_for(2.0)  # full load goes on at the new size
            assert await edge.wait_delivered(60)
            await asyncio.sleep(1.0)  # housekeeping trims the heap once drained
            after = rss(proc.proc.pid)
            write_cgroup(cg, big)
            await publish_for(1.0)
            assert await edge.wait_delivered(60)
        await edge.close()
    print(
        f"shrink 1 GiB -> 256 MiB: RSS full {full / MiB:.0f} MiB, after {after / MiB:.0f} MiB "
        f"(limit - headroom = {limit_after / MiB:.0f} MiB)"
    )
    assert full > small, "the load must hold more than the new limit for the shrink to matter"
    for i in range(4):
        count = len(received.seqs.get(("good", f"s{i}"), []))
        assert received.exactly("good", f"s{i}", count)
    assert sum(len(v) for v in received.seqs.values()) == published
    assert after <= limit_after


@pytest.fixture(autouse=True)
def _not_on_a_loaded_ci_without_memory() -> None:
    if not Path("/proc/self/status").exists():
        pytest.skip("needs /proc to read the bridge's RSS")
