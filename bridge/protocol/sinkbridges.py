"""Which bridge a push stream comes from, and the sink's per-bridge state (sans-I/O: ``now`` is a
monotonic second).

Why: with replicas every bridge pushes to the same sink, and ``bridge_seq`` is consecutive per
bridge process only (docs/protocol.md §10). A status that folds every stream's acks into one
number (a max) mixes unrelated sequence spaces; a sink keeps them apart by the bridge's name,
which a bridge sends as the ``x-simbridge-bridge`` metadata of each stream it opens. A bridge
that sends none (older) is tracked under the empty name, as before.

Bounded: at most ``cap`` bridges are tracked. A new name evicts the bridge idle longest (no
stream open); when every tracked bridge has a stream open, the new stream is served but not
tracked (counted in ``untracked_streams``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

#: The metadata naming the bridge on each Push / PushBatch stream it opens.
BRIDGE_HEADER = "x-simbridge-bridge"
#: The longest name kept (a sink reads the header from a peer it does not control).
MAX_NAME_CHARS = 128
#: Bridges tracked at once by default.
MAX_BRIDGES = 64


def bridge_named(metadata: Iterable[tuple[str, str | bytes]] | None) -> str:
    """The bridge a stream's metadata names ("" when none), cut to MAX_NAME_CHARS."""
    for key, value in metadata or ():
        if key == BRIDGE_HEADER:
            text = value.decode("ascii", "replace") if isinstance(value, bytes) else str(value)
            return text[:MAX_NAME_CHARS]
    return ""


@dataclass
class BridgeState:
    """What the sink knows of one bridge."""

    bridge_id: str
    last_seen: float
    push_streams: int = 0  # push streams opened (watermark queries not included)
    active_push_streams: int = 0
    marks_queries: int = 0  # streams that only asked for one device's watermarks
    open_queries: int = 0
    #: The last ack on this bridge's newest push stream: acks are cumulative per stream and a
    #: restarted bridge (same name) starts again from 1, so this is not a max over streams.
    acked_bridge_seq: int = 0
    frames_received: int = 0  # duplicates included
    newest_stream: int = 0

    @property
    def idle(self) -> bool:
        return self.active_push_streams == 0 and self.open_queries == 0

    def as_dict(self, now: float) -> dict[str, object]:
        return {
            "bridge_id": self.bridge_id,
            "connected": self.active_push_streams > 0,
            "push_streams": self.push_streams,
            "active_push_streams": self.active_push_streams,
            "marks_queries": self.marks_queries,
            "acked_bridge_seq": self.acked_bridge_seq,
            "frames_received": self.frames_received,
            "seconds_since_seen": round(max(0.0, now - self.last_seen), 3),
        }


@dataclass(frozen=True)
class Ticket:
    """One stream's handle on its bridge's state (``state`` None: not tracked)."""

    state: BridgeState | None
    number: int
    query: bool


class BridgeTable:
    def __init__(self, cap: int = MAX_BRIDGES) -> None:
        if cap < 1:
            raise ValueError("cap must be >= 1")
        self.cap = cap
        self.bridges: dict[str, BridgeState] = {}
        self.untracked_streams = 0
        self._streams = 0

    def opened(self, bridge_id: str, now: float, *, query: bool = False) -> Ticket:
        """A stream from ``bridge_id`` opened; ``query``: it only asks for watermarks."""
        self._streams += 1
        state = self.bridges.get(bridge_id) or self._admit(bridge_id, now)
        if state is None:
            self.untracked_streams += 1
            return Ticket(None, self._streams, query)
        state.last_seen = now
        if query:
            state.marks_queries += 1
            state.open_queries += 1
        else:
            state.push_streams += 1
            state.active_push_streams += 1
            state.newest_stream = self._streams
        return Ticket(state, self._streams, query)

    def received(self, ticket: Ticket, frames: int, now: float) -> None:
        if ticket.state is not None:
            ticket.state.frames_received += frames
            ticket.state.last_seen = now

    def acked(self, ticket: Ticket, high: int, now: float) -> None:
        state = ticket.state
        if state is not None and ticket.number == state.newest_stream:
            state.acked_bridge_seq = high
            state.last_seen = now

    def closed(self, ticket: Ticket, now: float) -> None:
        state = ticket.state
        if state is None:
            return
        state.last_seen = now
        if ticket.query:
            state.open_queries -= 1
        else:
            state.active_push_streams -= 1

    def report(self, now: float) -> list[dict[str, object]]:
        """Every tracked bridge, by name."""
        return [self.bridges[name].as_dict(now) for name in sorted(self.bridges)]

    def _admit(self, bridge_id: str, now: float) -> BridgeState | None:
        if len(self.bridges) >= self.cap:
            idle = [s for s in self.bridges.values() if s.idle]
            if not idle:
                return None
            del self.bridges[min(idle, key=lambda s: s.last_seen).bridge_id]
        state = self.bridges[bridge_id] = BridgeState(bridge_id, now)
        return state
