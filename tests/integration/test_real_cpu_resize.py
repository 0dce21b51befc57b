"""A real CPU resize: the bridge runs in its own cgroup (v1 cpu controller, as root), its quota is
changed live under load, it re-plans its workers and keeps every connection and frame."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from pathlib import Path

import pytest

from loadgen.clouds import synthetic
from loadgen.edge import EdgeClient, StreamConfig
from loadgen.sink import SinkServer
from tests.integration.harness import BridgeProcess, http_get

CPU_V1 = Path("/sys/fs/cgroup/cpu")


def writable_cpu_controller() -> Path | None:
    if os.geteuid() != 0 or not (CPU_V1 / "cpu.cfs_quota_us").exists():
        return None
    return CPU_V1 if os.access(CPU_V1, os.W_OK) else None


@pytest.mark.cgroup
async def test_quota_change_under_load_replans_workers_and_keeps_everything(
    tmp_path: Path,
) -> None:
    base = writable_cpu_controller()
    if base is None:
        pytest.skip("needs root and a writable cgroup v1 cpu controller at /sys/fs/cgroup/cpu")
    group = base / f"simbridge-resize-{os.getpid()}"
    group.mkdir()
    (group / "cpu.cfs_period_us").write_text("100000")
    (group / "cpu.cfs_quota_us").write_text("200000")
    bridge: BridgeProcess | None = None
    try:
        async with SinkServer(fsync=False) as sink:
            bridge = await BridgeProcess.start(
                "--sink-address", sink.address, "--voxel-size", "0.2",
                "--cgroup-poll-seconds", "0.05", env={"BRIDGE_ADAPT": "true"}, cgroup=group,
            )  # fmt: skip
            proc = bridge

            async def workers() -> int:
                _, body = await http_get(proc.http, "/debug/resources")
                return int(json.loads(body)["workers"])

            async def workers_become(n: int) -> bool:
                for _ in range(200):
                    if await workers() == n:
                        return True
                    await asyncio.sleep(0.02)
                return False

            cpus = len(os.sched_getaffinity(0))
            assert await workers_become(min(2, cpus))
            edges = [
                EdgeClient("ws", bridge.ws_url, "ws-edge", [StreamConfig("lidar")]),
                EdgeClient(
                    "grpc", f"127.0.0.1:{bridge.grpc}", "grpc-edge", [StreamConfig("lidar")]
                ),
            ]
            for edge in edges:
                await edge.start()
            cloud = synthetic(20_000).to_proto()
            stop = asyncio.Event()

            async def publish() -> None:
                while not stop.is_set():
                    for edge in edges:
                        await edge.publish("lidar", cloud)
                    await asyncio.sleep(0.05)

            load = asyncio.create_task(publish())
            await asyncio.sleep(0.5)
            (group / "cpu.cfs_quota_us").write_text("50000")  # 0.5 CPU: really throttled
            assert await workers_become(1)
            await asyncio.sleep(1.0)
            (group / "cpu.cfs_quota_us").write_text("150000")
            assert await workers_become(min(2, cpus))
            await asyncio.sleep(0.5)
            stop.set()
            await load
            for edge in edges:
                assert await edge.wait_delivered(30), edge.stats.as_dict()
                assert edge.stats.disconnects == 0 and edge.stats.reconnects == 0
            published = sum(e.stats.published for e in edges)
            totals = sink.record.totals()
            assert totals["delivered"] == published > 0
            assert totals["lost"] == totals["duplicates"] == 0
            for edge in edges:
                await edge.close()
            bridge.signal(signal.SIGTERM)
            assert await bridge.wait() == 0
    finally:
        if bridge is not None:
            bridge.kill()
        for _ in range(100):  # the kernel drops the exited task from the group shortly
            with contextlib.suppress(OSError):
                group.rmdir()
                break
            await asyncio.sleep(0.05)
