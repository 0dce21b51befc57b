"""``make bench-capacity``: the most clouds/s the bridge sustains vs its CPU quota.

For each quota the bridge child runs in its own cgroup (v1 cpu controller, as root: a real CFS
throttle, the mechanism behind a pod's CPU limit) and is offered a fixed load meant to exceed
what it can process (``--offered``, 100k-point lidar, decimated, gRPC, open-loop edges spread
over processes; the ``bound`` column says where it did not). Printed per quota:
delivered clouds/s, the bridge's CPU split into its event loop (main thread) and everything else
(decimation workers, gRPC threads) per delivered cloud, the longest stall, and what bound the
row (the quota, the offered load, or the rest of the machine); a PNG plots clouds/s against
cores. The point: what an in-place CPU resize buys, and where the single loop stops it from
buying more (docs/scaling.md).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.overload import POINTS, RESEND_FRAMES, VOXEL, MiB
from loadgen.aio import run_async
from loadgen.launch import ChildProcess, serve_command
from loadgen.procs import publish_procs
from loadgen.sink import SinkServer

CPU_V1 = Path("/sys/fs/cgroup/cpu")
OFFERED_BOUND = 0.95  # delivered / offered at or above which the offered load was the limit
QUOTA_USED = 0.9  # bridge cores / quota at or above which the quota was the limit
TICK = os.sysconf("SC_CLK_TCK")


def thread_cpu(pid: int) -> tuple[float, float]:
    """(main thread, other threads) CPU seconds of ``pid``."""
    main = other = 0.0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the thread ended
        seconds = (int(fields[11]) + int(fields[12])) / TICK
        if int(task.name) == pid:
            main += seconds
        else:
            other += seconds
    return main, other


async def measure(cores: float, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    group = CPU_V1 / f"simbridge-capacity-{os.getpid()}"
    group.mkdir(exist_ok=True)
    (group / "cpu.cfs_period_us").write_text("100000")
    (group / "cpu.cfs_quota_us").write_text(str(int(cores * 100000)))
    async with SinkServer(listen="127.0.0.1:0", fsync=False) as sink:
        cmd = serve_command(
            *("--ws-port", "0", "--grpc-port", "0", "--http-port", "0"),
            *("--voxel-size", str(VOXEL), "--sink-address", f"127.0.0.1:{sink.port}"),
            *("--max-frame-bytes", str(4 * MiB), "--ring-budget-bytes", str(32 * MiB)),
            *("--session-ttl-seconds", "1", "--log-level", "WARNING"),
            *("--adapt", "--cgroup-poll-seconds", "0.2"),  # workers follow the quota
        )
        cmd = ["sh", "-c", f'echo $$ > {group}/cgroup.procs && exec "$0" "$@"', *cmd]
        child = await ChildProcess.start(cmd, log_path=tmp / f"bridge-{cores:g}.log", timeout=60)
        try:
            url = f"127.0.0.1:{child.port('grpc')}"
            common: dict[str, Any] = dict(
                transport="grpc", url=url, edges=args.edges, points=POINTS, voxel_size=VOXEL,
                resend_buffer_frames=RESEND_FRAMES, drain_timeout_s=60.0,
            )  # fmt: skip
            await publish_procs(
                args.procs, **common, rate_hz=args.offered / args.edges, duration_s=1.0,
                device_prefix="warm",
            )  # fmt: skip
            samples: list[tuple[int, float, float]] = []

            async def sample() -> None:
                while True:
                    samples.append((time.time_ns(), *thread_cpu(child.pid)))
                    await asyncio.sleep(0.1)

            sampler = asyncio.create_task(sample())
            try:
                rep = await publish_procs(
                    args.procs, **common, rate_hz=args.offered / args.edges,
                    duration_s=args.seconds, device_prefix="cap",
                )  # fmt: skip
            finally:
                sampler.cancel()
        finally:
            await child.stop()
    group.rmdir()
    start, end = rep["window_ns"]
    window = (end - start) / 1e9
    delivered = sum(1 for t in rep["_delivered_at_ns"] if start <= t <= end)
    inside = [s for s in samples if start <= s[0] <= end]
    (t0, m0, o0), (t1, m1, o1) = inside[0], inside[-1]
    per = max(1, delivered)
    return {
        "cores": cores,
        "clouds_per_s": delivered / window,
        "loop_ms_per_cloud": 1e3 * (m1 - m0) * window / ((t1 - t0) / 1e9) / per,
        "other_ms_per_cloud": 1e3 * (o1 - o0) * window / ((t1 - t0) / 1e9) / per,
        "bridge_cores": ((m1 - m0) + (o1 - o0)) / ((t1 - t0) / 1e9),
        "stall_s": rep["longest_stall_ms"] / 1e3,
        "gen_lagged": rep["schedule_lagged"],
    }


def bound(row: dict[str, Any], offered: float) -> str:
    """What held a quota's throughput: ``offered`` when the edges got almost everything they
    offered delivered (the row is then only a lower bound: raise ``--offered``), ``quota`` when
    the bridge used its whole CPU quota, else ``machine`` (the generator and the sink, on the
    same cores, left the bridge less than its quota)."""
    if row["clouds_per_s"] >= OFFERED_BOUND * offered:
        return "offered"
    if row["bridge_cores"] >= QUOTA_USED * row["cores"]:
        return "quota"
    return "machine"


def render(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([r["cores"] for r in rows], [r["clouds_per_s"] for r in rows], "o-")
    ax.set_xlabel("bridge CPU quota (cores)")
    ax.set_ylabel("delivered clouds/s (100k points, voxel 0.2 m)")
    ax.set_title("simbridge capacity vs CPU quota")
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


async def main(args: argparse.Namespace) -> int:
    if os.geteuid() != 0 or not os.access(CPU_V1, os.W_OK):
        print("bench-capacity needs root and a writable cgroup v1 cpu controller", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="bench-capacity-"))
    print(
        f"# {POINTS // 1000}k-point clouds, voxel {VOXEL} m, gRPC, {args.edges} edges over "
        f"{args.procs} generator processes offering {args.offered:g}/s, {args.seconds:g} s each"
    )
    print(
        f"{'cores':>5} {'clouds/s':>8} {'loop ms/cloud':>13} {'other ms/cloud':>14} "
        f"{'bridge cores':>12} {'stall s':>7} {'gen lag':>7} {'bound':>7}"
    )
    rows = []
    for cores in args.cores:
        r = await measure(cores, args, tmp)
        r["bound"] = bound(r, args.offered)
        rows.append(r)
        print(
            f"{r['cores']:>5g} {r['clouds_per_s']:>8.1f} {r['loop_ms_per_cloud']:>13.2f} "
            f"{r['other_ms_per_cloud']:>14.2f} {r['bridge_cores']:>12.2f} {r['stall_s']:>7.2f} "
            f"{'LAGGED' if r['gen_lagged'] else 'ok':>7} {r['bound']:>7}",
            flush=True,
        )
    render(rows, args.png)
    print(f"# plot: {args.png}")
    capped = [f"{r['cores']:g}" for r in rows if r["bound"] == "offered"]
    if capped:
        print(
            f"# note: at {', '.join(capped)} core(s) the bridge delivered what was offered: "
            "those rows are a lower bound on capacity (raise --offered)"
        )
    return 0


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cores", nargs="+", type=float, default=[0.5, 1.0, 1.5, 2.0])
    p.add_argument("--offered", type=float, default=300.0)
    p.add_argument("--edges", type=int, default=8)
    p.add_argument("--procs", type=int, default=2)
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--png", type=Path, default=Path("docs/capacity.png"))
    return p.parse_args(argv)


if __name__ == "__main__":
    sys.exit(run_async(main(parse())))
