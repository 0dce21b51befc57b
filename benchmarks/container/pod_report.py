"""What the pod's container run proves (:mod:`benchmarks.container.pod_steps`): its checks, its
step table and each device's delivery pauses.

The single bridge's checks (:func:`benchmarks.container.report.checks`) hold as they are for
loss, restarts, OOM kills and the resize calls. Three change meaning in a pod:

- duplicates: a retiring process keeps the frames it could not push yet and pushes them later,
  so the sink may receive a frame twice; the sink keeps it once (its dedupe). What must hold is
  every published frame exactly once after that, with no announced gap and no contradiction;
  the raw duplicates and the edges' resends are reported;
- disconnects: retiring a process moves its devices (Drain, reconnect, resume), and only its
  own: the edges' disconnects must equal the sessions the retired processes held, every process
  must keep its sessions when one is added, and each device's longest pause between two frames at
  the sink must stay bounded (pauses past :data:`PAUSE_S` are listed: on a step that moves
  nothing they say the pod or the host stalled);
- reported limits: each process reports its share, not the cgroup's limits; the pod's plan
  (``/debug/resources``) must hold the cgroup's limits and N must equal the plan.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from benchmarks.container.report import Check
from benchmarks.container.report import checks as rig_checks
from loadgen.record import FrameRecord, decode

if TYPE_CHECKING:
    from benchmarks.container.pod_rig import PodRig

MiB = 1 << 20
PAUSE_S = 0.5  # a device with no frame at the sink for this long was moved (or stalled)
MOVE_BOUND_S = 5.0  # a moved device's pause: Drain, reconnect after reconnect_ms, claim, resend
KEPT = ("0 lost", "container restarts 0", "OOM kills 0", "resizes applied")

# (window index → device → longest gap between two frames at the sink, seconds)
Pauses = list[dict[str, float]]
#: Where a frame's time went (its record's clocks: the publisher's schedule, the bridge's ingest
#: and processed times, the sink's receipt; one host clock): the longest of each per window.
STAGES = ("edge→bridge", "in bridge", "bridge→sink")


def _window_of(spans: list[tuple[float, float]], t: float) -> int | None:
    return next((i for i, (lo, hi) in enumerate(spans) if lo <= t < hi), None)


def windows(rig: PodRig) -> list[tuple[float, float]]:
    """[start, end) in rig seconds: 0 is the start (before the first step), i is step i."""
    starts = [0.0] + [r.started_t for r in rig.steps]
    ends = [*starts[1:], rig.load_ended_t or rig.now()]
    return list(zip(starts, ends, strict=True))


def _records(rig: PodRig) -> Iterator[FrameRecord]:
    """The sink's record of the run, duplicates left out."""
    with open(rig.record_path) as f:
        for line in f:
            if line.strip():
                rec, dup = decode(line)
                if not dup:
                    yield rec


def device_pauses(rig: PodRig) -> Pauses:
    """Each window's longest gap per device between two consecutive frames received by the
    sink (its record, every stream of the device together; a gap counts where it ends)."""
    arrivals: dict[str, list[int]] = defaultdict(list)
    for rec in _records(rig):
        arrivals[rec.device_id].append(rec.received_ns)
    spans = windows(rig)
    out: Pauses = [{} for _ in spans]
    for device, times in arrivals.items():
        times.sort()
        for a, b in itertools.pairwise(times):
            i = _window_of(spans, (b - rig.wall0_ns) / 1e9)
            if i is not None:
                out[i][device] = max(out[i].get(device, 0.0), (b - a) / 1e9)
    return out


