"""Pod, ResourceClaim and ResourceSlice models and quantities, on the real-shaped fixtures."""

from __future__ import annotations

import copy
import json
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from bridge.resources.pod import (
    ResizeState,
    Resources,
    parse_claim,
    parse_pod,
    parse_slices,
    pending_memory_decrease,
    resolve_devices,
)
from bridge.resources.quantity import (
    QuantityError,
    format_bytes,
    parse_quantity,
    to_bytes,
    to_millicores,
)

K8S = Path(__file__).resolve().parent.parent / "fixtures" / "k8s"
GiB = 1 << 30
MiB = 1 << 20


def load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((K8S / name).read_text())
    return data


# ------------------------------------------------------------------------------ quantities


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("2", Fraction(2)),
        ("250m", Fraction(1, 4)),
        ("12Gi", Fraction(12 * GiB)),
        ("20224Mi", Fraction(20224 * MiB)),
        ("1.5Ki", Fraction(1536)),
        ("1k", Fraction(1000)),
        ("1M", Fraction(10**6)),
        ("1G", Fraction(10**9)),
        ("1e3", Fraction(1000)),
        ("1E-2", Fraction(1, 100)),
        ("100u", Fraction(1, 10_000)),
        ("5n", Fraction(5, 10**9)),
        ("+3", Fraction(3)),
        ("-1", Fraction(-1)),
        (".5", Fraction(1, 2)),
        ("1Ei", Fraction(1 << 60)),
        (7, Fraction(7)),
    ],
)
def test_parse_quantity(text: str | int, value: Fraction) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", ["two", "", "1Gb", "1 Gi", "1.2.3", "Gi", "1ki", "--1", "1e"])
def test_parse_quantity_rejects(text: str) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(text)


def test_conversions_round_up() -> None:
    assert to_millicores("250m") == 250
    assert to_millicores("2") == 2000
    assert to_millicores("1u") == 1  # MilliValue rounds up
    assert to_bytes("100m") == 1
    assert to_bytes("8Gi") == 8 * GiB
    assert format_bytes(None) == "unlimited"
    assert format_bytes(8 * GiB) == "8.0 GiB"
    assert format_bytes(512) == "512 B"


# ------------------------------------------------------------------------------ pods

TWO_8 = Resources(2000, 2000, 8 * GiB, 8 * GiB)
FOUR_12 = Resources(4000, 4000, 12 * GiB, 12 * GiB)


@pytest.mark.parametrize(
    ("fixture", "state", "desired", "allocated_cpu", "actual", "generation", "observed"),
    [
        ("pod-running-initial.json", ResizeState.NONE, TWO_8, 2000, TWO_8, 1, 1),
        ("pod-resize-deferred.json", ResizeState.DEFERRED, FOUR_12, 2000, TWO_8, 2, 2),
        ("pod-resize-inprogress.json", ResizeState.IN_PROGRESS, FOUR_12, 4000, TWO_8, 2, 2),
        ("pod-resize-done.json", ResizeState.NONE, FOUR_12, 4000, FOUR_12, 2, 2),
        (
            "pod-resize-infeasible.json",
            ResizeState.INFEASIBLE,
            Resources(40000, 40000, 12 * GiB, 12 * GiB),
            4000,
            FOUR_12,
            3,
            3,
        ),
        (
            "pod-resize-mem-decrease-blocked.json",
            ResizeState.ERROR,
            Resources(4000, 4000, 6 * GiB, 6 * GiB),
            4000,
            FOUR_12,
            3,
            3,
        ),
        ("pod-resize-done-v1.36-health.json", ResizeState.NONE, FOUR_12, 4000, FOUR_12, 2, 2),
    ],
)
def test_container_states(
    fixture: str,
    state: ResizeState,
    desired: Resources,
    allocated_cpu: int,
    actual: Resources,
    generation: int,
    observed: int,
) -> None:
    pod = parse_pod(load(fixture))
    assert (pod.name, pod.namespace, pod.node_name) == ("sim-bridge-0", "sim", "gpu-node-a")
    assert pod.resize_state() is state
    c = pod.container()
    assert c is not None and c.name == "bridge"
    assert c.desired == desired
    assert c.allocated is not None and c.allocated.cpu_request_m == allocated_cpu
    assert c.actual == actual
    assert (pod.generation, pod.observed_generation) == (generation, observed)
    assert pod.generation_observed
    assert pod.claim_statuses == (("gpu", "sim-bridge-0-gpu-x7k2p"),)
    assert pod.problems == ()


