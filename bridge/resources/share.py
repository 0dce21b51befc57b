"""A process's share of its pod (issue 31, docs/pod-worker.md): with several ingest processes in
one cgroup, each plans from the part the supervisor gives it, not from the whole cgroup.

Why: every process reading the pod's ``memory.max`` would plan a data budget the size of the
whole pod, N times over, and ``memory.current`` (the whole pod's usage) says nothing about one
process. So the share stands in for the cgroup's limits in the snapshot the plan reads
(:func:`shared_reading`), the process's own resident size stands in for the usage, and the
share's worker count replaces the one the plan derives from the CPU quota (:func:`shared_plan`).
Pure functions: the Adapter (bridge.resources.adapt) calls them at every re-plan.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from bridge.resources.cgroup_parse import CpuMax
from bridge.resources.plan import Plan
from bridge.resources.quantity import format_bytes
from bridge.resources.snapshot import CgroupReading, Sourced

PERIOD_US = 100_000
SOURCE = "pod share (the supervisor's plan)"


@dataclass(frozen=True, slots=True)
class PodShare:
    """The supervisor's ``share`` message (bridge.protocol.podcontrol)."""

    memory_limit_bytes: int | None  # None: no limit
    cpu_cores: float | None  # None: no quota
    workers: int
    processes: int
    index: int
    siblings: tuple[tuple[int, str], ...] = field(default=())  # (index, private gRPC address)

    def as_dict(self) -> dict[str, Any]:
        return {
            "memory_limit_bytes": self.memory_limit_bytes,
            "cpu_cores": self.cpu_cores,
            "workers": self.workers,
            "processes": self.processes,
            "index": self.index,
            "siblings": [{"index": i, "grpc_internal": a} for i, a in self.siblings],
        }


def shared_reading(reading: CgroupReading, share: PodShare, rss_bytes: int | None) -> CgroupReading:
    """``reading`` with the share's limits in place of the pod's, and this process's resident
    size as its usage (what memory pressure is judged by)."""
    what = f"{SOURCE}, process {share.index} of {share.processes}"
    quota = None if share.cpu_cores is None else max(1, round(share.cpu_cores * PERIOD_US))
    usage = None if rss_bytes is None else Sourced(rss_bytes, "VmRSS of this process")
    return dataclasses.replace(
        reading,
        memory_max=Sourced(share.memory_limit_bytes, what),
        memory_high=None,
        cpu_max=Sourced(CpuMax(quota, PERIOD_US), what),
        memory_current=usage,
    )


def shared_plan(plan: Plan, share: PodShare) -> Plan:
    """``plan`` with the share's worker count (planned pod-wide: processes x workers stays
    within the pod's cores)."""
    reasons = dict(plan.reasons)
    reasons["workers"] = (
        f"{share.workers} from the {SOURCE} ({share.processes} processes; the plan alone "
        f"would run {plan.workers})"
    )
    limit = share.memory_limit_bytes
    reasons["share"] = (
        f"process {share.index} of {share.processes}: "
        f"{'no memory limit' if limit is None else format_bytes(limit)}, "
        f"{'no cpu quota' if share.cpu_cores is None else f'{share.cpu_cores:g} cores'}"
    )
    return dataclasses.replace(plan, workers=max(1, share.workers), reasons=reasons)
