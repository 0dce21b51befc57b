"""MarksGate: which of the Hellos' watermark queries go to the sink (issue 32), on a clock of our
own. The integration side, with a real sink, is tests/integration/test_sink_marks_bound.py."""

from __future__ import annotations

from pathlib import Path

from bridge.server.push_impl import MARKS_TIMEOUT_SECONDS, Marks, MarksGate, MarksLimits

PROTOCOL_MD = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"

MARKS: Marks = [(("d", "s"), 7)]


def test_the_rate_admits_the_burst_then_per_second() -> None:
    gate = MarksGate(MarksLimits(in_flight=100, per_second=2.0, burst=3))
    admitted = []
    for tick in range(40):  # 4 s in steps of 0.1 s, five Hellos per step
        now = tick * 0.1
        for _ in range(5):
            if gate.admit(now) is None:
                admitted.append(now)
                gate.done("d", now, None, timed_out=False)
    assert admitted[:3] == [0.0, 0.0, 0.0]  # the burst
    assert len(admitted) == 3 + 7  # then 2 a second: 7.8 tokens in 3.9 s
    assert gate.admit(3.95) == "rate"


def test_queries_open_at_once_are_capped() -> None:
    gate = MarksGate(MarksLimits(in_flight=2, per_second=1000.0, burst=1000))
    assert gate.admit(0.0) is None and gate.admit(0.0) is None
    assert gate.admit(0.0) == "in_flight"
    gate.done("a", 0.1, MARKS, timed_out=False)
    assert gate.admit(0.1) is None


def test_a_timeout_quiets_every_query_for_the_stall_period() -> None:
    gate = MarksGate(MarksLimits(stall_seconds=5.0))
    assert gate.admit(0.0) is None
    gate.done("a", 0.5, None, timed_out=True)
    assert gate.admit(1.0) == gate.admit(5.4) == "stalled"
    assert gate.admit(5.5) is None  # one query probes again
    gate.reset()  # a new push stream: not stalled any more
    gate.done("b", 5.6, None, timed_out=True)
    gate.reset()
    assert gate.admit(5.7) is None


def test_answers_are_cached_for_a_while_and_only_answers() -> None:
    gate = MarksGate(MarksLimits(cache_seconds=2.0))
    gate.admit(0.0)
    gate.done("robot", 0.0, MARKS, timed_out=False)
    gate.admit(0.0)
    gate.done("silent", 0.0, None, timed_out=False)  # no answer: nothing to serve
    gate.admit(0.0)
    gate.done("empty", 0.0, [], timed_out=False)  # "holds nothing" is an answer
    assert gate.cached("robot", 1.9) == MARKS
    assert gate.cached("empty", 1.9) == []
    assert gate.cached("silent", 0.1) is None
    assert gate.cached("robot", 2.0) is None
    gate.admit(3.0)
    gate.done("robot", 3.0, MARKS, timed_out=False)
    gate.reset()  # a new push stream, maybe a sink that lost its state
    assert gate.cached("robot", 3.1) is None


def test_the_cache_keeps_the_newest_devices() -> None:
    gate = MarksGate(MarksLimits(cache_devices=3, in_flight=100, burst=100))
    for n in range(5):
        assert gate.admit(0.0) is None
        gate.done(f"d{n}", 0.0, MARKS, timed_out=False)
    kept = {n for n in range(5) if gate.cached(f"d{n}", 0.1) is not None}
    assert kept == {2, 3, 4}


def test_protocol_md_states_the_limits_a_sink_sees() -> None:
    text = " ".join(PROTOCOL_MD.read_text().split())
    d = MarksLimits()
    for phrase in (
        f"it waits at most {MARKS_TIMEOUT_SECONDS:g} s",
        f"Hellos for {d.cache_seconds:g} s",
        f"at most {d.in_flight} queries are open",
        f"about {d.per_second:g} a second are sent (a burst of {d.burst})",
        f"none is sent for {d.stall_seconds:g} s",
    ):
        assert phrase in text, phrase
