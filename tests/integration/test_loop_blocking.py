"""A steady relay never blocks the event loop: WS and gRPC edges, decimation, a sink, all on one
loop, and no callback holds it for more than 50 ms of CPU or of blocking (see conftest)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager

from loadgen.clouds import synthetic
from loadgen.edge import EdgeClient, StreamConfig
from loadgen.sink import SinkServer
from tests.integration.harness import grpc_target, running_bridge, ws_url


async def test_a_steady_relay_never_blocks_the_loop(
    loop_guard: Callable[[], AbstractContextManager[list[str]]],
) -> None:
    clouds = [synthetic(20_000, seed=i).to_proto() for i in range(4)]  # built up front
    async with (
        SinkServer(fsync=False) as sink,
        running_bridge(sink_address=sink.address, voxel_size=0.2) as bridge,
    ):
        streams = [StreamConfig("lidar"), StreamConfig("imu", kind="telemetry")]
        edges = [
            EdgeClient("ws", ws_url(bridge), "ws-edge", streams),
            EdgeClient("grpc", grpc_target(bridge), "grpc-edge", streams),
        ]
        for edge in edges:
            await edge.start()

        async def burst(frames: int) -> None:
            for k in range(frames):
                for edge in edges:
                    await edge.publish("lidar", clouds[k % len(clouds)])
                    await edge.publish("imu", {"ax": float(k)})
            for edge in edges:
                assert await edge.wait_delivered(30), edge.stats.as_dict()

        await burst(10)  # warm-up: first use of every code path (lazy imports, channels)
        with loop_guard():
            await burst(40)
        for edge in edges:
            assert edge.stats.disconnects == 0
            await edge.close()
        assert sink.record.totals()["delivered"] == 2 * 2 * 50
