"""The ``VisualizationSink.Push`` handler: watermarks first, record, then cumulative acks.

Protocol (the sink's side, docs/protocol.md): on every new Push stream the sink first sends one
``SinkAck`` with ``bridge_seq = 0`` and its per-stream watermarks, so a restarted bridge never
sends what the sink already holds. Afterwards each ``SinkAck.bridge_seq`` acknowledges every
frame up to it on this stream, and only once those frames are durable (written and flushed to
the MCAP record when there is one).

Batching: a reader task queues incoming frames; the writer takes what is queued (up to
``ack_batch_frames``), records it as one MCAP chunk, acknowledges, and only then offers the new
frames to the viewers (:mod:`bridge.view.fanout`), which never block. The bounded queue turns a
slow disk into HTTP/2 backpressure on the bridge instead of memory here.

Per bridge: with replicas several bridges push here at once, each with its own ``bridge_seq``;
status reports each by the name its streams carry (:mod:`bridge.protocol.sinkbridges`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any, Protocol

import grpc

from bridge.client.transport import ROUTING_HEADER
from bridge.protocol.batches import frames_of
from bridge.protocol.sinkbridges import BridgeTable, bridge_named
from bridge.protocol.sinkstream import serve_push
from bridge.v1 import bridge_pb2 as pb
from bridge.v1 import bridge_pb2_grpc
from bridge.view import convert
from bridge.view.fanout import Delivery, Fanout
from bridge.view.ledger import Ledger
from bridge.view.stats import ViewStats

log = logging.getLogger("bridge.view.push")

Watermarks = list[tuple[str, str, int]]
Metadata = Iterable[tuple[str, str | bytes]]


class Recorder(Protocol):
    """The durable record (MCAP): ``write`` returns once the messages are on disk."""

    def write(
        self, messages: list[convert.OutMessage], marks: Callable[[], Watermarks]
    ) -> None: ...

    def roll_if_due(self, marks: Callable[[], Watermarks]) -> bool: ...


class PushSink:
    def __init__(
        self,
        *,
        ledger: Ledger,
        fanout: Fanout,
        stats: ViewStats,
        frame_ids: convert.FrameIds,
        recorder: Recorder | None = None,
        ack_batch_frames: int = 64,
        clock_ns: Callable[[], int] = time.time_ns,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if ack_batch_frames < 1:
            raise ValueError("ack_batch_frames must be >= 1")
        self.ledger = ledger
        self.fanout = fanout
        self.stats = stats
        self.frame_ids = frame_ids
        self.recorder = recorder
        self.ack_batch_frames = ack_batch_frames
        self._clock_ns = clock_ns
        self._monotonic = monotonic
        self._lock = asyncio.Lock()  # one writer at a time: watermarks follow the record
        # Counters
        self.push_streams = 0
        self.active_push_streams = 0
        self.acks_sent = 0
        self.bridges = BridgeTable()
        self.frames_recorded = 0
        self.last_frame_at = 0.0

    def status(self) -> dict[str, Any]:
        idle = self._monotonic() - self.last_frame_at if self.last_frame_at else None
        return {
            "connected": self.active_push_streams > 0,
            "push_streams": self.push_streams,
            "active_push_streams": self.active_push_streams,
            "acks_sent": self.acks_sent,
            # one entry per bridge: bridge_seq is a sequence per bridge, never compared across
            "bridges": self.bridges.report(self._monotonic()),
            "untracked_streams": self.bridges.untracked_streams,
            "frames_recorded": self.frames_recorded,
            "duplicates": self.ledger.duplicates,
            "seconds_since_last_frame": None if idle is None else round(idle, 3),
        }

    def watermark_ack(self) -> pb.SinkAck:
        return pb.SinkAck(
            bridge_seq=0,
            watermarks=[
                pb.StreamWatermark(device_id=d, stream_id=s, seq=w)
                for d, s, w in self.ledger.snapshot()
            ],
        )

    async def push(
        self,
        requests: AsyncIterator[pb.ProcessedFrame],
        write_ack: Callable[[pb.SinkAck], Awaitable[None]],
        metadata: Metadata = (),
    ) -> None:
        """Serve one Push stream until the bridge ends it; ``metadata`` names its bridge."""
        metadata = list(metadata)
        bridge = bridge_named(metadata)
        query = any(key == ROUTING_HEADER for key, _ in metadata)  # a watermark query
        ticket = self.bridges.opened(bridge, self._monotonic(), query=query)
        if not query:
            log.info("push stream from bridge %s opened", bridge or "(unnamed)")
        self.push_streams += 1
        self.active_push_streams += 1

        def acked(high: int) -> None:
            self.acks_sent += 1
            self.bridges.acked(ticket, high, self._monotonic())

        async def record(batch: list[tuple[pb.ProcessedFrame, int]]) -> int:
            self.bridges.received(ticket, len(batch), self._monotonic())
            return await self._record(batch)

        try:
            await serve_push(
                requests,
                write_ack,
                self.watermark_ack(),
                record,
                batch_frames=self.ack_batch_frames,
                clock_ns=self._clock_ns,
                on_ack=acked,
            )
        finally:
            self.active_push_streams -= 1
            self.bridges.closed(ticket, self._monotonic())
            if not query:
                log.info("push stream from bridge %s closed", bridge or "(unnamed)")

    async def roll_if_due(self) -> bool:
        """Finish the record's current file if it is due (between batches, like a write)."""
        if self.recorder is None:
            return False
        async with self._lock:
            return await asyncio.to_thread(self.recorder.roll_if_due, self.ledger.snapshot)

    async def _record(self, batch: list[tuple[pb.ProcessedFrame, int]]) -> int:
        """Make the batch durable and return its highest bridge_seq; then fan the new frames out."""
        received = {id(f): ns for f, ns in batch}
        async with self._lock:
            adm = self.ledger.admit(f for f, _ in batch)
            new_ids = {id(f) for f in adm.new}
            for f, _ in batch:
                if id(f) not in new_ids:
                    self.stats.duplicate(f.device_id, f.stream_id)
            per_frame = await asyncio.to_thread(self._convert, adm.new, received)
            if self.recorder is not None:
                messages = [m for msgs, meta in per_frame for m in (*msgs, meta)]
                await asyncio.to_thread(self.recorder.write, messages, self.ledger.snapshot)
            self.ledger.commit(adm)
        self.frames_recorded += len(adm.new)
        now = self._monotonic()
        self.last_frame_at = now
        for frame, (msgs, _meta) in zip(adm.new, per_frame, strict=True):
            ns = received[id(frame)]
            self.stats.frame(frame, ns, now)
            self.fanout.offer(Delivery(frame, msgs, ns))
        return adm.high_bridge_seq

    def _convert(
        self, frames: list[pb.ProcessedFrame], received: dict[int, int]
    ) -> list[tuple[list[convert.OutMessage], convert.OutMessage]]:
        out = []
        for f in frames:
            ns = received[id(f)]
            out.append((convert.to_messages(f, ns, self.frame_ids), convert.frame_record(f, ns)))
        return out


