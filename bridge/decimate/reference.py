"""The NumPy reference decimator: the readable statement of the contract (docs/design.md §3).

Every other backend is tested against this module. It is also the always-available fallback,
so it avoids ``np.unique`` (a sort plus several passes) and per-voxel Python loops:

1. drop points whose x, y or z is not finite;
2. ``k = floor(p / voxel_size)`` per axis (in float32 for float32 clouds, as Open3D does),
   refused with :class:`VoxelKeyOverflow` outside the int64 range;
3. one linear key per point from the per-axis spans (lexicographic order preserved); when the
   grid is small (at most ~4 cells per point) a ``np.bincount`` over cells numbers the voxels
   with no sort at all, otherwise the point index goes into the key's low bits so a plain
   ``np.sort`` is a stable argsort;
4. per-voxel sums with ``np.bincount`` in input order (float64), means, integer rounding.

Summing in input order within each voxel is what the C kernel does too, so the two agree
to the last bit on x, y, z and float fields.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from bridge.decimate._types import VoxelKeyOverflow, check_voxel_size, keys_in_float32
from bridge.protocol.cloud import XYZ, CloudLayout, FieldSpec, make_layout, point_count

_INT64_LIMIT = 2.0**63  # keys must lie in [-2**63, 2**63)

IntArray = npt.NDArray[np.intp]


class Bins:
    """Which voxel each kept point falls in; voxels numbered in key order."""

    __slots__ = ("_order", "counts", "inverse", "kept")

    def __init__(
        self,
        kept: IntArray | None,
        inverse: IntArray,
        counts: npt.NDArray[np.int64],
        order: IntArray | None = None,
    ) -> None:
        self.kept = kept  #: input index of each kept (finite) point; None when all are kept
        self.inverse = inverse  #: voxel number of each kept point, in input order
        self.counts = counts  #: points per voxel
        self._order = order

    @property
    def voxels(self) -> int:
        return len(self.counts)

    @property
    def order(self) -> IntArray:
        """Kept-point positions sorted by (voxel, input position); computed on first use."""
        if self._order is None:
            self._order = np.argsort(self.inverse, kind="stable")
        return self._order

    @property
    def starts(self) -> IntArray:
        """First position in ``order`` of each voxel."""
        return np.concatenate(([0], np.cumsum(self.counts)[:-1])).astype(np.intp)


def as_byte_buffer(data: bytes | bytearray | memoryview) -> bytes | memoryview:
    """A view whose ``len`` counts bytes (a memoryview of another format counts items)."""
    if isinstance(data, bytearray):
        data = memoryview(data)
    if isinstance(data, memoryview):
        if not data.c_contiguous:
            raise ValueError("point data must be a C-contiguous buffer")
        return data if data.format == "B" and data.ndim == 1 else data.cast("B")
    if isinstance(data, bytes):
        return data
    raise ValueError(f"point data must be bytes or a memoryview, got {type(data).__name__}")


def bin_points(xyz: npt.NDArray[np.floating], voxel_size: float, float32_keys: bool) -> Bins:
    """Assign finite points of an (n, 3) array to voxels sorted by (kx, ky, kz)."""
    return bin_columns([xyz[:, i] for i in range(3)], voxel_size, float32_keys)


def _overflow(voxel_size: float, cols: list[npt.NDArray[np.floating]]) -> VoxelKeyOverflow:
    lo = min(float(c.min()) for c in cols)
    hi = max(float(c.max()) for c in cols)
    return VoxelKeyOverflow(
        f"voxel index floor(p / {voxel_size!r}) exceeds the int64 range "
        f"(coordinates span {lo!r}..{hi!r}); use a larger voxel_size"
    )


def bin_columns(
    cols: list[npt.NDArray[np.floating]], voxel_size: float, float32_keys: bool
) -> Bins:
    """Like :func:`bin_points` on three 1-D coordinate arrays (x, y, z).

    Works on contiguous columns: NumPy reductions over axis 0 of an (n, 3) array are an
    order of magnitude slower than over three flat arrays.
    """
    ftype = np.dtype(np.float32 if float32_keys else np.float64)
    cols = [np.asarray(c, dtype=ftype) for c in cols]
    finite = np.isfinite(cols[0]) & np.isfinite(cols[1]) & np.isfinite(cols[2])
    kept: IntArray | None = None
    if not finite.all():
        kept = np.flatnonzero(finite)
        cols = [c[kept] for c in cols]
    n = len(cols[0])
    if n == 0:
        return Bins(kept, np.zeros(0, dtype=np.intp), np.zeros(0, dtype=np.int64))
    scale = np.asarray(voxel_size, dtype=ftype)
    keys: list[npt.NDArray[np.int64]] = []
    spans: list[int] = []
    for c in cols:
        q = np.floor(c / scale)
        lo, hi = float(q.min()), float(q.max())
        if lo < -_INT64_LIMIT or hi >= _INT64_LIMIT:
            raise _overflow(voxel_size, cols)
        k = q.astype(np.int64)
        spans.append(int(hi) - int(lo) + 1)
        # k - lo lies in [0, span) with span <= 2**64: exact modulo 2**64, so read as uint64
        # (a span above 2**63 wraps negative as int64 and would break the order).
        k -= int(lo)
        keys.append(k)
    total = spans[0] * spans[1] * spans[2]
    if total > 2**62:
        # Spans too wide for one int64: lexsort on the three unsigned offsets (exact).
        u = [k.view(np.uint64) for k in keys]
        order = np.lexsort((u[2], u[1], u[0]))
        new = np.empty(n, dtype=bool)
        new[0] = True
        new[1:] = (
            (np.diff(keys[0][order]) != 0)
            | (np.diff(keys[1][order]) != 0)
            | (np.diff(keys[2][order]) != 0)
        )
        return _from_sorted(kept, order, new)
    # Mixed-radix linear key: same order as (kx, ky, kz).
    lin = keys[0]
    lin *= spans[1] * spans[2]
    keys[1] *= spans[2]
    lin += keys[1]
    lin += keys[2]
    if total <= max(4 * n, 1 << 16):
        # Dense grid: count per cell, no sort at all (cells come out in key order).
        per_cell = np.bincount(lin, minlength=total)
        occupied = per_cell > 0
        voxel_of_cell = np.cumsum(occupied, dtype=np.intp) - 1
        return Bins(kept, voxel_of_cell[lin], per_cell[occupied].astype(np.int64))
    idx_bits = max(1, (n - 1).bit_length())
    if (total - 1).bit_length() + idx_bits <= 63:
        # Point index in the low bits: a plain sort is then a stable argsort.
        lin <<= idx_bits
        lin |= np.arange(n, dtype=np.int64)
        lin.sort()
        order = (lin & ((1 << idx_bits) - 1)).astype(np.intp)
        lin >>= idx_bits
        sorted_keys = lin
    else:
        order = np.argsort(lin, kind="stable")
        sorted_keys = lin[order]
    new = np.empty(n, dtype=bool)
    new[0] = True
    np.not_equal(sorted_keys[1:], sorted_keys[:-1], out=new[1:])
    return _from_sorted(kept, order, new)


def _from_sorted(kept: IntArray | None, order: IntArray, new: npt.NDArray[np.bool_]) -> Bins:
    """Bins from a key-sorted permutation and its "first of a voxel" flags."""
    n = len(order)
    starts = np.flatnonzero(new)
    segment = np.cumsum(new, dtype=np.intp) - 1
    inverse = np.empty(n, dtype=np.intp)
    inverse[order] = segment
    counts = np.diff(np.append(starts, n)).astype(np.int64)
    return Bins(kept, inverse, counts, order)


def _strided(
    buf: npt.NDArray[np.uint8], n: int, stride: int, spec: FieldSpec, dtype: np.dtype[np.generic]
) -> npt.NDArray[np.generic]:
    shape: tuple[int, ...] = (n,) if dtype.itemsize == spec.type.size else (n, 4)
    strides: tuple[int, ...] = (stride,) if len(shape) == 1 else (stride, 1)
    return np.ndarray(shape=shape, dtype=dtype, buffer=buf, offset=spec.offset, strides=strides)


def _round_mean(
    sums: npt.NDArray[np.int64], counts: npt.NDArray[np.int64]
) -> npt.NDArray[np.int64]:
    """sum / count rounded half away from zero, in exact integer arithmetic."""
    mag = (2 * np.abs(sums) + counts) // (2 * counts)
    return np.where(sums < 0, -mag, mag)


def _field_means(
    values: npt.NDArray[np.generic], spec: FieldSpec, bins: Bins
) -> npt.NDArray[np.generic]:
    """Per-voxel mean of one field's kept values (1-D, or (n, 4) uint8 for packed colour)."""
    m = bins.voxels
    if values.ndim == 2:  # packed colour: four uint8 channels, exact sums via bincount
        out = np.empty((m, 4), dtype=np.uint8)
        for c in range(4):
            s = np.bincount(bins.inverse, weights=values[:, c], minlength=m).astype(np.int64)
            out[:, c] = _round_mean(s, bins.counts)
        return out
    if spec.type.is_float:
        sums = np.bincount(bins.inverse, weights=values, minlength=m)
        return (sums / bins.counts).astype(spec.type.dtype)
    if spec.type.size <= 2:  # sums of <= 16-bit ints are exact in float64
        isums = np.bincount(bins.inverse, weights=values, minlength=m).astype(np.int64)
    else:
        isums = np.add.reduceat(values.astype(np.int64)[bins.order], bins.starts)
    return _round_mean(isums, bins.counts).astype(spec.type.dtype)


