"""The Adapter live: a temp cgroup directory rewritten during the test, the kubesim stand-in for the
own Pod, a fake NVML, and a fake AdaptTarget that records every call."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from bridge.config import settings as settings_mod
from bridge.resources.adapt import Adapter, AdapterSettings
from bridge.resources.cgroup import CgroupReader
from bridge.resources.gpu import GpuProbe
from bridge.resources.kubeapi import KubeClient, KubeConfig
from bridge.resources.kubelight import connect
from bridge.resources.plan import PlanSettings
from loadgen.kubesim import KubeSim, NodeModel
from tests.support.adapt_fakes import MIG_UUID, FakeNvml, FakeTarget

K8S = Path(__file__).resolve().parent.parent / "fixtures" / "k8s"
REPO = str(Path(__file__).resolve().parents[2])
MiB = 1 << 20
GiB = 1 << 30


def mem(budget: int) -> tuple[int, int]:
    """(data budget, reserve) the default plan applies for ``budget``."""
    return budget, budget // 4


def ring_of(budget: int) -> int:
    return budget - budget // 4


RESIZE = "/api/v1/namespaces/sim/pods/sim-bridge-0/resize"
MIG_ID = "gpu.nvidia.com/gpu-node-a/gpu-0-mig-3g40gb-9-4"


def load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((K8S / name).read_text())
    return data


def write(path: Path, text: str) -> None:
    """Atomic like a cgroup write: the reader sees the old or the new value, never half."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text + "\n")
    os.replace(tmp, path)


async def eventually(pred: Callable[[], bool], within: float = 3.0) -> None:
    async with asyncio.timeout(within):
        for _ in itertools.count():
            if pred():
                return
            await asyncio.sleep(0.005)


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


@pytest.fixture
def cg(tmp_path: Path) -> Path:
    root = tmp_path / "cg"
    root.mkdir()
    write(root / "cpu.max", "200000 100000")
    write(root / "memory.max", str(GiB))
    write(root / "memory.current", str(100 * MiB))
    return root


@pytest.fixture
async def stack(
    tmp_path: Path,
) -> AsyncIterator[Callable[..., Any]]:
    """Builds kubesim + adapter pairs and tears them down."""
    closers: list[Any] = []

    async def make(
        pod: str,
        *,
        node: NodeModel | None = None,
        settings: AdapterSettings | None = None,
        gpu: GpuProbe | None = None,
        target: FakeTarget | None = None,
    ) -> tuple[KubeSim, Adapter, FakeTarget, CollectorRegistry, KubeClient]:
        root = tmp_path / "cg-sim"
        sim = KubeSim(
            load(pod),
            claims=[load("resourceclaim-allocated.json")],
            slices=[load("resourceslice-h100-nvidia-static-mig.json")],
            cgroup_dir=str(root),
            node=node,
            sync_interval=0.02,
        )
        await sim.start()
        closers.append(sim)
        client = KubeClient(KubeConfig(sim.url), timeout=5)
        registry = CollectorRegistry()
        target = target or FakeTarget()
        adapter = Adapter(
            target,
            registry,
            cgroup=CgroupReader.from_root(str(root)),
            kube=connect(KubeConfig(sim.url), timeout=5),  # the bridge's own (lightkube) client
            pod_ref=("sim", "sim-bridge-0"),
            gpu=gpu,
            settings=settings or AdapterSettings(poll_interval=0.01, slow_interval=0.05),
            cpus_allowed=lambda: 16,
        )
        await adapter.start()
        closers.append(adapter)
        return sim, adapter, target, registry, client

    yield make
    for c in reversed(closers):
        await c.stop()


# ----------------------------------------------------------------------------- cgroup only


