"""Wire codec (sans-I/O): bytes <-> protobuf messages, with every limit checked here.

Adapters hand raw bytes in and get either a message or a :class:`~bridge.errors.ProtocolError`
that says exactly what was wrong, so both transports reject bad input the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

from google.protobuf.message import DecodeError

from bridge import wire
from bridge.cloud import CloudLayout, make_layout, point_count
from bridge.errors import BatchTooLarge, FrameTooLarge, MalformedMessage, TelemetryTooLarge
from bridge.v1 import bridge_pb2 as pb


@dataclass(frozen=True, slots=True)
class Limits:
    max_frame_bytes: int
    max_points: int
    max_streams_per_session: int
    max_telemetry_bytes: int = 1 << 20
    max_telemetry_entries: int = 4096
    max_batch_frames: int = 256  # 0 = no FrameBatch accepted

    def to_proto(self) -> pb.ServerLimits:
        return pb.ServerLimits(
            max_frame_bytes=self.max_frame_bytes,
            max_points=self.max_points,
            max_streams_per_session=self.max_streams_per_session,
            max_batch_frames=self.max_batch_frames,
            max_telemetry_bytes=self.max_telemetry_bytes,
        )


def decode_edge(raw: bytes, limits: Limits) -> pb.EdgeMessage:
    """Parse one EdgeMessage; refuse oversize or undecodable bytes and empty oneofs.

    Telemetry is sized before it is parsed (a map of many small entries costs far more to parse
    than its bytes suggest), and its entries are counted after; both refusals are non-fatal and
    carry the frame's stream and seq so the edge knows which frame was refused.
    """
    if len(raw) > limits.max_frame_bytes:
        raise FrameTooLarge(f"message of {len(raw)} bytes exceeds max {limits.max_frame_bytes}")
    # A message no larger than the limit cannot carry too much telemetry: skip the walk.
    telemetry_bytes = _telemetry_size(raw) if len(raw) > limits.max_telemetry_bytes else 0
    if telemetry_bytes > limits.max_telemetry_bytes:
        raise TelemetryTooLarge(
            f"telemetry of {telemetry_bytes} bytes exceeds max_telemetry_bytes "
            f"{limits.max_telemetry_bytes}",
            frame=_frame_header(raw),
        )
    msg = pb.EdgeMessage()
    try:
        msg.ParseFromString(raw)
    except DecodeError as exc:
        raise MalformedMessage(f"not a valid EdgeMessage: {exc}") from None
    kind = msg.WhichOneof("kind")
    if kind is None:
        raise MalformedMessage("EdgeMessage carries neither hello nor frame")
    if kind == "batch":  # a batch arriving where is_batch() was not asked (e.g. first message)
        raise MalformedMessage("a FrameBatch is not a whole EdgeMessage here")
    if kind == "frame" and msg.frame.HasField("telemetry"):
        _check_entries(msg.frame, limits)
    return msg


def _check_entries(frame: pb.Frame, limits: Limits) -> None:
    entries = len(frame.telemetry.values)
    if entries > limits.max_telemetry_entries:
        header = pb.Frame(stream_id=frame.stream_id, seq=frame.seq)
        raise TelemetryTooLarge(
            f"telemetry with {entries} entries exceeds max_telemetry_entries "
            f"{limits.max_telemetry_entries}",
            frame=header,
        )


_BATCH_KEY = wire.field_key(pb.EdgeMessage.DESCRIPTOR, "batch")
_IN_BATCH_KEY = wire.field_key(pb.FrameBatch.DESCRIPTOR, "frames")


def is_batch(raw: bytes) -> bool:
    """Whether ``raw`` is an ``EdgeMessage{batch}`` (decoded by :func:`batch_spans`)."""
    return raw.startswith(_BATCH_KEY)


def batch_spans(raw: bytes, limits: Limits) -> list[tuple[int, int]]:
    """(start, end) of each Frame in an ``EdgeMessage{batch}``, checked against the limits
    before anything is parsed: the frame count, and the telemetry bytes of all frames together
    (the same parse-cost bound one message has). Each frame is then parsed on its own
    (:func:`decode_frame`), so no frame's memory outlives it inside a shared batch."""
    if len(raw) > limits.max_frame_bytes:
        raise FrameTooLarge(f"message of {len(raw)} bytes exceeds max {limits.max_frame_bytes}")
    try:
        length, start = wire.decode_varint(raw, len(_BATCH_KEY))
        if start + length != len(raw):
            raise ValueError("batch length does not match the message")
        spans = [
            (start + a, start + b)
            for a, b in wire.repeated_spans(memoryview(raw)[start:], _IN_BATCH_KEY)
        ]
    except (IndexError, ValueError) as exc:
        raise MalformedMessage(f"not a valid FrameBatch: {exc}") from None
    if not spans:
        raise MalformedMessage("empty FrameBatch")
    if len(spans) > limits.max_batch_frames:
        raise BatchTooLarge(
            f"FrameBatch of {len(spans)} frames exceeds max_batch_frames {limits.max_batch_frames}"
        )
    telemetry = sum(_telemetry_in(raw, a, b) for a, b in spans)
    if telemetry > limits.max_telemetry_bytes:
        raise BatchTooLarge(
            f"FrameBatch with {telemetry} telemetry bytes exceeds max_telemetry_bytes "
            f"{limits.max_telemetry_bytes}"
        )
    return spans


