"""The bridge's WebSocket adapter yields exactly the messages ``websockets`` alone would.

The adapter meters headers, waits for grants, collects large payloads and takes whole binary
messages past the library's parser (``GovernedConnection._direct``, ``_bypassable``). Whatever
the mix of frames (binary and text, small and large, fragments, pings between them) and however
the bytes are cut into reads, ``recv()`` must give the same messages in the same order as a plain
``websockets`` connection fed the same reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import os

from hypothesis import given, settings
from hypothesis import strategies as st
from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed
from websockets.frames import Frame, Opcode

from bridge.governor import Governor
from bridge.ws_impl import GovernedConnection
from tests.unit.ws_stub import governed_connection, open_connection

READ_BYTES = 256 * 1024  # the event loop's largest read

_sizes = st.sampled_from([1, 125, 126, 1000, 65535, 65536, 70_000, 200_000])


@st.composite
def _message(draw: st.DrawFn) -> list[Frame]:
    kind = draw(st.sampled_from(["binary", "binary", "text", "ping", "fragmented"]))
    if kind == "ping":
        return [Frame(Opcode.PING, os.urandom(draw(st.integers(0, 125))))]
    if kind == "text":
        return [Frame(Opcode.TEXT, b"t" * draw(_sizes))]
    if kind == "binary":
        return [Frame(Opcode.BINARY, os.urandom(draw(_sizes)))]
    parts = draw(st.lists(_sizes, min_size=2, max_size=3))
    frames = [Frame(Opcode.CONT, os.urandom(n), fin=False) for n in parts]
    frames[0] = Frame(Opcode.BINARY, frames[0].data, fin=False)
    frames[-1] = Frame(Opcode.CONT, frames[-1].data, fin=True)
    return frames


async def _received(connection: ServerConnection, reads: list[bytes]) -> list[bytes | str]:
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
                out.append(message)
    return out


@settings(max_examples=60, deadline=None)
@given(
    messages=st.lists(_message(), min_size=1, max_size=6),
    cuts=st.lists(st.integers(1, READ_BYTES), max_size=12),
)
def test_the_adapter_yields_what_websockets_yields(
    messages: list[list[Frame]], cuts: list[int]
) -> None:
    wire = b"".join(f.serialize(mask=True, extensions=[]) for m in messages for f in m)
    reads, pos = [], 0
    for cut in [*cuts, READ_BYTES] * (len(wire) // READ_BYTES + 2):
        if pos >= len(wire):
            break
        reads.append(wire[pos : pos + cut])
        pos += cut

    async def both() -> tuple[list[bytes | str], list[bytes | str]]:
        plain = await open_connection(ServerConnection)
        governed = await governed_connection(Governor(64 << 20))
        governed.meter.frames = 1  # past the Hello (forced, not granted)
        return await _received(plain, reads), await _received(governed, reads)

    plain, ours = asyncio.run(both())
    expected = [
        b"".join(f.data for f in m) if m[0].opcode is Opcode.BINARY else bytes(m[0].data).decode()
        for m in messages
        if m[0].opcode is not Opcode.PING
    ]
    assert plain == expected  # the reference itself read everything
    assert ours == plain
