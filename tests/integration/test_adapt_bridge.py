"""The real bridge under in-place resize through the Kubernetes stand-in: a memory decrease the
kubelet would refuse for usage is made to succeed by the bridge's cooperative shrink, with every
connection kept and no frame lost."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from bridge.resources.kubeapi import KubeClient, KubeConfig
from bridge.server.app import BridgeService
from loadgen.clouds import synthetic
from loadgen.edge import EdgeClient, StreamConfig
from loadgen.kubesim import KubeSim
from loadgen.sink import SinkServer
from tests.integration.harness import bridge_settings, wait_until, ws_url

K8S = Path(__file__).resolve().parent.parent / "fixtures" / "k8s"
MiB = 1 << 20
RESIZE = "/api/v1/namespaces/sim/pods/sim-bridge-0/resize"
FRAMES = 100  # ~1 MB each: ~100 MB held while the sink is down


def resize_body(memory: int) -> dict[str, Any]:
    quantity = f"{memory // MiB}Mi"
    return {
        "spec": {
            "containers": [
                {
                    "name": "bridge",
                    "resources": {
                        "requests": {"cpu": "4", "memory": quantity},
                        "limits": {"cpu": "4", "memory": quantity},
                    },
                }
            ]
        }
    }


async def test_memory_decrease_below_usage_succeeds_through_cooperative_shrink(
    tmp_path: Path, free_port: int
) -> None:
    cgroup = tmp_path / "cg"
    pod = json.loads((K8S / "pod-resize-done.json").read_text())
    async with KubeSim(pod, cgroup_dir=str(cgroup), sync_interval=0.02) as sim:
        settings = bridge_settings(
            adapt=True,
            cgroup_root=str(cgroup),
            kube_api=sim.url,
            pod_name="sim-bridge-0",
            pod_namespace="sim",
            passthrough=True,
            max_frame_bytes=2 * MiB,
            sink_address=f"127.0.0.1:{free_port}",  # the sink is down at first
        )
        bridge = BridgeService(settings, CollectorRegistry())
        await bridge.start()
        assert bridge.capacity is not None
        baseline = bridge.capacity.memory_baseline_bytes()
        assert sim.cgroup is not None
        cg = sim.cgroup

        async def usage_follows_the_rings() -> None:  # what memory.current would show
            while True:
                cg.set_memory_usage(baseline + bridge.core.buffered_bytes)
                await asyncio.sleep(0.01)

        usage = asyncio.create_task(usage_follows_the_rings())
        edge = EdgeClient("ws", ws_url(bridge), "dev", [StreamConfig("lidar")])
        sink: SinkServer | None = None
        try:
            await edge.start()
            cloud = synthetic(64_000).to_proto()  # ~1 MB
            for _ in range(FRAMES):
                await edge.publish("lidar", cloud)
            assert await wait_until(lambda: bridge.core.buffered_frames == FRAMES, timeout=20)
            # A limit below current usage: the kubelet must hold it (PodResizeInProgress/Error).
            target = baseline + 64 * MiB + 8 * MiB
            assert target < baseline + bridge.core.buffered_bytes
            client = KubeClient(KubeConfig(sim.url), timeout=5)
            await client.patch(RESIZE, resize_body(target))
            target = (target // MiB) * MiB
            assert await wait_until(
                lambda: (sim.condition("PodResizeInProgress") or {}).get("reason") == "Error"
            )
            # The bridge plans for the new limit before the kubelet applies it.
            assert await wait_until(
                lambda: (
                    bridge.adapter.plan is not None
                    and bridge.adapter.plan.memory_limit_bytes == target
                )
            )
            # 8 MiB above baseline + 64 MiB leaves 4 MiB after the 2-frame headroom: the plan
            # takes the 16 MiB floor instead, 12 MiB of it for admission.
            assert bridge.core.ring_capacity_per_stream <= 12 * MiB
            assert (cgroup / "memory.max").read_text().strip() != str(target)
            # Delivery resumes; nothing new is admitted beyond the shrunk ring: usage falls.
            sink = SinkServer(listen=f"127.0.0.1:{free_port}", fsync=False)
            await sink.start()
            assert await wait_until(
                lambda: (cgroup / "memory.max").read_text().strip() == str(target), timeout=30
            )
            assert sim.condition("PodResizeInProgress") is None
            for _ in range(10):
                await edge.publish("lidar", cloud)
            assert await edge.wait_delivered(30)
            totals = sink.record.totals()
            assert totals["delivered"] == FRAMES + 10
            assert totals["lost"] == totals["duplicates"] == 0
            assert edge.stats.disconnects == 0
            assert bridge.core.streams[("dev", "lidar")].ring.occupancy_bytes <= 12 * MiB
        finally:
            usage.cancel()
            await edge.close()
            await bridge.close()
            if sink is not None:
                await sink.stop()
