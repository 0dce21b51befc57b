"""The hand-splice helpers agree with the real protobuf encoder."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.protocol import wire
from bridge.v1 import bridge_pb2 as pb


@settings(deadline=None)  # timing varies on a loaded CI machine
@given(st.integers(min_value=1, max_value=2**64 - 1))
def test_varint_round_trips_and_matches_protobuf(value: int) -> None:
    encoded = wire.encode_varint(value)
    assert wire.decode_varint(encoded, 0) == (value, len(encoded))
    # A non-default uint64 field is encoded as its key followed by the varint (proto3 omits 0).
    reference = pb.Frame(seq=value).SerializeToString()
    assert reference == wire.field_key(pb.Frame.DESCRIPTOR, "seq", wire.WIRE_VARINT) + encoded


def test_varint_lengths_at_their_boundaries() -> None:
    for value, size in [(0, 1), (127, 1), (128, 2), (16383, 2), (16384, 3), (2**21 - 1, 3)]:
        encoded = wire.encode_varint(value)
        assert len(encoded) == size
        assert wire.decode_varint(encoded, 0) == (value, size)
        if value:
            assert encoded == pb.Frame(seq=value).SerializeToString()[1:]


@settings(deadline=None)
@given(st.text(max_size=30), st.text(max_size=20), st.integers(min_value=0, max_value=2**63))
def test_spliced_frame_equals_encoder(frame_id: str, stream_id: str, seq: int) -> None:
    cloud = pb.PointCloud(frame_id=frame_id).SerializeToString()
    header = pb.Frame(stream_id=stream_id, seq=seq).SerializeToString()
    inner = header + wire.length_prefix(
        wire.field_key(pb.Frame.DESCRIPTOR, "point_cloud"), len(cloud)
    )
    inner += cloud
    spliced = wire.length_prefix(wire.field_key(pb.EdgeMessage.DESCRIPTOR, "frame"), len(inner))
    spliced += inner
    reference = pb.EdgeMessage(
        frame=pb.Frame(stream_id=stream_id, seq=seq, point_cloud=pb.PointCloud(frame_id=frame_id))
    ).SerializeToString()
    assert spliced == reference


def test_key_byte_rejects_numbers_that_need_two_bytes() -> None:
    assert wire.key_byte(pb.EdgeMessage.DESCRIPTOR, "frame") == (
        pb.EdgeMessage.DESCRIPTOR.fields_by_name["frame"].number << 3 | 2
    )


def test_truncated_varint_raises() -> None:
    try:
        wire.decode_varint(b"\x80\x80", 0)
    except IndexError:
        return
    raise AssertionError("a truncated varint must not decode")
