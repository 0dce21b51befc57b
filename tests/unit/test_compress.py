"""Cloud codecs (bridge.protocol.compress): lossless round trips exactly, lossy within the stated
precision, and the decoder refuses lies and bombs before allocating."""

from __future__ import annotations

import contextlib
import tracemalloc
import warnings

import numpy as np
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from bridge.client.codecs import codec_spec, encode_payload
from bridge.client.payload import PreparedPayload
from bridge.protocol import compress, predictive
from bridge.protocol.cloud import make_layout
from bridge.protocol.errors import CodecError
from bridge.v1 import bridge_pb2 as pb
from loadgen.clouds import lidar_xyzi

# x, y, z float32, a uint8 label, 3 padding bytes, intensity float64: odd offsets on purpose.
DTYPE = np.dtype(
    {
        "names": ["x", "y", "z", "label", "intensity"],
        "formats": ["<f4", "<f4", "<f4", "u1", "<f8"],
        "offsets": [0, 4, 8, 12, 16],
        "itemsize": 24,
    }
)
FIELDS = [("x", 0, pb.FLOAT32), ("y", 4, pb.FLOAT32), ("z", 8, pb.FLOAT32)]
FIELDS += [("label", 12, pb.UINT8), ("intensity", 16, pb.FLOAT64)]
LAYOUT = make_layout(24, FIELDS)  # type: ignore[arg-type]

coords = st.floats(-5000.0, 5000.0, allow_nan=False, width=32)


def roundtrip(records: np.ndarray, spec: compress.CodecSpec) -> np.ndarray:
    encoded = compress.encode(LAYOUT, records.tobytes(), spec)
    cloud = pb.PointCloud(point_stride=24, data=encoded)
    cloud.fields.extend(pb.PackedField(name=n, offset=o, type=t) for n, o, t in FIELDS)  # type: ignore[misc]
    sizes = compress.decode_cloud(cloud, spec, max_points=10_000, max_bytes=1 << 20)
    assert sizes == (len(encoded), len(records) * 24)
    return np.frombuffer(cloud.data, DTYPE)


@st.composite
def finite_clouds(draw: st.DrawFn) -> np.ndarray:
    n = draw(st.integers(0, 300))
    out = np.zeros(n, DTYPE)
    for name in ("x", "y", "z"):
        out[name] = draw(hnp.arrays(np.float32, n, elements=coords))
    out["label"] = draw(hnp.arrays(np.uint8, n))
    out["intensity"] = draw(hnp.arrays(np.float64, n, elements=st.floats(-1e6, 1e6)))
    return out


@settings(max_examples=100, deadline=None)
@given(records=finite_clouds())
def test_zstd_round_trips_exactly(records: np.ndarray) -> None:
    assert roundtrip(records, compress.CodecSpec(compress.ZSTD)).tobytes() == records.tobytes()


@settings(max_examples=200, deadline=None)
@given(
    records=finite_clouds(),
    step=st.sampled_from([0.0001, 0.001, 0.01, 0.05]),
    attr_step=st.sampled_from([0.0, 0.001, 0.5]),
)
def test_quantized_is_within_the_stated_precision(
    records: np.ndarray, step: float, attr_step: float
) -> None:
    out = roundtrip(records, compress.CodecSpec(compress.QUANTIZED, step, attr_step))
    for name in ("x", "y", "z"):
        original = records[name].astype(np.float64)
        # step / 2, plus the float32 rounding of the decoded value itself
        bound = step / 2 + np.spacing(np.abs(original).astype(np.float32)).astype(np.float64)
        assert (np.abs(out[name].astype(np.float64) - original) <= bound * 1.0001).all(), name
    assert np.array_equal(out["label"], records["label"])  # integer fields: always exact
    if attr_step == 0:
        assert np.array_equal(out["intensity"], records["intensity"])
    else:
        err = np.abs(out["intensity"] - records["intensity"])
        assert (err <= attr_step / 2 + 1e-9 * np.abs(records["intensity"])).all()


def sensor_like(cloud_data: bytes) -> bytes:
    """The synthetic scan with an 8-bit reflectivity (k / 255 as float32), as sensors report."""
    rec = np.frombuffer(cloud_data, "<f4").reshape(-1, 4).copy()
    rec[:, 3] = np.rint(rec[:, 3] * 255) / 255
    return rec.tobytes()


