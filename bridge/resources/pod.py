"""The bridge's own Pod, its ResourceClaims and ResourceSlices, as plain values (pure; JSON in).

Why: in-place resize has four states per container (desired ``spec``, allocated
``status.containerStatuses[].allocatedResources``, actuated (kubelet-only) and actual
``status.containerStatuses[].resources``) plus two conditions, and the plan must read them without
caring how the JSON was fetched. Shapes follow the real API objects (see tests/fixtures/k8s/).

Parsing is tolerant: a missing field is ``None``; a malformed quantity becomes an entry of
``problems`` and the value is treated as absent, so one odd field never blinds the watcher.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from bridge.resources.quantity import QuantityError, to_bytes, to_millicores

JSON = Mapping[str, Any]
DEFAULT_CONTAINER = "bridge"


@dataclass(frozen=True, slots=True)
class Resources:
    """cpu in millicores, memory in bytes; ``None`` = not set."""

    cpu_request_m: int | None = None
    cpu_limit_m: int | None = None
    memory_request: int | None = None
    memory_limit: int | None = None

    def is_empty(self) -> bool:
        return self == Resources()


def _dict(obj: object) -> JSON:
    return obj if isinstance(obj, Mapping) else {}


def _list(obj: object) -> list[Any]:
    return obj if isinstance(obj, list) else []


def _resource_list(obj: object, where: str, problems: list[str]) -> tuple[int | None, int | None]:
    """A ResourceList ``{"cpu": q, "memory": q}`` → (millicores, bytes)."""
    rl = _dict(obj)
    cpu = mem = None
    if "cpu" in rl:
        try:
            cpu = to_millicores(rl["cpu"])
        except QuantityError as e:
            problems.append(f"{where}.cpu: {e}")
    if "memory" in rl:
        try:
            mem = to_bytes(rl["memory"])
        except QuantityError as e:
            problems.append(f"{where}.memory: {e}")
    return cpu, mem


def parse_requirements(obj: object, where: str, problems: list[str]) -> Resources:
    """A ResourceRequirements ``{"requests": {...}, "limits": {...}}``."""
    req_cpu, req_mem = _resource_list(_dict(obj).get("requests"), f"{where}.requests", problems)
    lim_cpu, lim_mem = _resource_list(_dict(obj).get("limits"), f"{where}.limits", problems)
    return Resources(req_cpu, lim_cpu, req_mem, lim_mem)


def parse_allocated(obj: object, where: str, problems: list[str]) -> Resources:
    """``allocatedResources`` is a ResourceList of requests only."""
    cpu, mem = _resource_list(obj, where, problems)
    return Resources(cpu_request_m=cpu, memory_request=mem)


@dataclass(frozen=True, slots=True)
class Condition:
    type: str
    status: str
    reason: str = ""
    message: str = ""
    observed_generation: int | None = None
    last_transition_time: str | None = None


@dataclass(frozen=True, slots=True)
class DeviceHealth:
    """One ``allocatedResourcesStatus[].resources[]`` entry (KEP-4680)."""

    claim: str  # pod claim name (``claim:gpu`` → ``gpu``; ``claim:gpu/req`` → ``gpu``)
    resource_id: str  # "<driver>/<pool>/<device>"
    health: str  # Healthy | Unhealthy | Unknown
    message: str = ""


@dataclass(frozen=True, slots=True)
class ContainerView:
    name: str
    desired: Resources
    allocated: Resources | None
    actual: Resources | None
    restart_count: int = 0
    health: tuple[DeviceHealth, ...] = ()


class ResizeState(enum.Enum):
    """The resize situation in one word, for gauges and logs."""

    NONE = "None"
    DEFERRED = "Deferred"
    INFEASIBLE = "Infeasible"
    IN_PROGRESS = "InProgress"
    ERROR = "Error"


@dataclass(frozen=True, slots=True)
class PodView:
    name: str
    namespace: str
    uid: str
    generation: int | None
    observed_generation: int | None
    resource_version: str | None
    qos_class: str | None
    node_name: str | None
    containers: tuple[ContainerView, ...]
    pod_desired: Resources | None = None
    pod_allocated: Resources | None = None
    pod_actual: Resources | None = None
    resize_pending: Condition | None = None
    resize_in_progress: Condition | None = None
    claim_statuses: tuple[tuple[str, str | None], ...] = ()  # (pod claim name, claim object name)
    problems: tuple[str, ...] = ()

    def container(self, name: str | None = None) -> ContainerView | None:
        """The named container; with ``name`` None the one called ``bridge`` (the chart's
        name for it) if there is one, else the first."""
        if name is None:
            named = next((c for c in self.containers if c.name == DEFAULT_CONTAINER), None)
            return named or (self.containers[0] if self.containers else None)
        return next((c for c in self.containers if c.name == name), None)

    @property
    def generation_observed(self) -> bool:
        """The kubelet has seen the latest spec (``status.observedGeneration >= generation``)."""
        if self.generation is None or self.observed_generation is None:
            return True
        return self.observed_generation >= self.generation

    def resize_state(self) -> ResizeState:
        """Pending wins over in-progress (both can be set); Error is an in-progress failure."""
        if self.resize_pending is not None:
            if self.resize_pending.reason == "Infeasible":
                return ResizeState.INFEASIBLE
            return ResizeState.DEFERRED
        if self.resize_in_progress is not None:
            if self.resize_in_progress.reason == "Error":
                return ResizeState.ERROR
            return ResizeState.IN_PROGRESS
        return ResizeState.NONE


def _condition(obj: JSON) -> Condition:
    og = obj.get("observedGeneration")
    return Condition(
        type=str(obj.get("type", "")),
        status=str(obj.get("status", "")),
        reason=str(obj.get("reason") or ""),
        message=str(obj.get("message") or ""),
        observed_generation=og if isinstance(og, int) else None,
        last_transition_time=obj.get("lastTransitionTime"),
    )


def _health(obj: object) -> tuple[DeviceHealth, ...]:
    out: list[DeviceHealth] = []
    for entry in _list(obj):
        name = str(_dict(entry).get("name", ""))
        claim = name.removeprefix("claim:").split("/", 1)[0] if name.startswith("claim:") else name
        for res in _list(_dict(entry).get("resources")):
            r = _dict(res)
            out.append(
                DeviceHealth(
                    claim=claim,
                    resource_id=str(r.get("resourceID", "")),
                    health=str(r.get("health") or "Unknown"),
                    message=str(r.get("message") or ""),
                )
            )
    return tuple(out)


def parse_pod(obj: JSON) -> PodView:
    """A core/v1 Pod (as returned by GET or inside a watch event) → :class:`PodView`."""
    problems: list[str] = []
    meta, spec, status = (
        _dict(obj.get("metadata")),
        _dict(obj.get("spec")),
        _dict(obj.get("status")),
    )
    statuses = {str(_dict(s).get("name")): _dict(s) for s in _list(status.get("containerStatuses"))}
    containers: list[ContainerView] = []
    for c in _list(spec.get("containers")):
        name = str(_dict(c).get("name", ""))
        where = f"spec.containers[{name}].resources"
        desired = parse_requirements(_dict(c).get("resources"), where, problems)
        st = statuses.get(name)
        allocated = actual = None
        health: tuple[DeviceHealth, ...] = ()
        restarts = 0
        if st is not None:
            swhere = f"status.containerStatuses[{name}]"
            if "allocatedResources" in st:
                allocated = parse_allocated(
                    st["allocatedResources"], f"{swhere}.allocatedResources", problems
                )
            if "resources" in st:
                actual = parse_requirements(st["resources"], f"{swhere}.resources", problems)
            health = _health(st.get("allocatedResourcesStatus"))
            rc = st.get("restartCount", 0)
            restarts = rc if isinstance(rc, int) else 0
        containers.append(ContainerView(name, desired, allocated, actual, restarts, health))
    pending = in_progress = None
    for cond in _list(status.get("conditions")):
        c = _condition(_dict(cond))
        if c.status != "True":
            continue
        if c.type == "PodResizePending":
            pending = c
        elif c.type == "PodResizeInProgress":
            in_progress = c
    pod_desired = pod_allocated = pod_actual = None
    if "resources" in spec:
        pod_desired = parse_requirements(spec["resources"], "spec.resources", problems)
    if "allocatedResources" in status:
        pod_allocated = parse_allocated(
            status["allocatedResources"], "status.allocatedResources", problems
        )
    if "resources" in status:
        pod_actual = parse_requirements(status["resources"], "status.resources", problems)
    claims = tuple(
        (str(_dict(s).get("name", "")), _dict(s).get("resourceClaimName"))
        for s in _list(status.get("resourceClaimStatuses"))
    )
    gen, ogen = meta.get("generation"), status.get("observedGeneration")
    return PodView(
        name=str(meta.get("name", "")),
        namespace=str(meta.get("namespace", "")),
        uid=str(meta.get("uid", "")),
        generation=gen if isinstance(gen, int) else None,
        observed_generation=ogen if isinstance(ogen, int) else None,
        resource_version=meta.get("resourceVersion"),
        qos_class=status.get("qosClass"),
        node_name=spec.get("nodeName"),
        containers=tuple(containers),
        pod_desired=pod_desired,
        pod_allocated=pod_allocated,
        pod_actual=pod_actual,
        resize_pending=pending,
        resize_in_progress=in_progress,
        claim_statuses=claims,
        problems=tuple(problems),
    )


@dataclass(frozen=True, slots=True)
class MemoryTarget:
    """A memory limit to plan for now, and why."""

    limit_bytes: int
    source: str


def pending_memory_decrease(pod: PodView, container: str | None = None) -> MemoryTarget | None:
    """Cooperative downscale: the desired memory limit when it is *below* the actual one.

    The kubelet refuses to lower a memory limit below current usage (PodResizeInProgress, reason
    Error) and retries later; planning for the smaller limit first lets its next check pass. An
    Infeasible resize will never be applied, so it does not shrink anything. Pod-level limits
    (KEP-5419) count the same way; the smaller target wins.
    """
    if pod.resize_state() is ResizeState.INFEASIBLE:
        return None
    targets: list[MemoryTarget] = []
    c = pod.container(container)
    if c is not None and c.actual is not None:
        want, have = c.desired.memory_limit, c.actual.memory_limit
        if want is not None and have is not None and want < have:
            src = f"pod spec.containers[{c.name}].resources.limits.memory (desired < actual {have})"
            targets.append(MemoryTarget(want, src))
    if pod.pod_desired is not None and pod.pod_actual is not None:
        want, have = pod.pod_desired.memory_limit, pod.pod_actual.memory_limit
        if want is not None and have is not None and want < have:
            targets.append(
                MemoryTarget(want, f"pod spec.resources.limits.memory (desired < actual {have})")
            )
    return min(targets, key=lambda t: t.limit_bytes) if targets else None


# ----------------------------------------------------------------------------------------- DRA


@dataclass(frozen=True, slots=True)
class DeviceRef:
    """One ``status.allocation.devices.results[]`` entry of a ResourceClaim."""

    request: str
    driver: str
    pool: str
    device: str

    @property
    def resource_id(self) -> str:
        """The id that ``allocatedResourcesStatus`` uses: ``<driver>/<pool>/<device>``."""
        return f"{self.driver}/{self.pool}/{self.device}"


@dataclass(frozen=True, slots=True)
class ClaimView:
    name: str
    namespace: str
    results: tuple[DeviceRef, ...]
    allocated: bool


def parse_claim(obj: JSON) -> ClaimView:
    """A resource.k8s.io/v1 ResourceClaim → its allocated devices."""
    meta, status = _dict(obj.get("metadata")), _dict(obj.get("status"))
    allocation = status.get("allocation")
    results = tuple(
        DeviceRef(
            request=str(_dict(r).get("request", "")),
            driver=str(_dict(r).get("driver", "")),
            pool=str(_dict(r).get("pool", "")),
            device=str(_dict(r).get("device", "")),
        )
        for r in _list(_dict(_dict(allocation).get("devices")).get("results"))
    )
    return ClaimView(
        name=str(meta.get("name", "")),
        namespace=str(meta.get("namespace", "")),
        results=results,
        allocated=allocation is not None,
    )


@dataclass(frozen=True, slots=True)
class SliceDevice:
    """A device published in a ResourceSlice: flattened attributes and capacity quantities."""

    driver: str
    pool: str
    name: str
    attributes: Mapping[str, object]
    capacity: Mapping[str, str]

    def attribute(self, name: str) -> object | None:
        """An attribute by short name; unqualified names belong to the driver's domain."""
        if name in self.attributes:
            return self.attributes[name]
        return self.attributes.get(f"{self.driver}/{name}")


