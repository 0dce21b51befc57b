"""The Hello-time ownership step: in a pod, a device's session lives in one process at a time
(docs/pod-worker.md). Before a Hello learns the sink's marks and attaches, this process claims
the device from the supervisor; another process that holds it is asked to release it first.

Why here and not in the core: claiming waits on another process, and the core is sans-I/O.
Why before ``learn_sink_marks`` and ``challenge.attach``: what the previous owner delivered comes
with the grant (``delivered``) and must be known before the Welcome says where to resume, and a
device must never have two sessions taking frames in two processes at once.

Outside a pod (no :class:`OwnershipGate`) :func:`attach` is what ``EdgeConnection.run`` did
before: marks, then attach (with the challenge); nothing is added per frame, pod or not.

The other side, :meth:`OwnershipGate.release` (the supervisor asks for a device another process
has a Hello for):

- a Hello for the device in progress here, or a live session whose connection answers a ping
  (as :mod:`bridge.server.challenge` asks), keeps it: ``ok=false, reason="taken"``; a claimer
  with the session's resume token, or whose transport proved the device, supersedes the live
  connection instead;
- otherwise the session is (now) detached: wait up to ``release_timeout`` for its rings to be
  delivered, then answer with what was delivered per stream. Undelivered frames are never
  dropped: they stay and are pushed when the sink can take them (the sink drops the new owner's
  copies as duplicates); the detached session stays until its TTL, as any other.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import Protocol

from bridge.protocol.errors import SessionTaken, TooManyPending
from bridge.server import challenge
from bridge.server.metrics import BridgeMetrics
from bridge.server.podlink import ClaimUnanswered, PodLink
from bridge.server.ports import Attached, EdgeTransport, IngestCore
from bridge.server.push_impl import learn_sink_marks
from bridge.server.session import Session, StreamKey
from bridge.v1 import bridge_pb2 as pb

log = logging.getLogger("bridge.server.ownership_gate")

POLL_SECONDS = 0.01  # a release waits for a count to fall (rare: one per device move)


class PodCore(IngestCore, Protocol):
    """What the gate reads of the core besides the ingest port."""

    @property
    def by_device(self) -> Mapping[str, Session]: ...
    def sink_watermarks(self, marks: list[tuple[StreamKey, int]]) -> None: ...


class Superseding(Protocol):
    def supersede(self, old: object) -> None: ...


class OwnerUnknown(TooManyPending):
    """The supervisor did not answer the claim in time (or is gone): retry later. The wire
    error of ``too_many_pending`` (TOO_MANY_SESSIONS, close 1013 / RESOURCE_EXHAUSTED), which
    every client retries (docs/protocol.md §8)."""


class OwnershipGate:
    """Claims at Hello, answers releases (module docstring)."""

    def __init__(
        self,
        link: PodLink,
        core: PodCore,
        edges: Superseding,
        metrics: BridgeMetrics,
        *,
        release_timeout: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.link = link
        self.core = core
        self.edges = edges
        self.metrics = metrics
        self.release_timeout = release_timeout
        self.clock = clock
        self._hellos: dict[str, int] = {}  # device -> Hellos in progress here
        link.on_release = self.release
        link.on_abandoned_grant = self._abandoned_grant

    # -- Hello --------------------------------------------------------------------------------
    async def attach(
        self, hello: pb.Hello, connection: object, proven: bool, metrics: BridgeMetrics
    ) -> Attached:
        device = hello.device_id
        self._hellos[device] = self._hellos.get(device, 0) + 1
        attached: Attached | None = None
        try:
            await self.claim(hello, proven)
            await learn_sink_marks(self.core, hello)
            attached = await challenge.attach(self.core, hello, connection, proven, metrics)
            return attached
        finally:
            left = self._hellos.pop(device) - 1
            if left:
                self._hellos[device] = left
            elif attached is None and device not in self.core.by_device:
                self.link.forget(device)  # granted maybe, but nothing of it stayed here

    async def claim(self, hello: pb.Hello, proven: bool) -> None:
        """Own ``hello``'s device before it attaches; raises what the edge is told."""
        device = hello.device_id
        try:
            claimed = await self.link.claim(device, hello.resume_token, proven)
        except ClaimUnanswered as exc:
            raise OwnerUnknown(
                f"device {device!r}: ownership in the pod unknown ({exc}); retry"
            ) from None
        if not claimed.granted:
            raise SessionTaken(
                f"device {device!r} has a live session; resume it with its session token or "
                f"wait until it disconnects (in another process of this pod: {claimed.reason})"
            )
        if claimed.delivered:  # what the previous owner delivered: start above it
            self.core.sink_watermarks(
                [((device, stream_id), seq) for stream_id, seq in claimed.delivered.items()]
            )

    def _abandoned_grant(self, device: str) -> None:
        """A grant came for a Hello that gave up waiting: forget the device unless a Hello or a
        session here holds it now (its own claim is answered after this one, in order)."""
        if not self._hellos.get(device) and device not in self.core.by_device:
            self.link.forget(device)

    # -- release ------------------------------------------------------------------------------
    async def release(
        self, device: str, token: str, proven: bool
    ) -> tuple[bool, str, dict[str, int]]:
        deadline = self.clock() + self.release_timeout
        if self._hellos.get(device):
            return False, "taken", {}
        session = self.core.by_device.get(device)
        if session is None:
            return True, "no session", {}
        connection = session.connection if session.attached else None
        if connection is not None:
            if proven or (token and token == session.session_id):
                self.edges.supersede(connection)
            elif await self._alive(device, connection, deadline):
                return False, "taken", {}
            await self._until(lambda: session.connection is not connection, deadline)
            self.core.detach(session, connection, self.clock())  # a no-op once it ended
            if self._hellos.get(device) or session.attached:
                return False, "taken", {}  # a Hello here took it back meanwhile
        await self._until(lambda: session.buffered_frames == 0, deadline)
        left = session.buffered_frames
        if left:
            log.info(
                "device %s released with %d frames still undelivered (kept; pushed when the "
                "sink takes them)",
                device,
                left,
            )
        return True, "released", {sid: s.delivered_seq for sid, s in session.streams.items()}

    async def _alive(self, device: str, connection: object, deadline: float) -> bool:
        """One ping at the incumbent (as a challenged Hello sends): anything but silence keeps
        the session where it is."""
        transport: EdgeTransport | None = getattr(connection, "transport", None)
        if transport is None:
            return True
        gate = challenge.gate_of(self.core)
        if not gate.begin(device, self.clock()):
            self.metrics.session_challenges.labels("skipped").inc()
            return True
        try:
            seconds = max(0.0, min(challenge.CHALLENGE_SECONDS, deadline - self.clock()))
            alive = await transport.ping(seconds)
        finally:
            gate.end(device)
        if alive is not False:
            self.metrics.session_challenges.labels("alive" if alive else "unchecked").inc()
            return True
        self.metrics.session_challenges.labels("dead").inc()
        return False

    async def _until(self, done: Callable[[], bool], deadline: float) -> None:
        while not done() and self.clock() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(POLL_SECONDS)


async def attach(
    core: IngestCore,
    gate: OwnershipGate | None,
    hello: pb.Hello,
    connection: object,
    proven: bool,
    metrics: BridgeMetrics,
) -> Attached:
    """The Hello's session: claimed in a pod, then the sink's marks, then attached."""
    if gate is not None:
        return await gate.attach(hello, connection, proven, metrics)
    await learn_sink_marks(core, hello)  # before Welcome: what others delivered
    return await challenge.attach(core, hello, connection, proven, metrics)
