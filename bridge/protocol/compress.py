"""Point-cloud codecs for slow uplinks (sans-I/O): ``PointCloud.data`` encoded on the wire.

Why: a 100k-point xyz+intensity cloud is 1.6 MB; at 10 Hz that is 128 Mbit/s, several times
what a Wi-Fi or LTE uplink carries. A stream declares its codec in ``Hello``
(``StreamSpec.codec``); the edge encodes ``data`` and the bridge decodes it before anything else
sees the frame, so rings, decimation and the sink only ever see raw records.

- ``CODEC_ZSTD`` (lossless): the records split into byte planes (byte k of every record, then
  byte k+1, ...), which puts the similar exponent bytes of floats side by side, then zstd.
- ``CODEC_QUANTIZED`` (lossy, stated precision): ``x``, ``y``, ``z`` rounded to multiples of
  ``step`` (every decoded coordinate is within ``step / 2`` of the original, plus the float's
  own rounding), then predicted from points already decoded (:mod:`bridge.protocol.predictive`: scan
  order and range noise along the ray make the residuals small), zigzag, byte planes, zstd.
  Other float fields are rounded to ``attr_step`` and delta coded when it is > 0; otherwise
  (and for integer fields) they are lossless: a palette of at most 256 values plus one index
  byte per point when the field has that few (a sensor's 8- or 16-bit reflectivity stored as
  float), else byte planes. Padding is not carried (decoded as zeros). Point order is kept.

Every size is checked before anything is decompressed: :func:`declared` reads only the headers
and says what decoding will hold at its peak (output copies and scratch), so the caller charges
that to the memory budget *before* inflating; a decoder never allocates more than the limit it is
given, and zstd data must be exactly one frame of the stated size (a bomb, a lie or trailing
frames are refused).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import zstandard

from bridge.protocol import predictive
from bridge.protocol.cloud import CloudLayout, FieldType, make_layout
from bridge.protocol.errors import CodecError
from bridge.v1 import bridge_pb2 as pb

NONE, ZSTD, QUANTIZED = pb.CODEC_NONE, pb.CODEC_ZSTD, pb.CODEC_QUANTIZED
NAMES: dict[int, str] = {NONE: "none", ZSTD: "zstd", QUANTIZED: "quantized"}
DEFAULT_LEVEL = 3
#: Quantized values must stay below this magnitude so that residuals fit 32-bit zigzag codes.
MAX_QUANTUM = predictive.MAX_QUANTUM
_XYZ = ("x", "y", "z")
_QHEADER = struct.Struct("<IIddB")  # points, xyz block bytes, step, attr_step, levels
_FIELD = struct.Struct("<BH")  # per non-coordinate field: mode, palette size
_RAW, _STEPPED, _PALETTE = 0, 1, 2
#: A lossless field with at most this many distinct values is sent as a palette + u8 indices.
_PALETTE_MAX = 256
_PROBE = 4096  # values looked at first: a field with more distinct ones than that is not
LEVELS = predictive.DEFAULT_LEVELS


@dataclass(frozen=True, slots=True)
class CodecSpec:
    """A stream's codec as declared in ``Hello`` (validated by :func:`spec_of`)."""

    codec: int = NONE
    step: float = 0.0
    attr_step: float = 0.0
    level: int = DEFAULT_LEVEL

    @property
    def name(self) -> str:
        return NAMES[self.codec]

    def to_proto(self) -> tuple[int, pb.CodecParams | None]:
        if self.codec == NONE:
            return NONE, None
        return self.codec, pb.CodecParams(
            step=self.step, attr_step=self.attr_step, level=self.level
        )


RAW = CodecSpec()


