"""``make bench-decimate``: every backend next to Open3D, on the same inputs, in one run.

For humans, not CI (timings on shared VMs are noisy, docs/design.md §6): each method is warmed
up, then timed several times and the median reported, as input points per second (the raw
frame's count, NaN included, for every method; Open3D is handed the finite points
pre-filtered, which flatters it). "peak MB" is the resident-memory high-water mark above the
baseline during one cold call (Linux ``/proc/self/clear_refs``). The GIL line runs two
Python threads decimating at once and reports their combined throughput over one thread's:
~2x on two cores means the method really runs in parallel in a worker pool.

Run ``python -m benchmarks.decimate.cli --help`` for the input sets (``make bench-decimate
ARGS=...`` passes them through).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from benchmarks.decimate.measure import Runner, key_frame_guesses, peak_mb, time_runs
from benchmarks.decimate.peers import (
    Timed,
    interleaved_peers,
    load_avg,
    pcl_harness,
    pcl_timed,
    ratio_summary,
    service_timed,
    service_vs_bare,
    use_cpu_time,
    use_server_allocator,
)
from benchmarks.hostinfo import cpu_description
from bridge.decimate.backends import available_backends, get_decimator
from bridge.protocol.cloud import CloudLayout, make_layout
from tests.support.clouds import lidar_like, read_frame, uniform

XYZ_LAYOUT = make_layout(12, [("x", 0, 7), ("y", 4, 7), ("z", 8, 7)])
REPO = Path(__file__).resolve().parents[2]
DEFAULT_PCL = REPO / "tests" / "data" / "pcl"  # the PCL frames, vendored (BSD-3-Clause)


# ---- inputs ----


@dataclass
class Case:
    name: str
    shape: str
    voxel: float
    layout: CloudLayout
    data: bytes
    xyz: npt.NDArray[np.float32]  #: finite points only (what Open3D gets)
    rgb: npt.NDArray[np.uint8] | None = None  #: finite points' colours, if any

    @property
    def points(self) -> int:
        return len(self.data) // self.layout.stride


SHAPES = ("lidar", "lidar-shuffled", "uniform")


def synthetic_case(shape: str, n: int, voxel: float, seed: int) -> Case:
    """``lidar-shuffled`` is the same sweep in random order: hash tables lose their locality."""
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; choose from {', '.join(SHAPES)}")
    xyz = uniform(n, seed) if shape == "uniform" else lidar_like(n, seed)
    if shape == "lidar-shuffled":
        xyz = xyz[np.random.default_rng(seed + 1).permutation(len(xyz))]
    return Case(f"{shape} {_count(n)} v{voxel:g}", shape, voxel, XYZ_LAYOUT, xyz.tobytes(), xyz)


def real_case(path: Path, voxel: float, bin_layout: str = "xyzi") -> Case | None:
    """A real frame: .pcd/.ply through Open3D (x, y, z, rgb; NaN points kept), or a KITTI-style
    .bin of float32 records (``bin_layout`` xyzi or xyz). None when Open3D is needed and absent."""
    got = read_frame(path, bin_layout, _open3d())
    if got is None:
        return None
    layout, data, xyz, rgb = got
    return Case(f"{path.stem[:24]} v{voxel:g}", "real", voxel, layout, data, xyz, rgb)


def _count(n: int) -> str:
    return f"{n // 1_000_000}M" if n % 1_000_000 == 0 else f"{n // 1000}k"


def _parse_count(text: str) -> int:
    text = text.strip().lower()
    scale = {"k": 1_000, "m": 1_000_000}.get(text[-1:], 1)
    return int(float(text[:-1] if scale > 1 else text) * scale)


# ---- methods ----


def _open3d() -> Any:
    try:
        import open3d as o3d
    except ImportError:
        return None
    return o3d


def methods_for(case: Case, wanted: set[str], cpus: int) -> dict[str, Runner]:
    """name -> zero-argument runner returning the output point count."""
    runners: dict[str, Runner] = {}
    avail = available_backends()

    def ours(backend: str, threads: int) -> Runner:
        d = get_decimator(backend, threads=threads)
        return lambda: d.downsample(case.layout, case.data, case.voxel).points

    if "numpy" in wanted:
        runners["numpy"] = ours("numpy", 1)
    if "c" in wanted and avail["c"] is None:
        runners["c x1"] = ours("c", 1)
        if cpus > 1:
            runners[f"c x{cpus}"] = ours("c", cpus)
    if "cuda" in wanted and avail["cuda"] is None:
        runners["cuda"] = ours("cuda", 1)
    o3d = _open3d()
    if o3d is not None and "open3d" in wanted:
        legacy = o3d.geometry.PointCloud(o3d.utility.Vector3dVector(case.xyz.astype(np.float64)))
        if case.rgb is not None:
            legacy.colors = o3d.utility.Vector3dVector(case.rgb / 255.0)
        tensor = o3d.t.geometry.PointCloud(o3d.core.Tensor(case.xyz))
        if case.rgb is not None:
            tensor.point.colors = o3d.core.Tensor(case.rgb)
        runners["o3d legacy"] = lambda: len(legacy.voxel_down_sample(case.voxel).points)
        runners["o3d tensor"] = lambda: len(tensor.voxel_down_sample(case.voxel).point.positions)
    return runners


def timed_for(case: Case, wanted: set[str], cpus: int, repeats: int) -> dict[str, Timed]:
    """Methods timed inside their own process or loop: PCL's harness, the in-service path."""
    timed: dict[str, Timed] = {}
    if "pcl" in wanted:
        harness, _why = pcl_harness()
        if harness is not None:
            timed["pcl voxelgrid"] = pcl_timed(harness, case.xyz, case.rgb, case.voxel, repeats)
    if "service" in wanted and available_backends()["c"] is None:
        for t in sorted({1, cpus}):
            timed[f"c x{t} service"] = service_timed(case.layout, case.data, case.voxel, t, repeats)
    return timed


