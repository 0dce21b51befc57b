"""Type stub for the compiled C glue (native/voxel_module.c)."""

from collections.abc import Sequence

from typing_extensions import Buffer

ABI_VERSION: int

def cpu_count() -> int:
    """Online CPUs (a default for the kernel's thread count)."""

def scratch_keep(bytes: int | None = None, /) -> int:
    """Set the per-thread cached scratch limit in bytes (None: only read); returns the old one."""

def hash_voxels_max(voxels: int | None = None, /) -> int:
    """Set the one-thread hash path's voxel limit (0: never; None: only read); returns the old
    one. The output is the same either way: for tests and tuning."""

def frame_guesses(reset: bool = False, /) -> tuple[int, int]:
    """This thread's calls that skipped the bounds pass with a key frame guessed from the
    estimate's sample, and those of them where a point fell outside it (then the bounds pass
    ran after all); ``reset`` clears the back-off after misses. The output is the same either
    way: for tests."""

def release_scratch() -> None:
    """Free the calling thread's cached kernel scratch memory."""

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

def downsample_into(
    data: Buffer,
    stride: int,
    fields: Sequence[tuple[int, int, int]],
    voxel_size: float,
    out: Buffer,
    threads: int = 1,
) -> int:
    """Decimate into the writable ``out`` (>= len(data) bytes); returns the record count."""
