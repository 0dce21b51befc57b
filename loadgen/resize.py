"""Resize drivers: change the bridge's CPU and memory limits the way a node would.

Why several backends: the bridge learns its limits from cgroup files (and, in a cluster, from its
own Pod), so the benchmark must change exactly those, in the order and with the refusals a real
node has (docs/kubernetes.md: memory-decrease guard, write order), or the comparison with a
restart proves nothing.

``local``
    The bridge runs as a child process with ``BRIDGE_CGROUP_ROOT`` pointing at a directory laid
    out like a container's cgroup v2 view, which this module writes: ``cpu.max``, ``memory.max``
    and ``memory.current`` (the child's RSS from ``/proc/PID/statm``, refreshed every 100 ms and
    read live where this driver compares it, so a memory decrease meets the usage it would meet
    on a node). CPU is additionally throttled
    for real through a cgroup CPU controller when one is writable (:class:`CpuThrottle`:
    v1 ``cpu.cfs_quota_us`` or v2 ``cpu.max``; as root); otherwise the report says
    "simulated only". Memory limits are never enforced, only announced.
    A memory decrease below the current usage is held like the kubelet holds it: ``memory.max``
    keeps the old value until usage is below the new one. Without a Pod API the bridge has no
    "desired" limit to plan for, so the driver announces it through ``memory.high`` (the cgroup
    v2 knob for "reclaim above this"; the bridge plans for min(memory.max, memory.high)) and
    restores ``memory.high = max`` when the decrease is enacted.
``kubesim``
    ``PATCH …/pods/NAME/resize`` (strategic merge, like ``kubectl patch --subresource resize``)
    against :class:`loadgen.kubesim.KubeSim`, whose kubelet simulator writes the same directory.
    The bridge watches the stand-in's Pod (``BRIDGE_KUBE_API`` …), sees desired vs actual and
    downscales cooperatively; the simulator holds a decrease below ``memory.current``.
``kubectl``
    The same through ``kubectl patch pod NAME --subresource resize --type strategic -p BODY``
    against the stand-in, then ``kubectl get pod -o json`` until the status converges.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bridge.resources.kubeapi import ENV_API, ENV_POD_NAME, ENV_POD_NAMESPACE
from bridge.resources.quantity import QuantityError, to_bytes, to_millicores
from loadgen.kubesim import CgroupDir, KubeSim
from loadgen.podhttp import get_pod, patch_resize

PERIOD_US = 100_000
PAGE = os.sysconf("SC_PAGE_SIZE")
POD_NAME = "simbridge-loadgen-0"
POD_NAMESPACE = "loadgen"
CONTAINER = "bridge"
BACKENDS = ("local", "kubesim", "kubectl")


def rss_bytes(pid: int) -> int:
    """Resident set size of ``pid`` (what the kubelet's usage check compares, roughly); 0 when
    the process is gone."""
    try:
        with open(f"/proc/{pid}/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * PAGE
    except (OSError, ValueError, IndexError):
        return 0


def cpu_quantity(cores: float) -> str:
    return f"{round(cores * 1000)}m"


def memory_quantity(n: int) -> str:
    for suffix, shift in (("Gi", 30), ("Mi", 20), ("Ki", 10)):
        if n and n % (1 << shift) == 0:
            return f"{n >> shift}{suffix}"
    return str(n)


def resize_body(cpu: float, memory: int) -> dict[str, Any]:
    """A strategic-merge resize body (the shape of ``tests/fixtures/k8s/resize-patch-body.json``):
    requests = limits, so the Guaranteed QoS class cannot change."""
    rl = {"cpu": cpu_quantity(cpu), "memory": memory_quantity(memory)}
    return {
        "spec": {"containers": [{"name": CONTAINER, "resources": {"requests": rl, "limits": rl}}]}
    }


# ---------------------------------------------------------------------------------------------
# Real CPU throttling


class CpuThrottle:
    """A cgroup of our own under a writable CPU controller; the bridge child is moved into it.

    Why: the simulated files tell the bridge what it *may* use; only a real quota shows whether
    it copes when it really gets less. Created with mkdir (needs root), removed at the end.
    """

    def __init__(self, version: str, path: Path, parent: Path) -> None:
        self.version = version
        self.path = path
        self.parent = parent
        self.pids: set[int] = set()

    @property
    def description(self) -> str:
        return f"real (cgroup {self.version} {self.path})"

    @classmethod
    def create(cls, name: str | None = None) -> CpuThrottle | str:
        """The throttle, or a sentence saying why there is none (never raises)."""
        name = name or f"simbridge-loadgen-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        v1 = Path("/sys/fs/cgroup/cpu")
        v2 = Path("/sys/fs/cgroup")
        try:
            if (v1 / "cpu.cfs_quota_us").exists():
                path = v1 / name
                path.mkdir()
                (path / "cpu.cfs_period_us").write_text(str(PERIOD_US))
                return cls("v1", path, v1)
            if (v2 / "cgroup.controllers").exists():
                own = _own_v2_cgroup()
                parent = v2 / own.lstrip("/")
                control = (parent / "cgroup.subtree_control").read_text().split()
                if "cpu" not in control:
                    return f"cgroup v2 at {parent}: cpu controller not delegated to children"
                path = parent / name
                path.mkdir()
                return cls("v2", path, parent)
        except OSError as exc:
            return f"cannot create a CPU cgroup ({exc.strerror or exc}; needs root)"
        return "no cgroup CPU controller mounted"

    def attach(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(str(pid))
        self.pids.add(pid)

    def set(self, cores: float | None) -> None:
        quota = -1 if cores is None else max(1000, round(cores * PERIOD_US))
        if self.version == "v1":
            (self.path / "cpu.cfs_quota_us").write_text(str(quota))
        else:
            (self.path / "cpu.max").write_text(f"{'max' if quota < 0 else quota} {PERIOD_US}")

    def close(self) -> None:
        """Move any process still inside back to the parent and remove the group."""
        with contextlib.suppress(OSError):
            for line in (self.path / "cgroup.procs").read_text().split():
                with contextlib.suppress(OSError):
                    (self.parent / "cgroup.procs").write_text(line)
        for _ in range(50):
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.02)  # the kernel frees the group once its last task is gone


def _own_v2_cgroup() -> str:
    with open("/proc/self/cgroup", encoding="ascii") as f:
        for line in f:
            if line.startswith("0::"):
                return line[3:].strip()
    return "/"


# ---------------------------------------------------------------------------------------------
# Results


@dataclass
class Applied:
    """What one resize did, on the runner's wall clock (ns)."""

    requested_ns: int
    target_cpu: float | None
    target_memory: int | None
    usage_at_request: int = 0
    #: when the node-side value was in the files the bridge reads (None: never, i.e. a held
    #: memory decrease that did not resolve before the deadline)
    written_ns: int | None = None
    held: bool = False
    hold_s: float | None = None
    resolved: bool = True
    notes: list[str] = field(default_factory=list)


# ---------------------------------------------------------------------------------------------
# Backends


class LocalBackend:
    """See the module docstring (``local``)."""

    name = "local"

    def __init__(self, cgroup_dir: Path, *, real_cpu: bool = True) -> None:
        self.dir = CgroupDir(str(cgroup_dir), version="v2")
        self.cgroup_dir = cgroup_dir
        self.pid: int | None = None
        self.cpu: float | None = None
        self.memory: int | None = None
        self._usage_task: asyncio.Task[None] | None = None
        self._throttle: CpuThrottle | None = None
        if real_cpu:
            made = CpuThrottle.create()
            if isinstance(made, CpuThrottle):
                self._throttle = made
                self.cpu_throttle = made.description
            else:
                self.cpu_throttle = f"simulated only: {made}"
        else:
            self.cpu_throttle = "simulated only: disabled (--no-real-cpu)"

    # -- lifecycle -------------------------------------------------------------------------

    def env(self) -> dict[str, str]:
        return {"BRIDGE_CGROUP_ROOT": str(self.cgroup_dir)}

    async def start(self, cpu: float | None, memory: int | None) -> None:
        self.cgroup_dir.mkdir(parents=True, exist_ok=True)
        self.write_now(cpu, memory)
        self._write(self.cgroup_dir / "memory.high", "max")
        self.dir.set_memory_usage(0)
        self._usage_task = asyncio.create_task(self._mirror_usage(), name="usage-mirror")

    def attach(self, pid: int) -> None:
        """A (new) bridge process: mirror its RSS, put it under the real CPU quota."""
        self.pid = pid
        self.dir.set_memory_usage(rss_bytes(pid))
        if self._throttle is not None:
            try:
                self._throttle.attach(pid)
            except OSError as exc:
                self.cpu_throttle = f"simulated only: attaching pid failed ({exc.strerror})"
                self._throttle.close()
                self._throttle = None

    async def close(self) -> None:
        if self._usage_task is not None:
            self._usage_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._usage_task
        if self._throttle is not None:
            await asyncio.to_thread(self._throttle.close)

    async def _mirror_usage(self) -> None:
        while True:
            if self.pid is not None and (rss := rss_bytes(self.pid)):
                self.dir.set_memory_usage(rss)
            await asyncio.sleep(0.1)

    def usage(self) -> int:
        """``memory.current`` as the node sees it: the bridge's RSS read now (and mirrored into
        the file, which kubesim's kubelet compares a decrease with). A real ``memory.current``
        is live: a dip that lasts 100 ms must not hide between two mirror refreshes."""
        if self.pid is not None and (rss := rss_bytes(self.pid)):
            self.dir.set_memory_usage(rss)
            return rss
        return self.dir.memory_usage()

    # -- writing ---------------------------------------------------------------------------

    @staticmethod
    def _write(path: Path, text: str) -> None:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text + "\n")
        os.replace(tmp, path)  # the bridge never reads half a value

    def _write_cpu(self, cpu: float) -> None:
        self.dir.write_cpu(round(cpu * 1000), round(cpu * 1000))
        if self._throttle is not None:
            self._throttle.set(cpu)
        self.cpu = cpu

    def _write_memory(self, memory: int) -> None:
        self.dir.write_memory_limit(memory)
        self.memory = memory

    def write_now(self, cpu: float | None, memory: int | None) -> None:
        """Set limits without any check (a new container starts with them: the restart path)."""
        if memory is not None:
            self._write_memory(memory)
            self._write(self.cgroup_dir / "memory.high", "max")
        if cpu is not None:
            self._write_cpu(cpu)

    async def apply(
        self,
        cpu: float | None,
        memory: int | None,
        *,
        hold_timeout: float,
        converge_timeout: float = 10.0,
    ) -> Applied:
        """Like the kubelet: memory before cpu when memory grows; a decrease below usage is
        held (announced through ``memory.high``) until usage drops or ``hold_timeout``."""
        res = Applied(time.time_ns(), cpu, memory, usage_at_request=self.usage())
        if memory is not None and self.memory is not None and memory < self.memory:
            if cpu is not None:
                self._write_cpu(cpu)  # cpu changes are not blocked by a held memory decrease
                cpu = None
            # The sample that falls below the limit is the one acted on, as the kubelet does: a
            # second read a moment later may already see frames in flight regrow the heap.
            usage = self.usage()
            if usage >= memory:
                res.held = True
                self._write(self.cgroup_dir / "memory.high", str(memory))
                t0 = time.monotonic()
                deadline = t0 + hold_timeout
                while usage >= memory and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)  # usage is a file to poll, nothing to wait on
                    usage = self.usage()
                res.hold_s = round(time.monotonic() - t0, 3)
                res.notes.append(
                    f"held: usage {res.usage_at_request >> 20}Mi -> {usage >> 20}Mi, "
                    f"limit {memory >> 20}Mi"
                )
                if usage >= memory:
                    res.resolved = False
                    res.notes.append(
                        f"unresolved after {hold_timeout:g} s: memory.max not lowered "
                        "(memory.high keeps announcing it)"
                    )
                    return res
        if memory is not None:
            self.write_now(None, memory)
        if cpu is not None:
            self._write_cpu(cpu)
        res.written_ns = time.time_ns()
        return res


