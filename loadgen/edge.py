"""Reference edge device: the client half of the ingest protocol, and an open-loop publisher.

Why: the bridge's promise (nothing accepted is lost across a reconnect or a restart) can only be
checked against an edge that keeps its side of the contract: buffer every frame until the bridge
reports it *delivered*, resend above the right sequence number after a reconnect, honour
PAUSE/RESUME and Drain, reconnect with backoff. :class:`EdgeClient` does exactly that over
WebSocket or gRPC and counts everything it sees, so tests assert on numbers, not on logs.

Structure: :class:`EdgeCore` is the sans-I/O state (sequence numbers, the bounded resend buffer,
ack and flow-control bookkeeping); :class:`EdgeClient` adds the connection loop and one sender
task; ``_WsConn`` / ``_GrpcConn`` are the two thin transports. :class:`Publisher` drives K clients
on a fixed schedule; latency is measured from the *scheduled* send time, so a stalled bridge
shows up as latency instead of silently slowing the schedule (no coordinated omission).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import grpc
import websockets
from websockets.asyncio.client import connect as ws_connect

from bridge.v1 import bridge_pb2 as pb
from bridge.v1 import bridge_pb2_grpc
from loadgen.clouds import synthetic
from loadgen.record import latency_summary

log = logging.getLogger(__name__)

Transport = Literal["ws", "grpc"]
Payload = pb.PointCloud | pb.Telemetry | bytes | Mapping[str, float]


@dataclass(frozen=True, slots=True)
class PreparedPayload:
    """A payload serialized once as the ``Frame.payload`` field, reusable across frames.

    Why: serializing a 1.6 MB cloud per frame costs about a millisecond of the load
    generator's CPU; a frame built from prepared bytes is one concatenation. Immutable, so a
    caller that later changes its PointCloud object cannot alter frames already buffered.
    """

    frame_bytes: bytes

    @classmethod
    def of(cls, payload: Payload) -> PreparedPayload:
        frame = pb.Frame()
        if isinstance(payload, pb.PointCloud):
            frame.point_cloud.CopyFrom(payload)
        elif isinstance(payload, pb.Telemetry):
            frame.telemetry.CopyFrom(payload)
        elif isinstance(payload, bytes):
            frame.telemetry.blob = payload
        else:
            frame.telemetry.values.update(payload)
        return cls(frame.SerializeToString())


DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
KINDS = {"point_cloud": pb.POINT_CLOUD, "telemetry": pb.TELEMETRY}
#: Reconnect backoff (seconds): exponential from BACKOFF_BASE, capped, with jitter.
BACKOFF_BASE = 0.1
BACKOFF_CAP = 5.0
#: Latency samples kept per client (a long run keeps the first ones; the sink keeps a reservoir).
MAX_LATENCY_SAMPLES = 1_000_000
#: Error codes that reject one frame (``Error.seq``) for good: resending it cannot succeed.
FRAME_REJECTIONS = frozenset(
    {pb.INVALID_LAYOUT, pb.TOO_LARGE, pb.TOO_MANY_POINTS, pb.UNKNOWN_STREAM, pb.SEQ_REGRESSION}
)
#: WebSocket close codes the bridge uses (docs/design.md §2), named in ``EdgeStats.close_reasons``.
WS_CLOSE_NAMES = {
    1000: "normal",
    1001: "going_away",
    1006: "abnormal",
    1007: "malformed",
    1008: "policy",
    1009: "too_big",
    1011: "internal_error",
}


@dataclass(frozen=True, slots=True)
class StreamConfig:
    """One stream the edge declares in Hello (mirrors ``bridge.v1.StreamSpec``)."""

    stream_id: str
    kind: Literal["point_cloud", "telemetry"] = "point_cloud"
    voxel_size: float = 0.0
    passthrough: bool = False
    overflow: int = pb.OVERFLOW_POLICY_UNSPECIFIED
    max_points: int = 0

    def spec(self) -> pb.StreamSpec:
        return pb.StreamSpec(
            stream_id=self.stream_id,
            kind=KINDS[self.kind],
            voxel_size=self.voxel_size,
            passthrough=self.passthrough,
            overflow=self.overflow,  # type: ignore[arg-type]
            max_points=self.max_points,
        )


@dataclass
class EdgeStats:
    """What one edge saw. ``acked_*`` count frames newly covered by cumulative acks."""

    published: int = 0
    sent: int = 0
    resent: int = 0
    acked_accepted: int = 0
    acked_delivered: int = 0
    dropped_resend_overflow: int = 0
    #: frames refused for good (an Error naming their seq, or above the Welcome's size limit)
    rejected: int = 0
    disconnects: int = 0
    reconnects: int = 0
    connect_failures: int = 0
    drains: int = 0
    pauses: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    close_reasons: Counter[str] = field(default_factory=Counter)
    latency_ns: list[int] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in vars(self).items() if k != "latency_ns"}
        d["errors"] = dict(self.errors)
        d["close_reasons"] = dict(self.close_reasons)
        d["latency"] = latency_summary(self.latency_ns)
        return d


async def cancel_and_wait(task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` and wait until it has ended, without swallowing *our* cancellation.

    ``with suppress(CancelledError): await task`` would also swallow a cancel aimed at the
    caller: a cancelled reconnect loop would then carry on, and ``asyncio.run`` (or a test
    runner) waiting for cancelled tasks would hang.
    """
    task.cancel()
    await asyncio.wait({task})
    if not task.cancelled():
        task.exception()  # retrieved: not logged as "never retrieved"