def test_conditions_carry_reason_and_message() -> None:
    deferred = parse_pod(load("pod-resize-deferred.json")).resize_pending
    assert deferred is not None
    assert deferred.reason == "Deferred"
    assert deferred.message.startswith("Node didn't have enough resource: cpu")
    assert deferred.observed_generation == 2
    infeasible = parse_pod(load("pod-resize-infeasible.json")).resize_pending
    assert infeasible is not None and infeasible.reason == "Infeasible"
    err = parse_pod(load("pod-resize-mem-decrease-blocked.json")).resize_in_progress
    assert err is not None and err.reason == "Error"
    assert "below current usage (9663676416)" in err.message
    ip = parse_pod(load("pod-resize-inprogress.json")).resize_in_progress
    assert ip is not None and (ip.reason, ip.message) == ("", "")


def test_generation_not_yet_observed() -> None:
    obj = load("pod-resize-deferred.json")
    obj["metadata"]["generation"] = 3
    assert not parse_pod(obj).generation_observed


def test_pod_level_resources() -> None:
    pod = parse_pod(load("pod-level-resize-inprogress-v1.36.json"))
    assert pod.qos_class == "Burstable"
    assert pod.pod_desired == Resources(4000, 12000, 16 * GiB, 16 * GiB)
    assert pod.pod_allocated == Resources(cpu_request_m=4000, memory_request=16 * GiB)
    assert pod.pod_actual == Resources(4000, 8000, 16 * GiB, 16 * GiB)
    assert pod.resize_state() is ResizeState.IN_PROGRESS
    bridge = pod.container("bridge")
    assert bridge is not None and bridge.desired.is_empty()
    assert bridge.actual is not None and bridge.actual.is_empty()
    tele = pod.container("telemetry")
    assert tele is not None and tele.desired == Resources(250, 500, 256 * MiB, 512 * MiB)
    assert pod.container("nope") is None


def test_health_status() -> None:
    pod = parse_pod(load("pod-resize-done-v1.36-health.json"))
    c = pod.container()
    assert c is not None
    (h,) = c.health
    assert (h.claim, h.resource_id, h.health) == (
        "gpu",
        "gpu.nvidia.com/gpu-node-a/gpu-0-mig-3g40gb-9-4",
        "Healthy",
    )


def test_bad_quantity_is_a_problem_not_a_crash() -> None:
    obj = load("pod-running-initial.json")
    obj["spec"]["containers"][0]["resources"]["limits"]["cpu"] = "two"
    pod = parse_pod(obj)
    c = pod.container()
    assert c is not None and c.desired.cpu_limit_m is None
    assert c.desired.memory_limit == 8 * GiB
    assert any("limits.cpu" in p and "two" in p for p in pod.problems)


def test_empty_and_odd_objects() -> None:
    pod = parse_pod({})
    assert pod.containers == () and pod.container() is None
    assert pod.resize_state() is ResizeState.NONE
    pod = parse_pod({"spec": {"containers": "nope"}, "status": {"conditions": [None, 3]}})
    assert pod.containers == ()


# ------------------------------------------------------------------------------ downscale


@pytest.mark.parametrize(
    ("fixture", "expected"),
    [
        ("pod-running-initial.json", None),
        ("pod-resize-deferred.json", None),  # an increase
        ("pod-resize-done.json", None),
        ("pod-resize-mem-decrease-blocked.json", 6 * GiB),
    ],
)
def test_pending_memory_decrease(fixture: str, expected: int | None) -> None:
    target = pending_memory_decrease(parse_pod(load(fixture)))
    assert (target.limit_bytes if target else None) == expected


def test_decrease_before_the_kubelet_acts_and_infeasible_does_not_count() -> None:
    obj = load("pod-running-initial.json")
    obj["metadata"]["generation"] = 2
    for k in ("requests", "limits"):
        obj["spec"]["containers"][0]["resources"][k]["memory"] = "6Gi"
    target = pending_memory_decrease(parse_pod(obj))
    assert target is not None and target.limit_bytes == 6 * GiB
    assert "desired < actual" in target.source
    infeasible = copy.deepcopy(obj)
    infeasible["status"]["conditions"].append(
        {"type": "PodResizePending", "status": "True", "reason": "Infeasible", "message": "x"}
    )
    assert pending_memory_decrease(parse_pod(infeasible)) is None