async def test_live_cgroup_change_is_detected_and_applied_fast(cg: Path) -> None:
    registry = CollectorRegistry()
    target = FakeTarget(streams=2, baseline=128 * MiB)
    adapter = Adapter(
        target,
        registry,
        cgroup=CgroupReader.from_root(str(cg)),
        settings=AdapterSettings(poll_interval=0.01, slow_interval=0.05),
        cpus_allowed=lambda: 8,
    )
    async with adapter:
        # the first plan is applied before start() returns
        assert target.workers == 2
        assert target.ring == mem(GiB - 128 * MiB - 64 * MiB)
        assert target.gpu_healthy is False  # no NVML probe: CPU
        assert sample(registry, "bridge_limit_cpu_cores") == 2.0
        assert sample(registry, "bridge_plan_workers") == 2

        written = time.monotonic()
        write(cg / "cpu.max", "350000 100000")
        await eventually(lambda: target.workers == 4, within=2)
        applied = next(t for kind, v, t in reversed(target.calls) if kind == "workers")
        assert applied - written < 0.5, "cpu.max change not applied within 500 ms"

        write(cg / "memory.max", str(512 * MiB))
        await eventually(lambda: target.ring == mem(512 * MiB - 192 * MiB))
        write(cg / "cpu.max", "max 100000")
        await eventually(lambda: target.workers == 8)  # unlimited -> all 8 CPUs
        assert sample(registry, "bridge_limit_cpu_cores") == float("inf")

        # usage moves all the time; it must not cause re-plans
        n = len(target.calls)
        for i in range(5):
            write(cg / "memory.current", str((200 + i) * MiB))
            await asyncio.sleep(0.02)
        assert len(target.calls) == n

    assert sample(registry, "bridge_resize_events_total", resource="cpu", direction="up") == 2
    assert sample(registry, "bridge_resize_events_total", resource="memory", direction="down") == 1
    count = sample(registry, "bridge_adapt_seconds_count")
    assert count is not None and count >= 4
    total = sample(registry, "bridge_adapt_seconds_sum")
    assert total is not None and total / count < 0.1


async def test_malformed_file_is_reported_and_the_rest_still_adapts(cg: Path) -> None:
    target = FakeTarget()
    registry = CollectorRegistry()
    adapter = Adapter(
        target,
        registry,
        cgroup=CgroupReader.from_root(str(cg)),
        settings=AdapterSettings(poll_interval=0.01),
        cpus_allowed=lambda: 4,
    )
    async with adapter:
        write(cg / "cpu.max", "250000 0")  # zero period
        await eventually(lambda: bool(adapter.describe()["cgroup"]["problems"]))
        assert "period must be > 0" in adapter.describe()["cgroup"]["problems"][0]
        assert target.workers == 4  # no quota known: all CPUs
        write(cg / "memory.max", str(256 * MiB))
        await eventually(lambda: target.ring == mem(256 * MiB - 64 * MiB))
    # an unreadable cpu.max is not a cpu resize; the memory change is one
    assert sample(registry, "bridge_resize_events_total", resource="cpu", direction="up") == 0
    assert sample(registry, "bridge_resize_events_total", resource="memory", direction="down") == 1


async def test_workload_change_replans_shares(cg: Path) -> None:
    target = FakeTarget(streams=1)
    adapter = Adapter(
        target,
        CollectorRegistry(),
        cgroup=CgroupReader.from_root(str(cg)),
        settings=AdapterSettings(poll_interval=0.01, slow_interval=0.02),
    )
    async with adapter:
        assert adapter.plan is not None and adapter.plan.per_stream_bytes == ring_of(GiB - 64 * MiB)
        target.streams = 4
        await eventually(
            lambda: (
                adapter.plan is not None
                and adapter.plan.per_stream_bytes == ring_of(GiB - 64 * MiB) // 4
            )
        )


# ----------------------------------------------------------------------------- with the Pod


