"""The cost of a cloud's fields is bounded (issue 29, "cpu_dos fields").

A field is ~10 wire bytes and costs Python work to walk, build and validate, so every path that
meets a cloud's fields counts them against ``max_cloud_fields`` before it does that work, and
every walk of a message's keys is bounded whatever the message declares. These tests count the
work (varints decoded, fields read) instead of timing it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import overload

import pytest

from bridge.config import settings
from bridge.protocol import codec, wire
from bridge.protocol.cloud import MAX_CLOUD_FIELDS, make_layout
from bridge.protocol.errors import BatchTooLarge, ConfigError, InvalidLayout, MalformedMessage
from bridge.v1 import bridge_pb2 as pb

LIMITS = codec.Limits(max_frame_bytes=16 << 20, max_points=1 << 20, max_streams_per_session=8)
FRAME_KEY = wire.field_key(pb.EdgeMessage.DESCRIPTOR, "frame")
CLOUD_KEY = wire.field_key(pb.Frame.DESCRIPTOR, "point_cloud")
FIELDS_KEY = wire.field_key(pb.PointCloud.DESCRIPTOR, "fields")


def layout_fields(n: int, prefix: str = "f") -> list[tuple[str, int, int]]:
    """x, y, z float32, then ``n`` one-byte fields side by side: a valid layout of n + 3."""
    return [("x", 0, 7), ("y", 4, 7), ("z", 8, 7)] + [(f"{prefix}{i}", 12 + i, 2) for i in range(n)]


def cloud(n_extra: int, points: int = 1) -> pb.PointCloud:
    fields = layout_fields(n_extra)
    stride = 12 + n_extra
    return pb.PointCloud(
        point_stride=stride,
        fields=[pb.PackedField(name=a, offset=o, type=t) for a, o, t in fields],  # type: ignore[arg-type]
        data=bytes(stride * points),
    )


def frame_message(body: bytes) -> bytes:
    return FRAME_KEY + wire.encode_varint(len(body)) + body


def cloud_message(cloud_bytes: bytes, stream: str = "lidar", seq: int = 7) -> bytes:
    head = pb.Frame(stream_id=stream, seq=seq).SerializeToString()
    return frame_message(head + CLOUD_KEY + wire.encode_varint(len(cloud_bytes)) + cloud_bytes)


@pytest.fixture
def varints(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the varints the codec decodes: the unit of work of every walk of keys."""
    calls: list[int] = []
    real = wire.decode_varint

    def counting(buf: bytes | memoryview, i: int) -> tuple[int, int]:
        calls.append(i)
        return real(buf, i)

    monkeypatch.setattr(wire, "decode_varint", counting)
    return calls


def named(exc: InvalidLayout) -> tuple[str, int]:
    """The frame a refusal names (its Error carries them to the edge)."""
    assert exc.frame is not None
    return exc.frame.stream_id, exc.frame.seq


