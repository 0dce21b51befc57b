"""The memory governor: FIFO grants, the admission limit, optional and forced charges, live
budget changes and exactly-once release, checked by examples and by a hypothesis state machine."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    precondition,
    rule,
)

from bridge.server.governor import Charge, Component, DoubleRelease, Governor, Tier, Waiter

T = Component.TRANSPORT


def granted(log: list[Charge | None]) -> list[int]:
    return [c.nbytes for c in log if c is not None]


def test_request_is_granted_at_once_when_there_is_room() -> None:
    gov = Governor(100, reserve_bytes=20)
    charge = gov.request(T, 80, lambda _: None)
    assert isinstance(charge, Charge) and charge.tier is Tier.ADMISSION
    assert gov.admitted_bytes == gov.total_bytes == 80 and gov.charged(T) == 80
    charge.release()
    assert gov.total_bytes == 0 and gov.live_charges == 0


def test_waiters_are_granted_in_order_and_passed_only_within_their_own_size() -> None:
    gov = Governor(100)
    held = gov.request(T, 90, lambda _: None)
    assert isinstance(held, Charge)
    log: list[Charge | None] = []
    big = gov.request(T, 50, log.append)
    assert isinstance(big, Waiter)
    # Fits now, and the big waiter lets up to its own size pass it: granted at once instead
    # of stalling behind the big one (issue 29: a good edge behind a 188 MiB decode grant).
    small = gov.request(T, 5, log.append)
    assert isinstance(small, Charge) and big.passed_bytes == 5
    small.release()
    for _ in range(9):  # 45 more, one at a time: 50 in all
        passed = gov.request(T, 5, log.append)
        assert isinstance(passed, Charge)
        passed.release()
    late = gov.request(T, 5, log.append)  # the big one's allowance is spent: it waits behind
    assert isinstance(late, Waiter) and gov.waiting == 2 and log == []
    held.release()
    assert granted(log) == [50, 5] and gov.waiting == 0
    assert gov.admitted_bytes == 55


def test_a_released_grant_lets_younger_waiters_pass_a_head_that_still_does_not_fit() -> None:
    gov = Governor(100)
    held = [gov.request(T, 30, lambda _: None) for _ in range(3)]  # 90 held
    log: list[Charge | None] = []
    head = gov.request(T, 60, log.append)
    bigger = gov.request(T, 70, log.append)  # younger, never passes the head (60 < 70)
    small = gov.request(T, 20, log.append)
    assert isinstance(head, Waiter) and isinstance(bigger, Waiter) and isinstance(small, Waiter)
    first = held.pop()
    assert isinstance(first, Charge)
    first.release()  # 60 held: the head (60) does not fit, the small one (20) does
    assert granted(log) == [20] and head.passed_bytes == 20 and bigger.passed_bytes == 20
    assert gov.waiting == 2


def test_a_request_that_can_never_fit_is_refused_at_once() -> None:
    gov = Governor(100, reserve_bytes=30)
    assert gov.never_fits(71) and not gov.never_fits(70)
    assert gov.request(T, 71, lambda _: None) is None
    assert gov.stats.refused == 1 and gov.total_bytes == 0


def test_a_shrink_refuses_waiters_that_no_longer_fit_and_unblocks_the_rest() -> None:
    gov = Governor(100)
    held = gov.request(T, 100, lambda _: None)
    assert isinstance(held, Charge)
    log: list[Charge | None] = []
    gov.request(T, 80, log.append)
    gov.request(T, 10, log.append)
    gov.set_budget(40)  # the 80-byte head can never fit now: refused, not blocking the 10
    assert log == [None]
    held.release()
    assert granted(log) == [10]


def test_a_shrink_below_what_is_held_pauses_admission_until_it_drains() -> None:
    gov = Governor(100)
    a = gov.request(T, 60, lambda _: None)
    assert isinstance(a, Charge)
    gov.set_budget(50)
    assert gov.over_admission
    log: list[Charge | None] = []
    assert isinstance(gov.request(T, 10, log.append), Waiter)
    a.resize(45)  # still 45 + 10 > 50
    assert log == []
    a.resize(40)
    assert granted(log) == [10] and gov.admitted_bytes == 50


def test_cancelled_head_unblocks_the_queue() -> None:
    gov = Governor(100)
    held = gov.request(T, 90, lambda _: None)
    log: list[Charge | None] = []
    head = gov.request(T, 15, log.append)
    passing = gov.request(T, 10, log.append)  # within the head's allowance: passes
    assert isinstance(passing, Charge)
    passing.release()
    behind = gov.request(T, 10, log.append)  # 5 of the head's 15 left: waits behind it
    assert isinstance(held, Charge) and isinstance(head, Waiter) and isinstance(behind, Waiter)
    gov.cancel(head)
    gov.cancel(head)  # idempotent
    assert granted(log) == [10]


def test_try_charge_uses_the_reserve_but_never_overdraws() -> None:
    gov = Governor(100, reserve_bytes=40)
    held = gov.request(T, 60, lambda _: None)
    assert isinstance(held, Charge)
    sub = gov.try_charge(Component.SUBSCRIBERS, 40)
    assert sub is not None and gov.total_bytes == 100
    assert gov.try_charge(Component.SUBSCRIBERS, 1) is None
    assert gov.stats.optional_refused == 1
    sub.release()
    held.release()


def test_pinned_charges_shrink_what_admission_can_ever_grant() -> None:
    gov = Governor(100, reserve_bytes=20)
    log: list[Charge | None] = []
    held = gov.request(T, 50, lambda _: None)
    assert isinstance(held, Charge)
    assert isinstance(gov.request(T, 60, log.append), Waiter)  # fits 80 - 0 pinned: waits
    session = gov.try_charge(Component.SESSIONS, 25, pinned=True)
    assert session is not None and session.tier is Tier.PINNED
    assert log == [None], "60 can never fit 80 - 25 pinned: refused, not blocking the queue"
    assert gov.admissible_bytes == 55 and gov.fair_share(5) == 11 and gov.never_fits(56)
    more = gov.try_charge(Component.SESSIONS, 6, pinned=True)  # admission full: still welcome
    assert more is not None and gov.admitted_bytes == 81 and gov.over_admission
    more.release()
    assert gov.try_charge(Component.SESSIONS, 56, pinned=True) is None  # 25 + 56 pinned > 80
    session.release()
    held.release()
    assert gov.admitted_bytes == gov.pinned_bytes == gov.total_bytes == 0


def test_forced_charges_always_succeed_and_overdraft_is_counted() -> None:
    gov = Governor(100, reserve_bytes=20)
    held = gov.request(T, 80, lambda _: None)
    assert isinstance(held, Charge)
    out = gov.force(Component.DECIMATION, 30)
    assert gov.total_bytes == 110 and gov.stats.overdraft_peak_bytes == 10
    assert gov.admitted_bytes == 80  # forced bytes never count against admission
    out.release()
    held.release()
    assert gov.stats.overdraft_peak_bytes == 10  # a peak, kept for the metric


def test_move_relabels_without_changing_totals() -> None:
    gov = Governor(100)
    charge = gov.request(T, 30, lambda _: None)
    assert isinstance(charge, Charge)
    charge.move(Component.RING)
    assert gov.charged(T) == 0 and gov.charged(Component.RING) == 30
    assert gov.admitted_bytes == 30
    charge.release()
    assert gov.charged(Component.RING) == 0


def test_split_carves_a_message_out_of_a_connection_grant() -> None:
    gov = Governor(100)
    conn = gov.request(T, 60, lambda _: None)
    assert isinstance(conn, Charge)
    msg = conn.split(25)
    assert (conn.nbytes, msg.nbytes, gov.total_bytes, gov.live_charges) == (35, 25, 60, 2)
    with pytest.raises(ValueError, match="cannot split"):
        conn.split(36)
    more = gov.request(T, 5, lambda _: None)
    assert isinstance(more, Charge)
    conn.merge(more)
    assert conn.nbytes == 40 and more.released and gov.live_charges == 2
    with pytest.raises(DoubleRelease):
        more.release()
    msg.move(Component.RING)
    with pytest.raises(ValueError, match="same component"):
        conn.merge(msg)
    msg.release()
    conn.release()
    assert gov.total_bytes == gov.admitted_bytes == gov.live_charges == 0
    gov.stats.double_releases = 0


def test_double_release_raises_and_is_counted() -> None:
    gov = Governor(100)
    charge = gov.force(Component.EGRESS, 10)
    charge.release()
    with pytest.raises(DoubleRelease):
        charge.release()
    with pytest.raises(DoubleRelease):
        charge.resize(5)
    with pytest.raises(DoubleRelease):
        charge.move(Component.RING)
    assert gov.stats.double_releases == 1 and gov.total_bytes == 0


def test_bad_budgets_and_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match="reserve"):
        Governor(10, reserve_bytes=11)
    gov = Governor(10)
    with pytest.raises(ValueError, match="negative"):
        gov.force(T, -1)


def test_fair_share_has_no_floor() -> None:
    gov = Governor(64 << 20, reserve_bytes=16 << 20)
    assert gov.fair_share(0) == gov.fair_share(1) == 48 << 20
    assert gov.fair_share(32) == (48 << 20) // 32  # 1.5 MiB, even if frames are 16 MiB


class GovernorMachine(RuleBasedStateMachine):
    """Random interleavings of every operation; the ledger must always add up."""

    held = Bundle("held")

    def __init__(self) -> None:
        super().__init__()
        self.gov = Governor(1000, reserve_bytes=200)
        self.order: list[int] = []  # request ids in arrival order
        self.grant_order: list[int] = []
        self.pending: dict[int, Waiter] = {}
        self.granted: list[Charge] = []
        self.next_id = 0
        self.shrunk_below_held = False
        self.pinned: list[Charge] = []
        self.sizes: dict[int, int] = {}

    def _callback(self, rid: int):  # type: ignore[no-untyped-def]
        def on_grant(charge: Charge | None) -> None:
            self.pending.pop(rid, None)
            if charge is not None:
                self.grant_order.append(rid)
                self.granted.append(charge)

        return on_grant

    @rule(n=st.integers(0, 900))
    def request(self, n: int) -> None:
        rid = self.next_id
        self.next_id += 1
        self.sizes[rid] = n
        result = self.gov.request(T, n, self._callback(rid))
        if isinstance(result, Charge):
            self.grant_order.append(rid)
            self.granted.append(result)
        elif isinstance(result, Waiter):
            self.pending[rid] = result
        else:
            assert n > self.gov.admissible_bytes
            return
        self.order.append(rid)

    @precondition(lambda self: self.pending)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.pending)))
        self.gov.cancel(self.pending.pop(rid))
        self.order.remove(rid)

    @precondition(lambda self: self.granted)
    @rule(data=st.data())
    def release_granted(self, data: st.DataObject) -> None:
        charge = self.granted.pop(data.draw(st.integers(0, len(self.granted) - 1)))
        charge.release()

    @precondition(lambda self: self.granted)
    @rule(data=st.data(), n=st.integers(0, 300))
    def shrink_granted(self, data: st.DataObject, n: int) -> None:
        charge = data.draw(st.sampled_from(self.granted))
        charge.resize(min(charge.nbytes, n))  # processed results are smaller

    @rule(target=held, n=st.integers(0, 400), forced=st.booleans(), pinned=st.booleans())
    def optional_or_forced(self, n: int, forced: bool, pinned: bool) -> Charge | None:
        if forced:
            return self.gov.force(Component.DECIMATION, n)
        if pinned:
            charge = self.gov.try_charge(Component.SESSIONS, n, pinned=True)
            if charge is not None:
                self.pinned.append(charge)
            return charge
        before = self.gov.total_bytes
        charge = self.gov.try_charge(Component.SUBSCRIBERS, n)
        assert (charge is None) == (before + n > self.gov.budget_bytes)
        return charge

    @rule(charge=consumes(held))
    def release_held(self, charge: Charge | None) -> None:
        if charge is not None:
            charge.release()

    @rule(budget=st.integers(100, 1500))
    def set_budget(self, budget: int) -> None:
        self.gov.set_budget(budget, budget // 5)
        if not self._within():
            self.shrunk_below_held = True

    @invariant()
    def ledger_adds_up(self) -> None:
        gov = self.gov
        by_component = gov.stats.by_component
        assert sum(by_component.values()) == gov.total_bytes
        live_pinned = sum(c.nbytes for c in self.pinned if not c.released)
        assert gov.pinned_bytes == live_pinned
        assert gov.admitted_bytes == sum(c.nbytes for c in self.granted) + live_pinned
        assert all(v >= 0 for v in by_component.values())
        assert gov.stats.double_releases == 0

    def _within(self) -> bool:
        gov = self.gov
        forced = gov.charged(Component.DECIMATION)
        # documented exceptions: forced (progress) charges, and pinned ones (sessions), which are
        # welcome even while admission is full
        return (
            gov.admitted_bytes - gov.pinned_bytes <= gov.admission_limit
            and gov.total_bytes <= gov.budget_bytes + forced + gov.pinned_bytes
            and gov.pinned_bytes <= gov.admission_limit
        )

    @invariant()
    def only_forced_charges_overdraw_except_after_a_shrink(self) -> None:
        """Admission stays under its limit and only forced charges go past the budget, except
        for what was already held when the budget fell (it drains; nothing new is granted)."""
        if self._within():
            self.shrunk_below_held = False
        assert self._within() or self.shrunk_below_held

    @invariant()
    def grants_pass_older_waiters_only_within_their_size(self) -> None:
        """Out of arrival order only past waiters that allow it: the bytes granted to younger
        requests while one waits never exceed its own size."""
        granted = set(self.grant_order)
        for rid, waiter in self.pending.items():
            younger = [r for r in self.grant_order if r > rid]
            passed = sum(self.sizes[r] for r in younger if r in granted)
            assert passed == waiter.passed_bytes <= waiter.nbytes

    @invariant()
    def no_waiter_while_the_head_fits(self) -> None:
        gov = self.gov
        if gov.waiting:
            head = next(iter(self.pending.values()), None)
            assert head is not None
            first = min(self.pending)
            n = self.pending[first].nbytes
            assert (
                gov.admitted_bytes + n > gov.admission_limit
                or gov.total_bytes + n > gov.budget_bytes
            )

    def teardown(self) -> None:
        for waiter in list(self.pending.values()):
            self.gov.cancel(waiter)
        for charge in list(self.granted):
            if not charge.released:
                charge.release()
        self.granted.clear()
        # held bundle charges are released by consumes() rules only; count those still live
        live_forced = self.gov.live_charges
        assert self.gov.total_bytes == sum(self.gov.stats.by_component.values())
        assert live_forced >= 0


TestGovernorMachine = GovernorMachine.TestCase
TestGovernorMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


@settings(max_examples=200, deadline=None)
@given(
    budget=st.integers(0, 1000),
    sizes=st.lists(st.integers(0, 1200), max_size=20),
    order=st.randoms(use_true_random=False),
)
def test_every_grant_is_released_exactly_once(
    budget: int, sizes: list[int], order: random.Random
) -> None:
    """Whatever is requested, granted at once or later, or refused, releasing every grant in
    any order leaves the ledger empty, each charge released once and no waiter behind."""
    gov = Governor(budget)
    charges: list[Charge] = []
    refused = 0

    def grant(c: Charge | None) -> None:
        nonlocal refused
        if c is None:
            refused += 1
        else:
            charges.append(c)

    for n in sizes:
        got = gov.request(T, n, grant)
        if isinstance(got, Charge):
            charges.append(got)
        elif got is None:
            refused += 1
    released = 0
    while charges:
        charges.pop(order.randrange(len(charges))).release()
        released += 1
    assert released + refused == len(sizes)
    assert gov.total_bytes == gov.admitted_bytes == gov.live_charges == 0
    assert gov.waiting == 0 and gov.stats.double_releases == 0
