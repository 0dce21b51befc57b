"""Decimation inside the service at kernel speed: from the received cloud straight into the
parts of the outgoing message, with no copy of the decimated cloud on the worker.

Why: the generic path (``Decimator.downsample`` → ``DecimationResult.data`` → protobuf field →
``SerializeToString``) allocated and copied the decimated cloud three to four times per frame,
which cost 25-45 % on top of the kernel for a 100k-point frame. Here the C kernel writes into a
``bytes`` object allocated once, uninitialised, at the input's size and shrunk in place to the
output (``_native.downsample``), and the outgoing ``ProcessedFrame`` is returned as parts around
it (:func:`decimate_parts`): the push joins every frame of a batch into one message anyway, so
that join is the output's only copy. (Joining the parts on the worker as well, into a message
of its own, was a second copy of the output: ~0.1-0.25 ms of a 100k-point lidar frame's ~2.5 ms,
most of the in-service cost above the bare kernel.) Other backends (CUDA, NumPy, or a point
budget that needs the ladder) go through ``downsample`` and are spliced the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bridge.cloud import CloudLayout
from bridge.decimate._types import (
    DecimationResult,
    Decimator,
    VoxelKeyOverflow,
    check_voxel_size,
    keys_in_float32,
)
from bridge.decimate.native_table import field_table
from bridge.v1 import bridge_pb2 as pb
from bridge.wire import field_key, length_prefix

_CLOUD_KEY = field_key(pb.ProcessedFrame.DESCRIPTOR, "point_cloud")
_DATA_KEY = field_key(pb.PointCloud.DESCRIPTOR, "data")
_NATIVE: list[Any] = []  # the extension module once imported (None: not built)


def _native() -> Any:
    """The C extension, imported once (an import statement per frame showed in the profile)."""
    if not _NATIVE:
        mod: Any = None
        try:
            from bridge.decimate import _native as ext
        except ImportError:
            pass
        else:
            mod = ext
        _NATIVE.append(mod)
    return _NATIVE[0]


_TABLES: dict[int, tuple[CloudLayout, tuple[tuple[int, int, int], ...], bool]] = {}


def _kernel_table(layout: CloudLayout) -> tuple[tuple[tuple[int, int, int], ...], bool]:
    """The kernel's field table and whether keys are float32, per layout. Keyed by identity:
    a stream keeps one layout object frame after frame, and hashing the nested frozen
    dataclass cost more than the lookup saves. Bounded; the entry holds the layout alive so
    its id cannot be reused while cached."""
    hit = _TABLES.get(id(layout))
    if hit is not None and hit[0] is layout:
        return hit[1], hit[2]
    if len(_TABLES) >= 256:
        _TABLES.clear()
    entry = (layout, field_table(layout), keys_in_float32(layout))
    _TABLES[id(layout)] = entry
    return entry[1], entry[2]


def kernel_output(
    view: bytes | memoryview, layout: CloudLayout, voxel: float, threads: int = 1
) -> tuple[bytes, int]:
    """The decimated records of packed points as one ``bytes`` object, and their count, from the
    C kernel. Raises ``VoxelKeyOverflow`` / ``ValueError`` like the backends, ``RuntimeError``
    when the C extension is not built."""
    native = _native()
    if native is None:
        raise RuntimeError("kernel_output needs the C extension bridge.decimate._native")
    table, f32 = _kernel_table(layout)
    v = check_voxel_size(voxel, f32)
    try:
        out, count = native.downsample(view, layout.stride, table, v, max(1, threads))
    except OverflowError as exc:
        raise VoxelKeyOverflow(str(exc)) from None
    return out, int(count)


def kernel_threads(workers: int, busy: int, cpus: int) -> int:
    """Kernel threads for the next frame: the idle share of the pool, so that workers x kernel
    threads stays near the CPU count when few frames are queued and is 1 under load."""
    idle = max(1, workers - busy)
    return max(1, min(idle, cpus))


def cloud_parts(
    head: pb.ProcessedFrame, cloud: pb.PointCloud, data: bytes | memoryview
) -> tuple[bytes | memoryview, ...]:
    """``head`` (a ProcessedFrame without point_cloud) plus ``cloud``'s metadata and ``data``,
    serialized as parts to join (``data`` is not copied; ``cloud.data`` is never read, so
    ``cloud`` may be a frame's metadata only)."""
    meta = pb.PointCloud(point_stride=cloud.point_stride, frame_id=cloud.frame_id)
    meta.fields.extend(cloud.fields)
    if cloud.HasField("pose"):
        meta.pose.CopyFrom(cloud.pose)
    meta_bytes = meta.SerializeToString()
    data_prefix = length_prefix(_DATA_KEY, len(data))
    inner = len(meta_bytes) + len(data_prefix) + len(data)
    return (
        head.SerializeToString(),
        length_prefix(_CLOUD_KEY, inner),
        meta_bytes,
        data_prefix,
        data,
    )


def decimate_parts(
    decimator: Decimator,
    layout: CloudLayout,
    cloud: pb.PointCloud,
    head: pb.ProcessedFrame,
    voxel: float,
    max_points: int,
    threads: int,
    clock: Callable[[], int],
    data: bytes | memoryview | None = None,
) -> tuple[bytes | memoryview, ...]:
    """The serialized ProcessedFrame for a decimated cloud, as parts to join (the decimated
    records one of them, never copied here): ``head`` gets the decimation info and processed
    time. ``data``: the cloud's points when the caller holds them (else read from ``cloud``).
    Raises what the backend raises (``ValueError`` for refused frames)."""
    if data is None:
        data = cloud.data
    info = head.decimation
    out: bytes | memoryview
    if decimator.name == "c" and max_points == 0 and _native() is not None:
        out, count = kernel_output(data, layout, voxel, threads)
        info.output_points, info.voxel_size, info.backend = count, float(voxel), "c"
    else:
        result: DecimationResult = decimator.downsample(layout, data, voxel, max_points)
        out = result.data
        info.output_points, info.voxel_size = result.points, result.voxel_size
        info.backend = result.backend
    head.processed_time_ns = clock()
    return cloud_parts(head, cloud, out)
