"""loadgen.phases / loadgen.report: exact per-phase accounting from a planted sink record, the
report schema, and the side-by-side table."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from loadgen import report
from loadgen.demo import report_command
from loadgen.phases import Window, account, timeline
from loadgen.record import FrameRecord, encode
from loadgen.runner import read_record

MS = 1_000_000


def rec(seq: int, received_ms: int, **kw: Any) -> FrameRecord:
    return FrameRecord("d", "s", seq, received_ns=received_ms * MS, capture_ns=seq * 100 * MS, **kw)


# Ten frames of stream d/s scheduled every 100 ms (seq n at n*100 ms).
PUBLISHED = [("d", "s", n, n * 100 * MS) for n in range(1, 11)]
# Window A holds seqs 1-4, window B seqs 5-10.
A = Window("A", "steady", 0, 500 * MS)
B = Window("B", "resize", 500 * MS, 1100 * MS)
RECORDS = [
    (rec(1, 150), False),
    (rec(2, 250), False),
    (rec(4, 460), False),
    (rec(3, 470), False),  # arrives after 4: a reorder (A)
    (rec(5, 560), False),
    (rec(5, 570), True),  # a duplicate (B)
    (rec(7, 760, gap_first=6, gap_last=6, gap_count=1), False),  # 6 announced dropped
    (rec(10, 1500), False),  # 8 and 9 never arrive: lost, burst 2
]


def planted() -> list[dict[str, Any]]:
    return account(
        PUBLISHED,
        RECORDS,
        [A, B, Window("all", "overall", 0, 2**62)],
        publishing=(0, 1100 * MS),
        disconnects_ns=[700 * MS],
    )


def test_phase_accounting_is_exact() -> None:
    a, b, total = planted()
    assert {k: a[k] for k in ("published", "delivered", "lost", "duplicates", "reorders")} == {
        "published": 4,
        "delivered": 4,
        "lost": 0,
        "duplicates": 0,
        "reorders": 1,
    }
    assert (a["gap_frames"], a["max_loss_burst"], a["disconnects"]) == (0, 0, 0)
    # latencies received - scheduled: 50, 50, 60, 170 ms (nearest rank)
    assert a["latency_ms"] == {"count": 4, "p50": 50.0, "p99": 170.0, "max": 170.0}
    # delivery gaps inside publishing [0, 1100]: the longest touching A is 250 -> 460
    assert a["max_stall_s"] == 0.21

    assert (b["published"], b["delivered"], b["lost"], b["gap_frames"]) == (6, 3, 2, 1)
    assert (b["duplicates"], b["reorders"], b["max_loss_burst"], b["disconnects"]) == (1, 0, 2, 1)
    assert b["latency_ms"] == {"count": 3, "p50": 60.0, "p99": 500.0, "max": 500.0}
    assert b["max_stall_s"] == 0.34  # 760 ms -> end of publishing at 1100 ms

    assert (total["published"], total["delivered"], total["lost"]) == (10, 7, 2)
    assert (total["duplicates"], total["reorders"], total["gap_frames"]) == (1, 1, 1)


def test_same_numbers_through_the_sinks_record_file(tmp_path: Path) -> None:
    """The runner reads the sink's JSON-lines record; the accounting must not change."""
    path = tmp_path / "sink.jsonl"
    path.write_text("".join(encode(r, duplicate=d) for r, d in RECORDS) + '{"torn": ')
    assert (
        account(
            PUBLISHED,
            read_record(path),
            [A, B, Window("all", "overall", 0, 2**62)],
            publishing=(0, 1100 * MS),
            disconnects_ns=[700 * MS],
        )
        == planted()
    )


def test_stalls_are_clipped_to_the_window() -> None:
    # [700, 800) sits inside the 560->760 and 760->1100 gaps: it saw 60 ms of the first
    (c,) = account(
        PUBLISHED, RECORDS, [Window("C", "steady", 700 * MS, 800 * MS)], publishing=(0, 1100 * MS)
    )
    assert c["max_stall_s"] == 0.06
    assert (c["published"], c["delivered"], c["lost"]) == (1, 1, 0)  # seq 7


def test_unlogged_frames_fall_back_to_capture_time() -> None:
    # nothing published in our log, but the sink saw seq 1: it is counted, not lost
    (w,) = account([], [(rec(1, 150), False)], [A], publishing=(0, 500 * MS))
    assert (w["published"], w["delivered"], w["lost"]) == (1, 1, 0)


