"""Issue 33: a client written from docs/protocol.md alone (tests/support/protocol_client.py, the
generated messages and nothing else of the bridge) against a real ``simbridge serve`` with
authentication on (a shared edge token, per-device tokens and a viewer token), over both
transports: Hello, publish, acks, Subscribe, resume, and every refusal of §8 a client can
provoke, each with the Error code, WebSocket close code and gRPC status the document names."""

from __future__ import annotations

import ast
import asyncio
import hashlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from grpc import StatusCode as Status

from bridge.v1 import bridge_pb2 as pb
from tests.integration.harness import BridgeProcess, scraped, serve_process
from tests.support import protocol_client as pc
from tests.support.protocol_client import Edge, End, Refused, Sink, Viewer, cloud

EDGE_TOKEN, VIEWER_TOKEN = "edge-secret", "viewer-secret"
DEVICE_TOKENS = {"robot-1": "r1-secret", "robot-2": "r2-secret"}
MAX_FRAME = 256 * 1024
LIMITS = (
    f"--max-frame-bytes={MAX_FRAME}",
    "--max-points=1000",
    "--max-streams-per-session=4",
    "--max-batch-frames=4",
    "--max-telemetry-bytes=4096",
    "--max-telemetry-entries=8",
    "--hello-timeout-seconds=0.5",
    "--chunk-max-age-seconds=1",
    "--chunk-stall-seconds=1",
    "--chunk-check-interval-seconds=0.1",
    "--refused-decode-budget-bytes=16384",
    "--ack-interval-seconds=0.005",
)
# §8: how each fatal row ends a connection: (WebSocket close code, gRPC status)
MALFORMED = (1007, Status.INVALID_ARGUMENT)
VIOLATION = (1008, Status.FAILED_PRECONDITION)
HELLO_LATE = (1008, Status.DEADLINE_EXCEEDED)
OVERSIZE = (1009, Status.RESOURCE_EXHAUSTED)
EXHAUSTED = (1008, Status.RESOURCE_EXHAUSTED)
PENDING = (1013, Status.RESOURCE_EXHAUSTED)
UNAUTHENTICATED = (1008, Status.UNAUTHENTICATED)
HELLO_CODEC = (1008, Status.INVALID_ARGUMENT)
SUPERSEDED = (1001, Status.UNAVAILABLE)

Transport = str  # "ws" | "grpc"


def lidar(stream: str = "lidar", **kw: object) -> pb.StreamSpec:
    return pb.StreamSpec(stream_id=stream, kind=pb.POINT_CLOUD, passthrough=True, **kw)  # type: ignore[arg-type]


def imu() -> pb.StreamSpec:
    return pb.StreamSpec(stream_id="imu", kind=pb.TELEMETRY)


def points(n: int, seed: int = 0) -> pb.PointCloud:
    return cloud([(float(i + seed), float(i % 7), 0.5) for i in range(n)])


def opener(b: BridgeProcess, transport: Transport) -> pc.Opener:
    return pc.ws_opener(b.ws_url) if transport == "ws" else pc.grpc_opener(f"127.0.0.1:{b.grpc}")


def assert_end(end: End | None, transport: Transport, row: tuple[int, Status]) -> None:
    assert end is not None, "the connection did not end"
    if transport == "ws":
        assert end.ws_code == row[0], end
    else:
        assert end.grpc_code == row[1], end


@asynccontextmanager
async def bridge(tmp_path: Path, *extra: str) -> AsyncIterator[BridgeProcess]:
    """§2/§11: a shared edge token, per-device tokens (README: `DEVICE_ID sha256:HEX`) and a
    viewer token."""
    tokens = tmp_path / "device-tokens"
    digests = {d: hashlib.sha256(t.encode()).hexdigest() for d, t in DEVICE_TOKENS.items()}
    tokens.write_text("".join(f"{d} sha256:{h}\n" for d, h in digests.items()))
    async with serve_process(
        f"--auth-token={EDGE_TOKEN}",
        f"--viewer-token={VIEWER_TOKEN}",
        f"--device-tokens-file={tokens}",
        *LIMITS,
        *extra,
    ) as b:
        yield b


