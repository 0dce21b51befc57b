"""Stand-ins for the Adapter's neighbours: the data plane it adapts (an ``AdaptTarget`` that
records every call) and NVML as a DRA MIG container sees it (one GPU, one 3g.40gb instance)."""

from __future__ import annotations

import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

MiB = 1 << 20
MIG_UUID = "MIG-4d5e6f7a-8b9c-5d0e-1f2a-3b4c5d6e7f80"  # the claimed device in the k8s fixtures


class FakeTarget:
    """Records calls; ``probe`` runs inside set_memory_budget (to see the world at apply time)."""

    def __init__(self, streams: int = 2, baseline: int = 0) -> None:
        self.calls: list[tuple[str, Any, float]] = []
        self.streams = streams
        self.baseline = baseline
        self.workers: int | None = None
        self.ring: tuple[int, int] | None = None
        self.gpu_healthy: bool | None = None
        self.probe: Callable[[], Any] | None = None
        self.probed: list[Any] = []

    def resize_workers(self, workers: int) -> None:
        self.calls.append(("workers", workers, time.monotonic()))
        self.workers = workers

    def set_memory_budget(self, budget_bytes: int, reserve_bytes: int) -> None:
        self.calls.append(("ring", budget_bytes, time.monotonic()))
        self.ring = (budget_bytes, reserve_bytes)
        if self.probe is not None:
            self.probed.append((budget_bytes, self.probe()))

    def set_gpu_healthy(self, healthy: bool) -> None:
        self.calls.append(("gpu", healthy, time.monotonic()))
        self.gpu_healthy = healthy

    def set_gpu_batch_points(self, points: int) -> None:  # the optional hook
        self.calls.append(("batch", points, time.monotonic()))

    def active_streams(self) -> int:
        return self.streams

    def memory_baseline_bytes(self) -> int:
        return self.baseline


class FakeNVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return {15: "GPU is lost", 6: "Not Found", 3: "Not Supported"}.get(self.value, "error")


class FakeNvml:
    """A GPU in MIG mode with one instance (what NVML shows inside a DRA MIG container)."""

    NVMLError = FakeNVMLError
    NVML_DEVICE_MIG_ENABLE = 1
    NVML_ERROR_NOT_FOUND = 6

    def __init__(self) -> None:
        self.lost = False
        self.used = 0

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int:
        return 1

    def nvmlDeviceGetHandleByIndex(self, i: int) -> tuple[str, int]:
        return ("gpu", i)

    def nvmlDeviceGetUUID(self, h: tuple[Any, ...]) -> str:
        return MIG_UUID if h[0] == "mig" else "GPU-6f1d3c2a-9b8e-4f7a-a1c2-3d4e5f60718a"

    def nvmlDeviceGetName(self, h: tuple[Any, ...]) -> str:
        return "NVIDIA H100 80GB HBM3 MIG 3g.40gb" if h[0] == "mig" else "NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetMemoryInfo(self, h: tuple[Any, ...]) -> SimpleNamespace:
        if self.lost and h[0] == "mig":
            raise FakeNVMLError(15)
        total = 40448 * MiB if h[0] == "mig" else 81559 * MiB
        return SimpleNamespace(total=total, used=self.used, free=total - self.used)

    def nvmlDeviceGetMigMode(self, h: tuple[Any, ...]) -> tuple[int, int]:
        return (1, 1)

    def nvmlDeviceGetMaxMigDeviceCount(self, h: tuple[Any, ...]) -> int:
        return 2

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: tuple[Any, ...], j: int) -> tuple[Any, ...]:
        if j != 0:
            raise FakeNVMLError(6)
        return ("mig", h[1], j)
