"""What the README tells a new user works as written: its "Connect a device" snippet, pasted into
a file, runs against a real bridge, and its claim about a repeated seq is what the bridge does."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from pathlib import Path

import websockets

from bridge.v1 import bridge_pb2 as pb
from tests.integration.harness import ROOT, cloud_frame, hello, running_bridge, ws_url

README = ROOT / "README.md"
TOKEN = "readme-token"


def readme_section(title: str) -> str:
    text = README.read_text()
    start = text.index(f"\n## {title}\n")
    return text[start : text.index("\n## ", start + 1)]


def connect_snippet() -> str:
    """The first ```python block of "Connect a device", as a user would paste it."""
    found = re.search(r"```python\n(.*?)```", readme_section("Connect a device"), re.S)
    assert found, "README 'Connect a device' has no python block"
    return found.group(1)


def pointed_at(snippet: str, url: str, token: str) -> str:
    """The snippet with its URL and TOKEN settings (one line each) changed, nothing else."""
    for name, value in (("URL", url), ("TOKEN", token)):
        snippet, n = re.subn(rf"^{name} = .*$", f"{name} = {value!r}", snippet, flags=re.M)
        assert n == 1, f"the snippet has no single '{name} = ...' line to set"
    return snippet


async def test_connect_a_device_snippet_runs_as_pasted(tmp_path: Path) -> None:
    async with running_bridge(auth_token=TOKEN) as service:
        script = tmp_path / "edge.py"
        script.write_text(pointed_at(connect_snippet(), ws_url(service), TOKEN))
        done = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, str(script)],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        assert done.returncode == 0, done.stderr[-2000:]
        # Both frames (one cloud, one telemetry) were reported delivered to the snippet.
        assert done.stdout.split() == ["delivered", "2"], done.stdout


async def test_readme_says_what_a_repeated_seq_on_one_connection_gets() -> None:
    """The README's sentence names the code the bridge really sends for the same seq twice."""
    async with running_bridge() as service, websockets.connect(ws_url(service)) as ws:
        await ws.send(hello("dev-1", "lidar").SerializeToString())
        assert pb.BridgeMessage.FromString(await ws.recv()).HasField("welcome")
        frame = cloud_frame("lidar", 1)
        for _ in range(2):
            await ws.send(pb.EdgeMessage(frame=frame).SerializeToString())
        async with asyncio.timeout(5):
            while not (msg := pb.BridgeMessage.FromString(await ws.recv())).HasField("error"):
                pass
    code = pb.ErrorCode.Name(msg.error.code)
    assert (code, msg.error.fatal) == ("SEQ_REGRESSION", False)
    sessions = README.read_text().split("**Sessions.**", 1)[1].split("\n\n", 1)[0]
    assert f"non-fatal `{code}`" in sessions and "acked,\nnot stored again" not in sessions
