"""Viewers that dial in (``Visualization.Subscribe``): one queue each, bounded in bytes.

Fan-out never waits for a subscriber. Each committed frame is serialized once into a
:class:`SharedFrame`, an immutable buffer that every queue holding it shares and that is charged
to the memory governor once (component ``subscribers``), until the last queue lets go. A frame is
skipped for a subscriber whose queue is over its byte share (or its frame count), or for all of
them when the governor has no room; the next frame that subscriber does get on that stream
carries a ``slow_subscriber`` gap with the exact count, so a slow viewer never slows the bridge
or other viewers, never holds unbounded memory, and never guesses.

All subscriber queues together may hold at most half the governor's reserve, split evenly over
the connected subscribers (``share_bytes``); the rest of the reserve stays for forward progress.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterable, Iterator

from bridge.egress import EgressLog, frame_bytes, gap_trailer
from bridge.governor import Charge, Component, Governor
from bridge.ring import Entry, Gap
from bridge.session import Stream, StreamKey


class SharedFrame:
    """One serialized frame, shared read-only by the queues that hold it."""

    __slots__ = ("charge", "data", "refs")

    def __init__(self, data: bytes, charge: Charge) -> None:
        self.data = data
        self.charge = charge
        self.refs = 0

    def drop_ref(self) -> None:
        self.refs -= 1
        if self.refs == 0:
            self.charge.release()


class Subscriber:
    def __init__(self, stream_ids: set[str], queue_frames: int) -> None:
        self.stream_ids = stream_ids
        self.queue_frames = queue_frames
        self.queued_bytes = 0
        self._queue: deque[tuple[SharedFrame, bytes] | None] = deque()
        self._ready = asyncio.Event()
        self.missed: dict[StreamKey, Gap] = {}

    def __len__(self) -> int:
        return len(self._queue)

    def wants(self, stream: Stream) -> bool:
        return not self.stream_ids or stream.stream_id in self.stream_ids

    def has_room(self, nbytes: int, share_bytes: int) -> bool:
        return len(self._queue) < self.queue_frames and self.queued_bytes + nbytes <= share_bytes

    def miss(self, stream: Stream, entry: Entry) -> None:
        gap = Gap(entry.seq, entry.seq, 1, "slow_subscriber")
        missed = self.missed.get(stream.key)
        self.missed[stream.key] = gap if missed is None else missed.merge(gap)

    def put(self, stream: Stream, entry: Entry, shared: SharedFrame) -> None:
        """Queue ``shared``; a pending gap for this stream rides in a small trailer."""
        missed = self.missed.pop(stream.key, None)
        trailer = b"" if missed is None else gap_trailer(entry, missed)
        shared.refs += 1
        self.queued_bytes += len(shared.data) + len(trailer)
        self._queue.append((shared, trailer))
        self._ready.set()

    async def get(self) -> bytes | None:
        """The next frame's bytes (None: the subscription ended)."""
        while not self._queue:
            self._ready.clear()
            await self._ready.wait()
        item = self._queue.popleft()
        if item is None:
            return None
        shared, trailer = item
        self.queued_bytes -= len(shared.data) + len(trailer)
        data = shared.data + trailer if trailer else shared.data
        shared.drop_ref()
        return data

    def close(self) -> None:
        """End the subscription after what is queued."""
        self._queue.append(None)
        self._ready.set()

    def discard(self) -> None:
        """The viewer went away: give back every shared frame still queued."""
        while self._queue:
            item = self._queue.popleft()
            if item is not None:
                item[0].drop_ref()
        self.queued_bytes = 0


class SubscriberSet:
    """Every attached viewer; the backlog a new one asks for comes from ``log``."""

    def __init__(self, log: EgressLog, governor: Governor) -> None:
        self._log = log
        self.governor = governor
        self._subs: set[Subscriber] = set()

    def __len__(self) -> int:
        return len(self._subs)

    @property
    def share_bytes(self) -> int:
        """Bytes one subscriber's queue may hold (half the reserve, split evenly)."""
        return self.governor.reserve_bytes // 2 // max(1, len(self._subs))

    def attach(self, sub: Subscriber, from_bridge_seq: int) -> Iterator[bytes]:
        """Register ``sub``; returns its backlog after ``from_bridge_seq`` (0 = live only),
        serialized one frame at a time as it is read (never the whole log copied at once)."""
        log = self._log
        if from_bridge_seq and from_bridge_seq + 1 < log.first_bridge_seq:
            raise ValueError(
                f"bridge_seq {from_bridge_seq + 1} is no longer held "
                f"(oldest is {log.first_bridge_seq})"
            )
        self._subs.add(sub)
        until = log.last_bridge_seq if from_bridge_seq else 0
        return backlog(sub, log, from_bridge_seq, until)

    def detach(self, sub: Subscriber) -> None:
        self._subs.discard(sub)
        sub.discard()

    def fanout(self, entries: Iterable[tuple[Stream, Entry]]) -> int:
        """Offer committed entries to every subscriber; returns how many deliveries were dropped."""
        dropped = 0
        share = self.share_bytes
        for stream, entry in entries:
            wanting = [s for s in self._subs if s.wants(stream)]
            if not wanting:
                continue
            data = frame_bytes(entry)
            takers = [s for s in wanting if s.has_room(len(data), share)]
            charge = self.governor.try_charge(Component.SUBSCRIBERS, len(data)) if takers else None
            if charge is None:
                takers = []
            else:
                shared = SharedFrame(data, charge)
                for sub in takers:
                    sub.put(stream, entry, shared)
            for sub in wanting:
                if sub not in takers:
                    sub.miss(stream, entry)
                    dropped += 1
        return dropped

    def close_all(self) -> None:
        for sub in self._subs:
            sub.close()


def backlog(sub: Subscriber, log: EgressLog, after: int, until: int) -> Iterator[bytes]:
    """Frames ``after < bridge_seq <= until`` that ``sub`` wants, serialized one at a time (a
    resumed viewer never makes the bridge copy the whole log at once)."""
    cursor = after
    while cursor < until:
        found = next(iter(log.entries_after(cursor)), None)
        if found is None:
            return
        stream, entry = found
        if entry.bridge_seq > until:
            return
        cursor = entry.bridge_seq
        if sub.wants(stream) and not entry.removed:
            yield frame_bytes(entry)
