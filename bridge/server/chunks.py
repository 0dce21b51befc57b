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

Held bytes cost others their room, so holding is bounded in time and in share, whether or not
the edge sends another piece (the connection calls these on a timer, ``now`` passed in):
:meth:`Reassembler.expire` drops frames older than ``max_age_seconds``;
:meth:`Reassembler.shed` drops the least recently fed frames until the connection holds no more
than its share; :meth:`Reassembler.stalled_for` says how long the connection has held
incomplete frames since a piece last completed one (the connection is closed past a deadline).
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass, field

from bridge.protocol import wire
from bridge.protocol.errors import (
    ChunkAbandoned,
    ChunkSequence,
    ChunkTooLarge,
    ProtocolError,
    UnknownStream,
)
from bridge.server.governor import Charge
from bridge.v1 import bridge_pb2 as pb

_FRAME_KEY = wire.field_key(pb.EdgeMessage.DESCRIPTOR, "frame")

#: An incomplete frame is dropped this long after its first piece. A ``max_frame_bytes`` frame
#: (16 MiB by default) takes 6.7 s over a 20 Mbit/s uplink on its own; twice that leaves room for
#: the other lanes that share the link. (``Settings.chunk_max_age_seconds``.)
DEFAULT_MAX_AGE_SECONDS = 15.0


@dataclass(slots=True)
class _Partial:
    seq: int
    total: int
    started: float
    touched: float  # when its last piece came (shed drops the least recently fed first)
    parts: list[bytes] = field(default_factory=list)
    charges: list[Charge] = field(default_factory=list)
    filled: int = 0
    charged: int = 0  # the sum of its charges (they do not change while held here)

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
        self,
        streams: Container[str],
        max_frame_bytes: int,
        max_age_seconds: float = DEFAULT_MAX_AGE_SECONDS,
    ) -> None:
        self._streams = streams  # the session's declared streams (a live view)
        self.max_frame_bytes = max_frame_bytes
        self.max_age_seconds = max_age_seconds
        self._partials: dict[str, _Partial] = {}
        # Hold clock: seconds spent holding incomplete frames since a piece last completed one
        # (``_held_before``, plus ``now - _holding_since`` while something is held).
        self._held_before = 0.0
        self._holding_since: float | None = None
        self._last_now = 0.0  # for drops that come without a time (frame_arrived)
        self._charged = 0  # the sum of every incomplete frame's charges

    @property
    def held_bytes(self) -> int:
        return sum(p.filled for p in self._partials.values())

    @property
    def charged_bytes(self) -> int:
        """What the incomplete frames hold in the memory governor (their pieces' charges)."""
        return self._charged

    @property
    def in_progress(self) -> int:
        return len(self._partials)

    def feed(self, chunk: pb.FrameChunk, charge: Charge, now: float) -> Fed:
        """Take one piece and its charge (released here unless transferred to a frame)."""
        with charge:
            return self._feed(chunk, charge, now)

    def _feed(self, chunk: pb.FrameChunk, charge: Charge, now: float) -> Fed:
        fed = Fed()
        self._last_now = now
        fed.errors += self.expire(now)
        sid, seq = chunk.stream_id, chunk.seq
        header = pb.Frame(stream_id=sid, seq=seq)
        error = self._check(chunk, header)
        partial = self._partials.get(sid)
        if partial is not None and (error is not None or partial.seq != seq):
            self._drop(sid, now)
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
            self._drop(sid, now)
            error = ChunkSequence(
                f"stream {sid!r} seq {seq}: piece at offset {chunk.offset} of "
                f"{chunk.total_bytes}, expected offset {partial.filled} of {partial.total} "
                "(pieces must be in order and must not overlap)",
                frame=header,
            )
        if error is not None:
            fed.errors.append(error)
            return fed
        if partial is None:
            if not self._partials:
                self._holding_since = now
            partial = self._partials[sid] = _Partial(seq, chunk.total_bytes, now, now)
        partial.touched = now
        partial.parts.append(chunk.data)
        held = charge.transfer()  # the incomplete frame's now
        partial.charges.append(held)
        partial.charged += held.nbytes
        self._charged += held.nbytes
        partial.filled += len(chunk.data)
        if partial.filled == partial.total:
            del self._partials[sid]
            self._charged -= partial.charged
            prefix = wire.length_prefix(_FRAME_KEY, partial.total)
            fed.data = b"".join((prefix, *partial.parts))
            fed.charge = _combine(partial.charges)
            fed.header = header
            partial.parts.clear()
            # Progress: the hold clock starts over (from now, if other frames are still held).
            self._held_before = 0.0
            self._holding_since = now if self._partials else None
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

    def frame_arrived(self, stream_id: str, now: float | None = None) -> ProtocolError | None:
        """A whole ``Frame`` came on ``stream_id``: an incomplete chunked one there is abandoned."""
        partial = self._drop(stream_id, self._last_now if now is None else now)
        if partial is None:
            return None
        return _abandoned(stream_id, partial.seq, "a whole frame came on its stream")

    def expire(self, now: float) -> list[ProtocolError]:
        """Drop (and release) every frame incomplete for more than ``max_age_seconds``; one
        ``CHUNK_ABANDONED`` each. Called on a timer: a held frame expires without another
        piece arriving."""
        self._last_now = now
        errors: list[ProtocolError] = []
        for sid, partial in list(self._partials.items()):
            if now - partial.started > self.max_age_seconds:
                self._drop(sid, now)
                errors.append(
                    _abandoned(sid, partial.seq, f"incomplete after {self.max_age_seconds:g} s")
                )
        return errors

    def shed(self, max_bytes: int, now: float) -> list[ProtocolError]:
        """Drop the least recently fed frames until the charges held are at most ``max_bytes``
        (the connection's share while others wait for memory); one ``CHUNK_ABANDONED`` each.
        The frame an edge is actively sending is dropped last."""
        self._last_now = now
        errors: list[ProtocolError] = []
        held = self._charged
        if held <= max_bytes:
            return errors
        for sid, partial in sorted(self._partials.items(), key=lambda kv: kv[1].touched):
            if held <= max_bytes:
                break
            held -= partial.charged
            self._drop(sid, now)
            errors.append(
                _abandoned(
                    sid,
                    partial.seq,
                    f"the connection held more than its share ({max_bytes} bytes) of memory "
                    "in incomplete frames while others waited",
                )
            )
        return errors

    def stalled_for(self, now: float) -> float:
        """Seconds spent holding incomplete frames since a piece last completed a frame (time
        holding nothing does not count; frames dropped meanwhile do not restart it)."""
        self._last_now = now
        held = self._held_before
        if self._holding_since is not None:
            held += max(0.0, now - self._holding_since)
        return held

    def _drop(self, stream_id: str, now: float) -> _Partial | None:
        """Remove and release one incomplete frame; the hold clock pauses once nothing is held."""
        partial = self._partials.pop(stream_id, None)
        if partial is None:
            return None
        partial.release()
        self._charged -= partial.charged
        if not self._partials and self._holding_since is not None:
            self._held_before += max(0.0, now - self._holding_since)
            self._holding_since = None
        return partial

    def close(self) -> None:
        """The connection ended: every incomplete frame is dropped (the edge resends it)."""
        for partial in self._partials.values():
            partial.release()
        self._partials.clear()
        self._charged = 0
        self._holding_since = None


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
