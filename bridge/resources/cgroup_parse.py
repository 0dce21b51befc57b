"""Pure parsers for cgroup and procfs text: text in, values or :class:`CgroupParseError` out.

Why pure: the formats are small but full of edge cases (``max``, ``-1``, v1's "unlimited" that is a
huge number, zero periods, stray fields). Keeping them free of I/O lets the unit tests feed every
case as a string, and lets the reader adapter turn each error into an entry of the snapshot's
``problems`` list instead of crashing the watcher.

Conventions: ``None`` means *unlimited*. Sizes are bytes, cpu quota/period microseconds.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass

#: cgroup v1 reports "no memory limit" as PAGE_COUNTER_MAX * page size (9223372036854771712 on
#: x86-64, other values elsewhere); anything at or above 2**60 bytes is treated as unlimited.
V1_UNLIMITED_THRESHOLD = 1 << 60


class CgroupParseError(ValueError):
    """A cgroup or procfs file does not have the expected format."""


@dataclass(frozen=True, slots=True)
class CpuMax:
    """CFS bandwidth: ``quota_us`` per ``period_us``; ``quota_us is None`` means no limit."""

    quota_us: int | None
    period_us: int

    @property
    def cores(self) -> float | None:
        """The limit in cores (``200000/100000`` → 2.0); ``None`` when unlimited."""
        return None if self.quota_us is None else self.quota_us / self.period_us


@dataclass(frozen=True, slots=True)
class Psi:
    """One PSI file: ``some`` (and ``full`` where the kernel has it): averages and total stall."""

    some_avg10: float
    some_avg60: float
    some_total_us: int
    full_avg10: float | None = None
    full_total_us: int | None = None


def _one_line(text: str, name: str) -> str:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if len(lines) != 1:
        raise CgroupParseError(f"{name}: expected one line, got {len(lines)}")
    return lines[0].strip()


def _int(token: str, name: str) -> int:
    try:
        return int(token, 10)
    except ValueError:
        raise CgroupParseError(f"{name}: {token!r} is not an integer") from None


def parse_cpu_max(text: str) -> CpuMax:
    """cgroup v2 ``cpu.max``: ``"max 100000"`` or ``"<quota> <period>"`` (a lone quota keeps the
    kernel's default period of 100000, as the kernel accepts on write). Zero period is an error."""
    fields = _one_line(text, "cpu.max").split()
    if len(fields) > 2:
        raise CgroupParseError(
            f"cpu.max: expected '<quota|max> <period>', got {len(fields)} fields"
        )
    period = _int(fields[1], "cpu.max period") if len(fields) == 2 else 100_000
    if period <= 0:
        raise CgroupParseError(f"cpu.max: period must be > 0, got {period}")
    if fields[0] == "max":
        return CpuMax(None, period)
    quota = _int(fields[0], "cpu.max quota")
    if quota <= 0:
        raise CgroupParseError(f"cpu.max: quota must be > 0 or 'max', got {quota}")
    return CpuMax(quota, period)


def parse_v1_cpu(quota_text: str, period_text: str) -> CpuMax:
    """cgroup v1 ``cpu.cfs_quota_us`` (``-1`` = unlimited) and ``cpu.cfs_period_us`` (> 0)."""
    quota = _int(_one_line(quota_text, "cpu.cfs_quota_us"), "cpu.cfs_quota_us")
    period = _int(_one_line(period_text, "cpu.cfs_period_us"), "cpu.cfs_period_us")
    if period <= 0:
        raise CgroupParseError(f"cpu.cfs_period_us: period must be > 0, got {period}")
    if quota == -1:
        return CpuMax(None, period)
    if quota <= 0:
        raise CgroupParseError(f"cpu.cfs_quota_us: must be > 0 or -1, got {quota}")
    return CpuMax(quota, period)


def parse_bytes_or_max(text: str, name: str = "memory.max") -> int | None:
    """cgroup v2 ``memory.max`` / ``memory.high``: bytes or ``max`` (→ ``None``)."""
    token = _one_line(text, name)
    if token == "max":
        return None
    value = _int(token, name)
    if value < 0:
        raise CgroupParseError(f"{name}: negative value {value}")
    return value


def parse_v1_bytes(text: str, name: str = "memory.limit_in_bytes") -> int | None:
    """cgroup v1 ``memory.limit_in_bytes``: ``-1`` or ≥ 2**60 mean unlimited (→ ``None``)."""
    value = _int(_one_line(text, name), name)
    if value == -1 or value >= V1_UNLIMITED_THRESHOLD:
        return None
    if value < 0:
        raise CgroupParseError(f"{name}: negative value {value}")
    return value


def parse_uint(text: str, name: str) -> int:
    """A single non-negative integer (``memory.current``, ``memory.usage_in_bytes``)."""
    value = _int(_one_line(text, name), name)
    if value < 0:
        raise CgroupParseError(f"{name}: negative value {value}")
    return value


def parse_cpu_weight(text: str) -> int:
    """cgroup v2 ``cpu.weight``: 1..10000."""
    value = _int(_one_line(text, "cpu.weight"), "cpu.weight")
    if not 1 <= value <= 10_000:
        raise CgroupParseError(f"cpu.weight: {value} outside 1..10000")
    return value


def parse_flat_keyed(text: str, name: str = "memory.events") -> dict[str, int]:
    """A flat-keyed file (``memory.events``): ``<key> <integer>`` per line."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = line.split()
        if len(fields) != 2:
            raise CgroupParseError(f"{name}: malformed line {line!r}")
        out[fields[0]] = _int(fields[1], f"{name} {fields[0]}")
    return out


_PSI_RE = re.compile(
    r"^(some|full) avg10=([0-9.]+) avg60=([0-9.]+) avg300=([0-9.]+) total=(\d+)$",
)


def parse_psi(text: str, name: str = "cpu.pressure") -> Psi:
    """A PSI file (``cpu.pressure``, ``memory.pressure``): a ``some`` line, optionally ``full``."""
    rows: dict[str, tuple[float, float, int]] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        m = _PSI_RE.match(line.strip())
        if m is None:
            raise CgroupParseError(f"{name}: malformed line {line!r}")
        rows[m.group(1)] = (float(m.group(2)), float(m.group(3)), int(m.group(5)))
    if "some" not in rows:
        raise CgroupParseError(f"{name}: no 'some' line")
    some = rows["some"]
    full = rows.get("full")
    return Psi(
        some_avg10=some[0],
        some_avg60=some[1],
        some_total_us=some[2],
        full_avg10=None if full is None else full[0],
        full_total_us=None if full is None else full[2],
    )


# --------------------------------------------------------------------------- finding our cgroup


@dataclass(frozen=True, slots=True)
class ProcCgroupEntry:
    """One line of ``/proc/self/cgroup``: ``<hierarchy-id>:<controllers>:<path>``."""

    hierarchy_id: int
    controllers: tuple[str, ...]
    path: str


@dataclass(frozen=True, slots=True)
class Mount:
    """The fields of a ``/proc/self/mountinfo`` line that locating a cgroup needs."""

    root: str
    mount_point: str
    fstype: str
    super_options: tuple[str, ...]


def parse_proc_cgroup(text: str) -> list[ProcCgroupEntry]:
    """``/proc/self/cgroup``; the v2 entry is ``0::<path>`` (empty controller list)."""
    entries: list[ProcCgroupEntry] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split(":", 2)
        if len(parts) != 3:
            raise CgroupParseError(f"/proc/self/cgroup: malformed line {line!r}")
        hid = _int(parts[0], "/proc/self/cgroup hierarchy id")
        controllers = tuple(c for c in parts[1].split(",") if c)
        entries.append(ProcCgroupEntry(hid, controllers, parts[2]))
    return entries


_OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")


def _unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as ``\\ooo`` octal."""
    return _OCTAL_ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field)


