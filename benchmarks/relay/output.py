"""The relay benchmark's numbers: one cell's summary, the bridge/raw ratios, the table, the JSON."""

from __future__ import annotations

import json
import math
import os
import platform
from dataclasses import asdict
from pathlib import Path

import grpc
import numpy as np

from benchmarks.hostinfo import cpu_description
from benchmarks.relay.clients import Payload
from benchmarks.relay.common import SIZES, BenchConfig, Cell, CellResult


def _slice_rates(arrivals: np.ndarray, t0: int, t1: int) -> np.ndarray:
    slices = max(1, min(8, round((t1 - t0) / 0.25e9)))
    counts, _ = np.histogram(arrivals, bins=slices, range=(t0, t1))
    return counts / ((t1 - t0) / 1e9 / slices)


def summarize(
    target: str,
    payload: Payload,
    cell: Cell,
    cfg: BenchConfig,
    t0: int,
    t1: int,
    cpu: dict[str, float],
    errors: list[str],
) -> CellResult:
    arrivals = np.asarray(cell.arrivals, dtype=np.int64)
    latencies = np.asarray(cell.latencies, dtype=np.int64)
    nan = float("nan")
    rate = mean = p50 = p99 = nan
    if t1 > t0:
        inside = (arrivals >= t0) & (arrivals < t1)
        rate = float(np.median(_slice_rates(arrivals[inside], t0, t1)))
        mean = int(inside.sum()) / ((t1 - t0) / 1e9)
        if inside.any():
            p50, p99 = (float(v) / 1e6 for v in np.percentile(latencies[inside], [50, 99]))
    return CellResult(
        target=target,
        size=payload.name,
        wire_bytes=payload.wire_bytes,
        conns=len(cell.conns),
        window=cfg.window,
        seconds=cfg.seconds,
        msgs_per_s=rate,
        mean_msgs_per_s=mean,
        mb_per_s=rate * payload.wire_bytes / 1e6,
        p50_ms=p50,
        p99_ms=p99,
        relay_cpu_pct=cpu.get("relay", nan),
        relay_us_per_msg=cpu.get("relay", nan) * 1e4 / mean if mean > 0 else nan,
        bench_cpu_pct=cpu.get("own", nan),
        other_cpu_pct=_non_negative(cpu.get("other", nan)),
        sent=cell.sent,
        completed=cell.completed,
        sink_received=cell.sink_received,
        backpressure_pauses=sum(c.backpressure for c in cell.conns),
        errors=errors,
        replies_per_frame=(
            sum(c.replies for c in cell.conns) / cell.sent
            if target.startswith("bridge") and cell.sent
            else None
        ),
    )


def _non_negative(value: float) -> float:
    """Clamp rounding noise below zero; keep NaN (unknown) as NaN."""
    return value if math.isnan(value) else max(0.0, value)


def attach_ratios(results: list[CellResult]) -> None:
    raw = {(r.target.split("-")[1], r.size, r.conns): r for r in results if r.target[:3] == "raw"}
    for r in results:
        if r.target.startswith("bridge"):
            base = raw.get((r.target.split("-")[1], r.size, r.conns))
            if base is not None and base.msgs_per_s > 0:
                r.ratio = r.msgs_per_s / base.msgs_per_s


HEADER = (
    f"{'size':<6} {'conns':>5}  {'target':<12} {'msgs/s':>8} {'MB/s':>7} {'p50 ms':>8} "
    f"{'p99 ms':>8} {'relay':>6} {'us/msg':>7} {'bench':>6} {'other':>6} {'bridge/raw':>10} "
    f"{'acks/frame':>10}"
)


def format_row(r: CellResult) -> str:
    ratio = f"{r.ratio:10.2f}" if r.ratio is not None else f"{'':10}"
    replies = f"{r.replies_per_frame:10.2f}" if r.replies_per_frame is not None else ""
    line = (
        f"{r.size:<6} {r.conns:>5}  {r.target:<12} {r.msgs_per_s:8.1f} {r.mb_per_s:7.1f} "
        f"{r.p50_ms:8.2f} {r.p99_ms:8.2f} {r.relay_cpu_pct:5.0f}% {r.relay_us_per_msg:7.0f} "
        f"{r.bench_cpu_pct:5.0f}% {r.other_cpu_pct:5.0f}% {ratio} {replies}"
    ).rstrip()
    if r.errors:
        line += f"  ERRORS: {len(r.errors)} (first: {r.errors[0]})"
    return line


def report_header(cfg: BenchConfig) -> str:
    return "\n".join(
        [
            "simbridge relay benchmark: bridge --passthrough vs raw relays, same machine, same run",
            f"closed loop, window {cfg.window} msgs/conn; {cfg.warmup:g} s warm-up + "
            f"{cfg.seconds:g} s per cell; msgs/s = median of slice rates; "
            "latency = client send -> sink arrival",
            "CPU in % of one core: relay = the relay/bridge process (us/msg: its CPU time per "
            "message), bench = clients + sink, other = the rest of the machine",
            "acks/frame: messages the bridge sent its edges (acks, flow control) per frame, each "
            "a write the raw relay never makes",
            f"{os.cpu_count()} CPUs ({cpu_description()}), Python {platform.python_version()}, "
            f"grpcio {grpc.__version__}, malloc env: "
            f"{' '.join(f'{k}={v}' for k, v in _malloc_env().items()) or 'default'}",
            *(
                [
                    f"bridge: {cfg.bridge_procs} processes sharing the ports (--reuse-port); its "
                    "relay CPU and us/msg are their sum"
                ]
                if cfg.bridge_procs > 1
                else []
            ),
            "",
            HEADER,
        ]
    )


