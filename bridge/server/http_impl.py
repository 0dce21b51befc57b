"""Operations HTTP endpoint: ``/metrics``, ``/healthz``, ``/readyz``, ``/debug/resources``.

Two processes share the ops port. The public socket is bound here and served by a small child
process (:mod:`bridge.server.probe_child`) that answers ``/healthz`` and ``/readyz`` itself from a
shared-memory block this server's beat writes, and relays every other request byte for byte to
the server in this module, on an internal ``127.0.0.1`` port. Why (issue 29): a probe answered
by any thread of the bridge waits for the GIL, which the bridge's threads hold under load (with
two threads spinning bytecode in the bridge process, p99 146-197 ms on a thread of its own); the
child has its own interpreter. :class:`OpsHttpServer` is the child's one owner: it starts it in
:meth:`~OpsHttpServer.start`, restarts it with a bounded back-off when it dies (meanwhile
connections wait in the listen backlog unanswered, so a probe times out: a failed probe, which
is honest) and stops it in :meth:`~OpsHttpServer.close`; a bridge killed outright takes it along
(the child watches a pipe from here for EOF).

The internal server is a deliberately tiny HTTP/1.1 server (GET and HEAD only, one request per
connection, bounded request size and read time, at most :data:`MAX_CONNECTIONS` open at once)
on an event loop of its own, on a thread: the control surface exposes nothing that changes
state. With a token set, ``/debug/*`` always needs ``Authorization: Bearer <token>`` and
``/metrics`` does unless it was left open for Prometheus (``metrics_auth: open``); the probes
stay open for the kubelet. The token stays in this process: the child only relays. The one
exception to "GET and HEAD only": ``post_routes`` (e.g. ``/admin/rebalance``,
:mod:`bridge.server.rebalance`), which always need the token and are refused without one.

A bridge loop that has *stopped* turning fails both probes: it beats every
:data:`BEAT_SECONDS` (writing its beat, is_live and is_ready to the shared block), and the probes
answer 503 once the last beat is older than ``loop_stall_seconds``; readiness follows
``is_ready`` within one beat. ``/metrics`` and ``/debug/*`` read state the bridge's loop owns,
so they are computed there (the request waits for it, up to :data:`LOOP_ANSWER_SECONDS`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from bridge.config import opsauth
from bridge.server import probe_child
from bridge.server.probe_child import (
    LOOP_ANSWER_SECONDS,
    MAX_CONNECTIONS,
    MAX_REQUEST_BYTES,
    READ_SECONDS,
    Answer,
    ProbeState,
    probe_answer,
)
from bridge.server.probe_child import response as _response

log = logging.getLogger("bridge.http")

__all__ = [
    "BEAT_SECONDS",
    "LOOP_ANSWER_SECONDS",
    "MAX_CONNECTIONS",
    "READ_SECONDS",
    "OpsHttpServer",
]

_MAX_REQUEST_BYTES = MAX_REQUEST_BYTES
BEAT_SECONDS = 0.5  # the bridge's loop beats this often
MIRROR_SECONDS = 0.1  # the ops thread copies beat and flags to the shared block this often
CHILD_START_SECONDS = 10.0  # the probe child prints "ready" within this
CHILD_STOP_SECONDS = 2.0  # after SIGTERM, then SIGKILL
RESTART_BACKOFF = (0.1, 5.0)  # first and longest wait before a dead child is started again


class OpsHttpServer:
    """The ops endpoint's one owner: the public socket, the probe child, the shared block and
    the internal server that answers what the child relays."""

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
        self._loop_stall_seconds = loop_stall_seconds
        self._bridge_loop: asyncio.AbstractEventLoop | None = None
        self._own_loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._thread: threading.Thread | None = None
        self._beat_task: asyncio.Task[None] | None = None
        self._last_beat = time.monotonic()
        self._open: set[_OpsConnection] = set()
        self._handlers: set[asyncio.Task[Any]] = set()
        self._public: list[socket.socket] = []
        self._state: ProbeState | None = None
        self._state_fd = -1
        self.child: ProbeChild | None = None
        self.internal_port = 0
        #: POST path -> handler of the query string, run on the bridge's loop (token required)
        self.post_routes: dict[str, Callable[[str], Awaitable[Answer]]] = {}

    @property
    def loop_stall_seconds(self) -> float:
        return self._loop_stall_seconds

    @loop_stall_seconds.setter
    def loop_stall_seconds(self, seconds: float) -> None:
        """The child sees it within :data:`MIRROR_SECONDS`."""
        self._loop_stall_seconds = seconds

    async def start(self, host: str, port: int, *, public: bool = True) -> int:
        """Bind the public port, start the internal server (a thread of its own) and the probe
        child; the public bound port (OSError when it cannot listen).

        ``public=False`` (a process of a pod, whose supervisor owns the public port and answers
        the probes): only the internal server, on ``host:port``; its bound port."""
        self._bridge_loop = asyncio.get_running_loop()
        if public:
            self._public = await _bind(host, port)
            self._state, self._state_fd = ProbeState.create()
            self._publish()  # before the ops thread starts: it is the writer from then on
        started: asyncio.Future[int] = self._bridge_loop.create_future()
        internal = ("127.0.0.1", 0) if public else (host, port)
        self._thread = threading.Thread(
            target=self._run, args=(*internal, started), name="ops-http", daemon=True
        )
        self._thread.start()
        self.internal_port = await started
        if not public:
            self._beat_task = asyncio.ensure_future(self._beat())
            return self.internal_port
        self.child = ProbeChild(
            [s.fileno() for s in self._public], self._state_fd, self.internal_port
        )
        await asyncio.to_thread(self.child.start)
        self._beat_task = asyncio.ensure_future(self._beat())
        return int(self._public[0].getsockname()[1])

    async def close(self) -> None:
        if self._beat_task is not None:
            self._beat_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._beat_task
        if self.child is not None:
            await asyncio.to_thread(self.child.close)
        for sock in self._public:
            sock.close()
        self._public = []
        own = self._own_loop
        if own is not None and not own.is_closed():
            with contextlib.suppress(RuntimeError):
                own.call_soon_threadsafe(own.stop)
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 5.0)
        if self._state is not None:
            self._state.close()
            self._state = None
            os.close(self._state_fd)

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
            loop.call_soon(self._mirror)
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

    def _mirror(self) -> None:
        """On the ops loop, every :data:`MIRROR_SECONDS`: readiness reaches the child within
        that even while the bridge's loop is busy (as when the probes read the flags here)."""
        self._publish()
        loop = self._own_loop
        if loop is not None:
            loop.call_later(MIRROR_SECONDS, self._mirror)

    def _publish(self) -> None:
        """The beat, the threshold and the flags into the shared block (one writer: the ops
        thread, or the starting loop before that thread runs)."""
        if self._state is not None:
            self._state.write(
                beat=self._last_beat,
                stall=self._loop_stall_seconds,
                live=bool(self.is_live()),
                ready=bool(self.is_ready()),
            )

    # -- routing ---------------------------------------------------------------------------------
    def needs_token(self, path: str) -> bool:
        return opsauth.needs_token(path, self.token, self.metrics_open)

    def authorized(self, head: bytes) -> bool:
        return opsauth.bearer_matches(head, self.token)

    def probe(self, path: str) -> Answer | None:
        """The probes, answered on the calling thread (None: not a probe); the child answers
        them by the same rules, so these answer only a request sent to the internal port."""
        if path not in ("/healthz", "/readyz"):
            return None
        return probe_answer(
            path,
            beat_age=time.monotonic() - self._last_beat,
            stall=self.loop_stall_seconds,
            live=self.is_live(),
            ready=self.is_ready(),
        )

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

    async def _on_bridge_loop(self, path: str, method: str = "GET") -> Answer:
        bridge = self._bridge_loop
        if bridge is None or bridge.is_closed():
            return 503, "text/plain", b"shutting down\n"

        async def compute() -> Answer:
            if method == "POST":  # path is path?query, of a post route (answer_now)
                route, _, query = path.partition("?")
                return await self.post_routes[route](query)
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
        path = target.split("?", 1)[0]
        if method == "POST" and path in self.post_routes:
            if not (self.token and self.authorized(head)):
                if self.on_unauthorized is not None:
                    self.on_unauthorized(path)
                refusal = b"bearer token required\n" if self.token else b"no auth_token set\n"
                return _response(method, (401 if self.token else 403, "text/plain", refusal)), None
            return b"", target
        if method not in ("GET", "HEAD"):
            return _response(method, (405, "text/plain", b"method not allowed\n")), None
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
            conn.send(_response(method, await self._on_bridge_loop(path, method)))
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


