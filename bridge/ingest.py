"""Edge connections, transport-agnostic: Hello → Welcome, then frames in and acks out.

The WebSocket and gRPC adapters wrap each connection in an ``EdgeTransport`` and hand it to
:meth:`EdgeRegistry.serve`; every rule lives in the core, so both transports behave identically.
The registry owns what connections share: the live set, the per-stream "space freed" events, the
ack wake-ups and the draining flag. Backpressure: when a ring is full a connection stops reading
(the transport's own flow control then stops the sender) and tells the edge with
``FlowControl PAUSE`` / ``RESUME``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import time
import weakref
from dataclasses import dataclass
from typing import Any

from bridge import codec
from bridge.core import Offer
from bridge.errors import (
    FrameTooLarge,
    HelloTimeout,
    ProtocolError,
    ProtocolViolation,
    TooManyPending,
    Unauthenticated,
)
from bridge.logs import RateLimitedLog
from bridge.metrics import BridgeMetrics
from bridge.ports import EdgeTransport, IngestCore
from bridge.session import Session, Stream, StreamKey
from bridge.settings import Settings
from bridge.v1 import bridge_pb2 as pb

log = logging.getLogger("bridge.ingest")
# One line per reason, then a count at most every 10 s: a fuzzer must not fill the disk.
_refusals = RateLimitedLog(log, interval_seconds=10.0)


@dataclass(frozen=True, slots=True)
class IngestConfig:
    limits: codec.Limits
    auth_token: str = ""
    ack_interval_seconds: float = 0.01
    ack_accepted_delay_seconds: float = 0.05
    reconnect_after_ms: int = 1000
    hello_timeout_seconds: float = 5.0
    max_pending_connections: int = 256

    @classmethod
    def from_settings(cls, settings: Settings, limits: codec.Limits) -> IngestConfig:
        return cls(
            limits=limits,
            auth_token=settings.auth_token,
            ack_interval_seconds=settings.ack_interval_seconds,
            ack_accepted_delay_seconds=settings.ack_accepted_delay_seconds,
            reconnect_after_ms=settings.reconnect_after_ms,
            hello_timeout_seconds=settings.hello_timeout_seconds,
            max_pending_connections=settings.max_pending_connections,
        )


class EdgeRegistry:
    """Every attached edge connection and what they share (implements ``ports.Edges`` for the
    transports and ``ports.EdgeEvents`` for the core)."""

    def __init__(self, core: IngestCore, config: IngestConfig, metrics: BridgeMetrics) -> None:
        self._core = core
        self._config = config
        self._metrics = metrics
        self._connections: set[EdgeConnection] = set()
        # Weak: an event lives only while a connection waits on it, so sessions the core
        # forgets (expiry, eviction for room, churn) leave nothing behind here.
        self._space: weakref.WeakValueDictionary[StreamKey, asyncio.Event] = (
            weakref.WeakValueDictionary()
        )
        self.pending = 0  # connections that have not completed Hello
        self._tasks: set[asyncio.Task[None]] = set()
        self._draining = False

    def __len__(self) -> int:
        return len(self._connections)

    @property
    def tracked_streams(self) -> int:
        """Per-stream wake-up events held (bounded by the streams waiting for room)."""
        return len(self._space)

    @property
    def draining(self) -> bool:
        return self._draining

    async def serve(self, transport: EdgeTransport, header_token: str = "") -> None:
        """Run one edge connection until it ends."""
        conn = EdgeConnection(
            self, self._core, self._config, self._metrics, transport, header_token=header_token
        )
        await conn.run()

    # -- core notifications (EdgeEvents) --------------------------------------------------
    def on_space(self, stream: Stream) -> None:
        event = self._space.get(stream.key)
        if event is not None:
            event.set()

    def on_acks(self, session: Session) -> None:
        conn = session.connection
        if isinstance(conn, EdgeConnection):
            conn.wake_acks(urgent=session.ack_urgent)

    def forget(self, sessions: list[Session]) -> None:
        """The core expired these sessions: drop their space events."""
        for session in sessions:
            for key in [s.key for s in session.streams.values()]:
                self._space.pop(key, None)

    # -- used by connections ----------------------------------------------------------------
    def space_event(self, key: StreamKey) -> asyncio.Event:
        event = self._space.get(key)
        if event is None:
            event = self._space[key] = asyncio.Event()
        return event

    def register(self, conn: EdgeConnection) -> None:
        self._connections.add(conn)

    def unregister(self, conn: EdgeConnection) -> None:
        self._connections.discard(conn)

    def supersede(self, old: object) -> None:
        if isinstance(old, EdgeConnection):
            task = asyncio.create_task(old.supersede(), name="close-superseded")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    # -- lifecycle -------------------------------------------------------------------------
    async def drain(self) -> None:
        """Refuse new edges, send ``Drain`` to every edge, and wake admissions blocked on
        backpressure (they give up while draining)."""
        self._draining = True
        await asyncio.gather(*(c.drain() for c in list(self._connections)))
        for event in list(self._space.values()):
            event.set()

    async def final_acks(self) -> None:
        await asyncio.gather(*(c.final_acks() for c in list(self._connections)))

    async def close(self) -> None:
        """Close every connection now (going away)."""
        for conn in list(self._connections):
            with contextlib.suppress(Exception):
                await conn.transport.close_going_away()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


class EdgeConnection:
    def __init__(
        self,
        edges: EdgeRegistry,
        core: IngestCore,
        config: IngestConfig,
        metrics: BridgeMetrics,
        transport: EdgeTransport,
        *,
        header_token: str = "",
    ) -> None:
        self._edges = edges
        self._core = core
        self._config = config
        self._metrics = metrics
        self.transport = transport
        self.header_token = header_token
        self.session: Session | None = None
        self._acks_due = asyncio.Event()
        self._acks_urgent = asyncio.Event()
        self._send_lock = asyncio.Lock()
        self._task: asyncio.Task[Any] | None = None
        self._superseded = False

    def wake_acks(self, *, urgent: bool) -> None:
        self._acks_due.set()
        if urgent:
            self._acks_urgent.set()

    async def send(self, msg: pb.BridgeMessage) -> None:
        async with self._send_lock:
            await self.transport.send(msg.SerializeToString())

    async def run(self) -> None:
        core, edges, metrics = self._core, self._edges, self._metrics
        transport = self.transport.name
        metrics.connections.labels(transport).inc()
        self._task = asyncio.current_task()
        ack_task: asyncio.Task[None] | None = None
        try:
            raw = await self._first_message()
            if raw is None:
                return
            try:
                msg = codec.decode_edge(raw, self._config.limits)
                if msg.WhichOneof("kind") != "hello":
                    raise ProtocolViolation("the first message must be Hello")
                self._authenticate(msg.hello)
                if edges.draining:
                    await self.send(self._drain_message())
                    return
                attached = core.hello(msg.hello, self)
                self.session, welcome = attached.session, attached.welcome
                edges.supersede(attached.superseded)
            except ProtocolError as exc:
                await self._refuse(exc, fatal=True)
                return
            edges.register(self)
            metrics.sessions.set(core.attached_sessions)
            await self.send(pb.BridgeMessage(welcome=welcome))
            log.info(
                "session %s device %s attached over %s (%d streams, resumed=%s)",
                welcome.session_id,
                msg.hello.device_id,
                transport,
                len(welcome.streams),
                welcome.resumed,
            )
            ack_task = asyncio.create_task(self._ack_writer(), name="ack-writer")
            ack_task.add_done_callback(_log_ack_writer_failure)
            try:
                await self._read_loop()
            except asyncio.CancelledError:
                if not self._superseded:
                    raise
                # Our own cancel (see supersede): end the call normally so the transport sends
                # its close/status to the old peer instead of treating it as a client cancel.
                if self._task is not None:
                    self._task.uncancel()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            if ack_task is not None:
                ack_task.cancel()
            edges.unregister(self)
            if self.session is not None:
                core.detach(self.session, self, time.monotonic())
                metrics.sessions.set(core.attached_sessions)
            metrics.connections.labels(transport).dec()

    async def _first_message(self) -> bytes | None:
        """The Hello's bytes, within the deadline, while at most ``max_pending_connections``
        connections wait for theirs; anything else is refused and the connection closed."""
        edges, config = self._edges, self._config
        if edges.pending >= config.max_pending_connections:
            await self._refuse(
                TooManyPending(f"{edges.pending} connections are already waiting for Hello"),
                fatal=True,
            )
            return None
        edges.pending += 1
        self._metrics.pending_connections.set(edges.pending)
        try:
            return await asyncio.wait_for(self.transport.recv(), config.hello_timeout_seconds)
        except TimeoutError:
            await self._refuse(
                HelloTimeout(f"no Hello within {config.hello_timeout_seconds:g} s"), fatal=True
            )
            return None
        finally:
            edges.pending -= 1
            self._metrics.pending_connections.set(edges.pending)

    def _authenticate(self, hello: pb.Hello) -> None:
        expected = self._config.auth_token
        if not expected:
            return
        offered = hello.auth_token or self.header_token
        if not hmac.compare_digest(offered.encode(), expected.encode()):
            raise Unauthenticated("missing or wrong bearer token")

    async def _read_loop(self) -> None:
        metrics = self._metrics
        transport = self.transport.name
        assert self.session is not None
        while True:
            raw = await self.transport.recv()
            if raw is None:
                return
            metrics.frames_received.labels(transport).inc()
            metrics.bytes_received.labels(transport).inc(len(raw))
            frame: pb.Frame | None = None
            try:
                msg = codec.decode_edge(raw, self._config.limits)
                if msg.WhichOneof("kind") != "frame":
                    raise ProtocolViolation("Hello may only be sent once per connection")
                frame = msg.frame
                if self._edges.draining:
                    continue  # not accepted, not acked: the edge resends it after reconnecting
                await self._admit(frame, len(raw))
            except ProtocolError as exc:
                if exc.fatal:
                    await self._refuse(exc, fatal=True)
                    return
                await self._refuse(exc, fatal=False, frame=frame or exc.frame)

    async def _admit(self, frame: pb.Frame, size: int) -> None:
        core, metrics = self._core, self._metrics
        assert self.session is not None
        paused = False
        while True:
            space = self._edges.space_event((self.session.device_id, frame.stream_id))
            space.clear()
            outcome = core.offer(self.session, frame, size, time.time_ns())
            if outcome is Offer.ACCEPTED:
                metrics.frames_accepted.inc()
                break
            if outcome is Offer.DUPLICATE:
                metrics.frames_duplicate.inc()
                break
            if not paused:
                paused = True
                if not core.fits(self.session, frame, size):
                    # Only after a live shrink below one frame: wait for the budget to grow.
                    log.warning("frame of %d bytes exceeds the ring capacity; waiting", size)
                metrics.backpressure.inc()
                await self.send(
                    pb.BridgeMessage(
                        flow_control=pb.FlowControl(
                            action=pb.FlowControl.PAUSE, stream_id=frame.stream_id
                        )
                    )
                )
            await space.wait()
            if self._edges.draining:
                return
        if paused:
            # Hysteresis: RESUME only once the ring drained to its low watermark.
            while not core.resume_ready(self.session, frame.stream_id, size):
                space = self._edges.space_event((self.session.device_id, frame.stream_id))
                space.clear()
                if core.resume_ready(self.session, frame.stream_id, size):
                    break
                await space.wait()
                if self._edges.draining:
                    return
            await self.send(
                pb.BridgeMessage(
                    flow_control=pb.FlowControl(
                        action=pb.FlowControl.RESUME, stream_id=frame.stream_id
                    )
                )
            )

    async def _refuse(
        self, exc: ProtocolError, *, fatal: bool, frame: pb.Frame | None = None
    ) -> None:
        self._metrics.rejected.labels(self.transport.name, exc.reason).inc()
        _refusals.log(exc.reason, "refused input from %s: %s", self.transport.name, exc)
        if fatal:
            # An Error message first where the transport can still carry it, then the close.
            if not isinstance(exc, FrameTooLarge):
                with contextlib.suppress(ConnectionError):
                    await self.send(self._error(exc, fatal=True))
            await self.transport.reject(exc)
            return
        await self.send(self._error(exc, fatal=False, frame=frame))

    @staticmethod
    def _error(
        exc: ProtocolError, *, fatal: bool, frame: pb.Frame | None = None
    ) -> pb.BridgeMessage:
        return pb.BridgeMessage(
            error=pb.Error(
                code=exc.wire.code,  # type: ignore[arg-type]
                message=str(exc),
                stream_id=frame.stream_id if frame is not None else "",
                seq=frame.seq if frame is not None else 0,
                fatal=fatal,
            )
        )

    async def _ack_writer(self) -> None:
        """Coalesce acks: at most one per ``ack_interval_seconds``; an accepted-only change waits
        up to ``ack_accepted_delay_seconds`` for a delivered one to share the message (halves
        the acks on a busy connection, where each frame would otherwise be acked twice)."""
        assert self.session is not None
        config = self._config
        interval = config.ack_interval_seconds
        while True:
            await self._acks_due.wait()
            if not self._acks_urgent.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        self._acks_urgent.wait(), config.ack_accepted_delay_seconds
                    )
            self._acks_due.clear()
            self._acks_urgent.clear()
            ack = self._core.take_acks(self.session)
            if ack is not None:
                await self.send(pb.BridgeMessage(ack=ack))
            await asyncio.sleep(interval)

    def _drain_message(self) -> pb.BridgeMessage:
        return pb.BridgeMessage(
            drain=pb.Drain(
                reconnect_after_ms=self._config.reconnect_after_ms, reason="shutting down"
            )
        )

    async def supersede(self) -> None:
        """Close this connection because its session moved to a newer one."""
        self._superseded = True
        with contextlib.suppress(Exception):
            await self.transport.close_going_away("superseded by a newer connection")
        if self._task is not None and not self._task.done():
            self._task.cancel()

    async def drain(self) -> None:
        """Tell the edge we are going away; it reconnects (elsewhere or to our successor) later."""
        with contextlib.suppress(ConnectionError):
            await self.send(self._drain_message())

    async def final_acks(self) -> None:
        """Flush the last delivered_seq so the edge can discard what was delivered."""
        if self.session is None:
            return
        ack = self._core.take_acks(self.session)
        if ack is not None:
            with contextlib.suppress(ConnectionError):
                await self.send(pb.BridgeMessage(ack=ack))


def _log_ack_writer_failure(task: asyncio.Task[None]) -> None:
    """Retrieve the ack writer's end: a closed connection is normal, anything else is logged."""
    if task.cancelled():
        return
    exc = task.exception()
    if exc is not None and not isinstance(exc, ConnectionError):
        log.error("ack writer failed: %r", exc)