def test_pod_level_memory_decrease() -> None:
    obj = load("pod-level-resize-inprogress-v1.36.json")
    obj["spec"]["resources"]["limits"]["memory"] = "10Gi"
    target = pending_memory_decrease(parse_pod(obj))
    assert target is not None and target.limit_bytes == 10 * GiB
    assert target.source.startswith("pod spec.resources")


# ------------------------------------------------------------------------------ DRA


def test_claim_and_slice_resolution() -> None:
    claim = parse_claim(load("resourceclaim-allocated.json"))
    assert claim.allocated and claim.name == "sim-bridge-0-gpu-x7k2p"
    (ref,) = claim.results
    assert (ref.request, ref.driver, ref.pool, ref.device) == (
        "mig",
        "gpu.nvidia.com",
        "gpu-node-a",
        "gpu-0-mig-3g40gb-9-4",
    )
    slices = parse_slices([load("resourceslice-h100-nvidia-static-mig.json")])
    assert len(slices) == 5
    full = slices[("gpu.nvidia.com", "gpu-node-a", "gpu-1")]
    assert full.attribute("type") == "gpu" and full.attribute("profile") is None
    assert full.attribute("resource.kubernetes.io/pciBusID") is not None

    pod = parse_pod(load("pod-resize-done-v1.36-health.json"))
    (dev,) = resolve_devices(pod, {claim.name: claim}, slices)
    assert dev.uuid == "MIG-4d5e6f7a-8b9c-5d0e-1f2a-3b4c5d6e7f80"
    assert dev.profile == "3g.40gb"
    assert dev.product_name == "NVIDIA H100 80GB HBM3"
    assert dev.memory_bytes == 40448 * MiB
    assert dev.health == "Healthy"
    assert dev.pod_claim == "gpu"
    assert "gpu.nvidia.com/gpu-node-a/gpu-0-mig-3g40gb-9-4" in dev.source


def test_slice_list_and_missing_pieces() -> None:
    one = load("resourceslice-h100-nvidia-static-mig.json")
    slices = parse_slices([{"kind": "ResourceSliceList", "items": [one]}])
    assert len(slices) == 5
    claim = parse_claim(load("resourceclaim-allocated.json"))
    pod = parse_pod(load("pod-running-initial.json"))
    (dev,) = resolve_devices(pod, {claim.name: claim}, {})  # slice not visible (no ClusterRole)
    assert dev.uuid is None and dev.memory_bytes is None and dev.health == "Unknown"
    assert "not found" in dev.source
    assert resolve_devices(pod, {}, slices) == ()  # claim not fetched yet


def test_unhealthy_device_with_message() -> None:
    obj = load("pod-resize-done-v1.36-health.json")
    res = obj["status"]["containerStatuses"][0]["allocatedResourcesStatus"][0]["resources"][0]
    res.update(health="Unhealthy", message="XID 79: GPU has fallen off the bus")
    claim = parse_claim(load("resourceclaim-allocated.json"))
    slices = parse_slices([load("resourceslice-h100-nvidia-static-mig.json")])
    (dev,) = resolve_devices(parse_pod(obj), {claim.name: claim}, slices)
    assert (dev.health, dev.health_message) == ("Unhealthy", "XID 79: GPU has fallen off the bus")


def test_consumable_capacity_claim_and_unallocated_claim() -> None:
    claim = parse_claim(load("resourceclaim-consumable-capacity-example.json"))
    (ref,) = claim.results
    assert ref.resource_id == "dra.example.com/pool/gpu-0"
    pending = parse_claim({"metadata": {"name": "x"}, "status": {}})
    assert not pending.allocated and pending.results == ()


def test_default_container_is_bridge_else_first() -> None:
    obj = load("pod-level-resize-inprogress-v1.36.json")
    obj["spec"]["containers"].reverse()  # telemetry first
    pod = parse_pod(obj)
    c = pod.container()
    assert c is not None and c.name == "bridge"
    for spec in obj["spec"]["containers"]:
        spec["name"] = "x-" + spec["name"]
    first = parse_pod(obj).container()
    assert first is not None and first.name == "x-telemetry"
