"""Egress push client: the bridge dials the configured ``VisualizationSink`` and streams
processed frames to it, replaying everything unacknowledged after any reconnect.

Protocol: on a new Push stream the sink first sends its per-stream watermarks (what it already
holds); the bridge marks those delivered and only then sends, so a restarted bridge never sends
a frame twice. Afterwards the sink acknowledges cumulatively by ``bridge_seq``. Reconnects use
exponential backoff with full jitter.

Batching: the bridge first tries ``PushBatch`` (the same protocol, many consecutive frames per
message: one gRPC write instead of one per frame, the dominant per-frame cost of small frames)
and falls back to ``Push`` for the life of the process when the sink answers UNIMPLEMENTED.

Liveness: a sink can go silent without a TCP reset (a partition, a hung process). HTTP/2
keepalive pings notice a dead connection; an ack deadline notices a live connection whose sink
stopped acknowledging: frames in flight with no ack progress for ``sink_ack_timeout_seconds``
end the stream, and the next one replays them.

Identity: every stream the bridge opens names it (``x-simbridge-bridge`` metadata, see
:func:`bridge_identity`): with replicas one sink serves several bridges, and ``bridge_seq`` is
one sequence per bridge process (protocol.md §10). A sink that ignores the metadata is unaffected.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import socket
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import grpc

from bridge.config.settings import Settings
from bridge.protocol import wire
from bridge.protocol.sinkbridges import BRIDGE_HEADER, MAX_NAME_CHARS
from bridge.resources.from_settings import PUSH_COPIES
from bridge.server.governor import Component, Governor
from bridge.server.metrics import BridgeMetrics
from bridge.server.ports import Delivery
from bridge.server.ring import Entry
from bridge.server.session import ROUTING_HEADER, StreamKey
from bridge.server.tls import sink_channel_credentials
from bridge.v1 import bridge_pb2 as pb

log = logging.getLogger("bridge.push")

PUSH_METHOD = "/bridge.v1.VisualizationSink/Push"
PUSH_BATCH_METHOD = "/bridge.v1.VisualizationSink/PushBatch"
_BATCH = 64
_IN_BATCH_KEY = wire.field_key(pb.ProcessedFrameBatch.DESCRIPTOR, "frames")
#: How long a Hello waits for the sink's watermarks of its device (see SinkPusher.marks_of).
MARKS_TIMEOUT_SECONDS = 0.5

Marks = list[tuple[StreamKey, int]]


def bridge_identity(settings: Settings) -> str:
    """The name this bridge gives its push streams: ``bridge_id`` when set (a pod's supervisor
    sets one per process), else the Pod name (downward API), else ``hostname-pid``."""
    name = settings.bridge_id or settings.pod_name or f"{socket.gethostname()}-{os.getpid()}"
    printable = "".join(c if "!" <= c <= "~" else "_" for c in name)  # a gRPC metadata value
    return printable[:MAX_NAME_CHARS] or "bridge"


@dataclass(frozen=True)
class MarksLimits:
    """What one Hello may cost the sink (issue 32). Every Hello that does not resume a session
    of this bridge would open a sink stream, so an edge saying Hello in a loop with fresh device
    ids would cost the sink one stream each, and a stalled sink MARKS_TIMEOUT_SECONDS each.
    Past these limits a Hello is welcomed without asking: the query only spares resends, the
    sink's dedupe keeps delivery exactly-once without it (protocol.md §10)."""

    #: Queries open at once; against a stalled sink at most this many Hellos wait.
    in_flight: int = 8
    #: Queries a second, on average (a token bucket of ``burst``): the sink's cost of a Hello
    #: flood, whatever its shape.
    per_second: float = 50.0
    burst: int = 50
    #: An answer serves the same device's Hellos this long (a device reconnecting in a loop is
    #: asked once). Short: another replica may deliver more of it meanwhile, and a stale answer
    #: costs resends, never a frame.
    cache_seconds: float = 2.0
    cache_devices: int = 1024
    #: After a query timed out, nobody asks for this long: a stalled sink costs one Hello
    #: MARKS_TIMEOUT_SECONDS per period, not every Hello.
    stall_seconds: float = 5.0


