"""Value types shared by the watchers, the plan and ``describe()`` (no I/O).

Every observed value is a :class:`Sourced`: the value plus a human-readable ``source`` saying where
it came from (a file path, a Pod field path, an NVML call). Why: an operator who asks "why 3
workers?" must be able to follow each number back to the file or API field it was read from.

Unlimited is ``None`` *inside* a Sourced; a Sourced that is itself ``None`` means "not available"
(file absent, no cluster, no GPU).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, TypeVar

from bridge.resources.cgroup_parse import CpuMax, Psi
from bridge.resources.pod import AllocatedDevice, PodView

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Sourced(Generic[T]):
    """A value and where it was read from."""

    value: T
    source: str


def _value(s: Sourced[T] | None) -> T | None:
    return None if s is None else s.value


@dataclass(frozen=True, slots=True)
class CgroupReading:
    """One read of the process's own cgroup (v2, v1, or none found)."""

    version: str  # "v2" | "v1" | "none"
    location: str  # directory (v2) or "cpu=<dir> memory=<dir>" (v1), for describe()
    cpu_max: Sourced[CpuMax] | None = None
    cpu_weight: Sourced[int] | None = None
    memory_max: Sourced[int | None] | None = None
    memory_high: Sourced[int | None] | None = None
    memory_current: Sourced[int] | None = None
    memory_events: Sourced[dict[str, int]] | None = None
    cpu_pressure: Sourced[Psi] | None = None
    memory_pressure: Sourced[Psi] | None = None
    problems: tuple[str, ...] = ()

    @property
    def cpu_limit_cores(self) -> float | None:
        """Quota/period in cores; ``None`` when unlimited or unknown."""
        return None if self.cpu_max is None else self.cpu_max.value.cores

    @property
    def memory_limit_bytes(self) -> int | None:
        """``memory.max`` (or v1 limit); ``None`` when unlimited or unknown."""
        return None if self.memory_max is None else self.memory_max.value

    def relevant_key(self) -> tuple[object, ...]:
        """The values a re-plan depends on. Usage, events and pressure change all the time and do
        not move the plan, so a change in them alone does not wake the adapter."""

        return (
            self.version,
            _value(self.cpu_max),
            _value(self.cpu_weight),
            _value(self.memory_max),
            _value(self.memory_high),
            self.problems,
        )


@dataclass(frozen=True, slots=True)
class GpuDevice:
    """One NVML-visible device: a full GPU or a MIG instance (``parent_index`` set)."""

    index: str  # "0" for a GPU, "0/1" for MIG instance 1 of GPU 0
    uuid: str
    name: str
    memory_total_bytes: int
    memory_used_bytes: int
    healthy: bool
    is_mig: bool = False
    problem: str | None = None

    @property
    def memory_free_bytes(self) -> int:
        return max(0, self.memory_total_bytes - self.memory_used_bytes)


@dataclass(frozen=True, slots=True)
class GpuReading:
    """What NVML shows. ``available`` is False without the library or a driver (not an error)."""

    available: bool
    devices: tuple[GpuDevice, ...] = ()
    problems: tuple[str, ...] = ()
    source: str = "nvml"

    @property
    def healthy(self) -> bool:
        return self.available and bool(self.devices) and all(d.healthy for d in self.devices)

    def relevant_key(self) -> tuple[object, ...]:
        """Used memory moves constantly; round it to 64 MiB so tiny moves do not re-plan."""
        return (
            self.available,
            tuple(
                (d.uuid, d.memory_total_bytes, d.memory_used_bytes >> 26, d.healthy)
                for d in self.devices
            ),
            self.problems,
        )


@dataclass(frozen=True, slots=True)
class Workload:
    """What the data plane reports about itself at plan time."""

    active_streams: int = 0
    baseline_bytes: int = 0


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything the plan reads; ``pod`` and ``devices`` only when running in a cluster."""

    cgroup: CgroupReading
    cpus_allowed: Sourced[int]
    pod: PodView | None = None
    devices: tuple[AllocatedDevice, ...] = ()
    gpu: GpuReading | None = None
    workload: Workload = field(default_factory=Workload)
    detected_at: float = 0.0  # time.monotonic() when the change that led here was seen