def _attr_value(obj: object) -> object:
    """``{"string": "x"}``, ``{"int": 3}``, ``{"bool": true}``, ``{"version": "1.2"}`` → value."""
    d = _dict(obj)
    for key in ("string", "int", "bool", "version", "strings", "ints", "bools", "versions"):
        if key in d:
            return d[key]
    return None


def parse_slices(objs: Iterable[JSON]) -> dict[tuple[str, str, str], SliceDevice]:
    """ResourceSlices (objects or ``ResourceSliceList``) → devices keyed by (driver, pool, name)."""
    out: dict[tuple[str, str, str], SliceDevice] = {}
    for obj in objs:
        items = _list(obj.get("items")) if "items" in obj else [obj]
        for item in items:
            spec = _dict(_dict(item).get("spec"))
            driver = str(spec.get("driver", ""))
            pool = str(_dict(spec.get("pool")).get("name", ""))
            for dev in _list(spec.get("devices")):
                d = _dict(dev)
                name = str(d.get("name", ""))
                attrs = {k: _attr_value(v) for k, v in _dict(d.get("attributes")).items()}
                cap = {
                    k: str(_dict(v).get("value", "")) for k, v in _dict(d.get("capacity")).items()
                }
                out[(driver, pool, name)] = SliceDevice(driver, pool, name, attrs, cap)
    return out