def parse_mountinfo(text: str) -> list[Mount]:
    """``/proc/self/mountinfo`` (proc(5)): optional fields end at ``-``, then fstype/source/opts."""
    mounts: list[Mount] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = line.split(" ")
        try:
            sep = fields.index("-", 6)
        except ValueError:
            raise CgroupParseError(f"mountinfo: no '-' separator in {line!r}") from None
        if len(fields) < sep + 4:
            raise CgroupParseError(f"mountinfo: truncated line {line!r}")
        mounts.append(
            Mount(
                root=_unescape(fields[3]),
                mount_point=_unescape(fields[4]),
                fstype=fields[sep + 1],
                super_options=tuple(fields[sep + 3].split(",")),
            )
        )
    return mounts


@dataclass(frozen=True, slots=True)
class CgroupLocation:
    """Where our limits live. v2: one directory. v1: one directory per controller (cpu, memory);
    ``unified`` is the v2 directory in hybrid mode (PSI files live there). Paths are absolute as
    the process sees them; the reader prefixes its injectable filesystem root."""

    version: str  # "v2" | "v1"
    v2_dir: str | None = None
    cpu_dir: str | None = None
    memory_dir: str | None = None


def _join_under_mount(mount: Mount, cgroup_path: str) -> str:
    """The directory of ``cgroup_path`` under ``mount``. A bind-mounted sub-tree has a non-root
    ``root``: strip it. A path outside the mounted sub-tree (cgroup namespaces showing ``/..``)
    cannot be resolved: use the mount point itself, which is what the container can see."""
    root = mount.root.rstrip("/") or "/"
    path = posixpath.normpath(cgroup_path) if cgroup_path else "/"
    if root == "/":
        rel = path.lstrip("/")
    elif path == root or path.startswith(root + "/"):
        rel = path[len(root) :].lstrip("/")
    else:
        rel = ""
    if rel.startswith(".."):
        rel = ""
    return posixpath.join(mount.mount_point, rel) if rel else mount.mount_point


