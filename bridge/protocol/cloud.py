"""Point-cloud layout: validation of packed fields and zero-copy NumPy views (sans-I/O).

A cloud on the wire is ROS ``PointCloud2``-shaped: ``point_stride`` bytes per point, a list of
packed fields (name, byte offset, scalar type), little-endian ``data``. This module turns the
protobuf description into a validated :class:`CloudLayout` and gives NumPy views onto the bytes
without copying them. Every backend of :mod:`bridge.decimate` consumes these types.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from bridge.protocol.errors import InvalidLayout, TooManyPoints


class FieldType(enum.IntEnum):
    """Scalar types of a packed field; values match ``bridge.v1.FieldType`` and PointCloud2."""

    INT8 = 1
    UINT8 = 2
    INT16 = 3
    UINT16 = 4
    INT32 = 5
    UINT32 = 6
    FLOAT32 = 7
    FLOAT64 = 8

    @property
    def dtype(self) -> np.dtype[np.generic]:
        return np.dtype(_DTYPES[self])

    @property
    def size(self) -> int:
        return _SIZES[self]

    @property
    def is_float(self) -> bool:
        return self in (FieldType.FLOAT32, FieldType.FLOAT64)


_DTYPES = {
    FieldType.INT8: "<i1",
    FieldType.UINT8: "<u1",
    FieldType.INT16: "<i2",
    FieldType.UINT16: "<u2",
    FieldType.INT32: "<i4",
    FieldType.UINT32: "<u4",
    FieldType.FLOAT32: "<f4",
    FieldType.FLOAT64: "<f8",
}
# Looked up per field while a layout is validated: a dict, not an enum call and a np.dtype each.
_SIZES = {t: np.dtype(code).itemsize for t, code in _DTYPES.items()}
_BY_CODE = {int(t): t for t in FieldType}

#: The most fields a cloud may declare unless a limit says otherwise (``max_cloud_fields``).
#: Validating a layout is Python work per field and a field costs ~10 wire bytes, so without a
#: bound one 16 MiB message declared ~1M fields and held the event loop for seconds.
MAX_CLOUD_FIELDS = 256

#: Field names whose 4 bytes are packed colour channels (averaged per channel, not as a number).
PACKED_COLOR_NAMES = frozenset({"rgb", "rgba"})
XYZ = ("x", "y", "z")


@dataclass(frozen=True, slots=True)
class FieldSpec:
    name: str
    offset: int
    type: FieldType

    @property
    def end(self) -> int:
        return self.offset + self.type.size

    @property
    def is_packed_color(self) -> bool:
        return self.name in PACKED_COLOR_NAMES and self.type.size == 4


@dataclass(frozen=True, slots=True)
class CloudLayout:
    """A validated point record layout: stride and non-overlapping fields, x/y/z floats."""

    stride: int
    fields: tuple[FieldSpec, ...]

    def field(self, name: str) -> FieldSpec:
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(name)

    @property
    def structured_dtype(self) -> np.dtype[np.void]:
        """A NumPy structured dtype with the exact offsets and itemsize of the wire layout."""
        return np.dtype(
            {
                "names": [f.name for f in self.fields],
                "formats": [f.type.dtype for f in self.fields],
                "offsets": [f.offset for f in self.fields],
                "itemsize": self.stride,
            }
        )


def make_layout(
    stride: int, fields: Sequence[tuple[str, int, int]], max_fields: int = MAX_CLOUD_FIELDS
) -> CloudLayout:
    """Validate ``(name, offset, type)`` triples against ``stride``; raise InvalidLayout on error.

    Rules: at most ``max_fields`` fields (checked first, before any work per field); stride > 0;
    each type known; names unique and non-empty; every field inside the stride; no two fields
    overlap; x, y and z present and floating point (float32 or float64). O(n log n) in fields.
    """
    check_field_count(len(fields), max_fields)
    if stride <= 0:
        raise InvalidLayout(f"point_stride must be > 0, got {stride}")
    by_name: dict[str, FieldSpec] = {}
    for name, offset, type_code in fields:
        if not name:
            raise InvalidLayout("field with an empty name")
        if name in by_name:
            raise InvalidLayout(f"field {name!r} appears twice")
        ftype = _BY_CODE.get(type_code)
        if ftype is None:
            raise InvalidLayout(f"field {name!r} has unknown type {type_code}")
        offset = int(offset)
        if offset < 0 or offset + _SIZES[ftype] > stride:
            raise InvalidLayout(
                f"field {name!r} at offset {offset} ({_SIZES[ftype]} bytes) exceeds stride {stride}"
            )
        by_name[name] = FieldSpec(name, offset, ftype)
    specs = tuple(by_name.values())
    ordered = sorted(specs, key=_offset)
    for a, b in itertools.pairwise(ordered):
        if b.offset < a.offset + _SIZES[a.type]:
            raise InvalidLayout(f"fields {a.name!r} and {b.name!r} overlap")
    for axis in XYZ:
        spec = by_name.get(axis)
        if spec is None:
            raise InvalidLayout(f"required field {axis!r} is missing")
        if not spec.type.is_float:
            raise InvalidLayout(f"field {axis!r} must be float32 or float64")
    return CloudLayout(stride=stride, fields=specs)


def check_field_count(count: int, max_fields: int) -> None:
    """Refuse a cloud of more than ``max_fields`` fields (INVALID_LAYOUT): cheap, so callers
    run it before anything that costs per field."""
    if count > max_fields:
        raise InvalidLayout(f"cloud declares more than max_cloud_fields = {max_fields} fields")


def _offset(spec: FieldSpec) -> int:
    return spec.offset


def point_count(layout: CloudLayout, nbytes: int, max_points: int | None = None) -> int:
    """Number of points in ``nbytes`` of data; the length must be a whole number of strides."""
    if nbytes % layout.stride:
        raise InvalidLayout(
            f"data length {nbytes} is not a multiple of point_stride {layout.stride}"
        )
    n = nbytes // layout.stride
    if max_points is not None and n > max_points:
        raise TooManyPoints(f"{n} points exceed the limit of {max_points}")
    return n


def records(layout: CloudLayout, data: bytes | memoryview) -> npt.NDArray[np.void]:
    """Zero-copy structured view of ``data`` (read-only when ``data`` is bytes)."""
    n = point_count(layout, len(data))
    return np.frombuffer(data, dtype=layout.structured_dtype, count=n)


def field_view(layout: CloudLayout, data: bytes | memoryview, name: str) -> npt.NDArray[np.generic]:
    """Zero-copy strided 1-D view of one field."""
    spec = layout.field(name)
    n = point_count(layout, len(data))
    if n == 0:  # NumPy refuses a strided view into an empty buffer
        return np.empty(0, dtype=spec.type.dtype)
    base = np.frombuffer(data, dtype=np.uint8)
    return np.ndarray(
        shape=(n,), dtype=spec.type.dtype, buffer=base, offset=spec.offset, strides=(layout.stride,)
    )


def xyz_view(layout: CloudLayout, data: bytes | memoryview) -> npt.NDArray[np.floating]:
    """Zero-copy (n, 3) view when x, y, z are consecutive and share a dtype; else an (n, 3) copy."""
    fx, fy, fz = (layout.field(a) for a in XYZ)
    n = point_count(layout, len(data))
    if n == 0:
        return np.empty(
            (0, 3), dtype=fx.type.dtype if fx.type == fy.type == fz.type else np.float64
        )
    if fx.type == fy.type == fz.type and fy.offset == fx.end and fz.offset == fy.end:
        base = np.frombuffer(data, dtype=np.uint8)
        return np.ndarray(
            shape=(n, 3),
            dtype=fx.type.dtype,
            buffer=base,
            offset=fx.offset,
            strides=(layout.stride, fx.type.size),
        )
    return np.stack([field_view(layout, data, a).astype(np.float64) for a in XYZ], axis=1)
