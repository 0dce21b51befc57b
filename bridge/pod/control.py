"""The supervisor's end of the control channel: a Unix socket in a private directory, one
connection per ingest process, identified by the kernel (``SO_PEERCRED``: the peer's pid must be
a process this supervisor started), lines decoded by :mod:`bridge.protocol.podcontrol` and
handed to the supervisor; claims and releases go through the ownership table here.

A line that is not a valid message closes that process's channel (it is the bridge's own code
at the other end, so this is a bug, logged loudly), never the supervisor.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import struct
import tempfile
import time
from collections.abc import Callable
from typing import Any

from bridge.pod.ownership import Action, AskRelease, Grant, Ownership, Refuse
from bridge.protocol import podcontrol
from bridge.protocol.podcontrol import KINDS_TO_SUPERVISOR, ControlError, Message

log = logging.getLogger("bridge.pod.control")


#: How a grant is counted (``bridge_pod_claims_total{result}``): after the owner let the device
#: go, after it failed to answer in time, or at once (unowned, own, owner gone).
GRANT_RESULTS = {"released": "released", "owner-timeout": "timeout"}


#: Counts each claim's answer by result (``bridge_pod_claims_total{result}``).
ClaimCounter = Callable[[str], None]


class Peer:
    """One ingest process's channel."""

    def __init__(self, index: int, pid: int, writer: asyncio.StreamWriter) -> None:
        self.index = index
        self.pid = pid
        self.writer = writer
        self.up: Message | None = None
        self.last_share: dict[str, Any] | None = None

    def send(self, kind: str, **fields: Any) -> bool:
        if self.writer.is_closing():
            return False
        self.writer.write(podcontrol.encode(kind, **fields))
        return True


class ControlServer:
    """``index_of_pid`` maps a started process's pid to its slot (None: not ours: refused);
    ``on_up``/``on_gone`` tell the supervisor when a process reported its addresses / when its
    channel closed."""

    def __init__(
        self,
        ownership: Ownership,
        index_of_pid: Callable[[int], int | None],
        on_up: Callable[[Peer], None],
        counter: ClaimCounter | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ownership = ownership
        self.index_of_pid = index_of_pid
        self.on_up = on_up
        self.counter = counter
        self.clock = clock
        self.peers: dict[int, Peer] = {}
        self.directory = tempfile.mkdtemp(prefix="simbridge-pod-")  # mode 0700
        self.path = os.path.join(self.directory, "control.sock")
        self._server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._ticker: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_unix_server(
            self._serve, self.path, limit=podcontrol.MAX_LINE_BYTES + 2
        )
        os.chmod(self.path, 0o600)
        self._ticker = asyncio.create_task(self._tick(), name="pod-ownership-timeouts")

    async def close(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
        if self._server is not None:
            self._server.close()
        for peer in list(self.peers.values()):
            peer.writer.close()
        # Each handler ends on the EOF of its closed channel; only a straggler is cancelled (a
        # cancelled handler makes asyncio's server log its CancelledError).
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=1.0)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        with contextlib.suppress(OSError):
            os.rmdir(self.directory)

    def alive(self) -> set[int]:
        return set(self.peers)

    def send(self, to: int, kind: str, **fields: Any) -> bool:
        peer = self.peers.get(to)
        return peer is not None and peer.send(kind, **fields)

    def process_gone(self, index: int) -> None:
        """The process exited (or its channel closed): its devices are free."""
        peer = self.peers.pop(index, None)
        if peer is not None:
            peer.writer.close()
        self._dispatch(self.ownership.process_gone(index, self.clock(), self.alive()))

    # -- inside ------------------------------------------------------------------------------
    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        index: int | None = None
        try:
            pid = _peer_pid(writer)
            index = self.index_of_pid(pid) if pid is not None else None
            if index is None:
                log.warning("control channel: refused a connection from pid %s (not ours)", pid)
                return
            peer = Peer(index, pid or 0, writer)
            old = self.peers.get(index)
            if old is not None:
                old.writer.close()
            self.peers[index] = peer
            while True:
                try:
                    line = await reader.readline()
                except ValueError:  # over the limit: readline raises after discarding
                    raise ControlError("control line too long") from None
                if not line:
                    return
                self._handle(peer, podcontrol.decode(line, expect=KINDS_TO_SUPERVISOR))
        except ControlError as exc:
            log.error("control channel of process %s: %s; closing it", index, exc)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            if task is not None:
                self._tasks.discard(task)
            writer.close()
            current = self.peers.get(index) if index is not None else None
            if index is not None and current is not None and current.writer is writer:
                self.process_gone(index)

    def _handle(self, peer: Peer, msg: Message) -> None:
        now = self.clock()
        if msg.kind == "up":
            peer.up = msg
            self.on_up(peer)
        elif msg.kind == "claim":
            actions = self.ownership.claim(
                msg["device"],
                peer.index,
                msg["id"],
                now,
                token=msg["token"],
                proven=msg["proven"],
                alive=self.alive(),
            )
            self._dispatch(actions)
        elif msg.kind == "released":
            self._dispatch(
                self.ownership.released(msg["id"], msg["ok"], msg["reason"], msg["delivered"], now)
            )
        elif msg.kind == "forget":
            self.ownership.forget(msg["device"], peer.index)

    def _dispatch(self, actions: list[Action]) -> None:
        for action in actions:
            if isinstance(action, Grant):
                if self.counter is not None:
                    self.counter(GRANT_RESULTS.get(action.why, "granted"))
                self.send(
                    action.to,
                    "claimed",
                    id=action.claim_id,
                    granted=True,
                    reason=action.why,
                    delivered=action.delivered,
                    epoch=action.epoch,
                )
            elif isinstance(action, Refuse):
                if self.counter is not None:
                    self.counter("refused")
                self.send(
                    action.to,
                    "claimed",
                    id=action.claim_id,
                    granted=False,
                    reason=action.reason,
                    delivered={},
                    epoch=0,
                )
            elif isinstance(action, AskRelease):
                # An owner that cannot be asked is passed over at the release timeout.
                self.send(
                    action.owner,
                    "release",
                    id=action.release_id,
                    device=action.device,
                    token=action.token,
                    proven=action.proven,
                )

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(0.05)
            self._dispatch(self.ownership.expire(self.clock()))


def _peer_pid(writer: asyncio.StreamWriter) -> int | None:
    sock = writer.get_extra_info("socket")
    if sock is None:
        return None
    try:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return None
    pid, _uid, _gid = struct.unpack("3i", creds)
    return int(pid)
