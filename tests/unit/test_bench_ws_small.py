"""``python -m benchmarks.ws_small`` runs and prints a row per read shape (a benchmark that broke
silently once: see test_bench_adapt)."""

from __future__ import annotations

import pytest

from benchmarks import ws_small


def test_prints_both_receivers_side_by_side_for_each_read_shape(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert ws_small.main(["--rounds", "1", "--reads", "20"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = [line.split() for line in lines[2:]]
    assert [int(row[0]) for row in rows] == list(ws_small.PER_READ)
    for row in rows:
        plain, ours, ratio = map(float, row[1:])
        assert plain > 0 and ours > 0 and ratio == pytest.approx(ours / plain, abs=0.01)
