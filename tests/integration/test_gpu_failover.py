"""GPU reported Unhealthy: the bridge switches decimation to the CPU live, and back when healthy.

No GPU exists here, so the "cuda" backend is a stand-in that delegates to NumPy and counts its
calls; everything else (the service, the processor, frames flowing) is real."""

from __future__ import annotations

from bridge.decimate import DecimationResult, get_decimator
from bridge.protocol.cloud import CloudLayout
from loadgen.clouds import synthetic
from loadgen.edge import EdgeClient, StreamConfig
from tests.integration.harness import metric, running_bridge, ws_url


class FakeCuda:
    name = "cuda"

    def __init__(self) -> None:
        self.calls = 0
        self._inner = get_decimator("numpy")

    def downsample(
        self,
        layout: CloudLayout,
        data: bytes | memoryview,
        voxel_size: float,
        max_points: int = 0,
        threads: int = 0,
    ) -> DecimationResult:
        self.calls += 1
        return self._inner.downsample(layout, data, voxel_size, max_points)


async def test_unhealthy_gpu_switches_to_cpu_and_back_without_losing_frames() -> None:
    async with running_bridge(voxel_size=0.5) as bridge:
        assert bridge.processor is not None and bridge.capacity is not None
        gpu = FakeCuda()
        bridge.capacity.decimator = gpu
        bridge.processor.set_decimator(gpu)
        edge = EdgeClient("ws", ws_url(bridge), "dev", [StreamConfig("lidar")])
        await edge.start()

        async def burst(n: int) -> None:
            for _ in range(n):
                await edge.publish("lidar", synthetic(2000).to_proto())
            assert await edge.wait_delivered(10)

        await burst(3)
        assert gpu.calls == 3
        bridge.capacity.set_gpu_healthy(False)
        assert bridge.processor.decimator is bridge.capacity.cpu_decimator
        cpu_name = bridge.capacity.cpu_decimator.name if bridge.capacity.cpu_decimator else ""
        assert cpu_name in ("c", "numpy")
        assert metric(bridge, "bridge_decimate_backend", backend=cpu_name) == 1
        assert metric(bridge, "bridge_decimate_backend", backend="cuda") == 0
        await burst(3)
        assert gpu.calls == 3, "no frame went to the unhealthy GPU"
        bridge.capacity.set_gpu_healthy(True)
        assert bridge.processor.decimator is gpu
        await burst(3)
        assert gpu.calls == 6
        assert edge.stats.disconnects == 0
        await edge.close()
