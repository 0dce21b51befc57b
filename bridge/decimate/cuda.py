"""The CUDA backend: ``_sbv_cuda.so`` (native/voxel_cuda.cu) loaded through ctypes.

Why ctypes rather than linking the CUDA runtime into ``_native``: the C extension must import
on hosts without CUDA, and a separate library that fails to load just makes this backend
unavailable (with the reason). ctypes releases the GIL during the foreign call, so the
decimator stays thread-safe and parallel like the C one.
"""

from __future__ import annotations

import ctypes
import threading
from pathlib import Path

import numpy as np

from bridge.decimate._types import (
    BackendUnavailable,
    DecimationResult,
    VoxelKeyOverflow,
    check_layout,
)
from bridge.decimate.budget import run_with_budget
from bridge.decimate.native_table import field_table
from bridge.protocol.cloud import CloudLayout

ABI_VERSION = 1
SBV_OK, SBV_EINVAL, SBV_EOVERFLOW, SBV_ENOMEM, SBV_EDEVICE = range(5)


class _Field(ctypes.Structure):
    _fields_ = (("offset", ctypes.c_uint32), ("type", ctypes.c_uint32), ("role", ctypes.c_uint32))


class _Cloud(ctypes.Structure):
    _fields_ = (
        ("data", ctypes.c_void_p),
        ("points", ctypes.c_size_t),
        ("stride", ctypes.c_size_t),
        ("fields", ctypes.POINTER(_Field)),
        ("n_fields", ctypes.c_size_t),
    )


_lock = threading.Lock()
_state: dict[str, object] = {}


def use_library(path: str) -> None:
    """Load the CUDA library from ``path`` (setting ``cuda_lib``: tests, custom builds) instead
    of the one next to the package; call before the first backend lookup."""
    with _lock:
        _state.pop("result", None)
        _state["path"] = path


def library_path() -> Path:
    chosen = _state.get("path")
    return (
        Path(chosen)
        if isinstance(chosen, str) and chosen
        else Path(__file__).with_name("_sbv_cuda.so")
    )


def _load() -> tuple[ctypes.CDLL | None, str | None]:
    """Load the library once; (library, None) or (None, reason)."""
    with _lock:
        if "result" in _state:
            return _state["result"]  # type: ignore[return-value]
        path = library_path()
        lib: ctypes.CDLL | None = None
        reason: str | None = None
        if not path.exists():
            reason = f"CUDA library not built ({path.name} missing; build with nvcc on PATH)"
        else:
            try:
                lib = ctypes.CDLL(str(path))
                lib.sbv_abi_version.restype = ctypes.c_int
                lib.sbv_cuda_device_count.restype = ctypes.c_int
                lib.sbv_cuda_device_count.argtypes = (ctypes.c_char_p, ctypes.c_size_t)
                lib.sbv_downsample_cuda.restype = ctypes.c_int
                lib.sbv_downsample_cuda.argtypes = (
                    ctypes.POINTER(_Cloud),
                    ctypes.c_double,
                    ctypes.c_void_p,
                    ctypes.c_size_t,
                    ctypes.POINTER(ctypes.c_size_t),
                    ctypes.c_char_p,
                    ctypes.c_size_t,
                )
                lib.sbv_downsample_cuda_batch.restype = ctypes.c_int
                lib.sbv_downsample_cuda_batch.argtypes = (
                    ctypes.POINTER(ctypes.POINTER(_Cloud)),
                    ctypes.POINTER(ctypes.c_double),
                    ctypes.c_size_t,
                    ctypes.POINTER(ctypes.c_void_p),
                    ctypes.POINTER(ctypes.c_size_t),
                    ctypes.POINTER(ctypes.c_size_t),
                    ctypes.POINTER(ctypes.c_int),
                    ctypes.c_char_p,
                    ctypes.c_size_t,
                )
                lib.sbv_cuda_time_resident.restype = ctypes.c_int
                lib.sbv_cuda_time_resident.argtypes = (
                    ctypes.POINTER(_Cloud),
                    ctypes.c_double,
                    ctypes.c_int,
                    ctypes.POINTER(ctypes.c_double),
                    ctypes.c_char_p,
                    ctypes.c_size_t,
                )
                if lib.sbv_abi_version() != ABI_VERSION:
                    reason = f"{path.name} has ABI {lib.sbv_abi_version()}, expected {ABI_VERSION}"
                else:
                    err = ctypes.create_string_buffer(256)
                    count = lib.sbv_cuda_device_count(err, len(err))
                    if count < 0:
                        msg = err.value.decode(errors="replace")
                        reason = f"CUDA runtime unusable (no GPU or driver here?): {msg}"
                    elif count == 0:
                        reason = "no CUDA device visible"
            except (OSError, AttributeError) as exc:
                reason = f"cannot load {path.name}: {exc}"
            if reason is not None:
                lib = None
        _state["result"] = (lib, reason)
        return lib, reason


def _cpu_fallback(layout: CloudLayout, buf: bytes | memoryview, v: float) -> tuple[bytes, int]:
    """Frames whose keys need more than 63 bits (coordinates over ~2^40 voxels): not on the GPU."""
    try:
        from bridge.decimate import _native
    except ImportError:
        from bridge.decimate.reference import downsample_packed

        return downsample_packed(layout, buf, v)
    return _native.downsample(buf, layout.stride, field_table(layout), v, 1)


