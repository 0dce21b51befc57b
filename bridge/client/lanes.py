"""Priority lanes on one connection (sans-I/O): large frames go out in chunks, and a frame of a
higher lane is sent between two chunks of a lower one.

Why: on a 20 Mbit/s uplink a 1.6 MB cloud takes ~640 ms to send; sent whole, every telemetry
frame published meanwhile waits behind it. Here a frame larger than ``chunk_bytes`` is cut into
``FrameChunk`` pieces of at most ``chunk_bytes``, and before each piece the scheduler looks
again for the oldest frame of the highest lane (control < telemetry < bulk). A telemetry frame
therefore waits for at most one piece (64 KiB: ~26 ms at 20 Mbit/s) plus what the socket holds.

The pieces of one frame go out in order; a frame counts as sent (``EdgeCore.mark_sent``) once
its last piece is out. On a new connection every partly sent frame starts again from offset 0
(the bridge drops incomplete frames when a connection ends).
"""

from __future__ import annotations

from dataclasses import dataclass

from bridge import wire
from bridge.client.core import EdgeCore, Entry
from bridge.v1 import bridge_pb2 as pb

DEFAULT_CHUNK_BYTES = 64 * 1024
#: A piece's own framing (keys, stream id, seq, sizes) on top of its data, with room to spare.
CHUNK_OVERHEAD = 512


@dataclass(frozen=True, slots=True)
class Outgoing:
    """One message to write; ``done`` is the frame it completes (then ``mark_sent`` it)."""

    data: bytes
    done: Entry | None


class LaneScheduler:
    """What to send next on one connection: whole frames and pieces, highest lane first."""

    def __init__(self, core: EdgeCore, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> None:
        if chunk_bytes < 1024:
            raise ValueError("chunk_bytes must be at least 1024")
        self.core = core
        self.chunk_bytes = chunk_bytes
        self._progress: dict[tuple[str, int], int] = {}  # (stream, seq) -> bytes of it sent
        self.chunks_sent = 0

    def reset(self) -> None:
        """A new connection: partly sent frames start over."""
        self._progress.clear()

    def next(self, max_frame_bytes: int = 0) -> Outgoing | None:
        entry = self.core.next_to_send(max_frame_bytes, by_lane=True)
        if entry is None:
            return None
        if entry.nbytes <= self.chunk_bytes + CHUNK_OVERHEAD:
            return Outgoing(entry.data, entry)
        _, start = wire.decode_varint(entry.data, 1)  # after EdgeMessage.frame's key and length
        total = len(entry.data) - start
        key = (entry.stream_id, entry.seq)
        sent = self._progress.get(key, 0)
        end = min(total, sent + self.chunk_bytes)
        piece = pb.EdgeMessage(
            chunk=pb.FrameChunk(
                stream_id=entry.stream_id,
                seq=entry.seq,
                total_bytes=total,
                offset=sent,
                data=entry.data[start + sent : start + end],
            )
        ).SerializeToString()
        self.chunks_sent += 1
        if end == total:
            self._progress.pop(key, None)
            return Outgoing(piece, entry)
        if sent == 0:  # forget a frame of this stream dropped meanwhile (acked, evicted)
            self._progress = {k: v for k, v in self._progress.items() if k[0] != key[0]}
        self._progress[key] = end
        return Outgoing(piece, None)
