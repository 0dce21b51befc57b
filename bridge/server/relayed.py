"""A frame relayed from another process of the pod (sans-I/O): what a viewer's queue needs of it.

A sibling's ``Subscribe`` stream carries finished ``ProcessedFrame`` bytes. To queue one as a local
frame is queued (and skip it with an exact ``slow_subscriber`` gap when the viewer is slow), the
receiving process needs its stream key, ``seq``, ``bridge_seq`` and the gap it already carries:
:func:`scan_head` reads those top-level fields and skips the rest by length, so a point cloud's
payload is neither parsed nor copied.
"""

from __future__ import annotations

from dataclasses import dataclass

from bridge.protocol import wire
from bridge.server.ring import Gap
from bridge.server.session import StreamKey
from bridge.v1 import bridge_pb2 as pb

_FIELDS = pb.ProcessedFrame.DESCRIPTOR
_STREAM_ID = wire.field_number(_FIELDS, "stream_id")
_SEQ = wire.field_number(_FIELDS, "seq")
_DEVICE_ID = wire.field_number(_FIELDS, "device_id")
_GAP = wire.field_number(_FIELDS, "gap")
_BRIDGE_SEQ = wire.field_number(_FIELDS, "bridge_seq")
_FIXED = {1: 8, 5: 4}  # I64 and I32 wire types: their sizes


@dataclass(frozen=True, slots=True)
class FrameHead:
    key: StreamKey
    seq: int
    bridge_seq: int
    gap: Gap | None


def scan_head(data: bytes) -> FrameHead:
    """The head of one serialized ``ProcessedFrame``. Fields may repeat (the bridge appends a
    trailer that overrides ``bridge_seq`` and merges into ``gap``): scalars, last wins; the gap
    sub-messages merge as protobuf merges them. Raises ``ValueError`` on malformed bytes."""
    view = memoryview(data)
    n = len(view)
    i = 0
    stream_id = device_id = ""
    seq = bridge_seq = 0
    gap: pb.Gap | None = None
    try:
        while i < n:
            key, i = wire.decode_varint(view, i)
            number, wire_type = key >> 3, key & 7
            if wire_type == wire.WIRE_VARINT:
                value, i = wire.decode_varint(view, i)
                if number == _SEQ:
                    seq = value
                elif number == _BRIDGE_SEQ:
                    bridge_seq = value
            elif wire_type == wire.WIRE_LEN:
                length, i = wire.decode_varint(view, i)
                end = i + length
                if end > n:
                    raise ValueError("truncated field")
                if number == _STREAM_ID:
                    stream_id = bytes(view[i:end]).decode()
                elif number == _DEVICE_ID:
                    device_id = bytes(view[i:end]).decode()
                elif number == _GAP:
                    gap = gap if gap is not None else pb.Gap()
                    gap.MergeFromString(bytes(view[i:end]))
                i = end
            elif wire_type in _FIXED:
                i += _FIXED[wire_type]
            else:
                raise ValueError(f"wire type {wire_type} in a ProcessedFrame")
    except IndexError:
        raise ValueError("truncated ProcessedFrame") from None
    if i != n:
        raise ValueError("truncated ProcessedFrame")
    if not device_id or not stream_id or not seq:
        raise ValueError("not a ProcessedFrame: device_id, stream_id or seq missing")
    carried = None
    if gap is not None and gap.count:
        carried = Gap(gap.first_seq, gap.last_seq, gap.count, gap.reason)
    return FrameHead((device_id, stream_id), seq, bridge_seq, carried)


def relay_trailer(head: FrameHead, missed: Gap) -> bytes:
    """Appended to a relayed frame, announces ``missed`` (merged with the gap the frame carries).
    Every gap field is set, so the trailer's gap overrides the frame's own, field by field."""
    gap = missed if head.gap is None else head.gap.merge(missed)
    trailer = pb.ProcessedFrame(
        bridge_seq=head.bridge_seq,
        gap=pb.Gap(
            first_seq=gap.first_seq, last_seq=gap.last_seq, count=gap.count, reason=gap.reason
        ),
    )
    return trailer.SerializeToString()