MARKS_LIMITS = MarksLimits()


class MarksGate:
    """Which watermark queries go to the sink (sans-I/O: ``now`` is a monotonic second)."""

    def __init__(self, limits: MarksLimits) -> None:
        self.limits = limits
        self.in_flight = 0
        self._cache: OrderedDict[str, tuple[float, Marks]] = OrderedDict()
        self._tokens = float(limits.burst)
        self._refilled: float | None = None
        self._quiet_until = float("-inf")

    def cached(self, device_id: str, now: float) -> Marks | None:
        entry = self._cache.get(device_id)
        if entry is None:
            return None
        if now >= entry[0]:
            del self._cache[device_id]
            return None
        return entry[1]

    def admit(self, now: float) -> str | None:
        """None: ask (and call :meth:`done` after); else why not (one of
        bridge.server.metrics.SINK_MARKS_SKIP_REASONS)."""
        limits = self.limits
        if now < self._quiet_until:
            return "stalled"
        if self.in_flight >= limits.in_flight:
            return "in_flight"
        if self._refilled is not None:
            gained = (now - self._refilled) * limits.per_second
            self._tokens = min(float(limits.burst), self._tokens + gained)
        self._refilled = now
        if self._tokens < 1:
            return "rate"
        self._tokens -= 1
        self.in_flight += 1
        return None

    def done(self, device_id: str, now: float, marks: Marks | None, *, timed_out: bool) -> None:
        """An admitted query ended: ``marks`` is its answer (None: none came)."""
        self.in_flight -= 1
        if timed_out:
            self._quiet_until = now + self.limits.stall_seconds
        if marks is None:
            return
        self._cache[device_id] = (now + self.limits.cache_seconds, marks)
        self._cache.move_to_end(device_id)
        while len(self._cache) > self.limits.cache_devices:
            self._cache.popitem(last=False)

    def reset(self) -> None:
        """A new push stream (maybe another sink, or one that lost state): forget its answers
        and its stall."""
        self._cache.clear()
        self._quiet_until = float("-inf")


#: Installed on the core by the pusher: the sink's watermarks of one device, asked right now.
MarksLookup = Callable[[str], Awaitable[Marks]]


async def learn_sink_marks(core: object, hello: pb.Hello) -> None:
    """Before a Hello that does not resume a session of this bridge (a new device, or one that
    comes from another replica with its token), ask the sink what it holds of the device: what
    another replica delivered and the edge was not told yet is then never accepted, pushed or
    resent again (issue 32). Nothing happens without a connected sink, and within
    :class:`MarksLimits` only (else the Hello goes on without asking)."""
    lookup: MarksLookup | None = getattr(core, "marks_lookup", None)
    sessions: dict[str, object] = getattr(core, "sessions", {})
    if lookup is None or (hello.resume_token and hello.resume_token in sessions):
        return
    marks = await lookup(hello.device_id)
    if marks:
        getattr(core, "sink_watermarks")(marks)  # noqa: B009 - the core's Delivery port


