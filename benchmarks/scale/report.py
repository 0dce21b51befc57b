"""``make bench-scale``'s output (:mod:`benchmarks.scale.cli`): the table, the statements of what
limited the run, N = 2 against N = 1, the model from the measured per-frame costs, the plot."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.scale.connects import ClaimRtt, ConnectTimes
from benchmarks.scale.explain import comparison_lines
from benchmarks.scale.run import GEN_LOOP_LAGGED, CellResult, GroupInfo

MiB = 1 << 20
MODEL_CORES = (2, 4, 8, 12, 16)
MODEL_PROCS = (1, 2, 4, 8, 12)


#: The rest of the machine (neither the bridge nor the generator) busy at least this many cores
#: during a cell: the row measured a machine others were using.
NOISY_REST_CORES = 0.25


@dataclass(frozen=True)
class Summary:
    """One (workload, N) over the rounds without errors: medians (one round taken by a noisy
    neighbour moves a mean, not a median of three)."""

    workload: str
    procs: int
    rounds: int
    frames_per_s: float
    loop_us: float
    other_us: float
    gen_us: float
    wakeups: float  # per 1000 frames
    preempted: float  # per 1000 frames
    acks: float  # SinkAcks per 1000 frames
    per_push: float  # frames per push message
    conns: int
    frames: float  # delivered in the measured window
    cpu_us: float  # loop + other, the median of the cells' sums


def summary(cells: Sequence[CellResult], workload: str, procs: int) -> Summary | None:
    ok = [
        c
        for c in cells
        if c.workload == workload and c.procs == procs and not c.errors and c.frames > 0
    ]
    if not ok:
        return None
    return Summary(
        workload,
        procs,
        len(ok),
        statistics.median(c.frames_per_s for c in ok),
        statistics.median(c.loop_us_per_frame for c in ok),
        statistics.median(c.other_us_per_frame for c in ok),
        statistics.median(c.gen_us_per_frame for c in ok),
        statistics.median(c.wakeups_per_kframe for c in ok),
        statistics.median(c.preempted_per_kframe for c in ok),
        statistics.median(c.sink_acks_per_kframe for c in ok),
        statistics.median(c.frames_per_push for c in ok),
        ok[0].conns,
        statistics.median(c.frames for c in ok),
        statistics.median(c.loop_us_per_frame + c.other_us_per_frame for c in ok),
    )


def _workloads(cells: Sequence[CellResult]) -> list[str]:
    return list(dict.fromkeys(c.workload for c in cells))


def model_rate(loop_us: float, other_us: float, procs: int, cores: float) -> tuple[float, str]:
    """Frames/s that ``procs`` processes could reach on ``cores`` cores given to the bridge alone,
    at the measured per-frame costs, and which bound holds: ``loops`` (each process's loop takes
    at most one core; connections evenly spread) or ``cores`` (the loops and the other threads
    together take every core)."""
    loops = procs * 1e6 / loop_us
    cpu = cores * 1e6 / (loop_us + other_us)
    return (loops, "loops") if loops <= cpu else (cpu, "cores")


def model_rows(cells: Sequence[CellResult]) -> dict[str, Any]:
    """Per workload: the costs the model uses (N = 2's where measured: they include what a
    second process costs; else N = 1's) and the modelled rate for each (cores, procs <= cores)."""
    out: dict[str, Any] = {}
    for workload in _workloads(cells):
        one, two = summary(cells, workload, 1), summary(cells, workload, 2)
        basis = two or one
        if basis is None:
            continue
        entry: dict[str, Any] = {
            "basis_procs": basis.procs,
            "basis_rounds": basis.rounds,
            "loop_us_per_frame": round(basis.loop_us, 1),
            "other_us_per_frame": round(basis.other_us, 1),
            "generator_us_per_frame": round(basis.gen_us, 1),
            "rates": [],
        }
        if one is not None and two is not None:
            entry["n2_vs_n1_cpu_per_frame_pct"] = round(100 * (two.cpu_us / one.cpu_us - 1), 1)
            entry["n2_vs_n1_loop_per_frame_pct"] = round(100 * (two.loop_us / one.loop_us - 1), 1)
        for cores in MODEL_CORES:
            for procs in MODEL_PROCS:
                if procs > cores:
                    continue
                rate, bound = model_rate(basis.loop_us, basis.other_us, procs, cores)
                entry["rates"].append(
                    {
                        "cores": cores,
                        "procs": procs,
                        "frames_per_s": round(rate),
                        "bound": bound,
                        "generator_cores": round(rate * basis.gen_us / 1e6, 2),
                    }
                )
        out[workload] = entry
    return out


def _f(value: float, fmt: str) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else fmt % value


def format_report(
    host: dict[str, Any],
    config: dict[str, Any],
    groups: Sequence[GroupInfo],
    cells: Sequence[CellResult],
    model: dict[str, Any],
    plain: ConnectTimes | None = None,
    claims: ClaimRtt | None = None,
) -> str:
    ncpu = len(host["bridge_cpus"])
    lines = [
        "# bench-scale: one pod per N, `simbridge serve --processes N` (max:1 for N = 1): the "
        "supervisor and N ingest processes found on its /debug/resources; closed-loop edges over "
        f"{config['transport']}, {config['duration']:g} s per cell after {config['warmup']:g} s",
        f"# CPU: {host['cpu']}; nproc {host['nproc']}; "
        f"bridge on CPUs {_cpus(host['bridge_cpus'])}, "
        f"generator (clients + sink, one process) on CPUs {_cpus(host['generator_cpus'])}",
    ]
    if host["generator_shares_cores"]:
        lines.append(
            f"# GENERATOR SHARES THE BRIDGE'S CORES (CPUs {_cpus(host['shared_cpus'])}): every "
            "core it uses is one the bridge does not get, so frames/s below are lower bounds, not "
            "the bridge's capacity; compare CPU per frame across N"
        )
    else:
        lines.append(
            "# the generator runs on CPUs of its own: it does not share the bridge's cores"
        )
    lines.append(
        "# cloud: 100k-point lidar clouds, 1.2 MB, decimated at 0.2 m; 1KB: 1 KB passthrough "
        "frames. loop = the processes' event loops (main threads), other = every other thread "
        "(decimation workers, gRPC I/O); us per delivered frame, summed over the ingest "
        "processes; the supervisor apart (sup)"
    )
    lines.append("")
    head = (
        f"{'workload':>8} {'N':>2} {'rd':>2} {'wk':>2} {'frames/s':>9} {'xN=1':>5} {'loop us':>8} "
        f"{'other us':>8} {'decim us':>8} {'wake/kf':>7} {'pre/kf':>6} {'acks/kf':>7} "
        f"{'f/push':>6} {'bridge':>6} "
        f"{'sup':>5} {'sup us':>6} {'max loop':>8} {'gen loop':>8} "
        f"{'gen us':>7} {'machine':>7} {'rest':>5} {'gen':>6} {'errors':>6}  loop split %"
    )
    lines.append(head)
    by_procs = {g.procs: g for g in groups}
    for workload in _workloads(cells):
        base = summary(cells, workload, 1)
        rows = sorted((c for c in cells if c.workload == workload), key=lambda c: c.procs)
        for c in rows:
            speedup = c.frames_per_s / base.frames_per_s if base else float("nan")
            split = "/".join(f"{100 * s:.0f}" for s in c.loop_share)
            group = by_procs.get(c.procs)
            lines.append(
                f"{c.workload:>8} {c.procs:>2} {c.round:>2} {group.workers if group else 0:>2} "
                f"{c.frames_per_s:>9.0f} {_f(speedup, '%.2f'):>5} "
                f"{_f(c.loop_us_per_frame, '%.1f'):>8} {_f(c.other_us_per_frame, '%.1f'):>8} "
                f"{_f(c.decimate_us_per_frame, '%.1f'):>8} {_f(c.wakeups_per_kframe, '%.0f'):>7} "
                f"{_f(c.preempted_per_kframe, '%.0f'):>6} "
                f"{_f(c.sink_acks_per_kframe, '%.0f'):>7} {_f(c.frames_per_push, '%.1f'):>6} "
                f"{c.bridge_cores:>6.2f} {c.supervisor_cores:>5.3f} "
                f"{_f(c.supervisor_us_per_frame, '%.2f'):>6} {c.loop_cores_max:>8.2f} "
                f"{c.gen_loop_cores:>8.2f} {_f(c.gen_us_per_frame, '%.1f'):>7} "
                f"{c.machine_cores:>7.2f} {c.rest_cores:>5.2f} "
                f"{'LAGGED' if c.gen_lagged else 'ok':>6} "
                f"{len(c.errors):>6}  {split}"
            )
        lines.append("")
    lines.append(
        "# columns: rd = round; wk = decimation workers per process; decim us = a worker's wall "
        "time per frame decimating and encoding (bridge_decimation_seconds; above the CPU when "
        "it waited for a core or the GIL); wake/kf, pre/kf = the loops' wake-ups "
        "(voluntary context switches of the main threads: epoll found nothing to do) and "
        "preemptions (involuntary ones: the core went to another thread) per 1000 frames; "
        "acks/kf = the sink's acks the processes read per 1000 frames; f/push = frames per "
        "push message the sink read (how well the processes batch their pushes); "
        "bridge = the ingest processes; sup = the supervisor (cores, and us per frame); bridge / "
        "max loop / gen loop / machine / rest in cores (max loop: the busiest process's loop, "
        "1.0 = full; rest: the machine minus pod and generator, others' work); xN=1 against "
        "N = 1's median over the rounds; gen = the generator's loop "
        f"(>= {GEN_LOOP_LAGGED:.2f} core: LAGGED)"
    )
    lines += _statements(cells, groups, ncpu)
    lines += _memory(groups)
    lines += _connect_lines(groups, plain, claims)
    lines += comparison_lines(
        summary(cells, "cloud", 1),
        summary(cells, "cloud", 2),
        summary(cells, "1KB", 1),
        summary(cells, "1KB", 2),
        _claim_cost_us(groups, plain, claims),
        _idle_cores(groups),
        claims.mean_us if claims is not None else float("nan"),
    )
    lines += _model_text(model, host)
    return "\n".join(lines)


def _cpus(cpus: Sequence[int]) -> str:
    return ",".join(map(str, cpus)) or "-"


def _statements(cells: Sequence[CellResult], groups: Sequence[GroupInfo], ncpu: int) -> list[str]:
    out = []
    lagged = [
        f"{c.workload} N={c.procs} ({c.gen_loop_cores:.2f} core)" for c in cells if c.gen_lagged
    ]
    if lagged:
        out.append(
            "# GENERATOR LAGGED in: "
            + ", ".join(lagged)
            + ": its loop was (nearly) full, so those rates are bounded by the generator, "
            "not the bridge"
        )
    else:
        out.append("# generator: did not lag in any cell (its loop stayed below the threshold)")
    over = sorted({g.procs for g in groups if g.procs > ncpu})
    if over:
        out.append(
            f"# N = {', '.join(map(str, over))}: more bridge processes than the {ncpu} CPU(s) "
            "they run on; the kernel time-slices them"
        )
    bad = [c for c in cells if c.errors]
    for c in bad:
        out.append(f"# ERRORS in {c.workload} N={c.procs}: {'; '.join(c.errors[:3])}")
    if not bad:
        out.append("# accounting: every frame sent reached the sink exactly once, in order")
    noisy = [c for c in cells if c.rest_cores >= NOISY_REST_CORES]
    if noisy:
        rest = sorted(c.rest_cores for c in noisy)
        which = (
            ", ".join(f"{c.workload} N={c.procs} rd {c.round}" for c in noisy)
            if len(noisy) <= 4
            else "see the rest column"
        )
        out.append(
            f"# NOISE: other processes kept {rest[0]:.2f}-{rest[-1]:.2f} cores busy in "
            f"{len(noisy)} of {len(cells)} cells ({which}): those rows measured a machine "
            "shared with others"
        )
    for workload in _workloads(cells):
        one, two = summary(cells, workload, 1), summary(cells, workload, 2)
        if one is None or two is None:
            continue
        total = 100 * (two.cpu_us / one.cpu_us - 1)
        loop = 100 * (two.loop_us / one.loop_us - 1)
        out.append(
            f"# {workload}: with N = 2, bridge CPU per frame is {total:+.1f} % vs N = 1 "
            f"({one.cpu_us:.1f} -> {two.cpu_us:.1f} us; loop {loop:+.1f} %; "
            f"medians over {min(one.rounds, two.rounds)} round(s))"
        )
    bad_exit = [f"N={g.procs} rd {g.round}: {g.exit_code}" for g in groups if g.exit_code != 0]
    if bad_exit:
        out.append(
            "# POD EXIT: the pod did not exit 0 after SIGTERM (something undelivered) in "
            + ", ".join(bad_exit)
        )
    return out


def _memory(groups: Sequence[GroupInfo]) -> list[str]:
    out = ["# memory (MiB): each ingest process idle (before the cells) and after them; the "
           "supervisor beside"]  # fmt: skip
    for g in groups:
        idle = ", ".join(f"{r / MiB:.0f}" for r in g.idle_rss)
        pss = ", ".join(f"{r / MiB:.0f}" for r in g.idle_pss)
        end = ", ".join(f"{r / MiB:.0f}" for r in g.end_rss)
        out.append(
            f"# N={g.procs} rd {g.round}: ingest RSS idle [{idle}] (PSS [{pss}]), after [{end}]; "
            f"supervisor (pid {g.supervisor_pid}) RSS {g.supervisor_idle_rss / MiB:.0f} idle, "
            f"{g.supervisor_end_rss / MiB:.0f} after; CPU with no edge: ingest "
            f"{sum(g.idle_cores):.3f} cores, supervisor {g.supervisor_idle_cores:.3f}; "
            f"pids {g.pids}; plan: {g.plan}"
        )
    return out


def _idle_cores(groups: Sequence[GroupInfo]) -> dict[int, float]:
    """N -> the ingest processes' CPU with no edge, summed, in cores (mean over the rounds)."""
    by_n: dict[int, list[float]] = {}
    for g in groups:
        by_n.setdefault(g.procs, []).append(sum(g.idle_cores))
    return {n: statistics.fmean(v) for n, v in by_n.items()}


def _timing(t: Any) -> str:
    return f"{_f(t.p50_ms, '%.2f')} / {_f(t.p90_ms, '%.2f')}"


def _connect_lines(
    groups: Sequence[GroupInfo], plain: ConnectTimes | None, claims: ClaimRtt | None
) -> list[str]:
    rows = ([plain] if plain is not None else []) + [g.connects for g in groups if g.connects]
    if not rows and claims is None:
        return []
    out = [
        "",
        "# session setup, connections one at a time (ms, p50 / p90): connect = TCP + WebSocket "
        "upgrade; hello = Hello -> Welcome of a new device (a pod's claim sits here); resume = "
        "one device reconnecting (at N > 1 it lands on any process: a move is claim + release)",
        f"{'bridge':>14} {'N':>2} {'n':>4} {'connect':>13} {'hello':>13} {'resume':>13}",
    ]
    for r in rows:
        label = "single (no pod)" if r.label == "plain" else "pod"
        out.append(
            f"{label:>14} {r.procs:>2} {r.hello_welcome.count:>4} {_timing(r.connect):>13} "
            f"{_timing(r.hello_welcome):>13} {_timing(r.resume_hello_welcome):>13}"
            + (f"  ERRORS: {'; '.join(r.errors)}" if r.errors else "")
        )
    if claims is not None:
        out.append(
            "# claim round trip alone (claim -> claimed over the supervisor's Unix control "
            f"socket, its real control server and ownership table, {claims.rtt.count} claims): "
            f"p50 {1e3 * claims.rtt.p50_ms:.0f} us, p90 {1e3 * claims.rtt.p90_ms:.0f} us, mean "
            f"{claims.mean_us:.0f} us; the supervisor's CPU "
            f"{claims.supervisor_cpu_us_per_claim:.0f} us per claim"
            + (f"  ERRORS: {'; '.join(claims.errors)}" if claims.errors else "")
        )
    return out


def _claim_cost_us(
    groups: Sequence[GroupInfo], plain: ConnectTimes | None, claims: ClaimRtt | None
) -> float:
    """What one claim adds to a session's setup: the pod's Hello->Welcome at N = 1 minus the
    single bridge's when both were measured (never less than the round trip alone: noise can
    make the difference vanish, the claim's cost cannot), else the round trip alone."""
    rtt = claims.mean_us if claims is not None else float("nan")
    pod1 = [g.connects for g in groups if g.procs == 1 and g.connects is not None]
    if plain is not None and pod1:
        diff = statistics.median(c.hello_welcome.p50_ms for c in pod1) - plain.hello_welcome.p50_ms
        if math.isfinite(diff):
            return max(1e3 * diff, rtt) if math.isfinite(rtt) else max(0.0, 1e3 * diff)
    return rtt


def _model_text(model: dict[str, Any], host: dict[str, Any]) -> list[str]:
    if not model:
        return []
    out = [
        "",
        "# MODEL (not a measurement, not a curve): rate(N, C) = min(N x 1e6 / loop_us, "
        "C x 1e6 / (loop_us + other_us))",
        "#   each loop takes at most one core (connections spread evenly); loops and other threads "
        "share the C cores given to the bridge alone; the generator needs cores of its own "
        "(gen cores = rate x gen_us). Costs: the N = 2 cells' medians (they include a second "
        f"process's overhead) on {host['cpu']}",
    ]
    for workload, entry in model.items():
        out.append(
            f"# {workload}: loop {entry['loop_us_per_frame']} us + other "
            f"{entry['other_us_per_frame']} us per frame (N = {entry['basis_procs']}), "
            f"generator {entry['generator_us_per_frame']} us"
        )
        cores = sorted({r["cores"] for r in entry["rates"]})
        procs = sorted({r["procs"] for r in entry["rates"]})
        out.append("#   " + "C \\ N".rjust(6) + "".join(f"{n:>14}" for n in procs))
        for c in cores:
            row = {r["procs"]: r for r in entry["rates"] if r["cores"] == c}
            cells = "".join(
                f"{row[n]['frames_per_s']:>8} {row[n]['bound'][:5]:>5}" if n in row else f"{'':>14}"
                for n in procs
            )
            out.append(f"#   {c:>6}{cells}")
        top = max(entry["rates"], key=lambda r: r["frames_per_s"])
        gen_us = entry["generator_us_per_frame"]
        out.append(
            f"#   the generator would need {top['generator_cores']:g} cores of its own at "
            f"{top['frames_per_s']} frames/s (N = {top['procs']}, C = {top['cores']}); this "
            f"bench's generator is one process and stops near {1e6 / gen_us:.0f} frames/s"
        )
    return out


def plot(cells: Sequence[CellResult], host: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    loads = _workloads(cells)
    fig, axes = plt.subplots(2, len(loads), figsize=(5 * len(loads), 7), squeeze=False)
    for i, workload in enumerate(loads):
        rows = [c for c in cells if c.workload == workload]
        procs = sorted({c.procs for c in rows})
        ax = axes[0][i]
        for rnd in sorted({c.round for c in rows}):
            mine = sorted((c for c in rows if c.round == rnd), key=lambda c: c.procs)
            ax.plot(
                [c.procs for c in mine], [c.frames_per_s for c in mine], "o-", label=f"round {rnd}"
            )
        for c in rows:
            if c.gen_lagged:
                ax.annotate("gen lagged", (c.procs, c.frames_per_s), fontsize=8)
        ax.set_title(f"{workload}: aggregate frames/s (measured)")
        ax.set_xlabel("ingest processes N (one pod)")
        ax.set_xticks(procs)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        ax = axes[1][i]
        means = [summary(cells, workload, n) for n in procs]
        loop = [m.loop_us if m else 0.0 for m in means]
        ax.bar(range(len(procs)), loop, label="event loops")
        ax.bar(
            range(len(procs)),
            [m.other_us if m else 0.0 for m in means],
            bottom=loop,
            label="other threads",
        )
        ax.set_xticks(list(range(len(procs))), [str(p) for p in procs])
        ax.set_xlabel("ingest processes N (median over rounds)")
        ax.set_ylabel("ingest CPU us per frame (supervisor apart)")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3, axis="y")
    shared = " (generator shares the cores)" if host["generator_shares_cores"] else ""
    fig.suptitle(
        f"bench-scale on {host['cpu']}, {len(host['bridge_cpus'])} CPUs{shared}", fontsize=9
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
