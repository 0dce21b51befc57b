"""Chunk reassembly (bridge.server.chunks): any interleaving of streams' pieces reassembles exactly,
bad sequences are refused with the right code, and every charged byte comes back."""

from __future__ import annotations

import itertools

from hypothesis import example, given, settings
from hypothesis import strategies as st

from bridge.protocol import codec
from bridge.server.chunks import Reassembler
from bridge.server.governor import Charge, Component, Governor
from bridge.v1 import bridge_pb2 as pb

MAX = 1 << 20


def frame_bytes(stream: str, seq: int, size: int) -> bytes:
    blob = bytes((seq * 7 + i) % 251 for i in range(size))
    return pb.Frame(
        stream_id=stream, seq=seq, telemetry=pb.Telemetry(blob=blob)
    ).SerializeToString()


def pieces(stream: str, seq: int, body: bytes, cuts: list[int]) -> list[pb.FrameChunk]:
    bounds = sorted({0, len(body), *(c % len(body) for c in cuts)})
    return [
        pb.FrameChunk(stream_id=stream, seq=seq, total_bytes=len(body), offset=a, data=body[a:b])
        for a, b in itertools.pairwise(bounds)
    ]


def charged(gov: Governor, chunk: pb.FrameChunk) -> Charge:
    got = gov.request(Component.TRANSPORT, chunk.ByteSize(), lambda _c: None)
    assert isinstance(got, Charge)
    return got


streams_st = st.lists(
    st.tuples(st.integers(1, 3000), st.lists(st.integers(0, 10**6), max_size=6)),
    min_size=1,
    max_size=4,
)


@settings(max_examples=150, deadline=None)
@given(streams=streams_st, order=st.randoms(use_true_random=False))
def test_any_interleaving_of_streams_reassembles_exactly(streams, order) -> None:  # type: ignore[no-untyped-def]
    gov = Governor(64 * MAX)
    names = [f"s{i}" for i in range(len(streams))]
    r = Reassembler(set(names), MAX)
    bodies = {n: frame_bytes(n, 1, size) for n, (size, _) in zip(names, streams, strict=True)}
    queues = [pieces(n, 1, bodies[n], cuts) for n, (_, cuts) in zip(names, streams, strict=True)]
    out: dict[str, bytes] = {}
    while any(queues):
        q = order.choice([q for q in queues if q])  # any lane next; each lane stays in order
        piece = q.pop(0)
        fed = r.feed(piece, charged(gov, piece), now=0.0)
        assert fed.errors == []
        if fed.data is not None:
            assert fed.charge is not None and fed.header is not None
            msg = codec.decode_edge(fed.data, codec.Limits(MAX, 1000, 8))
            assert msg.frame.SerializeToString() == bodies[piece.stream_id]
            assert fed.charge.nbytes >= len(bodies[piece.stream_id])
            out[piece.stream_id] = fed.data
            fed.charge.release()
    assert set(out) == set(names)
    assert r.in_progress == 0 and gov.live_charges == 0 and gov.total_bytes == 0


BAD = ["gap", "overlap", "total_changes", "oversize", "past_total", "new_seq", "not_first"]