class SinkPusher:
    def __init__(
        self,
        delivery: Delivery,
        settings: Settings,
        metrics: BridgeMetrics,
        governor: Governor | None = None,
    ) -> None:
        self.delivery = delivery
        self.governor = governor  # each push in flight is charged (egress) until written
        self.settings = settings
        self.metrics = metrics
        self.address = settings.sink_address
        self.bridge_id = bridge_identity(settings)
        self._wake = asyncio.Event()
        self._connected = asyncio.Event()
        self._highest_sent = 0  # bridge_seq of the last frame written on this stream
        self._highest_acked = 0
        self._waiting_since: float | None = None  # frames in flight, no ack progress since
        # PushBatch until a sink says UNIMPLEMENTED (then Push, for this process's life)
        self.batching = settings.sink_batch_bytes > 0
        self._channel: grpc.aio.Channel | None = None  # the connected sink's, for marks_of
        self.marks_gate = MarksGate(MARKS_LIMITS)
        if hasattr(delivery, "marks_lookup"):  # the core (not part of the Delivery port)
            setattr(delivery, "marks_lookup", self.marks_of)  # noqa: B010

    def wake(self) -> None:
        self._wake.set()

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    async def run(self) -> None:
        settings = self.settings
        attempt = 0
        # One frame or one batch, plus protobuf framing (see _send_loop).
        max_msg = max(settings.max_frame_bytes, settings.sink_batch_bytes) + 64 * 1024
        options = [
            ("grpc.max_send_message_length", max_msg),
            ("grpc.max_receive_message_length", max_msg),
            ("grpc.initial_reconnect_backoff_ms", 100),
            # A fresh subchannel per attempt: a shared one may still sit in gRPC's own backoff
            # after the sink restarted, stalling our reconnect for seconds.
            ("grpc.use_local_subchannel_pool", 1),
            ("grpc.max_reconnect_backoff_ms", int(settings.sink_backoff_max_seconds * 1000)),
            ("grpc.keepalive_time_ms", int(settings.sink_keepalive_seconds * 1000)),
            ("grpc.keepalive_timeout_ms", int(settings.ping_timeout_seconds * 1000)),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0),
        ]
        while True:
            self.metrics.sink_reconnects.inc()
            credentials = sink_channel_credentials(settings)
            channel = (
                grpc.aio.secure_channel(self.address, credentials, options=options)
                if credentials is not None
                else grpc.aio.insecure_channel(self.address, options=options)
            )
            async with channel:
                try:
                    if await self._session(channel):
                        attempt = 0
                except (grpc.aio.AioRpcError, ConnectionError, TimeoutError) as exc:
                    log.warning("sink %s: %s", self.address, _describe(exc))
                finally:
                    self._connected.clear()
                    self.metrics.sink_connected.set(0)
                    self.delivery.sink_failed()
            delay = min(
                settings.sink_backoff_max_seconds,
                settings.sink_backoff_initial_seconds * (2**attempt),
            )
            attempt += 1
            await asyncio.sleep(random.uniform(delay / 2, delay))

    async def _session(self, channel: grpc.aio.Channel) -> bool:
        """One Push stream, until it fails. Returns True when the handshake succeeded."""
        delivery = self.delivery
        try:
            call, first = await self._open(channel)
        except grpc.aio.AioRpcError as exc:
            if not self.batching or exc.code() != grpc.StatusCode.UNIMPLEMENTED:
                raise
            log.info("sink %s has no PushBatch: one frame per Push message", self.address)
            self.batching = False
            call, first = await self._open(channel)
        if first is grpc.aio.EOF:
            raise ConnectionError("sink closed the stream before its watermarks")
        assert isinstance(first, pb.SinkAck)
        delivery.sink_connected([((w.device_id, w.stream_id), w.seq) for w in first.watermarks])
        self.marks_gate.reset()
        self._channel = channel
        self._highest_sent = self._highest_acked = 0
        self._waiting_since = None
        self._connected.set()
        self.metrics.sink_connected.set(1)
        log.info(
            "sink %s connected as bridge %s (%d watermarks)",
            self.address,
            self.bridge_id,
            len(first.watermarks),
        )
        tasks = [
            asyncio.create_task(self._send_loop(call), name="sink-send"),
            asyncio.create_task(self._read_acks(call), name="sink-acks"),
            asyncio.create_task(self._watch_acks(), name="sink-ack-deadline"),
        ]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()  # raises what ended the stream
            raise ConnectionError("push stream ended")
        finally:
            self._channel = None
            call.cancel()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def marks_of(self, device_id: str) -> Marks:
        """The sink's watermarks of ``device_id`` now: a Push stream opened only for its first
        message (every sink sends its watermarks first, protocol.md §10), the device id in the
        ``x-simbridge-device`` metadata so a sink may send that device's only; then cancelled.
        Nothing (at once) without a connected sink or past :class:`MarksLimits` (a recent
        answer for the device is returned instead); nothing after MARKS_TIMEOUT_SECONDS."""
        channel = self._channel
        if channel is None:
            return []
        gate, now = self.marks_gate, time.monotonic()
        known = gate.cached(device_id, now)
        skipped = "cached" if known is not None else gate.admit(now)
        if skipped is not None:
            self.metrics.sink_marks_skipped.labels(skipped).inc()
            return known or []
        marks: Marks | None = None
        result = "failed"
        try:
            marks = await self._ask(channel, device_id)
            result = "failed" if marks is None else "answered"
        except TimeoutError:
            result = "timeout"
        except grpc.aio.AioRpcError as exc:
            log.info("sink %s: no watermarks for %s: %s", self.address, device_id, _describe(exc))
        finally:
            self.metrics.sink_marks_queries.labels(result).inc()
            gate.done(device_id, time.monotonic(), marks, timed_out=result == "timeout")
        if result == "timeout":
            log.info("sink %s: no watermarks for %s in time", self.address, device_id)
        return marks or []

    async def _ask(self, channel: grpc.aio.Channel, device_id: str) -> Marks | None:
        """One query; None when the sink ended the stream without its watermarks."""
        method = PUSH_BATCH_METHOD if self.batching else PUSH_METHOD
        push = channel.stream_stream(
            method, request_serializer=None, response_deserializer=pb.SinkAck.FromString
        )
        metadata = ((ROUTING_HEADER, device_id), (BRIDGE_HEADER, self.bridge_id))
        call = push(metadata=metadata, wait_for_ready=False)
        try:
            first = await asyncio.wait_for(call.read(), MARKS_TIMEOUT_SECONDS)
        finally:
            try:
                with contextlib.suppress(Exception):
                    await call.done_writing()
            finally:  # even when the Hello's task is cancelled meanwhile: no stream left open
                call.cancel()
        if not isinstance(first, pb.SinkAck):
            return None
        return [
            ((w.device_id, w.stream_id), w.seq)
            for w in first.watermarks
            if w.device_id == device_id
        ]

    async def _open(
        self, channel: grpc.aio.Channel
    ) -> tuple[grpc.aio.StreamStreamCall[bytes, pb.SinkAck], object]:
        """Start a Push (or PushBatch) stream and read the sink's watermark ack."""
        method = PUSH_BATCH_METHOD if self.batching else PUSH_METHOD
        push = channel.stream_stream(
            method, request_serializer=None, response_deserializer=pb.SinkAck.FromString
        )
        call = push(metadata=((BRIDGE_HEADER, self.bridge_id),), wait_for_ready=False)
        handshake = self.settings.sink_handshake_timeout_seconds
        try:
            return call, await asyncio.wait_for(call.read(), handshake)
        except TimeoutError:
            call.cancel()
            self.metrics.sink_failures.labels("handshake_timeout").inc()
            raise TimeoutError(
                f"no watermark SinkAck within {handshake:g} s: a VisualizationSink sends its "
                "watermarks first on every Push stream"
            ) from None

    async def _read_acks(self, call: grpc.aio.StreamStreamCall[bytes, pb.SinkAck]) -> None:
        delivery = self.delivery
        while True:
            ack = await call.read()
            if ack is grpc.aio.EOF:
                raise ConnectionError("sink ended the stream")
            assert isinstance(ack, pb.SinkAck)
            if ack.watermarks:
                delivery.sink_watermarks(
                    [((w.device_id, w.stream_id), w.seq) for w in ack.watermarks]
                )
            if ack.bridge_seq:
                self._count_delivered(delivery.sink_ack(ack.bridge_seq))
                if ack.bridge_seq > self._highest_acked:
                    self._highest_acked = ack.bridge_seq
                    caught_up = self._highest_acked >= self._highest_sent
                    self._waiting_since = None if caught_up else time.monotonic()

    async def _watch_acks(self) -> None:
        """End the stream when frames are in flight and no ack advanced for the deadline."""
        timeout = self.settings.sink_ack_timeout_seconds
        while True:
            await asyncio.sleep(min(1.0, timeout / 4))
            since = self._waiting_since
            if since is not None and time.monotonic() - since > timeout:
                self.metrics.sink_failures.labels("ack_timeout").inc()
                raise TimeoutError(
                    f"no ack progress for {timeout:g} s with frames in flight "
                    f"(sent up to bridge_seq {self._highest_sent}, acked {self._highest_acked})"
                )

    async def _send_loop(self, call: grpc.aio.StreamStreamCall[bytes, pb.SinkAck]) -> None:
        delivery = self.delivery
        replayed = self.metrics.sink_replayed
        batching = self.batching
        max_bytes = self.settings.sink_batch_bytes
        max_frames = self.settings.sink_batch_frames if batching else 1
        while True:
            self._wake.clear()
            batch = delivery.next_batch(_BATCH)
            if not batch:
                await self._wake.wait()
                if batching:
                    # One loop turn: frames committed by callbacks already ready to run (one
                    # TCP read often carries several messages) join this batch.
                    await asyncio.sleep(0)
                continue
            parts: list[wire.Part] = []
            nbytes = frames = 0
            highest = 0
            for entry in batch:
                out = delivery.mark_sent(entry)
                if out is None:  # evicted (drop_oldest) since the batch was taken
                    continue
                if out.replay:
                    replayed.inc()
                head = wire.length_prefix(_IN_BATCH_KEY, out.nbytes) if batching else b""
                if frames and nbytes + len(head) + out.nbytes > max_bytes:
                    # Never past sink_batch_bytes with more than one frame: a message is either
                    # a batch within the limit or one frame (within max_frame_bytes).
                    await self._write(call, parts, nbytes, highest)
                    parts, nbytes, frames = [], 0, 0
                if head:
                    parts.append(head)
                    nbytes += len(head)
                parts += out.parts
                nbytes += out.nbytes
                frames += 1
                highest = entry.bridge_seq
                del out
                if frames >= max_frames or nbytes >= max_bytes:
                    await self._write(call, parts, nbytes, highest)
                    parts, nbytes, frames = [], 0, 0
            if frames:
                await self._write(call, parts, nbytes, highest)

    async def _write(
        self,
        call: grpc.aio.StreamStreamCall[bytes, pb.SinkAck],
        parts: list[wire.Part],
        nbytes: int,
        highest: int,
    ) -> None:
        """One message on the stream (a frame, or a batch of them), charged before it is joined
        and while written: :data:`PUSH_COPIES` copies (forced: this is what frees the budget;
        one push is in flight at a time, so it is bounded by PUSH_COPIES x the largest message)."""
        with (
            self.governor.force(Component.EGRESS, PUSH_COPIES * nbytes)
            if self.governor is not None
            else contextlib.nullcontext()
        ):
            try:
                await call.write(b"".join(parts))
            except asyncio.InvalidStateError:
                # The sink ended the call while this write was due: the stream is gone, which
                # the session loop handles like any sink failure (reconnect, replay), never by
                # dying.
                raise ConnectionError("sink push stream already finished") from None
        self._highest_sent = max(self._highest_sent, highest)
        if self._waiting_since is None:
            self._waiting_since = time.monotonic()

    def _count_delivered(self, entries: list[Entry]) -> None:
        self.metrics.frames_delivered.inc(len(entries))
        now = time.time_ns()
        for entry in entries:
            self.metrics.e2e_latency.observe(max(0, now - entry.ingest_ns) / 1e9)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{exc.code().name}: {exc.details()}"
    return f"{type(exc).__name__}: {exc}"
