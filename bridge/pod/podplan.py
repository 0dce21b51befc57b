"""The pod's plan: how many ingest processes, and each one's share of the memory limit, the CPU
and the decimation workers. Sans-I/O: a function of one cgroup reading, the affinity set and the
settings (``bridge.resources.processes`` decides N; this module adds what each process gets).

Memory: the pod's limit holds the supervisor (its measured RSS plus a margin: ``reserve``) and N
processes. Each process plans its data budget from ``share = (limit - reserve) // N`` as a
single process plans from the whole limit: its own baseline, its headroom and its budget all
come out of its share, so the sum of every process's RSS stays within the limit. A process the
limit cannot hold (its baseline, its headroom and the smallest budget) is never planned.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from bridge.config.settings import Settings
from bridge.resources.from_settings import PROBE_CHILD_BYTES, memory_headroom_bytes
from bridge.resources.plan import PlanSettings
from bridge.resources.processes import DEFAULT_PER_PROCESS_BYTES, ProcessPlan, plan_processes

MiB = 1 << 20
SUPERVISOR_MARGIN_BYTES = 16 * MiB  # the supervisor's own growth: ops requests, metric merges


def per_process_bytes(settings: Settings) -> int:
    """What one more ingest process needs at least: an idle interpreter with the data plane
    loaded (``DEFAULT_PER_PROCESS_BYTES``), the headroom its plan keeps (without a probe child:
    in a pod the supervisor answers the probes) and the smallest data budget."""
    headroom = memory_headroom_bytes(settings.max_frame_bytes) - PROBE_CHILD_BYTES
    return DEFAULT_PER_PROCESS_BYTES + headroom + PlanSettings().min_budget_bytes


@dataclass(frozen=True, slots=True)
class Share:
    """What one process is told (the control channel's ``share``)."""

    memory_limit_bytes: int | None
    cpu_cores: float | None
    workers: int
    processes: int


@dataclass(frozen=True, slots=True)
class PodPlan:
    processes: ProcessPlan
    share: Share
    memory_limit_bytes: int | None
    reserve_bytes: int
    per_process_bytes: int

    @property
    def count(self) -> int:
        return self.processes.processes

    def as_dict(self) -> dict[str, Any]:
        return {
            **self.processes.as_dict(),
            "memory_limit_bytes": self.memory_limit_bytes,
            "supervisor_reserve_bytes": self.reserve_bytes,
            "per_process_min_bytes": self.per_process_bytes,
            "share": {
                "memory_limit_bytes": self.share.memory_limit_bytes,
                "cpu_cores": self.share.cpu_cores,
                "workers": self.share.workers,
            },
        }


def _first_process(plan: ProcessPlan, limit: int, reserve: int, cpus: int) -> ProcessPlan:
    """The first process runs whenever its interpreter fits, at the smallest data budget, as a
    single bridge does under a small limit (frames that can never fit are refused, and the
    edges are told ``max_frame_bytes``); only the extra ones need a whole ``per_process``."""
    if limit < reserve + DEFAULT_PER_PROCESS_BYTES:
        return plan
    reasons = dict(plan.reasons)
    reasons["processes"] = (
        f"1: the limit holds the supervisor and one process at the smallest data budget, no "
        f"more ({reasons.get('memory', '')})"
    )
    workers = max(1, min(cpus, math.ceil(plan.cores - 1e-9)))
    return ProcessPlan(1, workers, plan.cores, 1, reasons)


def plan_pod(
    settings: Settings,
    cpu_quota_cores: float | None,
    affinity_cpus: int,
    memory_limit_bytes: int | None,
    supervisor_rss_bytes: int,
) -> PodPlan:
    reserve = supervisor_rss_bytes + SUPERVISOR_MARGIN_BYTES
    per_process = per_process_bytes(settings)
    plan = plan_processes(
        cpu_quota_cores,
        affinity_cpus,
        memory_limit_bytes,
        baseline_bytes=reserve,
        per_process_bytes=per_process,
        setting=settings.processes,
    )
    if plan.refused and memory_limit_bytes is not None:
        plan = _first_process(plan, memory_limit_bytes, reserve, affinity_cpus)
    n = plan.processes
    memory_share = (
        None if memory_limit_bytes is None or n == 0 else (memory_limit_bytes - reserve) // n
    )
    cpu_share = None if cpu_quota_cores is None or n == 0 else plan.cores / n
    workers = settings.workers or plan.workers_per_process
    share = Share(memory_share, cpu_share, workers, n)
    return PodPlan(plan, share, memory_limit_bytes, reserve, per_process)
