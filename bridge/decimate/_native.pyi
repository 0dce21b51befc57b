"""Type stub for the compiled C glue (native/voxel_module.c)."""

from collections.abc import Sequence

from typing_extensions import Buffer

#: Number of kernel threads the machine suggests (online CPUs).
def cpu_count() -> int: ...
def downsample(
    data: Buffer,
    stride: int,
    fields: Sequence[tuple[int, int, int]],
    voxel_size: float,
    threads: int = 1,
) -> tuple[bytes, int]:
    """Decimate packed points; (offset, type, role) per field; releases the GIL.

    Raises ValueError for bad arguments, OverflowError when a voxel key leaves int64,
    MemoryError when buffers cannot be allocated.
    """
