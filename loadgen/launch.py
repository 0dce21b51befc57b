"""Servers as child processes: start, wait for the ready line, stop cleanly, kill on timeout.

Why one module: ``simbridge serve`` (and the relay bench's raw relays) announce readiness with one
stdout line, ``SIMBRIDGE_READY ws=PORT grpc=PORT http=PORT`` (or one JSON object with
``"msg": "SIMBRIDGE_READY"`` under ``--log-format json``), after binding port 0. The loadgen
runner, the integration-test harness and the relay bench all need the same dance around it, and
the failure paths (no line before the deadline, the child dies, SIGTERM ignored) are where copies
drift. Standard library only, so tests and benchmarks import it without the loadgen extras.

The child's stderr goes to a log file (``log_path``, appended to) or to an anonymous temporary
file; :meth:`ChildProcess.logs` returns its tail for error messages. The stdout pipe is kept open
and not read after the ready line (the servers print nothing else there).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

READY = "SIMBRIDGE_READY"


def serve_command(*args: str, host: str = "127.0.0.1", processes: str = "1") -> list[str]:
    """``python -m bridge.cli serve --host HOST --processes P ARGS`` with this interpreter.

    One process unless asked (``processes``, or a ``--processes`` in ``ARGS``, which comes
    later and wins): the runner, the benchmarks and the tests that launch through here measure
    or drive one bridge process; ``serve``'s own default (auto) runs a pod of several on a
    machine with several cores (docs/scaling.md), which they ask for explicitly."""
    return [
        *(sys.executable, "-m", "bridge.cli", "serve", "--host", host),
        f"--processes={processes}",
        *args,
    ]


def parse_ready(line: str, prefix: str = READY) -> dict[str, int] | None:
    """The ports of a ready line; ``None`` when ``line`` is not one. Plain form:
    ``PREFIX key=port ...``; JSON form (``serve --log-format json``): one object with
    ``"msg": PREFIX`` and the ports as integer members."""
    if line.lstrip().startswith("{"):
        try:
            entry = json.loads(line)
        except ValueError:
            return None
        if not isinstance(entry, dict) or entry.get("msg") != prefix:
            return None
        return {k: v for k, v in entry.items() if isinstance(v, int) and not isinstance(v, bool)}
    words = line.split()
    if not words or words[0] != prefix:
        return None
    ports: dict[str, int] = {}
    for word in words[1:]:
        key, sep, value = word.partition("=")
        if sep and value.isdigit():
            ports[key] = int(value)
    return ports


class ChildProcess:
    """One server child process (see the module docstring). Start with :meth:`start`."""

    def __init__(
        self, name: str, proc: subprocess.Popen[str], log: IO[bytes], log_path: Path | None
    ) -> None:
        self.name = name
        self.proc = proc
        self.log = log
        self.log_path = log_path
        self.ports: dict[str, int] = {}

    @classmethod
    def spawn(
        cls,
        cmd: Sequence[str],
        *,
        name: str = "bridge",
        env: Mapping[str, str] | None = None,
        cwd: Path | str | None = None,
        log_path: Path | None = None,
        new_session: bool = False,
    ) -> ChildProcess:
        """Start ``cmd`` (``env`` over this process's environment) without waiting for it; call
        :meth:`wait_ready` next. Apart from :meth:`start` for callers that must fork before they
        start threads of their own (gRPC's fork handlers). ``new_session``: a Ctrl-C at the
        console reaches this process only (the caller decides when the child stops)."""
        # closed by stop()/kill()
        log: IO[bytes] = tempfile.TemporaryFile() if log_path is None else log_path.open("ab")  # noqa: SIM115
        try:
            proc = subprocess.Popen(
                list(cmd),
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                env={**os.environ, **(env or {})},
                cwd=cwd,
                start_new_session=new_session,
            )
        except BaseException:
            log.close()
            raise
        return cls(name, proc, log, log_path)

    async def wait_ready(self, ready: str = READY, timeout: float = 60.0) -> dict[str, int]:  # noqa: ASYNC109
        """Read the ready line within ``timeout`` seconds and keep its ports. On failure the
        child is killed and the error carries the line it printed instead and its log's tail."""
        assert self.proc.stdout is not None
        try:
            line = await asyncio.wait_for(asyncio.to_thread(self.proc.stdout.readline), timeout)
        except TimeoutError:
            line = f"(no ready line within {timeout:g} s)"
        except BaseException:
            self.kill()
            raise
        ports = parse_ready(line, ready)
        if ports is None:
            where = f"; log: {self.log_path}" if self.log_path is not None else ""
            logs = self.logs()  # read before kill() closes the log
            self.kill()
            raise RuntimeError(f"{self.name} did not start: {line.strip()!r}{where}\n{logs}")
        self.ports = ports
        return ports

    @classmethod
    async def start(
        cls,
        cmd: Sequence[str],
        *,
        name: str = "bridge",
        ready: str = READY,
        env: Mapping[str, str] | None = None,
        cwd: Path | str | None = None,
        log_path: Path | None = None,
        timeout: float = 60.0,  # noqa: ASYNC109
        new_session: bool = False,
    ) -> ChildProcess:
        """:meth:`spawn`, then :meth:`wait_ready`."""
        child = cls.spawn(
            cmd, name=name, env=env, cwd=cwd, log_path=log_path, new_session=new_session
        )
        await child.wait_ready(ready, timeout)
        return child

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        return self.proc.poll()

    def port(self, key: str) -> int:
        """A port from the ready line (``ws``, ``grpc``, ``http``, ``port``)."""
        try:
            return self.ports[key]
        except KeyError:
            raise KeyError(f"{self.name}'s ready line has no {key}= (got {self.ports})") from None

    def signal(self, sig: signal.Signals) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    async def wait(self, timeout: float = 30.0) -> int:  # noqa: ASYNC109
        """The exit status; ``TimeoutError`` if the child still runs after ``timeout``."""
        return await asyncio.wait_for(asyncio.to_thread(self.proc.wait), timeout)

    async def stop(self, timeout: float = 30.0) -> int:  # noqa: ASYNC109
        """SIGTERM (a bridge drains, then exits 0); SIGKILL if it has not exited within
        ``timeout``. Returns the exit status (negative: the signal that ended it)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await self.wait(timeout)
            except TimeoutError:
                self.kill()
        self.close_files()
        return self.proc.wait()

    def kill(self) -> None:
        """SIGKILL if still running, reap it, release the pipe and the log (idempotent)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.close_files()

    def close_files(self) -> None:
        if self.proc.stdout is not None and not self.proc.stdout.closed:
            self.proc.stdout.close()
        if not self.log.closed:
            self.log.close()

    def logs(self, tail: int = 4000) -> str:
        """The last ``tail`` characters the child wrote to stderr."""
        if self.log_path is not None:
            try:
                data = self.log_path.read_bytes()
            except OSError:
                return ""
        elif self.log.closed:
            return ""
        else:
            self.log.flush()
            self.log.seek(0)
            data = self.log.read()
            self.log.seek(0, os.SEEK_END)
        return data.decode(errors="replace")[-tail:]

    def cpu_seconds(self) -> float:
        """User + system CPU time of the child (all threads) from ``/proc/PID/stat``; NaN once
        it is gone or where there is no /proc."""
        try:
            stat = Path(f"/proc/{self.proc.pid}/stat").read_text()
        except OSError:
            return float("nan")
        fields = stat.rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
