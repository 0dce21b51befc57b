"""How many ingest processes a pod runs, and how many decimation workers each: a pure function
of the CPU quota, the affinity set and the memory limit (issue 31, docs/scaling.md "The process
plan").

    cores      = min(CPU quota, CPUs in the affinity set)      (no quota: the affinity set)
    by CPU     = max(1, floor(cores))      every process's loop may take a whole core
    setting    = auto: by CPU | N: exactly N | max:K: min(by CPU, K)
    by memory  = floor((limit - baseline) / per process)          (no limit: no cap)
    processes  = min(setting, by memory); 0 when the limit cannot hold one process: refused
    workers    = max(1, ceil(cores) // processes) per process, so processes x workers <= the
                 worker count one process would plan alone (ceil(quota), clamped to the CPUs)

Why floor for processes but ceil for workers: an event loop is one thread and uses one core at
most, so a process beyond floor(cores) only splits the same cores between more loops (measured:
``make bench-scale``, docs/scaling.md); a fractional core still serves a decimation worker,
which is what plan.py's worker count (ceil) already gives one process.

Memory: every process costs one interpreter baseline (``per_process_bytes``: the idle RSS of
one ``simbridge serve`` plus the smallest data budget it can work with) on top of what the pod
costs whatever N is (``baseline_bytes``: the supervisor and the shared headroom). The plan never
counts on a process the limit cannot hold: with 0 it refuses, and the caller starts none (it
keeps a process it already runs rather than kill its edges, and says not ready).

Every value carries a sentence in ``reasons`` naming the inputs that decided it, for logs and
``/debug/resources``.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from bridge.resources.quantity import format_bytes

MiB = 1 << 20
#: Interpreter, native extensions, gRPC and WebSocket servers, idle, rounded up: an idle
#: ``simbridge serve`` measured 68.4 MiB RSS, of which 35.3 MiB anonymous (what a cgroup is
#: charged per extra process; the file pages are shared), on the 2-core VM (docs/scaling.md
#: "Memory per process"). 80 MiB leaves a margin and is issue 31's per-process target.
DEFAULT_PER_PROCESS_BYTES = 80 * MiB


@dataclass(frozen=True, slots=True)
class ProcessesSetting:
    """The ``processes`` setting: ``auto`` (None, None), an exact count, or a maximum."""

    exact: int | None = None
    maximum: int | None = None

    def __str__(self) -> str:
        if self.exact is not None:
            return str(self.exact)
        return f"max:{self.maximum}" if self.maximum is not None else "auto"


def parse_processes_setting(value: str | int | ProcessesSetting) -> ProcessesSetting:
    """``"auto"``, ``N`` (an int or its text) or ``"max:K"``, with N, K >= 1."""
    if isinstance(value, ProcessesSetting):
        return value
    if isinstance(value, bool):
        raise ValueError(f"processes: expected auto, N or max:K, got {value!r}")
    if isinstance(value, int):
        if value < 1:
            raise ValueError(f"processes must be >= 1, got {value}")
        return ProcessesSetting(exact=value)
    text = value.strip().lower()
    if text == "auto":
        return ProcessesSetting()
    kind, sep, number = text.partition(":")
    digits = number if sep else kind
    if (sep and kind != "max") or not digits.isdigit() or int(digits) < 1:
        raise ValueError(f"processes: expected auto, N or max:K (N, K >= 1), got {value!r}")
    return ProcessesSetting(maximum=int(digits)) if sep else ProcessesSetting(exact=int(digits))


@dataclass(frozen=True, slots=True)
class ProcessPlan:
    processes: int  # ingest processes to run; 0: the limit cannot hold one (refused)
    workers_per_process: int  # decimation threads in each (0 with no process)
    cores: float  # the CPU the plan had: min(quota, affinity set)
    memory_holds: int | None  # processes the memory limit holds; None: no limit
    reasons: Mapping[str, str] = field(default_factory=dict, compare=False)

    @property
    def refused(self) -> bool:
        return self.processes == 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "processes": self.processes,
            "workers_per_process": self.workers_per_process,
            "cores": self.cores,
            "memory_holds": self.memory_holds,
            "refused": self.refused,
            "reasons": dict(self.reasons),
        }


def _cpu_count(affinity_cpus: int | Collection[int]) -> int:
    n = affinity_cpus if isinstance(affinity_cpus, int) else len(affinity_cpus)
    if n < 1:
        raise ValueError(f"the affinity set must hold at least one CPU, got {affinity_cpus!r}")
    return n


def plan_processes(
    cpu_quota_cores: float | None,
    affinity_cpus: int | Collection[int],
    memory_limit_bytes: int | None,
    baseline_bytes: int,
    per_process_bytes: int = DEFAULT_PER_PROCESS_BYTES,
    setting: str | int | ProcessesSetting = "auto",
) -> ProcessPlan:
    """The process plan (module docstring). ``cpu_quota_cores``: the cgroup's quota / period, or
    None when there is none; ``affinity_cpus``: the affinity set (or its size);
    ``memory_limit_bytes``: the effective limit (``plan.effective_memory_limit``), None when
    unlimited; ``baseline_bytes``: what the pod needs whatever N is; ``per_process_bytes``: what
    each ingest process adds. Raises ValueError on inputs no pod can have."""
    want = parse_processes_setting(setting)
    cpus = _cpu_count(affinity_cpus)
    if cpu_quota_cores is not None and not cpu_quota_cores > 0:
        raise ValueError(f"a CPU quota must be > 0 cores, got {cpu_quota_cores}")
    if per_process_bytes <= 0 or baseline_bytes < 0:
        raise ValueError("per_process_bytes must be > 0 and baseline_bytes >= 0")
    if memory_limit_bytes is not None and memory_limit_bytes <= 0:
        raise ValueError(f"a memory limit must be > 0 bytes, got {memory_limit_bytes}")
    reasons: dict[str, str] = {}

    # CPU
    if cpu_quota_cores is None:
        cores = float(cpus)
        cpu_why = f"no cpu quota; {cpus} CPUs in the affinity set"
    else:
        cores = min(cpu_quota_cores, float(cpus))
        cpu_why = f"cpu quota {cpu_quota_cores:g} cores, {cpus} CPUs in the affinity set"
    by_cpu = max(1, math.floor(cores + 1e-9))
    reasons["cpu"] = f"{cpu_why}: {cores:g} cores, one event loop per whole core -> {by_cpu}"

    if want.exact is not None:
        wanted = want.exact
        why = f"processes={want.exact} (explicit)"
        if wanted > by_cpu:
            why += f"; more loops than the {by_cpu} whole core(s): they share them"
    elif want.maximum is not None:
        wanted = min(by_cpu, want.maximum)
        why = f"processes=max:{want.maximum}, {by_cpu} by CPU -> {wanted}"
    else:
        wanted = by_cpu
        why = f"processes=auto -> {by_cpu} by CPU"

    # Memory
    holds: int | None = None
    if memory_limit_bytes is None:
        mem_why = "no memory limit: no cap"
    else:
        room = memory_limit_bytes - baseline_bytes
        holds = max(0, room // per_process_bytes)
        mem_why = (
            f"limit {format_bytes(memory_limit_bytes)} - baseline {format_bytes(baseline_bytes)}"
            f" holds {holds} process(es) of {format_bytes(per_process_bytes)}"
        )
    reasons["memory"] = mem_why
    processes = wanted if holds is None else min(wanted, holds)
    if processes == 0:
        reasons["processes"] = (
            f"refused: {why}, but the memory limit cannot hold one process "
            f"({format_bytes(baseline_bytes)} + {format_bytes(per_process_bytes)} > "
            f"{format_bytes(memory_limit_bytes or 0)}); start none"
        )
    elif processes < wanted:
        reasons["processes"] = (
            f"{why}, cut to {processes}: the memory limit holds no more "
            f"({wanted - processes} refused)"
        )
    else:
        reasons["processes"] = why

    # Workers, pod-wide
    total = max(1, min(cpus, math.ceil(cores - 1e-9)))
    per = max(1, total // processes) if processes else 0
    workers_why = f"{total} worker core(s) (ceil of {cores:g}, at most {cpus})"
    if processes == 0:
        workers_why += "; no process"
    elif processes * per > total:
        workers_why += (
            f" over {processes} processes: 1 each, {processes} in all (a process needs one)"
        )
    else:
        workers_why += f" // {processes} processes = {per} each, {processes * per} in all"
    reasons["workers"] = workers_why
    return ProcessPlan(processes, per, cores, holds, reasons)
