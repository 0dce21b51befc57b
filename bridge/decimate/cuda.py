"""The CUDA backend (placeholder until the library lands): always unavailable for now."""

from __future__ import annotations

from bridge.cloud import CloudLayout
from bridge.decimate._types import BackendUnavailable, DecimationResult


def unavailable_reason() -> str | None:
    return "CUDA library not built"


class CudaDecimator:
    name = "cuda"

    def __init__(self) -> None:
        reason = unavailable_reason()
        if reason is not None:
            raise BackendUnavailable(self.name, reason)

    def downsample(
        self,
        layout: CloudLayout,
        data: bytes | memoryview,
        voxel_size: float,
        max_points: int = 0,
    ) -> DecimationResult:
        raise BackendUnavailable(self.name, "CUDA library not built")
