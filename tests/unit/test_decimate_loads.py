"""The C kernel reads x, y, z four points at a time (native/cpu_internal.h, sbvi_load4): 16-byte
loads when x, y, z are consecutive floats, which run 4 bytes past z, and 4-byte loads otherwise.
Every layout, on the hash path and the radix path, must still give the NumPy reference's bytes,
and no load may touch a byte past the cloud (checked against a page the process cannot read).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bridge.decimate import available_backends, get_decimator
from bridge.decimate.reference import downsample_packed
from bridge.protocol.cloud import CloudLayout, make_layout
from tests.unit.test_decimate import SETTINGS, pack

pytestmark = pytest.mark.skipif(
    available_backends()["c"] is not None, reason=f"c backend: {available_backends()['c']}"
)

LAYOUTS: dict[str, CloudLayout] = {
    #: lidar records: the 16-byte load of the last point would end 4 bytes past the cloud
    "xyz32": make_layout(12, [("x", 0, 7), ("y", 4, 7), ("z", 8, 7)]),
    #: x, y, z apart and out of order, one colour: 4-byte loads, the colour loop
    "spaced32": make_layout(24, [("y", 0, 7), ("rgb", 4, 6), ("x", 8, 7), ("z", 16, 7)]),
    #: consecutive x, y, z that end the record: the 16-byte load reads the next record's colour
    "xyz_at4": make_layout(16, [("rgb", 0, 6), ("x", 4, 7), ("y", 8, 7), ("z", 12, 7)]),
    #: x, y, z then 4 bytes no field covers
    "xyz_pad": make_layout(16, [("x", 0, 7), ("y", 4, 7), ("z", 8, 7)]),
    #: the RGB-D frame layout: the colour is lane 3 of the 16-byte load
    "xyzrgb": make_layout(16, [("x", 0, 7), ("y", 4, 7), ("z", 8, 7), ("rgb", 12, 6)]),
}


def sweep(n: int, rng: np.random.Generator, holes: float, scatter: bool) -> np.ndarray:
    """An organized-like sweep (runs of points in one voxel, NaN holes) or scattered points."""
    if scatter:
        xyz = rng.normal(0, 5, (n, 3))
    else:
        t = np.linspace(0, 30, n)
        xyz = np.stack([np.cos(t) * t, np.sin(t) * t, rng.normal(0, 0.3, n)], axis=1)
    xyz[rng.random(n) < holes] = np.nan
    return xyz.astype(np.float32)


def c_bytes(layout: CloudLayout, data: bytes | memoryview, voxel: float, hash_max: int) -> bytes:
    from bridge.decimate import _native

    old = _native.hash_voxels_max(hash_max)
    try:
        return get_decimator("c").downsample(layout, data, voxel).data
    finally:
        _native.hash_voxels_max(old)


@SETTINGS
@given(
    name=st.sampled_from(sorted(LAYOUTS)),
    n=st.integers(1, 9_000),
    seed=st.integers(0, 2**32 - 1),
    holes=st.sampled_from([0.0, 0.1, 0.5]),
    scatter=st.booleans(),
    voxel=st.sampled_from([0.05, 0.5, 2.0]),
)
def test_every_layout_both_paths(
    name: str, n: int, seed: int, holes: float, scatter: bool, voxel: float
) -> None:
    """Groups of four and the tail (any n), runs and holes, hash path and radix path."""
    layout = LAYOUTS[name]
    rng = np.random.default_rng(seed)
    data = pack(layout, sweep(n, rng, holes, scatter), rng)
    want, _ = downsample_packed(layout, data, voxel)
    assert c_bytes(layout, data, voxel, 1 << 30) == want
    assert c_bytes(layout, data, voxel, 0) == want


GUARDED = textwrap.dedent(
    """
    import ctypes, mmap, sys
    import numpy as np
    from bridge.decimate import _native, get_decimator
    from bridge.decimate.reference import downsample_packed
    from tests.unit.test_decimate import pack
    from tests.unit.test_decimate_loads import LAYOUTS, sweep

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    PAGE = mmap.PAGESIZE
    name, n, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    layout = LAYOUTS[name]
    rng = np.random.default_rng(n)
    data = pack(layout, sweep(n, rng, 0.1, False), rng)
    pages = -(-len(data) // PAGE)
    mem = mmap.mmap(-1, (pages + 1) * PAGE)
    base = ctypes.addressof(ctypes.c_char.from_buffer(mem))
    assert libc.mprotect(base + pages * PAGE, PAGE, 0) == 0  # PROT_NONE after the cloud
    end = pages * PAGE
    mem[end - len(data) : end] = data
    view = memoryview(mem)[end - len(data) : end]
    want, _ = downsample_packed(layout, data, 0.05)
    for hash_max in (1 << 30, 0):
        _native.hash_voxels_max(hash_max)
        got = get_decimator("c", threads=threads).downsample(layout, view, 0.05).data
        assert got == want, (name, n, threads, hash_max)
    print("ok")
    """
)


@pytest.mark.parametrize(
    ("name", "n", "threads"),
    [
        ("xyz32", 4_000, 1),
        ("xyz32", 4_001, 1),
        ("xyz_at4", 4, 1),
        ("xyz_at4", 4_000, 1),
        ("xyz_pad", 4_003, 1),
        ("spaced32", 1_000, 1),
        ("xyz32", 40_000, 2),
        ("xyz_at4", 40_002, 2),
    ],
)
def test_no_load_past_the_cloud(name: str, n: int, threads: int) -> None:
    """The cloud ends where a page the process may not read begins: a load past its last byte
    would kill the child process (SIGSEGV) instead of printing "ok". Point counts divisible by
    four put the last point in a group of four, read with a 16-byte load unless guarded."""
    run = subprocess.run(
        [sys.executable, "-c", GUARDED, name, str(n), str(threads)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0 and run.stdout.strip() == "ok", (run.returncode, run.stderr[-2000:])


SSE2_ONLY = textwrap.dedent(
    """
    import numpy as np
    from bridge.decimate.reference import downsample_packed
    from tests.unit.test_decimate import pack
    from tests.unit.test_decimate_loads import LAYOUTS, c_bytes, sweep

    for seed in range(12):
        for name, layout in sorted(LAYOUTS.items()):
            rng = np.random.default_rng(seed)
            n = int(rng.integers(1, 9_000))
            data = pack(layout, sweep(n, rng, (0.0, 0.1, 0.5)[seed % 3], seed % 4 == 3), rng)
            for voxel in (0.05, 0.5, 2.0):
                want, _ = downsample_packed(layout, data, voxel)
                for hash_max in (1 << 30, 0):
                    assert c_bytes(layout, data, voxel, hash_max) == want, (name, seed, voxel)
    print("ok")
    """
)


def test_sse2_pass_where_avx2_is_not_used() -> None:
    """The hash pass has an eight-point AVX2 version, taken where the CPU has AVX2; the
    SSE2 version (every x86-64 CPU) must give the same bytes: forced in a child process."""
    env = {**os.environ, "SBV_NO_AVX2": "1"}
    run = subprocess.run(
        [sys.executable, "-c", SSE2_ONLY], capture_output=True, text=True, timeout=300, env=env
    )
    assert run.returncode == 0 and run.stdout.strip() == "ok", (run.returncode, run.stderr[-2000:])