# ---------------------------------------------------------------------------------------------
# Sans-I/O core


@dataclass(slots=True)
class _Entry:
    stream_id: str
    seq: int
    order: int  # global publish order: "oldest" across streams
    data: bytes  # the serialized EdgeMessage, sent as is
    scheduled_ns: int
    transmissions: int = 0

    @property
    def nbytes(self) -> int:
        return len(self.data)


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_EDGE_MESSAGE_FRAME_TAG = b"\x12"  # EdgeMessage.frame: field 2, length-delimited


def encode_frame(stream_id: str, seq: int, capture_time_ns: int, payload: PreparedPayload) -> bytes:
    """A serialized ``EdgeMessage{frame}``: protobuf merges concatenated message encodings, so
    the small header (stream id, seq, time) followed by the prepared payload field is exactly
    the encoding of the whole frame."""
    header = pb.Frame(
        stream_id=stream_id, seq=seq, capture_time_ns=capture_time_ns
    ).SerializeToString()
    body_len = len(header) + len(payload.frame_bytes)
    return b"".join((_EDGE_MESSAGE_FRAME_TAG, _varint(body_len), header, payload.frame_bytes))


class _Stream:
    __slots__ = ("accepted", "buf", "config", "delivered", "next_seq", "paused", "pending")

    def __init__(self, config: StreamConfig) -> None:
        self.config = config
        self.next_seq = 1
        self.buf: dict[int, _Entry] = {}  # unacknowledged frames, in seq order
        self.pending: deque[_Entry] = deque()  # not yet sent on the current connection
        self.accepted = 0
        self.delivered = 0
        self.paused = False


