"""``make bench-scale``: aggregate frames/s and CPU per frame of a real pod at N = 1, 2, 4, 8
ingest processes.

What it answers (issue 31, docs/bench-scale.md): does the pod move more frames when given more
cores, and what does each frame cost its event loops and its other threads, side by side in one
run. Each N is one ``simbridge serve --processes N`` (``max:1`` for N = 1): the supervisor
(:mod:`bridge.pod`) plans N, reserves the ports, starts the ingest processes and answers claims;
the benchmark finds those processes' pids on the pod's ``/debug/resources``
(:mod:`benchmarks.scale.pod`). Two workloads per N, against the same pod:

- ``cloud``: 100k-point lidar-like clouds (xyz float32, 1.2 MB), decimated at a 0.2 m voxel;
- ``1KB``: 1 KB passthrough frames, the loop-bound protocol path (no worker involved).

``--workers max(1, cores // N)`` per process, so processes x workers stays at the cores where it
can. The load is closed-loop (the relay benchmark's clients and sink, in this process): each
connection keeps ``window`` frames in flight and a sink arrival releases the next, so frames/s is
what the whole system reaches, and every frame is checked to arrive exactly once and in order.
CPU comes from /proc/PID/task/*/stat at the edges of the measured window: ``loop`` is each ingest
process's main thread (its event loop), ``other`` every other thread (decimation workers, gRPC's
I/O threads), both summed over the ingest processes and divided by the frames delivered; the
supervisor's CPU is a column of its own. Memory: each ingest process's RSS idle and after the
cells, the supervisor's beside it. After the cells of each N, a loop of connections one at a
time times Hello→Welcome (where a pod's claim sits), against a single bridge without supervisor
too, and the claim's round trip is timed alone against the supervisor's control server
(:mod:`benchmarks.scale.connects`).

Limits it states in its output, never silently:

- where the generator (this process: clients + sink) runs on the bridge's cores, which on a
  machine with few cores is always: its CPU comes out of the bridge's, so frames/s there is a lower
  bound and CPU per frame is the figure to compare across N;
- when the generator lagged (its event loop busy >= 85 % of a core in the window): the row's rate
  is bounded by the generator, not the bridge;
- when N processes outnumber the cores they are pinned to;
- when other programs kept the machine busy (the ``rest`` column).

``--cores N`` pins the pod to N of this process's CPUs (``taskset`` on the supervisor, which its
processes inherit) and the generator to the rest, when any are left. The model printed at the end
(rates at C cores from the per-frame costs measured at N = 1 and 2) is a model, not a measurement.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from benchmarks.hostinfo import cpu_description
from benchmarks.scale.connects import ClaimRtt, ConnectTimes, claim_rtts, connect_loop
from benchmarks.scale.pod import PodGroup
from benchmarks.scale.report import format_report, model_rows, plot
from benchmarks.scale.run import (
    CellResult,
    GroupInfo,
    ScaleSink,
    end_memory,
    group_info,
    run_cell,
    workloads,
)

TRANSPORTS = ("ws", "grpc")
WORKLOADS = ("cloud", "1KB")


def _csv(kind: Callable[[str], Any], choices: Sequence[Any] | None = None) -> Any:
    def parse(text: str) -> list[Any]:
        try:
            values = [kind(v) for v in text.split(",") if v]
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        bad = [v for v in values if choices is not None and v not in choices]
        if bad or not values:
            raise argparse.ArgumentTypeError(f"choose from {', '.join(map(str, choices or []))}")
        return values

    return parse


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.scale.cli",
        description="Aggregate decimated clouds/s and 1 KB frames/s at N bridge processes.",
    )
    p.add_argument("--procs", type=_csv(int), default=[1, 2, 4, 8], help="e.g. 1,2,4,8")
    p.add_argument(
        "--cores",
        type=int,
        default=0,
        help="pin the bridge to this many of our CPUs (taskset) and the generator to the rest "
        "(default 0: every CPU for both, shared)",
    )
    p.add_argument("--duration", type=float, default=4.0, help="measured seconds per cell")
    p.add_argument("--warmup", type=float, default=1.0, help="warm-up seconds per cell")
    p.add_argument(
        "--rounds", type=int, default=1, help="repeat every N this many times (interleaved)"
    )
    p.add_argument("--transport", choices=TRANSPORTS, default="ws")
    p.add_argument("--workloads", type=_csv(str, WORKLOADS), default=list(WORKLOADS))
    p.add_argument("--cloud-conns", type=int, default=16, help="connections in cloud cells")
    p.add_argument("--small-conns", type=int, default=32, help="connections in 1KB cells")
    p.add_argument(
        "--connects",
        type=int,
        default=40,
        help="Hello->Welcome loop per N: this many new devices, then reconnects (0: none)",
    )
    p.add_argument(
        "--claims", type=int, default=500, help="claim round trips timed alone (0: none)"
    )
    p.add_argument("--json", type=Path, metavar="PATH", help="write the results here")
    p.add_argument("--plot", type=Path, metavar="PNG", help="draw frames/s and CPU/frame here")
    ns = p.parse_args(argv)
    if any(n < 1 for n in ns.procs) or ns.duration <= 0 or ns.warmup < 0 or ns.cores < 0:
        p.error("--procs >= 1, --duration > 0, --warmup >= 0, --cores >= 0 please")
    if ns.rounds < 1:
        p.error("--rounds >= 1 please")
    if ns.connects < 0 or ns.claims < 0:
        p.error("--connects and --claims >= 0 please")
    if ns.cloud_conns < 1 or ns.small_conns < 1:
        p.error("--cloud-conns and --small-conns >= 1 please")
    return ns


def placement(cores: int, allowed: Sequence[int]) -> tuple[list[int], list[int]]:
    """(bridge CPUs, generator CPUs) from ``--cores`` and the CPUs we may use: the bridge takes
    the first ``cores`` (all when 0 or too many), the generator the rest, or all when none are
    left (then they share)."""
    allowed = sorted(allowed)
    if cores <= 0 or cores >= len(allowed):
        return allowed, allowed
    return allowed[:cores], allowed[cores:]


def workers_per_process(cores: int, procs: int) -> int:
    """Decimation threads per process: processes x workers <= cores where it can (one at least)."""
    return max(1, cores // procs)


async def run(
    ns: argparse.Namespace,
    bridge_cpus: list[int],
    on_group: Callable[[list[GroupInfo], list[CellResult]], None] = lambda _g, _c: None,
) -> dict[str, Any]:
    """Every N of every round, then the claim loop; ``on_group`` after each N (partial saves)."""
    loads = {
        k: v for k, v in workloads(ns.cloud_conns, ns.small_conns).items() if k in ns.workloads
    }
    sink = ScaleSink()
    sink.reserve_port()
    await sink.start()
    groups: list[GroupInfo] = []
    cells: list[CellResult] = []
    plain: ConnectTimes | None = None
    number = 0
    try:
        if ns.connects:  # the reference: a single bridge, no supervisor, no claim
            workers = workers_per_process(len(bridge_cpus), 1)
            async with PodGroup(sink, 1, workers, bridge_cpus, plain=True) as single:
                await asyncio.sleep(1.0)
                plain = await connect_loop(single.address("ws"), "plain", 1, ns.connects, "plain")
        for rnd in range(1, ns.rounds + 1):
            for procs in ns.procs:
                workers = workers_per_process(len(bridge_cpus), procs)
                group = PodGroup(sink, procs, workers, bridge_cpus)
                async with group:
                    await asyncio.sleep(1.0)  # settle: imports done, first timers run
                    info = await group_info(group, rnd)
                    for load in loads.values():
                        number += 1
                        cell = await run_cell(
                            rnd, group, number, load, ns.transport, ns.warmup, ns.duration
                        )
                        cells.append(cell)
                        print(
                            f"  round {rnd}: measured {load.name} at N={procs}",
                            file=sys.stderr,
                            flush=True,
                        )
                    end_memory(info, group)
                    if ns.connects:
                        info.connects = await connect_loop(
                            group.address("ws"), "pod", procs, ns.connects, f"r{rnd}n{procs}"
                        )
                info.exit_code = group.exit_code
                groups.append(info)
                on_group(groups, cells)
    finally:
        await sink.stop()
    claims = await asyncio.to_thread(claim_rtts, ns.claims) if ns.claims else None
    return {"groups": groups, "cells": cells, "plain": plain, "claims": claims}


def main(argv: Sequence[str] | None = None) -> int:
    ns = parse_args(argv)
    allowed = sorted(os.sched_getaffinity(0))
    bridge_cpus, gen_cpus = placement(ns.cores, allowed)
    if gen_cpus != allowed:
        os.sched_setaffinity(0, gen_cpus)  # before any thread starts: they inherit it
    shared = sorted(set(bridge_cpus) & set(gen_cpus))
    host = {
        "cpu": cpu_description(),
        "nproc": os.cpu_count(),
        "allowed_cpus": allowed,
        "bridge_cpus": bridge_cpus,
        "generator_cpus": gen_cpus,
        "generator_shares_cores": bool(shared),
        "shared_cpus": shared,
    }

    def save_partial(groups: list[GroupInfo], cells: list[CellResult]) -> None:
        """What is measured so far, should the run be cut short (a time limit)."""
        if ns.json is not None:
            partial = ns.json.with_suffix(".partial.json")
            partial.parent.mkdir(parents=True, exist_ok=True)
            doc = {
                "host": host,
                "groups": [asdict(g) for g in groups],
                "cells": [asdict(c) for c in cells],
            }
            partial.write_text(json.dumps(doc, indent=1) + "\n")

    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        results = asyncio.run(run(ns, bridge_cpus, save_partial))
    else:  # the bridge runs on uvloop too
        results = uvloop.run(run(ns, bridge_cpus, save_partial))
    cells: list[CellResult] = results["cells"]
    groups: list[GroupInfo] = results["groups"]
    plain: ConnectTimes | None = results["plain"]
    claims: ClaimRtt | None = results["claims"]
    model = model_rows(cells)
    config = {
        k: (str(v) if isinstance(v, Path) else v) for k, v in vars(ns).items() if k not in ("json",)
    }
    print(format_report(host, config, groups, cells, model, plain, claims), flush=True)
    if ns.plot is not None:
        plot(cells, host, ns.plot)
        print(f"# plot: {ns.plot}")
    if ns.json is not None:
        doc = {
            "host": host,
            "config": config,
            "groups": [asdict(g) for g in groups],
            "cells": [asdict(c) for c in cells],
            "model": model,
            "connects_plain": asdict(plain) if plain is not None else None,
            "claim_rtt": asdict(claims) if claims is not None else None,
        }
        ns.json.parent.mkdir(parents=True, exist_ok=True)
        ns.json.write_text(json.dumps(doc, indent=1) + "\n")  # NaN: a figure not measured
    failed = any(c.errors for c in cells) or any(g.exit_code != 0 for g in groups)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
