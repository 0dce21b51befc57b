"""The relay benchmark's sink: one gRPC server in the benchmark process for every target."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from typing import Any

import grpc

from benchmarks.relay.common import (
    ACK_EVERY,
    ACK_IDLE_SECONDS,
    MAX_FRAME_BYTES,
    RAW_HEADER,
    SINK_PUSH_METHOD,
    Cell,
    scan_processed,
)
from benchmarks.relay.servers import RAW_SINK_METHOD, grpc_options
from bridge.protocol.wire import field_key, repeated_spans
from bridge.v1 import bridge_pb2 as pb
from loadgen.sink import routed_device

SINK_PUSH_BATCH_METHOD = SINK_PUSH_METHOD + "Batch"
_IN_BATCH_KEY = field_key(pb.ProcessedFrameBatch.DESCRIPTOR, "frames")


class BenchSink:
    """The visualization sink every target pushes to, in this process.

    Two methods on one gRPC server: the bridge's ``VisualizationSink/Push`` (watermark ack first,
    then cumulative acks; the bridge holds every frame until acked) and the raw relays' protocol-
    free ``RawSink/Push``. Both stamp the arrival time before anything else and hand the message
    to the current :class:`Cell`. Requests stay raw bytes: no protobuf copy of the payload.
    """

    def __init__(self, max_bytes: int = MAX_FRAME_BYTES) -> None:
        self.max_bytes = max_bytes
        self.cell: Cell | None = None
        self.stray = 0  # arrivals outside any cell (should stay 0)
        self.bridge_streams = 0
        self.raw_streams = 0
        self.acks_sent = 0
        self._server: Any = None
        self.port = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def reserve_port(self) -> int:
        """Pick the port before listening, so the relays can be started first."""
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        return self.port

    async def start(self) -> int:
        server = grpc.aio.server(options=grpc_options(self.max_bytes + 64 * 1024))
        handlers: dict[str, dict[str, Any]] = {}
        for path, handler in (
            (SINK_PUSH_METHOD, grpc.stream_stream_rpc_method_handler(self._bridge_push)),
            (SINK_PUSH_BATCH_METHOD, grpc.stream_stream_rpc_method_handler(self._bridge_batch)),
            (RAW_SINK_METHOD, grpc.stream_unary_rpc_method_handler(self._raw_push)),
        ):
            service, method = path.strip("/").split("/")
            handlers.setdefault(service, {})[method] = handler
        server.add_generic_rpc_handlers(
            tuple(grpc.method_handlers_generic_handler(s, m) for s, m in handlers.items())
        )
        self.port = server.add_insecure_port(f"127.0.0.1:{self.port}")
        if not self.port:
            raise OSError("the sink cannot bind its port")
        await server.start()
        self._server = server
        return self.port

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(0.5)
            self._server = None

    def _arrive(self, key: bytes | int, seq: int, sent_ns: int, now_ns: int) -> None:
        cell = self.cell
        if cell is None:
            self.stray += 1
        else:
            cell.arrive(key, seq, sent_ns, now_ns)

    async def _raw_push(self, requests: Any, _context: Any) -> bytes:
        self.raw_streams += 1
        unpack = RAW_HEADER.unpack_from
        clock = time.time_ns
        async for raw in requests:
            now = clock()
            sent_ns, token, seq = unpack(raw)
            self._arrive(token, seq, sent_ns, now)
        return b""

    async def _bridge_batch(self, requests: Any, context: Any) -> None:
        await self._bridge_push(requests, context, batched=True)

    async def _bridge_push(self, requests: Any, context: Any, *, batched: bool = False) -> None:
        if routed_device(context) is not None:
            # A bridge asking one device's watermarks before it welcomes it (docs/protocol.md
            # section 10): this sink holds none; not one of the bridge's push streams.
            await context.write(pb.SinkAck(bridge_seq=0).SerializeToString())
            return
        self.bridge_streams += 1
        high = 0
        unacked = 0
        wake = asyncio.Event()
        ended = False

        async def reader() -> None:
            nonlocal high, unacked, ended
            clock = time.time_ns
            try:
                async for raw in requests:
                    now = clock()
                    spans = repeated_spans(raw, _IN_BATCH_KEY) if batched else [(0, len(raw))]
                    for start, end in spans:
                        device, seq, capture_ns, bridge_seq = scan_processed(raw, start, end)
                        self._arrive(device, seq, capture_ns, now)
                        high = max(high, bridge_seq)
                        unacked += 1
                    if unacked >= ACK_EVERY:
                        wake.set()
            finally:
                ended = True
                wake.set()

        task = asyncio.create_task(reader(), name="bench-sink-reader")
        try:
            # The bridge sends nothing before the watermark ack; this sink holds nothing.
            await context.write(pb.SinkAck(bridge_seq=0).SerializeToString())
            acked = 0
            while not ended:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(ACK_IDLE_SECONDS):
                        await wake.wait()
                wake.clear()
                if high > acked:
                    acked, unacked = high, 0
                    await context.write(pb.SinkAck(bridge_seq=acked).SerializeToString())
                    self.acks_sent += 1
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
