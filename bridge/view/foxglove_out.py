"""The live Foxglove WebSocket server (foxglove-sdk): one channel per topic, messages as recorded.

The messages are the bytes already encoded for the MCAP record (``foxglove.PointCloud`` protobuf,
JSON for telemetry and gaps), logged on generic channels with the same schemas, so Foxglove shows
the live stream and the recording identically. The SDK's server speaks the ``foxglove.sdk.v1``
subprotocol and keeps its own bounded per-client queues; our queue in front of it drops the
oldest delivery when the publisher falls behind, counts it per stream and announces it on
``/<device>/<stream>/gaps`` with reason ``slow_viewer``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import foxglove

from bridge.view import convert
from bridge.view.fanout import Delivery, DroppingQueue
from bridge.view.stats import ViewStats

log = logging.getLogger("bridge.view.foxglove")


class FoxgloveOutlet:
    def __init__(
        self,
        stats: ViewStats,
        *,
        host: str = "127.0.0.1",
        port: int = 8765,
        name: str = "simbridge",
        queue_frames: int = 256,
    ) -> None:
        self.stats = stats
        self.host = host
        self.port = port
        self.name = name
        self._queue: DroppingQueue[Delivery] = DroppingQueue(queue_frames, self._dropped)
        self._missed: dict[tuple[str, str], int] = {}
        self._context: Any = None
        self._server: Any = None
        self._channels: dict[str, foxglove.Channel] = {}
        self._task: asyncio.Task[None] | None = None
        self.dropped = 0
        self.logged = 0

    def start(self) -> int:
        self._context = foxglove.Context()
        self._server = foxglove.start_server(
            name=self.name, host=self.host, port=self.port, context=self._context
        )
        self.port = int(self._server.port)
        self._task = asyncio.create_task(self._run(), name="view-foxglove")
        log.info("Foxglove WebSocket server on ws://%s:%d", self.host, self.port)
        return self.port

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._server is not None:
            self._server.stop()
            self._server = None

    def offer(self, delivery: Delivery) -> None:
        self._queue.put(delivery)

    def status(self) -> dict[str, Any]:
        return {"port": self.port, "dropped": self.dropped, "logged": self.logged}

    def _dropped(self, delivery: Delivery) -> None:
        key = (delivery.frame.device_id, delivery.frame.stream_id)
        self._missed[key] = self._missed.get(key, 0) + 1
        self.dropped += 1
        self.stats.viewer_drop(*key)

    def _channel(self, msg: convert.OutMessage) -> foxglove.Channel:
        ch = self._channels.get(msg.topic)
        if ch is None:
            s = convert.SCHEMAS[msg.kind]
            ch = self._channels[msg.topic] = foxglove.Channel(
                msg.topic,
                schema=foxglove.Schema(name=s.name, encoding=s.encoding, data=s.data),
                message_encoding=s.message_encoding,
                context=self._context,
                metadata={"device": msg.device, "stream": msg.stream},
            )
        return ch

    def _log(self, msg: convert.OutMessage) -> None:
        self._channel(msg).log(msg.data, log_time=msg.log_time)
        self.logged += 1

    async def _run(self) -> None:
        while True:
            delivery = await self._queue.get()
            frame = delivery.frame
            key = (frame.device_id, frame.stream_id)
            missed = self._missed.pop(key, 0)
            if missed:
                now = time.time_ns()
                self._log(convert.gap_message(*key, frame.seq, 0, 0, missed, "slow_viewer", now))
            for msg in delivery.messages:
                self._log(msg)
            await asyncio.sleep(0)
