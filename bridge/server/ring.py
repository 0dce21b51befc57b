"""Per-stream ring bounded in bytes (sans-I/O).

A frame enters at acceptance and leaves only when the visualization side has acknowledged its
processed result (or when a ``drop_oldest`` stream evicts it). Entries move through
``PENDING -> PROCESSING -> READY`` and are charged their current size: the raw frame until it is
processed, the (usually much smaller) processed result afterwards.

Capacity is the stream's fair share of the memory governor's admission limit, with no floor: a
frame larger than the share is admitted only into an otherwise empty ring (it borrows the room
of streams that are not using theirs; the governor has already granted its bytes). Each entry
carries its governor charge and releases it exactly once, when it leaves the ring.

``backpressure`` never drops: a full ring refuses admission and the ingest adapter stops reading.
``drop_oldest`` evicts the oldest evictable entries to make room, counts them and attaches a
:class:`Gap` to the next surviving entry of the stream so the viewer is told, never left to guess.
An entry is evictable unless a worker is processing it or it is in flight to the sink.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol


class Held(Protocol):
    """The governor charge an entry holds (see :class:`bridge.server.governor.Charge`)."""

    def release(self) -> None: ...
    def resize(self, nbytes: int) -> None: ...


class Policy(enum.Enum):
    BACKPRESSURE = "backpressure"
    DROP_OLDEST = "drop_oldest"


class State(enum.Enum):
    PENDING = 1
    PROCESSING = 2
    READY = 3


@dataclass(slots=True)
class Gap:
    """Frames ``first_seq..last_seq`` (``count`` of them) were not delivered before this one."""

    first_seq: int
    last_seq: int
    count: int
    reason: str

    def merge(self, other: Gap) -> Gap:
        reason = self.reason if self.reason == other.reason else "mixed"
        return Gap(
            min(self.first_seq, other.first_seq),
            max(self.last_seq, other.last_seq),
            self.count + other.count,
            reason,
        )


@dataclass(slots=True, eq=False)
class Entry:
    seq: int
    size: int
    item: object  # the accepted frame, then the processed result
    ingest_ns: int = 0
    state: State = State.PENDING
    gap: Gap | None = None
    bridge_seq: int = 0  # set when committed to the egress log
    in_flight: bool = False  # sent to the sink, not yet acknowledged
    removed: bool = False  # acknowledged or evicted: egress skips it
    charge: Held | None = None  # released when the entry leaves the ring

    def release(self) -> None:
        """Leave the ring: drop the data (the egress log may still list the entry) and give
        its bytes back to the governor, exactly once."""
        self.removed = True
        self.item = None
        if self.charge is not None:
            charge, self.charge = self.charge, None
            charge.release()


class AdmitResult(enum.Enum):
    ACCEPTED = "accepted"
    FULL = "full"  # backpressure: try again when space frees up


@dataclass(slots=True)
class RingStats:
    admitted: int = 0
    delivered: int = 0
    evicted: int = 0


class StreamRing:
    """Ordered entries of one stream, bounded by ``capacity_bytes``."""

    def __init__(self, capacity_bytes: int, policy: Policy = Policy.BACKPRESSURE) -> None:
        if capacity_bytes < 0:
            raise ValueError(f"capacity_bytes must be >= 0, got {capacity_bytes}")
        self.capacity_bytes = capacity_bytes
        self.policy = policy
        self.occupancy_bytes = 0
        self.stats = RingStats()
        self._entries: deque[Entry] = deque()
        # Work lists in seq order so the hot path is O(1): entries not yet taken by a worker, and
        # entries not yet committed to the egress log. Removed entries are skipped lazily.
        self._pending: deque[Entry] = deque()
        self._uncommitted: deque[Entry] = deque()
        self._pending_gap: Gap | None = None  # evictions with no later entry yet

    # -- inspection -------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[Entry]:
        return iter(self._entries)

    @property
    def free_bytes(self) -> int:
        return max(0, self.capacity_bytes - self.occupancy_bytes)

    def _room(self, size: int) -> bool:
        # One frame above the share is allowed into an empty ring (it borrows; no floor).
        return self.occupancy_bytes + size <= self.capacity_bytes or not self._entries

    # -- admission --------------------------------------------------------------------------
    def admit(
        self,
        seq: int,
        size: int,
        item: object,
        *,
        ingest_ns: int = 0,
        gap: Gap | None = None,
        charge: Held | None = None,
    ) -> tuple[AdmitResult, list[Entry]]:
        """Admit a frame (taking over ``charge``), or report FULL (the caller keeps it).
        Returns the entries evicted to make room."""
        if self._entries and seq <= self._entries[-1].seq:
            raise ValueError(f"seq {seq} is not above the ring's last seq {self._entries[-1].seq}")
        evicted: list[Entry] = []
        if not self._room(size):
            if self.policy is Policy.BACKPRESSURE:
                return AdmitResult.FULL, []
            evicted = self._evict_until(max(0, self.capacity_bytes - size))
            if not self._room(size):
                return AdmitResult.FULL, evicted
        entry = Entry(seq, size, item, ingest_ns=ingest_ns, gap=gap, charge=charge)
        if self._pending_gap is not None:
            entry.gap = (
                self._pending_gap if entry.gap is None else self._pending_gap.merge(entry.gap)
            )
            self._pending_gap = None
        self._entries.append(entry)
        self._pending.append(entry)
        self._uncommitted.append(entry)
        self.occupancy_bytes += size
        self.stats.admitted += 1
        return AdmitResult.ACCEPTED, evicted

    def hold_newest(self, charge: Held) -> None:
        """The entry just accepted holds ``charge`` (taken over) until it leaves the ring."""
        self._entries[-1].charge = charge

    def release_all(self) -> None:
        """The stream is forgotten: every entry's charge goes back to the governor."""
        for entry in self._entries:
            entry.release()
        self._entries.clear()
        self._pending.clear()
        self._uncommitted.clear()
        self.occupancy_bytes = 0

    def evict_bytes(self, nbytes: int) -> list[Entry]:
        """Free at least ``nbytes`` if evictable entries allow (drop_oldest only)."""
        if self.policy is not Policy.DROP_OLDEST or nbytes <= 0:
            return []
        return self._evict_until(max(0, self.occupancy_bytes - nbytes))

    def _evict_until(self, target_bytes: int) -> list[Entry]:
        """Evict oldest evictable entries until occupancy <= target (drop_oldest only)."""
        evicted: list[Entry] = []
        kept: deque[Entry] = deque()
        while self._entries and self.occupancy_bytes > target_bytes:
            entry = self._entries.popleft()
            if entry.state is State.PROCESSING or entry.in_flight:
                kept.append(entry)
                continue
            self._drop(entry)
            evicted.append(entry)
        kept.extend(self._entries)
        self._entries = kept
        if evicted:
            self._announce(evicted)
        return evicted

    def _drop(self, entry: Entry) -> None:
        entry.release()
        self.occupancy_bytes -= entry.size
        self.stats.evicted += 1

    def _announce(self, evicted: list[Entry]) -> None:
        """Attach a gap for the evicted seqs to the next surviving entry (or keep it pending)."""
        gap = Gap(evicted[0].seq, evicted[-1].seq, len(evicted), "drop_oldest")
        for e in evicted:  # carry gaps the evicted entries were announcing
            if e.gap is not None:
                gap = gap.merge(e.gap)
        last = evicted[-1].seq
        for entry in self._entries:
            if entry.seq > last:
                entry.gap = gap if entry.gap is None else entry.gap.merge(gap)
                return
        self._pending_gap = gap if self._pending_gap is None else self._pending_gap.merge(gap)

    # -- processing -------------------------------------------------------------------------
    def take_pending(self) -> Entry | None:
        """The oldest PENDING entry, now marked PROCESSING (None when there is none)."""
        while self._pending:
            entry = self._pending.popleft()
            if not entry.removed:
                entry.state = State.PROCESSING
                return entry
        return None

    def complete(self, entry: Entry, result: object, result_size: int) -> None:
        """A worker finished ``entry``: charge the result's size instead of the raw frame's."""
        if entry.removed:
            return
        entry.state = State.READY
        entry.item = result
        self.occupancy_bytes += result_size - entry.size
        entry.size = result_size
        if entry.charge is not None:
            entry.charge.resize(result_size)

    def take_committable(self) -> list[Entry]:
        """READY entries not yet committed whose predecessors are all committed (seq order)."""
        out: list[Entry] = []
        queue = self._uncommitted
        while queue and (queue[0].removed or queue[0].state is State.READY):
            entry = queue.popleft()
            if not entry.removed:
                out.append(entry)
        return out

    # -- delivery ---------------------------------------------------------------------------
    def ack(self, seq: int) -> int:
        """Cumulative ack: every entry with seq <= ``seq`` is delivered. Returns bytes freed."""
        freed = 0
        while self._entries and self._entries[0].seq <= seq:
            entry = self._entries.popleft()
            entry.release()
            freed += entry.size
            self.stats.delivered += 1
        self.occupancy_bytes -= freed
        if self._pending_gap is not None and self._pending_gap.last_seq <= seq:
            self._pending_gap = None
        return freed

    # -- live resize ------------------------------------------------------------------------
    def resize(self, capacity_bytes: int) -> list[Entry]:
        """Change capacity live. Shrinking below occupancy evicts only under drop_oldest;
        under backpressure the ring simply admits nothing until delivery drains it."""
        if capacity_bytes < 0:
            raise ValueError(f"capacity_bytes must be >= 0, got {capacity_bytes}")
        self.capacity_bytes = capacity_bytes
        if self.policy is Policy.DROP_OLDEST and self.occupancy_bytes > capacity_bytes:
            return self._evict_until(capacity_bytes)
        return []
