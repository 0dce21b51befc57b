"""``make e2e-container``'s scenarios: the bridge in a real container, resized live under load,
through ``podman update`` directly and through the Kubernetes stand-in.

Run one by hand: ``python -m benchmarks.container.e2e --path podman`` (or ``kube``); the table is
printed and the PNG + JSON go to ``--out``. The pytest wrapper is ``tests/e2e``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

from benchmarks.container import report
from benchmarks.container.resize import PodmanResizer, Resizer
from benchmarks.container.rig import (
    ContainerRig,
    Load,
    MiB,
    RigConfig,
    Step,
)
from benchmarks.container.stale import remove_stale

START_CPU = 1.5
START_MEMORY = 512 * MiB

# CPU down/up, memory up, memory down (twice: to a plain smaller limit, then to just above the
# working set left after the shrink), back up, then both at once.
STEPS = [
    Step("cpu down", 0.5, None),
    Step("cpu up", 1.5, None),
    Step("memory up", None, 768 * MiB),
    Step("memory down", None, 384 * MiB),
    Step("memory down to working set", None, "working-set"),
    Step("memory back up", None, 512 * MiB),
    Step("cpu down + memory up", 1.0, 640 * MiB),
    Step("cpu + memory back", START_CPU, START_MEMORY),
]


@dataclass(frozen=True, slots=True)
class Outcome:
    rig: ContainerRig
    text: str
    png: Path
    ok: bool


async def _remove_on_signals(rig: ContainerRig) -> None:
    """SIGTERM/SIGHUP: cancel the run so its ``finally`` removes the container."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    for sig in (signal.SIGTERM, signal.SIGHUP):
        loop.add_signal_handler(sig, task.cancel)


async def run_scenario(
    path: str,
    image: str,
    out_dir: Path,
    *,
    steps: list[Step] | None = None,
    load: Load | None = None,
    name: str | None = None,
    start: tuple[float, int] = (START_CPU, START_MEMORY),
) -> Outcome:
    """One rig run through ``path`` (``podman`` or ``kube``), its table, PNG and JSON."""
    from benchmarks.container import kube as container_kube

    rig = ContainerRig(
        RigConfig(image=image, cpu=start[0], memory=start[1], load=load or Load()),
        tag=path,
    )
    await remove_stale(rig.podman)
    await _remove_on_signals(rig)
    kube = container_kube.KubePath() if path == "kube" else None
    try:
        if kube is not None:
            await rig.run(steps or STEPS, kube.resizer_for, before_bridge=kube.before_bridge)
        else:

            async def direct(r: ContainerRig) -> Resizer:
                assert r.cgroup is not None
                return PodmanResizer(r.podman, r.name, r.cgroup)

            await rig.run(steps or STEPS, direct)
    except BaseException:
        sys.stderr.write(f"--- bridge log (tail) ---\n{await rig.logs()}\n")
        raise
    finally:
        if kube is not None:
            await kube.close()
        await rig.close()
    how = kube.resizer.name if kube is not None and kube.resizer else PodmanResizer.name
    title = (
        f"{name or 'e2e-container'}: bridge in a podman container (--cpus {start[0]:g} "
        f"--memory {start[1] // MiB}Mi),\nresized live via {how}"
    )
    text = report.render(rig, title)
    stem = name or f"e2e-container-{path}"
    await asyncio.to_thread(out_dir.mkdir, parents=True, exist_ok=True)
    png = out_dir / f"{stem}.png"
    report.plot(rig, png, title)
    (out_dir / f"{stem}.json").write_text(json.dumps(report.summary(rig), indent=1, default=str))
    (out_dir / f"{stem}.txt").write_text(text + "\n")
    return Outcome(rig, text, png, all(c.ok for c in report.checks(rig)))


def main(argv: list[str] | None = None) -> int:
    from benchmarks.container import env as container_env

    p = argparse.ArgumentParser(prog="python -m benchmarks.container.e2e", description=__doc__)
    p.add_argument("--path", choices=("podman", "kube"), default="podman")
    p.add_argument("--out", type=Path, default=Path("reports/e2e-container"))
    args = p.parse_args(argv)
    try:
        image = container_env.prepare()
    except container_env.Unavailable as e:
        print(f"SKIPPED: containers cannot run here: {e}")
        return 0
    out = asyncio.run(run_scenario(args.path, image, args.out))
    print(out.text)
    print(f"PNG: {out.png}")
    return 0 if out.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
