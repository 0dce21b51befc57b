"""Sustained overload: an open-loop edge publishing far faster than the bridge can process.

What must hold (issue 12): the bridge keeps delivering (no stall longer than 1 s while work is
queued), PAUSE/RESUME comes in bursts rather than once per frame, nothing is lost inside the
bridge for a ``backpressure`` stream (every accepted frame reaches the sink), overload turns into
loss only in the edge's own resend buffer, and the edge never counts as accepted a frame it
dropped without sending.
"""

from __future__ import annotations

import asyncio
import itertools
import time

import pytest

from bridge.client import PreparedPayload
from bridge.decimate import get_decimator
from bridge.protocol.cloud import make_layout
from bridge.v1 import bridge_pb2 as pb
from loadgen.clouds import CloudData, synthetic
from loadgen.edge import EdgeClient, StreamConfig
from loadgen.sink import SinkServer
from tests.integration.harness import grpc_target, metric, running_bridge, ws_url

POINTS = 40_000  # 640 KB xyz+intensity clouds: decimation makes the bridge the bottleneck
# The NumPy reference, not the C kernel: one C worker decimates these clouds far faster than
# any rate the edge could offer here, so nothing would be overloaded.
BACKEND = "numpy"
VOXEL = 0.2
# Offered load against what one NumPy worker decimates on this machine, measured before the
# run: a fixed 400 Hz overloaded the earlier CI VM (the edge dropped 37-51 %) and nothing on
# its faster successor (NumPy at ~1.6 ms a cloud: 0 dropped, CI red on 1 December).
OVERLOAD = 3.0
MAX_HZ = 4000.0
SECONDS = 3.0
RING = 8 * 1024 * 1024  # about 13 frames


def overload_hz(cloud: CloudData) -> float:
    """``OVERLOAD`` times the clouds per second one worker decimates here (best of five)."""
    layout = make_layout(cloud.stride, cloud.layout_triples())
    decimator = get_decimator(BACKEND)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        decimator.downsample(layout, cloud.data, VOXEL)
        best = min(best, time.perf_counter() - t0)
    return min(MAX_HZ, OVERLOAD / best)


@pytest.mark.parametrize("transport", ["ws", "grpc"])
async def test_overload_keeps_delivering_and_loses_nothing_inside(
    transport: str, free_port: int
) -> None:
    async with (
        SinkServer(listen=f"127.0.0.1:{free_port}", fsync=False) as sink,
        running_bridge(
            sink_address=f"127.0.0.1:{free_port}",
            voxel_size=VOXEL,
            workers=1,
            decimate_backend=BACKEND,
            max_frame_bytes=1024 * 1024,
            ring_budget_bytes=RING,
        ) as bridge,
    ):
        url = ws_url(bridge) if transport == "ws" else grpc_target(bridge)
        edge = EdgeClient(
            transport,  # type: ignore[arg-type]
            url,
            "dev",
            [StreamConfig("lidar", overflow=pb.BACKPRESSURE)],
            resend_buffer_frames=64,  # more than the bridge holds: only unsent frames go
        )
        delivered_at: list[float] = []
        edge.core.on_delivered = lambda *_: delivered_at.append(time.monotonic())
        data = synthetic(POINTS)
        hz = overload_hz(data)
        cloud = PreparedPayload.of(data.to_proto())
        await edge.start()
        t0 = time.monotonic()
        for i in range(int(hz * SECONDS)):
            await asyncio.sleep(max(0.0, t0 + i / hz - time.monotonic()))
            await edge.publish("lidar", cloud)
            if time.monotonic() - t0 > SECONDS:
                break  # the publisher itself fell behind: the load is offered for SECONDS
        t_end = time.monotonic()
        assert await edge.wait_delivered(30), "every frame the edge kept gets delivered"
        await edge.close()

        stats = edge.stats
        assert stats.dropped > 0, f"the test must overload the bridge ({hz:.0f} Hz offered)"
        assert stats.accepted <= stats.sent, "frames dropped unsent were counted as accepted"
        assert stats.accepted == stats.delivered == stats.sent
        assert stats.published == stats.delivered + stats.dropped
        # Nothing lost inside the bridge: every accepted frame reached the sink, the only gaps
        # are the edge's own drops, announced.
        assert metric(bridge, "bridge_frames_dropped_total", reason="drop_oldest") == 0
        totals = sink.record.totals()
        assert totals["delivered"] == stats.delivered and totals["lost"] == 0
        assert totals["gap_frames"] <= stats.dropped
        # Bursts, not a PAUSE/RESUME pair per frame (that was about one per frame sent; a
        # loaded CI machine was seen at 0.29 per frame with the hysteresis).
        pauses = metric(bridge, "bridge_backpressure_pauses_total")
        assert 0 < pauses <= stats.sent / 2, (pauses, stats.sent)
        # No stall while work was queued (the publisher ran until t_end).
        busy = [t for t in delivered_at if t <= t_end] + [t_end]
        longest = max(b - a for a, b in itertools.pairwise(busy))
        assert longest <= 1.0, f"deliveries stalled for {longest:.2f} s"
