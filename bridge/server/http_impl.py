"""Operations HTTP endpoint: ``/metrics``, ``/healthz``, ``/readyz``, ``/debug/resources``.

A deliberately tiny HTTP/1.1 server (GET and HEAD only, one request per connection, bounded
request size and read time, at most :data:`MAX_CONNECTIONS` open at once): the control surface
exposes nothing that changes state. With a token set, ``/debug/*`` always needs
``Authorization: Bearer <token>`` and ``/metrics`` does unless it was left open for Prometheus
(``metrics_auth: open``); the probes stay open for the kubelet.

Why an event loop of its own, on a thread, and not the bridge's: a probe answered by the
bridge's loop waits for two or three of its turns, and under floods of 15 MiB frames a turn joins
or parses one of them (issue 29, measured in the container: probes answered in 130-1,078 ms
while the loop's worst turn was 245-411 ms). The kubelet restarts a pod whose liveness probe
times out, which is the wrong answer to a busy loop. So ``/healthz`` and ``/readyz`` are answered
on this server's loop from plain flags, within milliseconds whatever the bridge's loop does and
whatever slow clients hold (each costs a coroutine here, never a thread). A bridge loop that has
*stopped* turning still fails both: it beats every :data:`BEAT_SECONDS`, and the probes answer
503 once the last beat is older than ``loop_stall_seconds``. ``/metrics`` and ``/debug/*`` read
state the bridge's loop owns, so they are computed there (the request waits for it, up to
:data:`LOOP_ANSWER_SECONDS`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

log = logging.getLogger("bridge.http")

_MAX_REQUEST_BYTES = 8192
READ_SECONDS = 5.0  # a client must send its request line and headers within this
MAX_CONNECTIONS = 256  # open at once; more are closed at once
BEAT_SECONDS = 0.5
LOOP_ANSWER_SECONDS = 10.0
_REASONS = {
    200: "OK",
    401: "Unauthorized",
    404: "Not Found",
    405: "Method Not Allowed",
    503: "Service Unavailable",
}
Answer = tuple[int, str, bytes]


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
        loop_stall_seconds: float = 10.0,
    ) -> None:
        self.registry = registry
        self.is_live = is_live
        self.is_ready = is_ready
        self.describe_resources = describe_resources
        self.token = token
        self.metrics_open = metrics_open
        self.on_unauthorized = on_unauthorized
        self.loop_stall_seconds = loop_stall_seconds
        self._bridge_loop: asyncio.AbstractEventLoop | None = None
        self._own_loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._thread: threading.Thread | None = None
        self._beat_task: asyncio.Task[None] | None = None
        self._last_beat = time.monotonic()
        self._open: set[_OpsConnection] = set()
        self._handlers: set[asyncio.Task[Any]] = set()

    async def start(self, host: str, port: int) -> int:
        """Listen on a thread of its own; the bound port (OSError when it cannot listen)."""
        self._bridge_loop = asyncio.get_running_loop()
        started: asyncio.Future[int] = self._bridge_loop.create_future()
        self._thread = threading.Thread(
            target=self._run, args=(host, port, started), name="ops-http", daemon=True
        )
        self._thread.start()
        bound = await started
        self._beat_task = asyncio.ensure_future(self._beat())
        return bound

    async def close(self) -> None:
        if self._beat_task is not None:
            self._beat_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._beat_task
        own = self._own_loop
        if own is not None and not own.is_closed():
            with contextlib.suppress(RuntimeError):
                own.call_soon_threadsafe(own.stop)
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 5.0)

    # -- the thread ------------------------------------------------------------------------------
    def _run(self, host: str, port: int, started: asyncio.Future[int]) -> None:
        bridge = self._bridge_loop
        assert bridge is not None
        loop = asyncio.new_event_loop()
        self._own_loop = loop
        try:
            try:
                self._server = loop.run_until_complete(
                    loop.create_server(lambda: _OpsConnection(self), host, port)
                )
            except OSError as exc:
                bridge.call_soon_threadsafe(_settle, started, None, exc)
                return
            bound = int(self._server.sockets[0].getsockname()[1])
            bridge.call_soon_threadsafe(_settle, started, bound, None)
            loop.run_forever()
            self._server.close()
            loop.run_until_complete(self._finish_handlers())
            loop.run_until_complete(self._server.wait_closed())
        finally:
            loop.close()

    async def _finish_handlers(self) -> None:
        """Cancel and await every open connection's handler before this loop closes: a handler
        left pending (a slow client's read) would keep its socket open until garbage collection,
        which then runs its ``finally`` against a closed loop."""
        pending = [t for t in self._handlers if not t.done()]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for conn in list(self._open):
            conn.close()
        await asyncio.sleep(0)  # their connection_lost runs on this loop, before it closes

    # -- the bridge loop's side ------------------------------------------------------------------
    async def _beat(self) -> None:
        while True:
            self._last_beat = time.monotonic()
            await asyncio.sleep(BEAT_SECONDS)

    def loop_alive(self) -> bool:
        """The bridge's event loop turned within ``loop_stall_seconds`` (any thread)."""
        return time.monotonic() - self._last_beat <= self.loop_stall_seconds

    # -- routing ---------------------------------------------------------------------------------
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

    def probe(self, path: str) -> Answer | None:
        """The probes, answered on the calling thread (None: not a probe)."""
        if path == "/healthz":
            ok = self.loop_alive() and self.is_live()
            return (200 if ok else 503), "text/plain", b"ok\n" if ok else b"unhealthy\n"
        if path == "/readyz":
            ok = self.loop_alive() and self.is_ready()
            return (200 if ok else 503), "text/plain", b"ready\n" if ok else b"not ready\n"
        return None

    def route(self, path: str) -> Answer:
        """Every path, on the bridge's loop (the probes may be answered anywhere)."""
        probe = self.probe(path)
        if probe is not None:
            return probe
        if path == "/metrics":
            return 200, CONTENT_TYPE_LATEST, generate_latest(self.registry)
        if path == "/debug/resources":
            body = json.dumps(self.describe_resources(), indent=2, default=str).encode() + b"\n"
            return 200, "application/json", body
        return 404, "text/plain", b"not found\n"

    async def _on_bridge_loop(self, path: str) -> Answer:
        bridge = self._bridge_loop
        if bridge is None or bridge.is_closed():
            return 503, "text/plain", b"shutting down\n"

        async def compute() -> Answer:
            return self.route(path)

        try:
            future = asyncio.run_coroutine_threadsafe(compute(), bridge)
        except RuntimeError:
            return 503, "text/plain", b"shutting down\n"
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), LOOP_ANSWER_SECONDS)
        except TimeoutError:
            future.cancel()
            return 503, "text/plain", b"the event loop did not answer in time\n"

    def answer_now(self, head: bytes) -> tuple[bytes, str | None]:
        """The response to a request ``head``, or ``(b"", path)`` when ``path`` must be answered
        on the bridge's loop. Probes, refusals and errors are answered here, in the callback
        that read the request: no task, no further turn of this loop (each turn waits for the
        GIL, which the bridge's threads hold under load)."""
        try:
            method, target, _ = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ", 2)
        except ValueError:
            return b"", None
        if method not in ("GET", "HEAD"):
            return _response(method, (405, "text/plain", b"method not allowed\n")), None
        path = target.split("?", 1)[0]
        if self.needs_token(path) and not self.authorized(head):
            if self.on_unauthorized is not None:
                self.on_unauthorized(path)
            return _response(method, (401, "text/plain", b"bearer token required\n")), None
        answer = self.probe(path)
        if answer is not None:
            return _response(method, answer), None
        return b"", path

    async def answer_later(self, conn: _OpsConnection, method: str, path: str) -> None:
        try:
            conn.send(_response(method, await self._on_bridge_loop(path)))
        finally:
            conn.close()


