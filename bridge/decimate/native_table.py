"""The field table the native kernels take: (offset, type code, role) per field.

Shared by the C (``_native``) and CUDA (ctypes) backends; roles are ``SBV_ROLE_*`` in
native/simbridge_voxel.h.
"""

from __future__ import annotations

from bridge.decimate._types import per_layout
from bridge.protocol.cloud import XYZ, CloudLayout

#: Field roles in the kernel's field table (native/simbridge_voxel.h, ``SBV_ROLE_*``).
ROLE_VALUE, ROLE_COLOR, ROLE_X, ROLE_Y, ROLE_Z = 0, 1, 2, 3, 4


@per_layout
def field_table(layout: CloudLayout) -> tuple[tuple[int, int, int], ...]:
    """(offset, type code, role) per field, as the C ABI takes them."""
    axis_role = {a: ROLE_X + i for i, a in enumerate(XYZ)}
    return tuple(
        (
            f.offset,
            int(f.type),
            axis_role.get(f.name, ROLE_COLOR if f.is_packed_color else ROLE_VALUE),
        )
        for f in layout.fields
    )
