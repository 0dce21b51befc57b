"""BridgeCore without an event loop: sessions, admission rules, gaps, acks, watermarks."""

from __future__ import annotations

import numpy as np
import pytest

from bridge.protocol import codec
from bridge.protocol.errors import (
    FrameNeverFits,
    InvalidLayout,
    ProtocolViolation,
    SeqRegression,
    SessionTaken,
    TooManyPoints,
    TooManySessions,
    TooManyStreams,
    UnknownStream,
)
from bridge.server.core import BridgeCore
from bridge.server.egress import frame_bytes
from bridge.server.governor import Component, Governor
from bridge.server.ports import CoreConfig, Offer
from bridge.server.ring import Entry, Policy
from bridge.server.session import Session, Stream
from bridge.v1 import bridge_pb2 as pb


class Recorder:
    def __init__(self) -> None:
        self.space: list[tuple[str, str]] = []
        self.acks: list[str] = []
        self.work = 0
        self.committed: list[tuple[str, int]] = []
        self.evicted = 0

    def on_space(self, stream: Stream) -> None:
        self.space.append(stream.key)

    def on_acks(self, session: Session) -> None:
        self.acks.append(session.session_id)

    def on_work(self) -> None:
        self.work += 1

    def on_committed(self, entries: list[tuple[Stream, Entry]]) -> None:
        self.committed += [(s.stream_id, e.seq) for s, e in entries]

    def on_evicted(self, stream: Stream, count: int) -> None:
        self.evicted += count


def make_core(**overrides: object) -> tuple[BridgeCore, Recorder]:
    limits = codec.Limits(
        max_frame_bytes=int(overrides.pop("max_frame_bytes", 10_000)),  # type: ignore[call-overload]
        max_points=int(overrides.pop("max_points", 1000)),  # type: ignore[call-overload]
        max_streams_per_session=int(overrides.pop("max_streams", 4)),  # type: ignore[call-overload]
    )
    cfg = CoreConfig(
        limits=limits,
        max_sessions=int(overrides.pop("max_sessions", 2)),  # type: ignore[call-overload]
        default_voxel_size=0.1,
        default_policy=Policy.BACKPRESSURE,
        default_passthrough=False,
        session_bytes=int(overrides.pop("session_bytes", 0)),  # type: ignore[call-overload]
        stream_bytes=0,
    )
    rec = Recorder()
    budget = int(overrides.pop("budget", 100_000))  # type: ignore[call-overload]
    return BridgeCore(cfg, rec, Governor(budget)), rec


def hello(device: str = "dev", streams: tuple[str, ...] = ("lidar",), **kw: object) -> pb.Hello:
    specs = [
        pb.StreamSpec(stream_id=s, kind=pb.TELEMETRY if s.startswith("t") else pb.POINT_CLOUD)
        for s in streams
    ]
    return pb.Hello(device_id=device, streams=specs, **kw)  # type: ignore[arg-type]


def attach(core: BridgeCore, h: pb.Hello, conn: object) -> tuple[Session, pb.Welcome]:
    attached = core.hello(h, conn)
    return attached.session, attached.welcome


def cloud_frame(stream: str, seq: int, n: int = 4) -> pb.Frame:
    xyz = np.arange(n * 3, dtype="<f4")
    return pb.Frame(
        stream_id=stream,
        seq=seq,
        point_cloud=pb.PointCloud(
            point_stride=12,
            fields=[
                pb.PackedField(name="x", offset=0, type=pb.FLOAT32),
                pb.PackedField(name="y", offset=4, type=pb.FLOAT32),
                pb.PackedField(name="z", offset=8, type=pb.FLOAT32),
            ],
            data=xyz.tobytes(),
        ),
    )


