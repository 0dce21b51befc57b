"""A large WebSocket payload reaches the ``websockets`` parser in one piece, whatever the reads,
or (a whole binary message) skips the parser altogether.

Why it matters: the parser keeps unread bytes in a bytearray grown by reallocation, so a 1 MB frame
handed over read by read (at most 256 KiB each) was copied several times before the bridge saw it;
and its read and unmask are two more copies of the payload. What the parser is fed is seen at its
public door, ``ServerProtocol.receive_data``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from websockets.asyncio.client import connect
from websockets.server import ServerProtocol

from bridge.v1 import bridge_pb2 as pb
from tests.integration.harness import cloud_frame, hello, running_bridge, wait_until, ws_url

POINTS = 100_000  # 1.2 MB of x, y, z


@pytest.fixture
def server_pieces(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The sizes of what the bridge's server-side parsers were fed, call by call."""
    sizes: list[int] = []
    original = ServerProtocol.receive_data

    def spy(self: ServerProtocol, data: Any) -> None:
        sizes.append(len(data))
        original(self, data)

    monkeypatch.setattr(ServerProtocol, "receive_data", spy)
    yield sizes


async def test_large_frames_arrive_intact_without_the_parser(
    server_pieces: list[int], ws_received: list[bytes]
) -> None:
    """A whole large binary message is collected, unmasked and queued by the adapter itself
    (``GovernedConnection._bypassable``, ``Payload``): the parser never holds its payload."""
    frames = [cloud_frame("lidar", seq, n=POINTS) for seq in (1, 2)] + [cloud_frame("lidar", 3)]
    wire = [pb.EdgeMessage(frame=f).SerializeToString() for f in frames]
    async with (
        running_bridge() as bridge,
        connect(ws_url(bridge), max_size=None, compression=None) as ws,
    ):
        await ws.send(hello("dev", "lidar").SerializeToString())
        welcome = pb.BridgeMessage.FromString(await ws.recv(decode=False))
        assert welcome.WhichOneof("kind") == "welcome"
        for message in wire:  # back to back: a read ends one frame and starts the next
            await ws.send(message)
        assert await wait_until(lambda: len(ws_received) == 4, timeout=20)
    assert ws_received[1:] == wire  # what ingest got is what was sent, byte for byte
    big = [n for n in server_pieces if n >= len(frames[0].point_cloud.data) // 4]
    assert not big, f"large payloads reached the parser: {server_pieces}"


async def test_a_fragmented_large_message_arrives_whole(
    server_pieces: list[int], ws_received: list[bytes]
) -> None:
    """Each large fragment is collected on its own; websockets joins the fragments."""
    message = pb.EdgeMessage(frame=cloud_frame("lidar", 1, n=POINTS)).SerializeToString()
    third = len(message) // 3
    fragments = [message[:third], message[third : 2 * third], message[2 * third :]]
    async with (
        running_bridge() as bridge,
        connect(ws_url(bridge), max_size=None, compression=None) as ws,
    ):
        await ws.send(hello("dev", "lidar").SerializeToString())
        await ws.recv(decode=False)
        await ws.send(fragments)  # one message in three frames
        await ws.send(pb.EdgeMessage(frame=cloud_frame("lidar", 2)).SerializeToString())
        assert await wait_until(lambda: len(ws_received) == 3, timeout=20)
    assert ws_received[1] == message
    assert sum(1 for n in server_pieces if n >= third) == 3
