"""GpuBatcher: concurrent worker calls share one device batch, with a latency cap and a CPU
fallback. The GPU is faked here (no device on CI): the fake records each batch it gets and
answers with the NumPy reference; the real CUDA batch runs in scripts/gpu-check.sh."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from bridge.decimate import DecimationResult, VoxelKeyOverflow, available_backends, get_decimator
from bridge.decimate.batch import GpuBatcher
from bridge.protocol.cloud import CloudLayout, make_layout

XYZ = make_layout(12, [("x", 0, 7), ("y", 4, 7), ("z", 8, 7)])


class RecordingGpu:
    def __init__(self, fail: bool = False) -> None:
        self.batches: list[int] = []
        self.fail = fail
        self.ref = get_decimator("numpy")

    def downsample_batch(
        self, layout: CloudLayout, frames: list[tuple[bytes, float]]
    ) -> list[DecimationResult | Exception]:
        if self.fail:
            raise RuntimeError("device lost")
        self.batches.append(len(frames))
        out: list[DecimationResult | Exception] = []
        for data, v in frames:
            try:
                out.append(self.ref.downsample(layout, data, v))
            except ValueError as exc:
                out.append(exc)
        return out


def frame(seed: int, n: int = 2000) -> bytes:
    return np.random.default_rng(seed).normal(0, 3, (n, 3)).astype(np.float32).tobytes()


def run_concurrently(batcher: GpuBatcher, frames: list[bytes], voxel: float = 0.5) -> list[object]:
    results: list[object] = [None] * len(frames)
    gate = threading.Barrier(len(frames))

    def work(i: int) -> None:
        gate.wait()
        try:
            results[i] = batcher.downsample(XYZ, frames[i], voxel)
        except Exception as exc:
            results[i] = exc

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(frames))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_concurrent_frames_share_batches_and_match_reference() -> None:
    gpu = RecordingGpu()
    batcher = GpuBatcher(gpu, get_decimator("numpy"), batch_points=10**9, max_wait_s=0.2)
    frames = [frame(i) for i in range(8)]
    results = run_concurrently(batcher, frames)
    assert sum(gpu.batches) == 8 and len(gpu.batches) < 8  # some frames rode together
    ref = get_decimator("numpy")
    for data, got in zip(frames, results, strict=True):
        assert isinstance(got, DecimationResult)
        assert got.data == ref.downsample(XYZ, data, 0.5).data


def test_full_batch_does_not_wait_for_the_cap() -> None:
    gpu = RecordingGpu()
    batcher = GpuBatcher(gpu, get_decimator("numpy"), batch_points=1, max_wait_s=30.0)
    assert batcher.downsample(XYZ, frame(1), 0.5).points > 0  # returns well before 30 s
    assert gpu.batches == [1]


def test_zero_batch_points_and_device_failure_fall_back_to_cpu() -> None:
    cpu = get_decimator("numpy")
    gpu = RecordingGpu()
    batcher = GpuBatcher(gpu, cpu, batch_points=0)
    assert batcher.downsample(XYZ, frame(2), 0.5).backend == "numpy"
    assert gpu.batches == []
    broken = GpuBatcher(RecordingGpu(fail=True), cpu, batch_points=100, max_wait_s=0.0)
    assert broken.downsample(XYZ, frame(3), 0.5).backend == "numpy"


class ThreadsSeen:
    """A CPU decimator that notes the kernel threads each frame was given."""

    name = "numpy"

    def __init__(self) -> None:
        self.ref = get_decimator("numpy")
        self.threads: list[int] = []

    def downsample(
        self, layout: CloudLayout, data: bytes, voxel: float, max_points: int = 0, threads: int = 0
    ) -> DecimationResult:
        self.threads.append(threads)
        return self.ref.downsample(layout, data, voxel, max_points)


def test_cpu_fallbacks_keep_the_frames_kernel_threads() -> None:
    cpu = ThreadsSeen()
    GpuBatcher(RecordingGpu(), cpu, batch_points=0).downsample(XYZ, frame(6), 0.5, threads=3)
    broken = GpuBatcher(RecordingGpu(fail=True), cpu, batch_points=100, max_wait_s=0.0)
    broken.downsample(XYZ, frame(7), 0.5, threads=2)
    assert cpu.threads == [3, 2]


def test_per_frame_errors_stay_with_their_frame() -> None:
    batcher = GpuBatcher(RecordingGpu(), get_decimator("numpy"), batch_points=10**9, max_wait_s=0.2)
    bad = np.full((3, 3), 3e38, dtype=np.float32).tobytes()
    results = run_concurrently(batcher, [frame(4), bad, frame(5)], voxel=1e-30)
    assert isinstance(results[1], VoxelKeyOverflow)


@pytest.mark.gpu
def test_real_cuda_batch_matches_cpu() -> None:
    reason = available_backends()["cuda"]
    if reason is not None:
        pytest.skip(f"cuda backend unavailable: {reason}")
    from bridge.decimate.cuda import CudaDecimator

    gpu = CudaDecimator()
    frames = [(frame(i, 5000 + 1000 * i), 0.05 * (1 + i % 3)) for i in range(12)]
    got = gpu.downsample_batch(XYZ, frames)
    ref = get_decimator("numpy")
    for (data, v), r in zip(frames, got, strict=True):
        assert isinstance(r, DecimationResult)
        assert r.data == ref.downsample(XYZ, data, v).data


def test_capacity_hands_the_planned_batch_size_to_the_batcher() -> None:
    from types import SimpleNamespace
    from typing import Any

    from bridge.server.capacity import Capacity
    from bridge.server.governor import Governor

    batcher = GpuBatcher(RecordingGpu(), get_decimator("numpy"), batch_points=5)
    dummy: Any = SimpleNamespace()
    core: Any = SimpleNamespace(governor=Governor(64 << 20, 16 << 20))  # the kept kernel scratch
    pool: Any = SimpleNamespace(size=1)
    cap = Capacity(
        core,
        pool,
        dummy,
        dummy,
        decimator=batcher,
        cpu_decimator=None,
        pinned_workers=False,
        baseline_rss=0,
    )
    cap.set_gpu_batch_points(123_456)
    assert batcher.batch_points == 123_456
    cap.set_gpu_batch_points(0)
    assert batcher.downsample(XYZ, frame(9), 0.5).backend == "numpy"
