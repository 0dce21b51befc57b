"""``simbridge view`` as a real child process, for the view's integration tests."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import urllib.request
from dataclasses import dataclass
from typing import IO, Any

from tests.integration.harness import ROOT


@dataclass
class ViewProcess:
    proc: subprocess.Popen[str]
    grpc: int
    foxglove: int
    web: int
    log: IO[str]

    @classmethod
    async def start(cls, *args: str) -> ViewProcess:
        cmd = [sys.executable, "-m", "bridge.cli", "view", "--listen", "127.0.0.1:0", *args]
        log = tempfile.NamedTemporaryFile("w+", prefix="simbridge-view-", suffix=".log")  # noqa: SIM115
        proc = subprocess.Popen(  # noqa: ASYNC220  (spawning does not block; reads go to threads)
            cmd, stdout=subprocess.PIPE, stderr=log, text=True, env=dict(os.environ), cwd=ROOT
        )
        assert proc.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 30)
        if not line.startswith("SIMBRIDGE_VIEW_READY"):
            proc.kill()
            proc.wait()
            log.seek(0)
            raise RuntimeError(f"view did not start: {line!r}\n{log.read()}")
        ports = dict(kv.split("=") for kv in line.split()[1:])
        return cls(proc, int(ports["grpc"]), int(ports["foxglove"]), int(ports["web"]), log)

    @property
    def sink_address(self) -> str:
        return f"127.0.0.1:{self.grpc}"

    async def status(self) -> dict[str, Any]:
        url = f"http://127.0.0.1:{self.web}/api/status"

        def get() -> dict[str, Any]:
            with urllib.request.urlopen(url, timeout=5) as r:
                return json.loads(r.read())  # type: ignore[no-any-return]

        return await asyncio.to_thread(get)

    async def stop(self, sig: signal.Signals = signal.SIGTERM) -> int:
        self.proc.send_signal(sig)
        return await asyncio.wait_for(asyncio.to_thread(self.proc.wait), 30)

    def logs(self) -> str:
        self.log.seek(0)
        return self.log.read()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None and not self.proc.stdout.closed:
            self.proc.stdout.close()
        if not self.log.closed:
            self.log.close()