class Untouchable(Sequence[tuple[str, int, int]]):
    """A field list of a given length whose fields must not be read."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    @overload
    def __getitem__(self, i: int) -> tuple[str, int, int]: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[tuple[str, int, int]]: ...
    def __getitem__(self, i: int | slice) -> object:
        raise AssertionError("a field was read")

    def __iter__(self) -> Iterator[tuple[str, int, int]]:
        raise AssertionError("the fields were walked")


# -- the limit itself --------------------------------------------------------------------------


def test_the_limit_is_a_setting_with_a_sane_default_shared_by_the_codec() -> None:
    assert settings.Settings().max_cloud_fields == MAX_CLOUD_FIELDS == LIMITS.max_cloud_fields
    assert 64 <= MAX_CLOUD_FIELDS <= 1024
    assert settings.load({"max_cloud_fields": 1000}, env={}).max_cloud_fields == 1000
    with pytest.raises(ConfigError, match="max_cloud_fields"):
        settings.load({"max_cloud_fields": 2}, env={})


def test_make_layout_refuses_too_many_fields_before_reading_one() -> None:
    with pytest.raises(InvalidLayout, match="max_cloud_fields = 256"):
        make_layout(10**6, Untouchable(257))
    with pytest.raises(InvalidLayout, match="max_cloud_fields = 8"):
        make_layout(10**6, Untouchable(9), max_fields=8)
    assert len(make_layout(12 + 253, layout_fields(253)).fields) == 256  # at the limit: taken
    assert len(make_layout(12 + 997, layout_fields(997), max_fields=1000).fields) == 1000


def test_cloud_layout_refuses_by_count_before_building_the_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def never(*_: object) -> None:
        raise AssertionError("per-field work ran")

    monkeypatch.setattr(codec, "layout_key", never)
    with pytest.raises(InvalidLayout, match="max_cloud_fields"):
        codec.cloud_layout(cloud(300), LIMITS)


# -- before the parse: large messages ------------------------------------------------------------


def test_split_refuses_a_many_field_cloud_after_walking_at_most_the_limit(
    varints: list[int],
) -> None:
    raw = cloud_message(cloud(100_000).SerializeToString())
    with pytest.raises(InvalidLayout, match="max_cloud_fields") as refused:
        codec.split_cloud_frame(raw, max_fields=MAX_CLOUD_FIELDS)
    assert named(refused.value) == ("lidar", 7)
    assert len(varints) < 3 * (MAX_CLOUD_FIELDS + 16)  # was 2 per field: 200,000
    varints.clear()
    # Without the connection's limit it declines past the default, as quickly: decode_edge
    # then counts against the limit configured.
    assert codec.split_cloud_frame(raw) is None
    assert len(varints) < 3 * (MAX_CLOUD_FIELDS + 16)


def test_decode_edge_refuses_a_large_many_field_cloud_before_parsing_it(
    varints: list[int],
) -> None:
    # Fields 0-299, then bytes that are no protobuf: the parser would call it MALFORMED, so an
    # INVALID_LAYOUT says the count came first and nothing past the limit was read.
    body = cloud(300, points=300).SerializeToString() + b"\xff" * 8
    raw = cloud_message(body)
    assert len(raw) >= codec.WALK_BYTES
    with pytest.raises(MalformedMessage):  # when the fields are within the limit
        codec.decode_edge(raw, dataclasses.replace(LIMITS, max_cloud_fields=1000))
    varints.clear()
    with pytest.raises(InvalidLayout, match="max_cloud_fields") as refused:
        codec.decode_edge(raw, LIMITS)
    assert named(refused.value) == ("lidar", 7)
    assert len(varints) < 3 * (MAX_CLOUD_FIELDS + 16)


def test_the_limit_configured_is_the_one_applied() -> None:
    wide = dataclasses.replace(LIMITS, max_cloud_fields=400)
    big = cloud(300 - 3, points=300)
    msg = pb.EdgeMessage(frame=pb.Frame(stream_id="c", seq=1, point_cloud=big))
    raw = msg.SerializeToString()
    assert codec.decode_edge(raw, wide) == msg
    assert codec.split_cloud_frame(raw) is None  # past the default: left to decode_edge
    split = codec.split_cloud_frame(raw, max_fields=400)
    assert split is not None and len(split[0].point_cloud.fields) == 300
    assert len(codec.cloud_layout(big, wide)[0].fields) == 300
    with pytest.raises(InvalidLayout):
        codec.cloud_layout(big, LIMITS)


def test_a_frame_in_a_batch_is_counted_like_a_whole_message() -> None:
    frame = pb.Frame(stream_id="lidar", seq=3, point_cloud=cloud(300, points=300))
    member = frame.SerializeToString()
    assert len(member) >= codec.WALK_BYTES
    raw = b"\x00" + member
    with pytest.raises(InvalidLayout, match="max_cloud_fields") as refused:
        codec.decode_frame(raw, 1, len(raw), LIMITS)
    assert named(refused.value) == ("lidar", 3)


# -- after the parse: small messages, before a codec or the layout check -------------------------


@pytest.mark.parametrize("fields", [257, 1000])
def test_a_small_many_field_cloud_is_refused_right_after_the_parse(fields: int) -> None:
    frame = pb.Frame(stream_id="lidar", seq=5, point_cloud=cloud(fields - 3))
    raw = pb.EdgeMessage(frame=frame).SerializeToString()
    assert len(raw) < codec.WALK_BYTES
    with pytest.raises(InvalidLayout, match="max_cloud_fields") as refused:
        codec.decode_edge(raw, LIMITS)
    assert named(refused.value) == ("lidar", 5)
    with pytest.raises(InvalidLayout, match="max_cloud_fields"):
        codec.decode_frame(frame.SerializeToString(), 0, len(frame.SerializeToString()), LIMITS)


def test_a_cloud_at_the_limit_passes_every_path() -> None:
    at_limit = cloud(MAX_CLOUD_FIELDS - 3, points=300)
    raw = pb.EdgeMessage(frame=pb.Frame(stream_id="c", seq=1, point_cloud=at_limit))
    encoded = raw.SerializeToString()
    assert len(encoded) >= codec.WALK_BYTES
    assert codec.decode_edge(encoded, LIMITS) == raw
    split = codec.split_cloud_frame(encoded, max_fields=MAX_CLOUD_FIELDS)
    assert split is not None and len(split[0].point_cloud.fields) == MAX_CLOUD_FIELDS
    layout, points, _ = codec.cloud_layout(at_limit, LIMITS)
    assert len(layout.fields) == MAX_CLOUD_FIELDS and points == 300


def test_split_keeps_fields_written_on_both_sides_of_the_points() -> None:
    """Entries are copied as spans of the wire bytes; ones that are not adjacent still all go."""
    whole = cloud(2, points=4)
    first, rest = whole.fields[:2], whole.fields[2:]
    before = pb.PointCloud(point_stride=whole.point_stride, fields=first).SerializeToString()
    after = pb.PointCloud(fields=rest, frame_id="lidar").SerializeToString()
    data = pb.PointCloud(data=whole.data).SerializeToString()
    raw = cloud_message(before + data + after)
    split = codec.split_cloud_frame(raw)
    assert split is not None
    parsed = pb.EdgeMessage.FromString(raw).frame
    parsed.point_cloud.ClearField("data")
    assert split[0] == parsed and bytes(split[1]) == whole.data


# -- every other walk of keys is bounded too -----------------------------------------------------


def test_a_frame_of_many_repeated_fields_is_refused_after_a_bounded_walk(
    varints: list[int],
) -> None:
    """16 MiB of one two-byte field repeated was 8M steps of Python (5 s) in the telemetry
    walk and as many in the split; an encoder writes each of a Frame's fields once."""
    head = pb.Frame(stream_id="c", point_cloud=cloud(0, points=8)).SerializeToString()
    raw = frame_message(head + b"\x10\x01" * 600_000)
    assert len(raw) > LIMITS.max_telemetry_bytes
    assert codec.split_cloud_frame(raw) is None
    with pytest.raises(MalformedMessage, match="more than 64 top-level fields"):
        codec.decode_edge(raw, LIMITS)
    assert len(varints) < 20 * codec.FRAME_ENTRIES_MAX  # was 2 per entry: 2.4 million


def test_a_batch_of_many_empty_frames_is_refused_after_a_bounded_walk(
    varints: list[int],
) -> None:
    body = b"\x0a\x00" * 500_000
    raw = wire.field_key(pb.EdgeMessage.DESCRIPTOR, "batch") + wire.encode_varint(len(body)) + body
    with pytest.raises(BatchTooLarge, match="max_batch_frames"):
        codec.batch_spans(raw, LIMITS)
    assert len(varints) < 2 * (LIMITS.max_batch_frames + 8)  # was one per frame: 500,000
