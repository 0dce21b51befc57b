"""One process count of ``make bench-scale`` (:mod:`benchmarks.scale.cli`): one real pod
(``simbridge serve --processes N``: the supervisor and its N ingest processes,
:mod:`benchmarks.scale.pod`), the relay benchmark's closed-loop clients and sink in this process,
and the CPU of every thread of every process, cut at the measured window.

Reused from the relay benchmark (:mod:`benchmarks.relay.cli`): the sink (watermark first,
cumulative acks; every arrival routed to its connection, order and exactly-once checked) and the
clients (``window`` frames in flight per connection, a sink arrival releases the next send).
What this adds: a decimating workload (the relay's clients declare passthrough streams), CPU
split per thread (event loop = each ingest process's main thread; ``other`` = every other
thread: decimation workers, gRPC's I/O threads), the loops' wake-ups, the supervisor's CPU
apart, the generator's own loop CPU, and affinity pinning.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.relay.clients import GrpcClient, Payload, WsClient, bridge_encoder
from benchmarks.relay.common import DRAIN_TIMEOUT, Cell
from benchmarks.relay.sink import BenchSink
from benchmarks.scale.connects import ConnectTimes
from benchmarks.scale.pod import VOXEL, PodGroup, http_get
from bridge.v1 import bridge_pb2 as pb
from loadgen.clouds import lidar_xyzi
from loadgen.resize import rss_bytes

TICK = os.sysconf("SC_CLK_TCK")
CLOUD_POINTS = 100_000
#: The generator's event loop busy this share of one core or more: it, not the bridge, may have
#: set the pace (its rows are lower bounds).
GEN_LOOP_LAGGED = 0.85


@dataclass(frozen=True)
class Workload:
    """One cell kind: what each frame carries and how the bridge treats its stream."""

    name: str
    payload: Payload
    decimate: bool
    conns: int
    window: int

    def hello(self, device: str) -> bytes:
        spec = pb.StreamSpec(
            stream_id="cloud",
            kind=pb.POINT_CLOUD,
            passthrough=not self.decimate,
            voxel_size=VOXEL if self.decimate else 0.0,
        )
        return pb.EdgeMessage(hello=pb.Hello(device_id=device, streams=[spec])).SerializeToString()


def lidar_payload(points: int = CLOUD_POINTS) -> Payload:
    """A lidar-like scan (loadgen's synthetic sensor) as xyz float32: the cloud a voxel grid
    thins the way it thins real scans (bench-capacity's cloud, without the intensity)."""
    xyz = np.frombuffer(lidar_xyzi(points, seed=31).data, "<f4").reshape(-1, 4)[:, :3]
    cloud = np.ascontiguousarray(xyz).tobytes()
    wire = len(bridge_encoder(cloud)(1, time.time_ns()))
    return Payload(f"{points // 1000}k-cloud", cloud, b"", wire)


def workloads(cloud_conns: int, small_conns: int) -> dict[str, Workload]:
    return {
        "cloud": Workload("cloud", lidar_payload(), True, cloud_conns, 2),
        "1KB": Workload("1KB", Payload.build("1KB", 1024), False, small_conns, 8),
    }


class ScaleWsClient(WsClient):
    def __init__(self, cell: Cell, index: int, workload: Workload) -> None:
        super().__init__(cell, cell.conns[index], workload.payload, bridge=True)
        self.workload = workload

    def hello(self) -> bytes:
        return self.workload.hello(self.cell.device_id(self.conn.index))


class ScaleGrpcClient(GrpcClient):
    def __init__(self, cell: Cell, index: int, workload: Workload) -> None:
        super().__init__(cell, cell.conns[index], workload.payload, bridge=True)
        self.workload = workload

    def hello(self) -> bytes:
        return self.workload.hello(self.cell.device_id(self.conn.index))


# -- CPU -------------------------------------------------------------------------------------


def thread_cpu(pid: int) -> tuple[float, float]:
    """(main thread, every other thread) CPU seconds of ``pid``; (nan, nan) once it is gone."""
    main = other = 0.0
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return float("nan"), float("nan")
    for task in tasks:
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the thread ended
        seconds = (int(fields[11]) + int(fields[12])) / TICK
        if int(task.name) == pid:
            main += seconds
        else:
            other += seconds
    return main, other


def loop_switches(pid: int) -> tuple[int, int]:
    """(voluntary, involuntary) context switches of the main thread (the event loop): it went to
    sleep in epoll with nothing to do / the kernel took the core from it for another thread.
    Per frame, the first says how many frames a loop handles per wake-up, the second how often
    it was preempted (cores shared with the other loops, the workers, the generator)."""
    counts = {"voluntary_ctxt_switches": 0, "nonvoluntary_ctxt_switches": 0}
    try:
        for line in Path(f"/proc/{pid}/task/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in counts:
                counts[key] = int(value)
    except (OSError, ValueError):
        pass
    return counts["voluntary_ctxt_switches"], counts["nonvoluntary_ctxt_switches"]


def process_cpu(pid: int | None) -> float:
    """Every thread of ``pid``, CPU seconds, at the scheduler's nanosecond resolution
    (/proc/PID/task/*/schedstat) where the kernel keeps it, else in clock ticks (10 ms: too coarse
    for a process that idles); 0 for None."""
    if pid is None:
        return 0.0
    total = 0
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
        for task in tasks:
            with contextlib.suppress(FileNotFoundError, ProcessLookupError):
                total += int((task / "schedstat").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        main, other = thread_cpu(pid)
        return main + other
    return total / 1e9


def machine_busy_seconds() -> float:
    """Busy CPU seconds of the whole machine so far (all CPUs, steal included)."""
    try:
        ticks = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    except (OSError, ValueError):
        return float("nan")
    return (sum(ticks) - ticks[3] - ticks[4]) / TICK


def pss_bytes(pid: int) -> int:
    """Proportional set size (shared pages split between the processes mapping them): what one
    more process really adds is nearer this than its RSS. 0 where unreadable."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


DECIMATE_SUM = "bridge_decimation_seconds_sum"


async def metric_sum(port: int, name: str) -> float:
    """Sum of one metric's samples on the pod's merged /metrics (counters and histograms summed
    over the processes); NaN when it does not answer."""
    status, body = await http_get(port, "/metrics", timeout=5)
    if status != 200:
        return float("nan")
    total = 0.0
    for line in body.splitlines():
        if line.startswith(name) and line[len(name) : len(name) + 1] in (" ", "{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


@dataclass
class Snapshot:
    t_ns: int
    loops: list[float]  # per ingest process, main thread
    others: list[float]  # per ingest process, every other thread
    wakeups: int  # the ingest processes' loops' voluntary switches, summed
    preempted: int  # their involuntary switches, summed
    supervisor: float  # the supervisor, all threads
    gen_loop: float  # this process's main thread
    gen_total: float  # this process, all threads
    busy: float  # the machine
    acks: int  # SinkAcks the bench's sink sent so far (every push stream)
    pushes: int  # push messages it read so far
    decimate: float = 0.0  # seconds in the decimation kernel, all processes (/metrics)

    @classmethod
    def take(cls, pids: Sequence[int], supervisor: int | None, sink: Any = None) -> Snapshot:
        """CPU only: the /metrics scrape is taken outside the window (:meth:`with_decimate`),
        so its cost (the processes' renders, the supervisor's merge) is in no row."""
        split = [thread_cpu(p) for p in pids]
        switches = [loop_switches(p) for p in pids]
        gen_loop, _ = thread_cpu(os.getpid())
        times = os.times()
        return cls(
            time.time_ns(),
            [s[0] for s in split],
            [s[1] for s in split],
            sum(v for v, _ in switches),
            sum(i for _, i in switches),
            process_cpu(supervisor),
            gen_loop,
            times.user + times.system,
            machine_busy_seconds(),
            getattr(sink, "acks_sent", 0),
            getattr(sink, "push_messages", 0),
        )


class ScaleSink(BenchSink):
    """The relay benchmark's sink, also counting the push messages it reads (each a batch of
    frames): frames per message says how well each process batches its pushes."""

    def __init__(self) -> None:
        super().__init__()
        self.push_messages = 0

    async def _bridge_push(self, requests: Any, context: Any, *, batched: bool = False) -> None:
        await super()._bridge_push(self._counted(requests), context, batched=batched)

    async def _counted(self, requests: Any) -> AsyncIterator[bytes]:
        async for raw in requests:
            self.push_messages += 1
            yield raw


# -- cells -----------------------------------------------------------------------------------


@dataclass
class CellResult:
    round: int
    procs: int
    workload: str
    transport: str
    conns: int
    window: int
    wire_bytes: int
    seconds: float
    frames: int  # arrivals at the sink inside the measured window
    frames_per_s: float
    loop_us_per_frame: float  # every process's event loop, summed, per frame
    other_us_per_frame: float  # every other bridge thread (workers, gRPC I/O), per frame
    decimate_us_per_frame: float  # workers' wall time decimating + encoding (/metrics), per frame
    bridge_cores: float  # the ingest processes' CPU, in cores
    supervisor_cores: float  # the supervisor's CPU, in cores (not in loop/other)
    supervisor_us_per_frame: float
    wakeups_per_kframe: float  # the loops' wake-ups (voluntary switches) per 1000 frames
    preempted_per_kframe: float  # the loops' involuntary switches per 1000 frames
    sink_acks_per_kframe: float  # SinkAcks the processes read per 1000 frames (all streams)
    frames_per_push: float  # frames per push message the sink read (the processes' batching)
    loop_cores_max: float  # the busiest process's loop, in cores (1.0 = that loop is full)
    loop_share: list[float]  # each process's share of the loop CPU (the kernel's spread)
    gen_loop_cores: float  # the generator's event loop (clients + sink), in cores
    gen_cores: float  # the generator process, all threads
    gen_us_per_frame: float
    machine_cores: float  # everything busy on the machine, in cores
    rest_cores: float  # the machine minus the bridge and the generator: others' work, noise
    gen_lagged: bool
    sent: int
    completed: int
    pauses: int
    errors: list[str] = field(default_factory=list)


def _per_kframe(count: int, frames: int) -> float:
    return 1e3 * count / frames if frames > 0 else float("nan")


def _per_frame(cpu_s: float, frames: int) -> float:
    return 1e6 * cpu_s / frames if frames > 0 else float("nan")


def cell_result(
    rnd: int,
    procs: int,
    workload: Workload,
    transport: str,
    cell: Cell,
    a: Snapshot,
    b: Snapshot,
    errors: list[str],
) -> CellResult:
    window = (b.t_ns - a.t_ns) / 1e9 or float("nan")  # nan: the cell failed before measuring
    frames = sum(1 for t in cell.arrivals if a.t_ns <= t < b.t_ns)
    loops = [y - x for x, y in zip(a.loops, b.loops, strict=True)]
    supervisor = b.supervisor - a.supervisor
    others = [y - x for x, y in zip(a.others, b.others, strict=True)]
    loop_total = sum(loops)
    gen_loop = (b.gen_loop - a.gen_loop) / window
    bridge_cores = (loop_total + sum(others)) / window
    gen_cores = (b.gen_total - a.gen_total) / window
    machine = (b.busy - a.busy) / window
    return CellResult(
        round=rnd,
        procs=procs,
        workload=workload.name,
        transport=transport,
        conns=workload.conns,
        window=workload.window,
        wire_bytes=workload.payload.wire_bytes,
        seconds=round(window, 3),
        frames=frames,
        frames_per_s=frames / window,
        loop_us_per_frame=_per_frame(loop_total, frames),
        other_us_per_frame=_per_frame(sum(others), frames),
        decimate_us_per_frame=_per_frame(b.decimate - a.decimate, frames),
        bridge_cores=bridge_cores,
        supervisor_cores=supervisor / window,
        supervisor_us_per_frame=_per_frame(supervisor, frames),
        wakeups_per_kframe=_per_kframe(b.wakeups - a.wakeups, frames),
        preempted_per_kframe=_per_kframe(b.preempted - a.preempted, frames),
        sink_acks_per_kframe=_per_kframe(b.acks - a.acks, frames),
        frames_per_push=frames / (b.pushes - a.pushes) if b.pushes > a.pushes else float("nan"),
        loop_cores_max=max(loops, default=0.0) / window,
        loop_share=[round(v / loop_total, 3) if loop_total else 0.0 for v in loops],
        gen_loop_cores=gen_loop,
        gen_cores=gen_cores,
        gen_us_per_frame=_per_frame(b.gen_total - a.gen_total, frames),
        machine_cores=machine,
        rest_cores=max(0.0, machine - bridge_cores - supervisor / window - gen_cores),
        gen_lagged=gen_loop >= GEN_LOOP_LAGGED,
        sent=cell.sent,
        completed=cell.completed,
        pauses=sum(c.backpressure for c in cell.conns),
        errors=errors,
    )


# -- one process count -----------------------------------------------------------------------


@dataclass
class GroupInfo:
    round: int
    procs: int
    workers: int  # decimation workers per process
    bridge_cpus: list[int]
    supervisor_pid: int | None
    pids: list[int]  # the ingest processes, from the pod's /debug/resources
    plan: str  # the plan's reason for N (/debug/resources)
    idle_rss: list[int]  # per ingest process, before the first cell
    idle_pss: list[int]
    supervisor_idle_rss: int
    idle_cores: list[float]  # each ingest process's CPU with no edge (background tasks), cores
    supervisor_idle_cores: float
    end_rss: list[int] = field(default_factory=list)  # after the last cell
    supervisor_end_rss: int = 0
    connects: ConnectTimes | None = None
    exit_code: int | None = None  # the pod's, after SIGTERM (0: every process delivered all)


async def group_info(group: PodGroup, rnd: int, idle_seconds: float = 1.0) -> GroupInfo:
    """Memory and the background CPU of a pod with no edge, measured over ``idle_seconds``."""
    sup = group.supervisor_pid
    before = [process_cpu(p) for p in group.pids], process_cpu(sup)
    t0 = time.monotonic()
    await asyncio.sleep(idle_seconds)
    after = [process_cpu(p) for p in group.pids], process_cpu(sup)
    elapsed = time.monotonic() - t0
    return GroupInfo(
        round=rnd,
        procs=group.procs,
        workers=group.workers,
        bridge_cpus=group.cpus,
        supervisor_pid=sup,
        pids=list(group.pids),
        plan=group.plan_reason(),
        idle_rss=[rss_bytes(p) for p in group.pids],
        idle_pss=[pss_bytes(p) for p in group.pids],
        supervisor_idle_rss=rss_bytes(sup) if sup else 0,
        idle_cores=[round((y - x) / elapsed, 4) for x, y in zip(before[0], after[0], strict=True)],
        supervisor_idle_cores=round((after[1] - before[1]) / elapsed, 4),
    )


def end_memory(info: GroupInfo, group: PodGroup) -> None:
    info.end_rss = [rss_bytes(p) for p in group.pids]
    sup = group.supervisor_pid
    info.supervisor_end_rss = rss_bytes(sup) if sup else 0


async def run_cell(
    rnd: int,
    group: PodGroup,
    number: int,
    workload: Workload,
    transport: str,
    warmup: float,
    seconds: float,
) -> CellResult:
    """One closed-loop cell against the group; every frame sent must reach the sink once, in
    order (else the result lists errors)."""
    sink = group.sink
    cell = Cell(number, workload.conns, workload.window)
    cell.register()
    kind = ScaleWsClient if transport == "ws" else ScaleGrpcClient
    clients = [kind(cell, i, workload) for i in range(workload.conns)]
    errors: list[str] = []
    sink.cell = cell
    stop = asyncio.Event()
    senders: list[asyncio.Task[None]] = []
    pids, sup = group.pids, group.supervisor_pid
    a = b = Snapshot.take(pids, sup, sink)
    try:
        await asyncio.gather(*(c.open(group.address(transport)) for c in clients))
        senders = [asyncio.create_task(c.send_loop(stop)) for c in clients]
        await asyncio.sleep(warmup)
        decimate_a = await metric_sum(group.http_port, DECIMATE_SUM)  # outside the window
        a = Snapshot.take(pids, sup, sink)
        await asyncio.sleep(seconds)
        b = Snapshot.take(pids, sup, sink)
        decimate_b = await metric_sum(group.http_port, DECIMATE_SUM)
        a.decimate, b.decimate = decimate_a, decimate_b
        stop.set()
        deadline = time.monotonic() + DRAIN_TIMEOUT
        while cell.completed < cell.sent or not all(t.done() for t in senders):
            if time.monotonic() > deadline:
                errors.append(f"{cell.sent - cell.completed} of {cell.sent} frames never arrived")
                break
            await asyncio.sleep(0.01)
    except Exception as exc:  # a failed cell is reported, the run goes on
        errors.append(f"{type(exc).__name__}: {exc}")
    finally:
        stop.set()
        for task in senders:
            task.cancel()
        await asyncio.gather(*senders, return_exceptions=True)
        closed = await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)
        errors += [f"close: {type(e).__name__}: {e}" for e in closed if e is not None]
        await asyncio.sleep(0.05)
        sink.cell = None
    for conn in cell.conns:
        errors += conn.errors
    if cell.stray:
        errors.append(f"{cell.stray} arrivals from unknown connections")
    errors += await group.check_processes()
    return cell_result(rnd, group.procs, workload, transport, cell, a, b, errors)