def spec_of(spec: pb.StreamSpec) -> CodecSpec:
    """The codec a ``StreamSpec`` declares; ``CodecError`` for one this bridge cannot decode."""
    codec = int(spec.codec)
    if codec == NONE:
        return RAW
    if codec not in NAMES:
        raise CodecError(f"stream {spec.stream_id!r}: unknown codec {codec}")
    if spec.kind != pb.POINT_CLOUD:
        raise CodecError(f"stream {spec.stream_id!r}: codecs apply to point-cloud streams only")
    params = spec.codec_params
    level = params.level or DEFAULT_LEVEL
    if codec == QUANTIZED:
        if not (np.isfinite(params.step) and params.step > 0):
            raise CodecError(f"stream {spec.stream_id!r}: the quantized codec needs a step > 0")
        if not (np.isfinite(params.attr_step) and params.attr_step >= 0):
            raise CodecError(f"stream {spec.stream_id!r}: attr_step must be >= 0")
        return CodecSpec(codec, params.step, params.attr_step, level)
    return CodecSpec(codec, 0.0, 0.0, level)


# -- encoding (the edge) ----------------------------------------------------------------------


def encode(layout: CloudLayout, data: bytes, spec: CodecSpec) -> bytes:
    """``data`` (raw records of ``layout``) encoded with ``spec``. ``ValueError`` when the
    lossy codec cannot represent a value (non-finite, or beyond ``MAX_QUANTUM`` steps)."""
    if spec.codec == NONE:
        return data
    cz = zstandard.ZstdCompressor(level=spec.level, write_content_size=True)
    if spec.codec == ZSTD:
        return cz.compress(_planes(np.frombuffer(data, np.uint8), layout.stride))
    records = np.frombuffer(data, layout.structured_dtype)
    axes = np.empty((3, len(records)), np.int64)
    for i, name in enumerate(_XYZ):
        axes[i] = _quantize(records[name].astype(np.float64), spec.step, name)
    xyz_block = cz.compress(predictive.encode(axes, LEVELS))
    modes, rest = [], []
    for name, _, ftype in _others(layout):
        mode, count, block = _encode_field(records[name], name, ftype, spec.attr_step)
        modes.append(_FIELD.pack(mode, count))
        rest.append(block)
    rest_block = cz.compress(b"".join(rest))
    header = _QHEADER.pack(len(records), len(xyz_block), spec.step, spec.attr_step, LEVELS)
    return header + b"".join(modes) + xyz_block + rest_block


def _encode_field(
    column: npt.NDArray[Any], name: str, ftype: FieldType, attr_step: float
) -> tuple[int, int, bytes]:
    """(mode, palette size, uncompressed block) of one non-coordinate field."""
    if attr_step > 0 and ftype in (FieldType.FLOAT32, FieldType.FLOAT64):
        q = _quantize(column.astype(np.float64), attr_step, name)
        return _STEPPED, 0, predictive.to_planes(_zigzag_delta(q), 4)
    raw = np.ascontiguousarray(column).view(f"<u{ftype.size}")
    if ftype.size > 1 and len(raw) and len(np.unique(raw[:_PROBE])) <= _PALETTE_MAX:
        values, index = np.unique(raw, return_inverse=True)
        if len(values) <= _PALETTE_MAX:
            steps = np.diff(index.astype(np.uint8), prepend=np.uint8(0))
            return _PALETTE, len(values), values.tobytes() + steps.tobytes()
    return _RAW, 0, predictive.to_planes(raw, ftype.size)


def _quantize(values: npt.NDArray[np.float64], step: float, name: str) -> npt.NDArray[np.int64]:
    if not np.all(np.isfinite(values)):
        raise ValueError(f"field {name!r} has non-finite values; the quantized codec needs finite")
    q = np.rint(values / step)
    if q.size and np.abs(q).max() >= MAX_QUANTUM:
        raise ValueError(f"field {name!r} spans more than {MAX_QUANTUM} steps of {step:g}")
    return q.astype(np.int64)


def _zigzag_delta(q: npt.NDArray[np.int64]) -> npt.NDArray[np.uint32]:
    d = np.diff(q, prepend=np.int64(0))
    return ((d << 1) ^ (d >> 63)).astype(np.uint32)


def _planes(raw: npt.NDArray[np.uint8], width: int) -> bytes:
    """Byte k of every ``width``-byte item, for k = 0 .. width-1."""
    return raw.reshape(-1, width).T.tobytes()


