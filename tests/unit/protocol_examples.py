"""The byte-level examples of docs/protocol.md, built with the real encoder and annotated from
the generated descriptors.

``python -m tests.unit.protocol_examples`` prints every example block; the test
``tests/unit/test_protocol_doc.py`` checks that the document holds exactly these blocks, so the
spec cannot drift from what the code puts on the wire.
"""

from __future__ import annotations

import struct

import numpy as np
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from bridge.protocol.wire import decode_varint
from bridge.v1 import bridge_pb2 as pb

_WIRE_NAMES = {0: "VARINT", 1: "I64", 2: "LEN", 5: "I32"}
_ROW = 10  # bytes shown per line


def _hex(b: bytes) -> str:
    return " ".join(f"{x:02x}" for x in b)


def _rows(raw: bytes, indent: str, comment: str) -> list[str]:
    lines = []
    for i in range(0, max(len(raw), 1), _ROW):
        chunk = raw[i : i + _ROW]
        lines.append(f"{_hex(chunk):<{_ROW * 3}} {indent}{comment if i == 0 else '…'}")
    return lines


def annotate(raw: bytes, desc: Descriptor, indent: str = "") -> list[str]:
    """One line per field: its key and length bytes, the value bytes, what they mean."""
    out: list[str] = []
    i = 0
    while i < len(raw):
        start = i
        key, i = decode_varint(raw, i)
        number, wire = key >> 3, key & 7
        field = desc.fields_by_number.get(number)
        name = f"{desc.name}.{field.name}" if field else f"{desc.name}.<unknown {number}>"
        head = f"{name} (field {number}, {_WIRE_NAMES.get(wire, wire)})"
        if wire == 0:
            value, i = decode_varint(raw, i)
            shown: object = value
            if field is not None and field.type == FieldDescriptor.TYPE_ENUM:
                shown = f"{field.enum_type.values_by_number[value].name} = {value}"
            elif field is not None and field.type == FieldDescriptor.TYPE_BOOL:
                shown = bool(value)
            out += _rows(raw[start:i], indent, f"{head} = {shown}")
        elif wire == 1:
            i += 8
            (value_f,) = struct.unpack("<d", raw[i - 8 : i])
            out += _rows(raw[start:i], indent, f"{head} = {value_f:g}")
        elif wire == 5:
            i += 4
            out += _rows(raw[start:i], indent, f"{head} = {raw[i - 4 : i].hex()}")
        elif wire == 2:
            length, j = decode_varint(raw, i)
            body = raw[j : j + length]
            i = j + length
            if field is not None and field.type == FieldDescriptor.TYPE_MESSAGE:
                out += _rows(raw[start:j], indent, f"{head}, {length} bytes:")
                out += annotate(body, field.message_type, indent + "  ")
            elif field is not None and field.type == FieldDescriptor.TYPE_STRING:
                out += _rows(raw[start:i], indent, f"{head} = {body.decode()!r}")
            else:
                out += _rows(raw[start:j], indent, f"{head}, {length} bytes:")
                out += _rows(body, indent + "  ", f"{length} raw bytes")
        else:  # pragma: no cover - groups are not used by this schema
            raise ValueError(f"wire type {wire}")
    return out


def block(raw: bytes, desc: Descriptor, *, grpc: bool = False) -> str:
    lines = []
    if grpc:  # gRPC length-prefixed message: compressed flag, u32 big-endian length
        prefix = b"\x00" + struct.pack(">I", len(raw))
        lines.append(
            f"{_hex(prefix):<{_ROW * 3}} gRPC message prefix: not compressed, {len(raw)} bytes"
        )
    lines += annotate(raw, desc)
    return "\n".join(lines)


def two_point_cloud() -> pb.PointCloud:
    rec = np.array([(1.0, 2.0, 0.5, 0.25), (-1.0, 0.0, 1.5, 1.0)], dtype="<f4")
    return pb.PointCloud(
        point_stride=16,
        fields=[
            pb.PackedField(name="x", offset=0, type=pb.FLOAT32),
            pb.PackedField(name="y", offset=4, type=pb.FLOAT32),
            pb.PackedField(name="z", offset=8, type=pb.FLOAT32),
            pb.PackedField(name="intensity", offset=12, type=pb.FLOAT32),
        ],
        data=rec.tobytes(),
    )


def examples() -> dict[str, tuple[Message, bool]]:
    """name -> (message, framed as a gRPC message)."""
    hello = pb.EdgeMessage(
        hello=pb.Hello(
            device_id="robot-1",
            streams=[
                pb.StreamSpec(stream_id="lidar", kind=pb.POINT_CLOUD, voxel_size=0.1),
            ],
        )
    )
    welcome = pb.BridgeMessage(
        welcome=pb.Welcome(
            session_id="5f0c",
            limits=pb.ServerLimits(
                max_frame_bytes=16 << 20, max_points=4_000_000, max_streams_per_session=64
            ),
            streams=[pb.StreamState(stream_id="lidar")],
        )
    )
    frame = pb.EdgeMessage(
        frame=pb.Frame(
            stream_id="lidar",
            seq=1,
            capture_time_ns=1_700_000_000_000_000_000,
            point_cloud=two_point_cloud(),
        )
    )
    ack = pb.BridgeMessage(
        ack=pb.Ack(streams=[pb.StreamAck(stream_id="lidar", accepted_seq=1, delivered_seq=1)])
    )
    resume = pb.EdgeMessage(
        hello=pb.Hello(
            device_id="robot-1",
            resume_token="5f0c",
            streams=[pb.StreamSpec(stream_id="lidar", kind=pb.POINT_CLOUD, voxel_size=0.1)],
            resume=[pb.ResumeState(stream_id="lidar", delivered_seq=1)],
        )
    )
    watermarks = pb.SinkAck(
        bridge_seq=0,
        watermarks=[pb.StreamWatermark(device_id="robot-1", stream_id="lidar", seq=1)],
    )
    sink_ack = pb.SinkAck(bridge_seq=7)
    return {
        "ws-hello": (hello, False),
        "ws-welcome": (welcome, False),
        "ws-frame": (frame, False),
        "ws-ack": (ack, False),
        "grpc-hello-resume": (resume, True),
        "sink-watermarks": (watermarks, True),
        "sink-ack": (sink_ack, True),
    }


def rendered() -> dict[str, str]:
    return {
        name: block(msg.SerializeToString(), msg.DESCRIPTOR, grpc=grpc)
        for name, (msg, grpc) in examples().items()
    }


if __name__ == "__main__":
    for name, text in rendered().items():
        print(f"<!-- example: {name} -->\n```text\n{text}\n```\n")
