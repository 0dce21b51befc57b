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
from bridge.v1 import bridge_pb2 as pb
from loadgen.clouds import synthetic
from loadgen.edge import EdgeClient, StreamConfig
from loadgen.sink import SinkServer
from tests.integration.harness import grpc_target, metric, running_bridge, ws_url

POINTS = 40_000  # 640 KB xyz+intensity clouds: decimation makes the bridge the bottleneck
PUBLISH_HZ = 400  # far above what one worker decimates here with NumPy (below)
# The NumPy reference, not the C kernel: one C worker now decimates these clouds in well under
# the 2.5 ms a frame that 400 Hz leaves, so the WebSocket edge dropped nothing (CI, 1 December;
# 0 of 1,200 dropped in three of three runs here, gRPC 4-9 %) and the test overloaded nothing.
# With NumPy the edge drops 37-51 % of the frames on either transport.
BACKEND = "numpy"
SECONDS = 3.0
RING = 8 * 1024 * 1024  # about 13 frames


@pytest.mark.parametrize("transport", ["ws", "grpc"])
async def test_overload_keeps_delivering_and_loses_nothing_inside(
    transport: str, free_port: int
) -> None:
    async with (
        SinkServer(listen=f"127.0.0.1:{free_port}", fsync=False) as sink,
        running_bridge(
            sink_address=f"127.0.0.1:{free_port}",
            voxel_size=0.2,
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
        cloud = PreparedPayload.of(synthetic(POINTS).to_proto())
        await edge.start()
        t0 = time.monotonic()
        n = int(PUBLISH_HZ * SECONDS)
        for i in range(n):
            await asyncio.sleep(max(0.0, t0 + i / PUBLISH_HZ - time.monotonic()))
            await edge.publish("lidar", cloud)
        t_end = time.monotonic()
        assert await edge.wait_delivered(30), "every frame the edge kept gets delivered"
        await edge.close()

        stats = edge.stats
        assert stats.dropped > 0, "the test must overload the bridge"
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