@dataclass(frozen=True, slots=True)
class AllocatedDevice:
    """A device this pod holds, joined across Pod → ResourceClaim → ResourceSlice → health."""

    pod_claim: str
    claim: str
    ref: DeviceRef
    uuid: str | None = None
    product_name: str | None = None
    profile: str | None = None
    memory_bytes: int | None = None
    health: str = "Unknown"  # Healthy | Unhealthy | Unknown (Unknown also when not reported)
    health_message: str = ""
    source: str = ""


def resolve_devices(
    pod: PodView,
    claims: Mapping[str, ClaimView],
    slices: Mapping[tuple[str, str, str], SliceDevice],
    container: str | None = None,
) -> tuple[AllocatedDevice, ...]:
    """Join the pod's claim statuses with fetched claims and slices. Missing claims or slice
    entries leave the corresponding fields ``None``: the device is still listed."""
    c = pod.container(container)
    health = {h.resource_id: h for h in (c.health if c is not None else ())}
    out: list[AllocatedDevice] = []
    for pod_claim, claim_name in pod.claim_statuses:
        claim = claims.get(claim_name) if claim_name else None
        if claim is None:
            continue
        for ref in claim.results:
            dev = slices.get((ref.driver, ref.pool, ref.device))
            h = health.get(ref.resource_id)
            memory = None
            if dev is not None and "memory" in dev.capacity:
                try:
                    memory = to_bytes(dev.capacity["memory"])
                except QuantityError:
                    memory = None

            def s(name: str, dev: SliceDevice | None = dev) -> str | None:
                value = dev.attribute(name) if dev is not None else None
                return None if value is None else str(value)

            out.append(
                AllocatedDevice(
                    pod_claim=pod_claim,
                    claim=claim.name,
                    ref=ref,
                    uuid=s("uuid"),
                    product_name=s("productName"),
                    profile=s("profile"),
                    memory_bytes=memory,
                    health=h.health if h is not None else "Unknown",
                    health_message=h.message if h is not None else "",
                    source=(
                        f"ResourceClaim {claim.namespace}/{claim.name} → ResourceSlice device "
                        f"{ref.resource_id}" + ("" if dev is not None else " (not found in slices)")
                    ),
                )
            )
    return tuple(out)