async def test_cooperative_downscale_plans_before_the_kubelet_applies(
    stack: Callable[..., Any], tmp_path: Path
) -> None:
    target = FakeTarget(streams=2)
    sim, adapter, target, registry, client = await stack("pod-resize-done.json", target=target)
    root = tmp_path / "cg-sim"
    await eventually(lambda: adapter.describe()["pod"] is not None)
    assert target.ring == mem(12 * GiB - 64 * MiB)
    target.probe = lambda: (root / "memory.max").read_text().strip()

    assert sim.cgroup is not None
    sim.cgroup.set_memory_usage(9 * GiB)  # above the new limit: the kubelet will refuse
    await client.patch(
        RESIZE,
        {
            "spec": {
                "containers": [
                    {
                        "name": "bridge",
                        "resources": {
                            "requests": {"cpu": "4", "memory": "6Gi"},
                            "limits": {"cpu": "4", "memory": "6Gi"},
                        },
                    }
                ]
            }
        },
    )

    small = 6 * GiB - 64 * MiB
    await eventually(lambda: target.ring == mem(small))
    # applied while the cgroup still had the old 12 GiB limit
    assert target.probed[-1] == (small, str(12 * GiB))
    await eventually(lambda: (sim.condition("PodResizeInProgress") or {}).get("reason") == "Error")
    await eventually(lambda: (adapter.describe()["pending_resize"] or {}).get("reason") == "Error")
    assert adapter.plan is not None and adapter.plan.memory_limit_bytes == 6 * GiB
    assert "cooperative downscale" in adapter.plan.reasons["memory_limit_bytes"]
    assert sample(registry, "bridge_limit_memory_bytes") == 12 * GiB  # what the kernel enforces
    assert sample(registry, "bridge_plan_memory_limit_bytes") == 6 * GiB  # what we plan for

    # the data plane shrinks (simulated usage drop): the kubelet's next check passes
    sim.cgroup.set_memory_usage(5 * GiB)
    await eventually(lambda: (root / "memory.max").read_text().strip() == str(6 * GiB))
    await eventually(lambda: adapter.describe()["pending_resize"] is None)
    await eventually(
        lambda: (
            sample(registry, "bridge_resize_events_total", resource="memory", direction="down") == 1
        )
    )
    assert target.ring == mem(small)  # nothing more to do: already planned for 6 GiB
    assert [v for kind, v, _ in target.calls if kind == "ring"][-2:] == [
        12 * GiB - 64 * MiB,
        small,
    ]  # and it never bounced back up while the kubelet caught up


async def test_deferred_pending_too_long_raises_event_and_gauge(
    stack: Callable[..., Any],
) -> None:
    settings = AdapterSettings(poll_interval=0.01, slow_interval=0.02, pending_timeout=0.2)
    sim, adapter, target, registry, client = await stack(
        "pod-running-initial.json", node=NodeModel(others_cpu_m=13_000), settings=settings
    )
    await client.patch(RESIZE, load("resize-patch-body.json"))
    await eventually(
        lambda: (adapter.describe()["pending_resize"] or {}).get("reason") == "Deferred"
    )
    assert sample(registry, "bridge_resize_pending", reason="Deferred") == 0  # not yet
    await eventually(lambda: len(sim.events) == 1, within=2)
    ev = sim.events[0]
    assert ev["reason"] == "BridgeResizePending" and ev["type"] == "Warning"
    assert ev["involvedObject"]["name"] == "sim-bridge-0"
    assert ev["involvedObject"]["uid"] == "5f1c2b7e-2a64-4c1e-9d0e-0f3c7a51b9d2"
    assert "Deferred" in ev["message"] and "Node didn't have enough resource: cpu" in ev["message"]
    assert sample(registry, "bridge_resize_pending", reason="Deferred") == 1
    await asyncio.sleep(0.1)
    assert len(sim.events) == 1  # once per pending resize, not per poll

    sim.set_node_others(cpu_m=0)
    await eventually(lambda: target.workers == 4)
    await eventually(lambda: sample(registry, "bridge_resize_pending", reason="Deferred") == 0)
    assert adapter.describe()["pending_resize"] is None


async def test_gpu_health_from_kubelet_and_from_nvml(stack: Callable[..., Any]) -> None:
    nvml = FakeNvml()
    sim, adapter, target, _, _ = await stack(
        "pod-resize-done-v1.36-health.json", gpu=GpuProbe(nvml)
    )
    assert target.gpu_healthy is True  # NVML sees the MIG instance
    await eventually(lambda: bool(adapter.describe()["devices"]))
    dev = adapter.describe()["devices"][0]
    assert dev["uuid"] == MIG_UUID and dev["profile"] == "3g.40gb"
    assert adapter.plan is not None and adapter.plan.gpu_batch_points > 0

    sim.set_device_health(MIG_ID, "Unhealthy", "XID 79")
    await eventually(lambda: target.gpu_healthy is False)
    assert adapter.plan is not None and "Unhealthy: XID 79" in adapter.plan.reasons["gpu_healthy"]
    sim.set_device_health(MIG_ID, "Healthy")
    await eventually(lambda: target.gpu_healthy is True)

    nvml.lost = True  # NVML error on the MIG instance
    await eventually(lambda: target.gpu_healthy is False)
    assert "GPU is lost" in adapter.plan.reasons["gpu_healthy"]
    nvml.lost = False
    await eventually(lambda: target.gpu_healthy is True)
    flips = [v for kind, v, _ in target.calls if kind == "gpu"]
    assert flips == [True, False, True, False, True]
    batches = [v for kind, v, _ in target.calls if kind == "batch"]
    # 0.5 * 40448 MiB free / 32 B per point, capped at 16 Mi points; 0 while unhealthy
    assert batches == [16_777_216, 0, 16_777_216, 0, 16_777_216]


