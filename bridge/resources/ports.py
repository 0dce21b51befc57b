"""The resources layer's ports: what it asks of the data plane it adapts (why: ``resources`` may
not import ``server``, so the data plane meets this Protocol structurally; ``server.capacity``
implements it and the adapter's tests drive a fake)."""

from __future__ import annotations

from typing import Protocol


class AdaptTarget(Protocol):
    """What the data plane exposes to the adapter (implemented in the data plane)."""

    def resize_workers(self, workers: int) -> None: ...
    def set_memory_budget(self, budget_bytes: int, reserve_bytes: int) -> None: ...
    def set_gpu_healthy(self, healthy: bool) -> None: ...  # decimation backend to CPU and back
    def active_streams(self) -> int: ...
    def memory_baseline_bytes(self) -> int: ...  # measured at startup


# Optional, looked up with getattr so targets need not implement it:
#     def set_gpu_batch_points(self, points: int) -> None: ...   # 0 = decimate on the CPU
