"""What ``benchmarks/decimate/cli.py`` measures besides our backends: PCL's ``VoxelGrid`` (a small
C++ harness built on demand), the bridge's in-service path, and real frames from disk.

PCL is the strongest CPU peer for voxel decimation, but a Python binding would measure the
binding: the harness loads the cloud once and times only ``filter()`` (median after a warm-up),
so PCL gets the benefit of every doubt. It is built into ``build/bench/`` (ignored by git) when
Debian's ``libpcl-dev`` headers are there, and skipped with the reason otherwise.
"""

from __future__ import annotations

import glob
import os
import shutil
import statistics
import subprocess
import tempfile
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from bridge.protocol.cloud import CloudLayout

REPO = Path(__file__).resolve().parents[2]
HARNESS_SRC = Path(__file__).with_name("pcl_voxelgrid.cpp")
HARNESS_BIN = REPO / "build" / "bench" / "pcl_voxelgrid"


#: (seconds per call, output points), measured inside the peer's own process.
Timed = Callable[[], tuple[float, int]]
T = TypeVar("T")

#: The clock every method is timed with: wall time, or (``--cpu-time``) this process's CPU time,
#: steadier on a shared machine for one-thread methods (a multi-threaded call adds its threads').
CLOCK: dict[str, Callable[[], float]] = {"now": time.perf_counter}
CPU_TIME = {"on": False}


def use_cpu_time(on: bool) -> None:
    CPU_TIME["on"] = on
    CLOCK["now"] = time.process_time if on else time.perf_counter


def pcl_harness() -> tuple[Path | None, str]:
    """The built harness, or None and why not (headers missing, no compiler, build error)."""
    if HARNESS_BIN.exists() and HARNESS_BIN.stat().st_mtime >= HARNESS_SRC.stat().st_mtime:
        return HARNESS_BIN, "built"
    headers = sorted(glob.glob("/usr/include/pcl-*/pcl/filters/voxel_grid.h"))
    if not headers:
        return None, "PCL headers not found (apt-get install libpcl-dev)"
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        return None, "no C++ compiler"
    include = str(Path(headers[-1]).parents[2])
    HARNESS_BIN.parent.mkdir(parents=True, exist_ok=True)
    cmd = [cxx, "-O3", "-std=c++17", f"-I{include}", "-I/usr/include/eigen3"]
    cmd += [str(HARNESS_SRC), "-o", str(HARNESS_BIN), "-lpcl_filters", "-lpcl_common"]
    try:
        subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.SubprocessError) as exc:
        detail = getattr(exc, "stderr", "") or str(exc)
        return None, f"PCL harness build failed: {detail.strip()[-300:]}"
    return HARNESS_BIN, "built"


def load_avg() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


_PEER_ENV: dict[str, str] = {}  # environment added for the PCL harness (use_server_allocator)


def use_server_allocator() -> str:
    """The allocator policy of ``simbridge serve`` (bridge.server.memtrim.tune_allocator) for this
    process, and the same for PCL's harness (``GLIBC_TUNABLES``): the in-service rows measure
    the service as it runs, and every method gets the same allocator. Untuned, glibc trimmed
    and faulted in a 100k-point frame's output again on most calls."""
    from bridge.server.memtrim import MMAP_THRESHOLD, TRIM_THRESHOLD, tune_allocator

    if not tune_allocator():
        return "glibc defaults (no mallopt here)"
    _PEER_ENV["GLIBC_TUNABLES"] = (
        f"glibc.malloc.mmap_threshold={MMAP_THRESHOLD}:glibc.malloc.trim_threshold={TRIM_THRESHOLD}"
    )
    mib = f"mmap threshold {MMAP_THRESHOLD >> 20} MiB, trim {TRIM_THRESHOLD >> 20} MiB"
    return f"as simbridge serve: glibc {mib} (PCL's harness too)"


