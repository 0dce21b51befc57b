"""SinkRecord accounting: every verdict planted on purpose, plus a property against a tiny model."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from loadgen.record import FrameRecord, RecordFile, SinkRecord, decode, encode, latency_summary


def fr(seq: int, stream: str = "s", device: str = "d", **kw: object) -> FrameRecord:
    return FrameRecord(device_id=device, stream_id=stream, seq=seq, **kw)  # type: ignore[arg-type]


def feed(rec: SinkRecord, seqs: list[int], **kw: object) -> list[bool]:
    return [rec.feed(fr(s, **kw)) for s in seqs]


def test_in_order_stream_has_nothing_to_report() -> None:
    r = SinkRecord()
    assert feed(r, [1, 2, 3, 4]) == [True] * 4
    t = r.totals()
    assert (t["received"], t["delivered"], t["duplicates"], t["lost"], t["reorders"]) == (
        4,
        4,
        0,
        0,
        0,
    )
    assert r.watermarks() == [("d", "s", 4)]


def test_planted_losses_are_counted_with_their_burst() -> None:
    r = SinkRecord()
    feed(r, [1, 2, 5, 6, 7, 9, 10, 11, 12, 20])
    st = r.stats("d", "s")
    assert st.holes == {3, 4, 8, 13, 14, 15, 16, 17, 18, 19}
    assert st.lost == 10
    assert st.max_loss_burst == 7
    assert st.watermark == 2


def test_duplicates_are_counted_not_delivered_twice() -> None:
    r = SinkRecord()
    assert feed(r, [1, 2, 2, 3, 1, 3]) == [True, True, False, True, False, False]
    st = r.stats("d", "s")
    assert (st.received, st.delivered, st.duplicates) == (6, 3, 3)


def test_late_arrival_fills_a_hole_as_a_reorder() -> None:
    r = SinkRecord()
    feed(r, [1, 3, 4])
    assert r.stats("d", "s").lost == 1
    assert r.stats("d", "s").watermark == 1
    assert r.feed(fr(2)) is True
    st = r.stats("d", "s")
    assert (st.lost, st.reorders, st.delivered, st.watermark) == (0, 1, 4, 4)
    assert r.feed(fr(2)) is False  # a second copy is a duplicate, not another reorder
    assert st.reorders == 1 and st.duplicates == 1


def test_gap_marker_covering_the_hole_is_announced_not_lost() -> None:
    r = SinkRecord()
    feed(r, [1, 2])
    r.feed(fr(6, gap_first=3, gap_last=5, gap_count=3, gap_reason="drop_oldest"))
    st = r.stats("d", "s")
    assert (st.lost, st.gap_frames, st.gap_markers, st.watermark) == (0, 3, 1, 6)


def test_gap_marker_covering_part_of_the_hole() -> None:
    r = SinkRecord()
    feed(r, [1])
    # seqs 2..9 missing; the marker announces only 5..8 -> 2,3,4 and 9 are lost
    r.feed(fr(10, gap_first=5, gap_last=8, gap_count=4))
    st = r.stats("d", "s")
    assert st.holes == {2, 3, 4, 9}
    assert st.gap_frames == 4
    assert st.max_loss_burst == 3
    assert st.watermark == 1


def test_gap_marker_announcing_already_missing_seqs_after_a_reorder() -> None:
    r = SinkRecord()
    feed(r, [1, 5])  # 2..4 lost so far
    r.feed(fr(6, gap_first=2, gap_last=4, gap_count=3))  # the bridge says: dropped by policy
    st = r.stats("d", "s")
    assert (st.lost, st.gap_frames, st.watermark) == (0, 3, 6)


def test_frame_inside_an_announced_gap_is_a_contradiction() -> None:
    r = SinkRecord()
    feed(r, [1])
    r.feed(fr(5, gap_first=2, gap_last=4, gap_count=3))
    assert r.feed(fr(3)) is True
    st = r.stats("d", "s")
    assert (st.gap_contradictions, st.gap_frames, st.delivered) == (1, 2, 3)
    assert r.feed(fr(3)) is False


def test_resent_frame_with_the_same_gap_marker_announces_nothing_new() -> None:
    r = SinkRecord()
    gap = {"gap_first": 2, "gap_last": 3, "gap_count": 2}
    feed(r, [1])
    r.feed(fr(4, **gap))
    assert r.feed(fr(4, **gap)) is False
    st = r.stats("d", "s")
    assert (st.gap_frames, st.gap_markers, st.duplicates) == (2, 1, 1)


def test_streams_and_devices_are_independent() -> None:
    r = SinkRecord()
    feed(r, [1, 2, 3], stream="a")
    feed(r, [1, 3], stream="b")
    feed(r, [2], device="e", stream="a")
    assert r.watermarks() == [("d", "a", 3), ("d", "b", 1), ("e", "a", 0)]
    assert r.totals()["lost"] == 2
    assert r.totals()["streams"] == 3


def test_decimation_mismatch_and_latency() -> None:
    r = SinkRecord()
    r.feed(fr(1, capture_ns=1_000_000, received_ns=3_000_000, output_points=10, payload_points=10))
    r.feed(fr(2, capture_ns=1_000_000, received_ns=5_000_000, output_points=10, payload_points=9))
    st = r.stats("d", "s")
    assert st.decimation_mismatches == 1
    lat = r.report()["latency"]
    assert lat["count"] == 2 and lat["p50_ms"] == 2.0 and lat["max_ms"] == 4.0


def test_latency_summary_nearest_rank() -> None:
    s = latency_summary([i * 1_000_000 for i in range(1, 101)])
    assert (s["p50_ms"], s["p90_ms"], s["p99_ms"], s["max_ms"]) == (50.0, 90.0, 99.0, 100.0)
    assert latency_summary([]) == {"count": 0}


def test_encode_decode_roundtrip_and_duplicate_lines_are_identifiers_only() -> None:
    rec = fr(7, bridge_seq=9, capture_ns=1, backend="numpy", gap_first=3, gap_last=6, gap_count=4)
    back, dup = decode(encode(rec))
    assert back == rec and not dup
    back, dup = decode(encode(rec, duplicate=True))
    assert dup and back.seq == 7 and back.bridge_seq == 9 and back.backend == ""


def test_record_file_replay_restores_state_and_cuts_a_torn_line(tmp_path: Path) -> None:
    path = tmp_path / "rec.jsonl"
    live = SinkRecord()
    log = RecordFile(path, fsync=False)
    assert log.load(live) == 0
    lines = []
    for s in [1, 2, 4, 2, 6]:
        rec = fr(s, gap_first=5, gap_last=5, gap_count=1) if s == 6 else fr(s)
        lines.append(encode(rec, duplicate=not live.feed(rec)))
    log.append(lines)
    log.close()
    with path.open("ab") as fh:
        fh.write(b'{"device_id":"d","stream_id":"s","se')  # crash mid-write
    again = SinkRecord()
    log2 = RecordFile(path, fsync=False)
    assert log2.load(again) == 5
    assert log2.torn_bytes > 0
    assert again.totals() == live.totals()
    assert again.watermarks() == live.watermarks() == [("d", "s", 2)]
    log2.append([encode(fr(3))])
    log2.close()
    third = SinkRecord()
    log3 = RecordFile(path)
    log3.load(third)
    log3.close()
    assert third.watermarks() == [("d", "s", 6)]
    assert third.totals()["reorders"] == 1


# ---------------------------------------------------------------------------------------------
# Property: for any arrival pattern (permutation, duplicates, drops) the counts match a model.


@st.composite
def arrivals(draw: st.DrawFn) -> list[int]:
    n = draw(st.integers(1, 40))
    kept = [s for s in range(1, n + 1) if not draw(st.booleans()) or s == n]
    dups = draw(st.lists(st.sampled_from(kept), max_size=10))
    return draw(st.permutations(kept + dups))


@settings(max_examples=300, deadline=None)
@given(arrivals())
def test_counts_match_a_simple_model(order: list[int]) -> None:
    r = SinkRecord()
    verdicts = feed(r, order)

    seen: set[int] = set()
    reorders = 0
    expected_new = []
    for i, s in enumerate(order):
        expected_new.append(s not in seen)
        if s not in seen and any(o > s for o in order[:i]):
            reorders += 1
        seen.add(s)
    top = max(order)
    missing = sorted(set(range(1, top + 1)) - seen)
    burst, run, prev = 0, 0, None
    for m in missing:
        run = run + 1 if prev == m - 1 else 1
        burst, prev = max(burst, run), m
    watermark = (missing[0] - 1) if missing else top

    st_ = r.stats("d", "s")
    assert verdicts == expected_new
    assert st_.received == len(order)
    assert st_.delivered == len(seen)
    assert st_.duplicates == len(order) - len(seen)
    assert st_.lost == len(missing)
    assert st_.reorders == reorders
    assert st_.max_loss_burst == burst
    assert st_.watermark == watermark


@settings(max_examples=200, deadline=None)
@given(st.integers(2, 60).flatmap(lambda n: st.tuples(st.just(n), st.sets(st.integers(1, n - 1)))))
def test_in_order_delivery_with_announced_drops_loses_nothing(case: tuple[int, set[int]]) -> None:
    """The bridge drops by policy and marks the next frame it sends with the exact gap."""
    n, dropped = case
    r = SinkRecord()
    pending: list[int] = []
    for s in range(1, n + 1):
        if s in dropped:
            pending.append(s)
            continue
        if pending:
            r.feed(fr(s, gap_first=pending[0], gap_last=pending[-1], gap_count=len(pending)))
        else:
            r.feed(fr(s))
        pending = []
    st_ = r.stats("d", "s")
    assert st_.lost == 0
    assert st_.gap_frames == len(dropped)
    assert st_.delivered == n - len(dropped)
    assert st_.watermark == n