def decode_frame(raw: bytes, start: int, end: int, limits: Limits) -> pb.Frame:
    """One Frame of a batch (see :func:`batch_spans`)."""
    frame = pb.Frame()
    try:
        frame.ParseFromString(raw[start:end])
    except DecodeError as exc:
        raise MalformedMessage(f"not a valid Frame in a FrameBatch: {exc}") from None
    if frame.HasField("telemetry"):
        _check_entries(frame, limits)
    return frame


_FRAME_KEY = wire.field_key(pb.EdgeMessage.DESCRIPTOR, "frame")
_TELEMETRY = wire.field_number(pb.Frame.DESCRIPTOR, "telemetry")
_STREAM_ID = wire.field_number(pb.Frame.DESCRIPTOR, "stream_id")
_SEQ = wire.field_number(pb.Frame.DESCRIPTOR, "seq")


def _frame_fields(raw: bytes) -> list[tuple[int, int, int, int]]:
    """(field number, wire type, value or start, length) of the top-level Frame fields, or []
    when ``raw`` is not a well-formed EdgeMessage{frame} (the parser then says what is wrong).
    Walks keys and lengths only: O(fields), never O(bytes)."""
    try:
        if not raw.startswith(_FRAME_KEY):
            return []
        length, i = wire.decode_varint(raw, len(_FRAME_KEY))
        end = i + length
        if end > len(raw):
            return []
    except (IndexError, ValueError):
        return []
    return _fields_in(raw, i, end)


def _fields_in(
    raw: bytes, i: int, end: int, *, fixed: bool = False
) -> list[tuple[int, int, int, int]]:
    """:func:`_frame_fields` of the Frame at ``raw[i:end]``; ``fixed``: list I32 / I64 fields
    too (start, width) instead of skipping them."""
    try:
        out = []
        while i < end:
            key, i = wire.decode_varint(raw, i)
            number, wire_type = key >> 3, key & 7
            if wire_type == wire.WIRE_VARINT:
                value, i = wire.decode_varint(raw, i)
                out.append((number, wire_type, value, 0))
            elif wire_type == wire.WIRE_LEN:
                size, i = wire.decode_varint(raw, i)
                out.append((number, wire_type, i, size))
                i += size
            elif wire_type in (1, 5):
                width = 8 if wire_type == 1 else 4
                if fixed:
                    out.append((number, wire_type, i, width))
                i += width
            else:
                return []
        return out if i == end else []
    except (IndexError, ValueError):
        return []


def _telemetry_size(raw: bytes) -> int:
    return sum(size for n, t, _, size in _frame_fields(raw) if n == _TELEMETRY and t == 2)


def _telemetry_in(raw: bytes, start: int, end: int) -> int:
    return sum(size for n, t, _, size in _fields_in(raw, start, end) if n == _TELEMETRY and t == 2)


def _frame_header(raw: bytes) -> pb.Frame:
    frame = pb.Frame()
    for number, wire_type, value, size in _frame_fields(raw):
        if number == _STREAM_ID and wire_type == wire.WIRE_LEN:
            frame.stream_id = raw[value : value + size].decode("utf-8", "replace")
        elif number == _SEQ and wire_type == wire.WIRE_VARINT:
            frame.seq = value
    return frame


LayoutKey = tuple[int, tuple[tuple[str, int, int], ...]]


def layout_key(cloud: pb.PointCloud) -> LayoutKey:
    """What identifies a layout (stride and fields), as plain values."""
    return cloud.point_stride, tuple((f.name, f.offset, int(f.type)) for f in cloud.fields)


@dataclass(frozen=True, slots=True)
class CachedLayout:
    """A stream's last validated layout. ``fields`` are standalone copies of the messages it
    was validated from (holding the frame's own would keep the whole frame alive): comparing a
    freshly parsed frame's fields with them costs ~3.3 us for four fields, building the key
    tuple ~4.8 us."""

    fields: list[pb.PackedField]
    layout: CloudLayout

    @classmethod
    def of(cls, key: LayoutKey, layout: CloudLayout) -> CachedLayout:
        fields = [pb.PackedField(name=n, offset=o, type=t) for n, o, t in key[1]]  # type: ignore[arg-type]
        return cls(fields, layout)

    def matches(self, cloud: pb.PointCloud) -> bool:
        return cloud.point_stride == self.layout.stride and cloud.fields == self.fields


