"""Operations HTTP endpoint: ``/metrics``, ``/healthz``, ``/readyz``, ``/debug/resources``.

A deliberately tiny HTTP/1.1 server (GET and HEAD only, one request per connection, bounded
request size, at most :data:`MAX_CONNECTIONS` served at once): the control surface exposes
nothing that changes state. With a token set, ``/debug/*`` always needs ``Authorization: Bearer
<token>`` and ``/metrics`` does unless it was left open for Prometheus (``metrics_auth: open``);
the probes stay open for the kubelet.

Why a thread of its own and not the event loop: a probe answered by the loop waits for two or
three of its turns, and under floods of 15 MiB frames a turn joins or parses one of them (issue
29, measured in the container: probes answered in 130-1,078 ms while the loop's worst turn was
245-411 ms). The kubelet restarts a pod whose liveness probe times out, which is the wrong answer
to a busy loop. So ``/healthz`` and ``/readyz`` are answered here, from plain flags, within
milliseconds whatever the loop does; and a loop that has *stopped* turning still fails
liveness: the loop beats every :data:`BEAT_SECONDS`, and ``/healthz`` answers 503 once the last
beat is older than ``loop_stall_seconds``. ``/metrics`` and ``/debug/*`` read state the loop
owns, so they are computed on the loop (the request waits for it, up to
:data:`LOOP_ANSWER_SECONDS`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import hmac
import json
import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

log = logging.getLogger("bridge.http")

_MAX_REQUEST_BYTES = 8192
READ_SECONDS = 5.0  # a client must send its request line and headers within this
MAX_CONNECTIONS = 8  # served at once; more are answered 503 at once and closed
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
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._beat_task: asyncio.Task[None] | None = None
        self._last_beat = time.monotonic()
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._pool = concurrent.futures.ThreadPoolExecutor(
            MAX_CONNECTIONS, thread_name_prefix="ops-http"
        )
        self._closing = threading.Event()

    async def start(self, host: str, port: int) -> int:
        self._loop = asyncio.get_running_loop()
        self._sock = socket.create_server((host, port), backlog=64)
        self._beat_task = asyncio.ensure_future(self._beat())
        self._thread = threading.Thread(target=self._accept, name="ops-http-accept", daemon=True)
        self._thread.start()
        return int(self._sock.getsockname()[1])

    async def close(self) -> None:
        self._closing.set()
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)
            self._sock.close()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 5.0)
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self._beat_task is not None:
            self._beat_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._beat_task

    # -- the loop's side ------------------------------------------------------------------------
    async def _beat(self) -> None:
        while True:
            self._last_beat = time.monotonic()
            await asyncio.sleep(BEAT_SECONDS)

    def loop_alive(self) -> bool:
        """The event loop turned within ``loop_stall_seconds`` (callable from any thread)."""
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
        """Every path (on the loop, except the probes, which may be answered anywhere)."""
        probe = self.probe(path)
        if probe is not None:
            return probe
        if path == "/metrics":
            return 200, CONTENT_TYPE_LATEST, generate_latest(self.registry)
        if path == "/debug/resources":
            body = json.dumps(self.describe_resources(), indent=2, default=str).encode() + b"\n"
            return 200, "application/json", body
        return 404, "text/plain", b"not found\n"

    def answer(self, head: bytes) -> tuple[Answer, bool]:
        """The answer to one request head, and whether a body goes with it (not for HEAD).
        Raises ValueError on a malformed request line."""
        method, target, _ = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ", 2)
        if method not in ("GET", "HEAD"):
            return (405, "text/plain", b"method not allowed\n"), True
        path = target.split("?", 1)[0]
        if self.needs_token(path) and not self.authorized(head):
            if self.on_unauthorized is not None:
                self.on_unauthorized(path)
            return (401, "text/plain", b"bearer token required\n"), method != "HEAD"
        answer = self.probe(path)
        if answer is None:
            answer = self._on_loop(path)
        return answer, method != "HEAD"

    def _on_loop(self, path: str) -> Answer:
        loop = self._loop
        if loop is None or loop.is_closed():
            return 503, "text/plain", b"shutting down\n"

        async def compute() -> Answer:
            return self.route(path)

        future = asyncio.run_coroutine_threadsafe(compute(), loop)
        try:
            return future.result(LOOP_ANSWER_SECONDS)
        except (TimeoutError, concurrent.futures.CancelledError, RuntimeError):
            future.cancel()
            return 503, "text/plain", b"the event loop did not answer in time\n"

    # -- the server thread -----------------------------------------------------------------------
    def _accept(self) -> None:
        sock = self._sock
        assert sock is not None
        while not self._closing.is_set():
            try:
                conn, _ = sock.accept()
            except OSError:
                if self._closing.is_set():
                    return
                time.sleep(0.01)  # e.g. out of file descriptors: never spin
                continue
            if not self._slots.acquire(blocking=False):
                conn.settimeout(1.0)
                _reply(conn, (503, "text/plain", b"busy\n"), True)
                continue
            try:
                self._pool.submit(self._serve, conn)
            except RuntimeError:  # shut down meanwhile
                self._slots.release()
                conn.close()
                return

    def _serve(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(READ_SECONDS)
            head = _read_head(conn)
            if head is not None:
                answer, with_body = self.answer(head)
                _reply(conn, answer, with_body)
        except (OSError, ValueError):
            pass
        except Exception:  # never let one request end the server
            log.exception("ops http request failed")
        finally:
            with contextlib.suppress(OSError):
                conn.close()
            self._slots.release()


def _read_head(conn: socket.socket) -> bytes | None:
    """Up to the blank line after the headers; None when the client closes or sends too much."""
    data = b""
    deadline = time.monotonic() + READ_SECONDS
    while b"\r\n\r\n" not in data:
        if len(data) > _MAX_REQUEST_BYTES or time.monotonic() > deadline:
            return None
        chunk = conn.recv(4096)
        if not chunk:
            return None
        data += chunk
    return data.split(b"\r\n\r\n", 1)[0] + b"\r\n\r\n"


def _reply(conn: socket.socket, answer: Answer, with_body: bool) -> None:
    status, ctype, body = answer
    auth_header = "WWW-Authenticate: Bearer\r\n" if status == 401 else ""
    head = (
        f"HTTP/1.1 {status} {_REASONS.get(status, 'OK')}\r\nContent-Type: {ctype}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n{auth_header}\r\n"
    ).encode()
    with contextlib.suppress(OSError):
        conn.sendall(head + body if with_body else head)
        conn.close()
