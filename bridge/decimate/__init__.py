"""Voxel-grid decimation of point clouds: NumPy reference, native C and CUDA backends.

The contract (docs/design.md §3) in one line: drop non-finite points, bin by
``floor(p / voxel_size)``, output the per-voxel mean of every field in key order. Callers use
:func:`get_decimator` once at startup and call ``downsample`` from any worker thread.
"""

from bridge.decimate._types import (
    BackendUnavailable,
    DecimationResult,
    Decimator,
    VoxelKeyOverflow,
)
from bridge.decimate.backends import available_backends, get_decimator
from bridge.decimate.reference import downsample_arrays

__all__ = [
    "BackendUnavailable",
    "DecimationResult",
    "Decimator",
    "VoxelKeyOverflow",
    "available_backends",
    "downsample_arrays",
    "get_decimator",
]
