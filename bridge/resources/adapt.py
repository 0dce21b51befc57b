"""The applier: watch the cgroup, the own Pod and NVML; re-plan on every change; apply the
differences to the data plane through :class:`~bridge.resources.ports.AdaptTarget`.

Why one owner: the plan depends on all three sources at once (e.g. the cooperative downscale needs
the Pod's desired limit *and* the cgroup's current one), so a single object keeps the latest value
of each, computes :func:`~bridge.resources.plan.make_plan` and calls the target only for values
that changed. It never restarts anything and never closes a connection.

Observability: one log line per applied re-plan, ``bridge_adapt_seconds`` (detection → applied),
limit/plan gauges, ``bridge_resize_events_total``; a resize that stays Deferred/Infeasible (or in
PodResizeInProgress reason Error) longer than ``pending_timeout`` raises a Warning Event on the Pod
and sets ``bridge_resize_pending{reason}``. :meth:`Adapter.describe` is ``/debug/resources``.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import datetime as _dt
import logging
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from prometheus_client import CollectorRegistry

from bridge.config.settings import Settings
from bridge.resources.cgroup import CgroupReader, open_cgroup
from bridge.resources.describe import describe_gpu, describe_plan, describe_snapshot
from bridge.resources.from_settings import plan_settings
from bridge.resources.gpu import GpuProbe
from bridge.resources.kubeapi import KubeConfig, KubeError, event_body, own_pod
from bridge.resources.metrics import ResourceMetrics
from bridge.resources.plan import Plan, PlanSettings, make_plan
from bridge.resources.pod import AllocatedDevice, PodView, ResizeState, pending_memory_decrease
from bridge.resources.podsource import PodApi, PodSource, PodUpdate
from bridge.resources.poller import Poller
from bridge.resources.ports import AdaptTarget
from bridge.resources.quantity import format_bytes
from bridge.resources.rss import own_rss_bytes
from bridge.resources.share import PodShare, shared_plan, shared_reading
from bridge.resources.snapshot import CgroupReading, GpuReading, Snapshot, Sourced, Workload

log = logging.getLogger(__name__)


class KubeApi(PodApi, Protocol):
    """The Pod source's calls plus an Event about the own Pod (see resources/kubelight.py)."""

    base_url: str

    async def create_event(self, namespace: str, body: dict[str, Any]) -> None: ...

    async def close(self) -> None: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class AdapterSettings:
    poll_interval: float = 0.05  # cgroup files (no change events exist for them)
    slow_interval: float = 1.0  # NVML, active streams, pending-resize escalation
    pending_timeout: float = 60.0  # raise an Event after a resize is pending this long
    event_reason: str = "BridgeResizePending"
    plan: PlanSettings = field(default_factory=PlanSettings)

    def __post_init__(self) -> None:
        if self.poll_interval <= 0 or self.slow_interval <= 0 or self.pending_timeout < 0:
            raise ValueError("poll_interval and slow_interval must be > 0, pending_timeout >= 0")