@dataclass
class Row:
    case: str
    shape: str
    points: int
    voxel: float
    method: str
    mpts_per_s: float
    median_s: float
    out_points: int
    peak_mb: float | None
    ratio_vs_open3d_best: float | None = None
    ratio_vs_pcl: float | None = None


@dataclass
class GilRow:
    method: str
    one_thread_mpts: float
    two_threads_mpts: float
    ratio: float


@dataclass
class Report:
    env: dict[str, Any]
    rows: list[Row] = field(default_factory=list)
    gil: list[GilRow] = field(default_factory=list)
    #: case -> in-service / bare kernel time, one thread, calls interleaved
    service_ratio: dict[str, float] = field(default_factory=dict)
    #: peer ("pcl", "o3d best") -> case -> its time / C x1 time, measured in alternation
    interleaved: dict[str, dict[str, float]] = field(default_factory=dict)
    #: case -> (guessed, missed): this thread's C calls that skipped the bounds pass with a
    #: key frame guessed from the estimate's sample, and those where a point fell outside it
    key_frame: dict[str, tuple[int, int]] = field(default_factory=dict)


def bench_case(
    case: Case,
    runners: dict[str, Runner],
    repeats: int,
    budget_s: float,
    timed: dict[str, Timed] | None = None,
) -> list[Row]:
    rows: list[Row] = []

    def row(name: str, t: float, out: int, peak: float | None) -> Row:
        return Row(
            case.name,
            case.shape,
            case.points,
            case.voxel,
            name,
            case.points / t / 1e6,
            t,
            out,
            peak,
        )

    for name, run in runners.items():
        out = run()  # warm-up (also first-touch of the output)
        peak = peak_mb(run)
        run()
        rows.append(row(name, statistics.median(time_runs(run, repeats, budget_s)), out, peak))
    for name, measure in (timed or {}).items():
        t, out = measure()
        rows.append(row(name, t, out, None))
    best = max((r.mpts_per_s for r in rows if r.method.startswith("o3d")), default=None)
    pcl = next((r.mpts_per_s for r in rows if r.method == "pcl voxelgrid"), None)
    for r in rows:
        r.ratio_vs_open3d_best = None if best is None else r.mpts_per_s / best
        r.ratio_vs_pcl = None if pcl is None else r.mpts_per_s / pcl
    return rows


