"""The relay benchmark's footer says which rows the load side limited, raw or bridge alike."""

from __future__ import annotations

from benchmarks.relay.common import CellResult
from benchmarks.relay.output import report_footer


def cell(target: str, rate: float, bench_cpu: float, ratio: float | None = None) -> CellResult:
    return CellResult(
        target=target,
        size="1.2MB",
        wire_bytes=1_200_030,
        conns=32,
        window=8,
        seconds=3.0,
        msgs_per_s=rate,
        mean_msgs_per_s=rate,
        mb_per_s=rate * 1.2,
        p50_ms=900.0,
        p99_ms=1000.0,
        relay_cpu_pct=80.0,
        relay_us_per_msg=3000.0,
        bench_cpu_pct=bench_cpu,
        other_cpu_pct=1.0,
        sent=1000,
        completed=1000,
        sink_received=1000,
        backpressure_pauses=0,
        ratio=ratio,
    )


def test_a_bridge_row_limited_by_the_load_side_is_named_as_a_lower_bound() -> None:
    footer = report_footer([cell("raw-grpc", 500, 80.0), cell("bridge-grpc", 270, 104.0, 0.54)])
    assert "bridge cell(s) bridge-grpc 1.2MB x32" in footer
    assert "lower bound" in footer
    assert "raw cell(s)" not in footer  # the raw row had CPU to spare


def test_no_note_when_the_load_side_had_room() -> None:
    footer = report_footer([cell("raw-grpc", 500, 80.0), cell("bridge-grpc", 450, 70.0, 0.9)])
    assert "note:" not in footer
