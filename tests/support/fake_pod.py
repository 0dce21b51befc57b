"""A stand-in for the pod's supervisor in tests of the worker side (tests/integration/
test_pod_worker.py): a real Unix-socket server speaking :mod:`bridge.protocol.podcontrol`.

It keeps the simplest ownership table that has the real one's shape (a claim is granted when
nobody owns the device, the claimer does, or the owner's channel is gone; otherwise the owner is
asked to release and its answer decides), and lets a test override the answer per device
(``answers``: "grant", "refuse" or "silent") or talk to a worker directly (:meth:`send`,
:meth:`release`, :meth:`drop`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import Any

from bridge.protocol import podcontrol
from bridge.protocol.podcontrol import KINDS_TO_SUPERVISOR, Message

TIMEOUT = 8.0


@dataclass
class WorkerPeer:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    index: int | None = None
    up: Message | None = None
    inbox: asyncio.Queue[Message] = field(default_factory=asyncio.Queue)  # released, forget

    def send(self, kind: str, **fields: Any) -> None:
        self.writer.write(podcontrol.encode(kind, **fields))


@dataclass
class Release:
    """One release the table asked for, with its answer and how long it took."""

    index: int
    device: str
    answer: Message | None = None
    seconds: float = 0.0


class FakeSupervisor:
    def __init__(self) -> None:
        self.directory = tempfile.mkdtemp(prefix="sbpod-")  # short: a socket path has a limit
        self.path = os.path.join(self.directory, "control.sock")
        self.secret = "0123456789abcdef0123456789abcdef"
        self.workers: dict[int, WorkerPeer] = {}
        self.owner: dict[str, int] = {}
        self.answers: dict[str, str] = {}  # device -> grant | refuse | silent (default: table)
        self.grant_delivered: dict[str, dict[str, int]] = {}  # sent with a grant not released
        self.claims: list[tuple[int | None, str, bool]] = []  # (index, device, granted)
        self.releases: list[Release] = []
        self._ups = asyncio.Condition()
        self._server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._ids = itertools.count(1)
        self._answers: dict[int, asyncio.Future[Message]] = {}

    def env(self, index: int) -> dict[str, str]:
        return {
            podcontrol.ENV_CONTROL: self.path,
            podcontrol.ENV_INDEX: str(index),
            podcontrol.ENV_SECRET: self.secret,
        }

    async def __aenter__(self) -> FakeSupervisor:
        self._server = await asyncio.start_unix_server(
            self._serve, self.path, limit=podcontrol.MAX_LINE_BYTES + 2
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.close()
        for peer in self.workers.values():
            peer.writer.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        shutil.rmtree(self.directory, ignore_errors=True)

    async def wait_up(self, index: int, timeout: float = TIMEOUT) -> Message:  # noqa: ASYNC109
        async with self._ups:
            await asyncio.wait_for(
                self._ups.wait_for(lambda: index in self.workers and self.workers[index].up),
                timeout,
            )
        up = self.workers[index].up
        assert up is not None
        return up

    def send(self, to: int, kind: str, **fields: Any) -> None:
        self.workers[to].send(kind, **fields)

    def share(self, index: int, **fields: Any) -> None:
        base: dict[str, Any] = {
            "memory_limit_bytes": None,
            "cpu_cores": None,
            "workers": 1,
            "processes": 1,
            "index": index,
            "siblings": [],
        }
        self.send(index, "share", **{**base, **fields})

    async def release(
        self, index: int, device: str, token: str = "", proven: bool = False
    ) -> Message:
        """Ask worker ``index`` to release ``device``; its ``released`` answer."""
        release_id = next(self._ids)
        future: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self._answers[release_id] = future
        self.send(index, "release", id=release_id, device=device, token=token, proven=proven)
        return await asyncio.wait_for(future, TIMEOUT)

    def drop(self, index: int) -> None:
        """Close worker ``index``'s channel (as a supervisor that died)."""
        self.workers[index].writer.close()

    async def next_message(self, index: int, kind: str, timeout: float = TIMEOUT) -> Message:  # noqa: ASYNC109
        inbox = self.workers[index].inbox
        while True:
            msg = await asyncio.wait_for(inbox.get(), timeout)
            if msg.kind == kind:
                return msg

    # -- inside ------------------------------------------------------------------------------
    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        peer = WorkerPeer(reader, writer)
        try:
            while line := await reader.readline():
                msg = podcontrol.decode(line, expect=KINDS_TO_SUPERVISOR)
                if msg.kind == "up":
                    peer.index, peer.up = msg["index"], msg
                    self.workers[msg["index"]] = peer
                    async with self._ups:
                        self._ups.notify_all()
                elif msg.kind == "claim":
                    claim = asyncio.create_task(self._claim(peer, msg))
                    self._tasks.add(claim)
                    claim.add_done_callback(self._tasks.discard)
                elif msg.kind == "released" and msg["id"] in self._answers:
                    future = self._answers.pop(msg["id"])
                    if not future.done():
                        future.set_result(msg)
                else:
                    peer.inbox.put_nowait(msg)
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self._tasks.discard(task)
            writer.close()
            if peer.index is not None and self.workers.get(peer.index) is peer:
                del self.workers[peer.index]
                for device in [d for d, i in self.owner.items() if i == peer.index]:
                    del self.owner[device]

    async def _claim(self, peer: WorkerPeer, msg: Message) -> None:
        device, index = msg["device"], peer.index
        answer = self.answers.get(device, "table")
        if answer == "silent":
            self.claims.append((index, device, False))
            return
        delivered: dict[str, int] = dict(self.grant_delivered.get(device, {}))
        granted = answer == "grant"
        reason = "refused by the test" if answer == "refuse" else ""
        if answer == "table":
            owner = self.owner.get(device)
            granted = owner is None or owner == index or owner not in self.workers
            if not granted:
                assert owner is not None
                release = Release(owner, device)
                self.releases.append(release)
                loop = asyncio.get_running_loop()
                began = loop.time()
                with contextlib.suppress(TimeoutError):
                    release.answer = await self.release(owner, device, msg["token"], msg["proven"])
                release.seconds = loop.time() - began
                granted = release.answer is None or bool(release.answer["ok"])
                if release.answer is not None:
                    delivered = dict(release.answer["delivered"]) if granted else {}
                    reason = release.answer["reason"]
        if granted and index is not None:
            self.owner[device] = index
        self.claims.append((index, device, granted))
        peer.send(
            "claimed", id=msg["id"], granted=granted, reason=reason, delivered=delivered, epoch=1
        )