def affinity_cpus() -> int:
    """CPUs this process may run on (a cpuset narrows it; ``os.cpu_count`` would not)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


@dataclass(slots=True)
class _Pending:
    reason: str
    message: str
    generation: int | None
    since: float
    escalated: bool = False


@dataclass(frozen=True, slots=True)
class AppliedChange:
    """What one re-plan changed, for logs, tests and the benchmark."""

    cause: str
    detected_at: float
    applied_at: float
    changes: tuple[str, ...]
    plan: Plan


class Adapter:
    """Owns the watchers; see the module docstring. Use ``async with Adapter(...)`` or
    :meth:`start` / :meth:`stop`."""

    def __init__(
        self,
        target: AdaptTarget,
        registry: CollectorRegistry,
        *,
        cgroup: CgroupReader,
        kube: KubeApi | None = None,
        pod_ref: tuple[str, str] | None = None,
        gpu: GpuProbe | None = None,
        settings: AdapterSettings | None = None,
        cpus_allowed: Callable[[], int] = affinity_cpus,
        clock: Callable[[], float] = time.monotonic,
        on_applied: Callable[[AppliedChange], None] | None = None,
    ) -> None:
        self.target = target
        self.settings = settings or AdapterSettings()
        self.metrics = ResourceMetrics(registry)
        self._cgroup_reader = cgroup
        # usage/PSI/events refresh about once a second; limits on every poll
        cgroup.detail_every = max(1, round(1.0 / self.settings.poll_interval))
        self._kube = kube
        self._pod_ref = pod_ref
        self._gpu_probe = gpu
        self._cpus_allowed = cpus_allowed
        self._clock = clock
        self._on_applied = on_applied
        self._poller: Poller[CgroupReading] = Poller(
            cgroup.read, self._on_cgroup, interval=self.settings.poll_interval, clock=clock
        )
        self._cgroup: CgroupReading = CgroupReading("none", cgroup.location)
        self._cpus = Sourced(1, "os.sched_getaffinity(0)")
        self._pod: PodView | None = None
        self._devices: tuple[AllocatedDevice, ...] = ()
        self._pod_problems: tuple[str, ...] = ()
        self._gpu: GpuReading | None = None
        self._workload = Workload()
        self._applied: Plan | None = None
        self._snapshot: Snapshot | None = None
        self._pending: _Pending | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        self._event_tasks: set[asyncio.Task[Any]] = set()
        self._pod_source: PodSource | None = None
        self.history: collections.deque[AppliedChange] = collections.deque(maxlen=256)
        self.events_posted: list[dict[str, Any]] = []
        self.last_adapt_seconds: float | None = None
        self._share: PodShare | None = None  # in a pod: the supervisor's share, not the cgroup

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_settings(
        cls,
        target: AdaptTarget,
        registry: CollectorRegistry,
        bridge: Settings,
        *,
        settings: AdapterSettings | None = None,
        gpu: GpuProbe | None = None,
    ) -> Adapter:
        """Real sources, as the bridge settings name them: ``cgroup_root`` or the own cgroup;
        the own Pod when ``pod_name``/``pod_namespace`` and an API (``kube_api`` or the service
        account) exist; NVML when ``nvidia-ml-py`` is installed. ``container_name`` names the
        bridge's container in the Pod (default: ``bridge``, else the first). ``settings``
        defaults to the polling, timeout and memory-cap values of ``bridge``."""
        if settings is None:
            settings = AdapterSettings(
                poll_interval=bridge.cgroup_poll_seconds,
                pending_timeout=bridge.resize_pending_timeout_seconds,
                plan=plan_settings(bridge),  # the same plan `simbridge resources` prints
            )
        if settings.plan.container is None and bridge.container_name:
            plan = dataclasses.replace(settings.plan, container=bridge.container_name)
            settings = dataclasses.replace(settings, plan=plan)
        config = KubeConfig.resolve(bridge.kube_api, bridge.kube_token_file)
        pod_ref = own_pod(bridge.pod_name, bridge.pod_namespace)
        kube = None
        if config is not None and pod_ref is not None:
            from bridge.resources.kubelight import connect  # lightkube only with a cluster

            kube = connect(config)
        return cls(
            target,
            registry,
            cgroup=open_cgroup(bridge.cgroup_root),
            kube=kube,
            pod_ref=pod_ref if kube is not None else None,
            gpu=gpu if gpu is not None else GpuProbe.load(),
            settings=settings,
        )

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Read every source once and apply the first plan before returning, then keep
        watching in background tasks."""
        self._cpus = Sourced(self._cpus_allowed(), "os.sched_getaffinity(0)")
        if self._gpu_probe is not None:
            self._gpu = await asyncio.to_thread(self._gpu_probe.read)
        await self._poller.poll_once()  # applies the first plan
        self._tasks.append(asyncio.create_task(self._poller.run(), name="resources-cgroup"))
        self._tasks.append(asyncio.create_task(self._slow_loop(), name="resources-slow"))
        if self._kube is not None and self._pod_ref is not None:
            ns, name = self._pod_ref
            self._pod_source = PodSource(
                self._kube, ns, name, self._on_pod, container=self.settings.plan.container
            )
            self._tasks.append(asyncio.create_task(self._pod_source.run(), name="resources-pod"))

    async def stop(self) -> None:
        pending = set(self._tasks)
        while pending:  # re-cancel: a cancellation can be swallowed by a racing wait_for (3.11)
            for t in pending:
                t.cancel()
            _, pending = await asyncio.wait(pending, timeout=0.5)
        self._tasks.clear()
        if self._event_tasks:
            await asyncio.gather(*self._event_tasks, return_exceptions=True)
        if self._gpu_probe is not None:
            self._gpu_probe.close()
        if self._kube is not None:
            await self._kube.close()

    async def __aenter__(self) -> Adapter:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # ------------------------------------------------------------------ inputs

    def _on_cgroup(self, reading: CgroupReading, detected_at: float) -> None:
        old = self._cgroup
        self._cgroup = reading
        if old.version != "none":
            self._count_resize(old, reading)
        self.replan("cgroup", detected_at)

    def _count_resize(self, old: CgroupReading, new: CgroupReading) -> None:
        """Count limit changes; a value that could not be read on either side is no resize."""
        inf = float("inf")
        pairs = []
        if old.cpu_max is not None and new.cpu_max is not None:
            pairs.append(("cpu", old.cpu_limit_cores, new.cpu_limit_cores))
        if old.memory_max is not None and new.memory_max is not None:
            pairs.append(("memory", old.memory_limit_bytes, new.memory_limit_bytes))
        for resource, a, b in pairs:
            a_, b_ = inf if a is None else a, inf if b is None else b
            if a_ != b_:
                direction = "up" if b_ > a_ else "down"
                self.metrics.resize_events.labels(resource=resource, direction=direction).inc()
                log.info("cgroup %s limit %s: %s -> %s", resource, direction, a, b)

    async def _on_pod(self, update: PodUpdate) -> None:
        self._pod = update.pod
        self._devices = update.devices
        self._pod_problems = update.problems
        self._track_pending(update.pod)
        self.replan("pod", update.detected_at)

    def _workload_now(self) -> Workload:
        try:
            return Workload(
                active_streams=int(self.target.active_streams()),
                baseline_bytes=int(self.target.memory_baseline_bytes()),
            )
        except Exception:
            log.exception("AdaptTarget workload query failed; keeping the last values")
            return self._workload

    async def _slow_loop(self) -> None:
        """NVML (off the loop: driver calls can take milliseconds), active streams, escalation."""
        while True:
            await asyncio.sleep(self.settings.slow_interval)
            now = self._clock()
            cause = ""
            if self._gpu_probe is not None:
                gpu = await asyncio.to_thread(self._gpu_probe.read)
                if self._gpu is None or gpu.relevant_key() != self._gpu.relevant_key():
                    self._gpu = gpu
                    cause = "gpu"
            if self._workload_now() != self._workload:
                cause = cause or "workload"
            if cause:
                self.replan(cause, now)
            self._check_escalation()

    def set_share(self, share: PodShare) -> None:
        """In a pod: plan from this process's share from now on (bridge.resources.share)."""
        self._share = share
        self.replan("share", self._clock())

    def notify_workload_changed(self) -> None:
        """For the data plane: streams opened/closed; re-plan the per-stream shares now."""
        self.replan("workload", self._clock())

    # ------------------------------------------------------------------ plan + apply

    def snapshot(self, detected_at: float | None = None) -> Snapshot:
        self._workload = self._workload_now()
        share = self._share
        return Snapshot(
            cgroup=self._cgroup
            if share is None
            else shared_reading(self._cgroup, share, own_rss_bytes()),
            cpus_allowed=self._cpus,
            pod=self._pod,
            devices=self._devices,
            gpu=self._gpu,
            workload=self._workload,
            detected_at=self._clock() if detected_at is None else detected_at,
        )

    def replan(self, cause: str, detected_at: float | None = None) -> Plan:
        snap = self.snapshot(detected_at)
        self._snapshot = snap
        plan = make_plan(snap, self.settings.plan)
        if self._share is not None:
            plan = shared_plan(plan, self._share)
        self.metrics.set_limits(
            snap.cgroup.cpu_limit_cores, snap.cgroup.memory_limit_bytes, plan.memory_limit_bytes
        )
        prev = self._applied
        if prev is not None and plan == prev:
            self._applied = plan  # same values; keep the newest reasons for describe()
            return plan
        changes = self._apply(prev, plan)
        if changes is None:
            return plan  # the target failed; retried on the next change
        applied_at = self._clock()
        self._applied = plan
        self.metrics.plan_workers.set(plan.workers)
        self.metrics.plan_ring_budget_bytes.set(plan.ring_budget_bytes)
        elapsed = max(0.0, applied_at - snap.detected_at)
        self.metrics.adapt_seconds.observe(elapsed)
        self.last_adapt_seconds = elapsed
        change = AppliedChange(cause, snap.detected_at, applied_at, tuple(changes), plan)
        self.history.append(change)
        log.info(
            "re-plan (%s): %s; %.1f ms after detection",
            cause,
            ", ".join(changes) or "initial",
            elapsed * 1000,
        )
        if self._on_applied is not None:
            self._on_applied(change)
        return plan

    def _apply(self, prev: Plan | None, plan: Plan) -> list[str] | None:
        changes: list[str] = []
        try:
            if prev is None or plan.workers != prev.workers:
                self.target.resize_workers(plan.workers)
                changes.append(f"workers {prev.workers if prev else '-'}->{plan.workers}")
            memory = (plan.data_budget_bytes, plan.reserve_bytes)
            if prev is None or memory != (prev.data_budget_bytes, prev.reserve_bytes):
                self.target.set_memory_budget(plan.data_budget_bytes, plan.reserve_bytes)
                before = format_bytes(prev.data_budget_bytes) if prev else "-"
                changes.append(f"memory budget {before}->{format_bytes(plan.data_budget_bytes)}")
            if prev is None or plan.gpu_healthy != prev.gpu_healthy:
                self.target.set_gpu_healthy(plan.gpu_healthy)
                changes.append(f"gpu {'healthy' if plan.gpu_healthy else 'off (CPU)'}")
            if prev is None or plan.gpu_batch_points != prev.gpu_batch_points:
                # optional hook, not in AdaptTarget: a target without it keeps its own batch size
                setter = getattr(self.target, "set_gpu_batch_points", None)
                if callable(setter):
                    setter(plan.gpu_batch_points)
                before_b = prev.gpu_batch_points if prev else "-"
                changes.append(f"gpu_batch_points {before_b}->{plan.gpu_batch_points}")
        except Exception:
            log.exception("applying the plan failed after %s", changes or "no change")
            return None
        if prev is not None:
            for name in ("per_stream_bytes", "memory_limit_bytes"):
                if getattr(plan, name) != getattr(prev, name):
                    changes.append(f"{name} {getattr(prev, name)}->{getattr(plan, name)}")
        return changes

    # ------------------------------------------------------------------ pending resizes

    def _track_pending(self, pod: PodView) -> None:
        state = pod.resize_state()
        if state in (ResizeState.DEFERRED, ResizeState.INFEASIBLE, ResizeState.ERROR):
            cond = pod.resize_pending if pod.resize_pending is not None else pod.resize_in_progress
            message = cond.message if cond is not None else ""
            p = self._pending
            if p is None or (p.reason, p.generation) != (state.value, pod.generation):
                if p is not None and p.escalated:
                    self.metrics.resize_pending.labels(reason=p.reason).set(0)
                self._pending = _Pending(state.value, message, pod.generation, self._clock())
                log.info("resize %s (generation %s): %s", state.value, pod.generation, message)
            else:
                p.message = message
            self._check_escalation()
        elif self._pending is not None:
            p = self._pending
            log.info(
                "resize no longer %s after %.1f s (now %s)",
                p.reason,
                self._clock() - p.since,
                state.value,
            )
            self.metrics.resize_pending.labels(reason=p.reason).set(0)
            self._pending = None

    def _check_escalation(self) -> None:
        p = self._pending
        if p is None or p.escalated:
            return
        age = self._clock() - p.since
        if age < self.settings.pending_timeout:
            return
        p.escalated = True
        self.metrics.resize_pending.labels(reason=p.reason).set(1)
        message = f"in-place resize {p.reason} for {age:.0f}s: {p.message}"
        if self._pod is not None:
            target = pending_memory_decrease(self._pod, self.settings.plan.container)
            if target is not None:
                message += (
                    f"; bridge already planning for the new memory limit "
                    f"{format_bytes(target.limit_bytes)} (cooperative downscale)"
                )
        log.warning("%s", message)
        if self._kube is not None and self._pod is not None:
            task = asyncio.create_task(self._post_event(message))
            self._event_tasks.add(task)
            task.add_done_callback(self._event_tasks.discard)

    async def _post_event(self, message: str) -> None:
        assert self._kube is not None and self._pod is not None
        pod = self._pod
        body = event_body(
            namespace=pod.namespace,
            pod_name=pod.name,
            pod_uid=pod.uid,
            reason=self.settings.event_reason,
            message=message,
            now_iso=_dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            suffix=f"{time.time_ns():x}{secrets.token_hex(2)}",
        )
        try:
            await self._kube.create_event(pod.namespace, body)
            self.events_posted.append(body)
        except KubeError as e:
            log.warning("could not post Event on %s/%s: %s", pod.namespace, pod.name, e)

    # ------------------------------------------------------------------ introspection

    @property
    def plan(self) -> Plan | None:
        return self._applied

    def describe(self) -> dict[str, Any]:
        """Every value the bridge sees, where it came from, and the plan with its reasons."""
        snap = self._snapshot or self.snapshot()
        out = describe_snapshot(snap)
        out["gpu"] = describe_gpu(self._gpu)
        out["pod_source"] = (
            None
            if self._pod_source is None
            else {
                "api": self._kube.base_url if self._kube else None,
                "connected": self._pod_source.connected,
                "problems": list(self._pod_problems),
            }
        )
        out["plan"] = describe_plan(self._applied)
        out["pod_share"] = None if self._share is None else self._share.as_dict()
        p = self._pending
        out["pending_resize"] = (
            None
            if p is None
            else {
                "reason": p.reason,
                "message": p.message,
                "generation": p.generation,
                "pending_seconds": round(self._clock() - p.since, 3),
                "escalated": p.escalated,
            }
        )
        out["adapt"] = {
            "last_seconds": self.last_adapt_seconds,
            "replans_applied": len(self.history),
            "poll_interval_s": self.settings.poll_interval,
            "polls": self._poller.polls,
        }
        return out