class _OpsConnection(asyncio.Protocol):
    """One request per connection: the head (at most ``_MAX_REQUEST_BYTES``, within
    ``READ_SECONDS``), then the response and close. Past ``MAX_CONNECTIONS`` open, closed at
    once."""

    def __init__(self, server: OpsHttpServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.server._open.add(self)
        if len(self.server._open) > MAX_CONNECTIONS:
            transport.close()
            return
        self.timer = asyncio.get_running_loop().call_later(READ_SECONDS, self.close)

    def data_received(self, data: bytes) -> None:
        if self.timer is None or self.transport is None:
            return  # answered (or being answered) already: the rest is ignored
        self.buffer += data
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(self.buffer) > _MAX_REQUEST_BYTES:
                self.close()
            return
        self.timer.cancel()
        self.timer = None
        head = bytes(self.buffer[: end + 4])
        self.buffer.clear()
        self.transport.pause_reading()
        response, later = self.server.answer_now(head)
        if later is None:
            self.send(response)
            self.close()
            return
        method = head.split(b" ", 1)[0].decode("latin-1")
        task = asyncio.get_running_loop().create_task(self.server.answer_later(self, method, later))
        self.server._handlers.add(task)
        task.add_done_callback(self.server._handlers.discard)

    def send(self, data: bytes) -> None:
        if data and self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def close(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.transport is not None:
            self.transport.close()  # after what was written is sent

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.server._open.discard(self)


def _response(method: str, answer: Answer) -> bytes:
    status, ctype, body = answer
    auth_header = "WWW-Authenticate: Bearer\r\n" if status == 401 else ""
    head = (
        f"HTTP/1.1 {status} {_REASONS.get(status, 'OK')}\r\nContent-Type: {ctype}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n{auth_header}\r\n"
    ).encode()
    return head if method == "HEAD" else head + body


def _settle(future: asyncio.Future[int], port: int | None, exc: BaseException | None) -> None:
    if future.done():
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        assert port is not None
        future.set_result(port)
