"""Clouds that declare many fields (issue 29, "cpu_dos fields") cost only their sender.

Validating a layout is Python work per field, and a field costs about ten bytes on the wire, so
a 2 MiB cloud can declare 150,000 of them: before the field count was bounded, each such frame
held the event loop for over a second (the cheap parse of its bytes was not the cost). A real
``simbridge serve`` gets such frames over WebSocket (whole, small, inside a FrameBatch) and gRPC
while a well-behaved edge publishes and ``/healthz`` is polled: every one is refused with
INVALID_LAYOUT to its sender only, the good edge loses nothing, and the probe never stalls.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from websockets.asyncio.client import connect

from bridge.protocol import wire
from bridge.v1 import bridge_pb2 as pb
from loadgen.clouds import synthetic
from loadgen.edge import EdgeClient, StreamConfig
from tests.integration.harness import BridgeProcess, RawGrpcEdge, hello

#: Fields in the large attack clouds (about 2 MiB on the wire) and in the small ones (below the
#: size at which the bridge keeps a cloud's points out of the parse).
LARGE_FIELDS = 150_000
SMALL_FIELDS = 4_000
#: The default ``max_cloud_fields``: clouds of exactly that many are legal, and the attacker
#: alternates two such layouts (each frame misses the stream's layout cache) in clouds large
#: enough (256 points, 67 KB) to take the path that keeps points out of the parse.
AT_LIMIT_FIELDS = 256
AT_LIMIT_FRAMES = 200
#: Generous for a loaded 2-core CI machine; the figures measured are in the commit message.
HEALTHZ_BOUND_S = 0.5
CPU_BOUND_S = 1.5

_CLOUD_KEY = wire.field_key(pb.Frame.DESCRIPTOR, "point_cloud")
_FRAME_KEY = wire.field_key(pb.EdgeMessage.DESCRIPTOR, "frame")
_BATCH_KEY = wire.field_key(pb.EdgeMessage.DESCRIPTOR, "batch")
_IN_BATCH_KEY = wire.field_key(pb.FrameBatch.DESCRIPTOR, "frames")


def many_field_cloud(n_fields: int, points: int = 1, prefix: str = "f") -> bytes:
    """A serialized PointCloud of x, y, z, then ``n_fields`` one-byte fields side by side
    (named ``prefix`` + a number), all zeros."""
    fields = [pb.PackedField(name=a, offset=4 * i, type=pb.FLOAT32) for i, a in enumerate("xyz")]
    fields += [
        pb.PackedField(name=f"{prefix}{i:x}", offset=12 + i, type=pb.UINT8) for i in range(n_fields)
    ]
    stride = 12 + n_fields
    cloud = pb.PointCloud(point_stride=stride, fields=fields, data=bytes(stride * points))
    return cloud.SerializeToString()


def _len_field(key: bytes, body: bytes) -> bytes:
    return key + wire.encode_varint(len(body)) + body


def frame_bytes(stream: str, seq: int, cloud: bytes) -> bytes:
    """A serialized Frame around an already serialized cloud (built once, sent many times)."""
    return pb.Frame(stream_id=stream, seq=seq).SerializeToString() + _len_field(_CLOUD_KEY, cloud)


def frame_message(stream: str, seq: int, cloud: bytes) -> bytes:
    return _len_field(_FRAME_KEY, frame_bytes(stream, seq, cloud))


def batch_message(stream: str, seqs: range, cloud: bytes) -> bytes:
    frames = b"".join(_len_field(_IN_BATCH_KEY, frame_bytes(stream, s, cloud)) for s in seqs)
    return _len_field(_BATCH_KEY, frames)


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process so far (its event loop and every thread)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    utime, stime = stat.rsplit(")", 1)[1].split()[11:13]
    return (int(utime) + int(stime)) / 100.0


async def healthz_latency(port: int) -> float:
    loop = asyncio.get_running_loop()
    started = loop.time()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    await writer.drain()
    head = await reader.readline()
    writer.close()
    assert head.split()[1] == b"200", head
    return loop.time() - started


async def poll_healthz(port: int, stop: asyncio.Event, latencies: list[float]) -> None:
    while not stop.is_set():
        latencies.append(await asyncio.wait_for(healthz_latency(port), 60))
        await asyncio.sleep(0.02)


def refusals(messages: list[pb.BridgeMessage]) -> list[tuple[int, bool, str]]:
    return [
        (m.error.seq, m.error.fatal, m.error.message)
        for m in messages
        if m.WhichOneof("kind") == "error" and m.error.code == pb.INVALID_LAYOUT
    ]


def legal_message(seq: int) -> bytes:
    frame = pb.Frame(stream_id="c", seq=seq, point_cloud=synthetic(16).to_proto())
    return pb.EdgeMessage(frame=frame).SerializeToString()


def accepted(messages: list[pb.BridgeMessage], seq: int) -> bool:
    """Whether an ack has taken ``seq``: the connection survived what came before it."""
    return any(
        s.accepted_seq >= seq
        for m in messages
        if m.WhichOneof("kind") == "ack"
        for s in m.ack.streams
    )


async def ws_attack(url: str, large: bytes, small: bytes) -> list[tuple[int, bool, str]]:
    """Large many-field frames (seq 1-4), small ones (5-8), a batch of two (9-10), then legal
    frames on the same connection: a small one (11), then clouds at the field limit."""
    async with connect(url, compression=None, max_size=None) as ws:
        await ws.send(hello("evil-ws", "c").SerializeToString())
        await ws.recv()
        for seq in range(1, 5):
            await ws.send(frame_message("c", seq, large))
        for seq in range(5, 9):
            await ws.send(frame_message("c", seq, small))
        await ws.send(batch_message("c", range(9, 11), small))
        await ws.send(legal_message(11))
        at_limit = [many_field_cloud(AT_LIMIT_FIELDS - 3, 256, prefix) for prefix in "ab"]
        last = 11 + AT_LIMIT_FRAMES
        for seq in range(12, last + 1):
            await ws.send(frame_message("c", seq, at_limit[seq % 2]))
        received: list[pb.BridgeMessage] = []
        while not accepted(received, last):
            raw = await asyncio.wait_for(ws.recv(decode=False), 60)
            received.append(pb.BridgeMessage.FromString(raw))
        return refusals(received)


async def grpc_attack(target: str, large: bytes) -> list[tuple[int, bool, str]]:
    """Large many-field frames (seq 1-4), then a legal one (5) on the same call."""
    edge = RawGrpcEdge(target)
    try:
        await edge.send(hello("evil-grpc", "c").SerializeToString())
        await edge.recv()
        for seq in range(1, 5):
            await edge.send(frame_message("c", seq, large))
        await edge.send(legal_message(5))
        received: list[pb.BridgeMessage] = []
        while not accepted(received, 5):
            msg = await edge.recv(timeout=60)
            assert msg is not None, "the bridge ended the call"
            received.append(msg)
        return refusals(received)
    finally:
        await edge.close()


async def test_many_field_clouds_are_refused_without_stalling_anyone() -> None:
    large, small = many_field_cloud(LARGE_FIELDS), many_field_cloud(SMALL_FIELDS)
    assert len(large) > 1 << 20 and len(small) < 64 << 10
    b = await BridgeProcess.start("--ws-port=0", "--grpc-port=0", "--http-port=0", "--workers=1")
    try:
        good = EdgeClient(
            "grpc", f"127.0.0.1:{b.grpc}", "good", [StreamConfig("s", passthrough=True)]
        )
        await good.start()
        stop = asyncio.Event()
        latencies: list[float] = []
        poller = asyncio.create_task(poll_healthz(b.http, stop, latencies))
        try:
            cpu_before = cpu_seconds(b.proc.pid)
            ws_refused, grpc_refused, _ = await asyncio.gather(
                ws_attack(b.ws_url, large, small),
                grpc_attack(f"127.0.0.1:{b.grpc}", large),
                publish_good(good),
            )
            cpu = cpu_seconds(b.proc.pid) - cpu_before
            assert await good.wait_delivered(30), str(good.stats.as_dict())
        finally:
            stop.set()
            with contextlib.suppress(asyncio.CancelledError):
                await poller
            await good.close()
        worst = max(latencies)
        print(f"bridge CPU {cpu:.2f} s, /healthz worst {worst * 1e3:.0f} ms of {len(latencies)}")
        assert sorted(seq for seq, _, _ in ws_refused) == list(range(1, 11))
        assert [seq for seq, _, _ in grpc_refused] == [1, 2, 3, 4]
        for _, fatal, message in ws_refused + grpc_refused:
            assert not fatal and "fields" in message, message
        assert good.stats.acked_delivered == 40, str(good.stats.as_dict())
        assert worst < HEALTHZ_BOUND_S, f"/healthz took {worst:.2f} s under the field flood"
        assert cpu < CPU_BOUND_S, f"the field flood cost the bridge {cpu:.2f} s of CPU"
    finally:
        b.kill()


async def publish_good(good: EdgeClient) -> None:
    for _ in range(40):
        await good.publish("s", synthetic(32).to_proto())
        await asyncio.sleep(0.02)
