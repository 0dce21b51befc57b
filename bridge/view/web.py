"""The browser page: static files, ``/api/status`` and a live WebSocket of decimated clouds.

One ``websockets`` server does both HTTP and WebSocket (``process_request`` answers plain GETs),
so the page needs no web framework and no CDN: ``static/`` holds hand-written HTML and WebGL.

Backpressure: frames are converted once (:mod:`bridge.view.webframe`) and each browser keeps
only the newest unsent frame per topic. A browser that reads slowly skips frames (counted per
stream and per client) and never delays anything else.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import OrderedDict
from collections.abc import Callable
from http import HTTPStatus
from importlib import resources
from typing import Any

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from bridge.view import webframe
from bridge.view.fanout import Delivery, DroppingQueue
from bridge.view.stats import ViewStats

log = logging.getLogger("bridge.view.web")
_http_log = logging.getLogger("bridge.view.web.http")  # one line per request: quiet by default
_http_log.setLevel(logging.WARNING)

_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8"}
STATIC_FILES = ("index.html", "view.js")


def _response(status: HTTPStatus, body: bytes, content_type: str) -> Response:
    headers = Headers(
        [
            ("Content-Type", content_type),
            ("Content-Length", str(len(body))),
            ("Cache-Control", "no-store"),
            ("Connection", "close"),
        ]
    )
    return Response(status.value, status.phrase, headers, body)


class _Client:
    """One browser: the newest unsent frame per topic and a sender task."""

    def __init__(self, ws: ServerConnection, stats: ViewStats) -> None:
        self.ws = ws
        self.stats = stats
        self.pending: dict[str, tuple[tuple[str, str], bytes]] = {}
        self.ready = asyncio.Event()
        self.sent = 0
        self.dropped = 0

    def push(self, topic: str, key: tuple[str, str], data: bytes) -> None:
        if topic in self.pending:
            self.dropped += 1
            self.stats.viewer_drop(*key)
        self.pending[topic] = (key, data)
        self.ready.set()

    async def run(self) -> None:
        while True:
            await self.ready.wait()
            self.ready.clear()
            while self.pending:
                topic = next(iter(self.pending))
                _key, data = self.pending.pop(topic)
                await self.ws.send(data)
                self.sent += 1


class WebOutlet:
    def __init__(
        self,
        stats: ViewStats,
        status: Callable[[], dict[str, Any]],
        *,
        host: str = "127.0.0.1",
        port: int = 8088,
        max_points: int = 200_000,
        max_clients: int = 32,
        max_topics: int = 256,
    ) -> None:
        self.stats = stats
        self._status = status
        self.host = host
        self.port = port
        self.max_points = max_points
        self.max_clients = max_clients
        self.max_topics = max_topics
        self._queue: DroppingQueue[Delivery] = DroppingQueue(4, self._dropped)
        self._clients: set[_Client] = set()
        # The newest frame per topic, for viewers that connect later: bounded like the rest.
        self._latest: OrderedDict[str, tuple[tuple[str, str], bytes]] = OrderedDict()
        self._server: Server | None = None
        self._task: asyncio.Task[None] | None = None
        self._static = {
            name: (resources.files("bridge.view") / "static" / name).read_bytes()
            for name in STATIC_FILES
        }
        self.dropped = 0

    async def start(self) -> int:
        self._server = await serve(
            self._handler,
            self.host,
            self.port,
            process_request=self._http,
            compression=None,
            max_size=64 * 1024,
            logger=_http_log,
        )
        self.port = int(next(iter(self._server.sockets)).getsockname()[1])
        self._task = asyncio.create_task(self._run(), name="view-web")
        log.info("web page on http://%s:%d/", self.host, self.port)
        return self.port

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def offer(self, delivery: Delivery) -> None:
        if delivery.frame.HasField("point_cloud"):
            self._queue.put(delivery)

    def status(self) -> dict[str, Any]:
        return {
            "port": self.port,
            "clients": len(self._clients),
            "dropped": self.dropped + sum(c.dropped for c in self._clients),
        }

    def _dropped(self, delivery: Delivery) -> None:
        self.dropped += 1
        self.stats.viewer_drop(delivery.frame.device_id, delivery.frame.stream_id)

    async def _run(self) -> None:
        while True:
            delivery = await self._queue.get()
            frame = delivery.frame
            data = webframe.encode(frame, self.max_points)
            if data is None:
                continue
            topic = f"/{frame.device_id}/{frame.stream_id}"
            key = (frame.device_id, frame.stream_id)
            self._latest[topic] = (key, data)
            self._latest.move_to_end(topic)
            while len(self._latest) > self.max_topics:
                self._latest.popitem(last=False)
            for client in self._clients:
                client.push(topic, key, data)
            await asyncio.sleep(0)

    def _http(self, connection: ServerConnection, request: Request) -> Response | None:
        path = request.path.split("?", 1)[0]
        if path == "/ws":
            if len(self._clients) >= self.max_clients:
                return _response(
                    HTTPStatus.SERVICE_UNAVAILABLE, b"too many viewers\n", "text/plain"
                )
            return None
        if path == "/api/status":
            body = json.dumps(self._status(), indent=1).encode()
            return _response(HTTPStatus.OK, body, "application/json")
        name = "index.html" if path == "/" else path.lstrip("/")
        if name in self._static:
            ext = name[name.rfind(".") :]
            return _response(HTTPStatus.OK, self._static[name], _TYPES[ext])
        return _response(HTTPStatus.NOT_FOUND, b"not found\n", "text/plain")

    async def _handler(self, ws: ServerConnection) -> None:
        client = _Client(ws, self.stats)
        for topic, (key, data) in self._latest.items():  # something to draw at once
            client.push(topic, key, data)
        self._clients.add(client)
        sender = asyncio.create_task(client.run())
        try:
            async for _ in ws:  # the page sends nothing we need; read to notice the close
                pass
        except ConnectionClosed:
            pass
        finally:
            self._clients.discard(client)
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionClosed):
                await sender
