#!/usr/bin/env bash
# One prepared run for a machine with an NVIDIA GPU (the device tool fetches $OUT):
#   1. build the CUDA library and the GPU bench driver with nvcc (sm_90 unless BRIDGE_CUDA_ARCH);
#   2. native/bench_gpu.cu: CUDA vs the C kernel byte for byte, 10M points device-resident and with
#      transfers (pinned and pageable input), batched vs unbatched 100k-point frames, the C kernel
#      on every core on the same frames;
#   3. when a Python with numpy, pytest and hypothesis is there: the gpu-marked tests (Open3D CUDA
#      parity included when open3d imports) and the Python batch path.
# Usage: bash scripts/gpu-check.sh   (results in ${OUT:-gpu-check}/)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
out="${OUT:-gpu-check}"
mkdir -p "$out"
arch="${BRIDGE_CUDA_ARCH:--gencode=arch=compute_90,code=sm_90}"
cpus="$(nproc)"
{ nvidia-smi; nvcc --version; lscpu | head -20; command -v python3; } > "$out/machine.txt" 2>&1
build() {
  # shellcheck disable=SC2086  # arch is a list of flags
  nvcc -O3 -std=c++17 -shared -Xcompiler -fPIC --cudart=static $arch -I native \
    -o bridge/decimate/_sbv_cuda.so native/voxel_cuda.cu &
  gcc -O3 -std=c11 -pthread -fPIC -c -I native native/voxel_cpu.c native/cpu_*.c || return 1
  # shellcheck disable=SC2086
  # both halves define sbv_abi_version (same value): let the linker keep one
  nvcc -O3 -std=c++17 $arch -I native -o bench_gpu native/bench_gpu.cu native/voxel_cuda.cu \
    voxel_cpu.o cpu_*.o -lpthread -Xlinker --allow-multiple-definition || return 1
  wait
}
{ time build; } > "$out/build.log" 2>&1 || { echo "build failed"; tail -30 "$out/build.log"; }
tail -4 "$out/build.log"
if [ -x ./bench_gpu ]; then
  timeout "${BENCH_TIMEOUT:-240}" ./bench_gpu "$cpus" 2>&1 | tee "$out/bench-gpu.txt"
fi
py="${PYTHON:-python3}"
if "$py" -c 'import numpy, pytest, hypothesis' 2>/dev/null; then
  BRIDGE_BUILD_CUDA=no "$py" setup.py build_ext --inplace -q > "$out/pybuild.log" 2>&1
  # -W/-o: a bare host may lack pytest-asyncio/-timeout, whose ini options then only warn
  timeout "${PYTEST_TIMEOUT:-150}" "$py" -m pytest -q -p no:cacheprovider -W ignore::pytest.PytestConfigWarning \
    -o addopts= -m gpu -rs tests/unit/test_decimate.py \
    tests/unit/test_decimate_open3d.py tests/unit/test_decimate_batch.py 2>&1 |
    tee "$out/gpu-tests.txt" | tail -8
else
  echo "no python with numpy, pytest and hypothesis here: pytest gpu tests not run" |
    tee "$out/gpu-tests.txt"
fi
