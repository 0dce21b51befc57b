#!/usr/bin/env bash
# ab.sh [REV] - the CPU kernel of REV (default main) against the working tree's, side by
# side in one process per input (benchmarks/decimate/ab.c), one thread, CPU time: the vendored
# real frames at 2 cm and synthetic lidar (100k, 1M) at 0.2 m. Ratios, not rates, are the
# finding on a shared machine. Needs gcc and (for the .pcd frames) Open3D; writes build/ab/.
# THREADS=N (N > 1): thread scaling of both builds instead, wall clock, on the lidar clouds
# (x1 and xN of A and B interleaved in every round; see ab.c).
# SHAPES=1: also the synthetic lidar-shuffled and uniform clouds (100k, 1M at 0.2 m), one thread.
set -euo pipefail
REV=${1:-main}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=$ROOT/build/ab
PY=${PYTHON:-$ROOT/.venv/bin/python}
mkdir -p "$OUT/rev"
rm -rf "$OUT/rev/native"
git -C "$ROOT" archive "$REV" native | tar -x -C "$OUT/rev"
kernel() { # kernel SRC_DIR OUT.so
    gcc -std=c11 -O3 -pthread -fno-strict-aliasing -fPIC -shared -I"$1" -o "$2" \
        "$1"/voxel_cpu.c "$1"/cpu_*.c -lm
}
kernel "$OUT/rev/native" "$OUT/before.so"
kernel "$ROOT/native" "$OUT/after.so"
gcc -std=c11 -O2 -I"$ROOT/native" -o "$OUT/decimate_ab" "$ROOT/benchmarks/decimate/ab.c" -ldl
PYTHONPATH=$ROOT "$PY" - "$OUT" <<'PYEOF'
import sys
from pathlib import Path
from benchmarks.decimate.cli import DEFAULT_PCL, real_case, synthetic_case
out = Path(sys.argv[1])
for p in sorted(DEFAULT_PCL.glob("*.pcd")):
    case = real_case(p, 0.02)
    if case is not None:
        (out / (p.stem[:24] + ".s16")).write_bytes(case.data)
for n in (100_000, 1_000_000):
    (out / f"lidar{n}.s12").write_bytes(synthetic_case("lidar", n, 0.2, 0).data)
    for shape in ("lidar-shuffled", "uniform"):
        (out / f"{shape}{n}.s12").write_bytes(synthetic_case(shape, n, 0.2, 0).data)
PYEOF
CPU=$(PYTHONPATH=$ROOT "$PY" -c 'from benchmarks.hostinfo import cpu_description as c; print(c())')
echo "A = $REV, B = working tree; $CPU; load $(cut -d' ' -f1-3 /proc/loadavg)"
if [ "${THREADS:-1}" -gt 1 ]; then
    "$OUT/decimate_ab" "$OUT/before.so" "$OUT/after.so" "$OUT/lidar100000.s12" 0.2 101 "$THREADS"
    "$OUT/decimate_ab" "$OUT/before.so" "$OUT/after.so" "$OUT/lidar1000000.s12" 0.2 31 "$THREADS"
    echo "load $(cut -d' ' -f1-3 /proc/loadavg)"
    exit 0
fi
for f in "$OUT"/*.s16; do "$OUT/decimate_ab" "$OUT/before.so" "$OUT/after.so" "$f" 0.02 21; done
"$OUT/decimate_ab" "$OUT/before.so" "$OUT/after.so" "$OUT/lidar100000.s12" 0.2 21
"$OUT/decimate_ab" "$OUT/before.so" "$OUT/after.so" "$OUT/lidar1000000.s12" 0.2 9
if [ "${SHAPES:-0}" = 1 ]; then
    for shape in lidar-shuffled uniform; do
        "$OUT/decimate_ab" "$OUT/before.so" "$OUT/after.so" "$OUT/${shape}100000.s12" 0.2 21
        "$OUT/decimate_ab" "$OUT/before.so" "$OUT/after.so" "$OUT/${shape}1000000.s12" 0.2 9
    done
fi
echo "load $(cut -d' ' -f1-3 /proc/loadavg)"
