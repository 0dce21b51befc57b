"""kubesim's object model: the Pod (with its claims, slices and events) as the API server stores
it, and the API server's validation of a resize.

Why apart: this is the part that decides what a client sees (422 messages, generations, conditions),
and it needs no sockets, files or event loop, so it is tested and reasoned about on its own. The
kubelet (:mod:`loadgen.kubesim.kubelet`) and the HTTP front (:mod:`loadgen.kubesim.server`) change
the Pod only through :class:`PodStore`; every change goes through :meth:`PodStore.touch`, which
bumps ``resourceVersion`` and hands the MODIFIED event to each listener (the watch streams).
"""

from __future__ import annotations

import copy
import datetime as _dt
import json
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from bridge.resources.quantity import QuantityError, to_bytes, to_millicores

JSON = dict[str, Any]
GiB = 1 << 30


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


@dataclass(frozen=True, slots=True)
class Want:
    """cpu/memory requests+limits of one container (or the pod level) in numbers."""

    cpu_req: int | None
    cpu_lim: int | None
    mem_req: int | None
    mem_lim: int | None

    @classmethod
    def of(cls, res: Any) -> Want:
        """From a ResourceRequirements; a missing request defaults to the limit."""
        req, lim = container_qos_parts(_rl(res))
        return cls(req.get("cpu"), lim.get("cpu"), req.get("memory"), lim.get("memory"))


