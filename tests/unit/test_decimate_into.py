"""Decimation inside the service: the kernel's output is one of the outgoing ProcessedFrame's
parts, never copied on the worker (bridge/decimate/into.py)."""

from __future__ import annotations

import numpy as np
import pytest

from bridge.decimate import VoxelKeyOverflow, available_backends, get_decimator
from bridge.decimate.into import cloud_parts, decimate_parts, kernel_threads
from bridge.decimate.reference import downsample_packed
from bridge.protocol.cloud import make_layout
from bridge.v1 import bridge_pb2 as pb

LAYOUT = make_layout(16, [("x", 0, 7), ("y", 4, 7), ("z", 8, 7), ("rgb", 12, 6)])
needs_c = pytest.mark.skipif(
    available_backends()["c"] is not None, reason=f"C backend: {available_backends()['c']}"
)


def cloud_bytes(n: int, seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    rec = np.zeros(n, dtype=LAYOUT.structured_dtype)
    xyz = rng.normal(0, 5, (n, 3)).astype(np.float32)
    xyz[::13] = np.nan
    for i, a in enumerate("xyz"):
        rec[a] = xyz[:, i]
    rec["rgb"] = rng.integers(0, 2**32, n, dtype=np.uint32)
    return rec.tobytes()


def kernel_output(
    data: bytes | memoryview, layout: object, voxel: float, threads: int = 0
) -> tuple[bytes, int]:
    """The C backend's records and count for one call with ``threads`` kernel threads."""
    result = get_decimator("c").downsample(layout, data, voxel, 0, threads)  # type: ignore[arg-type]
    return result.data, result.points


def point_cloud(data: bytes) -> pb.PointCloud:
    pc = pb.PointCloud(point_stride=16, data=data, frame_id="lidar_top")
    for f in LAYOUT.fields:
        pc.fields.add(name=f.name, offset=f.offset, type=int(f.type))
    pc.pose.px = 1.5
    return pc


@needs_c
@pytest.mark.parametrize("threads", [1, 2, 4])
def test_kernel_output_equals_reference(threads: int) -> None:
    data = cloud_bytes(70_000)
    want, m = downsample_packed(LAYOUT, data, 0.3)
    assert kernel_output(memoryview(data), LAYOUT, 0.3, threads) == (want, m)


@needs_c
def test_kernel_output_errors() -> None:
    data = cloud_bytes(100)
    with pytest.raises(ValueError, match="not a multiple of"):  # the shared check words it
        kernel_output(data[:-3], LAYOUT, 0.3)
    huge = np.full((4, 4), 3e38, dtype=np.float32).tobytes()
    with pytest.raises(VoxelKeyOverflow):
        kernel_output(huge, LAYOUT, 1e-30)
    with pytest.raises(ValueError, match="voxel_size"):
        kernel_output(data, LAYOUT, 0.0)


@needs_c
def test_the_decimated_cloud_is_a_part_of_its_own_not_copied_into_a_message() -> None:
    """The push joins a batch's parts into one message: that is the output's only copy."""
    data = cloud_bytes(20_000, 5)
    head = pb.ProcessedFrame(stream_id="s", seq=1)
    parts = decimate_parts(get_decimator("c"), LAYOUT, point_cloud(data), head, 0.3, 0, 1, int)
    want, _ = downsample_packed(LAYOUT, data, 0.3)
    assert parts[-1] == want and isinstance(parts[-1], bytes)
    assert max(len(p) for p in parts[:-1]) < 100  # headers only
    assert pb.ProcessedFrame.FromString(b"".join(parts)).point_cloud.data == want


@pytest.mark.parametrize("backend", ["c", "numpy"])
@pytest.mark.parametrize("max_points", [0, 500])
def test_decimate_parts_join_to_the_protobuf_encoding(backend: str, max_points: int) -> None:
    if available_backends()[backend] is not None:
        pytest.skip(f"{backend} unavailable")
    data = cloud_bytes(20_000, 3)
    cloud = point_cloud(data)
    head = pb.ProcessedFrame(stream_id="s", seq=7, device_id="d")
    head.decimation.input_points = 20_000
    raw = b"".join(
        decimate_parts(get_decimator(backend), LAYOUT, cloud, head, 0.3, max_points, 2, lambda: 123)
    )
    got = pb.ProcessedFrame.FromString(raw)
    ref = get_decimator("numpy").downsample(LAYOUT, data, 0.3, max_points)
    want = pb.ProcessedFrame(stream_id="s", seq=7, device_id="d", processed_time_ns=123)
    want.decimation.input_points = 20_000
    want.decimation.output_points = ref.points
    want.decimation.voxel_size = ref.voxel_size
    want.decimation.backend = backend
    want.point_cloud.CopyFrom(point_cloud(ref.data))
    assert got == want  # field order on the wire may differ; parsers accept any order


def test_cloud_parts_match_the_serializer_with_memoryview() -> None:
    data = cloud_bytes(10)
    head = pb.ProcessedFrame(stream_id="a", seq=1)
    want = pb.ProcessedFrame(stream_id="a", seq=1)
    want.point_cloud.CopyFrom(point_cloud(data))
    raw = b"".join(cloud_parts(head, point_cloud(b""), memoryview(data)))
    assert pb.ProcessedFrame.FromString(raw) == want


@pytest.mark.parametrize(
    ("workers", "busy", "cpus", "want"),
    [(8, 0, 16, 8), (8, 7, 16, 1), (8, 8, 16, 1), (16, 0, 4, 4), (1, 0, 2, 1), (4, 1, 8, 3)],
)
def test_kernel_threads(workers: int, busy: int, cpus: int, want: int) -> None:
    assert kernel_threads(workers, busy, cpus) == want
