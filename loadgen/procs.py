"""The open-loop publisher spread over several processes (``publish --procs N``).

Why: one Python process drives a few hundred 1.2 MB frames a second at most; past that the
generator, not the bridge, sets the pace and its report would blame the bridge. Each child runs a
:class:`~loadgen.edge.Publisher` for its share of the edges (device ids stay distinct and the
stagger spans all edges), all children start their schedules at one agreed wall-clock instant,
and the parent merges their counters, latency samples and delivery times into one report.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from loadgen.aio import run_async  # uvloop when installed, like the CLI
from loadgen.edge import LoadStats, Publisher, longest_stall_s, schedule_lagged

#: How long children get to start and connect before the shared schedule begins.
STARTUP_S = 4.0


def split(edges: int, procs: int) -> list[tuple[int, int]]:
    """(first edge, count) per process, as even as possible; never an empty process."""
    procs = max(1, min(procs, edges))
    base, extra = divmod(edges, procs)
    out, first = [], 0
    for k in range(procs):
        n = base + (k < extra)
        out.append((first, n))
        first += n
    return out


def _child(kwargs: dict[str, Any]) -> dict[str, Any]:
    """One process's publisher (runs in a spawned child): its report plus the raw samples."""
    result: dict[str, Any] = {}

    async def main() -> int:
        pub = Publisher(**kwargs)
        result["report"] = await pub.run()
        stats = LoadStats()
        for c in pub.clients:
            stats.add(c.stats)
        result["stats"] = {
            k: (dict(v) if isinstance(v, Counter) else v) for k, v in vars(stats).items()
        }
        result.update(
            ticks=pub.ticks,
            late_ticks=pub.late_ticks,
            max_lag_s=pub.max_lag_s,
            window_ns=pub.window_ns,
            cpu_s=pub.cpu_s,
        )
        return 0

    run_async(main())
    return result


def merge(results: list[dict[str, Any]], **meta: Any) -> dict[str, Any]:
    """One report from the children's, in the single-process report's keys."""
    total = LoadStats()
    for r in results:
        raw = dict(r["stats"])
        raw["errors"] = Counter(raw["errors"])
        raw["close_reasons"] = Counter(raw["close_reasons"])
        total.add(LoadStats(**raw))
    start = min(r["window_ns"][0] for r in results)
    end = max(r["window_ns"][1] for r in results)
    elapsed = (end - start) / 1e9
    ticks = sum(r["ticks"] for r in results)
    late = sum(r["late_ticks"] for r in results)
    cpu = sum(r["cpu_s"] for r in results)
    out = total.as_dict()
    out.update(meta)
    out.update(
        procs=len(results),
        elapsed_s=round(elapsed, 3),
        publish_rate_hz=round(total.published / elapsed, 1) if elapsed > 0 else 0,
        undelivered=sum(r["report"]["undelivered"] for r in results),
        late_ticks=late,
        max_schedule_lag_ms=round(max(0.0, *(r["max_lag_s"] for r in results)) * 1e3, 3),
        schedule_lagged=schedule_lagged(late, ticks),
        generator_cpu_pct=round(100 * cpu / elapsed, 1) if elapsed > 0 else 0,
        longest_stall_ms=round(longest_stall_s(total.delivered_at_ns, start, end) * 1e3),
        window_ns=[start, end],
    )
    out["_delivered_at_ns"] = total.delivered_at_ns  # for stall analysis; not printed
    return out


async def publish_procs(procs: int, **kwargs: Any) -> dict[str, Any]:
    """Run ``Publisher(**kwargs)`` with its edges spread over ``procs`` processes."""
    edges = int(kwargs.pop("edges", 1))
    parts = split(edges, procs)
    start_at = time.time_ns() + int((STARTUP_S + 0.02 * edges) * 1e9)
    loop = asyncio.get_running_loop()
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=len(parts), mp_context=ctx) as pool:
        results = await asyncio.gather(
            *(
                loop.run_in_executor(
                    pool,
                    _child,
                    dict(
                        kwargs,
                        edges=n,
                        first_edge=first,
                        total_edges=edges,
                        start_at_ns=start_at,
                    ),
                )
                for first, n in parts
            )
        )
    first = results[0]["report"]
    return merge(
        list(results),
        edges=edges,
        streams_per_edge=first["streams_per_edge"],
        rate_hz=first["rate_hz"],
        duration_s=first["duration_s"],
    )