class KubeSimBackend(LocalBackend):
    """See the module docstring (``kubesim``); the RSS mirror and real throttle are inherited."""

    name = "kubesim"

    def __init__(self, cgroup_dir: Path, *, real_cpu: bool = True) -> None:
        super().__init__(cgroup_dir, real_cpu=real_cpu)
        self.sim: KubeSim | None = None
        self.bodies: list[dict[str, Any]] = []

    def env(self) -> dict[str, str]:
        assert self.sim is not None, "start() first"
        return {
            **super().env(),
            ENV_API: self.sim.url,
            ENV_POD_NAME: POD_NAME,
            ENV_POD_NAMESPACE: POD_NAMESPACE,
            "BRIDGE_CONTAINER_NAME": CONTAINER,
        }

    async def start(self, cpu: float | None, memory: int | None) -> None:
        if cpu is None or memory is None:
            raise ValueError(f"the {self.name} backend needs initial cpu and memory limits")
        await super().start(cpu, memory)
        self.sim = KubeSim(
            pod_json(cpu, memory), cgroup_dir=str(self.cgroup_dir), sync_interval=0.05
        )
        await self.sim.start()

    async def close(self) -> None:
        if self.sim is not None:
            await self.sim.stop()
        await super().close()

    @property
    def pod_path(self) -> str:
        return f"/api/v1/namespaces/{POD_NAMESPACE}/pods/{POD_NAME}"

    async def _patch(self, body: dict[str, Any]) -> None:
        assert self.sim is not None
        await patch_resize(self.sim.url + self.pod_path, body)

    async def _get_pod(self) -> dict[str, Any]:
        assert self.sim is not None
        return await get_pod(self.sim.url + self.pod_path)

    async def apply(
        self,
        cpu: float | None,
        memory: int | None,
        *,
        hold_timeout: float,
        converge_timeout: float = 10.0,
    ) -> Applied:
        """PATCH, then wait until the status converged and the files show it; a resize the
        kubelet holds (PodResizeInProgress reason Error) waits at most ``hold_timeout``."""
        res = Applied(time.time_ns(), cpu, memory, usage_at_request=self.usage())
        cpu_t = cpu if cpu is not None else self.cpu
        mem_t = memory if memory is not None else self.memory
        assert cpu_t is not None and mem_t is not None
        body = resize_body(cpu_t, mem_t)
        self.bodies.append(body)
        await self._patch(body)
        want_cpu = f"{round(cpu_t * PERIOD_US)} {PERIOD_US}"
        t0 = time.monotonic()
        held_since: float | None = None
        while True:
            pod = await self._get_pod()
            if _converged(pod, body) and self._files_match(want_cpu, mem_t):
                break
            if _resize_error(pod) and held_since is None:
                held_since = time.monotonic()
                res.held = True
            waited = time.monotonic() - t0
            if (held_since is not None and time.monotonic() - held_since > hold_timeout) or (
                waited > max(hold_timeout, converge_timeout)
            ):
                res.resolved = False
                res.notes.append(f"pod status did not converge within {waited:.1f} s")
                break
            await asyncio.sleep(0.02)
        if held_since is not None:
            res.hold_s = round(time.monotonic() - held_since, 3)
        if res.resolved:
            res.written_ns = time.time_ns()
            if self._throttle is not None:
                self._throttle.set(cpu_t)
            self.cpu, self.memory = cpu_t, mem_t
        return res

    def _files_match(self, cpu_max: str, memory: int) -> bool:
        try:
            return (self.cgroup_dir / "cpu.max").read_text().strip() == cpu_max and int(
                (self.cgroup_dir / "memory.max").read_text().strip()
            ) == memory
        except (OSError, ValueError):
            return False