def _others(layout: CloudLayout) -> list[tuple[str, int, FieldType]]:
    return [(f.name, f.offset, f.type) for f in layout.fields if f.name not in _XYZ]


# -- decoding (the bridge) --------------------------------------------------------------------


#: Working memory of the quantized decoder per point, beyond its output (tracemalloc: 70-95 B a
#: point for every layout and level count; tests/unit/test_compress.py holds the decoder to it).
QUANTIZED_SCRATCH_PER_POINT = 100
#: Fixed part of a decode's working memory (headers, small arrays, the interpreter's objects).
DECODE_SLACK_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class Declared:
    """What an encoded cloud's headers promise, read without inflating anything."""

    layout: CloudLayout
    points: int
    decoded_bytes: int  # what ``PointCloud.data`` holds once decoded
    #: The most the decode holds at once beyond the encoded bytes: the output, its copies (the
    #: structured array, its bytes, protobuf's copy on assignment) and scratch. The caller
    #: charges this to the memory budget before decoding.
    peak_bytes: int


def declared(cloud: pb.PointCloud, spec: CodecSpec, max_points: int, max_bytes: int) -> Declared:
    """Read ``cloud``'s codec headers only (cost independent of the declared size): the
    decoded size, checked against ``max_points`` and ``max_bytes``, and the decode's peak
    memory. ``CodecError`` (or ``InvalidLayout``) for a header that cannot be honoured."""
    key = (cloud.point_stride, [(f.name, f.offset, int(f.type)) for f in cloud.fields])
    layout = make_layout(*key)  # InvalidLayout for a bad header, as for raw clouds
    data = cloud.data
    stride = layout.stride
    if spec.codec == ZSTD:
        try:
            size = zstandard.frame_content_size(data)
        except zstandard.ZstdError as exc:
            raise CodecError(f"zstd data has no valid frame header: {exc}") from None
        if size < 0 or size % stride:
            raise CodecError(f"zstd frame must state a size that is a multiple of {stride}")
        points = size // stride
        _check_size(points, stride, max_points, max_bytes)
        # byte planes, their transpose as bytes, protobuf's copy: three times the output
        return Declared(layout, points, size, 3 * size + DECODE_SLACK_BYTES)
    if len(data) < _QHEADER.size:
        raise CodecError("quantized data shorter than its header")
    points = _QHEADER.unpack_from(data)[0]
    _check_size(points, stride, max_points, max_bytes)
    decoded = points * stride
    scratch = QUANTIZED_SCRATCH_PER_POINT * points + DECODE_SLACK_BYTES
    return Declared(layout, points, decoded, 3 * decoded + scratch)


def decode_cloud(
    cloud: pb.PointCloud, spec: CodecSpec, max_points: int, max_bytes: int
) -> tuple[int, int]:
    """Replace ``cloud.data`` by the decoded records; return (encoded, decoded) byte counts.

    ``CodecError`` (the frame is refused, the connection stays) for anything that does not
    decode to at most ``max_points`` records and ``max_bytes`` bytes of ``cloud``'s layout."""
    if spec.codec == NONE:
        n = len(cloud.data)
        return n, n
    return decode_declared(cloud, spec, declared(cloud, spec, max_points, max_bytes))


def decode_declared(cloud: pb.PointCloud, spec: CodecSpec, plan: Declared) -> tuple[int, int]:
    """:func:`decode_cloud` once :func:`declared` has read the headers (and the caller has
    charged ``plan.peak_bytes``): the decode holds at most that and yields exactly
    ``plan.decoded_bytes``, or raises ``CodecError``."""
    data = cloud.data
    try:
        decode = _decode_zstd if spec.codec == ZSTD else _decode_quantized
        out = decode(data, plan)
    except zstandard.ZstdError as exc:
        raise CodecError(f"{spec.name} data does not decode: {exc}") from None
    cloud.data = out
    return len(data), len(out)