def stage_delays(rig: PodRig) -> list[dict[str, float]]:
    """Each window's longest time a frame spent in each of :data:`STAGES` (where a pause was)."""
    spans = windows(rig)
    out = [dict.fromkeys(STAGES, 0.0) for _ in spans]
    for rec in _records(rig):
        i = _window_of(spans, (rec.received_ns - rig.wall0_ns) / 1e9)
        if i is None or not (rec.capture_ns and rec.ingest_ns and rec.processed_ns):
            continue
        marks = (rec.capture_ns, rec.ingest_ns, rec.processed_ns, rec.received_ns)
        for name, a, b in zip(STAGES, marks, marks[1:], strict=False):
            out[i][name] = max(out[i][name], (b - a) / 1e9)
    return out


def checks(rig: PodRig, pauses: Pauses) -> list[Check]:
    intended, settle_s = rig.scenario.intended, rig.scenario.settle_s
    base = {c.name: c for c in rig_checks(rig)}
    sink = rig.sink_report.get("totals", {})
    pub = rig.publish_report
    published = int(pub.get("published", -1))
    delivered, received = int(sink.get("delivered", -2)), int(sink.get("received", -3))
    dups = int(sink.get("duplicates", -1))
    over = [s for s in rig.samples if s.limit is not None and s.rss > s.limit]
    worst = max((s.rss / s.limit for s in rig.samples if s.limit), default=0.0)
    anon_worst = max((s.cg_anon / s.limit for s in rig.samples if s.limit), default=0.0)
    most = max((len(p) for _, p in rig.proc_samples), default=0)
    expected = [p.expected for p in rig.pod_steps]
    unsettled = [p.index for p in rig.pod_steps if p.settle_s is None]
    flaps = _n_after_settle(rig)
    retiring = [p for p in rig.pod_steps if p.n_before is not None and p.expected < p.n_before]
    moved = sum(p.moved for p in retiring)
    # Adding a process moves no connection: every process keeps the sessions it held.
    kept = {
        p.index: all(p.sessions_after.get(k, 0) >= v for k, v in p.sessions_before.items())
        for p in rig.pod_steps
        if p not in retiring and p.settle_s is not None
    }
    disconnects = int(pub.get("disconnects", -1))
    longest = max((g for w in pauses for g in w.values()), default=0.0)
    return [
        base["0 lost"],
        Check(
            "0 duplicates after the sink's dedupe, 0 gaps",
            delivered == published
            and received == delivered + dups
            and sink.get("gap_frames", 1) == 0
            and sink.get("gap_contradictions", 1) == 0,
            f"published {published}, delivered once each {delivered}; raw: received "
            f"{received}, duplicates (deduped) {dups}, resent by the edges {_resent(pub)}; "
            f"announced gap frames {sink.get('gap_frames')}, contradictions "
            f"{sink.get('gap_contradictions')}",
        ),
        base["container restarts 0"],
        base["OOM kills 0"],
        base["resizes applied"],
        Check(
            "sum of every process's RSS ≤ limit at every 100 ms sample",
            not over and len(rig.samples) > 10 and most >= 2,
            f"{len(rig.samples)} samples of the container's processes' anon RSS summed (up to "
            f"{most} processes at once), {len(over)} over; worst sum/limit {worst:.2f}, "
            f"cgroup anon/limit {anon_worst:.2f}",
        ),
        Check(
            "the plan gives the intended N at every step",
            rig.n_start == intended[0] and expected == list(intended[1 : len(expected) + 1]),
            f"N at start {rig.n_start} (intended {intended[0]}); plan_pod per step {expected}, "
            f"intended {list(intended[1 : len(expected) + 1])} (reserve "
            f"{rig.reserve / MiB:.0f} MiB; adjust the limits if they differ)",
        ),
        Check(
            "retiring moves only the retired processes' devices, with a bounded pause",
            bool(retiring)
            and all(p.moved > 0 for p in retiring)
            and disconnects == moved
            and all(kept.values())
            and longest <= MOVE_BOUND_S,
            f"devices on the retired process before each retiring step "
            f"{ {p.index: p.moved for p in retiring} } (each > 0: the step moved devices), "
            f"edge disconnects {disconnects} (= the {moved} moved: no other device moved); "
            f"sessions kept by every process on the other steps {kept} (adding a process moves "
            f"no connection); longest pause of any device at the sink {longest:.2f} s "
            f"(≤ {MOVE_BOUND_S:g})",
        ),
        Check(
            f"N reported = plan within {settle_s:g} s of every step, and kept",
            bool(rig.pod_steps) and not unsettled and not flaps,
            f"{len(rig.pod_steps)} steps, settle s "
            f"{[None if p.settle_s is None else round(p.settle_s, 1) for p in rig.pod_steps]}"
            f", not settled: {unsettled or 'none'}, N off the plan after settling: "
            f"{flaps or 'never'}",
        ),
    ]