def test_lidar_ratios_meet_the_targets() -> None:
    cloud = lidar_xyzi(100_000, seed=1)
    layout = make_layout(cloud.stride, cloud.layout_triples())
    sensor = sensor_like(cloud.data)
    mm = compress.CodecSpec(compress.QUANTIZED, 0.001)

    def ratio(data: bytes, spec: compress.CodecSpec) -> float:
        return len(data) / len(compress.encode(layout, data, spec))

    assert ratio(cloud.data, compress.CodecSpec(compress.ZSTD)) >= 1.3
    assert ratio(cloud.data, compress.CodecSpec(compress.QUANTIZED, 0.001, 1 / 256)) >= 4.0
    # 1 mm with the intensity lossless: random float32 noise in [0, 1] costs ~3 bytes a point
    # whatever x, y, z cost; a sensor-like 8-bit one costs < 1.
    assert ratio(cloud.data, mm) >= 3.0
    assert ratio(sensor, mm) >= 5.0
    pc = cloud.to_proto()
    pc.data = compress.encode(layout, sensor, mm)
    compress.decode_cloud(pc, mm, 100_000, 1 << 30)
    decoded = np.frombuffer(pc.data, "<f4").reshape(-1, 4)
    assert decoded[:, 3].tobytes() == np.frombuffer(sensor, "<f4").reshape(-1, 4)[:, 3].tobytes()


@settings(max_examples=100, deadline=None)
@given(
    records=finite_clouds(),
    palette=hnp.arrays(np.uint64, st.integers(1, 256), elements=st.integers(0, 2**64 - 1)),
    seed=st.integers(0, 2**32 - 1),
)
def test_fields_with_few_values_round_trip_bit_exactly(
    records: np.ndarray, palette: np.ndarray, seed: int
) -> None:
    """Any 64-bit patterns (NaNs, -0.0, infinities included) drawn from <= 256 values."""
    index = np.random.default_rng(seed).integers(0, len(palette), len(records))
    records["intensity"] = palette[index].view(np.float64)
    spec = compress.CodecSpec(compress.QUANTIZED, 0.01)
    if len(records):  # the path under test is the palette (descriptor of the 2nd field)
        encoded = compress.encode(LAYOUT, records.tobytes(), spec)
        at = compress._QHEADER.size + compress._FIELD.size
        assert compress._FIELD.unpack_from(encoded, at)[0] == compress._PALETTE
    out = roundtrip(records, spec)
    assert out["intensity"].tobytes() == records["intensity"].tobytes()
    assert np.array_equal(out["label"], records["label"])


def test_the_decoder_refuses_bad_field_descriptors_and_indices() -> None:
    spec = compress.CodecSpec(compress.QUANTIZED, 0.001)
    records = np.zeros(100, DTYPE)
    records["intensity"] = np.arange(100) % 3  # a palette of 3 values
    good = compress.encode(LAYOUT, records.tobytes(), spec)
    assert len(compress.decode_cloud(_cloud(good), spec, 10**6, 1 << 30)) == 2
    header = compress._QHEADER.size
    label, intensity = header, header + compress._FIELD.size  # descriptors of the two fields
    for at, patch in [
        (label, compress._FIELD.pack(7, 0)),  # unknown mode
        (label, compress._FIELD.pack(compress._STEPPED, 0)),  # stepped is for floats only
        (intensity, compress._FIELD.pack(compress._PALETTE, 0)),  # empty palette
        (intensity, compress._FIELD.pack(compress._PALETTE, 257)),
        (header - 1, bytes([predictive.MAX_LEVELS + 1])),  # levels
    ]:
        bad = good[:at] + patch + good[at + len(patch) :]
        with pytest.raises(CodecError):
            compress.decode_cloud(_cloud(bad), spec, 10**6, 1 << 30)
    # An index past the palette, in a rest block of the right size.
    xyz_len = compress._QHEADER.unpack_from(good)[1]
    rest_at = intensity + compress._FIELD.size + xyz_len
    rest = bytearray(zstandard.ZstdDecompressor().decompress(good[rest_at:]))
    rest[100 + 3 * 8] = 5  # label: 100 raw bytes, then 3 palette values, then index deltas
    bad = good[:rest_at] + zstandard.ZstdCompressor(write_content_size=True).compress(rest)
    with pytest.raises(CodecError, match="palette index"):
        compress.decode_cloud(_cloud(bad), spec, 10**6, 1 << 30)


def test_non_finite_or_huge_coordinates_are_refused_at_the_edge() -> None:
    records = np.zeros(3, DTYPE)
    records["x"][1] = np.nan
    with pytest.raises(ValueError, match="non-finite"):
        compress.encode(LAYOUT, records.tobytes(), compress.CodecSpec(compress.QUANTIZED, 0.001))
    records["x"][1] = 3e6  # 3e9 steps of 1 mm: past MAX_QUANTUM
    with pytest.raises(ValueError, match="steps"):
        compress.encode(LAYOUT, records.tobytes(), compress.CodecSpec(compress.QUANTIZED, 0.001))


