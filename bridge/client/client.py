"""The async edge client: one connection loop and one sender task around the sans-I/O core.

The sender (what goes out on a connection, batched or in lane pieces) is
:mod:`bridge.client.sender`; this module owns connecting, receiving and the public API.

Why a client at all: an edge that keeps its side of the contract (hold every frame until the bridge
reports it *delivered*, resend above the right seq after a reconnect, honour PAUSE/RESUME and Drain,
reconnect with backoff) loses nothing across network blips and bridge restarts. Doing that
correctly by hand is the hard part of talking to simbridge; this class does it for you::

    async with EdgeClient("ws://bridge:8080/v1/ingest", device_id="robot-1",
                          streams=[StreamSpec("lidar")]) as edge:
        await edge.publish("lidar", points)      # an (n, 3) float32 array
        await edge.drain(timeout=10)             # every frame delivered, or DeliveryTimeout
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any

from bridge.client.core import (
    CHUNK_RESTARTS,
    DeliveryHook,
    EdgeCore,
    EdgeStats,
    StreamSpec,
)
from bridge.client.lanes import DEFAULT_CHUNK_BYTES, DEFAULT_MAX_HOLD_SECONDS, LaneScheduler
from bridge.client.payload import Payload, PreparedPayload
from bridge.client.refusal import (
    SESSION_TAKEN_MARK,
    BridgeRefused,
    is_terminal,
    refusal,
    refused_upgrade,
)
from bridge.client.sender import Sender
from bridge.client.transport import Connection, Endpoint, TlsConfig, Transport, open_connection
from bridge.v1 import bridge_pb2 as pb

log = logging.getLogger(__name__)

DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
#: Reconnect backoff (seconds): exponential from BACKOFF_BASE, capped, with jitter.
BACKOFF_BASE = 0.1
BACKOFF_CAP = 5.0
#: While a bridge refuses the Hello because an older connection of this device looks alive
#: (half-open, until its keepalive gives up), retry at least this often: a refused Hello is
#: cheap, and exponential backoff would add seconds after the old connection is gone.
SESSION_TAKEN_RETRY = 0.5
#: After a fatal Error, how long to read on for the end of the connection (the gRPC status and
#: its details, the WebSocket close reason) before giving up on it.
FATAL_END_SECONDS = 1.0


class ClientClosed(RuntimeError):
    """``publish`` on a client that was closed (or closed while it waited for room)."""


class DeliveryTimeout(TimeoutError):
    """``drain`` ran out of time with frames still undelivered (``undelivered`` of them)."""

    def __init__(self, message: str, undelivered: int) -> None:
        super().__init__(message)
        self.undelivered = undelivered


async def cancel_and_wait(task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` and wait until it has ended, without swallowing *our* cancellation.

    ``with suppress(CancelledError): await task`` would also swallow a cancel aimed at the
    caller: a cancelled reconnect loop would then carry on.
    """
    task.cancel()
    await asyncio.wait({task})
    if not task.cancelled():
        task.exception()  # retrieved: not logged as "never retrieved"


