"""A worker's end of the pod's control channel (docs/pod-worker.md): one Unix stream connection
to the supervisor (its path in ``SIMBRIDGE_POD_CONTROL``), JSON lines of
:mod:`bridge.protocol.podcontrol`.

What goes through it: ``up`` once the process is ready; a ``claim`` per Hello, answered by
``claimed`` (or refused here, retryably, when the supervisor does not answer in time or the
channel is gone); ``release`` requests, answered by ``released`` from a handler the ownership
gate installs (:mod:`bridge.server.ownership_gate`); ``share`` whenever the pod's plan changes;
``forget`` when a device's session leaves this process.

Why the worker exits when the channel closes: the supervisor is its lifecycle owner (it
restarts workers and holds the ownership table). A worker without one cannot claim devices any
more, so it drains as on SIGTERM and exits; the supervisor that replaces the pod starts a new one.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from bridge.protocol import podcontrol
from bridge.protocol.podcontrol import KINDS_TO_WORKER, ControlError, Message
from bridge.resources.share import PodShare

log = logging.getLogger("bridge.server.podlink")


@dataclass(frozen=True, slots=True)
class PodEnv:
    """What the supervisor told this process in its environment."""

    control: str  # the control socket's path
    index: int  # this process's slot, 0..N-1
    secret: str  # the pod-internal credential

    @classmethod
    def from_environ(cls, environ: dict[str, str] | None = None) -> PodEnv | None:
        """None outside a pod (no ``SIMBRIDGE_POD_CONTROL``): a single process, as before."""
        env = os.environ if environ is None else environ
        path = env.get(podcontrol.ENV_CONTROL, "")
        if not path:
            return None
        try:
            index = int(env.get(podcontrol.ENV_INDEX, "0"))
        except ValueError:
            index = 0
        return cls(path, index, env.get(podcontrol.ENV_SECRET, ""))


def share_of(msg: Message) -> PodShare:
    """A ``share`` message as the plan reads it."""
    siblings = tuple(
        (int(s.get("index", -1)), str(s.get("grpc_internal", "")))
        for s in msg["siblings"]
        if isinstance(s, dict)
    )
    cores = msg["cpu_cores"]
    return PodShare(
        memory_limit_bytes=msg["memory_limit_bytes"],
        cpu_cores=None if cores is None else float(cores),
        workers=max(1, msg["workers"]),
        processes=max(1, msg["processes"]),
        index=msg["index"],
        siblings=siblings,
    )


@dataclass(frozen=True, slots=True)
class Claimed:
    granted: bool
    reason: str
    delivered: dict[str, int]
    epoch: int


class ClaimUnanswered(Exception):
    """No ``claimed`` within the timeout, or the channel is gone: the Hello is refused
    retryably (the caller maps it to a protocol error)."""


#: A release handler: (device, token, proven) -> (ok, reason, delivered).
ReleaseHandler = Callable[[str, str, bool], Awaitable[tuple[bool, str, dict[str, int]]]]

#: Claims given up on (timed out, or the Hello cancelled) whose answer is still due; a grant
#: that comes for one is handed to ``on_abandoned_grant``. Bounded: the oldest is dropped.
MAX_ABANDONED_CLAIMS = 4096


class PodLink:
    """The control channel's client; see the module docstring. ``on_share`` is called with
    every share (on the event loop); ``on_lost`` once when the channel closes by itself."""

    def __init__(
        self,
        env: PodEnv,
        *,
        claim_timeout: float,
        on_share: Callable[[PodShare], None] | None = None,
        on_lost: Callable[[], None] | None = None,
    ) -> None:
        self.env = env
        self.claim_timeout = claim_timeout
        self.on_share = on_share
        self.on_retire: Callable[[int], None] | None = None  # the plan retires this process
        self.on_lost = on_lost
        self.on_release: ReleaseHandler | None = None  # set by the ownership gate
        #: Called with a device granted to a claim nobody waits for any more (set by the gate).
        self.on_abandoned_grant: Callable[[str], None] | None = None
        self._abandoned: dict[int, str] = {}  # claim id -> device
        self.share: PodShare | None = None
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._task: asyncio.Task[None] | None = None
        self._ids = itertools.count(1)
        self._claims: dict[int, asyncio.Future[Claimed]] = {}
        self._releases: set[asyncio.Task[None]] = set()
        self._closing = False
        self.lost = False

    @property
    def index(self) -> int:
        return self.env.index

    @property
    def secret(self) -> str:
        """The pod-internal credential (siblings' private gRPC, for cross-process Subscribe)."""
        return self.env.secret

    def siblings(self) -> list[str]:
        """The other processes' private gRPC addresses (host:port), from the last share."""
        share = self.share
        if share is None:
            return []
        return [addr for index, addr in share.siblings if index != self.index and addr]

    @property
    def connected(self) -> bool:
        return self._writer is not None and not self._writer.is_closing() and not self.lost

    # -- lifecycle -----------------------------------------------------------------------------
    async def connect(self) -> None:
        """Connect to the supervisor (OSError when it is not there) and start reading."""
        self._reader, self._writer = await asyncio.open_unix_connection(
            self.env.control, limit=podcontrol.MAX_LINE_BYTES + 2
        )
        self._task = asyncio.create_task(self._read(), name="pod-control")

    async def close(self) -> None:
        """Close the channel (our own close: ``on_lost`` is not called)."""
        self._closing = True
        for task in list(self._releases):
            task.cancel()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(Exception):
                await self._writer.wait_closed()
        self._fail_claims()

    # -- to the supervisor ------------------------------------------------------------------------
    def _send(self, kind: str, **fields: Any) -> bool:
        writer = self._writer
        if writer is None or writer.is_closing() or self.lost:
            return False
        writer.write(podcontrol.encode(kind, **fields))
        return True

    def up(self, *, ops: str, grpc_internal: str, ws: int, grpc: int) -> None:
        self._send(
            "up",
            index=self.index,
            pid=os.getpid(),
            ops=ops,
            grpc_internal=grpc_internal,
            ws=ws,
            grpc=grpc,
        )

    def forget(self, device: str) -> None:
        self._send("forget", device=device)

    async def claim(self, device: str, token: str, proven: bool) -> Claimed:
        """Ask the supervisor for ``device``; :class:`ClaimUnanswered` when no answer comes
        within ``claim_timeout`` or the channel is gone."""
        claim_id = next(self._ids)
        future: asyncio.Future[Claimed] = asyncio.get_running_loop().create_future()
        if not self._send("claim", id=claim_id, device=device, token=token, proven=proven):
            raise ClaimUnanswered("the pod's supervisor is not connected")
        self._claims[claim_id] = future
        try:
            return await asyncio.wait_for(future, self.claim_timeout)
        except TimeoutError:
            raise ClaimUnanswered(
                f"the pod's supervisor did not answer the claim within {self.claim_timeout:g} s"
            ) from None
        finally:
            self._claims.pop(claim_id, None)
            if not future.done() or future.cancelled():  # its answer may still come
                self._abandon(claim_id, device)

    def _abandon(self, claim_id: int, device: str) -> None:
        """Why: a grant nobody waits for would leave the supervisor's table naming this
        process as the device's owner with no session here, never forgotten (an edge that
        cancels its Hello while the owner elsewhere releases could grow the table without end)."""
        if len(self._abandoned) >= MAX_ABANDONED_CLAIMS:
            del self._abandoned[next(iter(self._abandoned))]
        self._abandoned[claim_id] = device

    # -- from the supervisor ----------------------------------------------------------------------
    async def _read(self) -> None:
        assert self._reader is not None
        try:
            while True:
                try:
                    line = await self._reader.readline()
                except ValueError:
                    raise ControlError("control line too long") from None
                if not line:
                    break
                self._handle(podcontrol.decode(line, expect=KINDS_TO_WORKER))
        except ControlError as exc:
            log.error("pod control channel: %s; closing it", exc)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        if self._closing:
            return
        self.lost = True
        self._fail_claims()
        if self._writer is not None:
            self._writer.close()
        log.warning("pod control channel closed: the supervisor is gone; draining to exit")
        if self.on_lost is not None:
            self.on_lost()

    def _handle(self, msg: Message) -> None:
        if msg.kind == "claimed":
            abandoned = self._abandoned.pop(msg["id"], None)
            if abandoned is not None and msg["granted"] and self.on_abandoned_grant is not None:
                self.on_abandoned_grant(abandoned)
            future = self._claims.get(msg["id"])
            if future is not None and not future.done():
                future.set_result(
                    Claimed(msg["granted"], msg["reason"], dict(msg["delivered"]), msg["epoch"])
                )
        elif msg.kind == "release":
            task = asyncio.create_task(
                self._release(msg["id"], msg["device"], msg["token"], msg["proven"]),
                name="pod-release",
            )
            self._releases.add(task)
            task.add_done_callback(self._releases.discard)
        elif msg.kind == "retire":
            log.info(
                "retired by the pod's plan: draining (edges back in %d ms)",
                msg["reconnect_after_ms"],
            )
            if self.on_retire is not None:
                self.on_retire(msg["reconnect_after_ms"])
        elif msg.kind == "share":
            self.share = share_of(msg)
            if self.on_share is not None:
                try:
                    self.on_share(self.share)
                except Exception:
                    log.exception("applying the pod share failed")

    async def _release(self, release_id: int, device: str, token: str, proven: bool) -> None:
        ok, reason = False, "no release handler"
        delivered: dict[str, int] = {}
        try:
            if self.on_release is not None:
                ok, reason, delivered = await self.on_release(device, token, proven)
        except Exception:
            log.exception("release of device %s failed", device)
            ok, reason, delivered = False, "error", {}
        self._send("released", id=release_id, ok=ok, reason=reason, delivered=delivered)

    def _fail_claims(self) -> None:
        for future in self._claims.values():
            if not future.done():
                future.set_exception(ClaimUnanswered("the pod's control channel closed"))
