"""What the Helm chart's tests (tests/unit/test_chart_*.py) share: the chart rendered with a real
Helm engine, offline (helm-python-sdk bundles Helm 4 as a shared library), once per values file
under charts/simbridge/ci/ for the whole run; finders for the rendered objects; and what Kubernetes
itself would compute where its schemas accept anything (any string as a Quantity): Quantities and
the QoS class (computed like pkg/apis/core/helper/qos.ComputePodQOS), the CRD schemas vendored in
tests/fixtures/crds, and the series the bridge's /metrics can carry.

Importing it skips the importing test module when Helm, PyYAML, kubernetes-validate or jsonschema
is missing. A test module takes the ``renderer`` fixture by importing ``renderer_fixture``.
"""

from __future__ import annotations

import copy
import functools
import json
import re
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

yaml = pytest.importorskip("yaml", reason="PyYAML is needed to read rendered manifests")
helm = pytest.importorskip(
    "helm_python",
    reason="helm-python-sdk (bundled Helm engine) is not installed; pip install helm-python-sdk",
)
kv = pytest.importorskip(
    "kubernetes_validate",
    reason="kubernetes-validate is not installed; pip install kubernetes-validate",
)
jsonschema = pytest.importorskip("jsonschema", reason="jsonschema is not installed")

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "simbridge"
CI_DIR = CHART / "ci"
CI_FILES = sorted(p.name for p in CI_DIR.glob("*.yaml"))
K8S_VERSIONS = ("1.35.0", "1.36.0", "1.37.0")
RELEASE = "sb"
NAMESPACE = "sim"
FULLNAME = f"{RELEASE}-simbridge"
# Kinds from CRDs the Kubernetes schemas do not cover: validated against the CRD schemas vendored
# in tests/fixtures/crds where there is one, checked structurally otherwise.
CRD_KINDS = {
    "ServiceMonitor",
    "Gateway",
    "HTTPRoute",
    "GRPCRoute",
    "PrometheusRule",
    "VerticalPodAutoscaler",
    "BackendTrafficPolicy",
}
CRD_SCHEMAS = REPO / "tests" / "fixtures" / "crds"
WORKLOAD_KINDS = {"StatefulSet", "Deployment"}

Obj = dict[str, Any]


# ------------------------------------------------------------------------------------- rendering


def load_values(name: str) -> Obj:
    loaded = yaml.safe_load((CI_DIR / name).read_text())
    return loaded or {}


#: Each values file's rendered objects, shared by every test module of the run (the chart does
#: not change while it runs), so each scenario is rendered once, not once per test module.
_RENDERED: dict[str, list[Obj]] = {}


class Renderer:
    """Renders the chart once per values file (cached for the run); objects come back parsed."""

    def __init__(self) -> None:
        self.chart = helm.Chart.load(str(CHART))
        self._cache = _RENDERED

    def render_values(self, values: Obj) -> list[Obj]:
        manifests = self.chart.render(values, name=RELEASE, namespace=NAMESPACE)
        docs: list[Obj] = []
        for path, text in sorted(manifests.items()):
            if not path.endswith((".yaml", ".yml")):
                continue  # NOTES.txt
            docs.extend(d for d in yaml.safe_load_all(text) if d)
        return docs

    def ci(self, name: str) -> list[Obj]:
        if name not in self._cache:
            self._cache[name] = self.render_values(load_values(name))
        return copy.deepcopy(self._cache[name])


@pytest.fixture(scope="module", name="renderer")
def renderer_fixture() -> Iterator[Renderer]:
    r = Renderer()
    yield r
    r.chart.close()


# ------------------------------------------------------------------------------- finding objects


def by_kind(docs: list[Obj], kind: str) -> list[Obj]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[Obj], kind: str, name: str | None = None) -> Obj:
    found = [d for d in by_kind(docs, kind) if name is None or d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def workload(docs: list[Obj]) -> Obj:
    found = [d for d in docs if d["kind"] in WORKLOAD_KINDS]
    assert len(found) == 1
    return found[0]


def pod_spec(docs: list[Obj]) -> Obj:
    spec: Obj = workload(docs)["spec"]["template"]["spec"]
    return spec


def bridge_container(docs: list[Obj]) -> Obj:
    containers: list[Obj] = pod_spec(docs)["containers"]
    [c] = [c for c in containers if c["name"] == "bridge"]
    return c


def bridge_env(docs: list[Obj]) -> dict[str, Obj]:
    return {e["name"]: e for e in bridge_container(docs)["env"]}


def most_replicas(docs: list[Obj]) -> int:
    """Most pods the workload can have: spec.replicas, or the maxReplicas of an HPA owning it."""
    w = workload(docs)
    hpas = [
        h
        for h in by_kind(docs, "HorizontalPodAutoscaler")
        if h["spec"]["scaleTargetRef"]["name"] == w["metadata"]["name"]
    ]
    if hpas:
        [hpa] = hpas
        assert "replicas" not in w["spec"], "with an HPA the chart must leave spec.replicas alone"
        return int(hpa["spec"]["maxReplicas"])
    return int(w["spec"]["replicas"])


# ---------------------------------------------- quantities and QoS (as Kubernetes computes them)


_QUANTITY = re.compile(
    r"^(?P<num>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(?P<suffix>[a-zA-Z]*|[eE][+-]?[0-9]+)$"
)


_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}