def gil_figure(name: str, run: Runner, points: int, rounds: int) -> GilRow:
    """Two long-lived Python threads calling ``run`` at once vs one thread: throughput ratio.

    Long-lived like a worker pool's threads (per-thread scratch stays warm). Each round
    times one call alone, then a pair of concurrent calls, and the median of the per-round
    ratios is reported, so load from other processes drifting during the run cancels out.
    """
    rounds = max(3, rounds)
    start_gate = threading.Barrier(3)
    end_gate = threading.Barrier(3)

    def worker() -> None:
        for _ in range(rounds + 1):  # first round warms the thread up
            start_gate.wait()
            run()
            end_gate.wait()

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(2)]
    for t in threads:
        t.start()
    ones: list[float] = []
    twos: list[float] = []
    for i in range(rounds + 1):
        start = time.perf_counter()
        run()
        one = time.perf_counter() - start
        start_gate.wait()
        start = time.perf_counter()
        end_gate.wait()
        if i:
            ones.append(one)
            twos.append(time.perf_counter() - start)
    for t in threads:
        t.join()
    ratio = statistics.median(2 * a / b for a, b in zip(ones, twos, strict=True))
    return GilRow(
        name,
        points / statistics.median(ones) / 1e6,
        2 * points / statistics.median(twos) / 1e6,
        ratio,
    )


# ---- CLI ----


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.decimate.cli",
        description=(
            "Benchmark voxel decimation: numpy, C (1 thread and all CPUs), CUDA when present, "
            "and Open3D's legacy and tensor voxel_down_sample on the same clouds in one run "
            "(synthetic uniform and lidar-like clouds, plus real PCD frames). Prints median "
            "M points/s, output count, peak memory, the ratio to Open3D's best, and the GIL "
            "figure (two threads vs one)."
        ),
    )
    p.add_argument("--json", action="store_true", help="print one JSON document instead of tables")
    p.add_argument("--quick", action="store_true", help="a small set (about a minute)")
    p.add_argument("--full", action="store_true", help="100k, 1M and 10M points (slow: Open3D)")
    p.add_argument("--sizes", help="comma list of point counts, e.g. 100k,1M,10M")
    p.add_argument("--voxels", help="comma list of voxel sizes (default 0.05,0.2,1.0)")
    p.add_argument(
        "--shapes", help=f"comma list of {','.join(SHAPES)} (default all; --quick: lidar, uniform)"
    )
    p.add_argument(
        "--methods",
        default="numpy,c,cuda,open3d,pcl,service",
        help="comma list of numpy,c,cuda,open3d,pcl,service (default all available; service = "
        "the bridge worker's whole per-frame job next to the bare kernel)",
    )
    p.add_argument(
        "--real",
        type=Path,
        action="append",
        default=[],
        help="a folder of real frames (.pcd, .ply, KITTI-style .bin) to add to the vendored "
        "tests/data/pcl frames; repeatable",
    )
    p.add_argument(
        "--bin-layout",
        choices=["xyzi", "xyz"],
        default="xyzi",
        help=".bin records: float32 x, y, z, intensity (KITTI) or x, y, z",
    )
    p.add_argument("--real-voxel", type=float, default=0.02, help="voxel for real frames")
    p.add_argument("--no-real", action="store_true", help="skip the real frames")
    p.add_argument("--no-gil", action="store_true", help="skip the two-thread GIL figure")
    p.add_argument("--repeats", type=int, default=5, help="timed runs per method (median)")
    p.add_argument("--threads", type=int, help="C threads for the 'c xN' row (default: CPUs)")
    p.add_argument(
        "--cpu-time",
        action="store_true",
        help="time with process CPU time instead of wall time (steadier on a shared machine; "
        "one-thread rows only: a multi-threaded call counts every thread's time)",
    )
    p.add_argument("--seed", type=int, default=0)
    return p


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def plan_cases(args: argparse.Namespace) -> Iterable[Case]:
    if args.sizes:
        sizes = [_parse_count(s) for s in args.sizes.split(",")]
    elif args.full:
        sizes = [100_000, 1_000_000, 10_000_000]
    elif args.quick:
        sizes = [100_000, 1_000_000]
    else:
        sizes = [100_000, 1_000_000]
    voxels = [float(v) for v in args.voxels.split(",")] if args.voxels else None
    if args.shapes:
        shapes = args.shapes.split(",")
    else:
        shapes = ["lidar", "uniform"] if args.quick else list(SHAPES)
    for shape in shapes:
        for n in sizes:
            default = [0.2] if args.quick else [0.05, 0.2, 1.0]
            for v in voxels or default:
                if args.quick and shape == "uniform" and n < 1_000_000:
                    continue
                yield synthetic_case(shape, n, v, args.seed)
    if not args.no_real:
        dirs = [Path(os.environ.get("BRIDGE_PCL_DATA") or DEFAULT_PCL), *args.real]
        for folder in dirs:
            frames = sorted(p for p in folder.glob("*") if p.suffix in (".pcd", ".ply", ".bin"))
            for path in frames[:2] if args.quick else frames:
                case = real_case(path, args.real_voxel, args.bin_layout)
                if case is not None:
                    yield case