async def test_describe_names_every_source(stack: Callable[..., Any]) -> None:
    sim, adapter, *_ = await stack("pod-resize-done.json")
    await eventually(lambda: adapter.describe()["pod"] is not None)
    d = adapter.describe()
    assert d["cgroup"]["cpu.max"]["source"].endswith("cpu.max")
    assert d["cgroup"]["memory.max"]["value"] == 12 * GiB
    assert d["cpus_allowed"] == {"value": 16, "source": "os.sched_getaffinity(0)"}
    assert d["pod"]["source"] == "GET /api/v1/namespaces/sim/pods/sim-bridge-0"
    assert d["pod"]["resize"] == "None"
    assert d["pod_source"]["api"] == sim.url and d["pod_source"]["connected"]
    assert d["plan"]["workers"]["value"] == 4
    assert "cpu.max" in d["plan"]["workers"]["why"]
    json.dumps(d)  # JSON-able for /debug/resources


async def test_from_settings_env_form(cg: Path) -> None:
    sim = KubeSim(load("pod-running-initial.json"), cgroup_dir=None)
    await sim.start()
    try:
        env = {
            "BRIDGE_CGROUP_ROOT": str(cg),
            "BRIDGE_KUBE_API": sim.url,
            "BRIDGE_POD_NAME": "sim-bridge-0",
            "BRIDGE_POD_NAMESPACE": "sim",
        }
        target = FakeTarget()
        settings = AdapterSettings(poll_interval=0.01, plan=PlanSettings(reserve_fraction=0.5))
        adapter = Adapter.from_settings(
            target,
            CollectorRegistry(),
            settings_mod.load(env=env),
            settings=settings,
            gpu=GpuProbe(None),
        )
        async with adapter:
            await eventually(lambda: adapter.describe()["pod"] is not None)
            assert target.ring == (GiB - 64 * MiB, (GiB - 64 * MiB) // 2)
        no_cluster = Adapter.from_settings(
            FakeTarget(), CollectorRegistry(), settings_mod.Settings(cgroup_root=str(cg))
        )
        assert no_cluster.describe()["pod_source"] is None
    finally:
        await sim.stop()


async def test_cli_prints_values_and_sources(stack: Callable[..., Any], tmp_path: Path) -> None:
    """``simbridge resources --json`` (run as ``python -m bridge.resources``) against kubesim."""
    sim, *_ = await stack("pod-resize-done-v1.36-health.json")
    env = {
        **os.environ,
        "BRIDGE_CGROUP_ROOT": str(tmp_path / "cg-sim"),
        "BRIDGE_KUBE_API": sim.url,
        "BRIDGE_POD_NAME": "sim-bridge-0",
        "BRIDGE_POD_NAMESPACE": "sim",
    }
    for args in (["--json"], []):
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bridge.resources",
            *args,
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), 30)
        assert proc.returncode == 0, err.decode()
        if args:
            data = json.loads(out)
            assert data["cgroup"]["cpu.max"]["value"]["cores"] == 4.0
            assert data["cgroup"]["memory.max"]["source"] == str(tmp_path / "cg-sim" / "memory.max")
            assert data["pod"]["resize"] == "None" and data["pod_source"]["configured"]
            assert data["devices"][0]["uuid"] == MIG_UUID
            assert data["devices"][0]["health"] == "Healthy"
            workers = min(4, len(os.sched_getaffinity(0)))  # clamped to this machine's CPUs
            assert data["plan"]["workers"]["value"] == workers
        else:
            text = out.decode()
            assert "cpu.max: " in text and "<- " + str(tmp_path / "cg-sim" / "cpu.max") in text
            assert f"workers: {min(4, len(os.sched_getaffinity(0)))}" in text