def _settle(future: asyncio.Future[int], port: int | None, exc: BaseException | None) -> None:
    if future.done():
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        assert port is not None
        future.set_result(port)


async def _bind(host: str, port: int) -> list[socket.socket]:
    """Listening sockets for ``host`` (every address it resolves to, as asyncio would; with port
    0 all take the first one's port), bound here so that the child inherits them and a
    restarted child keeps the port."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(
        host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )
    bound: list[socket.socket] = []
    seen: set[tuple[int, Any]] = set()
    try:
        for family, kind, proto, _, address in infos:
            if (family, address[:2]) in seen:
                continue
            seen.add((family, address[:2]))
            sock = socket.socket(family, kind, proto)
            bound.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            if port == 0 and len(bound) > 1:
                address = (address[0], bound[0].getsockname()[1], *address[2:])
            try:
                sock.bind(address)
            except OSError as exc:  # worded as asyncio's create_server words it
                raise OSError(
                    exc.errno,
                    f"error while attempting to bind on address {address!r}: "
                    f"{(exc.strerror or str(exc)).lower()}",
                ) from None
            sock.listen(128)
            sock.setblocking(False)
    except BaseException:
        for sock in bound:
            sock.close()
        raise
    return bound


class ProbeChild:
    """The probe child's lifecycle: start (waiting for its "ready"), restart when it dies
    (bounded back-off, logged), stop (SIGTERM, then SIGKILL). It reads EOF from
    ``self._pipe`` when this process dies, however it dies, and then exits by itself."""

    def __init__(self, listen_fds: list[int], state_fd: int, upstream_port: int) -> None:
        self.listen_fds = listen_fds
        self.state_fd = state_fd
        self.upstream_port = upstream_port
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0
        self._pipe_r, self._pipe_w = os.pipe()  # the child watches the read end for EOF
        self._closing = threading.Event()
        self._watcher: threading.Thread | None = None

    def command(self) -> list[str]:
        """``-I -S``: no site, no environment, no ``bridge`` import: milliseconds to start."""
        cmd = [sys.executable, "-I", "-S", probe_child.__file__]
        for fd in self.listen_fds:
            cmd += ["--listen-fd", str(fd)]
        cmd += ["--state-fd", str(self.state_fd), "--upstream-port", str(self.upstream_port)]
        return [*cmd, "--parent-fd", str(self._pipe_r)]

    def start(self) -> None:
        """Blocking (call it off the loop): the first child, then the watcher that restarts it.
        OSError when it does not start."""
        self._spawn()
        self._watcher = threading.Thread(target=self._watch, name="ops-probe-child", daemon=True)
        self._watcher.start()

    def _spawn(self) -> None:
        proc = subprocess.Popen(
            self.command(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            pass_fds=(*self.listen_fds, self.state_fd, self._pipe_r),
        )
        assert proc.stdout is not None
        ready = select.select([proc.stdout], [], [], CHILD_START_SECONDS)[0]
        line = proc.stdout.readline() if ready else b""
        proc.stdout.close()
        if line != b"ready\n":
            _stop(proc)
            raise OSError(0, f"the probe process did not start (exit status {proc.returncode})")
        self.proc = proc

    def _watch(self) -> None:
        delay = RESTART_BACKOFF[0]
        while not self._closing.is_set():
            proc = self.proc
            assert proc is not None
            began = time.monotonic()
            status = proc.wait()
            if self._closing.is_set():
                return
            lived = time.monotonic() - began
            if lived > 30.0:  # it had settled: this death starts the back-off afresh
                delay = RESTART_BACKOFF[0]
            wait, delay = delay, min(delay * 2, RESTART_BACKOFF[1])
            log.error(
                "the ops probe process %d exited (status %s) after %.1f s; starting another in "
                "%.1f s (until then probes wait unanswered and time out)",
                proc.pid,
                status,
                lived,
                wait,
            )
            if self._closing.wait(wait):
                return
            try:
                self._spawn()
            except OSError as exc:
                log.error("the ops probe process did not start again: %s", exc)
                continue  # proc is the dead one: its wait() returns at once, the back-off grows
            self.restarts += 1
            if self._closing.is_set():  # close() came while it started
                assert self.proc is not None
                _stop(self.proc)

    def close(self) -> None:
        """Blocking: stop the child (SIGTERM, then SIGKILL) and the watcher."""
        self._closing.set()
        if self.proc is not None:
            _stop(self.proc)
        if self._watcher is not None:
            self._watcher.join(CHILD_START_SECONDS + CHILD_STOP_SECONDS)
        if self.proc is not None:
            _stop(self.proc)  # one the watcher started meanwhile
        for fd in (self._pipe_r, self._pipe_w):
            with contextlib.suppress(OSError):
                os.close(fd)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(CHILD_STOP_SECONDS)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