def run(args: argparse.Namespace, emit: Callable[[str], None]) -> Report:
    use_cpu_time(args.cpu_time)
    cpus = args.threads or _cpus()
    wanted = set(args.methods.split(","))
    o3d = _open3d()
    report = Report(
        env={
            "python": platform.python_version(),
            "numpy": np.__version__,
            "open3d": getattr(o3d, "__version__", None),
            "cpus": _cpus(),
            "cpu": cpu_description(),
            "c_threads": cpus,
            "backends": available_backends(),
            "machine": platform.machine(),
            "load_avg_1m": load_avg(),
            "clock": "process CPU time" if args.cpu_time else "wall",
            "allocator": use_server_allocator(),
        }
    )
    emit(_header(report.env))
    load = report.env["load_avg_1m"]
    if load is not None and load > 0.3:
        emit(
            f"note: load average {load:.2f} before starting: other processes share these CPUs, "
            "so figures (two-thread ones most) are noisy\n"
        )
    emit(
        f"{'case':<30} {'method':<15} {'Mpts/s':>8} {'out pts':>9} {'peak MB':>8} "
        f"{'x o3d':>6} {'x pcl':>6}"
    )
    if "pcl" in wanted and pcl_harness()[0] is None:
        emit(f"pcl voxelgrid: skipped, {pcl_harness()[1]}")
    budget = 1.0 if args.quick else 3.0
    repeats = min(args.repeats, 3) if args.quick else args.repeats
    gil_case: Case | None = None
    for case in plan_cases(args):  # lazily: 10M-point inputs are not all held at once
        # GIL figure on the biggest lidar-like case, preferably at voxel 0.2 (the reference
        # point in docs/design.md §6)
        if gil_case is None or _gil_rank(case) > _gil_rank(gil_case):
            gil_case = case
        runners = methods_for(case, wanted, cpus)
        timed = timed_for(case, wanted, cpus, repeats)
        guesses_before = key_frame_guesses()
        rows = bench_case(case, runners, repeats, budget, timed)
        report.rows += rows
        for r in rows:
            emit(_fmt_row(r))
        line = ratio_summary(rows)
        if line:
            emit(line)
        harness = pcl_harness()[0] if "pcl" in wanted else None
        pcl = pcl_timed(harness, case.xyz, case.rgb, case.voxel, 3) if harness else None
        for peer, (mid, low, high) in interleaved_peers(runners, pcl, max(5, repeats)).items():
            report.interleaved.setdefault(peer, {})[case.name] = mid
            emit(
                f"  {case.name}: c x1 / {peer}, calls interleaved: {mid:.2f} ({low:.2f}-{high:.2f})"
            )
        if "service" in wanted and available_backends()["c"] is None:
            ratio = service_vs_bare(case.layout, case.data, case.voxel, 3 * repeats)
            report.service_ratio[case.name] = ratio
            emit(f"  {case.name}: c x1 service / bare, calls interleaved: {ratio:.2f}x time")
        after = key_frame_guesses()
        guessed, missed = after[0] - guesses_before[0], after[1] - guesses_before[1]
        if guessed:
            report.key_frame[case.name] = (guessed, missed)
            emit(
                f"  {case.name}: c key frame guessed in {guessed} calls, missed in {missed} "
                "(native/README.md, 'Guessed key frame')"
            )
        counts = {r.out_points for r in rows if r.method not in ("o3d legacy", "pcl voxelgrid")}
        if len(counts) > 1:
            emit(f"{'':<30} WARNING: output counts differ: {sorted(counts)}")
    emit(
        "(o3d legacy anchors its grid at min bound - v/2, so its counts differ by design; PCL "
        "computes p * (1/v) in float32, so a few points on voxel faces may land elsewhere; every "
        "other method must agree)"
    )
    if args.no_gil or gil_case is None:
        return report
    emit(f"\nGIL: two threads decimating at once vs one ({gil_case.name}; ~2x = parallel)")
    runners = methods_for(gil_case, wanted, cpus)
    for name, fn in runners.items():
        if name.startswith("c x") and name != "c x1":
            continue  # already uses every core per call
        row = gil_figure(name, fn, gil_case.points, max(5, repeats))
        report.gil.append(row)
        emit(
            f"  {name:<11} 1 thread {row.one_thread_mpts:7.1f} Mpts/s"
            f"   2 threads {row.two_threads_mpts:7.1f} Mpts/s"
            f"   ratio {row.ratio:4.2f}"
        )
    return report


