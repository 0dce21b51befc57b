"""NVML adapter: the GPUs (and MIG instances) this container can see → :class:`GpuReading`.

``nvidia-ml-py`` (``import pynvml``) is optional: without the package, the shared library or a
driver there is simply no GPU (``available=False``), which is a CPU plan, not an error. Any other
NVML failure on a device marks that device unhealthy with the error text, so the plan switches the
decimator to the CPU instead of crashing on the next kernel launch.

Inside a DRA-managed container NVML enumerates only the injected GPU, or the parent GPU plus the one
MIG instance (docs/kubernetes.md, claims vs resize); MIG instances are listed with ``is_mig``
and ``index`` ``"<gpu>/<mig>"``.
The module is injectable (``GpuProbe(nvml=fake)``) so tests run without a GPU.
"""

from __future__ import annotations

import importlib
import threading
from typing import Any

from bridge.resources.snapshot import GpuDevice, GpuReading

# NVML return codes (nvml.h); used when the module does not expose the constant.
_NO_GPU_CODES = {"NVML_ERROR_LIBRARY_NOT_FOUND": 12, "NVML_ERROR_DRIVER_NOT_LOADED": 9}
_NOT_FOUND = 6
_NOT_SUPPORTED = 3


def _text(value: object) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class GpuProbe:
    """Initialises NVML once (lazily) and reads devices on each :meth:`read`. Thread-safe."""

    def __init__(self, nvml: Any | None = None, *, missing_reason: str = "") -> None:
        self._nvml = nvml
        self._missing_reason = missing_reason
        self._initialized = False
        self._no_gpu: str | None = None
        self._lock = threading.Lock()

    @classmethod
    def load(cls) -> GpuProbe:
        """Import ``pynvml`` if installed; absent package → a probe that reports no GPU."""
        try:
            return cls(importlib.import_module("pynvml"))
        except ImportError:
            return cls(None, missing_reason="nvidia-ml-py (pynvml) not installed")

    def _code(self, name: str, default: int) -> int:
        value = getattr(self._nvml, name, default)
        return value if isinstance(value, int) else default

    def _is_error(self, e: BaseException) -> bool:
        err = getattr(self._nvml, "NVMLError", None)
        return isinstance(err, type) and isinstance(e, err)

    def _init(self) -> str | None:
        """None when NVML is usable, else why there is no GPU."""
        if self._nvml is None:
            return self._missing_reason or "NVML not available"
        if self._no_gpu is not None:
            return self._no_gpu
        if self._initialized:
            return None
        try:
            self._nvml.nvmlInit()
        except Exception as e:
            if not self._is_error(e):
                raise
            code = getattr(e, "value", None)
            no_gpu = {self._code(n, d) for n, d in _NO_GPU_CODES.items()}
            reason = f"nvmlInit: {e}"
            if code in no_gpu:
                self._no_gpu = reason  # permanent: do not retry every poll
            return reason
        self._initialized = True
        return None

    def read(self) -> GpuReading:
        with self._lock:
            why = self._init()
            if why is not None:
                return GpuReading(available=False, problems=(why,))
            nvml: Any = self._nvml
            try:
                count = int(nvml.nvmlDeviceGetCount())
            except Exception as e:
                if not self._is_error(e):
                    raise
                return GpuReading(available=True, problems=(f"nvmlDeviceGetCount: {e}",))
            devices: list[GpuDevice] = []
            for i in range(count):
                devices.extend(self._device(i))
            problems = tuple(f"{d.name} {d.index}: {d.problem}" for d in devices if d.problem)
            return GpuReading(available=True, devices=tuple(devices), problems=problems)

    def _device(self, i: int) -> list[GpuDevice]:
        nvml: Any = self._nvml
        out: list[GpuDevice] = []
        name = uuid = "?"
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            uuid = _text(nvml.nvmlDeviceGetUUID(handle))
            name = _text(nvml.nvmlDeviceGetName(handle))
            mem = nvml.nvmlDeviceGetMemoryInfo(handle)
            out.append(GpuDevice(str(i), uuid, name, int(mem.total), int(mem.used), True))
        except Exception as e:
            if not self._is_error(e):
                raise
            return [GpuDevice(str(i), uuid, name, 0, 0, healthy=False, problem=str(e) or repr(e))]
        try:
            current, _pending = nvml.nvmlDeviceGetMigMode(handle)
        except Exception as e:
            if not self._is_error(e):
                raise
            return out  # not MIG-capable (NOT_SUPPORTED) or unknown: the GPU itself is the device
        if current != getattr(nvml, "NVML_DEVICE_MIG_ENABLE", 1):
            return out
        try:
            slots = int(nvml.nvmlDeviceGetMaxMigDeviceCount(handle))
        except Exception as e:
            if not self._is_error(e):
                raise
            out.append(GpuDevice(f"{i}/?", uuid, name, 0, 0, False, True, f"MIG count: {e}"))
            return out
        for j in range(slots):
            try:
                mh = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, j)
            except Exception as e:
                if self._is_error(e) and getattr(e, "value", None) == self._code(
                    "NVML_ERROR_NOT_FOUND", _NOT_FOUND
                ):
                    continue  # empty slot
                if not self._is_error(e):
                    raise
                out.append(GpuDevice(f"{i}/{j}", "?", name, 0, 0, False, True, str(e)))
                continue
            try:
                muuid = _text(nvml.nvmlDeviceGetUUID(mh))
                mname = _text(nvml.nvmlDeviceGetName(mh))
                mmem = nvml.nvmlDeviceGetMemoryInfo(mh)
                out.append(
                    GpuDevice(f"{i}/{j}", muuid, mname, int(mmem.total), int(mmem.used), True, True)
                )
            except Exception as e:
                if not self._is_error(e):
                    raise
                out.append(GpuDevice(f"{i}/{j}", "?", name, 0, 0, False, True, str(e)))
        return out

    def close(self) -> None:
        with self._lock:
            if self._initialized and self._nvml is not None:
                try:
                    self._nvml.nvmlShutdown()
                except Exception as e:
                    if not self._is_error(e):
                        raise
                self._initialized = False
