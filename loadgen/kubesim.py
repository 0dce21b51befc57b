"""kubesim: a local stand-in for the Kubernetes API server and the kubelet's in-place resize.

Why: the bridge's adaptation to in-place resize (docs/design.md §4) has to be tested end to end
on a machine without a cluster.
kubesim serves real HTTP/1.1 on 127.0.0.1 (port 0 by default), speaks the JSON
shapes of the real objects (tests/fixtures/k8s), and writes the cgroup files the bridge reads into a
directory laid out like ``BRIDGE_CGROUP_ROOT`` (v2: ``cpu.max`` etc. in it; v1: ``cpu/``,
``memory/`` sub-directories).

What it models
  * One Pod (any number of containers), its ResourceClaims and the ResourceSlices, read-only except
    for ``PATCH /api/v1/namespaces/{ns}/pods/{name}/resize`` (strategic merge patch, the default of
    ``kubectl patch --subresource resize``; JSON merge patch too, which replaces the containers list
    and is then rejected like the real API does).
  * API-side validation of a resize (422 ``Invalid`` Status): only cpu/memory requests/limits may
    change (``spec: Forbidden: only cpu and memory resources are mutable``), limits/requests cannot
    be removed, requests <= limits, and the QoS class may not change. Optionally
    (``claims_block_resize``) the ≤1.35 behaviour: a container with ``resources.claims`` cannot be
    resized at all (docs/kubernetes.md, claims vs resize).
  * Each accepted resize bumps ``metadata.generation``; watchers get ``MODIFIED`` events.
  * A kubelet loop (every ``sync_interval``): admits the resize against the node's allocatable
    (``PodResizePending`` ``Infeasible`` beyond allocatable, ``Deferred`` beyond what the other pods
    leave free, with the kubelet's message formats), sets ``allocatedResources`` and
    ``PodResizeInProgress``, then after ``actuation_delay`` writes the cgroup files — memory before
    cpu — and updates ``status.containerStatuses[].resources``. A memory-limit decrease below the
    current usage (``memory.current`` / v1 ``memory.usage_in_bytes`` read from the cgroup directory)
    is held with ``PodResizeInProgress`` reason ``Error`` and retried each sync until usage drops;
    cpu decreases are still applied meanwhile, cpu increases are not (docs/kubernetes.md,
    cgroup values).
  * ``status.observedGeneration`` follows ``metadata.generation`` on each sync.
  * Events: ``POST``/``GET /api/v1/namespaces/{ns}/events``.
  * Discovery (``/version``, ``/api``, ``/apis``, ``/api/v1``, ``/apis/resource.k8s.io/v1``) so that
    ``kubectl --server http://127.0.0.1:PORT get pod`` / ``patch pod … --subresource resize`` work.

What it does not model
  the kubelet's retry timers (Deferred is re-evaluated on every sync, not after 30 s / 3 min),
  authentication/RBAC, other resource kinds, creating/deleting pods, resourceVersion-exact watch
  replay (a watch from an old version gets the current object), ``$patch`` directives, scheduler
  preemption, restarts for ``RestartContainer`` policies, swap, static CPU/memory managers,
  pod-level cgroups (only one container's own cgroup is written: ``container``, default the one
  named ``bridge`` else the first; a container without a limit gets the pod-level limit, as in
  KEP-2837), the old linear cpu.weight formula (the quadratic one of current runtimes is used),
  and real timing (defaults are fast for tests). Authorization headers are recorded, not checked.

Run standalone: ``python -m loadgen.kubesim --pod pod.json --cgroup-dir /tmp/cg`` (prints the URL).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import datetime as _dt
import http
import json
import math
import os
import urllib.parse
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from bridge.resources.quantity import QuantityError, to_bytes, to_millicores

JSON = dict[str, Any]
GiB = 1 << 30

# ----------------------------------------------------------------------------- pure helpers


def now_iso() -> str:
    return _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


_MERGE_KEYS = {"containers": "name", "initContainers": "name", "resizePolicy": "resourceName"}


def strategic_merge(base: Any, patch: Any, key: str | None = None) -> Any:
    """Strategic merge for the fields a resize touches: maps merge recursively (``null``
    deletes), containers merge by ``name`` (resizePolicy by ``resourceName``), other lists
    replace."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for k, v in patch.items():
            if v is None:
                out.pop(k, None)
            else:
                out[k] = strategic_merge(base.get(k), v, k)
        return out
    if isinstance(base, list) and isinstance(patch, list) and key in _MERGE_KEYS:
        mk = _MERGE_KEYS[key]
        out_list = [copy.deepcopy(x) for x in base]
        for item in patch:
            if not isinstance(item, dict) or mk not in item:
                raise ValueError(f"{key}: list element without merge key {mk!r}")
            idx = next(
                (
                    i
                    for i, x in enumerate(out_list)
                    if isinstance(x, dict) and x.get(mk) == item[mk]
                ),
                None,
            )
            if idx is None:
                out_list.append(copy.deepcopy(item))
            else:
                out_list[idx] = strategic_merge(out_list[idx], item)
        return out_list
    return copy.deepcopy(patch)