def _gil_rank(case: Case) -> tuple[bool, bool, int]:
    return (case.shape == "lidar", case.voxel == 0.2, case.points)


def _header(env: dict[str, Any]) -> str:
    backends = ", ".join(
        f"{k}: {'yes' if v is None else 'no (' + v + ')'}" for k, v in env["backends"].items()
    )
    return (
        f"decimation bench: python {env['python']}, numpy {env['numpy']}, open3d {env['open3d']}, "
        f"{env['cpus']} CPUs ({env['cpu']}), C threads {env['c_threads']}\n"
        f"backends: {backends}\n"
        f"allocator: {env['allocator']}\n"
    )


def _fmt_row(r: Row) -> str:
    peak = "n/a" if r.peak_mb is None else f"{r.peak_mb:.1f}"
    ratio = "" if r.ratio_vs_open3d_best is None else f"{r.ratio_vs_open3d_best:.2f}"
    pcl = "" if r.ratio_vs_pcl is None else f"{r.ratio_vs_pcl:.2f}"
    return (
        f"{r.case:<30} {r.method:<15} {r.mpts_per_s:8.2f} {r.out_points:9d} {peak:>8} "
        f"{ratio:>6} {pcl:>6}"
    )


def main(argv: list[str] | None = None) -> int:
    """Entry point for ``python -m benchmarks.decimate.cli``; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    for folder in [] if args.no_real else args.real:  # an error, never a smaller benchmark
        if not folder.is_dir():
            parser.error(f"--real {folder}: no such directory (--no-real skips the real frames)")
    if args.json:
        report = run(args, lambda _line: None)
        print(
            json.dumps(
                {
                    "env": report.env,
                    "results": [asdict(r) for r in report.rows],
                    "gil": [asdict(g) for g in report.gil],
                    "service_vs_bare": report.service_ratio,
                    "c_vs_peers_interleaved": report.interleaved,
                    "c_key_frame_guessed_missed": report.key_frame,
                },
                indent=2,
            )
        )
    else:
        run(args, lambda line: print(line, flush=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
