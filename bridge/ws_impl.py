"""WebSocket ingest adapter (``websockets`` asyncio server) at ``/v1/ingest``.

Library defaults that bite a point-cloud relay are set deliberately (docs/design.md §2): permessage-
deflate off and ``max_size`` from settings. Fatal protocol errors close with the code from
``bridge.errors.WIRE``; a draining bridge closes with 1001.
"""

from __future__ import annotations

import logging
import socket

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed
from websockets.frames import CloseCode
from websockets.http11 import Request, Response

from bridge.errors import FrameTooLarge, MalformedMessage, ProtocolError
from bridge.metrics import BridgeMetrics
from bridge.ports import Edges
from bridge.settings import Settings
from bridge.tls import server_ssl_context

log = logging.getLogger("bridge.ws")

INGEST_PATH = "/v1/ingest"


class WsTransport:
    name = "ws"

    def __init__(self, ws: ServerConnection) -> None:
        self.ws = ws

    async def recv(self) -> bytes | None:
        try:
            data = await self.ws.recv()
        except ConnectionClosed:
            return None
        if isinstance(data, str):
            raise MalformedMessage("text messages are not accepted; send binary protobuf")
        return data

    async def send(self, data: bytes) -> None:
        try:
            await self.ws.send(data)
        except ConnectionClosed as exc:
            raise ConnectionError(str(exc)) from None

    async def reject(self, error: ProtocolError) -> None:
        await self.ws.close(error.wire.ws_close, str(error)[:120])

    async def close_going_away(self, reason: str = "bridge shutting down") -> None:
        await self.ws.close(int(CloseCode.GOING_AWAY), reason)


def _bearer(headers: Headers) -> str:
    value = headers.get("Authorization", "")
    return value[7:] if value.lower().startswith("bearer ") else ""


async def start_ws_server(edges: Edges, settings: Settings, metrics: BridgeMetrics) -> Server:
    """Listen on ``settings.host:settings.ws_port``; each connection is served by ``edges``."""

    def check_path(conn: ServerConnection, request: Request) -> Response | None:
        if request.path.split("?", 1)[0] != INGEST_PATH:
            return conn.respond(404, f"WebSocket ingest is at {INGEST_PATH}\n")
        if edges.draining:
            return conn.respond(503, "draining\n")
        return None

    async def handler(ws: ServerConnection) -> None:
        sock = ws.transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        transport = WsTransport(ws)
        token = _bearer(ws.request.headers) if ws.request is not None else ""
        try:
            await edges.serve(transport, token)
        except MalformedMessage as exc:  # a text frame: refuse like any malformed message
            metrics.rejected.labels("ws", exc.reason).inc()
            await transport.reject(exc)
        finally:
            # websockets enforces max_size itself (closing with 1009): count it here, whichever
            # of our reads or writes noticed the closed connection first.
            sent = ws.protocol.close_sent
            if sent is not None and sent.code == CloseCode.MESSAGE_TOO_BIG:
                metrics.rejected.labels("ws", FrameTooLarge.reason).inc()

    return await serve(
        handler,
        settings.host,
        settings.ws_port,
        process_request=check_path,
        compression=None,
        # websockets enforces the size (closing with 1009) before we ever see the bytes.
        max_size=settings.max_frame_bytes,
        max_queue=16,
        ping_interval=settings.ping_interval_seconds,
        ping_timeout=settings.ping_timeout_seconds,
        close_timeout=2.0,
        ssl=server_ssl_context(settings),
    )