def _bounded(data: bytes, expected: int) -> bytes:
    """Decompress one zstd frame that must hold exactly ``expected`` bytes (checked first);
    bytes after that frame (a second frame, padding) are refused, not ignored."""
    try:
        size = zstandard.frame_content_size(data)
    except zstandard.ZstdError as exc:
        raise CodecError(f"zstd data has no valid frame header: {exc}") from None
    if size != expected:
        raise CodecError(f"zstd frame holds {size} bytes, expected {expected}")
    out = zstandard.ZstdDecompressor().decompress(
        data, max_output_size=expected, allow_extra_data=False
    )
    if len(out) != expected:
        raise CodecError(f"zstd frame decoded to {len(out)} bytes, expected {expected}")
    return out


def _check_size(points: int, stride: int, max_points: int, max_bytes: int) -> None:
    if points > max_points or points * stride > max_bytes:
        raise CodecError(
            f"encoded cloud claims {points} points ({points * stride} bytes); limits are "
            f"{max_points} points and {max_bytes} bytes"
        )


def _decode_zstd(data: bytes, plan: Declared) -> bytes:
    planes = np.frombuffer(_bounded(data, plan.decoded_bytes), np.uint8)
    return planes.reshape(plan.layout.stride, -1).T.tobytes()


def _decode_quantized(data: bytes, plan: Declared) -> bytes:
    layout = plan.layout
    n, xyz_len, step, attr_step, levels = _QHEADER.unpack_from(data)
    if not (np.isfinite(step) and step > 0 and np.isfinite(attr_step) and attr_step >= 0):
        raise CodecError("quantized header has an invalid step")
    if levels > predictive.MAX_LEVELS:
        raise CodecError(f"quantized header has {levels} levels, at most {predictive.MAX_LEVELS}")
    others = _others(layout)
    start = _QHEADER.size + _FIELD.size * len(others)
    if start + xyz_len > len(data):
        raise CodecError("quantized header or xyz block runs past the data")
    fields = [_FIELD.unpack_from(data, _QHEADER.size + _FIELD.size * i) for i in range(len(others))]
    widths = [_field_bytes(f[0], f[1], t, n) for f, (_, _, t) in zip(fields, others, strict=True)]
    xyz_raw = _bounded(data[start : start + xyz_len], predictive.block_bytes(n, levels))
    rest = np.frombuffer(_bounded(data[start + xyz_len :], sum(widths)), np.uint8)
    out = np.zeros(n, layout.structured_dtype)
    axes = predictive.decode(np.frombuffer(xyz_raw, np.uint8), n, levels)
    for i, name in enumerate(_XYZ):
        out[name] = axes[i] * step
    at = 0
    for (mode, count), (name, _, ftype), width in zip(fields, others, widths, strict=True):
        block = rest[at : at + width]
        at += width
        if mode == _STEPPED:
            out[name] = _undelta(block, n) * attr_step
        elif mode == _PALETTE:
            values = block[: count * ftype.size].view(f"<u{ftype.size}")
            index = np.cumsum(block[count * ftype.size :], dtype=np.uint8)
            if n and int(index.max()) >= count:
                raise CodecError(f"field {name!r}: palette index beyond its {count} values")
            out[name] = values[index].view(ftype.dtype)
        else:
            out[name] = predictive.from_planes(block, n, ftype.size).view(ftype.dtype)
    return out.tobytes()


def _field_bytes(mode: int, count: int, ftype: FieldType, n: int) -> int:
    """Bytes of one field's part of the rest block; ``CodecError`` for a bad descriptor."""
    if mode == _RAW:
        return n * ftype.size
    if mode == _STEPPED and ftype in (FieldType.FLOAT32, FieldType.FLOAT64):
        return 4 * n
    if mode == _PALETTE and 1 <= count <= _PALETTE_MAX:
        return count * ftype.size + n
    raise CodecError(f"quantized field descriptor ({mode}, {count}) is invalid for {ftype.name}")


def _undelta(planes: npt.NDArray[np.uint8], n: int) -> npt.NDArray[np.float64]:
    z = predictive.from_planes(planes, n, 4).astype(np.int64)
    return np.cumsum((z >> 1) ^ -(z & 1)).astype(np.float64)
