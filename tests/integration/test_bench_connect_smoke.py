"""Keeps ``benchmarks.connect`` from rotting: a real bridge, a few sessions of each kind and the
Unix-socket round trip. Timings are not asserted (CI timings are noise), only that every row ran."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ROWS = ("ws new session", "ws resume", "grpc new session", "grpc resume", "unix rtt")


def test_every_row_measures_sessions_against_a_real_bridge() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.connect", "--count", "3"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = {line[:22].strip(): line[22:].split() for line in proc.stdout.splitlines()}
    for name in ROWS:
        row = next((v for k, v in lines.items() if k.startswith(name)), None)
        assert row is not None, (name, proc.stdout)
        p50, p99, rate = (float(x) for x in row)
        assert 0 < p50 <= p99 and rate > 0, (name, row)
