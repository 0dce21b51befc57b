"""The edge's side of the cloud codecs: a prepared cloud re-encoded with its stream's codec.

Why at prepare time: the resend buffer then holds the encoded (smaller) frame, and a frame that
is resent after a reconnect is not encoded twice. The codecs themselves live in
:mod:`bridge.protocol.compress`, shared with the bridge that decodes them.
"""

from __future__ import annotations

from typing import Literal

from bridge.client.payload import PreparedPayload
from bridge.protocol import compress, wire
from bridge.protocol.cloud import make_layout
from bridge.protocol.errors import CodecError
from bridge.v1 import bridge_pb2 as pb

CloudCodec = Literal["none", "zstd", "quantized"]
_CODECS = {"none": compress.NONE, "zstd": compress.ZSTD, "quantized": compress.QUANTIZED}


def codec_spec(
    name: str, *, step: float = 0.001, attr_step: float = 0.0, level: int = 0
) -> compress.CodecSpec:
    """A validated codec: ``ValueError`` for an unknown name or a step the bridge refuses."""
    if name not in _CODECS:
        raise ValueError(f"codec must be one of {sorted(_CODECS)}, got {name!r}")
    proto = pb.StreamSpec(
        stream_id="s",
        kind=pb.POINT_CLOUD,
        codec=_CODECS[name],
        codec_params=pb.CodecParams(step=step, attr_step=attr_step, level=level),
    )
    try:
        return compress.spec_of(proto)
    except CodecError as exc:
        raise ValueError(str(exc)) from None


def encode_payload(payload: PreparedPayload, spec: compress.CodecSpec) -> PreparedPayload:
    """``payload`` with its cloud data encoded by ``spec`` (as is when there is nothing to do).

    ``ValueError`` for a payload already encoded with another codec, or values the lossy codec
    cannot carry (non-finite coordinates)."""
    if spec.codec == payload.codec or payload.kind != "point_cloud":
        return payload
    if payload.codec != compress.NONE:
        raise ValueError(
            f"payload is encoded with codec {payload.codec}, the stream uses {spec.name}"
        )
    body = payload.frame_bytes
    _, at = wire.decode_varint(body, 1)  # after the Frame.point_cloud key and length
    cloud = pb.PointCloud.FromString(body[at:])
    layout = make_layout(
        cloud.point_stride, [(f.name, f.offset, int(f.type)) for f in cloud.fields]
    )
    cloud.data = compress.encode(layout, cloud.data, spec)
    spliced = PreparedPayload.of(cloud)
    return PreparedPayload(spliced.kind, spliced.frame_bytes, spec.codec)
