"""make_plan: table-driven cases over cpu, memory (incl. cooperative downscale) and GPU inputs."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from bridge.resources.cgroup_parse import CpuMax
from bridge.resources.gpu import GpuProbe
from bridge.resources.plan import Plan, PlanSettings, effective_memory_limit, make_plan
from bridge.resources.pod import (
    AllocatedDevice,
    DeviceRef,
    PodView,
    parse_pod,
)
from bridge.resources.snapshot import (
    CgroupReading,
    GpuDevice,
    GpuReading,
    Snapshot,
    Sourced,
    Workload,
)

K8S = Path(__file__).resolve().parent.parent / "fixtures" / "k8s"
MiB = 1 << 20
GiB = 1 << 30
UNL = "unlimited"  # marker for "no value in the cgroup file" (max / -1)


def pod(name: str) -> PodView:
    obj: dict[str, Any] = json.loads((K8S / name).read_text())
    return parse_pod(obj)


def snap(
    *,
    cpu: tuple[int, int] | str | None = None,
    mem: int | str | None = None,
    high: int | None = None,
    cpus: int = 16,
    streams: int = 0,
    baseline: int = 0,
    pod_view: PodView | None = None,
    gpu: GpuReading | None = None,
    devices: tuple[AllocatedDevice, ...] = (),
) -> Snapshot:
    cpu_max = None
    if cpu == UNL:
        cpu_max = Sourced(CpuMax(None, 100_000), "cpu.max")
    elif isinstance(cpu, tuple):
        cpu_max = Sourced(CpuMax(*cpu), "cpu.max")
    memory_max = None
    if mem == UNL:
        memory_max = Sourced(None, "memory.max")
    elif isinstance(mem, int):
        memory_max = Sourced(mem, "memory.max")
    cg = CgroupReading(
        version="v2",
        location="/test",
        cpu_max=cpu_max,
        memory_max=memory_max,
        memory_high=Sourced(high, "memory.high") if high is not None else None,
    )
    return Snapshot(
        cgroup=cg,
        cpus_allowed=Sourced(cpus, "os.sched_getaffinity"),
        pod=pod_view,
        gpu=gpu,
        devices=devices,
        workload=Workload(active_streams=streams, baseline_bytes=baseline),
    )


# --------------------------------------------------------------------------------- workers


@pytest.mark.parametrize(
    ("cpu", "cpus", "max_workers", "workers", "cores"),
    [
        ((200_000, 100_000), 16, None, 2, 2.0),
        ((250_000, 100_000), 16, None, 3, 2.5),  # ceil
        ((200_001, 100_000), 16, None, 3, 2.00001),  # exact integer ceil, no float slop
        ((25_000, 100_000), 16, None, 1, 0.25),  # at least one worker
        ((1_000, 100_000), 16, None, 1, 0.01),
        ((4_000_000, 100_000), 8, None, 8, 40.0),  # clamped to the affinity set
        (UNL, 6, None, 6, None),  # unlimited: every CPU we may run on
        (None, 6, None, 6, None),  # no file at all
        ((800_000, 100_000), 16, 4, 4, 8.0),  # configured cap
        ((100_000, 50_000), 16, None, 2, 2.0),  # non-default period
    ],
)
def test_workers(
    cpu: tuple[int, int] | str | None,
    cpus: int,
    max_workers: int | None,
    workers: int,
    cores: float | None,
) -> None:
    plan = make_plan(snap(cpu=cpu, cpus=cpus), PlanSettings(max_workers=max_workers))
    assert (plan.workers, plan.cpu_limit_cores) == (workers, cores)
    assert "workers" in plan.reasons


def test_workers_fall_back_to_pod_limit_without_cgroup() -> None:
    plan = make_plan(snap(pod_view=pod("pod-resize-done.json")))
    assert plan.workers == 4 and plan.cpu_limit_cores == 4.0
    assert "status.containerStatuses[bridge]" in plan.reasons["workers"]


# --------------------------------------------------------------------------------- memory

S = PlanSettings()  # reserve 0.25, headroom 64 MiB, cap 1 GiB


@pytest.mark.parametrize(
    ("mem", "high", "baseline", "streams", "budget", "share"),
    [
        # 1 GiB - 64 MiB = 960 MiB; ring = 0.75 * 960 = 720 MiB, 4 streams -> 180 MiB each
        (GiB, None, 0, 4, 960 * MiB, 180 * MiB),
        # baseline is subtracted: 1 GiB - 256 MiB - 64 MiB = 704 MiB, ring 528 MiB
        (GiB, None, 256 * MiB, 0, 704 * MiB, 528 * MiB),
        # unlimited -> the configured cap
        (UNL, None, 0, 2, GiB, 384 * MiB),
        (None, None, 0, 2, GiB, 384 * MiB),
        # memory.high is lower than memory.max: it wins
        (GiB, 512 * MiB, 0, 1, 448 * MiB, 336 * MiB),
        # limit below baseline + headroom: the floor (16 MiB, taken from the headroom), so a
        # squeezed pod pauses its edges rather than refusing every frame
        (100 * MiB, None, 80 * MiB, 3, 16 * MiB, (12 * MiB) // 3),
        # many streams: a small share, never a floor above it
        (GiB, None, 0, 1000, 960 * MiB, (720 * MiB) // 1000),
        # fair split rounds down
        (GiB, None, 0, 7, 960 * MiB, (720 * MiB) // 7),
    ],
)
def test_memory_budget(
    mem: int | str | None,
    high: int | None,
    baseline: int,
    streams: int,
    budget: int,
    share: int,
) -> None:
    plan = make_plan(snap(mem=mem, high=high, baseline=baseline, streams=streams), S)
    assert (plan.data_budget_bytes, plan.per_stream_bytes) == (budget, share)
    assert plan.reserve_bytes == budget // 4
    assert plan.ring_budget_bytes == budget - plan.reserve_bytes


def test_the_demo_cut_to_86_mi_plans_what_it_can_hold() -> None:
    """The old plan gave a 0 MiB ring budget and a 16 MiB per-stream floor at 86 Mi: the
    budget now follows the limit and no stream is promised more than its share."""
    s = PlanSettings(headroom_bytes=64 * MiB)
    plan = make_plan(snap(mem=86 * MiB, baseline=12 * MiB, streams=4), s)
    assert plan.data_budget_bytes == 10 * MiB + 6 * MiB  # 86 - 12 - 64, raised to the floor
    assert "below the floor" in plan.reasons["data_budget_bytes"]
    assert plan.per_stream_bytes * 4 <= plan.ring_budget_bytes < plan.data_budget_bytes


def test_settings_change_the_budget() -> None:
    s = PlanSettings(reserve_fraction=0.5, headroom_bytes=0, unlimited_memory_cap_bytes=2 * GiB)
    assert make_plan(snap(mem=4 * GiB), s).ring_budget_bytes == 2 * GiB
    assert make_plan(snap(mem=UNL), s).ring_budget_bytes == GiB


def test_memory_high_can_be_ignored() -> None:
    s = PlanSettings(use_memory_high=False)
    assert make_plan(snap(mem=GiB, high=512 * MiB), s).memory_limit_bytes == GiB


@pytest.mark.parametrize(
    ("fixture", "cgroup_mem", "effective", "why"),
    [
        # kubelet has not lowered memory.max yet (Error: usage above the new limit): plan for 6 Gi
        ("pod-resize-mem-decrease-blocked.json", 12 * GiB, 6 * GiB, "cooperative downscale"),
        # an increase pending: the cgroup value stands
        ("pod-resize-deferred.json", 8 * GiB, 8 * GiB, "memory.max"),
        ("pod-resize-done.json", 12 * GiB, 12 * GiB, "memory.max"),
        # the cgroup is already lower than anything the pod says
        ("pod-resize-mem-decrease-blocked.json", 4 * GiB, 4 * GiB, "memory.max"),
        # the watch reported the enacted 8 GiB before the next cgroup poll saw the file change
        ("pod-running-initial.json", 12 * GiB, 8 * GiB, "status.containerStatuses[bridge]"),
    ],
)
def test_cooperative_downscale(fixture: str, cgroup_mem: int, effective: int, why: str) -> None:
    plan = make_plan(snap(mem=cgroup_mem, pod_view=pod(fixture), streams=2), S)
    assert plan.memory_limit_bytes == effective
    assert why in plan.reasons["memory_limit_bytes"]
    assert plan.data_budget_bytes == effective - 64 * MiB


def test_downscale_plans_smaller_before_the_kubelet_applies_it() -> None:
    before = make_plan(snap(mem=12 * GiB, pod_view=pod("pod-resize-done.json")))
    during = make_plan(snap(mem=12 * GiB, pod_view=pod("pod-resize-mem-decrease-blocked.json")))
    assert during.ring_budget_bytes < before.ring_budget_bytes
    assert "Error" in during.reasons["memory_limit_bytes"]


def test_pod_limit_stands_in_without_cgroup() -> None:
    limit, why = effective_memory_limit(snap(pod_view=pod("pod-resize-done.json")), S)
    assert limit == 12 * GiB and "containerStatuses[bridge]" in why


# --------------------------------------------------------------------------------- GPU


def gpu_dev(
    uuid: str,
    total: int,
    used: int,
    *,
    mig: bool = False,
    healthy: bool = True,
    problem: str | None = None,
) -> GpuDevice:
    return GpuDevice(
        index=uuid[-1],
        uuid=uuid,
        name="NVIDIA H200" if not mig else "MIG 3g.71gb",
        memory_total_bytes=total,
        memory_used_bytes=used,
        healthy=healthy,
        is_mig=mig,
        problem=problem,
    )


def claimed(uuid: str | None, health: str = "Unknown") -> AllocatedDevice:
    return AllocatedDevice(
        pod_claim="gpu",
        claim="c",
        ref=DeviceRef("mig", "gpu.nvidia.com", "node", "dev"),
        uuid=uuid,
        health=health,
        health_message="XID 79" if health == "Unhealthy" else "",
    )


@pytest.mark.parametrize(
    ("gpu", "devices", "batch", "healthy"),
    [
        (None, (), 0, False),
        (GpuReading(available=False, problems=("NVML Shared Library Not Found",)), (), 0, False),
        (GpuReading(available=True), (), 0, False),  # NVML but nothing visible
        # 0.5 * 1 GiB free / 32 B = 16 Mi points -> exactly the max
        (GpuReading(True, (gpu_dev("GPU-a", 2 * GiB, GiB),)), (), 16 * MiB, True),
        # capped at max
        (GpuReading(True, (gpu_dev("GPU-a", 140 * GiB, 0),)), (), 16_777_216, True),
        # 0.5 * 64 MiB / 32 = 1 Mi points
        (GpuReading(True, (gpu_dev("GPU-a", GiB, GiB - 64 * MiB),)), (), MiB, True),
        # too little free memory: CPU, though healthy
        (GpuReading(True, (gpu_dev("GPU-a", GiB, GiB - MiB),)), (), 0, True),
        # NVML error on the device: unhealthy
        (
            GpuReading(True, (gpu_dev("GPU-a", GiB, 0, healthy=False, problem="GPU is lost"),)),
            (),
            0,
            False,
        ),
        # MIG instance preferred over its parent GPU (parent memory is not ours)
        (
            GpuReading(
                True,
                (gpu_dev("GPU-p", 141 * GiB, 0), gpu_dev("MIG-1", 128 * MiB, 0, mig=True)),
            ),
            (),
            2 * MiB,
            True,
        ),
        # the DRA-claimed UUID wins
        (
            GpuReading(True, (gpu_dev("GPU-a", GiB, 0), gpu_dev("GPU-b", 256 * MiB, 0))),
            (claimed("GPU-b"),),
            4 * MiB,
            True,
        ),
        # kubelet says Unhealthy (allocatedResourcesStatus): CPU regardless of NVML
        (GpuReading(True, (gpu_dev("GPU-a", GiB, 0),)), (claimed("GPU-a", "Unhealthy"),), 0, False),
        # Unknown health is not a failure
        (
            GpuReading(True, (gpu_dev("GPU-a", 2 * GiB, GiB),)),
            (claimed("GPU-a", "Unknown"),),
            16 * MiB,
            True,
        ),
    ],
)
def test_gpu(
    gpu: GpuReading | None, devices: tuple[AllocatedDevice, ...], batch: int, healthy: bool
) -> None:
    plan = make_plan(snap(gpu=gpu, devices=devices))
    assert (plan.gpu_batch_points, plan.gpu_healthy) == (batch, healthy)
    assert plan.reasons["gpu_healthy"].startswith("true" if healthy else "false")


def test_unhealthy_reason_names_the_device_and_message() -> None:
    gpu = GpuReading(True, (gpu_dev("GPU-a", GiB, 0),))
    plan = make_plan(snap(gpu=gpu, devices=(claimed("GPU-a", "Unhealthy"),)))
    assert "gpu.nvidia.com/node/dev Unhealthy: XID 79" in plan.reasons["gpu_healthy"]


# --------------------------------------------------------------------------------- misc


def test_plan_is_pure_and_comparable() -> None:
    a = make_plan(snap(cpu=(200_000, 100_000), mem=GiB, streams=3))
    b = make_plan(snap(cpu=(200_000, 100_000), mem=GiB, streams=3))
    assert a == b and a.as_dict() == b.as_dict()
    c = replace(a, reasons={"other": "x"})
    assert c == a  # reasons do not take part in equality: same values = nothing to apply
    assert isinstance(a, Plan)


def test_problems_are_carried_into_reasons() -> None:
    s = snap(mem=GiB)
    s = replace(s, cgroup=replace(s.cgroup, problems=("cpu.max: period must be > 0, got 0",)))
    assert "period" in make_plan(s).reasons["problems"]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"reserve_fraction": -0.1},
        {"reserve_fraction": 1},
        {"gpu_memory_fraction": 0},
        {"headroom_bytes": -1},
        {"gpu_bytes_per_point": 0},
        {"gpu_min_batch_points": 10, "gpu_max_batch_points": 5},
        {"max_workers": 0},
    ],
)
def test_settings_validation(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        PlanSettings(**kwargs)


# --------------------------------------------------------------------------------- NVML probe


class FakeNVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        names = {12: "NVML Shared Library Not Found", 15: "GPU is lost", 6: "Not Found"}
        return names.get(self.value, f"NVML error {self.value}")


class FakeNvml:
    """pynvml-shaped: GPUs given as dicts; ``mig`` lists instance slots (None = empty slot)."""

    NVMLError = FakeNVMLError
    NVML_DEVICE_MIG_ENABLE = 1
    NVML_ERROR_LIBRARY_NOT_FOUND = 12
    NVML_ERROR_NOT_FOUND = 6

    def __init__(self, gpus: list[dict[str, Any]], init_error: int | None = None) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.init_calls = 0
        self.shutdowns = 0

    def nvmlInit(self) -> None:
        self.init_calls += 1
        if self.init_error is not None:
            raise FakeNVMLError(self.init_error)

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> dict[str, Any]:
        return self.gpus[i]

    def nvmlDeviceGetUUID(self, h: dict[str, Any]) -> bytes:
        return str(h["uuid"]).encode()  # older bindings return bytes

    def nvmlDeviceGetName(self, h: dict[str, Any]) -> str:
        return str(h["name"])

    def nvmlDeviceGetMemoryInfo(self, h: dict[str, Any]) -> Any:
        if h.get("error"):
            raise FakeNVMLError(h["error"])
        if h.get("bug"):
            raise TypeError("a bug, not an NVML error")
        return SimpleNamespace(total=h["total"], used=h["used"])

    def nvmlDeviceGetMigMode(self, h: dict[str, Any]) -> tuple[int, int]:
        if "mig" not in h:
            raise FakeNVMLError(3)  # NOT_SUPPORTED
        return (1, 1)

    def nvmlDeviceGetMaxMigDeviceCount(self, h: dict[str, Any]) -> int:
        return len(h["mig"])

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: dict[str, Any], j: int) -> dict[str, Any]:
        slot = h["mig"][j]
        if slot is None:
            raise FakeNVMLError(6)
        return dict(slot)


H200 = {"uuid": "GPU-h200", "name": "NVIDIA H200", "total": 141 * GiB, "used": 2 * GiB}


def test_probe_without_package_or_driver() -> None:
    assert GpuProbe(None, missing_reason="nvidia-ml-py not installed").read() == GpuReading(
        available=False, problems=("nvidia-ml-py not installed",)
    )
    nvml = FakeNvml([], init_error=12)
    probe = GpuProbe(nvml)
    first, second = probe.read(), probe.read()
    assert not first.available and "Shared Library Not Found" in first.problems[0]
    assert second == first and nvml.init_calls == 1  # no GPU is permanent: no retry per poll


def test_probe_retries_other_init_errors() -> None:
    nvml = FakeNvml([H200], init_error=999)
    probe = GpuProbe(nvml)
    assert not probe.read().available
    nvml.init_error = None
    reading = probe.read()
    assert reading.available and nvml.init_calls == 2
    assert (
        reading.devices[0].uuid == "GPU-h200" and reading.devices[0].memory_free_bytes == 139 * GiB
    )
    probe.close()
    assert nvml.shutdowns == 1


def test_probe_lists_mig_instances_and_skips_empty_slots() -> None:
    mig = {"uuid": "MIG-1", "name": "NVIDIA H200 MIG 3g.71gb", "total": 71 * GiB, "used": 0}
    gpu = {**H200, "mig": [None, mig, None]}
    reading = GpuProbe(FakeNvml([gpu])).read()
    assert [(d.index, d.uuid, d.is_mig) for d in reading.devices] == [
        ("0", "GPU-h200", False),
        ("0/1", "MIG-1", True),
    ]
    plan = make_plan(snap(gpu=reading))
    assert plan.gpu_healthy and "MIG 3g.71gb" in plan.reasons["gpu_healthy"]


def test_probe_marks_nvml_errors_unhealthy_and_does_not_hide_bugs() -> None:
    lost = {**H200, "error": 15}
    reading = GpuProbe(FakeNvml([lost])).read()
    (dev,) = reading.devices
    assert not dev.healthy and dev.problem == "GPU is lost"
    assert reading.problems == ("NVIDIA H200 0: GPU is lost",)
    assert not make_plan(snap(gpu=reading)).gpu_healthy
    with pytest.raises(TypeError):
        GpuProbe(FakeNvml([{**H200, "bug": True}])).read()


def test_probe_load_uses_pynvml_when_installed() -> None:
    probe = GpuProbe.load()
    reading = probe.read()  # on a machine without a GPU: available False, never an exception
    assert isinstance(reading, GpuReading)
    probe.close()
