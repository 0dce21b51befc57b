"""Large frames on their way out (issue 29, "OOM-killed once the sink is up"): three WebSocket
edges send 15 MiB frames and ignore PAUSE while the sink is down, then the sink connects and
drains the rings while the flood goes on. A push holds two copies of its message while it is
written (the join, and grpc's copy of it); both must be charged before they exist, and RSS growth
must stay within the budget plus the plan's headroom at every sample (docs/design.md "Where
memory goes").
"""

from __future__ import annotations

import asyncio
import json

import numpy as np
from websockets.asyncio.client import connect

from bridge.resources.from_settings import memory_headroom_bytes
from bridge.v1 import bridge_pb2 as pb
from loadgen.edge import EdgeClient, StreamConfig
from loadgen.sink import SinkServer
from tests.integration.harness import hello, http_get, xyz_cloud
from tests.integration.test_memory_hostile import Received, bridge

MiB = 1 << 20
BUDGET = 128 * MiB
MAX_FRAME = 16 * MiB
FRAME = 15 * MiB
HEADROOM = memory_headroom_bytes(MAX_FRAME)
CLOUD = xyz_cloud(
    np.random.default_rng(29).uniform(-5, 5, ((FRAME - 4096) // 12, 3)).astype(np.float32)
)


async def big_flood(url: str, device: str) -> None:
    """An edge that ignores PAUSE: 15 MiB frames as fast as TCP takes them."""
    async with connect(
        url, max_size=None, compression=None, ping_interval=None, close_timeout=0.2
    ) as ws:
        await ws.send(hello(device, "s").SerializeToString())
        seq = 0
        while True:
            seq += 1
            frame = pb.Frame(stream_id="s", seq=seq, point_cloud=CLOUD)
            await ws.send(pb.EdgeMessage(frame=frame).SerializeToString())
            await asyncio.sleep(0)  # let the other floods and the probes run


async def charged_egress(port: int, seen: list[int], stop: asyncio.Event) -> None:
    """Sample the egress component's charge (stopped by ``stop``, never mid-request)."""
    while not stop.is_set():
        status, body = await http_get(port, "/debug/resources")
        if status == 200:
            seen.append(json.loads(body)["memory"]["charged_by_component"]["egress"])
        await asyncio.sleep(0.03)


async def test_pushes_of_large_frames_are_charged_and_rss_stays_within_the_plan(
    free_port: int,
) -> None:
    received = Received()
    args = ("--ring-budget-bytes", str(BUDGET), "--max-frame-bytes", str(MAX_FRAME))
    async with bridge(free_port, *args) as (proc, peak):
        peak.budget = BUDGET
        floods = [asyncio.ensure_future(big_flood(proc.ws_url, f"bad{i}")) for i in range(3)]
        edge = EdgeClient("ws", proc.ws_url, "good", [StreamConfig("cam")])
        await edge.start()
        cloud = xyz_cloud(np.random.default_rng(7).uniform(-5, 5, (60_000, 3)))
        for _ in range(10):
            await edge.publish("cam", cloud)
        await asyncio.sleep(2.0)  # the sink is down: the rings fill to the admission limit
        filled = len(peak.samples)
        egress: list[int] = []
        async with SinkServer(
            listen=f"127.0.0.1:{free_port}", fsync=False, ack_batch_frames=4, on_frame=received
        ):
            stop = asyncio.Event()
            probe = asyncio.ensure_future(charged_egress(proc.http, egress, stop))
            await asyncio.sleep(3.0)  # drains while the flood goes on
            stop.set()
            await probe
            for task in floods:
                task.cancel()
            await asyncio.gather(*floods, return_exceptions=True)
            assert await edge.wait_delivered(30)
        await edge.close()
    drained = peak.samples[filled:]
    limit = peak.baseline + BUDGET + HEADROOM
    over = [s for s in drained if s > limit]
    print(
        peak.report("3 ws edges x 15 MiB ignoring PAUSE, sink down then up")
        + f"; headroom {HEADROOM / MiB:.0f} MiB; egress charged peak {max(egress) / MiB:.0f} MiB"
    )
    assert received.exactly("good", "cam", 10), "the well-behaved edge lost or repeated frames"
    assert sum(len(v) for k, v in received.seqs.items() if k[0] != "good") > 0, "nothing drained"
    # One push in flight: its message (one 15 MiB frame) is charged twice, before the join.
    assert max(egress) >= 2 * len(CLOUD.data), f"egress charged at most {max(egress)} B"
    assert not over, f"{len(over)} samples above baseline + budget + headroom ({peak.report('')})"
