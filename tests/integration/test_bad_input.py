"""Bad input over both transports: a clear error to that sender only, a metric, and nothing
changes for a well-behaved session publishing alongside."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import grpc
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from bridge.server.app import BridgeService
from bridge.v1 import bridge_pb2 as pb
from loadgen.clouds import synthetic
from loadgen.edge import EdgeClient, StreamConfig
from tests.integration.harness import (
    RawGrpcEdge,
    cloud_frame,
    grpc_target,
    hello,
    metric,
    running_bridge,
    wait_until,
    ws_url,
)

MAX_FRAME = 64 * 1024


@dataclass
class Bystander:
    edge: EdgeClient
    sent: int = 0

    async def publish(self, n: int) -> None:
        for _ in range(n):
            await self.edge.publish("lidar", synthetic(50).to_proto())
            self.sent += 1


@pytest.fixture
async def bridge() -> AsyncIterator[BridgeService]:
    async with running_bridge(
        max_frame_bytes=MAX_FRAME, max_points=100, max_streams_per_session=2, max_sessions=2
    ) as service:
        yield service


@pytest.fixture
async def bystander(bridge: BridgeService) -> AsyncIterator[Bystander]:
    edge = EdgeClient(
        "grpc", grpc_target(bridge), "good", [StreamConfig("lidar", passthrough=True)]
    )
    await edge.start()
    by = Bystander(edge)
    await by.publish(5)
    yield by
    await by.publish(5)
    assert await edge.wait_delivered(10), "the well-behaved session lost nothing"
    assert edge.stats.disconnects == 0 and not edge.stats.errors
    await edge.close()


def oversized_points() -> bytes:
    return pb.EdgeMessage(frame=cloud_frame("lidar", 1, n=101)).SerializeToString()


def frame_with(mutate: Callable[[pb.Frame], None]) -> bytes:
    frame = cloud_frame("lidar", 1, n=4)
    mutate(frame)
    return pb.EdgeMessage(frame=frame).SerializeToString()


def _overlap(f: pb.Frame) -> None:
    f.point_cloud.fields[1].offset = 2


def _exceed_stride(f: pb.Frame) -> None:
    f.point_cloud.fields[2].offset = 10


def _ragged(f: pb.Frame) -> None:
    f.point_cloud.data = f.point_cloud.data[:-3]


def _no_z(f: pb.Frame) -> None:
    del f.point_cloud.fields[2]


def _unknown_stream(f: pb.Frame) -> None:
    f.stream_id = "nope"


# (id, first message after a valid Hello, expected Error code, metric reason)
NON_FATAL = [
    ("unknown-stream", frame_with(_unknown_stream), pb.UNKNOWN_STREAM, "unknown_stream"),
    ("fields-overlap", frame_with(_overlap), pb.INVALID_LAYOUT, "invalid_layout"),
    ("field-exceeds-stride", frame_with(_exceed_stride), pb.INVALID_LAYOUT, "invalid_layout"),
    ("data-not-multiple-of-stride", frame_with(_ragged), pb.INVALID_LAYOUT, "invalid_layout"),
    ("missing-z", frame_with(_no_z), pb.INVALID_LAYOUT, "invalid_layout"),
    ("too-many-points", oversized_points(), pb.TOO_MANY_POINTS, "too_many_points"),
]


async def ws_exchange(url: str, *messages: bytes) -> tuple[list[pb.BridgeMessage], int | None]:
    """Send messages, collect replies until the bridge closes or goes quiet."""
    replies: list[pb.BridgeMessage] = []
    async with connect(url, max_size=None, compression=None) as ws:
        for m in messages:
            await ws.send(m)
        try:
            while True:
                raw = await ws.recv(decode=False)
                replies.append(pb.BridgeMessage.FromString(raw))
                if replies[-1].WhichOneof("kind") == "error" and not replies[-1].error.fatal:
                    break
        except ConnectionClosed as exc:
            return replies, exc.rcvd.code if exc.rcvd else None
        except TimeoutError:
            pass
    return replies, None


HELLO = hello("bad", "lidar").SerializeToString()
FRAME_FIRST = pb.EdgeMessage(frame=cloud_frame("a", 1)).SerializeToString()
THREE_STREAMS = hello("x", "a", "b", "c").SerializeToString()
GARBAGE = b"\xff\xff\xff\xff garbage"
TOO_BIG = b"\x00" * (MAX_FRAME + 1)


@pytest.mark.parametrize(
    ("case", "raw", "code", "reason"), NON_FATAL, ids=[c[0] for c in NON_FATAL]
)
async def test_ws_frame_errors_are_reported_and_the_session_continues(
    bridge: BridgeService, bystander: Bystander, case: str, raw: bytes, code: int, reason: str
) -> None:
    async with connect(ws_url(bridge), max_size=None, compression=None) as ws:
        await ws.send(HELLO)
        welcome = pb.BridgeMessage.FromString(await ws.recv(decode=False))
        assert welcome.WhichOneof("kind") == "welcome"
        await ws.send(raw)
        reply = pb.BridgeMessage.FromString(await ws.recv(decode=False))
        assert reply.WhichOneof("kind") == "error", case
        assert reply.error.code == code and not reply.error.fatal and reply.error.message
        # The connection stays usable: a valid frame is accepted afterwards.
        await ws.send(pb.EdgeMessage(frame=cloud_frame("lidar", 1)).SerializeToString())
        while True:
            msg = pb.BridgeMessage.FromString(await ws.recv(decode=False))
            if msg.WhichOneof("kind") == "ack" and msg.ack.streams[0].accepted_seq == 1:
                break
    assert metric(bridge, "bridge_rejected_messages_total", transport="ws", reason=reason) == 1
    await bystander.publish(3)


async def test_ws_seq_going_backwards_is_an_error(
    bridge: BridgeService, bystander: Bystander
) -> None:
    async with connect(ws_url(bridge), max_size=None, compression=None) as ws:
        await ws.send(HELLO)
        await ws.recv()
        for seq in (1, 2, 1):
            await ws.send(pb.EdgeMessage(frame=cloud_frame("lidar", seq)).SerializeToString())
        while True:
            msg = pb.BridgeMessage.FromString(await ws.recv(decode=False))
            if msg.WhichOneof("kind") == "error":
                break
        assert msg.error.code == pb.SEQ_REGRESSION and msg.error.seq == 1
    assert (
        metric(bridge, "bridge_rejected_messages_total", transport="ws", reason="seq_regression")
        == 1
    )


FATAL_WS = [
    ("garbage-bytes", [GARBAGE], 1007, "malformed"),
    ("frame-before-hello", [FRAME_FIRST], 1008, "protocol_violation"),
    ("too-many-streams", [THREE_STREAMS], 1008, "too_many_streams"),
    ("above-max-size", [HELLO, TOO_BIG], 1009, "too_large"),
    ("text-message", ["not binary"], 1007, "malformed"),
]


@pytest.mark.parametrize(
    ("case", "messages", "close", "reason"), FATAL_WS, ids=[c[0] for c in FATAL_WS]
)
async def test_ws_fatal_errors_close_with_the_right_code(
    bridge: BridgeService,
    bystander: Bystander,
    case: str,
    messages: list[bytes],
    close: int,
    reason: str,
) -> None:
    async with connect(ws_url(bridge), max_size=None, compression=None) as ws:
        for m in messages:
            await ws.send(m)
        with pytest.raises(ConnectionClosed) as info:
            while True:
                await ws.recv()
    assert info.value.rcvd is not None and info.value.rcvd.code == close, case
    assert await wait_until(
        lambda: metric(bridge, "bridge_rejected_messages_total", transport="ws", reason=reason) == 1
    )


async def test_too_many_sessions(bridge: BridgeService, bystander: Bystander) -> None:
    async with connect(ws_url(bridge), compression=None) as first:
        await first.send(hello("second", "lidar").SerializeToString())
        await first.recv()  # Welcome: two sessions now (with the bystander)
        async with connect(ws_url(bridge), compression=None) as third:
            await third.send(hello("third", "lidar").SerializeToString())
            error = pb.BridgeMessage.FromString(await third.recv(decode=False))
            assert error.error.code == pb.TOO_MANY_SESSIONS and error.error.fatal
            with pytest.raises(ConnectionClosed) as info:
                await third.recv()
            assert info.value.rcvd is not None and info.value.rcvd.code == 1008
        grpc_edge = RawGrpcEdge(grpc_target(bridge))
        await grpc_edge.send(hello("fourth", "lidar").SerializeToString())
        assert await grpc_edge.status() == grpc.StatusCode.RESOURCE_EXHAUSTED
        await grpc_edge.close()
    assert (
        metric(bridge, "bridge_rejected_messages_total", transport="ws", reason="too_many_sessions")
        == 1
    )
    assert (
        metric(
            bridge, "bridge_rejected_messages_total", transport="grpc", reason="too_many_sessions"
        )
        == 1
    )


Status = grpc.StatusCode
GRPC_FATAL = [
    ("garbage-bytes", [GARBAGE], Status.INVALID_ARGUMENT, "malformed"),
    ("frame-before-hello", [FRAME_FIRST], Status.FAILED_PRECONDITION, "protocol_violation"),
    ("too-many-streams", [THREE_STREAMS], Status.RESOURCE_EXHAUSTED, "too_many_streams"),
    ("above-max-size", [HELLO, TOO_BIG], Status.RESOURCE_EXHAUSTED, "too_large"),
]


@pytest.mark.parametrize(
    ("case", "messages", "status", "reason"), GRPC_FATAL, ids=[c[0] for c in GRPC_FATAL]
)
async def test_grpc_fatal_errors_end_the_call_with_the_right_status(
    bridge: BridgeService,
    bystander: Bystander,
    case: str,
    messages: list[bytes],
    status: grpc.StatusCode,
    reason: str,
) -> None:
    edge = RawGrpcEdge(grpc_target(bridge))
    for m in messages:
        await edge.send(m)
    assert await edge.status() == status, case
    await edge.close()
    assert metric(bridge, "bridge_rejected_messages_total", transport="grpc", reason=reason) == 1


@pytest.mark.parametrize(
    ("case", "raw", "code", "reason"), NON_FATAL, ids=[c[0] for c in NON_FATAL]
)
async def test_grpc_frame_errors_are_reported_as_error_messages(
    bridge: BridgeService, bystander: Bystander, case: str, raw: bytes, code: int, reason: str
) -> None:
    edge = RawGrpcEdge(grpc_target(bridge))
    await edge.send(HELLO)
    welcome = await edge.recv()
    assert welcome is not None and welcome.WhichOneof("kind") == "welcome"
    await edge.send(raw)
    reply = await edge.recv()
    assert reply is not None and reply.WhichOneof("kind") == "error", case
    assert reply.error.code == code and not reply.error.fatal
    await edge.close()
    assert metric(bridge, "bridge_rejected_messages_total", transport="grpc", reason=reason) == 1


async def test_bearer_token_required_when_configured() -> None:
    async with running_bridge(auth_token="s3cret") as bridge:
        async with connect(ws_url(bridge), compression=None) as ws:
            await ws.send(hello("anon", "lidar").SerializeToString())
            error = pb.BridgeMessage.FromString(await ws.recv(decode=False))
            assert error.error.code == pb.UNAUTHENTICATED
            with pytest.raises(ConnectionClosed):
                await ws.recv()
        grpc_edge = RawGrpcEdge(grpc_target(bridge))
        await grpc_edge.send(hello("anon", "lidar").SerializeToString())
        assert await grpc_edge.status() == grpc.StatusCode.UNAUTHENTICATED
        await grpc_edge.close()
        headers = {"Authorization": "Bearer s3cret"}
        async with connect(ws_url(bridge), compression=None, additional_headers=headers) as ws:
            await ws.send(hello("header", "lidar").SerializeToString())
            assert pb.BridgeMessage.FromString(await ws.recv(decode=False)).HasField("welcome")
        token_edge = EdgeClient(
            "grpc", grpc_target(bridge), "token", [StreamConfig("lidar")], auth_token="s3cret"
        )
        await token_edge.start()
        await token_edge.close()
        assert (
            metric(
                bridge, "bridge_rejected_messages_total", transport="ws", reason="unauthenticated"
            )
            == 1
        )