class EdgeCore:
    """Sequence numbers, the bounded resend buffer, and what acks and flow control do to them."""

    def __init__(
        self,
        device_id: str,
        streams: list[StreamConfig],
        *,
        resend_buffer_bytes: int,
        resend_buffer_frames: int,
        stats: EdgeStats | None = None,
    ) -> None:
        if not streams:
            raise ValueError("an edge needs at least one stream")
        if len({s.stream_id for s in streams}) != len(streams):
            raise ValueError("stream ids must be unique")
        if resend_buffer_bytes <= 0 or resend_buffer_frames <= 0:
            raise ValueError("resend buffer bounds must be > 0")
        self.device_id = device_id
        self.streams = {s.stream_id: _Stream(s) for s in streams}
        self.max_bytes = resend_buffer_bytes
        self.max_frames = resend_buffer_frames
        self.stats = stats or EdgeStats()
        self.session_id = ""
        self.session_paused = False
        self.buffered_bytes = 0
        self.buffered_frames = 0
        self._order = 0

    # -- publishing ---------------------------------------------------------------------------

    def publish(
        self, stream_id: str, payload: Payload | PreparedPayload, capture_time_ns: int
    ) -> int:
        """Assign the next seq, buffer the frame, evict the oldest frames beyond the bounds."""
        st = self.streams[stream_id]  # KeyError for an undeclared stream: a caller bug
        if not isinstance(payload, PreparedPayload):
            payload = PreparedPayload.of(payload)
        data = encode_frame(stream_id, st.next_seq, capture_time_ns, payload)
        self._order += 1
        entry = _Entry(stream_id, st.next_seq, self._order, data, capture_time_ns)
        st.next_seq += 1
        st.buf[entry.seq] = entry
        st.pending.append(entry)
        self.buffered_bytes += entry.nbytes
        self.buffered_frames += 1
        self.stats.published += 1
        # The newest frame always stays: evicting it would make publish a no-op.
        while (
            self.buffered_frames > self.max_frames or self.buffered_bytes > self.max_bytes
        ) and self.buffered_frames > 1:
            self._evict_oldest()
        return entry.seq

    def _evict_oldest(self) -> None:
        victim = min(
            (s for s in self.streams.values() if s.buf),
            key=lambda s: next(iter(s.buf.values())).order,
        )
        entry = victim.buf.pop(next(iter(victim.buf)))
        self._forget(entry)
        self.stats.dropped_resend_overflow += 1

    def _forget(self, entry: _Entry) -> None:
        self.buffered_bytes -= entry.nbytes
        self.buffered_frames -= 1

    def reject(self, stream_id: str, seq: int) -> bool:
        """Forget a frame the bridge refused for good (it would be refused again on resend)."""
        st = self.streams.get(stream_id)
        entry = st.buf.pop(seq, None) if st is not None else None
        if entry is None:
            return False
        self._forget(entry)
        self.stats.rejected += 1
        return True

    # -- connection lifecycle -----------------------------------------------------------------

    def hello(self, auth_token: str = "") -> pb.EdgeMessage:
        return pb.EdgeMessage(
            hello=pb.Hello(
                device_id=self.device_id,
                resume_token=self.session_id,
                streams=[s.config.spec() for s in self.streams.values()],
                resume=[
                    pb.ResumeState(stream_id=sid, delivered_seq=s.delivered)
                    for sid, s in self.streams.items()
                ],
                auth_token=auth_token,
            )
        )

    def on_welcome(self, welcome: pb.Welcome, now_ns: int) -> None:
        """Adopt the session and queue every buffered frame the bridge does not hold."""
        self.session_id = welcome.session_id
        self.session_paused = False
        states = {s.stream_id: s for s in welcome.streams}
        for sid, st in self.streams.items():
            st.paused = False
            state = states.get(sid)
            bridge_delivered = state.delivered_seq if state else 0
            self._delivered(st, bridge_delivered, now_ns)
            if welcome.resumed and state is not None:
                start = max(st.delivered, state.accepted_seq)
                self._accepted(st, state.accepted_seq)
            else:
                start = st.delivered
            st.pending = deque(e for e in st.buf.values() if e.seq > start)

    def on_ack(self, ack: pb.Ack, now_ns: int) -> None:
        for sa in ack.streams:
            st = self.streams.get(sa.stream_id)
            if st is not None:
                self._accepted(st, sa.accepted_seq)
                self._delivered(st, sa.delivered_seq, now_ns)

    def _accepted(self, st: _Stream, seq: int) -> None:
        if seq > st.accepted:
            self.stats.acked_accepted += seq - st.accepted
            st.accepted = seq

    def _delivered(self, st: _Stream, seq: int, now_ns: int) -> None:
        """Discard buffered frames up to ``seq`` (never earlier) and sample their latency."""
        if seq <= st.delivered:
            return
        st.delivered = seq
        lat = self.stats.latency_ns
        while st.buf:
            first = next(iter(st.buf))
            if first > seq:
                break
            entry = st.buf.pop(first)
            self._forget(entry)
            self.stats.acked_delivered += 1
            if len(lat) < MAX_LATENCY_SAMPLES:
                lat.append(now_ns - entry.scheduled_ns)

    def on_flow_control(self, fc: pb.FlowControl) -> None:
        paused = fc.action == pb.FlowControl.PAUSE
        if fc.action not in (pb.FlowControl.PAUSE, pb.FlowControl.RESUME):
            return
        self.stats.pauses += paused
        if not fc.stream_id:
            self.session_paused = paused
        elif (st := self.streams.get(fc.stream_id)) is not None:
            st.paused = paused

    # -- sending ------------------------------------------------------------------------------

    def next_to_send(self, max_frame_bytes: int = 0) -> _Entry | None:
        """The oldest frame not yet sent on this connection, among streams that are not paused.

        Frames above ``max_frame_bytes`` (the Welcome's limit, 0 = none) are rejected here:
        sending one would only get the connection closed, again after every reconnect.
        """
        if self.session_paused:
            return None
        best: _Entry | None = None
        for st in self.streams.values():
            if st.paused:
                continue
            while st.pending and (
                st.pending[0].seq not in st.buf  # acked or evicted meanwhile
                or (max_frame_bytes and st.pending[0].nbytes > max_frame_bytes)
            ):
                head = st.pending.popleft()
                if head.seq in st.buf:
                    self.reject(head.stream_id, head.seq)
            if st.pending and (best is None or st.pending[0].order < best.order):
                best = st.pending[0]
        return best

    def mark_sent(self, entry: _Entry) -> None:
        st = self.streams[entry.stream_id]
        if st.pending and st.pending[0] is entry:
            st.pending.popleft()
        if entry.transmissions:
            self.stats.resent += 1
        else:
            self.stats.sent += 1
        entry.transmissions += 1

    def all_delivered(self) -> bool:
        return self.buffered_frames == 0