def test_hello_welcome_and_resume_by_token_and_device() -> None:
    core, _ = make_core()
    s1, w1 = attach(core, hello(), "conn1")
    assert not w1.resumed and w1.session_id == s1.session_id
    assert core.offer(s1, cloud_frame("lidar", 1), 100, 0) is Offer.ACCEPTED
    core.detach(s1, "conn1", now=0.0)
    s2, w2 = attach(core, hello(resume_token=s1.session_id), "conn2")
    assert s2 is s1 and w2.resumed
    assert [(s.stream_id, s.accepted_seq, s.delivered_seq) for s in w2.streams] == [("lidar", 1, 0)]
    with pytest.raises(SessionTaken):  # same device, no token, session live: refused
        attach(core, hello(), "conn3")
    assert s1.connection == "conn2"
    core.detach(s1, "conn2", now=1.0)
    s3, w3 = attach(core, hello(), "conn3")  # detached: a device that lost its token resumes
    assert s3 is s1 and w3.resumed and s3.connection == "conn3"
    s4, w4 = attach(core, hello(resume_token=s1.session_id), "conn4")  # the token takes over
    assert s4 is s1 and w4.resumed and s4.connection == "conn4"


def test_resume_state_from_hello_sets_the_baseline_of_a_new_stream() -> None:
    core, _ = make_core()
    s, w = attach(core, hello(resume=[pb.ResumeState(stream_id="lidar", delivered_seq=7)]), "c")
    assert w.streams[0].delivered_seq == 7
    assert core.offer(s, cloud_frame("lidar", 7), 100, 0) is Offer.DUPLICATE
    assert core.offer(s, cloud_frame("lidar", 8), 100, 0) is Offer.ACCEPTED
    assert s.streams["lidar"].upstream_gap_frames == 0


def test_duplicates_reacked_regression_refused_and_upstream_gap_recorded() -> None:
    core, rec = make_core()
    s, _ = attach(core, hello(), "c")
    assert core.offer(s, cloud_frame("lidar", 1), 100, 0) is Offer.ACCEPTED
    with pytest.raises(SeqRegression):
        core.offer(s, cloud_frame("lidar", 1), 100, 0)
    core.detach(s, "c", 0.0)
    s, _ = attach(core, hello(), "c2")  # a resend after reconnect is a duplicate, not an error
    rec.acks.clear()
    assert core.offer(s, cloud_frame("lidar", 1), 100, 0) is Offer.DUPLICATE
    assert rec.acks, "a duplicate is re-acked"
    assert core.offer(s, cloud_frame("lidar", 5), 100, 0) is Offer.ACCEPTED
    stream = s.streams["lidar"]
    assert stream.upstream_gap_frames == 3
    last = list(stream.ring)[-1]
    assert last.gap is not None and (last.gap.first_seq, last.gap.last_seq) == (2, 4)
    assert last.gap.reason == "upstream"


def test_bad_input_is_classified() -> None:
    core, _ = make_core(max_points=3)
    s, _ = attach(core, hello(streams=("lidar", "tele")), "c")
    with pytest.raises(UnknownStream):
        core.offer(s, cloud_frame("nope", 1), 10, 0)
    with pytest.raises(TooManyPoints):
        core.offer(s, cloud_frame("lidar", 1, n=4), 10, 0)
    bad = cloud_frame("lidar", 1, n=2)
    bad.point_cloud.data = bad.point_cloud.data[:-1]
    with pytest.raises(InvalidLayout, match="multiple"):
        core.offer(s, bad, 10, 0)
    overlap = cloud_frame("lidar", 1, n=2)
    overlap.point_cloud.fields[1].offset = 2
    with pytest.raises(InvalidLayout, match="overlap"):
        core.offer(s, overlap, 10, 0)
    with pytest.raises(InvalidLayout, match="expects telemetry"):
        core.offer(s, cloud_frame("tele", 1), 10, 0)
    with pytest.raises(SeqRegression):
        core.offer(s, cloud_frame("lidar", 0), 10, 0)
    assert core.offer(s, cloud_frame("lidar", 1, n=2), 10, 0) is Offer.ACCEPTED


