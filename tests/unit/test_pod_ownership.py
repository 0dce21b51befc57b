"""The supervisor's ownership table (bridge/pod/ownership.py): every case of issue 31's device
ownership list, as decisions (the processes' side is tested in tests/integration)."""

from __future__ import annotations

from bridge.pod.ownership import MAX_WAITING_CLAIMS, AskRelease, Grant, Ownership, Refuse

ALIVE = frozenset({0, 1, 2})


def test_an_unowned_device_is_granted_and_owned() -> None:
    table = Ownership(release_timeout=2.0)
    [grant] = table.claim("d", 1, 10, 0.0, alive=ALIVE)
    assert isinstance(grant, Grant) and (grant.to, grant.claim_id, grant.why) == (1, 10, "unowned")
    assert table.owner("d") == 1


def test_a_reconnect_to_the_owner_is_granted_without_asking_anyone() -> None:
    table = Ownership(release_timeout=2.0)
    table.claim("d", 1, 10, 0.0, alive=ALIVE)
    [grant] = table.claim("d", 1, 11, 1.0, alive=ALIVE)
    assert isinstance(grant, Grant) and grant.why == "own"


def test_a_device_owned_elsewhere_is_released_and_starts_above_what_the_owner_delivered() -> None:
    table = Ownership(release_timeout=2.0)
    first = table.claim("d", 0, 1, 0.0, alive=ALIVE)[0]
    [ask] = table.claim("d", 2, 7, 1.0, token="tok", proven=False, alive=ALIVE)
    assert isinstance(ask, AskRelease) and (ask.owner, ask.device, ask.token) == (0, "d", "tok")
    [grant] = table.released(ask.release_id, True, "", {"lidar": 41}, 1.1)
    assert isinstance(grant, Grant) and (grant.to, grant.claim_id) == (2, 7)
    assert grant.delivered == {"lidar": 41} and grant.why == "released"
    assert isinstance(first, Grant) and grant.epoch > first.epoch
    assert table.owner("d") == 2


def test_an_owner_with_a_live_connection_refuses_and_keeps_the_device() -> None:
    table = Ownership(release_timeout=2.0)
    table.claim("d", 0, 1, 0.0, alive=ALIVE)
    [ask] = table.claim("d", 1, 2, 0.5, alive=ALIVE)
    assert isinstance(ask, AskRelease)
    [refuse] = table.released(ask.release_id, False, "taken", {}, 0.6)
    assert refuse == Refuse(1, 2, "taken")
    assert table.owner("d") == 0


def test_two_hellos_at_two_processes_at_once_one_wins_the_other_asks_the_winner() -> None:
    table = Ownership(release_timeout=2.0)
    [grant] = table.claim("d", 0, 1, 0.0, alive=ALIVE)
    [ask] = table.claim("d", 1, 1, 0.0, alive=ALIVE)
    assert isinstance(grant, Grant) and isinstance(ask, AskRelease) and ask.owner == 0
    # The winner's Hello is still in progress: it refuses, and the second edge is told.
    assert table.released(ask.release_id, False, "taken", {}, 0.01) == [Refuse(1, 1, "taken")]


def test_a_dead_owner_s_devices_are_granted_at_once() -> None:
    table = Ownership(release_timeout=2.0)
    table.claim("d", 0, 1, 0.0, alive=ALIVE)
    [grant] = table.claim("d", 1, 2, 0.5, alive=frozenset({1, 2}))
    assert isinstance(grant, Grant) and grant.why == "owner-gone"


def test_an_owner_dying_while_asked_grants_the_waiting_claim() -> None:
    table = Ownership(release_timeout=2.0)
    table.claim("d", 0, 1, 0.0, alive=ALIVE)
    [ask] = table.claim("d", 1, 2, 0.5, alive=ALIVE)
    assert isinstance(ask, AskRelease)
    [grant] = table.process_gone(0, 0.6, alive=frozenset({1, 2}))
    assert isinstance(grant, Grant) and (grant.to, grant.why) == (1, "owner-gone")
    assert table.released(ask.release_id, True, "", {"s": 3}, 0.7) == []  # stale answer


def test_a_hung_owner_is_passed_over_after_the_release_timeout() -> None:
    table = Ownership(release_timeout=2.0)
    table.claim("d", 0, 1, 0.0, alive=ALIVE)
    table.claim("d", 1, 2, 1.0, alive=ALIVE)
    assert table.expire(2.9) == []
    [grant] = table.expire(3.0)
    assert isinstance(grant, Grant) and (grant.to, grant.why) == (1, "owner-timeout")


def test_claims_queue_behind_the_one_in_progress_and_the_queue_is_bounded() -> None:
    table = Ownership(release_timeout=2.0)
    table.claim("d", 0, 1, 0.0, alive=ALIVE)
    [ask] = table.claim("d", 1, 100, 0.1, alive=ALIVE)
    assert isinstance(ask, AskRelease)
    for n in range(MAX_WAITING_CLAIMS):
        assert table.claim("d", 2, 200 + n, 0.2, alive=ALIVE) == []
    [busy] = table.claim("d", 2, 999, 0.3, alive=ALIVE)
    assert isinstance(busy, Refuse) and busy.reason.startswith("busy")
    # The owner lets go: process 1 gets it, and the next waiting claim asks process 1.
    grant, ask2 = table.released(ask.release_id, True, "", {}, 0.4)
    assert isinstance(grant, Grant) and grant.to == 1
    assert isinstance(ask2, AskRelease) and ask2.owner == 1


def test_the_table_forgets_devices_whose_sessions_ended_and_those_of_a_dead_process() -> None:
    table = Ownership(release_timeout=2.0)
    for n in range(10):
        table.claim(f"d{n}", n % 2, n, 0.0, alive=ALIVE)
    table.forget("d0", 0)
    table.forget("d1", 0)  # not its owner: ignored
    assert len(table) == 9 and table.owner("d1") == 1
    assert table.process_gone(1, 1.0, alive=frozenset({0})) == []
    assert len(table) == 4 and table.owned_by(0) == 4
