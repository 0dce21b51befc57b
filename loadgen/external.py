"""``simbridge-loadgen run --target URL``: drive a bridge that already runs elsewhere.

Why a mode of its own: in a cluster (the kind demo, deploy/kind/demo.sh) the bridge is a Pod and
its sink is whatever it pushes to, so there is no child process to start or restart and no sink
record to read. What this side can still measure honestly is what the bridge tells each edge:
frames acknowledged as delivered to the sink, frames left undelivered, reconnects, and latency from
the scheduled send time to the delivered ack. The scenario's resize steps (if any) go to the Pod
through ``kubectl patch pod --subresource resize`` against the *current* kubectl context (no
stand-in, nothing touched but that one Pod), each followed by ``kubectl get pod`` until its status
converged. ``memory: usage`` steps need the bridge's usage at that moment and are refused here.

Exit status (see :func:`loadgen.demo.run_command`): 0 when every published frame was acknowledged
as delivered and every resize converged, 1 otherwise.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
import urllib.parse
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bridge.resources.quantity import QuantityError, to_bytes, to_millicores
from loadgen.edge import EdgeClient, LoadStats, PreparedPayload, StreamConfig, Transport
from loadgen.resize import cpu_quantity, memory_quantity
from loadgen.scenario import ResizeStep, Scenario
from loadgen.steps import prepare_clouds

WS_PATH = "/v1/ingest"
ProgressFn = Callable[[dict[str, Any]], None]


@dataclass(frozen=True, slots=True)
class Target:
    """One ingest endpoint of the external bridge, in the form :class:`EdgeClient` takes."""

    transport: Transport
    address: str  # ws://host:port/v1/ingest, or host:port for gRPC

    def __str__(self) -> str:
        return self.address if self.transport == "ws" else f"grpc://{self.address}"


def parse_target(text: str) -> Target:
    """``ws://HOST:PORT[/path]`` (the path defaults to /v1/ingest) or ``grpc://HOST:PORT``."""
    url = urllib.parse.urlsplit(text)
    try:
        port = url.port
    except ValueError:
        port = None
    if url.scheme not in ("ws", "grpc") or not url.hostname or port is None:
        raise ValueError(
            f"--target must be ws://HOST:PORT[/path] or grpc://HOST:PORT, got {text!r}"
        )
    if url.scheme == "ws":
        return Target(
            "ws", f"ws://{url.netloc}{url.path if url.path not in ('', '/') else WS_PATH}"
        )
    if url.path not in ("", "/") or url.query:
        raise ValueError(f"a grpc:// target is HOST:PORT only, got {text!r}")
    return Target("grpc", url.netloc)


def check_scenario(s: Scenario) -> list[str]:
    """Why ``s`` cannot run against an external bridge (empty: it can)."""
    return [
        f"resizes[{i}]: 'memory: usage' needs the bridge's own usage; not available with --target"
        for i, step in enumerate(s.resizes)
        if step.memory_below_usage
    ]


def resize_patch(step: ResizeStep, container: str) -> dict[str, Any]:
    """Strategic-merge resize body: requests = limits for what the step changes (a Guaranteed
    pod stays Guaranteed)."""
    rl: dict[str, str] = {}
    if step.cpu is not None:
        rl["cpu"] = cpu_quantity(step.cpu)
    if step.memory is not None:
        rl["memory"] = memory_quantity(step.memory)
    res = {"requests": dict(rl), "limits": dict(rl)}
    return {"spec": {"containers": [{"name": container, "resources": res}]}}


