"""Build hook for the optional native decimation code (see native/README.md).

Metadata lives in pyproject.toml; this file only adds what pyproject cannot say:

* ``bridge.decimate._native``: the C CPU kernel + CPython glue, built when a C compiler works;
* ``bridge/decimate/_sbv_cuda.so``: the CUDA kernel behind the same C ABI, built with
  ``nvcc`` when it is on PATH (loaded at run time via ctypes, so the C extension never
  depends on the CUDA runtime).

Switches (environment):

* ``BRIDGE_BUILD_NATIVE=auto|yes|no`` (default auto): auto builds what the toolchain allows
  and quietly skips the rest; yes makes any native build failure (C or, with nvcc present,
  CUDA) fatal; no builds nothing native (the NumPy backend still works).
* ``BRIDGE_SANITIZE=1``: build the C code with ``-fsanitize=address,undefined`` (run with
  ``LD_PRELOAD=$(gcc -print-file-name=libasan.so)``); release builds stay lean.
* ``BRIDGE_CUDA_ARCH``: nvcc ``-arch`` value list (default: a fat binary for common GPUs).
* ``BRIDGE_BUILD_CUDA=no``: skip the CUDA library even where nvcc exists (its build takes
  minutes; handy while iterating on the C kernel).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).parent
NATIVE = "native"
MODE = os.environ.get("BRIDGE_BUILD_NATIVE", "auto").strip().lower() or "auto"
SANITIZE = os.environ.get("BRIDGE_SANITIZE", "") not in ("", "0", "no", "false")
if MODE not in ("auto", "yes", "no"):
    raise SystemExit(f"BRIDGE_BUILD_NATIVE must be auto, yes or no, not {MODE!r}")

CFLAGS = ["-std=c11", "-O3", "-pthread", "-fno-strict-aliasing", "-Wall", "-Wextra"]
LDFLAGS = ["-pthread"]
if SANITIZE:
    CFLAGS += ["-O1", "-g", "-fsanitize=address,undefined", "-fno-omit-frame-pointer"]
    LDFLAGS += ["-fsanitize=address,undefined"]

# sm_80 (A100), sm_90 (H100/H200) as SASS + compute_90 PTX for newer GPUs to JIT.
DEFAULT_CUDA_ARCH = (
    "-gencode=arch=compute_80,code=sm_80 -gencode=arch=compute_90,code=[sm_90,compute_90]"
)


def _log(msg: str) -> None:
    print(f"simbridge native build: {msg}", file=sys.stderr)


class BuildNative(build_ext):
    """build_ext that tolerates a missing compiler (auto) and also builds the CUDA library."""

    def initialize_options(self) -> None:
        super().initialize_options()
        self.failed: set[str] = set()

    def copy_extensions_to_source(self) -> None:
        # an in-place (editable) build must not try to copy what was skipped
        kept = self.extensions
        self.extensions = [e for e in kept if e.name not in self.failed]
        try:
            super().copy_extensions_to_source()
        finally:
            self.extensions = kept

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:
            if MODE == "yes":
                raise
            _log(f"C extension skipped ({exc}); the NumPy backend will be used")
        self._build_cuda()

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:
            if MODE == "yes":
                raise
            self.failed.add(ext.name)
            _log(f"C extension {ext.name} skipped ({exc}); the NumPy backend will be used")

    def _build_cuda(self) -> None:
        nvcc = shutil.which("nvcc")
        if os.environ.get("BRIDGE_BUILD_CUDA", "auto").strip().lower() == "no":
            _log("BRIDGE_BUILD_CUDA=no: CUDA backend not built")
            return
        if nvcc is None:
            _log("nvcc not on PATH: CUDA backend not built")
            return
        target = Path(self.get_ext_fullpath("bridge.decimate._native")).parent / "_sbv_cuda.so"
        target.parent.mkdir(parents=True, exist_ok=True)
        arch = os.environ.get("BRIDGE_CUDA_ARCH", DEFAULT_CUDA_ARCH).split()
        cmd = [
            nvcc,
            "-O3",
            "-std=c++17",
            "-shared",
            "-Xcompiler",
            "-fPIC",
            "--cudart=static",
            *arch,
            "-I",
            NATIVE,
            "-o",
            str(target),
            f"{NATIVE}/voxel_cuda.cu",
        ]
        _log("building CUDA library: " + " ".join(cmd))
        try:
            subprocess.run(cmd, check=True, cwd=HERE)
        except (OSError, subprocess.CalledProcessError) as exc:
            if MODE == "yes":
                raise
            _log(f"CUDA library skipped ({exc})")
            return
        if self.inplace:
            return
        # Keep the in-tree copy fresh too, so an editable checkout finds the same library.
        inplace = HERE / "bridge" / "decimate" / "_sbv_cuda.so"
        if inplace.resolve() != target.resolve() and inplace.exists():
            shutil.copyfile(target, inplace)


ext_modules = []
if MODE != "no":
    ext_modules.append(
        Extension(
            "bridge.decimate._native",
            sources=[
                f"{NATIVE}/{name}.c"
                for name in (
                    "voxel_module",
                    "voxel_cpu",
                    "cpu_sorted",
                    "cpu_dense",
                    "cpu_wide",
                    "cpu_team",
                    "cpu_scratch",
                    "cpu_hash",
                    "cpu_hash_direct",
                    "cpu_estimate",
                )
            ],
            include_dirs=[NATIVE],
            depends=[
                f"{NATIVE}/{h}"
                for h in ("simbridge_voxel.h", "sbv_body.h", "cpu_internal.h", "cpu_hash_pass.h")
            ],
            extra_compile_args=CFLAGS,
            extra_link_args=LDFLAGS,
        )
    )

setup(
    ext_modules=ext_modules,
    cmdclass={"build_ext": BuildNative} if MODE != "no" else {},
)
