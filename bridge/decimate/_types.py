"""Types every decimation backend shares: the result, the backend protocol, the errors.

Why a separate module: the data plane codes against these names (``bridge.decimate``
re-exports them) while the backends behind them are chosen at startup; keeping them apart
from the implementations lets the NumPy, C and CUDA backends import them without cycles.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar, runtime_checkable

from bridge.protocol.cloud import XYZ, CloudLayout, FieldType
from bridge.protocol.errors import BridgeError

#: Keys are computed in float32 for float32 clouds, so float32(voxel_size) must be usable.
_F32_MAX = 3.4028234663852886e38
_F32_TINY = 1.401298464324817e-45


@dataclass(frozen=True, slots=True)
class DecimationResult:
    """Decimated points, packed in the input's layout (same stride and fields)."""

    data: bytes  #: packed points; bytes not covered by a field (padding) are zero
    points: int
    voxel_size: float  #: effective voxel size (after the point-budget ladder)
    backend: str  #: "numpy" | "c" | "cuda"


@runtime_checkable
class Decimator(Protocol):
    """A voxel-grid downsampler. Implementations are stateless and thread-safe."""

    name: str

    def downsample(
        self,
        layout: CloudLayout,
        data: bytes | memoryview,
        voxel_size: float,
        max_points: int = 0,
        threads: int = 0,
    ) -> DecimationResult:
        """``threads``: kernel threads for this frame (the plan's choice, see
        ``into.kernel_threads``); 0 keeps the backend's own setting. Only the C kernel splits
        a cloud across threads; the other backends ignore it."""
        ...


class BackendUnavailable(BridgeError):
    """An explicitly requested backend cannot run here; ``reason`` says why (a startup error)."""

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(f"decimation backend {name!r} is unavailable: {reason}")
        self.name = name
        self.reason = reason


class VoxelKeyOverflow(ValueError):
    """``floor(p / voxel_size)`` does not fit in int64: refused rather than passed through."""


T = TypeVar("T")
_PER_LAYOUT_MAX = 256


def per_layout(fn: Callable[[CloudLayout], T]) -> Callable[[CloudLayout], T]:
    """``fn(layout)`` cached by the layout's identity. A stream keeps one layout object frame
    after frame, and recomputing per frame (or hashing the nested frozen dataclass) cost more
    than the lookup: ~5-9 us a call on the in-service path. Bounded; an entry holds its layout
    alive, so its id cannot be reused while cached."""
    cache: dict[int, tuple[CloudLayout, T]] = {}

    def cached(layout: CloudLayout) -> T:
        hit = cache.get(id(layout))
        if hit is not None and hit[0] is layout:
            return hit[1]
        if len(cache) >= _PER_LAYOUT_MAX:
            cache.clear()
        value = fn(layout)
        cache[id(layout)] = (layout, value)
        return value

    cached.__doc__ = fn.__doc__
    return cached


@per_layout
def keys_in_float32(layout: CloudLayout) -> bool:
    """Whether voxel keys are computed in float32 (all of x, y, z float32), as Open3D does.

    Why: Open3D's tensor API divides float32 positions by float32(voxel_size); computing the
    key in float64 instead puts points lying within one ulp of a voxel face into the
    neighbouring voxel, so counts would differ from Open3D's on real clouds.
    """
    return all(layout.field(a).type == FieldType.FLOAT32 for a in XYZ)


def check_voxel_size(voxel_size: float, float32_keys: bool) -> float:
    """Return ``voxel_size`` as a float or raise ``ValueError`` saying what is wrong with it."""
    if isinstance(voxel_size, bool) or not isinstance(voxel_size, int | float):
        raise ValueError(f"voxel_size must be a number, got {type(voxel_size).__name__}")
    v = float(voxel_size)
    if not math.isfinite(v) or v <= 0.0:
        raise ValueError(f"voxel_size must be finite and > 0, got {voxel_size!r}")
    if float32_keys and not (_F32_TINY <= v <= _F32_MAX):
        raise ValueError(f"voxel_size {voxel_size!r} is not representable as float32")
    return v


def check_max_points(max_points: int) -> int:
    if isinstance(max_points, bool) or not isinstance(max_points, int) or max_points < 0:
        raise ValueError(f"max_points must be an int >= 0, got {max_points!r}")
    return max_points


def check_layout(layout: CloudLayout) -> CloudLayout:
    if not isinstance(layout, CloudLayout):
        raise ValueError(
            f"layout must be a bridge.protocol.cloud.CloudLayout, got {type(layout).__name__}"
        )
    return layout
