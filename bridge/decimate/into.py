"""Decimation inside the service at kernel speed: from the received cloud straight into the
parts of the outgoing message, with no copy of the decimated cloud on the worker.

Why: the generic path (``Decimator.downsample`` → ``DecimationResult.data`` → protobuf field →
``SerializeToString``) allocated and copied the decimated cloud three to four times per frame,
which cost 25-45 % on top of the kernel for a 100k-point frame. Here the backend's output (for
C, a ``bytes`` object allocated once, uninitialised, at the input's size and shrunk in place:
``_native.downsample``) becomes one of the outgoing ``ProcessedFrame``'s parts
(:func:`decimate_parts`): the push joins every frame of a batch into one message anyway, so that
join is the output's only copy. (Joining the parts on the worker as well, into a message of its
own, was a second copy of the output: ~0.1-0.25 ms of a 100k-point lidar frame's ~2.5 ms, most
of the in-service cost above the bare kernel.)
"""

from __future__ import annotations

from collections.abc import Callable

from bridge.decimate._types import Decimator
from bridge.protocol.cloud import CloudLayout
from bridge.protocol.wire import field_key, length_prefix
from bridge.v1 import bridge_pb2 as pb

_CLOUD_KEY = field_key(pb.ProcessedFrame.DESCRIPTOR, "point_cloud")
_DATA_KEY = field_key(pb.PointCloud.DESCRIPTOR, "data")


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
    result = decimator.downsample(layout, data, voxel, max_points, threads)
    info = head.decimation
    info.output_points, info.voxel_size = result.points, result.voxel_size
    info.backend = result.backend
    head.processed_time_ns = clock()
    return cloud_parts(head, cloud, result.data)