@settings(max_examples=150, deadline=None)
@given(
    size=st.integers(200, 5000),
    cuts=st.lists(st.integers(1, 10**6), min_size=3, max_size=6),
    bad=st.sampled_from(BAD),
    at=st.integers(0, 100),
)
@example(size=200, cuts=[1, 1, 66886], bad="gap", at=1)  # found by CI: a one-byte last piece
def test_bad_sequences_are_refused_with_their_code(
    size: int, cuts: list[int], bad: str, at: int
) -> None:
    gov = Governor(64 * MAX)
    r = Reassembler({"a", "b"}, MAX)
    body = frame_bytes("a", 5, size)
    seq = pieces("a", 5, body, cuts)
    i = 1 + at % max(1, len(seq) - 1)  # a piece after the first
    good = seq[:i]
    wrong = pb.FrameChunk()
    wrong.CopyFrom(seq[min(i, len(seq) - 1)])
    expect, expect_seq = pb.CHUNK_SEQUENCE, 5
    if bad == "gap":
        wrong.offset += 1
        wrong.data = wrong.data[: max(1, len(wrong.data) - 1)]
        if wrong.offset + len(wrong.data) > wrong.total_bytes:
            # A one-byte last piece moved by one runs past the end, which is checked first.
            expect = pb.TOO_LARGE
    elif bad == "overlap":
        wrong.offset -= 1
        wrong.data = body[wrong.offset : wrong.offset + 1]
    elif bad == "total_changes":
        wrong.total_bytes += 1
    elif bad == "oversize":
        wrong.total_bytes = MAX + 1
        expect = pb.TOO_LARGE
    elif bad == "past_total":
        wrong.data += b"x" * (wrong.total_bytes - wrong.offset)
        expect = pb.TOO_LARGE
    elif bad == "new_seq":  # a new frame starts: the incomplete one is abandoned
        wrong = pieces("a", 6, frame_bytes("a", 6, 100), [])[0]
        expect = pb.CHUNK_ABANDONED
    elif bad == "not_first":  # no frame in progress and the piece is not at offset 0
        good = []
        wrong.CopyFrom(seq[1])
    # Another stream's frame is in progress throughout: it must be untouched.
    other = pieces("b", 1, frame_bytes("b", 1, 900), [300])
    assert r.feed(other[0], charged(gov, other[0]), 0.0).errors == []
    for p in good:
        assert r.feed(p, charged(gov, p), 0.0).errors == []
    fed = r.feed(wrong, charged(gov, wrong), 0.0)
    if fed.charge is not None:  # "new_seq": the new frame was whole in one piece
        fed.charge.release()
    codes = [(e.wire.code, e.frame.seq if e.frame else 0) for e in fed.errors]
    assert (expect, expect_seq) in codes
    assert all(e.frame is not None and e.frame.stream_id == "a" for e in fed.errors)
    done = r.feed(other[1], charged(gov, other[1]), 0.0)
    assert done.errors == [] and done.data is not None and done.charge is not None
    done.charge.release()
    r.close()
    assert gov.live_charges == 0 and gov.total_bytes == 0


def test_unknown_streams_whole_frames_and_age_abandon_or_refuse() -> None:
    gov = Governor(64 * MAX)
    r = Reassembler({"a"}, MAX, max_age_seconds=5.0)
    body = frame_bytes("a", 1, 1000)
    first, _ = pieces("a", 1, body, [400])
    stray = pb.FrameChunk(stream_id="zz", seq=1, total_bytes=10, offset=0, data=b"0123456789")
    assert [e.wire.code for e in r.feed(stray, charged(gov, stray), 0.0).errors] == [
        pb.UNKNOWN_STREAM
    ]
    assert r.feed(first, charged(gov, first), 0.0).errors == []
    assert r.held_bytes == 400
    gone = r.frame_arrived("a")  # a whole Frame on the stream abandons the incomplete one
    assert gone is not None and gone.wire.code == pb.CHUNK_ABANDONED and gone.frame.seq == 1  # type: ignore[union-attr]
    assert r.feed(first, charged(gov, first), 1.0).errors == []
    fresh = pb.FrameChunk(stream_id="zz", seq=1, total_bytes=10, offset=0, data=b"0123456789")
    late = r.feed(fresh, charged(gov, fresh), 7.0)  # any later feed expires the stale one
    assert sorted(e.wire.code for e in late.errors) == [pb.UNKNOWN_STREAM, pb.CHUNK_ABANDONED]
    assert r.in_progress == 0 and gov.live_charges == 0