# ---------------------------------------------------------------------------------------------
# Transports


class _Conn(Protocol):
    async def send(self, data: bytes) -> None: ...
    async def recv(self) -> pb.BridgeMessage | None: ...
    async def close(self) -> None: ...
    def close_reason(self) -> str: ...


class _WsConn:
    """One WebSocket connection; binary messages only, deflate off, explicit max size."""

    def __init__(self, ws: Any) -> None:
        self._ws = ws

    @classmethod
    async def open(
        cls, url: str, max_bytes: int, open_timeout: float, auth_token: str = ""
    ) -> _WsConn:
        ws = await ws_connect(
            url,
            max_size=max_bytes,
            compression=None,
            ping_interval=20,
            open_timeout=open_timeout,
            additional_headers={"Authorization": f"Bearer {auth_token}"} if auth_token else None,
        )
        return cls(ws)

    async def send(self, data: bytes) -> None:
        await self._ws.send(data)

    async def recv(self) -> pb.BridgeMessage | None:
        try:
            data = await self._ws.recv()
        except websockets.ConnectionClosed:
            return None
        if isinstance(data, str):
            raise ValueError("bridge sent a text frame; the protocol is binary")
        return pb.BridgeMessage.FromString(data)

    async def close(self) -> None:
        await self._ws.close()

    def close_reason(self) -> str:
        code = self._ws.close_code
        if code is None:
            return "ws:none"
        return f"ws:{code}:{WS_CLOSE_NAMES[code]}" if code in WS_CLOSE_NAMES else f"ws:{code}"


