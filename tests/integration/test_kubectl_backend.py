"""Resize backends that go through the Kubernetes API: ``kubectl patch --subresource resize``
(and the plain HTTP PATCH of the kubesim backend) against the local stand-in (loadgen.kubesim).

Checks that the strategic-merge body the runner builds is exactly what reaches the stand-in, that
the runner waits for the pod status to converge (docs/kubernetes.md), that a memory decrease
below usage is held by the simulated kubelet, and, end to end, that a bridge watching the
stand-in's Pod adapts with nothing lost. kubectl tests skip visibly where kubectl is not installed.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from loadgen.resize import (
    CONTAINER,
    KubectlBackend,
    KubeSimBackend,
    LocalBackend,
    resize_body,
)
from loadgen.runner import run_scenario
from loadgen.scenario import from_mapping

GiB = 1 << 30
needs_kubectl = pytest.mark.skipif(
    shutil.which("kubectl") is None, reason="kubectl not installed (the kubectl backend needs it)"
)
pytestmark = pytest.mark.timeout(90)


def _make(kind: str, tmp_path: Path) -> LocalBackend:
    cls = KubectlBackend if kind == "kubectl" else KubeSimBackend
    return cls(tmp_path / "cgroup", real_cpu=False)


@pytest.mark.parametrize("kind", [pytest.param("kubectl", marks=needs_kubectl), "kubesim"])
async def test_resize_body_reaches_the_stand_in_and_status_converges(
    kind: str, tmp_path: Path
) -> None:
    backend = _make(kind, tmp_path)
    await backend.start(2.0, 2 * GiB)
    try:
        assert isinstance(backend, KubeSimBackend) and backend.sim is not None
        sim = backend.sim
        result = await backend.apply(0.5, 1 * GiB, hold_timeout=10)
        assert result.resolved and result.written_ns is not None and not result.held
        body = resize_body(0.5, 1 * GiB)
        assert backend.bodies == [body]
        # the reference body's shape (tests/fixtures/k8s/resize-patch-body.json): requests = limits
        assert body["spec"]["containers"][0] == {
            "name": CONTAINER,
            "resources": {
                "requests": {"cpu": "500m", "memory": "1Gi"},
                "limits": {"cpu": "500m", "memory": "1Gi"},
            },
        }
        (spec,) = sim.pod["spec"]["containers"]
        assert spec["resources"] == body["spec"]["containers"][0]["resources"]
        assert ("PATCH", "/api/v1/namespaces/loadgen/pods/simbridge-loadgen-0/resize") in [
            (m, p.split("?")[0]) for m, p in sim.requests_seen
        ]
        status = sim.pod["status"]
        assert status["observedGeneration"] == sim.pod["metadata"]["generation"] == 2
        assert status["containerStatuses"][0]["resources"]["limits"] == {
            "cpu": "500m",
            "memory": "1Gi",
        }
        assert not [c for c in status.get("conditions", []) if "Resize" in c["type"]]
        cg = tmp_path / "cgroup"
        assert (cg / "cpu.max").read_text().strip() == "50000 100000"
        assert (cg / "memory.max").read_text().strip() == str(1 * GiB)
        if kind == "kubectl":
            assert isinstance(backend, KubectlBackend)
            assert backend.outputs and "patched" in backend.outputs[0]
    finally:
        await backend.close()


@pytest.mark.parametrize("kind", [pytest.param("kubectl", marks=needs_kubectl), "kubesim"])
async def test_memory_decrease_below_usage_is_held_by_the_kubelet(
    kind: str, tmp_path: Path
) -> None:
    backend = _make(kind, tmp_path)
    await backend.start(2.0, 2 * GiB)
    try:
        backend.dir.set_memory_usage(int(1.5 * GiB))  # no bridge attached: plant the usage
        result = await backend.apply(None, 1 * GiB, hold_timeout=1.0)
        assert result.held and not result.resolved and result.written_ns is None
        assert (tmp_path / "cgroup" / "memory.max").read_text().strip() == str(2 * GiB)
        assert isinstance(backend, KubeSimBackend) and backend.sim is not None
        cond = backend.sim.condition("PodResizeInProgress")
        assert cond is not None and cond["reason"] == "Error"
        assert "below current usage" in cond["message"]
        backend.dir.set_memory_usage(512 << 20)  # usage drops: the next sync enacts it
        result = await backend.apply(None, 1 * GiB, hold_timeout=5.0)
        assert result.resolved and result.written_ns is not None
        assert (tmp_path / "cgroup" / "memory.max").read_text().strip() == str(1 * GiB)
    finally:
        await backend.close()


@needs_kubectl
async def test_bridge_adapts_through_kubectl_resizes(tmp_path: Path) -> None:
    s = from_mapping(
        {
            "name": "kubectl-e2e",
            "edges": 2,
            "transport": "mixed",
            "rate_hz": 10,
            "points": 2000,
            "duration": "6s",
            "warmup": "1s",
            "drain": "5s",
            "initial": {"cpu": 2, "memory": "2Gi"},
            "resizes": [
                {"at": "2s", "cpu": 1, "memory": "1Gi"},
                {"at": "4s", "cpu": 2, "memory": "3Gi"},
            ],
            "baseline": "none",
        }
    )
    rep = await run_scenario(s, tmp_path, backend="kubectl", real_cpu=False)
    (run,) = rep["runs"]
    assert run["backend"] == "kubectl"
    t = run["totals"]
    assert (t["lost"], t["duplicates"], t["disconnects"]) == (0, 0, 0)
    assert t["delivered"] == t["published"] == 2 * s.frames_per_edge
    for x in run["resizes"]:
        assert x["resolved"], json.dumps(x)
        assert x["plan"]["memory_limit_bytes"] == x["memory_bytes"]
        assert x["plan"]["cpu_limit_cores"] == pytest.approx(x["cpu"])
    log = Path(run["bridge"]["log"]).read_text()  # noqa: ASYNC240  (small file, test end)
    assert "pod" in log.lower()  # the bridge watched the stand-in's Pod
