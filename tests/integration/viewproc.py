"""``simbridge view`` as a real child process, and a headless Chromium to look at its page, for
the view's integration tests."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import AsyncIterator
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


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


class Browser:
    """Headless Chromium driven over the DevTools protocol (a WebSocket): open the view's page
    at a given window size, evaluate JavaScript in it, click, take screenshots."""

    def __init__(self, proc: subprocess.Popen[bytes], ws: Any, profile: str) -> None:
        self.proc, self.ws, self.profile = proc, ws, profile
        self.session = ""
        self._next = 0

    @classmethod
    @contextlib.asynccontextmanager
    async def open(cls, url: str, width: int, height: int) -> AsyncIterator[Browser]:
        assert CHROMIUM is not None, "chromium not installed"
        from websockets.asyncio.client import connect

        profile = tempfile.mkdtemp(prefix="simbridge-chromium-")
        errlog = os.path.join(profile, "stderr.log")
        with open(errlog, "w") as err:  # noqa: ASYNC230  (a file, not a pipe: never blocks)
            proc = subprocess.Popen(  # noqa: ASYNC220  (spawning does not block)
                [CHROMIUM, "--headless=new", "--no-sandbox", "--use-angle=swiftshader",
                 "--enable-unsafe-swiftshader", "--disable-gpu-sandbox", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", f"--user-data-dir={profile}", "--remote-debugging-port=0",
                 "about:blank"],
                stderr=err, stdout=subprocess.DEVNULL,
            )  # fmt: skip
        try:
            devtools = ""
            deadline = time.monotonic() + 30
            while not devtools:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("chromium: no DevTools endpoint")
                await asyncio.sleep(0.05)
                with open(errlog) as f:  # noqa: ASYNC230  (a small local file)
                    for line in f:
                        devtools = devtools or line.partition("DevTools listening on ")[2].strip()
            async with connect(devtools, max_size=None) as ws:
                b = cls(proc, ws, profile)
                target = (await b.call("Target.createTarget", url="about:blank"))["targetId"]
                b.session = (await b.call("Target.attachToTarget", targetId=target, flatten=True))[
                    "sessionId"
                ]
                await b.resize(width, height)
                await b.call("Page.navigate", url=url)
                yield b
        finally:
            proc.kill()
            await asyncio.to_thread(proc.wait)
            shutil.rmtree(profile, ignore_errors=True)

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        self._next += 1
        msg: dict[str, Any] = {"id": self._next, "method": method, "params": params}
        if self.session:
            msg["sessionId"] = self.session
        await self.ws.send(json.dumps(msg))
        while True:
            reply = json.loads(await asyncio.wait_for(self.ws.recv(), 30))
            if reply.get("id") == self._next:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]  # type: ignore[no-any-return]

    async def resize(self, width: int, height: int) -> None:
        await self.call(
            "Emulation.setDeviceMetricsOverride",
            width=width, height=height, deviceScaleFactor=1, mobile=False,
        )  # fmt: skip

    async def js(self, expression: str) -> Any:
        result = await self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def wait_js(self, expression: str, timeout: float = 15.0) -> Any:  # noqa: ASYNC109
        """Poll ``expression`` until it is truthy; returns its value (or the last one)."""
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(RuntimeError):  # the page may still be loading
                value = await self.js(expression)
                if value or time.monotonic() > deadline:
                    return value
            if time.monotonic() > deadline:
                return None
            await asyncio.sleep(0.05)

    async def screenshot(self) -> bytes:
        return base64.b64decode((await self.call("Page.captureScreenshot", format="png"))["data"])