class _GrpcConn:
    """One ``Ingest.Connect`` call on its own channel, fed from a bounded queue."""

    def __init__(self, target: str, max_bytes: int, auth_token: str = "") -> None:
        self._channel = grpc.aio.insecure_channel(
            target,
            options=[
                ("grpc.max_send_message_length", max_bytes),
                ("grpc.max_receive_message_length", max_bytes),
                # Channels to one target share subchannels by default, and a shared subchannel
                # in gRPC's own reconnect backoff fails every new call at once: our reconnect
                # loop would keep failing after the bridge is back. One pool per channel.
                ("grpc.use_local_subchannel_pool", 1),
            ],
        )
        # A small queue: a slow stream backs up into the sender (and the resend buffer).
        self._queue: asyncio.Queue[pb.EdgeMessage | None] = asyncio.Queue(maxsize=8)
        stub = bridge_pb2_grpc.IngestStub(self._channel)  # type: ignore[no-untyped-call]
        metadata = (("authorization", f"Bearer {auth_token}"),) if auth_token else None
        self._call = stub.Connect(self._requests(), metadata=metadata)
        self._status = ""

    async def _requests(self) -> AsyncIterator[pb.EdgeMessage]:
        while (msg := await self._queue.get()) is not None:
            yield msg

    async def send(self, data: bytes) -> None:
        # The generated stub serializes messages itself, so the prepared bytes are parsed back.
        await self._queue.put(pb.EdgeMessage.FromString(data))

    async def recv(self) -> pb.BridgeMessage | None:
        try:
            msg = await self._call.read()
        except grpc.aio.AioRpcError as exc:
            self._status = exc.code().name
            return None
        if msg is grpc.aio.EOF:
            self._status = "OK"
            return None
        return msg  # type: ignore[no-any-return]

    async def close(self) -> None:
        # End the request generator too, or it stays parked on the queue after the cancel.
        with contextlib.suppress(asyncio.QueueFull):
            self._queue.put_nowait(None)
        self._call.cancel()
        await self._channel.close()

    def close_reason(self) -> str:
        return f"grpc:{self._status or 'CANCELLED'}"


# ---------------------------------------------------------------------------------------------
# The client


