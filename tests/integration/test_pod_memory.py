"""One memory budget for the pod (issue 31): with hostile edges flooding both processes of a real
``simbridge serve --processes 2`` (edges that ignore PAUSE, the sink down, then up), the sum of
every process's RSS, the supervisor's included, stays within the memory limit the pod reads,
at every 20 ms sample, and a well-behaved edge alongside loses nothing.

The limit is an injected cgroup directory's ``memory.max`` (the kernel does not enforce it here;
the container e2e runs a pod under a real one). Summed VmRSS counts the interpreter's shared
file pages once per process, so it is above what a cgroup would charge: a conservative check.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np

from loadgen.edge import EdgeClient, StreamConfig
from loadgen.sink import SinkServer
from tests.integration.harness import BridgeProcess, rss, xyz_cloud
from tests.integration.test_memory_hostile import (
    FLOOD_SECONDS,
    MAX_FRAME,
    Received,
    grpc_flood,
    ws_flood,
)

MiB = 1 << 20
LIMIT = 640 * MiB  # two processes fit (the plan's 64 MiB reserve + 2 x 180 MiB at 4 MiB frames)


def pod_pids(root: int) -> list[int]:
    """The supervisor and every process under it."""
    pids, todo = [], [root]
    while todo:
        pid = todo.pop()
        pids.append(pid)
        try:
            with open(f"/proc/{pid}/task/{pid}/children") as f:
                todo += [int(p) for p in f.read().split()]
        except OSError:
            continue
    return pids


def pod_rss(root: int) -> tuple[int, int]:
    """(summed RSS, processes) of the pod now."""
    total, count = 0, 0
    for pid in pod_pids(root):
        try:
            total += rss(pid)
            count += 1
        except (OSError, RuntimeError):
            continue
    return total, count


async def test_flooded_pod_stays_within_its_memory_limit(free_port: int, tmp_path: Path) -> None:
    cg = tmp_path / "cg"
    cg.mkdir()
    (cg / "cpu.max").write_text("200000 100000\n")
    (cg / "memory.max").write_text(f"{LIMIT}\n")
    (cg / "memory.current").write_text("0\n")
    proc = await BridgeProcess.start(
        *("--processes=2", "--adapt", f"--cgroup-root={cg}", f"--max-frame-bytes={MAX_FRAME}"),
        *("--passthrough", "--sink-address", f"127.0.0.1:{free_port}"),
        *("--ws-port=0", "--grpc-port=0", "--http-port=0", "--sink-backoff-max-seconds=0.2"),
    )
    samples: list[tuple[int, int]] = []

    async def sample() -> None:
        while True:
            samples.append(pod_rss(proc.proc.pid))
            await asyncio.sleep(0.02)

    sampler = asyncio.create_task(sample())
    received = Received()
    try:
        target = f"127.0.0.1:{proc.grpc}"
        floods = [
            asyncio.ensure_future(f)
            for i in range(3)
            for f in (
                ws_flood(proc.ws_url, f"bad-ws{i}", "s"),
                grpc_flood(target, f"bad-g{i}", "s"),
            )
        ]
        await asyncio.sleep(0.5)
        edge = EdgeClient("ws", proc.ws_url, "good", [StreamConfig("cam")])
        await edge.start()
        cloud = xyz_cloud(np.random.default_rng(7).uniform(-5, 5, (60_000, 3)))
        for _ in range(20):
            await edge.publish("cam", cloud)
        await asyncio.sleep(FLOOD_SECONDS)  # the sink is down: everything stays buffered
        async with SinkServer(listen=f"127.0.0.1:{free_port}", fsync=False, on_frame=received):
            await asyncio.sleep(1.0)  # drains while the flood goes on
            for task in floods:
                task.cancel()
            await asyncio.gather(*floods, return_exceptions=True)
            assert await edge.wait_delivered(30)
        await edge.close()
    finally:
        sampler.cancel()
        proc.kill()
    peak, processes = max(samples)
    print(
        f"pod of {processes} processes under 6 flooding edges: peak summed RSS "
        f"{peak / MiB:.0f} MiB of a {LIMIT / MiB:.0f} MiB limit over {len(samples)} samples"
    )
    assert max(count for _, count in samples) >= 3  # the supervisor and two processes
    assert received.exactly("good", "cam", 20), "the well-behaved edge lost or repeated frames"
    assert edge.stats.disconnects == 0
    assert peak <= LIMIT, f"summed RSS {peak / MiB:.0f} MiB > limit {LIMIT / MiB:.0f} MiB"
