"""Resources, QoS and in-place resize: the QoS class Kubernetes would compute for each scenario, and
Quantities and enums the API server would accept (its schemas accept any string)."""

from __future__ import annotations

from fractions import Fraction

import pytest

from tests.unit.chart_support import (
    CI_FILES,
    Obj,
    Renderer,
    bridge_container,
    by_kind,
    compute_qos,
    defaulted,
    parse_quantity,
    pod_spec,
    renderer_fixture,  # noqa: F401 - the module-scoped fixture
    workload,
)


def test_parse_quantity_reference_values() -> None:
    assert parse_quantity("500m") == Fraction(1, 2)
    assert parse_quantity("2") == 2
    assert parse_quantity(1.5) == Fraction(3, 2)
    assert parse_quantity("2Gi") == 2 * 2**30
    assert parse_quantity("1k") == 1000
    assert parse_quantity("1e3") == 1000
    for bad in ("two", "2GB", "", "1.2.3", "Gi", True):
        with pytest.raises(ValueError):
            parse_quantity(bad)


def test_compute_qos_reference_cases() -> None:
    def pod(*resources: Obj, pod_level: Obj | None = None) -> Obj:
        spec: Obj = {
            "containers": [{"name": f"c{i}", "resources": r} for i, r in enumerate(resources)]
        }
        if pod_level is not None:
            spec["resources"] = pod_level
        return spec

    g = {"limits": {"cpu": "1", "memory": "1Gi"}}
    assert compute_qos(pod(g)) == "Guaranteed"
    assert compute_qos(pod({"requests": {"cpu": "1000m", "memory": "1Gi"}, **g})) == "Guaranteed"
    assert compute_qos(pod(g, {"requests": {"cpu": "1"}})) == "Burstable"
    assert (
        compute_qos(pod({"requests": {"cpu": "1"}, "limits": {"cpu": "2", "memory": "1Gi"}}))
        == "Burstable"
    )
    assert compute_qos(pod({})) == "BestEffort"
    assert compute_qos(pod({"limits": {"nvidia.com/gpu": "1"}})) == "BestEffort"
    assert compute_qos(pod({}, pod_level={"limits": {"cpu": "2", "memory": "4Gi"}})) == "Guaranteed"
    assert compute_qos(pod(g, pod_level={"requests": {"cpu": "1", "memory": "1Gi"}})) == "Burstable"


EXPECTED_QOS = {
    "burstable-values.yaml": "Burstable",
    "burstable-no-cpu-limit-values.yaml": "Burstable",
}


@pytest.mark.parametrize("values_file", CI_FILES)
def test_qos_class(renderer: Renderer, values_file: str) -> None:
    spec = pod_spec(renderer.ci(values_file))
    assert compute_qos(spec) == EXPECTED_QOS.get(values_file, "Guaranteed")


def test_default_is_guaranteed_with_requests_equal_limits(renderer: Renderer) -> None:
    docs = renderer.render_values({})
    resources = bridge_container(docs)["resources"]
    assert resources["requests"] == resources["limits"]
    assert compute_qos(pod_spec(docs)) == "Guaranteed"
    assert workload(docs)["kind"] == "StatefulSet"


@pytest.mark.parametrize("values_file", CI_FILES)
def test_resize_policy_in_place_for_cpu_and_memory(renderer: Renderer, values_file: str) -> None:
    policy = bridge_container(renderer.ci(values_file))["resizePolicy"]
    assert {p["resourceName"]: p["restartPolicy"] for p in policy} == {
        "cpu": "NotRequired",
        "memory": "NotRequired",
    }


@pytest.mark.parametrize("values_file", CI_FILES)
def test_quantities_and_enums_valid(renderer: Renderer, values_file: str) -> None:
    docs = renderer.ci(values_file)
    spec = pod_spec(docs)
    blocks = [c.get("resources") or {} for c in spec["containers"]]
    if "resources" in spec:
        blocks.append(spec["resources"])
    for block in blocks:
        assert set(block) <= {"requests", "limits", "claims"}
        requests, limits = defaulted(block)
        for name, q in {**requests, **limits}.items():
            assert q > 0, (name, q)
            if name == "cpu":
                assert (q * 1000).denominator == 1, f"cpu {q} finer than 1m"
            elif name == "memory":
                assert q.denominator == 1
        for name, lim in limits.items():
            assert requests[name] <= lim, f"{name}: request above limit"
    for vol in spec["volumes"]:
        if "emptyDir" in vol and "sizeLimit" in vol["emptyDir"]:
            parse_quantity(vol["emptyDir"]["sizeLimit"])
    for c in spec["containers"]:
        for p in c.get("resizePolicy", []):
            assert p["resourceName"] in {"cpu", "memory"}
            assert p["restartPolicy"] in {"NotRequired", "RestartContainer"}
        assert c["imagePullPolicy"] in {"Always", "IfNotPresent", "Never"}
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert env["BRIDGE_LOG_FORMAT"] in {"json", "text"}
        assert env["BRIDGE_LOG_LEVEL"] in {"DEBUG", "INFO", "WARNING", "ERROR"}
        assert env["BRIDGE_DECIMATE_BACKEND"] in {"auto", "cuda", "c", "numpy"}
    for svc in by_kind(docs, "Service"):
        assert svc["spec"].get("type", "ClusterIP") in {"ClusterIP", "NodePort", "LoadBalancer"}


def test_pod_level_resources(renderer: Renderer) -> None:
    docs = renderer.ci("pod-level-resources-values.yaml")
    spec = pod_spec(docs)
    assert spec["resources"]["limits"] == {"cpu": "2", "memory": "4Gi"}
    assert spec["resources"]["requests"] == spec["resources"]["limits"]
    # The container inherits the pod-level limits: no cpu/memory of its own.
    assert "resources" not in bridge_container(docs)


def test_burstable_keeps_requests_below_limits(renderer: Renderer) -> None:
    res = bridge_container(renderer.ci("burstable-values.yaml"))["resources"]
    assert res["requests"] == {"cpu": "250m", "memory": "1Gi"}
    assert res["limits"] == {"cpu": "2", "memory": "4Gi"}
    res = bridge_container(renderer.ci("burstable-no-cpu-limit-values.yaml"))["resources"]
    assert "cpu" not in res["limits"]