class KubectlResizer:
    """Resizes one Pod with ``kubectl`` and the current context (namespace: ``namespace`` or the
    context's)."""

    def __init__(
        self, pod: str, *, namespace: str | None = None, container: str = "bridge"
    ) -> None:
        if shutil.which("kubectl") is None:
            raise RuntimeError("resizing an external bridge needs kubectl on PATH")
        self.pod = pod
        self.namespace = namespace
        self.container = container

    async def kubectl(self, *args: str) -> tuple[int, str]:
        ns = ("-n", self.namespace) if self.namespace else ()
        proc = await asyncio.create_subprocess_exec(
            "kubectl",
            *ns,
            *args,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            out, err = await asyncio.wait_for(proc.communicate(), 30)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            return 124, "kubectl timed out after 30 s"
        return proc.returncode or 0, out.decode() + err.decode()

    async def apply(self, step: ResizeStep, converge_timeout: float) -> dict[str, Any]:
        """PATCH the resize, then poll the Pod until it converged (or ``converge_timeout``)."""
        body = resize_patch(step, self.container)
        out: dict[str, Any] = {"at_s": step.at_s, "patch": body, "notes": []}
        t0 = time.monotonic()
        rc, text = await self.kubectl(
            *("patch", "pod", self.pod, "--subresource", "resize", "--type", "strategic"),
            *("-p", json.dumps(body)),
        )
        if rc != 0:
            out.update(converged=False, notes=[f"kubectl patch failed ({rc}): {text.strip()}"])
            return out
        while True:
            rc, text = await self.kubectl("get", "pod", self.pod, "-o", "json")
            waited = time.monotonic() - t0
            if rc == 0 and converged(json.loads(text), body):
                out.update(converged=True, converged_after_s=round(waited, 3))
                return out
            if waited > converge_timeout:
                note = text.strip()[-300:] if rc != 0 else "status did not converge"
                out.update(converged=False, notes=[f"after {waited:.1f} s: {note}"])
                return out
            await asyncio.sleep(0.2)


def _quantity(key: str, value: Any) -> int | None:
    try:
        return to_millicores(value) if key == "cpu" else to_bytes(value)
    except (QuantityError, TypeError, ValueError):
        return None


def converged(pod: dict[str, Any], body: dict[str, Any]) -> bool:
    """The kubelet saw the resize (observedGeneration) and finished it: no PodResizePending /
    PodResizeInProgress, and the container's actual resources equal what the body asked for."""
    meta, status = pod.get("metadata", {}), pod.get("status", {})
    if status.get("observedGeneration", 0) < meta.get("generation", 0):
        return False
    if any(
        c.get("type") in ("PodResizePending", "PodResizeInProgress")
        for c in status.get("conditions", [])
    ):
        return False
    (want_c,) = body["spec"]["containers"]
    have: dict[str, Any] = next(
        (
            c.get("resources", {})
            for c in status.get("containerStatuses", [])
            if c.get("name") == want_c["name"]
        ),
        {},
    )
    return all(
        _quantity(k, have.get(part, {}).get(k)) == _quantity(k, v)
        for part, rl in want_c["resources"].items()
        for k, v in rl.items()
    )


@dataclass
class ExternalRun:
    """One run of ``scenario`` against ``targets`` (edge i uses ``targets[i % len(targets)]``)."""

    scenario: Scenario
    targets: list[Target]
    resizer: KubectlResizer | None = None
    progress: ProgressFn | None = None
    connect_timeout_s: float = 30.0
    edges: list[EdgeClient] = field(default_factory=list)
    resizes: list[dict[str, Any]] = field(default_factory=list)
    late_ticks: int = 0

    async def execute(self) -> dict[str, Any]:
        s = self.scenario
        problems = check_scenario(s)
        if s.resizes and self.resizer is None:
            problems.append("the scenario resizes: give --pod (kubectl, current context)")
        if problems:
            raise ValueError("; ".join(problems))
        payloads, note = await asyncio.to_thread(prepare_clouds, s)
        run_id = uuid.uuid4().hex[:6]  # fresh device ids: no session of an earlier run resumes
        specs = [
            StreamConfig(f"lidar{i}", voxel_size=s.voxel_size) for i in range(s.streams_per_edge)
        ]
        if s.telemetry:
            specs.append(StreamConfig("telemetry", kind="telemetry"))
        for i in range(s.edges):
            t = self.targets[i % len(self.targets)]
            self.edges.append(
                EdgeClient(
                    t.transport,
                    t.address,
                    f"loadgen-{run_id}-{i:03d}-{t.transport}",
                    specs,
                    seed=s.seed + i,
                )
            )
        started = time.time_ns()
        try:
            await asyncio.gather(*(e.start(timeout=self.connect_timeout_s) for e in self.edges))
            loop = asyncio.get_running_loop()
            t0 = loop.time() + 0.05
            t0_wall = time.time_ns() + 50_000_000
            resize_task = asyncio.create_task(self._resize_plan(t0), name="resize-plan")
            try:
                await asyncio.gather(
                    *(self._drive(i, e, t0, t0_wall, payloads) for i, e in enumerate(self.edges))
                )
                await resize_task
            finally:
                resize_task.cancel()
                await asyncio.gather(resize_task, return_exceptions=True)
            await asyncio.gather(*(e.wait_delivered(s.drain_s) for e in self.edges))
        finally:
            await asyncio.gather(*(e.close() for e in self.edges), return_exceptions=True)
        return self.report(started, note)

    async def _drive(
        self, index: int, edge: EdgeClient, t0: float, t0_wall: int, payloads: list[PreparedPayload]
    ) -> None:
        s, loop = self.scenario, asyncio.get_running_loop()
        period = 1.0 / s.rate_hz
        stagger = index * period / len(self.edges)
        for tick in range(int(s.duration_s * s.rate_hz)):
            offset = stagger + tick * period
            lag = loop.time() - (t0 + offset)
            if lag < 0:
                await asyncio.sleep(-lag)
            elif lag > period:
                self.late_ticks += 1
            scheduled_ns = t0_wall + int(offset * 1e9)
            for k in range(s.streams_per_edge):
                cloud = payloads[(tick + k + index) % len(payloads)]
                await edge.publish(f"lidar{k}", cloud, capture_time_ns=scheduled_ns)
            if s.telemetry:
                values = {"tick": float(tick), "speed_mps": 5.0 + (tick % 10) / 10.0}
                await edge.publish("telemetry", values, capture_time_ns=scheduled_ns)
            if self.progress is not None and index == 0 and tick % max(1, int(s.rate_hz)) == 0:
                self.progress(self.snapshot(tick / s.rate_hz))

    async def _resize_plan(self, t0: float) -> None:
        loop = asyncio.get_running_loop()
        for step in self.scenario.resizes:
            assert self.resizer is not None
            delay = t0 + step.at_s - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            self.resizes.append(await self.resizer.apply(step, self.scenario.adapt_timeout_s))

    def snapshot(self, elapsed_s: float) -> dict[str, Any]:
        return {
            "mode": "external",
            "phase": "publishing",
            "elapsed_s": elapsed_s,
            "duration_s": self.scenario.duration_s,
            "published": sum(e.stats.published for e in self.edges),
            "delivered": sum(e.stats.acked_delivered for e in self.edges),
            "duplicates": 0,
            "disconnects": sum(e.stats.disconnects for e in self.edges),
            "resizes_done": len(self.resizes),
            "resizes": len(self.scenario.resizes),
        }

    def report(self, started_ns: int, cloud_note: str) -> dict[str, Any]:
        total = LoadStats()
        for e in self.edges:
            total.add(e.stats)
        totals = total.as_dict()
        totals["undelivered"] = sum(e.core.buffered_frames for e in self.edges)
        totals["late_ticks"] = self.late_ticks
        ok = totals["undelivered"] == 0 and all(r.get("converged") for r in self.resizes)
        return {
            "mode": "external",
            "ok": ok,
            "targets": [str(t) for t in self.targets],
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started_ns / 1e9)),
            "scenario": self.scenario.as_dict(),
            "clouds": cloud_note,
            "edges": [
                {"device": e.device_id, "transport": e.transport, "url": e.url} for e in self.edges
            ],
            "totals": totals,
            "resizes": self.resizes,
        }


def format_report(rep: dict[str, Any]) -> str:
    t, lat = rep["totals"], rep["totals"]["latency"]
    latency = (
        f"p50 {lat['p50_ms']:.1f} ms, p99 {lat['p99_ms']:.1f} ms, max {lat['max_ms']:.1f} ms"
        if lat.get("count")
        else "no samples"
    )
    lines = [
        f"external bridge {', '.join(rep['targets'])}: {len(rep['edges'])} edges",
        f"published {t['published']}, delivered (acked) {t['acked_delivered']}, "
        f"undelivered {t['undelivered']}, resent {t['resent']}, disconnects {t['disconnects']}, "
        f"reconnects {t['reconnects']}, late ticks {t['late_ticks']}",
        f"latency scheduled send -> delivered ack: {latency}",
    ]
    for r in rep["resizes"]:
        state = f"converged after {r['converged_after_s']} s" if r.get("converged") else "FAILED"
        lines.append(f"resize @{r['at_s']:g}s: {state} {' '.join(r['notes'])}".rstrip())
    lines.append("OK" if rep["ok"] else "NOT OK: frames undelivered or a resize did not converge")
    return "\n".join(lines)
