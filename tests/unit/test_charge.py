"""A charge that owns itself (issue 30): a move-only token with ``transfer``, ``release`` and
``with``, owner tags, and debug mode's leak reports at the end of a connection or a bridge."""

from __future__ import annotations

import pytest

from bridge.server import governor as governor_mod
from bridge.server.governor import Charge, Component, DoubleRelease, Governor, MovedCharge

T, R = Component.TRANSPORT, Component.RING


def test_a_double_release_raises_and_is_counted() -> None:
    gov = Governor(100, debug=True)
    charge = gov.force(T, 10)
    charge.release()
    with pytest.raises(DoubleRelease):
        charge.release()
    assert gov.stats.double_releases == 1
    assert gov.total_bytes == 0 and gov.live_charges == 0  # nothing released twice


def test_a_moved_handle_cannot_be_used() -> None:
    gov = Governor(100, debug=True)
    old = gov.force(T, 10, owner="conn")
    new = old.transfer()
    assert old.moved and old.released and not new.released
    assert new.nbytes == 10 and new.owner == "conn" and gov.live_charges == 1
    with pytest.raises(MovedCharge):
        old.release()
    assert gov.stats.double_releases == 1  # releasing a moved handle would free its bytes twice
    for use in (lambda: old.resize(5), lambda: old.split(1), lambda: old.transfer()):
        with pytest.raises(MovedCharge):
            use()
    with pytest.raises(MovedCharge), old:
        pass
    assert gov.total_bytes == 10 and gov.live_charges == 1
    new.release()
    assert gov.total_bytes == 0 and gov.live_charges == 0


def test_transfer_retags_the_owner_and_moves_the_component() -> None:
    gov = Governor(100, debug=True)
    charge = gov.force(T, 30, owner="conn")
    ring = charge.transfer(None, R)
    assert ring.owner is None and ring.component is R
    assert gov.charged(T) == 0 and gov.charged(R) == 30
    assert gov.end_owner("conn") == [] and gov.stats.leaked_charges == 0
    ring.release()


def test_with_releases_on_every_path_unless_transferred() -> None:
    gov = Governor(100)
    with gov.force(T, 10) as charge:
        pass
    assert charge.released and gov.live_charges == 0
    with pytest.raises(RuntimeError), gov.force(T, 10):
        raise RuntimeError("boom")
    assert gov.live_charges == 0
    with gov.force(T, 10) as charge:
        kept = charge.transfer()
    assert gov.live_charges == 1 and not kept.released
    with kept:
        kept.release()  # released inside the block: the exit leaves it alone
    assert gov.live_charges == 0 and gov.stats.double_releases == 0


def test_split_and_merge_keep_the_owner_ledger() -> None:
    gov = Governor(100, debug=True)
    whole = gov.force(T, 30, owner="conn")
    part = whole.split(10)
    assert part.owner == "conn" and len(gov.live_of("conn")) == 2
    whole.merge(part)
    assert gov.live_of("conn") == [whole]
    whole.release()
    assert gov.live_of("conn") == []


def test_a_leaked_charge_at_connection_end_is_reported() -> None:
    gov = Governor(100, debug=True)
    leaks_before = len(governor_mod.LEAKS)
    granted = gov.request(T, 20, lambda _: None, owner="conn")
    assert isinstance(granted, Charge)
    kept = granted.split(5)
    granted.release()
    left = gov.end_owner("conn")
    assert left == [kept] and gov.stats.leaked_charges == 1
    assert "'conn' ended holding 1 charge(s): transport 5 B" in gov.leaks[0]
    assert governor_mod.LEAKS[leaks_before:] == gov.leaks
    del governor_mod.LEAKS[leaks_before:]  # reported on purpose: not this test's failure
    assert gov.describe()["leaked_charges"] == 1
    kept.release()
    assert gov.end_owner("conn") == []


def test_a_bridge_that_closes_with_live_charges_is_reported() -> None:
    gov = Governor(100, debug=True)
    leaks_before = len(governor_mod.LEAKS)
    charge = gov.force(R, 7)
    assert not gov.check_all_released()
    assert gov.leaks == ["bridge closed with 1 live charges: 1 charge(s): ring 7 B"]
    del governor_mod.LEAKS[leaks_before:]
    charge.release()
    assert gov.check_all_released()


def test_debug_mode_follows_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(governor_mod.DEBUG_ENV, "1")
    assert Governor(10).debug
    monkeypatch.setenv(governor_mod.DEBUG_ENV, "0")
    assert not Governor(10).debug and not Governor(10, debug=False).debug
    off = Governor(10)
    off.force(T, 1, owner="conn")
    assert off.end_owner("conn") == [] and off.live_of("conn") == []  # not tracked: no cost


def test_adopt_retags_in_place_unless_the_ledger_is_kept() -> None:
    plain = Governor(100, debug=False)
    charge = plain.force(T, 10, owner="transport")
    assert charge.adopt("conn") is charge and charge.owner == "conn"
    charge.release()
    gov = Governor(100, debug=True)
    old = gov.force(T, 10, owner="transport")
    new = old.adopt("conn")
    assert old.moved and new.owner == "conn" and gov.live_of("transport") == []
    assert gov.live_of("conn") == [new]
    new.release()
