"""``make bench-overload``: a bridge under 0.5x to 4x the load it can process.

Per transport: a saturating run measures capacity (delivered clouds/s), then offered loads at
0.5, 1, 2 and 4 times it. One bridge child (voxel-decimated 100k-point lidar, a small ring so
backpressure engages, an in-process reference sink), the open-loop publisher spread over
processes (``loadgen.procs``) so the generator is not the bottleneck. Printed per cell:
delivered/s and its ratio to capacity, latency p50/p99 of delivered (admitted) frames, the
longest stall (no delivery while publishing), edge-side drops, loss inside the bridge (accepted
but never delivered, plus ring evictions), PAUSEs, bridge and generator CPU, and whether the
generator kept its schedule. Cells are short: the timings are noisy on a shared machine.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from loadgen.aio import run_async
from loadgen.launch import ChildProcess, serve_command
from loadgen.procs import publish_procs
from loadgen.sink import SinkServer

POINTS = 100_000
VOXEL = 0.2
MiB = 1024 * 1024
#: Per edge; above what the bridge holds per connection (ring, WebSocket queue), so what the
#: edges drop are frames never sent.
RESEND_FRAMES = 24


async def _metric(port: int, name: str) -> float:
    """Sum of one Prometheus metric's samples from the bridge's /metrics."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
    body = (await reader.read()).decode()
    writer.close()
    total = 0.0
    for line in body.splitlines():
        if line.startswith(name) and line[len(name)] in " {":
            total += float(line.rsplit(" ", 1)[1])
    return total


class CpuSampler:
    """The bridge child's CPU seconds, sampled often enough to cut out one publishing window."""

    def __init__(self, child: ChildProcess) -> None:
        self.child = child
        self.samples: list[tuple[int, float]] = []
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            self.samples.append((time.time_ns(), self.child.cpu_seconds()))
            await asyncio.sleep(0.1)

    def __enter__(self) -> CpuSampler:
        self._task = asyncio.create_task(self._run())
        return self

    def __exit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()

    def cores(self, start_ns: int, end_ns: int) -> float:
        inside = [s for s in self.samples if start_ns <= s[0] <= end_ns]
        if len(inside) < 2:
            return 0.0
        (t0, c0), (t1, c1) = inside[0], inside[-1]
        return (c1 - c0) / ((t1 - t0) / 1e9)


async def run_cell(
    transport: str,
    url: str,
    http_port: int,
    cpu: CpuSampler,
    sink: SinkServer,
    *,
    offered: float,
    edges: int,
    procs: int,
    seconds: float,
    label: str,
) -> dict[str, Any]:
    before = {
        n: await _metric(http_port, n)
        for n in ("bridge_backpressure_pauses_total", "bridge_frames_dropped_total")
    }
    lost_before = sink.record.totals()["lost"]
    rep = await publish_procs(
        procs,
        transport=transport,
        url=url,
        edges=edges,
        rate_hz=offered / edges,
        duration_s=seconds,
        points=POINTS,
        voxel_size=VOXEL,
        device_prefix=f"{transport}-{label}",
        resend_buffer_frames=RESEND_FRAMES,
        drain_timeout_s=30.0,
    )
    start, end = rep["window_ns"]
    window = (end - start) / 1e9
    delivered = sum(1 for t in rep.pop("_delivered_at_ns") if start <= t <= end)
    after = {n: await _metric(http_port, n) for n in before}
    return {
        "offered": offered,
        "delivered_per_s": delivered / window,
        "p50_ms": rep["latency"].get("p50_ms", 0.0),
        "p99_ms": rep["latency"].get("p99_ms", 0.0),
        "stall_s": rep["longest_stall_ms"] / 1e3,
        "edge_drops": rep["dropped_resend_overflow"],
        "sent": rep["sent"],
        # Inside the bridge: frames the sink never got and no gap announced, plus ring evictions.
        "bridge_loss": sink.record.totals()["lost"]
        - lost_before
        + int(after["bridge_frames_dropped_total"] - before["bridge_frames_dropped_total"]),
        "undelivered": rep["undelivered"],
        "pauses": int(
            after["bridge_backpressure_pauses_total"] - before["bridge_backpressure_pauses_total"]
        ),
        "bridge_cores": cpu.cores(start, end),
        "gen_cpu_pct": rep["generator_cpu_pct"],
        "gen_lagged": rep["schedule_lagged"],
    }