def _resent(pub: dict[str, Any]) -> int:
    return sum(int(r.get("resent", 0)) for r in pub.get("by_transport", {}).values())


def _n_after_settle(rig: PodRig) -> list[str]:
    """Steps whose ``bridge_pod_processes`` left the plan after it had settled."""
    out = []
    spans = windows(rig)[1:]
    for ps, res, (_, end) in zip(rig.pod_steps, rig.steps, spans, strict=False):
        if ps.settle_s is None:
            continue
        since = res.started_t + res.resize_ms / 1000 + ps.settle_s + 1.0  # a scrape's age
        seen = {
            s.metrics["bridge_pod_processes"]
            for s in rig.samples
            if since <= s.t < end and "bridge_pod_processes" in s.metrics
        }
        if seen - {float(ps.expected)}:
            out.append(f"step {ps.index}: {sorted(seen)}")
    return out


def _rss_by_process(rig: PodRig, lo: float, hi: float) -> str:
    peak: dict[int, int] = {}
    for t, per in rig.proc_samples:
        if lo <= t < hi:
            for pid, anon in per.items():
                slot = rig.slot_of.get(pid, 1000 + pid)
                peak[slot] = max(peak.get(slot, 0), anon)
    names = {-1: "sup"}
    return " · ".join(
        f"{names.get(k, f'p{k}' if k < 1000 else f'pid{k - 1000}')} {v / MiB:.0f}"
        for k, v in sorted(peak.items())
    )


