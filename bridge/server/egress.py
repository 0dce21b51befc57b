"""Egress log (sans-I/O): processed frames in commit order, until the sink acknowledges them.

Every committed entry gets a ``bridge_seq`` (consecutive, starting at 1 for this process). The
log keeps the sink's send cursor and the ``in_flight`` marks itself (:meth:`rewind`,
:meth:`take_batch`, :meth:`mark_sent`, :meth:`clear_in_flight`), so the push adapter only moves
bytes; the sink acknowledges cumulatively by ``bridge_seq`` and after a reconnect everything still
in the log is replayed. Entries evicted by ``drop_oldest``
stay in the deque flagged ``removed`` and are skipped; the log only shrinks from the left.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice

from bridge.protocol import wire
from bridge.server.ring import Entry, Gap
from bridge.server.session import Stream
from bridge.v1 import bridge_pb2 as pb

_BRIDGE_SEQ_KEY = wire.field_key(pb.ProcessedFrame.DESCRIPTOR, "bridge_seq", wire.WIRE_VARINT)


@dataclass(frozen=True, slots=True)
class Outgoing:
    """One entry's wire bytes, marked in flight, as parts (joined once, by whoever writes them:
    alone or inside a batch); ``replay`` when it was sent before."""

    parts: tuple[wire.Part, ...]
    nbytes: int
    replay: bool

    @property
    def data(self) -> bytes:
        return b"".join(self.parts)


class EgressLog:
    def __init__(self) -> None:
        self._log: deque[tuple[Stream, Entry]] = deque()
        self.last_bridge_seq = 0
        self.acked_bridge_seq = 0
        self._cursor = 0  # highest bridge_seq handed to the sink on this connection
        self._sent_high = 0  # highest bridge_seq ever sent (to tell replays apart)

    def __len__(self) -> int:
        return len(self._log)

    def append(self, stream: Stream, entry: Entry) -> None:
        self.last_bridge_seq += 1
        entry.bridge_seq = self.last_bridge_seq
        self._log.append((stream, entry))

    @property
    def first_bridge_seq(self) -> int:
        """bridge_seq of the oldest entry still held (last + 1 when empty)."""
        return self._log[0][1].bridge_seq if self._log else self.last_bridge_seq + 1

    def entries_after(self, bridge_seq: int) -> Iterator[tuple[Stream, Entry]]:
        """Live entries with bridge_seq > ``bridge_seq``, oldest first."""
        start = max(0, bridge_seq + 1 - self.first_bridge_seq)
        for i in range(start, len(self._log)):
            stream, entry = self._log[i]
            if not entry.removed:
                yield stream, entry

    def pop_acked(self, bridge_seq: int) -> list[tuple[Stream, Entry]]:
        """Remove and return entries with bridge_seq <= ``bridge_seq`` (evicted ones included)."""
        if bridge_seq > self.last_bridge_seq:
            raise ValueError(f"ack for bridge_seq {bridge_seq} beyond last {self.last_bridge_seq}")
        out = []
        while self._log and self._log[0][1].bridge_seq <= bridge_seq:
            out.append(self._log.popleft())
        self.acked_bridge_seq = max(self.acked_bridge_seq, bridge_seq)
        return out

    def trim_removed(self) -> None:
        """Drop leading entries that were evicted or acknowledged by watermark."""
        while self._log and self._log[0][1].removed:
            self._log.popleft()

    # -- the sink's send cursor ---------------------------------------------------------------
    def rewind(self) -> None:
        """A new sink connection: send again from the oldest unacknowledged entry."""
        self._cursor = self.acked_bridge_seq

    def take_batch(self, limit: int) -> list[Entry]:
        """Up to ``limit`` live entries after the send cursor, which moves past them."""
        batch = [e for _, e in islice(self.entries_after(self._cursor), limit)]
        if batch:
            self._cursor = batch[-1].bridge_seq
        return batch

    def mark_sent(self, entry: Entry) -> Outgoing | None:
        """``entry`` is being written to the sink: mark it in flight (a ring never evicts it
        then) and return its bytes, or None when it was evicted since :meth:`take_batch`."""
        if entry.removed:
            return None
        entry.in_flight = True
        replay = entry.bridge_seq <= self._sent_high
        self._sent_high = max(self._sent_high, entry.bridge_seq)
        parts = frame_parts(entry)
        return Outgoing(parts, sum(map(len, parts)), replay)

    def clear_in_flight(self) -> None:
        """The sink connection is gone: nothing is in flight any more (all will be replayed)."""
        for _, entry in self._log:
            entry.in_flight = False


def frame_bytes(entry: Entry, extra_gap: Gap | None = None) -> bytes:
    """Wire bytes of a committed entry: the processed core plus its bridge_seq and gap.

    Protobuf merges concatenated messages (scalars: last wins), so the per-send fields are a
    small serialized trailer appended to the core serialized once by the worker.
    """
    return b"".join(frame_parts(entry, extra_gap))


def frame_parts(entry: Entry, extra_gap: Gap | None = None) -> tuple[wire.Part, ...]:
    """:func:`frame_bytes` before the join (the push joins a whole batch at once)."""
    trailer = gap_trailer(entry, extra_gap)
    core = entry.item
    if isinstance(core, tuple):
        return (*core, trailer)
    assert isinstance(core, bytes)
    return (core, trailer)


def gap_trailer(entry: Entry, extra_gap: Gap | None = None) -> bytes:
    """The serialized ``bridge_seq`` and gap (the entry's, merged with ``extra_gap``). Appended
    after :func:`frame_bytes` it overrides the gap there: every gap field is set (seqs start at
    1, counts are positive), and a repeated sub-message merges field by field, last wins."""
    gap = entry.gap
    if extra_gap is not None:
        gap = extra_gap if gap is None else gap.merge(extra_gap)
    if gap is None:  # the common case, without building a message
        return _BRIDGE_SEQ_KEY + wire.encode_varint(entry.bridge_seq)
    trailer = pb.ProcessedFrame(bridge_seq=entry.bridge_seq)
    if gap is not None:
        trailer.gap.CopyFrom(
            pb.Gap(
                first_seq=gap.first_seq, last_seq=gap.last_seq, count=gap.count, reason=gap.reason
            )
        )
    return trailer.SerializeToString()