HEADER = (
    f"{'transport':>9} {'load':>5} {'offered/s':>9} {'deliv/s':>8} {'x cap':>6} {'p50 ms':>7} "
    f"{'p99 ms':>7} {'stall s':>7} {'edge drops':>10} {'bridge loss':>11} {'pauses':>6} "
    f"{'bridge cores':>12} {'gen cpu %':>9} {'gen lag':>7}"
)


def fmt(transport: str, load: str, row: dict[str, Any], capacity: float) -> str:
    return (
        f"{transport:>9} {load:>5} {row['offered']:>9.0f} {row['delivered_per_s']:>8.1f} "
        f"{row['delivered_per_s'] / capacity:>6.2f} {row['p50_ms']:>7.0f} {row['p99_ms']:>7.0f} "
        f"{row['stall_s']:>7.2f} {row['edge_drops']:>10} {row['bridge_loss']:>11} "
        f"{row['pauses']:>6} {row['bridge_cores']:>12.2f} {row['gen_cpu_pct']:>9.0f} "
        f"{'LAGGED' if row['gen_lagged'] else 'ok':>7}"
    )


async def main(args: argparse.Namespace) -> int:
    tmp = Path(tempfile.mkdtemp(prefix="bench-overload-"))
    async with SinkServer(listen="127.0.0.1:0", fsync=False) as sink:
        cmd = serve_command(
            *("--ws-port", "0", "--grpc-port", "0", "--http-port", "0"),
            *("--voxel-size", str(VOXEL), "--sink-address", f"127.0.0.1:{sink.port}"),
            *("--max-frame-bytes", str(4 * MiB), "--ring-budget-bytes", str(args.ring_mib * MiB)),
            *("--session-ttl-seconds", "1", "--no-adapt", "--log-level", "WARNING"),
            *("--workers", str(args.workers)),
        )
        child = await ChildProcess.start(cmd, log_path=tmp / "bridge.log", timeout=60)
        try:
            with CpuSampler(child) as cpu:
                print(
                    f"# {POINTS // 1000}k-point clouds, voxel {VOXEL} m, {args.edges} edges over "
                    f"{args.procs} generator processes, {args.seconds:g} s per cell, ring "
                    f"{args.ring_mib} MiB, edge resend buffer {RESEND_FRAMES} frames",
                    flush=True,
                )
                print(HEADER, flush=True)
                for transport in args.transports:
                    url = (
                        f"ws://127.0.0.1:{child.port('ws')}/v1/ingest"
                        if transport == "ws"
                        else f"127.0.0.1:{child.port('grpc')}"
                    )
                    common = dict(edges=args.edges, procs=args.procs, seconds=args.seconds)
                    # Warm-up (connections, allocator, caches), not reported.
                    await run_cell(
                        transport, url, child.port("http"), cpu, sink,
                        offered=args.saturate, label="warm", **common,
                    )  # fmt: skip
                    sat = await run_cell(
                        transport, url, child.port("http"), cpu, sink,
                        offered=args.saturate, label="cap", **common,
                    )  # fmt: skip
                    capacity = max(1.0, sat["delivered_per_s"])
                    print(fmt(transport, "sat", sat, capacity), flush=True)
                    for k in args.loads:
                        row = await run_cell(
                            transport, url, child.port("http"), cpu, sink,
                            offered=k * capacity, label=f"x{k:g}", **common,
                        )  # fmt: skip
                        print(fmt(transport, f"{k:g}x", row, capacity), flush=True)
        finally:
            await child.stop()
        totals = sink.record.totals()
        print(
            f"# sink: delivered {totals['delivered']}, lost {totals['lost']}, "
            f"duplicates {totals['duplicates']}, announced gap frames {totals['gap_frames']} "
            "(the edges' resend-buffer drops)"
        )
    return 0


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--transports", nargs="+", default=["grpc", "ws"], choices=["grpc", "ws"])
    p.add_argument("--loads", nargs="+", type=float, default=[0.5, 1.0, 2.0, 4.0])
    p.add_argument("--edges", type=int, default=8)
    p.add_argument("--procs", type=int, default=2)
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument(
        "--saturate", type=float, default=400.0, help="offered clouds/s to measure capacity"
    )
    p.add_argument("--ring-mib", type=int, default=32)
    p.add_argument("--workers", type=int, default=2)
    return p.parse_args(argv)


if __name__ == "__main__":
    sys.exit(run_async(main(parse())))