def json_merge(base: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (lists replace wholesale)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(base) if isinstance(base, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = json_merge(out.get(k), v)
    return out


def _rl(req: Any) -> JSON:
    return req if isinstance(req, dict) else {}


_CONVERT = {"cpu": to_millicores, "memory": to_bytes}


def _numbers(rl: Any) -> dict[str, int]:
    """The cpu (millicores) and memory (bytes) entries of a ResourceList."""
    return {k: _CONVERT[k](v) for k, v in _rl(rl).items() if k in _CONVERT}


def container_qos_parts(res: JSON) -> tuple[dict[str, int], dict[str, int]]:
    """requests and limits of cpu/memory as numbers; requests default to limits (API defaulting)."""
    limits = _numbers(res.get("limits"))
    return {**limits, **_numbers(res.get("requests"))}, limits


def qos_class(spec: JSON) -> str:
    """core/v1 QoS: Guaranteed (every container cpu+memory limits == requests), BestEffort (no
    cpu/memory anywhere), else Burstable. Pod-level resources decide when present."""
    if isinstance(spec.get("resources"), dict) and spec["resources"]:
        parts = [container_qos_parts(spec["resources"])]
    else:
        parts = [container_qos_parts(_rl(c.get("resources"))) for c in spec.get("containers", [])]
    if all(not r and not lim for r, lim in parts):
        return "BestEffort"
    guaranteed = all(
        set(lim) >= {"cpu", "memory"} and all(r.get(k) == lim[k] for k in ("cpu", "memory"))
        for r, lim in parts
    )
    return "Guaranteed" if guaranteed else "Burstable"


def _mask_cpu_memory(spec: JSON) -> JSON:
    """The spec without cpu/memory requests/limits (everything else must be equal on resize)."""
    s = copy.deepcopy(spec)
    holders = [c.get("resources") for c in s.get("containers", []) + s.get("initContainers", [])]
    holders.append(s.get("resources"))
    for res in holders:
        if not isinstance(res, dict):
            continue
        for part in ("requests", "limits"):
            rl = res.get(part)
            if isinstance(rl, dict):
                for k in ("cpu", "memory"):
                    rl.pop(k, None)
                if not rl:
                    res.pop(part)
    for c in s.get("containers", []) + s.get("initContainers", []):
        if c.get("resources") == {}:
            c.pop("resources")
    if s.get("resources") == {}:
        s.pop("resources")
    return s


def validate_resize(old: JSON, new: JSON, *, claims_block_resize: bool = False) -> str | None:
    """The API server's resize validation; ``None`` when valid, else the error message."""
    name = old.get("metadata", {}).get("name", "")
    prefix = f'Pod "{name}" is invalid: '
    os_, ns_ = old.get("spec", {}), new.get("spec", {})
    if claims_block_resize and any(
        _rl(c.get("resources")).get("claims") for c in os_.get("containers", [])
    ):
        return prefix + "spec: Forbidden: only cpu and memory resources are mutable"
    if [c.get("name") for c in os_.get("containers", [])] != [
        c.get("name") for c in ns_.get("containers", [])
    ]:
        return (
            prefix
            + "spec.containers: Forbidden: containers may not be renamed or reordered on resize"
        )
    if _mask_cpu_memory(os_) != _mask_cpu_memory(ns_):
        return prefix + "spec: Forbidden: only cpu and memory resources are mutable"
    pairs = list(zip(os_.get("containers", []), ns_.get("containers", []), strict=True))
    holders = [
        (f"spec.containers[{i}].resources", _rl(a.get("resources")), _rl(b.get("resources")))
        for i, (a, b) in enumerate(pairs)
    ]
    if "resources" in os_ or "resources" in ns_:
        holders.append(("spec.resources", _rl(os_.get("resources")), _rl(ns_.get("resources"))))
    for path, a, b in holders:
        try:
            for part in ("limits", "requests"):
                removed = set(_rl(a.get(part))) - set(_rl(b.get(part)))
                if removed & {"cpu", "memory"}:
                    return prefix + f"{path}.{part}: Forbidden: resource {part} cannot be removed"
            req, lim = container_qos_parts(b)
        except QuantityError as e:
            return prefix + f"{path}: Invalid value: {e}"
        for k in ("cpu", "memory"):
            if k in req and k in lim and req[k] > lim[k]:
                return prefix + (
                    f'{path}.requests: Invalid value: "{_rl(b.get("requests")).get(k)}": '
                    f"must be less than or equal to {k} limit of {_rl(b.get('limits')).get(k)}"
                )
    old_q, new_q = qos_class(os_), qos_class(ns_)
    if old_q != new_q:
        return prefix + (
            f'spec: Invalid value: "{new_q}": Pod QOS Class may not change as a result of resizing'
        )
    return None


def status_error(code: int, reason: str, message: str, name: str = "", kind: str = "Pod") -> JSON:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "details": {"name": name, "kind": kind},
        "code": code,
    }


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


# ----------------------------------------------------------------------------- node and cgroup


@dataclass(slots=True)
class NodeModel:
    """Node allocatable and what the *other* pods on it request (for Deferred/Infeasible)."""

    name: str = "gpu-node-a"
    allocatable_cpu_m: int = 15_800
    allocatable_memory: int = 60 * GiB
    others_cpu_m: int = 0
    others_memory: int = 0


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


# ----------------------------------------------------------------------------- the simulator


@dataclass(frozen=True, slots=True)
class _Want:
    """cpu/memory requests+limits of one container (or the pod level) in numbers."""

    cpu_req: int | None
    cpu_lim: int | None
    mem_req: int | None
    mem_lim: int | None

    @classmethod
    def of(cls, res: Any) -> _Want:
        """From a ResourceRequirements; a missing request defaults to the limit."""
        req, lim = container_qos_parts(_rl(res))
        return cls(req.get("cpu"), lim.get("cpu"), req.get("memory"), lim.get("memory"))


def _fmt_cpu(m: int) -> str:
    return str(m // 1000) if m % 1000 == 0 else f"{m}m"


def _fmt_mem(b: int) -> str:
    for suffix, shift in (("Gi", 30), ("Mi", 20), ("Ki", 10)):
        if b % (1 << shift) == 0 and b:
            return f"{b >> shift}{suffix}"
    return str(b)


class KubeSim:
    """API server + kubelet stand-in for one Pod. Use ``async with KubeSim(...) as sim``."""

    def __init__(
        self,
        pod: JSON,
        *,
        claims: Iterable[JSON] = (),
        slices: Iterable[JSON] = (),
        cgroup_dir: str | None = None,
        container: str | None = None,
        node: NodeModel | None = None,
        sync_interval: float = 0.05,
        actuation_delay: float = 0.0,
        claims_block_resize: bool = False,
        write_initial_cgroup: bool = True,
    ) -> None:
        self.pod: JSON = copy.deepcopy(pod)
        self.pod.setdefault("metadata", {}).setdefault("generation", 1)
        self.pod["metadata"].setdefault("resourceVersion", "1")
        self.claims = {c["metadata"]["name"]: copy.deepcopy(c) for c in claims}
        self.slices = [copy.deepcopy(s) for s in slices]
        self.events: list[JSON] = []
        self.node = node or NodeModel(name=self.pod.get("spec", {}).get("nodeName", "gpu-node-a"))
        self.cgroup = CgroupDir(cgroup_dir) if cgroup_dir else None
        containers = self.pod.get("spec", {}).get("containers", [])
        names = [c["name"] for c in containers]
        self.container = container or ("bridge" if "bridge" in names else (names or [""])[0])
        self.sync_interval = sync_interval
        self.actuation_delay = actuation_delay
        self.claims_block_resize = claims_block_resize
        self.requests_seen: list[tuple[str, str]] = []
        self.last_authorization: str | None = None
        self._rv = (
            int(self.pod["metadata"]["resourceVersion"])
            if str(self.pod["metadata"]["resourceVersion"]).isdigit()
            else 1
        )
        self._watchers: list[asyncio.Queue[JSON | None]] = []
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._allocated_at: float | None = None
        self._lock = asyncio.Lock()
        self._kick = asyncio.Event()
        self.port = 0
        # allocated limits are not in the API (kubelet checkpoint): keep them here
        self._alloc_limits: dict[str, _Want] = {}
        self._pod_alloc: JSON | None = copy.deepcopy(self.pod.get("spec", {}).get("resources"))
        for c in containers:
            self._alloc_limits[c["name"]] = self._actual_of(c["name"])
        if self.cgroup is not None and write_initial_cgroup:
            self._write_initial_cgroup()

    # ------------------------------------------------------------------ lifecycle

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        self._server = await asyncio.start_server(self._serve, host, port)
        self.port = self._server.sockets[0].getsockname()[1]
        self._spawn(self._kubelet_loop())
        return self.url

    async def stop(self) -> None:
        for q in self._watchers:
            q.put_nowait(None)
        if self._server is not None:
            self._server.close()
        pending = set(self._tasks)
        while pending:
            for t in pending:
                t.cancel()
            _, pending = await asyncio.wait(pending, timeout=0.5)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1)

    async def __aenter__(self) -> KubeSim:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def _spawn(self, coro: Any) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ------------------------------------------------------------------ state helpers

    def _container_spec(self, name: str) -> JSON:
        return next(c for c in self.pod["spec"]["containers"] if c["name"] == name)

    def _status(self, name: str) -> JSON:
        statuses = self.pod.setdefault("status", {}).setdefault("containerStatuses", [])
        st = next((s for s in statuses if s.get("name") == name), None)
        if st is None:
            st = {"name": name, "ready": True, "started": True, "restartCount": 0}
            statuses.append(st)
        return st

    def _actual_of(self, name: str) -> _Want:
        st = self._status(name)
        if "resources" in st:
            return _Want.of(st["resources"])
        return _Want.of(self._container_spec(name).get("resources"))

    def _pod_level(self, w: _Want, actual: bool = False) -> _Want:
        """A container without its own limit gets the pod-level limit in its cgroup (KEP-2837):
        the allocated one (spec) or, with ``actual``, the one in ``status.resources``."""
        pod_res = self.pod.get("spec", {}).get("resources")
        if actual and isinstance(self.pod.get("status", {}).get("resources"), dict):
            pod_res = self.pod["status"]["resources"]
        if not isinstance(pod_res, dict):
            return w
        p = _Want.of(pod_res)
        return _Want(
            w.cpu_req,
            w.cpu_lim if w.cpu_lim is not None else p.cpu_lim,
            w.mem_req,
            w.mem_lim if w.mem_lim is not None else p.mem_lim,
        )

    def _write_initial_cgroup(self) -> None:
        assert self.cgroup is not None
        w = self._pod_level(self._actual_of(self.container), actual=True)
        self.cgroup.write_memory_limit(w.mem_lim)
        self.cgroup.write_cpu(w.cpu_lim, w.cpu_req)
        usage_file = (
            "memory.current" if self.cgroup.version == "v2" else "memory/memory.usage_in_bytes"
        )
        if not os.path.exists(os.path.join(self.cgroup.root, usage_file)):
            self.cgroup.set_memory_usage(256 << 20)

    def _touch(self) -> None:
        self._rv += 1
        self.pod["metadata"]["resourceVersion"] = str(self._rv)
        event = {"type": "MODIFIED", "object": copy.deepcopy(self.pod)}
        for q in self._watchers:
            q.put_nowait(event)

    def _set_condition(self, ctype: str, reason: str = "", message: str = "") -> None:
        conds = self.pod.setdefault("status", {}).setdefault("conditions", [])
        existing = next((c for c in conds if c.get("type") == ctype), None)
        gen = self.pod["metadata"]["generation"]
        if existing is None:
            cond: JSON = {
                "type": ctype,
                "status": "True",
                "lastProbeTime": None,
                "lastTransitionTime": now_iso(),
                "observedGeneration": gen,
            }
            conds.append(cond)
            existing = cond
        elif ctype == "PodResizePending":
            existing["observedGeneration"] = gen
        for k, v in (("reason", reason), ("message", message)):
            if v:
                existing[k] = v
            else:
                existing.pop(k, None)

    def _clear_condition(self, ctype: str) -> None:
        conds = self.pod.get("status", {}).get("conditions", [])
        self.pod["status"]["conditions"] = [c for c in conds if c.get("type") != ctype]

    def condition(self, ctype: str) -> JSON | None:
        """Test helper: the condition of that type, if present."""
        conds = self.pod.get("status", {}).get("conditions", [])
        return next((c for c in conds if c.get("type") == ctype), None)

    # ------------------------------------------------------------------ control (tests, demo)

    def set_node_others(self, cpu_m: int | None = None, memory: int | None = None) -> None:
        """Change what the other pods request (frees or takes room; Deferred is re-evaluated)."""
        if cpu_m is not None:
            self.node.others_cpu_m = cpu_m
        if memory is not None:
            self.node.others_memory = memory
        self._kick.set()

    def set_device_health(self, resource_id: str, health: str, message: str = "") -> None:
        """Model the kubelet's device-health update (KEP-4680): set ``health`` (Healthy,
        Unhealthy, Unknown) of ``<driver>/<pool>/<device>`` in every container's
        ``allocatedResourcesStatus`` that lists it, and notify watchers."""
        changed = False
        for st in self.pod.get("status", {}).get("containerStatuses", []):
            for entry in st.get("allocatedResourcesStatus", []):
                for res in entry.get("resources", []):
                    if res.get("resourceID") == resource_id:
                        res["health"] = health
                        if message:
                            res["message"] = message
                        else:
                            res.pop("message", None)
                        changed = True
        if not changed:
            raise KeyError(resource_id)
        self._touch()

    @property
    def open_watches(self) -> int:
        """Watch streams currently being served."""
        return len(self._watchers)

    def end_watches(self) -> None:
        """End every open watch stream, as an API server restart or watch timeout does."""
        for q in self._watchers:
            q.put_nowait(None)

    def kick(self) -> None:
        """Run a kubelet sync now."""
        self._kick.set()

    # ------------------------------------------------------------------ resize (API side)

    def apply_resize_patch(self, body: Any, content_type: str) -> tuple[int, JSON]:
        if not isinstance(body, dict):
            return 400, status_error(400, "BadRequest", "patch body must be a JSON object")
        if "strategic-merge-patch" in content_type:
            try:
                new = strategic_merge(self.pod, body)
            except ValueError as e:
                return 400, status_error(400, "BadRequest", str(e))
        elif "merge-patch" in content_type:
            new = json_merge(self.pod, body)
        else:
            return 415, status_error(
                415,
                "UnsupportedMediaType",
                f"the body of the request was in an unknown format: {content_type}",
            )
        name = self.pod["metadata"]["name"]
        if new.get("metadata") != self.pod.get("metadata") or new.get("status") != self.pod.get(
            "status"
        ):
            new["metadata"], new["status"] = self.pod["metadata"], self.pod.get("status", {})
        error = validate_resize(self.pod, new, claims_block_resize=self.claims_block_resize)
        if error is not None:
            body_ = status_error(422, "Invalid", error, name)
            field, _, detail = error.split(" is invalid: ", 1)[-1].partition(": ")
            reason = (
                "FieldValueForbidden" if detail.startswith("Forbidden") else "FieldValueInvalid"
            )
            body_["details"]["causes"] = [{"reason": reason, "message": detail, "field": field}]
            return 422, body_
        if new["spec"] != self.pod["spec"]:
            self.pod["spec"] = new["spec"]
            self.pod["metadata"]["generation"] += 1
            self._touch()
            self._kick.set()
        return 200, copy.deepcopy(self.pod)

    # ------------------------------------------------------------------ kubelet

    async def _kubelet_loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.sync_interval):
                    await self._kick.wait()
            self._kick.clear()
            async with self._lock:
                self.sync()

    def _requests_total(self, spec: JSON) -> tuple[int, int]:
        if isinstance(spec.get("resources"), dict) and spec["resources"]:
            w = _Want.of(spec["resources"])
            return w.cpu_req or 0, w.mem_req or 0
        cpu = mem = 0
        for c in spec.get("containers", []):
            w = _Want.of(c.get("resources"))
            cpu += w.cpu_req or 0
            mem += w.mem_req or 0
        return cpu, mem

    def _allocated_total(self) -> tuple[int, int]:
        cpu = mem = 0
        for c in self.pod["spec"]["containers"]:
            alloc = self._status(c["name"]).get("allocatedResources", {})
            w = _Want.of({"requests": alloc}) if alloc else self._alloc_limits[c["name"]]
            cpu += w.cpu_req or 0
            mem += w.mem_req or 0
        pod_alloc = self.pod.get("status", {}).get("allocatedResources")
        if isinstance(pod_alloc, dict) and pod_alloc:
            w = _Want.of({"requests": pod_alloc})
            return w.cpu_req or 0, w.mem_req or 0
        return cpu, mem

    def sync(self) -> None:
        """One kubelet sync: admit (allocate) a pending resize, then actuate what is allocated."""
        changed = False
        status = self.pod.setdefault("status", {})
        gen = self.pod["metadata"]["generation"]
        if status.get("observedGeneration") != gen:
            status["observedGeneration"] = gen
            changed = True
        spec = self.pod["spec"]
        desired = {c["name"]: _Want.of(c.get("resources")) for c in spec["containers"]}
        if (
            any(desired[n] != self._alloc_limits.get(n) for n in desired)
            or self._pod_alloc_differs()
        ):
            changed |= self._admit(desired)
        changed |= self._actuate()
        if changed:
            self._touch()

    def _pod_alloc_differs(self) -> bool:
        pod_res = self.pod["spec"].get("resources")
        if not isinstance(pod_res, dict):
            return False
        return bool(self._pod_alloc != pod_res)

    def _admit(self, desired: dict[str, _Want]) -> bool:
        new_cpu, new_mem = self._requests_total(self.pod["spec"])
        node = self.node
        pending = self.condition("PodResizePending")
        if new_cpu > node.allocatable_cpu_m or new_mem > node.allocatable_memory:
            res, req, cap = (
                ("cpu", new_cpu, node.allocatable_cpu_m)
                if new_cpu > node.allocatable_cpu_m
                else ("memory", new_mem, node.allocatable_memory)
            )
            msg = f"Node didn't have enough capacity: {res}, requested: {req}, capacity: {cap}"
            before = copy.deepcopy(pending)
            self._set_condition("PodResizePending", "Infeasible", msg)
            return before != self.condition("PodResizePending")
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
            before = copy.deepcopy(pending)
            self._set_condition("PodResizePending", "Deferred", msg)
            return before != self.condition("PodResizePending")
        # admitted: allocate
        self._clear_condition("PodResizePending")
        for c in self.pod["spec"]["containers"]:
            w = desired[c["name"]]
            alloc: JSON = {}
            if w.cpu_req is not None:
                alloc["cpu"] = _fmt_cpu(w.cpu_req)
            if w.mem_req is not None:
                alloc["memory"] = _fmt_mem(w.mem_req)
            self._status(c["name"])["allocatedResources"] = alloc
            self._alloc_limits[c["name"]] = w
        pod_res = self.pod["spec"].get("resources")
        if isinstance(pod_res, dict):
            self.pod["status"]["allocatedResources"] = copy.deepcopy(_rl(pod_res.get("requests")))
            self._pod_alloc = copy.deepcopy(pod_res)
        self._set_condition("PodResizeInProgress")
        self._allocated_at = asyncio.get_running_loop().time()
        return True

    def _actuate(self) -> bool:
        """Write what is allocated but not actual: memory first, then cpu; decreases of memory
        below usage are refused (Error) and retried; cpu increases wait for memory."""
        if self.condition("PodResizeInProgress") is None:
            return False
        loop_time = asyncio.get_running_loop().time()
        if self._allocated_at is not None and loop_time - self._allocated_at < self.actuation_delay:
            return False
        errors: list[str] = []
        changed = False
        for c in self.pod["spec"]["containers"]:
            name = c["name"]
            want, have = self._alloc_limits[name], self._actual_of(name)
            st = self._status(name)
            res = copy.deepcopy(st.get("resources") or c.get("resources") or {})
            res.pop("claims", None)
            mem_ok = True
            if (want.mem_lim, want.mem_req) != (have.mem_lim, have.mem_req):
                eff = self._pod_level(want)
                usage = self.cgroup.memory_usage() if self.cgroup and name == self.container else 0
                lowering = want.mem_lim is not None and (
                    have.mem_lim is None or want.mem_lim < have.mem_lim
                )
                if lowering and eff.mem_lim is not None and usage >= eff.mem_lim:
                    errors.append(
                        f'attempting to set container "{name}" memory limit ({eff.mem_lim}) '
                        f"below current usage ({usage})"
                    )
                    mem_ok = False
                else:
                    if self.cgroup is not None and name == self.container:
                        self.cgroup.write_memory_limit(eff.mem_lim)
                    _set_rl(res, "memory", want.mem_req, want.mem_lim, _fmt_mem)
                    changed = True
            if (want.cpu_lim, want.cpu_req) != (have.cpu_lim, have.cpu_req):
                increase = (want.cpu_lim or 0) > (have.cpu_lim or 0) or (want.cpu_req or 0) > (
                    have.cpu_req or 0
                )
                if mem_ok or not increase:
                    eff = self._pod_level(want)
                    if self.cgroup is not None and name == self.container:
                        self.cgroup.write_cpu(eff.cpu_lim, eff.cpu_req)
                    _set_rl(res, "cpu", want.cpu_req, want.cpu_lim, _fmt_cpu)
                    changed = True
            if changed:
                st["resources"] = res
        pod_res = self.pod["spec"].get("resources")
        if (
            isinstance(pod_res, dict)
            and not errors
            and self.pod["status"].get("resources") != pod_res
        ):
            # pod-level resize (KEP-5419): a container without its own limit inherits it
            eff = self._pod_level(self._alloc_limits[self.container])
            usage = self.cgroup.memory_usage() if self.cgroup is not None else 0
            old = _Want.of(self.pod["status"].get("resources"))
            new = _Want.of(pod_res)
            lowering = new.mem_lim is not None and (
                old.mem_lim is None or new.mem_lim < old.mem_lim
            )
            if lowering and new.mem_lim is not None and usage >= new.mem_lim:
                errors.append(
                    f"attempting to set pod memory limit ({new.mem_lim}) "
                    f"below current usage ({usage})"
                )
            else:
                if self.cgroup is not None:
                    self.cgroup.write_memory_limit(eff.mem_lim)
                    self.cgroup.write_cpu(eff.cpu_lim, eff.cpu_req)
                self.pod["status"]["resources"] = copy.deepcopy(pod_res)
                changed = True
        if errors:
            cond = self.condition("PodResizeInProgress")
            msg = "; ".join(errors)
            if cond is None or cond.get("reason") != "Error" or cond.get("message") != msg:
                self._set_condition("PodResizeInProgress", "Error", msg)
                changed = True
        else:
            self._clear_condition("PodResizeInProgress")
            self._allocated_at = None
            changed = True
        return changed

    # ------------------------------------------------------------------ HTTP

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                line = await reader.readline()
                if not line:
                    return
                parts = line.decode("latin-1").strip().split(" ")
                if len(parts) != 3:
                    await self._send(
                        writer, 400, status_error(400, "BadRequest", "bad request line")
                    )
                    return
                method, target, _ = parts
                headers: dict[str, str] = {}
                while True:
                    h = await reader.readline()
                    if h in (b"\r\n", b"\n", b""):
                        break
                    k, _, v = h.decode("latin-1").partition(":")
                    headers[k.strip().lower()] = v.strip()
                body = b""
                if "content-length" in headers:
                    body = await reader.readexactly(int(headers["content-length"]))
                elif "chunked" in headers.get("transfer-encoding", ""):
                    body = await _read_chunked(reader)
                url = urllib.parse.urlsplit(target)
                query = dict(urllib.parse.parse_qsl(url.query))
                self.requests_seen.append((method, target))
                self.last_authorization = headers.get("authorization")
                if method == "GET" and query.get("watch") in ("true", "1"):
                    await self._watch(writer, url.path, query)
                    return
                code, obj = await self._route(method, url.path, query, headers, body)
                await self._send(writer, code, obj)
                if headers.get("connection", "").lower() == "close":
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            writer.close()

    @staticmethod
    async def _send(writer: asyncio.StreamWriter, code: int, obj: JSON) -> None:
        payload = json.dumps(obj).encode()
        reason = http.HTTPStatus(code).phrase
        head = (
            f"HTTP/1.1 {code} {reason}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\nCache-Control: no-cache, private\r\n\r\n"
        )
        writer.write(head.encode() + payload)
        await writer.drain()

    async def _route(
        self, method: str, path: str, query: dict[str, str], headers: dict[str, str], body: bytes
    ) -> tuple[int, JSON]:
        seg = [urllib.parse.unquote(s) for s in path.strip("/").split("/")] if path != "/" else []
        ns, name = self.pod["metadata"].get("namespace", "default"), self.pod["metadata"]["name"]
        if method == "GET" and seg in (["version"],):
            return 200, _VERSION
        if method == "GET" and seg == ["api"]:
            return 200, {
                "kind": "APIVersions",
                "versions": ["v1"],
                "serverAddressByClientCIDRs": [
                    {"clientCIDR": "0.0.0.0/0", "serverAddress": f"127.0.0.1:{self.port}"}
                ],
            }
        if method == "GET" and seg == ["apis"]:
            return 200, _API_GROUPS
        if method == "GET" and seg == ["api", "v1"]:
            return 200, _CORE_RESOURCES
        if method == "GET" and seg == ["apis", "resource.k8s.io", "v1"]:
            return 200, _RESOURCE_RESOURCES
        # /api/v1/namespaces/{ns}/pods[/{name}[/resize]]
        if seg[:3] == ["api", "v1", "namespaces"] and len(seg) >= 5 and seg[4] == "pods":
            if seg[3] != ns:
                return self._not_found("pods", seg[5] if len(seg) > 5 else "")
            if len(seg) == 5 and method == "GET":
                return 200, {
                    "kind": "PodList",
                    "apiVersion": "v1",
                    "metadata": {"resourceVersion": str(self._rv)},
                    "items": [copy.deepcopy(self.pod)] if _selects(query, self.pod) else [],
                }
            if len(seg) >= 6 and seg[5] != name:
                return self._not_found("pods", seg[5])
            if len(seg) == 6 and method == "GET":
                return 200, copy.deepcopy(self.pod)
            if len(seg) == 7 and seg[6] == "resize":
                if method == "GET":
                    return 200, copy.deepcopy(self.pod)
                if method == "PATCH":
                    try:
                        patch = json.loads(body or b"null")
                    except ValueError as e:
                        return 400, status_error(400, "BadRequest", f"invalid JSON: {e}")
                    async with self._lock:
                        return self.apply_resize_patch(patch, headers.get("content-type", ""))
            return 405, status_error(405, "MethodNotAllowed", f"{method} not supported on {path}")
        if seg[:3] == ["api", "v1", "namespaces"] and len(seg) == 5 and seg[4] == "events":
            if method == "GET":
                items = [e for e in self.events if e["metadata"].get("namespace") == seg[3]]
                return 200, {
                    "kind": "EventList",
                    "apiVersion": "v1",
                    "metadata": {},
                    "items": items,
                }
            if method == "POST":
                return self._create_event(seg[3], body)
        if seg[:3] == ["apis", "resource.k8s.io", "v1"]:
            if (
                len(seg) == 7
                and seg[3] == "namespaces"
                and seg[5] == "resourceclaims"
                and method == "GET"
            ):
                claim = self.claims.get(seg[6])
                if claim is None or claim["metadata"].get("namespace") != seg[4]:
                    return self._not_found("resourceclaims", seg[6], "resource.k8s.io")
                return 200, copy.deepcopy(claim)
            if len(seg) == 4 and seg[3] == "resourceslices" and method == "GET":
                items = [s for s in self.slices if _slice_selected(query, s)]
                return 200, {
                    "kind": "ResourceSliceList",
                    "apiVersion": "resource.k8s.io/v1",
                    "metadata": {"resourceVersion": str(self._rv)},
                    "items": items,
                }
        return 404, status_error(
            404, "NotFound", "the server could not find the requested resource"
        )

    def _not_found(self, resource: str, name: str, group: str = "") -> tuple[int, JSON]:
        res = f"{resource}.{group}" if group else resource
        return 404, status_error(404, "NotFound", f'{res} "{name}" not found', name, resource)

    def _create_event(self, namespace: str, body: bytes) -> tuple[int, JSON]:
        try:
            event = json.loads(body)
        except ValueError as e:
            return 400, status_error(400, "BadRequest", f"invalid JSON: {e}")
        if not isinstance(event, dict) or event.get("kind", "Event") != "Event":
            return 400, status_error(400, "BadRequest", "body is not an Event")
        meta = event.setdefault("metadata", {})
        if not meta.get("name"):
            if not meta.get("generateName"):
                return 422, status_error(
                    422, "Invalid", "Event is invalid: metadata.name: Required value"
                )
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        if meta.setdefault("namespace", namespace) != namespace:
            return 400, status_error(
                400, "BadRequest", "the namespace of the object does not match"
            )
        if not event.get("involvedObject"):
            return 422, status_error(
                422, "Invalid", "Event is invalid: involvedObject: Required value"
            )
        if any(e["metadata"]["name"] == meta["name"] for e in self.events):
            return 409, status_error(
                409, "AlreadyExists", f'events "{meta["name"]}" already exists'
            )
        self._rv += 1
        meta.update(
            uid=str(uuid.uuid4()), resourceVersion=str(self._rv), creationTimestamp=now_iso()
        )
        self.events.append(event)
        return 201, copy.deepcopy(event)

    async def _watch(self, writer: asyncio.StreamWriter, path: str, query: dict[str, str]) -> None:
        seg = path.strip("/").split("/")
        ns = self.pod["metadata"].get("namespace", "default")
        if (
            seg[:3] != ["api", "v1", "namespaces"]
            or len(seg) != 5
            or seg[4] != "pods"
            or seg[3] != ns
        ):
            await self._send(writer, 404, status_error(404, "NotFound", "watch not supported here"))
            return
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\nCache-Control: no-cache, private\r\n\r\n"
        )
        queue: asyncio.Queue[JSON | None] = asyncio.Queue()
        selected = _selects(query, self.pod)
        rv = query.get("resourceVersion")
        if selected and rv != self.pod["metadata"]["resourceVersion"]:
            queue.put_nowait(
                {"type": "ADDED" if not rv else "MODIFIED", "object": copy.deepcopy(self.pod)}
            )
        self._watchers.append(queue)
        timeout = float(query.get("timeoutSeconds", "1800"))
        deadline = asyncio.get_running_loop().time() + timeout
        try:
            while True:
                remaining = deadline - asyncio.get_running_loop().time()
                if remaining <= 0:
                    break
                try:
                    async with asyncio.timeout(remaining):
                        event = await queue.get()
                except TimeoutError:
                    break
                if event is None:
                    break
                if not _selects(query, event["object"]):
                    continue
                line = json.dumps(event).encode() + b"\n"
                writer.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
                await writer.drain()
            writer.write(b"0\r\n\r\n")
            await writer.drain()
        except ConnectionError:
            pass
        finally:
            self._watchers.remove(queue)


