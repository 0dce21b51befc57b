"""``pip install simbridge`` is the server only: the load generator's libraries are an extra, and
a bridge starts and stops with them missing."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LOADGEN_ONLY = ("matplotlib", "rich", "jsonschema")

# Runs in a child: the loadgen-only packages cannot be imported there; every bridge module is
# imported and a real bridge starts on free ports and closes.
_CHILD = """
import asyncio, importlib, importlib.abc, pkgutil, sys

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ImportError("blocked: " + name)
        return None

sys.meta_path.insert(0, Block())
import bridge
skip = {{"bridge.decimate.bench", "bridge.decimate._sbv_cuda"}}  # a benchmark; a ctypes library
for info in pkgutil.walk_packages(bridge.__path__, "bridge."):
    if info.name not in skip and not info.name.endswith("__main__"):
        importlib.import_module(info.name)
from bridge.server.app import BridgeService
from bridge.config.settings import Settings

async def main():
    service = BridgeService(Settings(host="127.0.0.1", ws_port=0, grpc_port=0, http_port=0,
                                     adapt=False, workers=1))
    await service.start()
    await service.close()

asyncio.run(main())
print("ok")
"""


def test_runtime_dependencies_exclude_the_load_generator() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {re.split(r"[<>=!;\[ ]", d, maxsplit=1)[0] for d in project["dependencies"]}
    assert not names & set(LOADGEN_ONLY)
    extras = project["optional-dependencies"]
    loadgen = {re.split(r"[<>=!;\[ ]", d, maxsplit=1)[0] for d in extras["loadgen"]}
    assert loadgen >= set(LOADGEN_ONLY)
    assert any(d.startswith("nvidia-ml-py") for d in extras["gpu"])
    assert {"test", "dev"} <= set(extras)
    install = re.search(r"pip install -q -e '\.\[([^\]]*)\]'", (ROOT / "Makefile").read_text())
    assert install is not None
    assert set(install.group(1).split(",")) >= {"test", "dev", "loadgen", "gpu"}


def test_a_bridge_runs_without_the_load_generator_libraries() -> None:
    code = _CHILD.format(blocked=set(LOADGEN_ONLY))
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("ok")
