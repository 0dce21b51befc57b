"""The core's :class:`~bridge.server.ports.Listener`: routes each notification to the one adapter
that cares (why: the core knows no adapter, and no adapter is the listener for the others).

Edge wake-ups go to the edge registry, committed frames to the viewers and the sink pusher, work
to the processor, evictions to the metrics. Every callback only sets a flag, fills a queue or
schedules a call: none of them re-enters the core.
"""

from __future__ import annotations

from collections.abc import Callable

from bridge.server.metrics import BridgeMetrics
from bridge.server.ports import EdgeEvents, Fanout
from bridge.server.ring import Entry
from bridge.server.session import Session, Stream


def _nothing() -> None:
    return None


class _Unwired:
    """Stands in until the composer wires the real adapter (they are built after the core)."""

    def on_space(self, stream: Stream) -> None:
        return None

    def on_acks(self, session: Session) -> None:
        return None

    def fanout(self, entries: list[tuple[Stream, Entry]]) -> int:
        return 0


class CoreEvents:
    def __init__(self, metrics: BridgeMetrics) -> None:
        self._metrics = metrics
        self.edges: EdgeEvents = _Unwired()  # the edge registry
        self.viewers: Fanout = _Unwired()  # the subscriber set
        self.work: Callable[[], None] = _nothing  # the processor's notify, once it exists
        self.committed: Callable[[], None] = _nothing  # the sink pusher's wake, if there is one

    def on_space(self, stream: Stream) -> None:
        self.edges.on_space(stream)

    def on_acks(self, session: Session) -> None:
        self.edges.on_acks(session)

    def on_work(self) -> None:
        self.work()

    def on_committed(self, entries: list[tuple[Stream, Entry]]) -> None:
        dropped = self.viewers.fanout(entries)
        if dropped:
            self._metrics.subscriber_dropped.inc(dropped)
        self.committed()

    def on_evicted(self, stream: Stream, count: int) -> None:
        self._metrics.frames_dropped.labels("drop_oldest").inc(count)
