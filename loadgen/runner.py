"""The scenario runner: one bridge, one sink, K edges, a resize plan; in place or by restart.

Why the pieces are where they are: the bridge is a real child process (``simbridge serve``), so a
restart is a real process exit and the CPU throttle acts on it alone; the sink and the edges run
in this process on one event loop, so the sink's record (the source of truth for delivery) and
the edges' publish log share one wall clock. Edges publish open loop on a fixed schedule; each
frame's scheduled send time is logged, so latency counts from when it *should* have left and a
stalled bridge cannot hide by slowing the schedule down.

A run (:func:`run_mode`) goes: write the initial limits, start sink and bridge, wait until the
bridge's plan reflects them (``/debug/resources``), connect the edges, publish for the scenario's
duration while a timer applies each resize step, wait for delivery, stop everything, then account
per phase from the sink's record (:mod:`loadgen.phases`). In ``in-place`` mode a step goes through
a resize backend (:mod:`loadgen.resize`) and the step is *adapted* when the bridge's applied plan
shows the new limits; in ``restart`` mode the same step stops the bridge (SIGTERM: it drains and
sends Drain to the edges) and starts a new one with the new limits on the same ports, the way
limits changed before in-place resize existed.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from loadgen import phases
from loadgen.child import BridgeChild, wait_adapted
from loadgen.edge import EdgeClient, PreparedPayload, StreamConfig
from loadgen.resize import Applied, LocalBackend, make_backend
from loadgen.scenario import ResizeStep, Scenario
from loadgen.sink import SinkServer
from loadgen.steps import (
    StepRecord,
    edge_summary,
    prepare_clouds,
    read_record,
    ttas_summary,
)

__all__ = ["MODES", "Run", "prepare_clouds", "read_record", "run_scenario"]

MODES = ("in-place", "restart")
#: a memory decrease "below usage" targets at least this much below the usage at that moment
BELOW_USAGE_MIN = 256 << 10
ProgressFn = Callable[[dict[str, Any]], None]
#: Sees every new frame the sink records, with the run's mode (e.g. to tee it to a viewer).
FrameHook = Callable[[str, Any], None]


def below_usage_target(usage: int, resources: dict[str, Any]) -> tuple[int, str]:
    """The limit for a memory decrease "below usage", and a note saying why.

    Only the frames in the bridge's rings are its to give back (drained once the plan shrinks
    the rings, then trimmed from the heap), so the target is below ``usage`` by half of what the
    rings hold, never by less than BELOW_USAGE_MIN. A fixed floor of 2 MiB asked the impossible
    of a bridge holding 0.8 MiB just after a heap trim (seen in CI: usage stayed 94 Mi against a
    92 Mi limit).
    """
    ring = int(resources.get("ring_occupancy_bytes", 0))
    margin = max(ring // 2, BELOW_USAGE_MIN)
    note = f"ring held {ring >> 10}Ki at the request: {margin >> 10}Ki below usage"
    return max(16 << 20, usage - margin), note


# ---------------------------------------------------------------------------------------------
# One run


class Run:
    """State of one run (one mode) of a scenario."""

    def __init__(
        self,
        scenario: Scenario,
        mode: str,
        out_dir: Path,
        *,
        backend: str = "local",
        real_cpu: bool = True,
        progress: ProgressFn | None = None,
        stem: str | None = None,
        frame_hook: FrameHook | None = None,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}")
        self.s = scenario
        self.mode = mode
        self.out_dir = out_dir
        self.backend_name = backend if mode == "in-place" else "local"
        self.real_cpu = real_cpu
        self.progress = progress
        self.frame_hook = frame_hook
        self.tmp = Path(tempfile.mkdtemp(prefix=f"simbridge-{mode}-"))
        self.backend: LocalBackend = make_backend(
            self.backend_name, self.tmp / "cgroup", real_cpu=real_cpu
        )
        self.sink: SinkServer | None = None
        self.bridge: BridgeChild | None = None
        self.edges: list[EdgeClient] = []
        self.published: list[tuple[str, str, int, int]] = []
        self.disconnects_ns: list[int] = []
        self.steps = [StepRecord(i, st) for i, st in enumerate(scenario.resizes)]
        self.bridge_exit_codes: list[int] = []
        stem = stem or scenario.name
        self.record_path = out_dir / f"{stem}-{mode}-sink.jsonl"
        self.log_path = out_dir / f"{stem}-{mode}-bridge.log"
        self.phase = "starting"
        self.t0_ns = 0
        self.t_end_ns = 0
        self.cloud_note = ""
        self.initial_tta_ms: float | None = None

    # -- lifecycle -------------------------------------------------------------------------

    def _bridge_env(self) -> dict[str, str]:
        env = {f"BRIDGE_{k.upper()}": str(v) for k, v in self.s.bridge.items()}
        env.update(self.backend.env())
        assert self.sink is not None
        env.update(
            BRIDGE_ADAPT="true",
            BRIDGE_SINK_ADDRESS=self.sink.address,
            BRIDGE_SINK_BACKOFF_INITIAL_SECONDS="0.05",
            BRIDGE_SINK_BACKOFF_MAX_SECONDS="0.5",
            BRIDGE_LOG_LEVEL="INFO",
        )
        return env

    async def _start_bridge(self, ports: tuple[int, int, int] = (0, 0, 0)) -> BridgeChild:
        bridge = await BridgeChild.start(self._bridge_env(), self.log_path, ports)
        self.backend.attach(bridge.pid)
        self.bridge = bridge
        return bridge

    async def execute(self) -> dict[str, Any]:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        for p in (self.record_path, self.log_path):
            p.unlink(missing_ok=True)
        payloads, self.cloud_note = await asyncio.to_thread(prepare_clouds, self.s)
        try:
            await self.backend.start(self.s.initial_cpu, self.s.initial_memory)
            hook = self.frame_hook
            on_frame = None if hook is None else (lambda f: hook(self.mode, f))
            self.sink = SinkServer(record_path=self.record_path, fsync=False, on_frame=on_frame)
            await self.sink.start()
            t_start = time.time_ns()
            bridge = await self._start_bridge()
            adapted, _ = await wait_adapted(
                bridge, self.s.initial_cpu, self.s.initial_memory, self.s.adapt_timeout_s
            )
            if adapted is None:
                raise RuntimeError("the bridge never planned for the initial limits")
            self.initial_tta_ms = round((adapted - t_start) / 1e6, 1)
            await self._connect_edges(bridge)
            await self._publish_and_resize(payloads)
            return await self._finish()
        finally:
            await self._cleanup()

    async def _connect_edges(self, bridge: BridgeChild) -> None:
        specs = [
            StreamConfig(f"lidar{i}", voxel_size=self.s.voxel_size)
            for i in range(self.s.streams_per_edge)
        ]
        if self.s.telemetry:
            specs.append(StreamConfig("telemetry", kind="telemetry"))
        for i in range(self.s.edges):
            transport = self.s.transport_of(i)
            url = bridge.url(transport)
            self.edges.append(
                EdgeClient(
                    transport,  # type: ignore[arg-type]
                    url,
                    f"edge-{i:03d}-{transport}",
                    specs,
                    resend_buffer_frames=1_000_000,
                    resend_buffer_bytes=8 << 30,
                    seed=self.s.seed + i,
                )
            )
        await asyncio.gather(*(e.start(timeout=30) for e in self.edges))

    async def _publish_and_resize(self, payloads: list[PreparedPayload]) -> None:
        loop = asyncio.get_running_loop()
        t0_mono = loop.time() + 0.1
        self.t0_ns = time.time_ns() + 100_000_000
        tasks = [
            asyncio.create_task(self._drive(i, e, t0_mono, payloads), name=f"drive-{i}")
            for i, e in enumerate(self.edges)
        ]
        resizer = asyncio.create_task(self._resize_plan(t0_mono), name="resize-plan")
        watcher = asyncio.create_task(self._watch(), name="watch")
        try:
            await asyncio.gather(*tasks)
            self.phase = "finishing resizes"
            await resizer
        finally:
            self.t_end_ns = self.t0_ns + int(self.s.duration_s * 1e9)
            for t in (*tasks, resizer):
                t.cancel()
            await asyncio.gather(*tasks, resizer, return_exceptions=True)
            self.phase = "draining"
            await asyncio.gather(*(e.wait_delivered(self.s.drain_s) for e in self.edges))
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
            self._sample_disconnects()

    async def _drive(
        self, index: int, edge: EdgeClient, t0_mono: float, payloads: list[PreparedPayload]
    ) -> None:
        loop = asyncio.get_running_loop()
        period = 1.0 / self.s.rate_hz
        stagger = index * period / len(self.edges)
        streams = [f"lidar{k}" for k in range(self.s.streams_per_edge)]
        dev = edge.device_id
        for tick in range(int(self.s.duration_s * self.s.rate_hz)):
            offset = stagger + tick * period
            delay = t0_mono + offset - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            scheduled_ns = self.t0_ns + int(offset * 1e9)
            for k, sid in enumerate(streams):
                cloud = payloads[(tick + k + index) % len(payloads)]
                seq = await edge.publish(sid, cloud, capture_time_ns=scheduled_ns)
                self.published.append((dev, sid, seq, scheduled_ns))
            if self.s.telemetry:
                values = {"tick": float(tick), "speed_mps": 5.0 + (tick % 10) / 10.0}
                seq = await edge.publish("telemetry", values, capture_time_ns=scheduled_ns)
                self.published.append((dev, "telemetry", seq, scheduled_ns))

    def _sample_disconnects(self) -> None:
        now = time.time_ns()
        total = sum(e.stats.disconnects for e in self.edges)
        while len(self.disconnects_ns) < total:
            self.disconnects_ns.append(now)

    async def _watch(self) -> None:
        """Disconnect times (20 ms resolution) and the progress display."""
        last_progress = 0.0
        while True:
            self._sample_disconnects()
            now = time.monotonic()
            if self.progress is not None and now - last_progress >= 0.25:
                last_progress = now
                self.progress(self.snapshot())
            await asyncio.sleep(0.02)

    def snapshot(self) -> dict[str, Any]:
        t = self.sink.record.totals() if self.sink else {}
        return {
            "mode": self.mode,
            "phase": self.phase,
            "elapsed_s": max(0.0, (time.time_ns() - self.t0_ns) / 1e9) if self.t0_ns else 0.0,
            "duration_s": self.s.duration_s,
            "published": len(self.published),
            "delivered": t.get("delivered", 0),
            "duplicates": t.get("duplicates", 0),
            "disconnects": len(self.disconnects_ns),
            "resizes_done": sum(1 for st in self.steps if st.applied is not None),
            "resizes": len(self.steps),
        }

    # -- the resize plan -------------------------------------------------------------------

    async def _resize_plan(self, t0_mono: float) -> None:
        loop = asyncio.get_running_loop()
        for rec in self.steps:
            delay = t0_mono + rec.step.at_s - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            self.phase = f"resize {rec.index + 1}/{len(self.steps)}: {rec.step.describe()}"
            try:
                if self.mode == "in-place":
                    await self._in_place(rec)
                else:
                    await self._restart(rec)
            except Exception as exc:  # recorded, and the run goes on: the report shows it
                rec.error = f"{type(exc).__name__}: {exc}"
            self.phase = "steady"

    async def _memory_target(self, step: ResizeStep) -> tuple[int | None, str]:
        """The step's memory limit and a note on how it was chosen. ``memory: usage``: below
        the current usage by what the bridge can give back (:func:`below_usage_target`)."""
        if not step.memory_below_usage:
            return step.memory, ""
        info: dict[str, Any] = {}
        if self.bridge is not None:
            with contextlib.suppress(OSError, TimeoutError, ValueError, IndexError):
                info = await self.bridge.resources()
        return below_usage_target(self.backend.usage(), info)

    async def _in_place(self, rec: StepRecord) -> None:
        assert self.bridge is not None
        memory, note = await self._memory_target(rec.step)
        next_at = self._next_at(rec)
        hold = min(self.s.hold_timeout_s, max(0.5, next_at - rec.step.at_s - 0.5))
        # Watch the plan while the node side works: for a held memory decrease the bridge
        # should plan for the lower limit *before* it is enacted (cooperative downscale).
        apply = asyncio.create_task(
            self.backend.apply(
                rec.step.cpu, memory, hold_timeout=hold, converge_timeout=self.s.adapt_timeout_s
            ),
            name="apply",
        )
        planned_cpu = None if memory is not None else rec.step.cpu
        rec.planned_ns, _ = await wait_adapted(
            self.bridge, planned_cpu, memory, hold + self.s.adapt_timeout_s
        )
        rec.applied = await apply
        if rec.step.memory_below_usage:
            rec.applied.notes.append(note)
        rec.adapted_ns, rec.plan = await wait_adapted(
            self.bridge, rec.step.cpu, memory, self.s.adapt_timeout_s
        )
        if rec.adapted_ns is None:
            rec.error = (
                f"bridge plan did not show the new limits within {self.s.adapt_timeout_s:g} s"
            )

    def _next_at(self, rec: StepRecord) -> float:
        if rec.index + 1 < len(self.steps):
            return self.steps[rec.index + 1].step.at_s
        return self.s.duration_s

    async def _restart(self, rec: StepRecord) -> None:
        """Evict and recreate: SIGTERM (drain), new limits, a new bridge on the same ports."""
        assert self.bridge is not None
        memory, _ = await self._memory_target(rec.step)
        applied = Applied(time.time_ns(), rec.step.cpu, memory, self.backend.usage())
        rec.applied = applied
        ports = self.bridge.ports
        code = await self.bridge.stop()
        rec.restart_exit_code = code
        self.bridge_exit_codes.append(code)
        self.backend.write_now(rec.step.cpu, memory)
        applied.written_ns = time.time_ns()
        bridge = await self._start_bridge(ports)
        rec.adapted_ns, rec.plan = await wait_adapted(
            bridge, rec.step.cpu, memory, self.s.adapt_timeout_s
        )

    # -- the end ---------------------------------------------------------------------------

    async def _finish(self) -> dict[str, Any]:
        self.phase = "accounting"
        edge_totals = edge_summary(self.edges)
        for e in self.edges:
            await e.close()
        # Let the bridge notice the closed connections before SIGTERM: its drain writes a Drain
        # message to every connection it still holds, and a write to a gRPC stream the client
        # has just cancelled raised out of shutdown once (exit 1; reported to the bridge owner).
        await asyncio.sleep(0.3)
        if self.bridge is not None:
            self.bridge_exit_codes.append(await self.bridge.stop())
            self.bridge = None
        assert self.sink is not None
        await self.sink.stop(grace=1.0)
        records = await asyncio.to_thread(read_record, self.record_path)
        windows = self.windows()
        results = phases.account(
            self.published,
            records,
            [*windows, phases.Window("overall", "overall", 0, 2**63 - 1)],
            publishing=(self.t0_ns, self.t_end_ns),
            disconnects_ns=self.disconnects_ns,
        )
        overall = results.pop()
        ttas = [
            d["time_to_adapt_ms"]
            for d in (st.as_dict(self.t0_ns) for st in self.steps)
            if d["time_to_adapt_ms"] is not None
        ]
        sink_totals = self.sink.record.totals()
        return {
            "mode": self.mode,
            "backend": self.backend_name,
            "cpu_throttle": self.backend.cpu_throttle,
            "clouds": self.cloud_note,
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.t0_ns / 1e9)),
            "duration_s": self.s.duration_s,
            "initial_adapt_ms": self.initial_tta_ms,
            "totals": {
                **{k: overall[k] for k in _TOTAL_KEYS},
                "disconnects": edge_totals["disconnects"],
                "reconnects": edge_totals["reconnects"],
                "resent": edge_totals["resent"],
                "undelivered_at_end": edge_totals["undelivered"],
            },
            "time_to_adapt_ms": ttas_summary(ttas),
            "phases": [
                {
                    **{k: v for k, v in r.items() if k not in ("start_ns", "end_ns")},
                    "start_s": round((r["start_ns"] - self.t0_ns) / 1e9, 4),
                    "end_s": round((r["end_ns"] - self.t0_ns) / 1e9, 4),
                }
                for r in results
            ],
            "resizes": [st.as_dict(self.t0_ns) for st in self.steps],
            "timeline": phases.timeline(
                self.published,
                records,
                start_ns=self.t0_ns,
                end_ns=max(self.t_end_ns + int(2e9), *(r.received_ns + 1 for r, _ in records)),
                disconnects_ns=self.disconnects_ns,
            ),
            "edges": edge_totals,
            "sink": {
                "totals": sink_totals,
                "record": str(self.record_path),
            },
            "bridge": {"exit_codes": self.bridge_exit_codes, "log": str(self.log_path)},
        }

    def windows(self) -> list[phases.Window]:
        """warmup, steady before, then per step its resize window and the steady after it."""
        t0 = self.t0_ns
        ws = [phases.Window("warmup", "warmup", t0 - 10**9, t0 + int(self.s.warmup_s * 1e9))]
        cursor = ws[0].end_ns
        label = "steady before"
        for rec in self.steps:
            a = rec.applied
            if a is None:
                continue
            start = max(cursor, a.requested_ns)
            stop = rec.adapted_ns
            if stop is None:  # never adapted: the window runs until the next step
                stop = t0 + int(self._next_at(rec) * 1e9)
            stop = max(stop, start + 1)
            ws.append(phases.Window(label, "steady", cursor, start))
            ws.append(phases.Window(f"resize {rec.index + 1}", "resize", start, stop))
            cursor = stop
            label = f"after resize {rec.index + 1}"
        ws.append(phases.Window(label, "steady", cursor, self.t_end_ns + 1))
        return [w for w in ws if w.end_ns > w.start_ns]

    async def _cleanup(self) -> None:
        for e in self.edges:
            with contextlib.suppress(Exception):
                await e.close()
        if self.bridge is not None:
            self.bridge.kill()
        if self.sink is not None:
            with contextlib.suppress(Exception):
                await self.sink.stop(grace=0)
        with contextlib.suppress(Exception):
            await self.backend.close()
        await asyncio.to_thread(_rmtree, self.tmp)


_TOTAL_KEYS = (
    "published",
    "delivered",
    "lost",
    "gap_frames",
    "duplicates",
    "reorders",
    "max_loss_burst",
    "latency_ms",
    "max_stall_s",
)


def _rmtree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


async def run_scenario(
    scenario: Scenario,
    out_dir: Path,
    *,
    backend: str = "local",
    baseline: str | None = None,
    real_cpu: bool = True,
    progress: ProgressFn | None = None,
    frame_hook: FrameHook | None = None,
) -> dict[str, Any]:
    """Run in place, then (unless the baseline is ``none``) the restart baseline; the report."""
    from loadgen.report import SCHEMA_VERSION, host_info

    baseline = baseline or scenario.baseline
    modes = ["in-place"] + (["restart"] if baseline == "restart" else [])
    stem = f"{scenario.name}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
    runs = []
    for mode in modes:
        run = Run(
            scenario,
            mode,
            out_dir,
            backend=backend,
            real_cpu=real_cpu,
            progress=progress,
            stem=stem,
            frame_hook=frame_hook,
        )
        runs.append(await run.execute())
    return {
        "schema_version": SCHEMA_VERSION,
        "stem": stem,
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "scenario": scenario.as_dict(),
        "host": host_info(),
        "runs": runs,
    }
