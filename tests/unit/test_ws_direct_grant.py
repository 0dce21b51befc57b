"""A small message whose grant must wait is not taken past the governor by the direct path.

``GovernedConnection._direct`` queues whole small binary messages without the frame parser, but
only with a grant at hand; otherwise the header goes to the parser, the payload stays unread
until the grant, and the messages still come out whole and in order. A connection on a stub
transport (no socket), so the test sees exactly what was queued and when.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from websockets.frames import Frame, Opcode
from websockets.protocol import State
from websockets.server import ServerProtocol

from bridge.governor import Component, Governor
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


async def _connection(governor: Governor) -> GovernedConnection:
    class Connection(GovernedConnection):
        pass

    Connection.governor = governor
    protocol = ServerProtocol(max_size=1 << 20)
    protocol.state = State.OPEN  # past the handshake: a parser for frames
    protocol.parser = protocol.parse()
    next(protocol.parser)
    connection = Connection(protocol, _Server(), ping_interval=None, max_queue=1)  # type: ignore[arg-type]
    connection.connection_made(_Transport())
    connection.request = object()  # type: ignore[assignment]
    connection.meter.frames = 1  # the Hello came already: these are ordinary messages
    await asyncio.sleep(0)
    return connection


async def test_a_message_waiting_for_its_grant_is_queued_only_once_granted() -> None:
    governor = Governor(64 * 1024)
    hog = governor.force(Component.RING, governor.admissible_bytes)  # nothing left to grant
    connection = await _connection(governor)
    payloads = [os.urandom(1000), os.urandom(1000)]
    read = b"".join(Frame(Opcode.BINARY, p).serialize(mask=True, extensions=[]) for p in payloads)
    connection.data_received(read)
    assert len(connection.recv_messages.frames) == 0  # nothing queued without a grant
    assert connection.waiter is not None and connection.stash  # the payload waits unread
    assert len(connection.protocol.reader.buffer) == 0  # the parser has the header, no more
    hog.release()
    await asyncio.sleep(0)  # the grant resumes feeding on the next loop turn
    await asyncio.sleep(0)
    got = [await asyncio.wait_for(connection.recv(), 1) for _ in payloads]
    assert got == payloads
    for message in got:
        connection.take(len(message)).release()
