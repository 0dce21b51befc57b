"""The bridge in a real container, resized live under load (``make e2e-container``).

Each test builds nothing itself (the session fixture builds the image once), runs one scenario
of :mod:`benchmarks.container.e2e` (the pod's: :mod:`benchmarks.container.pod_steps`), prints its
step table and writes its PNG under ``reports/e2e-container/``; every check of
:func:`benchmarks.container.report.checks` (the pod's: :mod:`benchmarks.container.pod_report`)
must pass.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.container.e2e import STEPS, run_scenario

OUT = Path(__file__).resolve().parents[2] / "reports" / "e2e-container"


def _assert_all_checks(outcome_text: str, ok: bool) -> None:
    print("\n" + outcome_text)
    assert ok, "a check failed (see the FAIL lines above)"


@pytest.mark.timeout(420)
async def test_resize_with_podman_update(container_image: str) -> None:
    """``podman update --cpus/--memory`` (runc update) on the running container, ≥ 8 steps."""
    assert len(STEPS) >= 8
    out = await run_scenario("podman", container_image, OUT)
    _assert_all_checks(out.text, out.ok)
    assert out.png.stat().st_size > 10_000


@pytest.mark.timeout(420)
async def test_resize_through_kubernetes_stand_in(container_image: str) -> None:
    """``kubectl patch --subresource resize`` → kubesim → ``podman update`` → the bridge, which
    reads its real cgroup and its Pod from the stand-in."""
    from benchmarks.container.kube import seam_missing

    reason = seam_missing()
    if reason is not None:
        pytest.skip(reason)
    out = await run_scenario("kube", container_image, OUT)
    _assert_all_checks(out.text, out.ok)
    assert out.png.stat().st_size > 10_000


@pytest.mark.timeout(360)
async def test_processes_follow_cpu_steps(container_image: str) -> None:
    """The bridge as a pod (``--processes auto``): CPU 1 → 2 → 1 and memory steps between them
    move N to the plan (1, 2, 2, 1 retired by memory, 2, 1 retired by CPU) under load, with 0
    lost, every frame once after the sink's dedupe, 0 OOM kills, 0 restarts, the sum of every
    process's RSS within the limit at every sample."""
    from benchmarks.container.pod_steps import INTENDED, STEPS, run_pod_scenario

    assert len(set(INTENDED)) > 1 and len(INTENDED) == len(STEPS) + 1
    out = await run_pod_scenario(container_image, OUT)
    _assert_all_checks(out.text, out.ok)
    assert out.png.stat().st_size > 10_000
