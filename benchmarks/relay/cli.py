"""Bridge relay vs the raw transport (``make bench-relay`` = ``python -m benchmarks.relay.cli``).

What it answers: how much throughput and latency the bridge's passthrough path costs compared with
the least any relay must do, measured side by side in one run on the same machine
(docs/design.md §6).
Target: bridge/raw msgs/s >= 0.6 at 1.2 MB.

Targets (each relay is its own process; load clients and the sink share this one):

- ``raw-ws`` / ``raw-grpc``: :mod:`benchmarks.relay.servers`, a relay that forwards each received
  WebSocket / gRPC message's bytes over one ``grpc.aio`` stream to the sink. No protocol, no acks.
  The clients send opaque messages of the same wire size as the bridge's, with the send time, the
  connection and the sequence number in the first 16 bytes.
- ``bridge-ws`` / ``bridge-grpc``: ``python -m bridge.cli serve --passthrough --no-adapt`` pushing
  to the sink. The clients speak the real protocol (Hello/Welcome, Frames with a point cloud of
  ``size`` bytes of xyz float32, reading and discarding every Ack/FlowControl); the sink speaks
  the real sink protocol (watermark SinkAck first, then cumulative acks every 16 frames or after
  2 ms without any) and takes the edge's timestamp from ``capture_time_ns``.

Load model: closed loop. Each connection keeps at most ``--window`` messages sent but not yet
arrived at the sink; a sink arrival releases the next send. So msgs/s is the relay's capacity at
that concurrency, and latency (send → arrival at the sink, both stamped with ``time.time_ns()``)
includes the queueing that the window allows: by Little's law p50 ≈ conns * window / rate once the
relay is the bottleneck. Compare latencies between targets of the same cell, not across cells.

Process layout (2-core machines): the relay runs alone; the clients and the sink share this process
and event loop. That keeps the closed loop exact (a sink arrival releases the window directly, no
cross-process signal) and gives raw and bridge the same client and sink costs. With 2 cores a
third process for the sink would only oversubscribe the CPUs.

CPU columns (% of one core over the measured window, from /proc): ``relay`` is the relay or bridge
process, ``us/msg`` its CPU time per message (its cost, which stays meaningful when something else
limits the rate), ``bench`` this process, ``other`` the rest of the machine. When the relay is near
100 % it is the bottleneck and the ratio is the relay's; when ``bench`` is, the load side limits
and a raw rate is only a lower bound (the footer says so); a large ``other`` means the machine was
busy and the row is noise. The environment passes through to every process: glibc's malloc
settings (``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``) change the 1.2 MB results a lot,
so the header and the JSON record them.

Each cell runs ``--warmup`` seconds (first touch of memory is slow here; docs/design.md §6), then
``--seconds``; msgs/s is the median of the per-slice rates over the measured window (robust to a
GC pause or a page-fault storm), MB/s follows from the wire size. Every cell ends with an exact
accounting: the clients stop, every message sent must arrive at the sink exactly once and in order
per connection, else the cell lists errors (and the process exits 1).

The cells run interleaved (for each size and concurrency: every target), all relays staying up
the whole run, so slow drift of the machine hits all targets alike. Ratios are bridge/raw msgs/s
for the same transport, size and concurrency.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.relay.clients import GrpcClient, Payload, WsClient
from benchmarks.relay.common import (
    BATCH_MAX_BYTES,
    CONNS,
    DRAIN_TIMEOUT,
    MAX_FRAME_BYTES,
    QUICK_CONNS,
    QUICK_SIZES,
    ROOT,
    SIZES,
    TARGETS,
    BenchConfig,
    Cell,
    CellResult,
    scan_processed,
)
from benchmarks.relay.group import reserve_shared_ports, shared_port_args, spread_line
from benchmarks.relay.output import (
    attach_ratios,
    format_report,
    format_row,
    report_footer,
    report_header,
    summarize,
    write_json,
)
from benchmarks.relay.sink import BenchSink
from loadgen.launch import READY, ChildProcess
from loadgen.resize import rss_bytes

__all__ = [
    "CONNS",
    "SIZES",
    "TARGETS",
    "Bench",
    "BenchConfig",
    "CellResult",
    "format_report",
    "main",
    "run",
    "scan_processed",
]

# -- relay processes -------------------------------------------------------------------------


class ServerProcess:
    """A relay or the bridge as a child process (:mod:`loadgen.launch`), with its CPU time."""

    def __init__(self, name: str, cmd: list[str], ready_prefix: str) -> None:
        self.name = name
        self.cmd = cmd
        self.ready_prefix = ready_prefix
        self.child: ChildProcess | None = None

    @property
    def ports(self) -> dict[str, int]:
        return self.child.ports if self.child is not None else {}

    async def spawn(self) -> None:
        self.child = ChildProcess.spawn(
            self.cmd, name=self.name, env={"BRIDGE_ADAPT": "false"}, cwd=ROOT
        )

    async def wait_ready(self) -> None:
        """Read the one ready line (``NAME_READY key=port ...``) and keep its ports."""
        assert self.child is not None
        await self.child.wait_ready(self.ready_prefix, timeout=60)

    def logs(self) -> str:
        return self.child.logs() if self.child is not None else ""

    def cpu_seconds(self) -> float:
        """User + system CPU of the process (all threads), from /proc/PID/stat."""
        assert self.child is not None
        return self.child.cpu_seconds()

    async def stop(self) -> None:
        if self.child is not None:
            await self.child.stop(timeout=30)


class ServerGroup:
    """``--bridge-procs N``: N bridge processes on one port pair, used as one relay target
    (shared ports, CPU summed; :mod:`benchmarks.relay.group`)."""

    def __init__(self, sink: str, extra: Sequence[str], procs: int) -> None:
        self._held, (ws, grpc_port) = reserve_shared_ports(2)
        self.ports = {"ws": ws, "grpc": grpc_port}
        shared = shared_port_args(ws, grpc_port)
        self.servers = [bridge_process(sink, [*extra, *shared]) for _ in range(procs)]
        self.cpu_at_start: list[float] = []

    async def spawn(self) -> None:
        for server in self.servers:
            await server.spawn()

    async def wait_ready(self) -> None:
        try:
            await asyncio.gather(*(s.wait_ready() for s in self.servers))
        finally:
            self._release_ports()
        self.cpu_at_start = self.cpu_by_process()

    def _release_ports(self) -> None:
        for s in self._held:
            s.close()
        self._held = []

    def cpu_by_process(self) -> list[float]:
        return [s.cpu_seconds() for s in self.servers]

    def cpu_seconds(self) -> float:
        return sum(self.cpu_by_process())

    def spread(self) -> str:
        cpu = [b - a for a, b in zip(self.cpu_at_start, self.cpu_by_process(), strict=True)]
        pids = [s.child.proc.pid for s in self.servers if s.child is not None]
        return spread_line(cpu, [rss_bytes(pid) for pid in pids])

    def logs(self) -> str:
        return "\n".join(s.logs() for s in self.servers)

    async def stop(self) -> None:
        self._release_ports()
        await asyncio.gather(*(s.stop() for s in self.servers), return_exceptions=True)


def bridge_process(sink: str, extra: Sequence[str] = ()) -> ServerProcess:
    cmd = [
        *(sys.executable, "-m", "bridge.cli", "serve", "--host", "127.0.0.1"),
        "--processes=1",  # one bridge process per server (--bridge-procs starts several)
        *("--ws-port", "0", "--grpc-port", "0", "--http-port", "0"),
        *("--passthrough", "--no-adapt", "--sink-address", sink),
        *("--max-frame-bytes", str(MAX_FRAME_BYTES)),
        # Each cell connects new devices; their detached sessions would otherwise keep a share of
        # the ring budget for 5 minutes and shrink the rings of later cells.
        *("--session-ttl-seconds", "1", "--log-level", "WARNING"),
        *extra,
    ]
    return ServerProcess("bridge", cmd, READY)


def raw_relay_process(kind: str, sink: str) -> ServerProcess:
    cmd = [sys.executable, "-m", "benchmarks.relay.servers", kind, "--sink", sink]
    cmd += ["--max-bytes", str(MAX_FRAME_BYTES + 64 * 1024)]
    return ServerProcess(f"raw-{kind}", cmd, "RELAY_READY")


# -- cells -----------------------------------------------------------------------------------


class Bench:
    """Owns the sink and the relay processes for one run; runs cells against them."""

    def __init__(self, config: BenchConfig, progress: Callable[[CellResult], None] | None = None):
        self.config = config
        self.progress = progress or (lambda _result: None)
        self.sink = BenchSink()
        self.servers: dict[str, ServerProcess | ServerGroup] = {}
        self._cells = 0
        self._stray_seen = 0

    async def __aenter__(self) -> Bench:
        # Children are forked before this process starts any gRPC thread (the sink), which gRPC's
        # fork handlers would otherwise complain about; they find the sink once it listens.
        self.sink.reserve_port()
        wanted = {"bridge" if t.startswith("bridge") else t for t in self.config.targets}
        procs = self.config.bridge_procs
        makers: dict[str, Callable[[], ServerProcess | ServerGroup]] = {
            "bridge": lambda: (
                ServerGroup(self.sink.address, self.config.bridge_args, procs)
                if procs > 1
                else bridge_process(self.sink.address, self.config.bridge_args)
            ),
            "raw-ws": lambda: raw_relay_process("ws", self.sink.address),
            "raw-grpc": lambda: raw_relay_process("grpc", self.sink.address),
        }
        self.servers = {name: makers[name]() for name in sorted(wanted)}
        try:
            for server in self.servers.values():
                await server.spawn()
            await self.sink.start()
            await asyncio.gather(*(s.wait_ready() for s in self.servers.values()))
            await self._wait_for_sink_streams()
        except BaseException:
            await self.__aexit__()
            raise
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await asyncio.gather(*(s.stop() for s in self.servers.values()), return_exceptions=True)
        await self.sink.stop()

    async def _wait_for_sink_streams(self) -> None:
        """Every relay's (and the bridge's) stream to the sink is up before the first cell."""
        need_bridge = self.config.bridge_procs if "bridge" in self.servers else 0
        need_raw = sum(name.startswith("raw") for name in self.servers)
        deadline = time.monotonic() + 30
        while (self.sink.bridge_streams < need_bridge) or (self.sink.raw_streams < need_raw):
            if time.monotonic() > deadline:
                raise RuntimeError("relays did not connect to the sink within 30 s")
            await asyncio.sleep(0.02)

    def _address(self, target: str) -> tuple[ServerProcess | ServerGroup, str]:
        if target.startswith("bridge"):
            server = self.servers["bridge"]
            port = server.ports["ws" if target.endswith("ws") else "grpc"]
        else:
            server = self.servers[target]
            port = server.ports["port"]
        return server, f"127.0.0.1:{port}"

    async def run_all(self) -> list[CellResult]:
        """Every cell, interleaved by (size, conns); raw before bridge so each bridge row knows
        its ratio as soon as it is measured."""
        results: list[CellResult] = []
        payloads = {name: Payload.build(name, SIZES[name]) for name in self.config.sizes}
        targets = [t for t in TARGETS if t in self.config.targets]
        for size in self.config.sizes:
            for conns in self.config.conns:
                for target in targets:
                    batched = target.startswith("bridgeB")
                    if batched and payloads[size].wire_bytes * self.config.batch > BATCH_MAX_BYTES:
                        continue  # batches are for small frames (the SDK sends big ones alone)
                    result = await self.run_cell(target, payloads[size], conns)
                    results.append(result)
                    attach_ratios(results)
                    self.progress(result)
        return results

    async def run_cell(self, target: str, payload: Payload, conns: int) -> CellResult:
        cfg = self.config
        self._cells += 1
        batch = cfg.batch if target.startswith("bridgeB") else 1
        cell = Cell(self._cells, conns, cfg.window * batch)
        cell.register()
        server, address = self._address(target)
        kind = WsClient if target.endswith("ws") else GrpcClient
        bridge = target.startswith("bridge")
        clients = [kind(cell, c, payload, bridge=bridge, batch=batch) for c in cell.conns]
        errors: list[str] = []
        if self.sink.stray > self._stray_seen:
            errors.append(f"{self.sink.stray - self._stray_seen} messages arrived between cells")
            self._stray_seen = self.sink.stray
        self.sink.cell = cell
        stop = asyncio.Event()
        senders: list[asyncio.Task[None]] = []
        t0 = t1 = 0
        cpu: dict[str, float] = {}
        try:
            await asyncio.gather(*(c.open(address) for c in clients))
            senders = [asyncio.create_task(c.send_loop(stop)) for c in clients]
            await asyncio.sleep(cfg.warmup)
            before, t0 = _cpu_seconds(server), time.time_ns()
            await asyncio.sleep(cfg.seconds)
            after, t1 = _cpu_seconds(server), time.time_ns()
            cpu = {k: 100 * (after[k] - before[k]) / ((t1 - t0) / 1e9) for k in before}
            stop.set()
            errors += await self._drain(cell, senders)
        except Exception as exc:  # a failed cell is reported, the run goes on
            errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            stop.set()
            for task in senders:
                task.cancel()
            await asyncio.gather(*senders, return_exceptions=True)
            closed = await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)
            errors += [f"close: {type(e).__name__}: {e}" for e in closed if e is not None]
            await asyncio.sleep(0.05)  # anything still arriving is counted as stray
            self.sink.cell = None
        for conn in cell.conns:
            errors += conn.errors
        if cell.stray:
            errors.append(f"{cell.stray} arrivals from unknown connections")
        return summarize(target, payload, cell, cfg, t0, t1, cpu, errors)

    async def _drain(self, cell: Cell, senders: list[asyncio.Task[None]]) -> list[str]:
        """After stop: every sent message must reach the sink (closed loop: the senders return
        once their in-flight messages arrive)."""
        deadline = time.monotonic() + DRAIN_TIMEOUT
        while cell.completed < cell.sent or not all(t.done() for t in senders):
            if time.monotonic() > deadline:
                return [f"{cell.sent - cell.completed} of {cell.sent} messages never arrived"]
            await asyncio.sleep(0.01)
        return []


def _cpu_seconds(server: ServerProcess | ServerGroup) -> dict[str, float]:
    """CPU seconds so far of the relay, of this process and of everything else on the machine
    (busy time from /proc/stat, steal included, minus the two)."""
    times = os.times()
    own = times.user + times.system
    relay = server.cpu_seconds()
    try:
        ticks = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
        busy = (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")  # minus idle, iowait
    except (OSError, ValueError, IndexError):
        busy = float("nan")
    return {"relay": relay, "own": own, "other": busy - relay - own}


# -- command line ----------------------------------------------------------------------------


def _csv(kind: Callable[[str], Any], choices: Sequence[Any] | None = None) -> Any:
    def parse(text: str) -> list[Any]:
        values = [kind(v) for v in text.split(",") if v]
        bad = [v for v in values if choices is not None and v not in choices]
        if bad or not values:
            raise argparse.ArgumentTypeError(f"choose from {', '.join(map(str, choices or []))}")
        return values

    return parse


def parse_args(argv: Sequence[str] | None) -> tuple[BenchConfig, Path | None]:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.relay.cli",
        description="Bridge (passthrough) vs raw WebSocket/gRPC relays: msgs/s, MB/s, latency.",
    )
    parser.add_argument("--seconds", type=float, default=3.0, help="measured seconds per cell")
    parser.add_argument("--warmup", type=float, default=1.0, help="warm-up seconds per cell")
    parser.add_argument("--window", type=int, default=8, help="in-flight messages per connection")
    parser.add_argument(
        "--batch", type=int, default=16, help="frames per message in the bridgeB-* cells"
    )
    parser.add_argument("--sizes", type=_csv(str, list(SIZES)), help="e.g. 1KB,1.2MB")
    parser.add_argument("--conns", type=_csv(int), help="e.g. 1,32")
    parser.add_argument("--targets", type=_csv(str, TARGETS), help=f"of {','.join(TARGETS)}")
    parser.add_argument(
        "--quick", action="store_true", help="smoke matrix: 1KB and 1.2MB, 1 connection"
    )
    parser.add_argument("--json", type=Path, metavar="PATH", help="write the results here")
    parser.add_argument(
        "--bridge-arg",
        action="append",
        default=[],
        metavar="FLAG",
        help="extra simbridge serve flag, repeatable: --bridge-arg=--ack-interval-seconds=0.01",
    )
    parser.add_argument(
        "--bridge-procs",
        type=int,
        default=1,
        metavar="N",
        help="run the bridge as N processes sharing its ports (--reuse-port; docs/scaling.md)",
    )
    ns = parser.parse_args(argv)
    if ns.seconds <= 0 or ns.warmup < 0 or ns.window < 1 or ns.batch < 2 or ns.bridge_procs < 1:
        parser.error(
            "--seconds > 0, --warmup >= 0, --window >= 1, --batch >= 2, --bridge-procs >= 1 please"
        )
    cfg = BenchConfig(
        seconds=ns.seconds,
        warmup=ns.warmup,
        window=ns.window,
        batch=ns.batch,
        bridge_args=ns.bridge_arg,
        bridge_procs=ns.bridge_procs,
    )
    if ns.quick:
        cfg.sizes, cfg.conns = QUICK_SIZES, QUICK_CONNS
    cfg.sizes = ns.sizes or cfg.sizes
    cfg.conns = ns.conns or cfg.conns
    cfg.targets = ns.targets or cfg.targets
    return cfg, ns.json


async def run(
    cfg: BenchConfig, progress: Callable[[CellResult], None] | None = None
) -> list[CellResult]:
    async with Bench(cfg, progress) as bench:
        results = await bench.run_all()
        group = bench.servers.get("bridge")
        if isinstance(group, ServerGroup):
            print(group.spread(), flush=True)
        return results


def main(argv: Sequence[str] | None = None) -> int:
    cfg, json_path = parse_args(argv)
    print(report_header(cfg), flush=True)
    previous: list[tuple[str, int]] = []

    def progress(result: CellResult) -> None:
        if previous and previous[-1] != (result.size, result.conns):
            print()
        previous.append((result.size, result.conns))
        print(format_row(result), flush=True)

    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        results = asyncio.run(run(cfg, progress))
    else:  # the bridge runs on uvloop too; the ceilings in docs/design.md §6 were measured with it
        results = uvloop.run(run(cfg, progress))
    print()
    print(report_footer(results))
    if json_path is not None:
        write_json(json_path, results, cfg)
    return 1 if any(r.errors for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