class KubectlBackend(KubeSimBackend):
    """See the module docstring (``kubectl``)."""

    name = "kubectl"

    def __init__(self, cgroup_dir: Path, *, real_cpu: bool = True) -> None:
        if shutil.which("kubectl") is None:
            raise RuntimeError("the kubectl backend needs kubectl on PATH")
        super().__init__(cgroup_dir, real_cpu=real_cpu)
        self.kubeconfig = cgroup_dir.parent / "kubeconfig"
        self.outputs: list[str] = []

    async def start(self, cpu: float | None, memory: int | None) -> None:
        await super().start(cpu, memory)
        # an empty kubeconfig: the user's own (a real cluster) must never be touched
        self.kubeconfig.write_text("apiVersion: v1\nkind: Config\n")

    async def kubectl(self, *args: str) -> tuple[int, str]:
        assert self.sim is not None
        proc = await asyncio.create_subprocess_exec(
            "kubectl",
            "--kubeconfig",
            str(self.kubeconfig),
            "--server",
            self.sim.url,
            "-n",
            POD_NAMESPACE,
            *args,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), 30)
        return proc.returncode or 0, out.decode() + err.decode()

    async def _patch(self, body: dict[str, Any]) -> None:
        rc, out = await self.kubectl(
            "patch",
            "pod",
            POD_NAME,
            "--subresource",
            "resize",
            "--type",
            "strategic",
            "-p",
            json.dumps(body),
        )
        self.outputs.append(out.strip())
        if rc != 0:
            raise RuntimeError(f"kubectl patch failed ({rc}): {out.strip()}")

    async def _get_pod(self) -> dict[str, Any]:
        rc, out = await self.kubectl("get", "pod", POD_NAME, "-o", "json")
        if rc != 0:
            raise RuntimeError(f"kubectl get pod failed ({rc}): {out.strip()}")
        pod: dict[str, Any] = json.loads(out)
        return pod


