"""A WebSocket server connection on a stub transport: no socket, no handshake, so a test (or
``benchmarks.ws_small``) feeds it reads by hand and sees exactly what was queued and when.

``open_connection(cls)`` gives any ``websockets`` server connection class past its handshake;
``governed_connection(governor)`` gives the bridge's adapter on it, granting from ``governor``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from websockets.asyncio.server import ServerConnection
from websockets.protocol import State
from websockets.server import ServerProtocol

from bridge.governor import Governor
from bridge.ws_impl import GovernedConnection


class StubTransport(asyncio.Transport):
    """Accepts writes, never pauses: the connection's bookkeeping without a socket."""

    def write(self, data: Any) -> None:
        pass

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
    """The bridge's adapter on that stub, granting from ``governor``; past its Hello (a first
    message is forced in, not granted) unless ``hello_received`` is False."""

    class Connection(GovernedConnection):
        pass

    Connection.governor = governor
    connection = await open_connection(Connection, max_size)
    assert isinstance(connection, GovernedConnection)
    if hello_received:
        connection.meter.frames = 1
    return connection
