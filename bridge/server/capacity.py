"""The data plane as the resource adapter drives it (``resources.ports.AdaptTarget``): worker
count, ring budget and the GPU/CPU decimation switch (why: kept apart from the lifecycle owner,
so the adapter's view is one small object, testable without servers). It sees the core through
the ``Budget`` port only."""

from __future__ import annotations

import logging
from collections.abc import Callable

from bridge.decimate import Decimator
from bridge.server.governor import Charge, Component
from bridge.server.metrics import BridgeMetrics
from bridge.server.ports import Budget
from bridge.server.processing import Processor
from bridge.server.workers import WorkerPool

log = logging.getLogger("bridge.server.capacity")


class Capacity:
    def __init__(
        self,
        core: Budget,
        pool: WorkerPool,
        processor: Processor,
        metrics: BridgeMetrics,
        *,
        decimator: Decimator,
        cpu_decimator: Decimator | None,
        pinned_workers: bool,
        baseline_rss: int,
    ) -> None:
        self._core = core
        self._pool = pool
        self._processor = processor
        self._metrics = metrics
        self.decimator = decimator  # chosen at startup (cuda when available)
        self.cpu_decimator = cpu_decimator  # where decimation goes while the GPU is unhealthy
        self._pinned = pinned_workers
        self._baseline_rss = baseline_rss
        self.trim_pending = False  # a ring shrink waits to drain before the heap is trimmed
        # The C kernel keeps a scratch buffer per worker thread between frames: capped from the
        # reserve and charged (decimation) as a standing charge, workers x cap.
        self._scratch_keep = _scratch_keep_setter() if decimator.name != "numpy" else None
        self._scratch: Charge | None = None
        self._cap_scratch()

    def resize_workers(self, workers: int) -> None:
        if self._pinned:  # pinned by configuration: the plan does not override it
            return
        self._pool.resize(workers)
        self._metrics.workers.set(workers)
        self._cap_scratch()
        self._processor.notify()

    def set_memory_budget(self, budget_bytes: int, reserve_bytes: int) -> None:
        """The plan changed the data budget: it applies at once. After a fall, admission waits
        (connections stop being read, edges get PAUSE) until what is held drains under it; then
        the freed heap is returned (the owner's housekeeping, see ``trim_pending``)."""
        governor = self._core.governor
        before = governor.budget_bytes
        self._core.set_memory_budget(budget_bytes, reserve_bytes)
        self._metrics.ring_capacity.set(self._core.ring_capacity_per_stream)
        self._cap_scratch()
        if budget_bytes < before:
            self.trim_pending = True

    def _cap_scratch(self) -> None:
        """Per-thread scratch kept between frames: at most a quarter of the reserve in all,
        never above the kernel's default (64 MiB a thread)."""
        if self._scratch_keep is None:
            return
        governor = self._core.governor
        threads = max(1, self._pool.size)
        keep = min(SCRATCH_KEEP_MAX, governor.reserve_bytes // 4 // threads)
        self._scratch_keep(keep)
        if self._scratch is None:
            self._scratch = governor.force(Component.DECIMATION, keep * threads)
        else:
            self._scratch.resize(keep * threads)

    def set_gpu_healthy(self, healthy: bool) -> None:
        if self.decimator.name != "cuda":
            return
        chosen = self.decimator if healthy else self.cpu_decimator
        if chosen is not self._processor.decimator:
            self._processor.set_decimator(chosen)
            self._metrics.publish_backend(chosen.name if chosen else None)
            log.warning(
                "GPU %s: decimation backend now %s",
                "healthy" if healthy else "unhealthy",
                chosen.name if chosen else "none",
            )

    def set_gpu_batch_points(self, points: int) -> None:
        """The plan's GPU batch size (0: frame by frame on the CPU decimator)."""
        setter = getattr(self.decimator, "set_batch_points", None)
        if setter is not None:
            setter(points)

    def active_streams(self) -> int:
        return len(self._core.streams)

    def memory_baseline_bytes(self) -> int:
        return self._baseline_rss

    def standing_charges(self) -> list[Charge]:
        """Charges held for the life of the process (the C kernel's per-thread scratch): a
        closed bridge's ledger is empty but for these."""
        return [self._scratch] if self._scratch is not None else []

    def within_budget(self) -> bool:
        """What is held fits the current budget again (a shrink has drained)."""
        gov = self._core.governor
        return gov.admitted_bytes <= gov.admission_limit and gov.total_bytes <= gov.budget_bytes


SCRATCH_KEEP_MAX = 64 << 20  # the kernel's own default per thread (native/cpu_scratch.c)


def _scratch_keep_setter() -> Callable[[int], object] | None:
    """The C extension's ``scratch_keep`` when it is built, else None (nothing cached)."""
    try:
        from bridge.decimate import _native
    except ImportError:
        return None
    return _native.scratch_keep
