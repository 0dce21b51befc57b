"""Structure-aware strategies for hostile edge traffic.

Each example is a short session script: a list of raw transport messages. Most are real
``EdgeMessage`` encodings with hostile field values (odd layouts, seq jumps, huge claims,
unknown enum numbers, other devices' ids); some are encodings cut short or with bytes flipped,
and some are plain garbage, so the decoder, the layout checks and the session rules are all hit.
"""

from __future__ import annotations

import math

from hypothesis import strategies as st

from bridge.v1 import bridge_pb2 as pb

# Device ids the fuzzer may impersonate; the well-behaved edge in the test uses "good".
DEVICES = ("good", "fuzz-a", "fuzz-b", "", "x" * 300)
STREAMS = ("lidar", "imu", "", "s" * 200, "lidar\x00")

_u32 = st.integers(min_value=0, max_value=2**32 - 1)
_u64 = st.integers(min_value=0, max_value=2**64 - 1)
_enum = st.integers(min_value=-3, max_value=9)
_double = st.one_of(
    st.sampled_from([0.0, -1.0, 1e-9, 0.05, 1e300, math.inf, -math.inf, math.nan]),
    st.floats(allow_nan=True, allow_infinity=True),
)


@st.composite
def stream_specs(draw: st.DrawFn) -> pb.StreamSpec:
    return pb.StreamSpec(
        stream_id=draw(st.sampled_from(STREAMS)),
        kind=draw(_enum),
        voxel_size=draw(_double),
        passthrough=draw(st.booleans()),
        overflow=draw(_enum),
        max_points=draw(st.one_of(st.just(0), st.integers(1, 4), _u32)),
    )


@st.composite
def hellos(draw: st.DrawFn) -> pb.EdgeMessage:
    hello = pb.Hello(
        device_id=draw(st.sampled_from(DEVICES)),
        resume_token=draw(st.sampled_from(["", "bogus", "0" * 64])),
        streams=draw(st.lists(stream_specs(), max_size=4)),
        auth_token=draw(st.sampled_from(["", "wrong"])),
    )
    for _ in range(draw(st.integers(0, 2))):
        hello.resume.add(stream_id=draw(st.sampled_from(STREAMS)), delivered_seq=draw(_u64))
    return pb.EdgeMessage(hello=hello)


@st.composite
def point_clouds(draw: st.DrawFn) -> pb.PointCloud:
    fields = [
        pb.PackedField(
            name=draw(st.sampled_from(["x", "y", "z", "intensity", "rgb", "", "x"])),
            offset=draw(st.one_of(st.integers(0, 16), _u32)),
            type=draw(_enum),
        )
        for _ in range(draw(st.integers(0, 5)))
    ]
    stride = draw(st.one_of(st.sampled_from([0, 1, 12, 16]), _u32))
    n_bytes = draw(st.sampled_from([0, 1, 11, 12, 24, 96, 4000]))
    return pb.PointCloud(
        point_stride=stride,
        fields=fields,
        data=draw(st.binary(min_size=n_bytes, max_size=n_bytes)),
        frame_id=draw(st.sampled_from(["", "map", "f" * 500])),
    )


@st.composite
def frames(draw: st.DrawFn) -> pb.EdgeMessage:
    frame = pb.Frame(
        stream_id=draw(st.sampled_from(STREAMS)),
        seq=draw(st.one_of(st.integers(0, 5), _u64)),
        capture_time_ns=draw(st.integers(-(2**63), 2**63 - 1)),
    )
    if draw(st.booleans()):
        frame.point_cloud.CopyFrom(draw(point_clouds()))
    else:
        keys = st.text(max_size=8)
        frame.telemetry.values.update(draw(st.dictionaries(keys, _double, max_size=6)))
        frame.telemetry.blob = draw(st.binary(max_size=64))
    return pb.EdgeMessage(frame=frame)


@st.composite
def damaged(draw: st.DrawFn, inner: st.SearchStrategy[pb.EdgeMessage]) -> bytes:
    """A real encoding, cut short or with a byte flipped."""
    raw = bytearray(draw(inner).SerializeToString())
    if not raw:
        return b"\xff"
    if draw(st.booleans()):
        return bytes(raw[: draw(st.integers(0, len(raw) - 1))])
    i = draw(st.integers(0, len(raw) - 1))
    raw[i] ^= draw(st.integers(1, 255))
    return bytes(raw)


def messages() -> st.SearchStrategy[bytes]:
    encoded = st.one_of(hellos(), frames()).map(lambda m: m.SerializeToString())
    return st.one_of(
        encoded,
        encoded,
        damaged(st.one_of(hellos(), frames())),
        st.binary(max_size=64),
    )


@st.composite
def sessions(draw: st.DrawFn) -> tuple[str, list[bytes]]:
    """(transport, messages): usually a Hello first, so frames reach the session rules."""
    script = draw(st.lists(messages(), min_size=1, max_size=8))
    if draw(st.integers(0, 3)):
        script.insert(0, draw(hellos()).SerializeToString())
    return draw(st.sampled_from(["ws", "grpc"])), script
