"""The bridge under test as a child process, and reading its applied plan.

Why apart from the runner: starting, stopping and asking the bridge what it planned is the same for
an in-place run and a restart; the launching itself is :mod:`loadgen.launch`'s (shared with the
tests and the relay bench).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from pathlib import Path
from typing import Any

from loadgen.launch import ChildProcess, serve_command


class BridgeChild:
    """``python -m bridge.cli serve`` with its stderr in a log file; ports from its READY line."""

    def __init__(self, child: ChildProcess) -> None:
        self.child = child
        self.ws, self.grpc, self.http = child.port("ws"), child.port("grpc"), child.port("http")

    @classmethod
    async def start(
        cls, env: dict[str, str], log_path: Path, ports: tuple[int, int, int] = (0, 0, 0)
    ) -> BridgeChild:
        cmd = serve_command(
            *("--ws-port", str(ports[0]), "--grpc-port", str(ports[1])),
            *("--http-port", str(ports[2])),
        )
        # new session: a Ctrl-C at the console reaches the runner, which then stops the bridge
        child = await ChildProcess.start(
            cmd, env=env, log_path=log_path, timeout=60, new_session=True
        )
        return cls(child)

    @property
    def pid(self) -> int:
        return self.child.pid

    @property
    def ports(self) -> tuple[int, int, int]:
        return self.ws, self.grpc, self.http

    async def stop(self, timeout: float = 30.0) -> int:  # noqa: ASYNC109
        """SIGTERM (drain, then exit 0); SIGKILL if it does not exit within ``timeout``."""
        return await self.child.stop(timeout)

    def kill(self) -> None:
        self.child.kill()

    def url(self, transport: str) -> str:
        """The ingest address of ``transport`` (``ws`` or ``grpc``)."""
        if transport == "ws":
            return f"ws://127.0.0.1:{self.ws}/v1/ingest"
        return f"127.0.0.1:{self.grpc}"

    async def resources(self) -> dict[str, Any]:
        """GET /debug/resources (the applied plan and where each value came from)."""
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection("127.0.0.1", self.http), 2.0
        )
        try:
            writer.write(b"GET /debug/resources HTTP/1.1\r\nHost: bridge\r\n\r\n")
            await writer.drain()
            raw = await asyncio.wait_for(reader.read(), 2.0)
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
        body = raw.split(b"\r\n\r\n", 1)[1]
        data: dict[str, Any] = json.loads(body)
        return data


def plan_of(resources: dict[str, Any]) -> dict[str, Any]:
    """The applied plan's values (``{"workers": 2, ...}``) from a /debug/resources body."""
    plan = (resources.get("adapter") or {}).get("plan") or {}
    return {k: v["value"] for k, v in plan.items() if isinstance(v, dict) and "value" in v}


def plan_matches(plan: dict[str, Any], cpu: float | None, memory: int | None) -> bool:
    if cpu is not None:
        have = plan.get("cpu_limit_cores")
        if have is None or abs(have - cpu) > 1e-6:
            return False
    return memory is None or plan.get("memory_limit_bytes") == memory


async def wait_adapted(
    bridge: BridgeChild,
    cpu: float | None,
    memory: int | None,
    timeout: float,  # noqa: ASYNC109
) -> tuple[int | None, dict[str, Any]]:
    """Poll /debug/resources every 20 ms until the applied plan shows the limits; return the
    wall time (ns) it was first seen and the plan (None and the last plan on timeout)."""
    deadline = time.monotonic() + timeout
    plan: dict[str, Any] = {}
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, TimeoutError, ValueError, IndexError):
            plan = plan_of(await bridge.resources())
            if plan_matches(plan, cpu, memory):
                return time.time_ns(), plan
        await asyncio.sleep(0.02)
    return None, plan
