"""The memory pressure guard (bridge.pressure) and its hook in the governor: resident memory past
the line holds admission back by as much, never forward progress, and nothing is refused for it."""

from __future__ import annotations

from bridge.governor import Charge, Component, Governor, Waiter
from bridge.pressure import PressurePolicy

MiB = 1 << 20


def test_the_line_keeps_a_fraction_of_the_limit_or_two_frames_free() -> None:
    policy = PressurePolicy(margin_fraction=0.10, min_margin_bytes=32 * MiB)
    assert policy.line(1000 * MiB) == 900 * MiB
    assert policy.line(256 * MiB) == 224 * MiB  # 10 % is less than two 16 MiB frames
    assert policy.check(800 * MiB, 1000 * MiB).hold_bytes == 0
    assert policy.check(950 * MiB, 1000 * MiB).hold_bytes == 50 * MiB
    assert policy.check(10_000 * MiB, None).hold_bytes == 0  # no limit: nothing to guard


def test_pressure_holds_admission_back_until_it_falls() -> None:
    governor = Governor(100 * MiB)
    granted: list[Charge | None] = []
    first = governor.request(Component.TRANSPORT, 40 * MiB, granted.append)
    assert isinstance(first, Charge)
    governor.set_pressure(61 * MiB)
    assert governor.over_admission
    waiter = governor.request(Component.TRANSPORT, 20 * MiB, granted.append)
    assert isinstance(waiter, Waiter) and granted == []  # waits: 40 + 20 + 61 > 100
    assert not governor.never_fits(60 * MiB)  # pressure refuses nothing, it only delays
    progress = governor.force(Component.EGRESS, 30 * MiB)  # forward progress is never held
    assert progress.nbytes == 30 * MiB
    progress.release()
    governor.set_pressure(0)  # resident memory fell back under the line
    assert len(granted) == 1 and granted[0] is not None and granted[0].nbytes == 20 * MiB
    for charge in (first, granted[0]):
        charge.release()
    assert governor.live_charges == 0