def test_session_and_stream_limits() -> None:
    core, _ = make_core(max_sessions=1, max_streams=2)
    with pytest.raises(TooManyStreams):
        core.hello(hello(streams=("a", "b", "c")), "c")
    core.hello(hello("d1"), "c1")
    with pytest.raises(TooManySessions):
        core.hello(hello("d2"), "c2")
    with pytest.raises(ProtocolViolation):
        core.hello(pb.Hello(), "c3")


def test_processing_commit_sink_ack_and_delivered_seq() -> None:
    core, rec = make_core()
    s, _ = attach(core, hello(), "c")
    for seq in (1, 2, 3):
        core.offer(s, cloud_frame("lidar", seq), 100, 0)
    items = [core.take_work() for _ in range(3)]
    assert core.take_work() is None
    assert all(items)

    def done(i: int) -> None:
        item = items[i]
        assert item is not None
        core.complete(item, pb.ProcessedFrame(stream_id="lidar", seq=i + 1).SerializeToString())

    done(1)
    assert rec.committed == []
    done(0)
    assert rec.committed == [("lidar", 1), ("lidar", 2)]
    done(2)
    delivered = core.sink_ack(2)
    assert [e.seq for e in delivered] == [1, 2]
    ack = core.take_acks(s)
    assert ack is not None
    assert (ack.streams[0].accepted_seq, ack.streams[0].delivered_seq) == (3, 2)
    wire = pb.ProcessedFrame.FromString(frame_bytes(next(iter(s.streams["lidar"].ring))))
    assert (wire.seq, wire.bridge_seq, wire.HasField("gap")) == (3, 3, False)


def test_watermarks_mark_frames_delivered_and_future_resends_duplicate() -> None:
    core, _ = make_core()
    core.sink_watermarks([(("dev", "lidar"), 5)])  # before the stream exists
    s, w = attach(core, hello(), "c")
    assert w.streams[0].delivered_seq == 5
    assert core.offer(s, cloud_frame("lidar", 4), 100, 0) is Offer.DUPLICATE
    assert core.offer(s, cloud_frame("lidar", 6), 100, 0) is Offer.ACCEPTED
    assert core.offer(s, cloud_frame("lidar", 7), 100, 0) is Offer.ACCEPTED
    core.sink_watermarks([(("dev", "lidar"), 6)])  # while frames are buffered
    stream = s.streams["lidar"]
    assert [e.seq for e in stream.ring] == [7] and stream.delivered_seq == 6


def test_ring_budget_split_fairly_and_shrink_is_backpressure() -> None:
    core, _ = make_core(max_frame_bytes=100, budget=1000)
    s, _ = attach(core, hello(streams=("a", "b")), "c")
    assert core.ring_capacity_per_stream == 500
    for seq in range(1, 5):
        assert core.offer(s, cloud_frame("a", seq), 100, 0) is Offer.ACCEPTED
    core.set_memory_budget(200, 0)
    assert core.ring_capacity_per_stream == 100  # budget/2
    assert len(s.streams["a"].ring) == 4, "backpressure: a shrink keeps every frame"
    assert core.offer(s, cloud_frame("a", 5), 100, 0) is Offer.FULL


def test_no_floor_a_frame_above_its_share_is_admitted_only_into_an_empty_ring() -> None:
    core, _ = make_core(max_frame_bytes=10_000, budget=1000, max_streams=8)
    s, _ = attach(core, hello(streams=tuple("abcdefgh")), "c")
    assert core.ring_capacity_per_stream == 125  # 1000 / 8 streams, not max_frame_bytes
    assert core.offer(s, cloud_frame("a", 1), 400, 0) is Offer.ACCEPTED  # borrows
    assert core.offer(s, cloud_frame("a", 2), 10, 0) is Offer.FULL
    assert core.offer(s, cloud_frame("b", 1), 100, 0) is Offer.ACCEPTED
    assert core.offer(s, cloud_frame("b", 2), 100, 0) is Offer.FULL  # 200 > its 125 share


