"""ProcessedFrame -> the messages a viewer sees: Foxglove topics, schemas, timestamps (sans-I/O).

Why no re-encoding of points: simbridge clouds and ``foxglove.PointCloud`` both describe packed
records by offsets and a stride, so the bytes pass through untouched; only the numeric type
codes differ (Foxglove numbers unsigned before signed). Topics: ``/<device>/<stream>`` carries
the cloud (``foxglove.PointCloud``, protobuf) or the telemetry (JSON);
``/<device>/<stream>/gaps`` announces dropped frames; ``/simbridge/frames`` (MCAP only) holds
one small JSON record per frame, from which a restarted view recovers its watermarks.
Timestamps come from the frame (its capture time).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from foxglove.messages import (
    PackedElementField,
    PackedElementFieldNumericType,
    PointCloud,
    Pose,
    Quaternion,
    Timestamp,
    Vector3,
)

from bridge.v1 import bridge_pb2 as pb

POINT_CLOUD = "point_cloud"
TELEMETRY = "telemetry"
GAP = "gap"
FRAME = "frame"
FRAMES_TOPIC = "/simbridge/frames"

#: simbridge FieldType -> Foxglove PackedElementFieldNumericType name.
_NUMERIC = {
    pb.INT8: "Int8",
    pb.UINT8: "Uint8",
    pb.INT16: "Int16",
    pb.UINT16: "Uint16",
    pb.INT32: "Int32",
    pb.UINT32: "Uint32",
    pb.FLOAT32: "Float32",
    pb.FLOAT64: "Float64",
}


@dataclass(frozen=True, slots=True)
class Schema:
    name: str
    encoding: str  # schema encoding: "protobuf" | "jsonschema"
    data: bytes
    message_encoding: str  # "protobuf" | "json"


def _json_schema(name: str, properties: dict[str, Any]) -> Schema:
    body = {"title": name, "type": "object", "properties": properties}
    return Schema(name, "jsonschema", json.dumps(body).encode(), "json")


_TIME = {
    "type": "object",
    "properties": {"sec": {"type": "integer"}, "nsec": {"type": "integer"}},
}


def _schemas() -> dict[str, Schema]:
    fg = PointCloud.get_schema()
    return {
        POINT_CLOUD: Schema(fg.name, fg.encoding, bytes(fg.data), "protobuf"),
        TELEMETRY: _json_schema(
            "simbridge.Telemetry",
            {
                "timestamp": _TIME,
                "seq": {"type": "integer"},
                "values": {"type": "object", "additionalProperties": {"type": "number"}},
                "blob_base64": {"type": "string"},
            },
        ),
        GAP: _json_schema(
            "simbridge.Gap",
            {
                "timestamp": _TIME,
                "seq": {"type": "integer"},
                "first_seq": {"type": "integer"},
                "last_seq": {"type": "integer"},
                "count": {"type": "integer"},
                "reason": {"type": "string"},
            },
        ),
        FRAME: _json_schema(
            "simbridge.Frame",
            {
                name: {"type": "integer"}
                for name in (
                    "seq",
                    "bridge_seq",
                    "capture_ns",
                    "ingest_ns",
                    "processed_ns",
                    "received_ns",
                    "input_points",
                    "output_points",
                )
            }
            | {
                "device": {"type": "string"},
                "stream": {"type": "string"},
                "backend": {"type": "string"},
                "voxel_size": {"type": "number"},
            },
        ),
    }


SCHEMAS = _schemas()


@dataclass(frozen=True, slots=True)
class OutMessage:
    """One message for the viewers: its topic, schema kind, encoded bytes and times."""

    topic: str
    kind: str
    data: bytes
    log_time: int  # capture time of the frame (ns since the epoch)
    publish_time: int  # when the bridge processed it
    device: str
    stream: str


def topic(device: str, stream: str) -> str:
    return f"/{device}/{stream}"


def gap_topic(device: str, stream: str) -> str:
    return f"/{device}/{stream}/gaps"


class FrameIds:
    """``frame_id`` per stream: ``DEVICE/STREAM=ID`` beats ``STREAM=ID`` beats the cloud's own
    ``frame_id`` beats the default."""

    def __init__(self, specs: Iterable[str] = (), default: str = "world") -> None:
        self.default = default
        self._map: dict[str, str] = {}
        for spec in specs:
            key, sep, value = spec.partition("=")
            if not sep or not key or not value:
                raise ValueError(f"frame id {spec!r}: expected [DEVICE/]STREAM=FRAME_ID")
            self._map[key] = value

    def resolve(self, device: str, stream: str, own: str = "") -> str:
        return self._map.get(f"{device}/{stream}") or self._map.get(stream) or own or self.default


def _stamp(ns: int) -> dict[str, int]:
    return {"sec": ns // 1_000_000_000, "nsec": ns % 1_000_000_000}


def _pose(cloud: pb.PointCloud) -> Pose:
    if not cloud.HasField("pose"):
        return Pose(position=Vector3(), orientation=Quaternion(w=1.0))
    p = cloud.pose
    return Pose(
        position=Vector3(x=p.px, y=p.py, z=p.pz),
        orientation=Quaternion(x=p.qx, y=p.qy, z=p.qz, w=p.qw),
    )


def encode_cloud(cloud: pb.PointCloud, capture_ns: int, frame_id: str) -> bytes:
    """A ``foxglove.PointCloud`` with the simbridge layout as is (same bytes, same offsets)."""
    fields = [
        PackedElementField(
            name=f.name,
            offset=f.offset,
            type=getattr(PackedElementFieldNumericType, _NUMERIC.get(f.type, "Unknown")),
        )
        for f in cloud.fields
    ]
    msg = PointCloud(
        timestamp=Timestamp(capture_ns // 1_000_000_000, capture_ns % 1_000_000_000),
        frame_id=frame_id,
        pose=_pose(cloud),
        point_stride=cloud.point_stride,
        fields=fields,
        data=cloud.data,
    )
    return msg.encode()


def encode_telemetry(telemetry: pb.Telemetry, seq: int, capture_ns: int) -> bytes:
    body: dict[str, Any] = {"timestamp": _stamp(capture_ns), "seq": seq}
    if telemetry.values:
        body["values"] = dict(telemetry.values)
    if telemetry.blob:
        body["blob_base64"] = base64.b64encode(telemetry.blob).decode()
    return json.dumps(body).encode()


def gap_message(
    device: str, stream: str, seq: int, first: int, last: int, count: int, reason: str, at: int
) -> OutMessage:
    body = {
        "timestamp": _stamp(at),
        "seq": seq,
        "first_seq": first,
        "last_seq": last,
        "count": count,
        "reason": reason,
    }
    return OutMessage(
        gap_topic(device, stream), GAP, json.dumps(body).encode(), at, at, device, stream
    )


def capture_ns(frame: pb.ProcessedFrame, received_ns: int) -> int:
    return frame.capture_time_ns if frame.capture_time_ns > 0 else received_ns


def to_messages(
    frame: pb.ProcessedFrame, received_ns: int, frame_ids: FrameIds
) -> list[OutMessage]:
    """The data message of a frame, preceded by its gap announcement when it carries one."""
    dev, stream = frame.device_id, frame.stream_id
    at = capture_ns(frame, received_ns)
    published = frame.processed_time_ns or at
    out: list[OutMessage] = []
    gap = frame.gap
    if gap.count or gap.last_seq:
        out.append(
            gap_message(
                dev, stream, frame.seq, gap.first_seq, gap.last_seq, gap.count, gap.reason, at
            )
        )
    if frame.HasField("point_cloud"):
        own = frame.point_cloud.frame_id
        data = encode_cloud(frame.point_cloud, at, frame_ids.resolve(dev, stream, own))
        out.append(OutMessage(topic(dev, stream), POINT_CLOUD, data, at, published, dev, stream))
    elif frame.HasField("telemetry"):
        data = encode_telemetry(frame.telemetry, frame.seq, at)
        out.append(OutMessage(topic(dev, stream), TELEMETRY, data, at, published, dev, stream))
    return out


def frame_record(frame: pb.ProcessedFrame, received_ns: int) -> OutMessage:
    """The per-frame bookkeeping record (``/simbridge/frames``) a restart recovers from."""
    dec = frame.decimation
    body = {
        "device": frame.device_id,
        "stream": frame.stream_id,
        "seq": frame.seq,
        "bridge_seq": frame.bridge_seq,
        "capture_ns": frame.capture_time_ns,
        "ingest_ns": frame.ingest_time_ns,
        "processed_ns": frame.processed_time_ns,
        "received_ns": received_ns,
        "input_points": dec.input_points,
        "output_points": dec.output_points,
        "voxel_size": dec.voxel_size,
        "backend": dec.backend,
    }
    at = capture_ns(frame, received_ns)
    return OutMessage(
        FRAMES_TOPIC,
        FRAME,
        json.dumps(body).encode(),
        at,
        received_ns,
        frame.device_id,
        frame.stream_id,
    )
