"""Full rings: backpressure stops admission and drops nothing; drop_oldest drops, counts, and the
sink sees a gap marker with the exact count."""

from __future__ import annotations

import asyncio
import contextlib

from websockets.asyncio.client import connect

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


async def test_a_paused_stream_does_not_hold_up_the_edges_other_streams(free_port: int) -> None:
    """A cloud frame that finds its ring full waits on its own: the same connection's telemetry
    is still read and accepted, and once the sink is back everything is delivered in order."""
    port = free_port  # sink down: the cloud ring fills and stays full
    async with running_bridge(
        sink_address=f"127.0.0.1:{port}",
        passthrough=True,
        max_frame_bytes=20_000,
        ring_budget_bytes=RING,
    ) as bridge:
        specs = [
            pb.StreamSpec(stream_id="lidar", kind=pb.POINT_CLOUD),
            pb.StreamSpec(stream_id="status", kind=pb.TELEMETRY),
        ]
        hello = pb.EdgeMessage(hello=pb.Hello(device_id="dev", streams=specs))
        async with connect(ws_url(bridge), max_size=None, compression=None) as ws:
            await ws.send(hello.SerializeToString())
            reply = pb.BridgeMessage.FromString(await ws.recv())
            assert reply.HasField("welcome")
            seq = 0
            paused = False
            while not paused:  # clouds until the bridge says PAUSE (that frame waits for room)
                seq += 1
                frame = pb.Frame(stream_id="lidar", seq=seq)
                frame.point_cloud.CopyFrom(synthetic(FRAME_POINTS).to_proto())
                await ws.send(pb.EdgeMessage(frame=frame).SerializeToString())
                with contextlib.suppress(TimeoutError):
                    while not paused:
                        msg = pb.BridgeMessage.FromString(await asyncio.wait_for(ws.recv(), 0.2))
                        paused = msg.flow_control.action == pb.FlowControl.PAUSE
                assert seq < 50, "the ring never filled"
            lidar = bridge.core.streams[("dev", "lidar")]
            assert lidar.accepted_seq == seq - 1
            telemetry = pb.Frame(stream_id="status", seq=1)
            telemetry.telemetry.values["battery"] = 0.5
            await ws.send(pb.EdgeMessage(frame=telemetry).SerializeToString())
            status = bridge.core.streams[("dev", "status")]
            assert await wait_until(lambda: status.accepted_seq == 1, timeout=5.0)
            assert lidar.accepted_seq == seq - 1, "the cloud ring is still full"
            async with SinkServer(listen=f"127.0.0.1:{port}", fsync=False) as sink:
                assert await wait_until(lambda: lidar.delivered_seq == seq, timeout=15.0)
                assert await wait_until(lambda: status.delivered_seq == 1, timeout=15.0)
                resumed = False
                with contextlib.suppress(TimeoutError):
                    while not resumed:
                        msg = pb.BridgeMessage.FromString(await asyncio.wait_for(ws.recv(), 5.0))
                        resumed = msg.flow_control.action == pb.FlowControl.RESUME
                assert resumed, "the paused stream gets its RESUME"
                assert sink.record.totals()["lost"] == 0