def _set_rl(res: JSON, key: str, req: int | None, lim: int | None, fmt: Any) -> None:
    for part, value in (("requests", req), ("limits", lim)):
        rl = res.setdefault(part, {})
        if value is None:
            rl.pop(key, None)
        else:
            rl[key] = fmt(value)


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    out = b""
    while True:
        size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
        if size == 0:
            await reader.readline()
            return out
        out += await reader.readexactly(size)
        await reader.readexactly(2)


def _selects(query: dict[str, str], obj: JSON) -> bool:
    sel = query.get("fieldSelector", "")
    for term in filter(None, sel.split(",")):
        key, _, value = term.partition("=")
        value = value.lstrip("=")
        if key == "metadata.name" and obj.get("metadata", {}).get("name") != value:
            return False
        if key == "metadata.namespace" and obj.get("metadata", {}).get("namespace") != value:
            return False
    return True


def _slice_selected(query: dict[str, str], obj: JSON) -> bool:
    spec = obj.get("spec", {})
    for term in filter(None, query.get("fieldSelector", "").split(",")):
        key, _, value = term.partition("=")
        value = value.lstrip("=")
        if key == "spec.nodeName" and spec.get("nodeName") != value:
            return False
        if key == "spec.driver" and spec.get("driver") != value:
            return False
    return True


