"""Reader adapter: the own cgroup files → :class:`~bridge.resources.snapshot.CgroupReading`.

Finding the cgroup: ``/proc/self/cgroup`` + ``/proc/self/mountinfo`` (both under an injectable
``proc_root``; mount points are re-rooted under ``fs_root``), or, when ``BRIDGE_CGROUP_ROOT`` is
set, that directory laid out like a container's v2 view (``cpu.max`` … directly in it) or like v1
(``cpu/`` and ``memory/`` sub-directories). Why injectable: tests, the benchmark and the local demo
point the bridge at a directory they rewrite, because limit files raise no change events and cannot
be changed for real without privileges.

Reading never raises: an unreadable or malformed file becomes a ``problems`` entry naming the path;
an absent optional file (``memory.high``, PSI, ``cpu.max`` of a root cgroup) is simply absent.
The paths are resolved once; each :meth:`CgroupReader.read` is a handful of small ``os.read`` calls.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from bridge.resources import cgroup_parse as cp
from bridge.resources.snapshot import CgroupReading, Sourced

T = TypeVar("T")

V2_FILES = (
    "cpu.max",
    "cpu.weight",
    "memory.max",
    "memory.high",
    "memory.current",
    "memory.events",
    "cpu.pressure",
    "memory.pressure",
)
V1_CPU_FILES = ("cpu.cfs_quota_us", "cpu.cfs_period_us")
V1_MEMORY_FILES = ("memory.limit_in_bytes", "memory.usage_in_bytes")
PSI_FILES = ("cpu.pressure", "memory.pressure")


def _read(path: str) -> str | None:
    """The file's text, or ``None`` when it does not exist. Other OS errors propagate."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        return os.read(fd, 65536).decode("ascii", "replace")
    finally:
        os.close(fd)


class CgroupReader:
    """Reads a fixed set of files. ``files`` maps a logical name (``cpu.max``,
    ``cpu.cfs_quota_us``…) to an absolute path; ``version`` selects how they are combined."""

    def __init__(
        self,
        version: str,
        location: str,
        files: Mapping[str, str],
        problems: tuple[str, ...] = (),
    ) -> None:
        self.version = version
        self.location = location
        self.files = dict(files)
        self._static_problems = problems
        self.detail_every = 1
        self._reads = 0
        self._detail: tuple[dict[str, Any], tuple[str, ...]] | None = None

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_root(cls, root: str) -> CgroupReader:
        """An injected root directory (``BRIDGE_CGROUP_ROOT``), v2 or v1 layout (auto-detected)."""
        try:
            names = set(os.listdir(root))
        except OSError as e:
            return cls("none", root, {}, (f"{root}: {e.strerror or e}",))
        if cp.detect_root_layout(names) == "v1":
            cpu = os.path.join(root, cp.v1_dir_name(names, "cpu"))
            mem = os.path.join(root, cp.v1_dir_name(names, "memory"))
            return cls.v1(cpu, mem, v2_dir=None, location=root)
        return cls.v2(root)

    @classmethod
    def v2(cls, directory: str) -> CgroupReader:
        return cls("v2", directory, {n: os.path.join(directory, n) for n in V2_FILES})

    @classmethod
    def v1(
        cls, cpu_dir: str | None, memory_dir: str | None, v2_dir: str | None, location: str = ""
    ) -> CgroupReader:
        files: dict[str, str] = {}
        if cpu_dir is not None:
            files.update({n: os.path.join(cpu_dir, n) for n in V1_CPU_FILES})
        if memory_dir is not None:
            files.update({n: os.path.join(memory_dir, n) for n in V1_MEMORY_FILES})
        if v2_dir is not None:  # hybrid hosts keep PSI in the unified tree
            files.update({n: os.path.join(v2_dir, n) for n in PSI_FILES})
        return cls("v1", location or f"cpu={cpu_dir} memory={memory_dir}", files)

    # ------------------------------------------------------------------ reading

    def read(self) -> CgroupReading:
        """Limits are read on every call; usage, events and PSI (which never move the plan) on
        every ``detail_every``-th call and reused in between, to keep the 50 ms poll cheap."""
        if self.version not in ("v1", "v2"):
            return CgroupReading("none", self.location, problems=self._static_problems)
        problems = list(self._static_problems)
        limits = self._read_limits(problems)
        if self._detail is None or self._reads % self.detail_every == 0:
            detail_problems: list[str] = []
            self._detail = (self._read_detail(detail_problems), tuple(detail_problems))
        self._reads += 1
        detail, detail_problems_t = self._detail
        return CgroupReading(
            version=self.version,
            location=self.location,
            **limits,
            **detail,
            problems=tuple(problems) + detail_problems_t,
        )

    def _get(self, name: str, parse: Callable[[str], T], problems: list[str]) -> Sourced[T] | None:
        path = self.files.get(name)
        if path is None:
            return None
        try:
            text = _read(path)
            if text is None:
                return None
            return Sourced(parse(text), path)
        except cp.CgroupParseError as e:
            problems.append(f"{path}: {e}")
        except OSError as e:
            problems.append(f"{path}: {e.strerror or e}")
        return None

    def _read_limits(self, problems: list[str]) -> dict[str, Any]:
        if self.version == "v1":
            return {
                "cpu_max": self._v1_cpu(problems),
                "memory_max": self._get("memory.limit_in_bytes", cp.parse_v1_bytes, problems),
            }
        return {
            "cpu_max": self._get("cpu.max", cp.parse_cpu_max, problems),
            "cpu_weight": self._get("cpu.weight", cp.parse_cpu_weight, problems),
            "memory_max": self._get("memory.max", cp.parse_bytes_or_max, problems),
            "memory_high": self._get("memory.high", _parse_high, problems),
        }

    def _read_detail(self, problems: list[str]) -> dict[str, Any]:
        usage = "memory.usage_in_bytes" if self.version == "v1" else "memory.current"
        out: dict[str, Any] = {
            "memory_current": self._get(usage, lambda t: cp.parse_uint(t, usage), problems),
            "cpu_pressure": self._get("cpu.pressure", cp.parse_psi, problems),
            "memory_pressure": self._get("memory.pressure", _parse_memory_psi, problems),
        }
        if self.version == "v2":
            out["memory_events"] = self._get("memory.events", cp.parse_flat_keyed, problems)
        return out

    def _v1_cpu(self, problems: list[str]) -> Sourced[cp.CpuMax] | None:
        qpath, ppath = self.files.get("cpu.cfs_quota_us"), self.files.get("cpu.cfs_period_us")
        if qpath is None or ppath is None:
            return None
        try:
            quota, period = _read(qpath), _read(ppath)
            if quota is None or period is None:
                return None
            return Sourced(cp.parse_v1_cpu(quota, period), f"{qpath} / {ppath}")
        except cp.CgroupParseError as e:
            problems.append(f"{qpath}: {e}")
        except OSError as e:
            problems.append(f"{qpath}: {e.strerror or e}")
        return None


