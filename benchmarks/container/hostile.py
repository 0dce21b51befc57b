"""Hostile load on the bridge in its real container (issue 29, build step 6): the cases of
``make e2e-container`` (a short set at one limit) and ``make e2e-container-full`` (every case at
256m, 400m, 768m and 1g).

Each case runs the project's image with podman (:class:`benchmarks.container.rig.ContainerRig`'s
flags, ``--max-frame-bytes`` 16 MiB), one well-behaved WebSocket edge publishing all along
(``simbridge-loadgen publish``, its own process), the attackers of :mod:`benchmarks.hostile` in
another process, and the reference sink, which is *down* while the attack starts and comes up
half-way (the bridge then holds everything, and afterwards pushes it out under the attack):

    good edge alone (sink down) → attackers on (sink down) → sink up [→ live shrinks] → attackers
    stopped → the good edge drains → checks

What is asserted (:func:`checks`), measured from outside the bridge:
  * 0 OOM kills: the cgroup's ``oom_kill`` counter, podman's OOMKilled, exit code 137, the
    kernel log, and the container still running with the same PID;
  * anonymous memory charged to the cgroup (``memory.stat``) ≤ the limit at every 100 ms sample;
  * the good edge: every seq delivered exactly once at the sink (its record file), nothing left
    undelivered at the edge, and its longest stall with the sink up ≤ :data:`STALL_BOUND_S`;
  * ``/healthz`` answered within :data:`HEALTHZ_BOUND_S` by every probe (every 100 ms, from a
    thread of the harness);
  * the attack really ran (every attacker sent something), and a shrink really shrank.

Run one by hand: ``python -m benchmarks.container.hostile --case ignore-pause --limit 400``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import signal
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.container import report
from benchmarks.container.good_edge import GoodEdge, good_edge_at_sink
from benchmarks.container.hostile_cases import CASES, Case, Timing
from benchmarks.container.probe import HealthProbe, free_port, round_up
from benchmarks.container.resize import DirectResizer
from benchmarks.container.rig import (
    MIN_BUDGET,
    SAMPLE_S,
    ContainerRig,
    Load,
    MiB,
    RigConfig,
    Step,
)
from benchmarks.container.stale import remove_stale
from bridge.resources.from_settings import memory_headroom_bytes as governor_headroom

MAX_FRAME = 16 * MiB
#: More ``simbridge serve`` flags for every case (``--serve-flag``: experiments, e.g. whether
#: a case behaves the same with ``--passthrough``).
EXTRA_SERVE_ARGS: tuple[str, ...] = ()
FLOOD_FRAME = 15 * MiB
CPU = 1.5
#: The good edge's longest time without a frame reaching the sink while the sink is up (the
#: issue's target; a stall is measured, reported, and asserted against this).
STALL_BOUND_S = 2.0
#: A probe is set apart from the /healthz bound when a trivial HTTP server on the host, probed at
#: the same instant from the same probe process, took longer than this: the host's CPUs were busy
#: (the 2-vCPU VM runs the attackers, the sink and the publisher beside the container), not the
#: bridge. Measured: such a server answered in 107 ms once while a benchmark ran. Such probes
#: are reported, and more than HOST_BUSY_SHARE of them fails the check: the host was too busy
#: to judge the bridge.
HOST_BUSY_S = 0.05
HOST_BUSY_SHARE = 0.05
#: The good edge publishes this long past the nominal end of the attack (measured: the sink and
#: the attackers took up to 3 s to start on the loaded 2-core VM, and a fixed-length run then
#: ended before the attack did, which read as a 2.8-4 s "stall" at the end).
PUBLISH_SLACK_S = 5.0
HEALTHZ_TARGET_S = 0.100
#: The asserted ``/healthz`` bound: the target unless a slower VM states a looser one.
HEALTHZ_BOUND_S = float(os.environ.get("SIMBRIDGE_E2E_HEALTHZ_BOUND_MS", "100")) / 1000
LIMITS_FULL = (256 * MiB, 400 * MiB, 768 * MiB, 1024 * MiB)
SHORT_LIMIT = 400 * MiB
#: One well-behaved edge: 2 streams of 20k-point clouds (240 KB) at 10 Hz.
GOOD = Load(transports=("ws",), edges=1, streams_per_edge=2, rate_hz=10.0, points=20_000)


class HostileRig(ContainerRig):
    """One case: the bridge container, the good edge, the attackers, the sink down then up."""

    def __init__(self, case: Case, limit: int, image: str, timing: Timing, workdir: Path) -> None:
        cfg = RigConfig(
            image=image,
            cpu=CPU,
            memory=limit,
            load=GOOD,
            max_frame_bytes=MAX_FRAME,
            ws_margin=16 * MiB,  # "just above the working set"
            extra_args=("--sink-backoff-max-seconds", "0.5", *EXTRA_SERVE_ARGS),
        )
        super().__init__(cfg, tag=f"{case.name}-{limit // MiB}")
        self.case, self.limit, self.timing = case, limit, timing
        self.record = workdir / f"{self.name}.sink.jsonl"
        self.health: HealthProbe | None = None
        self.attack_report: dict[str, Any] = {}
        self.attack_started_t: float | None = None
        self.attack_stopped_t: float | None = None
        self.sink_up_t: float | None = None
        self.window_ns = (0, 0)
        self.good = GoodEdge()
        self.shrink_notes: list[str] = []
        self.throttle: dict[str, int] = {}  # cpu.stat growth over the case (CFS throttling)

    def cpu_stat(self) -> dict[str, int]:
        """The container's ``cpu.stat`` (periods, throttled periods, throttled time)."""
        if self.cgroup is None:
            return {}
        try:
            text = (self.cgroup.cpu_dir / "cpu.stat").read_text()
        except OSError:
            return {}
        return {k: int(v) for k, _, v in (ln.partition(" ") for ln in text.splitlines()) if v}

    async def _hold(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while self.died_t is None and time.monotonic() < end:
            if not self.alive():
                self._died()
            await asyncio.sleep(0.1)

    async def start_attack(self) -> asyncio.subprocess.Process:
        proc = await self._spawn(
            sys.executable,
            "-m",
            "benchmarks.hostile",
            "--ws",
            f"ws://127.0.0.1:{self.ports['ws']}/v1/ingest",
            "--grpc",
            f"127.0.0.1:{self.ports['grpc']}",
            "--frame-bytes",
            str(FLOOD_FRAME),
            "--max-frame-bytes",
            str(MAX_FRAME),
            *itertools.chain.from_iterable(("--attack", a) for a in self.case.attacks),
        )
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
        if line.strip() != "attacks running":
            _, err = await proc.communicate()
            raise RuntimeError(f"attackers did not start: {line!r} {err.decode()[-2000:]}")
        return proc

    async def stop_attack(self, proc: asyncio.subprocess.Process) -> dict[str, Any]:
        if proc.returncode is not None:
            return {"error": f"attackers ended early (exit {proc.returncode})"}
        proc.send_signal(signal.SIGTERM)
        try:
            out, err = await asyncio.wait_for(proc.communicate(), 30)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            return {"error": "attackers gave no summary within 30 s"}
        lines = out.decode().strip().splitlines()
        try:
            rep: dict[str, Any] = json.loads(lines[-1])
        except (IndexError, ValueError):
            return {"error": f"attackers exited {proc.returncode}: {err.decode()[-500:]}"}
        return rep

    def anon_working_set_limit(self, window_s: float = 1.0) -> int:
        """Just above the anonymous memory of the last ``window_s`` (``ws_margin``), never below
        the governor's floor (:meth:`working_set_limit`'s). Anonymous memory, not usage: page
        cache is reclaimed when the limit falls, anonymous memory can only be OOM-killed."""
        now = self.now()
        anon = max((s.cg_anon for s in self.samples if s.t >= now - window_s), default=0)
        floor = self.working_set_limit() if anon == 0 else 0
        governor_floor = self.baseline_rss() + governor_headroom(self.cfg.max_frame_bytes)
        return round_up(max(anon + self.cfg.ws_margin, governor_floor + MIN_BUDGET, floor), 4 * MiB)

    async def _shrink(self) -> None:
        """Two live decreases with ``podman update --memory`` (runc update; the kernel reclaims
        page cache to get there): half-way to just above the anonymous working set, then to it.
        A step whose target is not below the current limit is skipped and noted."""
        assert self.cgroup is not None
        resizer = DirectResizer(self.podman, self.name)
        await self._hold(self.timing.settle_s)
        for i in (1, 2):
            if self.died_t is not None:
                return
            target = self.anon_working_set_limit()
            if i == 1:
                target = round_up((target + self._cur_mem) // 2, 4 * MiB)
            if target >= self._cur_mem:
                self.shrink_notes.append(
                    f"shrink {i}: no room: anon working set + margin {target // MiB} MiB is not "
                    f"below the limit {self._cur_mem // MiB} MiB"
                )
            else:
                step = Step(f"shrink {i} to the working set", None, target)
                self.steps.append(await self._apply(i, step, resizer))
            await self._hold(self.timing.shrink_hold_s)

    async def run_case(self) -> None:
        t = self.timing
        self._t0 = time.monotonic()
        sink_port = next(p for p in iter(free_port, 0) if p not in self.ports.values())
        self._sink_addr = f"127.0.0.1:{sink_port}"  # nobody listens there yet
        await self.start_bridge()
        cpu0 = self.cpu_stat()
        self.health = HealthProbe(self.ports["http"])
        self.health.start()
        sampler = asyncio.ensure_future(self._sample_loop())
        attack: asyncio.subprocess.Process | None = None
        try:
            # Past the attack by PUBLISH_SLACK_S: starting the attackers and the sink takes
            # seconds on a loaded VM, and the good edge must publish until the attack ends.
            publish_s = t.warmup_s + t.attack_s(self.case) + PUBLISH_SLACK_S
            publisher = await self.start_publisher("ws", publish_s)
            await self._hold(t.warmup_s)
            self.attack_started_t = self.now()
            if self.case.attacks and self.died_t is None:
                attack = await self.start_attack()
            await self._hold(t.down_s)
            if self.died_t is None:
                await self.start_sink(self._sink_addr, self.record)
                self.sink_up_t, sink_up_ns = self.now(), time.time_ns()
                if self.case.shrink:
                    await self._shrink()
                await self._hold(t.up_s)
                self.window_ns = (sink_up_ns, time.time_ns())
            self.attack_stopped_t = self.now()
            if attack is not None:
                self.attack_report = await self.stop_attack(attack)
            try:
                self.publish_report = await self._json_output(publisher, "good edge")
            except RuntimeError as e:
                self.publish_report = {"error": str(e)[-500:]}
            self.load_ended_t = self.now()
            await asyncio.sleep(0.5)  # the last samples
        finally:
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler
            self.health.stop()
        cpu1 = self.cpu_stat()
        self.throttle = {k: v - cpu0.get(k, 0) for k, v in cpu1.items() if k in cpu0}
        await self.collect_end()
        if self._sink_proc is not None:
            with contextlib.suppress(RuntimeError):
                self.sink_report = await self.stop_sink()
        self.good = await asyncio.to_thread(
            good_edge_at_sink,
            self.record,
            f"{self.name}-ws-",
            self.window_ns,
            self.publish_report,
        )


# ----------------------------------------------------------------------------- checks, table


def checks(rig: HostileRig) -> list[report.Check]:
    by_name = {c.name: c for c in report.checks(rig)}  # the resize e2e's OOM and restart checks
    g = rig.good
    samples = [s for s in rig.samples if s.limit]
    over = [s for s in samples if s.cg_anon > (s.limit or 0)]
    worst = max((s.cg_anon / (s.limit or 1) for s in samples), default=0.0)
    gap = max((b.t - a.t for a, b in itertools.pairwise(samples)), default=0.0)
    proc_worst = max((s.rss / (s.limit or 1) for s in samples), default=0.0)
    hz, probes, failed = _healthz(rig)
    busy = _host_busy(rig)
    busy_share = len(busy) / max(1, probes + len(busy))
    attackers = {k: v for k, v in rig.attack_report.items() if isinstance(v, dict)}
    idle = [k for k, v in attackers.items() if int(v.get("messages", 0)) == 0 or v.get("error")]
    if not rig.case.attacks:
        applied, applied_detail = True, "no attackers in this case"
    elif rig.died_t is not None:
        applied, applied_detail = True, "the bridge died under the attack (attackers killed)"
    else:
        applied = bool(attackers) and not idle
        applied_detail = (
            ", ".join(
                f"{k}: {v['messages']} msgs {v['bytes_sent'] / MiB:.0f} MiB, "
                f"{v['connects']} connects, {v['closes']} closes"
                for k, v in attackers.items()
            )
            or str(rig.attack_report.get("error", "no attacker report"))
        ) + (f"; idle or failed: {idle}" if idle else "")
    out = [
        report.Check("hostile load applied", applied, applied_detail),
        by_name["container restarts 0"],
        by_name["OOM kills 0"],
        report.Check(
            "anon RSS ≤ limit at every 100 ms sample",
            not over and len(samples) > 10 and gap <= 3 * SAMPLE_S,
            f"{len(samples)} samples of the cgroup's anon (memory.stat), {len(over)} over, "
            f"longest between two {gap * 1000:.0f} ms; worst anon/limit {worst:.2f} (the bridge "
            f"process's RssAnon: {proc_worst:.2f})",
        ),
        report.Check(
            "good edge: every seq exactly once",
            g.lost == 0 and g.duplicated == 0 and g.undelivered_at_edge == 0 and g.published > 0,
            f"published {g.published}, delivered {g.delivered}, lost {g.lost}, duplicated "
            f"{g.duplicated}, undelivered at the edge {g.undelivered_at_edge}, disconnects "
            f"{g.disconnects}"
            + (
                f"; edge: {rig.publish_report['error'][:300]}"
                if "error" in rig.publish_report
                else ""
            ),
        ),
        report.Check(
            f"good edge: longest stall with the sink up ≤ {STALL_BOUND_S:g} s",
            rig.died_t is None and 0 <= g.stall_s <= STALL_BOUND_S,
            f"longest stall {g.stall_s:.2f} s, first frame {g.first_after_s:.2f} s after the sink "
            "came up; the frame that ended it: capture→accept {:.2f} s, accept→processed {:.2f} s, "
            "processed→sink {:.2f} s; the edge's longest capture gap {:.2f} s".format(
                *g.stall_end_delays_s, g.capture_gap_s
            )
            + (
                f"; measured to its last frame: it published until "
                f"{g.published_until_s_before_end:.2f} s before the attackers stopped"
                if g.published_until_s_before_end > 0
                else ""
            )
            + ("; the bridge died, so the good edge stalled for good" if rig.died_t else ""),
        ),
        report.Check(
            f"/healthz within {HEALTHZ_BOUND_S * 1000:.0f} ms throughout",
            probes > 10 and failed == 0 and hz <= HEALTHZ_BOUND_S and busy_share <= HOST_BUSY_SHARE,
            f"max {hz * 1000:.0f} ms over {probes} probes (p50 {_healthz_q(rig, 0.5):.0f}, p99 "
            f"{_healthz_q(rig, 0.99):.0f} ms), {failed} failed (target "
            f"{HEALTHZ_TARGET_S * 1000:.0f} ms, asserted {HEALTHZ_BOUND_S * 1000:.0f} ms)"
            + _host_busy_note(busy, busy_share),
        ),
    ]
    if rig.case.shrink:
        shrunk = [
            r for r in rig.steps if r.cgroup_memory is not None and r.cgroup_memory < rig.limit
        ]
        notes = [n for r in rig.steps for n in r.notes] + rig.shrink_notes
        out.append(
            report.Check(
                "live shrinks applied and seen",
                rig.died_t is not None or (bool(shrunk) and all(r.match for r in rig.steps)),
                ", ".join(
                    f"{_mib(rig.limit)} → {_mib(r.target_memory)} MiB "
                    f"{'seen' if r.match else 'NOT seen'} by the bridge"
                    for r in rig.steps
                )
                + (f"; {'; '.join(notes)}" if notes else ""),
            )
        )
    return out


def _probe_window(rig: HostileRig) -> tuple[float, float]:
    """From the good edge's start to the end (to its death: a dead bridge answers nothing,
    which is the OOM check's)."""
    end = rig._t0 + (rig.load_ended_t if rig.load_ended_t is not None else rig.now())
    if rig.died_t is not None:
        end = rig._t0 + rig.died_t
    return rig._t0, end


def _healthz(rig: HostileRig) -> tuple[float, int, int]:
    """Worst ``/healthz`` latency, probes and failures, the probes when the host was busy set
    apart (:data:`HOST_BUSY_S`)."""
    if rig.health is None:
        return 0.0, 0, 0
    return rig.health.worst(*_probe_window(rig), HOST_BUSY_S)


def _healthz_q(rig: HostileRig, q: float) -> float:
    if rig.health is None:
        return 0.0
    return 1000 * rig.health.percentile(*_probe_window(rig), q, HOST_BUSY_S)


def _host_busy(rig: HostileRig) -> list[tuple[float, float]]:
    if rig.health is None:
        return []
    return rig.health.host_busy(*_probe_window(rig), HOST_BUSY_S)


def _host_busy_note(busy: list[tuple[float, float]], share: float) -> str:
    if not busy:
        return f"; the control server never took over {HOST_BUSY_S * 1000:.0f} ms"
    worst = max(busy)
    return (
        f"; {len(busy)} probe(s) set apart ({share:.0%}, at most {HOST_BUSY_SHARE:.0%} may be) "
        f"because a trivial server on the host took over {HOST_BUSY_S * 1000:.0f} ms at the "
        f"same instant: the worst of them {worst[0] * 1000:.0f} ms (control "
        f"{worst[1] * 1000:.0f} ms)"
    )


def _mib(n: int | None) -> str:
    return "max" if n is None else f"{n / MiB:.0f}"


TABLE_HEAD = (
    "case",
    "limit",
    "peak anon/limit",
    "OOM",
    "good lost/dup",
    "longest stall s",
    "/healthz max ms",
    "verdict",
)


def row(rig: HostileRig) -> tuple[str, ...]:
    res = checks(rig)
    by = {c.name: c for c in res}
    samples = [s for s in rig.samples if s.limit]
    peak = max(samples, key=lambda s: s.cg_anon / (s.limit or 1), default=None)
    hz, _, failed = _healthz(rig)
    g = rig.good
    failing = [c.name.split(":")[0].split(" ≤")[0].split(" within")[0] for c in res if not c.ok]
    return (
        rig.case.name,
        f"{rig.limit // MiB}m",
        "-"
        if peak is None
        else f"{peak.cg_anon / MiB:.0f}/{(peak.limit or 0) / MiB:.0f} = "
        f"{peak.cg_anon / (peak.limit or 1):.2f}",
        "no" if by["OOM kills 0"].ok else "YES",
        f"{g.lost}/{g.duplicated}",
        f"{g.stall_s:.2f}",
        f"{hz * 1000:.0f}" + (f" ({failed} failed)" if failed else ""),
        "PASS" if not failing else "FAIL: " + ", ".join(failing),
    )


def table(rows: list[tuple[str, ...]]) -> str:
    rows = [TABLE_HEAD, *rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(TABLE_HEAD))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class Outcome:
    rig: HostileRig
    text: str
    row: tuple[str, ...]
    ok: bool
    checks: list[report.Check] = field(default_factory=list)


def render(rig: HostileRig) -> str:
    res = checks(rig)
    width = max(len(c.name) for c in res)
    title = (
        f"hostile case {rig.case.name!r} at --memory {rig.limit // MiB}m --cpus {CPU:g} "
        f"(max_frame_bytes {MAX_FRAME // MiB} MiB): {rig.case.what}"
    )
    lines = [title, table([row(rig)]), ""]
    lines += [f"{'PASS' if c.ok else 'FAIL'}  {c.name.ljust(width)}  {c.detail}" for c in res]
    t = rig.timing
    lines.append(
        f"timeline: attackers on at {_t(rig.attack_started_t)} s (sink down), sink up at "
        f"{_t(rig.sink_up_t)} s, attackers off at {_t(rig.attack_stopped_t)} s, good edge "
        f"drained at {_t(rig.load_ended_t)} s (warmup {t.warmup_s:g} s, down {t.down_s:g} s, "
        f"up {t.up_s:g} s)"
    )
    th = rig.throttle
    if th:
        throttled_s = th.get("throttled_time", 1000 * th.get("throttled_usec", 0)) / 1e9
        lines.append(
            f"cpu: throttled in {th.get('nr_throttled', 0)} of {th.get('nr_periods', 0)} CFS "
            f"periods, {throttled_s:.2f} s in all (a /healthz stall can be the --cpus quota)"
        )
    lines += [f"kernel: {line}" for line in rig.kernel_ooms]
    if rig.died_t is not None:
        lines.append(f"note: the container died at {rig.died_t:.1f} s")
    if rig.scrape_errors:
        lines.append(f"note: {rig.scrape_errors} /metrics scrapes failed (cgroup data kept)")
    return "\n".join(lines)


def _t(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def summary(rig: HostileRig) -> dict[str, Any]:
    return {
        "case": rig.case.name,
        "limit": rig.limit,
        "row": dict(zip(TABLE_HEAD, row(rig), strict=True)),
        "checks": [{"name": c.name, "ok": c.ok, "detail": c.detail} for c in checks(rig)],
        "good_edge": asdict(rig.good),
        "attackers": rig.attack_report,
        "publisher": rig.publish_report,
        "healthz": [
            (round(t - rig._t0, 3), round(lat, 4), ok, round(ctl, 4))
            for (t, lat, ok), ctl in zip(rig.health.results, rig.health.control, strict=True)
        ]
        if rig.health
        else [],
        "samples": [
            {"t": s.t, "cg_anon": s.cg_anon, "rss": s.rss, "usage": s.usage, "limit": s.limit}
            | {k: v for k, v in s.metrics.items() if "{" not in k}
            for s in rig.samples
        ],
        "kernel_ooms": rig.kernel_ooms,
    }


async def run_case(
    case: Case, limit: int, image: str, out_dir: Path, timing: Timing | None = None
) -> Outcome:
    """One case at one memory limit; its text, table row, JSON and PNG (under ``out_dir``)."""
    with tempfile.TemporaryDirectory(prefix="simbridge-hostile-") as tmp:
        rig = HostileRig(case, limit, image, timing or Timing(), Path(tmp))
        await remove_stale(rig.podman)
        try:
            await rig.run_case()
        except BaseException:
            sys.stderr.write(f"--- bridge log (tail) ---\n{await rig.logs()}\n")
            raise
        finally:
            if rig.health is not None:
                rig.health.stop()
            logs = await rig.logs(tail=30)
            await rig.close()
    text = render(rig)
    if not all(c.ok for c in checks(rig)):
        text += "\n--- bridge log (tail) ---\n" + logs
    stem = f"hostile-{case.name}-{limit // MiB}m"
    await asyncio.to_thread(out_dir.mkdir, parents=True, exist_ok=True)
    (out_dir / f"{stem}.json").write_text(json.dumps(summary(rig), indent=1, default=str))
    (out_dir / f"{stem}.txt").write_text(text + "\n")
    report.plot(rig, out_dir / f"{stem}.png", text.splitlines()[0])
    res = checks(rig)
    return Outcome(rig, text, row(rig), all(c.ok for c in res), res)


def main(argv: list[str] | None = None) -> int:
    from benchmarks.container import env as container_env

    p = argparse.ArgumentParser(prog="python -m benchmarks.container.hostile", description=__doc__)
    p.add_argument("--case", action="append", choices=sorted(CASES), help="repeatable; all")
    p.add_argument(
        "--limit", action="append", type=int, metavar="MIB", help="repeatable; 400 by default"
    )
    p.add_argument("--out", type=Path, default=Path("reports/e2e-container"))
    p.add_argument(
        "--serve-flag", action="append", default=[], help="repeatable: --serve-flag=--passthrough"
    )
    args = p.parse_args(argv)
    global EXTRA_SERVE_ARGS
    EXTRA_SERVE_ARGS = tuple(args.serve_flag)
    try:
        image = container_env.prepare()
    except container_env.Unavailable as e:
        print(f"SKIPPED: containers cannot run here: {e}")
        return 0
    rows, ok = [], True
    for limit in args.limit or [SHORT_LIMIT // MiB]:
        for name in args.case or list(CASES):
            out = asyncio.run(run_case(CASES[name], limit * MiB, image, args.out))
            print(out.text + "\n", flush=True)
            rows.append(out.row)
            ok = ok and out.ok
    print(table(rows))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
