"""EgressLog on its own: bridge_seq numbering, cumulative acks, evicted entries, and the sink's
send cursor with its in-flight marks and replay detection."""

from __future__ import annotations

import pytest

from bridge.server.egress import EgressLog
from bridge.server.ring import Entry, StreamRing
from bridge.server.session import Stream, StreamConfig
from bridge.v1 import bridge_pb2 as pb


def stream(stream_id: str = "lidar") -> Stream:
    cfg = StreamConfig(kind=1, voxel_size=0.1, passthrough=False, policy=None, max_points=0)  # type: ignore[arg-type]
    return Stream(("dev", stream_id), cfg, StreamRing(1 << 20))


def committed(log: EgressLog, s: Stream, *seqs: int) -> list[Entry]:
    entries = []
    for seq in seqs:
        core = pb.ProcessedFrame(stream_id=s.stream_id, seq=seq).SerializeToString()
        entry = Entry(seq=seq, size=len(core), item=core)
        log.append(s, entry)
        entries.append(entry)
    return entries


def test_bridge_seq_is_consecutive_and_acks_are_cumulative() -> None:
    log, s = EgressLog(), stream()
    a, b, c = committed(log, s, 1, 2, 3)
    assert [e.bridge_seq for e in (a, b, c)] == [1, 2, 3]
    assert log.first_bridge_seq == 1 and len(log) == 3
    assert [e for _, e in log.pop_acked(2)] == [a, b]
    assert log.acked_bridge_seq == 2 and log.first_bridge_seq == 3
    with pytest.raises(ValueError):
        log.pop_acked(4)  # the sink cannot ack what was never sent
    assert log.pop_acked(1) == [] and log.acked_bridge_seq == 2  # an old ack changes nothing


def test_removed_entries_are_skipped_and_trimmed_from_the_left() -> None:
    log, s = EgressLog(), stream()
    a, b, c = committed(log, s, 1, 2, 3)
    b.removed = True
    assert [e for _, e in log.entries_after(0)] == [a, c]
    a.removed = True
    log.trim_removed()
    assert log.first_bridge_seq == 3 and len(log) == 1
    assert log.first_bridge_seq == c.bridge_seq


def test_send_cursor_marks_in_flight_and_replays_after_a_reconnect() -> None:
    log, s = EgressLog(), stream()
    a, b, c = committed(log, s, 1, 2, 3)
    log.rewind()
    assert log.take_batch(2) == [a, b]
    first = log.mark_sent(a)
    assert first is not None and not first.replay and a.in_flight
    assert pb.ProcessedFrame.FromString(first.data).bridge_seq == 1
    b.removed = True  # evicted after the batch was taken: not sent
    assert log.mark_sent(b) is None and not b.in_flight
    assert log.take_batch(10) == [c]
    assert log.take_batch(10) == []
    log.clear_in_flight()  # the connection failed
    assert not a.in_flight
    log.rewind()  # a new connection replays everything unacknowledged
    assert log.take_batch(10) == [a, c]
    again = log.mark_sent(a)
    assert again is not None and again.replay
    log.pop_acked(1)
    log.rewind()
    assert log.take_batch(10) == [c]
