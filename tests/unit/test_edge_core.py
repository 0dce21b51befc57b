"""The edge SDK's sans-I/O parts, message by message: no sockets, no event loop."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bridge.client import EdgeCore, PreparedPayload, StreamSpec
from bridge.client.payload import encode_frame
from bridge.protocol.cloud import make_layout, records
from bridge.protocol.errors import InvalidLayout
from bridge.v1 import bridge_pb2 as pb


def core(*streams: StreamSpec, frames: int = 100, nbytes: int = 1 << 20, **kw: object) -> EdgeCore:
    specs = streams or (StreamSpec("a", kind="telemetry"),)
    return EdgeCore(
        "dev",
        specs,
        resend_buffer_bytes=nbytes,
        resend_buffer_frames=frames,
        **kw,  # type: ignore[arg-type]
    )


def blob(c: EdgeCore, stream: str, data: bytes = b"x", t: int = 0) -> int:
    return c.publish(stream, c.prepare(stream, data), t)


def send_all(c: EdgeCore, limit: int = 0) -> list[tuple[str, int]]:
    out = []
    while (e := c.next_to_send(limit)) is not None:
        c.mark_sent(e)
        out.append((e.stream_id, e.seq))
    return out


def ack(stream: str, accepted: int, delivered: int) -> pb.Ack:
    return pb.Ack(
        streams=[pb.StreamAck(stream_id=stream, accepted_seq=accepted, delivered_seq=delivered)]
    )


def welcome(resumed: bool, *states: tuple[str, int, int], session: str = "s1") -> pb.Welcome:
    return pb.Welcome(
        session_id=session,
        resumed=resumed,
        streams=[
            pb.StreamState(stream_id=s, accepted_seq=a, delivered_seq=d) for s, a, d in states
        ],
    )


# -- sequence numbers, acks, resume ---------------------------------------------------------------


def test_seqs_per_stream_and_oldest_first_across_streams() -> None:
    c = core(StreamSpec("a", kind="telemetry"), StreamSpec("b", kind="telemetry"))
    assert [blob(c, s) for s in "abab"] == [1, 1, 2, 2]
    c.on_welcome(welcome(False), 0)
    assert send_all(c) == [("a", 1), ("b", 1), ("a", 2), ("b", 2)]
    assert (c.stats.published, c.stats.sent) == (4, 4)


def test_frames_leave_the_buffer_only_when_delivered() -> None:
    delivered: list[tuple[str, int, int, int]] = []
    c = core(on_delivered=lambda *a: delivered.append(a))
    for t in range(3):
        blob(c, "a", t=100 + t)
    c.on_welcome(welcome(False), 0)
    send_all(c)
    c.on_ack(ack("a", 3, 0), 5)
    assert c.buffered_frames == 3 and c.stats.accepted == 3  # accepted is not delivered
    c.on_ack(ack("a", 3, 2), 7)
    assert list(c.streams["a"].buf) == [3] and c.stats.delivered == 2
    assert delivered == [("a", 1, 100, 7), ("a", 2, 101, 7)]
    c.on_ack(ack("a", 3, 1), 9)  # cumulative: an older ack changes nothing
    assert c.stats.delivered == 2 and not c.all_delivered()


def test_resume_resends_above_accepted_and_a_new_session_above_delivered() -> None:
    c = core()
    for _ in range(5):
        blob(c, "a")
    c.on_welcome(welcome(False, session="s1"), 0)
    send_all(c)
    c.on_ack(ack("a", 4, 2), 0)
    hello = pb.EdgeMessage.FromString(c.hello("tok")).hello
    assert (hello.resume_token, hello.auth_token) == ("s1", "tok")
    assert [(r.stream_id, r.delivered_seq) for r in hello.resume] == [("a", 2)]
    c.on_welcome(welcome(True, ("a", 4, 2), session="s1"), 0)  # the session survived
    assert send_all(c) == [("a", 5)]
    c.on_welcome(welcome(False, ("a", 0, 3), session="s2"), 0)  # bridge restarted; sink has 3
    assert send_all(c) == [("a", 4), ("a", 5)]
    assert c.session_id == "s2" and list(c.streams["a"].buf) == [4, 5]
    assert (c.stats.sent, c.stats.resent) == (5, 3)


def test_a_fresh_process_continues_above_what_the_bridge_holds_for_its_device() -> None:
    c = core(StreamSpec("a", kind="telemetry"), StreamSpec("b", kind="telemetry"))
    blob(c, "a", b"early", t=11)  # published while connecting
    c.on_welcome(welcome(True, ("a", 7, 5), ("b", 0, 0), session="old"), 0)
    assert blob(c, "a") == 9 and blob(c, "b") == 1
    sent = []
    while (e := c.next_to_send()) is not None:
        c.mark_sent(e)
        sent.append(pb.EdgeMessage.FromString(e.data).frame)
    assert [(f.stream_id, f.seq) for f in sent] == [("a", 8), ("a", 9), ("b", 1)]
    assert (sent[0].capture_time_ns, sent[0].telemetry.blob) == (11, b"early")
    assert c.buffered_bytes == sum(len(e.data) for s in c.streams.values() for e in s.buf.values())
    c.on_ack(ack("a", 9, 9), 0)
    c.on_ack(ack("b", 1, 1), 0)
    assert c.all_delivered() and (c.stats.accepted, c.stats.delivered) == (3, 3)
    c.on_welcome(welcome(True, ("a", 9, 9), ("b", 1, 1), session="old"), 0)  # later: no shift
    assert blob(c, "a") == 10


def test_flow_control_pauses_a_stream_or_the_session_and_a_welcome_clears_it() -> None:
    c = core(StreamSpec("a", kind="telemetry"), StreamSpec("b", kind="telemetry"))
    c.on_welcome(welcome(False), 0)
    blob(c, "a")
    blob(c, "b")
    c.on_flow_control(pb.FlowControl(action=pb.FlowControl.PAUSE, stream_id="a"))
    assert c.paused("a") and not c.paused("b")
    assert send_all(c) == [("b", 1)]
    c.on_flow_control(pb.FlowControl(action=pb.FlowControl.PAUSE))
    c.on_flow_control(pb.FlowControl(action=pb.FlowControl.RESUME, stream_id="a"))
    assert c.paused("b") and c.next_to_send() is None
    c.on_welcome(welcome(True, ("a", 0, 0), ("b", 1, 0)), 0)
    assert not c.paused("a") and send_all(c) == [("a", 1)]
    assert c.stats.pauses == 2


# -- bounds, backpressure, rejections ------------------------------------------------------------


def test_backpressure_streams_wait_drop_oldest_streams_never_do() -> None:
    c = core(
        StreamSpec("bp", kind="telemetry"),
        StreamSpec("lossy", kind="telemetry", overflow="drop_oldest"),
        frames=2,
    )
    c.on_welcome(welcome(False), 0)
    assert not c.must_wait("bp", 10)
    blob(c, "bp")
    blob(c, "bp")
    assert c.must_wait("bp", 10) and not c.must_wait("lossy", 10)
    c.on_ack(ack("bp", 2, 1), 0)  # delivered 1: room again
    assert not c.must_wait("bp", 10)
    c.on_flow_control(pb.FlowControl(action=pb.FlowControl.PAUSE, stream_id="bp"))
    assert c.must_wait("bp", 10) and not c.must_wait("lossy", 10)


def test_open_loop_a_full_buffer_evicts_the_oldest_frame_across_streams_keeps_the_newest() -> None:
    a, b = StreamSpec("a", kind="telemetry"), StreamSpec("b", kind="telemetry")
    c = core(a, b, nbytes=100, protect_backpressure=False)
    blob(c, "a", b"1" * 30)
    blob(c, "b", b"2" * 30)
    blob(c, "a", b"3" * 30)  # over 100 bytes with headers: a/1 goes
    assert sorted((s, q) for s, x in c.streams.items() for q in x.buf) == [("a", 2), ("b", 1)]
    blob(c, "b", b"4" * 500)  # larger than the whole buffer: it alone stays
    assert c.buffered_frames == 1 and list(c.streams["b"].buf) == [2]
    assert c.stats.dropped == 3 and not c.has_room(1)
    assert core(nbytes=100).has_room(10**9)  # an empty buffer takes any frame


def test_eviction_takes_unsent_frames_first_and_acks_count_only_sent_frames() -> None:
    c = core(StreamSpec("a", kind="telemetry"), frames=3, protect_backpressure=False)
    blob(c, "a")
    blob(c, "a")
    assert send_all(c) == [("a", 1), ("a", 2)]  # in the bridge's hands now
    c.on_flow_control(pb.FlowControl(action=pb.FlowControl.PAUSE, stream_id="a"))
    for _ in range(4):
        blob(c, "a")  # paused: seqs 3..6 queue, and each new one evicts the oldest unsent
    assert list(c.streams["a"].buf) == [1, 2, 6] and c.stats.dropped == 3
    c.on_flow_control(pb.FlowControl(action=pb.FlowControl.RESUME, stream_id="a"))
    assert send_all(c) == [("a", 6)]
    c.on_ack(ack("a", 6, 6), 0)  # the bridge's cumulative seq jumps over 3..5
    assert c.stats.accepted == c.stats.delivered == c.stats.sent == 3
    assert c.stats.published == c.stats.delivered + c.stats.dropped


def test_a_drop_oldest_stream_never_evicts_a_backpressure_streams_frames() -> None:
    bp = StreamSpec("bp", kind="telemetry", overflow="backpressure")
    lossy = StreamSpec("lossy", kind="telemetry", overflow="drop_oldest")
    c = core(bp, lossy, frames=2)
    blob(c, "bp")
    blob(c, "bp")
    blob(c, "lossy")  # over the bound by this one frame: nothing else may go
    assert c.buffered_frames == 3 and c.stats.dropped == 0
    blob(c, "lossy")  # the older lossy frame goes, the backpressure ones stay
    assert list(c.streams["bp"].buf) == [1, 2] and list(c.streams["lossy"].buf) == [2]
    assert c.stats.dropped == 1


def test_rejections_forget_the_frame_for_good() -> None:
    c = core()
    for data in (b"s", b"x" * 2000, b"s"):
        blob(c, "a", data)
    c.on_welcome(welcome(False), 0)
    assert send_all(c, limit=500) == [("a", 1), ("a", 3)]  # 2 exceeds the Welcome's limit
    c.on_error(pb.Error(code=pb.INVALID_LAYOUT, stream_id="a", seq=3))
    c.on_error(pb.Error(code=pb.SHUTTING_DOWN, stream_id="a", seq=1))  # not about the frame
    assert list(c.streams["a"].buf) == [1]
    assert c.stats.rejected == 2 and c.stats.errors == {"INVALID_LAYOUT": 1, "SHUTTING_DOWN": 1}


def test_streams_and_payloads_are_checked() -> None:
    with pytest.raises(ValueError, match="unique"):
        core(StreamSpec("a"), StreamSpec("a"))
    with pytest.raises(ValueError, match="overflow"):
        StreamSpec("a", overflow="sometimes")  # type: ignore[arg-type]
    c = core(StreamSpec("lidar"), StreamSpec("status", kind="telemetry"))
    with pytest.raises(KeyError, match="not declared"):
        c.prepare("nope", b"")
    with pytest.raises(TypeError, match="telemetry payload on a point_cloud stream"):
        c.prepare("lidar", {"v": 1.0})
    with pytest.raises(TypeError, match="point_cloud payload on telemetry stream"):
        c.publish("status", PreparedPayload.cloud(np.zeros((1, 3), np.float32)), 0)
    spec = pb.EdgeMessage.FromString(c.hello()).hello.streams
    assert [(s.stream_id, s.kind, s.overflow) for s in spec] == [
        ("lidar", pb.POINT_CLOUD, pb.OVERFLOW_POLICY_UNSPECIFIED),
        ("status", pb.TELEMETRY, pb.OVERFLOW_POLICY_UNSPECIFIED),
    ]
    assert (
        StreamSpec("x", overflow=pb.DROP_OLDEST).policy
        == StreamSpec("x", overflow="drop_oldest").policy
    )


# -- payload encoding ---------------------------------------------------------------------------


def test_prepared_frames_encode_exactly_like_the_message() -> None:
    cloud = pb.PointCloud(point_stride=12, data=bytes(range(240)), frame_id="f")
    for payload in (cloud, pb.Telemetry(values={"v": 1.5}), b"blob" * 100, {"k": 2.0}):
        prepared = PreparedPayload.of(payload)  # type: ignore[arg-type]
        msg = pb.EdgeMessage.FromString(encode_frame("lidar", 300, -5, prepared))
        expected = pb.EdgeMessage(frame=pb.Frame(stream_id="lidar", seq=300, capture_time_ns=-5))
        if isinstance(payload, pb.PointCloud):
            expected.frame.point_cloud.CopyFrom(payload)
        elif isinstance(payload, pb.Telemetry):
            expected.frame.telemetry.CopyFrom(payload)
        elif isinstance(payload, bytes):
            expected.frame.telemetry.blob = payload
        else:
            expected.frame.telemetry.values.update(payload)
        assert msg == expected
    raw = PreparedPayload.of(cloud.SerializeToString(), "point_cloud")  # prepared cloud bytes
    assert pb.EdgeMessage.FromString(encode_frame("s", 1, 0, raw)).frame.point_cloud == cloud


@given(
    st.integers(0, 300),
    st.sampled_from([np.float32, np.float64]),
    st.sampled_from([3, 4]),
    st.booleans(),
)
def test_float_arrays_become_xyz_clouds_the_bridge_accepts(
    n: int, dtype: type, width: int, big_endian: bool
) -> None:
    pts = np.random.default_rng(n).uniform(-1e3, 1e3, (n, width)).astype(dtype)
    if big_endian:
        pts = pts.astype(pts.dtype.newbyteorder(">"))
    frame = pb.EdgeMessage.FromString(
        encode_frame("l", 1, 0, PreparedPayload.of(pts, "point_cloud"))
    ).frame
    pc = frame.point_cloud
    layout = make_layout(pc.point_stride, [(f.name, f.offset, f.type) for f in pc.fields])
    assert [f.name for f in layout.fields] == ["x", "y", "z", "intensity"][:width]
    view = records(layout, pc.data)
    for i, name in enumerate(["x", "y", "z", "intensity"][:width]):
        assert np.array_equal(view[name], pts[:, i])


def test_structured_arrays_keep_their_fields_offsets_and_padding() -> None:
    dt = np.dtype(
        {
            "names": ["x", "y", "z", "rgb", "ring"],
            "formats": ["<f4", "<f4", "<f4", "<u4", ">u2"],
            "offsets": [0, 4, 8, 16, 20],
            "itemsize": 24,
        }
    )
    pts = np.zeros(5, dtype=dt)
    pts["x"] = np.arange(5)
    pts["ring"] = 300
    pc = pb.EdgeMessage.FromString(
        encode_frame("l", 1, 0, PreparedPayload.cloud(pts, frame_id="lidar_link"))
    ).frame.point_cloud
    assert pc.point_stride == 24 and pc.frame_id == "lidar_link"
    assert [(f.name, f.offset, f.type) for f in pc.fields] == [
        ("x", 0, pb.FLOAT32), ("y", 4, pb.FLOAT32), ("z", 8, pb.FLOAT32),
        ("rgb", 16, pb.UINT32), ("ring", 20, pb.UINT16),
    ]  # fmt: skip
    view = records(make_layout(24, [(f.name, f.offset, f.type) for f in pc.fields]), pc.data)
    assert list(view["ring"]) == [300] * 5 and list(view["x"]) == [0, 1, 2, 3, 4]


def test_arrays_the_bridge_would_refuse_fail_at_the_caller() -> None:
    with pytest.raises(InvalidLayout, match="'z' is missing"):
        PreparedPayload.of(np.zeros(3, dtype=[("x", "<f4"), ("y", "<f4")]))
    with pytest.raises(InvalidLayout, match="float32 or float64"):
        PreparedPayload.of(np.zeros(3, dtype=[("x", "<i4"), ("y", "<f4"), ("z", "<f4")]))
    with pytest.raises(ValueError, match="shape"):
        PreparedPayload.of(np.zeros((4, 5), np.float32))
    with pytest.raises(ValueError, match="cannot carry"):
        PreparedPayload.of(
            np.zeros(2, dtype=[("x", "<f4"), ("y", "<f4"), ("z", "<f4"), ("s", "U3")])
        )
    with pytest.raises(TypeError, match="cannot publish"):
        PreparedPayload.of(3.5)  # type: ignore[arg-type]
