"""One suite over every decimation backend (ids numpy, c, cuda): same answers, same errors.

The NumPy reference is itself checked against a slow, obviously-correct dictionary oracle;
every other backend is then compared with the reference on hypothesis-generated clouds.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import defaultdict

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from bridge.decimate import (
    BackendUnavailable,
    DecimationResult,
    Decimator,
    VoxelKeyOverflow,
    available_backends,
    downsample_arrays,
    get_decimator,
)
from bridge.decimate.ladder import rungs
from bridge.decimate.reference import downsample_packed
from bridge.protocol.cloud import CloudLayout, FieldType, make_layout
from bridge.protocol.errors import BridgeError

BACKENDS = [
    pytest.param("numpy", id="numpy"),
    pytest.param("c", id="c"),
    pytest.param("cuda", id="cuda", marks=pytest.mark.gpu),
]

SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(params=BACKENDS, scope="module")
def decimator(request: pytest.FixtureRequest) -> Decimator:
    reason = available_backends()[request.param]
    if reason is not None:
        pytest.skip(f"{request.param} backend unavailable: {reason}")
    return get_decimator(request.param, threads=2)


# ---- layouts used throughout ----

XYZ32 = make_layout(12, [("x", 0, 7), ("y", 4, 7), ("z", 8, 7)])
#: float32 xyz, packed rgb, uint16 intensity, 2 padding bytes.
RICH32 = make_layout(
    20, [("x", 0, 7), ("y", 4, 7), ("z", 8, 7), ("rgb", 12, 6), ("intensity", 16, 4)]
)
#: float64 xyz out of order, float32 value, signed int8 ring, uint32 id, rgba as float32 bits.
RICH64 = make_layout(
    48,
    [
        ("intensity", 0, 7),
        ("z", 8, 8),
        ("x", 16, 8),
        ("y", 24, 8),
        ("ring", 32, 1),
        ("id", 36, 6),
        ("rgba", 40, 7),
        ("t", 44, 3),
    ],
)
LAYOUTS = {"xyz32": XYZ32, "rich32": RICH32, "rich64": RICH64}


def pack(layout: CloudLayout, xyz: np.ndarray, rng: np.random.Generator) -> bytes:
    """Records with the given xyz and random values in every other field."""
    rec = np.zeros(len(xyz), dtype=layout.structured_dtype)
    for i, axis in enumerate("xyz"):
        rec[axis] = xyz[:, i]
    for f in layout.fields:
        if f.name in "xyz":
            continue
        if f.is_packed_color:
            rec[f.name] = rng.integers(0, 256, (len(xyz), 4), dtype=np.uint8).view(f.type.dtype)[
                :, 0
            ]
        elif f.type.is_float:
            rec[f.name] = rng.normal(0, 100, len(xyz))
        else:
            info = np.iinfo(f.type.dtype)
            rec[f.name] = rng.integers(info.min, info.max, len(xyz), endpoint=True)
    return rec.tobytes()


SPECIAL = [math.nan, math.inf, -math.inf, 0.0, -0.0, 1e6, -1e6, 0.2, -0.2, 0.6, 123456.75]
#: Large enough that floor(p / voxel) leaves int64 for the smaller voxel sizes drawn below.
HUGE = [1e15, -3e16, 4e17, -2e18, 9.3e18, 3e20, -1e30, 3e38]


@st.composite
def clouds(draw: st.DrawFn) -> tuple[str, bytes, float]:
    name = draw(st.sampled_from(sorted(LAYOUTS)))
    layout = LAYOUTS[name]
    n = draw(st.integers(0, 48))
    dtype = np.float64 if name == "rich64" else np.float32
    element = st.one_of(
        st.floats(-1000, 1000, width=32),
        st.sampled_from(SPECIAL),
        st.sampled_from(HUGE) if draw(st.integers(0, 9)) == 0 else st.nothing(),
        st.integers(-20, 20).map(lambda i: i * 0.25),  # duplicates and exact faces
    )
    xyz = draw(hnp.arrays(dtype, (n, 3), elements=element))
    if n and draw(st.booleans()):  # repeat some points verbatim
        xyz = np.concatenate([xyz, xyz[: draw(st.integers(1, n))]])
    voxel = draw(st.sampled_from([0.05, 0.2, 0.25, 1.0, 3.7, 1000.0]))
    seed = draw(st.integers(0, 2**32 - 1))
    return name, pack(layout, xyz, np.random.default_rng(seed)), voxel


# ---- comparison helpers ----


def as_records(layout: CloudLayout, data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype=layout.structured_dtype)


def assert_same_cloud(layout: CloudLayout, got: bytes, want: bytes, rtol: float = 1e-5) -> None:
    """Same point count, integers and colours exact, floats within rtol, padding zero."""
    a, b = as_records(layout, got), as_records(layout, want)
    assert len(a) == len(b)
    for f in layout.fields:
        if f.is_packed_color or not f.type.is_float:
            np.testing.assert_array_equal(
                a[f.name].view(f"V{f.type.size}"), b[f.name].view(f"V{f.type.size}"), f.name
            )
        else:
            np.testing.assert_allclose(
                a[f.name], b[f.name], rtol=rtol, atol=0, err_msg=f.name, equal_nan=True
            )
    covered = np.zeros(layout.stride, dtype=bool)
    for f in layout.fields:
        covered[f.offset : f.end] = True
    raw = np.frombuffer(got, dtype=np.uint8).reshape(-1, layout.stride)
    assert not raw[:, ~covered].any(), "padding bytes must be zero"


def oracle(layout: CloudLayout, data: bytes, voxel: float) -> bytes:
    """Slow statement of docs/design.md §3: dict of voxel key -> points, means, key order.

    Raises OverflowError when a key leaves the int64 range.
    """
    rec = as_records(layout, data)
    f32 = all(layout.field(a).type == FieldType.FLOAT32 for a in "xyz")
    groups: dict[tuple[int, ...], list[int]] = defaultdict(list)
    for i, r in enumerate(rec):
        p = [r[a] for a in "xyz"]
        if not all(math.isfinite(float(c)) for c in p):
            continue
        if f32:
            with np.errstate(over="ignore"):  # inf keys raise OverflowError in int()
                key = tuple(int(np.floor(np.float32(c) / np.float32(voxel))) for c in p)
        else:
            key = tuple(math.floor(float(c) / voxel) for c in p)
        if any(not -(2**63) <= k < 2**63 for k in key):
            raise OverflowError(key)
        groups[key].append(i)
    out = np.zeros(len(groups), dtype=layout.structured_dtype)
    for j, key in enumerate(sorted(groups)):
        members = rec[groups[key]]
        for f in layout.fields:
            col = members[f.name]
            if f.is_packed_color:
                ch = np.ascontiguousarray(col).view(np.uint8).reshape(-1, 4).astype(np.int64)
                out[f.name][j] = np.array(
                    [math.floor(s / len(ch) + 0.5) for s in ch.sum(0)], dtype=np.uint8
                ).view(f.type.dtype)[0]
            elif f.type.is_float:
                total = 0.0
                for v in col:  # input order, float64, like the backends
                    total += float(v)
                out[f.name][j] = total / len(col)
            else:
                s = int(col.astype(np.int64).sum())
                mag = (2 * abs(s) + len(col)) // (2 * len(col))
                out[f.name][j] = -mag if s < 0 else mag
    return out.tobytes()


# ---- the reference against the oracle ----


@SETTINGS
@given(clouds())
def test_reference_matches_oracle(cloud: tuple[str, bytes, float]) -> None:
    name, data, voxel = cloud
    layout = LAYOUTS[name]
    try:
        want = oracle(layout, data, voxel)
    except OverflowError:
        with pytest.raises(VoxelKeyOverflow):
            downsample_packed(layout, data, voxel)
        return
    got, m = downsample_packed(layout, data, voxel)
    assert m * layout.stride == len(got)
    assert_same_cloud(layout, got, want, rtol=1e-12)


# ---- every backend against the reference ----


@SETTINGS
@given(cloud=clouds())
def test_backend_matches_reference(decimator: Decimator, cloud: tuple[str, bytes, float]) -> None:
    name, data, voxel = cloud
    layout = LAYOUTS[name]
    try:
        want, m = downsample_packed(layout, data, voxel)
    except VoxelKeyOverflow:
        with pytest.raises(VoxelKeyOverflow):
            decimator.downsample(layout, data, voxel)
        return
    result = decimator.downsample(layout, data, voxel)
    assert isinstance(result, DecimationResult)
    assert (result.points, result.voxel_size, result.backend) == (m, voxel, decimator.name)
    assert_same_cloud(layout, result.data, want)


@pytest.mark.parametrize("voxel", [0.5, 5.0], ids=["sorted", "dense-grid"])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_c_threads_equal_reference_bitwise(threads: int, voxel: float) -> None:
    """Large enough to split across kernel threads; CPU sums run in the same order.

    voxel 0.5 takes the kernel's radix-sort path, 5.0 its dense-grid counting path.
    """
    if available_backends()["c"] is not None:
        pytest.skip(f"c backend unavailable: {available_backends()['c']}")
    rng = np.random.default_rng(7)
    xyz = rng.normal(0, 30, (300_000, 3)).astype(np.float32)
    xyz[::97] = np.nan
    data = pack(RICH32, xyz, rng)
    want, _ = downsample_packed(RICH32, data, voxel)
    assert get_decimator("c", threads=threads).downsample(RICH32, data, voxel).data == want


def test_output_sorted_by_key_and_means(decimator: Decimator) -> None:
    xyz = np.array(
        [[0.1, 0.1, 0.1], [-0.1, 0.0, 0.0], [0.3, 0.1, 0.1], [0.0, -0.1, 5.0], [-0.3, 0.0, 0.0]],
        dtype=np.float32,
    )
    out = decimator.downsample(XYZ32, xyz.tobytes(), 0.5)
    got = np.frombuffer(out.data, dtype=np.float32).reshape(-1, 3)
    np.testing.assert_allclose(
        got, [[-0.2, 0.0, 0.0], [0.0, -0.1, 5.0], [0.2, 0.1, 0.1]], rtol=1e-6, atol=1e-7
    )


def test_empty_all_nan_and_single(decimator: Decimator) -> None:
    empty = decimator.downsample(XYZ32, b"", 0.1)
    assert (empty.data, empty.points) == (b"", 0)
    nan = np.full((5, 3), np.nan, dtype=np.float32)
    nan[1, 0] = 1.0
    assert decimator.downsample(XYZ32, nan.tobytes(), 0.1).points == 0
    one = np.array([[1.5, -2.5, 3.25]], dtype=np.float32)
    assert decimator.downsample(XYZ32, one.tobytes(), 0.1).data == one.tobytes()


def test_memoryview_and_bytearray_inputs(decimator: Decimator) -> None:
    xyz = np.random.default_rng(1).uniform(-5, 5, (1000, 3)).astype(np.float32)
    want = decimator.downsample(XYZ32, xyz.tobytes(), 0.5)
    assert decimator.downsample(XYZ32, memoryview(xyz), 0.5) == want  # float32 format view
    assert decimator.downsample(XYZ32, memoryview(bytearray(xyz.tobytes())), 0.5) == want


def test_huge_and_negative_coordinates(decimator: Decimator) -> None:
    """Keys spread over more than 64 bits of packed key: exercises the wide-key paths."""
    xyz = np.array(
        [[1e12, -1e12, 3.0], [-1e12, 1e12, -3.0], [1e12, -1e12, 3.004], [-5e11, 0.0, 1e12]],
        dtype=np.float64,
    )
    layout = make_layout(24, [("x", 0, 8), ("y", 8, 8), ("z", 16, 8)])
    want, m = downsample_packed(layout, xyz.tobytes(), 0.01)
    assert m == 3
    assert_same_cloud(layout, decimator.downsample(layout, xyz.tobytes(), 0.01).data, want)


@pytest.mark.parametrize(
    ("xyz", "voxel"),
    [
        (np.array([[1e30, 0, 0]], dtype=np.float32), 1e-3),
        (np.array([[0, 0, -1e300]], dtype=np.float64), 1.0),
        (np.array([[0, 0, 0], [0, 9.3e18, 0]], dtype=np.float64), 1.0),
        (np.array([[3e38, 0, 0]], dtype=np.float32), 0.05),  # p / v is inf in float32
        (np.array([[-1e308, 0, 0]], dtype=np.float64), 1e-10),  # and in float64
    ],
    ids=["f32", "f64", "just-over", "f32-inf", "f64-inf"],
)
def test_key_overflow_is_an_error(decimator: Decimator, xyz: np.ndarray, voxel: float) -> None:
    size = xyz.dtype.itemsize
    code = 7 if size == 4 else 8
    layout = make_layout(3 * size, [(a, i * size, code) for i, a in enumerate("xyz")])
    with pytest.raises(VoxelKeyOverflow, match="int64"):
        decimator.downsample(layout, xyz.tobytes(), voxel)


def test_key_just_inside_int64_is_fine(decimator: Decimator) -> None:
    xyz = np.array([[0.0, 0.0, 0.0], [9.2e18, -9.2e18, 1.0]], dtype=np.float64)
    layout = make_layout(24, [("x", 0, 8), ("y", 8, 8), ("z", 16, 8)])
    assert decimator.downsample(layout, xyz.tobytes(), 1.0).points == 2


@pytest.mark.parametrize("voxel", [0.0, -1.0, math.nan, math.inf, True, "0.1", None, 1e-50])
def test_bad_voxel_size(decimator: Decimator, voxel: object) -> None:
    with pytest.raises(ValueError, match="voxel_size"):
        decimator.downsample(XYZ32, np.zeros((2, 3), np.float32).tobytes(), voxel)  # type: ignore[arg-type]


def test_bad_data_and_arguments(decimator: Decimator) -> None:
    with pytest.raises(ValueError, match="multiple"):
        decimator.downsample(XYZ32, b"\0" * 13, 0.1)
    with pytest.raises(ValueError):
        decimator.downsample(XYZ32, "not bytes", 0.1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="layout"):
        decimator.downsample(None, b"", 0.1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_points"):
        decimator.downsample(XYZ32, b"", 0.1, max_points=-1)


def test_thread_safe_under_concurrent_calls(decimator: Decimator) -> None:
    rng = np.random.default_rng(3)
    inputs = [
        pack(RICH32, rng.normal(0, 10, (20_000, 3)).astype(np.float32), rng) for _ in range(6)
    ]
    wants = [downsample_packed(RICH32, d, 0.3)[0] for d in inputs]
    errors: list[BaseException] = []

    def work(k: int) -> None:
        try:
            for _ in range(3):
                got = decimator.downsample(RICH32, inputs[k], 0.3).data
                assert_same_cloud(RICH32, got, wants[k])
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


# ---- point budget ladder ----


def test_rungs() -> None:
    got = [r / 0.1 for r in list(rungs(0.1))[:9]]
    np.testing.assert_allclose(got, [1, 1.5, 2, 3, 4, 6, 8, 12, 16])


def test_budget_ladder(decimator: Decimator) -> None:
    rng = np.random.default_rng(5)
    data = rng.uniform(-10, 10, (20_000, 3)).astype(np.float32).tobytes()
    free = decimator.downsample(XYZ32, data, 0.25)
    assert free.points > 5000
    result = decimator.downsample(XYZ32, data, 0.25, max_points=5000)
    assert result.points <= 5000 < free.points
    ladder = list(rungs(0.25))
    k = ladder.index(result.voxel_size)
    assert k > 0
    assert decimator.downsample(XYZ32, data, ladder[k - 1]).points > 5000
    exact = decimator.downsample(XYZ32, data, result.voxel_size)
    assert exact.data == result.data
    # a budget already met leaves the voxel alone
    assert decimator.downsample(XYZ32, data, 0.25, max_points=free.points).voxel_size == 0.25


def test_budget_unreachable_stops(decimator: Decimator) -> None:
    """Points in all eight octants never merge below 8 voxels: the ladder must end."""
    corners = np.array(np.meshgrid([-1, 1], [-1, 1], [-1, 1])).reshape(3, -1).T.astype(np.float32)
    result = decimator.downsample(XYZ32, corners.tobytes(), 0.1, max_points=1)
    assert result.points == 8
    assert result.voxel_size > 1.0


# ---- registry ----


def test_available_backends_shape() -> None:
    backends = available_backends()
    assert set(backends) == {"numpy", "c", "cuda"}
    assert backends["numpy"] is None
    for reason in backends.values():
        assert reason is None or (isinstance(reason, str) and reason)


def test_auto_picks_best_and_logs(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="bridge.decimate"):
        d = get_decimator("auto", threads=2)
    best = next(n for n in ("cuda", "c", "numpy") if available_backends()[n] is None)
    assert d.name == best
    assert isinstance(d, Decimator)
    assert f"auto -> {best}" in caplog.text


def test_explicit_unavailable_or_unknown_backend_raises() -> None:
    with pytest.raises(BackendUnavailable, match="unknown backend") as info:
        get_decimator("gpu-magic")
    assert isinstance(info.value, BridgeError)
    for name, reason in available_backends().items():
        if reason is not None:
            with pytest.raises(BackendUnavailable) as info:
                get_decimator(name)
            assert info.value.reason == reason


@pytest.mark.parametrize("threads", [0, -1, True, 1.5])
def test_bad_thread_count(threads: object) -> None:
    with pytest.raises(ValueError, match="threads"):
        get_decimator("numpy", threads=threads)  # type: ignore[arg-type]


# ---- downsample_arrays ----


def test_downsample_arrays() -> None:
    xyz = np.array([[0.1, 0.1, 0.1], [0.2, 0.2, 0.2], [5.0, 5.0, 5.0]])
    out = downsample_arrays(xyz, 1.0)
    assert out.dtype == np.float64
    np.testing.assert_allclose(out, [[0.15, 0.15, 0.15], [5.0, 5.0, 5.0]])
    assert downsample_arrays(xyz.astype(np.float32), 1.0).dtype == np.float32
    assert downsample_arrays(np.zeros((0, 3), np.float32), 1.0).shape == (0, 3)


@pytest.mark.parametrize(
    "bad",
    [np.zeros((4, 2)), np.zeros(3), np.zeros((4, 3), dtype=np.int32), [[0.0, 0.0, 0.0]]],
    ids=["shape", "1d", "dtype", "list"],
)
def test_downsample_arrays_rejects(bad: object) -> None:
    with pytest.raises(ValueError, match="xyz"):
        downsample_arrays(bad, 1.0)  # type: ignore[arg-type]


# ---- the C glue's own argument checks (the kernel validates what Python already did) ----


@pytest.mark.parametrize(
    ("stride", "fields", "threads", "match"),
    [
        (12, [(0, 7, 2), (4, 7, 3)], 1, "3..64 fields"),
        (12, [(0, 7, 2), (4, 7, 3), (8, 7, 9)], 1, "unknown role"),
        (12, [(0, 7, 2), (4, 7, 3), (8, 9, 4)], 1, "unknown type"),
        (12, [(0, 7, 2), (2, 7, 3), (8, 7, 4)], 1, "overlap"),
        (12, [(0, 7, 2), (4, 7, 2), (8, 7, 4)], 1, "once"),
        (12, [(0, 7, 2), (4, 7, 3), (8, 5, 4)], 1, "float32 or float64"),
        (12, [(0, 7, 2), (4, 7, 3), (10, 7, 4)], 1, "exceeds stride"),
        (16, [(0, 7, 2), (4, 7, 3), (8, 7, 4), (12, 4, 1)], 1, "colour"),
        (12, [(0, 7, 2), (4, 7, 3), (8, 7, 4)], 0, "threads"),
        (0, [(0, 7, 2), (4, 7, 3), (8, 7, 4)], 1, "stride"),
        (12, [(0, 7, 2), (4, 7, 3), [8, 7, 4]], 1, "tuple"),
    ],
)
def test_native_rejects_bad_tables(
    stride: int, fields: list[tuple[int, int, int]], threads: int, match: str
) -> None:
    if available_backends()["c"] is not None:
        pytest.skip(f"c backend unavailable: {available_backends()['c']}")
    from bridge.decimate import _native

    data = np.zeros(4 * max(stride, 1), dtype=np.uint8).tobytes()
    with pytest.raises(ValueError, match=match):
        _native.downsample(data, stride, fields, 0.1, threads)


def test_native_scratch_controls() -> None:
    if available_backends()["c"] is not None:
        pytest.skip(f"c backend unavailable: {available_backends()['c']}")
    from bridge.decimate import _native

    old = _native.scratch_keep()
    try:
        assert _native.scratch_keep(0) == old
        assert _native.scratch_keep(None) == 0
        data = np.random.default_rng(0).normal(0, 5, (200_000, 3)).astype(np.float32).tobytes()
        want, _ = downsample_packed(XYZ32, data, 0.1)
        c = get_decimator("c")
        assert c.downsample(XYZ32, data, 0.1).data == want  # scratch freed after the call
        _native.scratch_keep(old)
        assert c.downsample(XYZ32, data, 0.1).data == want  # scratch kept
        _native.release_scratch()
        assert c.downsample(XYZ32, data, 0.1).data == want
        with pytest.raises(ValueError):
            _native.scratch_keep(-1)
    finally:
        _native.scratch_keep(old)


def test_c_releases_the_gil() -> None:
    """While a big C decimation runs in another thread, this thread keeps running Python."""
    if available_backends()["c"] is not None:
        pytest.skip(f"c backend unavailable: {available_backends()['c']}")
    data = np.random.default_rng(4).normal(0, 50, (3_000_000, 3)).astype(np.float32).tobytes()
    c = get_decimator("c", threads=1)
    c.downsample(XYZ32, data, 0.1)  # warm (scratch, first touch)
    done = threading.Event()
    span: list[float] = []

    def work() -> None:
        start = time.perf_counter()
        c.downsample(XYZ32, data, 0.1)
        span.append(time.perf_counter() - start)
        done.set()

    worker = threading.Thread(target=work)
    stamps = [time.perf_counter()]
    worker.start()
    while not done.is_set():
        stamps.append(time.perf_counter())
    worker.join()
    longest_pause = max(np.diff(stamps))
    assert longest_pause < 0.6 * span[0], (longest_pause, span[0])


# ---- keys spanning more than 2^63 (the int64 min-shift wraps) ----

#: float32 values whose keys at voxel 0.05 lie within int64 but span more than 2^63 together.
WIDE = [4e17, -4e17, 3.5e17, -3e17, 1.0, -1.0, 0.0, 2e17, -2e17]


@st.composite
def wide_clouds(draw: st.DrawFn) -> tuple[str, bytes, float]:
    name = draw(st.sampled_from(["xyz32", "rich32"]))
    n = draw(st.integers(2, 24))
    xyz = draw(hnp.arrays(np.float32, (n, 3), elements=st.sampled_from(WIDE)))
    xyz[0, 0], xyz[1, 0] = 4e17, -4e17  # at least one axis spans > 2^63 keys
    seed = draw(st.integers(0, 2**32 - 1))
    return name, pack(LAYOUTS[name], xyz, np.random.default_rng(seed)), 0.05


@SETTINGS
@given(wide_clouds())
def test_reference_orders_keys_spanning_more_than_2_63(cloud: tuple[str, bytes, float]) -> None:
    """floor(+-4e17 / 0.05) fit int64 but their difference does not: order must still hold."""
    name, data, voxel = cloud
    layout = LAYOUTS[name]
    got, _ = downsample_packed(layout, data, voxel)
    assert_same_cloud(layout, got, oracle(layout, data, voxel), rtol=1e-12)


@SETTINGS
@given(cloud=wide_clouds())
def test_backend_orders_keys_spanning_more_than_2_63(
    decimator: Decimator, cloud: tuple[str, bytes, float]
) -> None:
    name, data, voxel = cloud
    layout = LAYOUTS[name]
    got = decimator.downsample(layout, data, voxel)
    assert_same_cloud(layout, got.data, oracle(layout, data, voxel))