_VERSION: JSON = {
    "major": "1",
    "minor": "35",
    "gitVersion": "v1.35.0-kubesim",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2026-01-01T00:00:00Z",
    "goVersion": "go1.25.0",
    "compiler": "gc",
    "platform": "linux/amd64",
}
_API_GROUPS: JSON = {
    "kind": "APIGroupList",
    "apiVersion": "v1",
    "groups": [
        {
            "name": "resource.k8s.io",
            "versions": [{"groupVersion": "resource.k8s.io/v1", "version": "v1"}],
            "preferredVersion": {"groupVersion": "resource.k8s.io/v1", "version": "v1"},
        }
    ],
}


def _res(
    name: str, kind: str, namespaced: bool, verbs: list[str], short: list[str] | None = None
) -> JSON:
    out: JSON = {
        "name": name,
        "singularName": "",
        "namespaced": namespaced,
        "kind": kind,
        "verbs": verbs,
    }
    if short:
        out["shortNames"] = short
    return out


_CORE_RESOURCES: JSON = {
    "kind": "APIResourceList",
    "groupVersion": "v1",
    "resources": [
        _res("pods", "Pod", True, ["get", "list", "watch"], ["po"]),
        _res("pods/resize", "Pod", True, ["get", "patch"]),
        _res("events", "Event", True, ["create", "get", "list"], ["ev"]),
    ],
}
_RESOURCE_RESOURCES: JSON = {
    "kind": "APIResourceList",
    "groupVersion": "resource.k8s.io/v1",
    "resources": [
        _res("resourceclaims", "ResourceClaim", True, ["get"]),
        _res("resourceslices", "ResourceSlice", False, ["list"]),
    ],
}


