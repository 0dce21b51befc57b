"""The bridge under test in ``make bench-scale``: one real pod, ``simbridge serve --processes N``
(the supervisor, :mod:`bridge.pod`), as a user runs it. The ingest processes are the
supervisor's children; their pids come from the pod's own ``/debug/resources`` (``workers``), so
the benchmark measures what the supervisor started, not processes of its own.

N = 1 is ``--processes max:1``: the supervisor with one ingest process (``--processes 1`` is a
single bridge without a supervisor: no claims). That plain bridge is kept as the reference of
the Hello→Welcome loop only (:class:`PodGroup` with ``plain=True``), where it shows what the
claim adds to a session's setup.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.relay.cli import ServerProcess, bridge_process

VOXEL = 0.2
START_TIMEOUT = 120.0  # eight interpreters importing gRPC and NumPy on two busy cores


def processes_flag(procs: int) -> str:
    """``--processes`` for a pod of ``procs`` ingest processes (1 would be no pod at all)."""
    return "max:1" if procs == 1 else str(procs)


def cpu_list(cpus: Sequence[int]) -> str:
    return ",".join(str(c) for c in sorted(cpus))


def pin_threads(pid: int, cpus: Sequence[int]) -> None:
    """Every thread of ``pid`` onto ``cpus`` (threads started later inherit it)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        os.sched_setaffinity(int(task.name), cpus)


async def http_get(port: int, path: str, timeout: float = 5.0) -> tuple[int, str]:  # noqa: ASYNC109
    """(status, body) of a GET on 127.0.0.1:``port``; (0, reason) when it does not answer."""
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(f"GET {path} HTTP/1.0\r\nHost: bench\r\n\r\n".encode())
            raw = await reader.read()
            writer.close()
    except (OSError, TimeoutError) as exc:
        return 0, f"{type(exc).__name__}: {exc}"
    head, _, body = raw.partition(b"\r\n\r\n")
    try:
        status = int(head.split(b" ", 2)[1])
    except (IndexError, ValueError):
        status = 0
    return status, body.decode(errors="replace")


class PodGroup:
    """One pod pushing to ``sink``, pinned to ``cpus`` (``taskset`` on the supervisor: its
    children inherit it; else ``sched_setaffinity`` on every thread after the start)."""

    def __init__(
        self,
        sink: Any,
        procs: int,
        workers: int,
        cpus: Sequence[int],
        *,
        plain: bool = False,
    ) -> None:
        self.sink = sink
        self.procs = procs
        self.workers = workers
        self.cpus = sorted(cpus)
        self.plain = plain
        args = [
            *("--no-passthrough", "--voxel-size", str(VOXEL)),
            *("--workers", str(workers)),
            *("--processes", "1" if plain else processes_flag(procs)),
        ]
        self.server: ServerProcess = bridge_process(sink.address, args)
        taskset = shutil.which("taskset")
        self._pin_after = taskset is None
        if taskset is not None:
            self.server.cmd = [taskset, "-c", cpu_list(self.cpus), *self.server.cmd]
        self.resources: dict[str, Any] = {}
        self.pids: list[int] = []  # the ingest processes, by slot

    @property
    def command(self) -> list[str]:
        return self.server.cmd

    @property
    def supervisor_pid(self) -> int | None:
        """The process we started: the supervisor (None for the plain single bridge)."""
        if self.plain or self.server.child is None:
            return None
        return self.server.child.proc.pid

    @property
    def http_port(self) -> int:
        return self.server.ports["http"]

    def address(self, transport: str) -> str:
        return f"127.0.0.1:{self.server.ports[transport]}"

    async def __aenter__(self) -> PodGroup:
        before = self.sink.bridge_streams
        try:
            await self.server.spawn()
            assert self.server.child is not None
            await self.server.child.wait_ready(timeout=START_TIMEOUT)
            if self.plain:
                self.pids = [self.server.child.proc.pid]
            else:
                await self._find_processes()
            if self._pin_after:
                for pid in [*self.pids, *filter(None, [self.supervisor_pid])]:
                    pin_threads(pid, self.cpus)
            deadline = time.monotonic() + 30
            while self.sink.bridge_streams < before + self.procs:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"{self.sink.bridge_streams - before} of {self.procs} ingest processes "
                        "connected to the sink in 30 s"
                    )
                await asyncio.sleep(0.02)
        except BaseException:
            await self.server.stop()
            raise
        return self

    async def _find_processes(self) -> None:
        """The ingest processes' pids from the pod's /debug/resources: all N up, or an error."""
        deadline = time.monotonic() + 30
        while True:
            status, body = await http_get(self.http_port, "/debug/resources")
            if status == 200:
                self.resources = json.loads(body)
                up = [w for w in self.resources.get("workers", []) if w.get("state") == "up"]
                if len(up) == self.procs and all(w.get("pid") for w in up):
                    self.pids = [int(w["pid"]) for w in sorted(up, key=lambda w: w["index"])]
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the pod did not report {self.procs} ingest processes up in 30 s "
                    f"(/debug/resources: {status} {body[:400]})"
                )
            await asyncio.sleep(0.1)

    async def check_processes(self) -> list[str]:
        """Errors when the pod no longer runs the processes measured (a restart, a retirement):
        a row whose pids changed under it measured something else."""
        if self.plain:
            return []
        status, body = await http_get(self.http_port, "/debug/resources")
        if status != 200:
            return [f"/debug/resources answered {status}: {body[:200]}"]
        workers = json.loads(body).get("workers", [])
        now = [int(w["pid"]) for w in sorted(workers, key=lambda w: w["index"]) if w["pid"]]
        if now != self.pids or any(w.get("restarts") for w in workers):
            return [f"the pod's processes changed during the cell: {self.pids} -> {now}"]
        return []

    def plan_reason(self) -> str:
        plan = self.resources.get("plan") or {}
        return str((plan.get("reasons") or {}).get("processes", ""))

    async def __aexit__(self, *_exc: object) -> None:
        await self.server.stop()

    @property
    def exit_code(self) -> int | None:
        return self.server.child.returncode if self.server.child is not None else None
