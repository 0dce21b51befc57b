"""loadgen.kubesim over real HTTP: resize outcomes, watch stream, claims/slices/events, kubectl.

The client is the bridge's own :class:`bridge.resources.kubeapi.KubeClient`, so these tests also
exercise it (chunked watch bodies, Status errors).
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import json
import shutil
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from bridge.resources.kubeapi import (
    KubeClient,
    KubeConfig,
    KubeError,
    claim_path,
    pod_path,
    pod_watch_path,
    slices_path,
)
from loadgen.kubesim import (
    KubeSim,
    NodeModel,
    Want,
    qos_class,
    shares_to_weight,
    strategic_merge,
    validate_resize,
)

K8S = Path(__file__).resolve().parent.parent / "fixtures" / "k8s"
GiB = 1 << 30
RESIZE = "/api/v1/namespaces/sim/pods/sim-bridge-0/resize"


def load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((K8S / name).read_text())
    return data


def patch_body(cpu: str, memory: str) -> dict[str, Any]:
    res = {"requests": {"cpu": cpu, "memory": memory}, "limits": {"cpu": cpu, "memory": memory}}
    return {"spec": {"containers": [{"name": "bridge", "resources": res}]}}


async def eventually(pred: Callable[[], bool], within: float = 3.0) -> None:
    """Poll ``pred`` (files and sim state have no change events) until true or ``within`` s."""
    async with asyncio.timeout(within):
        for _ in itertools.count():
            if pred():
                return
            await asyncio.sleep(0.01)


def read(p: Path) -> str:
    return p.read_text().strip()


@pytest.fixture
async def sim_factory(tmp_path: Path) -> AsyncIterator[Callable[..., Any]]:
    sims: list[KubeSim] = []

    async def make(pod: str = "pod-running-initial.json", **kw: Any) -> tuple[KubeSim, KubeClient]:
        kw.setdefault("sync_interval", 0.02)
        sim = KubeSim(
            load(pod),
            claims=[load("resourceclaim-allocated.json")],
            slices=[load("resourceslice-h100-nvidia-static-mig.json")],
            cgroup_dir=str(tmp_path / "cg"),
            **kw,
        )
        await sim.start()
        sims.append(sim)
        return sim, KubeClient(KubeConfig(sim.url), timeout=5)

    yield make
    for s in sims:
        await s.stop()


# ----------------------------------------------------------------------------- pure parts


@pytest.mark.parametrize(
    ("milli", "weight"),
    [(100, 17), (250, 35), (500, 59), (1000, 100), (2000, 174), (4000, 303), (8000, 532)],
)
def test_weight_matches_facts_table(milli: int, weight: int) -> None:
    assert shares_to_weight(milli * 1024 // 1000) == weight


def test_qos_and_merge() -> None:
    pod = load("pod-running-initial.json")
    assert qos_class(pod["spec"]) == "Guaranteed"
    assert qos_class(load("pod-level-resize-inprogress-v1.36.json")["spec"]) == "Burstable"
    assert qos_class({"containers": [{"name": "a"}]}) == "BestEffort"
    merged = strategic_merge(pod, load("resize-patch-body.json"))
    c = merged["spec"]["containers"][0]
    assert c["resources"]["limits"] == {"cpu": "4", "memory": "12Gi"}
    assert c["resources"]["claims"] == [{"name": "gpu"}]  # merged, not replaced
    assert c["image"] == pod["spec"]["containers"][0]["image"]
    assert validate_resize(pod, merged) is None


# ----------------------------------------------------------------------------- outcomes


async def test_resize_success_writes_cgroup_memory_then_cpu(
    sim_factory: Any, tmp_path: Path
) -> None:
    sim, client = await sim_factory()
    cg = tmp_path / "cg"
    assert (read(cg / "cpu.max"), read(cg / "memory.max"), read(cg / "cpu.weight")) == (
        "200000 100000",
        str(8 * GiB),
        "174",
    )
    pod = await client.patch(RESIZE, load("resize-patch-body.json"))
    assert pod["metadata"]["generation"] == 2
    await eventually(lambda: read(cg / "cpu.max") == "400000 100000")
    assert read(cg / "memory.max") == str(12 * GiB)
    assert read(cg / "cpu.weight") == "303"
    await eventually(lambda: sim.condition("PodResizeInProgress") is None)
    got = await client.get(pod_path("sim", "sim-bridge-0"))
    st = got["status"]["containerStatuses"][0]
    assert st["allocatedResources"] == {"cpu": "4", "memory": "12Gi"}
    assert st["resources"]["limits"] == {"cpu": "4", "memory": "12Gi"}
    assert got["status"]["observedGeneration"] == 2
    assert not [c for c in got["status"]["conditions"] if c["type"].startswith("PodResize")]


async def test_deferred_until_room_frees_up(sim_factory: Any, tmp_path: Path) -> None:
    sim, client = await sim_factory(node=NodeModel(others_cpu_m=13_000))
    await client.patch(RESIZE, load("resize-patch-body.json"))
    await eventually(lambda: sim.condition("PodResizePending") is not None)
    cond = sim.condition("PodResizePending")
    assert cond is not None and cond["reason"] == "Deferred"
    # the exact kubelet message of the fixture pod-resize-deferred.json
    assert (
        cond["message"] == load("pod-resize-deferred.json")["status"]["conditions"][-1]["message"]
    )
    assert cond["observedGeneration"] == 2
    await asyncio.sleep(0.1)
    assert read(tmp_path / "cg" / "cpu.max") == "200000 100000"  # nothing applied
    sim.set_node_others(cpu_m=2_000)
    await eventually(lambda: read(tmp_path / "cg" / "cpu.max") == "400000 100000")
    await eventually(lambda: sim.condition("PodResizePending") is None)


async def test_infeasible(sim_factory: Any, tmp_path: Path) -> None:
    sim, client = await sim_factory()
    await client.patch(RESIZE, patch_body("40", "12Gi"))
    await eventually(lambda: sim.condition("PodResizePending") is not None)
    cond = sim.condition("PodResizePending")
    assert cond is not None and cond["reason"] == "Infeasible"
    assert (
        cond["message"]
        == "Node didn't have enough capacity: cpu, requested: 40000, capacity: 15800"
    )
    await asyncio.sleep(0.1)
    assert read(tmp_path / "cg" / "cpu.max") == "200000 100000"
    assert sim.condition("PodResizeInProgress") is None


@pytest.mark.parametrize(
    ("body", "content_type", "fragment"),
    [
        (  # Guaranteed -> Burstable
            {"spec": {"containers": [{"name": "bridge", "resources": {"requests": {"cpu": "1"}}}]}},
            "application/strategic-merge-patch+json",
            "Pod QOS Class may not change as a result of resizing",
        ),
        (
            {"spec": {"containers": [{"name": "bridge", "image": "evil:latest"}]}},
            "application/strategic-merge-patch+json",
            "only cpu and memory resources are mutable",
        ),
        (
            {"spec": {"containers": [{"name": "bridge", "resources": {"limits": {"cpu": None}}}]}},
            "application/strategic-merge-patch+json",
            "resource limits cannot be removed",
        ),
        (  # a JSON merge patch replaces the whole containers list
            load("resize-patch-body.json"),
            "application/merge-patch+json",
            "only cpu and memory resources are mutable",
        ),
        (
            {"spec": {"containers": [{"name": "sidecar", "resources": {}}]}},
            "application/strategic-merge-patch+json",
            "containers may not be renamed or reordered",
        ),
    ],
)
async def test_rejected_patches_are_422(
    sim_factory: Any, body: dict[str, Any], content_type: str, fragment: str
) -> None:
    sim, client = await sim_factory()
    with pytest.raises(KubeError) as err:
        await client.patch(RESIZE, body, content_type)
    assert err.value.status == 422
    assert err.value.body["reason"] == "Invalid"
    assert fragment in str(err.value)
    assert sim.pod["metadata"]["generation"] == 1


async def test_claims_block_resize_switch(sim_factory: Any) -> None:
    _, client = await sim_factory(claims_block_resize=True)
    with pytest.raises(KubeError, match="only cpu and memory resources are mutable"):
        await client.patch(RESIZE, load("resize-patch-body.json"))


async def test_memory_decrease_held_in_error_until_usage_drops(
    sim_factory: Any, tmp_path: Path
) -> None:
    sim, client = await sim_factory("pod-resize-done.json")
    cg = tmp_path / "cg"
    assert sim.cgroup is not None
    sim.cgroup.set_memory_usage(9 * GiB)
    await client.patch(RESIZE, patch_body("4", "6Gi"))
    await eventually(lambda: (sim.condition("PodResizeInProgress") or {}).get("reason") == "Error")
    cond = sim.condition("PodResizeInProgress")
    assert cond is not None
    fixture = load("pod-resize-mem-decrease-blocked.json")["status"]["conditions"][-1]["message"]
    assert cond["message"] == fixture
    assert read(cg / "memory.max") == str(12 * GiB)  # not applied
    pod = await client.get(pod_path("sim", "sim-bridge-0"))
    st = pod["status"]["containerStatuses"][0]
    assert st["allocatedResources"]["memory"] == "6Gi"  # allocated, not actuated
    assert st["resources"]["limits"]["memory"] == "12Gi"
    sim.cgroup.set_memory_usage(5 * GiB)
    await eventually(lambda: read(cg / "memory.max") == str(6 * GiB))
    await eventually(lambda: sim.condition("PodResizeInProgress") is None)


async def test_cpu_decrease_proceeds_while_memory_is_held(sim_factory: Any, tmp_path: Path) -> None:
    sim, client = await sim_factory("pod-resize-done.json")
    assert sim.cgroup is not None
    sim.cgroup.set_memory_usage(9 * GiB)
    await client.patch(RESIZE, patch_body("2", "6Gi"))
    await eventually(lambda: read(tmp_path / "cg" / "cpu.max") == "200000 100000")
    assert (sim.condition("PodResizeInProgress") or {}).get("reason") == "Error"


async def test_pod_level_in_progress_completes_into_the_container_cgroup(
    sim_factory: Any, tmp_path: Path
) -> None:
    sim, _ = await sim_factory("pod-level-resize-inprogress-v1.36.json")
    # the bridge container has no own limits: its cgroup shows the pod-level ones
    await eventually(lambda: read(tmp_path / "cg" / "cpu.max") == "1200000 100000")
    assert read(tmp_path / "cg" / "memory.max") == str(16 * GiB)
    await eventually(lambda: sim.condition("PodResizeInProgress") is None)
    assert sim.pod["status"]["resources"]["limits"]["cpu"] == "12"


class RecordingActuator:
    """An Actuator that records the kubelet's calls and fails the first ``fail`` applies (the
    seam itself is under test here, so this stands where a container runtime would)."""

    def __init__(self, usage: int, fail: int = 0) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.usage = usage
        self.fail = fail

    async def start(self, actual: Want) -> None:
        self.calls.append(("start", (actual.cpu_lim, actual.mem_lim)))

    async def memory_usage(self) -> int:
        self.calls.append(("usage", None))
        return self.usage

    async def apply_memory(self, limit: int | None) -> None:
        if self.fail:
            self.fail -= 1
            raise RuntimeError("runtime said no")
        self.calls.append(("memory", limit))

    async def apply_cpu(self, limit_m: int | None, request_m: int | None) -> None:
        self.calls.append(("cpu", (limit_m, request_m)))


async def test_actuator_seam_order_guard_and_failure_retry(sim_factory: Any) -> None:
    act = RecordingActuator(usage=1 * GiB, fail=1)
    sim, client = await sim_factory(actuator=act)
    assert act.calls == [("start", (2000, 8 * GiB))]
    await client.patch(RESIZE, load("resize-patch-body.json"))
    # the first apply fails: held with the runtime's message, then retried on a later sync
    await eventually(lambda: ("memory", 12 * GiB) in act.calls)
    assert act.calls[1:] == [("memory", 12 * GiB), ("cpu", (4000, 4000))]  # memory first
    await eventually(lambda: sim.condition("PodResizeInProgress") is None)
    st = sim.pod["status"]["containerStatuses"][0]
    assert st["resources"]["limits"] == {"cpu": "4", "memory": "12Gi"}
    # a decrease below the usage the actuator reports is held, cpu decrease still applied
    act.calls.clear()
    act.usage = 9 * GiB
    await client.patch(RESIZE, patch_body("2", "6Gi"))
    await eventually(lambda: (sim.condition("PodResizeInProgress") or {}).get("reason") == "Error")
    await eventually(lambda: ("cpu", (2000, 2000)) in act.calls)
    assert ("usage", None) in act.calls and not [c for c in act.calls if c[0] == "memory"]
    act.usage = 5 * GiB
    await eventually(lambda: ("memory", 6 * GiB) in act.calls)
    await eventually(lambda: sim.condition("PodResizeInProgress") is None)


async def test_actuator_failure_is_reported_in_the_condition(sim_factory: Any) -> None:
    act = RecordingActuator(usage=0, fail=10**6)
    sim, client = await sim_factory(actuator=act)
    await client.patch(RESIZE, load("resize-patch-body.json"))
    await eventually(lambda: (sim.condition("PodResizeInProgress") or {}).get("reason") == "Error")
    cond = sim.condition("PodResizeInProgress")
    assert cond is not None and "runtime said no" in cond["message"]
    st = sim.pod["status"]["containerStatuses"][0]
    assert st["resources"]["limits"]["memory"] == "8Gi"  # not actuated, not reported as done


# ----------------------------------------------------------------------------- watch + reads


async def test_watch_stream_events(sim_factory: Any) -> None:
    sim, client = await sim_factory(node=NodeModel(others_cpu_m=13_000))
    seen: list[tuple[str, int, str]] = []

    async def follow() -> None:
        async for ev in client.watch(pod_watch_path("sim", "sim-bridge-0")):
            obj = ev["object"]
            reasons = ",".join(
                c.get("reason", "") for c in obj["status"]["conditions"] if "Resize" in c["type"]
            )
            seen.append((ev["type"], obj["metadata"]["generation"], reasons))

    task = asyncio.create_task(follow())
    try:
        await eventually(lambda: len(seen) >= 1)
        assert seen[0] == ("ADDED", 1, "")
        await client.patch(RESIZE, load("resize-patch-body.json"))
        await eventually(lambda: any(r == "Deferred" for _, _, r in seen))
        sim.set_node_others(cpu_m=0)
        await eventually(lambda: seen[-1][2] == "" and seen[-1][1] == 2)
        assert all(t == "MODIFIED" for t, _, _ in seen[1:])
    finally:
        task.cancel()
    # a watch for another pod name gets nothing
    other = [ev async for ev in client.watch(pod_watch_path("sim", "nope").replace("300", "0.2"))]
    assert other == []


async def test_watch_ends_at_timeout_and_resumes_from_version(sim_factory: Any) -> None:
    sim, client = await sim_factory()
    rv = sim.pod["metadata"]["resourceVersion"]
    path = pod_watch_path("sim", "sim-bridge-0", rv).replace(
        "timeoutSeconds=300", "timeoutSeconds=0.2"
    )
    assert [ev async for ev in client.watch(path)] == []  # up to date: nothing to send
    stale = pod_watch_path("sim", "sim-bridge-0", "1").replace("300", "0.2")
    events = [ev async for ev in client.watch(stale)]
    assert [e["type"] for e in events] == ["MODIFIED"]


async def test_claims_slices_events_and_errors(sim_factory: Any) -> None:
    sim, client = await sim_factory()
    claim = await client.get(claim_path("sim", "sim-bridge-0-gpu-x7k2p"))
    assert (
        claim["status"]["allocation"]["devices"]["results"][0]["device"] == "gpu-0-mig-3g40gb-9-4"
    )
    slices = await client.get(slices_path("gpu-node-a"))
    assert len(slices["items"]) == 1 and slices["kind"] == "ResourceSliceList"
    assert (await client.get(slices_path("other-node")))["items"] == []
    with pytest.raises(KubeError) as err:
        await client.get(claim_path("sim", "missing"))
    assert err.value.status == 404
    with pytest.raises(KubeError):
        await client.get(pod_path("sim", "other-pod"))

    event = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": "sim-bridge-0.abc", "namespace": "sim"},
        "involvedObject": {"kind": "Pod", "name": "sim-bridge-0", "namespace": "sim"},
        "reason": "ResizePending",
        "message": "m",
        "type": "Warning",
    }
    created = await client.post("/api/v1/namespaces/sim/events", event)
    assert created["metadata"]["uid"] and sim.events[0]["reason"] == "ResizePending"
    with pytest.raises(KubeError) as err:
        await client.post("/api/v1/namespaces/sim/events", event)
    assert err.value.status == 409
    bad = copy.deepcopy(event)
    del bad["involvedObject"]
    bad["metadata"]["name"] = "x"
    with pytest.raises(KubeError):
        await client.post("/api/v1/namespaces/sim/events", bad)
    listed = await client.get("/api/v1/namespaces/sim/events")
    assert [e["metadata"]["name"] for e in listed["items"]] == ["sim-bridge-0.abc"]


async def test_discovery_documents(sim_factory: Any) -> None:
    _, client = await sim_factory()
    assert (await client.get("/version"))["major"] == "1"
    assert (await client.get("/api"))["versions"] == ["v1"]
    core = await client.get("/api/v1")
    assert {"pods", "pods/resize", "events"} <= {r["name"] for r in core["resources"]}
    groups = await client.get("/apis")
    assert groups["groups"][0]["name"] == "resource.k8s.io"


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed")
async def test_kubectl_patch_resize(sim_factory: Any, tmp_path: Path) -> None:
    sim, _ = await sim_factory()
    config = tmp_path / "kubeconfig"
    config.write_text("apiVersion: v1\nkind: Config\n")

    async def kubectl(*args: str) -> tuple[int, str]:
        proc = await asyncio.create_subprocess_exec(
            "kubectl",
            "--kubeconfig",
            str(config),
            "--server",
            sim.url,
            "-n",
            "sim",
            *args,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        out, _ = await asyncio.wait_for(proc.communicate(), 30)
        return proc.returncode or 0, out.decode()

    body = (K8S / "resize-patch-body.json").read_text()
    rc, out = await kubectl("patch", "pod", "sim-bridge-0", "--subresource", "resize", "-p", body)
    assert rc == 0, out
    assert "patched" in out
    await eventually(lambda: read(tmp_path / "cg" / "cpu.max") == "400000 100000")
    rc, out = await kubectl(
        "patch",
        "pod",
        "sim-bridge-0",
        "--subresource",
        "resize",
        "-p",
        '{"spec":{"containers":[{"name":"bridge","resources":{"requests":{"cpu":"1"}}}]}}',
    )
    assert rc != 0
    assert 'The Pod "sim-bridge-0" is invalid' in out and "QOS Class may not change" in out


async def test_v1_cgroup_layout(tmp_path: Path) -> None:
    root = tmp_path / "v1"
    (root / "cpu").mkdir(parents=True)
    (root / "memory").mkdir()
    sim = KubeSim(load("pod-running-initial.json"), cgroup_dir=str(root), sync_interval=0.02)
    async with sim:
        assert read(root / "cpu" / "cpu.cfs_quota_us") == "200000"
        assert read(root / "cpu" / "cpu.shares") == "2048"
        assert read(root / "memory" / "memory.limit_in_bytes") == str(8 * GiB)
        client = KubeClient(KubeConfig(sim.url))
        await client.patch(RESIZE, load("resize-patch-body.json"))
        await eventually(lambda: read(root / "cpu" / "cpu.cfs_quota_us") == "400000")
        assert read(root / "memory" / "memory.limit_in_bytes") == str(12 * GiB)


async def test_token_file_is_sent_and_reread(sim_factory: Any, tmp_path: Path) -> None:
    sim, _ = await sim_factory()
    token = tmp_path / "token"
    token.write_text("first\n")
    client = KubeClient(KubeConfig(sim.url, token_file=str(token)))
    await client.get(pod_path("sim", "sim-bridge-0"))
    assert sim.last_authorization == "Bearer first"
    token.write_text("rotated\n")  # projected service-account tokens rotate
    await client.get(pod_path("sim", "sim-bridge-0"))
    assert sim.last_authorization == "Bearer rotated"


def test_kube_config_from_env(tmp_path: Path) -> None:
    assert KubeConfig.resolve(env={}, sa_dir=str(tmp_path)) is None
    explicit = KubeConfig.resolve("http://127.0.0.1:1/")
    assert explicit == KubeConfig("http://127.0.0.1:1")
    (tmp_path / "token").write_text("t")
    (tmp_path / "ca.crt").write_text("")
    env = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "6443"}
    cfg = KubeConfig.resolve(env=env, sa_dir=str(tmp_path))
    assert cfg is not None and cfg.base_url == "https://[fd00::1]:6443"
    assert cfg.token_file == str(tmp_path / "token") and cfg.ca_file == str(tmp_path / "ca.crt")
    with pytest.raises(ValueError):
        KubeClient(KubeConfig("ftp://x"))


async def test_standalone_process(tmp_path: Path) -> None:
    """``python -m loadgen.kubesim`` prints its URL and serves until terminated."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "loadgen.kubesim",
        "--pod",
        str(K8S / "pod-running-initial.json"),
        "--cgroup-dir",
        str(tmp_path / "cg"),
        "--sync-interval",
        "0.05",
        "--actuation-delay",
        "0",
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        async with asyncio.timeout(15):
            first = (await proc.stdout.readline()).decode()
        url = first.split()[2]
        assert url.startswith("http://127.0.0.1:")
        client = KubeClient(KubeConfig(url))
        await client.patch(RESIZE, load("resize-patch-body.json"))
        await eventually(lambda: read(tmp_path / "cg" / "cpu.max") == "400000 100000")
    finally:
        proc.terminate()
        await proc.wait()
