"""Small whole binary messages skip websockets' frame parser; everything else still uses it.

Why: at 1 KB a message, the parser pass was about half of the WebSocket adapter's cost per
message (``GovernedConnection._direct``). The frames below are written straight to the client's
transport, several to one write, so a test controls exactly what one server read holds: masking,
reserved bits, fragments and pings between messages.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed
from websockets.frames import Frame, Opcode
from websockets.protocol import Protocol, Side

from bridge.v1 import bridge_pb2 as pb
from tests.integration.harness import cloud_frame, hello, running_bridge, wait_until, ws_url


@pytest.fixture
def parsed(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[bytes]]:
    """Every byte string the bridge's server-side parsers were fed."""
    fed: list[bytes] = []
    original = Protocol.receive_data

    def spy(self: Protocol, data: Any) -> None:
        if self.side is Side.SERVER:
            fed.append(bytes(data))
        original(self, data)

    monkeypatch.setattr(Protocol, "receive_data", spy)
    yield fed


@pytest.fixture
def pongs(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[bytes]]:
    """Payloads of the pongs the bridge sent."""
    sent: list[bytes] = []
    original = Protocol.send_frame

    def spy(self: Protocol, frame: Frame) -> None:
        if self.side is Side.SERVER and frame.opcode is Opcode.PONG:
            sent.append(bytes(frame.data))
        original(self, frame)

    monkeypatch.setattr(Protocol, "send_frame", spy)
    yield sent


def client_frame(opcode: Opcode, data: bytes, *, fin: bool = True, mask: bool = True) -> bytes:
    return Frame(opcode, data, fin=fin).serialize(mask=mask, extensions=[])


def messages(*seqs: int) -> list[bytes]:
    return [pb.EdgeMessage(frame=cloud_frame("lidar", s)).SerializeToString() for s in seqs]


async def welcomed(ws: ClientConnection) -> None:
    await ws.send(hello("dev", "lidar").SerializeToString())
    welcome = pb.BridgeMessage.FromString(await ws.recv(decode=False))
    assert welcome.WhichOneof("kind") == "welcome"


async def test_small_binary_messages_reach_ingest_without_the_parser(
    parsed: list[bytes], ws_received: list[bytes]
) -> None:
    wire = messages(1, 2, 3)
    async with (
        running_bridge() as bridge,
        connect(ws_url(bridge), compression=None) as ws,
    ):
        await welcomed(ws)
        parsed.clear()
        ws.transport.write(b"".join(client_frame(Opcode.BINARY, m) for m in wire))  # one read
        assert await wait_until(lambda: len(ws_received) == 4, timeout=10)
    assert ws_received[1:] == wire  # unmasked right, in order, byte for byte
    fed = sum(map(len, parsed))
    assert fed < min(map(len, wire)), f"the parser was fed {fed} B of these messages"


async def test_pings_and_fragments_between_messages_keep_their_place(
    parsed: list[bytes], ws_received: list[bytes], pongs: list[bytes]
) -> None:
    first, fragmented, last = messages(1, 2, 3)
    half = len(fragmented) // 2
    one_read = b"".join(
        [
            client_frame(Opcode.BINARY, first),
            client_frame(Opcode.PING, b"are you there"),
            client_frame(Opcode.BINARY, fragmented[:half], fin=False),
            client_frame(Opcode.CONT, fragmented[half:]),
            client_frame(Opcode.BINARY, last),
        ]
    )
    async with (
        running_bridge() as bridge,
        connect(ws_url(bridge), compression=None) as ws,
    ):
        await welcomed(ws)
        parsed.clear()
        ws.transport.write(one_read)
        assert await wait_until(lambda: len(ws_received) == 4, timeout=10)
        assert await wait_until(lambda: pongs == [b"are you there"], timeout=5)
    assert ws_received[1:] == [first, fragmented, last]
    # The parser had the fragments and the ping (headers: a few bytes each), not the others.
    fed = sum(map(len, parsed))
    assert len(fragmented) <= fed < len(fragmented) + min(len(first), len(last)), fed


@pytest.mark.parametrize(
    ("case", "code"),
    [("unmasked", 1002), ("reserved bit", 1002), ("text", 1007), ("too large", 1009)],
)
async def test_frames_the_parser_refuses_still_close_the_connection(
    case: str, code: int, ws_received: list[bytes]
) -> None:
    (message,) = messages(1)
    if case == "unmasked":
        raw = client_frame(Opcode.BINARY, message, mask=False)
    elif case == "reserved bit":
        masked = bytearray(client_frame(Opcode.BINARY, message))
        masked[0] |= 0x40  # RSV1 without a negotiated extension
        raw = bytes(masked)
    elif case == "text":
        raw = client_frame(Opcode.TEXT, b"not protobuf")
    else:
        raw = client_frame(Opcode.BINARY, b"\x00" * 3000)
    async with (
        running_bridge(max_frame_bytes=2048) as bridge,
        connect(ws_url(bridge), compression=None, max_size=None) as ws,
    ):
        await welcomed(ws)
        ws.transport.write(raw)
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                await ws.recv()
    assert closed.value.rcvd is not None and closed.value.rcvd.code == code
    assert len(ws_received) == 1  # only the Hello reached ingest
