"""One edge connection, transport-agnostic: Hello → Welcome, then frames in and acks out.

The WebSocket and gRPC adapters each wrap their connection in an :class:`EdgeTransport` and run
:meth:`EdgeConnection.run`; every rule lives in the core, so both transports behave identically.
Backpressure: when a ring is full this coroutine stops reading (the transport's own flow control
then stops the sender) and tells the edge with ``FlowControl PAUSE`` / ``RESUME``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from bridge import codec
from bridge.core import Offer
from bridge.errors import (
    FrameTooLarge,
    ProtocolError,
    ProtocolViolation,
    Unauthenticated,
)
from bridge.governor import Charge
from bridge.session import Session
from bridge.v1 import bridge_pb2 as pb

if TYPE_CHECKING:
    from bridge.app import BridgeService as Hub

log = logging.getLogger("bridge.ingest")

ERROR_CODES: dict[str, int] = {
    "malformed": pb.MALFORMED,
    "protocol_violation": pb.PROTOCOL_VIOLATION,
    "unknown_stream": pb.UNKNOWN_STREAM,
    "invalid_layout": pb.INVALID_LAYOUT,
    "too_large": pb.TOO_LARGE,
    "too_many_points": pb.TOO_MANY_POINTS,
    "seq_regression": pb.SEQ_REGRESSION,
    "too_many_streams": pb.TOO_MANY_STREAMS,
    "too_many_sessions": pb.TOO_MANY_SESSIONS,
    "unauthenticated": pb.UNAUTHENTICATED,
}


@dataclass(slots=True)
class Received:
    """One message and the governor charge for its bytes (granted before it was read)."""

    data: bytes
    charge: Charge


class EdgeTransport(Protocol):
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


class EdgeConnection:
    def __init__(self, hub: Hub, transport: EdgeTransport, *, header_token: str = "") -> None:
        self.hub = hub
        self.transport = transport
        self.header_token = header_token
        self.session: Session | None = None
        self.acks_due = asyncio.Event()
        self.acks_urgent = asyncio.Event()
        self._send_lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._superseded = False
        self._flow_want = False  # session-wide PAUSE wanted (a receive grant is waiting)
        self._flow_sent = False
        self._flow_task: asyncio.Future[None] | None = None

    async def send(self, msg: pb.BridgeMessage) -> None:
        async with self._send_lock:
            await self.transport.send(msg.SerializeToString())

    async def run(self) -> None:
        hub = self.hub
        metrics = hub.metrics
        transport = self.transport.name
        metrics.connections.labels(transport).inc()
        self._task = asyncio.current_task()
        ack_task: asyncio.Task[None] | None = None
        self.transport.on_wait(self._on_grant_wait)
        try:
            received = await self.transport.recv()
            if received is None:
                return
            raw = received.data
            received.charge.release()  # a Hello is parsed and dropped at once
            try:
                msg = codec.decode_edge(raw, hub.limits)
                if msg.WhichOneof("kind") != "hello":
                    raise ProtocolViolation("the first message must be Hello")
                self._authenticate(msg.hello)
                if hub.draining:
                    await self.send(self._drain_message())
                    return
                prior = hub.core.by_device.get(msg.hello.device_id)
                superseded = prior.connection if prior is not None and prior.attached else None
                self.session, welcome = hub.core.hello(msg.hello, self)
                if isinstance(superseded, EdgeConnection) and superseded is not self:
                    # The device reconnected while its old connection looked alive (half-open):
                    # one connection per session, the newest wins.
                    hub.spawn(superseded.supersede(), "close-superseded")
            except ProtocolError as exc:
                await self._refuse(exc, fatal=True)
                return
            hub.connections.add(self)
            metrics.sessions.set(hub.core.attached_sessions)
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
            if self._flow_task is not None:
                self._flow_task.cancel()
            hub.connections.discard(self)
            if self.session is not None:
                hub.core.detach(self.session, self, time.monotonic())
                metrics.sessions.set(hub.core.attached_sessions)
            metrics.connections.labels(transport).dec()

    def _authenticate(self, hello: pb.Hello) -> None:
        expected = self.hub.settings.auth_token
        if not expected:
            return
        offered = hello.auth_token or self.header_token
        if not hmac.compare_digest(offered.encode(), expected.encode()):
            raise Unauthenticated("missing or wrong bearer token")

    async def _read_loop(self) -> None:
        hub = self.hub
        metrics = hub.metrics
        transport = self.transport.name
        assert self.session is not None
        while True:
            received = await self.transport.recv()
            if received is None:
                return
            size = len(received.data)
            metrics.frames_received.labels(transport).inc()
            metrics.bytes_received.labels(transport).inc(size)
            frame: pb.Frame | None = None
            charge: Charge | None = received.charge
            try:
                msg = codec.decode_edge(received.data, hub.limits)
                del received  # the wire bytes: only the parsed frame (charged) is kept
                if msg.WhichOneof("kind") != "frame":
                    raise ProtocolViolation("Hello may only be sent once per connection")
                frame = msg.frame
                if hub.draining:
                    continue  # not accepted, not acked: the edge resends it after reconnecting
                assert charge is not None
                owned, charge = charge, None
                await self._admit(frame, size, owned)
            except ProtocolError as exc:
                if exc.fatal:
                    await self._refuse(exc, fatal=True)
                    return
                await self._refuse(exc, fatal=False, frame=frame)
            finally:
                if charge is not None:
                    charge.release()

    def _on_grant_wait(self, waiting: bool) -> None:
        """Reading stopped for a memory grant: tell the whole session to pause (and resume).
        Then let ``drop_oldest`` streams give way first: they chose losing old frames over
        stalling (this may grant at once, and then RESUME follows the PAUSE)."""
        if waiting:
            self.hub.metrics.backpressure.inc()
        self._flow_want = waiting
        if self.session is not None and self._flow_task is None:
            # One sender, whatever the edge reads: a peer that never reads blocks it, and
            # flips in between only update what it sends next (bounded, in order).
            self._flow_task = asyncio.ensure_future(self._flow_sender())
        if waiting:
            self.hub.core.reclaim(max(1, self.hub.governor.waiting_bytes))

    async def _flow_sender(self) -> None:
        try:
            while self._flow_want != self._flow_sent:
                want = self._flow_want
                action = pb.FlowControl.PAUSE if want else pb.FlowControl.RESUME
                msg = pb.BridgeMessage(flow_control=pb.FlowControl(action=action))
                with contextlib.suppress(ConnectionError):
                    await self.send(msg)
                self._flow_sent = want
        finally:
            self._flow_task = None

    async def _admit(self, frame: pb.Frame, size: int, charge: Charge) -> None:
        """Offer until the ring accepts (it takes over ``charge``); otherwise (a duplicate, an
        error, draining, cancelled) ``charge`` is released here, exactly once."""
        state = {"taken": False, "paused": False}
        try:
            await self._offer_until_taken(frame, size, charge, state)
        finally:
            if not state["taken"]:
                charge.release()
        if state["paused"]:
            await self.send(
                pb.BridgeMessage(
                    flow_control=pb.FlowControl(
                        action=pb.FlowControl.RESUME, stream_id=frame.stream_id
                    )
                )
            )

    async def _offer_until_taken(
        self, frame: pb.Frame, size: int, charge: Charge, state: dict[str, bool]
    ) -> None:
        hub = self.hub
        assert self.session is not None
        while True:
            space = hub.space_event(self.session, frame.stream_id)
            space.clear()
            outcome = hub.core.offer(self.session, frame, size, time.time_ns(), charge)
            if outcome is Offer.ACCEPTED:
                state["taken"] = True
                hub.metrics.frames_accepted.inc()
                return
            if outcome is Offer.DUPLICATE:
                hub.metrics.frames_duplicate.inc()
                return
            if not state["paused"]:
                state["paused"] = True
                hub.metrics.backpressure.inc()
                await self.send(
                    pb.BridgeMessage(
                        flow_control=pb.FlowControl(
                            action=pb.FlowControl.PAUSE, stream_id=frame.stream_id
                        )
                    )
                )
            await space.wait()
            if hub.draining:
                return

    async def _refuse(
        self, exc: ProtocolError, *, fatal: bool, frame: pb.Frame | None = None
    ) -> None:
        self.hub.metrics.rejected.labels(self.transport.name, exc.reason).inc()
        log.info("refused input from %s: %s (%s)", self.transport.name, exc, exc.reason)
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
                code=ERROR_CODES.get(exc.reason, pb.ERROR_CODE_UNSPECIFIED),  # type: ignore[arg-type]
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
        settings = self.hub.settings
        interval = settings.ack_interval_seconds
        while True:
            await self.acks_due.wait()
            if not self.acks_urgent.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        self.acks_urgent.wait(), settings.ack_accepted_delay_seconds
                    )
            self.acks_due.clear()
            self.acks_urgent.clear()
            ack = self.hub.core.take_acks(self.session)
            if ack is not None:
                await self.send(pb.BridgeMessage(ack=ack))
            await asyncio.sleep(interval)

    def _drain_message(self) -> pb.BridgeMessage:
        return pb.BridgeMessage(
            drain=pb.Drain(
                reconnect_after_ms=self.hub.settings.reconnect_after_ms, reason="shutting down"
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
        ack = self.hub.core.take_acks(self.session)
        if ack is not None:
            with contextlib.suppress(ConnectionError):
                await self.send(pb.BridgeMessage(ack=ack))
