"""Reassembly of chunked frames, per stream (sans-I/O: chunks and times in, frames out).

Why chunks: on one connection a telemetry frame queued behind a 1.6 MB cloud waits for the whole
cloud (~640 ms at 20 Mbit/s). An edge therefore sends large frames as ``FrameChunk`` pieces and
puts higher-priority frames between them (docs/protocol.md §3.1). The bridge puts the pieces
back together here and then handles the frame exactly as if it had arrived whole.

Rules (anything else is refused for that stream only; the connection stays open):

- a frame's pieces come in order: the first at offset 0, each next one exactly where the last
  ended, all naming the same ``total_bytes`` (at most ``max_frame_bytes``) and ``seq``;
- one frame in progress per declared stream; pieces of other streams may come in between;
- a piece of a new seq while a frame is still incomplete abandons the incomplete one
  (``CHUNK_ABANDONED`` for it), as does a whole ``Frame`` on that stream and age above
  ``max_age_seconds``.

Memory: a piece's bytes stay charged to the governor (the charge its message was granted) until
the frame is handed on or dropped; the charges of a completed frame become one charge that the
ring takes over. At most one incomplete frame per declared stream, each at most
``max_frame_bytes``.
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass, field

from bridge import wire
from bridge.errors import (
    ChunkAbandoned,
    ChunkSequence,
    ChunkTooLarge,
    ProtocolError,
    UnknownStream,
)
from bridge.governor import Charge
from bridge.v1 import bridge_pb2 as pb

_FRAME_KEY = wire.field_key(pb.EdgeMessage.DESCRIPTOR, "frame")


@dataclass(slots=True)
class _Partial:
    seq: int
    total: int
    started: float
    parts: list[bytes] = field(default_factory=list)
    charges: list[Charge] = field(default_factory=list)
    filled: int = 0

    def release(self) -> None:
        for charge in self.charges:
            charge.release()
        self.charges.clear()
        self.parts.clear()


@dataclass(slots=True)
class Fed:
    """What one piece produced: a whole ``EdgeMessage{frame}`` (``data``, with the charge that
    now holds its bytes) when it completed a frame, and refusals to report (each names its
    stream and seq in ``frame``)."""

    data: bytes | None = None
    charge: Charge | None = None
    header: pb.Frame | None = None  # stream and seq the pieces named
    errors: list[ProtocolError] = field(default_factory=list)


class Reassembler:
    """The incomplete chunked frames of one connection."""

    def __init__(
        self, streams: Container[str], max_frame_bytes: int, max_age_seconds: float = 30.0
    ) -> None:
        self._streams = streams  # the session's declared streams (a live view)
        self.max_frame_bytes = max_frame_bytes
        self.max_age_seconds = max_age_seconds
        self._partials: dict[str, _Partial] = {}

    @property
    def held_bytes(self) -> int:
        return sum(p.filled for p in self._partials.values())

    @property
    def in_progress(self) -> int:
        return len(self._partials)

    def feed(self, chunk: pb.FrameChunk, charge: Charge, now: float) -> Fed:
        """Take one piece and its charge (released here unless it becomes part of a frame)."""
        fed = Fed()
        self._expire(now, fed)
        sid, seq = chunk.stream_id, chunk.seq
        header = pb.Frame(stream_id=sid, seq=seq)
        error = self._check(chunk, header)
        partial = self._partials.get(sid)
        if partial is not None and (error is not None or partial.seq != seq):
            del self._partials[sid]
            partial.release()
            if partial.seq != seq:
                fed.errors.append(_abandoned(sid, partial.seq, f"seq {seq} started"))
            partial = None
        if error is None and partial is None and chunk.offset != 0:
            error = ChunkSequence(
                f"stream {sid!r} seq {seq}: first piece at offset {chunk.offset}, expected 0",
                frame=header,
            )
        if (
            error is None
            and partial is not None
            and (chunk.total_bytes != partial.total or chunk.offset != partial.filled)
        ):
            del self._partials[sid]
            partial.release()
            error = ChunkSequence(
                f"stream {sid!r} seq {seq}: piece at offset {chunk.offset} of "
                f"{chunk.total_bytes}, expected offset {partial.filled} of {partial.total} "
                "(pieces must be in order and must not overlap)",
                frame=header,
            )
        if error is not None:
            charge.release()
            fed.errors.append(error)
            return fed
        if partial is None:
            partial = self._partials[sid] = _Partial(seq, chunk.total_bytes, now)
        partial.parts.append(chunk.data)
        partial.charges.append(charge)
        partial.filled += len(chunk.data)
        if partial.filled == partial.total:
            del self._partials[sid]
            prefix = wire.length_prefix(_FRAME_KEY, partial.total)
            fed.data = b"".join((prefix, *partial.parts))
            fed.charge = _combine(partial.charges)
            fed.header = header
            partial.parts.clear()
        return fed

    def _check(self, chunk: pb.FrameChunk, header: pb.Frame) -> ProtocolError | None:
        sid, seq = chunk.stream_id, chunk.seq
        if sid not in self._streams:
            return UnknownStream(f"stream {sid!r} was not declared in Hello", frame=header)
        if seq == 0:
            return ChunkSequence("a chunked frame's seq starts at 1", frame=header)
        if not 0 < chunk.total_bytes <= self.max_frame_bytes:
            return ChunkTooLarge(
                f"stream {sid!r} seq {seq}: total_bytes {chunk.total_bytes} must be 1.."
                f"{self.max_frame_bytes} (max_frame_bytes)",
                frame=header,
            )
        if not chunk.data:
            return ChunkSequence(f"stream {sid!r} seq {seq}: empty piece", frame=header)
        if chunk.offset + len(chunk.data) > chunk.total_bytes:
            return ChunkTooLarge(
                f"stream {sid!r} seq {seq}: piece at {chunk.offset} of {len(chunk.data)} bytes "
                f"runs past total_bytes {chunk.total_bytes}",
                frame=header,
            )
        return None

    def frame_arrived(self, stream_id: str) -> ProtocolError | None:
        """A whole ``Frame`` came on ``stream_id``: an incomplete chunked one there is abandoned."""
        partial = self._partials.pop(stream_id, None)
        if partial is None:
            return None
        partial.release()
        return _abandoned(stream_id, partial.seq, "a whole frame came on its stream")

    def _expire(self, now: float, fed: Fed) -> None:
        for sid, partial in list(self._partials.items()):
            if now - partial.started > self.max_age_seconds:
                del self._partials[sid]
                partial.release()
                fed.errors.append(
                    _abandoned(sid, partial.seq, f"incomplete after {self.max_age_seconds:g} s")
                )

    def close(self) -> None:
        """The connection ended: every incomplete frame is dropped (the edge resends it)."""
        for partial in self._partials.values():
            partial.release()
        self._partials.clear()


def check_frame(frame: pb.Frame, stream_id: str, seq: int) -> None:
    """The reassembled frame must be the one its pieces named."""
    if frame.stream_id != stream_id or frame.seq != seq:
        raise ChunkSequence(
            f"pieces for stream {stream_id!r} seq {seq} carried a frame of stream "
            f"{frame.stream_id!r} seq {frame.seq}",
            frame=pb.Frame(stream_id=stream_id, seq=seq),
        )


def _abandoned(stream_id: str, seq: int, why: str) -> ChunkAbandoned:
    return ChunkAbandoned(
        f"stream {stream_id!r} seq {seq}: chunked frame abandoned ({why})",
        frame=pb.Frame(stream_id=stream_id, seq=seq),
    )


def _combine(charges: list[Charge]) -> Charge:
    """One charge holding the bytes of all ``charges`` (which are spent)."""
    first, *rest = charges
    for other in rest:
        if (other.component, other.tier) == (first.component, first.tier):
            first.merge(other)
        else:
            first.resize(first.nbytes + other.nbytes)
            other.release()
    charges.clear()
    return first
