#!/usr/bin/env bash
# make bench-scale on the 16-core device machine (issue 31 item 5), in one go, within 8 minutes:
# a real pod (simbridge serve --processes N) at N = 1, 2, 4, 8, 12, pinned to 12 cores, the
# generator (clients + sink, one process) on the other 4; the table, the JSON and the curve (PNG)
# under $OUT. Nothing is fetched there: what the image lacks travels as wheels in .whl/.
#
# 1. Here (a machine that reaches PyPI), once, from the repo root:
#      echo /.whl/ >> .git/info/exclude
#      bash benchmarks/scale/device_run.sh wheels
# 2. In a session that has the device machine (one call, ~6-7 min of its 15):
#      run(command="bash benchmarks/scale/device_run.sh", carry=[".whl"], timeout_s=540)
#    Back under files_at: machine.txt, build.txt, bench-scale.txt (the report),
#    bench-scale.json, bench-scale.png (and bench-scale.partial.json if cut short).
# 3. Put the table and the PNG in docs/bench-scale.md ("16-core machine"), with machine.txt's
#    facts. If the report says GENERATOR LAGGED for 1KB rows, those rates are the generator's
#    ceiling, not the pod's (one generator process; see docs/bench-scale.md).
set -uo pipefail
cd "$(dirname "$0")/../.."

# Versions as in this project's .venv (pip list, 2 Dec 2026); the image has numpy, matplotlib,
# pyyaml, httpx.
WHEELS=(
  "grpcio==1.85.3" "grpcio-health-checking==1.85.1" "protobuf==7.36.2" "websockets==17.4"
  "zstandard==0.25.0" "uvloop==0.23.0" "prometheus_client==0.26.0"
  "lightkube==1.0.1" "lightkube-models==1.37.0.8"
)

if [ "${1:-}" = "wheels" ]; then
  python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 -d .whl "${WHEELS[@]}"
  exit $?
fi

START=$SECONDS
OUT=${OUT:-$PWD/reports/device}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PY=python3

if compgen -G ".whl/*.whl" >/dev/null; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 2
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi

{
  echo "nproc: $(nproc)"
  grep -m1 'model name' /proc/cpuinfo
  grep Cpus_allowed_list /proc/self/status
  echo "cpu.max: $(cat /sys/fs/cgroup/cpu.max 2>/dev/null || echo none)"
  echo "memory.max: $(cat /sys/fs/cgroup/memory.max 2>/dev/null || echo none)"
  uname -a
  $PY --version
  command -v taskset || echo "no taskset: the bench pins with sched_setaffinity after the start"
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null || true
} >"$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"

# The C decimation kernel for this interpreter (the tree's .so is built for 3.11): the same
# backend as the 2-core figures. No CUDA build: this measures CPU scaling, the GPU stays out.
BRIDGE_BUILD_NATIVE=yes BRIDGE_BUILD_CUDA=no $PY setup.py -q build_ext --inplace \
  >"$OUT/build.txt" 2>&1 || { tail -20 "$OUT/build.txt"; exit 3; }
export BRIDGE_DECIMATE_BACKEND=c

$PY - <<'EOF' || exit 4
import grpc, websockets, google.protobuf, zstandard, uvloop, matplotlib  # noqa
import bridge.cli, bridge.pod.supervisor  # noqa
from bridge.decimate import _native  # noqa: the C backend loads
print("imports ok: grpc", grpc.__version__, "websockets", websockets.__version__)
EOF

# ~20 s per N on 16 cores (start, 2 cells of 1 + 4 s, connects, drain): 5 N x 2 rounds ~ 4 min.
# Leave the rest of the 8 minutes for the setup above; a cut run keeps its partial JSON.
LEFT=$((470 - (SECONDS - START)))
timeout --signal=INT --kill-after=20 "$LEFT" \
  $PY -m benchmarks.scale.cli --procs 1,2,4,8,12 --cores 12 --rounds 2 \
  --duration 4 --warmup 1 --cloud-conns 48 --small-conns 96 \
  --json "$OUT/bench-scale.json" --plot "$OUT/bench-scale.png" 2>&1 | tee "$OUT/bench-scale.txt"
rc=${PIPESTATUS[0]}
echo "bench-scale exit $rc after $((SECONDS - START)) s"
exit "$rc"
