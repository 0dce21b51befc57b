"""Decimation inside the service: straight into a reused per-worker buffer, spliced into the
outgoing ProcessedFrame (bridge/decimate/into.py)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from bridge.cloud import make_layout
from bridge.decimate import VoxelKeyOverflow, available_backends, get_decimator
from bridge.decimate.into import (
    decimate_into,
    decimate_message,
    encode_cloud,
    kernel_threads,
    worker_buffer,
)
from bridge.decimate.reference import downsample_packed
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


def point_cloud(data: bytes) -> pb.PointCloud:
    pc = pb.PointCloud(point_stride=16, data=data, frame_id="lidar_top")
    for f in LAYOUT.fields:
        pc.fields.add(name=f.name, offset=f.offset, type=int(f.type))
    pc.pose.px = 1.5
    return pc


@needs_c
@pytest.mark.parametrize("threads", [1, 2, 4])
def test_decimate_into_equals_reference(threads: int) -> None:
    data = cloud_bytes(70_000)
    want, m = downsample_packed(LAYOUT, data, 0.3)
    buf = bytearray(len(data) + 64)
    assert decimate_into(memoryview(data), LAYOUT, 0.3, buf, threads) == m
    assert bytes(buf[: m * 16]) == want


@needs_c
def test_decimate_into_errors() -> None:
    data = cloud_bytes(100)
    with pytest.raises(ValueError, match="out has"):
        decimate_into(data, LAYOUT, 0.3, bytearray(10))
    huge = np.full((4, 4), 3e38, dtype=np.float32).tobytes()
    with pytest.raises(VoxelKeyOverflow):
        decimate_into(huge, LAYOUT, 1e-30, bytearray(len(huge)))
    with pytest.raises(ValueError, match="voxel_size"):
        decimate_into(data, LAYOUT, 0.0, bytearray(len(data)))


def test_worker_buffer_is_reused_per_thread() -> None:
    a = worker_buffer(100)
    assert worker_buffer(50) is a
    bigger = worker_buffer(1000)
    assert len(bigger) >= 1000 and worker_buffer(10) is bigger
    seen: list[bytearray] = []
    t = threading.Thread(target=lambda: seen.append(worker_buffer(10)))
    t.start()
    t.join()
    assert seen[0] is not bigger


@pytest.mark.parametrize("backend", ["c", "numpy"])
@pytest.mark.parametrize("max_points", [0, 500])
def test_decimate_message_equals_protobuf_encoding(backend: str, max_points: int) -> None:
    if available_backends()[backend] is not None:
        pytest.skip(f"{backend} unavailable")
    data = cloud_bytes(20_000, 3)
    cloud = point_cloud(data)
    head = pb.ProcessedFrame(stream_id="s", seq=7, device_id="d")
    head.decimation.input_points = 20_000
    raw = decimate_message(
        get_decimator(backend), LAYOUT, cloud, head, 0.3, max_points, 2, lambda: 123
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


def test_encode_cloud_matches_serializer_with_memoryview() -> None:
    data = cloud_bytes(10)
    head = pb.ProcessedFrame(stream_id="a", seq=1)
    want = pb.ProcessedFrame(stream_id="a", seq=1)
    want.point_cloud.CopyFrom(point_cloud(data))
    raw = encode_cloud(head, point_cloud(b""), memoryview(data))
    assert pb.ProcessedFrame.FromString(raw) == want


@pytest.mark.parametrize(
    ("workers", "busy", "cpus", "want"),
    [(8, 0, 16, 8), (8, 7, 16, 1), (8, 8, 16, 1), (16, 0, 4, 4), (1, 0, 2, 1), (4, 1, 8, 3)],
)
def test_kernel_threads(workers: int, busy: int, cpus: int, want: int) -> None:
    assert kernel_threads(workers, busy, cpus) == want