def _cloud(data: bytes) -> pb.PointCloud:
    cloud = pb.PointCloud(point_stride=24, data=data)
    cloud.fields.extend(pb.PackedField(name=n, offset=o, type=t) for n, o, t in FIELDS)  # type: ignore[misc]
    return cloud


@pytest.mark.parametrize("codec", [compress.ZSTD, compress.QUANTIZED])
def test_the_decoder_refuses_garbage_lies_and_bombs(codec: int) -> None:
    spec = compress.CodecSpec(codec, 0.001 if codec == compress.QUANTIZED else 0.0)
    records = np.zeros(1000, DTYPE).tobytes()
    good = compress.encode(LAYOUT, records, spec)
    with pytest.raises(CodecError):  # too many points for the limit: refused before inflating
        compress.decode_cloud(_cloud(good), spec, max_points=999, max_bytes=1 << 30)
    with pytest.raises(CodecError):
        compress.decode_cloud(_cloud(good), spec, max_points=10**6, max_bytes=1000 * 24 - 1)
    with pytest.raises(CodecError):
        compress.decode_cloud(_cloud(b"\x00" * 40), spec, 10**6, 1 << 30)
    with pytest.raises(CodecError):
        compress.decode_cloud(_cloud(good[:-5]), spec, 10**6, 1 << 30)
    # A zstd frame whose header says less than it inflates to (a bomb) is refused.
    bomb = zstandard.ZstdCompressor(write_content_size=False).compress(b"\x00" * (1 << 24))
    with pytest.raises(CodecError):
        compress.decode_cloud(_cloud(bomb), spec, 10**6, 1 << 30)


def test_stream_specs_are_validated() -> None:
    def spec(**kw: object) -> pb.StreamSpec:
        return pb.StreamSpec(stream_id="s", kind=pb.POINT_CLOUD, **kw)  # type: ignore[arg-type]

    assert compress.spec_of(spec()) is compress.RAW
    assert compress.spec_of(spec(codec=pb.CODEC_ZSTD)).level == compress.DEFAULT_LEVEL
    for bad in (
        spec(codec=pb.CODEC_QUANTIZED),  # no step
        spec(codec=pb.CODEC_QUANTIZED, codec_params=pb.CodecParams(step=-1)),
        spec(codec=pb.CODEC_QUANTIZED, codec_params=pb.CodecParams(step=1, attr_step=-1)),
        spec(codec=99),  # type: ignore[arg-type]
        pb.StreamSpec(stream_id="t", kind=pb.TELEMETRY, codec=pb.CODEC_ZSTD),
    ):
        with pytest.raises(CodecError):
            compress.spec_of(bad)


def test_the_sdk_encodes_a_prepared_cloud_once() -> None:
    cloud = lidar_xyzi(1000, seed=2)
    raw = PreparedPayload.of(cloud.to_proto())
    spec = codec_spec("zstd")
    encoded = encode_payload(raw, spec)
    assert encoded.codec == compress.ZSTD and encoded.nbytes < raw.nbytes
    assert encode_payload(encoded, spec) is encoded
    with pytest.raises(ValueError, match="encoded with codec"):
        encode_payload(encoded, codec_spec("quantized", step=0.01))
    with pytest.raises(ValueError):
        codec_spec("draco")


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), garbage=st.booleans())
def test_any_xyz_block_of_the_right_size_decodes_or_is_refused(seed: int, garbage: bool) -> None:
    """Inside size-checked zstd frames the bytes can be anything (a peer's or a bit flip's):
    the decoder yields some records or CODEC_ERROR, never another exception or a warning."""
    rng = np.random.default_rng(seed)
    records = np.zeros(500, DTYPE)
    records["x"] = np.linspace(0, 50, 500)
    records["intensity"] = np.arange(500) % 7
    spec = compress.CodecSpec(compress.QUANTIZED, 0.001)
    good = compress.encode(LAYOUT, records.tobytes(), spec)
    start = compress._QHEADER.size + 2 * compress._FIELD.size
    xyz_len = compress._QHEADER.unpack_from(good)[1]
    block = bytearray(zstandard.ZstdDecompressor().decompress(good[start : start + xyz_len]))

    def spliced(block: bytes) -> bytes:
        frame = zstandard.ZstdCompressor(write_content_size=True).compress(block)
        head = good[:4] + len(frame).to_bytes(4, "little") + good[8:start]
        return head + frame + good[start + xyz_len :]

    same = _cloud(spliced(bytes(block)))  # the splice itself is sound
    compress.decode_cloud(same, spec, 10**6, 1 << 30)
    assert np.array_equal(np.frombuffer(same.data, DTYPE)["intensity"], records["intensity"])
    if garbage:
        block = bytearray(rng.integers(0, 256, len(block), dtype=np.uint8).tobytes())
    else:
        for at in rng.integers(0, len(block), 20):
            block[at] = int(rng.integers(0, 256))
    with warnings.catch_warnings(), contextlib.suppress(CodecError):
        warnings.simplefilter("error")
        compress.decode_cloud(_cloud(spliced(bytes(block))), spec, 10**6, 1 << 30)