def pcl_timed(
    harness: Path,
    xyz: npt.NDArray[np.float32],
    rgb: npt.NDArray[np.uint8] | None,
    voxel: float,
    repeats: int,
) -> Timed:
    """PCL VoxelGrid on the finite points (PointXYZRGB when there are colours)."""
    if rgb is None:
        raw = np.ascontiguousarray(xyz, dtype="<f4").tobytes()
    else:
        rec = np.zeros(len(xyz), dtype=[("xyz", "<f4", 3), ("rgb", "<u4")])
        rec["xyz"] = xyz
        rgba = np.zeros((len(xyz), 4), dtype=np.uint8)
        rgba[:, :3] = rgb[:, ::-1]  # PCL packs rgb as 0x00RRGGBB: b, g, r in memory
        rec["rgb"] = rgba.view("<u4")[:, 0]
        raw = rec.tobytes()

    # The cloud goes to disk once per case, not once per interleaved round (up to 12 MB at 1M
    # points); the file lives as long as the runner does.
    with tempfile.NamedTemporaryFile(suffix=".bin", delete=False) as f:
        f.write(raw)
    args = [str(harness), f.name, "1" if rgb is not None else "0", repr(voxel)]
    args += [str(max(3, repeats)), "cpu" if CPU_TIME["on"] else "wall"]

    def run() -> tuple[float, int]:
        env = {**os.environ, **_PEER_ENV}
        out = subprocess.run(args, check=True, capture_output=True, text=True, env=env)
        seconds, count = out.stdout.split()
        return float(seconds), int(count)

    weakref.finalize(run, os.unlink, f.name)
    return run


def c_vs_peer_interleaved(
    c_run: Callable[[], object], peer_run: Timed, rounds: int
) -> tuple[float, float, float]:
    """A peer's time over the C kernel's, the two measured in alternation, ``rounds`` times:
    (median, lowest, highest) of the per-round ratios. Why: timed one after the other the two
    rows are seconds apart, and this VM's speed drifts more than that between them (PCL's rate
    moved 1.5x between runs of the same command); a ratio per round sees the same machine on
    both sides. ``peer_run`` returns (seconds, output points) for its own warm median."""
    ratios: list[float] = []
    for _ in range(rounds):
        c_seconds, _ = warm_median(c_run)  # warmed up after the peer ran, as the peers are
        peer_seconds, _count = peer_run()
        ratios.append(peer_seconds / c_seconds)
    return statistics.median(ratios), min(ratios), max(ratios)


def warm_median(call: Callable[[], T], calls: int = 3) -> tuple[float, T]:
    """One warm-up call, then the median time of ``calls`` more (and the last call's result)."""
    now = CLOCK["now"]
    result = call()
    times = []
    for _ in range(calls):
        t0 = now()
        result = call()
        times.append(now() - t0)
    return statistics.median(times), result


def best_of(runs: list[Callable[[], int]]) -> Timed:
    """In-process peers (Open3D's two APIs) as one: each warmed up and called three times; the
    faster median wins, as the "best" in the targets."""

    def run() -> tuple[float, int]:
        return min(warm_median(call) for call in runs)

    return run


def interleaved_peers(
    runners: dict[str, Callable[[], int]], pcl: Timed | None, rounds: int
) -> dict[str, tuple[float, float, float]]:
    """C x1 against PCL (its own process) and Open3D's best, each measured in alternation."""
    if "c x1" not in runners:
        return {}
    peers: dict[str, Timed] = {}
    if pcl is not None:
        peers["pcl"] = pcl
    o3d = [run for name, run in runners.items() if name.startswith("o3d")]
    if o3d:
        peers["o3d best"] = best_of(o3d)
    return {
        name: c_vs_peer_interleaved(runners["c x1"], peer, rounds) for name, peer in peers.items()
    }


def _service_item(layout: CloudLayout, data: bytes, voxel: float) -> Any:
    """A work item as a worker gets it: a large cloud's header apart from a view of its points
    in the wire bytes (codec.split_cloud_frame), a small one parsed."""
    from bridge.protocol.codec import split_cloud_frame
    from bridge.v1 import bridge_pb2 as pb

    frame = pb.Frame(stream_id="bench", seq=1, capture_time_ns=1)
    pc = frame.point_cloud
    pc.point_stride = layout.stride
    pc.data = data
    for f in layout.fields:
        pc.fields.add(name=f.name, offset=f.offset, type=int(f.type))
    split = split_cloud_frame(pb.EdgeMessage(frame=frame).SerializeToString())
    points = None
    if split is not None:
        frame, points = split
    else:
        frame = pb.Frame.FromString(frame.SerializeToString())
    config = SimpleNamespace(voxel_size=voxel, max_points=0, passthrough=False)
    stream = SimpleNamespace(stream_id="bench", device_id="bench", config=config, key=("b", "b"))
    return SimpleNamespace(
        stream=stream,
        entry=SimpleNamespace(ingest_ns=1),
        frame=frame,
        layout=layout,
        points=len(data) // layout.stride,
        data=points,
    )


