"""``python -m benchmarks.ingest_batch`` runs a real bridge in process, every frame is accepted,
and it prints the per-frame CPU figures (a benchmark that broke silently once: see
test_bench_adapt)."""

from __future__ import annotations

import pytest

from benchmarks import ingest_batch


def test_feeds_every_frame_and_prints_per_frame_cpu(capsys: pytest.CaptureFixture[str]) -> None:
    assert ingest_batch.main(["--messages", "300", "--rounds", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("16 x 1024 B frames a message") and "3 chunks" in lines[0]
    figures = lines[1].split()
    assert figures[0::2] == ["min", "p10", "p25", "median"]
    values = [float(v) for v in figures[1::2]]
    assert 0 < values[0] <= values[1] <= values[2] <= values[3]
