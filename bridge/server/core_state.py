"""What every role of :class:`~bridge.server.core.BridgeCore` shares: its state, and the calls one
role makes on another, declared here so each role's file states what it relies on.

The roles (one file each, mixed into ``BridgeCore``): ``core_ingest`` (hello, offers, the edge's
acks), ``core_work`` (frames for the processor), ``core_delivery`` (the sink's batches, acks and
watermarks), ``core_budget`` (ring shares, reclaim) and ``core_expiry`` (how sessions end). Sans-I/O
like all of them: times come in as arguments.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Awaitable, Callable

from bridge.server.egress import EgressLog
from bridge.server.governor import Charge, Governor
from bridge.server.ports import CoreConfig, Listener
from bridge.server.ring import Entry
from bridge.server.session import Session, Stream, StreamKey


class CoreState(ABC):
    def __init__(self, config: CoreConfig, listener: Listener, governor: Governor) -> None:
        self.config = config
        self.listener = listener
        self.governor = governor
        self.sessions: dict[str, Session] = {}  # by session id (the resume token)
        self.by_device: dict[str, Session] = {}
        self.streams: dict[StreamKey, Stream] = {}
        self.egress = EgressLog()
        self.auto_ack = False  # no sink configured: delivered once offered to subscribers
        self._state_charges: dict[str, Charge] = {}  # session id -> its state's charge
        # Work: streams with PENDING entries, one round-robin queue per lane (index = lane - 1).
        self._work_queues: tuple[deque[Stream], ...] = (deque(), deque(), deque())
        self._lane_skipped = [0, 0, 0]  # picks in a row that passed over a lane with work
        self._queued: set[StreamKey] = set()
        # Delivery: the sink's marks for streams not known here yet (applied at their Hello).
        self._watermarks: dict[StreamKey, int] = {}
        # Set by the sink pusher (push_impl.MarksLookup): asks the sink for one device's marks.
        self.marks_lookup: Callable[[str], Awaitable[list[tuple[StreamKey, int]]]] | None = None
        # Set in a pod (bridge.server.podlink): a device's session left this process.
        self.on_forget: Callable[[str], None] | None = None

    # -- what one role asks of another --------------------------------------------------------
    @abstractmethod
    def _mark_dirty(self, stream: Stream, *, urgent: bool) -> None:
        """core_ingest: the edge is owed an Ack for ``stream``."""

    @abstractmethod
    def _queue_work(self, stream: Stream) -> None:
        """core_work: ``stream`` has a frame to process."""

    @abstractmethod
    def sink_ack(self, bridge_seq: int) -> list[Entry]:
        """core_delivery: the sink holds everything up to ``bridge_seq``."""

    @abstractmethod
    def _delivered_elsewhere(self, stream: Stream, seq: int) -> None:
        """core_delivery: the sink holds ``stream`` up to ``seq``."""

    @abstractmethod
    def _rebalance_rings(self) -> None:
        """core_budget: the number of streams changed; every ring to its fair share."""

    @property
    @abstractmethod
    def ring_capacity_per_stream(self) -> int:
        """core_budget: each stream's fair share of the admission limit."""

    @abstractmethod
    def _make_room_for_a_session(self) -> None:
        """core_expiry: a new session is coming; forget a detached one if the table is full."""