_DECIMAL = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}


def parse_quantity(value: object) -> Fraction:
    """Parse a Kubernetes resource.Quantity (the serialized forms the API server accepts)."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ValueError(f"not a quantity: {value!r}")
    text = str(value)
    m = _QUANTITY.match(text)
    if not m:
        raise ValueError(f"not a quantity: {text!r}")
    number = Fraction(m["num"])
    suffix = m["suffix"]
    if suffix in _BINARY:
        return number * _BINARY[suffix]
    if suffix in _DECIMAL:
        return number * _DECIMAL[suffix]
    if suffix[:1] in ("e", "E"):
        return number * Fraction(10) ** int(suffix[1:])
    raise ValueError(f"unknown quantity suffix in {text!r}")


QOS_RESOURCES = ("cpu", "memory")


def defaulted(resources: Obj | None) -> tuple[dict[str, Fraction], dict[str, Fraction]]:
    """requests/limits after API-server defaulting: a limit without a request defaults it."""
    resources = resources or {}
    limits = {k: parse_quantity(v) for k, v in (resources.get("limits") or {}).items()}
    requests = {k: parse_quantity(v) for k, v in (resources.get("requests") or {}).items()}
    for name, lim in limits.items():
        requests.setdefault(name, lim)
    return requests, limits


def compute_qos(spec: Obj) -> str:
    """Pod QoS class as Kubernetes computes it (ComputePodQOS, PodLevelResources enabled)."""
    pod_level = spec.get("resources")
    if pod_level and (pod_level.get("requests") or pod_level.get("limits")):
        requests, limits = defaulted(pod_level)
        requests = {k: v for k, v in requests.items() if k in QOS_RESOURCES and v > 0}
        limits = {k: v for k, v in limits.items() if k in QOS_RESOURCES and v > 0}
        guaranteed = set(limits) >= set(QOS_RESOURCES)
    else:
        requests, limits = {}, {}
        guaranteed = True
        for c in [*spec.get("initContainers", []), *spec["containers"]]:
            c_req, c_lim = defaulted(c.get("resources"))
            for name, q in c_req.items():
                if name in QOS_RESOURCES and q > 0:
                    requests[name] = requests.get(name, Fraction(0)) + q
            found = set()
            for name, q in c_lim.items():
                if name in QOS_RESOURCES and q > 0:
                    found.add(name)
                    limits[name] = limits.get(name, Fraction(0)) + q
            if not found >= set(QOS_RESOURCES):
                guaranteed = False
    if not requests and not limits:
        return "BestEffort"
    if guaranteed:
        for name, req in requests.items():
            if limits.get(name) != req:
                guaranteed = False
                break
    if guaranteed and len(requests) == len(limits):
        return "Guaranteed"
    return "Burstable"


# ----------------------------------------------------------------------- custom resources (CRDs)


def _strict(schema: Any) -> Any:
    """Reject unknown fields, as the API server does with strict field validation."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) for k, v in schema.items()}
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


@functools.cache
def crd_validators() -> dict[tuple[str, str], Any]:
    found = {}
    for path in sorted(CRD_SCHEMAS.glob("*.json")):
        doc = json.loads(path.read_text())
        schema = _strict(doc["schema"])
        found[(doc["apiVersion"], doc["kind"])] = jsonschema.Draft7Validator(schema)
    return found


# -------------------------------------------------------------------------- the bridge's metrics


@functools.cache
def exported_series() -> frozenset[str]:
    """Every series name the bridge's /metrics can carry, from its own metric registrations."""
    prometheus_client = pytest.importorskip("prometheus_client")
    metrics_mod = pytest.importorskip(
        "bridge.server.metrics", reason="bridge package not importable"
    )
    resource_metrics = pytest.importorskip("bridge.resources.metrics")
    registry = prometheus_client.CollectorRegistry()
    metrics_mod.BridgeMetrics(registry)
    resource_metrics.ResourceMetrics(registry)
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
    names = set()
    for family in registry.collect():
        for suffix in suffixes.get(family.type, ("",)):
            names.add(family.name + suffix)
    return frozenset(names)
