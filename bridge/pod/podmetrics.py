"""The supervisor's own metrics, in a registry of its own (never the global one): appended to the
pod's merged ``/metrics`` (docs/operations.md, "A pod"). Every name starts with
``bridge_pod_`` so that none meets a name an ingest process exports (the supervisor has no
``process_*`` collector: those names are the processes' own, kept per process in the merge)."""

from __future__ import annotations

import os
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, disable_created_metrics
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from bridge.pod.metrics_merge import REFUSE_REASONS
from bridge.resources.rss import own_rss_bytes

# No ``*_created`` series (as the processes: bridge.server.metrics); process-wide.
disable_created_metrics()  # type: ignore[no-untyped-call]

CLAIM_RESULTS = ("granted", "refused", "released", "timeout")
# Why a process's /metrics was not merged on a scrape: the fetch, then the merge's refusals.
SCRAPE_ERROR_REASONS = ("unreachable", "timeout", "status", *REFUSE_REASONS)
DROP_REASONS = ("conflict", "cap")


class PodMetrics:
    """The supervisor sets these; the ops port renders them after the merged processes'."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = registry if registry is not None else CollectorRegistry(auto_describe=True)
        self.registry = r
        self.processes = Gauge(
            "bridge_pod_processes", "Ingest processes running and up", registry=r
        )
        self.processes_planned = Gauge(
            "bridge_pod_processes_planned", "Ingest processes the current plan asks for", registry=r
        )
        self.restarts = Counter(
            "bridge_pod_restarts", "Ingest processes started again after they exited", registry=r
        )
        self.crash_loop = Gauge(
            "bridge_pod_crash_loop",
            "1 while a slot restarts too often (the pod is not ready), else 0",
            registry=r,
        )
        self.claims = Counter(
            "bridge_pod_claims",
            "Device ownership claims answered, by result",
            ["result"],
            registry=r,
        )
        self.scrape_errors = Counter(
            "bridge_pod_scrape_errors",
            "Process /metrics not merged on a scrape, by reason",
            ["reason"],
            registry=r,
        )
        self.process_up = Gauge(
            "bridge_pod_process_up",
            "1 when the process's /metrics answered on the last scrape, else 0",
            ["process"],
            registry=r,
        )
        self.dropped_samples = Counter(
            "bridge_pod_metrics_dropped_samples",
            "Samples left out of the merged /metrics: a kind that disagrees, or over the cap",
            ["reason"],
            registry=r,
        )
        self.ready = Gauge("bridge_pod_ready", "1 when the pod answers /readyz 200", registry=r)
        self.unauthorized = Counter(
            "bridge_pod_unauthorized_requests",
            "Requests to the pod's ops port refused for a missing or wrong token",
            registry=r,
        )
        self._up_slots: set[int] = set()
        for result in CLAIM_RESULTS:
            self.claims.labels(result)
        for reason in SCRAPE_ERROR_REASONS:
            self.scrape_errors.labels(reason)
        for reason in DROP_REASONS:
            self.dropped_samples.labels(reason)
        r.register(_SupervisorProcess())

    def set_processes_up(self, up: dict[int, bool]) -> None:
        """``bridge_pod_process_up`` for exactly these slots (a slot that left is removed)."""
        for index in self._up_slots - up.keys():
            self.process_up.remove(str(index))
        self._up_slots = set(up)
        for index, ok in up.items():
            self.process_up.labels(str(index)).set(1 if ok else 0)


class _SupervisorProcess(Collector):
    """The supervisor's own memory and CPU (its RSS counts against the pod's limit); named apart
    from the processes' ``process_*`` series."""

    def collect(self) -> Iterator[Metric]:
        rss = GaugeMetricFamily(
            "bridge_pod_supervisor_resident_memory_bytes", "The supervisor's resident memory"
        )
        resident = own_rss_bytes()
        rss.add_metric([], float("nan") if resident is None else float(resident))
        yield rss
        times = os.times()
        cpu = CounterMetricFamily(
            "bridge_pod_supervisor_cpu_seconds", "CPU time the supervisor used (user and system)"
        )
        cpu.add_metric([], times.user + times.system)
        yield cpu
