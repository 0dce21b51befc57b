"""The container rig for the bridge as a pod (``--processes auto``): what it samples and how it
awaits a step (the scenario is :mod:`benchmarks.container.pod_steps`).

- memory: the sum of every process of the container's cgroup (``cgroup.procs``: the supervisor
  and each ingest process), each one's anonymous RSS kept by its pid inside the container;
- ``bridge_pod_processes`` from the pod's merged ``/metrics``, the plan and the slots from its
  ``/debug/resources``;
- a step is settled when the pod's plan holds the cgroup's limits, its N is the one
  :func:`bridge.pod.podplan.plan_pod` gives for them, that many processes are up and none is
  starting or retiring (a retiring one has drained and exited);
- the sink records every frame, for each device's pauses (:mod:`benchmarks.container.pod_report`);
- the load comes in waves: devices connected while N=1 all sit in process 0, and adding a process
  moves no connection, so a retired process would hold no device; a new wave of publishers after
  each step that adds a process spreads over every process (``SO_REUSEPORT``), and the sessions
  each process holds before a step (``bridge_sessions`` by process) say how many devices a
  retirement moved.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from benchmarks.container.probe import http_get, parse_metrics, process_rss
from benchmarks.container.resize import Resizer
from benchmarks.container.rig import ContainerRig, RigConfig, Step, StepResult
from bridge.config.settings import Settings
from bridge.pod.podplan import SUPERVISOR_MARGIN_BYTES, plan_pod

POD_GAUGES = ("bridge_pod_processes", "bridge_pod_processes_planned")
SUMMED = ("published", "undelivered", "dropped_resend_overflow", "disconnects", "reconnects",
          "connect_failures", "pauses")  # fmt: skip


@dataclass(frozen=True, slots=True)
class PodScenario:
    """What the rig needs to know of the scenario."""

    intended: tuple[int, ...]  # N at the start, then after each step
    settle_s: float  # a step's N must equal the plan within this
    waves_after: tuple[int, ...] = ()  # steps after which a new wave of publishers starts


@dataclass(slots=True)
class PodStep:
    """What one step did to N, as the pod reports it."""

    index: int
    label: str
    intended: int
    expected: int  # plan_pod on the step's limits with the pod's reserve
    n_before: float | None = None  # bridge_pod_processes just before the resize
    planned: int | None = None  # the pod's plan (/debug/resources) when settled, or at timeout
    n_after: float | None = None  # bridge_pod_processes then
    settle_s: float | None = None  # the resize call done → N = plan, no process starting/retiring
    states: list[str] = field(default_factory=list)  # slot states at settle (or at timeout)
    sessions_before: dict[int, float] = field(default_factory=dict)  # process → bridge_sessions
    sessions_after: dict[int, float] = field(default_factory=dict)  # the same once settled
    moved: int = 0  # sessions the processes that this step retired held just before it


class PodRig(ContainerRig):
    """The container rig with the pod's view: every process's RSS summed over the container's
    cgroup, ``bridge_pod_*`` gauges scraped, each step awaited until N equals the plan, and the
    sink's record of every frame (for each device's delivery pauses)."""

    scrape_every_s = 0.5  # each scrape merges every process's /metrics in the supervisor

    def __init__(self, cfg: RigConfig, scenario: PodScenario, record: Path) -> None:
        super().__init__(cfg, tag="pod")
        self.scenario = scenario
        self.record_path = record
        self._waves = {i: asyncio.Event() for i in scenario.waves_after}
        self.affinity = len(os.sched_getaffinity(0))
        self.reserve = 0  # the supervisor's reserve in the pod's plan (RSS + margin)
        self.wall0_ns = 0  # time.time_ns() at self.now() == 0
        self.n_start: float | None = None
        self.pod_steps: list[PodStep] = []
        self.proc_samples: list[tuple[float, dict[int, int]]] = []  # t, container pid → anon
        self.slot_of: dict[int, int] = {1: -1}  # container pid → slot (the supervisor: -1)
        self._sessions: dict[int, float] = {}
        self._n_before: float | None = None

    # -- hooks of ContainerRig -----------------------------------------------------------------
    async def start_sink(self, listen: str = "127.0.0.1:0", record: Path | None = None) -> None:
        self.wall0_ns = time.time_ns() - int(self.now() * 1e9)
        await super().start_sink(listen, record or self.record_path)

    async def start_bridge(self) -> None:
        await super().start_bridge()
        doc = await self.debug()
        self.reserve = int(doc["plan"]["supervisor_reserve_bytes"])
        self._learn_slots(doc)
        self.n_start = float(doc["processes_running"])

    def rss_now(self) -> tuple[int, int]:
        """Summed over every process of the container's cgroup (``cgroup.procs``); each one's
        anonymous RSS kept by its pid inside the container (``NSpid``)."""
        assert self.cgroup is not None
        try:
            pids = (self.cgroup.memory_dir / "cgroup.procs").read_text().split()
        except OSError:
            return process_rss(self.pid)
        anon_sum = vm_sum = 0
        per: dict[int, int] = {}
        for pid in pids:
            anon, vmrss, inner = _status(int(pid))
            anon_sum += anon
            vm_sum += vmrss
            if inner:
                per[inner] = anon
        self.proc_samples.append((self.now(), per))
        return anon_sum, vm_sum

    async def scrape(self) -> dict[str, float]:
        status, body = await http_get(self.ports["http"], "/metrics")
        if status != 200:
            raise ValueError(f"/metrics answered {status}")
        out = parse_metrics(body)
        for fam in text_string_to_metric_families(body):
            for s in fam.samples:
                if s.name in POD_GAUGES:
                    out[s.name] = s.value
                elif s.name == "bridge_sessions" and s.labels.get("process", "").isdigit():
                    out[f"bridge_sessions{{process={s.labels['process']}}}"] = s.value
        return out

    @staticmethod
    def sessions(metrics: dict[str, float]) -> dict[int, float]:
        """``bridge_sessions`` by process index, from a scrape."""
        head = "bridge_sessions{process="
        return {int(k[len(head) : -1]): v for k, v in metrics.items() if k.startswith(head)}

    async def _apply(self, i: int, step: Step, resizer: Resizer) -> StepResult:
        try:
            m = await self.scrape()
        except (OSError, TimeoutError, ValueError, IndexError):
            m = self._metrics
        self._n_before, self._sessions = m.get("bridge_pod_processes"), self.sessions(m)
        return await super()._apply(i, step, resizer)

    async def _publish(self, duration_s: float, tag: str = "") -> dict[str, Any]:
        """The first wave now, one more after each step of ``waves_after`` (once it settled),
        all ending together; their summaries added up (``by_transport`` keeps each)."""
        t0 = self.now()
        first = asyncio.ensure_future(super()._publish(duration_s, tag))
        waves = [first]
        try:
            for k, i in enumerate(self.scenario.waves_after, 2):
                started = asyncio.ensure_future(self._waves[i].wait())
                await asyncio.wait({started, first}, return_when=asyncio.FIRST_COMPLETED)
                started.cancel()
                left = duration_s - (self.now() - t0)
                if not self._waves[i].is_set() or left < 2.0:
                    break  # the run ended early (the first wave finished: it died with the bridge)
                waves.append(asyncio.ensure_future(super()._publish(left, f"{tag}-w{k}")))
            reps = await asyncio.gather(*waves)
        finally:
            for wave in waves:
                wave.cancel()  # a wave failed or the run was cancelled: no task outlives it
        total: dict[str, Any] = {"waves": len(reps), "by_transport": {}}
        for k, rep in enumerate(reps, 1):
            for t, r in rep["by_transport"].items():
                total["by_transport"][f"{t} wave {k}"] = r
        for key in SUMMED:
            total[key] = sum(int(r.get(key, 0)) for r in reps)
        return total

    async def _await_seen(self, res: StepResult, timeout: float = 0.0) -> None:  # noqa: ASYNC109
        """Until the pod's plan holds the cgroup's limits, its N is the expected one, that many
        processes are up and none is starting or retiring (a retiring one has drained and
        exited); ``res.match`` then, else a note after ``settle_s``."""
        try:
            await self._settle(res, timeout or self.scenario.settle_s)
        finally:
            if res.index in self._waves:
                self._waves[res.index].set()

    async def _settle(self, res: StepResult, timeout: float) -> None:  # noqa: ASYNC109
        expected = self.expected_n(res.target_cpu, res.target_memory)
        intended = self.scenario.intended
        ps = PodStep(
            res.index,
            res.label,
            intended[res.index] if res.index < len(intended) else -1,
            expected,
            self._n_before,
            sessions_before=self._sessions,
            moved=round(sum(v for k, v in self._sessions.items() if k >= expected)),
        )
        self.pod_steps.append(ps)
        t0 = time.monotonic()
        while True:
            try:
                _, res.cgroup_memory, res.cgroup_cpu = self._cg_values()
            except OSError:
                res.notes.append("the container is gone (its cgroup was removed)")
                return
            with contextlib.suppress(OSError, TimeoutError, ValueError, IndexError, KeyError):
                doc = await self.debug()
                self._learn_slots(doc)
                m = await self.scrape()
                plan = doc["plan"]
                res.seen_cpu, res.seen_memory = plan["cores"], plan["memory_limit_bytes"]
                ps.planned, ps.n_after = int(plan["processes"]), m.get("bridge_pod_processes")
                ps.sessions_after = self.sessions(m)
                ps.states = [f"p{w['index']} {w['state']}" for w in doc["workers"]]
                cores = min(res.cgroup_cpu or float(self.affinity), float(self.affinity))
                moving = [w for w in doc["workers"] if w["state"] not in ("up", "stopped", "idle")]
                if (
                    _same(res.seen_memory, res.cgroup_memory)
                    and _same(res.seen_cpu, cores)
                    and ps.planned == expected
                    and ps.n_after == expected
                    and not moving
                ):
                    res.match = True
                    res.seen_after_ms = (time.monotonic() - t0) * 1000
                    ps.settle_s = time.monotonic() - t0
                    return
            if time.monotonic() - t0 > timeout:
                res.notes.append(
                    f"not settled after {timeout:.0f} s: plan {ps.planned} (expected {expected})"
                    f" for {res.seen_cpu} cores / {_mib(res.seen_memory)} MiB (cgroup "
                    f"{res.cgroup_cpu} / {_mib(res.cgroup_memory)}), bridge_pod_processes "
                    f"{ps.n_after}, slots {', '.join(ps.states) or 'none'}"
                )
                return
            await asyncio.sleep(0.25)

    # -- the pod's view ------------------------------------------------------------------------
    async def debug(self) -> dict[str, Any]:
        status, body = await http_get(self.ports["http"], "/debug/resources", timeout=5.0)
        if status != 200:
            raise ValueError(f"/debug/resources answered {status}")
        doc: dict[str, Any] = json.loads(body)
        return doc

    def _learn_slots(self, doc: dict[str, Any]) -> None:
        for w in doc.get("workers", []):
            if w.get("pid"):
                self.slot_of[int(w["pid"])] = int(w["index"])

    def expected_n(self, cpu: float, memory: int) -> int:
        """N as ``plan_pod`` gives it for these limits and the pod's reserve."""
        settings = Settings(processes="auto", max_frame_bytes=self.cfg.max_frame_bytes)
        supervisor_rss = self.reserve - SUPERVISOR_MARGIN_BYTES
        return plan_pod(settings, cpu, self.affinity, memory, supervisor_rss).count


def _status(pid: int) -> tuple[int, int, int]:
    """(RssAnon + RssShmem, VmRSS, pid inside the container) of a host pid; zeros when gone."""
    fields: dict[str, str] = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("VmRSS", "RssAnon", "RssShmem", "NSpid"):
                    fields[key] = rest.strip()
    except OSError:
        return 0, 0, 0

    def kib(key: str) -> int:
        return int(fields.get(key, "0 kB").split()[0]) * 1024

    inner = fields.get("NSpid", "0").split()
    return kib("RssAnon") + kib("RssShmem"), kib("VmRSS"), int(inner[-1])


def _mib(n: float | None) -> str:
    return "-" if n is None else f"{n / (1 << 20):.0f}"


def _same(a: float | None, b: float | None) -> bool:
    return a is not None and b is not None and abs(a - b) <= 1e-6 * max(1.0, abs(b))
