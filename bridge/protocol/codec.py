"""Wire codec (sans-I/O): bytes <-> protobuf messages, with every limit checked here.

Adapters hand raw bytes in and get either a message or a
:class:`~bridge.protocol.errors.ProtocolError` that says exactly what was wrong, so both transports
reject bad input the same way.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import cast

from google.protobuf.message import DecodeError

from bridge.protocol import wire
from bridge.protocol.cloud import (
    MAX_CLOUD_FIELDS,
    CloudLayout,
    check_field_count,
    make_layout,
    point_count,
)
from bridge.protocol.errors import (
    BatchTooLarge,
    FrameTooLarge,
    InvalidLayout,
    MalformedMessage,
    TelemetryTooLarge,
)
from bridge.v1 import bridge_pb2 as pb


@dataclass(frozen=True, slots=True)
class Limits:
    max_frame_bytes: int
    max_points: int
    max_streams_per_session: int
    max_telemetry_bytes: int = 1 << 20
    max_telemetry_entries: int = 4096
    max_batch_frames: int = 256  # 0 = no FrameBatch accepted
    max_cloud_fields: int = MAX_CLOUD_FIELDS  # fields one PointCloud may declare

    def to_proto(self) -> pb.ServerLimits:
        return pb.ServerLimits(
            max_frame_bytes=self.max_frame_bytes,
            max_points=self.max_points,
            max_streams_per_session=self.max_streams_per_session,
            max_batch_frames=self.max_batch_frames,
            max_telemetry_bytes=self.max_telemetry_bytes,
        )


# The bytes of one received message: a large WebSocket message is the bytearray it was read
# into (bridge.server.ws_conn.Payload), handed on without another copy.
Wire = bytes | bytearray


def decode_edge(raw: Wire, limits: Limits) -> pb.EdgeMessage:
    """Parse one EdgeMessage; refuse oversize or undecodable bytes and empty oneofs.

    Telemetry is sized before it is parsed (a map of many small entries costs far more to parse
    than its bytes suggest), and its entries are counted after; a cloud's fields are counted
    before a large message is parsed and after a small one is. These refusals are non-fatal and
    carry the frame's stream and seq so the edge knows which frame was refused.
    """
    if len(raw) > limits.max_frame_bytes:
        raise FrameTooLarge(f"message of {len(raw)} bytes exceeds max {limits.max_frame_bytes}")
    # A message no larger than the limit cannot carry too much telemetry, nor a small one enough
    # fields to cost much: skip the walk.
    if len(raw) > limits.max_telemetry_bytes or len(raw) >= WALK_BYTES:
        entries = _frame_fields(raw)
        telemetry_bytes = sum(size for n, t, _, size in entries if n == _TELEMETRY and t == 2)
        if telemetry_bytes > limits.max_telemetry_bytes:
            raise TelemetryTooLarge(
                f"telemetry of {telemetry_bytes} bytes exceeds max_telemetry_bytes "
                f"{limits.max_telemetry_bytes}",
                frame=_header(raw, entries),
            )
        _count_cloud_fields(raw, entries, limits.max_cloud_fields)
    msg = pb.EdgeMessage()
    try:
        msg.ParseFromString(cast(bytes, raw))  # upb parses any buffer; the stub says bytes
    except DecodeError as exc:
        raise MalformedMessage(f"not a valid EdgeMessage: {exc}") from None
    kind = msg.WhichOneof("kind")
    if kind is None:
        raise MalformedMessage("EdgeMessage carries neither hello nor frame")
    if kind == "batch":  # a batch arriving where is_batch() was not asked (e.g. first message)
        raise MalformedMessage("a FrameBatch is not a whole EdgeMessage here")
    if kind == "frame":
        _check_frame(msg.frame, limits)
    return msg


def _check_frame(frame: pb.Frame, limits: Limits) -> None:
    """The counts only a parsed frame shows cheaply: telemetry entries, cloud fields (before a
    stream's codec or the layout check does work per field)."""
    payload = frame.WhichOneof("payload")
    if payload == "telemetry":
        _check_entries(frame, limits)
    elif payload == "point_cloud" and len(frame.point_cloud.fields) > limits.max_cloud_fields:
        header = pb.Frame(stream_id=frame.stream_id, seq=frame.seq)
        _refuse_fields(len(frame.point_cloud.fields), limits.max_cloud_fields, header)


def _refuse_fields(count: int, max_fields: int, header: pb.Frame) -> None:
    """:func:`~bridge.protocol.cloud.check_field_count`, its refusal naming the frame."""
    try:
        check_field_count(count, max_fields)
    except InvalidLayout as exc:
        exc.frame = header
        raise


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


def is_batch(raw: Wire) -> bool:
    """Whether ``raw`` is an ``EdgeMessage{batch}`` (decoded by :func:`batch_spans`)."""
    return raw.startswith(_BATCH_KEY)


def batch_spans(raw: Wire, limits: Limits) -> list[tuple[int, int]]:
    """(start, end) of each Frame in an ``EdgeMessage{batch}``, checked against the limits
    before anything is parsed: the frame count, and the telemetry bytes of all frames together
    (the same parse-cost bound one message has). Each frame is then parsed on its own
    (:func:`decode_frame`), so no frame's memory outlives it inside a shared batch."""
    if len(raw) > limits.max_frame_bytes:
        raise FrameTooLarge(f"message of {len(raw)} bytes exceeds max {limits.max_frame_bytes}")
    try:
        length, start = wire.decode_varint(cast(bytes, raw), len(_BATCH_KEY))  # typing only
        if start + length != len(raw):
            raise ValueError("batch length does not match the message")
        # One span more than the limit is enough to refuse: 16 MiB of empty frames are 8M spans.
        spans = [
            (start + a, start + b)
            for a, b in wire.repeated_spans(
                memoryview(raw)[start:], _IN_BATCH_KEY, limits.max_batch_frames + 1
            )
        ]
    except (IndexError, ValueError) as exc:
        raise MalformedMessage(f"not a valid FrameBatch: {exc}") from None
    if not spans:
        raise MalformedMessage("empty FrameBatch")
    if len(spans) > limits.max_batch_frames:
        raise BatchTooLarge(
            f"FrameBatch of {len(spans)} frames exceeds max_batch_frames {limits.max_batch_frames}"
        )
    # A batch no larger than the limit cannot carry more telemetry than that (its frames' bytes
    # include their telemetry): no walk, as decode_edge skips it for one message.
    telemetry = (
        sum(_telemetry_in(raw, a, b) for a, b in spans)
        if len(raw) > limits.max_telemetry_bytes
        else 0
    )
    if telemetry > limits.max_telemetry_bytes:
        raise BatchTooLarge(
            f"FrameBatch with {telemetry} telemetry bytes exceeds max_telemetry_bytes "
            f"{limits.max_telemetry_bytes}"
        )
    return spans


def decode_frame(raw: Wire, start: int, end: int, limits: Limits) -> pb.Frame:
    """One Frame of a batch (see :func:`batch_spans`); a large one's cloud fields are counted
    before it is parsed, as in :func:`decode_edge`."""
    if end - start >= WALK_BYTES:
        _count_cloud_fields(raw, _fields_in(raw, start, end), limits.max_cloud_fields)
    frame = pb.Frame()
    try:
        frame.ParseFromString(cast(bytes, raw[start:end]))  # as above
    except DecodeError as exc:
        raise MalformedMessage(f"not a valid Frame in a FrameBatch: {exc}") from None
    _check_frame(frame, limits)
    return frame


_FRAME_KEY = wire.field_key(pb.EdgeMessage.DESCRIPTOR, "frame")
_TELEMETRY = wire.field_number(pb.Frame.DESCRIPTOR, "telemetry")
_STREAM_ID = wire.field_number(pb.Frame.DESCRIPTOR, "stream_id")
_SEQ = wire.field_number(pb.Frame.DESCRIPTOR, "seq")


#: Messages from this size on are walked (their keys and lengths, never their bytes) before
#: they are parsed, so that counts that cost per entry (cloud fields) are refused first; below
#: it the parse is cheap whatever the message declares, and its counts are checked after.
WALK_BYTES = 64 * 1024
#: Top-level fields of a Frame that a walk reads. An encoder writes each of a Frame's five fields
#: at most once; Python reads ~1 us a field, so 16 MiB of one repeated two-byte field would
#: otherwise hold the event loop for seconds. A Frame of more is refused (MALFORMED).
FRAME_ENTRIES_MAX = 64
#: A cloud's entries other than ``fields`` that a count reads (``point_stride``, ``data``,
#: ``frame_id``, ``pose``: once each from an encoder) before it leaves the rest to the parser.
_CLOUD_OTHER_MAX = 16

Entry = tuple[int, int, int, int]
"""(field number, wire type, value or start of the value, length) of one encoded field."""


def _frame_fields(raw: Wire) -> list[Entry]:
    """The top-level Frame fields (:func:`_fields_in`) of an ``EdgeMessage{frame}``, or [] when
    ``raw`` is not one (the parser then says what is wrong)."""
    try:
        if not raw.startswith(_FRAME_KEY):
            return []
        length, i = wire.decode_varint(cast(bytes, raw), len(_FRAME_KEY))  # typing only
        end = i + length
        if end > len(raw):
            return []
    except (IndexError, ValueError):
        return []
    return _fields_in(raw, i, end)


def _fields_in(raw: Wire, i: int, end: int) -> list[Entry]:
    """The fields of the Frame at ``raw[i:end]`` (I32 / I64 ones skipped), or [] when it is not
    well formed; MalformedMessage beyond ``FRAME_ENTRIES_MAX`` of them. Walks keys and lengths
    only: O(fields), never O(bytes), and never more than the bound."""
    try:
        walked = list(itertools.islice(_walk(raw, i, end), FRAME_ENTRIES_MAX + 1))
    except (IndexError, ValueError):
        return []
    if len(walked) > FRAME_ENTRIES_MAX:
        raise MalformedMessage(f"a Frame of more than {FRAME_ENTRIES_MAX} top-level fields")
    return [e[:4] for e in walked if e[1] in (wire.WIRE_VARINT, wire.WIRE_LEN)]


def _walk(raw: Wire, i: int, end: int) -> Iterator[tuple[int, int, int, int, int, int]]:
    """(number, wire type, value or value start, length, entry start, entry end) of each field
    in ``raw[i:end]``, lazily, so a caller stops as soon as it knows enough. ValueError or
    IndexError where the bytes are not well formed (an entry past ``end``, wire types 3, 4, 6
    and 7); I32 / I64 fields come as (start, width)."""
    raw = cast(bytes, raw)  # typing only: decode_varint reads a bytearray alike
    while i < end:
        at = i
        key, i = wire.decode_varint(raw, i)
        number, wire_type = key >> 3, key & 7
        if wire_type == wire.WIRE_VARINT:
            value, i = wire.decode_varint(raw, i)
            size = 0
        elif wire_type == wire.WIRE_LEN:
            size, value = wire.decode_varint(raw, i)
            i = value + size
        elif wire_type in (1, 5):
            value, size = i, 8 if wire_type == 1 else 4
            i += size
        else:
            raise ValueError(f"wire type {wire_type}")
        if i > end:
            raise ValueError("a field runs past its message")
        yield number, wire_type, value, size, at, i


def _count_cloud_fields(raw: Wire, entries: list[Entry], max_fields: int) -> None:
    """Refuse (INVALID_LAYOUT, naming the frame) a Frame, given its top-level ``entries``, whose
    cloud declares more than ``max_fields`` fields, from the keys alone: no field is built."""
    count = _cloud_field_count(raw, entries, max_fields)
    if count > max_fields:
        _refuse_fields(count, max_fields, _header(raw, entries))


def _cloud_field_count(raw: Wire, entries: list[Entry], max_fields: int) -> int:
    """The cloud's ``fields`` entries, counted up to one past ``max_fields`` (the walk reads no
    further). A cloud that is not well formed, or has many entries of other kinds, counts 0:
    it is the parser's, and :func:`_check_frame` checks the parsed count."""
    budget = max_fields + _CLOUD_OTHER_MAX
    count = 0
    try:
        for number, wire_type, start, size in entries:
            if number != _F_CLOUD or wire_type != wire.WIRE_LEN:
                continue
            for field, field_type, *_ in _walk(raw, start, start + size):
                if field == _C_FIELDS and field_type == wire.WIRE_LEN:
                    count += 1
                    if count > max_fields:
                        return count
                budget -= 1
                if budget < 0:
                    return 0
    except (IndexError, ValueError):
        return 0
    return count


def _telemetry_in(raw: Wire, start: int, end: int) -> int:
    return sum(size for n, t, _, size in _fields_in(raw, start, end) if n == _TELEMETRY and t == 2)


def _header(raw: Wire, entries: list[Entry]) -> pb.Frame:
    """The stream and seq of a Frame from its top-level ``entries`` (for a refusal's Error)."""
    frame = pb.Frame()
    for number, wire_type, value, size in entries:
        if number == _STREAM_ID and wire_type == wire.WIRE_LEN:
            frame.stream_id = raw[value : value + size].decode("utf-8", "replace")
        elif number == _SEQ and wire_type == wire.WIRE_VARINT:
            frame.seq = value % _U64
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
        return (
            cloud.point_stride == self.layout.stride
            and len(cloud.fields) == len(self.fields)  # a longer list is not compared at all
            and cloud.fields == self.fields
        )


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
        check_field_count(len(cloud.fields), limits.max_cloud_fields)  # before work per field
        key = layout_key(cloud)
        entry = CachedLayout.of(key, make_layout(key[0], key[1], limits.max_cloud_fields))
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


def split_cloud_frame(
    raw: Wire, max_fields: int | None = None
) -> tuple[pb.Frame, memoryview] | None:
    """An ``EdgeMessage{frame}`` carrying a point cloud, as (the frame without its points, a
    view of the points in ``raw``): the megabytes of points are neither parsed nor copied.

    Only the plain shape is taken (each Frame and PointCloud field at most once, the wire types
    the schema says, nothing else); anything else returns None and the caller parses the whole
    message, so malformed input gets the parser's own error and nothing is accepted here that
    the parser would refuse. The walk stops at the first entry that is not the plain shape, and
    after ``max_fields`` cloud fields: a cloud of more is refused here (INVALID_LAYOUT naming
    the frame), or, without ``max_fields``, declined past ``MAX_CLOUD_FIELDS`` (then
    :func:`decode_edge` counts them against the connection's limit before it parses)."""
    try:
        return _split(raw, max_fields)
    except InvalidLayout:
        raise
    except (IndexError, ValueError, UnicodeDecodeError, DecodeError):
        return None


def _split(raw: Wire, max_fields: int | None) -> tuple[pb.Frame, memoryview] | None:
    raw = cast(bytes, raw)  # typing only: decode_varint reads a bytearray alike
    if not raw.startswith(_FRAME_KEY):
        return None
    length, i = wire.decode_varint(raw, len(_FRAME_KEY))
    if i + length != len(raw):
        return None
    seen: dict[int, tuple[int, int]] = {}
    for number, wire_type, value, size, _, _ in _walk(raw, i, len(raw)):
        expected = wire.WIRE_VARINT if number in (_F_SEQ, _F_CAPTURE) else wire.WIRE_LEN
        if number not in (_F_STREAM, _F_SEQ, _F_CAPTURE, _F_CLOUD) or number in seen:
            return None
        if wire_type != expected:
            return None
        seen[number] = (value, size)
    if _F_CLOUD not in seen:
        return None
    frame = pb.Frame()
    if _F_STREAM in seen:
        text, n = seen[_F_STREAM]
        frame.stream_id = raw[text : text + n].decode("utf-8")
    if _F_SEQ in seen:
        frame.seq = seen[_F_SEQ][0] % _U64
    if _F_CAPTURE in seen:
        capture = seen[_F_CAPTURE][0] % _U64
        frame.capture_time_ns = capture - _U64 if capture >= 1 << 63 else capture
    start, size = seen[_F_CLOUD]
    limit = MAX_CLOUD_FIELDS if max_fields is None else max_fields
    fields = 0
    meta: list[list[int]] = []  # [start, end) of the entries kept, adjacent ones joined
    data: memoryview | None = None
    cloud_seen: set[int] = set()
    for number, wire_type, value, length, at, after in _walk(raw, start, start + size):
        if number == _C_FIELDS and wire_type == wire.WIRE_LEN:
            fields += 1
            if fields > limit:
                if max_fields is None:
                    return None
                header = pb.Frame(stream_id=frame.stream_id, seq=frame.seq)
                _refuse_fields(fields, max_fields, header)
        elif number in cloud_seen:  # only ``fields`` repeats
            return None
        cloud_seen.add(number)
        if number == _C_STRIDE and wire_type == wire.WIRE_VARINT:
            if value >= 1 << 32:
                return None
        elif number == _C_DATA and wire_type == wire.WIRE_LEN:
            data = memoryview(raw)[value : value + length]
            continue
        elif number not in _C_META or wire_type != wire.WIRE_LEN:
            return None
        if meta and meta[-1][1] == at:
            meta[-1][1] = after
        else:
            meta.append([at, after])
    if data is None:
        return None
    frame.point_cloud.ParseFromString(b"".join(raw[a:b] for a, b in meta))
    return frame, data
