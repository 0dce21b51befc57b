"""The bridge as a pod (``simbridge serve --processes auto``) in the real container, resized live
under load with CPU steps that change the number of ingest processes N (issue 31, "The container
proof"; ``make e2e-container``).

Why: a resize must move N to what the plan says (a process added when CPUs are added, one
retired when they are taken away or when the memory limit can no longer hold it) without losing
or duplicating a frame, without an OOM kill or a restart, and with every process's memory
together within the limit at every sample.

Steps, from ``--cpus 1 --memory 1g`` (N=1): cpu 2 (N=2), memory 768m (N stays 2), memory 384m
(the limit holds one process: N=1, one retired by memory), memory back to 1g (N=2), cpu 1
(N=1). Why 384m and not 512m: with ``--max-frame-bytes 4MiB`` a process needs 180 MiB and the
supervisor's reserve is at least 64 MiB, so 512m still holds two (424 MiB). The N each step should
give is computed with :func:`bridge.pod.podplan.plan_pod` from the pod's own reserve
(``/debug/resources``) and checked against :data:`INTENDED`: when the plan changes, the check
says which limits to adjust.

The load comes in waves (:data:`WAVES_AFTER`): devices stay in the process they connected to, so
without a new wave after each added process the retired one would hold nothing to move.

Run one by hand: ``python -m benchmarks.container.pod_steps`` (table on stdout, PNG + JSON under
``--out``); the pytest wrapper is ``tests/e2e/test_container.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path

from benchmarks.container import pod_report, report
from benchmarks.container.e2e import Outcome, _remove_on_signals
from benchmarks.container.pod_rig import PodRig, PodScenario
from benchmarks.container.resize import PodmanResizer, Resizer
from benchmarks.container.rig import ContainerRig, Load, MiB, RigConfig, Step
from benchmarks.container.stale import remove_stale

START_CPU = 1.0
START_MEMORY = 1024 * MiB
SETTLE_S = 15.0  # a step's N must equal the plan within this (a retiring process drains first)
HOLD_S = 20.0  # each step's time under load, settling included

STEPS = [
    Step("cpu 2: a process added", 2.0, None, HOLD_S),
    Step("memory 768m: N stays", None, 768 * MiB, HOLD_S),
    Step("memory 384m: one retired by memory", None, 384 * MiB, HOLD_S),
    Step("memory back to 1g: added again", None, 1024 * MiB, HOLD_S),
    Step("cpu 1: one retired by CPU", 1.0, None, HOLD_S),
]
#: N at the start, then after each step, as the scenario means it (the plan must agree).
INTENDED = (1, 2, 2, 1, 2, 1)
#: A new wave of devices after the steps that add a process: the kernel spreads their connections
#: over every process (devices already connected stay where they are), so each retirement moves
#: some (a whole wave in one process, which would leave nothing to move: 2**-16).
WAVES_AFTER = (1, 4)
#: Each wave: 16 devices (8 per transport, one connection each), one stream each at 10 Hz
#: (48 devices, 480 clouds of 2,000 points a second in the last steps).
LOAD = Load(edges=8, streams_per_edge=1, rate_hz=10.0, points=2_000)


async def run_pod_scenario(
    image: str, out_dir: Path, *, steps: list[Step] | None = None, name: str = "e2e-container-pod"
) -> Outcome:
    """One run: the pod in a container, resized through ``podman update``; table, PNG, JSON."""
    with tempfile.TemporaryDirectory(prefix="simbridge-pod-e2e-") as tmp:
        cfg = RigConfig(
            image=image,
            cpu=START_CPU,
            memory=START_MEMORY,
            load=LOAD,
            processes="auto",
        )
        scenario = PodScenario(INTENDED, SETTLE_S, WAVES_AFTER)
        rig = PodRig(cfg, scenario, Path(tmp) / "sink.jsonl")
        await remove_stale(rig.podman)
        await _remove_on_signals(rig)

        async def direct(r: ContainerRig) -> Resizer:
            assert r.cgroup is not None
            return PodmanResizer(r.podman, r.name, r.cgroup)

        try:
            await rig.run(steps or STEPS, direct)
        except BaseException:
            sys.stderr.write(f"--- pod log (tail) ---\n{await rig.logs(80)}\n")
            raise
        finally:
            log_tail = await rig.logs(80)
            await rig.close()
        pauses = await asyncio.to_thread(pod_report.device_pauses, rig)
        stages = await asyncio.to_thread(pod_report.stage_delays, rig)
    title = (
        f"{name}: the bridge as a pod (--processes auto) in a podman container (--cpus "
        f"{START_CPU:g} --memory {START_MEMORY // MiB}Mi), resized live via podman update"
    )
    checks = pod_report.checks(rig, pauses)
    text = pod_report.render(rig, title, checks, pauses, stages)
    await asyncio.to_thread(out_dir.mkdir, parents=True, exist_ok=True)
    png = out_dir / f"{name}.png"
    report.plot(rig, png, title)
    summary = report.summary(rig) | pod_report.summary(rig, checks, pauses)
    summary["stage_delays_s"] = stages
    (out_dir / f"{name}.json").write_text(json.dumps(summary, indent=1, default=str))
    (out_dir / f"{name}.txt").write_text(text + "\n")
    if not all(c.ok for c in checks):
        sys.stderr.write(f"--- pod log (tail) ---\n{log_tail}\n")
    return Outcome(rig, text, png, all(c.ok for c in checks))


def main(argv: list[str] | None = None) -> int:
    from benchmarks.container import env as container_env

    p = argparse.ArgumentParser(
        prog="python -m benchmarks.container.pod_steps", description=__doc__
    )
    p.add_argument("--out", type=Path, default=Path("reports/e2e-container"))
    args = p.parse_args(argv)
    try:
        image = container_env.prepare()
    except container_env.Unavailable as e:
        print(f"SKIPPED: containers cannot run here: {e}")
        return 0
    out = asyncio.run(run_pod_scenario(image, args.out))
    print(out.text)
    print(f"PNG: {out.png}")
    return 0 if out.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
