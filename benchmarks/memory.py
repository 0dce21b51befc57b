"""``make bench-memory``: RSS vs memory limit vs budget over a resize trace, one run.

The bridge runs in a real container (the rig of ``make e2e-container``) under a heavier load than
the end-to-end test, and the trace walks the memory limit down to the working set and back, with a
CPU cut first so the rings fill. Resizes go through the Kubernetes stand-in when its Actuator seam
is present (the bridge then shrinks cooperatively before the kubelet applies a decrease), else
with ``podman update`` and the kubelet's guard. Printed: per step, the limit, the budget the
bridge plans (the governor's ``bridge_memory_budget_bytes`` when exported, else the ring budget),
peak RSS, and the ratios RSS/limit and budget/limit; plotted to ``reports/bench-memory.png``.
Timings on the shared CI-class machine are noisy; the ratios within one run are what to compare.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from benchmarks.container import report
from benchmarks.container.e2e import START_CPU, run_scenario
from benchmarks.container.rig import ContainerRig, Load, MiB, Step

TRACE = [
    Step("cpu cut: rings fill", 0.5, None, hold_s=8),
    Step("memory → 512 Mi", None, 512 * MiB, hold_s=8),
    Step("memory → 384 Mi", None, 384 * MiB, hold_s=8),
    Step("cpu back", START_CPU, None, hold_s=6),
    Step("memory → working set", None, "working-set", hold_s=8),
    Step("memory → 640 Mi", None, 640 * MiB, hold_s=6),
    Step("memory → 1 Gi", None, 1024 * MiB, hold_s=6),
    Step("cpu cut at 1 Gi", 0.5, None, hold_s=8),
    Step("back: 1.5 cpu, 512 Mi", START_CPU, 512 * MiB, hold_s=8),
]
LOAD = Load(transports=("ws", "grpc"), edges=1, streams_per_edge=2, rate_hz=15.0, points=60_000)


def ratio_table(rig: ContainerRig) -> str:
    bm = report.budget_metric(rig.samples)
    name = bm[1] if bm else "budget (none exported)"
    rows = [["#", "step", "limit MiB", f"{name} MiB", "RSS peak MiB", "RSS/limit", "budget/limit"]]
    ends = [r.started_t for r in rig.steps[1:]] + [rig.load_ended_t or rig.now()]
    worst = 0.0
    for r, end in zip(rig.steps, ends, strict=True):
        window = [s for s in rig.samples if r.started_t <= s.t < end and s.limit]
        if not window:
            continue
        peak = max(window, key=lambda s: s.rss / (s.limit or 1))
        limit = peak.limit or 1
        budget = peak.metrics.get(bm[0]) if bm else None
        worst = max(worst, peak.rss / limit)
        rows.append(
            [
                str(r.index),
                r.label,
                f"{limit / MiB:.0f}",
                "-" if budget is None else f"{budget / MiB:.0f}",
                f"{peak.rss / MiB:.0f}",
                f"{peak.rss / limit:.2f}",
                "-" if budget is None else f"{budget / limit:.2f}",
            ]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.append(f"worst RSS/limit over the run (at the step's worst 100 ms sample): {worst:.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from benchmarks.container import env as container_env
    from benchmarks.container.kube import seam_missing

    p = argparse.ArgumentParser(prog="python -m benchmarks.memory", description=__doc__)
    p.add_argument("--out", type=Path, default=Path("reports"))
    p.add_argument("--path", choices=("auto", "podman", "kube"), default="auto")
    args = p.parse_args(argv)
    try:
        image = container_env.prepare()
    except container_env.Unavailable as e:
        print(f"SKIPPED: containers cannot run here: {e}")
        return 0
    path = args.path
    if path == "auto":
        path = "podman" if seam_missing() else "kube"
    out = asyncio.run(
        run_scenario(
            path,
            image,
            args.out,
            steps=TRACE,
            load=LOAD,
            name="bench-memory",
            start=(START_CPU, 768 * MiB),
        )
    )
    print(out.text)
    print()
    print(ratio_table(out.rig))
    print(f"PNG: {out.png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
