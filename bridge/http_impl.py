"""Operations HTTP endpoint: ``/metrics``, ``/healthz``, ``/readyz``, ``/debug/resources``.

A deliberately tiny HTTP/1.1 server on asyncio streams (GET only, one request per connection,
bounded request size): the control surface exposes nothing that changes state. With a token set,
``/debug/*`` always needs ``Authorization: Bearer <token>`` and ``/metrics`` does unless it was
left open for Prometheus (``metrics_auth: open``); the probes stay open for the kubelet.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
from collections.abc import Callable
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

log = logging.getLogger("bridge.http")

_MAX_REQUEST_BYTES = 8192


class OpsHttpServer:
    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        is_live: Callable[[], bool],
        is_ready: Callable[[], bool],
        describe_resources: Callable[[], dict[str, Any]],
        token: str = "",
        metrics_open: bool = False,
        on_unauthorized: Callable[[str], None] | None = None,
    ) -> None:
        self.registry = registry
        self.is_live = is_live
        self.is_ready = is_ready
        self.describe_resources = describe_resources
        self.token = token
        self.metrics_open = metrics_open
        self.on_unauthorized = on_unauthorized
        self.server: asyncio.Server | None = None

    async def start(self, host: str, port: int) -> int:
        self.server = await asyncio.start_server(self._handle, host, port, limit=_MAX_REQUEST_BYTES)
        return int(self.server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()

    def needs_token(self, path: str) -> bool:
        if not self.token:
            return False
        if path == "/metrics":
            return not self.metrics_open
        return path.startswith("/debug/")

    def authorized(self, head: bytes) -> bool:
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"authorization":
                scheme, _, offered = value.strip().partition(b" ")
                if scheme.lower() == b"bearer":
                    return hmac.compare_digest(offered.strip(), self.token.encode())
        return False

    def route(self, path: str) -> tuple[int, str, bytes]:
        if path == "/metrics":
            return 200, CONTENT_TYPE_LATEST, generate_latest(self.registry)
        if path == "/healthz":
            ok = self.is_live()
            return (200 if ok else 503), "text/plain", b"ok\n" if ok else b"unhealthy\n"
        if path == "/readyz":
            ok = self.is_ready()
            return (200 if ok else 503), "text/plain", b"ready\n" if ok else b"not ready\n"
        if path == "/debug/resources":
            body = json.dumps(self.describe_resources(), indent=2, default=str).encode() + b"\n"
            return 200, "application/json", body
        return 404, "text/plain", b"not found\n"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5.0)
            method, target, _ = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ", 2)
            if method not in ("GET", "HEAD"):
                status, ctype, body = 405, "text/plain", b"method not allowed\n"
            else:
                path = target.split("?", 1)[0]
                if self.needs_token(path) and not self.authorized(head):
                    status, ctype, body = 401, "text/plain", b"bearer token required\n"
                    if self.on_unauthorized is not None:
                        self.on_unauthorized(path)
                else:
                    status, ctype, body = self.route(path)
            reason = {
                200: "OK",
                401: "Unauthorized",
                404: "Not Found",
                405: "Method Not Allowed",
                503: "Service Unavailable",
            }
            auth_header = "WWW-Authenticate: Bearer\r\n" if status == 401 else ""
            writer.write(
                f"HTTP/1.1 {status} {reason.get(status, 'OK')}\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n{auth_header}\r\n".encode()
            )
            if method != "HEAD":
                writer.write(body)
            await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ValueError):
            pass
        except ConnectionError:
            pass
        finally:
            writer.close()