def _container_status(pod: dict[str, Any]) -> dict[str, Any]:
    for st in pod.get("status", {}).get("containerStatuses", []):
        if st.get("name") == CONTAINER:
            return dict(st)
    return {}


def _resize_error(pod: dict[str, Any]) -> bool:
    return any(
        c.get("type") == "PodResizeInProgress" and c.get("reason") == "Error"
        for c in pod.get("status", {}).get("conditions", [])
    )


def _converged(pod: dict[str, Any], body: dict[str, Any]) -> bool:
    """Seen (observedGeneration) and finished (actual == desired, no condition); see
    docs/kubernetes.md, desired/allocated/actual."""
    meta, status = pod.get("metadata", {}), pod.get("status", {})
    if status.get("observedGeneration", 0) < meta.get("generation", 0):
        return False
    if any(
        c.get("type") in ("PodResizePending", "PodResizeInProgress")
        for c in status.get("conditions", [])
    ):
        return False
    want = body["spec"]["containers"][0]["resources"]
    have = _container_status(pod).get("resources", {})
    return all(
        _quantities(have.get(part, {}), want[part]) == _quantities(want[part], want[part])
        for part in ("requests", "limits")
    )


def _quantities(rl: dict[str, Any], keys: dict[str, Any]) -> dict[str, int | None]:
    """cpu in millicores, memory in bytes: "1" and "1000m" are the same quantity."""
    out: dict[str, int | None] = {}
    for k in keys:
        v = rl.get(k)
        try:
            out[k] = None if v is None else (to_millicores(v) if k == "cpu" else to_bytes(v))
        except QuantityError:
            out[k] = None
    return out


