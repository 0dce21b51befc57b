"""Viewers that dial in (``Visualization.Subscribe``): one bounded queue each.

Fan-out never waits for a subscriber. When a queue is full the frame is skipped for that
subscriber only, and the next frame it does get on that stream carries a ``slow_subscriber`` gap
with the exact count, so a slow viewer never slows the bridge or other viewers and never guesses.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from bridge.egress import EgressLog, frame_bytes
from bridge.ring import Entry, Gap
from bridge.session import Stream, StreamKey


class Subscriber:
    def __init__(self, stream_ids: set[str], queue_frames: int) -> None:
        self.stream_ids = stream_ids
        self.queue: asyncio.Queue[bytes | None] = asyncio.Queue(maxsize=queue_frames)
        self.missed: dict[StreamKey, Gap] = {}

    def wants(self, stream: Stream) -> bool:
        return not self.stream_ids or stream.stream_id in self.stream_ids

    def offer(self, stream: Stream, entry: Entry) -> bool:
        """Queue the frame, or remember it as missed. Returns False when it was dropped."""
        missed = self.missed.get(stream.key)
        if self.queue.full():
            gap = Gap(entry.seq, entry.seq, 1, "slow_subscriber")
            self.missed[stream.key] = gap if missed is None else missed.merge(gap)
            return False
        if missed is not None:
            del self.missed[stream.key]
        self.queue.put_nowait(frame_bytes(entry, missed))
        return True

    async def get(self) -> bytes | None:
        return await self.queue.get()

    def close(self) -> None:
        """End the subscription after what is queued (best effort when the queue is full)."""
        try:
            self.queue.put_nowait(None)
        except asyncio.QueueFull:
            _ = self.queue.get_nowait()
            self.queue.put_nowait(None)


class SubscriberSet:
    """Every attached viewer; the backlog a new one asks for comes from ``log``."""

    def __init__(self, log: EgressLog) -> None:
        self._log = log
        self._subs: set[Subscriber] = set()

    def __len__(self) -> int:
        return len(self._subs)

    def attach(self, sub: Subscriber, from_bridge_seq: int) -> list[bytes]:
        """Register ``sub``; returns the backlog after ``from_bridge_seq`` (0 = live only)."""
        log = self._log
        backlog: list[bytes] = []
        if from_bridge_seq:
            if from_bridge_seq + 1 < log.first_bridge_seq:
                raise ValueError(
                    f"bridge_seq {from_bridge_seq + 1} is no longer held "
                    f"(oldest is {log.first_bridge_seq})"
                )
            backlog = [
                frame_bytes(e) for s, e in log.entries_after(from_bridge_seq) if sub.wants(s)
            ]
        self._subs.add(sub)
        return backlog

    def detach(self, sub: Subscriber) -> None:
        self._subs.discard(sub)

    def fanout(self, entries: Iterable[tuple[Stream, Entry]]) -> int:
        """Offer committed entries to every subscriber; returns how many deliveries were dropped."""
        dropped = 0
        for stream, entry in entries:
            for sub in self._subs:
                if sub.wants(stream) and not sub.offer(stream, entry):
                    dropped += 1
        return dropped

    def close_all(self) -> None:
        for sub in self._subs:
            sub.close()
