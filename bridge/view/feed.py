"""A best-effort Push client that tees processed frames into a ``simbridge view``.

Why: a process that already *is* a bridge's sink (the load generator's reference sink, which
keeps the delivery accounting) can still show its frames live and record them: it hands each new
frame to :meth:`ViewFeed.offer`, and the feed forwards it to a view over
``VisualizationSink.Push``. ``offer`` never blocks: the queue drops its oldest frame when the view
falls behind (counted in ``dropped``), and a view that is down only costs reconnect attempts.

The frames keep their payload bytes; the feed re-numbers ``bridge_seq`` on its own stream and may
prefix ``device_id`` (e.g. with the run mode) by appending a small trailer: protobuf lets the
last occurrence of a scalar field win, so the frame is never copied or re-encoded.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import grpc

from bridge.v1 import bridge_pb2 as pb
from bridge.view.fanout import DroppingQueue

log = logging.getLogger("bridge.view.feed")

PUSH_METHOD = "/bridge.v1.VisualizationSink/Push"


class ViewFeed:
    def __init__(
        self, address: str, *, queue_frames: int = 256, max_message_bytes: int = 64 << 20
    ) -> None:
        self.address = address
        self.max_message_bytes = max_message_bytes
        self._queue: DroppingQueue[bytes] = DroppingQueue(queue_frames)
        self._task: asyncio.Task[None] | None = None
        self._next = 0
        self.sent = 0
        self.connects = 0

    @property
    def dropped(self) -> int:
        return self._queue.dropped

    def offer(self, frame: pb.ProcessedFrame, device_prefix: str = "") -> None:
        """Queue ``frame`` for the view (call from the event loop the feed runs on)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="view-feed")
        self._next += 1
        trailer = pb.ProcessedFrame(bridge_seq=self._next)
        if device_prefix:
            trailer.device_id = f"{device_prefix}{frame.device_id}"
        self._queue.put(frame.SerializeToString() + trailer.SerializeToString())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        options = [
            ("grpc.max_send_message_length", self.max_message_bytes),
            ("grpc.max_receive_message_length", self.max_message_bytes),
        ]
        while True:
            try:
                async with grpc.aio.insecure_channel(self.address, options=options) as channel:
                    call = channel.stream_stream(
                        PUSH_METHOD,
                        request_serializer=None,
                        response_deserializer=pb.SinkAck.FromString,
                    )()
                    await call.read()  # the view's watermarks: it drops what it already holds
                    self.connects += 1
                    acks = asyncio.create_task(self._drain_acks(call))
                    try:
                        while True:
                            await call.write(await self._queue.get())
                            self.sent += 1
                    finally:
                        acks.cancel()
                        call.cancel()
            except (grpc.aio.AioRpcError, ConnectionError) as exc:
                log.debug("view feed to %s: %s", self.address, exc)
            await asyncio.sleep(0.5)

    @staticmethod
    async def _drain_acks(call: grpc.aio.StreamStreamCall[bytes, pb.SinkAck]) -> None:
        while await call.read() is not grpc.aio.EOF:
            pass
