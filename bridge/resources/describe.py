"""What the bridge sees and where each value came from, as a JSON-able dict and as text.

Shared by ``Adapter.describe()`` (served at ``/debug/resources``) and ``simbridge resources``.
Each leaf that was observed is ``{"value": ..., "source": ...}``; unlimited values are ``"max"``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

from bridge.resources.plan import Plan
from bridge.resources.pod import PodView, Resources
from bridge.resources.quantity import format_bytes
from bridge.resources.snapshot import GpuReading, Snapshot, Sourced

T = TypeVar("T")


def _sv(s: Sourced[T] | None, fmt: Callable[[T], Any] = lambda v: v) -> dict[str, Any] | None:
    return None if s is None else {"value": fmt(s.value), "source": s.source}


def _bytes(v: int | None) -> Any:
    return "max" if v is None else v


def _res(r: Resources | None) -> dict[str, Any] | None:
    return None if r is None else {k: v for k, v in dataclasses.asdict(r).items() if v is not None}


def describe_pod(pod: PodView) -> dict[str, Any]:
    def cond(c: Any) -> dict[str, Any] | None:
        return None if c is None else dataclasses.asdict(c)

    return {
        "source": f"GET /api/v1/namespaces/{pod.namespace}/pods/{pod.name}",
        "name": pod.name,
        "namespace": pod.namespace,
        "node": pod.node_name,
        "qosClass": pod.qos_class,
        "generation": pod.generation,
        "observedGeneration": pod.observed_generation,
        "resize": pod.resize_state().value,
        "PodResizePending": cond(pod.resize_pending),
        "PodResizeInProgress": cond(pod.resize_in_progress),
        "containers": {
            c.name: {
                "desired (spec.containers[].resources)": _res(c.desired),
                "allocated (status.containerStatuses[].allocatedResources)": _res(c.allocated),
                "actual (status.containerStatuses[].resources)": _res(c.actual),
                "restartCount": c.restart_count,
            }
            for c in pod.containers
        },
        "pod-level": {
            "desired (spec.resources)": _res(pod.pod_desired),
            "allocated (status.allocatedResources)": _res(pod.pod_allocated),
            "actual (status.resources)": _res(pod.pod_actual),
        },
        "problems": list(pod.problems),
    }


def describe_gpu(gpu: GpuReading | None) -> dict[str, Any] | None:
    if gpu is None:
        return None
    return {
        "source": gpu.source,
        "available": gpu.available,
        "devices": [dataclasses.asdict(d) for d in gpu.devices],
        "problems": list(gpu.problems),
    }


def describe_snapshot(snap: Snapshot) -> dict[str, Any]:
    cg = snap.cgroup
    return {
        "cgroup": {
            "version": cg.version,
            "location": cg.location,
            "cpu.max": _sv(
                cg.cpu_max,
                lambda v: {
                    "quota_us": v.quota_us or "max",
                    "period_us": v.period_us,
                    "cores": v.cores,
                },
            ),
            "cpu.weight": _sv(cg.cpu_weight),
            "memory.max": _sv(cg.memory_max, _bytes),
            "memory.high": _sv(cg.memory_high, _bytes),
            "memory.current": _sv(cg.memory_current),
            "memory.events": _sv(cg.memory_events),
            "cpu.pressure": _sv(cg.cpu_pressure, dataclasses.asdict),
            "memory.pressure": _sv(cg.memory_pressure, dataclasses.asdict),
            "problems": list(cg.problems),
        },
        "cpus_allowed": _sv(snap.cpus_allowed),
        "pod": describe_pod(snap.pod) if snap.pod is not None else None,
        "devices": [{**dataclasses.asdict(d), "ref": d.ref.resource_id} for d in snap.devices],
        "gpu": describe_gpu(snap.gpu),
        "workload": dataclasses.asdict(snap.workload),
    }


def describe_plan(plan: Plan | None) -> dict[str, Any] | None:
    if plan is None:
        return None
    values = plan.as_dict()
    reasons = values.pop("reasons")
    return {k: {"value": v, "why": reasons.get(k, "")} for k, v in values.items()} | {
        "problems": reasons.get("problems", "")
    }


def render_text(d: dict[str, Any], indent: int = 0) -> str:
    """Human form: one line per value, its source after an arrow."""
    lines: list[str] = []
    pad = "  " * indent
    for key, value in d.items():
        if isinstance(value, dict) and set(value) == {"value", "source"}:
            v = value["value"]
            if isinstance(v, int) and not isinstance(v, bool) and "memory" in key and v > 4096:
                v = f"{v} ({format_bytes(v)})"
            lines.append(f"{pad}{key}: {v}   <- {value['source']}")
        elif isinstance(value, dict) and set(value) == {"value", "why"}:
            lines.append(f"{pad}{key}: {value['value']}   <- {value['why']}")
        elif isinstance(value, dict):
            lines.append(f"{pad}{key}:")
            lines.append(render_text(value, indent + 1) if value else f"{pad}  (none)")
        elif isinstance(value, list):
            if not value:
                lines.append(f"{pad}{key}: []")
            else:
                lines.append(f"{pad}{key}:")
                for item in value:
                    if isinstance(item, dict):
                        lines.append(render_text(item, indent + 1))
                        lines.append(f"{pad}  --")
                    else:
                        lines.append(f"{pad}  - {item}")
        else:
            lines.append(f"{pad}{key}: {value}")
    return "\n".join(line for line in lines if line)