def _parse_high(text: str) -> int | None:
    return cp.parse_bytes_or_max(text, "memory.high")


def _parse_memory_psi(text: str) -> cp.Psi:
    return cp.parse_psi(text, "memory.pressure")


def _reroot(fs_root: str, path: str | None) -> str | None:
    if path is None:
        return None
    return os.path.join(fs_root, path.lstrip("/")) if fs_root not in ("", "/") else path


def find_cgroup(proc_root: str = "/proc", fs_root: str = "/") -> CgroupReader:
    """Locate our cgroup from ``<proc_root>/self/cgroup`` and ``<proc_root>/self/mountinfo``."""
    try:
        cgroup_text = _read(os.path.join(proc_root, "self", "cgroup"))
        mount_text = _read(os.path.join(proc_root, "self", "mountinfo"))
        if cgroup_text is None or mount_text is None:
            return CgroupReader("none", proc_root, {}, (f"{proc_root}/self: no cgroup/mountinfo",))
        loc = cp.locate_cgroup(cp.parse_proc_cgroup(cgroup_text), cp.parse_mountinfo(mount_text))
    except (cp.CgroupParseError, OSError) as e:
        return CgroupReader("none", proc_root, {}, (f"finding own cgroup: {e}",))
    if loc.version == "v2":
        directory = _reroot(fs_root, loc.v2_dir)
        assert directory is not None
        return CgroupReader.v2(directory)
    return CgroupReader.v1(
        _reroot(fs_root, loc.cpu_dir),
        _reroot(fs_root, loc.memory_dir),
        _reroot(fs_root, loc.v2_dir),
    )


def open_cgroup(
    root: str | None = None, proc_root: str = "/proc", fs_root: str = "/"
) -> CgroupReader:
    """The directory ``root`` (setting ``cgroup_root``) when given, else the own cgroup."""
    if root:
        return CgroupReader.from_root(root)
    return find_cgroup(proc_root, fs_root)
