"""Time-to-adapt and watcher cost (``make bench-adapt`` = ``python -m benchmarks.adapt``).

1. Latency: an :class:`~bridge.resources.adapt.Adapter` polls a temporary v2-layout cgroup
   directory (the same code path as ``BRIDGE_CGROUP_ROOT``) while this script makes N random
   limit changes (``cpu.max`` or ``memory.max``, atomic rename like a kernel write), each after a
   random pause so the writes do not phase-lock with the poll. Measured: file write → the target's
   last call of the re-plan (p50 / p99 / max). With polling at interval T the expected mean is about
   T/2 plus the cost of one read and plan.
2. Cost: the cgroup poller alone on its own event loop in a thread for a few seconds with no
   changes; ``time.thread_time()`` of that thread / wall time = share of one core. Measured on the
   temporary directory and on this process's real cgroup (sysfs), when one is found.

Targets (docs/design.md §4): p99 <= 100 ms and watcher <= 1 % of a core at 50 ms polling.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import tempfile
import threading
import time
from typing import Any

from prometheus_client import CollectorRegistry

from bridge.resources.adapt import Adapter, AdapterSettings, AppliedChange
from bridge.resources.cgroup import CgroupReader, open_cgroup
from bridge.resources.poller import Poller
from bridge.resources.snapshot import CgroupReading

MiB = 1 << 20


class _Target:
    """A do-nothing data plane that counts calls."""

    def __init__(self) -> None:
        self.calls = 0

    def resize_workers(self, workers: int) -> None:
        self.calls += 1

    def set_memory_budget(self, budget_bytes: int, reserve_bytes: int) -> None:
        self.calls += 1

    def set_gpu_healthy(self, healthy: bool) -> None:
        self.calls += 1

    def active_streams(self) -> int:
        return 8

    def memory_baseline_bytes(self) -> int:
        return 128 * MiB


def _write(path: str, text: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="ascii") as f:
        f.write(text + "\n")
    os.replace(tmp, path)


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    idx = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[idx]


async def measure_latency(changes: int, interval: float, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory(prefix="bench-adapt-") as root:
        cores, mem_mib = 2, 1024
        _write(os.path.join(root, "cpu.max"), f"{cores * 100_000} 100000")
        _write(os.path.join(root, "memory.max"), str(mem_mib * MiB))
        _write(os.path.join(root, "memory.current"), str(200 * MiB))
        applied: asyncio.Queue[AppliedChange] = asyncio.Queue()
        adapter = Adapter(
            _Target(),
            CollectorRegistry(),
            cgroup=CgroupReader.from_root(root),
            settings=AdapterSettings(poll_interval=interval, slow_interval=10.0),
            cpus_allowed=lambda: 64,
            on_applied=applied.put_nowait,
        )
        latencies: list[float] = []
        detect: list[float] = []
        async with adapter:
            applied.get_nowait()  # the initial plan
            for _ in range(changes):
                await asyncio.sleep(rng.uniform(0, 2 * interval))
                if rng.random() < 0.5:
                    cores = rng.choice([c for c in range(1, 33) if c != cores])
                    path, text = "cpu.max", f"{cores * 100_000} 100000"
                else:
                    mem_mib = rng.choice([m for m in range(512, 16384, 256) if m != mem_mib])
                    path, text = "memory.max", str(mem_mib * MiB)
                written = time.monotonic()
                _write(os.path.join(root, path), text)
                change = await asyncio.wait_for(applied.get(), 5)
                latencies.append(change.applied_at - written)
                detect.append(change.detected_at - written)
    ms = [x * 1000 for x in latencies]
    return {
        "changes": changes,
        "poll_interval_ms": interval * 1000,
        "p50_ms": round(_pct(ms, 0.50), 2),
        "p99_ms": round(_pct(ms, 0.99), 2),
        "max_ms": round(max(ms), 2),
        "mean_ms": round(statistics.fmean(ms), 2),
        "detect_to_applied_p99_ms": round(
            _pct([(a - d) * 1000 for a, d in zip(latencies, detect, strict=True)], 0.99), 3
        ),
    }


def measure_cpu(reader: CgroupReader | None, interval: float, seconds: float) -> dict[str, Any]:
    """Run the poller alone on a private loop in a thread; its thread CPU time / wall time.
    ``reader=None`` polls a constant reading: the cost of waking the loop and the poller itself,
    without any file I/O (the floor on this machine)."""
    result: dict[str, Any] = {}
    constant = CgroupReading("none", "")
    read = reader.read if reader is not None else (lambda: constant)

    def on_change(_r: CgroupReading, _t: float) -> None:
        return None

    def run() -> None:
        poller: Poller[CgroupReading] = Poller(read, on_change, interval=interval)

        async def main() -> None:
            task = asyncio.create_task(poller.run())
            await asyncio.sleep(0.2)  # warm up
            cpu0, wall0, polls0 = time.thread_time(), time.monotonic(), poller.polls
            await asyncio.sleep(seconds)
            cpu1, wall1, polls1 = time.thread_time(), time.monotonic(), poller.polls
            task.cancel()
            result.update(
                polls=polls1 - polls0,
                cpu_s=cpu1 - cpu0,
                wall_s=wall1 - wall0,
                core_percent=round(100 * (cpu1 - cpu0) / (wall1 - wall0), 3),
                us_per_poll=round(1e6 * (cpu1 - cpu0) / max(1, polls1 - polls0), 1),
            )

        asyncio.run(main())

    t = threading.Thread(target=run, name="bench-adapt-poller")
    t.start()
    t.join()
    result["files"] = len(reader.files) if reader is not None else 0
    result["location"] = reader.location if reader is not None else "(no files)"
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.adapt", description=__doc__)
    p.add_argument("--changes", type=int, default=100)
    p.add_argument("--interval", type=float, default=0.05, help="poll interval, s")
    p.add_argument("--cpu-seconds", type=float, default=5.0, help="duration of each cost run")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)

    latency = asyncio.run(measure_latency(args.changes, args.interval, args.seed))
    with tempfile.TemporaryDirectory(prefix="bench-adapt-cpu-") as root:
        for name, text in (
            ("cpu.max", "200000 100000"),
            ("cpu.weight", "100"),
            ("memory.max", str(1 << 30)),
            ("memory.high", "max"),
            ("memory.current", str(200 * MiB)),
            ("memory.events", "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0"),
            ("cpu.pressure", "some avg10=0.00 avg60=0.00 avg300=0.00 total=0"),
            ("memory.pressure", "some avg10=0.00 avg60=0.00 avg300=0.00 total=0"),
        ):
            _write(os.path.join(root, name), text)
        tmp_reader = CgroupReader.from_root(root)
        tmp_reader.detail_every = max(1, round(1.0 / args.interval))  # as the Adapter does
        cost_tmp = measure_cpu(tmp_reader, args.interval, args.cpu_seconds)
    host = open_cgroup()
    host.detail_every = tmp_reader.detail_every
    cost_host = (
        measure_cpu(host, args.interval, args.cpu_seconds) if host.version != "none" else None
    )
    cost_floor = measure_cpu(None, args.interval, args.cpu_seconds)
    report = {
        "latency": latency,
        "watcher_cost_tmpdir": cost_tmp,
        "watcher_cost_host": cost_host,
        "watcher_cost_no_files": cost_floor,
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    ok_lat = latency["p99_ms"] <= 100
    print(
        f"time to adapt (file write -> applied), {args.changes} random changes, "
        f"polling every {args.interval * 1000:.0f} ms:"
    )
    print(
        f"  p50 {latency['p50_ms']:.1f} ms   p99 {latency['p99_ms']:.1f} ms   "
        f"max {latency['max_ms']:.1f} ms   mean {latency['mean_ms']:.1f} ms   "
        f"[target p99 <= 100 ms: {'ok' if ok_lat else 'MISSED'}]"
    )
    print(f"  detection -> applied p99 {latency['detect_to_applied_p99_ms']:.3f} ms (plan + apply)")
    runs = (
        ("temp dir (8 files)", cost_tmp),
        ("host cgroup", cost_host),
        ("no files (loop wake-ups only)", cost_floor),
    )
    for label, cost in runs:
        if cost is None:
            print(f"watcher cost, {label}: no cgroup found")
            continue
        ok = cost["core_percent"] <= 1.0
        print(
            f"watcher cost, {label}: {cost['core_percent']:.3f} % of a core "
            f"({cost['polls']} polls, {cost['us_per_poll']:.0f} us CPU per poll, "
            f"{cost['files']} files) [target <= 1 %: {'ok' if ok else 'MISSED'}]"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
