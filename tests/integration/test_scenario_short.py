"""The frame-drop benchmark end to end, short: ci-short in place, then the same plan as restarts.

Real processes: the bridge is a child ``simbridge serve`` reading a cgroup directory the runner
writes (and, as root where a cgroup CPU controller is writable, really throttled: the report says
which); the sink and 4 edges (2 WebSocket, 2 gRPC) run here. Every number asserted comes from the
sink's record (loadgen.phases), never from the bridge's metrics.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from loadgen import report
from loadgen.runner import run_scenario
from loadgen.scenario import builtin

pytestmark = pytest.mark.timeout(150)


# The restart baseline counts one disconnect per edge per restart. On a loaded machine an edge can
# still be reconnecting (the Drain's reconnect delay, then the new bridge's startup) when the next
# restart comes; it is then not disconnected again (seen: 12-20 of 24 on a busy 2-core VM, never
# a lost frame). The in-place checks have no such race. Only that exact count is marked; the
# restart run's delivery, exit codes and stall are asserted strictly on their own.
SHORT = builtin("ci-short")
RESTARTS = len(SHORT.resizes)  # the restart baseline restarts the bridge at every resize step

RESTART_RACE = pytest.mark.xfail(
    strict=False,
    reason="restart baseline: an edge still reconnecting at the next restart is not counted",
)


@pytest.fixture(scope="module")
def outcome(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    import asyncio

    out = tmp_path_factory.mktemp("reports")
    rep = asyncio.run(run_scenario(SHORT, out, backend="local"))
    return rep, out


def _run(rep: dict[str, Any], mode: str) -> dict[str, Any]:
    (run,) = [r for r in rep["runs"] if r["mode"] == mode]
    return run


def test_report_validates_and_says_how_cpu_was_throttled(
    outcome: tuple[dict[str, Any], Path],
) -> None:
    rep, out = outcome
    report.validate(rep)
    path = report.write(rep, out, "ci-short")
    assert report.load(path) == rep
    for run in rep["runs"]:
        throttle = run["cpu_throttle"]
        assert throttle.startswith(("real (cgroup", "simulated only")), throttle
        print(f"{run['mode']}: cpu throttle {throttle}")  # visible with -s / in the -ra summary
    print(report.render_text(rep))


def test_in_place_loses_nothing_and_never_disconnects(
    outcome: tuple[dict[str, Any], Path],
) -> None:
    rep, _ = outcome
    run = _run(rep, "in-place")
    t = run["totals"]
    assert t["published"] == SHORT.edges * SHORT.frames_per_edge
    assert t["delivered"] == t["published"]
    assert (t["lost"], t["duplicates"], t["gap_frames"], t["disconnects"]) == (0, 0, 0, 0)
    assert t["undelivered_at_end"] == 0
    # the sink's own counters agree with the phase accounting
    assert run["sink"]["totals"]["lost"] == 0 and run["sink"]["totals"]["duplicates"] == 0
    assert all(p["lost"] == 0 and p["disconnects"] == 0 for p in run["phases"])
    assert run["bridge"]["exit_codes"] == [0]  # one bridge for the whole run, drained at the end


def test_in_place_resizes_are_adapted_live(outcome: tuple[dict[str, Any], Path]) -> None:
    rep, _ = outcome
    run = _run(rep, "in-place")
    resizes = run["resizes"]
    assert len(resizes) >= 6 and not [x for x in resizes if x["notes"] and not x["held"]]
    for x in resizes:
        assert x["resolved"], x
        assert x["time_to_adapt_ms"] is not None and x["time_to_adapt_ms"] < 2000, x
        if x["cpu"] is not None:
            assert x["plan"]["cpu_limit_cores"] == pytest.approx(x["cpu"])
    assert run["time_to_adapt_ms"]["count"] == len(resizes)
    # memory down to 1Gi: the ring budget follows the limit
    by_mem = {x["memory_bytes"]: x for x in resizes if not x["below_usage"]}
    assert (
        by_mem[1 << 30]["plan"]["ring_budget_bytes"] < by_mem[3 << 30]["plan"]["ring_budget_bytes"]
    )


def test_memory_decrease_below_usage_is_held_and_planned_for_first(
    outcome: tuple[dict[str, Any], Path],
) -> None:
    """The memory-decrease guard (docs/kubernetes.md): the node keeps the old memory.max while
    usage >= the new limit; the bridge plans for the lower limit at once (ring budget to the
    floor), before it is enacted."""
    rep, _ = outcome
    (x,) = [x for x in _run(rep, "in-place")["resizes"] if x["below_usage"]]
    assert x["memory_bytes"] < x["usage_at_request_bytes"]
    assert x["held"] and x["hold_s"] is not None
    assert x["planned_s"] is not None
    # resolved: usage fell below the new limit within the hold, then memory.max was lowered
    assert x["resolved"] and x["written_s"] is not None, x["notes"]
    assert x["planned_s"] <= x["written_s"] + 0.05  # planned for before (or as) it was enacted
    assert x["time_to_adapt_ms"] is not None
    assert x["plan"]["memory_limit_bytes"] == x["memory_bytes"]  # planned for the new limit


def test_restart_baseline_loses_nothing_and_stalls_longer_than_in_place(
    outcome: tuple[dict[str, Any], Path],
) -> None:
    rep, _ = outcome
    run = _run(rep, "restart")
    t = run["totals"]
    # every restart disconnects the edges connected at that moment: at least the first one all
    assert SHORT.edges <= t["disconnects"] <= SHORT.edges * RESTARTS
    assert t["lost"] == 0  # edges resend what was not delivered: nothing lost, only late
    assert t["delivered"] == t["published"]
    assert t["max_stall_s"] > 0
    assert run["bridge"]["exit_codes"] == [0] * (RESTARTS + 1)  # each drained cleanly
    # the restart stalls delivery much longer than the in-place resizes ever did
    in_place = _run(rep, "in-place")
    assert t["max_stall_s"] > in_place["totals"]["max_stall_s"]


@RESTART_RACE
def test_restart_baseline_disconnects_every_edge_each_time(
    outcome: tuple[dict[str, Any], Path],
) -> None:
    rep, _ = outcome
    run = _run(rep, "restart")
    assert run["totals"]["disconnects"] == SHORT.edges * RESTARTS
    resize_phases = [p for p in run["phases"] if p["kind"] == "resize"]
    assert sum(p["disconnects"] for p in resize_phases) == SHORT.edges * RESTARTS
