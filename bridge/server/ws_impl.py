"""WebSocket ingest adapter at ``/v1/ingest``: a server of
:class:`bridge.server.ws_conn.GovernedConnection`, our own asyncio protocol over ``websockets``'
public sans-I/O ``ServerProtocol``.

Library defaults that bite a point-cloud relay are set deliberately (docs/design.md §2): no
permessage-deflate (no extension is offered) and ``max_size`` from settings (a larger message
closes with 1009). Fatal protocol errors close with the code from ``bridge.protocol.errors.WIRE``; a
draining bridge answers an upgrade with 503 and closes open connections with 1001. Receive is
bounded in bytes by the memory governor: see :mod:`bridge.server.ws_conn`.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable

from websockets.datastructures import Headers
from websockets.frames import CloseCode
from websockets.http11 import Request, Response
from websockets.protocol import State

from bridge.config.settings import Settings
from bridge.protocol.errors import FrameTooLarge, MalformedMessage, ProtocolError
from bridge.server.governor import Governor
from bridge.server.metrics import BridgeMetrics
from bridge.server.ports import Edges, Received
from bridge.server.tls import certificate_names, server_ssl_context
from bridge.server.ws_conn import HELLO_BYTES, ConnectionClosed, GovernedConnection

log = logging.getLogger("bridge.ws")

INGEST_PATH = "/v1/ingest"
OPEN_TIMEOUT = 10.0  # seconds for the opening handshake (and the TLS one), as websockets' default
CLOSE_TIMEOUT = 2.0  # seconds from a close frame to an aborted connection

__all__ = ["HELLO_BYTES", "INGEST_PATH", "GovernedConnection", "WsServer", "WsTransport"]


class WsTransport:
    name = "ws"

    def __init__(self, ws: GovernedConnection) -> None:
        self.ws = ws
        self._closing: asyncio.Future[None] | None = None  # a close after an unanswered ping

    def on_wait(self, notify: Callable[[bool], None]) -> None:
        self.ws.on_wait = notify

    async def recv(self) -> Received | None:
        try:
            data = await self.ws.recv()
        except ConnectionClosed:
            return None
        if isinstance(data, str):
            self.ws.take(len(data.encode())).release()
            # ingest refuses it like any ProtocolError from recv: the Error, then close 1007
            raise MalformedMessage("text messages are not accepted; send binary protobuf")
        return Received(data, self.ws.take(len(data)))

    async def send(self, data: bytes) -> None:
        try:
            await self.ws.send(data)
        except ConnectionClosed as exc:
            raise ConnectionError(str(exc)) from None

    async def reject(self, error: ProtocolError) -> None:
        await self.ws.close(error.wire.ws_close, str(error)[:120])

    async def close_going_away(self, reason: str = "bridge shutting down") -> None:
        await self.ws.close(int(CloseCode.GOING_AWAY), reason)

    async def ping(self, seconds: float) -> bool | None:
        """One ping now (a challenge, :mod:`bridge.server.challenge`). True: its pong came
        within ``seconds``, or data did (a live edge busy sending a large frame over a slow
        link answers late). None: the connection is not reading (a memory grant or a full
        queue holds it), so a pong would sit unread: no ping, nothing concluded. False: nothing
        came; the connection is closed as the keepalive closes it (1011, then the close
        timeout)."""
        ws = self.ws
        if ws.state is not State.OPEN:
            return False
        if not ws.reading:
            return None
        meter = ws.meter
        before = (meter.frames, meter.payload_left)  # data frames begun, payload still to come
        pong = ws.send_ping()
        await asyncio.wait((pong,), timeout=seconds)
        if pong.done():
            return not pong.cancelled()  # cancelled: the connection was lost meanwhile
        if ws.state is not State.OPEN:
            return False
        if (meter.frames, meter.payload_left) != before:
            return True  # a frame began or went on (reading only stops for data: it was on)
        # The keepalive's code and reason; tasks start in order, so this close frame goes out
        # before the one of the Hello that replaces this connection (1001, superseded).
        self._closing = asyncio.ensure_future(
            ws.close(CloseCode.INTERNAL_ERROR, "keepalive ping timeout")
        )
        return False


def _bearer(headers: Headers) -> str:
    value = headers.get("Authorization", "")
    return value[7:] if value.lower().startswith("bearer ") else ""


class WsServer:
    """The listening socket and its connections (what ``websockets``' ``Server`` was to us):
    ``close()`` stops accepting, closes open connections with 1001 and answers upgrades still in
    their handshake with 503; ``wait_closed()`` returns once every connection and its handler
    are gone."""

    def __init__(self) -> None:
        self.connections: set[GovernedConnection] = set()
        self.server: asyncio.Server | None = None
        self._closed: asyncio.Task[None] | None = None

    @property
    def sockets(self) -> tuple[socket.socket, ...]:
        assert self.server is not None
        return tuple(self.server.sockets)

    def serving(self) -> bool:
        return self._closed is None

    def add(self, connection: GovernedConnection) -> GovernedConnection:
        self.connections.add(connection)
        connection.lost.add_done_callback(lambda _: self.connections.discard(connection))
        return connection

    def close(self) -> None:
        if self._closed is None:
            self._closed = asyncio.ensure_future(self._close())

    async def _close(self) -> None:
        assert self.server is not None
        self.server.close()
        connections = list(self.connections)  # they leave the set as they close
        closing = [asyncio.ensure_future(c.close(CloseCode.GOING_AWAY)) for c in connections]
        if closing:
            await asyncio.wait(closing)
        handlers = [c.task for c in connections if c.task is not None]
        if handlers:
            await asyncio.wait(handlers)

    async def wait_closed(self) -> None:
        assert self._closed is not None, "close() first"
        await asyncio.shield(self._closed)


async def start_ws_server(
    edges: Edges, settings: Settings, metrics: BridgeMetrics, governor: Governor
) -> WsServer:
    """Listen on ``settings.host:settings.ws_port``; each connection is served by ``edges``,
    its payloads read only as ``governor`` grants them."""

    def check_path(conn: GovernedConnection, request: Request) -> Response | None:
        if request.path.split("?", 1)[0] != INGEST_PATH:
            return conn.respond(404, f"WebSocket ingest is at {INGEST_PATH}\n")
        if edges.draining:
            return conn.respond(503, "draining\n")
        return None

    async def handler(ws: GovernedConnection) -> None:
        assert ws.transport is not None and ws.request is not None
        transport = WsTransport(ws)
        token = _bearer(ws.request.headers)
        try:
            await edges.serve(transport, token, certificate_names(ws.transport))
        finally:
            # websockets enforces max_size itself (closing with 1009): count it here, whichever
            # of our reads or writes noticed the closed connection first.
            sent = ws.protocol.close_sent
            if sent is not None and sent.code == CloseCode.MESSAGE_TOO_BIG:
                metrics.refused("ws", FrameTooLarge.reason)

    server = WsServer()

    def connection() -> GovernedConnection:
        return server.add(
            GovernedConnection(
                governor,
                # websockets enforces the size (closing with 1009) before we read the payload.
                max_size=settings.max_frame_bytes,
                ping_interval=settings.ping_interval_seconds,
                ping_timeout=settings.ping_timeout_seconds,
                close_timeout=CLOSE_TIMEOUT,
                open_timeout=OPEN_TIMEOUT,
                process_request=check_path,
                handler=handler,
                serving=server.serving,
            )
        )

    ssl = server_ssl_context(settings)
    loop = asyncio.get_running_loop()
    server.server = await loop.create_server(
        connection,
        settings.host,
        settings.ws_port,
        ssl=ssl,
        reuse_port=settings.reuse_port,
        ssl_handshake_timeout=OPEN_TIMEOUT if ssl is not None else None,
        ssl_shutdown_timeout=CLOSE_TIMEOUT if ssl is not None else None,
    )
    return server
