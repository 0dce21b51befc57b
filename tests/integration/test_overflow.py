"""Full rings: backpressure stops admission and drops nothing; drop_oldest drops, counts, and the
sink sees a gap marker with the exact count."""

from __future__ import annotations

from bridge.v1 import bridge_pb2 as pb
from loadgen.clouds import synthetic
from loadgen.edge import EdgeClient, StreamConfig
from loadgen.sink import SinkServer
from tests.integration.harness import metric, running_bridge, wait_until, ws_url

FRAME_POINTS = 1000  # 16 KB frames
RING = 100_000  # about six frames per stream


async def test_backpressure_pauses_the_edge_and_drops_nothing(free_port: int) -> None:
    port = free_port  # the sink is down at first: nothing gets delivered, the ring fills
    async with running_bridge(
        sink_address=f"127.0.0.1:{port}",
        passthrough=True,
        max_frame_bytes=20_000,
        ring_budget_bytes=RING,
    ) as bridge:
        edge = EdgeClient("ws", ws_url(bridge), "dev", [StreamConfig("lidar")])
        await edge.start()
        for _ in range(20):
            await edge.publish("lidar", synthetic(FRAME_POINTS).to_proto())
        assert await edge.wait_for(lambda: edge.stats.pauses >= 1)
        stream = bridge.core.streams[("dev", "lidar")]
        assert stream.ring.occupancy_bytes <= stream.ring.capacity_bytes
        assert stream.accepted_seq < 20, "admission stopped at capacity"
        assert metric(bridge, "bridge_backpressure_pauses_total") >= 1
        async with SinkServer(listen=f"127.0.0.1:{port}", fsync=False) as sink:
            assert await edge.wait_delivered(20)
            totals = sink.record.totals()
            assert totals["delivered"] == 20
            assert totals["lost"] == totals["gap_frames"] == 0
        assert metric(bridge, "bridge_frames_dropped_total", reason="drop_oldest") == 0
        assert edge.stats.disconnects == 0
        await edge.close()


async def test_drop_oldest_counts_and_announces_the_gap(free_port: int) -> None:
    port = free_port
    received: list[pb.ProcessedFrame] = []
    async with running_bridge(
        sink_address=f"127.0.0.1:{port}",
        passthrough=True,
        max_frame_bytes=20_000,
        ring_budget_bytes=RING,
    ) as bridge:
        edge = EdgeClient(
            "ws", ws_url(bridge), "dev", [StreamConfig("lidar", overflow=pb.DROP_OLDEST)]
        )
        await edge.start()
        for _ in range(20):
            await edge.publish("lidar", synthetic(FRAME_POINTS).to_proto())
        assert await wait_until(lambda: bridge.core.streams[("dev", "lidar")].accepted_seq == 20)
        dropped = metric(bridge, "bridge_frames_dropped_total", reason="drop_oldest")
        assert dropped > 0
        held = len(bridge.core.streams[("dev", "lidar")].ring)
        assert dropped + held == 20
        async with SinkServer(listen=f"127.0.0.1:{port}", fsync=False, on_frame=received.append):
            assert await wait_until(lambda: len(received) == held)
        await edge.close()
    first = received[0]
    assert first.HasField("gap")
    assert (first.gap.first_seq, first.gap.last_seq) == (1, dropped)
    assert first.gap.count == dropped and first.gap.reason == "drop_oldest"
    assert [f.seq for f in received] == list(range(int(dropped) + 1, 21))
    assert not any(f.HasField("gap") for f in received[1:])