class EdgeClient:
    """An edge device over ``transport`` ("ws": ``url`` = ws://host:port/v1/ingest; "grpc":
    ``url`` = host:port). Use ``await start()``, ``await publish(...)``, ``await close()``."""

    def __init__(
        self,
        transport: Transport,
        url: str,
        device_id: str,
        streams: list[StreamConfig],
        *,
        # Limits
        resend_buffer_bytes: int = 256 * 1024 * 1024,
        resend_buffer_frames: int = 10_000,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        # Timeouts
        open_timeout: float = 10.0,
        welcome_timeout: float = 10.0,
        auth_token: str = "",
        seed: int | None = None,
    ) -> None:
        if transport not in ("ws", "grpc"):
            raise ValueError(f"transport must be 'ws' or 'grpc', got {transport!r}")
        self.transport = transport
        self.url = url
        self.stats = EdgeStats()
        self.core = EdgeCore(
            device_id,
            streams,
            resend_buffer_bytes=resend_buffer_bytes,
            resend_buffer_frames=resend_buffer_frames,
            stats=self.stats,
        )
        self.max_message_bytes = max_message_bytes
        self.open_timeout = open_timeout
        self.welcome_timeout = welcome_timeout
        self.auth_token = auth_token
        self.welcome: pb.Welcome | None = None
        self._rng = random.Random(seed)
        self._closing = False
        self._run_task: asyncio.Task[None] | None = None
        self._conn: _Conn | None = None
        self._connected = asyncio.Event()
        self._wake = asyncio.Event()  # the sender has something to look at
        self._progress = asyncio.Event()  # replaced on every state change (broadcast)
        self._welcomes = 0

    @property
    def device_id(self) -> str:
        return self.core.device_id

    @property
    def session_id(self) -> str:
        return self.core.session_id

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    async def start(self, *, wait: bool = True, timeout: float = 10.0) -> None:  # noqa: ASYNC109
        """Start the connection loop; with ``wait``, return once the first Welcome arrived."""
        if self._run_task is None:
            self._run_task = asyncio.create_task(self._run(), name=f"edge-{self.device_id}")
        if wait:
            try:
                await asyncio.wait_for(self._connected.wait(), timeout)
            except TimeoutError:
                await self.close()
                raise ConnectionError(
                    f"{self.device_id}: no Welcome from {self.url} within {timeout} s"
                ) from None

    async def publish(
        self,
        stream_id: str,
        payload: Payload | PreparedPayload,
        *,
        capture_time_ns: int | None = None,
    ) -> int:
        """Buffer the next frame of ``stream_id`` and let the sender transmit it; return its seq.

        ``payload``: a PointCloud, a Telemetry, ``bytes`` (a telemetry blob), a mapping (telemetry
        values) or a :class:`PreparedPayload` (fastest when one payload is published repeatedly).
        ``capture_time_ns`` defaults to now; the Publisher passes the scheduled time instead.
        """
        seq = self.core.publish(
            stream_id, payload, time.time_ns() if capture_time_ns is None else capture_time_ns
        )
        self._wake.set()
        self._notify()
        await asyncio.sleep(0)
        return seq

    async def wait_delivered(self, timeout: float) -> bool:  # noqa: ASYNC109
        """Wait until every buffered frame is reported delivered; False on timeout."""
        try:
            async with asyncio.timeout(timeout):
                while not self.core.all_delivered():
                    await self._progress.wait()
        except TimeoutError:
            return False
        return True

    async def wait_for(self, predicate: Any, timeout: float = 5.0) -> bool:  # noqa: ASYNC109
        """Wait until ``predicate()`` holds after some protocol event; False on timeout."""
        try:
            async with asyncio.timeout(timeout):
                while not predicate():
                    await self._progress.wait()
        except TimeoutError:
            return False
        return True

    async def close(self) -> None:
        """Stop reconnecting and close the connection (idempotent). Buffered frames are kept."""
        self._closing = True
        self._wake.set()
        self._notify()
        task, self._run_task = self._run_task, None
        if self._conn is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._conn.close(), 2.0)
        if task is not None:
            await cancel_and_wait(task)

    def _notify(self) -> None:
        self._progress.set()
        self._progress = asyncio.Event()

    def _backoff(self, attempt: int) -> float:
        delay = min(BACKOFF_CAP, BACKOFF_BASE * 2.0 ** max(0, attempt - 1))
        return delay * self._rng.uniform(0.5, 1.0)

    async def _open(self) -> _Conn:
        if self.transport == "ws":
            return await _WsConn.open(
                self.url, self.max_message_bytes, self.open_timeout, self.auth_token
            )
        return _GrpcConn(self.url, self.max_message_bytes, self.auth_token)

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
            try:
                self._conn = await self._open()
                drain_delay = await self._session(self._conn)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # any failure of this connection: reconnect
                log.debug("%s: connection ended: %r", self.device_id, exc)
            finally:
                conn, self._conn = self._conn, None
                self._connected.clear()
                if conn is not None:
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(conn.close(), 2.0)
                    self.stats.close_reasons[conn.close_reason()] += 1
            if self._closing:
                break
            if self._welcomes > welcomed_before:
                self.stats.disconnects += 1
                attempt = 1
            else:
                self.stats.connect_failures += 1
                attempt += 1
            delay = drain_delay if drain_delay is not None else self._backoff(attempt)
            self._notify()

    async def _session(self, conn: _Conn) -> float | None:
        """One connection: Hello, Welcome, then send and receive until it ends.

        Returns the reconnect delay a Drain asked for, or None for a plain disconnect.
        """
        await conn.send(self.core.hello(self.auth_token).SerializeToString())
        first = await asyncio.wait_for(conn.recv(), self.welcome_timeout)
        if first is None:
            raise ConnectionError("closed before Welcome")
        kind = first.WhichOneof("kind")
        if kind != "welcome":
            if kind == "error":
                self.stats.errors[pb.ErrorCode.Name(first.error.code)] += 1
            raise ConnectionError(f"expected Welcome, got {kind}")
        self.welcome = first.welcome
        self.core.on_welcome(first.welcome, time.time_ns())
        if self._welcomes:
            self.stats.reconnects += 1
        self._welcomes += 1
        self._connected.set()
        self._notify()
        sender = asyncio.create_task(self._send_loop(conn))
        try:
            while (msg := await conn.recv()) is not None:
                drain = self._handle(msg)
                self._notify()
                if drain is not None:
                    return drain
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
            err = msg.error
            self.stats.errors[pb.ErrorCode.Name(err.code)] += 1
            log.info("%s: bridge error %s", self.device_id, err.message)
            if err.code in FRAME_REJECTIONS and err.stream_id and err.seq:
                self.core.reject(err.stream_id, err.seq)
        elif kind == "drain":
            self.stats.drains += 1
            return msg.drain.reconnect_after_ms / 1000.0
        elif kind == "welcome":
            self.stats.errors["UNEXPECTED_WELCOME"] += 1
        return None

    async def _send_loop(self, conn: _Conn) -> None:
        try:
            while True:
                limit = self.welcome.limits.max_frame_bytes if self.welcome else 0
                entry = self.core.next_to_send(limit)
                if entry is None:
                    self._notify()  # next_to_send may have rejected oversized frames
                    self._wake.clear()
                    if (entry := self.core.next_to_send(limit)) is None:
                        await self._wake.wait()
                        continue
                await conn.send(entry.data)
                self.core.mark_sent(entry)
                # websockets' send() does not yield while the socket takes data (docs/design.md §6).
                await asyncio.sleep(0)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.debug("%s: send failed: %r", self.device_id, exc)
            with contextlib.suppress(Exception):
                await conn.close()  # the receiver sees the end and the loop reconnects


