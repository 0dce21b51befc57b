"""The server layer's ports: the core's vocabulary and every narrow interface between the core
and the adapters (why: each adapter sees only what it uses, so a new transport or sink is written
against one small Protocol, never the whole bridge, and nothing but the composer names
``BridgeCore``).

Vocabulary: what adapters declare to the core (:class:`CoreConfig`), what it hands back
(:class:`Offer`, :class:`Attached`, :class:`WorkItem`). Pure like the core: no sockets, clocks,
threads or files.

``core.BridgeCore`` satisfies :class:`IngestCore`, :class:`Delivery`, :class:`Work` and
:class:`Budget` structurally and tells a :class:`Listener` (``events.CoreEvents``) what changed;
``ingest.EdgeRegistry`` satisfies :class:`Edges`, :class:`EdgeEvents` and :class:`SpaceEvents`;
``subscribers.SubscriberSet`` satisfies :class:`Subscriptions` and :class:`Fanout`.
``app.BridgeService`` composes them and is imported by no adapter.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from bridge.v1 import bridge_pb2 as pb

if TYPE_CHECKING:
    import asyncio

    from bridge.protocol import codec, wire
    from bridge.protocol.cloud import CloudLayout
    from bridge.protocol.errors import ProtocolError
    from bridge.server.egress import Outgoing
    from bridge.server.governor import Charge, Governor
    from bridge.server.ring import Entry, Policy
    from bridge.server.session import Session, Stream, StreamKey
    from bridge.server.subscribers import Subscriber

# -- the core's vocabulary ------------------------------------------------------------------


class Offer(enum.Enum):
    ACCEPTED = "accepted"
    DUPLICATE = "duplicate"  # at or below accepted_seq: re-acked and ignored
    FULL = "full"  # backpressure: wait for space, then offer again


@dataclass(frozen=True, slots=True)
class CoreConfig:
    limits: codec.Limits
    max_sessions: int
    default_voxel_size: float
    default_policy: Policy
    default_passthrough: bool
    max_known_watermarks: int = 100_000
    session_bytes: int = 24 * 1024  # see SESSION_BYTES
    stream_bytes: int = 1024


# SESSION_BYTES: what one session costs (its connection's buffers and objects, measured ~25 KiB
# per idle WebSocket session, see the README's memory model), charged while the session is known.


@dataclass(frozen=True, slots=True)
class Attached:
    """What :meth:`IngestCore.hello` decided: the session, the Welcome to send, and the connection
    it replaced (a device reconnecting while its old connection looked alive: one connection per
    session, the newest wins; the caller closes the old one)."""

    session: Session
    welcome: pb.Welcome
    superseded: object | None


@dataclass(frozen=True, slots=True)
class WorkItem:
    """Everything a worker needs, immutable once handed off the event loop."""

    stream: Stream
    entry: Entry
    frame: pb.Frame  # a large cloud's frame without its data (that is ``data``)
    layout: CloudLayout | None
    points: int  # input points (0 for telemetry), counted once at admission
    data: bytes | memoryview | None = None  # a large cloud's points, held apart from ``frame``


#: Clouds from this size on are held as (frame without data, data): below it, building the
#: smaller frame costs more than the copies it saves.
SPLIT_DATA_BYTES = 64 * 1024

# -- what the core asks of its neighbours ---------------------------------------------------


class Listener(Protocol):
    """How the core tells the adapters that something changed (called synchronously)."""

    def on_space(self, stream: Stream) -> None: ...
    def on_acks(self, session: Session) -> None: ...
    def on_work(self) -> None: ...
    def on_committed(self, entries: list[tuple[Stream, Entry]]) -> None: ...
    def on_evicted(self, stream: Stream, count: int) -> None: ...


# -- what the adapters ask of the core ------------------------------------------------------


class IngestCore(Protocol):
    """What one edge connection asks of the core."""

    @property
    def attached_sessions(self) -> int: ...
    def hello(
        self, hello: pb.Hello, connection: object, *, identity_proven: bool = False
    ) -> Attached: ...
    def offer(
        self,
        session: Session,
        frame: pb.Frame,
        size: int,
        now_ns: int,
        charge: Charge | None,
        data: bytes | memoryview | None = None,
    ) -> Offer: ...
    def reclaim_for_waiters(self) -> int: ...
    def resume_ready(self, session: Session, stream_id: str, size: int) -> bool: ...
    def detach(self, session: Session, connection: object, now: float) -> None: ...
    def live_connection(self, device_id: str) -> object | None: ...
    def take_acks(self, session: Session) -> pb.Ack | None: ...


class Delivery(Protocol):
    """What the sink pusher asks of the core: batches to send and what became of them. Every
    ``in_flight`` mark and the send cursor live behind this port."""

    def sink_connected(self, marks: list[tuple[StreamKey, int]]) -> None: ...
    def sink_watermarks(self, marks: list[tuple[StreamKey, int]]) -> None: ...
    def next_batch(self, limit: int) -> list[Entry]: ...
    def mark_sent(self, entry: Entry) -> Outgoing | None: ...
    def sink_ack(self, bridge_seq: int) -> list[Entry]: ...
    def sink_failed(self) -> None: ...


class Work(Protocol):
    """What the processor asks of the core: the next frame to process, and its result."""

    def take_work(self, accept: Callable[[Stream], bool] | None = None) -> WorkItem | None: ...
    def complete(self, item: WorkItem, result: bytes | tuple[wire.Part, ...]) -> None: ...


class Budget(Protocol):
    """What ``capacity.Capacity`` asks of the core when the memory plan changes."""

    @property
    def governor(self) -> Governor: ...
    @property
    def streams(self) -> Mapping[StreamKey, Stream]: ...
    @property
    def ring_capacity_per_stream(self) -> int: ...
    def set_memory_budget(self, budget_bytes: int, reserve_bytes: int) -> None: ...


# -- what the adapters ask of each other ----------------------------------------------------


class Edges(Protocol):
    """What a transport adapter (WebSocket, gRPC) asks of the edge registry."""

    @property
    def draining(self) -> bool: ...
    async def serve(
        self,
        transport: EdgeTransport,
        header_token: str = "",
        peer_names: frozenset[str] = frozenset(),
    ) -> None: ...


class EdgeEvents(Protocol):
    """Core notifications the edge registry turns into wake-ups (called synchronously)."""

    def on_space(self, stream: Stream) -> None: ...
    def on_acks(self, session: Session) -> None: ...


class SpaceEvents(Protocol):
    """What admission needs from the edge registry: a stream's "space freed" event, and whether
    the bridge is draining (then nothing more is accepted)."""

    @property
    def draining(self) -> bool: ...
    def space_event(self, key: StreamKey) -> asyncio.Event: ...


class Subscriptions(Protocol):
    """What the Subscribe handler asks of the viewer set."""

    def __len__(self) -> int: ...
    def attach(self, sub: Subscriber, from_bridge_seq: int) -> Iterator[bytes]: ...
    def detach(self, sub: Subscriber) -> None: ...


class Fanout(Protocol):
    def fanout(self, entries: list[tuple[Stream, Entry]]) -> int: ...


@dataclass(slots=True)
class Received:
    """One message and the memory governor's charge for its bytes (granted before reading)."""

    data: bytes | bytearray  # a large WebSocket message is the buffer it was read into
    charge: Charge


class EdgeTransport(Protocol):
    """One edge connection the transport's way (a WebSocket, a gRPC call)."""

    name: str

    async def recv(self) -> Received | None:
        """Next binary message, read only once the governor granted its bytes; None when the
        peer closed."""

    def on_wait(self, notify: Callable[[bool], None]) -> None:
        """Call ``notify(True)`` when reading stops for a grant, ``notify(False)`` after."""

    async def send(self, data: bytes) -> None: ...

    async def reject(self, error: ProtocolError) -> None:
        """Report a fatal error the transport's way (close code / status) and end the call."""

    async def close_going_away(self, reason: str = "bridge shutting down") -> None: ...

    async def ping(self, seconds: float) -> bool | None:
        """Ask the peer for a sign of life now (a Hello for this device's id challenges it:
        :mod:`bridge.server.challenge`). True: it answered within ``seconds``; False: it did
        not, and the transport closes the connection as its keepalive would; None: it cannot
        tell (gRPC has no ping of one call; a WebSocket not being read would not read the
        pong), so nothing is concluded."""