def pod_json(cpu: float, memory: int) -> dict[str, Any]:
    """The stand-in's Pod: one Guaranteed container ``bridge`` (resizePolicy NotRequired)."""
    rl = {"cpu": cpu_quantity(cpu), "memory": memory_quantity(memory)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": POD_NAME,
            "namespace": POD_NAMESPACE,
            "uid": str(uuid.uuid4()),
            "generation": 1,
            "resourceVersion": "1",
        },
        "spec": {
            "nodeName": "loadgen-node",
            "containers": [
                {
                    "name": CONTAINER,
                    "image": "simbridge:local",
                    "resources": {"requests": dict(rl), "limits": dict(rl)},
                    "resizePolicy": [
                        {"resourceName": "cpu", "restartPolicy": "NotRequired"},
                        {"resourceName": "memory", "restartPolicy": "NotRequired"},
                    ],
                }
            ],
        },
        "status": {
            "phase": "Running",
            "qosClass": "Guaranteed",
            "observedGeneration": 1,
            "containerStatuses": [
                {
                    "name": CONTAINER,
                    "ready": True,
                    "started": True,
                    "restartCount": 0,
                    "allocatedResources": dict(rl),
                    "resources": {"requests": dict(rl), "limits": dict(rl)},
                }
            ],
        },
    }


def make_backend(name: str, cgroup_dir: Path, *, real_cpu: bool = True) -> LocalBackend:
    if name == "local":
        return LocalBackend(cgroup_dir, real_cpu=real_cpu)
    if name == "kubesim":
        return KubeSimBackend(cgroup_dir, real_cpu=real_cpu)
    if name == "kubectl":
        return KubectlBackend(cgroup_dir, real_cpu=real_cpu)
    raise ValueError(f"unknown backend {name!r} (have {', '.join(BACKENDS)})")
