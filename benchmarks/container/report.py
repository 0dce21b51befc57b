"""What a container rig run proves: the checks, the step table and the PNG.

The checks are the promise of in-place resize, measured from outside the bridge: nothing lost,
duplicated or disconnected (the load generator's own sink and edges), the container never
restarted or OOM-killed (podman and the cgroup's counters), the bridge's reported limits equal
the cgroup's after every step, and RSS within the limit at every 100 ms sample.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.container.rig import ContainerRig, MiB, Sample

BUDGET_METRICS = (
    ("bridge_memory_budget_bytes", "governor budget"),
    ("bridge_plan_ring_budget_bytes", "ring budget (plan)"),
)


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    ok: bool
    detail: str


def budget_metric(samples: list[Sample]) -> tuple[str, str] | None:
    """The governor's budget when the bridge exports it, else the plan's ring budget."""
    for name, label in BUDGET_METRICS:
        if any(name in s.metrics for s in samples):
            return name, label
    return None


def _mib(n: float | None) -> str:
    return "max" if n is None else f"{n / MiB:.0f}"


def checks(rig: ContainerRig) -> list[Check]:
    sink = rig.sink_report.get("totals", {})
    pub = rig.publish_report
    state = rig.final_inspect.get("State", {})
    over = [s for s in rig.samples if s.limit is not None and s.rss > s.limit]
    worst = max(
        (s.rss / s.limit for s in rig.samples if s.limit), default=0.0
    )  # RSS / limit at the worst sample
    vm_worst = max((s.vmrss / s.limit for s in rig.samples if s.limit), default=0.0)
    oom_kills = rig.oom_end.get("oom_kill", 0) - rig.oom_start.get("oom_kill", 0)
    mismatched = [r.index for r in rig.steps if not r.match]
    failed = [f"{r.index}: {n}" for r in rig.steps for n in r.notes if "failed" in n]
    published = int(pub.get("published", -1))
    delivered = int(sink.get("delivered", -2))
    out = [
        Check(
            "0 lost",
            sink.get("lost", 1) == 0
            and pub.get("undelivered", 1) == 0
            and pub.get("dropped_resend_overflow", 1) == 0
            and published == delivered,
            f"published {published}, delivered to the sink {delivered}, sink lost "
            f"{sink.get('lost')}, undelivered at the edges {pub.get('undelivered')}, dropped by "
            f"the edges' bounded resend buffers {pub.get('dropped_resend_overflow')}",
        ),
        Check(
            "0 duplicates",
            sink.get("duplicates", 1) == 0,
            f"sink duplicates {sink.get('duplicates')}",
        ),
        Check(
            "0 disconnects",
            pub.get("disconnects", 1) == 0 and pub.get("reconnects", 1) == 0,
            f"disconnects {pub.get('disconnects')}, reconnects {pub.get('reconnects')}",
        ),
        Check(
            "container restarts 0",
            state.get("Running") is True
            and rig.final_inspect.get("RestartCount", 1) == 0
            and str(state.get("StartedAt")) == rig.started_at
            and int(state.get("Pid", 0)) == rig.pid,
            f"running {state.get('Running')}, RestartCount {rig.final_inspect.get('RestartCount')}"
            f", same start time and PID {rig.pid}: "
            f"{str(state.get('StartedAt')) == rig.started_at and state.get('Pid') == rig.pid}",
        ),
        Check(
            "OOM kills 0",
            oom_kills == 0
            and not state.get("OOMKilled", False)
            and not rig.kernel_ooms
            and state.get("ExitCode", 0) != 137,
            f"cgroup oom_kill +{oom_kills}, podman OOMKilled {state.get('OOMKilled')}, "
            f"kernel log OOM kills {len(rig.kernel_ooms)}, exit code {state.get('ExitCode')}, "
            + ", ".join(
                f"{k} {rig.oom_start.get(k, 0)}→{v}" for k, v in sorted(rig.oom_end.items())
            ),
        ),
        Check(
            "reported limits = cgroup after every step",
            not mismatched and bool(rig.steps),
            f"{len(rig.steps)} steps, mismatched: {mismatched or 'none'}",
        ),
        Check(
            "resizes applied",
            not failed,
            "; ".join(failed) or "every resize call succeeded",
        ),
        Check(
            "RSS ≤ limit at every 100 ms sample",
            not over and len(rig.samples) > 10,
            f"{len(rig.samples)} samples of anon RSS, {len(over)} over; worst RSS/limit "
            f"{worst:.2f} (VmRSS, with shared file pages: {vm_worst:.2f})",
        ),
    ]
    return out


def step_table(rig: ContainerRig) -> str:
    """One row per step: the target, what the cgroup and the bridge show, memory and throughput
    over the step's hold."""
    bm = budget_metric(rig.samples)
    rows = [
        [
            "#",
            "step",
            "cpu",
            "memory MiB",
            "cgroup cpu / MiB",
            "bridge sees",
            "seen after ms",
            "RSS max MiB",
            "usage max MiB",
            f"{'budget' if bm else 'budget (n/a)'} MiB",
            "frames/s",
        ]
    ]
    ends = [r.started_t for r in rig.steps[1:]] + [rig.load_ended_t or rig.now()]
    for r, end in zip(rig.steps, ends, strict=True):
        window = [s for s in rig.samples if r.started_t <= s.t < end]
        budget = next(
            (s.metrics[bm[0]] for s in reversed(window) if bm and bm[0] in s.metrics), None
        )
        rows.append(
            [
                str(r.index),
                r.label,
                f"{r.target_cpu:g}",
                _mib(r.target_memory),
                f"{'max' if r.cgroup_cpu is None else f'{r.cgroup_cpu:g}'} / "
                f"{_mib(r.cgroup_memory)}",
                (
                    f"{r.seen_cpu:g} / {_mib(r.seen_memory)} ✓"
                    if r.match and r.seen_cpu is not None
                    else "✗"
                ),
                "-" if r.seen_after_ms is None else f"{r.seen_after_ms:.0f}",
                _mib(max((s.rss for s in window), default=0)),
                _mib(max((s.usage for s in window), default=0)),
                _mib(budget) if budget is not None else "-",
                f"{_rate(window):.1f}",
            ]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _rate(window: list[Sample]) -> float:
    pts = [s for s in window if "bridge_frames_delivered_total" in s.metrics]
    if len(pts) < 2 or pts[-1].t <= pts[0].t:
        return 0.0
    d = (
        pts[-1].metrics["bridge_frames_delivered_total"]
        - pts[0].metrics["bridge_frames_delivered_total"]
    )
    return d / (pts[-1].t - pts[0].t)


def render(rig: ContainerRig, title: str) -> str:
    res = checks(rig)
    width = max(len(c.name) for c in res)
    lines = [title.replace("\n", " "), "", step_table(rig), ""]
    lines += [f"{'PASS' if c.ok else 'FAIL'}  {c.name.ljust(width)}  {c.detail}" for c in res]
    notes = [f"step {r.index}: {n}" for r in rig.steps for n in r.notes]
    lines += [f"note: {n}" for n in notes]
    pub = rig.publish_report
    lines.append(
        f"load: {' + '.join(rig.cfg.load.transports)} publishers, "
        f"{rig.cfg.load.edges} edge(s) x {rig.cfg.load.streams_per_edge} streams each at "
        f"{rig.cfg.load.rate_hz:g} Hz, {rig.cfg.load.points} points/cloud; "
        f"PAUSEs honoured {pub.get('pauses', 0)}"
    )
    lines += [f"kernel: {line}" for line in rig.kernel_ooms]
    if rig.died_t is not None:
        lines.append(
            f"note: the container died at {rig.died_t:.1f} s; the remaining steps were not run"
        )
    if rig.publish_report.get("error"):
        lines.append(f"note: publishers: {rig.publish_report['error']}")
    if rig.scrape_errors:
        lines.append(
            f"note: {rig.scrape_errors} /metrics scrapes failed (samples kept cgroup data)"
        )
    return "\n".join(lines)


def summary(rig: ContainerRig) -> dict[str, Any]:
    """JSON-able summary: checks, steps and the samples (for re-plotting)."""
    return {
        "container": rig.name,
        "checks": [{"name": c.name, "ok": c.ok, "detail": c.detail} for c in checks(rig)],
        "steps": [{k: getattr(r, k) for k in r.__slots__} for r in rig.steps],
        "samples": [
            {"t": s.t, "rss": s.rss, "usage": s.usage, "limit": s.limit, "cpu": s.cpu}
            | {k: v for k, v in s.metrics.items() if "{" not in k}
            for s in rig.samples
        ],
        "sink": rig.sink_report.get("totals", {}),
        "publisher": rig.publish_report,
    }


def plot(rig: ContainerRig, path: Path, title: str) -> None:
    """RSS, cgroup usage, limit and budget (MiB); CPU limit (cores); delivered frames/s."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = rig.samples
    t = [x.t for x in s]
    fig, (ax_m, ax_c, ax_t) = plt.subplots(
        3, 1, figsize=(11, 8), sharex=True, gridspec_kw={"height_ratios": [3, 1, 1.4]}
    )
    ax_m.plot(t, [x.rss / MiB for x in s], label="RSS anon (bridge)", color="tab:blue")
    ax_m.plot(t, [x.usage / MiB for x in s], label="cgroup usage", color="tab:cyan", lw=0.8)
    ax_m.step(
        t,
        [(x.limit or 0) / MiB for x in s],
        where="post",
        label="memory limit (cgroup)",
        color="tab:red",
    )
    bm = budget_metric(s)
    if bm is not None:
        pts = [(x.t, x.metrics[bm[0]] / MiB) for x in s if bm[0] in x.metrics]
        ax_m.step(*zip(*pts, strict=True), where="post", label=bm[1], color="tab:green")
    charged = [
        (x.t, x.metrics["bridge_memory_charged_bytes"] / MiB)
        for x in s
        if "bridge_memory_charged_bytes" in x.metrics
    ]
    if charged:
        ax_m.plot(*zip(*charged, strict=True), label="charged (governor)", color="tab:olive")
    ring = [
        (x.t, x.metrics["bridge_ring_occupancy_bytes"] / MiB)
        for x in s
        if "bridge_ring_occupancy_bytes" in x.metrics
    ]
    if ring:
        ax_m.plot(*zip(*ring, strict=True), label="ring occupancy", color="tab:orange", lw=0.8)
    ax_m.set_ylabel("MiB")
    ax_m.set_ylim(bottom=0)
    ax_m.legend(loc="upper left", fontsize=8, ncol=3)
    ax_m.set_title(title, fontsize=10)
    ax_c.step(t, [x.cpu or 0 for x in s], where="post", color="tab:purple", label="CPU limit")
    ax_c.set_ylabel("cores")
    ax_c.set_ylim(bottom=0)
    deliv = [
        (x.t, x.metrics["bridge_frames_delivered_total"])
        for x in s
        if "bridge_frames_delivered_total" in x.metrics
    ]
    rates = _smoothed_rate(deliv, 1.0)
    if rates:
        ax_t.plot(*zip(*rates, strict=True), color="tab:gray", label="delivered frames/s (1 s)")
    ax_t.set_ylabel("frames/s")
    ax_t.set_xlabel("seconds")
    ax_t.set_ylim(bottom=0)
    for ax in (ax_m, ax_c, ax_t):
        for r in rig.steps:
            ax.axvline(r.started_t, color="k", lw=0.6, ls=":")
        ax.grid(alpha=0.3)
    for r in rig.steps:
        ax_m.annotate(
            f"{r.index}", (r.started_t, 1.0), xycoords=("data", "axes fraction"),
            fontsize=8, ha="left", va="top",
        )  # fmt: skip
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _smoothed_rate(points: list[tuple[float, float]], window: float) -> list[tuple[float, float]]:
    out = []
    j = 0
    for i, (t, v) in enumerate(points):
        while points[j][0] < t - window:
            j += 1
        if i > j:
            out.append((t, (v - points[j][1]) / (t - points[j][0])))
    return out
