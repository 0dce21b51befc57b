"""The default actuator of kubesim's kubelet: the container's cgroup files, written into a directory
laid out like ``BRIDGE_CGROUP_ROOT`` (v2: ``cpu.max`` etc. in it; v1: ``cpu/`` and ``memory/``
sub-directories), with the values the kubelet and the container runtime would write.

Why a directory and not a real cgroup: the bridge reads these files to adapt, and tests must run as
an unprivileged user; a real cgroup (or a real container) is another :class:`~loadgen.kubesim.
kubelet.Actuator`.
"""

from __future__ import annotations

import math
import os

from loadgen.kubesim.model import Want

# cgroup values (kubelet + runtime formulas, docs/kubernetes.md, cgroup values)


def milli_to_shares(milli: int) -> int:
    return 2 if milli <= 0 else max(2, min(262144, milli * 1024 // 1000))


def shares_to_weight(shares: int) -> int:
    """The quadratic formula of current runtimes (runc ≥ 1.3.2, crun ≥ 1.23): 1 CPU → 100."""
    if shares <= 2:
        return 1
    if shares >= 262144:
        return 10000
    lg = math.log2(shares)
    return min(10000, math.ceil(10 ** ((lg * lg + 125 * lg) / 612 - 7 / 34)))


def milli_to_quota(milli: int | None, period: int = 100_000) -> int | None:
    return None if milli is None or milli <= 0 else max(1000, milli * period // 1000)


class CgroupDir:
    """The container's cgroup files as the bridge sees them (v2 or v1 layout)."""

    def __init__(self, root: str, version: str = "auto") -> None:
        self.root = root
        if version == "auto":
            version = "v1" if os.path.isdir(os.path.join(root, "cpu")) else "v2"
        self.version = version

    def _path(self, v2: str, v1: str) -> str:
        return os.path.join(self.root, v2 if self.version == "v2" else v1)

    @staticmethod
    def _write(path: str, text: str) -> None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.kubesim-tmp"
        with open(tmp, "w", encoding="ascii") as f:
            f.write(text + "\n")
        os.replace(tmp, path)  # readers never see a half-written value

    def write_memory_limit(self, limit: int | None) -> None:
        if self.version == "v2":
            self._write(self._path("memory.max", ""), "max" if limit is None else str(limit))
        else:
            value = "9223372036854771712" if limit is None else str(limit)
            self._write(os.path.join(self.root, "memory", "memory.limit_in_bytes"), value)

    def write_cpu(self, limit_m: int | None, request_m: int | None) -> None:
        quota = milli_to_quota(limit_m)
        shares = milli_to_shares(request_m or 0)
        if self.version == "v2":
            self._write(self._path("cpu.max", ""), f"{'max' if quota is None else quota} 100000")
            self._write(self._path("cpu.weight", ""), str(shares_to_weight(shares)))
        else:
            cpu = os.path.join(self.root, "cpu")
            self._write(os.path.join(cpu, "cpu.cfs_quota_us"), str(-1 if quota is None else quota))
            self._write(os.path.join(cpu, "cpu.cfs_period_us"), "100000")
            self._write(os.path.join(cpu, "cpu.shares"), str(shares))

    def memory_usage(self) -> int:
        path = (
            os.path.join(self.root, "memory.current")
            if self.version == "v2"
            else os.path.join(self.root, "memory", "memory.usage_in_bytes")
        )
        try:
            with open(path, encoding="ascii") as f:
                return int(f.read().strip() or 0)
        except (OSError, ValueError):
            return 0

    def set_memory_usage(self, usage: int) -> None:
        """Test/demo helper: what the workload 'uses'."""
        if self.version == "v2":
            self._write(os.path.join(self.root, "memory.current"), str(usage))
        else:
            self._write(os.path.join(self.root, "memory", "memory.usage_in_bytes"), str(usage))


class CgroupActuator:
    """:class:`~loadgen.kubesim.kubelet.Actuator` over a :class:`CgroupDir` (today's behaviour)."""

    def __init__(self, cgroup: CgroupDir) -> None:
        self.cgroup = cgroup

    async def start(self, actual: Want) -> None:
        self.write_initial(actual)

    def write_initial(self, actual: Want) -> None:
        """Write the running limits; seed ``memory.current`` (256 MiB) unless a test set one."""
        self.cgroup.write_memory_limit(actual.mem_lim)
        self.cgroup.write_cpu(actual.cpu_lim, actual.cpu_req)
        usage_file = (
            "memory.current" if self.cgroup.version == "v2" else "memory/memory.usage_in_bytes"
        )
        if not os.path.exists(os.path.join(self.cgroup.root, usage_file)):
            self.cgroup.set_memory_usage(256 << 20)

    async def memory_usage(self) -> int:
        return self.cgroup.memory_usage()

    async def apply_memory(self, limit: int | None) -> None:
        self.cgroup.write_memory_limit(limit)

    async def apply_cpu(self, limit_m: int | None, request_m: int | None) -> None:
        self.cgroup.write_cpu(limit_m, request_m)