class EdgeClient:
    """An edge device connected to a simbridge bridge over WebSocket or gRPC.

    ``url``: ``ws://host:port/v1/ingest``, ``wss://…``, ``grpc://host:port`` or
    ``grpcs://host:port``. ``token``: the bridge's ``auth_token`` when it requires one (sent in
    Hello and as ``Authorization: Bearer``). ``tls``: CA / client certificate for the secure
    schemes (default: the system's trust store, no client certificate).

    Limits: the resend buffer holds every frame not yet *delivered*, bounded by
    ``resend_buffer_bytes`` and ``resend_buffer_frames``. With ``wait_for_room`` (the default),
    ``publish`` on a stream that is not "drop_oldest" waits while the bridge has paused it or the
    buffer is full, and a "drop_oldest" stream makes room by evicting its own kind's oldest frames
    (counted in ``stats.dropped``), never another stream's. ``wait_for_room=False`` is open loop
    (the load generator): publish never waits and the oldest frame of any stream is evicted.
    ``on_delivered(stream_id, seq, capture_time_ns, now_ns)`` is called once per delivered frame,
    on the event loop.

    Batching (when the bridge's Welcome allows it): frames waiting to go out are sent together,
    up to ``batch_bytes`` per message (0 = one frame per message; larger frames always go alone).
    While traffic is dense (the previous message went out less than ``batch_linger`` seconds
    ago) the sender waits up to ``batch_linger`` for a batch to fill; an isolated frame (e.g.
    100 Hz telemetry with a 5 ms linger) never waits.

    Slow links: frames above ``chunk_bytes`` (32 KiB) are sent in pieces and higher-priority
    lanes (``StreamSpec.priority``; telemetry before clouds by default) go between the pieces,
    when streams of several lanes share the connection and the link would be held longer than
    ``lane_max_hold_seconds`` (10 ms; WebSocket estimates the link from the kernel's delivery
    rate, gRPC always uses pieces); ``chunk_bytes=0`` sends whole frames in publish order, as
    clients before lanes did. On WebSocket the next piece is written only once the socket holds
    less than ``send_lowat_bytes`` unsent (also set as ``TCP_NOTSENT_LOWAT``), so a telemetry
    frame never queues behind megabytes inside the kernel (0: no limit; gRPC's socket is not
    visible).
    ``StreamSpec.codec`` compresses clouds (see the README's "Slow links").
    """

    def __init__(
        self,
        url: str,
        *,
        device_id: str,
        streams: Sequence[StreamSpec],
        token: str | None = None,
        tls: TlsConfig | None = None,
        # Limits
        resend_buffer_bytes: int = 256 * 1024 * 1024,
        resend_buffer_frames: int = 10_000,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        # Timeouts
        connect_timeout: float = 10.0,
        welcome_timeout: float = 10.0,
        # Behaviour
        wait_for_room: bool = True,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        send_lowat_bytes: int = 16 * 1024,
        lane_max_hold_seconds: float = DEFAULT_MAX_HOLD_SECONDS,
        batch_bytes: int = 64 * 1024,
        batch_linger: float = 0.005,
        stats: EdgeStats | None = None,
        on_delivered: DeliveryHook | None = None,
        seed: int | None = None,
    ) -> None:
        self.endpoint = Endpoint.parse(url)
        if tls is not None and not self.endpoint.secure:
            raise ValueError(f"tls= needs a wss:// or grpcs:// URL, got {url!r}")
        self.url = url
        self.stats = stats if stats is not None else EdgeStats()
        self.core = EdgeCore(
            device_id,
            streams,
            resend_buffer_bytes=resend_buffer_bytes,
            resend_buffer_frames=resend_buffer_frames,
            stats=self.stats,
            on_delivered=on_delivered,
            protect_backpressure=wait_for_room,
        )
        self.token = token or ""
        self.tls = tls
        self.max_message_bytes = max_message_bytes
        self.connect_timeout = connect_timeout
        self.welcome_timeout = welcome_timeout
        self.wait_for_room = wait_for_room
        self.lanes = (
            LaneScheduler(self.core, chunk_bytes, max_hold_seconds=lane_max_hold_seconds)
            if chunk_bytes
            else None
        )
        self.send_lowat_bytes = send_lowat_bytes if chunk_bytes else 0
        if batch_bytes < 0 or not 0 <= batch_linger <= 1.0:
            raise ValueError("batch_bytes >= 0 and 0 <= batch_linger <= 1 s please")
        self.batch_bytes = batch_bytes
        self.batch_linger = batch_linger
        #: The last Welcome (limits, resumed or not); None before the first one.
        self.welcome: pb.Welcome | None = None
        self._rng = random.Random(seed)
        self._closing = False
        self._run_task: asyncio.Task[None] | None = None
        self._conn: Connection | None = None
        self._connected = asyncio.Event()
        self._wake = asyncio.Event()  # the sender has something to look at
        self._progress = asyncio.Event()  # replaced on every state change (broadcast)
        self._welcomes = 0
        self.last_close = ""  # how the last connection ended, with what the bridge said
        #: Set when the bridge refused this edge for good: the client stopped trying.
        self.refused: BridgeRefused | None = None
        self._fatal: pb.Error | None = None  # a terminal Error on the current connection
        self._fatal_seen = False  # any fatal Error on it (then its gRPC status says no more)
        self._taken = False  # its Hello was refused: the device's older connection looks alive

    # -- state --------------------------------------------------------------------------------

    @property
    def transport(self) -> Transport:
        return self.endpoint.transport

    @property
    def device_id(self) -> str:
        return self.core.device_id

    @property
    def session_id(self) -> str:
        return self.core.session_id

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    @property
    def undelivered(self) -> int:
        """Frames published and not yet reported delivered (held for resend)."""
        return self.core.buffered_frames

    # -- public API ---------------------------------------------------------------------------

    async def __aenter__(self) -> EdgeClient:
        await self.start()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def start(self, *, wait: bool = True, timeout: float = 10.0) -> None:  # noqa: ASYNC109
        """Start the connection loop; with ``wait``, return once the first Welcome arrived
        (``ConnectionError`` after ``timeout`` seconds without one)."""
        if self._closing:
            raise ClientClosed("this client was closed")
        if self.refused is not None:
            raise self.refused
        if self._run_task is None:
            self._run_task = asyncio.create_task(self._run(), name=f"edge-{self.device_id}")
        if wait:
            try:
                await asyncio.wait_for(self._welcomed_or_refused(), timeout)
            except TimeoutError:
                last = f" (last connection ended {self.last_close})" if self.last_close else ""
                await self.close()
                raise ConnectionError(
                    f"{self.device_id}: no Welcome from {self.url} within {timeout} s{last}"
                ) from None
            if self.refused is not None:
                await self.close()
                raise self.refused

    async def _welcomed_or_refused(self) -> None:
        while not self._connected.is_set() and self.refused is None:
            await self._progress.wait()

    def prepare(self, stream_id: str, data: Payload | PreparedPayload) -> PreparedPayload:
        """Encode ``data`` for ``stream_id`` once, to publish it many times cheaply."""
        return self.core.prepare(stream_id, data)

    async def publish(
        self,
        stream_id: str,
        data: Payload | PreparedPayload,
        *,
        capture_time_ns: int | None = None,
    ) -> int:
        """Buffer the next frame of ``stream_id`` for sending; return its seq.

        ``data``: for point-cloud streams a structured or (n, 3) / (n, 4) float NumPy array, a
        ``bridge.v1.PointCloud`` or its serialized bytes; for telemetry a ``{name: number}``
        mapping or ``bytes`` (a blob); on either, a :class:`PreparedPayload`. Returns once the
        frame is buffered (after waiting for room, see the class), not once it is delivered:
        ``drain`` waits for that. ``capture_time_ns`` defaults to now (wall clock).
        """
        payload = self.core.prepare(stream_id, data)
        if self.wait_for_room:
            while self.core.must_wait(stream_id, payload.nbytes):
                if self.refused is not None:
                    raise self.refused
                if self._closing:
                    raise ClientClosed(f"{self.device_id}: closed while waiting for room")
                await self._progress.wait()
        if self.refused is not None:
            raise self.refused
        if self._closing:
            raise ClientClosed(f"{self.device_id}: publish after close")
        seq = self.core.publish(
            stream_id, payload, time.time_ns() if capture_time_ns is None else capture_time_ns
        )
        self._wake.set()
        self._notify()
        await asyncio.sleep(0)
        return seq

    async def drain(self, timeout: float = 30.0) -> None:  # noqa: ASYNC109
        """Wait until every published frame is delivered; ``DeliveryTimeout`` if not in time."""
        if not await self.wait_delivered(timeout):
            n = self.core.buffered_frames
            raise DeliveryTimeout(
                f"{self.device_id}: {n} frame(s) not delivered within {timeout} s", n
            )

    async def wait_delivered(self, timeout: float) -> bool:  # noqa: ASYNC109
        """Like :meth:`drain`, but returns False on timeout instead of raising."""
        return await self.wait_for(self.core.all_delivered, timeout)

    async def wait_for(self, predicate: Callable[[], bool], timeout: float = 5.0) -> bool:  # noqa: ASYNC109
        """Wait until ``predicate()`` holds after some protocol event; False on timeout,
        :class:`BridgeRefused` once the bridge has refused this edge for good."""
        try:
            async with asyncio.timeout(timeout):
                while not predicate():
                    if self.refused is not None:
                        raise self.refused
                    await self._progress.wait()
        except TimeoutError:
            return False
        return True

    async def close(self) -> None:
        """Stop reconnecting and close the connection (idempotent). Undelivered frames stay in
        ``core`` but are no longer sent: call ``drain`` first to be sure they arrived."""
        self._closing = True
        self._wake.set()
        self._notify()
        task, self._run_task = self._run_task, None
        if self._conn is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._conn.close(), 2.0)
        if task is not None:
            await cancel_and_wait(task)

    # -- connection loop ----------------------------------------------------------------------

    def _notify(self) -> None:
        self._progress.set()
        self._progress = asyncio.Event()

    def _backoff(self, attempt: int) -> float:
        delay = min(BACKOFF_CAP, BACKOFF_BASE * 2.0 ** max(0, attempt - 1))
        return delay * self._rng.uniform(0.5, 1.0)

    async def _open(self) -> Connection:
        return await open_connection(
            self.endpoint,
            token=self.token,
            tls=self.tls,
            max_message_bytes=self.max_message_bytes,
            connect_timeout=self.connect_timeout,
            send_lowat_bytes=self.send_lowat_bytes,
            device_id=self.device_id,
        )

    async def _run(self) -> None:
        attempt = 0
        delay = 0.0
        while not self._closing:
            if delay > 0:
                await asyncio.sleep(delay)
                if self._closing:
                    break
            welcomed_before = self._welcomes
            drain_delay: float | None = None
            refused: BridgeRefused | None = None
            self._fatal, self._fatal_seen, self._taken = None, False, False
            try:
                self._conn = await self._open()
                drain_delay = await self._session(self._conn)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # any failure of this connection: reconnect
                log.debug("%s: connection ended: %r", self.device_id, exc)
                refused = refused_upgrade(self.device_id, exc)
            finally:
                conn, self._conn = self._conn, None
                self._connected.clear()
                if conn is not None:
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(conn.close(), 2.0)
                    self.stats.close_reasons[conn.close_reason()] += 1
                    detail = conn.close_detail()
                    self.last_close = conn.close_reason() + (f": {detail}" if detail else "")
                    refused = refused or refusal(
                        self.device_id,
                        self._fatal,
                        close=conn.close_reason(),
                        detail=conn.close_detail(),
                        fatal_seen=self._fatal_seen,
                    )
            if self._closing:
                break
            if self._welcomes > welcomed_before:
                self.stats.disconnects += 1
                attempt = 1
            else:
                self.stats.connect_failures += 1
                attempt += 1
            if refused is not None:
                log.warning("%s", refused)
                self.refused = refused
                self._notify()
                break
            delay = drain_delay if drain_delay is not None else self._backoff(attempt)
            if self._taken:
                delay = min(delay, SESSION_TAKEN_RETRY)
            self._notify()

    async def _session(self, conn: Connection) -> float | None:
        """One connection: Hello, Welcome, then send and receive until it ends.

        Returns the reconnect delay a Drain asked for, or None for a plain disconnect.
        """
        # Bounded as one step: a gRPC write can wait on a connection that never comes up.
        async with asyncio.timeout(self.welcome_timeout):
            await conn.send(self.core.hello(self.token))
            first = await conn.recv()
        if first is None:
            raise ConnectionError("closed before Welcome")
        kind = first.WhichOneof("kind")
        if kind != "welcome":
            if kind == "error":
                self.core.on_error(first.error)
                self._fatal_seen = first.error.fatal
                self._taken = SESSION_TAKEN_MARK in first.error.message
                if is_terminal(first.error, welcomed=False):
                    self._fatal = first.error
                if first.error.fatal:
                    await self._read_to_end(conn)
            raise ConnectionError(f"expected Welcome, got {kind}")
        self.welcome = first.welcome
        self.core.on_welcome(first.welcome, time.time_ns())
        if self._welcomes:
            self.stats.reconnects += 1
        self._welcomes += 1
        self._connected.set()
        self._notify()
        sender = asyncio.create_task(
            self._sender(conn, first.welcome).run(), name=f"edge-send-{self.device_id}"
        )
        try:
            while (msg := await conn.recv()) is not None:
                drain = self._handle(msg)
                self._notify()
                if drain is not None:
                    return drain
                if self._fatal is not None:
                    await self._read_to_end(conn)
                    return None
            return None
        finally:
            await cancel_and_wait(sender)

    def _handle(self, msg: pb.BridgeMessage) -> float | None:
        kind = msg.WhichOneof("kind")
        if kind == "ack":
            self.core.on_ack(msg.ack, time.time_ns())
        elif kind == "flow_control":
            self.core.on_flow_control(msg.flow_control)
            self._wake.set()
        elif kind == "error":
            log.info("%s: bridge error %s", self.device_id, msg.error.message)
            if self.lanes is not None and msg.error.code in CHUNK_RESTARTS:
                self.lanes.restart(msg.error.stream_id, msg.error.seq)
            self.core.on_error(msg.error)
            self._fatal_seen = self._fatal_seen or msg.error.fatal
            if is_terminal(msg.error, welcomed=True):
                self._fatal = msg.error
            self._wake.set()
        elif kind == "drain":
            self.stats.drains += 1
            return msg.drain.reconnect_after_ms / 1000.0
        elif kind == "welcome":
            self.stats.errors["UNEXPECTED_WELCOME"] += 1
        return None

    def _sender(self, conn: Connection, welcome: pb.Welcome) -> Sender:
        """This connection's sender (see :mod:`bridge.client.sender`)."""
        return Sender(
            conn,
            welcome,
            core=self.core,
            stats=self.stats,
            lanes=self.lanes,
            batch_bytes=self.batch_bytes,
            batch_linger=self.batch_linger,
            send_lowat_bytes=self.send_lowat_bytes,
            wake=self._wake,
            notify=self._notify,
            device_id=self.device_id,
        )

    @staticmethod
    async def _read_to_end(conn: Connection) -> None:
        """After a fatal Error: read until the bridge ends the connection, so its close reason
        or gRPC status (with details) is known rather than our own cancel."""
        with contextlib.suppress(Exception):
            async with asyncio.timeout(FATAL_END_SECONDS):
                while await conn.recv() is not None:
                    pass
