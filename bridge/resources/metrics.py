"""Prometheus metrics of the resource watcher, on an injected registry (never the global one).

``bridge_limit_*`` are what the kernel enforces (the cgroup files); ``bridge_plan_*`` what the
plan is sized for, which differs during a cooperative downscale. Unlimited is exported as
``+Inf`` (a finite sentinel would read as a real limit). ``bridge_resize_pending{reason}`` is 1
while a resize has been pending (Deferred / Infeasible) or failing (Error) for longer than the
configured escalation time, else 0.
"""

from __future__ import annotations

import math

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

PENDING_REASONS = ("Deferred", "Infeasible", "Error")
ADAPT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class ResourceMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.limit_cpu_cores = Gauge(
            "bridge_limit_cpu_cores",
            "CPU limit seen in the cgroup (quota/period), +Inf when unlimited",
            registry=registry,
        )
        self.limit_memory_bytes = Gauge(
            "bridge_limit_memory_bytes",
            "Memory limit seen in the cgroup (memory.max / memory.limit_in_bytes), +Inf when "
            "unlimited",
            registry=registry,
        )
        self.plan_memory_limit_bytes = Gauge(
            "bridge_plan_memory_limit_bytes",
            "Memory limit the plan is sized for: the cgroup's, memory.high, or a pending "
            "decrease of the Pod's limit (cooperative downscale); +Inf when unlimited",
            registry=registry,
        )
        self.plan_workers = Gauge(
            "bridge_plan_workers", "Decimation workers in the current plan", registry=registry
        )
        self.plan_ring_budget_bytes = Gauge(
            "bridge_plan_ring_budget_bytes",
            "Total ring budget across streams in the current plan",
            registry=registry,
        )
        self.resize_events = Counter(
            "bridge_resize_events",
            "Observed cgroup limit changes by resource (cpu|memory) and direction (up|down)",
            ["resource", "direction"],
            registry=registry,
        )
        self.adapt_seconds = Histogram(
            "bridge_adapt_seconds",
            "Time from detecting a resource change to the applied plan",
            buckets=ADAPT_BUCKETS,
            registry=registry,
        )
        self.resize_pending = Gauge(
            "bridge_resize_pending",
            "1 while an in-place resize of this pod is pending longer than the escalation time",
            ["reason"],
            registry=registry,
        )
        for reason in PENDING_REASONS:
            self.resize_pending.labels(reason=reason).set(0)
        for resource in ("cpu", "memory"):
            for direction in ("up", "down"):
                self.resize_events.labels(resource=resource, direction=direction)

    def set_limits(
        self, cpu_cores: float | None, memory_bytes: int | None, planned_memory: int | None
    ) -> None:
        self.limit_cpu_cores.set(math.inf if cpu_cores is None else cpu_cores)
        self.limit_memory_bytes.set(math.inf if memory_bytes is None else memory_bytes)
        self.plan_memory_limit_bytes.set(math.inf if planned_memory is None else planned_memory)