def _bomb(points: int, codec: int) -> tuple[pb.PointCloud, compress.CodecSpec]:
    """A few hundred bytes that inflate to ``points`` records of zeros: legal, and maximal
    work and memory per byte received."""
    spec = compress.CodecSpec(codec, 0.001 if codec == compress.QUANTIZED else 0.0)
    return _cloud(compress.encode(LAYOUT, np.zeros(points, DTYPE).tobytes(), spec)), spec


@pytest.mark.parametrize("codec", [compress.ZSTD, compress.QUANTIZED])
def test_declared_reads_headers_only_and_states_the_decoded_size(codec: int) -> None:
    cloud, spec = _bomb(400_000, codec)
    assert len(cloud.data) < 4096  # ~1 KB that declares 9.6 MB
    tracemalloc.start()
    try:
        plan = compress.declared(cloud, spec, max_points=10**6, max_bytes=1 << 30)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024, f"reading the headers allocated {peak} B"
    assert (plan.points, plan.decoded_bytes) == (400_000, 400_000 * 24)
    assert plan.peak_bytes >= 3 * plan.decoded_bytes
    with pytest.raises(CodecError):  # the same headers against a smaller limit: no work done
        compress.declared(cloud, spec, max_points=399_999, max_bytes=1 << 30)


F32 = pb.FLOAT32
PEAK_LAYOUTS = {
    12: [("x", 0, F32), ("y", 4, F32), ("z", 8, F32)],
    16: [("x", 0, F32), ("y", 4, F32), ("z", 8, F32), ("i", 12, F32)],
    24: FIELDS,
}


@pytest.mark.parametrize("stride", sorted(PEAK_LAYOUTS))
@pytest.mark.parametrize("levels", [0, 4, 16])
@pytest.mark.parametrize(
    "spec",
    [
        compress.CodecSpec(compress.ZSTD),
        compress.CodecSpec(compress.QUANTIZED, 0.001),
        compress.CodecSpec(compress.QUANTIZED, 0.001, 0.01),
    ],
    ids=["zstd", "quantized", "quantized-attr"],
)
def test_a_decode_holds_no_more_than_its_declared_peak(
    stride: int, levels: int, spec: compress.CodecSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bytes charged before a decode (``Declared.peak_bytes``) bound what it allocates
    (Python and NumPy allocations, as tracemalloc sees them), whatever the layout and levels."""
    monkeypatch.setattr(compress, "LEVELS", levels)
    fields = PEAK_LAYOUTS[stride]
    layout = make_layout(stride, fields)  # type: ignore[arg-type]
    rng = np.random.default_rng(stride + levels)
    for n in (1000, 50_000):
        records = np.zeros(n, layout.structured_dtype)
        for f in layout.fields:
            records[f.name] = rng.integers(0, 200, n) if f.name == "label" else rng.normal(0, 9, n)
        cloud = pb.PointCloud(
            point_stride=stride, data=compress.encode(layout, records.tobytes(), spec)
        )
        cloud.fields.extend(pb.PackedField(name=a, offset=o, type=t) for a, o, t in fields)  # type: ignore[misc]
        plan = compress.declared(cloud, spec, 10**6, 1 << 30)
        tracemalloc.start()
        try:
            compress.decode_declared(cloud, spec, plan)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert len(cloud.data) == plan.decoded_bytes
        assert peak <= plan.peak_bytes, f"{n} points: peak {peak} B > declared {plan.peak_bytes}"


def test_zstd_data_must_be_exactly_one_frame() -> None:
    """Trailing bytes after the stated frame (a second frame, padding) are refused, not
    skipped: what the edge sent is what is decoded."""
    spec = compress.CodecSpec(compress.ZSTD)
    good = compress.encode(LAYOUT, np.zeros(100, DTYPE).tobytes(), spec)
    compress.decode_cloud(_cloud(good), spec, 10**6, 1 << 30)
    trailing = zstandard.ZstdCompressor().compress(b"\x00" * (1 << 20))
    for extra in (trailing, b"\x00" * 16):
        with pytest.raises(CodecError, match="unused data"):
            compress.decode_cloud(_cloud(good + extra), spec, 10**6, 1 << 30)