def step_table(rig: PodRig, pauses: Pauses) -> str:
    """One row per window (the start, then each step): the limits, N before → after and the
    plan, the settle time, the sessions each process held before the step and how many a
    retirement moved, the moved devices' pauses (the step's longest gaps at the sink, as many
    as devices moved), the devices paused past :data:`PAUSE_S`, and memory."""
    head = [
        "#", "step", "cpu", "MiB", "N before → after", "plan", "settle s",
        "sessions before", "moved", "pause of the moved s", f"paused >{PAUSE_S:g}s",
        "RSS max MiB per process", "sum max / limit",
    ]  # fmt: skip
    rows = [head]
    for i, (lo, hi) in enumerate(windows(rig)):
        window = [s for s in rig.samples if lo <= s.t < hi]
        gaps = sorted(pauses[i].values(), reverse=True) if i < len(pauses) else []
        limit = next((s.limit for s in reversed(window) if s.limit), None)
        mem = f"{max((s.rss for s in window), default=0) / MiB:.0f} / " + (
            f"{limit / MiB:.0f}" if limit else "max"
        )
        ps = rig.pod_steps[i - 1] if 0 < i <= len(rig.pod_steps) else None
        if i == 0:
            row = ["0", "start", f"{rig.cfg.cpu:g}", f"{rig.cfg.memory / MiB:.0f}",
                   f"→ {_n(rig.n_start)}", f"(intended {rig.scenario.intended[0]})", "-", "-",
                   "-", "-"]  # fmt: skip
        elif ps is None:
            r = rig.steps[i - 1]
            row = [str(i), r.label, f"{r.target_cpu:g}", f"{r.target_memory / MiB:.0f}"]
            row += ["-"] * 6
        else:
            r = rig.steps[i - 1]
            moved = gaps[: ps.moved]
            row = [
                str(i),
                r.label,
                f"{r.target_cpu:g}",
                f"{r.target_memory / MiB:.0f}",
                f"{_n(ps.n_before)} → {_n(ps.n_after)}",
                f"{ps.planned} (exp. {ps.expected})",
                "✗" if ps.settle_s is None else f"{ps.settle_s:.1f}",
                " · ".join(f"p{k} {v:g}" for k, v in sorted(ps.sessions_before.items())) or "-",
                str(ps.moved),
                f"{moved[-1]:.2f}-{moved[0]:.2f}" if moved else "-",
            ]
        row += [
            f"{sum(1 for g in gaps if g > PAUSE_S)} of {len(gaps)}",
            _rss_by_process(rig, lo, hi),
            mem,
        ]
        rows.append(row)
    widths = [max(len(row[k]) for row in rows) for k in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _n(v: float | None) -> str:
    return "-" if v is None else f"{v:g}"


def render(
    rig: PodRig,
    title: str,
    results: list[Check],
    pauses: Pauses,
    stages: list[dict[str, float]] | None = None,
) -> str:
    width = max(len(c.name) for c in results)
    lines = [title, "", step_table(rig, pauses), ""]
    lines += [f"{'PASS' if c.ok else 'FAIL'}  {c.name.ljust(width)}  {c.detail}" for c in results]
    lines += [f"note: step {r.index}: {n}" for r in rig.steps for n in r.notes]
    for i, delays in enumerate(stages or []):
        lines.append(
            f"longest time a frame spent, {'start' if i == 0 else f'step {i}'}: "
            + ", ".join(f"{name} {v:.2f} s" for name, v in delays.items())
        )
    for i, window in enumerate(pauses):
        moved = sorted(((g, d) for d, g in window.items() if g > PAUSE_S), reverse=True)
        if moved:
            where = "start" if i == 0 else f"step {i}"
            lines.append(
                f"pauses at the sink, {where}: " + ", ".join(f"{d} {g:.2f} s" for g, d in moved)
            )
    pub, sink = rig.publish_report, rig.sink_report.get("totals", {})
    lat = rig.sink_report.get("latency", {})
    ld = rig.cfg.load
    lines.append(
        f"load: {' + '.join(ld.transports)} publishers, {ld.edges} edges x "
        f"{ld.streams_per_edge} streams each at {ld.rate_hz:g} Hz, {ld.points} points/cloud; "
        f"edges: disconnects {pub.get('disconnects')}, reconnects {pub.get('reconnects')}, "
        f"drains {sum(int(r.get('drains', 0)) for r in pub.get('by_transport', {}).values())}, "
        f"resent {_resent(pub)}, PAUSEs {pub.get('pauses', 0)}; sink duplicates (deduped) "
        f"{sink.get('duplicates')}; capture → sink latency p99 {lat.get('p99_ms', 0):.0f} ms, "
        f"max {lat.get('max_ms', 0):.0f} ms"
    )
    lines += [f"kernel: {line}" for line in rig.kernel_ooms]
    if rig.died_t is not None:
        lines.append(f"note: the container died at {rig.died_t:.1f} s")
    if rig.publish_report.get("error"):
        lines.append(f"note: publishers: {rig.publish_report['error']}")
    if rig.scrape_errors:
        lines.append(f"note: {rig.scrape_errors} /metrics scrapes failed")
    return "\n".join(lines)


def summary(rig: PodRig, results: list[Check], pauses: Pauses) -> dict[str, Any]:
    """The pod's part of the run's JSON (beside :func:`benchmarks.container.report.summary`)."""
    return {
        "checks": [{"name": c.name, "ok": c.ok, "detail": c.detail} for c in results],
        "pod_steps": [{k: getattr(p, k) for k in p.__slots__} for p in rig.pod_steps],
        "n_start": rig.n_start,
        "supervisor_reserve_bytes": rig.reserve,
        "device_pauses_s": pauses,
    }
