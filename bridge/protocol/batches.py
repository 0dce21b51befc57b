"""Frame batches on the wire: many frames in one transport message.

Batching exists because a transport message has a fixed cost (a WebSocket frame, a gRPC write,
a memory grant, a parse) that dominates small frames. A batch changes nothing else: its frames
are admitted, acknowledged, refused and delivered one by one, in order. Sans-I/O helpers for
both directions: the edge's ``FrameBatch`` and the sink's ``ProcessedFrameBatch``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable

from bridge.protocol import wire
from bridge.v1 import bridge_pb2 as pb

EDGE_BATCH_KEY = wire.field_key(pb.EdgeMessage.DESCRIPTOR, "batch")
EDGE_FRAME_KEY = wire.field_key(pb.EdgeMessage.DESCRIPTOR, "frame")
FRAME_IN_BATCH_KEY = wire.field_key(pb.FrameBatch.DESCRIPTOR, "frames")


async def frames_of(
    batches: AsyncIterator[pb.ProcessedFrameBatch],
) -> AsyncIterator[pb.ProcessedFrame]:
    """A ``PushBatch`` request stream as the ``Push`` stream it stands for (for sinks)."""
    async for batch in batches:
        for frame in batch.frames:
            yield frame


def edge_batch(messages: Iterable[bytes]) -> bytes:
    """One ``EdgeMessage{batch}`` from serialized ``EdgeMessage{frame}`` messages.

    An ``EdgeMessage.frame`` and a ``FrameBatch.frames`` element are both a length-delimited
    Frame; only the key differs, so each frame's bytes are reused with the key swapped (one
    copy, in the final join)."""
    parts: list[bytes] = []
    size = 0
    for message in messages:
        if not message.startswith(EDGE_FRAME_KEY):
            raise ValueError("not an EdgeMessage carrying a frame")
        parts.append(FRAME_IN_BATCH_KEY)
        parts.append(memoryview(message)[len(EDGE_FRAME_KEY) :])  # type: ignore[arg-type]
        size += len(FRAME_IN_BATCH_KEY) + len(message) - len(EDGE_FRAME_KEY)
    return b"".join((wire.length_prefix(EDGE_BATCH_KEY, size), *parts))