def fmt_cpu(m: int) -> str:
    return str(m // 1000) if m % 1000 == 0 else f"{m}m"


def fmt_mem(b: int) -> str:
    for suffix, shift in (("Gi", 30), ("Mi", 20), ("Ki", 10)):
        if b % (1 << shift) == 0 and b:
            return f"{b >> shift}{suffix}"
    return str(b)


def set_rl(
    res: JSON, key: str, req: int | None, lim: int | None, fmt: Callable[[int], str]
) -> None:
    """Set (or drop, when ``None``) ``key`` in ``res``'s requests and limits."""
    for part, value in (("requests", req), ("limits", lim)):
        rl = res.setdefault(part, {})
        if value is None:
            rl.pop(key, None)
        else:
            rl[key] = fmt(value)


@dataclass(slots=True)
class NodeModel:
    """Node allocatable and what the *other* pods on it request (for Deferred/Infeasible)."""

    name: str = "gpu-node-a"
    allocatable_cpu_m: int = 15_800
    allocatable_memory: int = 60 * GiB
    others_cpu_m: int = 0
    others_memory: int = 0


class PodStore:
    """One Pod, its ResourceClaims, the ResourceSlices and Events, as the API server keeps them."""

    def __init__(
        self,
        pod: JSON,
        *,
        claims: Iterable[JSON] = (),
        slices: Iterable[JSON] = (),
        claims_block_resize: bool = False,
    ) -> None:
        self.pod: JSON = copy.deepcopy(pod)
        self.pod.setdefault("metadata", {}).setdefault("generation", 1)
        self.pod["metadata"].setdefault("resourceVersion", "1")
        self.claims = {c["metadata"]["name"]: copy.deepcopy(c) for c in claims}
        self.slices = [copy.deepcopy(s) for s in slices]
        self.events: list[JSON] = []
        self.claims_block_resize = claims_block_resize
        rv = str(self.pod["metadata"]["resourceVersion"])
        self.rv = int(rv) if rv.isdigit() else 1
        self.listeners: list[Callable[[JSON], None]] = []
        #: called after an accepted resize changed the spec (the kubelet's kick)
        self.on_resize: Callable[[], None] = lambda: None

    @property
    def name(self) -> str:
        name: str = self.pod["metadata"]["name"]
        return name

    @property
    def namespace(self) -> str:
        ns: str = self.pod["metadata"].get("namespace", "default")
        return ns

    @property
    def container_names(self) -> list[str]:
        return [c["name"] for c in self.pod.get("spec", {}).get("containers", [])]

    def container_spec(self, name: str) -> JSON:
        spec: JSON = next(c for c in self.pod["spec"]["containers"] if c["name"] == name)
        return spec

    def status(self, name: str) -> JSON:
        """The container's status entry (created as running when missing)."""
        statuses = self.pod.setdefault("status", {}).setdefault("containerStatuses", [])
        st: JSON | None = next((s for s in statuses if s.get("name") == name), None)
        if st is None:
            st = {"name": name, "ready": True, "started": True, "restartCount": 0}
            statuses.append(st)
        return st

    def actual_of(self, name: str) -> Want:
        """What the container runs with: ``status.resources``, else its spec."""
        st = self.status(name)
        if "resources" in st:
            return Want.of(st["resources"])
        return Want.of(self.container_spec(name).get("resources"))

    def pod_level(self, w: Want, actual: bool = False) -> Want:
        """A container without its own limit gets the pod-level limit in its cgroup (KEP-2837):
        the allocated one (spec) or, with ``actual``, the one in ``status.resources``."""
        pod_res = self.pod.get("spec", {}).get("resources")
        if actual and isinstance(self.pod.get("status", {}).get("resources"), dict):
            pod_res = self.pod["status"]["resources"]
        if not isinstance(pod_res, dict):
            return w
        p = Want.of(pod_res)
        return Want(
            w.cpu_req,
            w.cpu_lim if w.cpu_lim is not None else p.cpu_lim,
            w.mem_req,
            w.mem_lim if w.mem_lim is not None else p.mem_lim,
        )

    def touch(self) -> None:
        """Record a change: new resourceVersion, MODIFIED to every listener."""
        self.rv += 1
        self.pod["metadata"]["resourceVersion"] = str(self.rv)
        event = {"type": "MODIFIED", "object": copy.deepcopy(self.pod)}
        for listener in self.listeners:
            listener(event)

    def set_condition(self, ctype: str, reason: str = "", message: str = "") -> None:
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

    def clear_condition(self, ctype: str) -> None:
        conds = self.pod.get("status", {}).get("conditions", [])
        self.pod["status"]["conditions"] = [c for c in conds if c.get("type") != ctype]

    def condition(self, ctype: str) -> JSON | None:
        """The condition of that type, if present."""
        conds = self.pod.get("status", {}).get("conditions", [])
        found: JSON | None = next((c for c in conds if c.get("type") == ctype), None)
        return found

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
        self.touch()

    def apply_resize_patch(self, body: Any, content_type: str) -> tuple[int, JSON]:
        """``PATCH pods/{name}/resize``: merge, validate, then accept (new generation) or answer
        with the API server's Status."""
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
        if new.get("metadata") != self.pod.get("metadata") or new.get("status") != self.pod.get(
            "status"
        ):
            new["metadata"], new["status"] = self.pod["metadata"], self.pod.get("status", {})
        error = validate_resize(self.pod, new, claims_block_resize=self.claims_block_resize)
        if error is not None:
            body_ = status_error(422, "Invalid", error, self.name)
            field, _, detail = error.split(" is invalid: ", 1)[-1].partition(": ")
            reason = (
                "FieldValueForbidden" if detail.startswith("Forbidden") else "FieldValueInvalid"
            )
            body_["details"]["causes"] = [{"reason": reason, "message": detail, "field": field}]
            return 422, body_
        if new["spec"] != self.pod["spec"]:
            self.pod["spec"] = new["spec"]
            self.pod["metadata"]["generation"] += 1
            self.touch()
            self.on_resize()
        return 200, copy.deepcopy(self.pod)

    def create_event(self, namespace: str, body: bytes) -> tuple[int, JSON]:
        """``POST events``: the checks the API server makes on the fields the bridge sends."""
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
        self.rv += 1
        meta.update(
            uid=str(uuid.uuid4()), resourceVersion=str(self.rv), creationTimestamp=now_iso()
        )
        self.events.append(event)
        return 201, copy.deepcopy(event)
