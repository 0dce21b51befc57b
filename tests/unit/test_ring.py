"""StreamRing: byte bound, cumulative acks, live resize, both overflow policies."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.server.ring import AdmitResult, Policy, State, StreamRing


def fill(ring: StreamRing, sizes: list[int], start: int = 1) -> list[int]:
    accepted = []
    for i, size in enumerate(sizes, start):
        result, _ = ring.admit(i, size, f"frame-{i}")
        if result is AdmitResult.ACCEPTED:
            accepted.append(i)
    return accepted


def test_backpressure_refuses_when_full_and_drops_nothing() -> None:
    ring = StreamRing(100, Policy.BACKPRESSURE)
    assert fill(ring, [40, 40]) == [1, 2]
    result, evicted = ring.admit(3, 40, "x")
    assert result is AdmitResult.FULL and evicted == []
    assert [e.seq for e in ring] == [1, 2] and ring.stats.evicted == 0
    ring.take_pending()
    entry = next(iter(ring))
    ring.complete(entry, b"r", 10)
    assert ring.occupancy_bytes == 50
    assert ring.admit(3, 40, "x")[0] is AdmitResult.ACCEPTED


def test_drop_oldest_evicts_counts_and_announces_gap_on_next_entry() -> None:
    ring = StreamRing(100, Policy.DROP_OLDEST)
    fill(ring, [40, 40])
    result, evicted = ring.admit(3, 40, "x")
    assert result is AdmitResult.ACCEPTED
    assert [e.seq for e in evicted] == [1]
    survivors = list(ring)
    assert [e.seq for e in survivors] == [2, 3]
    assert survivors[0].gap is not None
    assert (survivors[0].gap.first_seq, survivors[0].gap.last_seq, survivors[0].gap.count) == (
        1,
        1,
        1,
    )
    assert survivors[0].gap.reason == "drop_oldest"
    assert ring.stats.evicted == 1


def test_drop_oldest_never_evicts_processing_or_in_flight() -> None:
    ring = StreamRing(100, Policy.DROP_OLDEST)
    fill(ring, [50, 50])
    first = ring.take_pending()
    assert first is not None and first.state is State.PROCESSING
    second = list(ring)[1]
    second.in_flight = True
    result, evicted = ring.admit(3, 50, "x")
    assert result is AdmitResult.FULL and evicted == []


def test_gap_kept_pending_when_every_entry_was_evicted() -> None:
    ring = StreamRing(100, Policy.DROP_OLDEST)
    fill(ring, [60])
    evicted = ring.resize(50)
    assert [e.seq for e in evicted] == [1] and len(ring) == 0
    ring.admit(2, 10, "x")
    only = next(iter(ring))
    assert only.gap is not None and only.gap.count == 1 and only.gap.last_seq == 1


def test_cumulative_ack_frees_prefix() -> None:
    ring = StreamRing(1000)
    fill(ring, [10, 20, 30])
    assert ring.ack(2) == 30
    assert [e.seq for e in ring] == [3] and ring.occupancy_bytes == 30
    assert ring.ack(2) == 0  # idempotent


def test_take_committable_is_in_seq_order() -> None:
    ring = StreamRing(1000)
    fill(ring, [10, 10, 10])
    a, b, c = (ring.take_pending() for _ in range(3))
    assert a and b and c
    ring.complete(b, b"b", 1)
    assert ring.take_committable() == []  # seq 1 not done yet
    ring.complete(a, b"a", 1)
    assert [e.seq for e in ring.take_committable()] == [1, 2]
    ring.complete(c, b"c", 1)
    assert [e.seq for e in ring.take_committable()] == [3]


def test_a_frame_above_capacity_enters_only_an_empty_ring() -> None:
    for policy in Policy:
        ring = StreamRing(100, policy)
        assert ring.admit(1, 250, "big")[0] is AdmitResult.ACCEPTED
        result, evicted = ring.admit(2, 10, "small")
        if policy is Policy.BACKPRESSURE:
            assert result is AdmitResult.FULL
        else:  # the big one is evicted to make room for the next
            assert result is AdmitResult.ACCEPTED and [e.seq for e in evicted] == [1]


class Counted:
    def __init__(self) -> None:
        self.released = 0
        self.size = 0

    def release(self) -> None:
        self.released += 1

    def resize(self, nbytes: int) -> None:
        self.size = nbytes


def test_entries_release_their_charge_once_when_they_leave() -> None:
    ring = StreamRing(100, Policy.DROP_OLDEST)
    charges = [Counted() for _ in range(4)]
    for seq, charge in enumerate(charges, 1):
        ring.admit(seq, 40, f"f{seq}", charge=charge)
    entry = ring.take_pending()
    assert entry is not None and entry.seq == 3
    ring.complete(entry, b"r", 5)
    assert charges[2].size == 5
    ring.ack(3)
    ring.release_all()
    ring.ack(4)
    assert [c.released for c in charges] == [1, 1, 1, 1]
    assert ring.occupancy_bytes == 0


def test_admit_rejects_non_increasing_seq_and_bad_capacity() -> None:
    ring = StreamRing(100)
    ring.admit(5, 1, "x")
    with pytest.raises(ValueError):
        ring.admit(5, 1, "x")
    with pytest.raises(ValueError):
        StreamRing(-1)
    with pytest.raises(ValueError):
        ring.resize(-1)


ops = st.lists(
    st.one_of(
        st.tuples(st.just("admit"), st.integers(1, 60)),
        st.tuples(st.just("process"), st.integers(1, 30)),
        st.tuples(st.just("ack"), st.integers(0, 5)),
        st.tuples(st.just("resize"), st.integers(30, 300)),
    ),
    max_size=80,
)


@settings(max_examples=200, deadline=None)
@given(ops=ops, policy=st.sampled_from(list(Policy)))
def test_ring_properties(ops: list[tuple[str, int]], policy: Policy) -> None:
    """The byte bound holds after every admission; order is kept; every unacknowledged frame is
    either still held or was evicted (drop_oldest only) and counted exactly once."""
    ring = StreamRing(120, policy)
    seq = 0
    admitted: list[int] = []
    evicted_seqs: set[int] = set()
    acked = 0
    for op, arg in ops:
        if op == "admit":
            before = ring.occupancy_bytes
            result, evicted = ring.admit(seq + 1, arg, seq + 1)
            evicted_seqs.update(e.seq for e in evicted)
            if result is AdmitResult.ACCEPTED:
                seq += 1
                admitted.append(seq)
                # one frame above the share is allowed, alone (no floor: it borrows)
                assert ring.occupancy_bytes <= ring.capacity_bytes or len(ring) == 1
            elif policy is Policy.BACKPRESSURE:
                assert ring.occupancy_bytes == before
        elif op == "process":
            entry = ring.take_pending()
            if entry is not None:
                ring.complete(entry, b"", min(arg, entry.size))
                ring.take_committable()
        elif op == "ack":
            target = min(seq, acked + arg)
            ring.ack(target)
            acked = max(acked, target)
        else:
            evicted_seqs.update(e.seq for e in ring.resize(arg))
            if policy is Policy.DROP_OLDEST:
                stuck = sum(e.size for e in ring if e.state is State.PROCESSING or e.in_flight)
                assert ring.occupancy_bytes <= max(arg, stuck)
        held = [e.seq for e in ring]
        assert held == sorted(held)
        assert ring.occupancy_bytes == sum(e.size for e in ring)
        assert not set(held) & evicted_seqs
        assert ring.stats.evicted == len(evicted_seqs)
        for s in admitted:
            if s > acked:
                assert s in held or s in evicted_seqs
        if policy is Policy.BACKPRESSURE:
            assert not evicted_seqs
            assert held == [s for s in admitted if s > acked]
