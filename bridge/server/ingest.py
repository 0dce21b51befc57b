"""Edge connections, transport-agnostic: Hello → Welcome, then frames in and acks out.

Both transports wrap each connection in an ``EdgeTransport`` for :meth:`EdgeRegistry.serve`;
every rule lives in the core. The registry owns what connections share (the live set, "space
freed" events, ack wake-ups, draining); offers and PAUSE/RESUME live in
:mod:`bridge.server.admission`. A message's charge moves transport → connection → ring, or is
released when its ``with`` block ends; debug mode reports any the connection still owns.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import logging
import time
import weakref
from collections import deque
from typing import Any

from bridge.logs import RateLimitedLog, log_task_failure
from bridge.protocol import codec
from bridge.protocol.errors import (
    ChunksStalled,
    FrameTooLarge,
    HelloTimeout,
    ProtocolError,
    ProtocolViolation,
    TooManyPending,
    Unauthenticated,
)
from bridge.server import ownership_gate
from bridge.server.acks import AckPacer
from bridge.server.admission import Admission
from bridge.server.chunkwarden import ChunkWarden
from bridge.server.governor import Charge, Governor
from bridge.server.ingest_config import IngestConfig
from bridge.server.metrics import BridgeMetrics
from bridge.server.offload import OffLoopDecoder
from bridge.server.ports import SPLIT_DATA_BYTES, EdgeTransport, IngestCore, Received
from bridge.server.session import Session, Stream, StreamKey, check_routing, routing_keys
from bridge.server.uplink import Uplink
from bridge.v1 import bridge_pb2 as pb

log = logging.getLogger("bridge.server.ingest")
#: A fatal Error waits this long to be sent (to a peer that does not read), then we close anyway.
FATAL_ERROR_SEND_SECONDS = 1.0
#: Chunk refusals not yet sent to a peer that does not read: the oldest are not sent (they
#: are still counted and logged).
MAX_QUEUED_CHUNK_REPORTS = 256
# One line per reason, then a count at most every 10 s: a fuzzer must not fill the disk.
_refusals = RateLimitedLog(log, interval_seconds=10.0)


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
        self.drain_reconnect_ms: int | None = None  # a pod retiring this process: sooner
        self._tasks: set[asyncio.Task[None]] = set()
        self._draining = False
        self.pod: ownership_gate.OwnershipGate | None = None  # in a pod: claims at Hello

    def __len__(self) -> int:
        return len(self._connections)

    @property
    def tracked_streams(self) -> int:
        """Per-stream wake-up events held (bounded by the streams waiting for room)."""
        return len(self._space)

    @property
    def draining(self) -> bool:
        return self._draining

    async def serve(
        self,
        transport: EdgeTransport,
        header_token: str = "",
        peer_names: frozenset[str] = frozenset(),
    ) -> None:
        """Run one edge connection until it ends."""
        conn = EdgeConnection(
            self,
            self._core,
            self._config,
            self._metrics,
            transport,
            header_token=header_token,
            peer_names=peer_names,
        )
        await conn.run()

    # -- core notifications (EdgeEvents) --------------------------------------------------
    def on_space(self, stream: Stream) -> None:
        if not self._space:  # nobody waits for room (twice a frame): no lookup that misses
            return
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
        peer_names: frozenset[str] = frozenset(),
    ) -> None:
        self._edges = edges
        self._core = core
        self._config = config
        self._metrics = metrics
        self.transport = transport
        self.header_token = header_token
        self.peer_names = peer_names  # the client certificate's CN and SANs (mTLS)
        self.session: Session | None = None
        self._acks = AckPacer(config.ack_interval_seconds, config.ack_accepted_delay_seconds)
        self.wake_acks = self._acks.wake  # the core's (twice a frame): no call of ours between
        self._send_lock = asyncio.Lock()
        self._task: asyncio.Task[Any] | None = None
        self._superseded = False
        self._stalled: ChunksStalled | None = None  # the chunk warden's reason to close
        self._governor: Governor | None = None  # the one every charge of ours comes from
        self._grant_waiting = False  # our transport waits for a memory grant
        self._warden: ChunkWarden | None = (
            None  # incomplete chunked frames (bridge.server.chunkwarden)
        )
        # The warden's refusals, sent by their own task: the warden never waits on the peer.
        self._chunk_reports: deque[ProtocolError] = deque(maxlen=MAX_QUEUED_CHUNK_REPORTS)
        self._reporter: asyncio.Task[None] | None = None
        self._uplink: Uplink | None = None  # chunks and codecs (bridge.server.uplink)
        self._decoder: OffLoopDecoder | None = None  # large encoded clouds (bridge.server.offload)
        self._admission: Admission | None = (
            None  # offers and flow control (bridge.server.admission)
        )

    async def send(self, msg: pb.BridgeMessage) -> None:
        async with self._send_lock:
            await self.transport.send(msg.SerializeToString())

    async def run(self) -> None:
        core, edges, metrics = self._core, self._edges, self._metrics
        transport = self.transport.name
        metrics.connections.labels(transport).inc()
        self._task = asyncio.current_task()
        ack_task: asyncio.Task[None] | None = None
        warden: asyncio.Task[None] | None = None
        self.transport.on_wait(self._on_grant_wait)
        try:
            received = await self._first_message()
            if received is None:
                return
            raw = received.data
            self._governor = received.charge.governor
            received.charge.release()  # a Hello is parsed and dropped at once
            try:
                msg = codec.decode_edge(raw, self._config.limits)
                if msg.WhichOneof("kind") != "hello":
                    raise ProtocolViolation("the first message must be Hello")
                proven = self._authenticate(msg.hello)
                check_routing(msg.hello.device_id, routing_keys(self.transport))
                if edges.draining:
                    await self.send(self._drain_message())
                    return
                Uplink.check_hello(msg.hello)
                attached = await ownership_gate.attach(  # claim (pod), marks, attach
                    core, edges.pod, msg.hello, self, proven, metrics
                )
                self.session, welcome = attached.session, attached.welcome
                self._uplink = Uplink(
                    msg.hello,
                    self.session.streams,
                    self._config.limits,
                    self._config.refused_decode_budget_bytes,
                    self._config.chunk_max_age_seconds,
                )
                self._admission = Admission(core, edges, self.session, metrics, self.send)
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
            ack_task = asyncio.create_task(
                self._acks.run(functools.partial(core.take_acks, self.session), self.send),
                name="ack-writer",
            )
            ack_task.add_done_callback(log_task_failure(log, "ack writer"))
            self._warden = ChunkWarden(
                self._uplink.chunks,
                self._config,
                self._fair_share,
                self._report_chunk_refusals,
                self._close_stalled,
            )
            warden = asyncio.create_task(self._warden.run(), name="chunk-warden")
            warden.add_done_callback(log_task_failure(log, "chunk warden"))
            try:
                await self._read_loop()
            except asyncio.CancelledError:
                if not self._superseded and self._stalled is None:
                    raise
                # Our own cancel (supersede, chunk warden): end the call normally so the
                # transport sends its close/status to the peer instead of treating it as a
                # client cancel.
                if self._task is not None:
                    self._task.uncancel()
                if self._stalled is not None:
                    with contextlib.suppress(ConnectionError):
                        await self._refuse(
                            self._stalled, fatal=True, send_timeout=FATAL_ERROR_SEND_SECONDS
                        )
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            if ack_task is not None:
                ack_task.cancel()
            if warden is not None:
                warden.cancel()
            if self._reporter is not None:
                self._reporter.cancel()
            if self._decoder is not None:  # a cloud decoding (or waiting for its grant)
                await self._decoder.close()
            if self._admission is not None:  # parked frames release their charges
                await self._admission.close()
            if self._uplink is not None:
                self._uplink.close()
            edges.unregister(self)
            if self.session is not None:
                core.detach(self.session, self, time.monotonic())
                metrics.sessions.set(core.attached_sessions)
            metrics.connections.labels(transport).dec()
            if self._governor is not None:  # debug mode: every charge of ours went somewhere
                self._governor.end_owner(self)

    async def _first_message(self) -> Received | None:
        """The Hello, within the deadline, while at most ``max_pending_connections``
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
        except ProtocolError as exc:  # refused by the transport (a text message, the size)
            await self._refuse(exc, fatal=True)
            return None
        finally:
            edges.pending -= 1
            self._metrics.pending_connections.set(edges.pending)

    def _authenticate(self, hello: pb.Hello) -> bool:
        """Check the Hello's credentials; True when they prove the device id itself (a
        per-device token), which lets it take over its own live session."""
        if self._config.bind_device_to_certificate:
            if hello.device_id not in self.peer_names:
                raise Unauthenticated(
                    f"device id {hello.device_id!r} is not a name in the client certificate"
                )
            proven = True
        else:
            proven = False
        offered = hello.auth_token or self.header_token
        device_tokens = self._config.device_tokens
        if device_tokens is not None and device_tokens.current().verify(hello.device_id, offered):
            return True
        expected = self._config.auth_token
        if not expected and device_tokens is None:
            return proven
        if expected and hmac.compare_digest(offered.encode(), expected.encode()):
            return proven
        raise Unauthenticated("missing or wrong bearer token for this device")

    async def _read_loop(self) -> None:
        """Read and admit until the peer is done; a cloud still decoding is admitted first
        (or dropped, unacknowledged, when the connection fails)."""
        assert self._uplink is not None
        assert self._admission is not None
        admit = self._admission.admit
        self._decoder = decoder = OffLoopDecoder(self._uplink, admit, self._refuse_frame)
        try:
            await self._read_messages()
        except BaseException:
            decoder.drop()
            raise
        await decoder.settle()

    async def _read_messages(self) -> None:
        metrics = self._metrics
        transport = self.transport.name
        received_frames = metrics.frames_received.labels(transport)
        received_bytes = metrics.bytes_received.labels(transport)
        limits = self._config.limits
        admission = self._admission
        assert self.session is not None and admission is not None
        while True:
            try:
                received = await self.transport.recv()
            except ProtocolError as exc:  # refused by the transport (a text message, the size)
                assert self._decoder is not None
                self._decoder.drop()  # as when reading fails: a cloud in flight is not admitted
                await self._refuse(exc, fatal=True)
                return
            if received is None:
                return
            size = len(received.data)
            admission.last_size = size
            received_frames.inc()
            received_bytes.inc(size)
            try:  # the charge goes back before a refusal is sent: a refusal holds no data
                with received.charge.adopt(self) as charge:  # ours now (the owner tag)
                    data = received.data
                    del received
                    if codec.is_batch(data):
                        await self._admit_batch(data, codec.batch_spans(data, limits), charge)
                    else:
                        await self._admit_one(data, size, charge)
            except ProtocolError as exc:
                if exc.fatal:
                    await self._refuse(exc, fatal=True)
                    return
                await self._refuse(exc, fatal=False, frame=exc.frame)

    async def _admit_one(self, data: bytes | bytearray, size: int, charge: Charge) -> None:
        """One message's frame (or chunk) through the uplink to admission; ``charge`` is
        transferred on or released by the blocks that hold it. A refusal names the frame."""
        assert self._uplink is not None and self._decoder is not None
        uplink = self._uplink
        frame: pb.Frame | None = None  # what a refusal names, once known
        try:
            # A large cloud's points stay in the wire bytes (split: the frame and the points).
            split = codec.split_cloud_frame(data) if size >= SPLIT_DATA_BYTES else None
            if split is None:
                msg = codec.decode_edge(data, self._config.limits)
                if msg.WhichOneof("kind") not in ("frame", "chunk"):
                    raise ProtocolViolation("Hello may only be sent once per connection")
            else:
                frame = split[0]
            del data  # the wire bytes: only the parsed frame (charged), or the points, stay
            if self._edges.draining:
                return  # not accepted, not acked: the edge resends it after reconnecting
            now = time.monotonic()
            with (
                uplink.take(msg, size, charge, now)
                if split is None
                else uplink.take_split(*split, size, charge)
            ) as ready:
                del split
                if uplink.chunks.in_progress:
                    assert self._warden is not None
                    ready.errors += self._warden.held(now)
                for refused in ready.errors:
                    await self._refuse(refused, fatal=False, frame=refused.frame)
                if ready.frame is not None and ready.charge is not None:
                    frame = ready.frame
                    await self._decoder.admit(
                        frame, ready.size, ready.charge, ready.points, ready.encoded
                    )
        except ProtocolError as exc:
            exc.frame = frame or exc.frame
            raise

    async def _admit_batch(
        self, data: bytes | bytearray, spans: list[tuple[int, int]], charge: Charge
    ) -> None:
        """Each frame of a batch as if it came alone, in order: its own slice of the message's
        charge, its own refusal. A fatal refusal is raised (the rest of ``charge`` goes back
        with the caller's block first)."""
        limits, last, edges = self._config.limits, len(spans) - 1, self._edges
        assert self._uplink is not None and self._decoder is not None
        decode, prepare, admit = codec.decode_frame, self._uplink.prepare, self._decoder.admit
        for index, (start, end) in enumerate(spans):
            frame: pb.Frame | None = None
            part = charge if index == last else charge.split(min(end - start, charge.nbytes))
            try:
                with part:
                    frame = decode(data, start, end, limits)
                    if edges.draining:
                        continue
                    size, encoded = prepare(frame, end - start, part)
                    await admit(frame, size, part, encoded=encoded)
            except ProtocolError as exc:
                if exc.fatal:
                    raise
                await self._refuse(exc, fatal=False, frame=frame or exc.frame)

    def _on_grant_wait(self, waiting: bool) -> None:
        """Reading stopped (or resumed) for a memory grant: session-wide flow control."""
        self._grant_waiting = waiting
        if self._admission is not None:
            self._admission.on_grant_wait(waiting)

    async def _refuse(
        self,
        exc: ProtocolError,
        *,
        fatal: bool,
        frame: pb.Frame | None = None,
        send_timeout: float | None = None,
    ) -> None:
        self._count_refusal(exc)
        if fatal:
            # An Error message first where the transport can still carry it, then the close.
            if not isinstance(exc, FrameTooLarge):
                with contextlib.suppress(ConnectionError, TimeoutError):
                    await asyncio.wait_for(self.send(self._error(exc, fatal=True)), send_timeout)
            await self.transport.reject(exc)
            return
        await self.send(self._error(exc, fatal=False, frame=frame))

    def _count_refusal(self, exc: ProtocolError) -> None:
        self._metrics.refused(self.transport.name, exc.reason)
        _refusals.log(exc.reason, "refused input from %s: %s", self.transport.name, exc)

    async def _refuse_frame(self, exc: ProtocolError) -> None:
        await self._refuse(exc, fatal=False, frame=exc.frame)

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

    def _report_chunk_refusals(self, refusals: list[ProtocolError]) -> None:
        """Count them now; send them from a task of their own (bounded queue)."""
        for exc in refusals:
            self._count_refusal(exc)
            self._chunk_reports.append(exc)
        if self._chunk_reports and (self._reporter is None or self._reporter.done()):
            self._reporter = asyncio.create_task(self._send_chunk_reports(), name="chunk-reports")

    async def _send_chunk_reports(self) -> None:
        with contextlib.suppress(ConnectionError):
            while self._chunk_reports:
                exc = self._chunk_reports.popleft()
                await self.send(self._error(exc, fatal=False, frame=exc.frame))

    def _fair_share(self) -> int | None:
        """What admission may hold, split evenly between connections, while another
        connection waits for memory (None: nobody else waits, no cut)."""
        governor = self._governor
        assert governor is not None
        if governor.waiting - (1 if self._grant_waiting else 0) <= 0:
            return None
        return governor.admissible_bytes // max(1, len(self._edges))

    def _close_stalled(self, held_for: float, held_bytes: int) -> None:
        """Fatal ``CHUNK_ABANDONED``: the connection held memory without progress. Its frames
        are released at once (the close handshake may take a while); the read loop is
        cancelled and ``run`` reports the error and closes."""
        self._stalled = ChunksStalled(
            f"held {held_bytes} bytes of incomplete chunked frames for {held_for:.1f} s "
            f"without completing one (chunk_stall_seconds {self._config.chunk_stall_seconds:g})"
        )
        assert self._uplink is not None
        self._uplink.chunks.close()
        if self._task is not None and not self._task.done():
            self._task.cancel()

    def _drain_message(self) -> pb.BridgeMessage:
        return pb.BridgeMessage(
            drain=pb.Drain(
                reconnect_after_ms=self._edges.drain_reconnect_ms
                or self._config.reconnect_after_ms,
                reason="shutting down",
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
