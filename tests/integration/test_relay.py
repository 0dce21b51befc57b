"""End to end with real servers: WS and gRPC edges → bridge → reference sink, in order, once."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import numpy as np
from websockets.asyncio.client import connect

from bridge.decimate import get_decimator
from bridge.protocol.cloud import make_layout
from bridge.v1 import bridge_pb2 as pb
from bridge.v1 import bridge_pb2_grpc
from loadgen.clouds import synthetic
from loadgen.edge import EdgeClient, StreamConfig
from loadgen.sink import SinkServer
from tests.integration.harness import (
    RawGrpcEdge,
    cloud_frame,
    grpc_target,
    hello,
    metric,
    running_bridge,
    wait_until,
    ws_url,
)

FRAMES = 12


async def test_ws_and_grpc_edges_deliver_every_frame_in_order_decimated_like_numpy() -> None:
    received: list[pb.ProcessedFrame] = []
    async with (
        SinkServer(fsync=False, on_frame=received.append) as sink,
        running_bridge(sink_address=sink.address, voxel_size=0.5) as bridge,
    ):
        streams = [StreamConfig("lidar"), StreamConfig("imu", kind="telemetry")]
        edges = [
            EdgeClient("ws", ws_url(bridge), "ws-edge", streams),
            EdgeClient("grpc", grpc_target(bridge), "grpc-edge", streams),
        ]
        clouds: dict[tuple[str, int], Any] = {}
        for edge in edges:
            await edge.start()
        for seq in range(1, FRAMES + 1):
            for i, edge in enumerate(edges):
                cloud = synthetic(2000, seed=seq * 10 + i)
                clouds[(edge.device_id, seq)] = cloud
                await edge.publish("lidar", cloud.to_proto())
                await edge.publish("imu", {"ax": float(seq), "ay": 0.5})
        for edge in edges:
            assert await edge.wait_delivered(20), edge.stats.as_dict()
        for edge in edges:
            assert edge.stats.disconnects == 0
            await edge.close()
        totals = sink.record.totals()
        assert totals["delivered"] == 2 * 2 * FRAMES
        assert totals["lost"] == totals["duplicates"] == totals["reorders"] == 0
        assert metric(bridge, "bridge_frames_delivered_total") == 4 * FRAMES

    reference = get_decimator("numpy")
    by_stream: dict[tuple[str, str], list[int]] = {}
    for frame in received:
        by_stream.setdefault((frame.device_id, frame.stream_id), []).append(frame.seq)
        if frame.stream_id == "imu":
            assert frame.telemetry.values["ax"] == float(frame.seq)
            continue
        src = clouds[(frame.device_id, frame.seq)]
        layout = make_layout(src.stride, src.layout_triples())
        expected = reference.downsample(layout, src.data, 0.5)
        assert frame.decimation.input_points == src.num_points
        assert frame.decimation.output_points == expected.points
        assert frame.decimation.voxel_size == 0.5
        got = np.frombuffer(frame.point_cloud.data, dtype="<f4")
        want = np.frombuffer(expected.data, dtype="<f4")
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    for key, seqs in by_stream.items():
        assert seqs == list(range(1, FRAMES + 1)), key


async def test_sink_restart_loses_and_duplicates_nothing_and_keeps_edges_connected(
    tmp_path: Any,
) -> None:
    record = tmp_path / "sink.jsonl"
    sink = SinkServer(record_path=record, fsync=False)
    await sink.start()
    port = sink.port
    async with running_bridge(sink_address=f"127.0.0.1:{port}", passthrough=True) as bridge:
        edge = EdgeClient("ws", ws_url(bridge), "dev", [StreamConfig("lidar")])
        grpc_edge = EdgeClient("grpc", grpc_target(bridge), "dev2", [StreamConfig("lidar")])
        await edge.start()
        await grpc_edge.start()

        async def publish(n: int) -> None:
            for _ in range(n):
                await edge.publish("lidar", synthetic(500).to_proto())
                await grpc_edge.publish("lidar", synthetic(500).to_proto())
                await asyncio.sleep(0.005)

        await publish(20)
        await sink.stop(grace=0)  # killed mid-stream
        await publish(20)  # buffered in the bridge meanwhile
        assert await wait_until(lambda: bridge.core.buffered_frames >= 20)
        sink = SinkServer(listen=f"127.0.0.1:{port}", record_path=record, fsync=False)
        await sink.start()
        await publish(20)
        assert await edge.wait_delivered(20) and await grpc_edge.wait_delivered(20)
        assert edge.stats.disconnects == grpc_edge.stats.disconnects == 0
        await edge.close()
        await grpc_edge.close()
        # One reconnect after the restart (the first connect is not counted).
        assert metric(bridge, "bridge_sink_reconnects_total") >= 1
    await sink.stop()
    totals = sink.record.totals()
    assert totals["delivered"] == 120
    assert totals["lost"] == totals["duplicates"] == 0


async def test_subscribers_get_frames_and_a_slow_one_gets_gaps_without_slowing_others() -> None:
    async with running_bridge(passthrough=True) as bridge:
        channel = grpc.aio.insecure_channel(grpc_target(bridge))
        stub = bridge_pb2_grpc.VisualizationStub(channel)
        fast = stub.Subscribe(pb.SubscribeRequest())
        slow = stub.Subscribe(pb.SubscribeRequest(queue_frames=2))
        assert await wait_until(lambda: len(bridge.subscribers) == 2)
        edge = EdgeClient("ws", ws_url(bridge), "dev", [StreamConfig("lidar")])
        await edge.start()
        for _ in range(30):  # ~480 KB frames: far more than HTTP/2 buffers for a non-reader
            await edge.publish("lidar", synthetic(40_000).to_proto())
        assert await edge.wait_delivered(20)
        fast_seqs = [(await fast.read()).seq for _ in range(30)]
        assert fast_seqs == list(range(1, 31)), "the slow viewer did not slow the fast one"

        # A gap is announced with the subscriber's next frame: keep small frames coming.
        async def trickle() -> None:
            while True:
                await edge.publish("lidar", synthetic(100).to_proto())
                await asyncio.sleep(0.05)

        trickler = asyncio.create_task(trickle())
        seen: set[int] = set()
        announced = 0
        while not set(range(1, 32)) <= seen:
            frame = await asyncio.wait_for(slow.read(), 10)
            if frame.HasField("gap"):
                assert frame.gap.reason == "slow_subscriber"
                assert frame.gap.last_seq < frame.seq
                covered = set(range(frame.gap.first_seq, frame.gap.last_seq + 1))
                assert not covered & seen
                seen |= covered
                announced += frame.gap.count
            assert frame.seq not in seen
            seen.add(frame.seq)
        trickler.cancel()
        assert seen == set(range(1, max(seen) + 1)), "every frame received or announced"
        assert announced > 0
        assert metric(bridge, "bridge_subscriber_dropped_total") >= announced
        fast.cancel()
        slow.cancel()
        await edge.close()
        await channel.close()


async def test_a_device_reconnecting_supersedes_its_half_open_connection() -> None:
    async with running_bridge(passthrough=True) as bridge:
        old_grpc = RawGrpcEdge(grpc_target(bridge))
        await old_grpc.send(hello("dev", "lidar").SerializeToString())
        first = await old_grpc.recv()
        assert first is not None and first.HasField("welcome")
        async with connect(ws_url(bridge), compression=None) as ws:
            # A reconnect presents the session's resume token (without it a live session is
            # not taken over: see test_hardening).
            token = first.welcome.session_id
            await ws.send(hello("dev", "lidar", resume_token=token).SerializeToString())
            welcome = pb.BridgeMessage.FromString(await ws.recv(decode=False))
            assert welcome.welcome.resumed
            assert welcome.welcome.session_id == first.welcome.session_id
            # The old connection is closed by the bridge; the new one works.
            assert await old_grpc.status() != grpc.StatusCode.OK
            await ws.send(pb.EdgeMessage(frame=cloud_frame("lidar", 1)).SerializeToString())
            while True:
                msg = pb.BridgeMessage.FromString(await ws.recv(decode=False))
                if msg.HasField("ack") and msg.ack.streams[0].delivered_seq == 1:
                    break
            assert bridge.core.attached_sessions == 1
        await old_grpc.close()
