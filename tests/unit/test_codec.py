"""Codec and cloud layout: property tests over random field layouts and messages."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.protocol import codec
from bridge.protocol.cloud import FieldType, field_view, make_layout, point_count, records, xyz_view
from bridge.protocol.errors import FrameTooLarge, InvalidLayout, MalformedMessage, TooManyPoints
from bridge.v1 import bridge_pb2 as pb

LIMITS = codec.Limits(max_frame_bytes=1 << 20, max_points=10_000, max_streams_per_session=8)

field_st = st.tuples(
    st.sampled_from(["x", "y", "z", "rgb", "intensity", "ring", "t"]),
    st.integers(0, 40),
    st.integers(0, 9),  # 0 and 9 are not valid types
)


def is_valid(stride: int, fields: list[tuple[str, int, int]]) -> bool:
    """An independent statement of the layout rules."""
    if stride <= 0 or len({n for n, _, _ in fields}) != len(fields):
        return False
    spans = []
    for _name, offset, code in fields:
        if code not in range(1, 9):
            return False
        size = FieldType(code).size
        if offset + size > stride:
            return False
        spans.append((offset, offset + size))
    spans.sort()
    if any(b[0] < a[1] for a, b in itertools.pairwise(spans)):
        return False
    types = {n: c for n, _, c in fields}
    return all(types.get(axis) in (7, 8) for axis in "xyz")


@settings(max_examples=400, deadline=None)
@given(stride=st.integers(-1, 48), fields=st.lists(field_st, max_size=6))
def test_layout_validation_matches_the_rules(
    stride: int, fields: list[tuple[str, int, int]]
) -> None:
    if is_valid(stride, fields):
        layout = make_layout(stride, fields)
        assert layout.stride == stride and len(layout.fields) == len(fields)
    else:
        with pytest.raises(InvalidLayout):
            make_layout(stride, fields)


@settings(max_examples=100, deadline=None)
@given(
    n=st.integers(0, 50),
    pad=st.integers(0, 8),
    dtype=st.sampled_from([(7, "<f4"), (8, "<f8")]),
    seed=st.integers(0, 2**16),
)
def test_views_are_zero_copy_and_exact(n: int, pad: int, dtype: tuple[int, str], seed: int) -> None:
    code, np_type = dtype
    size = np.dtype(np_type).itemsize
    stride = 3 * size + 2 + pad
    layout = make_layout(
        stride, [("x", 0, code), ("y", size, code), ("z", 2 * size, code), ("ring", 3 * size, 4)]
    )
    rng = np.random.default_rng(seed)
    rec = np.zeros(n, dtype=layout.structured_dtype)
    for axis in "xyz":
        rec[axis] = rng.normal(size=n)
    rec["ring"] = rng.integers(0, 64, size=n)
    data = rec.tobytes()
    xyz = xyz_view(layout, data)
    assert np.shares_memory(xyz, np.frombuffer(data, dtype=np.uint8)) or n == 0
    np.testing.assert_array_equal(xyz[:, 0], rec["x"])
    np.testing.assert_array_equal(field_view(layout, data, "ring"), rec["ring"])
    np.testing.assert_array_equal(records(layout, data)["z"], rec["z"])
    assert point_count(layout, len(data)) == n


def test_point_count_checks_length_and_limit() -> None:
    layout = make_layout(12, [("x", 0, 7), ("y", 4, 7), ("z", 8, 7)])
    with pytest.raises(InvalidLayout):
        point_count(layout, 13)
    with pytest.raises(TooManyPoints):
        point_count(layout, 12 * 11, max_points=10)


@settings(max_examples=200, deadline=None)
@given(raw=st.binary(max_size=200))
def test_decode_edge_never_crashes_on_garbage(raw: bytes) -> None:
    try:
        msg = codec.decode_edge(raw, LIMITS)
    except MalformedMessage:
        return
    assert msg.WhichOneof("kind") in ("hello", "frame")


@settings(max_examples=100, deadline=None)
@given(device=st.text(max_size=20), seq=st.integers(1, 2**63), blob=st.binary(max_size=100))
def test_decode_edge_round_trips(device: str, seq: int, blob: bytes) -> None:
    frame = pb.EdgeMessage(
        frame=pb.Frame(stream_id=device, seq=seq, telemetry=pb.Telemetry(blob=blob))
    )
    assert codec.decode_edge(frame.SerializeToString(), LIMITS) == frame


def test_decode_edge_refuses_oversize_and_empty() -> None:
    with pytest.raises(FrameTooLarge):
        codec.decode_edge(b"\x00" * (LIMITS.max_frame_bytes + 1), LIMITS)
    with pytest.raises(MalformedMessage, match="neither"):
        codec.decode_edge(b"", LIMITS)


def test_cloud_layout_uses_the_cache_only_for_the_same_layout() -> None:
    cloud = pb.PointCloud(
        point_stride=12,
        fields=[pb.PackedField(name=a, offset=4 * i, type=pb.FLOAT32) for i, a in enumerate("xyz")],
        data=b"\x00" * 24,
    )
    layout, points, cached = codec.cloud_layout(cloud, LIMITS)
    assert points == 2
    again, _, still = codec.cloud_layout(cloud, LIMITS, cached)
    assert again is layout and still is cached
    cloud.fields[2].offset = 6  # overlaps y now: must be validated, not taken from the cache
    with pytest.raises(InvalidLayout):
        codec.cloud_layout(cloud, LIMITS, cached)


@pytest.mark.parametrize("change", ["name", "type", "stride", "one more field", "one fewer field"])
def test_cloud_layout_cache_misses_on_any_change_of_the_layout(change: str) -> None:
    def xyzi() -> pb.PointCloud:
        fields = [
            pb.PackedField(name=a, offset=4 * i, type=pb.FLOAT32) for i, a in enumerate("xyz")
        ]
        fields.append(pb.PackedField(name="intensity", offset=12, type=pb.FLOAT32))
        return pb.PointCloud(point_stride=20, fields=fields, data=b"\x00" * 40)

    layout, _, cached = codec.cloud_layout(xyzi(), LIMITS)
    cloud = xyzi()
    if change == "name":
        cloud.fields[3].name = "reflectivity"
    elif change == "type":
        cloud.fields[3].type = pb.UINT32
    elif change == "stride":
        cloud.point_stride = 40
    elif change == "one more field":
        cloud.fields.append(pb.PackedField(name="ring", offset=16, type=pb.UINT8))
    else:
        del cloud.fields[3]
    fresh, _, entry = codec.cloud_layout(cloud, LIMITS, cached)
    assert fresh is not layout and fresh != layout
    assert entry is not cached and entry.matches(cloud) and not cached.matches(cloud)


# -- large clouds split without parsing their points --------------------------------------------

_names = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=8)


@st.composite
def cloud_messages(draw: st.DrawFn) -> pb.Frame:
    fields = [
        pb.PackedField(name=draw(_names), offset=draw(st.integers(0, 64)), type=pb.FLOAT32)
        for _ in range(draw(st.integers(0, 4)))
    ]
    cloud = pb.PointCloud(
        point_stride=draw(st.integers(0, 2**32 - 1)),
        fields=fields,
        data=draw(st.binary(max_size=300)),
        frame_id=draw(_names),
    )
    if draw(st.booleans()):
        cloud.pose.CopyFrom(pb.Pose(px=draw(st.floats(allow_nan=False)), qw=1.0))
    return pb.Frame(
        stream_id=draw(_names),
        seq=draw(st.integers(0, 2**64 - 1)),
        capture_time_ns=draw(st.integers(-(2**63), 2**63 - 1)),
        point_cloud=cloud,
    )


@settings(max_examples=300)
@given(cloud_messages())
def test_split_cloud_frame_equals_the_parser(frame: pb.Frame) -> None:
    raw = pb.EdgeMessage(frame=frame).SerializeToString()
    split = codec.split_cloud_frame(raw)
    if not frame.point_cloud.data:
        assert split is None  # no points to keep apart: parsed as usual
        return
    assert split is not None
    meta, data = split
    expected = pb.Frame()
    expected.CopyFrom(frame)
    expected.point_cloud.ClearField("data")
    assert meta == expected
    assert bytes(data) == frame.point_cloud.data


@settings(max_examples=500)
@given(cloud_messages(), st.integers(0, 10_000), st.binary(min_size=1, max_size=3))
def test_split_cloud_frame_never_takes_what_the_parser_would_not(
    frame: pb.Frame, at: int, junk: bytes
) -> None:
    raw = bytearray(pb.EdgeMessage(frame=frame).SerializeToString())
    at %= len(raw)
    raw[at : at + len(junk)] = junk  # corrupt some bytes
    split = codec.split_cloud_frame(bytes(raw))
    if split is None:
        return  # the caller parses the whole message
    parsed = pb.EdgeMessage.FromString(bytes(raw))  # the parser accepts it too ...
    assert parsed.WhichOneof("kind") == "frame"
    expected = pb.Frame()
    expected.CopyFrom(parsed.frame)
    expected.point_cloud.ClearField("data")
    meta, data = split
    assert meta == expected and bytes(data) == parsed.frame.point_cloud.data  # ... and agrees


def test_split_cloud_frame_leaves_other_shapes_to_the_parser() -> None:
    tele = pb.EdgeMessage(frame=pb.Frame(stream_id="t", seq=1, telemetry=pb.Telemetry(blob=b"x")))
    assert codec.split_cloud_frame(tele.SerializeToString()) is None
    hello = pb.EdgeMessage(hello=pb.Hello(device_id="d"))
    assert codec.split_cloud_frame(hello.SerializeToString()) is None
    cloud = pb.EdgeMessage(frame=pb.Frame(stream_id="c", seq=1, point_cloud=pb.PointCloud()))
    raw = cloud.SerializeToString()
    twice = raw + raw  # a repeated frame field: the parser merges, the fast path declines
    assert codec.split_cloud_frame(twice) is None


def test_split_cloud_frame_declines_fixed_width_fields_the_parser_keeps_as_unknown() -> None:
    cloud = pb.PointCloud(point_stride=12, data=b"\x00" * 12).SerializeToString()
    odd = cloud + b"\x1d\x00\x00\x00\x00"  # field 3 (data) again, as a fixed32: unknown field
    frame = b"\x0a\x01a" + b"\x22" + bytes([len(odd)]) + odd
    raw = b"\x12" + bytes([len(frame)]) + frame
    assert pb.EdgeMessage.FromString(raw).frame.point_cloud.data == b"\x00" * 12
    assert codec.split_cloud_frame(raw) is None
    zero = b"\x05\x00\x00\x00\x00"  # field number 0: the parser refuses the message
    frame = b"\x0a\x01a" + zero + b"\x22" + bytes([len(cloud)]) + cloud
    assert codec.split_cloud_frame(b"\x12" + bytes([len(frame)]) + frame) is None
