"""A large WebSocket message costs one buffer of its size, not a list of reads plus their join.

Issue 29 measured it in the container: a 15 MiB payload collected as ~60 reads of 256 KiB,
unmasked read by read into new bytes, then joined, held twice its size at the join, and the
list and join churned glibc's heap (freed, not returned). The adapter now allocates ONE buffer
of the size the frame header announced, when the grant arrives, unmasks each read into it in
place and hands that buffer to ``recv()`` (``bridge.server.ws_conn.Payload``). Python's own
allocation tracer measures the peak of what receiving the message allocated, on a connection over a
stub
transport (the reads themselves are made before tracing starts).
"""

from __future__ import annotations

import os
import tracemalloc

from websockets.frames import Frame, Opcode

from bridge.server.governor import Governor
from tests.support.ws_stub import governed_connection

READ_BYTES = 256 * 1024  # the event loop's largest read
SIZE = 8 << 20


async def test_a_large_message_is_one_buffer_of_its_size() -> None:
    connection = await governed_connection(Governor(1 << 30), max_size=32 << 20)
    payload = os.urandom(SIZE)
    wire = Frame(Opcode.BINARY, payload).serialize(mask=True, extensions=[])
    reads = [wire[i : i + READ_BYTES] for i in range(0, len(wire), READ_BYTES)]
    tracemalloc.start()
    try:
        for read in reads:
            connection.data_received(read)
        message = await connection.recv()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert message == payload
    # One buffer of the payload, plus at most one read's worth of transients (the stash).
    assert peak < SIZE + 2 * READ_BYTES, f"peak {peak / SIZE:.2f} x the payload"
    connection.take(len(message)).release()
