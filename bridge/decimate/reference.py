"""The NumPy reference decimator: the readable statement of the contract (DESIGN.md §3).

Every other backend is tested against this module. It is also the always-available fallback,
so it avoids ``np.unique`` (a sort plus several passes) and per-voxel Python loops:

1. drop points whose x, y or z is not finite;
2. ``k = floor(p / voxel_size)`` per axis (in float32 for float32 clouds, as Open3D does),
   refused with :class:`VoxelKeyOverflow` outside the int64 range;
3. one linear key per point from the per-axis spans (lexicographic order preserved), with the
   point index packed into the low bits so a plain ``np.sort`` is a stable argsort;
4. per-voxel sums with ``np.bincount`` in input order (float64), means, integer rounding.

Summing in input order within each voxel is what the C kernel does too, so the two agree
to the last bit on x, y, z and float fields.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from bridge.cloud import XYZ, CloudLayout, FieldSpec, make_layout, point_count
from bridge.decimate._types import VoxelKeyOverflow, check_voxel_size, keys_in_float32

_INT64_LIMIT = 2.0**63  # keys must lie in [-2**63, 2**63)

IntArray = npt.NDArray[np.intp]


@dataclass(frozen=True, slots=True)
class Bins:
    """Which voxel each kept point falls in; voxels numbered in key order."""

    kept: IntArray | None  #: input index of each kept (finite) point; None when all are kept
    inverse: IntArray  #: voxel number of each kept point, in input order
    order: IntArray  #: kept-point positions sorted by (voxel, input position)
    starts: IntArray  #: first position in ``order`` of each voxel
    counts: npt.NDArray[np.int64]  #: points per voxel

    @property
    def voxels(self) -> int:
        return len(self.counts)


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
    finite = np.isfinite(xyz).all(axis=1)
    kept: IntArray | None = None
    if not finite.all():
        kept = np.flatnonzero(finite)
        xyz = xyz[kept]
    n = len(xyz)
    if n == 0:
        empty = np.zeros(0, dtype=np.intp)
        return Bins(kept, empty, empty, empty, np.zeros(0, dtype=np.int64))
    ftype = np.dtype(np.float32 if float32_keys else np.float64)
    q = np.floor(np.asarray(xyz, dtype=ftype) / np.asarray(voxel_size, dtype=ftype))
    lo, hi = q.min(axis=0), q.max(axis=0)
    if float(lo.min()) < -_INT64_LIMIT or float(hi.max()) >= _INT64_LIMIT:
        raise VoxelKeyOverflow(
            f"voxel index floor(p / {voxel_size!r}) exceeds the int64 range "
            f"(coordinates span {float(np.min(xyz))!r}..{float(np.max(xyz))!r}); "
            "use a larger voxel_size"
        )
    keys = q.astype(np.int64)
    kmin = [int(v) for v in lo]
    spans = [int(h) - int(v) + 1 for v, h in zip(lo, hi, strict=True)]
    total = spans[0] * spans[1] * spans[2]
    if total <= 2**62:
        # Mixed-radix linear key: same order as (kx, ky, kz); fits int64 by the check above.
        lin = (keys[:, 0] - kmin[0]) * (spans[1] * spans[2])
        lin += (keys[:, 1] - kmin[1]) * spans[2]
        lin += keys[:, 2] - kmin[2]
        idx_bits = max(1, (n - 1).bit_length())
        if (total - 1).bit_length() + idx_bits <= 63:
            packed = np.sort((lin << idx_bits) | np.arange(n, dtype=np.int64))
            order = (packed & ((1 << idx_bits) - 1)).astype(np.intp)
            sorted_keys = packed >> idx_bits
        else:
            order = np.argsort(lin, kind="stable")
            sorted_keys = lin[order]
        new = np.empty(n, dtype=bool)
        new[0] = True
        np.not_equal(sorted_keys[1:], sorted_keys[:-1], out=new[1:])
    else:
        # Spans too wide for one int64: lexsort on the three keys (slower, still exact).
        order = np.lexsort((keys[:, 2], keys[:, 1], keys[:, 0]))
        sk = keys[order]
        new = np.empty(n, dtype=bool)
        new[0] = True
        np.any(sk[1:] != sk[:-1], axis=1, out=new[1:])
    starts = np.flatnonzero(new)
    segment = np.cumsum(new, dtype=np.intp) - 1
    inverse = np.empty(n, dtype=np.intp)
    inverse[order] = segment
    counts = np.diff(np.append(starts, n)).astype(np.int64)
    return Bins(kept, inverse, order, starts, counts)


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
    if f32 and axes[1].offset == axes[0].end and axes[2].offset == axes[1].end:
        xyz: npt.NDArray[np.floating] = np.ndarray(
            shape=(n, 3), dtype="<f4", buffer=raw, offset=axes[0].offset, strides=(stride, 4)
        )
    else:
        xyz = np.stack(
            [_strided(raw, n, stride, s, s.type.dtype).astype(np.float64) for s in axes], axis=1
        )
    bins = bin_points(xyz, v, f32)
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