def open_frames(gov: Governor, r: Reassembler, names: list[str], size: int, now: float) -> None:
    """The first piece (half) of a ``size``-byte frame on each of ``names``."""
    for name in names:
        first = pieces(name, 1, frame_bytes(name, 1, size), [size // 2])[0]
        assert r.feed(first, charged(gov, first), now).errors == []


def test_expire_drops_held_frames_on_a_timer_without_another_piece() -> None:
    gov = Governor(64 * MAX)
    r = Reassembler({"a", "b", "c"}, MAX, max_age_seconds=5.0)
    open_frames(gov, r, ["a", "b"], 4000, now=0.0)
    open_frames(gov, r, ["c"], 4000, now=3.0)
    held = gov.total_bytes
    assert held > 0 and r.charged_bytes == held
    assert r.expire(4.9) == []  # nothing is old enough yet
    gone = r.expire(5.1)  # no piece came: the timer alone drops a and b
    assert sorted((e.wire.code, e.frame.stream_id, e.frame.seq) for e in gone) == [  # type: ignore[union-attr]
        (pb.CHUNK_ABANDONED, "a", 1),
        (pb.CHUNK_ABANDONED, "b", 1),
    ]
    assert r.in_progress == 1 and gov.total_bytes == r.charged_bytes < held
    assert [e.frame.stream_id for e in r.expire(8.1)] == ["c"]  # type: ignore[union-attr]
    assert r.in_progress == 0 and gov.total_bytes == 0 and gov.live_charges == 0


def test_shed_cuts_back_to_a_share_dropping_the_least_recently_fed_first() -> None:
    gov = Governor(64 * MAX)
    names = [f"s{i}" for i in range(6)]
    r = Reassembler(set(names), MAX)
    for i, name in enumerate(names):
        open_frames(gov, r, [name], 20_000, now=float(i))
    # s0 is fed again (the frame its edge is sending now): it goes last.
    body = frame_bytes("s0", 1, 20_000)
    second = pieces("s0", 1, body, [10_000, 15_000])[1]
    assert r.feed(second, charged(gov, second), 9.0).errors == []
    per_frame = r.charged_bytes // 7  # six first halves and one quarter, about
    share = 3 * per_frame
    gone = r.shed(share, 10.0)
    assert [e.frame.stream_id for e in gone] == ["s1", "s2", "s3", "s4"]  # type: ignore[union-attr]
    assert all(e.wire.code == pb.CHUNK_ABANDONED and not e.fatal for e in gone)
    assert r.charged_bytes <= share and gov.total_bytes == r.charged_bytes
    assert r.shed(share, 11.0) == []  # within its share: nothing more goes
    assert len(r.shed(0, 12.0)) == 2 and gov.total_bytes == 0 and gov.live_charges == 0


def test_stalled_for_counts_time_holding_since_a_frame_last_completed() -> None:
    gov = Governor(64 * MAX)
    r = Reassembler({"a", "b"}, MAX, max_age_seconds=5.0)
    assert r.stalled_for(100.0) == 0.0  # holding nothing: never stalled
    open_frames(gov, r, ["a"], 4000, now=0.0)
    assert r.stalled_for(4.0) == 4.0
    assert len(r.expire(6.0)) == 1  # dropped at 6 s: the clock stops, but does not restart
    assert r.stalled_for(50.0) == 6.0  # idle time holding nothing does not count
    open_frames(gov, r, ["a"], 4000, now=50.0)  # the same edge holds again, completing nothing
    assert r.stalled_for(53.0) == 9.0
    # A piece completing a frame is progress: only what is still held counts from then on.
    open_frames(gov, r, ["b"], 4000, now=53.0)
    body = frame_bytes("a", 1, 4000)
    last = pieces("a", 1, body, [2000])[1]
    done = r.feed(last, charged(gov, last), 54.0)
    assert done.charge is not None
    done.charge.release()
    assert r.stalled_for(55.0) == 1.0
    r.close()
    assert gov.total_bytes == 0 and gov.live_charges == 0