def test_a_frame_that_can_never_fit_gets_a_clear_error_and_welcome_follows_the_plan() -> None:
    core, _ = make_core(max_frame_bytes=10_000, budget=1000)
    s, welcome = attach(core, hello(), "c")
    assert welcome.limits.max_frame_bytes == 1000  # the budget, not the configured 10,000
    with pytest.raises(FrameNeverFits, match="can never fit"):
        core.offer(s, cloud_frame("lidar", 1), 1001, 0)
    core.set_memory_budget(800, 200)
    assert core.limits_now().max_frame_bytes == 600
    assert core.offer(s, cloud_frame("lidar", 1), 600, 0) is Offer.ACCEPTED


def test_every_ring_charge_is_released_once_by_ack_eviction_or_forget() -> None:
    core, _ = make_core(max_frame_bytes=100, budget=300, max_sessions=1, session_bytes=10)
    gov = core.governor
    h = pb.Hello(
        device_id="d",
        streams=[
            pb.StreamSpec(stream_id="a", kind=pb.POINT_CLOUD, overflow=pb.DROP_OLDEST),
            pb.StreamSpec(stream_id="b", kind=pb.POINT_CLOUD),
        ],
    )
    s, _ = attach(core, h, "c")
    assert gov.charged(Component.SESSIONS) == 10
    for seq in range(1, 6):  # a's share is 150: evictions release the oldest
        assert core.offer(s, cloud_frame("a", seq), 100, 0) is Offer.ACCEPTED
    assert core.offer(s, cloud_frame("b", 1), 100, 0) is Offer.ACCEPTED
    with pytest.raises(TooManySessions, match="no memory"):  # 10 + 200 held, budget 300
        make_core(budget=5, session_bytes=10)[0].hello(hello("x"), "c2")
    assert gov.charged(Component.RING) == core.buffered_bytes == 200
    while (item := core.take_work()) is not None:
        core.complete(item, b"x" * 10)  # results replace frames: charges shrink
    assert gov.charged(Component.RING) == core.buffered_bytes == 20
    core.sink_ack(core.egress.last_bridge_seq)
    assert gov.charged(Component.RING) == 0
    core.detach(s, "c", now=0.0)
    assert core.expire(now=100.0, ttl=1.0) == [s]
    assert gov.total_bytes == 0 and gov.live_charges == 0
    assert gov.stats.double_releases == 0


def test_drop_oldest_stream_from_hello() -> None:
    core, rec = make_core(max_frame_bytes=100, budget=300)
    h = pb.Hello(
        device_id="d",
        streams=[pb.StreamSpec(stream_id="a", kind=pb.POINT_CLOUD, overflow=pb.DROP_OLDEST)],
    )
    s, _ = attach(core, h, "c")
    for seq in range(1, 6):
        assert core.offer(s, cloud_frame("a", seq), 100, 0) is Offer.ACCEPTED
    assert rec.evicted == 2
    first = next(iter(s.streams["a"].ring))
    assert first.seq == 3 and first.gap is not None and first.gap.count == 2


def test_detached_sessions_are_bounded() -> None:
    core, _ = make_core(max_sessions=2)
    for i in range(2):
        conn = f"c{i}"
        s, _ = attach(core, hello(f"d{i}"), conn)
        core.detach(s, conn, now=float(i))
    # Two detached, idle sessions: a third device makes the oldest one go.
    s2, _ = attach(core, hello("d2"), "c2")
    assert "d0" not in core.by_device and {"d1", "d2"} <= set(core.by_device)
    assert core.offer(s2, cloud_frame("lidar", 1), 100, 0) is Offer.ACCEPTED
    core.detach(s2, "c2", now=3.0)
    # Now d1 (idle) and d2 (holding a frame) are detached: d1 goes, d2 is kept.
    core.hello(hello("d3"), "c3")
    assert "d1" not in core.by_device and "d2" in core.by_device
    core.detach(core.by_device["d3"], "c3", now=4.0)
    s4, _ = attach(core, hello("d4"), "c4")  # d3 idle goes
    core.offer(s4, cloud_frame("lidar", 1), 100, 0)
    core.detach(s4, "c4", now=5.0)
    with pytest.raises(TooManySessions, match="undelivered"):
        core.hello(hello("d5"), "c5")  # d2 and d4 both hold frames


