"""A WebSocket server connection past its handshake on a stub transport (no socket): tests feed
it bytes with ``data_received`` and read what ``recv()`` yields."""

from __future__ import annotations

import asyncio
from typing import Any

from websockets.asyncio.server import ServerConnection
from websockets.protocol import State
from websockets.server import ServerProtocol

from bridge.governor import Governor
from bridge.ws_impl import GovernedConnection


class _Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.paused = False

    def write(self, data: Any) -> None:
        pass

    def is_closing(self) -> bool:
        return False

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0


class _Server:
    handler_tasks: set[asyncio.Task[None]] = set()

    async def handler(self, connection: Any) -> None:
        pass


async def open_connection(cls: type[ServerConnection], max_size: int = 1 << 20) -> ServerConnection:
    protocol = ServerProtocol(max_size=max_size)
    protocol.state = State.OPEN  # past the handshake: a parser for frames
    protocol.parser = protocol.parse()
    next(protocol.parser)
    connection = cls(protocol, _Server(), ping_interval=None, max_queue=1)  # type: ignore[arg-type]
    connection.connection_made(_Transport())
    connection.request = object()  # type: ignore[assignment]
    await asyncio.sleep(0)
    return connection


async def governed_connection(governor: Governor, max_size: int = 1 << 20) -> GovernedConnection:
    class Connection(GovernedConnection):
        pass

    Connection.governor = governor
    connection = await open_connection(Connection, max_size)
    assert isinstance(connection, GovernedConnection)
    return connection
