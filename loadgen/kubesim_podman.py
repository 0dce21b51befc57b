"""kubesim actuation on a real container: an accepted in-place resize becomes ``podman update``.

Why: kubesim's default actuator writes cgroup *files* in a directory the bridge is pointed at. On a
node the kubelet's CRI ``UpdateContainerResources`` ends in ``runc update``, which rewrites the
container's real cgroup, and the kernel enforces it at once. ``podman update --cpus/--memory`` is
that same ``runc update``, so with :class:`PodmanActuator` the path is the real one end to end:
``kubectl patch --subresource resize`` → the stand-in's API → its kubelet → the container's cgroup
→ the bridge inside, which reads its own cgroup and its Pod from the stand-in.

:class:`PodmanActuator` implements kubesim's ``Actuator`` seam (``start``, ``memory_usage``,
``apply_memory``, ``apply_cpu``; see ``loadgen.kubesim.kubelet``) without importing it, so this
module works with any kubesim that accepts ``KubeSim(actuator=...)``. :class:`Podman` is the narrow
adapter over the podman CLI that the end-to-end harness shares. Flags are those that work on the
project's machines (hybrid cgroup layout: runc and the cgroupfs manager).

Run standalone against a running container::

    python -m loadgen.kubesim_podman --container NAME --cpu 1 --memory 512Mi
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from bridge.resources import cgroup_parse as cp

DEFAULT_RUNTIME = "/usr/sbin/runc"
PODMAN_TIMEOUT_S = 60.0
V1_UNLIMITED = 9223372036854771712  # what v1 memory.limit_in_bytes reads when unlimited
CFS_PERIOD_US = 100_000


class PodmanError(RuntimeError):
    """A podman command failed; the message carries its stderr."""


# ----------------------------------------------------------------------------- pure conversions


def cpu_shares(request_m: int | None) -> int:
    """cpu.shares from a cpu request, as the kubelet computes it (minimum 2)."""
    return max(2, (request_m or 0) * 1024 // 1000)


def cpu_update_args(limit_m: int | None, request_m: int | None) -> list[str]:
    """``podman update`` flags for a cpu limit/request in millicores (``None``: unlimited)."""
    quota = -1 if limit_m is None else max(1000, limit_m * CFS_PERIOD_US // 1000)
    return [
        "--cpu-period",
        str(CFS_PERIOD_US),
        "--cpu-quota",
        str(quota),
        "--cpu-shares",
        str(cpu_shares(request_m)),
    ]


def memory_update_args(limit: int | None) -> list[str]:
    """``podman update`` flags for a memory limit in bytes (``None``: unlimited). Swap is set to the
    same value, as for a pod without swap, so memory+swap can never exceed the limit."""
    value = "-1" if limit is None else f"{limit}b"
    return ["--memory", value, "--memory-swap", value]


# ------------------------------------------------------------------------- the container's cgroup


@dataclass(frozen=True, slots=True)
class ContainerCgroup:
    """Host paths of one container's cgroup (v1: the cpu and memory controllers' directories)."""

    version: str
    cpu_dir: Path
    memory_dir: Path

    @classmethod
    def of_pid(cls, pid: int, proc_root: str = "/proc") -> ContainerCgroup:
        """Locate from ``/proc/PID/cgroup`` and this process's mountinfo (the host's view)."""
        entries = cp.parse_proc_cgroup(Path(proc_root, str(pid), "cgroup").read_text())
        mounts = cp.parse_mountinfo(Path(proc_root, "self", "mountinfo").read_text())
        loc = cp.locate_cgroup(entries, mounts)
        if loc.version == "v2":
            assert loc.v2_dir is not None
            return cls("v2", Path(loc.v2_dir), Path(loc.v2_dir))
        if loc.cpu_dir is None or loc.memory_dir is None:
            raise PodmanError(f"pid {pid}: no cgroup v1 cpu and memory directories")
        return cls("v1", Path(loc.cpu_dir), Path(loc.memory_dir))

    def _read(self, directory: Path, name: str) -> str:
        return (directory / name).read_text().strip()

    def cpu_limit_cores(self) -> float | None:
        if self.version == "v2":
            quota, period = self._read(self.cpu_dir, "cpu.max").split()
            return None if quota == "max" else int(quota) / int(period)
        quota_us = int(self._read(self.cpu_dir, "cpu.cfs_quota_us"))
        period_us = int(self._read(self.cpu_dir, "cpu.cfs_period_us"))
        return None if quota_us < 0 else quota_us / period_us

    def memory_limit(self) -> int | None:
        name = "memory.max" if self.version == "v2" else "memory.limit_in_bytes"
        text = self._read(self.memory_dir, name)
        if text == "max" or int(text) >= V1_UNLIMITED:
            return None
        return int(text)

    def memory_usage(self) -> int:
        name = "memory.current" if self.version == "v2" else "memory.usage_in_bytes"
        return int(self._read(self.memory_dir, name))

    def oom_counters(self) -> dict[str, int]:
        """v2: ``memory.events`` (``max``: times the limit was hit, ``oom``, ``oom_kill``). v1:
        ``memory.failcnt`` (times usage hit the limit, reclaim included) and ``memory.oom_control``
        (``under_oom``, ``oom_kill``)."""
        if self.version == "v2":
            return cp.parse_flat_keyed(self._read(self.memory_dir, "memory.events"))
        out = cp.parse_flat_keyed(self._read(self.memory_dir, "memory.oom_control"))
        out["failcnt"] = int(self._read(self.memory_dir, "memory.failcnt"))
        return out


# ----------------------------------------------------------------------------- podman CLI


class Podman:
    """The podman CLI, async (a resize must not block the caller's event loop)."""

    def __init__(self, runtime: str = DEFAULT_RUNTIME, exe: str = "podman") -> None:
        self.base = [exe, "--runtime", runtime, "--cgroup-manager", "cgroupfs"]
        self.calls: list[list[str]] = []

    async def run(self, *args: str, timeout: float = PODMAN_TIMEOUT_S) -> str:  # noqa: ASYNC109
        argv = [*self.base, *args]
        self.calls.append(list(args))
        proc = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise PodmanError(f"podman {' '.join(args)}: timed out after {timeout} s") from None
        if proc.returncode != 0:
            raise PodmanError(
                f"podman {' '.join(args)} failed ({proc.returncode}): {err.decode().strip()}"
            )
        return out.decode()

    async def update(self, name: str, flags: list[str]) -> None:
        await self.run("update", *flags, name)

    async def inspect(self, name: str) -> dict[str, Any]:
        data = json.loads(await self.run("container", "inspect", name))
        if not data:
            raise PodmanError(f"no container {name}")
        state: dict[str, Any] = data[0]
        return state

    async def pid(self, name: str) -> int:
        pid = int((await self.inspect(name))["State"]["Pid"])
        if pid <= 0:
            raise PodmanError(f"container {name} is not running")
        return pid

    async def cgroup(self, name: str) -> ContainerCgroup:
        return ContainerCgroup.of_pid(await self.pid(name))

    async def remove(self, name: str) -> None:
        """Force-remove ``name`` if it exists (cleanup paths must never raise)."""
        with contextlib.suppress(PodmanError):
            await self.run("rm", "--force", "--ignore", "--time", "2", name, timeout=60)


# ----------------------------------------------------------------------------- the actuator


class _Want(Protocol):
    """What ``Actuator.start`` gets: kubesim's Want (limits/requests in millicores and bytes)."""

    @property
    def cpu_req(self) -> int | None: ...
    @property
    def cpu_lim(self) -> int | None: ...
    @property
    def mem_lim(self) -> int | None: ...


class PodmanActuator:
    """kubesim ``Actuator`` that resizes the running container ``container`` with podman.

    ``start`` applies the Pod's running limits, so the container and the Pod agree from the first
    sync; ``memory_usage`` is the container's real cgroup usage (the kubelet's guard against a
    memory decrease below usage sees what the kernel sees). ``applied`` records each call."""

    def __init__(self, container: str, podman: Podman | None = None) -> None:
        self.container = container
        self.podman = podman or Podman()
        self.applied: list[tuple[str, int | None, int | None]] = []
        self._cgroup: ContainerCgroup | None = None

    async def _cg(self) -> ContainerCgroup:
        if self._cgroup is None:
            self._cgroup = await self.podman.cgroup(self.container)
        return self._cgroup

    async def start(self, actual: _Want) -> None:
        await self.apply_memory(actual.mem_lim)
        await self.apply_cpu(actual.cpu_lim, actual.cpu_req)

    async def memory_usage(self) -> int:
        return (await self._cg()).memory_usage()

    async def apply_memory(self, limit: int | None) -> None:
        await self.podman.update(self.container, memory_update_args(limit))
        self.applied.append(("memory", limit, None))

    async def apply_cpu(self, limit_m: int | None, request_m: int | None) -> None:
        await self.podman.update(self.container, cpu_update_args(limit_m, request_m))
        self.applied.append(("cpu", limit_m, request_m))


# ----------------------------------------------------------------------------- CLI


async def _main(args: argparse.Namespace) -> None:
    from loadgen.kubesim import KubeSim
    from loadgen.resize import pod_json

    actuator = PodmanActuator(args.container, Podman(args.runtime))
    sim = KubeSim(
        pod_json(args.cpu, args.memory),
        actuator=actuator,  # type: ignore[call-arg,unused-ignore]
        sync_interval=args.sync_interval,
    )
    await sim.start(args.host, args.port)
    print(f"kubesim serving {sim.url} (BRIDGE_KUBE_API={sim.url}), resizes {args.container}")
    try:
        await asyncio.Event().wait()
    finally:
        await sim.stop()


def main(argv: list[str] | None = None) -> int:
    from bridge.resources.quantity import to_bytes, to_millicores

    p = argparse.ArgumentParser(
        prog="python -m loadgen.kubesim_podman",
        description="kubesim whose kubelet applies accepted resizes with `podman update` on a "
        "running container (the Pod is loadgen.resize.pod_json: one Guaranteed container).",
    )
    p.add_argument("--container", required=True, help="name of the running podman container")
    p.add_argument("--cpu", default="1", help="the Pod's initial cpu (requests = limits)")
    p.add_argument("--memory", default="512Mi", help="the Pod's initial memory")
    p.add_argument("--runtime", default=DEFAULT_RUNTIME, help="OCI runtime for podman")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--sync-interval", type=float, default=0.1, help="kubelet sync period, s")
    args = p.parse_args(argv)
    if shutil.which("podman") is None or not os.path.exists(args.runtime):
        p.error(f"needs podman and {args.runtime}")
    args.cpu = to_millicores(args.cpu) / 1000
    args.memory = to_bytes(args.memory)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_main(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
