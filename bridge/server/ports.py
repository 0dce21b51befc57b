"""The narrow interfaces between the core and the adapters (why: each adapter sees only what it
uses, so a new transport or sink is written against one small Protocol, never the whole bridge).

``BridgeCore`` satisfies :class:`IngestCore` and :class:`Delivery` structurally;
``ingest.EdgeRegistry`` satisfies :class:`Edges` and :class:`EdgeEvents`;
``subscribers.SubscriberSet`` satisfies :class:`Subscriptions` and :class:`Fanout`.
``app.BridgeService`` composes them and is imported by no adapter.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from bridge.v1 import bridge_pb2 as pb

if TYPE_CHECKING:
    from bridge.protocol.errors import ProtocolError
    from bridge.server.core import Attached, Offer
    from bridge.server.egress import Outgoing
    from bridge.server.governor import Charge
    from bridge.server.ring import Entry
    from bridge.server.session import Session, Stream, StreamKey
    from bridge.server.subscribers import Subscriber


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
