"""How the container harness changes a running container's limits (podman update, with or
without the kubelet's guard on memory decreases)."""

from __future__ import annotations

import asyncio
import time
from typing import Protocol

from loadgen.kubesim_podman import ContainerCgroup, Podman


class Resizer(Protocol):
    """Changes the running container's limits; returns when the cgroup holds them."""

    name: str

    async def resize(self, cpu: float, memory: int) -> list[str]: ...


class PodmanResizer:
    """``podman update --cpus --memory`` on the running container (runc update), with the
    kubelet's guard: a memory decrease waits (up to ``hold_s``) while the container's usage is at
    or above the new limit, and is not applied if usage never falls below it."""

    name = "podman update"

    def __init__(self, podman: Podman, container: str, cgroup: ContainerCgroup, hold_s: float = 20):
        self.podman, self.container, self.cgroup, self.hold_s = podman, container, cgroup, hold_s

    async def resize(self, cpu: float, memory: int) -> list[str]:
        notes = []
        limit = self.cgroup.memory_limit()
        if limit is None or memory < limit:
            t0 = time.monotonic()
            while self.cgroup.memory_usage() >= memory:
                if time.monotonic() - t0 > self.hold_s:
                    raise RuntimeError(
                        f"memory decrease held {self.hold_s:.0f} s: usage "
                        f"{self.cgroup.memory_usage() >> 20} MiB ≥ new limit {memory >> 20} MiB"
                    )
                await asyncio.sleep(0.05)
            if time.monotonic() - t0 > 0.05:
                notes.append(f"held {time.monotonic() - t0:.1f} s until usage < new limit")
        await self.podman.update(
            self.container,
            ["--cpus", f"{cpu:g}", "--memory", f"{memory}b", "--memory-swap", f"{memory}b"],
        )
        return notes


class DirectResizer:
    """``podman update --memory`` at once (no wait for usage to fall: usage counts page cache,
    which the kernel reclaims on the way down; runc refuses a limit below what it cannot)."""

    name = "podman update"

    def __init__(self, podman: Podman, container: str) -> None:
        self.podman, self.container = podman, container

    async def resize(self, cpu: float, memory: int) -> list[str]:
        args = ["--cpus", f"{cpu:g}", "--memory", f"{memory}b", "--memory-swap", f"{memory}b"]
        await self.podman.update(self.container, args)
        return []