def test_hello_returns_the_connection_it_supersedes() -> None:
    core, _ = make_core()
    first = core.hello(hello(), "old")
    assert first.superseded is None
    token = first.session.session_id
    # a reconnect with the session's token while "old" still looks attached (half-open)
    again = core.hello(hello(resume_token=token), "new")
    assert again.session is first.session
    assert again.superseded == "old"
    # the same connection replaces nothing
    assert core.hello(hello(resume_token=token), "new").superseded is None
    core.detach(again.session, "new", 1.0)
    assert core.hello(hello(), "newer").superseded is None  # detached: nothing left to close


def test_higher_lanes_are_processed_first_and_streams_of_a_lane_take_turns() -> None:
    core, _ = make_core(max_streams=4)
    specs = [
        pb.StreamSpec(stream_id="lidar", kind=pb.POINT_CLOUD),  # bulk by default
        pb.StreamSpec(stream_id="depth", kind=pb.POINT_CLOUD),  # bulk by default
        pb.StreamSpec(stream_id="tele", kind=pb.TELEMETRY),  # telemetry by default
        pb.StreamSpec(stream_id="stop", kind=pb.POINT_CLOUD, priority=pb.PRIORITY_CONTROL),
    ]
    s, _ = attach(core, pb.Hello(device_id="dev", streams=specs), "c")
    for seq in (1, 2):
        core.offer(s, cloud_frame("lidar", seq), 100, 0)
        core.offer(s, cloud_frame("depth", seq), 100, 0)
    tele = pb.Frame(stream_id="tele", seq=1)
    tele.telemetry.values["v"] = 1.0
    core.offer(s, tele, 50, 0)
    core.offer(s, cloud_frame("stop", 1), 100, 0)
    order = []
    while (item := core.take_work()) is not None:
        order.append((item.frame.stream_id, item.frame.seq))
    assert order == [
        ("stop", 1),
        ("tele", 1),
        ("lidar", 1),
        ("depth", 1),
        ("lidar", 2),
        ("depth", 2),
    ]


def test_an_unknown_priority_is_refused() -> None:
    core, _ = make_core()
    spec = pb.StreamSpec(stream_id="x", kind=pb.POINT_CLOUD, priority=9)  # type: ignore[arg-type]
    with pytest.raises(ProtocolViolation):
        core.hello(pb.Hello(device_id="dev", streams=[spec]), "c")


def test_a_flood_in_a_higher_lane_cannot_starve_a_lower_one() -> None:
    from bridge.server.core_work import LANE_BURST

    core, _ = make_core(max_streams=2, budget=10_000_000, max_frame_bytes=1_000_000)
    specs = [
        pb.StreamSpec(stream_id="noisy", kind=pb.POINT_CLOUD, priority=pb.PRIORITY_CONTROL),
        pb.StreamSpec(stream_id="lidar", kind=pb.POINT_CLOUD),
    ]
    s, _ = attach(core, pb.Hello(device_id="dev", streams=specs), "c")
    for seq in range(1, 3 * LANE_BURST):
        assert core.offer(s, cloud_frame("noisy", seq), 100, 0) is Offer.ACCEPTED
    for seq in (1, 2):
        assert core.offer(s, cloud_frame("lidar", seq), 100, 0) is Offer.ACCEPTED
    order = []
    while (item := core.take_work()) is not None:
        order.append(item.frame.stream_id)
    assert order.index("lidar") == LANE_BURST  # after LANE_BURST control frames, one bulk
    second = order.index("lidar", LANE_BURST + 1)
    assert second == 2 * LANE_BURST + 1  # and again after the next LANE_BURST
