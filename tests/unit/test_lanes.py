"""The SDK's lane scheduler (bridge.client.lanes): pieces in order, higher lanes in between."""

from __future__ import annotations

import numpy as np
import pytest

from bridge.client.core import EdgeCore, StreamSpec
from bridge.client.lanes import LaneScheduler
from bridge.v1 import bridge_pb2 as pb


def core(*specs: StreamSpec) -> EdgeCore:
    c = EdgeCore("dev", specs, resend_buffer_bytes=1 << 28, resend_buffer_frames=1000)
    c.on_welcome(pb.Welcome(session_id="s"), 0)
    return c


def cloud(n: int) -> np.ndarray:
    return np.random.default_rng(n).uniform(-5, 5, (n, 3)).astype(np.float32)


def test_telemetry_goes_between_the_pieces_of_a_cloud() -> None:
    c = core(StreamSpec("lidar"), StreamSpec("status", kind="telemetry"))
    lanes = LaneScheduler(c, chunk_bytes=16 * 1024)
    c.publish("lidar", c.prepare("lidar", cloud(20_000)), 1)  # 240 kB: 15 pieces
    first = lanes.next()
    assert first is not None and first.done is None
    c.publish("status", c.prepare("status", {"v": 1.0}), 2)  # published after the cloud
    second = lanes.next()
    assert second is not None and second.done is not None
    assert pb.EdgeMessage.FromString(second.data).frame.stream_id == "status"
    c.mark_sent(second.done)
    pieces = [pb.EdgeMessage.FromString(first.data).chunk]
    while (out := lanes.next()) is not None:
        pieces.append(pb.EdgeMessage.FromString(out.data).chunk)
        if out.done is not None:
            assert out.done.stream_id == "lidar"
            c.mark_sent(out.done)
    assert [p.offset for p in pieces] == [16 * 1024 * i for i in range(len(pieces))]
    assert all(len(p.data) <= 16 * 1024 for p in pieces)
    body = b"".join(p.data for p in pieces)
    assert len(body) == pieces[0].total_bytes
    assert pb.Frame.FromString(body).seq == 1
    # Without lanes the same core hands out whole frames in publish order.
    c2 = core(StreamSpec("lidar"), StreamSpec("status", kind="telemetry"))
    c2.publish("lidar", c2.prepare("lidar", cloud(20_000)), 1)
    c2.publish("status", c2.prepare("status", {"v": 1.0}), 2)
    assert c2.next_to_send().stream_id == "lidar"  # type: ignore[union-attr]
    assert c2.next_to_send(by_lane=True).stream_id == "status"  # type: ignore[union-attr]


def test_explicit_priority_and_restart_on_a_new_connection() -> None:
    # A cloud stream declared "control" goes before telemetry.
    c = core(StreamSpec("status", kind="telemetry"), StreamSpec("lidar", priority="control"))
    c.publish("status", c.prepare("status", {"v": 1.0}), 1)
    c.publish("lidar", c.prepare("lidar", cloud(10_000)), 2)
    lanes = LaneScheduler(c, chunk_bytes=8 * 1024)
    a, b = lanes.next(), lanes.next()
    assert a is not None and b is not None
    assert [pb.EdgeMessage.FromString(x.data).chunk.offset for x in (a, b)] == [0, 8192]
    lanes.reset()  # reconnect: the bridge dropped the incomplete frame
    again = lanes.next()
    assert again is not None and pb.EdgeMessage.FromString(again.data).chunk.offset == 0
    assert [StreamSpec("s", kind="telemetry").lane, StreamSpec("c").lane] == [
        pb.PRIORITY_TELEMETRY,
        pb.PRIORITY_BULK,
    ]
    with pytest.raises(ValueError):
        StreamSpec("s", priority="urgent")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        StreamSpec("s", kind="telemetry", codec="zstd")
    assert StreamSpec("c", codec="quantized").to_proto().codec_params.step == 0.001


def test_pieces_only_where_a_frame_could_hold_up_another_lane() -> None:
    big = cloud(20_000)  # 240 kB
    # One lane only: nothing could overtake, so the frame goes whole.
    solo = core(StreamSpec("lidar"))
    solo.publish("lidar", solo.prepare("lidar", big), 1)
    out = LaneScheduler(solo, chunk_bytes=16 * 1024).next()
    assert out is not None and out.done is not None
    mixed = core(StreamSpec("lidar"), StreamSpec("status", kind="telemetry"))
    mixed.publish("lidar", mixed.prepare("lidar", big), 1)
    lanes = LaneScheduler(mixed, chunk_bytes=16 * 1024, max_hold_seconds=0.01)
    # A link that carries it within 10 ms (loopback): whole.
    fast = lanes.next(link_bytes_per_second=1e9)
    assert fast is not None and fast.done is not None
    lanes.reset()
    mixed.on_welcome(pb.Welcome(session_id="s", resumed=True), 0)  # a new connection
    # 20 Mbit/s, or unknown (gRPC): pieces; once in pieces, the frame stays in pieces.
    for rate in (2.5e6, None, 1e9):
        out = lanes.next(link_bytes_per_second=rate)
        assert out is not None and out.done is None
    # The link is busy: no new piece, but a whole small frame still goes.
    assert lanes.next(pieces=False) is None
    mixed.publish("status", mixed.prepare("status", {"v": 1.0}), 2)
    small = lanes.next(pieces=False)
    assert small is not None and small.done is not None and small.done.stream_id == "status"


def test_a_frame_the_bridge_dropped_incomplete_is_sent_again_from_its_first_piece() -> None:
    c = core(StreamSpec("lidar"), StreamSpec("status", kind="telemetry"))
    lanes = LaneScheduler(c, chunk_bytes=16 * 1024)
    c.publish("lidar", c.prepare("lidar", cloud(5_000)), 1)  # 60 kB: 4 pieces
    offsets = []
    while (out := lanes.next()) is not None:
        offsets.append(pb.EdgeMessage.FromString(out.data).chunk.offset)
        if out.done is not None:
            c.mark_sent(out.done)
    assert offsets == [0, 16384, 32768, 49152]
    # e.g. 30 s incomplete while the stream was paused: the bridge says CHUNK_ABANDONED
    err = pb.Error(code=pb.CHUNK_ABANDONED, stream_id="lidar", seq=1)
    lanes.restart("lidar", 1)
    c.on_error(err)
    again = lanes.next()
    assert again is not None and pb.EdgeMessage.FromString(again.data).chunk.offset == 0
    assert c.stats.errors["CHUNK_ABANDONED"] == 1 and c.stats.rejected == 0
    c.on_error(pb.Error(code=pb.CODEC_ERROR, stream_id="lidar", seq=1))  # never resendable
    assert c.stats.rejected == 1 and c.buffered_frames == 0
