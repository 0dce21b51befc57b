"""Keeps ``make bench-adapt`` from rotting: its stand-in data plane once lacked a method the
adapter calls (``set_memory_budget``), the first plan failed, and the command died before
printing anything. A few changes, short cost runs; figures are not asserted."""

from __future__ import annotations

import pytest

from benchmarks.adapt import main


def test_bench_adapt_runs_and_reports(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--changes", "4", "--interval", "0.02", "--cpu-seconds", "0.2"]) == 0
    out = capsys.readouterr().out
    assert "time to adapt (file write -> applied), 4 random changes" in out
    assert "watcher cost, temp dir (8 files)" in out
