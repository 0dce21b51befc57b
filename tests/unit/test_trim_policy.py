"""HeapTrimPolicy: free heap inside the data budget is left for the next frames to reuse, trimmed
only once it has sat unused; past the budget it is trimmed at once, at most once a second."""

from __future__ import annotations

from bridge.server.trimpolicy import IDLE, OVER_BUDGET, OVER_LIMIT, HeapTrimPolicy

MiB = 1 << 20
BASE = 60 * MiB
BUDGET = 512 * MiB


def policy() -> HeapTrimPolicy:
    return HeapTrimPolicy(slack_bytes=32 * MiB, idle_seconds=10.0)


def test_churn_inside_the_budget_is_not_trimmed_every_second() -> None:
    # Measured in the 1.2 MB x32 gRPC relay: 365 MiB charged, ~50 MiB more resident.
    p = policy()
    rss = BASE + 365 * MiB + 50 * MiB
    assert [p.decide(t * 0.25, rss, BASE, 365 * MiB, BUDGET) for t in range(36)] == [None] * 36


def test_an_excess_that_lasts_is_trimmed_once_per_idle_period() -> None:
    p = policy()
    rss = BASE + 100 * MiB + 40 * MiB
    got = [(t, p.decide(float(t), rss, BASE, 100 * MiB, BUDGET)) for t in range(25)]
    assert [(t, r) for t, r in got if r] == [(10, IDLE), (21, IDLE)]


def test_an_excess_that_comes_and_goes_restarts_the_idle_clock() -> None:
    p = policy()
    for t in range(30):
        extra = 40 * MiB if t % 5 else 0  # every fifth sample the heap is in use again
        assert p.decide(float(t), BASE + 100 * MiB + extra, BASE, 100 * MiB, BUDGET) is None


def test_past_the_budget_the_heap_is_trimmed_at_once_and_at_most_once_a_second() -> None:
    p = policy()
    rss = BASE + BUDGET + 33 * MiB
    got = [p.decide(t * 0.25, rss, BASE, 300 * MiB, BUDGET) for t in range(9)]
    assert got == [OVER_BUDGET, None, None, None, OVER_BUDGET, None, None, None, OVER_BUDGET]


def test_charged_data_above_the_budget_is_not_counted_as_free_heap() -> None:
    # Forced charges may overdraw the budget: only what exceeds the charged data is slack.
    p = policy()
    charged = BUDGET + 64 * MiB
    assert p.decide(0.0, BASE + charged + 20 * MiB, BASE, charged, BUDGET) is None
    assert p.decide(0.5, BASE + charged + 40 * MiB, BASE, charged, BUDGET) == OVER_BUDGET


def test_a_planned_shrink_trim_counts_for_the_interval_and_the_idle_clock() -> None:
    p = policy()
    rss = BASE + 100 * MiB + 40 * MiB
    assert p.decide(0.0, rss, BASE, 100 * MiB, BUDGET) is None
    p.trimmed(9.5)
    assert p.decide(10.0, rss, BASE, 100 * MiB, BUDGET) is None  # 10 s since the excess began
    assert p.decide(19.5, rss, BASE, 100 * MiB, BUDGET) is None  # 9.5 s since the trim
    assert p.decide(20.0, rss, BASE, 100 * MiB, BUDGET) == IDLE


def test_any_excess_past_the_budget_is_trimmed_at_once() -> None:
    # A shrink lowers the budget under what the heap holds: no further slack past the budget
    # (an earlier draft allowed one, and RSS stayed 16 MB above the new limit in CI).
    p = policy()
    assert p.decide(0.0, BASE + BUDGET + 10 * MiB, BASE, 300 * MiB, BUDGET) == OVER_BUDGET


def test_above_the_planned_limit_the_heap_is_trimmed_on_every_call_whatever_the_slack() -> None:
    # Seen in CI: a decrease held at 93 MiB while RSS sat at 93-94 MiB with 781 KiB in the ring;
    # the free heap was far below the slack, and frames in flight grow it back within 250 ms.
    p = policy()
    limit = 93 * MiB
    rss = limit + 700 * 1024
    assert [p.decide(t * 0.25, rss, 85 * MiB, MiB, 2 * MiB, limit) for t in range(6)] == [
        OVER_LIMIT
    ] * 6
    assert p.decide(3.0, limit - 1, 85 * MiB, MiB, 2 * MiB, limit) is None  # under it: as before


def test_a_limit_that_stays_out_of_reach_costs_one_trim_a_second_after_the_idle_period() -> None:
    p = policy()
    limit = 60 * MiB  # e.g. below the libraries' resident pages: no trim gets RSS under it
    got = [p.decide(t * 0.25, limit + MiB, 85 * MiB, MiB, 2 * MiB, limit) for t in range(48)]
    assert got[:40] == [OVER_LIMIT] * 40  # the first 10 s: every pass
    assert got[40:] == [None, None, None, OVER_LIMIT] * 2  # then once a second
    assert p.decide(12.0, limit - 1, 85 * MiB, MiB, 2 * MiB, limit) is None
    assert p.decide(12.25, limit + MiB, 85 * MiB, MiB, 2 * MiB, limit) == OVER_LIMIT  # anew


def test_an_unlimited_plan_changes_nothing() -> None:
    p = policy()
    rss = BASE + 365 * MiB + 50 * MiB
    assert [p.decide(t * 0.25, rss, BASE, 365 * MiB, BUDGET, None) for t in range(8)] == [None] * 8
