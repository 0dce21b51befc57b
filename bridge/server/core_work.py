"""The core's work role: which accepted frame the processor takes next, and what becomes of its
result (committed in each stream's order, appended to the egress log, announced).

Lanes order the work, so the sink and viewers get a telemetry frame before the clouds queued
with it, and no lane starves the others (``LANE_BURST``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import cast

from bridge.protocol import wire
from bridge.protocol.cloud import CloudLayout
from bridge.server.core_state import CoreState
from bridge.server.ports import WorkItem
from bridge.server.session import Stream
from bridge.v1 import bridge_pb2 as pb

LANE_BURST = 8  # picks a lane with work may be passed over in a row (see take_work)


class WorkRole(CoreState):
    def _queue_work(self, stream: Stream) -> None:
        if stream.key not in self._queued:
            self._queued.add(stream.key)
            self._work_queues[stream.config.lane - 1].append(stream)
        self.listener.on_work()

    def take_work(self, accept: Callable[[Stream], bool] | None = None) -> WorkItem | None:
        """Next frame to process: the highest lane with pending frames first, round robin over
        its streams (only streams ``accept`` admits, when given: e.g. the cheap ones while every
        worker is busy). Lanes order commits, so the sink and viewers get a telemetry frame
        before the clouds that were queued with it. A lane passed over ``LANE_BURST`` times in
        a row goes first once: an edge that declares everything ``control`` cannot starve the
        other edges' bulk streams (lower lanes keep at least 1 pick in ``LANE_BURST + 1``)."""
        if not self._queued:  # the common miss (called until it returns None): no work at all
            return None
        queues = self._work_queues
        skipped = self._lane_skipped
        order: tuple[int, ...] = (0, 1, 2)
        if max(skipped) >= LANE_BURST:
            starved = max(range(3), key=lambda lane: skipped[lane])
            order = (starved, *(lane for lane in order if lane != starved))
        for lane in order:
            if not queues[lane]:
                continue
            item = self._take_from(queues[lane], accept)
            if item is not None:
                for other in range(3):
                    skipped[other] = (
                        0 if other == lane or not queues[other] else (skipped[other] + 1)
                    )
                return item
        return None

    def _take_from(
        self, queue: deque[Stream], accept: Callable[[Stream], bool] | None
    ) -> WorkItem | None:
        for _ in range(len(queue)):
            stream = queue.popleft()
            if accept is not None and not accept(stream):
                queue.append(stream)
                continue
            entry = stream.ring.take_pending()
            if entry is None:
                self._queued.discard(stream.key)
                continue
            queue.append(stream)
            frame, layout, points, data = cast(
                tuple[pb.Frame, CloudLayout | None, int, bytes | memoryview | None], entry.item
            )
            return WorkItem(stream, entry, frame, layout, points, data)
        return None

    def complete(self, item: WorkItem, result: bytes | tuple[wire.Part, ...]) -> None:
        """A worker produced the serialized ProcessedFrame core for ``item`` (one buffer, or
        parts joined only when sent, so a passthrough payload is not copied once more)."""
        stream = item.stream
        before = stream.ring.occupancy_bytes
        size = len(result) if isinstance(result, bytes) else sum(map(len, result))
        stream.ring.complete(item.entry, result, size)
        committed = [(stream, e) for e in stream.ring.take_committable()]
        for pair in committed:
            self.egress.append(*pair)
        if committed:
            self.listener.on_committed(committed)
            if self.auto_ack:
                self.sink_ack(self.egress.last_bridge_seq)
        if stream.ring.occupancy_bytes < before:
            self.listener.on_space(stream)
