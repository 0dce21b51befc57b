"""Subscribe in a pod (issue 31): a viewer's call on one process sees every process's devices.

Real in-process bridges wired to each other as one pod's processes are (a static sibling list
and a shared secret, what ``bridge.server.podlink`` gives a worker), real edges publishing to
each, real gRPC viewers. Each sibling's public gRPC port stands in for its private listener: the
same server and handler answer both.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import grpc
import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from bridge.client import EdgeClient as SdkEdge
from bridge.client import StreamSpec as SdkSpec
from bridge.server import app as app_module
from bridge.server.app import BridgeService
from bridge.server.governor import Component
from bridge.server.grpc_impl import build_server
from bridge.server.podfeed import POD_SECRET_METADATA, SiblingSource, StaticSiblings
from bridge.v1 import bridge_pb2 as pb
from bridge.v1 import bridge_pb2_grpc
from loadgen.clouds import synthetic
from loadgen.edge import EdgeClient, StreamConfig
from tests.integration.harness import (
    BridgeProcess,
    bridge_settings,
    grpc_target,
    http_get,
    metric,
    scraped,
    wait_until,
    ws_url,
)

SECRET = "0f" * 16
VIEWER = "viewer-token"
STREAMS = [StreamConfig("lidar"), StreamConfig("imu", kind="telemetry")]


class Pod:
    """In-process bridges that know each other as siblings (member i's list: every other)."""

    def __init__(self, **overrides: Any) -> None:
        self.overrides = {"passthrough": True, "viewer_token": VIEWER, **overrides}
        self.members: list[BridgeService | None] = []
        self.sources: dict[int, StaticSiblings] = {}

    async def add(self, grpc_port: int = 0) -> BridgeService:
        service = BridgeService(
            bridge_settings(grpc_port=grpc_port, **self.overrides), CollectorRegistry()
        )
        source = StaticSiblings([], SECRET)
        _SOURCES[id(service.subscribers)] = source
        await service.start()
        self.members.append(service)
        self.sources[id(service)] = source
        self.replan()
        return service

    def replan(self) -> None:
        live = [m for m in self.members if m is not None]
        for member in live:
            self.sources[id(member)].addresses = [grpc_target(m) for m in live if m is not member]

    async def kill(self, service: BridgeService) -> None:
        """Closed without telling the others: their lists still name it."""
        self.members[self.members.index(service)] = None
        await service.close()

    async def close(self) -> None:
        for member in self.members:
            if member is not None:
                await member.close()


_SOURCES: dict[int, SiblingSource] = {}


@pytest.fixture(autouse=True)
def pod_wired(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Hands each test bridge its static pod link through build_server's hook (``pod``), in place
    of the one app.py passes (a worker's link to its supervisor, None here)."""

    def wired(
        settings: Any,
        edges: Any,
        subscribers: Any,
        metrics: Any,
        governor: Any,
        pod: Callable[[], SiblingSource | None] | None = None,
    ) -> Any:
        def hook() -> SiblingSource | None:  # this test's static pod, not the environment's
            return _SOURCES.get(id(subscribers))

        return build_server(settings, edges, subscribers, metrics, governor, pod=hook)

    monkeypatch.setattr(app_module, "build_server", wired)
    yield
    _SOURCES.clear()


@asynccontextmanager
async def pod_of(n: int, **overrides: Any) -> AsyncIterator[Pod]:
    pod = Pod(**overrides)
    try:
        for _ in range(n):
            await pod.add()
        yield pod
    finally:
        await pod.close()


@asynccontextmanager
async def viewer(service: BridgeService, **request: Any) -> AsyncIterator[Any]:
    channel = grpc.aio.insecure_channel(
        grpc_target(service), options=[("grpc.max_receive_message_length", -1)]
    )
    call = bridge_pb2_grpc.VisualizationStub(channel).Subscribe(
        pb.SubscribeRequest(**request), metadata=(("authorization", f"Bearer {VIEWER}"),)
    )
    try:
        yield call
    finally:
        call.cancel()
        await channel.close()


@asynccontextmanager
async def edge_on(service: BridgeService, device: str) -> AsyncIterator[EdgeClient]:
    edge = EdgeClient("ws", ws_url(service), device, STREAMS)
    await edge.start()
    try:
        yield edge
    finally:
        await edge.close()


async def publish(edge: EdgeClient, frames: int, points: int = 200) -> None:
    for i in range(frames):
        await edge.publish("lidar", synthetic(points, seed=i).to_proto())
        await edge.publish("imu", {"ax": float(i)})


def followed_by_all(pod: Pod, viewers: int = 1) -> bool:
    """Every sibling of member 0 serves its internal calls (one per viewer on member 0)."""
    return all(len(m.subscribers) == viewers for m in pod.members[1:] if m is not None)


async def read_until(
    call: Any, done: Callable[[dict[tuple[str, str], list[int]]], bool], limit: float = 20
) -> dict[tuple[str, str], list[int]]:
    seqs: dict[tuple[str, str], list[int]] = {}

    async def read() -> None:
        while not done(seqs):
            frame = await call.read()
            assert frame is not grpc.aio.EOF, "the viewer's stream ended"
            assert not frame.HasField("gap"), frame.gap
            seqs.setdefault((frame.device_id, frame.stream_id), []).append(frame.seq)

    await asyncio.wait_for(read(), limit)
    return seqs


def through(last: int, keys: list[tuple[str, str]]) -> Callable[[dict[Any, list[int]]], bool]:
    return lambda seqs: all(seqs.get(k, [0])[-1] >= last for k in keys)


def keys_of(*devices: str) -> list[tuple[str, str]]:
    return [(d, s.stream_id) for d in devices for s in STREAMS]


async def test_a_viewer_on_one_process_sees_every_device_of_the_pod_once_in_order() -> None:
    frames = 15
    async with pod_of(3) as pod:
        a, b, c = pod.members
        assert a is not None and b is not None and c is not None
        async with viewer(a) as call, viewer(a, stream_ids=["imu"]) as imu_only:
            assert await wait_until(lambda: followed_by_all(pod, viewers=2)), "not followed"
            async with (
                edge_on(a, "dev-a") as ea,
                edge_on(b, "dev-b") as eb,
                edge_on(c, "dev-c") as ec,
            ):
                for edge in (ea, eb, ec):
                    await publish(edge, frames)
                keys = keys_of("dev-a", "dev-b", "dev-c")
                seqs = await read_until(call, through(frames, keys))
                imu_keys = [k for k in keys if k[1] == "imu"]
                imu_seqs = await read_until(imu_only, through(frames, imu_keys))
        assert set(seqs) == set(keys)
        for key in keys:
            assert seqs[key] == list(range(1, frames + 1)), key
        # The viewer's stream filter holds for the siblings' devices too.
        assert set(imu_seqs) == set(imu_keys)
        assert all(s == list(range(1, frames + 1)) for s in imu_seqs.values())
        # The internal calls passed without the viewer's token: the pod secret is theirs.
        assert metric(b, "bridge_unauthorized_requests_total", surface="subscribe") == 0


def internal_call(channel: grpc.aio.Channel, secret: str) -> Any:
    """Subscribe as a sibling does: the pod secret, no viewer token."""
    method: Any = channel.unary_stream(
        "/bridge.v1.Visualization/Subscribe",
        request_serializer=pb.SubscribeRequest.SerializeToString,
        response_deserializer=pb.ProcessedFrame.FromString,
    )
    return method(pb.SubscribeRequest(), metadata=((POD_SECRET_METADATA, secret),))


async def test_internal_calls_need_the_pod_secret_and_get_local_devices_only() -> None:
    async with pod_of(2) as pod:
        a, b = pod.members
        assert a is not None and b is not None
        async with grpc.aio.insecure_channel(grpc_target(a)) as channel:
            wrong = internal_call(channel, "0" * 32)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await asyncio.wait_for(wrong.read(), 5)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert metric(a, "bridge_unauthorized_requests_total", surface="pod") == 1
            assert len(a.subscribers) == 0

            # The right secret, no viewer token: served, and only this process's devices.
            inner = internal_call(channel, SECRET)
            assert await wait_until(lambda: len(a.subscribers) == 1)
            async with edge_on(a, "dev-a") as ea, edge_on(b, "dev-b") as eb:
                await publish(eb, 5)
                assert await eb.wait_delivered(10)
                await publish(ea, 5)
                seqs = await read_until(inner, through(5, keys_of("dev-a")))
            assert set(seqs) == set(keys_of("dev-a")), "an internal call relays no sibling"
            assert len(b.subscribers) == 0
            inner.cancel()


async def test_a_killed_sibling_stalls_nothing_and_is_dialled_again_when_back() -> None:
    async with pod_of(3) as pod:
        a, b, c = pod.members
        assert a is not None and b is not None and c is not None
        c_port = c.ports.grpc if c.ports else 0
        async with viewer(a) as call:
            assert await wait_until(lambda: followed_by_all(pod))
            await pod.kill(c)  # a's list still names it: its reader keeps failing
            async with edge_on(a, "dev-a") as ea, edge_on(b, "dev-b") as eb:
                await publish(ea, 10)
                await publish(eb, 10)
                seqs = await read_until(call, through(10, keys_of("dev-a", "dev-b")))
                assert all(s == list(range(1, 11)) for s in seqs.values())

                # Back on the same port: dialled again after the back-off.
                c2 = await pod.add(grpc_port=c_port)
                assert await wait_until(lambda: len(c2.subscribers) == 1)
                async with edge_on(c2, "dev-c2") as ec:
                    await publish(ec, 5)
                    seqs = await read_until(call, through(5, keys_of("dev-c2")))
                    assert seqs[("dev-c2", "lidar")] == list(range(1, 6))

                # Re-planned without it: its call ends, the others go on.
                pod.sources[id(a)].addresses = [grpc_target(b)]
                assert await wait_until(lambda: len(c2.subscribers) == 0)
                await publish(eb, 5)
                seqs = await read_until(call, through(15, keys_of("dev-b")))
                assert seqs[("dev-b", "lidar")] == list(range(11, 16))


async def test_a_slow_viewer_gets_exact_gaps_for_sibling_frames_without_slowing_others() -> None:
    async with pod_of(2) as pod:
        a, b = pod.members
        assert a is not None and b is not None
        async with viewer(a) as fast, viewer(a, queue_frames=2) as slow:
            assert await wait_until(lambda: followed_by_all(pod, viewers=2))
            async with edge_on(b, "dev-b") as eb:
                fast_seqs: list[int] = []

                async def read_fast() -> None:
                    while len(fast_seqs) < 30:
                        frame = await fast.read()
                        if frame.stream_id == "lidar":
                            fast_seqs.append(frame.seq)

                slow_sub = next(s for s in a.subscribers._subs if s.queue_frames == 2)
                most_frames = most_bytes = uncharged = 0

                async def sample() -> None:  # what A holds for the slow viewer, every ms
                    nonlocal most_frames, most_bytes, uncharged
                    while True:
                        most_frames = max(most_frames, len(slow_sub))
                        most_bytes = max(most_bytes, slow_sub.queued_bytes)
                        charged = a.governor.charged(Component.SUBSCRIBERS)
                        uncharged = max(uncharged, slow_sub.queued_bytes - charged)
                        await asyncio.sleep(0.001)

                reader = asyncio.create_task(read_fast())
                sampler = asyncio.create_task(sample())
                for _ in range(30):  # ~640 KB frames: far more than HTTP/2 buffers
                    await eb.publish("lidar", synthetic(40_000).to_proto())
                assert await eb.wait_delivered(20)
                await asyncio.wait_for(reader, 20)
                sampler.cancel()
                assert fast_seqs == list(range(1, 31)), "the slow viewer slowed the fast one"
                # Relayed frames meet the slow viewer's own bound on A (2 frames), not 30.
                assert 0 < most_frames <= 2, most_frames
                assert most_bytes <= 2 * 700_000, most_bytes  # ~640 KB each
                assert uncharged == 0, "queued relayed frames are charged to the governor"

                async def trickle() -> None:
                    while True:
                        await eb.publish("lidar", synthetic(100).to_proto())
                        await asyncio.sleep(0.05)

                trickler = asyncio.create_task(trickle())
                try:
                    seen: set[int] = set()
                    announced = 0
                    while not set(range(1, 32)) <= seen:
                        frame = await asyncio.wait_for(slow.read(), 10)
                        if frame.stream_id != "lidar":
                            continue
                        if frame.HasField("gap"):
                            assert frame.gap.reason == "slow_subscriber"
                            assert frame.gap.last_seq < frame.seq
                            covered = set(range(frame.gap.first_seq, frame.gap.last_seq + 1))
                            assert len(covered) == frame.gap.count
                            assert not covered & seen
                            seen |= covered
                            announced += frame.gap.count
                        assert frame.seq not in seen
                        seen.add(frame.seq)
                finally:
                    trickler.cancel()
                assert seen == set(range(1, max(seen) + 1)), "every frame received or announced"
                assert announced > 0
                dropped = metric(a, "bridge_subscriber_dropped_total") + metric(
                    b, "bridge_subscriber_dropped_total"
                )
                assert dropped >= announced


async def settled(get: Callable[[], Awaitable[Any]], ok: Callable[[Any], bool]) -> Any:
    """Poll ``get`` until ``ok`` holds for what it returns (15 s at most); returns it."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 15
    while not ok(got := await get()):
        assert loop.time() < deadline, got
        await asyncio.sleep(0.05)
    return got


async def test_viewers_of_a_real_pod_see_the_devices_of_both_processes() -> None:
    """``simbridge serve --processes 2`` (the supervisor, two ingest processes on one port pair):
    each viewer's call lands on one process, yet sees every device of both, each once, in order."""
    frames, viewers = 10, 3
    async with AsyncExitStack() as stack:
        proc = await BridgeProcess.start(
            "--ws-port=0", "--grpc-port=0", "--http-port=0", "--processes=2", "--passthrough"
        )
        stack.callback(proc.kill)

        async def per_process(name: str) -> list[float]:
            status, body = await http_get(proc.http, "/metrics")
            assert status == 200, body
            return [sum(scraped(body, name, process=str(i))) for i in range(2)]

        await settled(lambda: per_process("bridge_ready"), lambda r: r == [1, 1])
        edges: list[SdkEdge] = []
        while min(await per_process("bridge_sessions")) < 2:  # devices on both processes
            assert len(edges) < 32, "the kernel put every connection on one process"
            edge = SdkEdge(proc.ws_url, device_id=f"robot-{len(edges)}", streams=[SdkSpec("s")])
            edges.append(await stack.enter_async_context(edge))
            await settled(lambda: per_process("bridge_sessions"), lambda s: sum(s) == len(edges))
        calls = []
        for _ in range(viewers):  # one connection each: the kernel picks the process
            channel = grpc.aio.insecure_channel(f"127.0.0.1:{proc.grpc}")
            stack.push_async_callback(channel.close)
            stub = bridge_pb2_grpc.VisualizationStub(channel)
            calls.append(stub.Subscribe(pb.SubscribeRequest()))
        for call in calls:
            stack.callback(call.cancel)
        # Each viewer is a subscriber in both processes: its own, and its relay's.
        await settled(lambda: per_process("bridge_subscribers"), lambda s: s == [viewers] * 2)
        cloud = np.zeros((4, 3), np.float32)
        for edge in edges:
            for _ in range(frames):
                await edge.publish("s", cloud)
        keys = [(f"robot-{n}", "s") for n in range(len(edges))]
        for call in calls:
            seqs = await read_until(call, through(frames, keys))
            assert set(seqs) == set(keys)
            assert all(s == list(range(1, frames + 1)) for s in seqs.values()), seqs
