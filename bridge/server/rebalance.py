"""Drain on request: ``POST /admin/rebalance?spread_seconds=S`` spreads a replica's edges over
the replicas after a scale-up (issue 32, docs/scaling.md "Replicas").

Why: a consistent-hash balancer moves about 1/N of the devices to a new replica, but only on
their next connection, and a healthy device may keep its connection for days. This route sends
every edge attached at the time of the request a ``Drain`` (reason ``rebalance``), one after
another, evenly spaced over ``S`` seconds, each saying "reconnect after ``reconnect_ms``" (100 ms
by default). Each device then reconnects through the balancer: those whose key now maps to the
new replica move there (resuming from the sink's watermarks, protocol.md §6 and §10), the others
come back and resume their own session here. Nothing is lost either way: a Drain ends no
session, and what the edge has not seen acknowledged it resends.

Why the Drains are spaced rather than sent at once with spread reconnect delays: each device is
then away for ``reconnect_ms`` plus a reconnect, not for up to ``S`` seconds, and the Hellos
(with their watermark queries to the sink) still arrive spread over ``S``.

Bounded: one rebalance at a time (another is refused, 409, until it ends), ``S`` at most
:data:`MAX_SPREAD_SECONDS`, one Drain per edge. Auth: the ops server requires the bridge's
``auth_token`` for POST routes and refuses them when none is configured (secure by default).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

from bridge.server.ingest import EdgeConnection
from bridge.server.session import Session
from bridge.v1 import bridge_pb2 as pb

if TYPE_CHECKING:
    from bridge.server.app import BridgeService

log = logging.getLogger("bridge.rebalance")

ROUTE = "/admin/rebalance"
DEFAULT_SPREAD_SECONDS = 10.0
MAX_SPREAD_SECONDS = 600.0
DEFAULT_RECONNECT_MS = 100
MAX_RECONNECT_MS = 10_000
Answer = tuple[int, str, bytes]


@dataclass(frozen=True)
class Request:
    spread_seconds: float = DEFAULT_SPREAD_SECONDS
    reconnect_ms: int = DEFAULT_RECONNECT_MS


def parse_request(query: str) -> Request:
    """The route's query string; ValueError says what is wrong."""
    fields = parse_qs(query, keep_blank_values=True, max_num_fields=4)
    unknown = set(fields) - {"spread_seconds", "reconnect_ms"}
    if unknown:
        raise ValueError(f"unknown parameter(s): {', '.join(sorted(unknown))}")
    spread, reconnect = DEFAULT_SPREAD_SECONDS, DEFAULT_RECONNECT_MS
    if "spread_seconds" in fields:
        spread = _number(fields["spread_seconds"], "spread_seconds", float)
        if not (math.isfinite(spread) and 0 <= spread <= MAX_SPREAD_SECONDS):
            raise ValueError(f"spread_seconds: 0 to {MAX_SPREAD_SECONDS:g}")
    if "reconnect_ms" in fields:
        reconnect = int(_number(fields["reconnect_ms"], "reconnect_ms", int))
        if not 0 <= reconnect <= MAX_RECONNECT_MS:
            raise ValueError(f"reconnect_ms: 0 to {MAX_RECONNECT_MS}")
    return Request(spread, reconnect)


def _number(values: list[str], name: str, kind: Callable[[str], Any]) -> float:
    if len(values) != 1:
        raise ValueError(f"{name}: give it once")
    try:
        return float(kind(values[0]))
    except ValueError:
        raise ValueError(f"{name}: not a number: {values[0]!r}") from None


def offsets(count: int, spread_seconds: float) -> list[float]:
    """When each of ``count`` Drains is sent, from the start: evenly spaced over the spread,
    the first at once (a uniform spread, without the clumps random times would make)."""
    return [k * spread_seconds / count for k in range(count)]


def _answer(status: int, body: dict[str, Any]) -> Answer:
    return status, "application/json", json.dumps(body).encode() + b"\n"


class Rebalancer:
    """The route's state for one bridge: at most one rebalance runs."""

    def __init__(
        self,
        sessions: Callable[[], list[Session]],
        draining: Callable[[], bool],
        rng: random.Random | None = None,
    ) -> None:
        self._sessions = sessions
        self._draining = draining
        self._rng = rng or random.Random()
        self._task: asyncio.Task[int] | None = None
        self._ends_at = 0.0
        self._sends: set[asyncio.Task[None]] = set()  # Drains being written

    @classmethod
    def install(cls, service: BridgeService) -> Rebalancer:
        """Serve the route on ``service``'s ops port (after its start)."""
        core, edges = service.core, service.edges
        rebalancer = cls(lambda: list(core.sessions.values()), lambda: edges.draining)
        http = service._http  # the ops server (bridge.server.http_impl): its POST routes
        if http is not None:
            http.post_routes[ROUTE] = rebalancer.handle
        return rebalancer

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def handle(self, query: str) -> Answer:
        """One authorized POST (runs on the bridge's loop)."""
        try:
            request = parse_request(query)
        except ValueError as exc:
            return _answer(400, {"error": str(exc)})
        if self._draining():
            return _answer(503, {"error": "the bridge is shutting down"})
        if self.running:
            left = max(0.0, self._ends_at - time.monotonic())
            return _answer(
                409, {"error": "a rebalance is running", "remaining_seconds": round(left, 3)}
            )
        targets = [
            (s, s.connection)
            for s in self._sessions()
            if s.attached and isinstance(s.connection, EdgeConnection)
        ]
        self._rng.shuffle(targets)  # which devices go first: none by rule
        self._ends_at = time.monotonic() + request.spread_seconds
        self._task = asyncio.create_task(self._run(targets, request), name="rebalance")
        log.info(
            "rebalance: draining %d edges over %g s (reconnect after %d ms)",
            len(targets),
            request.spread_seconds,
            request.reconnect_ms,
        )
        return _answer(
            202,
            {
                "edges": len(targets),
                "spread_seconds": request.spread_seconds,
                "reconnect_ms": request.reconnect_ms,
            },
        )

    async def close(self) -> None:
        for task in [*self._sends, *([self._task] if self._task is not None else [])]:
            task.cancel()
        await asyncio.gather(
            *self._sends, *([self._task] if self._task else []), return_exceptions=True
        )

    async def _run(self, targets: list[tuple[Session, EdgeConnection]], request: Request) -> int:
        """Send the Drains on schedule; returns how many went out. A session that detached or
        moved to another connection meanwhile is skipped (it reconnected already)."""
        message = pb.BridgeMessage(
            drain=pb.Drain(reconnect_after_ms=request.reconnect_ms, reason="rebalance")
        )
        loop = asyncio.get_running_loop()
        start = loop.time()
        sends, sent = self._sends, 0
        for (session, conn), offset in zip(
            targets, offsets(len(targets), request.spread_seconds), strict=True
        ):
            delay = start + offset - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            if self._draining():
                break  # SIGTERM: every edge gets the shutdown Drain instead
            if session.connection is not conn:
                continue
            # A task per Drain: a peer that does not read delays only its own (its send ends
            # when its connection does).
            task = asyncio.create_task(_send(conn, message), name="rebalance-drain")
            sends.add(task)
            task.add_done_callback(sends.discard)
            sent += 1
        log.info("rebalance: %d of %d edges drained", sent, len(targets))
        return sent


async def _send(conn: EdgeConnection, message: pb.BridgeMessage) -> None:
    with contextlib.suppress(ConnectionError):
        await conn.send(message)
