"""The resize plan: a pure function of a :class:`Snapshot` and :class:`PlanSettings`
(docs/design.md §4).

    workers   = clamp(ceil(cpu quota), 1, CPUs in the affinity set)
    budget    = memory limit - measured baseline - headroom; unlimited → a fixed cap
    reserve   = max(reserve_fraction * budget, min(min_reserve_bytes, budget / 2))
                (forward progress: decimation, pushes in flight)
    ring      = budget - reserve: what transport receive and the rings may hold together
    per stream= ring split fairly over the active streams, no floor (a larger frame borrows)
    GPU batch = points that fit in a fraction of the free memory of the device we use

The budget is what :class:`bridge.server.governor.Governor` charges every byte held for data to.

The effective memory limit is the smallest of: the cgroup's ``memory.max`` (v1
``memory.limit_in_bytes``), ``memory.high`` (above it the kernel throttles by reclaim), and — the
cooperative downscale — the Pod's *desired* memory limit when it is below the actual one (the
kubelet will not apply a decrease below usage; planning for it first lets its check pass),
and the Pod's actual (enacted) limit, which stands in when no cgroup value is visible.

Every value carries a reason naming where its inputs came from, for logs and ``/debug/resources``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from bridge.resources.pod import AllocatedDevice, pending_memory_decrease
from bridge.resources.quantity import format_bytes
from bridge.resources.snapshot import GpuDevice, GpuReading, Snapshot

MiB = 1 << 20
GiB = 1 << 30


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanSettings:
    """Tunables of the plan; sizes in bytes. Defaults suit a 1-16 core, 1-64 GiB pod."""

    # Memory
    reserve_fraction: float = 0.25
    # The reserve never holds less than forward progress needs at once (one push in flight,
    # charged as its copies): below that a forced push overdraws the budget (issue 29: a 30 MiB
    # push on a 47 MiB budget after a live shrink). Capped at half the budget.
    min_reserve_bytes: int = 0
    headroom_bytes: int = 64 * MiB
    # The data budget never goes below this: a limit that leaves less after the headroom takes
    # it from the headroom, so a squeezed pod pauses and keeps its edges instead of refusing
    # every frame and closing every connection (a held resize then resolves once usage falls).
    min_budget_bytes: int = 16 * MiB
    unlimited_memory_cap_bytes: int = 1 * GiB
    use_memory_high: bool = True
    # CPU
    max_workers: int | None = None
    # GPU
    gpu_memory_fraction: float = 0.5
    gpu_bytes_per_point: int = 32  # xyz float32 in + int64 voxel key + index + output, rounded
    gpu_min_batch_points: int = 65_536
    gpu_max_batch_points: int = 16_777_216
    # Which container of the Pod is the bridge (None: the first one)
    container: str | None = None

    def __post_init__(self) -> None:
        problems = []
        if not 0 <= self.reserve_fraction < 1:
            problems.append(f"reserve_fraction must be in [0, 1), got {self.reserve_fraction}")
        if not 0 < self.gpu_memory_fraction <= 1:
            problems.append(
                f"gpu_memory_fraction must be in (0, 1], got {self.gpu_memory_fraction}"
            )
        for name in (
            "headroom_bytes",
            "unlimited_memory_cap_bytes",
            "min_budget_bytes",
            "min_reserve_bytes",
        ):
            if getattr(self, name) < 0:
                problems.append(f"{name} must be >= 0")
        if self.gpu_bytes_per_point <= 0:
            problems.append("gpu_bytes_per_point must be > 0")
        if not 0 < self.gpu_min_batch_points <= self.gpu_max_batch_points:
            problems.append("need 0 < gpu_min_batch_points <= gpu_max_batch_points")
        if self.max_workers is not None and self.max_workers < 1:
            problems.append("max_workers must be >= 1")
        if problems:
            raise ValueError("; ".join(problems))


@dataclass(frozen=True, slots=True)
class Plan:
    workers: int
    data_budget_bytes: int  # the governor's budget: every byte held for data
    reserve_bytes: int  # part of it kept for forward progress
    ring_budget_bytes: int  # admission limit = data budget - reserve
    per_stream_bytes: int  # fair share of the admission limit
    gpu_batch_points: int  # 0: decimate on the CPU
    gpu_healthy: bool
    cpu_limit_cores: float | None  # None: unlimited
    memory_limit_bytes: int | None  # effective limit planned for; None: unlimited
    reasons: Mapping[str, str] = field(default_factory=dict, compare=False)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)}
        out["reasons"] = dict(self.reasons)
        return out


def _workers(snap: Snapshot, s: PlanSettings, reasons: dict[str, str]) -> tuple[int, float | None]:
    cpus = max(1, snap.cpus_allowed.value)
    cap = min(cpus, s.max_workers) if s.max_workers is not None else cpus
    cap_why = f"{cpus} CPUs in the affinity set ({snap.cpus_allowed.source})"
    if s.max_workers is not None and s.max_workers < cpus:
        cap_why += f", max_workers={s.max_workers}"
    cpu = snap.cgroup.cpu_max
    if cpu is not None:
        q = cpu.value
        if q.quota_us is None:
            reasons["workers"] = f"no cpu quota ({cpu.source}: max); {cap_why}"
            return cap, None
        wanted = -(-q.quota_us // q.period_us)  # exact ceil, no float rounding
        cores = q.quota_us / q.period_us
        reasons["workers"] = (
            f"ceil({cores:g} cores = {q.quota_us}/{q.period_us} from {cpu.source}) = {wanted}, "
            f"clamped to 1..{cap} ({cap_why})"
        )
        return max(1, min(wanted, cap)), cores
    container = snap.pod.container(s.container) if snap.pod is not None else None
    if container is not None and container.actual is not None:
        lim = container.actual.cpu_limit_m
        if lim is not None:
            wanted = -(-lim // 1000)
            reasons["workers"] = (
                f"no cgroup cpu limit visible; pod status.containerStatuses[{container.name}]"
                f".resources.limits.cpu={lim}m → {wanted}, clamped to 1..{cap} ({cap_why})"
            )
            return max(1, min(wanted, cap)), lim / 1000
    reasons["workers"] = f"no cpu limit known; {cap_why}"
    return cap, None


def effective_memory_limit(snap: Snapshot, s: PlanSettings) -> tuple[int | None, str]:
    """The smallest applicable memory limit and a sentence saying where it came from."""
    candidates: list[tuple[int, str]] = []
    cg = snap.cgroup
    if cg.memory_max is not None and cg.memory_max.value is not None:
        candidates.append((cg.memory_max.value, f"{cg.memory_max.source}"))
    if s.use_memory_high and cg.memory_high is not None and cg.memory_high.value is not None:
        candidates.append((cg.memory_high.value, f"{cg.memory_high.source} (memory.high)"))
    if snap.pod is not None:
        target = pending_memory_decrease(snap.pod, s.container)
        if target is not None:
            state = snap.pod.resize_state().value
            candidates.append(
                (target.limit_bytes, f"cooperative downscale: {target.source}, resize {state}")
            )
        # The enacted limit as the Pod reports it. Usually equal to the cgroup's; it also
        # stands in when no cgroup is visible, and it closes the window in which the watch
        # reports a completed decrease before the next cgroup poll has seen the file change.
        c = snap.pod.container(s.container)
        if c is not None and c.actual is not None and c.actual.memory_limit is not None:
            candidates.append(
                (
                    c.actual.memory_limit,
                    f"pod status.containerStatuses[{c.name}].resources.limits.memory",
                )
            )
    if not candidates:
        if cg.memory_max is not None:
            return None, f"no limit in {cg.memory_max.source}"
        return None, "no memory limit visible"
    value, why = min(candidates, key=lambda c: c[0])
    return value, why


def _ring(
    snap: Snapshot, s: PlanSettings, reasons: dict[str, str]
) -> tuple[int, int, int, int | None]:
    limit, why = effective_memory_limit(snap, s)
    reasons["memory_limit_bytes"] = (
        f"unlimited: {why}" if limit is None else (f"{format_bytes(limit)} from {why}")
    )
    streams = max(0, snap.workload.active_streams)
    if limit is None:
        budget = s.unlimited_memory_cap_bytes
        reasons["data_budget_bytes"] = (
            f"memory unlimited → configured cap {format_bytes(budget)} (unlimited_memory_cap_bytes)"
        )
    else:
        left = limit - snap.workload.baseline_bytes - s.headroom_bytes
        budget = max(s.min_budget_bytes, left)
        reasons["data_budget_bytes"] = (
            f"{format_bytes(limit)} limit - {format_bytes(snap.workload.baseline_bytes)} "
            f"baseline - {format_bytes(s.headroom_bytes)} headroom = {format_bytes(max(0, left))}"
        )
        if budget > left:
            reasons["data_budget_bytes"] += (
                f", below the floor: {format_bytes(budget)} (min_budget_bytes, taken from the "
                "headroom)"
            )
    reserve = math.floor(s.reserve_fraction * budget)
    reasons["reserve_bytes"] = f"{s.reserve_fraction:g} * budget = {format_bytes(reserve)}"
    if reserve < min(s.min_reserve_bytes, budget // 2):
        reserve = min(s.min_reserve_bytes, budget // 2)
        reasons["reserve_bytes"] = (
            f"{format_bytes(reserve)}: what one push in flight needs (min_reserve_bytes, at most "
            f"half the budget), more than {s.reserve_fraction:g} * budget"
        )
    ring = budget - reserve
    reasons["ring_budget_bytes"] = (
        f"budget - reserve = {format_bytes(ring)} (transport receive + rings together)"
    )
    share = ring // streams if streams else ring
    reasons["per_stream_bytes"] = (
        f"{format_bytes(ring)} / {streams} active streams, no floor "
        "(a frame above its share waits for room in the whole admission limit)"
    )
    return budget, reserve, share, limit


def _pick_device(gpu: GpuReading, devices: tuple[AllocatedDevice, ...]) -> GpuDevice | None:
    """The NVML device the decimator will use: the one a DRA claim names (by UUID) if any, else a
    MIG instance (the parent GPU's memory is not ours), else the GPU with most free memory."""
    candidates = list(gpu.devices)
    claimed = {d.uuid for d in devices if d.uuid}
    by_claim = [d for d in candidates if d.uuid in claimed]
    if by_claim:
        candidates = by_claim
    elif any(d.is_mig for d in candidates):
        candidates = [d for d in candidates if d.is_mig]
    if not candidates:
        return None
    return max(candidates, key=lambda d: (d.healthy, d.memory_free_bytes))


def _gpu(snap: Snapshot, s: PlanSettings, reasons: dict[str, str]) -> tuple[int, bool]:
    unhealthy_claims = [d for d in snap.devices if d.health == "Unhealthy"]
    if unhealthy_claims:
        d = unhealthy_claims[0]
        msg = f": {d.health_message}" if d.health_message else ""
        reasons["gpu_healthy"] = (
            f"false: allocatedResourcesStatus reports {d.ref.resource_id} Unhealthy{msg}"
        )
        reasons["gpu_batch_points"] = "0: GPU unhealthy, decimating on CPU"
        return 0, False
    gpu = snap.gpu
    if gpu is None or not gpu.available:
        why = "NVML not available" if gpu is None else "; ".join(gpu.problems) or "no NVML"
        reasons["gpu_healthy"] = f"false: no GPU ({why})"
        reasons["gpu_batch_points"] = "0: no GPU, decimating on CPU"
        return 0, False
    dev = _pick_device(gpu, snap.devices)
    if dev is None:
        reasons["gpu_healthy"] = "false: NVML shows no device"
        reasons["gpu_batch_points"] = "0: no GPU, decimating on CPU"
        return 0, False
    if not dev.healthy:
        reasons["gpu_healthy"] = f"false: NVML error on {dev.name} {dev.uuid}: {dev.problem}"
        reasons["gpu_batch_points"] = "0: GPU unhealthy, decimating on CPU"
        return 0, False
    usable = math.floor(s.gpu_memory_fraction * dev.memory_free_bytes)
    points = usable // s.gpu_bytes_per_point
    reasons["gpu_healthy"] = f"true: {dev.name} {dev.uuid} (NVML)"
    base = (
        f"{s.gpu_memory_fraction:g} * {format_bytes(dev.memory_free_bytes)} free on {dev.name} "
        f"/ {s.gpu_bytes_per_point} B per point = {points}"
    )
    if points < s.gpu_min_batch_points:
        reasons["gpu_batch_points"] = f"0: {base} < minimum {s.gpu_min_batch_points}, CPU instead"
        return 0, True
    batch = min(points, s.gpu_max_batch_points)
    reasons["gpu_batch_points"] = base + (
        f", capped at {s.gpu_max_batch_points}" if batch < points else ""
    )
    return batch, True


def make_plan(snapshot: Snapshot, settings: PlanSettings | None = None) -> Plan:
    """Compute the plan; pure and deterministic (same snapshot and settings → same plan)."""
    s = settings or PlanSettings()
    reasons: dict[str, str] = {}
    workers, cores = _workers(snapshot, s, reasons)
    budget, reserve, share, limit = _ring(snapshot, s, reasons)
    batch, healthy = _gpu(snapshot, s, reasons)
    if snapshot.cgroup.problems:
        reasons["problems"] = "; ".join(snapshot.cgroup.problems)
    return Plan(
        workers=workers,
        data_budget_bytes=budget,
        reserve_bytes=reserve,
        ring_budget_bytes=budget - reserve,
        per_stream_bytes=share,
        gpu_batch_points=batch,
        gpu_healthy=healthy,
        cpu_limit_cores=cores,
        memory_limit_bytes=limit,
        reasons=reasons,
    )
