#!/usr/bin/env bash
# One prepared run for a machine with an NVIDIA GPU: build (with nvcc), the gpu-marked tests, the
# CUDA parity tests against Open3D, and the decimation benchmark with the cuda backend.
# Results go to ${OUT:-gpu-check}/ (the device tool fetches $OUT). Usage: bash scripts/gpu-check.sh
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
out="${OUT:-gpu-check}"
mkdir -p "$out"
nvidia-smi > "$out/nvidia-smi.txt" 2>&1 || echo "nvidia-smi failed" >> "$out/nvidia-smi.txt"
make venv > "$out/setup.log" 2>&1 || { echo "setup failed"; tail -30 "$out/setup.log"; exit 1; }
.venv/bin/python -c 'from bridge.decimate import available_backends as a; print(a())' \
  | tee "$out/backends.txt"
.venv/bin/python -m pytest -q -m gpu -rs tests/unit/test_decimate.py tests/unit/test_decimate_open3d.py \
  2>&1 | tee "$out/gpu-tests.txt" | tail -5
.venv/bin/python -m bridge.decimate.bench --sizes 1M,10M --voxels 0.05,0.2,1.0 --json \
  > "$out/bench-decimate.json" 2> "$out/bench-decimate.err"
.venv/bin/python -m bridge.decimate.bench --sizes 1M,10M --voxels 0.2 2>&1 | tee "$out/bench-decimate.txt"
