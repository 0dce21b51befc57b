"""The bridge's lightkube client against real HTTP: the Kubernetes stand-in, a server that answers
a watch with 410 Gone, a port where nothing listens; and lightkube stays unimported without a
cluster."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from bridge.resources.kubeapi import KubeConfig, KubeError
from bridge.resources.kubelight import connect
from bridge.resources.podsource import PodSource, PodUpdate
from loadgen.kubesim import KubeSim
from tests.integration.harness import ROOT

FIXTURES = ROOT / "tests" / "fixtures" / "k8s"


def load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / name).read_text())
    return data


@pytest.fixture
async def sim(tmp_path: Path) -> AsyncIterator[KubeSim]:
    s = KubeSim(
        load("pod-resize-done-v1.36-health.json"),
        claims=[load("resourceclaim-allocated.json")],
        slices=[load("resourceslice-h100-nvidia-static-mig.json")],
        cgroup_dir=str(tmp_path / "cg"),
        sync_interval=0.02,
    )
    await s.start()
    yield s
    await s.stop()


async def test_pod_claims_and_slices_through_lightkube(sim: KubeSim) -> None:
    api = connect(KubeConfig(sim.url), timeout=5)
    try:
        pod = await api.get_pod("sim", "sim-bridge-0")
        assert pod["metadata"]["name"] == "sim-bridge-0"
        statuses = pod["status"]["containerStatuses"][0]
        assert statuses["allocatedResourcesStatus"], "1.36 fields survive the typed models"
        updates: list[PodUpdate] = []
        source = PodSource(api, "sim", "sim-bridge-0", updates.append)
        update = await source.fetch_once()
        assert update.devices and update.devices[0].uuid, update.problems
        assert not source.problems
        with pytest.raises(KubeError) as err:
            await api.get_pod("sim", "no-such-pod")
        assert err.value.status == 404
        await api.create_event(
            "sim",
            {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"name": "sim-bridge-0.test", "namespace": "sim"},
                "involvedObject": {"kind": "Pod", "name": "sim-bridge-0", "namespace": "sim"},
                "reason": "Test",
                "message": "hello",
                "type": "Normal",
            },
        )
        assert sim.events[-1]["reason"] == "Test"
    finally:
        await api.close()


async def test_unreachable_api_is_a_kube_error(free_port: int) -> None:
    api = connect(KubeConfig(f"http://127.0.0.1:{free_port}"), timeout=2)
    try:
        with pytest.raises(KubeError) as err:
            await api.get_pod("sim", "x")
        assert err.value.status == 0
    finally:
        await api.close()


async def _gone_server(pod: dict[str, Any]) -> tuple[asyncio.Server, list[str]]:
    """GET answers the Pod; a watch answers one ERROR event 410 Gone (resourceVersion too old)."""
    seen: list[str] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while line := await reader.readline():
            target = line.decode().split(" ")[1]
            while (await reader.readline()) not in (b"\r\n", b""):
                pass
            seen.append(target)
            if "watch=" in target:
                status = {"kind": "Status", "apiVersion": "v1", "status": "Failure"}
                status |= {"code": 410, "reason": "Expired", "message": "too old resource version"}
                event = json.dumps({"type": "ERROR", "object": status}).encode() + b"\n"
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    b"Transfer-Encoding: chunked\r\n\r\n"
                    + f"{len(event):x}\r\n".encode()
                    + event
                    + b"\r\n0\r\n\r\n"
                )
            else:
                body = json.dumps(pod).encode()
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    + f"Content-Length: {len(body)}\r\n\r\n".encode()
                    + body
                )
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, seen


async def test_watch_410_gone_makes_the_source_relist() -> None:
    pod = load("pod-running-initial.json")
    server, seen = await _gone_server(pod)
    port = server.sockets[0].getsockname()[1]
    api = connect(KubeConfig(f"http://127.0.0.1:{port}"), timeout=5)
    try:
        with pytest.raises(KubeError) as err:
            async for _ in api.watch_pod("sim", "sim-bridge-0", "1"):
                pass
        assert err.value.status == 410
        # The source turns that into a fresh GET (a re-list) and a new watch.
        updates: list[PodUpdate] = []
        source = PodSource(api, "sim", "sim-bridge-0", updates.append, backoff_max=0.05)
        task = asyncio.create_task(source.run())
        try:
            for _ in range(200):
                if len(updates) >= 2:
                    break
                await asyncio.sleep(0.02)
        finally:
            task.cancel()
        assert len(updates) >= 2
        gets = [t for t in seen if "watch=" not in t]
        assert len(gets) >= 3  # one per (re)list: the first, and after each 410
    finally:
        await api.close()
        server.close()


def test_lightkube_is_not_imported_without_a_cluster(tmp_path: Path) -> None:
    script = (
        "import sys, os\n"
        "from bridge.resources.cli import collect\n"
        "from bridge.resources.adapt import Adapter\n"
        "from bridge.config.settings import load\n"
        "data = collect(load(env={'BRIDGE_CGROUP_ROOT': sys.argv[1]}))\n"
        "assert data['pod_source']['configured'] is False\n"
        "print([m for m in ('lightkube', 'httpx2') if m in sys.modules])\n"
    )
    root = ROOT / "tests" / "fixtures" / "cgroups" / "v2-set" / "sys" / "fs" / "cgroup"
    proc = subprocess.run(
        [sys.executable, "-c", script, str(root)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