def test_timeline_buckets() -> None:
    tl = timeline(
        PUBLISHED, RECORDS, start_ns=0, end_ns=1000 * MS, bucket_s=0.5, disconnects_ns=[700 * MS]
    )
    assert tl["t_s"] == [0.0, 0.5]
    assert tl["published_per_s"] == [8.0, 10.0]  # seqs 1-4 | 5-9 (10 is at 1.0 s, outside)
    assert tl["delivered_per_s"] == [8.0, 4.0]  # 1,2,4,3 | 5,7 (the duplicate is not counted)
    assert tl["disconnects"] == [0, 1]
    assert tl["latency_p99_ms"] == [170.0, 60.0]


# ---------------------------------------------------------------------------------------------
# The report document


def sample_report() -> dict[str, Any]:
    phases = planted()[:2]
    for p in phases:
        p["start_s"], p["end_s"] = p.pop("start_ns") / 1e9, p.pop("end_ns") / 1e9
    resize = {
        "index": 0,
        "at_s": 0.5,
        "cpu": 0.5,
        "memory_bytes": None,
        "below_usage": False,
        "usage_at_request_bytes": 100,
        "requested_s": 0.5,
        "written_s": 0.5,
        "adapted_s": 0.55,
        "time_to_adapt_ms": 50.0,
        "held": False,
        "hold_s": None,
        "resolved": True,
        "plan": {"workers": 1},
        "restart_exit_code": None,
        "notes": [],
    }
    total = {k: v for k, v in planted()[2].items() if k not in ("name", "kind", "start_ns")}
    total.pop("end_ns")
    run = {
        "mode": "in-place",
        "backend": "local",
        "cpu_throttle": "simulated only: test",
        "clouds": "synthetic",
        "totals": {**total, "reconnects": 0, "resent": 0, "undelivered_at_end": 0},
        "time_to_adapt_ms": {"count": 1, "p50": 50.0, "max": 50.0},
        "phases": phases,
        "resizes": [resize],
        "timeline": timeline(PUBLISHED, RECORDS, start_ns=0, end_ns=1000 * MS),
        "edges": {"published": 10, "disconnects": 1, "undelivered": 0},
        "sink": {"totals": {}},
        "bridge": {"exit_codes": [0]},
    }
    restart = copy.deepcopy(run)
    restart["mode"] = "restart"
    restart["totals"]["disconnects"] = 4
    return {
        "schema_version": report.SCHEMA_VERSION,
        "generated_at": "2026-11-29T00:00:00Z",
        "scenario": {
            "name": "planted",
            "edges": 1,
            "transport": "ws",
            "rate_hz": 10.0,
            "duration_s": 1.0,
            "baseline": "restart",
            "resizes": [{"at_s": 0.5, "cpu": 0.5, "memory": None}],
        },
        "host": report.host_info(),
        "runs": [run, restart],
    }


def test_schema_accepts_a_report_and_rejects_a_broken_one() -> None:
    rep = sample_report()
    report.validate(rep)
    broken = copy.deepcopy(rep)
    del broken["runs"][0]["totals"]["lost"]
    with pytest.raises(jsonschema.ValidationError, match="'lost' is a required property"):
        report.validate(broken)
    broken = copy.deepcopy(rep)
    broken["schema_version"] = "0.1"
    with pytest.raises(jsonschema.ValidationError):
        report.validate(broken)
    broken = copy.deepcopy(rep)
    broken["runs"][1]["cpu_throttle"] = "maybe"
    with pytest.raises(jsonschema.ValidationError):
        report.validate(broken)


def test_table_side_by_side() -> None:
    rows = report.comparison_table(sample_report())
    assert rows[0] == ["metric", "in-place (local)", "restart (local)"]
    by_name = {r[0]: r[1:] for r in rows[1:]}
    assert by_name["lost"] == ["2", "2"]
    assert by_name["disconnects (edges)"] == ["1", "4"]
    assert by_name["time-to-adapt p50 ms"] == ["50.0", "50.0"]
    text = report.render_text(sample_report())
    assert "resizes (restart):" in text and "simulated only: test" in text


def test_report_command_rerenders(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = report.write(sample_report(), tmp_path, "planted")
    assert json.loads(path.read_text())["schema_version"] == report.SCHEMA_VERSION
    import argparse

    args = argparse.Namespace(file=str(path), png=None, no_png=False)
    assert report_command(args) == 0
    assert (tmp_path / "planted.png").stat().st_size > 10_000
    out = capsys.readouterr().out
    assert "in-place (local)" in out and "planted.png" in out
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema_version": "1.0"}')
    assert report_command(argparse.Namespace(file=str(bad), png=None, no_png=True)) == 2
