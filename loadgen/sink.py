"""Reference visualization sink: the gRPC server the bridge dials out to (VisualizationSink.Push).

Why it exists: the sink is the source of truth for delivery (docs/design.md §2). Tests and load runs
need one that is strict and observable: it tells a (re)connecting bridge what it already
holds (watermarks first on every Push stream), acknowledges cumulatively by ``bridge_seq`` only
after a batch is durable, and counts every loss, duplicate, reorder and announced gap through
:class:`loadgen.record.SinkRecord`.

Batching: a reader task queues incoming frames; the writer takes whatever is queued (up to
``ack_batch_frames``), records it, then sends one ack. Under light load every frame is acked at
once; under heavy load one fsync covers many frames. The bounded queue turns a slow disk into
HTTP/2 backpressure on the bridge instead of unbounded memory here.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc

from bridge.protocol.batches import frames_of
from bridge.protocol.sinkbridges import BridgeTable, bridge_named
from bridge.protocol.sinkstream import serve_push
from bridge.server.session import ROUTING_HEADER
from bridge.v1 import bridge_pb2 as pb
from bridge.v1 import bridge_pb2_grpc
from loadgen.record import FrameRecord, RecordFile, SinkRecord, encode

log = logging.getLogger(__name__)

DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024


def frame_record(frame: pb.ProcessedFrame, received_ns: int) -> FrameRecord:
    """Metadata of a ProcessedFrame as the sink records it (the payload is not kept)."""
    payload_points = -1
    if frame.HasField("point_cloud") and frame.point_cloud.point_stride:
        payload_points = len(frame.point_cloud.data) // frame.point_cloud.point_stride
    gap = frame.gap
    dec = frame.decimation
    return FrameRecord(
        device_id=frame.device_id,
        stream_id=frame.stream_id,
        seq=frame.seq,
        bridge_seq=frame.bridge_seq,
        capture_ns=frame.capture_time_ns,
        ingest_ns=frame.ingest_time_ns,
        processed_ns=frame.processed_time_ns,
        received_ns=received_ns,
        input_points=dec.input_points,
        output_points=dec.output_points,
        payload_points=payload_points,
        voxel_size=dec.voxel_size,
        backend=dec.backend,
        gap_first=gap.first_seq,
        gap_last=gap.last_seq,
        gap_count=gap.count,
        gap_reason=gap.reason,
    )


def routed_device(context: Any) -> str | None:
    """The device a bridge's watermark query names (the ``x-simbridge-device`` metadata: a
    bridge about to welcome that device asks for its watermarks only, docs/protocol.md §10);
    None on one of its push streams. One reading of that metadata for every sink (the relay
    benchmark's too)."""
    for key, value in context.invocation_metadata() or ():
        if key == ROUTING_HEADER:
            return str(value)
    return None


class _Servicer(bridge_pb2_grpc.VisualizationSinkServicer):
    def __init__(self, server: SinkServer) -> None:
        self._server = server

    async def Push(self, request_iterator: AsyncIterator[pb.ProcessedFrame], context: Any) -> None:
        await self._server._push(request_iterator, context)

    async def PushBatch(
        self, request_iterator: AsyncIterator[pb.ProcessedFrameBatch], context: Any
    ) -> None:
        server = self._server

        async def counted() -> AsyncIterator[pb.ProcessedFrameBatch]:
            async for batch in request_iterator:
                server.push_batches += 1
                yield batch

        await server._push(frames_of(counted()), context)


class SinkServer:
    """A VisualizationSink gRPC server on ``listen`` (port 0 = any free port).

    ``record_path``: JSON-lines log, replayed on start (state survives restarts), appended and
    fsynced before each ack. Without it the state lives in memory only. ``on_frame`` sees every
    received ProcessedFrame (payload included), e.g. for tests that check decimated clouds.
    """

    def __init__(
        self,
        *,
        listen: str = "127.0.0.1:0",
        record_path: str | Path | None = None,
        # Limits
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        ack_batch_frames: int = 64,
        # Durability
        fsync: bool = True,
        on_frame: Callable[[pb.ProcessedFrame], None] | None = None,
        clock: Callable[[], int] = time.time_ns,
        # Security: TLS (or mTLS) credentials; None = plaintext
        server_credentials: grpc.ServerCredentials | None = None,
    ) -> None:
        if ack_batch_frames < 1:
            raise ValueError("ack_batch_frames must be >= 1")
        self.listen = listen
        self.server_credentials = server_credentials
        self.record = SinkRecord()
        self.max_message_bytes = max_message_bytes
        self.ack_batch_frames = ack_batch_frames
        self._file = RecordFile(record_path, fsync=fsync) if record_path else None
        self._on_frame = on_frame
        self._clock = clock
        self._lock = asyncio.Lock()
        self._server: grpc.aio.Server | None = None
        self.port = 0
        self.replayed = 0
        # Counters
        self.push_streams = 0
        self.push_batches = 0  # PushBatch messages (each one or more frames)
        self.active_push_streams = 0
        self.acks_sent = 0
        self.batches = 0
        self.bridges = BridgeTable()  # per bridge: bridge_seq is a sequence per bridge process

    @property
    def address(self) -> str:
        host = self.listen.rpartition(":")[0] or "127.0.0.1"
        return f"{host}:{self.port}"

    async def start(self) -> int:
        """Replay the record file (if any), bind, serve; return the bound port."""
        if self._file is not None:
            self.replayed = await asyncio.to_thread(self._file.load, self.record)
        opts = [
            ("grpc.max_receive_message_length", self.max_message_bytes),
            ("grpc.max_send_message_length", self.max_message_bytes),
        ]
        self._server = grpc.aio.server(options=opts)
        bridge_pb2_grpc.add_VisualizationSinkServicer_to_server(  # type: ignore[no-untyped-call]
            self._servicer(), self._server
        )
        self.port = (
            self._server.add_secure_port(self.listen, self.server_credentials)
            if self.server_credentials is not None
            else self._server.add_insecure_port(self.listen)
        )
        if not self.port:
            raise OSError(f"cannot bind {self.listen}")
        await self._server.start()
        log.info("sink listening on %s (replayed %d records)", self.address, self.replayed)
        return int(self.port)

    async def stop(self, grace: float | None = 1.0) -> None:
        """Stop serving (idempotent); open Push streams are cancelled after ``grace`` seconds."""
        if self._server is not None:
            await self._server.stop(grace)
            self._server = None
        if self._file is not None:
            self._file.close()

    async def __aenter__(self) -> SinkServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def report(self) -> dict[str, Any]:
        rep = self.record.report()
        rep["server"] = {
            "push_streams": self.push_streams,
            "push_batches": self.push_batches,
            "active_push_streams": self.active_push_streams,
            "batches": self.batches,
            "acks_sent": self.acks_sent,
            "replayed_records": self.replayed,
            "bridges": self.bridges.report(time.monotonic()),
            "untracked_streams": self.bridges.untracked_streams,
        }
        return rep

    def _servicer(self) -> bridge_pb2_grpc.VisualizationSinkServicer:
        return _Servicer(self)

    # -- one Push stream --------------------------------------------------------------------

    async def _push(self, requests: AsyncIterator[pb.ProcessedFrame], context: Any) -> None:
        self.push_streams += 1
        self.active_push_streams += 1
        device = routed_device(context)
        bridges = self.bridges
        ticket = bridges.opened(
            bridge_named(context.invocation_metadata()), time.monotonic(), query=device is not None
        )

        def acked(high: int) -> None:
            self.acks_sent += 1
            bridges.acked(ticket, high, time.monotonic())

        async def record(batch: list[tuple[pb.ProcessedFrame, int]]) -> int:
            bridges.received(ticket, len(batch), time.monotonic())
            return await self._record_batch(batch)

        try:
            await serve_push(
                requests,
                context.write,
                self._watermark_ack(device or ""),
                record,
                batch_frames=self.ack_batch_frames,
                clock_ns=self._clock,
                on_ack=acked,
            )
        finally:
            self.active_push_streams -= 1
            bridges.closed(ticket, time.monotonic())

    def _watermark_ack(self, device_id: str = "") -> pb.SinkAck:
        """Every watermark; only ``device_id``'s when a bridge asks for one device's (the
        ``x-simbridge-device`` metadata: a bridge about to welcome that device, issue 32)."""
        return pb.SinkAck(
            bridge_seq=0,
            watermarks=[
                pb.StreamWatermark(device_id=d, stream_id=s, seq=w)
                for d, s, w in self.record.watermarks()
                if not device_id or d == device_id
            ],
        )

    async def _record_batch(self, batch: list[tuple[pb.ProcessedFrame, int]]) -> int:
        """Account and persist a batch (durable before return); return its highest bridge_seq."""
        lines: list[str] = []
        async with self._lock:  # one writer at a time: the log replays in accounting order
            for frame, received_ns in batch:
                rec = frame_record(frame, received_ns)
                is_new = self.record.feed(rec)
                if self._file is not None:
                    lines.append(encode(rec, duplicate=not is_new))
                if is_new and self._on_frame is not None:
                    self._on_frame(frame)
            if self._file is not None:
                await asyncio.to_thread(self._file.append, lines)
        self.batches += 1
        return max(frame.bridge_seq for frame, _ in batch)
