"""kubesim's kubelet: admits an accepted resize against the node, then actuates it.

Why apart: admission (``PodResizePending`` Infeasible/Deferred, ``allocatedResources``,
``PodResizeInProgress``) is the kubelet's bookkeeping and is the same whatever runs the container;
*actuation* — making the container really get the new limits — is what differs between a
directory of cgroup files (tests), a real container runtime, or nothing at all. That difference is
the :class:`Actuator` seam.

The actuator seam
  The kubelet drives exactly one container's actuator (``KubeSim(container=...)``, default the
  container named ``bridge``, else the first). Values are numbers: memory in bytes, cpu in
  millicores; ``None`` means unlimited / not set. A container without its own limit gets the
  pod-level one (KEP-2837), so the values are what the container's cgroup must hold. The four
  coroutines, all awaited on the event loop while the kubelet holds :attr:`Kubelet.lock` (resize
  PATCHes wait meanwhile; keep each call short, or run blocking work in a thread):

  ``start(actual)``
      once, from ``KubeSim.start()`` before the API serves, with the limits the Pod runs with
      (``status.containerStatuses[].resources``, else the spec). Skipped when
      ``write_initial_cgroup=False``.
  ``memory_usage() -> int``
      on each sync that would lower the memory limit (container or pod level), again on every
      sync while such a decrease is held: at or above the new limit, the decrease is held with
      ``PodResizeInProgress`` reason ``Error`` (the kubelet's memory-decrease guard).
  ``apply_memory(limit)``
      when the allocated memory differs from the actual one and the guard lets it through;
      always before ``apply_cpu`` in the same sync.
  ``apply_cpu(limit_m, request_m)``
      after memory; a cpu *increase* waits while a memory change is held, a decrease does not.

  ``status.containerStatuses[].resources`` is updated only after the call returned. An exception
  from ``apply_*`` (or ``memory_usage``) holds the resize with ``PodResizeInProgress`` reason
  ``Error`` and the exception's text, and is retried on the next sync, as the kubelet retries a
  failed runtime ``UpdateContainerResources``. The default is
  :class:`loadgen.kubesim.cgroup.CgroupActuator`; with no actuator only the Pod status moves.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
from typing import Protocol

from loadgen.kubesim.model import JSON, NodeModel, PodStore, Want, fmt_cpu, fmt_mem, set_rl


class Actuator(Protocol):
    """What makes the target container really run with new limits (see the module docstring)."""

    async def start(self, actual: Want) -> None: ...

    async def memory_usage(self) -> int: ...

    async def apply_memory(self, limit: int | None) -> None: ...

    async def apply_cpu(self, limit_m: int | None, request_m: int | None) -> None: ...


class Kubelet:
    """The resize half of a kubelet for one Pod, synced every ``sync_interval`` or on a kick."""

    def __init__(
        self,
        store: PodStore,
        node: NodeModel,
        *,
        container: str,
        actuator: Actuator | None = None,
        sync_interval: float = 0.05,
        actuation_delay: float = 0.0,
    ) -> None:
        self.store = store
        self.node = node
        self.container = container
        self.actuator = actuator
        self.sync_interval = sync_interval
        self.actuation_delay = actuation_delay
        #: held while syncing; the API side takes it for a resize PATCH
        self.lock = asyncio.Lock()
        self._kick = asyncio.Event()
        self._allocated_at: float | None = None
        # allocated limits are not in the API (kubelet checkpoint): keep them here
        self._alloc_limits = {n: store.actual_of(n) for n in store.container_names}
        self._pod_alloc: JSON | None = copy.deepcopy(store.pod.get("spec", {}).get("resources"))

    def kick(self) -> None:
        """Sync now rather than at the next interval."""
        self._kick.set()

    async def start_actuator(self) -> None:
        if self.actuator is not None:
            actual = self.store.actual_of(self.container)
            await self.actuator.start(self.store.pod_level(actual, actual=True))

    async def run(self) -> None:
        """The sync loop (until cancelled)."""
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.sync_interval):
                    await self._kick.wait()
            self._kick.clear()
            async with self.lock:
                await self.sync()

    async def sync(self) -> None:
        """One kubelet sync: admit (allocate) a pending resize, then actuate what is allocated."""
        pod = self.store.pod
        changed = False
        status = pod.setdefault("status", {})
        gen = pod["metadata"]["generation"]
        if status.get("observedGeneration") != gen:
            status["observedGeneration"] = gen
            changed = True
        spec = pod["spec"]
        desired = {c["name"]: Want.of(c.get("resources")) for c in spec["containers"]}
        if (
            any(desired[n] != self._alloc_limits.get(n) for n in desired)
            or self._pod_alloc_differs()
        ):
            changed |= self._admit(desired)
        changed |= await self._actuate()
        if changed:
            self.store.touch()

    # ------------------------------------------------------------------ admission

    @staticmethod
    def _requests_total(spec: JSON) -> tuple[int, int]:
        if isinstance(spec.get("resources"), dict) and spec["resources"]:
            w = Want.of(spec["resources"])
            return w.cpu_req or 0, w.mem_req or 0
        cpu = mem = 0
        for c in spec.get("containers", []):
            w = Want.of(c.get("resources"))
            cpu += w.cpu_req or 0
            mem += w.mem_req or 0
        return cpu, mem

    def _allocated_total(self) -> tuple[int, int]:
        cpu = mem = 0
        for c in self.store.pod["spec"]["containers"]:
            alloc = self.store.status(c["name"]).get("allocatedResources", {})
            w = Want.of({"requests": alloc}) if alloc else self._alloc_limits[c["name"]]
            cpu += w.cpu_req or 0
            mem += w.mem_req or 0
        pod_alloc = self.store.pod.get("status", {}).get("allocatedResources")
        if isinstance(pod_alloc, dict) and pod_alloc:
            w = Want.of({"requests": pod_alloc})
            return w.cpu_req or 0, w.mem_req or 0
        return cpu, mem

    def _pod_alloc_differs(self) -> bool:
        pod_res = self.store.pod["spec"].get("resources")
        if not isinstance(pod_res, dict):
            return False
        return bool(self._pod_alloc != pod_res)

    def _pending(self, reason: str, message: str) -> bool:
        before = copy.deepcopy(self.store.condition("PodResizePending"))
        self.store.set_condition("PodResizePending", reason, message)
        return before != self.store.condition("PodResizePending")

    def _admit(self, desired: dict[str, Want]) -> bool:
        store, node = self.store, self.node
        new_cpu, new_mem = self._requests_total(store.pod["spec"])
        if new_cpu > node.allocatable_cpu_m or new_mem > node.allocatable_memory:
            res, req, cap = (
                ("cpu", new_cpu, node.allocatable_cpu_m)
                if new_cpu > node.allocatable_cpu_m
                else ("memory", new_mem, node.allocatable_memory)
            )
            msg = f"Node didn't have enough capacity: {res}, requested: {req}, capacity: {cap}"
            return self._pending("Infeasible", msg)
        old_cpu, old_mem = self._allocated_total()
        increases = new_cpu > old_cpu or new_mem > old_mem
        if increases and (
            new_cpu > node.allocatable_cpu_m - node.others_cpu_m
            or new_mem > node.allocatable_memory - node.others_memory
        ):
            if new_cpu > node.allocatable_cpu_m - node.others_cpu_m:
                res, req, used, cap = "cpu", new_cpu, node.others_cpu_m, node.allocatable_cpu_m
            else:
                res, req, used, cap = "memory", new_mem, node.others_memory, node.allocatable_memory
            msg = (
                f"Node didn't have enough resource: {res}, requested: {req}, "
                f"used: {used}, capacity: {cap}"
            )
            return self._pending("Deferred", msg)
        # admitted: allocate
        store.clear_condition("PodResizePending")
        for c in store.pod["spec"]["containers"]:
            w = desired[c["name"]]
            alloc: JSON = {}
            if w.cpu_req is not None:
                alloc["cpu"] = fmt_cpu(w.cpu_req)
            if w.mem_req is not None:
                alloc["memory"] = fmt_mem(w.mem_req)
            store.status(c["name"])["allocatedResources"] = alloc
            self._alloc_limits[c["name"]] = w
        pod_res = store.pod["spec"].get("resources")
        if isinstance(pod_res, dict):
            requests = pod_res.get("requests")
            store.pod["status"]["allocatedResources"] = copy.deepcopy(
                requests if isinstance(requests, dict) else {}
            )
            self._pod_alloc = copy.deepcopy(pod_res)
        store.set_condition("PodResizeInProgress")
        self._allocated_at = asyncio.get_running_loop().time()
        return True

    # ------------------------------------------------------------------ actuation

    async def _usage(self, name: str) -> int:
        if self.actuator is None or name != self.container:
            return 0
        return await self.actuator.memory_usage()

    async def _actuate(self) -> bool:
        """Apply what is allocated but not actual: memory first, then cpu; decreases of memory
        below usage are refused (Error) and retried; cpu increases wait for memory."""
        store = self.store
        if store.condition("PodResizeInProgress") is None:
            return False
        loop_time = asyncio.get_running_loop().time()
        if self._allocated_at is not None and loop_time - self._allocated_at < self.actuation_delay:
            return False
        errors: list[str] = []
        changed = False
        for c in store.pod["spec"]["containers"]:
            name = c["name"]
            try:
                changed |= await self._actuate_container(c, errors)
            except Exception as exc:
                errors.append(f'updating container "{name}" resources: {exc}')
        if not errors:
            try:
                changed |= await self._actuate_pod_level(errors)
            except Exception as exc:
                errors.append(f"updating pod resources: {exc}")
        if errors:
            cond = store.condition("PodResizeInProgress")
            msg = "; ".join(errors)
            if cond is None or cond.get("reason") != "Error" or cond.get("message") != msg:
                store.set_condition("PodResizeInProgress", "Error", msg)
                changed = True
        else:
            store.clear_condition("PodResizeInProgress")
            self._allocated_at = None
            changed = True
        return changed

    async def _actuate_container(self, c: JSON, errors: list[str]) -> bool:
        store, name = self.store, c["name"]
        act = self.actuator if name == self.container else None
        want, have = self._alloc_limits[name], store.actual_of(name)
        st = store.status(name)
        res = copy.deepcopy(st.get("resources") or c.get("resources") or {})
        res.pop("claims", None)
        changed, mem_ok = False, True
        if (want.mem_lim, want.mem_req) != (have.mem_lim, have.mem_req):
            eff = store.pod_level(want)
            lowering = want.mem_lim is not None and (
                have.mem_lim is None or want.mem_lim < have.mem_lim
            )
            usage = await self._usage(name) if lowering else 0
            if lowering and eff.mem_lim is not None and usage >= eff.mem_lim:
                errors.append(
                    f'attempting to set container "{name}" memory limit ({eff.mem_lim}) '
                    f"below current usage ({usage})"
                )
                mem_ok = False
            else:
                if act is not None:
                    await act.apply_memory(eff.mem_lim)
                set_rl(res, "memory", want.mem_req, want.mem_lim, fmt_mem)
                changed = True
        if (want.cpu_lim, want.cpu_req) != (have.cpu_lim, have.cpu_req):
            increase = (want.cpu_lim or 0) > (have.cpu_lim or 0) or (want.cpu_req or 0) > (
                have.cpu_req or 0
            )
            if mem_ok or not increase:
                eff = store.pod_level(want)
                if act is not None:
                    await act.apply_cpu(eff.cpu_lim, eff.cpu_req)
                set_rl(res, "cpu", want.cpu_req, want.cpu_lim, fmt_cpu)
                changed = True
        if changed:
            st["resources"] = res
        return changed

    async def _actuate_pod_level(self, errors: list[str]) -> bool:
        """Pod-level resize (KEP-5419): a container without its own limit inherits it."""
        pod = self.store.pod
        pod_res = pod["spec"].get("resources")
        if not isinstance(pod_res, dict) or pod["status"].get("resources") == pod_res:
            return False
        eff = self.store.pod_level(self._alloc_limits[self.container])
        old = Want.of(pod["status"].get("resources"))
        new = Want.of(pod_res)
        lowering = new.mem_lim is not None and (old.mem_lim is None or new.mem_lim < old.mem_lim)
        usage = await self.actuator.memory_usage() if self.actuator and lowering else 0
        if lowering and new.mem_lim is not None and usage >= new.mem_lim:
            errors.append(
                f"attempting to set pod memory limit ({new.mem_lim}) below current usage ({usage})"
            )
            return False
        if self.actuator is not None:
            await self.actuator.apply_memory(eff.mem_lim)
            await self.actuator.apply_cpu(eff.cpu_lim, eff.cpu_req)
        pod["status"]["resources"] = copy.deepcopy(pod_res)
        return True