# ---------------------------------------------------------------------------------------------
# Open-loop publisher


class Publisher:
    """K edges, S point-cloud streams each (plus one telemetry stream), at ``rate_hz`` per stream.

    Each edge runs its own schedule (staggered across one period so K edges do not burst
    together). A tick that is late is still published at once with its *scheduled* capture time.
    """

    def __init__(
        self,
        transport: Transport,
        url: str,
        *,
        edges: int = 1,
        streams_per_edge: int = 1,
        rate_hz: float = 10.0,
        duration_s: float = 5.0,
        points: int = 10_000,
        telemetry: bool = False,
        voxel_size: float = 0.0,
        color: bool = False,
        device_prefix: str = "loadgen",
        seed: int = 0,
        resend_buffer_bytes: int = 256 * 1024 * 1024,
        resend_buffer_frames: int = 10_000,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        drain_timeout_s: float = 10.0,
        connect_timeout_s: float = 10.0,
        auth_token: str = "",
    ) -> None:
        if edges < 1 or streams_per_edge < 0 or rate_hz <= 0 or duration_s < 0:
            raise ValueError("edges >= 1, streams_per_edge >= 0, rate_hz > 0, duration_s >= 0")
        if streams_per_edge == 0 and not telemetry:
            raise ValueError("nothing to publish: no point-cloud streams and no telemetry")
        self.rate_hz = rate_hz
        self.duration_s = duration_s
        self.drain_timeout_s = drain_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.telemetry = telemetry
        self.cloud_streams = [f"lidar{i}" for i in range(streams_per_edge)]
        specs = [StreamConfig(s, voxel_size=voxel_size) for s in self.cloud_streams]
        if telemetry:
            specs.append(StreamConfig("telemetry", kind="telemetry"))
        self.clients = [
            EdgeClient(
                transport,
                url,
                f"{device_prefix}-{i}",
                specs,
                resend_buffer_bytes=resend_buffer_bytes,
                resend_buffer_frames=resend_buffer_frames,
                max_message_bytes=max_message_bytes,
                auth_token=auth_token,
                seed=seed + i,
            )
            for i in range(edges)
        ]
        # A few distinct clouds shared by all streams: realistic content, bounded memory.
        self.clouds = [
            PreparedPayload.of(synthetic(points, seed + k, color=color).to_proto())
            for k in range(4)
        ]
        self.late_ticks = 0
        self.max_lag_s = 0.0
        self.elapsed_s = 0.0

    async def run(self) -> dict[str, Any]:
        """Connect all edges, publish for ``duration_s``, wait for delivery, close; report."""
        try:
            await asyncio.gather(*(c.start(timeout=self.connect_timeout_s) for c in self.clients))
        except BaseException:
            await asyncio.gather(*(c.close() for c in self.clients))
            raise
        loop = asyncio.get_running_loop()
        # One instant read on both clocks: schedule on the monotonic one, stamp with wall time.
        t0_mono, t0_wall = loop.time() + 0.05, time.time_ns() + 50_000_000
        period = 1.0 / self.rate_hz
        try:
            await asyncio.gather(
                *(
                    self._drive(c, t0_mono, t0_wall, i * period / len(self.clients), i)
                    for i, c in enumerate(self.clients)
                )
            )
            self.elapsed_s = loop.time() - t0_mono
            await asyncio.gather(*(c.wait_delivered(self.drain_timeout_s) for c in self.clients))
        finally:
            await asyncio.gather(*(c.close() for c in self.clients))
        return self.report()

    async def _drive(
        self, client: EdgeClient, t0_mono: float, t0_wall: int, stagger_s: float, index: int
    ) -> None:
        loop = asyncio.get_running_loop()
        period = 1.0 / self.rate_hz
        for tick in range(int(self.duration_s * self.rate_hz)):
            due = t0_mono + stagger_s + tick * period
            lag = loop.time() - due
            if lag < 0:
                await asyncio.sleep(-lag)
            elif lag > period:
                self.late_ticks += 1
            self.max_lag_s = max(self.max_lag_s, lag)
            scheduled_ns = t0_wall + int((due - t0_mono) * 1e9)
            for k, sid in enumerate(self.cloud_streams):
                cloud = self.clouds[(tick + k + index) % len(self.clouds)]
                await client.publish(sid, cloud, capture_time_ns=scheduled_ns)
            if self.telemetry:
                values = {"tick": float(tick), "speed_mps": 5.0 + (tick % 10) / 10.0}
                await client.publish("telemetry", values, capture_time_ns=scheduled_ns)

    def report(self) -> dict[str, Any]:
        total = EdgeStats()
        buffered = 0
        for c in self.clients:
            s = c.stats
            for k in (
                "published",
                "sent",
                "resent",
                "acked_accepted",
                "acked_delivered",
                "dropped_resend_overflow",
                "disconnects",
                "reconnects",
                "connect_failures",
                "drains",
                "pauses",
            ):
                setattr(total, k, getattr(total, k) + getattr(s, k))
            total.errors.update(s.errors)
            total.close_reasons.update(s.close_reasons)
            total.latency_ns.extend(s.latency_ns)
            buffered += c.core.buffered_frames
        out = total.as_dict()
        out.update(
            edges=len(self.clients),
            streams_per_edge=len(self.cloud_streams) + self.telemetry,
            rate_hz=self.rate_hz,
            duration_s=self.duration_s,
            elapsed_s=round(self.elapsed_s, 3),
            publish_rate_hz=round(total.published / self.elapsed_s, 1) if self.elapsed_s else 0,
            undelivered=buffered,
            late_ticks=self.late_ticks,
            max_schedule_lag_ms=round(max(0.0, self.max_lag_s) * 1e3, 3),
        )
        return out