SATURATED = 95.0
BUSY_MACHINE = 25.0


def _malloc_env() -> dict[str, str]:
    """glibc malloc settings passed to every process: they change the 1.2 MB results a lot
    (freed large buffers returned to the kernel are page-faulted in again on the next message)."""
    return {k: v for k, v in os.environ.items() if k.startswith(("MALLOC_", "GLIBC_TUNABLES"))}


def _target_line(results: list[CellResult], size: str, prefix: str, target: float) -> str | None:
    """One size's bridge/raw ratios against issue 12's relay target for them."""
    rows = [r for r in results if r.ratio is not None and r.size == size and r.target[:7] == prefix]
    if not rows:
        return None
    worst = min(r.ratio for r in rows if r.ratio is not None)
    verdict = "met" if worst >= target else "NOT met"
    cells = ", ".join(f"{r.target.split('-')[1]} x{r.conns} {r.ratio:.2f}" for r in rows)
    return f"{size} {prefix.rstrip('-')}/raw msgs/s: {cells}  (target >= {target:g}: {verdict})"


def report_footer(results: list[CellResult]) -> str:
    lines = []
    for size, prefix, target in (
        ("1.2MB", "bridge-", 0.9),
        ("1KB", "bridge-", 0.8),  # unbatched
        ("1KB", "bridgeB", 1.0),  # batched frames/s against the raw relay's messages/s
    ):
        line = _target_line(results, size, prefix, target)
        if line is not None:
            lines.append(line)
    ratios = [
        r
        for r in results
        if r.ratio is not None and r.size == "1.2MB" and r.target[:7] == "bridge-"
    ]
    if ratios:
        # CPU per message barely depends on what else limits the rate: the steadier comparison.
        raw = {
            (r.target.split("-")[1], r.conns): r
            for r in results
            if r.size == "1.2MB" and r.target.startswith("raw")
        }
        costs = [
            f"{r.target.split('-')[1]} x{r.conns} "
            f"{r.relay_us_per_msg / raw[(r.target.split('-')[1], r.conns)].relay_us_per_msg:.1f}x"
            for r in ratios
            if (r.target.split("-")[1], r.conns) in raw
        ]
        lines.append("1.2MB relay CPU per message, bridge/raw: " + ", ".join(costs))
    # Caveats the numbers carry, said next to them rather than left to the reader.
    capped = [r for r in results if r.target.startswith("raw") and r.bench_cpu_pct >= SATURATED]
    if capped:
        lines.append(
            f"note: the load side (bench) used >= {SATURATED:.0f}% of a core in {len(capped)} raw "
            "cell(s): there the raw rate is a lower bound and the ratio an upper bound"
        )
    loaded = [r for r in results if not r.target.startswith("raw") and r.bench_cpu_pct >= SATURATED]
    if loaded:
        cells = ", ".join(f"{r.target} {r.size} x{r.conns}" for r in loaded)
        lines.append(
            f"note: the load side (bench) used >= {SATURATED:.0f}% of a core in bridge cell(s) "
            f"{cells}: the clients and sink set that rate, the bridge's own capacity is higher "
            "(its ratio is a lower bound; compare CPU per message)"
        )
    busy = [r for r in results if r.other_cpu_pct >= BUSY_MACHINE]
    if busy:
        lines.append(
            f"note: other work used >= {BUSY_MACHINE:.0f}% of a core during {len(busy)} cell(s); "
            "those rows are noisy, rerun on a quiet machine"
        )
    failed = [r for r in results if r.errors]
    if failed:
        lines.append(f"{len(failed)} cell(s) with errors; --json PATH lists them all")
    return "\n".join(lines)


def format_report(results: list[CellResult], cfg: BenchConfig) -> str:
    """The whole table at once (what ``main`` prints row by row as the cells finish)."""
    lines = [report_header(cfg)]
    previous = None
    for r in results:
        if previous is not None and (r.size, r.conns) != previous:
            lines.append("")
        previous = (r.size, r.conns)
        lines.append(format_row(r))
    lines += ["", report_footer(results)]
    return "\n".join(lines)


def write_json(path: Path, results: list[CellResult], cfg: BenchConfig) -> None:
    doc = {
        "benchmark": "relay",
        "config": asdict(cfg) | {"sizes_bytes": {s: SIZES[s] for s in cfg.sizes}},
        "machine": {
            "cpus": os.cpu_count(),
            "cpu": cpu_description(),
            "python": platform.python_version(),
            "grpcio": grpc.__version__,
            "platform": platform.platform(),
            "malloc_env": _malloc_env(),
        },
        "cells": [asdict(r) for r in results],
    }
    path.write_text(json.dumps(doc, indent=2, default=list) + "\n")