def locate_cgroup(entries: list[ProcCgroupEntry], mounts: list[Mount]) -> CgroupLocation:
    """Combine ``/proc/self/cgroup`` and mountinfo. v1 wins when a v1 hierarchy carries the cpu
    or memory controller (hybrid hosts: the v2 tree then has no controllers); otherwise v2."""
    cpu_dir = memory_dir = None
    for entry in entries:
        if entry.hierarchy_id == 0:
            continue
        for mount in mounts:
            if mount.fstype != "cgroup":
                continue
            opts = set(mount.super_options)
            if "cpu" in entry.controllers and "cpu" in opts and cpu_dir is None:
                cpu_dir = _join_under_mount(mount, entry.path)
            if "memory" in entry.controllers and "memory" in opts and memory_dir is None:
                memory_dir = _join_under_mount(mount, entry.path)
    v2_dir = None
    v2_entry = next((e for e in entries if e.hierarchy_id == 0 and not e.controllers), None)
    v2_mount = next((m for m in mounts if m.fstype == "cgroup2"), None)
    if v2_entry is not None and v2_mount is not None:
        v2_dir = _join_under_mount(v2_mount, v2_entry.path)
    if cpu_dir is not None or memory_dir is not None:
        return CgroupLocation("v1", v2_dir=v2_dir, cpu_dir=cpu_dir, memory_dir=memory_dir)
    if v2_dir is not None:
        return CgroupLocation("v2", v2_dir=v2_dir)
    raise CgroupParseError("no cgroup v1 cpu/memory or cgroup v2 mount matches /proc/self/cgroup")


def detect_root_layout(names: set[str]) -> str:
    """For an injected root (``BRIDGE_CGROUP_ROOT``): ``"v2"`` when v2 files sit directly in it,
    ``"v1"`` when it has ``cpu``/``memory`` sub-directories, else ``"v2"`` (files may appear later,
    e.g. a test that writes them after start)."""
    v2_markers = {"cpu.max", "memory.max", "cgroup.controllers", "memory.current"}
    if names & v2_markers:
        return "v2"
    if {"cpu", "memory"} & names or {"cpu,cpuacct"} & names:
        return "v1"
    return "v2"


def v1_dir_name(names: set[str], controller: str) -> str:
    """Sub-directory name for a v1 controller in an injected root (``cpu`` or ``cpu,cpuacct``)."""
    if controller in names:
        return controller
    for name in sorted(names):
        if controller in name.split(","):
            return name
    return controller


__all__ = [
    "V1_UNLIMITED_THRESHOLD",
    "CgroupLocation",
    "CgroupParseError",
    "CpuMax",
    "Mount",
    "ProcCgroupEntry",
    "Psi",
    "detect_root_layout",
    "locate_cgroup",
    "parse_bytes_or_max",
    "parse_cpu_max",
    "parse_cpu_weight",
    "parse_flat_keyed",
    "parse_mountinfo",
    "parse_proc_cgroup",
    "parse_psi",
    "parse_uint",
    "parse_v1_bytes",
    "parse_v1_cpu",
    "v1_dir_name",
]
