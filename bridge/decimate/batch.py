"""GPU batching: frames that worker threads decimate at the same time go to the device together.

Why: a 100k-point frame is ~1 ms of transfers and launches on a GPU but microseconds of work;
one batch of many frames pays the fixed costs once. Workers call :meth:`GpuBatcher.downsample`
as they would a decimator; the first caller of a batch leads: it waits until the batch holds
``batch_points`` points or ``max_wait_s`` has passed (the latency cap), then runs the whole batch
while the other callers wait for their own result. With ``batch_points`` 0 (the plan says no
GPU, or the GPU is unhealthy) every frame goes to the CPU decimator, frame by frame.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from bridge.decimate._types import DecimationResult, Decimator
from bridge.protocol.cloud import CloudLayout


@dataclass
class _Job:
    layout: CloudLayout
    data: bytes | memoryview
    voxel: float
    points: int
    threads: int  # kernel threads the plan gave this frame, for a CPU fallback
    done: threading.Event = field(default_factory=threading.Event)
    result: DecimationResult | Exception | None = None


@dataclass
class _Batch:
    layout: CloudLayout
    jobs: list[_Job] = field(default_factory=list)
    points: int = 0
    closed: bool = False
    full: threading.Event = field(default_factory=threading.Event)


class GpuBatcher:
    """A decimator that batches concurrent calls onto a CUDA decimator (thread-safe)."""

    name = "cuda"

    def __init__(
        self, gpu: object, cpu: Decimator, batch_points: int = 4_000_000, max_wait_s: float = 0.002
    ) -> None:
        self.gpu = gpu  # a CudaDecimator (downsample_batch)
        self.cpu = cpu
        self.batch_points = batch_points
        self.max_wait_s = max_wait_s
        self._lock = threading.Lock()
        self._open: _Batch | None = None
        self.batches = 0
        self.frames = 0

    def set_batch_points(self, points: int) -> None:
        """From the plan; 0 sends every frame to the CPU decimator."""
        self.batch_points = max(0, int(points))

    def downsample(
        self,
        layout: CloudLayout,
        data: bytes | memoryview,
        voxel_size: float,
        max_points: int = 0,
        threads: int = 0,
    ) -> DecimationResult:
        if self.batch_points <= 0 or max_points:
            return self.cpu.downsample(layout, data, voxel_size, max_points, threads)
        job = _Job(layout, data, float(voxel_size), len(data) // layout.stride, threads)
        with self._lock:
            batch = self._open
            lead = batch is None or batch.closed or batch.layout != layout
            if lead:
                batch = self._open = _Batch(layout)
            assert batch is not None
            batch.jobs.append(job)
            batch.points += job.points
            if batch.points >= self.batch_points:
                batch.full.set()
        if lead:
            batch.full.wait(self.max_wait_s)
            with self._lock:
                batch.closed = True
                if self._open is batch:
                    self._open = None
            self._run(batch)
        job.done.wait()
        if isinstance(job.result, Exception):
            raise job.result
        assert job.result is not None
        return job.result

    def _run(self, batch: _Batch) -> None:
        try:
            results = self.gpu.downsample_batch(  # type: ignore[attr-defined]
                batch.layout, [(j.data, j.voxel) for j in batch.jobs]
            )
        except Exception as exc:  # device failure: this batch on the CPU, frame by frame
            results = []
            for j in batch.jobs:
                try:
                    results.append(self.cpu.downsample(j.layout, j.data, j.voxel, 0, j.threads))
                except Exception as cpu_exc:
                    results.append(cpu_exc)
            del exc
        self.batches += 1
        self.frames += len(batch.jobs)
        for j, r in zip(batch.jobs, results, strict=True):
            j.result = r
            j.done.set()