def unavailable_reason() -> str | None:
    """None when the library loads and sees a device, else why not."""
    return _load()[1]


class CudaDecimator:
    """Decimation on the first CUDA device; thread-safe (each call owns its device buffers)."""

    name = "cuda"

    def __init__(self) -> None:
        lib, reason = _load()
        if lib is None:
            raise BackendUnavailable(self.name, reason or "unknown")
        self._lib = lib

    def downsample(
        self,
        layout: CloudLayout,
        data: bytes | memoryview,
        voxel_size: float,
        max_points: int = 0,
        threads: int = 0,
    ) -> DecimationResult:
        table = field_table(check_layout(layout))
        fields = (_Field * len(table))(*(_Field(*row) for row in table))

        def run(buf: bytes | memoryview, v: float) -> tuple[bytes, int]:
            n = len(buf) // layout.stride
            if n == 0:
                return b"", 0
            src = np.frombuffer(buf, dtype=np.uint8)
            out = np.empty(len(buf), dtype=np.uint8)
            cloud = _Cloud(src.ctypes.data, n, layout.stride, fields, len(table))
            written = ctypes.c_size_t(0)
            err = ctypes.create_string_buffer(256)
            rc = self._lib.sbv_downsample_cuda(
                ctypes.byref(cloud), v, out.ctypes.data, n, ctypes.byref(written), err, len(err)
            )
            message = err.value.decode(errors="replace") or f"CUDA kernel status {rc}"
            if rc == SBV_EINVAL and "too wide" in message:
                return _cpu_fallback(layout, buf, v)  # keys beyond 63 bits: the CPU's wide path
            if rc == SBV_EOVERFLOW:
                raise VoxelKeyOverflow(message)
            if rc == SBV_EINVAL:
                raise ValueError(message)
            if rc == SBV_ENOMEM:
                raise MemoryError(message)
            if rc != SBV_OK:
                raise RuntimeError(f"CUDA decimation failed: {message}")
            m = written.value
            return out[: m * layout.stride].tobytes(), m

        return run_with_budget(self.name, run, layout, data, voxel_size, max_points)

    def downsample_batch(
        self, layout: CloudLayout, frames: list[tuple[bytes | memoryview, float]]
    ) -> list[DecimationResult | Exception]:
        """Decimate frames sharing ``layout`` in one device batch (one transfer each way).

        Per frame: a result, or the exception that frame alone raised (a key overflow, keys too
        wide for the GPU path); a device failure raises for the whole batch.
        """
        table = field_table(check_layout(layout))
        fields = (_Field * len(table))(*(_Field(*row) for row in table))
        k = len(frames)
        if k == 0:
            return []
        srcs = [np.frombuffer(buf, dtype=np.uint8) for buf, _ in frames]
        outs = [np.empty(max(1, len(a)), dtype=np.uint8) for a in srcs]
        clouds = [
            _Cloud(
                a.ctypes.data if len(a) else 0,
                len(a) // layout.stride,
                layout.stride,
                fields,
                len(table),
            )
            for a in srcs
        ]
        ptrs = (ctypes.POINTER(_Cloud) * k)(*(ctypes.pointer(c) for c in clouds))
        voxels = (ctypes.c_double * k)(*(float(v) for _, v in frames))
        out_ptrs = (ctypes.c_void_p * k)(*(o.ctypes.data for o in outs))
        caps = (ctypes.c_size_t * k)(*(len(a) // layout.stride for a in srcs))
        counts = (ctypes.c_size_t * k)()
        status = (ctypes.c_int * k)()
        err = ctypes.create_string_buffer(256)
        rc = self._lib.sbv_downsample_cuda_batch(
            ptrs, voxels, k, out_ptrs, caps, counts, status, err, len(err)
        )
        message = err.value.decode(errors="replace") or f"CUDA batch status {rc}"
        if rc == SBV_EINVAL and "wide" in message:
            return [ValueError(message) for _ in frames]
        if rc != SBV_OK:
            raise RuntimeError(f"CUDA decimation failed: {message}")
        results: list[DecimationResult | Exception] = []
        for i, (_, v) in enumerate(frames):
            if status[i] == SBV_EOVERFLOW:
                results.append(VoxelKeyOverflow(f"voxel index floor(p / {v!r}) exceeds int64"))
            elif status[i] != SBV_OK:
                results.append(ValueError(f"CUDA batch: frame status {status[i]}"))
            else:
                m = counts[i]
                results.append(
                    DecimationResult(outs[i][: m * layout.stride].tobytes(), m, float(v), "cuda")
                )
        return results

    def time_resident(self, layout: CloudLayout, data: bytes, voxel: float, reps: int) -> float:
        """Mean device seconds per decimation with the cloud already on the device (benchmark)."""
        table = field_table(check_layout(layout))
        fields = (_Field * len(table))(*(_Field(*row) for row in table))
        src = np.frombuffer(data, dtype=np.uint8)
        cloud = _Cloud(
            src.ctypes.data, len(src) // layout.stride, layout.stride, fields, len(table)
        )
        seconds = ctypes.c_double(0.0)
        err = ctypes.create_string_buffer(256)
        rc = self._lib.sbv_cuda_time_resident(
            ctypes.byref(cloud), voxel, reps, ctypes.byref(seconds), err, len(err)
        )
        if rc != SBV_OK:
            raise RuntimeError(err.value.decode(errors="replace") or f"status {rc}")
        return seconds.value