# ----------------------------------------------------------------------------- CLI


def _load(path: str) -> JSON:
    with open(path, encoding="utf-8") as f:
        data: JSON = json.load(f)
    return data


async def _main(args: argparse.Namespace) -> None:
    sim = KubeSim(
        _load(args.pod),
        claims=[_load(p) for p in args.claim],
        slices=[_load(p) for p in args.slice],
        cgroup_dir=args.cgroup_dir,
        node=NodeModel(
            allocatable_cpu_m=to_millicores(args.node_cpu),
            allocatable_memory=to_bytes(args.node_memory),
            others_cpu_m=to_millicores(args.others_cpu),
            others_memory=to_bytes(args.others_memory),
        ),
        sync_interval=args.sync_interval,
        actuation_delay=args.actuation_delay,
        claims_block_resize=args.claims_block_resize,
    )
    await sim.start(args.host, args.port)
    print(f"kubesim serving {sim.url} (BRIDGE_KUBE_API={sim.url})", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await sim.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m loadgen.kubesim",
        description="Local Kubernetes API + kubelet stand-in for in-place pod resize (one Pod).",
    )
    p.add_argument(
        "--pod", required=True, help="Pod JSON (e.g. tests/fixtures/k8s/pod-running-initial.json)"
    )
    p.add_argument("--claim", action="append", default=[], help="ResourceClaim JSON (repeatable)")
    p.add_argument("--slice", action="append", default=[], help="ResourceSlice JSON (repeatable)")
    p.add_argument("--cgroup-dir", help="directory the kubelet simulator writes cgroup files into")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--node-cpu", default="15800m", help="node allocatable cpu")
    p.add_argument("--node-memory", default="60Gi", help="node allocatable memory")
    p.add_argument("--others-cpu", default="0", help="cpu requested by the other pods")
    p.add_argument("--others-memory", default="0", help="memory requested by the other pods")
    p.add_argument("--sync-interval", type=float, default=1.0, help="kubelet sync period, s")
    p.add_argument("--actuation-delay", type=float, default=1.0, help="allocate→cgroup write, s")
    p.add_argument(
        "--claims-block-resize",
        action="store_true",
        help="reject resizes of pods whose containers have resources.claims (≤1.35)",
    )
    args = p.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_main(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
