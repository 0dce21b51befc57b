"""Processor with a real core and a real worker pool: notification never re-enters the core, the
in-flight bound holds, completion keeps seq order, and a refused frame is still delivered."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from bridge.decimate import get_decimator
from bridge.decimate._types import DecimationResult
from bridge.server.core import BridgeCore
from bridge.server.ports import SPLIT_DATA_BYTES
from bridge.server.processing import Processor, process_frame
from bridge.server.ring import Entry
from bridge.server.session import Session, Stream
from bridge.server.workers import WorkerPool
from bridge.v1 import bridge_pb2 as pb
from tests.unit.test_core import cloud_frame, hello, make_core


class Wired:
    """A listener wired the way the bridge wires it: work notifications go to the processor."""

    def __init__(self) -> None:
        self.processor: Processor | None = None
        self.committed: list[int] = []
        self.in_offer = False
        self.during_offer: list[str] = []

    def on_work(self) -> None:
        assert self.processor is not None
        self.processor.notify()

    def on_committed(self, entries: list[tuple[Stream, Entry]]) -> None:
        if self.in_offer:
            self.during_offer.append("committed")
        self.committed += [e.seq for _, e in entries]

    def on_space(self, stream: Stream) -> None:
        if self.in_offer:
            self.during_offer.append("space")

    def on_acks(self, session: Session) -> None:
        return None

    def on_evicted(self, stream: Stream, count: int) -> None:
        return None


class Gate:
    """A decimator that holds each call until released (and counts calls in flight)."""

    name = "gate"

    def __init__(self, fail_seq_points: int = -1) -> None:
        self._inner = get_decimator("numpy")
        self.release = threading.Event()
        self.calls = 0
        self._lock = threading.Lock()
        self.fail_points = fail_seq_points

    def downsample(
        self,
        layout: object,
        data: bytes | memoryview,
        voxel_size: float,
        max_points: int = 0,
        threads: int = 0,
    ) -> DecimationResult:
        with self._lock:
            self.calls += 1
        self.release.wait(10)
        if len(data) // 12 == self.fail_points:
            raise ValueError("voxel keys overflow")
        return self._inner.downsample(layout, data, voxel_size, max_points)  # type: ignore[arg-type]


def setup(
    decimator: object, workers: int = 1, depth: int = 1
) -> tuple[BridgeCore, Session, Processor, Wired, WorkerPool]:
    core, _ = make_core(budget=1_000_000)
    wired = Wired()
    core.listener = wired
    pool = WorkerPool(workers)
    processor = Processor(core, pool, decimator, depth=depth)  # type: ignore[arg-type]
    wired.processor = processor
    session = core.hello(hello(streams=("lidar", "tele")), "conn").session
    return core, session, processor, wired, pool


def offer(core: BridgeCore, wired: Wired, session: Session, frame: pb.Frame) -> None:
    wired.in_offer = True
    try:
        core.offer(session, frame, frame.ByteSize(), 0)
    finally:
        wired.in_offer = False


async def test_offer_returns_before_any_processing_or_fanout() -> None:
    core, session, _, wired, pool = setup(None)  # no decimator: every frame is cheap
    try:
        for seq in (1, 2, 3):
            offer(core, wired, session, cloud_frame("lidar", seq))
        assert wired.during_offer == []
        assert wired.committed == []
        assert core.buffered_frames == 3
        await asyncio.sleep(0)  # one loop turn: the single scheduled dispatch runs
        assert wired.committed == [1, 2, 3]
    finally:
        pool.close()


async def test_in_flight_is_bounded_by_workers_times_depth_and_order_is_kept() -> None:
    gate = Gate()
    core, session, _, wired, pool = setup(gate, workers=2, depth=1)
    try:
        for seq in range(1, 6):
            offer(core, wired, session, cloud_frame("lidar", seq))
        await asyncio.sleep(0.2)
        assert gate.calls == 2, "at most workers * depth frames go to the pool"
        assert wired.committed == []
        gate.release.set()
        for _ in range(200):
            if len(wired.committed) == 5:
                break
            await asyncio.sleep(0.01)
        assert wired.committed == [1, 2, 3, 4, 5]
    finally:
        gate.release.set()
        pool.close()


async def test_a_frame_the_kernel_refuses_is_delivered_raw_and_reported() -> None:
    gate = Gate(fail_seq_points=7)
    gate.release.set()
    core, session, processor, wired, pool = setup(gate, workers=1, depth=2)
    errors: list[str | None] = []
    processor._on_done = lambda item, spent, error: errors.append(error)
    try:
        offer(core, wired, session, cloud_frame("lidar", 1, n=7))
        offer(core, wired, session, cloud_frame("lidar", 2, n=5))
        for _ in range(200):
            if len(wired.committed) == 2:
                break
            await asyncio.sleep(0.01)
        assert wired.committed == [1, 2]
        assert errors[0] == "voxel keys overflow" and errors[1] is None
        entry = next(iter(core.streams[("dev", "lidar")].ring))
        out = pb.ProcessedFrame.FromString(b"".join(entry.item))  # type: ignore[arg-type]
        assert out.decimation.backend == "passthrough"
        assert out.point_cloud.data == cloud_frame("lidar", 1, n=7).point_cloud.data
    finally:
        pool.close()


@given(st.integers(min_value=0, max_value=8000), st.text(max_size=12))
def test_a_spliced_passthrough_cloud_equals_the_encoder(points: int, frame_id: str) -> None:
    core, _ = make_core(budget=10_000_000, max_points=10_000, max_frame_bytes=200_000)
    session = core.hello(hello(), "c").session
    frame = cloud_frame("lidar", 1, n=points)
    frame.point_cloud.frame_id = frame_id
    core.offer(session, frame, frame.ByteSize(), 5)
    item = core.take_work()
    assert item is not None
    parts, _, error = process_frame(item, None, clock=lambda: 9)
    assert error is None and isinstance(parts, tuple)
    expected = pb.ProcessedFrame(
        stream_id="lidar",
        seq=1,
        device_id="dev",
        ingest_time_ns=5,
        processed_time_ns=9,
        decimation=pb.DecimationInfo(
            input_points=points, output_points=points, backend="passthrough"
        ),
        point_cloud=frame.point_cloud,
    )
    joined = b"".join(parts)
    assert pb.ProcessedFrame.FromString(joined) == expected
    if points * 12 < SPLIT_DATA_BYTES:
        cloud = frame.point_cloud.SerializeToString()
        assert joined.endswith(cloud), "the cloud is spliced in verbatim, not re-encoded"
    else:  # a large cloud's data was read out once at admission and is held once
        assert item.data == frame.point_cloud.data
        assert item.frame.point_cloud.data == b"" and item.frame.seq == 1
        assert any(part is item.data for part in parts), "the data is spliced, not copied"


def test_a_large_cloud_is_decimated_from_the_data_read_at_admission() -> None:
    core, _ = make_core(budget=50_000_000, max_points=100_000, max_frame_bytes=2_000_000)
    session = core.hello(hello(), "c").session
    frame = cloud_frame("lidar", 1, n=30_000)
    frame.point_cloud.data = (
        np.random.default_rng(1).uniform(-20, 20, (30_000, 3)).astype("<f4").tobytes()
    )
    core.offer(session, frame, frame.ByteSize(), 5)
    item = core.take_work()
    assert item is not None and item.data is not None and item.frame.point_cloud.data == b""
    decimator = get_decimator("c")
    parts, _, error = process_frame(item, decimator, clock=lambda: 9)
    assert error is None
    assert isinstance(parts, tuple)  # joined by the push, with the rest of its batch
    got = pb.ProcessedFrame.FromString(b"".join(parts))
    layout = item.layout
    assert layout is not None
    want = decimator.downsample(layout, frame.point_cloud.data, 0.1, 0)
    assert got.point_cloud.data == bytes(want.data)
    assert got.decimation.input_points == 30_000
    assert got.decimation.output_points == want.points
