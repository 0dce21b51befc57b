"""Priority lanes on one connection (sans-I/O): large frames go out in chunks, and a frame of a
higher lane is sent between two chunks of a lower one.

Why: on a 20 Mbit/s uplink a 1.6 MB cloud takes ~640 ms to send; sent whole, every telemetry
frame published meanwhile waits behind it. Here a frame larger than ``chunk_bytes`` is cut into
``FrameChunk`` pieces of at most ``chunk_bytes``, and before each piece the scheduler looks
again for the oldest frame of the highest lane (control < telemetry < bulk). A telemetry frame
therefore waits for at most one piece plus what the socket holds; the client sends the next
piece only once the socket's unsent bytes fell below its threshold (``pieces=False`` meanwhile),
so that stays small too.

Pieces cost the bridge one message each, so they are used only where they help: when streams
of more than one lane share the connection and the link would be held longer than
``max_hold_seconds`` (10 ms) by the frame (WebSocket: the kernel's delivery-rate estimate;
gRPC or unknown: always). The pieces of one frame go out in order; a frame counts as sent
(``EdgeCore.mark_sent``) once its last piece is out. On a new connection every partly sent
frame starts again from offset 0 (the bridge drops incomplete frames when a connection ends).
"""

from __future__ import annotations

from dataclasses import dataclass

from bridge.client.core import EdgeCore, Entry
from bridge.protocol import wire
from bridge.v1 import bridge_pb2 as pb

DEFAULT_CHUNK_BYTES = 32 * 1024
#: A frame the link carries within this long goes whole (no piece overhead on fast links).
DEFAULT_MAX_HOLD_SECONDS = 0.01
#: A piece's own framing (keys, stream id, seq, sizes) on top of its data, with room to spare.
CHUNK_OVERHEAD = 512


@dataclass(frozen=True, slots=True)
class Outgoing:
    """One message to write; ``done`` is the frame it completes (then ``mark_sent`` it)."""

    data: bytes
    done: Entry | None
    whole: bool = False  # the frame's own EdgeMessage (not a piece)


class LaneScheduler:
    """What to send next on one connection: whole frames and pieces, highest lane first."""

    def __init__(
        self,
        core: EdgeCore,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        *,
        max_hold_seconds: float = DEFAULT_MAX_HOLD_SECONDS,
    ) -> None:
        if chunk_bytes < 1024:
            raise ValueError("chunk_bytes must be at least 1024")
        self.core = core
        self.chunk_bytes = chunk_bytes
        self.max_hold_seconds = max_hold_seconds
        #: Streams in more than one lane: only then can a frame hold up another one.
        self.mixed = len({st.spec.lane for st in core.streams.values()}) > 1
        self._progress: dict[tuple[str, int], int] = {}  # (stream, seq) -> bytes of it sent
        self.chunks_sent = 0

    def reset(self) -> None:
        """A new connection: partly sent frames start over."""
        self._progress.clear()

    def restart(self, stream_id: str, seq: int) -> None:
        """The bridge dropped this frame incomplete: its next piece starts at offset 0."""
        self._progress.pop((stream_id, seq), None)

    def next(
        self,
        max_frame_bytes: int = 0,
        *,
        pieces: bool = True,
        link_bytes_per_second: float | None = None,
    ) -> Outgoing | None:
        """The next message. ``pieces=False``: only a whole frame (None when the highest lane's
        next frame goes in pieces: the link is busy, so a piece would only queue).
        ``link_bytes_per_second``: the transport's estimate of the link (None: unknown); a
        frame the link carries within ``max_hold_seconds`` goes whole, as does every frame when
        all streams share one lane (nothing could overtake it)."""
        entry = self.core.next_to_send(max_frame_bytes, by_lane=True)
        if entry is None:
            return None
        key = (entry.stream_id, entry.seq)
        if entry.nbytes <= self.chunk_bytes + CHUNK_OVERHEAD or (
            key not in self._progress
            and (
                not self.mixed
                or (
                    link_bytes_per_second
                    and entry.nbytes <= link_bytes_per_second * self.max_hold_seconds
                )
            )
        ):
            return Outgoing(entry.data, entry, whole=True)
        if not pieces:
            return None
        # The serialized Frame is the head after EdgeMessage.frame's key and length, then the
        # prepared payload; pieces are cut from those two without joining them.
        _, start = wire.decode_varint(entry.head, 1)
        head = entry.head[start:]
        body = entry.payload.frame_bytes
        total = len(head) + len(body)
        sent = self._progress.get(key, 0)
        end = min(total, sent + self.chunk_bytes)
        piece = pb.EdgeMessage(
            chunk=pb.FrameChunk(
                stream_id=entry.stream_id,
                seq=entry.seq,
                total_bytes=total,
                offset=sent,
                data=_cut(head, body, sent, end),
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


def _cut(head: bytes, body: bytes, start: int, end: int) -> bytes:
    """Bytes ``start:end`` of ``head + body``, copying only those."""
    h = len(head)
    if end <= h:
        return head[start:end]
    if start >= h:
        return body[start - h : end - h]
    return head[start:] + body[: end - h]
