"""Wire codec (sans-I/O): bytes <-> protobuf messages, with every limit checked here.

Adapters hand raw bytes in and get either a message or a :class:`~bridge.errors.ProtocolError`
that says exactly what was wrong, so both transports reject bad input the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

from google.protobuf.message import DecodeError

from bridge.cloud import CloudLayout, make_layout, point_count
from bridge.errors import FrameTooLarge, MalformedMessage
from bridge.v1 import bridge_pb2 as pb


@dataclass(frozen=True, slots=True)
class Limits:
    max_frame_bytes: int
    max_points: int
    max_streams_per_session: int

    def to_proto(self) -> pb.ServerLimits:
        return pb.ServerLimits(
            max_frame_bytes=self.max_frame_bytes,
            max_points=self.max_points,
            max_streams_per_session=self.max_streams_per_session,
        )


def decode_edge(raw: bytes, limits: Limits) -> pb.EdgeMessage:
    """Parse one EdgeMessage; refuse oversize or undecodable bytes and empty oneofs."""
    if len(raw) > limits.max_frame_bytes:
        raise FrameTooLarge(f"message of {len(raw)} bytes exceeds max {limits.max_frame_bytes}")
    msg = pb.EdgeMessage()
    try:
        msg.ParseFromString(raw)
    except DecodeError as exc:
        raise MalformedMessage(f"not a valid EdgeMessage: {exc}") from None
    if msg.WhichOneof("kind") is None:
        raise MalformedMessage("EdgeMessage carries neither hello nor frame")
    return msg


LayoutKey = tuple[int, tuple[tuple[str, int, int], ...]]


def layout_key(cloud: pb.PointCloud) -> LayoutKey:
    """What identifies a layout; streams cache their validated layout under it."""
    return cloud.point_stride, tuple((f.name, f.offset, int(f.type)) for f in cloud.fields)


def cloud_layout(
    cloud: pb.PointCloud, limits: Limits, cached: tuple[LayoutKey, CloudLayout] | None = None
) -> tuple[CloudLayout, int, LayoutKey]:
    """Validate a PointCloud's packed layout (unless ``cached`` already holds it) and its size.

    Returns the layout, the point count and the layout's key. ``cloud.data`` is read once: the
    protobuf runtime copies a bytes field on every access, which costs at 1 MB per frame.
    """
    key = layout_key(cloud)
    if cached is not None and cached[0] == key:
        layout = cached[1]
    else:
        layout = make_layout(key[0], list(key[1]))
    return layout, point_count(layout, len(cloud.data), limits.max_points), key
