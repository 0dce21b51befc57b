"""The bridge's WebSocket adapter yields exactly the messages ``websockets`` alone would.

The adapter (our own asyncio protocol over the library's sans-I/O ``ServerProtocol``) meters
headers, waits for grants, collects large payloads and takes whole binary messages past the
library's parser (``GovernedConnection._direct``, ``_bypassable``, ``Payload``); the reference is
plain ``websockets``' asyncio ``ServerConnection``. Whatever
the mix of frames (binary and text, small and large, fragments, pings between them) and however
the bytes are cut into reads, ``recv()`` must give the same messages in the same order as a plain
``websockets`` connection fed the same reads - up to a frame the library refuses (unmasked,
reserved bits), after which both are closed alike.

``make test`` runs a bounded number of examples (``SIMBRIDGE_FUZZ_EXAMPLES``, default 100);
``make fuzz`` runs many more.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st
from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed
from websockets.frames import Frame, Opcode

from bridge.server.governor import Governor
from bridge.server.ws_conn import GovernedConnection
from tests.support.ws_stub import governed_connection, open_connection

READ_BYTES = 256 * 1024  # the event loop's largest read
EXAMPLES = int(os.environ.get("SIMBRIDGE_FUZZ_EXAMPLES", "100"))

_sizes = st.sampled_from([1, 125, 126, 1000, 65535, 65536, 70_000, 200_000])


@dataclass
class _Message:
    frames: list[Frame]
    wire: bytes

    @property
    def expected(self) -> bytes | str | None:
        """What recv() yields for it on a connection that is still open (None: nothing)."""
        first = self.frames[0]
        if first.opcode is Opcode.PING:
            return None
        data = b"".join(f.data for f in self.frames)
        return data.decode() if first.opcode is Opcode.TEXT else data

    @property
    def refused(self) -> bool:
        return not self.wire[1] & 0x80 or bool(self.wire[0] & 0x70)


@st.composite
def _message(draw: st.DrawFn) -> _Message:
    kind = draw(
        st.sampled_from(
            ["binary", "binary", "binary", "text", "ping", "fragmented", "unmasked", "reserved"]
        )
    )
    if kind == "ping":
        frames = [Frame(Opcode.PING, os.urandom(draw(st.integers(0, 125))))]
    elif kind == "text":
        frames = [Frame(Opcode.TEXT, b"t" * draw(_sizes))]
    elif kind == "fragmented":
        parts = draw(st.lists(_sizes, min_size=2, max_size=3))
        frames = [Frame(Opcode.CONT, os.urandom(n), fin=False) for n in parts]
        frames[0] = Frame(Opcode.BINARY, frames[0].data, fin=False)
        frames[-1] = Frame(Opcode.CONT, frames[-1].data, fin=True)
    else:
        frames = [Frame(Opcode.BINARY, os.urandom(draw(_sizes)))]
    wire = b"".join(f.serialize(mask=kind != "unmasked", extensions=[]) for f in frames)
    if kind == "reserved":
        wire = bytes([wire[0] | 0x40]) + wire[1:]  # RSV1 with no extension negotiated
    return _Message(frames, wire)


async def _received(
    connection: ServerConnection | GovernedConnection, reads: list[bytes]
) -> list[bytes | str]:
    out: list[bytes | str] = []
    for read in reads:
        connection.data_received(read)
        for _ in range(3):  # grants and collected payloads resume on later loop turns
            await asyncio.sleep(0)
        with contextlib.suppress(TimeoutError, ConnectionClosed):
            while True:
                message = await asyncio.wait_for(connection.recv(), 0.01)
                if isinstance(connection, GovernedConnection):
                    size = len(message.encode() if isinstance(message, str) else message)
                    connection.take(size).release()
                out.append(bytes(message) if isinstance(message, bytearray) else message)
    return out


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    messages=st.lists(_message(), min_size=1, max_size=6),
    cuts=st.lists(st.integers(1, READ_BYTES), max_size=12),
)
def test_the_adapter_yields_what_websockets_yields(
    messages: list[_Message], cuts: list[int]
) -> None:
    wire = b"".join(m.wire for m in messages)
    reads, pos = [], 0
    for cut in [*cuts, READ_BYTES] * (len(wire) // READ_BYTES + 2):
        if pos >= len(wire):
            break
        reads.append(wire[pos : pos + cut])
        pos += cut

    async def both() -> tuple[list[bytes | str], list[bytes | str]]:
        plain = await open_connection(ServerConnection, 1 << 20)
        governed = await governed_connection(Governor(64 << 20), 1 << 20)  # past the Hello
        return await _received(plain, reads), await _received(governed, reads)

    plain, ours = asyncio.run(both())
    expected: list[bytes | str] = []
    for message in messages:
        if message.refused:
            break
        if message.expected is not None:
            expected.append(message.expected)
    assert plain == expected  # the reference read everything up to a refused frame
    assert ours == plain
