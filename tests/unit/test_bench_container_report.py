"""The container rig's verdicts (``make e2e-container``): a clean run passes every check, and each
way a live resize can go wrong fails exactly the check that names it. The rig itself runs against
a real container only in ``make e2e-container``."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.container.probe import parse_metrics, round_up
from benchmarks.container.report import checks, render, step_table
from benchmarks.container.rig import ContainerRig, MiB, RigConfig, Sample, StepResult


def _clean_rig() -> ContainerRig:
    rig = ContainerRig(RigConfig(image="img", cpu=1.5, memory=512 * MiB))
    rig.pid, rig.started_at = 42, "2026-11-30T18:00:00Z"
    rig.samples = [
        Sample(
            t=0.1 * i,
            rss=100 * MiB,
            usage=90 * MiB,
            limit=512 * MiB,
            cpu=1.5,
            metrics={
                "bridge_frames_delivered_total": 4.0 * i,
                "bridge_plan_ring_budget_bytes": 1e8,
            },
        )
        for i in range(100)
    ]
    step = StepResult(1, "cpu down", 2.0, 0.5, 512 * MiB, 0.5, 512 * MiB, 0.5, 512.0 * MiB, 12.0)
    step.match = True
    rig.steps = [step]
    rig.load_ended_t = 9.9
    rig.publish_report = {
        "published": 400, "undelivered": 0, "dropped_resend_overflow": 0, "disconnects": 0,
        "reconnects": 0,
    }  # fmt: skip
    rig.sink_report = {"totals": {"delivered": 400, "lost": 0, "duplicates": 0}}
    rig.final_inspect = {
        "RestartCount": 0,
        "State": {"Running": True, "Pid": 42, "StartedAt": rig.started_at, "OOMKilled": False},
    }
    rig.oom_start = {"oom_kill": 0, "failcnt": 0}
    rig.oom_end = {"oom_kill": 0, "failcnt": 0}
    return rig


def _failed(rig: ContainerRig) -> list[str]:
    return [c.name for c in checks(rig) if not c.ok]


def test_a_clean_run_passes_everything() -> None:
    rig = _clean_rig()
    assert _failed(rig) == []
    table = step_table(rig)
    assert "0.5 / 512 ✓" in table and "40.0" in table  # delivered frames/s over the hold
    assert "FAIL" not in render(rig, "t")


def _set(d: dict[str, Any], path: str, value: Any) -> None:
    *head, last = path.split(".")
    for key in head:
        d = d[key]
    d[last] = value


@pytest.mark.parametrize(
    ("field", "value", "check"),
    [
        ("sink_report.totals.lost", 1, "0 lost"),
        ("sink_report.totals.delivered", 399, "0 lost"),
        ("publish_report.dropped_resend_overflow", 3, "0 lost"),
        ("publish_report.undelivered", 1, "0 lost"),
        ("sink_report.totals.duplicates", 2, "0 duplicates"),
        ("publish_report.reconnects", 1, "0 disconnects"),
        ("final_inspect.RestartCount", 1, "container restarts 0"),
        ("final_inspect.State.Pid", 43, "container restarts 0"),
        ("final_inspect.State.Running", False, "container restarts 0"),
        ("final_inspect.State.OOMKilled", True, "OOM kills 0"),
        ("oom_end.oom_kill", 1, "OOM kills 0"),
        ("final_inspect.State.ExitCode", 137, "OOM kills 0"),
    ],
)
def test_each_failure_fails_its_check(field: str, value: Any, check: str) -> None:
    rig = _clean_rig()
    attr, _, rest = field.partition(".")
    _set(getattr(rig, attr), rest, value)
    assert _failed(rig) == [check]


def test_an_oom_kill_in_the_kernel_log_fails() -> None:
    rig = _clean_rig()
    rig.kernel_ooms = ["oom-kill:constraint=CONSTRAINT_MEMCG,task_memcg=/libpod_parent/libpod-x"]
    assert _failed(rig) == ["OOM kills 0"]


def test_a_limit_the_bridge_did_not_report_fails() -> None:
    rig = _clean_rig()
    rig.steps[0].match = False
    assert _failed(rig) == ["reported limits = cgroup after every step"]


def test_one_sample_over_the_limit_fails() -> None:
    rig = _clean_rig()
    rig.samples[50].rss = 513 * MiB
    assert _failed(rig) == ["RSS ≤ limit at every 100 ms sample"]


def test_a_failed_resize_fails() -> None:
    rig = _clean_rig()
    rig.steps[0].notes.append("resize failed: podman update: exit 125")
    assert _failed(rig) == ["resizes applied"]


def test_metrics_sum_labelled_components_and_keep_them() -> None:
    text = (
        "# TYPE bridge_memory_charged_bytes gauge\n"
        'bridge_memory_charged_bytes{component="ring"} 100.0\n'
        'bridge_memory_charged_bytes{component="transport"} 20.0\n'
        "# TYPE bridge_limit_cpu_cores gauge\nbridge_limit_cpu_cores 1.5\n"
        "# TYPE other gauge\nother 7.0\n"
    )
    m = parse_metrics(text)
    assert m["bridge_memory_charged_bytes"] == 120.0
    assert m["bridge_memory_charged_bytes{component=ring}"] == 100.0
    assert m["bridge_limit_cpu_cores"] == 1.5 and "other" not in m
    assert round_up(5 * MiB + 1, 4 * MiB) == 8 * MiB
