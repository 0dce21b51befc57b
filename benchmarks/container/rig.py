"""The bridge in a real container, resized live: the rig behind ``make e2e-container`` and
``make bench-memory``.

Why a real container: the product's promise is "resize my pod in place and I adapt without
loss". Only a real cgroup shows what the kernel does when the limit moves under a running bridge
(reclaim, OOM kill); the file-based stand-ins only announce limits. ``podman update --cpus
--memory`` is the same ``runc update`` that the kubelet's CRI ``UpdateContainerResources`` ends in.

What runs where (all on this host, ``--network host``, 127.0.0.1):
  * the bridge: ``simbridge serve`` in the image built from the Dockerfile (cpu target), started
    with ``--cpus``/``--memory`` and explicit rlimits, reading its real cgroup inside the container;
  * the reference sink and the publisher: ``simbridge-loadgen sink`` / ``publish`` as child
    processes of the host (the load generator's own summaries give lost / duplicate /
    disconnect counts);
  * this process: resizes (:class:`Resizer`: ``podman update`` directly, or a resize PATCH to the
    Kubernetes stand-in whose kubelet applies it with ``podman update``) and samples every 100 ms:
    the container's cgroup from the host (limit, usage, OOM counters), the bridge's RSS
    (``/proc/PID/status``) and the bridge's ``/metrics`` (the limits it reports, its budget).

Only containers named ``simbridge-e2e-*`` and labelled ``simbridge-e2e`` are created or removed,
and every exit path removes them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.container.probe import (
    ULIMITS,
    cgroup_anon,
    free_ports,
    http_get,
    kernel_oom_kills,
    parse_metrics,
    process_rss,
    round_up,
)
from benchmarks.container.resize import Resizer
from bridge.resources.from_settings import memory_headroom_bytes as governor_headroom
from loadgen.kubesim_podman import ContainerCgroup, Podman, PodmanError

MiB = 1 << 20
LABEL = "simbridge-e2e"
SAMPLE_S = 0.1
MIN_BUDGET = 16 * MiB  # the least data budget a "working-set" step leaves the governor
REPO = Path(__file__).resolve().parents[2]


# ----------------------------------------------------------------------------- steps and samples


@dataclass(frozen=True, slots=True)
class Step:
    """One resize. ``memory`` is bytes, ``"working-set"`` (just above the peak usage of the last
    seconds: what is left after the cooperative shrink) or ``None`` (unchanged); ``cpu`` is cores
    or ``None``."""

    label: str
    cpu: float | None
    memory: int | str | None
    hold_s: float = 8.0


@dataclass(slots=True)
class Sample:
    t: float  # seconds since the rig started sampling
    rss: int  # anonymous + shmem RSS of the bridge (see process_rss)
    usage: int
    limit: int | None
    cpu: float | None
    metrics: dict[str, float]
    vmrss: int = 0
    cg_anon: int = 0  # anonymous memory charged to the container's cgroup (memory.stat)


@dataclass(slots=True)
class StepResult:
    index: int
    label: str
    started_t: float
    target_cpu: float
    target_memory: int
    cgroup_cpu: float | None = None
    cgroup_memory: int | None = None
    seen_cpu: float | None = None
    seen_memory: float | None = None
    seen_after_ms: float | None = None  # resize call done → the bridge reports the cgroup values
    match: bool = False
    resize_ms: float = 0.0  # the resize call itself (podman update / PATCH until converged)
    notes: list[str] = field(default_factory=list)


#: Fresh ports and another start when the container could not bind one (see start_bridge).
PORT_RETRIES = 2

# ----------------------------------------------------------------------------- the rig


@dataclass(frozen=True, slots=True)
class Load:
    """Per transport: one publisher process (edges x streams at rate_hz, clouds of ``points``)."""

    transports: tuple[str, ...] = ("ws", "grpc")
    edges: int = 1
    streams_per_edge: int = 2
    rate_hz: float = 10.0
    points: int = 25_000


@dataclass(slots=True)
class RigConfig:
    image: str
    cpu: float
    memory: int
    load: Load = field(default_factory=Load)
    warmup_s: float = 6.0
    ws_margin: int = 64 * MiB  # "working-set" steps: peak usage + this, rounded up to 4 MiB
    max_frame_bytes: int = 4 * MiB
    env: dict[str, str] = field(default_factory=dict)
    extra_args: tuple[str, ...] = ()  # more `simbridge serve` flags
    processes: str = "1"  # a single bridge's limits and RSS are checked; pod_steps runs "auto"


class ContainerRig:
    """One bridge container + sink + publisher; :meth:`run` drives the steps and samples."""

    scrape_every_s = SAMPLE_S  # a pod's /metrics merges every process's: scraped less often

    def __init__(self, cfg: RigConfig, podman: Podman | None = None, tag: str = "run") -> None:
        self.cfg = cfg
        self.podman = podman or Podman()
        self.name = f"{LABEL}-{tag}-{os.getpid()}"
        self.ports = dict(zip(("ws", "grpc", "http"), free_ports(3), strict=True))
        self.samples: list[Sample] = []
        self.steps: list[StepResult] = []
        self.pid = 0
        self.cgroup: ContainerCgroup | None = None
        self.started_at = ""
        self.scrape_errors = 0
        self._metrics: dict[str, float] = {}  # the latest /metrics scrape
        self.load_ended_t: float | None = None
        self.died_t: float | None = None  # when the harness found the container gone
        self._t0 = 0.0
        self._procs: list[asyncio.subprocess.Process] = []
        self._sink_proc: asyncio.subprocess.Process | None = None
        self._sink_addr = ""
        self._cur_cpu, self._cur_mem = cfg.cpu, cfg.memory
        self.sink_report: dict[str, Any] = {}
        self.publish_report: dict[str, Any] = {}
        self.final_inspect: dict[str, Any] = {}
        self.oom_start: dict[str, int] = {}
        self.oom_end: dict[str, int] = {}  # the last counters read (the cgroup may vanish)
        self.kernel_ooms: list[str] = []
        self.container_id = ""

    def now(self) -> float:
        return time.monotonic() - self._t0

    # ------------------------------------------------------------------ processes

    async def _spawn(self, *argv: str) -> asyncio.subprocess.Process:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        self._procs.append(proc)
        return proc

    @staticmethod
    def _loadgen(*args: str) -> list[str]:
        main = "from loadgen.cli import main; raise SystemExit(main())"
        return [sys.executable, "-c", main, *args]

    async def start_sink(self, listen: str = "127.0.0.1:0", record: Path | None = None) -> None:
        """The reference sink; with ``record`` it writes every frame's metadata there (JSON
        lines, ``received_ns`` included)."""
        extra = ["--record", str(record)] if record is not None else []
        proc = await self._spawn(
            *self._loadgen("sink", "--listen", listen, "--no-fsync", "--json", *extra)
        )
        self._sink_proc = proc
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
        if not line.startswith("sink listening on "):
            raise RuntimeError(f"sink did not start: {line!r}")
        self._sink_addr = line.split()[-1]

    async def start_bridge(self) -> None:
        """Start the container and wait until it is ready. Its ports were picked free, but with
        ``--network host`` another process may bind one before the bridge does (seen in a CI run
        while other tests ran): then fresh ports are picked and it starts again, up to
        :data:`PORT_RETRIES` times."""
        for attempt in range(PORT_RETRIES + 1):
            if await self._start_bridge_once():
                break
            if attempt == PORT_RETRIES:
                raise RuntimeError(
                    f"bridge ports taken {PORT_RETRIES + 1} times:\n{await self.logs()}"
                )
            self.ports = dict(zip(("ws", "grpc", "http"), free_ports(3), strict=True))
        state = await self.podman.inspect(self.name)
        self.pid = int(state["State"]["Pid"])
        self.container_id = str(state["Id"])
        self.started_at = str(state["State"]["StartedAt"])
        self.cgroup = ContainerCgroup.of_pid(self.pid)
        self.oom_start = self.cgroup.oom_counters()

    async def _start_bridge_once(self) -> bool:
        """Run the container and wait for ``/readyz``; False when it exited because one of its
        ports was taken."""
        await self.podman.remove(self.name)
        env_args: list[str] = []
        for k, v in self.cfg.env.items():
            env_args += ["--env", f"{k}={v}"]
        await self.podman.run(
            "run",
            "--detach",
            "--name",
            self.name,
            "--label",
            f"{LABEL}=1",
            "--label",
            f"{LABEL}.owner={os.getpid()}",
            "--network",
            "host",
            "--cpus",
            f"{self.cfg.cpu:g}",
            "--memory",
            f"{self.cfg.memory}b",
            "--memory-swap",
            f"{self.cfg.memory}b",
            "--log-driver",
            "k8s-file",
            *ULIMITS,
            *env_args,
            self.cfg.image,
            "--host",
            "127.0.0.1",
            "--ws-port",
            str(self.ports["ws"]),
            "--grpc-port",
            str(self.ports["grpc"]),
            "--http-port",
            str(self.ports["http"]),
            "--sink-address",
            self._sink_addr,
            "--max-frame-bytes",
            str(self.cfg.max_frame_bytes),
            "--log-format",
            "json",
            "--processes",
            self.cfg.processes,
            *self.cfg.extra_args,
        )
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(OSError, TimeoutError, ValueError, IndexError):
                if (await http_get(self.ports["http"], "/readyz"))[0] == 200:
                    return True
            if not (await self.podman.inspect(self.name))["State"]["Running"]:
                logs = await self.logs()
                if "address already in use" in logs:
                    return False
                raise RuntimeError(f"bridge exited before it was ready:\n{logs}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"bridge not ready in 60 s:\n{await self.logs()}")
            await asyncio.sleep(0.2)

    async def logs(self, tail: int = 40) -> str:
        """The bridge's last log lines: ``podman logs`` replays the container's stderr (where
        the bridge logs) on its own stderr, so both streams are read."""
        proc = await asyncio.create_subprocess_exec(
            *self.podman.base,
            "logs",
            "--tail",
            str(tail),
            self.name,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), 30)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            return "podman logs timed out"
        return out.decode(errors="replace")

    async def start_publisher(
        self, transport: str, duration_s: float, tag: str = ""
    ) -> asyncio.subprocess.Process:
        """``tag`` tells this publisher's devices apart from another's on the same transport."""
        ld = self.cfg.load
        target = (
            ["--ws", f"ws://127.0.0.1:{self.ports['ws']}/v1/ingest"]
            if transport == "ws"
            else ["--grpc", f"127.0.0.1:{self.ports['grpc']}"]
        )
        return await self._spawn(
            *self._loadgen(
                "publish",
                *target,
                "--edges",
                str(ld.edges),
                "--streams-per-edge",
                str(ld.streams_per_edge),
                "--rate",
                str(ld.rate_hz),
                "--points",
                str(ld.points),
                "--duration",
                f"{duration_s:.1f}",
                "--drain-timeout",
                "60",
                "--device-prefix",
                f"{self.name}-{transport}{tag}",
                "--json",
            )
        )

    @staticmethod
    async def _json_output(proc: asyncio.subprocess.Process, what: str) -> dict[str, Any]:
        try:
            out, err = await asyncio.wait_for(proc.communicate(), 120)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
            raise RuntimeError(f"{what} gave no summary within 120 s") from None
        text = out.decode()
        start = text.find("{")
        if proc.returncode not in (0,) or start < 0:
            raise RuntimeError(f"{what} exited {proc.returncode}: {text[-2000:]}{err.decode()}")
        rep: dict[str, Any] = json.loads(text[start:])
        return rep

    async def _publish(self, duration_s: float, tag: str = "") -> dict[str, Any]:
        """One publisher per transport; their summaries added up (``by_transport`` keeps each)."""
        transports = self.cfg.load.transports
        procs = [(t, await self.start_publisher(t, duration_s, tag)) for t in transports]
        reps = [(t, await self._json_output(p, f"publisher ({t})")) for t, p in procs]
        total: dict[str, Any] = {"by_transport": dict(reps)}
        for key in (
            "published",
            "undelivered",
            "dropped_resend_overflow",
            "disconnects",
            "reconnects",
            "connect_failures",
        ):
            total[key] = sum(int(r.get(key, 0)) for _, r in reps)
        total["pauses"] = sum(int(r.get("pauses", 0)) for _, r in reps)
        return total

    # ------------------------------------------------------------------ sampling

    async def scrape(self) -> dict[str, float]:
        status, body = await http_get(self.ports["http"], "/metrics")
        if status != 200:
            raise ValueError(f"/metrics answered {status}")
        return parse_metrics(body)

    def _cg_values(self) -> tuple[int, int | None, float | None]:
        assert self.cgroup is not None
        return (
            self.cgroup.memory_usage(),
            self.cgroup.memory_limit(),
            self.cgroup.cpu_limit_cores(),
        )

    async def _scrape_loop(self) -> None:
        """Keeps ``_metrics`` at the bridge's latest ``/metrics`` (every 100 ms at most); a
        scrape that fails leaves the last one. Its own task: a bridge whose event loop stalls
        answers late, and the cgroup samples must not wait for it."""
        while True:
            t = time.monotonic()
            try:
                self._metrics = await self.scrape()
            except (OSError, TimeoutError, ValueError, IndexError):
                self.scrape_errors += 1
            await asyncio.sleep(max(0.0, t + self.scrape_every_s - time.monotonic()))

    async def _sample_loop(self) -> None:
        """Every 100 ms: the cgroup (limit, usage, anon, OOM counters), the bridge's RSS, and
        the latest scraped metrics."""
        scraper = asyncio.ensure_future(self._scrape_loop())
        try:
            await self._sample_cgroup()
        finally:
            scraper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await scraper

    async def _sample_cgroup(self) -> None:
        next_t = time.monotonic()
        while True:
            try:
                usage, limit, cpu = self._cg_values()
            except OSError:
                usage = -1
            if usage < 0 or not self.alive():
                self._died()
                return  # the container is gone: the final checks say why
            anon, vmrss = self.rss_now()
            try:
                assert self.cgroup is not None
                cg_anon = cgroup_anon(self.cgroup.memory_dir, self.cgroup.version)
            except (OSError, ValueError):
                cg_anon = 0
            self.samples.append(
                Sample(self.now(), anon, usage, limit, cpu, dict(self._metrics), vmrss, cg_anon)
            )
            with contextlib.suppress(OSError, ValueError):
                self.oom_end = self.cgroup.oom_counters() if self.cgroup else {}
            next_t += SAMPLE_S
            await asyncio.sleep(max(0.0, next_t - time.monotonic()))

    def rss_now(self) -> tuple[int, int]:
        """(anonymous + shmem RSS, VmRSS) that a sample records: the bridge's main process here;
        a pod's rig (:mod:`benchmarks.container.pod_rig`) sums every process of the container."""
        return process_rss(self.pid)

    def baseline_rss(self) -> int:
        """The bridge's resident set when it came up, as the governor measures its baseline
        (``/proc/self/statm``: VmRSS, shared file pages included): the first nonzero sample."""
        return next((s.vmrss for s in self.samples if s.vmrss > 0), 0)

    def working_set(self, window_s: float = 3.0) -> int:
        """Peak of RSS and cgroup usage over the last ``window_s`` seconds."""
        now = self.now()
        recent = [max(s.rss, s.usage) for s in self.samples if s.t >= now - window_s]
        return max(recent) if recent else 0

    # ------------------------------------------------------------------ steps

    def working_set_limit(self) -> int:
        """A "working-set" step's limit: just above the working set (``ws_margin``), but never
        below what the memory governor needs for a data budget at all (startup baseline + its
        fixed headroom + a small budget): below that the bridge rightly admits nothing and the
        step would only measure a stall."""
        governor_floor = self.baseline_rss() + governor_headroom(self.cfg.max_frame_bytes)
        return round_up(
            max(self.working_set() + self.cfg.ws_margin, governor_floor + MIN_BUDGET), 4 * MiB
        )

    async def _apply(self, i: int, step: Step, resizer: Resizer) -> StepResult:
        cpu = step.cpu if step.cpu is not None else self._cur_cpu
        mem: int
        if step.memory == "working-set":
            mem = self.working_set_limit()
        elif isinstance(step.memory, int):
            mem = step.memory
        else:
            mem = self._cur_mem
        res = StepResult(i, step.label, self.now(), cpu, mem)
        t = time.monotonic()
        try:
            res.notes += await resizer.resize(cpu, mem)
        except (PodmanError, RuntimeError, OSError) as e:
            res.notes.append(f"resize failed: {e}")
        res.resize_ms = (time.monotonic() - t) * 1000
        self._cur_cpu, self._cur_mem = cpu, mem
        await self._await_seen(res)
        return res

    async def _await_seen(self, res: StepResult, timeout: float = 10.0) -> None:  # noqa: ASYNC109
        """Until the bridge's reported limits equal the cgroup's (read from the host)."""
        t0 = time.monotonic()
        while True:
            try:
                _, res.cgroup_memory, res.cgroup_cpu = self._cg_values()
            except OSError:
                res.notes.append("the container is gone (its cgroup was removed)")
                return
            with contextlib.suppress(OSError, TimeoutError, ValueError, IndexError):
                m = await self.scrape()
                res.seen_cpu = m.get("bridge_limit_cpu_cores")
                res.seen_memory = m.get("bridge_limit_memory_bytes")
            if _equal(res.seen_cpu, res.cgroup_cpu) and _equal(res.seen_memory, res.cgroup_memory):
                res.match = True
                res.seen_after_ms = (time.monotonic() - t0) * 1000
                return
            if time.monotonic() - t0 > timeout:
                res.notes.append(f"bridge still reports other limits after {timeout:.0f} s")
                return
            await asyncio.sleep(0.05)

    # ------------------------------------------------------------------ the run

    async def run(
        self,
        steps: list[Step],
        resizer_factory: Callable[[ContainerRig], Awaitable[Resizer]],
        before_bridge: Callable[[ContainerRig], Awaitable[None]] | None = None,
    ) -> None:
        """Sink → (``before_bridge``) → bridge → publisher + sampler → steps → reports."""
        self._t0 = time.monotonic()
        await self.start_sink()
        if before_bridge is not None:
            await before_bridge(self)
        await self.start_bridge()
        resizer = await resizer_factory(self)
        sampler = asyncio.ensure_future(self._sample_loop())
        duration = self.cfg.warmup_s + sum(s.hold_s for s in steps) + 4.0
        pub_result = asyncio.ensure_future(self._publish(duration))
        try:
            await asyncio.sleep(self.cfg.warmup_s)
            for i, step in enumerate(steps, 1):
                t_step = time.monotonic()
                self.steps.append(await self._apply(i, step, resizer))
                while self.died_t is None and time.monotonic() - t_step < step.hold_s:
                    if not self.alive():
                        self._died()
                    await asyncio.sleep(0.2)
                if self.died_t is not None:
                    break
            try:
                self.publish_report = await pub_result
            except RuntimeError as e:
                self.publish_report = {"error": str(e)[-500:]}
            self.load_ended_t = self.now()
            await asyncio.sleep(1.0)  # the last acks and samples
        finally:
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler
            if not pub_result.done():
                pub_result.cancel()
        await self.collect_end()
        self.sink_report = await self.stop_sink()

    async def collect_end(self) -> None:
        """What the run's end is judged by: podman's last inspect, the cgroup's OOM counters
        and the kernel's OOM kills of this container."""
        with contextlib.suppress(PodmanError):
            self.final_inspect = await self.podman.inspect(self.name)
        if self.cgroup is not None:
            with contextlib.suppress(OSError, ValueError):
                self.oom_end = self.cgroup.oom_counters()
        self.kernel_ooms = await asyncio.to_thread(kernel_oom_kills, self.container_id)

    async def stop_sink(self) -> dict[str, Any]:
        """SIGTERM to the sink; its JSON summary."""
        sink = self._sink_proc
        assert sink is not None
        if sink.returncode is None:
            sink.send_signal(signal.SIGTERM)
        return await self._json_output(sink, "sink")

    def alive(self) -> bool:
        """The bridge process (the container's PID 1) and its cgroup still exist."""
        return (
            self.cgroup is not None
            and os.path.exists(f"/proc/{self.pid}")
            and self.cgroup.memory_dir.exists()
        )

    def _died(self) -> None:
        """The bridge is gone: the edges would only retry it, so they are stopped (their
        summaries are lost; the checks fail on the death itself)."""
        if self.died_t is not None:
            return
        self.died_t = self.now()
        for proc in self._procs:
            if proc is self._sink_proc or proc.returncode is not None:
                continue
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)

    async def close(self) -> None:
        """Every exit path: children killed, the container removed."""
        for proc in self._procs:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(proc.wait(), 5)
        await self.podman.remove(self.name)


def _equal(a: float | None, b: float | None) -> bool:
    if a is None:
        return False
    if b is None:
        return a == float("inf")
    return abs(a - b) <= 1e-6 * max(1.0, abs(b))
