"""``python -m benchmarks.ws_parse`` runs, says how the allocator was set, and prints one row
per piece size (benchmarks that break silently are worse than none: see test_bench_adapt)."""

from __future__ import annotations

import pytest

from benchmarks import ws_parse


@pytest.mark.parametrize(("flag", "allocator"), [([], "tuned"), (["--default-malloc"], "glibc")])
def test_prints_a_cost_per_piece_size_and_the_allocator_it_ran_with(
    capsys: pytest.CaptureFixture[str], flag: list[str], allocator: str
) -> None:
    argv = ["--size", "300000", "--rounds", "1", "--frames", "2", *flag]
    assert ws_parse.main(argv) == 0
    header, *rows = capsys.readouterr().out.splitlines()
    assert f"allocator: {allocator}" in header
    assert len(rows) == len(ws_parse.PIECES) + 1
    costs = [float(row.split()[-4]) for row in rows]
    assert all(cost > 0 for cost in costs)
    assert rows[-1].split()[-2] == "1.0x"  # the whole frame is the unit
