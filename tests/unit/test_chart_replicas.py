"""The chart past one pod (issue 32): replicas behind Envoy Gateway with consistent hashing on the
device header, and a HorizontalPodAutoscaler on the event loop's busy fraction beside the VPA.

Every rendered object is validated by tests/unit/test_chart_validate.py (kubernetes-validate
--strict for the HPA, the vendored CRD schemas for the routes and the BackendTrafficPolicy); this
file checks what those schemas cannot: what the objects point at, and that they agree with each
other, with the metrics the bridge exports and with the adapter rule in docs/kubernetes.md.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.unit.chart_support import (
    FULLNAME,
    NAMESPACE,
    RELEASE,
    Renderer,
    by_kind,
    crd_validators,
    exported_series,
    helm,
    jsonschema,
    most_replicas,
    one,
    parse_quantity,
    renderer_fixture,  # noqa: F401 - the module-scoped fixture
    workload,
    yaml,
)

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs" / "kubernetes.md"
DEVICE_HEADER = "x-simbridge-device"
BTP = ("gateway.envoyproxy.io/v1alpha1", "BackendTrafficPolicy")
Obj = dict[str, Any]

ROUTES = {
    "gatewayAPI": {
        "parentRefs": [{"name": "edge-gateway", "namespace": "gateways"}],
        "httpRoute": {"enabled": True},
        "grpcRoute": {"enabled": True},
    }
}


def _route_refs(docs: list[Obj]) -> list[Obj]:
    return [
        {"group": "gateway.networking.k8s.io", "kind": r["kind"], "name": r["metadata"]["name"]}
        for kind in ("HTTPRoute", "GRPCRoute")
        for r in by_kind(docs, kind)
    ]


# ------------------------------------------------------------------ replicas and device affinity


def test_three_replicas_behind_envoy_gateway_hash_the_device_header(
    renderer: Renderer,
) -> None:
    docs = renderer.ci("replicas-gateway-values.yaml")
    assert workload(docs)["spec"]["replicas"] == 3
    policy = one(docs, "BackendTrafficPolicy")
    assert (policy["apiVersion"], policy["kind"]) == BTP
    assert (
        policy["metadata"]["namespace"]
        == NAMESPACE
        == one(docs, "HTTPRoute")["metadata"]["namespace"]
    ), "targetRefs are local: the policy lives beside the routes"
    assert policy["spec"]["targetRefs"] == _route_refs(docs)
    assert {r["kind"] for r in policy["spec"]["targetRefs"]} == {"HTTPRoute", "GRPCRoute"}
    assert policy["spec"]["loadBalancer"] == {
        "type": "ConsistentHash",
        "consistentHash": {"type": "Header", "header": {"name": DEVICE_HEADER}},
    }
    # Only when asked for: not by default, not for routes or replicas alone.
    for values in ({}, ROUTES, {"replicas": 3}):
        assert not by_kind(renderer.render_values(values), "BackendTrafficPolicy")


def test_headers_form_for_newer_envoy_gateway(renderer: Renderer) -> None:
    docs = renderer.ci("autoscaling-values.yaml")
    consistent = one(docs, "BackendTrafficPolicy")["spec"]["loadBalancer"]["consistentHash"]
    assert consistent == {
        "type": "Headers",
        "headers": [{"name": DEVICE_HEADER}],
        "tableSize": 65537,
    }


@pytest.mark.parametrize("hash_type", ["Header", "Headers"])
@pytest.mark.parametrize("routes", [("httpRoute",), ("grpcRoute",), ("httpRoute", "grpcRoute")])
def test_policy_follows_the_routes_and_the_crd_rules(
    renderer: Renderer,
    hash_type: str,
    routes: tuple[str, ...],
) -> None:
    """The CEL rules of the published CRD (dropped from the vendored schema) say: type Header
    needs `header` and forbids `headers`, type Headers the reverse; ConsistentHash needs
    consistentHash."""
    values = {
        "gatewayAPI": {
            "parentRefs": [{"name": "gw"}],
            **{r: {"enabled": True} for r in routes},
            "envoyGatewayAffinity": {"enabled": True, "hashType": hash_type},
        }
    }
    docs = renderer.render_values(values)
    policy = one(docs, "BackendTrafficPolicy")
    assert policy["spec"]["targetRefs"] == _route_refs(docs)
    assert len(policy["spec"]["targetRefs"]) == len(routes)
    assert not list(crd_validators()[BTP].iter_errors(policy))
    lb = policy["spec"]["loadBalancer"]
    assert lb["type"] == "ConsistentHash" and "consistentHash" in lb
    ch = lb["consistentHash"]
    assert ch["type"] == hash_type
    assert ("header" in ch) == (hash_type == "Header")
    assert ("headers" in ch) == (hash_type == "Headers")
    assert not {"cookie", "queryParams"} & set(ch)


def test_vendored_policy_schema_catches_a_misspelt_field() -> None:
    policy = {"apiVersion": BTP[0], "kind": BTP[1], "metadata": {}, "spec": {"loadBalancer": {}}}
    policy["spec"]["loadBalancer"] = {"type": "ConsistentHash", "consistentHash": {"type": "Hdr"}}
    assert list(crd_validators()[BTP].iter_errors(policy))
    policy["spec"]["loadBalancer"] = {
        "type": "ConsistentHash",
        "consistenthash": {"type": "Header"},
    }
    assert list(crd_validators()[BTP].iter_errors(policy))


def test_notes_say_how_devices_stay_on_one_replica(renderer: Renderer) -> None:
    def notes(values: Obj) -> str:
        rendered = renderer.chart.render(values, name=RELEASE, namespace=NAMESPACE)
        return next(t for p, t in rendered.items() if p.endswith("NOTES.txt"))

    assert DEVICE_HEADER not in notes({})
    plain = notes({"replicas": 3})
    assert DEVICE_HEADER in plain and "gatewayAPI.envoyGatewayAffinity.enabled" in plain
    affine = notes({"replicas": 3, **_affinity_on()})
    assert f"BackendTrafficPolicy {FULLNAME}-device-affinity" in affine


def _affinity_on() -> Obj:
    return {"gatewayAPI": {**ROUTES["gatewayAPI"], "envoyGatewayAffinity": {"enabled": True}}}


# ------------------------------------------------------------------ autoscaling


def test_hpa_scales_the_workload_on_the_loop_saturation_only(
    renderer: Renderer,
) -> None:
    docs = renderer.ci("autoscaling-values.yaml")
    w = workload(docs)
    hpa = one(docs, "HorizontalPodAutoscaler")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": w["kind"],
        "name": w["metadata"]["name"],
    }
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (3, 8)
    assert "replicas" not in w["spec"], "the HPA owns the replica count"
    [metric] = hpa["spec"]["metrics"]
    assert metric == {
        "type": "Pods",
        "pods": {
            "metric": {"name": "bridge_event_loop_busy_ratio"},
            "target": {"type": "AverageValue", "averageValue": "600m"},
        },
    }
    assert 0 < parse_quantity(metric["pods"]["target"]["averageValue"]) < 1, "a busy fraction"
    # Different signals: the VPA on cpu/memory, the HPA on neither.
    vpa = one(docs, "VerticalPodAutoscaler")
    [policy] = vpa["spec"]["resourcePolicy"]["containerPolicies"]
    assert set(policy["controlledResources"]) == {"cpu", "memory"}
    assert vpa["spec"]["updatePolicy"]["updateMode"] == "InPlaceOrRecreate"
    assert parse_quantity(policy["minAllowed"]["cpu"]) >= 1, "keep the loop's core"
    # Scaling moves devices: at most one replica at a time, down slowly.
    behavior = hpa["spec"]["behavior"]
    for direction in ("scaleUp", "scaleDown"):
        assert behavior[direction]["policies"][0] == {
            "type": "Pods",
            "value": 1,
            "periodSeconds": behavior[direction]["policies"][0]["periodSeconds"],
        }
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] >= 300
    # Off by default: one replica, spec.replicas rendered.
    default = renderer.render_values({})
    assert workload(default)["spec"]["replicas"] == 1
    assert not by_kind(default, "HorizontalPodAutoscaler")


def test_hpa_never_rendered_on_cpu_or_memory(renderer: Renderer) -> None:
    """Whatever metric name is set, the HPA stays a Pods metric (no Resource/ContainerResource)."""
    docs = renderer.render_values(
        {"autoscaling": {"enabled": True, "metric": {"name": "cpu", "averageValue": "1"}}}
    )
    kinds = {m["type"] for m in one(docs, "HorizontalPodAutoscaler")["spec"]["metrics"]}
    assert kinds == {"Pods"}


@pytest.mark.parametrize("kind", ["StatefulSet", "Deployment"])
def test_roles_cover_every_ordinal_the_hpa_can_create(
    renderer: Renderer,
    kind: str,
) -> None:
    values = {
        "workload": {"kind": kind},
        "replicas": 2,
        "autoscaling": {"enabled": True, "minReplicas": 2, "maxReplicas": 5},
        "resizer": {"enabled": True},
    }
    docs = renderer.render_values(values)
    assert most_replicas(docs) == 5
    ordinals = [tuple(f"{FULLNAME}-{i}" for i in range(5))] if kind == "StatefulSet" else []
    for name in (FULLNAME, f"{FULLNAME}-resizer"):
        rules = one(docs, "Role", name)["rules"]
        named = [tuple(r["resourceNames"]) for r in rules if "resourceNames" in r]
        assert named == ordinals, name


# ------------------------------------------------------------------ the adapter rule in the docs


def _adapter_rule() -> Obj:
    blocks = re.findall(r"```yaml\n(.*?)```", DOCS.read_text(), re.S)
    rules = [b for b in blocks if "seriesQuery" in b]
    assert len(rules) == 1, "docs/kubernetes.md shows one prometheus-adapter rule"
    [rule] = yaml.safe_load(rules[0])
    assert isinstance(rule, dict)
    return rule


def test_documented_adapter_rule_serves_the_hpa_metric_from_an_exported_series(
    renderer: Renderer,
) -> None:
    rule = _adapter_rule()
    series = re.match(r"^([a-z_:][a-z0-9_:]*)\{", rule["seriesQuery"])
    assert series and series[1] in exported_series(), rule["seriesQuery"]
    assert series[1].endswith("_seconds_total"), "a busy-seconds counter: the rate is the fraction"
    assert re.fullmatch(rule["name"]["matches"], series[1])
    assert rule["resources"]["overrides"] == {
        "namespace": {"resource": "namespace"},
        "pod": {"resource": "pod"},
    }
    assert re.search(r"\brate\(<<\.Series>>\{<<\.LabelMatchers>>\}\[\w+\]\)", rule["metricsQuery"])
    assert "by (<<.GroupBy>>)" in rule["metricsQuery"]
    values = renderer.chart.merge_values({})
    assert rule["name"]["as"] == values["autoscaling"]["metric"]["name"]
    hpa = one(renderer.ci("autoscaling-values.yaml"), "HorizontalPodAutoscaler")
    assert hpa["spec"]["metrics"][0]["pods"]["metric"]["name"] == rule["name"]["as"]
    # The ServiceMonitor the adapter relies on labels samples with namespace and pod.
    assert one(renderer.ci("autoscaling-values.yaml"), "ServiceMonitor")


def test_docs_state_the_interplay_rules_with_sources() -> None:
    text = DOCS.read_text()
    for needed in (
        "https://github.com/kubernetes/autoscaler/blob/master/vertical-pod-autoscaler/docs/known-limitations.md",
        "https://kubernetes.io/docs/tasks/run-application/horizontal-pod-autoscale/#support-for-resource-metrics",
        "https://kubernetes.io/docs/tasks/run-application/horizontal-pod-autoscale/#migrating-deployments-and-statefulsets-to-horizontal-autoscaling",
        "https://gateway-api.sigs.k8s.io/geps/gep-1619/",
        "examples/haproxy/haproxy.cfg",
        "InPlaceOrRecreate",
    ):
        assert needed in text, needed


# ------------------------------------------------------------------ invalid values


AFFINITY = {"gatewayAPI": {**ROUTES["gatewayAPI"], "envoyGatewayAffinity": {"enabled": True}}}
HPA = {"autoscaling": {"enabled": True}}

# (case, a value the schema must refuse, the nearest value it must accept)
SCHEMA_CASES: list[tuple[str, Obj, Obj]] = [
    ("hash-type", {"hashType": "Cookie"}, {"hashType": "Headers"}),
    ("table-size", {"tableSize": 5000012}, {"tableSize": 5000011}),
    ("affinity-unknown-key", {"header": "x-other"}, {"annotations": {"a": "b"}}),
    ("hpa-max", {"maxReplicas": 0}, {"minReplicas": 1, "maxReplicas": 1}),
    ("hpa-metric-name", {"metric": {"name": "busy ratio"}}, {"metric": {"name": "busy_ratio"}}),
    ("hpa-target-zero", {"metric": {"averageValue": "0"}}, {"metric": {"averageValue": "0.5"}}),
    ("hpa-target-percent", {"metric": {"averageValue": "60%"}}, {"metric": {"averageValue": 0.6}}),
    ("hpa-unknown-key", {"targetCPUUtilizationPercentage": 80}, {"behavior": {}}),
]


def _case_values(case: str, change: Obj) -> Obj:
    if case.startswith("hpa-"):
        metric = {"name": "bridge_event_loop_busy_ratio", "averageValue": "600m"}
        if "metric" in change:
            change = {**change, "metric": {**metric, **change["metric"]}}
        return {"autoscaling": {**HPA["autoscaling"], **change}}
    affinity = {**AFFINITY["gatewayAPI"]["envoyGatewayAffinity"], **change}
    return {"gatewayAPI": {**AFFINITY["gatewayAPI"], "envoyGatewayAffinity": affinity}}


@pytest.mark.parametrize(("case", "bad", "good"), SCHEMA_CASES, ids=[c for c, _, _ in SCHEMA_CASES])
def test_values_schema_refuses_bad_and_accepts_good(
    renderer: Renderer,
    case: str,
    bad: Obj,
    good: Obj,
) -> None:
    schema = yaml.safe_load((REPO / "charts" / "simbridge" / "values.schema.json").read_text())
    validator = jsonschema.validators.validator_for(schema)(schema)
    accepted = _case_values(case, good)
    assert renderer.render_values(accepted), case
    assert not list(validator.iter_errors(renderer.chart.merge_values(accepted))), case
    refused = _case_values(case, bad)
    with pytest.raises(helm.HelmValuesError):
        renderer.render_values(refused)
    assert list(validator.iter_errors(renderer.chart.merge_values(refused))), case


@pytest.mark.parametrize(
    ("case", "values", "message"),
    [
        (
            "affinity-without-routes",
            {"gatewayAPI": {"envoyGatewayAffinity": {"enabled": True}}},
            "enable gatewayAPI.httpRoute and/or gatewayAPI.grpcRoute",
        ),
        (
            "hpa-min-above-max",
            {"autoscaling": {"enabled": True, "minReplicas": 5, "maxReplicas": 3}},
            "autoscaling.minReplicas (5) must not exceed autoscaling.maxReplicas (3)",
        ),
    ],
)
def test_inconsistent_values_fail_rendering(
    renderer: Renderer,
    case: str,
    values: Obj,
    message: str,
) -> None:
    with pytest.raises(helm.HelmError) as err:
        renderer.render_values(values)
    assert message in str(err.value), f"{case}: {err.value}"


def test_dashboard_shows_the_hpa_signal() -> None:
    dashboard = yaml.safe_load(
        (REPO / "charts" / "simbridge" / "dashboards" / "simbridge.json").read_text()
    )
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    busy = [e for e in exprs if "bridge_event_loop_busy_seconds_total" in e]
    # The average loop of each pod (one series per process in a pod, one for a single bridge):
    # a sum would read up to N for N processes (bridge/pod/metrics_merge.PER_PROCESS).
    assert busy and all(e.startswith("avg by (pod) (rate(") for e in busy), busy
    assert any("bridge_event_loop_lag_seconds_bucket" in e for e in exprs)
