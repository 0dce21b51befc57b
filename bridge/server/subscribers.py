"""Viewers that dial in (``Visualization.Subscribe``): one queue each, bounded in bytes.

Fan-out never waits for a subscriber. Each committed frame is serialized once into a
:class:`SharedFrame`, an immutable buffer that every queue holding it shares and that is charged
to the memory governor once (component ``subscribers``), until the last queue lets go. A frame is
skipped for a subscriber whose queue is over its byte share (or its frame count), or for all of
them when the governor has no room; the next frame that subscriber does get on that stream
carries a ``slow_subscriber`` gap with the exact count, so a slow viewer never slows the bridge
or other viewers, never holds unbounded memory, and never guesses.

In a pod, frames another process serialized for this viewer (``bridge.server.podfeed``) meet
the same rule one at a time (:meth:`SubscriberSet.relay`): each is charged for itself, and a
skipped one's gap (with any gap it carried) rides on the stream's next frame.

All subscriber queues together may hold at most half the governor's reserve, split evenly over
the connected subscribers (``share_bytes``); the rest of the reserve stays for forward progress.

Charged before allocating (docs/design.md "Where memory goes"): a frame's charge is taken before
its parts are joined, and covers, besides the shared buffer, each taker's copies while its stream
sends it (grpc's copy of the bytes yielded, plus the frame joined with its gap trailer when one
rides along). A subscriber keeps its last frame, and that charge, until it asks for the next one:
the gRPC handler still references the bytes until then. A resumed viewer's backlog is serialized
one frame at a time, force-charged for the same copies (at most ``max_subscribers`` frames).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterable, Iterator

from bridge.server.egress import EgressLog, frame_parts, gap_trailer
from bridge.server.governor import Charge, Component, Governor
from bridge.server.relayed import relay_trailer, scan_head
from bridge.server.ring import Entry, Gap
from bridge.server.session import Stream, StreamKey

#: Copies of a backlog frame alive while it is sent: the join, and grpc's copy of it.
BACKLOG_COPIES = 2


def send_bytes(nbytes: int, trailer: int) -> int:
    """What one subscriber's stream holds besides the shared buffer while it sends a frame of
    ``nbytes``: grpc's copy, and the frame joined with a gap ``trailer`` when there is one."""
    whole = nbytes + trailer
    return whole + (whole if trailer else 0)


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
        self._sending: SharedFrame | None = None  # returned by get(), held until the next one
        self._ready = asyncio.Event()
        self.missed: dict[StreamKey, Gap] = {}

    def __len__(self) -> int:
        return len(self._queue)

    def wants(self, stream: Stream) -> bool:
        return not self.stream_ids or stream.stream_id in self.stream_ids

    def has_room(self, nbytes: int, share_bytes: int) -> bool:
        return len(self._queue) < self.queue_frames and self.queued_bytes + nbytes <= share_bytes

    def miss(self, key: StreamKey, seq: int, carried: Gap | None = None) -> None:
        """Frame ``seq`` of ``key`` is skipped for this subscriber; ``carried``: the gap that
        frame itself announced (a relayed frame's), which the next one must announce instead."""
        gap = Gap(seq, seq, 1, "slow_subscriber")
        if carried is not None:
            gap = carried.merge(gap)
        missed = self.missed.get(key)
        self.missed[key] = gap if missed is None else missed.merge(gap)

    def trailer(self, stream: Stream, entry: Entry) -> bytes:
        """The gap trailer ``entry`` would carry for this subscriber now (b"": none)."""
        missed = self.missed.get(stream.key)
        return b"" if missed is None else gap_trailer(entry, missed)

    def put(self, key: StreamKey, shared: SharedFrame, trailer: bytes) -> None:
        """Queue ``shared``; the pending gap for this stream rides in ``trailer``
        (:meth:`trailer`, taken before the frame was charged)."""
        self.missed.pop(key, None)
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
            self._done_sending()
            return None
        shared, trailer = item
        self.queued_bytes -= len(shared.data) + len(trailer)
        data = shared.data + trailer if trailer else shared.data
        self._done_sending()  # only now: the caller held the previous frame's bytes until here
        self._sending = shared
        return data

    def _done_sending(self) -> None:
        if self._sending is not None:
            sending, self._sending = self._sending, None
            sending.drop_ref()

    def close(self) -> None:
        """End the subscription after what is queued."""
        self._queue.append(None)
        self._ready.set()

    def discard(self) -> None:
        """The viewer went away: give back every shared frame still queued (and the one sent)."""
        self._done_sending()
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
        return backlog(sub, log, from_bridge_seq, until, self.governor)

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
            parts = frame_parts(entry)
            nbytes = sum(map(len, parts))
            takers = [s for s in wanting if s.has_room(nbytes, share)]
            charge = None
            if takers:  # charged before the join: a refused frame is never copied
                trailers = [s.trailer(stream, entry) for s in takers]
                sends = sum(send_bytes(nbytes, len(t)) for t in trailers)
                charge = self.governor.try_charge(Component.SUBSCRIBERS, nbytes + sends)
            if charge is None:
                takers = []
            else:
                shared = SharedFrame(b"".join(parts), charge)
                for sub, trailer in zip(takers, trailers, strict=True):
                    sub.put(stream.key, shared, trailer)
            for sub in wanting:
                if sub not in takers:
                    sub.miss(stream.key, entry.seq)
                    dropped += 1
        return dropped

    def relay(self, sub: Subscriber, data: bytes) -> bool:
        """Offer ``sub`` a frame another process of the pod serialized (``bridge.server.podfeed``)
        under the rule :meth:`fanout` applies to local frames: queued and charged when its queue
        and the governor have room, else skipped and announced as a gap with the stream's next
        frame. Returns False when skipped. Raises ``ValueError`` for bytes that are not a frame."""
        head = scan_head(data)
        nbytes = len(data)
        if sub.has_room(nbytes, self.share_bytes):
            missed = sub.missed.get(head.key)
            trailer = b"" if missed is None else relay_trailer(head, missed)
            charge = self.governor.try_charge(
                Component.SUBSCRIBERS, nbytes + send_bytes(nbytes, len(trailer))
            )
            if charge is not None:
                sub.put(head.key, SharedFrame(data, charge), trailer)
                return True
        sub.miss(head.key, head.seq, head.gap)
        return False

    def close_all(self) -> None:
        for sub in self._subs:
            sub.close()


def backlog(
    sub: Subscriber, log: EgressLog, after: int, until: int, governor: Governor
) -> Iterator[bytes]:
    """Frames ``after < bridge_seq <= until`` that ``sub`` wants, serialized one at a time (a
    resumed viewer never makes the bridge copy the whole log at once). Each is force-charged
    (:data:`BACKLOG_COPIES`) before it is joined, until the next one is joined: the caller
    holds the bytes it was given until it asks for more."""
    cursor = after
    held: Charge | None = None
    try:
        while cursor < until:
            found = next(iter(log.entries_after(cursor)), None)
            if found is None:
                return
            stream, entry = found
            if entry.bridge_seq > until:
                return
            cursor = entry.bridge_seq
            if sub.wants(stream) and not entry.removed:
                parts = frame_parts(entry)
                charge = governor.force(
                    Component.SUBSCRIBERS, BACKLOG_COPIES * sum(map(len, parts))
                )
                data = b"".join(parts)
                if held is not None:
                    held.release()
                held = charge
                yield data
                del data
    finally:
        if held is not None:
            held.release()