def cloud_layout(
    cloud: pb.PointCloud,
    limits: Limits,
    cached: CachedLayout | None = None,
    nbytes: int | None = None,
) -> tuple[CloudLayout, int, CachedLayout]:
    """Validate a PointCloud's packed layout (unless ``cached`` already holds it) and its size.

    Returns the layout, the point count and the cache entry for the next frame. ``nbytes`` is
    ``len(cloud.data)`` when the caller already holds the data: the protobuf runtime copies a
    bytes field on every access, which costs at 1 MB per frame.
    """
    if cached is not None and cached.matches(cloud):
        entry = cached
    else:
        key = layout_key(cloud)
        entry = CachedLayout.of(key, make_layout(key[0], list(key[1])))
    size = len(cloud.data) if nbytes is None else nbytes
    return entry.layout, point_count(entry.layout, size, limits.max_points), entry


# -- large clouds without a parse of their points ----------------------------------------------

_F_STREAM, _F_SEQ, _F_CAPTURE, _F_CLOUD = (
    wire.field_number(pb.Frame.DESCRIPTOR, name)
    for name in ("stream_id", "seq", "capture_time_ns", "point_cloud")
)
_C_STRIDE, _C_DATA, _C_FIELDS = (
    wire.field_number(pb.PointCloud.DESCRIPTOR, name) for name in ("point_stride", "data", "fields")
)
_C_META = {
    wire.field_number(pb.PointCloud.DESCRIPTOR, name) for name in ("fields", "frame_id", "pose")
}
_U64 = 1 << 64


def split_cloud_frame(raw: bytes) -> tuple[pb.Frame, memoryview] | None:
    """An ``EdgeMessage{frame}`` carrying a point cloud, as (the frame without its points, a
    view of the points in ``raw``): the megabytes of points are neither parsed nor copied.

    Only the plain shape is taken (each Frame and PointCloud field at most once, the wire types
    the schema says, nothing else); anything else returns None and the caller parses the whole
    message, so malformed input gets the parser's own error and nothing is accepted here that
    the parser would refuse."""
    try:
        return _split(raw)
    except (IndexError, ValueError, UnicodeDecodeError, DecodeError):
        return None


def _split(raw: bytes) -> tuple[pb.Frame, memoryview] | None:
    if not raw.startswith(_FRAME_KEY):
        return None
    length, i = wire.decode_varint(raw, len(_FRAME_KEY))
    if i + length != len(raw):
        return None
    seen: dict[int, tuple[int, int]] = {}
    for number, wire_type, value, size in _fields_in(raw, i, len(raw), fixed=True) or [
        (0, 0, 0, 0)
    ]:
        expected = wire.WIRE_VARINT if number in (_F_SEQ, _F_CAPTURE) else wire.WIRE_LEN
        if number not in (_F_STREAM, _F_SEQ, _F_CAPTURE, _F_CLOUD) or number in seen:
            return None
        if wire_type != expected:
            return None
        seen[number] = (value, size)
    if _F_CLOUD not in seen:
        return None
    start, size = seen[_F_CLOUD]
    meta_parts: list[bytes] = []
    data: memoryview | None = None
    cloud_seen: set[int] = set()
    cloud_fields = _fields_in(raw, start, start + size, fixed=True) or [(0, 0, 0, 0)]
    for number, wire_type, value, length in cloud_fields:
        if number in cloud_seen and number != _C_FIELDS:  # only ``fields`` repeats
            return None
        cloud_seen.add(number)
        if number == _C_STRIDE and wire_type == wire.WIRE_VARINT:
            if value >= 1 << 32:
                return None
            meta_parts.append(wire.field_key(pb.PointCloud.DESCRIPTOR, "point_stride", 0))
            meta_parts.append(wire.encode_varint(value))
        elif number == _C_DATA and wire_type == wire.WIRE_LEN:
            data = memoryview(raw)[value : value + length]
        elif number in _C_META and wire_type == wire.WIRE_LEN:
            meta_parts.append(bytes([(number << 3) | wire.WIRE_LEN]))
            meta_parts.append(wire.encode_varint(length))
            meta_parts.append(raw[value : value + length])
        else:
            return None
    if data is None:
        return None
    frame = pb.Frame()
    if _F_STREAM in seen:
        at, n = seen[_F_STREAM]
        frame.stream_id = raw[at : at + n].decode("utf-8")
    if _F_SEQ in seen:
        frame.seq = seen[_F_SEQ][0] % _U64
    if _F_CAPTURE in seen:
        capture = seen[_F_CAPTURE][0] % _U64
        frame.capture_time_ns = capture - _U64 if capture >= 1 << 63 else capture
    frame.point_cloud.ParseFromString(b"".join(meta_parts))
    return frame, data
