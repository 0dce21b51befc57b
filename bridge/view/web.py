"""The browser page: static files, ``/api/status`` and a live WebSocket of decimated clouds.

One ``websockets`` server does both HTTP and WebSocket (``process_request`` answers plain GETs),
so the page needs no web framework and no CDN: ``static/`` holds hand-written HTML and WebGL.

Backpressure: the page shows the newest cloud of each stream, so the outlet keeps only the
newest frame per topic that it has not converted yet (:mod:`bridge.view.webframe`); a frame that a
newer one of the same stream replaces there is *skipped* (a catch-up burst after a bridge
restart, or frames arriving faster than they convert), counted in ``status()["skipped"]`` and not a
viewer drop: no browser had a chance at it. Each browser then keeps only the newest unsent frame
per topic; a frame replaced there is a *viewer drop* (counted per stream and per client): that
browser reads too slowly. Neither ever delays anything else.
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
from bridge.view.fanout import Delivery
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
        # The newest frame per topic not yet converted: a newer one replaces it (skipped).
        self._pending: dict[str, Delivery] = {}
        self._ready = asyncio.Event()
        self._clients: set[_Client] = set()
        # The newest frame per topic, for viewers that connect later: bounded like the rest.
        self._latest: OrderedDict[str, tuple[tuple[str, str], bytes]] = OrderedDict()
        self._server: Server | None = None
        self._task: asyncio.Task[None] | None = None
        self._static = {
            name: (resources.files("bridge.view") / "static" / name).read_bytes()
            for name in STATIC_FILES
        }
        self.skipped = 0
        self.client_drops = 0  # of browsers that have gone

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
        frame = delivery.frame
        if not frame.HasField("point_cloud"):
            return
        topic = f"/{frame.device_id}/{frame.stream_id}"
        if self._pending.pop(topic, None) is not None:
            self.skipped += 1
        elif len(self._pending) >= self.max_topics:
            self._pending.pop(next(iter(self._pending)))
            self.skipped += 1
        self._pending[topic] = delivery
        self._ready.set()

    def status(self) -> dict[str, Any]:
        return {
            "port": self.port,
            "clients": len(self._clients),
            "dropped": self.client_drops + sum(c.dropped for c in self._clients),
            "skipped": self.skipped,
        }

    async def _run(self) -> None:
        while True:
            await self._ready.wait()
            self._ready.clear()
            while self._pending:
                topic = next(iter(self._pending))
                frame = self._pending.pop(topic).frame
                data = webframe.encode(frame, self.max_points)
                if data is not None:
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
            self.client_drops += client.dropped  # what it missed stays in the total
            self._clients.discard(client)
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionClosed):
                await sender