def downsample_packed(
    layout: CloudLayout, data: bytes | memoryview, voxel_size: float
) -> tuple[bytes, int]:
    """Decimate packed points; returns (packed output in the same layout, point count)."""
    buf_in = as_byte_buffer(data)
    f32 = keys_in_float32(layout)
    v = check_voxel_size(voxel_size, f32)
    n = point_count(layout, len(buf_in))
    if n == 0:
        return b"", 0
    raw = np.frombuffer(buf_in, dtype=np.uint8)
    stride = layout.stride
    axes = [layout.field(a) for a in XYZ]
    cols: list[npt.NDArray[np.floating]] = [
        _strided(raw, n, stride, a, a.type.dtype)  # type: ignore[misc]
        for a in axes
    ]
    # Overflow to inf (a huge p / voxel, refused just after) and inf - inf in a user's float
    # field are expected outcomes here, not bugs to warn about; the C kernel is silent too.
    with np.errstate(over="ignore", invalid="ignore"):
        bins = bin_columns(cols, v, f32)
        m = bins.voxels
        out = np.zeros(m * stride, dtype=np.uint8)
        for spec in layout.fields:
            dtype = np.dtype("u1") if spec.is_packed_color else spec.type.dtype
            values = _strided(raw, n, stride, spec, dtype)
            if bins.kept is not None:
                values = values[bins.kept]
            if m:
                _strided(out, m, stride, spec, dtype)[...] = _field_means(values, spec, bins)
    return out.tobytes(), m


def downsample_arrays(xyz: npt.NDArray[np.floating], voxel_size: float) -> npt.NDArray[np.floating]:
    """Decimate an (n, 3) float32/float64 array; returns an (m, 3) array of the same dtype."""
    if not isinstance(xyz, np.ndarray):
        raise ValueError(f"xyz must be a NumPy array, got {type(xyz).__name__}")
    if xyz.ndim != 2 or xyz.shape[1] != 3:
        raise ValueError(f"xyz must have shape (n, 3), got {xyz.shape}")
    if xyz.dtype not in (np.float32, np.float64):
        raise ValueError(f"xyz must be float32 or float64, got {xyz.dtype}")
    dt = np.dtype(xyz.dtype).newbyteorder("<")
    code = 7 if dt.itemsize == 4 else 8
    layout = make_layout(3 * dt.itemsize, [(a, i * dt.itemsize, code) for i, a in enumerate(XYZ)])
    packed, m = downsample_packed(layout, np.ascontiguousarray(xyz, dtype=dt).tobytes(), voxel_size)
    return np.frombuffer(packed, dtype=dt).reshape(m, 3).copy()
