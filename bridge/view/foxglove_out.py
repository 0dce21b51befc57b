"""The live Foxglove WebSocket server (foxglove-sdk): one channel per topic, messages as recorded.

The messages are the bytes already encoded for the MCAP record (``foxglove.PointCloud`` protobuf,
JSON for telemetry and gaps), logged on generic channels with the same schemas, so Foxglove shows
the live stream and the recording identically. The SDK's server speaks the ``foxglove.sdk.v1``
subprotocol and keeps its own bounded per-client queues; our queue in front of it drops the
oldest delivery when the publisher falls behind, counts it per stream and announces it on
``/<device>/<stream>/gaps`` with reason ``slow_viewer``.

New channels: a message logged while its channel has no subscriber is kept
(:mod:`bridge.view.foxglove_hold`) and handed to the first subscriber, so a client that subscribes
to a channel as soon as it is advertised also gets its first message (and a client that opens a
channel later sees its newest message at once). The server tells us of subscriptions on its own
thread (``ServerListener.on_subscribe``); the outlet acts on them on the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

import foxglove
from foxglove.websocket import ChannelView, Client, ServerListener

from bridge.view import convert
from bridge.view.fanout import Delivery, DroppingQueue
from bridge.view.foxglove_hold import HOLD_BYTES, HOLD_MESSAGES, ChannelHold
from bridge.view.stats import ViewStats

log = logging.getLogger("bridge.view.foxglove")

#: How long a new subscription may take to reach the channel (the SDK calls ``on_subscribe``
#: just before it routes the channel to the client) before the kept messages are given up on.
_SUBSCRIBE_SETTLE_S = 2.0
_SUBSCRIBE_POLL_S = 0.005


class _Listener(ServerListener):
    """foxglove-sdk's ``ServerListener``: called on the server's thread, forwards to the loop."""

    def __init__(self, outlet: FoxgloveOutlet, loop: asyncio.AbstractEventLoop) -> None:
        self._outlet = outlet
        self._loop = loop

    def on_subscribe(self, client: Client, channel: ChannelView) -> None:
        self._forward(self._outlet._subscribed, int(client.id), str(channel.topic))

    def on_unsubscribe(self, client: Client, channel: ChannelView) -> None:
        self._forward(self._outlet._unsubscribed, int(client.id), str(channel.topic))

    def _forward(self, fn: Callable[[int, str], None], client: int, topic: str) -> None:
        with contextlib.suppress(RuntimeError):  # the loop has closed: nothing left to do
            self._loop.call_soon_threadsafe(fn, client, topic)


class FoxgloveOutlet:
    def __init__(
        self,
        stats: ViewStats,
        *,
        host: str = "127.0.0.1",
        port: int = 8765,
        name: str = "simbridge",
        queue_frames: int = 256,
        hold_messages: int = HOLD_MESSAGES,
        hold_bytes: int = HOLD_BYTES,
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
        self.hold = ChannelHold(hold_messages, hold_bytes)
        self._subscriptions: dict[int, set[str]] = {}  # client id -> topics
        self.dropped = 0
        self.logged = 0

    def start(self) -> int:
        self._context = foxglove.Context()
        self._server = foxglove.start_server(
            name=self.name,
            host=self.host,
            port=self.port,
            context=self._context,
            server_listener=_Listener(self, asyncio.get_running_loop()),
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
        return {
            "port": self.port,
            "dropped": self.dropped,
            "logged": self.logged,
            "subscribed_clients": sum(1 for t in self._subscriptions.values() if t),
            **self.hold.status(),
        }

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
        ch = self._channel(msg)
        if not ch.has_sinks():  # nobody would get it: keep it for the first subscriber
            self.hold.put(msg, self._watching())
            return
        if self.hold.holds(msg.topic):  # subscribed since: what was kept goes first
            self._hand_over(msg.topic)
        ch.log(msg.data, log_time=msg.log_time)
        self.logged += 1

    def _watching(self) -> bool:
        return any(self._subscriptions.values())

    def _subscribed(self, client: int, topic: str, waited: float = 0.0) -> None:
        self._subscriptions.setdefault(client, set()).add(topic)
        ch = self._channels.get(topic)
        if ch is None or not self.hold.holds(topic):
            return
        if ch.has_sinks():
            self._hand_over(topic)
        elif waited < _SUBSCRIBE_SETTLE_S and self._server is not None:
            asyncio.get_running_loop().call_later(
                _SUBSCRIBE_POLL_S, self._subscribed, client, topic, waited + _SUBSCRIBE_POLL_S
            )

    def _unsubscribed(self, client: int, topic: str) -> None:
        topics = self._subscriptions.get(client)
        if topics is not None:
            topics.discard(topic)
            if not topics:
                del self._subscriptions[client]

    def _hand_over(self, topic: str) -> None:
        """Log what the hold kept for ``topic``; count and announce what it could not keep."""
        taken = self.hold.take(topic)
        ch = self._channels[topic]
        for msg in taken.messages:
            ch.log(msg.data, log_time=msg.log_time)
            self.logged += 1
        for (device, stream), count in taken.missed.items():
            self.dropped += count
            self.stats.viewer_drop(device, stream, count)
            now = time.time_ns()
            self._log(convert.gap_message(device, stream, 0, 0, 0, count, "slow_viewer", now))

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
