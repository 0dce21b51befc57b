"""A WebSocket server connection on a stub transport: no socket, so a test (or
``benchmarks.ws_small``) feeds it reads by hand and sees exactly what was queued and when.

``governed_connection(governor)`` gives the bridge's adapter (:class:`bridge.server.ws_conn.
GovernedConnection`, our own asyncio protocol), granting from ``governor``, past a real opening
handshake fed through its public door (``data_received``). ``open_connection(ServerConnection)``
gives plain ``websockets``' asyncio connection past its handshake: the reference the differential
fuzz test and the benchmark hold the adapter to (that one is set up through the library's
internals; the bridge does not use it).
"""

from __future__ import annotations

import asyncio
from typing import Any

from websockets.asyncio.server import ServerConnection
from websockets.protocol import State
from websockets.server import ServerProtocol

from bridge.server.governor import Governor
from bridge.server.ws_conn import GovernedConnection

UPGRADE = (
    b"GET /v1/ingest HTTP/1.1\r\nHost: stub\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
)


class StubTransport(asyncio.Transport):
    """Accepts writes, never pauses: the connection's bookkeeping without a socket."""

    def __init__(self) -> None:
        super().__init__()
        self.written: list[bytes] = []
        self.closed = False

    def write(self, data: Any) -> None:
        self.written.append(bytes(data))

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return False

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0


class StubServer:
    handler_tasks: set[asyncio.Task[None]] = set()

    async def handler(self, connection: Any) -> None:
        pass


async def open_connection(cls: type[ServerConnection], max_size: int = 4 << 20) -> ServerConnection:
    """A connection past its handshake, as the server would hand it to the handler."""
    protocol = ServerProtocol(max_size=max_size)
    protocol.state = State.OPEN
    protocol.parser = protocol.parse()  # a parser for frames, not for the HTTP request
    next(protocol.parser)
    connection = cls(protocol, StubServer(), ping_interval=None, max_queue=1)  # type: ignore[arg-type]
    connection.connection_made(StubTransport())
    connection.request = object()  # type: ignore[assignment]
    await asyncio.sleep(0)  # the (empty) handler task runs
    return connection


async def governed_connection(
    governor: Governor, max_size: int = 4 << 20, *, hello_received: bool = True
) -> GovernedConnection:
    """The bridge's adapter on that stub, granting from ``governor``, past its opening handshake;
    past its Hello (a first message is forced in, not granted) unless ``hello_received`` is
    False."""
    connection = GovernedConnection(governor, max_size=max_size, open_timeout=None)
    transport = StubTransport()
    connection.connection_made(transport)
    connection.data_received(UPGRADE)
    assert transport.written[0].startswith(b"HTTP/1.1 101"), transport.written
    transport.written.clear()
    if hello_received:
        connection.meter.frames = 1
    return connection