async def test_pod_watch_reconnects_after_the_server_ends_it(stack: Callable[..., Any]) -> None:
    sim, adapter, target, _, client = await stack("pod-running-initial.json")
    await eventually(lambda: sim.open_watches == 1)

    def watches() -> list[str]:
        return [t for m, t in sim.requests_seen if m == "GET" and "watch=" in t]

    before = len(watches())
    sim.end_watches()  # e.g. an API server restart
    # A new watch, resumed from the last resourceVersion seen (no re-list needed).
    await eventually(lambda: len(watches()) > before and sim.open_watches == 1)
    assert "resourceVersion=" in watches()[-1]
    await client.patch(RESIZE, load("resize-patch-body.json"))
    await eventually(lambda: (adapter.describe()["pod"] or {}).get("generation") == 2)
    await eventually(lambda: target.workers == 4)


async def test_container_name_from_env(cg: Path) -> None:
    pod = load("pod-level-resize-inprogress-v1.36.json")
    sim = KubeSim(pod, cgroup_dir=None)
    await sim.start()
    try:
        env = {
            "BRIDGE_CGROUP_ROOT": str(cg),
            "BRIDGE_KUBE_API": sim.url,
            "BRIDGE_POD_NAME": "sim-bridge-pl-0",
            "BRIDGE_POD_NAMESPACE": "sim",
            "BRIDGE_CONTAINER_NAME": "telemetry",
        }
        adapter = Adapter.from_settings(
            FakeTarget(), CollectorRegistry(), settings_mod.load(env=env), gpu=GpuProbe(None)
        )
        assert adapter.settings.plan.container == "telemetry"
    finally:
        await sim.stop()


# A child process that moves itself into the given v1 cpu cgroup, finds its own cgroup the real
# way (/proc/self/cgroup + mountinfo) and prints one JSON line per applied re-plan.
_CHILD = """
import asyncio, json, sys
from prometheus_client import CollectorRegistry
from bridge.resources.adapt import Adapter, AdapterSettings
from bridge.resources.cgroup import open_cgroup
from bridge.resources.gpu import GpuProbe

with open(sys.argv[1] + "/cgroup.procs", "w") as f:
    f.write("0")  # "0" = the writing process

class T:
    def resize_workers(self, w): pass
    def set_memory_budget(self, t, f): pass
    def set_gpu_healthy(self, h): pass
    def active_streams(self): return 1
    def memory_baseline_bytes(self): return 0

def report(change):
    print(json.dumps({"cores": change.plan.cpu_limit_cores, "workers": change.plan.workers}),
          flush=True)

async def main():
    adapter = Adapter(T(), CollectorRegistry(), cgroup=open_cgroup(), gpu=GpuProbe(None),
                      settings=AdapterSettings(poll_interval=0.01), on_applied=report)
    print(json.dumps({"location": adapter.describe()["cgroup"]["location"]}), flush=True)
    async with adapter:
        await asyncio.sleep(30)

asyncio.run(main())
"""


@pytest.mark.cgroup
async def test_real_v1_cpu_quota_change_is_seen(tmp_path: Path) -> None:
    """On the project's CI hosts the cpu controller is real and writable as root."""
    base = Path("/sys/fs/cgroup/cpu")
    if (
        os.geteuid() != 0
        or not (base / "cpu.cfs_quota_us").exists()
        or not os.access(base, os.W_OK)
    ):
        pytest.skip("needs root and a writable cgroup v1 cpu controller at /sys/fs/cgroup/cpu")
    group = base / f"simbridge-test-{os.getpid()}"
    group.mkdir()
    proc = None
    try:
        (group / "cpu.cfs_quota_us").write_text("50000")
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            _CHILD,
            str(group),
            stdout=asyncio.subprocess.PIPE,
            cwd=REPO,
        )
        stdout = proc.stdout
        assert stdout is not None

        async def line() -> dict[str, Any]:
            async with asyncio.timeout(10):
                data: dict[str, Any] = json.loads(await stdout.readline())
                return data

        assert f"cpu={group} " in (await line())["location"]  # found via /proc/self/cgroup
        assert (await line()) == {"cores": 0.5, "workers": 1}
        (group / "cpu.cfs_quota_us").write_text("150000")
        assert (await line()) == {"cores": 1.5, "workers": min(2, len(os.sched_getaffinity(0)))}
        (group / "cpu.cfs_quota_us").write_text("-1")
        got = await line()
        assert got["cores"] is None
    finally:
        if proc is not None and proc.returncode is None:
            proc.kill()
            await proc.wait()
        for _ in range(50):  # the kernel removes the task from the group shortly after exit
            try:
                group.rmdir()
                break
            except OSError:
                await asyncio.sleep(0.05)