async def gauge_reaches(b: BridgeProcess, name: str, value: float, timeout: float = 10) -> bool:  # noqa: ASYNC109
    """Poll a gauge on /metrics (with the token) until it reaches ``value``: §11 names
    ``bridge_subscribers`` as the way to know a subscription is attached."""
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        reader, writer = await asyncio.open_connection("127.0.0.1", b.http)
        auth = f"Authorization: Bearer {EDGE_TOKEN}\r\n"
        writer.write(f"GET /metrics HTTP/1.0\r\nHost: x\r\n{auth}\r\n".encode())
        raw = await reader.read()
        writer.close()
        if sum(scraped(raw.decode().partition("\r\n\r\n")[2], name)) >= value:
            return True
        await asyncio.sleep(0.05)
    return False


def test_the_client_uses_nothing_of_the_bridge_but_the_generated_messages() -> None:
    source = Path(pc.__file__).read_text()
    imported = {
        node.module if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    bridge_modules = {m for m in imported if m and m.split(".")[0] == "bridge"}
    assert bridge_modules == {"bridge.v1"}, bridge_modules


# -- Hello, publish, acks, Subscribe, resume ---------------------------------------------------


@pytest.mark.parametrize("transport", ["ws", "grpc"])
async def test_publish_ack_subscribe_and_resume(tmp_path: Path, transport: Transport) -> None:
    sink = Sink(MAX_FRAME)
    await sink.start()
    try:
        async with bridge(tmp_path, f"--sink-address=127.0.0.1:{sink.port}") as b:
            await publish_and_resume(b, sink, transport)
    finally:
        await sink.stop()


async def publish_and_resume(b: BridgeProcess, sink: Sink, transport: Transport) -> None:
    target = f"127.0.0.1:{b.grpc}"
    viewer = Viewer(target, VIEWER_TOKEN, stream_ids=["lidar"], max_frame_bytes=MAX_FRAME)
    everything = Viewer(target, VIEWER_TOKEN, max_frame_bytes=MAX_FRAME)
    assert await viewer.subscribed() and await everything.subscribed()
    assert await gauge_reaches(b, "bridge_subscribers", 2)
    # The device proves its id with its own token: as the transport's bearer token over
    # WebSocket, in Hello.auth_token over gRPC (§1, §2).
    edge = Edge(
        "robot-1", [lidar(), imu()], DEVICE_TOKENS["robot-1"], token_in_hello=transport == "grpc"
    )
    connect = opener(b, transport)
    try:
        welcome = await edge.connect(connect)
        assert not welcome.resumed and welcome.session_id
        assert welcome.limits.max_frame_bytes == MAX_FRAME and welcome.limits.max_points == 1000
        assert welcome.limits.max_streams_per_session == 4
        assert (welcome.limits.max_batch_frames, welcome.limits.max_telemetry_bytes) == (4, 4096)
        assert {s.stream_id: (s.accepted_seq, s.delivered_seq) for s in welcome.streams} == {
            "lidar": (0, 0),
            "imu": (0, 0),
        }
        for i in range(5):
            await edge.publish("lidar", points(20, seed=i))
        await edge.publish("imu", pb.Telemetry(values={"speed": 1.5}))
        assert await edge.wait_delivered("lidar", 5) and await edge.wait_delivered("imu", 1)
        assert edge.errors == []
        delivered = [
            a.delivered_seq for ack in edge.acks for a in ack.streams if a.stream_id == "lidar"
        ]
        assert delivered == sorted(delivered), "§5: acks never go backwards"

        # Frames in flight when the connection drops: the edge keeps them until delivered.
        for i in range(5, 8):
            await edge.publish("lidar", points(20, seed=i))
        await edge.disconnect()
        resumed = await edge.connect(connect)  # §6: the token from the last Welcome
        assert resumed.resumed and resumed.session_id == welcome.session_id
        for i in range(8, 10):
            await edge.publish("lidar", points(20, seed=i))
        assert await edge.wait_delivered("lidar", 10)

        # §3: across connections, a seq at or below accepted_seq is a duplicate: dropped and
        # acknowledged again (this connection's first frame, so no SEQ_REGRESSION).
        await edge.disconnect()
        await edge.connect(connect)
        acks_before = len(edge.acks)
        duplicate = pb.Frame(stream_id="lidar", seq=10, point_cloud=points(3))
        await edge.send(pb.EdgeMessage(frame=duplicate))

        def lidar_acks() -> list[pb.StreamAck]:
            return [a for m in edge.acks[acks_before:] for a in m.streams if a.stream_id == "lidar"]

        assert await edge.wait(lambda: bool(lidar_acks())), "§3: a duplicate is acknowledged"
        again = lidar_acks()
        assert again and again[0].accepted_seq == 10 and again[0].delivered_seq == 10, again
        await edge.publish("lidar", points(20, seed=10))
        assert await edge.wait_delivered("lidar", 11)
        assert edge.errors == [] and edge.end is None
    finally:
        await edge.disconnect()
    # No duplicates and no false gaps anywhere downstream.
    assert sink.held[("robot-1", "lidar")] == list(range(1, 12))
    assert sink.held[("robot-1", "imu")] == [1]
    assert [f.seq for f in sink.frames if f.stream_id == "lidar"] == list(range(1, 12))
    assert not any(f.HasField("gap") for f in sink.frames)
    assert await edge.wait(lambda: len(viewer.frames) >= 11)
    assert [(f.device_id, f.stream_id, f.seq) for f in viewer.frames] == [
        ("robot-1", "lidar", seq) for seq in range(1, 12)
    ]
    assert not any(f.HasField("gap") for f in viewer.frames)
    assert [f.bridge_seq for f in viewer.frames] == sorted({f.bridge_seq for f in viewer.frames})
    assert {(f.stream_id, f.seq) for f in everything.frames} >= {("imu", 1), ("lidar", 11)}
    assert viewer.frames[0].point_cloud == points(20, seed=0), "passthrough keeps the cloud"
    # §11: the sink has acknowledged them all, so the bridge holds none to resume after.
    late = await subscribe_end(f"127.0.0.1:{b.grpc}", VIEWER_TOKEN, from_bridge_seq=1)
    assert late.grpc_code == Status.OUT_OF_RANGE, late
    await viewer.close()
    await everything.close()


async def subscribe_end(target: str, token: str, **kw: object) -> End:
    viewer = Viewer(target, token, **kw)  # type: ignore[arg-type]
    try:
        return await viewer.ended()
    finally:
        await viewer.close()


async def test_subscribe_refusals(tmp_path: Path) -> None:
    """§11: the viewer token only (not the edge's, not a device's), a request that does not
    parse, a from_bridge_seq beyond the newest (live), and the subscriber cap."""
    async with bridge(tmp_path, "--max-subscribers=1") as b:
        target = f"127.0.0.1:{b.grpc}"
        for token in ("", EDGE_TOKEN, DEVICE_TOKENS["robot-1"], "wrong"):
            end = await subscribe_end(target, token)
            assert end.grpc_code == Status.UNAUTHENTICATED, (token, end)
            assert end.details == "viewer bearer token required"
        end = await subscribe_end(target, VIEWER_TOKEN, request=b"\xff\xff\xff\xff")
        assert end.grpc_code == Status.INVALID_ARGUMENT, end
        # A from_bridge_seq beyond the newest has nothing to replay: live from now (§11).
        first = Viewer(target, VIEWER_TOKEN, from_bridge_seq=10**9)
        assert await first.subscribed()
        assert await gauge_reaches(b, "bridge_subscribers", 1)
        edge = Edge("live", [lidar()], EDGE_TOKEN)
        await edge.connect(pc.ws_opener(b.ws_url))
        await edge.publish("lidar", points(3))
        assert await edge.wait(lambda: [f.seq for f in first.frames] == [1])
        await edge.disconnect()
        end = await subscribe_end(target, VIEWER_TOKEN)
        assert end.grpc_code == Status.RESOURCE_EXHAUSTED and "too many subscribers" in end.details
        await first.close()


# -- §8: refusals that reject one input and keep the connection --------------------------------


def padded(frame: pb.Frame, size: int) -> pb.EdgeMessage:
    """``frame`` as an EdgeMessage of exactly ``size`` bytes (a long frame_id)."""
    message = pb.EdgeMessage(frame=frame)
    message.frame.point_cloud.frame_id = "p" * (size - message.ByteSize())
    while message.ByteSize() > size:  # the length prefixes grew by a byte or two
        message.frame.point_cloud.frame_id = message.frame.point_cloud.frame_id[:-1]
    assert message.ByteSize() == size
    return message


def zstd_header(content_size: int) -> bytes:
    """§4.1: a zstd frame that states its content size (8-byte field, single segment) and
    then holds garbage: it must be refused, after its declared size was counted."""
    return b"\x28\xb5\x2f\xfd\xe0" + content_size.to_bytes(8, "little") + b"\x00garbage"


async def refusal(edge: Edge, message: pb.EdgeMessage) -> pb.Error:
    seen = len(edge.errors)
    await edge.send(message)
    assert await edge.wait(lambda: len(edge.errors) > seen), f"no Error for {message}"
    error = edge.errors[seen]
    assert not error.fatal, error
    return error


@pytest.mark.parametrize("transport", ["ws", "grpc"])
async def test_refusals_that_keep_the_connection(tmp_path: Path, transport: Transport) -> None:
    async with bridge(tmp_path) as b:
        packed = lidar("packed", codec=pb.CODEC_ZSTD)
        edge = Edge("nonfatal", [lidar(), imu(), packed], EDGE_TOKEN, token_in_hello=True)
        viewer = Viewer(f"127.0.0.1:{b.grpc}", VIEWER_TOKEN, ["lidar"], max_frame_bytes=MAX_FRAME)
        assert await viewer.subscribed()
        assert await gauge_reaches(b, "bridge_subscribers", 1)
        await edge.connect(opener(b, transport))
        got: dict[str, tuple[int, str, int]] = {}

        async def expect(name: str, message: pb.EdgeMessage) -> None:
            error = await refusal(edge, message)
            got[name] = (error.code, error.stream_id, error.seq)

        def frame(stream: str, payload: pb.PointCloud | pb.Telemetry) -> pb.EdgeMessage:
            return pb.EdgeMessage(frame=edge.frame(stream, payload))

        await expect("unknown_stream", frame_msg("nope", 1, points(3)))
        bad = frame("lidar", points(3))
        bad.frame.point_cloud.point_stride = 0
        await expect("layout", bad)  # lidar 1
        await expect("payload_kind", frame("lidar", pb.Telemetry(values={"a": 1.0})))  # 2
        await expect("too_many_points", frame("lidar", points(1001)))  # 3
        await expect("seq_zero", frame_msg("lidar", 0, points(3)))
        await edge.publish("lidar", points(3))  # 4
        assert await edge.wait(lambda: edge.streams["lidar"].accepted >= 4)
        await expect("seq_repeat", frame_msg("lidar", 4, points(3)))
        await expect("telemetry", frame("imu", pb.Telemetry(blob=b"t" * 5000)))  # imu 1
        entries = {f"v{i}": float(i) for i in range(9)}
        await expect("telemetry_entries", frame("imu", pb.Telemetry(values=entries)))  # imu 2
        whole = edge.frame("lidar", points(50)).SerializeToString()  # 5
        await expect("chunk_too_large", chunk("lidar", 5, MAX_FRAME + 1, 0, whole[:10]))
        whole = edge.frame("lidar", points(50)).SerializeToString()  # 6
        await expect("chunk_sequence", chunk("lidar", 6, len(whole), 5, whole[5:20]))
        whole = edge.frame("lidar", points(50)).SerializeToString()  # 7
        await edge.send(chunk("lidar", 7, len(whole), 0, whole[:100]))
        await expect("chunk_abandoned", frame("lidar", points(3)))  # 8 arrives whole
        assert await edge.wait(lambda: edge.streams["lidar"].accepted >= 8)
        coded = cloud([(0.0, 0.0, 0.0)])
        coded.data = zstd_header(12 * 900)
        await expect("codec", frame("packed", coded))  # packed 1
        # One message of exactly max_frame_bytes passes the size check (and is accepted).
        exact = padded(edge.frame("lidar", points(3)), MAX_FRAME)  # 9
        await edge.send(exact)
        # §3.2: a chunked frame abandoned for its age is sent again (whole, here): no gap.
        whole = edge.frame("lidar", points(50)).SerializeToString()  # 10
        await expect("chunk_age", chunk("lidar", 10, len(whole), 0, whole[:100]))
        assert 10 in edge.streams["lidar"].unacked, "an abandoned frame is kept for a resend"
        await edge.send(pb.EdgeMessage(frame=edge.streams["lidar"].unacked[10]))
        await edge.publish("lidar", points(3))  # 11: the connection is still there
        assert await edge.wait(lambda: edge.streams["lidar"].accepted >= 11), edge.errors
        assert edge.end is None
        await edge.disconnect()
        # §8: a refused seq is given up: the next accepted frame announces it as a gap.
        assert await edge.wait(lambda: len(viewer.frames) >= 5)
        await viewer.close()
    gaps = [
        (
            f.seq,
            (f.gap.first_seq, f.gap.last_seq, f.gap.count, f.gap.reason)
            if f.HasField("gap")
            else None,
        )
        for f in viewer.frames
    ]
    assert gaps == [
        (4, (1, 3, 3, "upstream")),
        (8, (5, 7, 3, "upstream")),
        (9, None),
        (10, None),
        (11, None),
    ]
    C = pb  # the §8 codes
    assert got == {
        "unknown_stream": (C.UNKNOWN_STREAM, "nope", 1),
        "layout": (C.INVALID_LAYOUT, "lidar", 1),
        "payload_kind": (C.INVALID_LAYOUT, "lidar", 2),
        "too_many_points": (C.TOO_MANY_POINTS, "lidar", 3),
        "seq_zero": (C.SEQ_REGRESSION, "lidar", 0),
        "seq_repeat": (C.SEQ_REGRESSION, "lidar", 4),
        "telemetry": (C.TOO_LARGE, "imu", 1),
        "telemetry_entries": (C.TOO_LARGE, "imu", 2),
        "chunk_age": (C.CHUNK_ABANDONED, "lidar", 10),
        "chunk_too_large": (C.TOO_LARGE, "lidar", 5),
        "chunk_sequence": (C.CHUNK_SEQUENCE, "lidar", 6),
        "chunk_abandoned": (C.CHUNK_ABANDONED, "lidar", 7),
        "codec": (C.CODEC_ERROR, "packed", 1),
    }


def frame_msg(stream: str, seq: int, payload: pb.PointCloud) -> pb.EdgeMessage:
    return pb.EdgeMessage(frame=pb.Frame(stream_id=stream, seq=seq, point_cloud=payload))


def chunk(stream: str, seq: int, total: int, offset: int, data: bytes) -> pb.EdgeMessage:
    return pb.EdgeMessage(
        chunk=pb.FrameChunk(stream_id=stream, seq=seq, total_bytes=total, offset=offset, data=data)
    )


# -- §8: refusals that end the connection ------------------------------------------------------


async def refused_hello(connect: pc.Opener, edge: Edge) -> tuple[pb.Error | None, End | None]:
    with pytest.raises(Refused) as refused:
        await edge.connect(connect)
    return refused.value.error, refused.value.end


async def ended(edge: Edge, message: pb.EdgeMessage | bytes | str) -> tuple[pb.Error | None, End]:
    """Send ``message`` on a connected edge; the last Error before the end, and the end."""
    await edge.send(message)
    assert await edge.wait(lambda: edge.end is not None), "the connection did not end"
    assert edge.end is not None
    return (edge.errors[-1] if edge.errors else None), edge.end


def batch_with_a_65_field_frame() -> bytes:
    """§8 MALFORMED: a Frame of 65 top-level fields (an encoder writes each of its five once)."""
    frame = b"\x0a\x05lidar" + b"\x10\x01" * 64
    inner = b"\x0a" + bytes([len(frame)]) + frame
    return b"\x1a" + bytes([len(inner)]) + inner


@pytest.mark.parametrize("transport", ["ws", "grpc"])
async def test_refusals_that_end_the_connection(tmp_path: Path, transport: Transport) -> None:
    async with bridge(tmp_path) as b:
        connect = opener(b, transport)
        ends: dict[str, tuple[int | None, bool | None, End | None]] = {}

        def record(name: str, error: pb.Error | None, end: End | None) -> None:
            ends[name] = (error.code if error else None, error.fatal if error else None, end)

        async def connected(device: str, *specs: pb.StreamSpec) -> Edge:
            edge = Edge(device, specs or [lidar()], EDGE_TOKEN)
            await edge.connect(connect)
            return edge

        # Tokens (§2): wrong, missing, another device's; Hello.auth_token wins over the header.
        for name, token in (("wrong_token", "wrong"), ("no_token", "")):
            error, end = await refused_hello(connect, Edge("robot-9", [lidar()], token))
            assert (
                error is not None
                and error.message == "missing or wrong bearer token for this device"
            )
            record(name, error, end)
        other = Edge("robot-1", [lidar()], DEVICE_TOKENS["robot-2"], token_in_hello=True)
        record("other_device_token", *await refused_hello(connect, other))
        wrong_header = await connect("wrong", "robot-8")
        await wrong_header.send(Edge("robot-8", [lidar()], EDGE_TOKEN, token_in_hello=True).hello())
        welcome = await wrong_header.recv()
        assert welcome is not None and welcome.HasField("welcome"), welcome
        await wrong_header.close()

        # Session rules (§2, §6).
        early = await connect(EDGE_TOKEN, "")
        await early.send(frame_msg("lidar", 1, points(3)))
        messages, end = await early.until_end()
        record("frame_before_hello", messages[-1].error if messages else None, end)
        twice = await connected("twice")
        record("second_hello", *await ended(twice, twice.hello()))
        record("empty_device", *await refused_hello(connect, Edge("", [lidar()], EDGE_TOKEN)))
        owner = await connected("owner")
        thief = Edge("thief", [lidar()], EDGE_TOKEN)
        thief.session_id = owner.session_id
        record("foreign_resume_token", *await refused_hello(connect, thief))
        routed = await connect(EDGE_TOKEN, "robot-7")  # §1: the routing key names robot-7
        await routed.send(Edge("robot-6", [lidar()], EDGE_TOKEN).hello())
        messages, end = await routed.until_end()
        record("routing_key", messages[-1].error if messages else None, end)
        assert messages and "differs from the routing key" in messages[-1].error.message
        silent = await connect(EDGE_TOKEN, "")
        messages, end = await silent.until_end()
        record("no_hello", messages[-1].error if messages else None, end)
        assert messages and "no Hello within" in messages[-1].error.message
        twin = Edge("owner", [lidar()], EDGE_TOKEN)
        error, end = await refused_hello(connect, twin)
        assert error is not None and "device 'owner' has a live session" in error.message
        if transport == "grpc":
            assert end is not None and end.details == error.message, "§8: details = message"
        record("session_taken", error, end)
        assert owner.end is None, "a Hello without the token must not end the live session"
        twin.session_id = owner.session_id
        assert (await twin.connect(connect)).resumed
        assert await owner.wait(lambda: owner.end is not None)
        record("superseded", None, owner.end)
        await twin.disconnect()
        device = Edge("robot-2", [lidar()], DEVICE_TOKENS["robot-2"])
        await device.connect(connect)
        again = Edge("robot-2", [lidar()], DEVICE_TOKENS["robot-2"])
        assert (await again.connect(connect)).resumed, "§6: a device token proves the id"
        assert await device.wait(lambda: device.end is not None)
        record("device_takeover", None, device.end)
        await again.disconnect()

        # Hello contents (§2): too many streams, a codec the bridge cannot decode.
        many = Edge("many", [lidar(f"s{i}") for i in range(5)], EDGE_TOKEN)
        record("too_many_streams", *await refused_hello(connect, many))
        codec = Edge("codec", [lidar(codec=pb.CODEC_QUANTIZED)], EDGE_TOKEN)  # no step
        record("hello_codec", *await refused_hello(connect, codec))

        # Messages (§1, §3.1, §8).
        record("garbage", *await ended(await connected("garbage"), b"\xff\xff\xff\xff"))
        if transport == "ws":
            record("text", *await ended(await connected("text"), "hello"))
        wide = await connected("wide")
        record("wide_frame", *await ended(wide, batch_with_a_65_field_frame()))
        big = await connected("big")
        record("oversize", *await ended(big, padded(big.frame("lidar", points(3)), MAX_FRAME + 1)))
        oversize_details = big.end.details if big.end else ""
        batcher = await connected("batcher")
        frames = [batcher.frame("lidar", points(3)) for _ in range(5)]
        record("batch", *await ended(batcher, pb.EdgeMessage(batch=pb.FrameBatch(frames=frames))))

        # Chunks held with no frame completed for chunk_stall_seconds (§3.2).
        staller = await connected("staller")
        for seq in range(1, 20):
            whole = staller.frame("lidar", points(50)).SerializeToString()
            await staller.send(chunk("lidar", seq, len(whole), 0, whole[:100]))
            if await staller.wait(lambda: staller.end is not None, timeout=0.3):
                break
        record("chunks_stalled", staller.errors[-1] if staller.errors else None, staller.end)
        # Refused decodes beyond refused_decode_budget_bytes (§4.1).
        bomber = await connected("bomber", lidar(codec=pb.CODEC_ZSTD))
        for _ in range(10):
            coded = cloud([(0.0, 0.0, 0.0)])
            coded.data = zstd_header(12 * 900)
            await bomber.publish("lidar", coded)
            if await bomber.wait(lambda: bomber.end is not None, timeout=0.3):
                break
        record("decode_budget", bomber.errors[-1] if bomber.errors else None, bomber.end)
        # 10800 declared bytes a refusal: over the 16384 budget after two, the third is fatal.
        assert [(e.code, e.fatal) for e in bomber.errors] == [
            (pb.CODEC_ERROR, False),
            (pb.CODEC_ERROR, False),
            (pb.CODEC_ERROR, True),
        ]

    E = pb
    expected: dict[str, tuple[int | None, tuple[int, Status]]] = {
        "wrong_token": (E.UNAUTHENTICATED, UNAUTHENTICATED),
        "no_token": (E.UNAUTHENTICATED, UNAUTHENTICATED),
        "other_device_token": (E.UNAUTHENTICATED, UNAUTHENTICATED),
        "frame_before_hello": (E.PROTOCOL_VIOLATION, VIOLATION),
        "second_hello": (E.PROTOCOL_VIOLATION, VIOLATION),
        "empty_device": (E.PROTOCOL_VIOLATION, VIOLATION),
        "foreign_resume_token": (E.PROTOCOL_VIOLATION, VIOLATION),
        "routing_key": (E.PROTOCOL_VIOLATION, VIOLATION),
        "no_hello": (E.PROTOCOL_VIOLATION, HELLO_LATE),
        "session_taken": (E.UNAUTHENTICATED, UNAUTHENTICATED),
        "superseded": (None, SUPERSEDED),
        "device_takeover": (None, SUPERSEDED),
        "too_many_streams": (E.TOO_MANY_STREAMS, EXHAUSTED),
        "hello_codec": (E.CODEC_ERROR, HELLO_CODEC),
        "garbage": (E.MALFORMED, MALFORMED),
        "wide_frame": (E.MALFORMED, MALFORMED),
        "oversize": (None, OVERSIZE),  # no Error message
        "batch": (E.TOO_LARGE, OVERSIZE),
        "chunks_stalled": (E.CHUNK_ABANDONED, EXHAUSTED),
        "decode_budget": (E.CODEC_ERROR, EXHAUSTED),
    }
    if transport == "ws":  # the Error before the close: test_a_text_message_gets_an_error
        assert_end(ends.pop("text")[2], transport, MALFORMED)
    for name, (code, row) in expected.items():
        error_code, fatal, end = ends[name]
        assert error_code == code, (name, error_code, end)
        assert fatal in ((None,) if code is None else (True,)), (name, fatal)
        assert_end(end, transport, row)
    if transport == "grpc":
        assert oversize_details == f"message of {MAX_FRAME + 1} bytes exceeds max {MAX_FRAME}"


async def test_a_text_message_gets_an_error_before_the_close(tmp_path: Path) -> None:
    async with bridge(tmp_path) as b:
        edge = Edge("text", [lidar()], EDGE_TOKEN)
        await edge.connect(opener(b, "ws"))
        error, end = await ended(edge, "hello")
        assert_end(end, "ws", MALFORMED)
        assert error is not None and error.code == pb.MALFORMED and error.fatal


# -- §8: capacity ------------------------------------------------------------------------------


@pytest.mark.parametrize("transport", ["ws", "grpc"])
async def test_session_and_pending_connection_caps(tmp_path: Path, transport: Transport) -> None:
    """``max_sessions`` attached sessions (TOO_MANY_SESSIONS, close 1008) and
    ``max_pending_connections`` connections waiting for their Hello (close 1013)."""
    caps = ("--max-sessions=1", "--max-pending-connections=2", "--hello-timeout-seconds=5")
    async with bridge(tmp_path, *caps) as b:
        connect = opener(b, transport)
        first = Edge("first", [lidar()], EDGE_TOKEN)
        await first.connect(connect)
        error, end = await refused_hello(connect, Edge("second", [lidar()], EDGE_TOKEN))
        assert error is not None and error.code == pb.TOO_MANY_SESSIONS and error.fatal
        assert_end(end, transport, EXHAUSTED)
        assert first.end is None
        await first.disconnect()

        waiting = [await connect(EDGE_TOKEN, "") for _ in range(2)]  # no Hello yet
        assert await gauge_reaches(b, "bridge_pending_connections", 2)
        silent = await connect(EDGE_TOKEN, "")  # one more, with nothing in flight
        messages, end = await silent.until_end()
        assert [(m.error.code, m.error.fatal) for m in messages] == [(pb.TOO_MANY_SESSIONS, True)]
        assert_end(end, transport, PENDING)
        error, end = await refused_hello(connect, Edge("third", [lidar()], EDGE_TOKEN))
        assert error is not None and error.code == pb.TOO_MANY_SESSIONS and error.fatal, error
        if end is None or end.grpc_code != Status.INTERNAL:  # §2: its Hello was in flight
            assert_end(end, transport, PENDING)
        for conn in waiting:
            await conn.close()
