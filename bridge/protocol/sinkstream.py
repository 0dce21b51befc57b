"""The sink's side of one ``Push`` / ``PushBatch`` stream, for any sink (the reference sink in
``loadgen.sink``, ``simbridge view``): watermarks first, then record in batches and acknowledge
cumulatively by ``bridge_seq`` (docs/protocol.md §10).

Why one place: the ack rule is the delivery guarantee. A sink only decides how a batch becomes
durable (``record``); when the ack may be sent is decided here, the same way for every sink.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

from bridge.v1 import bridge_pb2 as pb

log = logging.getLogger("bridge.protocol.sinkstream")

Received = tuple[pb.ProcessedFrame, int]  # a frame and when it arrived (ns)


async def serve_push(
    requests: AsyncIterator[pb.ProcessedFrame],
    write_ack: Callable[[pb.SinkAck], Awaitable[None]],
    watermarks: pb.SinkAck,
    record: Callable[[list[Received]], Awaitable[int]],
    *,
    batch_frames: int,
    clock_ns: Callable[[], int],
    on_ack: Callable[[int], None] = lambda _high: None,
) -> None:
    """Serve one stream until the bridge ends it. ``record`` makes a batch (at most
    ``batch_frames``, fewer when no more has arrived) durable and returns its highest
    ``bridge_seq``; only then is that acknowledged. Reading runs ahead by a bounded queue."""
    queue: asyncio.Queue[Received | None] = asyncio.Queue(maxsize=4 * batch_frames)

    async def reader() -> None:
        try:
            async for frame in requests:
                await queue.put((frame, clock_ns()))
        finally:
            await queue.put(None)

    reader_task = asyncio.create_task(reader(), name="sink-push-reader")
    try:
        await write_ack(watermarks)
        high = 0
        done = False
        while not done:
            item = await queue.get()
            batch: list[Received] = []
            while item is not None:
                batch.append(item)
                if len(batch) >= batch_frames or queue.empty():
                    break
                item = queue.get_nowait()
            done = item is None
            if batch:
                high = max(high, await record(batch))
                await write_ack(pb.SinkAck(bridge_seq=high))
                on_ack(high)
        if reader_task.done() and not reader_task.cancelled() and reader_task.exception():
            log.info("push stream ended: %s", reader_task.exception())
    finally:
        reader_task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await reader_task