def service_vs_bare(layout: CloudLayout, data: bytes, voxel: float, repeats: int) -> float:
    """In-service time over bare-kernel time for one frame, one kernel thread, the two calls
    alternating so that load from other processes hits both alike (the separate rows are
    timed minutes apart on a shared machine): median over median of ``repeats`` pairs."""
    from bridge.decimate import _native, get_decimator
    from bridge.decimate.native_table import field_table
    from bridge.server.processing import process_frame

    item = _service_item(layout, data, voxel)
    decimator = get_decimator("c", threads=1)
    table, out = field_table(layout), bytearray(len(data))

    def bare() -> None:
        _native.downsample_into(data, layout.stride, table, voxel, out, 1)

    def service() -> None:
        process_frame(item, decimator, threads=1)

    bare()  # warm-up: scratch, per-thread buffers
    service()
    times: dict[str, list[float]] = {"bare": [], "service": []}
    now = CLOCK["now"]
    for _ in range(max(5, repeats)):
        for name, call in (("bare", bare), ("service", service)):
            t0 = now()
            call()
            times[name].append(now() - t0)
    return statistics.median(times["service"]) / statistics.median(times["bare"])


def service_timed(
    layout: CloudLayout, data: bytes, voxel: float, threads: int, repeats: int
) -> Timed:
    """The bridge worker's whole job for one frame (``processing.process_frame``): the parsed
    Frame in, the serialized ProcessedFrame out, C backend, ``threads`` kernel threads."""
    from bridge.decimate import get_decimator
    from bridge.server.processing import process_frame
    from bridge.v1 import bridge_pb2 as pb

    item = _service_item(layout, data, voxel)
    decimator = get_decimator("c", threads=threads)

    def run() -> tuple[float, int]:
        process_frame(item, decimator, threads=threads)  # warm-up (per-thread buffers)
        times = []
        for _ in range(max(3, repeats)):
            t0 = CLOCK["now"]()
            process_frame(item, decimator, threads=threads)
            times.append(CLOCK["now"]() - t0)
        result = process_frame(item, decimator, threads=threads)[0]
        raw = result if isinstance(result, bytes) else b"".join(result)
        out = pb.ProcessedFrame.FromString(raw)
        return sorted(times)[len(times) // 2], out.decimation.output_points

    return run


def ratio_summary(rows: list[Any]) -> str:
    """One line per case: the ratios the targets are stated in (same inputs, same run)."""
    by = {r.method: r for r in rows}
    c1 = by.get("c x1")
    if c1 is None:
        return ""
    parts = [f"{rows[0].case}:"]
    if c1.ratio_vs_pcl is not None:
        parts.append(f"c x1 / pcl {c1.ratio_vs_pcl:.2f}")
    if c1.ratio_vs_open3d_best is not None:
        parts.append(f"c x1 / o3d best {c1.ratio_vs_open3d_best:.2f}")
    multi = [r for r in rows if r.method.startswith("c x") and r.method[3:].isdigit()]
    top = max(multi, key=lambda r: int(r.method[3:]))
    if top is not c1:
        # CPU time adds every thread's time: a ratio of it would read as a slow-down.
        speed_up = (
            "n/a (CPU time counts every thread; time it by wall)"
            if CPU_TIME["on"]
            else f"{top.mpts_per_s / c1.mpts_per_s:.2f}"
        )
        parts.append(f"{top.method} / c x1 {speed_up}")
    for r in rows:
        bare = by.get(r.method.removesuffix(" service"))
        if r.method.endswith(" service") and bare is not None:
            parts.append(f"{r.method} / bare {r.median_s / bare.median_s:.2f}x time")
    return "  " + "  ".join(parts)