class _Servicer(bridge_pb2_grpc.VisualizationSinkServicer):
    def __init__(self, sink: PushSink) -> None:
        self._sink = sink

    async def Push(self, request_iterator: AsyncIterator[pb.ProcessedFrame], context: Any) -> None:
        await self._sink.push(request_iterator, context.write, context.invocation_metadata())

    async def PushBatch(
        self, request_iterator: AsyncIterator[pb.ProcessedFrameBatch], context: Any
    ) -> None:
        await self._sink.push(
            frames_of(request_iterator), context.write, context.invocation_metadata()
        )


def grpc_server(
    sink: PushSink,
    listen: str,
    *,
    max_message_bytes: int,
    credentials: grpc.ServerCredentials | None = None,
) -> tuple[Any, int]:
    """A grpc.aio server with the Push service bound to ``listen``; returns it and its port."""
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
        ]
    )
    bridge_pb2_grpc.add_VisualizationSinkServicer_to_server(  # type: ignore[no-untyped-call]
        _Servicer(sink), server
    )
    try:
        port = (
            server.add_secure_port(listen, credentials)
            if credentials is not None
            else server.add_insecure_port(listen)
        )
    except RuntimeError:  # grpc's way of saying the address cannot be bound
        port = 0
    if not port:
        raise OSError(f"cannot bind {listen}")
    return server, int(port)


def server_credentials(
    cert_file: str, key_file: str, client_ca_file: str = ""
) -> grpc.ServerCredentials | None:
    """TLS for the Push server from PEM files; with a client CA the bridge must present a
    certificate (mTLS), matching the bridge's ``sink_ca_file``/``sink_cert_file`` settings."""
    if not cert_file:
        return None
    with open(key_file, "rb") as k, open(cert_file, "rb") as c:
        pair = (k.read(), c.read())
    client_ca = None
    if client_ca_file:
        with open(client_ca_file, "rb") as ca:
            client_ca = ca.read()
    return grpc.ssl_server_credentials(
        [pair], root_certificates=client_ca, require_client_auth=client_ca is not None
    )
