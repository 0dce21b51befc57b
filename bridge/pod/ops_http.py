"""The pod's public ops port, served by the supervisor: ``/healthz``, ``/readyz``, ``/metrics``
(every ingest process's, merged) and ``/debug/resources`` (docs/operations.md, "A pod").

Why on the supervisor's own event loop and not a probe child as in one process
(``bridge.server.probe_child``): the supervisor runs no data plane, so nothing in it holds the
GIL for long; its loop answering *is* what ``/healthz`` says. The one heavy step, parsing and
merging the processes' expositions, yields to the loop between processes and between families
(a bridge's ~300 series parse in a few ms); an exposition over :data:`INLINE_PARSE_BYTES` is
parsed on a thread. Sixteen processes of 300 series: a scrape in ~50 ms, probes meanwhile
answered in ~10 ms (median) to ~30 ms (max) on a shared 2-core machine.

Bounds, as on the single process's ops port: one request per connection, a request head of at
most :data:`MAX_REQUEST_BYTES` read within :data:`READ_SECONDS`, at most
:data:`MAX_CONNECTIONS` open (past that the oldest connection that has not sent its request is
closed to make room, so idle connections cannot lock a probe out; else the new one), an answer
written within :data:`WRITE_SECONDS`. Concurrent ``/metrics`` requests share one scrape of the
processes; each process is asked within :data:`FETCH_SECONDS`.

Auth, as ``bridge.server.http_impl.OpsHttpServer``: with a token set, ``/debug/*`` always needs
``Authorization: Bearer <token>`` and ``/metrics`` does unless ``metrics_open``; the probes stay
open for the kubelet. A refusal is a 401, counted.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any, cast

from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from bridge.config import opsauth
from bridge.pod import metrics_merge, ops_fetch
from bridge.pod.metrics_merge import PodMerge, Refused
from bridge.pod.ops_fetch import Fetched, fetch
from bridge.pod.podmetrics import PodMetrics
from bridge.pod.ports import PodView, WorkerOps

__all__ = ["PodOpsServer", "PodView", "WorkerOps"]

MAX_REQUEST_BYTES = 8192
READ_SECONDS = 5.0  # a client sends its request line and headers within this
WRITE_SECONDS = 30.0  # a client takes its answer within this, else the connection is aborted
MAX_CONNECTIONS = 256
FETCH_SECONDS = 3.0  # a process answers its /metrics or /debug/resources within this
STALE_SECONDS = 5.0  # a process's gauges are shown this long after its last good /metrics
MAX_DEBUG_BYTES = 1024 * 1024  # one process's /debug/resources
REBALANCE_ROUTE = "/admin/rebalance"  # bridge.server.rebalance's, forwarded to every process
INLINE_PARSE_BYTES = 256 * 1024  # a larger exposition is parsed on a thread
SLICE_SECONDS = 0.005  # the render yields to the loop this often
_REASONS = {
    200: "OK",
    401: "Unauthorized",
    404: "Not Found",
    405: "Method Not Allowed",
    503: "Service Unavailable",
}
Answer = tuple[int, str, bytes]


def response(method: str, answer: Answer) -> bytes:
    status, ctype, body = answer
    auth = "WWW-Authenticate: Bearer\r\n" if status == 401 else ""
    head = (
        f"HTTP/1.1 {status} {_REASONS.get(status, 'OK')}\r\nContent-Type: {ctype}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n{auth}\r\n"
    ).encode()
    return head if method == "HEAD" else head + body


class PodOpsServer:
    """The ops port's server and the scrape state behind its ``/metrics``."""

    def __init__(
        self,
        view: PodView,
        metrics: PodMetrics,
        *,
        token: str = "",
        metrics_open: bool = False,
        worker_token: str | None = None,
        fetch_seconds: float = FETCH_SECONDS,
        stale_seconds: float = STALE_SECONDS,
        max_exposition_bytes: int = metrics_merge.MAX_EXPOSITION_BYTES,
        max_series: int = metrics_merge.MAX_SERIES,
    ) -> None:
        self.view = view
        self.metrics = metrics
        self.token = token
        self.metrics_open = metrics_open
        self.worker_token = token if worker_token is None else worker_token
        self.fetch_seconds = fetch_seconds
        self.stale_seconds = stale_seconds
        self.max_exposition_bytes = max_exposition_bytes
        self.max_series = max_series
        self.merge = PodMerge()
        self._good: dict[int, tuple[int, float]] = {}  # slot -> (pid, when) of its last good
        self._dropped_seen = (0, 0)  # the merge's conflicts and dropped, as counted so far
        self._scrape: asyncio.Task[bytes] | None = None
        self._server: asyncio.Server | None = None
        self._open: dict[_Conn, None] = {}  # oldest first
        self._tasks: set[asyncio.Task[Any]] = set()

    async def start(self, host: str, port: int) -> int:
        """Listen on ``host:port`` (port 0: any); the bound port (OSError when it cannot)."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _Conn(self), host or None, port, reuse_address=True, backlog=512
        )
        return int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        tasks = [t for t in (*self._tasks, self._scrape) if t is not None and not t.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for conn in list(self._open):
            conn.abort()
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    # -- routing ---------------------------------------------------------------------------------
    def needs_token(self, path: str) -> bool:
        return opsauth.needs_token(path, self.token, self.metrics_open)

    def authorized(self, head: bytes) -> bool:
        return opsauth.bearer_matches(head, self.token)

    def answer_now(self, head: bytes) -> tuple[bytes, Callable[[], Awaitable[Answer]] | None]:
        """The response to ``head``, or ``(b"", compute)`` when it is computed by a task."""
        try:
            method, target, _ = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ", 2)
        except ValueError:
            return b"", None
        path, _, query = target.partition("?")
        if method == "POST" and path == REBALANCE_ROUTE:
            return self._post_rebalance(head, query)
        if method not in ("GET", "HEAD"):
            return response(method, (405, "text/plain", b"method not allowed\n")), None
        if self.needs_token(path) and not self.authorized(head):
            self.metrics.unauthorized.inc()
            return response(method, (401, "text/plain", b"bearer token required\n")), None
        if path == "/healthz":
            return response(method, (200, "text/plain", b"ok\n")), None
        if path == "/readyz":
            ready, why = self.view.ready()
            body = b"ready\n" if ready else f"not ready: {why}\n".encode()
            return response(method, (200 if ready else 503, "text/plain", body)), None
        if path == "/metrics":
            return b"", self.metrics_answer
        if path == "/debug/resources":
            return b"", self.debug_answer
        return response(method, (404, "text/plain", b"not found\n")), None

    # -- POST /admin/rebalance ------------------------------------------------------------------
    def _post_rebalance(
        self, head: bytes, query: str
    ) -> tuple[bytes, Callable[[], Awaitable[Answer]] | None]:
        """Each process's own route (bridge.server.rebalance) with the same query: every edge
        of the pod is drained, spread over the same S, and the answer sums them. The rules of
        the route: the token always (401), refused when none is configured (403)."""
        if not self.token:
            return response("POST", (403, "text/plain", b"no auth_token configured\n")), None
        if not self.authorized(head):
            self.metrics.unauthorized.inc()
            return response("POST", (401, "text/plain", b"bearer token required\n")), None
        return b"", lambda: self._rebalance_answer(query)

    async def _rebalance_answer(self, query: str) -> Answer:
        asked = [w for w in self.view.workers() if w.alive and w.ops]
        path = f"{REBALANCE_ROUTE}?{query}" if query else REBALANCE_ROUTE
        answers = await asyncio.gather(
            *(
                ops_fetch.post(
                    w.ops or "",
                    path,
                    token=self.worker_token,
                    max_body=MAX_DEBUG_BYTES,
                    seconds=self.fetch_seconds,
                )
                for w in asked
            )
        )
        per = {
            str(w.index): _json_or_text(said) | {"status": code}
            for w, (code, said) in zip(asked, answers, strict=True)
        }
        codes = {code for code, _ in answers}
        status = 202 if codes == {202} else max(codes - {202}, default=503)
        edges = sum(int(p.get("edges", 0)) for p in per.values() if p["status"] == 202)
        body = json.dumps({"edges": edges, "processes": per}).encode() + b"\n"
        return status or 503, "application/json", body

    # -- /metrics --------------------------------------------------------------------------------
    async def metrics_answer(self) -> Answer:
        """Requests that arrive while a scrape runs share it."""
        if self._scrape is None or self._scrape.done():
            self._scrape = asyncio.ensure_future(self._scrape_once())
        body = await asyncio.shield(self._scrape)
        return 200, CONTENT_TYPE_PLAIN_0_0_4, body

    async def _scrape_once(self) -> bytes:
        workers = self.view.workers()
        asked = [w for w in workers if w.alive and w.ops]
        fetched = await asyncio.gather(
            *(self._fetch(w, "/metrics", self.max_exposition_bytes) for w in asked)
        )
        by_index = dict(zip([w.index for w in asked], fetched, strict=True))
        up: dict[int, bool] = {}
        for worker in workers:
            up[worker.index] = await self._take(worker, by_index.get(worker.index))
        for index in set(self.merge.indexes()) - up.keys():
            self.merge.retire(index)
            self._good.pop(index, None)
        parts: list[str] = []
        began = time.monotonic()
        for part in self.merge.render_parts():
            parts.append(part)
            if time.monotonic() - began > SLICE_SECONDS:
                await asyncio.sleep(0)
                began = time.monotonic()
        conflicts, dropped = self.merge.conflicts, self.merge.dropped
        seen = self._dropped_seen
        self.metrics.dropped_samples.labels("conflict").inc(conflicts - seen[0])
        self.metrics.dropped_samples.labels("cap").inc(dropped - seen[1])
        self._dropped_seen = (conflicts, dropped)
        self.metrics.set_processes_up(up)
        return "".join(parts).encode() + generate_latest(self.metrics.registry)

    async def _take(self, worker: WorkerOps, got: Fetched | None) -> bool:
        """Merge what ``worker`` answered (True), or count why not and hide its gauges once
        its last good exposition is too old to show (False). A realistic exposition (~300
        series) parses in a few ms on the loop, between turns; a large one on a thread."""
        if got is not None and got.body is not None:
            try:
                if len(got.body) > INLINE_PARSE_BYTES:
                    exposition = await asyncio.to_thread(self._parse, got.body)
                else:
                    exposition = self._parse(got.body)
            except Refused as exc:
                self.metrics.scrape_errors.labels(exc.reason).inc()
            else:
                self.merge.update(worker.index, worker.pid, exposition)
                self._good[worker.index] = (worker.pid, time.monotonic())
                await asyncio.sleep(0)
                return True
        elif got is not None:
            self.metrics.scrape_errors.labels(got.error).inc()
        pid, when = self._good.get(worker.index, (-1, -1e9))
        stale = time.monotonic() - when > self.stale_seconds
        if not worker.alive or pid != worker.pid or stale:
            self.merge.hide_gauges(worker.index)
        return False

    def _parse(self, body: bytes) -> metrics_merge.Exposition:
        return metrics_merge.parse(
            body, max_bytes=self.max_exposition_bytes, max_series=self.max_series
        )

    async def _fetch(self, worker: WorkerOps, path: str, limit: int) -> Fetched:
        assert worker.ops is not None
        return await fetch(
            worker.ops, path, token=self.worker_token, max_body=limit, seconds=self.fetch_seconds
        )

    # -- /debug/resources ------------------------------------------------------------------------
    async def debug_answer(self) -> Answer:
        """The supervisor's describe() and, under ``processes``, each process's own."""
        workers = self.view.workers()
        asked = [w for w in workers if w.alive and w.ops]
        fetched = await asyncio.gather(
            *(self._fetch(w, "/debug/resources", MAX_DEBUG_BYTES) for w in asked)
        )
        by_index = dict(zip([w.index for w in asked], fetched, strict=True))
        processes = []
        for worker in workers:
            entry: dict[str, Any] = {
                "index": worker.index,
                "pid": worker.pid,
                "alive": worker.alive,
                "ops": worker.ops,
            }
            got = by_index.get(worker.index)
            if got is None:
                entry["error"] = "not running" if not worker.alive else "no ops address yet"
            elif got.body is None:
                entry["error"] = f"{got.error}: {got.detail}"
            else:
                try:
                    entry["resources"] = json.loads(got.body)
                except ValueError as exc:
                    entry["error"] = f"not JSON: {exc}"
            processes.append(entry)
        doc = {**self.view.describe(), "processes": processes}
        return 200, "application/json", json.dumps(doc, indent=2, default=str).encode() + b"\n"

    # -- connections -----------------------------------------------------------------------------
    def admit(self, conn: _Conn) -> bool:
        """Room for ``conn``: at the cap the oldest connection still reading its request gives
        way; False (close ``conn``) when every open one is being answered."""
        if len(self._open) >= MAX_CONNECTIONS:
            idle = next((c for c in self._open if c.reading), None)
            if idle is None:
                return False
            idle.abort()
        self._open[conn] = None
        return True

    def answer_later(
        self, conn: _Conn, method: str, compute: Callable[[], Awaitable[Answer]]
    ) -> None:
        async def run() -> None:
            try:
                answer = await compute()
            except Exception as exc:  # a 503 and the reason, never a hang
                answer = (503, "text/plain", f"{type(exc).__name__}: {exc}\n".encode())
            conn.finish(response(method, answer))

        task = asyncio.get_running_loop().create_task(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


class _Conn(asyncio.Protocol):
    """One request per connection: its head, then the answer and close."""

    def __init__(self, server: PodOpsServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.timer: asyncio.TimerHandle | None = None
        self.reading = True

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's TCP transport is not an asyncio.Transport subclass (an assert here failed
        # every connection under ``simbridge serve``, which runs on uvloop): cast, not check.
        self.transport = cast(asyncio.Transport, transport)
        if not self.server.admit(self):
            self.reading = False
            self.transport.abort()
            return
        self.timer = asyncio.get_running_loop().call_later(READ_SECONDS, self.abort)

    def data_received(self, data: bytes) -> None:
        if not self.reading or self.transport is None:
            return  # one request: the rest is ignored
        self.buffer += data
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(self.buffer) > MAX_REQUEST_BYTES:
                self.abort()
            return
        self.reading = False
        self._cancel_timer()
        head = bytes(self.buffer[: end + 4])
        self.buffer = bytearray()
        self.transport.pause_reading()
        now, later = self.server.answer_now(head)
        if later is None:
            self.finish(now)
            return
        self.server.answer_later(self, head.split(b" ", 1)[0].decode("latin-1"), later)

    def finish(self, data: bytes) -> None:
        """Write ``data`` and close once it is sent (aborted after :data:`WRITE_SECONDS`)."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if data:
            transport.write(data)
        transport.close()
        if transport.get_write_buffer_size():
            self.timer = asyncio.get_running_loop().call_later(WRITE_SECONDS, transport.abort)

    def abort(self) -> None:
        self.reading = False
        self._cancel_timer()
        if self.transport is not None:
            self.transport.abort()

    def _cancel_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timer()
        self.server._open.pop(self, None)


def _json_or_text(said: bytes) -> dict[str, Any]:
    try:
        value = json.loads(said)
    except ValueError:
        return {"said": said[:200].decode("utf-8", "replace").strip()}
    return value if isinstance(value, dict) else {"said": value}
