"""One size rule on both transports (issue 29): an EdgeMessage above ``max_frame_bytes`` is
refused the same way over WebSocket and gRPC, and one at the limit is accepted on both.

Before, gRPC's receive cap was ``max_frame_bytes`` + 64 KiB and a large plain cloud took the
split path, which never compared the message with the limit: a 144 KB cloud against a
131,072-byte limit was accepted over gRPC while WebSocket closed with 1009."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from bridge.protocol.errors import WIRE, FrameTooLarge
from bridge.server.app import BridgeService
from bridge.v1 import bridge_pb2 as pb
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

MAX_FRAME = 131_072
TOO_LARGE = WIRE[FrameTooLarge.reason]


def cloud_message(size: int, seq: int) -> tuple[str, bytes]:
    """(stream id, an EdgeMessage{frame} of exactly ``size`` bytes carrying a plain cloud);
    the stream id's length makes up what whole 12-byte points cannot."""
    n = (size - 64) // 12  # ~44 bytes of framing, the rest a stream id of 8 to 20 characters
    for stream_len in range(1, 32):
        stream = "s" * stream_len
        raw = pb.EdgeMessage(frame=cloud_frame(stream, seq, n=n)).SerializeToString()
        if len(raw) == size:
            return stream, raw
    raise AssertionError(f"no cloud of exactly {size} bytes")


AT_LIMIT = cloud_message(MAX_FRAME, seq=1)
OVER_LIMIT = cloud_message(MAX_FRAME + 1, seq=2)
FAR_OVER = cloud_message(144_067, seq=2)  # the size measured in the issue


@pytest.fixture
async def bridge() -> AsyncIterator[BridgeService]:
    async with running_bridge(max_frame_bytes=MAX_FRAME) as service:
        yield service


def accepted(bridge: BridgeService) -> float:
    return metric(bridge, "bridge_frames_accepted_total")


def rejected(bridge: BridgeService, transport: str) -> float:
    return metric(
        bridge, "bridge_rejected_messages_total", transport=transport, reason=FrameTooLarge.reason
    )


def hello_for(device: str, stream: str) -> bytes:
    """A Hello declaring the stream of the cloud at the limit and ``stream``."""
    return hello(device, AT_LIMIT[0], stream).SerializeToString()


async def ws_send(bridge: BridgeService, device: str, stream: str, over: bytes) -> int:
    """Hello, a cloud at the limit, then ``over``: the close code the bridge sent."""
    async with connect(ws_url(bridge), compression=None) as ws:
        await ws.send(hello_for(device, stream))
        assert pb.BridgeMessage.FromString(await ws.recv(decode=False)).HasField("welcome")
        await ws.send(AT_LIMIT[1])
        assert await wait_until(lambda: accepted(bridge) >= 1)
        await ws.send(over)
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                await asyncio.wait_for(ws.recv(), 5)
    assert closed.value.rcvd is not None
    return closed.value.rcvd.code


async def grpc_send(
    bridge: BridgeService, device: str, stream: str, over: bytes, before: float
) -> tuple[grpc.StatusCode, str]:
    edge = RawGrpcEdge(grpc_target(bridge))
    try:
        await edge.send(hello_for(device, stream))
        welcome = await edge.recv()
        assert welcome is not None and welcome.HasField("welcome")
        await edge.send(AT_LIMIT[1])
        assert await wait_until(lambda: accepted(bridge) >= before + 1)
        await edge.send(over)
        try:
            status = await edge.status()
        except TimeoutError:
            pytest.fail(f"the call stayed open: {accepted(bridge) - before:g} frames accepted")
        return status, await edge.call.details() or ""
    finally:
        await edge.close()


@pytest.mark.parametrize("over", [OVER_LIMIT, FAR_OVER], ids=["one-byte-over", "144067-bytes"])
async def test_a_message_above_max_frame_bytes_is_refused_alike_on_both_transports(
    bridge: BridgeService, over: tuple[str, bytes]
) -> None:
    stream, raw = over
    assert len(raw) > MAX_FRAME

    code = await ws_send(bridge, "ws-edge", stream, raw)
    assert code == TOO_LARGE.ws_close == 1009
    assert accepted(bridge) == 1  # the cloud at the limit, not the one above
    assert await wait_until(lambda: rejected(bridge, "ws") == 1)

    status, details = await grpc_send(bridge, "grpc-edge", stream, raw, before=1)
    assert status == grpc.StatusCode[TOO_LARGE.grpc_status] == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert f"message of {len(raw)} bytes exceeds max {MAX_FRAME}" in details
    assert accepted(bridge) == 2
    assert rejected(bridge, "grpc") == 1
