"""A small message whose grant must wait is not taken past the governor by the direct path.

``GovernedConnection._direct`` queues whole small binary messages without the frame parser, but
only with a grant at hand; otherwise the payload stays unread (and no buffer is allocated for
it) until the grant, and the messages still come out whole and in order. A connection on a stub
transport (no socket), so the test sees exactly what was queued and when.
"""

from __future__ import annotations

import asyncio
import os

import pytest
from websockets.frames import Frame, Opcode

from bridge.server.governor import Component, Governor
from bridge.server.ws_conn import HELLO_BYTES
from tests.support.ws_stub import governed_connection


@pytest.mark.parametrize("size", [1000, 100_000])  # the small path and the collected one
async def test_a_message_waiting_for_its_grant_is_queued_only_once_granted(size: int) -> None:
    governor = Governor(1 << 20)
    hog = governor.force(Component.RING, governor.admissible_bytes)  # nothing left to grant
    connection = await governed_connection(governor)  # past the Hello: ordinary messages
    payloads = [os.urandom(size), os.urandom(size)]
    read = b"".join(Frame(Opcode.BINARY, p).serialize(mask=True, extensions=[]) for p in payloads)
    connection.data_received(read)
    assert not connection.messages  # nothing queued without a grant
    assert connection.waiter is not None and connection.stash  # the payload waits unread
    assert not connection.reading  # and the socket is not read meanwhile
    # Its buffer is allocated once the grant arrives, not while it waits.
    assert connection.payload is None or connection.payload.data is None
    hog.release()
    await asyncio.sleep(0)  # the grant resumes feeding on the next loop turn
    await asyncio.sleep(0)
    got = [await asyncio.wait_for(connection.recv(), 1) for _ in payloads]
    assert got == payloads
    for message in got:
        connection.take(len(message)).release()


async def test_a_hello_of_the_largest_size_is_still_forced_in_while_the_budget_is_full() -> None:
    """The Hello (first message, up to HELLO_BYTES) never waits for a grant, on any path."""
    governor = Governor(1 << 20)
    hog = governor.force(Component.RING, governor.admissible_bytes)
    connection = await governed_connection(governor, hello_received=False)
    hello = os.urandom(HELLO_BYTES)  # also the size where payloads are collected whole
    connection.data_received(Frame(Opcode.BINARY, hello).serialize(mask=True, extensions=[]))
    await asyncio.sleep(0)
    assert connection.waiter is None
    assert await asyncio.wait_for(connection.recv(), 1) == hello
    connection.take(len(hello)).release()
    hog.release()
