"""One process count of ``make bench-scale`` (:mod:`benchmarks.scale.cli`): N ``simbridge serve
--reuse-port`` processes on one port pair, the relay benchmark's closed-loop clients and sink in
this process, and the CPU of every thread of every process, cut at the measured window.

Reused from the relay benchmark (:mod:`benchmarks.relay.cli`): the process group (shared ports, each
process with its own push stream to the sink), the sink (watermark first, cumulative acks; every
arrival routed to its connection, order and exactly-once checked) and the clients (``window``
frames in flight per connection, a sink arrival releases the next send). What this adds: a
decimating workload (the relay's clients declare passthrough streams), CPU split per thread
(event loop = each process's main thread; ``other`` = every other thread: decimation workers,
gRPC's I/O threads), the generator's own loop CPU, and affinity pinning.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.relay.cli import ServerGroup
from benchmarks.relay.clients import GrpcClient, Payload, WsClient, bridge_encoder
from benchmarks.relay.common import DRAIN_TIMEOUT, Cell
from bridge.v1 import bridge_pb2 as pb
from loadgen.clouds import lidar_xyzi
from loadgen.resize import rss_bytes

TICK = os.sysconf("SC_CLK_TCK")
CLOUD_POINTS = 100_000
VOXEL = 0.2
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
    """Sum of one metric's samples on a bridge's /metrics; NaN when it does not answer."""
    try:
        async with asyncio.timeout(2):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /metrics HTTP/1.0\r\nHost: bench\r\n\r\n")
            body = (await reader.read()).decode(errors="replace")
            writer.close()
    except (OSError, TimeoutError):
        return float("nan")
    total = 0.0
    for line in body.splitlines():
        if line.startswith(name) and line[len(name) : len(name) + 1] in (" ", "{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


@dataclass
class Snapshot:
    t_ns: int
    loops: list[float]  # per bridge process, main thread
    others: list[float]  # per bridge process, every other thread
    gen_loop: float  # this process's main thread
    gen_total: float  # this process, all threads
    busy: float  # the machine
    decimate: float = 0.0  # seconds in the decimation kernel, all processes (their /metrics)

    @classmethod
    async def take(cls, pids: Sequence[int], http_ports: Sequence[int] = ()) -> Snapshot:
        spent = await asyncio.gather(*(metric_sum(p, DECIMATE_SUM) for p in http_ports))
        split = [thread_cpu(p) for p in pids]
        gen_loop, _ = thread_cpu(os.getpid())
        times = os.times()
        return cls(
            time.time_ns(),
            [s[0] for s in split],
            [s[1] for s in split],
            gen_loop,
            times.user + times.system,
            machine_busy_seconds(),
            sum(spent),
        )


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
    bridge_cores: float  # the bridge processes' CPU, in cores
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
        loop_cores_max=max(loops, default=0.0) / window,
        loop_share=[round(v / loop_total, 3) if loop_total else 0.0 for v in loops],
        gen_loop_cores=gen_loop,
        gen_cores=gen_cores,
        gen_us_per_frame=_per_frame(b.gen_total - a.gen_total, frames),
        machine_cores=machine,
        rest_cores=max(0.0, machine - bridge_cores - gen_cores),
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
    idle_rss: list[int]
    idle_pss: list[int]
    end_rss: list[int] = field(default_factory=list)


def cpu_list(cpus: Sequence[int]) -> str:
    return ",".join(str(c) for c in sorted(cpus))


def pin_threads(pid: int, cpus: Sequence[int]) -> None:
    """Every thread of ``pid`` onto ``cpus`` (threads started later inherit it)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        os.sched_setaffinity(int(task.name), cpus)


class ScaleGroup:
    """N bridge processes sharing their ports (``--reuse-port``) pushing to ``sink``, pinned to
    ``cpus`` (``taskset``; or ``sched_setaffinity`` on every thread after the start)."""

    def __init__(self, sink: Any, procs: int, workers: int, cpus: Sequence[int]) -> None:
        self.sink = sink
        self.procs = procs
        self.workers = workers
        self.cpus = sorted(cpus)
        args = [
            *("--no-passthrough", "--voxel-size", str(VOXEL)),
            *("--workers", str(workers)),
        ]
        self.group = ServerGroup(sink.address, args, procs)
        taskset = shutil.which("taskset")
        self._pin_after = taskset is None
        if taskset is not None:
            for server in self.group.servers:
                server.cmd = [taskset, "-c", cpu_list(self.cpus), *server.cmd]

    @property
    def pids(self) -> list[int]:
        return [s.child.proc.pid for s in self.group.servers if s.child is not None]

    async def __aenter__(self) -> ScaleGroup:
        before = self.sink.bridge_streams
        try:
            await self.group.spawn()
            await self.group.wait_ready()
            if self._pin_after:
                for pid in self.pids:
                    pin_threads(pid, self.cpus)
            deadline = time.monotonic() + 30
            while self.sink.bridge_streams < before + self.procs:
                if time.monotonic() > deadline:
                    raise RuntimeError("the bridge processes did not connect to the sink in 30 s")
                await asyncio.sleep(0.02)
        except BaseException:
            await self.group.stop()
            raise
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.group.stop()

    def info(self, rnd: int) -> GroupInfo:
        return GroupInfo(
            round=rnd,
            procs=self.procs,
            workers=self.workers,
            bridge_cpus=self.cpus,
            idle_rss=[rss_bytes(p) for p in self.pids],
            idle_pss=[pss_bytes(p) for p in self.pids],
        )

    @property
    def http_ports(self) -> list[int]:
        return [s.ports["http"] for s in self.group.servers if "http" in s.ports]

    def address(self, transport: str) -> str:
        return f"127.0.0.1:{self.group.ports[transport]}"


async def run_cell(
    rnd: int,
    group: ScaleGroup,
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
    pids = group.pids
    http = group.http_ports
    a = b = await Snapshot.take(pids)
    try:
        await asyncio.gather(*(c.open(group.address(transport)) for c in clients))
        senders = [asyncio.create_task(c.send_loop(stop)) for c in clients]
        await asyncio.sleep(warmup)
        a = await Snapshot.take(pids, http)
        await asyncio.sleep(seconds)
        b = await Snapshot.take(pids, http)
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
    return cell_result(rnd, group.procs, workload, transport, cell, a, b, errors)
