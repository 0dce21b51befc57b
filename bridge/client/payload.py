"""Payloads: what ``publish`` accepts, turned into wire bytes once (sans-I/O).

Why prepared bytes: a 1 MB cloud serialized per frame costs about a millisecond; a frame built from
prepared bytes is a header plus one concatenation. The splices (``Frame.point_cloud``,
``PointCloud.data``, ``EdgeMessage.frame``) take their field keys from :mod:`bridge.protocol.wire`,
which derives them from the generated descriptors, so a renumbered field cannot silently break them.

Accepted payloads, by stream kind:

- point clouds: a NumPy structured array (one field per named dtype field, offsets and stride as in
  the dtype), a 2-D float array of shape (n, 3) (x, y, z) or (n, 4) (x, y, z, intensity), a
  ``bridge.v1.PointCloud`` message, or ``bytes`` holding a serialized ``PointCloud``;
- telemetry: a mapping of names to numbers, ``bytes`` (an opaque blob) or a ``bridge.v1.Telemetry``.

A :class:`PreparedPayload` is accepted on either kind, and is the fastest way to publish one
payload repeatedly.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, TypeAlias, cast

import numpy as np
import numpy.typing as npt
from google.protobuf.descriptor import Descriptor
from google.protobuf.message import Message

from bridge.protocol import wire
from bridge.protocol.cloud import FieldType, make_layout
from bridge.v1 import bridge_pb2 as pb

Kind = Literal["point_cloud", "telemetry"]
Payload: TypeAlias = (
    npt.NDArray[np.generic] | pb.PointCloud | pb.Telemetry | bytes | Mapping[str, float]
)


def _key(message: type[Message], name: str) -> bytes:
    return wire.field_key(cast(Descriptor, message.DESCRIPTOR), name)


_FRAME_CLOUD_KEY = _key(pb.Frame, "point_cloud")
_FRAME_TELEMETRY_KEY = _key(pb.Frame, "telemetry")
_CLOUD_DATA_KEY = _key(pb.PointCloud, "data")
_EDGE_FRAME_KEY = _key(pb.EdgeMessage, "frame")

#: NumPy scalar kinds and sizes → wire field types (little endian on the wire).
_FIELD_TYPES: dict[tuple[str, int], FieldType] = {
    ("i", 1): FieldType.INT8,
    ("u", 1): FieldType.UINT8,
    ("i", 2): FieldType.INT16,
    ("u", 2): FieldType.UINT16,
    ("i", 4): FieldType.INT32,
    ("u", 4): FieldType.UINT32,
    ("f", 4): FieldType.FLOAT32,
    ("f", 8): FieldType.FLOAT64,
}


@dataclass(frozen=True, slots=True)
class PreparedPayload:
    """A payload encoded once as the ``Frame`` payload field, reusable across frames.

    Immutable: a caller that later changes its array or message cannot alter frames already
    buffered for resend.
    """

    kind: Kind
    frame_bytes: bytes
    codec: int = 0  # the bridge.v1.Codec its PointCloud.data is encoded with (0: raw)

    @property
    def nbytes(self) -> int:
        return len(self.frame_bytes)

    @classmethod
    def of(cls, payload: Payload | PreparedPayload, kind: Kind | None = None) -> PreparedPayload:
        """Encode ``payload``; ``kind`` says how to read ``bytes`` (default: a telemetry blob).

        Raises ``TypeError`` for a payload that does not fit ``kind`` and ``ValueError``
        (``bridge.protocol.errors.InvalidLayout``) for an array whose layout the bridge would
        refuse.
        """
        if isinstance(payload, PreparedPayload):
            prepared = payload
        elif isinstance(payload, np.ndarray):
            prepared = cls.cloud(payload)
        elif isinstance(payload, pb.PointCloud):
            prepared = cls._spliced("point_cloud", payload.SerializeToString())
        elif isinstance(payload, pb.Telemetry):
            prepared = cls._spliced("telemetry", payload.SerializeToString())
        elif isinstance(payload, bytes | bytearray | memoryview):
            raw = bytes(payload)
            if kind == "point_cloud":
                prepared = cls._spliced("point_cloud", raw)
            else:
                prepared = cls._spliced("telemetry", pb.Telemetry(blob=raw).SerializeToString())
        elif isinstance(payload, Mapping):
            values = {str(k): float(v) for k, v in payload.items()}
            prepared = cls._spliced("telemetry", pb.Telemetry(values=values).SerializeToString())
        else:
            raise TypeError(f"cannot publish a {type(payload).__name__}")
        if kind is not None and prepared.kind != kind:
            raise TypeError(f"a {prepared.kind} payload on a {kind} stream")
        return prepared

    @classmethod
    def cloud(
        cls, points: npt.NDArray[np.generic], *, frame_id: str = "", pose: pb.Pose | None = None
    ) -> PreparedPayload:
        """A point cloud from a structured array or an (n, 3) / (n, 4) float array."""
        header, data = cloud_parts(points, frame_id=frame_id, pose=pose)
        body = header + wire.length_prefix(_CLOUD_DATA_KEY, len(data)) + data
        return cls._spliced("point_cloud", body)

    @classmethod
    def _spliced(cls, kind: Kind, message: bytes) -> PreparedPayload:
        key = _FRAME_CLOUD_KEY if kind == "point_cloud" else _FRAME_TELEMETRY_KEY
        return cls(kind, wire.length_prefix(key, len(message)) + message)


def cloud_parts(
    points: npt.NDArray[np.generic], *, frame_id: str = "", pose: pb.Pose | None = None
) -> tuple[bytes, bytes]:
    """``(serialized PointCloud without data, little-endian point bytes)`` for an array.

    The layout is validated here with the bridge's own rules, so a bad array fails at the caller
    instead of coming back as an ``INVALID_LAYOUT`` error for every frame.
    """
    if points.dtype.names:
        fields, records = _structured(points)
    elif points.ndim == 2 and points.shape[1] in (3, 4) and points.dtype.kind == "f":
        names = ("x", "y", "z", "intensity")[: points.shape[1]]
        ftype = FieldType.FLOAT64 if points.dtype.itemsize == 8 else FieldType.FLOAT32
        size = ftype.size
        fields = [
            pb.PackedField(name=n, offset=i * size, type=ftype.name) for i, n in enumerate(names)
        ]
        records = np.ascontiguousarray(points, dtype=ftype.dtype)
    else:
        raise ValueError(
            "points must be a structured array or a float array of shape (n, 3) or (n, 4), "
            f"got dtype {points.dtype} and shape {points.shape}"
        )
    stride = records.dtype.itemsize if points.dtype.names else records.shape[1] * size
    make_layout(stride, [(f.name, f.offset, f.type) for f in fields])  # InvalidLayout(ValueError)
    header = pb.PointCloud(point_stride=stride, fields=fields, frame_id=frame_id, pose=pose)
    return header.SerializeToString(), records.tobytes()


def _structured(
    points: npt.NDArray[np.generic],
) -> tuple[list[pb.PackedField], npt.NDArray[np.generic]]:
    """Wire fields and a little-endian, C-contiguous copy (or view) of a structured array."""
    if points.ndim != 1:
        raise ValueError(f"a structured point array must be 1-D, got shape {points.shape}")
    assert points.dtype.fields is not None
    fields: list[pb.PackedField] = []
    le_fields: dict[str, tuple[np.dtype[np.generic], int]] = {}
    for name, (dtype, offset, *_) in points.dtype.fields.items():
        ftype = _FIELD_TYPES.get((dtype.kind, dtype.itemsize))
        if ftype is None or dtype.shape:
            raise ValueError(f"field {name!r} has type {dtype}, which the wire cannot carry")
        fields.append(pb.PackedField(name=name, offset=offset, type=int(ftype)))  # type: ignore[arg-type]
        le_fields[name] = (dtype.newbyteorder("<"), offset)
    le = np.dtype(
        {
            "names": list(le_fields),
            "formats": [d for d, _ in le_fields.values()],
            "offsets": [o for _, o in le_fields.values()],
            "itemsize": points.dtype.itemsize,
        }
    )
    records = points if points.dtype == le else points.astype(le)
    return fields, np.ascontiguousarray(records)


def frame_head(stream_id: str, seq: int, capture_time_ns: int, payload: PreparedPayload) -> bytes:
    """Everything of a serialized ``EdgeMessage{frame}`` before the prepared payload: the
    ``EdgeMessage.frame`` key and length, then the small header (stream, seq, time). The header
    followed by the payload field is exactly the encoding of the whole frame (protobuf fields may
    come in any order)."""
    header = pb.Frame(
        stream_id=stream_id, seq=seq, capture_time_ns=capture_time_ns
    ).SerializeToString()
    return wire.length_prefix(_EDGE_FRAME_KEY, len(header) + len(payload.frame_bytes)) + header


def encode_frame(stream_id: str, seq: int, capture_time_ns: int, payload: PreparedPayload) -> bytes:
    """A serialized ``EdgeMessage{frame}`` (:func:`frame_head` plus the payload)."""
    return frame_head(stream_id, seq, capture_time_ns, payload) + payload.frame_bytes
