"""Predictive coding of quantized x, y, z in scan order (sans-I/O, integers only).

Why: a lidar's points come in scan order, neighbours lie on the same smooth surface, and a
lidar's noise is along the ray (range), not across it. Plain deltas pay for both the surface's
slope and the noise on every axis; here every point is predicted from points already decoded
and only the surprise is coded:

- *Base*: every ``2**levels``-th point, each axis predicted by linear extrapolation from the
  two base points before it (second differences, zero before the first).
- *Levels* 1 .. ``levels``: the points halfway between two decoded ones, ``h`` apart, are
  predicted as the midpoint of those two (``floor((left + right) / 2)``; ``left`` alone at the
  end of the cloud). The residual along the prediction's largest axis ``m`` is coded as is;
  the other two axes are predicted to move along the ray, by ``round(e_m * p_k / p_m)`` on top
  of the midpoint, clamped to ±(2**30 - 1), so range noise is paid for once, not three times.

Everything is integer arithmetic (int32 coordinates, int64 products) that every platform
evaluates identically (no floats), so the decoder rebuilds exactly the quantized values the
encoder saw: decoded coordinates stay within
``step / 2`` whatever the order or content of the cloud (scan order only makes it smaller).
Decoding is vectorized per level (``levels + 1`` passes), not a loop over points.

Layout of the (uncompressed) block: the base's zigzag second differences for x, y, z, each as
8 byte planes (``8 * 3 * ceil(n / 2**levels)`` bytes), then per level, for slots "major",
"next axis", "axis after that" (axes ``m``, ``m+1``, ``m+2`` mod 3), zigzag residuals as 4 byte
planes (12 bytes per point of the level).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

#: |q| must stay below this, so that every level residual is a zigzag u32.
MAX_QUANTUM = 1 << 30
DEFAULT_LEVELS = 4
MAX_LEVELS = 16

I64 = npt.NDArray[np.int64]
I32 = npt.NDArray[np.int32]
Ints = npt.NDArray[np.signedinteger[Any]]


def block_bytes(n: int, levels: int) -> int:
    """Size of the uncompressed block for ``n`` points."""
    base = -(-n // (1 << levels))
    return 24 * base + 12 * (n - base)


def encode(axes: Ints, levels: int) -> bytes:
    """The block for quantized points: ``axes`` is x, y, z (shape (3, n)), |q| < 2**30."""
    stride = 1 << levels
    axes = axes.astype(np.int32)  # |q| < 2**30: values, midpoints and r0 fit; products do not
    parts = []
    for a in range(3):
        base = axes[a, ::stride].astype(np.int64)
        second = np.diff(base, n=2, prepend=np.zeros(2, np.int64))
        parts.append(to_planes(_zigzag(second), 8))
    for h in _halves(levels):
        p = _midpoint(axes, h)
        if not p.shape[1]:
            continue
        pos, ps = _slots(p)
        v = np.ascontiguousarray(axes[:, h :: 2 * h]).ravel()
        major = v[pos[0]].astype(np.int64) - ps[0]
        parts.append(to_planes(_zigzag(major).astype(np.uint32), 4))
        for pk, minor in zip(pos[1:], _along_ray(ps, major), strict=True):
            parts.append(to_planes(_zigzag(v[pk] - minor).astype(np.uint32), 4))
    return b"".join(parts)


def decode(block: npt.NDArray[np.uint8], n: int, levels: int) -> I32:
    """Quantized x, y, z (shape (3, n), int32) from a block of ``block_bytes(n, levels)``
    bytes. A block that no encoder wrote decodes to some values, never to an error."""
    stride = 1 << levels
    nb = -(-n // stride)
    axes = np.empty((3, n), np.int32)
    at = 0
    for a in range(3):
        second = _unzigzag(from_planes(block[at : at + 8 * nb], nb, 8))
        at += 8 * nb
        axes[a, ::stride] = np.cumsum(np.cumsum(second))
    for h in _halves(levels):
        p = _midpoint(axes, h)
        k = p.shape[1]
        if not k:
            continue
        slots = []
        for _ in range(3):
            slots.append(_unzigzag(from_planes(block[at : at + 4 * k], k, 4)))
            at += 4 * k
        pos, ps = _slots(p)
        out = np.empty((3, k), np.int32)
        flat = out.ravel()
        flat[pos[0]] = ps[0] + slots[0]
        for j, minor in zip((1, 2), _along_ray(ps, slots[0]), strict=True):
            flat[pos[j]] = minor + slots[j]
        axes[:, h :: 2 * h] = out
    return axes


def _halves(levels: int) -> list[int]:
    """The distance ``h`` to the two decoded neighbours, level by level."""
    return [(1 << levels) >> level for level in range(1, levels + 1)]


def _midpoint(axes: Ints, h: int) -> Ints:
    """Predictions (3, k) for points h, 3h, 5h, ...: the midpoint of the points h before and
    h after (the one before alone past the end)."""
    left = axes[:, 0 : max(0, axes.shape[1] - h) : 2 * h]
    right = axes[:, 2 * h :: 2 * h]
    out = left.copy()
    k = right.shape[1]
    out[:, :k] = (left[:, :k] + right) >> 1
    return out


def _slots(p: Ints) -> tuple[list[npt.NDArray[np.intp]], list[Ints]]:
    """Per point, the flat positions in a (3, k) array of axes m, m+1, m+2 (mod 3), with m
    the axis where the prediction ``p`` is largest, and ``p`` at those positions."""
    a = np.abs(p)
    x_wins = a[0] >= a[1]
    # m = 0 where x is largest, 1 where y is (and x is not), else 2
    m = 2 - 2 * (x_wins & (a[0] >= a[2])).astype(np.intp) - (~x_wins & (a[1] >= a[2]))
    k = p.shape[1]
    first = m * k
    first += np.arange(k)
    wrap = 3 * k
    pos = [first, first + k - wrap * (m == 2), first - k + wrap * (m == 0)]
    flat = p.ravel()
    return pos, [flat[x] for x in pos]


def _along_ray(ps: list[Ints], major: I64) -> list[I64]:
    """Predictions of the two minor axes: the midpoint ``ps`` moved by ``major`` along its
    ray, ``round(major * p_k / p_m)`` in integers (|major| < 2**31, |p| < 2**30: no
    overflow), clamped so that the residuals stay zigzag u32."""
    pm = ps[0]
    den = np.abs(pm)
    den2 = np.maximum(2 * den, 1)  # p == 0 (all axes): every product is 0, so is the shift
    signed = np.where(pm < 0, -major, major)
    out = []
    for pk in ps[1:]:
        shift = signed * pk
        shift *= 2
        shift += den
        shift //= den2
        shift += pk
        np.minimum(shift, MAX_QUANTUM - 1, out=shift)
        np.maximum(shift, 1 - MAX_QUANTUM, out=shift)
        out.append(shift)
    return out


def _zigzag(d: I64) -> npt.NDArray[np.uint64]:
    return ((d << 1) ^ (d >> 63)).view(np.uint64)


def _unzigzag(z: npt.NDArray[np.uint64]) -> I64:
    u = z.astype(np.uint64, copy=False)
    one = np.uint64(1)
    return (u >> one).view(np.int64) ^ -((u & one).view(np.int64))


def to_planes(values: npt.NDArray[np.unsignedinteger[Any]], width: int) -> bytes:
    """The byte planes of little-endian unsigned ``values`` (shifts, no transpose)."""
    if width == 1:
        return values.tobytes()
    return b"".join((values >> np.uint8(8 * k)).astype(np.uint8).tobytes() for k in range(width))


def from_planes(planes: npt.NDArray[np.uint8], n: int, width: int) -> npt.NDArray[np.uint64]:
    """Little-endian ``width``-byte integers from their byte planes (shifts, no transpose),
    in the unsigned type of that width."""
    utype = np.dtype(f"<u{width}")
    rows = planes.reshape(width, n)
    acc: npt.NDArray[np.uint64] = rows[0].astype(utype)
    for k in range(1, width):
        acc |= rows[k].astype(utype) << np.uint8(8 * k)
    return acc
