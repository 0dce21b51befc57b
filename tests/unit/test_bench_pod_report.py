"""The pod's container run verdicts (``make e2e-container``, benchmarks/container/pod_report.py): a
clean run passes every check, and each way a live resize of a pod can go wrong fails the check
that names it. The rig itself runs against a real container only in ``make e2e-container``."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.container.pod_report import (
    checks,
    device_pauses,
    render,
    stage_delays,
    step_table,
)
from benchmarks.container.pod_rig import PodRig, PodScenario, PodStep
from benchmarks.container.rig import MiB, RigConfig, Sample, StepResult
from loadgen.record import FrameRecord, encode

S = 1_000_000_000  # ns


def _record(path: Path, stalls: dict[str, tuple[float, float]]) -> None:
    """Two devices at 10 Hz from 0 to 30 s; ``stalls``: a device's frames missing in (a, b)."""
    lines = []
    for device in ("d0", "d1"):
        lo, hi = stalls.get(device, (-1.0, -1.0))
        for k in range(300):
            t = k / 10
            if not lo < t < hi:
                ns = int(t * S)
                rec = FrameRecord(
                    device, "lidar", k, 0, ns, ns, ns, ns + (S // 20 if k == 250 else 0)
                )
                lines.append(encode(rec))
    lines.append(encode(FrameRecord("d0", "lidar", 3, received_ns=int(5 * S)), duplicate=True))
    path.write_text("".join(lines))


def _rig(tmp_path: Path, stalls: dict[str, tuple[float, float]] | None = None) -> PodRig:
    """Start N=1; step 1 at 10 s adds a process (N=2); step 2 at 20 s retires it (N=1), moving
    the 2 devices it held; d1's frames stop 0.95 s there (its move)."""
    record = tmp_path / "sink.jsonl"
    _record(record, {"d1": (21.0, 21.95)} if stalls is None else stalls)
    rig = PodRig(
        RigConfig(image="img", cpu=1.0, memory=1024 * MiB), PodScenario((1, 2, 1), 15.0), record
    )
    rig.pid, rig.started_at, rig.n_start, rig.reserve = 42, "2026-12-02T18:00:00Z", 1.0, 64 * MiB

    def n_at(t: float) -> float:
        return 2.0 if 10.5 <= t < 21.0 else 1.0

    rig.samples = [
        Sample(
            0.1 * i, 150 * MiB, 200 * MiB, 1024 * MiB, 1.0, {"bridge_pod_processes": n_at(0.1 * i)}
        )
        for i in range(300)
    ]
    rig.proc_samples = [(0.1 * i, {1: 22 * MiB, 7: 60 * MiB, 9: 60 * MiB}) for i in range(300)]
    rig.slot_of = {1: -1, 7: 0, 9: 1}
    add = StepResult(1, "cpu 2", 10.0, 2.0, 1024 * MiB, 2.0, 1024 * MiB, 2.0, 1024.0 * MiB, 400.0)
    retire = StepResult(2, "cpu 1", 20.0, 1.0, 1024 * MiB, 1.0, 1024 * MiB, 1.0, 1024.0 * MiB)
    add.match = retire.match = True
    rig.steps = [add, retire]
    rig.pod_steps = [
        PodStep(1, "cpu 2", 2, 2, 1.0, 2, 2.0, 0.4, [], {0: 2.0}, {0: 2.0, 1: 0.0}, moved=0),
        PodStep(2, "cpu 1", 1, 1, 2.0, 1, 1.0, 0.9, [], {0: 1.0, 1: 1.0}, {0: 2.0}, moved=1),
    ]
    rig.load_ended_t, rig.wall0_ns = 30.0, 0
    rig.publish_report = {
        "published": 600, "undelivered": 0, "dropped_resend_overflow": 0, "disconnects": 1,
        "reconnects": 1, "by_transport": {"ws wave 1": {"resent": 3, "drains": 1}},
    }  # fmt: skip
    rig.sink_report = {
        "totals": {
            "received": 601, "delivered": 600, "duplicates": 1, "lost": 0, "gap_frames": 0,
            "gap_contradictions": 0,
        }
    }  # fmt: skip
    rig.final_inspect = {
        "RestartCount": 0,
        "State": {"Running": True, "Pid": 42, "StartedAt": rig.started_at, "OOMKilled": False},
    }
    rig.oom_start = rig.oom_end = {"oom_kill": 0}
    return rig


def _failed(rig: PodRig) -> list[str]:
    return [c.name for c in checks(rig, device_pauses(rig)) if not c.ok]


MOVES = "retiring moves only the retired processes' devices, with a bounded pause"
N_CHECK = "N reported = plan within 15 s of every step, and kept"
RSS = "sum of every process's RSS ≤ limit at every 100 ms sample"


def test_a_clean_run_passes_and_its_table_says_what_moved(tmp_path: Path) -> None:
    rig = _rig(tmp_path)
    pauses = device_pauses(rig)
    assert pauses[2]["d1"] == pytest.approx(1.0)  # 20.9 → 22.0 s (frames at 10 Hz)
    assert max(pauses[1].values()) == pytest.approx(0.1)
    assert _failed(rig) == []
    table = step_table(rig, pauses)
    assert "1 → 2" in table and "2 → 1" in table and "p0 1 · p1 1" in table
    assert "1.00-1.00" in table  # the one moved device's pause
    assert "sup 22 · p0 60 · p1 60" in table
    text = render(rig, "t", checks(rig, pauses), pauses, stage_delays(rig))
    assert "step 2: edge→bridge 0.00 s, in bridge 0.00 s, bridge→sink 0.05 s" in text
    assert "FAIL" not in text and "duplicates (deduped) 1, resent by the edges 3" in text


def test_a_device_that_left_its_process_when_one_was_added_fails_the_move_check(
    tmp_path: Path,
) -> None:
    rig = _rig(tmp_path)
    rig.pod_steps[0].sessions_after = {0: 1.0, 1: 1.0}
    assert _failed(rig) == [MOVES]


def test_a_disconnect_beyond_the_moved_devices_fails_the_move_check(tmp_path: Path) -> None:
    rig = _rig(tmp_path)
    rig.publish_report["disconnects"] = 2
    assert _failed(rig) == [MOVES]


def test_a_pause_on_a_step_that_adds_a_process_is_reported(tmp_path: Path) -> None:
    """A pause alone says the host or the pod stalled, not that a connection moved."""
    rig = _rig(tmp_path, {"d0": (12.0, 13.0), "d1": (21.0, 21.95)})
    assert _failed(rig) == []
    pauses = device_pauses(rig)
    assert "pauses at the sink, step 1: d0 1.00 s" in render(rig, "t", checks(rig, pauses), pauses)


def test_a_retirement_that_moved_nothing_proves_nothing(tmp_path: Path) -> None:
    rig = _rig(tmp_path)
    rig.pod_steps[1].moved = 0
    assert _failed(rig) == [MOVES]


def test_a_pause_past_the_bound_fails(tmp_path: Path) -> None:
    assert _failed(_rig(tmp_path, {"d1": (21.0, 27.0)})) == [MOVES]


def test_n_off_the_plan_after_settling_or_never_settled_fails(tmp_path: Path) -> None:
    rig = _rig(tmp_path)
    rig.samples[250].metrics["bridge_pod_processes"] = 2.0  # 25 s: a process came back
    assert _failed(rig) == [N_CHECK]
    rig = _rig(tmp_path)
    rig.pod_steps[1].settle_s = None
    assert N_CHECK in _failed(rig)


def test_the_sum_of_the_processes_over_the_limit_fails(tmp_path: Path) -> None:
    rig = _rig(tmp_path)
    rig.samples[150].rss = 1025 * MiB
    assert _failed(rig) == [RSS]


def test_raw_duplicates_pass_after_the_dedupe_but_a_gap_does_not(tmp_path: Path) -> None:
    rig = _rig(tmp_path)
    rig.sink_report["totals"]["gap_frames"] = 1
    assert _failed(rig) == ["0 duplicates after the sink's dedupe, 0 gaps"]


def test_a_plan_that_no_longer_gives_the_intended_n_says_so(tmp_path: Path) -> None:
    rig = _rig(tmp_path)
    rig.pod_steps[1].expected = 2
    assert "the plan gives the intended N at every step" in _failed(rig)
