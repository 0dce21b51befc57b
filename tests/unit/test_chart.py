"""Tests for the Helm chart in charts/simbridge.

Every values file under charts/simbridge/ci/ is rendered with a real Helm engine, offline
(helm-python-sdk bundles Helm 4 as a shared library), and every rendered object is validated with
kubernetes-validate --strict against the Kubernetes 1.35, 1.36 and 1.37 schemas. On top of the
schemas, which accept any string as a Quantity and any resizePolicy value, the tests check what
Kubernetes itself would compute or reject: the QoS class (computed like
pkg/apis/core/helper/qos.ComputePodQOS), Quantities, enum values, and that RBAC grants exactly what
the bridge and the resizer use. Invalid values must be refused by values.schema.json (or by the
templates' own checks) before anything reaches a cluster.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
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


# --------------------------------------------------------------------------- rendering


def _load_values(name: str) -> Obj:
    loaded = yaml.safe_load((CI_DIR / name).read_text())
    return loaded or {}


class Renderer:
    """Renders the chart once per values file (cached); objects come back parsed."""

    def __init__(self) -> None:
        self.chart = helm.Chart.load(str(CHART))
        self._cache: dict[str, list[Obj]] = {}

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
            self._cache[name] = self.render_values(_load_values(name))
        return copy.deepcopy(self._cache[name])


@pytest.fixture(scope="module")
def renderer() -> Iterator[Renderer]:
    r = Renderer()
    yield r
    r.chart.close()


@pytest.fixture(scope="module")
def cached_validator() -> Iterator[Callable[[Obj, str], None]]:
    """kubernetes_validate.validate(strict=True), with its schema files read once per run.

    kubernetes-validate re-reads its 1.5 MB definitions file on every call; caching the reads keeps
    a few hundred validations well under a second. The validation itself is the library's own.
    """
    utils = kv.utils
    original = getattr(utils, "schema_contents", None)
    if original is not None:
        utils.schema_contents = functools.lru_cache(maxsize=None)(original)

    def validate(obj: Obj, version: str) -> None:
        kv.validate(obj, version, strict=True)

    yield validate
    if original is not None:
        utils.schema_contents = original


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
    containers = pod_spec(docs)["containers"]
    [c] = [c for c in containers if c["name"] == "bridge"]
    return c


# --------------------------------------------------------------------------- quantities and QoS

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


QOS_RESOURCES = ("cpu", "memory")


def _defaulted(resources: Obj | None) -> tuple[dict[str, Fraction], dict[str, Fraction]]:
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
        requests, limits = _defaulted(pod_level)
        requests = {k: v for k, v in requests.items() if k in QOS_RESOURCES and v > 0}
        limits = {k: v for k, v in limits.items() if k in QOS_RESOURCES and v > 0}
        guaranteed = set(limits) >= set(QOS_RESOURCES)
    else:
        requests, limits = {}, {}
        guaranteed = True
        for c in [*spec.get("initContainers", []), *spec["containers"]]:
            c_req, c_lim = _defaulted(c.get("resources"))
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


# --------------------------------------------------------------------------- rendering and schemas


@pytest.mark.parametrize("values_file", CI_FILES)
def test_ci_values_render(renderer: Renderer, values_file: str) -> None:
    docs = renderer.ci(values_file)
    assert docs, "nothing rendered"
    kinds = {d["kind"] for d in docs}
    assert kinds & WORKLOAD_KINDS
    assert {"Service", "ServiceAccount", "Role", "RoleBinding"} <= kinds
    for d in docs:
        assert d["metadata"]["name"], d
        assert d["metadata"]["labels"]["app.kubernetes.io/instance"] == RELEASE
    names = [(d["kind"], d["metadata"]["name"]) for d in docs]
    assert len(names) == len(set(names)), "duplicate objects"


def test_ci_scenarios_are_present() -> None:
    """The scenarios named in the issue each have a values file."""
    for scenario in (
        "default",
        "burstable",
        "dra-claim",
        "dra-extended",
        "resizer",
        "pod-level-resources",
        "monitoring",
        "multi-replica",
        "replicas-gateway",
        "autoscaling",
    ):
        assert f"{scenario}-values.yaml" in CI_FILES


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("values_file", CI_FILES)
def test_rendered_objects_pass_kubernetes_validate_strict(
    renderer: Renderer,
    cached_validator: Callable[[Obj, str], None],
    values_file: str,
    version: str,
) -> None:
    for d in renderer.ci(values_file):
        if d["kind"] in CRD_KINDS:
            continue
        try:
            cached_validator(d, version)
        except kv.ValidationError as e:  # pragma: no cover - failure path
            pytest.fail(
                f"{d['kind']}/{d['metadata']['name']} invalid for {version}: "
                f"{e.message} at {list(e.path)}"
            )


@pytest.mark.timeout(300)  # three CLI runs over every scenario; slow on a loaded 2-core VM
def test_kubernetes_validate_cli_strict(renderer: Renderer, tmp_path: Path) -> None:
    """The same check through the kubernetes-validate CLI: all scenarios, one call per version,
    the three versions at once."""
    files = []
    for name in CI_FILES:
        docs = [d for d in renderer.ci(name) if d["kind"] not in CRD_KINDS]
        path = tmp_path / name
        path.write_text(yaml.safe_dump_all(docs))
        files.append(str(path))
    cli = (sys.executable, "-m", "kubernetes_validate", "--strict", "--quiet")
    procs = {
        version: subprocess.Popen(
            [*cli, "-k", version, *files],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for version in K8S_VERSIONS
    }
    try:
        for version, proc in procs.items():
            out, _ = proc.communicate(timeout=280)
            assert proc.returncode == 0, f"{version}: {out}"
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_servicemonitor_shape(renderer: Renderer) -> None:
    docs = renderer.ci("monitoring-values.yaml")
    sm = one(docs, "ServiceMonitor")
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    metrics = one(docs, "Service", f"{FULLNAME}-metrics")
    selector = sm["spec"]["selector"]["matchLabels"]
    assert selector.items() <= metrics["metadata"]["labels"].items()
    # No other Service carries the metrics component label.
    for svc in by_kind(docs, "Service"):
        if svc is not metrics:
            assert not selector.items() <= svc["metadata"]["labels"].items()
    [endpoint] = sm["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in metrics["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"
    assert sm["spec"]["namespaceSelector"]["matchNames"] == [NAMESPACE]


@pytest.mark.parametrize("kube_version", ["v" + v for v in K8S_VERSIONS])
def test_helm_lint_clean(kube_version: str) -> None:
    report = helm.lint(str(CHART), strict=True, kube_version=kube_version, namespace=NAMESPACE)
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert not report["errors"] and not problems, report


@pytest.mark.parametrize("values_file", CI_FILES)
def test_helm_lint_clean_per_scenario(values_file: str) -> None:
    report = helm.lint(
        str(CHART),
        _load_values(values_file),
        strict=True,
        kube_version="v1.36.0",
        namespace=NAMESPACE,
    )
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert not report["errors"] and not problems, report


# --------------------------------------------------------------------------- resources, QoS, resize


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
        requests, limits = _defaulted(block)
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


# --------------------------------------------------------------------------- pod wiring


@pytest.mark.parametrize("values_file", CI_FILES)
def test_downward_api_env_and_drain_consistent(renderer: Renderer, values_file: str) -> None:
    docs = renderer.ci(values_file)
    values = helm.Chart.load(str(CHART)).merge_values(_load_values(values_file))
    c = bridge_container(docs)
    env = {e["name"]: e for e in c["env"]}
    assert env["BRIDGE_POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["BRIDGE_POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    drain = int(env["BRIDGE_DRAIN_GRACE_SECONDS"]["value"])
    assert drain == values["bridge"]["drainGraceSeconds"]
    pre_stop = c.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
    grace = pod_spec(docs)["terminationGracePeriodSeconds"]
    assert grace > drain + pre_stop, "kubelet would SIGKILL before the drain grace ends"
    if values["bridge"]["sinkAddress"]:
        assert env["BRIDGE_SINK_ADDRESS"]["value"] == values["bridge"]["sinkAddress"]


@pytest.mark.parametrize("values_file", CI_FILES)
def test_probes_and_ports(renderer: Renderer, values_file: str) -> None:
    c = bridge_container(renderer.ci(values_file))
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"ws": 8080, "grpc": 9090, "http-metrics": 9100}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http-metrics"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http-metrics"}
    values = helm.Chart.load(str(CHART)).merge_values(_load_values(values_file))
    if values["tls"]["enabled"]:
        # The kubelet's gRPC probe speaks plaintext only: with TLS on 9090 it checks the socket.
        assert c["startupProbe"]["tcpSocket"] == {"port": "grpc"}
    else:
        assert c["startupProbe"]["grpc"]["port"] == 9090
    # A throttled bridge (CPU shrunk in place) must not be restarted by its liveness probe quickly.
    live = c["livenessProbe"]
    assert live["timeoutSeconds"] * live["failureThreshold"] >= 20


@pytest.mark.parametrize("values_file", CI_FILES)
def test_security_defaults(renderer: Renderer, values_file: str) -> None:
    docs = renderer.ci(values_file)
    spec = pod_spec(docs)
    c = bridge_container(docs)
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] != 0
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    vols = {v["name"]: v for v in spec["volumes"]}
    assert "emptyDir" in vols[mounts["/tmp"]]


@pytest.mark.parametrize("values_file", CI_FILES)
def test_selectors_match_pods(renderer: Renderer, values_file: str) -> None:
    docs = renderer.ci(values_file)
    w = workload(docs)
    pod_labels = w["spec"]["template"]["metadata"]["labels"]
    assert w["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    for svc in by_kind(docs, "Service"):
        assert svc["spec"]["selector"].items() <= pod_labels.items()
    for pdb in by_kind(docs, "PodDisruptionBudget"):
        assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    for tsc in pod_spec(docs).get("topologySpreadConstraints", []):
        assert tsc["labelSelector"]["matchLabels"].items() <= pod_labels.items()
    for np in by_kind(docs, "NetworkPolicy"):
        assert np["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()


def test_statefulset_headless_service_and_pod_dns(renderer: Renderer) -> None:
    docs = renderer.ci("multi-replica-values.yaml")
    sts = one(docs, "StatefulSet")
    headless = one(docs, "Service", f"{FULLNAME}-headless")
    assert headless["spec"]["clusterIP"] == "None"
    assert sts["spec"]["serviceName"] == headless["metadata"]["name"]
    assert sts["spec"]["replicas"] == 3
    assert {p["port"] for p in headless["spec"]["ports"]} == {8080, 9090, 9100}
    client = one(docs, "Service", FULLNAME)
    assert {p["name"]: p["port"] for p in client["spec"]["ports"]} == {"ws": 8080, "grpc": 9090}
    metrics = one(docs, "Service", f"{FULLNAME}-metrics")
    assert [p["port"] for p in metrics["spec"]["ports"]] == [9100]
    pdb = one(docs, "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1


def test_scaled_to_zero_never_widens_pod_access(renderer: Renderer) -> None:
    """replicas: 0 must not drop resourceNames (which would grant every pod in the namespace)."""
    docs = renderer.render_values({"replicas": 0, "resizer": {"enabled": True}})
    for role in by_kind(docs, "Role"):
        for rule in role["rules"]:
            if "pods" in rule["resources"] or "pods/resize" in rule["resources"]:
                assert rule["resourceNames"] == [f"{FULLNAME}-0"]


def test_deployment_variant(renderer: Renderer) -> None:
    docs = renderer.ci("deployment-values.yaml")
    d = one(docs, "Deployment")
    assert "serviceName" not in d["spec"]
    assert d["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    for rule in one(docs, "Role")["rules"]:
        assert "resourceNames" not in rule, "a Deployment has no stable pod names to restrict to"


# --------------------------------------------------------------------------- RBAC


def _rules(role: Obj) -> set[tuple[str, str, str, tuple[str, ...]]]:
    """Flatten rules to (apiGroup, resource, verb, resourceNames) tuples."""
    out = set()
    for rule in role["rules"]:
        names = tuple(rule.get("resourceNames", ()))
        for group in rule.get("apiGroups", []):
            for resource in rule.get("resources", []):
                for verb in rule.get("verbs", []):
                    out.add((group, resource, verb, names))
    return out


def _bridge_role(docs: list[Obj]) -> Obj:
    return one(docs, "Role", FULLNAME)


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


@pytest.mark.parametrize("values_file", CI_FILES)
def test_bridge_role_grants_exactly_what_the_bridge_uses(
    renderer: Renderer, values_file: str
) -> None:
    docs = renderer.ci(values_file)
    values = helm.Chart.load(str(CHART)).merge_values(_load_values(values_file))
    w = workload(docs)
    if w["kind"] == "StatefulSet":
        own: tuple[str, ...] = tuple(f"{FULLNAME}-{i}" for i in range(most_replicas(docs)))
    else:
        own = ()
    expected = {
        ("", "pods", "get", own),
        ("", "pods", "watch", own),
        ("", "events", "create", ()),
    }
    if values["dra"]["enabled"]:
        expected.add(("resource.k8s.io", "resourceclaims", "get", ()))
    assert _rules(_bridge_role(docs)) == expected
    binding = one(docs, "RoleBinding", FULLNAME)
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": FULLNAME,
    }
    sa = pod_spec(docs)["serviceAccountName"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa, "namespace": NAMESPACE}]
    # Cluster-scoped read of ResourceSlices only when asked for, and only list/watch.
    cluster_roles = by_kind(docs, "ClusterRole")
    if values["rbac"]["resourceSlices"]:
        [cr] = cluster_roles
        assert _rules(cr) == {
            ("resource.k8s.io", "resourceslices", "list", ()),
            ("resource.k8s.io", "resourceslices", "watch", ()),
        }
        crb = one(docs, "ClusterRoleBinding")
        assert crb["roleRef"]["name"] == cr["metadata"]["name"]
        assert crb["subjects"] == binding["subjects"]
    else:
        assert not cluster_roles
    # No wildcards anywhere.
    for role in [*by_kind(docs, "Role"), *cluster_roles]:
        for group, resource, verb, _ in _rules(role):
            assert "*" not in (group, resource, verb)


@pytest.mark.parametrize("values_file", CI_FILES)
def test_resizer_role_is_pods_resize_patch_only(renderer: Renderer, values_file: str) -> None:
    docs = renderer.ci(values_file)
    values = helm.Chart.load(str(CHART)).merge_values(_load_values(values_file))
    roles = [r for r in by_kind(docs, "Role") if r["metadata"]["name"] == f"{FULLNAME}-resizer"]
    if not values["resizer"]["enabled"]:
        assert not roles
        return
    [role] = roles
    rules = _rules(role)
    assert {(g, r, v) for g, r, v, _ in rules} == {("", "pods/resize", "patch")}
    w = workload(docs)
    if w["kind"] == "StatefulSet":
        [(_, _, _, names)] = rules
        assert names == tuple(f"{FULLNAME}-{i}" for i in range(most_replicas(docs)))
    binding = one(docs, "RoleBinding", f"{FULLNAME}-resizer")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    [subject] = binding["subjects"]
    one(docs, "ServiceAccount", subject["name"])
    assert subject["name"] != pod_spec(docs)["serviceAccountName"], (
        "the bridge must not resize itself"
    )


# --------------------------------------------------------------------------- DRA and scheduling


def test_dra_default_form_keeps_pod_resizable(renderer: Renderer) -> None:
    """Default DRA form is the extended resource: no resources.claims (docs/kubernetes.md)."""
    defaults = renderer.chart.values
    assert defaults["dra"]["enabled"] is False
    assert defaults["dra"]["mode"] == "extendedResource"
    docs = renderer.render_values({"dra": {"enabled": True}})
    c = bridge_container(docs)
    assert "claims" not in c["resources"]
    assert "resourceClaims" not in pod_spec(docs)
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "1"


def test_dra_extended_resource(renderer: Renderer) -> None:
    docs = renderer.ci("dra-extended-values.yaml")
    c = bridge_container(docs)
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert "claims" not in c["resources"]
    assert c["image"].endswith("-gpu")
    assert not by_kind(docs, "ResourceClaimTemplate")
    docs = renderer.ci("dra-extended-deviceclass-values.yaml")
    dc = one(docs, "DeviceClass")
    assert dc["apiVersion"] == "resource.k8s.io/v1"
    assert dc["spec"]["extendedResourceName"] == "example.com/gpu"
    assert bridge_container(docs)["resources"]["limits"]["example.com/gpu"] == "1"


def test_dra_claim_template(renderer: Renderer) -> None:
    docs = renderer.ci("dra-claim-values.yaml")
    rct = one(docs, "ResourceClaimTemplate")
    assert rct["apiVersion"] == "resource.k8s.io/v1"
    [request] = rct["spec"]["spec"]["devices"]["requests"]
    assert request["name"] == "mig"
    exactly = request["exactly"]
    assert exactly["deviceClassName"] == "mig.nvidia.com"
    assert exactly["allocationMode"] == "ExactCount" and exactly["count"] == 1
    assert exactly["selectors"] == [
        {"cel": {"expression": "device.attributes['gpu.nvidia.com'].profile == '3g.40gb'"}}
    ]
    spec = pod_spec(docs)
    assert spec["resourceClaims"] == [
        {"name": "gpu", "resourceClaimTemplateName": rct["metadata"]["name"]}
    ]
    assert bridge_container(docs)["resources"]["claims"] == [{"name": "gpu"}]


def test_priority_class(renderer: Renderer) -> None:
    docs = renderer.ci("resizer-values.yaml")
    pc = one(docs, "PriorityClass")
    assert pc["value"] == 200000 and pc["globalDefault"] is False
    assert pc["preemptionPolicy"] == "PreemptLowerPriority"
    assert pod_spec(docs)["priorityClassName"] == pc["metadata"]["name"]
    assert "priorityClassName" not in pod_spec(renderer.ci("default-values.yaml"))


def test_network_policy(renderer: Renderer) -> None:
    np = one(renderer.ci("monitoring-values.yaml"), "NetworkPolicy")
    assert np["spec"]["policyTypes"] == ["Ingress", "Egress"]
    egress_ports = {p["port"] for rule in np["spec"]["egress"] for p in rule["ports"]}
    assert {53, 443, 6443, 7000} <= egress_ports


# --------------------------------------------------------------------------- values schema


def _schema() -> Obj:
    loaded: Obj = json.loads((CHART / "values.schema.json").read_text())
    return loaded


def test_values_schema_is_valid_and_accepts_every_ci_file() -> None:
    schema = _schema()
    validator_cls = jsonschema.validators.validator_for(schema)
    validator_cls.check_schema(schema)
    validator = validator_cls(schema)
    chart_defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    validator.validate(chart_defaults)
    with helm.Chart.load(str(CHART)) as chart:
        for name in CI_FILES:
            validator.validate(chart.merge_values(_load_values(name)))


def test_values_yaml_documented_line_by_line() -> None:
    """Every leaf key in values.yaml has a comment right above it.

    Keys inside Kubernetes-shaped blocks (requests, securityContext) are documented by the block.
    """
    passthrough = {
        *("requests", "limits", "podSecurityContext", "securityContext", "updateStrategy"),
        *("minAllowed", "maxAllowed", "labels", "behavior"),
    }
    stack: list[tuple[int, str]] = []
    lines = (CHART / "values.yaml").read_text().splitlines()
    undocumented = []
    for i, line in enumerate(lines):
        m = re.match(r"^(\s*)([A-Za-z][\w.-]*):(.*)$", line)
        if not m:
            continue
        indent, key, rest = len(m[1]), m[2], m[3].strip()
        while stack and stack[-1][0] >= indent:
            stack.pop()
        parents = {k for _, k in stack}
        stack.append((indent, key))
        is_leaf = rest != "" and not rest.startswith("#")
        if not is_leaf or parents & passthrough:
            continue
        j = i - 1
        while (
            j >= 0 and lines[j].strip().startswith("#") and not lines[j].strip().startswith("# --")
        ):
            j -= 1  # continuation lines of a multi-line comment
        if j < 0 or not lines[j].strip().startswith("#"):
            undocumented.append(key)
    assert not undocumented, f"values without a comment: {undocumented}"


BAD_VALUES: list[tuple[str, Obj]] = [
    ("unknown-top-level-key", {"replicaCount": 2}),
    (
        "unknown-nested-key",
        {"resizePolicy": {"cpu": "NotRequired", "memory": "NotRequired", "restartDelay": 5}},
    ),
    ("qos-besteffort", {"qosClass": "BestEffort"}),
    ("resize-policy-kep-typo", {"resizePolicy": {"cpu": "RestartRequired"}}),
    ("cpu-garbage", {"resources": {"limits": {"cpu": "two"}}}),
    ("cpu-zero", {"resources": {"limits": {"cpu": "0"}}}),
    ("cpu-sub-millicore", {"resources": {"limits": {"cpu": "0.0005"}}}),
    ("memory-wrong-suffix", {"resources": {"limits": {"memory": "2GB"}}}),
    ("memory-as-number", {"resources": {"limits": {"memory": 2147483648}}}),
    ("extended-resource-key-in-resources", {"resources": {"limits": {"nvidia.com/gpu": "1"}}}),
    ("guaranteed-without-memory-limit", {"resources": {"limits": {"cpu": "1", "memory": None}}}),
    ("log-format", {"bridge": {"logFormat": "xml"}}),
    ("log-level", {"bridge": {"logLevel": "info"}}),
    ("decimate-backend", {"bridge": {"decimateBackend": "gpu"}}),
    ("drain-negative", {"bridge": {"drainGraceSeconds": -1}}),
    ("sink-address-url", {"bridge": {"sinkAddress": "http://sink:7000/x"}}),
    ("image-variant", {"image": {"variant": "arm"}}),
    ("workload-kind", {"workload": {"kind": "DaemonSet"}}),
    ("dra-mode", {"dra": {"enabled": True, "mode": "claim"}}),
    ("extended-resource-no-domain", {"dra": {"extendedResource": {"name": "gpu"}}}),
    ("extended-resource-k8s-domain", {"dra": {"extendedResource": {"name": "kubernetes.io/gpu"}}}),
    ("allocation-mode", {"dra": {"claimTemplate": {"allocationMode": "Some"}}}),
    ("device-class-uppercase", {"dra": {"claimTemplate": {"deviceClassName": "MIG.nvidia.com"}}}),
    ("pdb-both", {"podDisruptionBudget": {"minAvailable": 1, "maxUnavailable": 1}}),
    ("scrape-interval", {"serviceMonitor": {"interval": "often"}}),
    ("service-type", {"service": {"type": "ExternalName"}}),
    ("replicas-string", {"replicas": "3"}),
    ("traffic-policy", {"service": {"externalTrafficPolicy": "Locale"}}),
    ("source-range-not-cidr", {"service": {"loadBalancerSourceRanges": ["everyone"]}}),
    ("node-port-range", {"service": {"nodePorts": {"ws": 70000}}}),
    ("route-hostname-url", {"gatewayAPI": {"httpRoute": {"hostnames": ["https://a.example"]}}}),
    ("parent-ref-without-name", {"gatewayAPI": {"parentRefs": [{"namespace": "gw"}]}}),
    ("vpa-update-mode", {"verticalPodAutoscaler": {"updateMode": "Auto"}}),
    ("vpa-min-allowed-garbage", {"verticalPodAutoscaler": {"minAllowed": {"memory": "1GB"}}}),
    ("alert-duration", {"prometheusRule": {"resizePendingFor": "five minutes"}}),
    ("alert-ratio", {"prometheusRule": {"memoryNearBudgetRatio": 1.5}}),
    ("auth-unknown-key", {"auth": {"password": "x"}}),
    ("pod-level-without-limits", {"podResources": {"enabled": True}}),
    ("burstable-without-requests", {"qosClass": "Burstable", "resources": {"requests": None}}),
    (
        "pod-level-burstable-without-requests",
        {"qosClass": "Burstable", "podResources": {"enabled": True, "limits": {"cpu": "2"}}},
    ),
    (
        "burstable-without-memory-request",
        {"qosClass": "Burstable", "resources": {"requests": {"memory": None}}},
    ),
]


@pytest.mark.parametrize(("case", "values"), BAD_VALUES, ids=[c for c, _ in BAD_VALUES])
def test_invalid_values_rejected_by_schema(renderer: Renderer, case: str, values: Obj) -> None:
    with pytest.raises(helm.HelmValuesError):
        renderer.render_values(values)
    # The same verdict from a plain JSON-Schema validator on the merged values.
    merged = renderer.chart.merge_values(values)
    validator = jsonschema.validators.validator_for(_schema())(_schema())
    assert list(validator.iter_errors(merged)), f"{case}: jsonschema accepted it"


TEMPLATE_ERRORS: list[tuple[str, Obj, str]] = [
    (
        "guaranteed-requests-differ",
        {"resources": {"requests": {"cpu": "500m"}}},
        "qosClass=Guaranteed needs resources.requests.cpu == resources.limits.cpu",
    ),
    (
        "burstable-equal-to-limits",
        {"qosClass": "Burstable", "resources": {"requests": {"cpu": "1", "memory": "2Gi"}}},
        "Kubernetes would compute Guaranteed",
    ),
    (
        "resizer-existing-sa-without-name",
        {"resizer": {"enabled": True, "serviceAccount": {"create": False}}},
        "resizer.serviceAccount.name is required",
    ),
    (
        "deviceclass-without-name",
        {"dra": {"enabled": True, "extendedResource": {"deviceClass": {"create": True}}}},
        "dra.extendedResource.deviceClass.name is required",
    ),
    (
        "claim-template-existing-without-name",
        {"dra": {"enabled": True, "mode": "claimTemplate", "claimTemplate": {"create": False}}},
        "dra.claimTemplate.existingName is required",
    ),
    ("auth-without-token", {"auth": {"enabled": True}}, "auth.token (or auth.existingSecret)"),
    ("tls-without-cert", {"tls": {"enabled": True}}, "tls.cert (or tls.existingSecret)"),
    (
        "mtls-chart-secret-without-ca",
        {"tls": {"enabled": True, "cert": "c", "key": "k", "requireClientCert": True}},
        "tls.clientCA is required",
    ),
    ("sink-tls-without-ca", {"sinkTLS": {"enabled": True}}, "sinkTLS.ca (or"),
    (
        "routes-without-parent",
        {"gatewayAPI": {"httpRoute": {"enabled": True}}},
        "gatewayAPI.parentRefs is required",
    ),
    (
        "gateway-without-class",
        {"gatewayAPI": {"gateway": {"create": True, "tlsSecretName": "x"}}},
        "gatewayAPI.gateway.className is required",
    ),
    (
        "gateway-without-certificate",
        {"gatewayAPI": {"gateway": {"create": True, "className": "eg"}}},
        "gatewayAPI.gateway.tlsSecretName is required",
    ),
    ("ingress-without-host", {"ingress": {"enabled": True}}, "ingress.ws.host is required"),
    (
        "vpa-with-pod-level-resources",
        {
            "verticalPodAutoscaler": {"enabled": True},
            "podResources": {"enabled": True, "limits": {"cpu": "2", "memory": "4Gi"}},
        },
        "cannot be combined with podResources.enabled",
    ),
]


@pytest.mark.parametrize(
    ("case", "values", "message"), TEMPLATE_ERRORS, ids=[c for c, _, _ in TEMPLATE_ERRORS]
)
def test_inconsistent_values_fail_rendering(
    renderer: Renderer, case: str, values: Obj, message: str
) -> None:
    with pytest.raises(helm.HelmError) as err:
        renderer.render_values(values)
    assert message in str(err.value), f"{case}: {err.value}"


# ------------------------------------------------------------------ contract with the bridge


@pytest.fixture(scope="module")
def pem_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """A self-signed certificate and its key: the bridge loads TLS files when settings load."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl CLI not found")
    d = tmp_path_factory.mktemp("pem")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "tls.key",
         "-out", "tls.crt", "-days", "1", "-subj", "/CN=localhost"],
        cwd=d, check=True, capture_output=True,
    )  # fmt: skip
    return str(d / "tls.crt"), str(d / "tls.key")


@pytest.mark.parametrize("values_file", CI_FILES)
def test_rendered_env_is_accepted_by_the_bridge(
    renderer: Renderer, values_file: str, pem_pair: tuple[str, str]
) -> None:
    """Every BRIDGE_* variable the chart sets is one the bridge reads, and its value loads.

    The bridge warns about unknown BRIDGE_* variables but runs on, so a typo here would do nothing.
    """
    settings_mod = pytest.importorskip(
        "bridge.config.settings", reason="bridge package not importable"
    )
    kubeapi = pytest.importorskip(
        "bridge.resources.kubeapi", reason="bridge package not importable"
    )
    known = {f"BRIDGE_{f.name.upper()}" for f in dataclasses.fields(settings_mod.Settings)}
    known |= {kubeapi.ENV_POD_NAME, kubeapi.ENV_POD_NAMESPACE}
    env_list = bridge_container(renderer.ci(values_file))["env"]
    names = [e["name"] for e in env_list]
    unknown = [n for n in names if n.startswith("BRIDGE_") and n not in known]
    assert not unknown, f"the bridge does not read {unknown}"
    plain = {e["name"]: e["value"] for e in env_list if "value" in e}
    # File settings (TLS material) point into the container: they must lie under a volume mount;
    # for loading them here, a real PEM certificate (or its key) stands in.
    mounts = [
        m["mountPath"] for m in bridge_container(renderer.ci(values_file)).get("volumeMounts", [])
    ]
    for name, value in list(plain.items()):
        if name.endswith("_FILE"):
            assert any(value.startswith(m.rstrip("/") + "/") for m in mounts), (name, value)
            plain[name] = pem_pair[1] if name.endswith("_KEY_FILE") else pem_pair[0]
    settings = settings_mod.load(flags={}, env=plain)
    assert settings.log_format == plain["BRIDGE_LOG_FORMAT"]
    assert settings.decimate_backend == plain["BRIDGE_DECIMATE_BACKEND"]
    assert settings.drain_grace_seconds == float(plain["BRIDGE_DRAIN_GRACE_SECONDS"])
    # The container ports the chart exposes are the bridge's defaults.
    ports = {
        p["name"]: p["containerPort"] for p in bridge_container(renderer.ci(values_file))["ports"]
    }
    assert (settings.ws_port, settings.grpc_port, settings.http_port) == (
        ports["ws"],
        ports["grpc"],
        ports["http-metrics"],
    )


# ------------------------------------------------------------------ custom resources (CRDs)


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


def test_vendored_crd_schemas_are_loaded() -> None:
    assert set(crd_validators()) == {
        ("gateway.networking.k8s.io/v1", "Gateway"),
        ("gateway.networking.k8s.io/v1", "HTTPRoute"),
        ("gateway.networking.k8s.io/v1", "GRPCRoute"),
        ("monitoring.coreos.com/v1", "PrometheusRule"),
        ("gateway.envoyproxy.io/v1alpha1", "BackendTrafficPolicy"),
    }
    # The strict form does catch a misspelt field.
    route = {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute", "metadata": {}}
    route["spec"] = {"parentRef": [{"name": "gw"}]}
    validator = crd_validators()[("gateway.networking.k8s.io/v1", "HTTPRoute")]
    assert list(validator.iter_errors(route))


@pytest.mark.parametrize("values_file", CI_FILES)
def test_custom_resources_match_their_crd_schemas(renderer: Renderer, values_file: str) -> None:
    for d in renderer.ci(values_file):
        validator = crd_validators().get((d["apiVersion"], d["kind"]))
        if validator is None:
            assert d["kind"] not in CRD_KINDS - {"ServiceMonitor", "VerticalPodAutoscaler"}, d
            continue
        errors = [f"{list(e.path)}: {e.message}" for e in validator.iter_errors(d)]
        assert not errors, f"{d['kind']}/{d['metadata']['name']}: {errors}"


def test_ci_scenarios_for_outside_access_are_present() -> None:
    for scenario in (
        "external-gateway",
        "external-gateway-parentrefs",
        "external-loadbalancer",
        "ingress",
        "vpa",
        "tls",
    ):
        assert f"{scenario}-values.yaml" in CI_FILES


# ------------------------------------------------------------------ outside access


def _proto_services() -> set[str]:
    proto = (REPO / "proto" / "bridge" / "v1" / "bridge.proto").read_text()
    package = re.search(r"^package\s+([\w.]+);", proto, re.M)
    assert package
    return {f"{package[1]}.{name}" for name in re.findall(r"^service\s+(\w+)", proto, re.M)}


def test_gateway_routes_reach_the_client_service(renderer: Renderer) -> None:
    docs = renderer.ci("external-gateway-values.yaml")
    service = one(docs, "Service", FULLNAME)
    ports = {p["name"]: p["port"] for p in service["spec"]["ports"]}
    gateway = one(docs, "Gateway")
    [listener] = gateway["spec"]["listeners"]
    assert listener["protocol"] == "HTTPS" and listener["tls"]["mode"] == "Terminate"
    assert listener["tls"]["certificateRefs"] == [
        {"kind": "Secret", "name": "bridge-example-com-tls"}
    ]
    assert {k["kind"] for k in listener["allowedRoutes"]["kinds"]} == {"HTTPRoute", "GRPCRoute"}
    http = one(docs, "HTTPRoute")
    grpc_route = one(docs, "GRPCRoute")
    for route in (http, grpc_route):
        assert route["spec"]["parentRefs"] == [
            {"name": gateway["metadata"]["name"], "sectionName": listener["name"]}
        ]
    [rule] = http["spec"]["rules"]
    assert rule["matches"] == [{"path": {"type": "Exact", "value": "/v1/ingest"}}]
    assert rule["backendRefs"] == [{"name": FULLNAME, "port": ports["ws"]}]
    assert http["spec"]["hostnames"] == ["bridge.example.com"]
    [rule] = grpc_route["spec"]["rules"]
    assert rule["backendRefs"] == [{"name": FULLNAME, "port": ports["grpc"]}]
    routed = {m["method"]["service"] for m in rule["matches"]}
    assert routed == _proto_services() - {"bridge.v1.VisualizationSink"} | {
        "grpc.health.v1.Health"
    }, "every service edges and viewers call, not the sink's (the bridge dials the sink)"


def test_gateway_routes_on_a_platform_gateway(renderer: Renderer) -> None:
    docs = renderer.ci("external-gateway-parentrefs-values.yaml")
    assert not by_kind(docs, "Gateway")
    for kind in ("HTTPRoute", "GRPCRoute"):
        assert one(docs, kind)["spec"]["parentRefs"] == [
            {"name": "edge-gateway", "namespace": "gateways", "sectionName": "https"}
        ]
    default = renderer.render_values({})
    assert not {"Gateway", "HTTPRoute", "GRPCRoute", "Ingress"} & {d["kind"] for d in default}


def test_ingress_alternative(renderer: Renderer) -> None:
    docs = renderer.ci("ingress-values.yaml")
    service = one(docs, "Service", FULLNAME)
    port_names = {p["name"] for p in service["spec"]["ports"]}
    ws = one(docs, "Ingress", f"{FULLNAME}-ws")
    grpc_ingress = one(docs, "Ingress", f"{FULLNAME}-grpc")
    assert grpc_ingress["metadata"]["annotations"] == {
        "nginx.ingress.kubernetes.io/backend-protocol": "GRPC",
        "nginx.ingress.kubernetes.io/proxy-read-timeout": "3600",
    }
    for ingress, host, path, port in (
        (ws, "bridge.example.com", "/v1/ingest", "ws"),
        (grpc_ingress, "grpc.bridge.example.com", "/", "grpc"),
    ):
        assert ingress["spec"]["ingressClassName"] == "nginx"
        assert ingress["spec"]["tls"] == [{"hosts": [host], "secretName": "bridge-example-com-tls"}]
        [rule] = ingress["spec"]["rules"]
        assert rule["host"] == host
        [p] = rule["http"]["paths"]
        assert p["path"] == path
        backend = p["backend"]["service"]
        assert backend == {"name": FULLNAME, "port": {"name": port}} and port in port_names
    # Fixed node ports on a NodePort Service.
    assert {p["name"]: p["nodePort"] for p in service["spec"]["ports"]} == {
        "ws": 30080,
        "grpc": 30090,
    }


def test_load_balancer_options(renderer: Renderer) -> None:
    service = one(renderer.ci("external-loadbalancer-values.yaml"), "Service", FULLNAME)
    spec = service["spec"]
    assert spec["type"] == "LoadBalancer"
    assert spec["loadBalancerSourceRanges"] == ["203.0.113.0/24", "2001:db8::/32"]
    assert spec["externalTrafficPolicy"] == "Local"
    assert {p["name"]: p.get("appProtocol") for p in spec["ports"]} == {
        "ws": "kubernetes.io/wss",
        "grpc": None,
    }
    default = one(renderer.render_values({}), "Service", FULLNAME)["spec"]
    for key in ("loadBalancerSourceRanges", "externalTrafficPolicy", "loadBalancerClass"):
        assert key not in default, key
    # LoadBalancer-only fields never reach a ClusterIP Service (the API server rejects them).
    docs = renderer.render_values(
        {"service": {"loadBalancerSourceRanges": ["10.0.0.0/8"], "externalTrafficPolicy": "Local"}}
    )
    spec = one(docs, "Service", FULLNAME)["spec"]
    assert "loadBalancerSourceRanges" not in spec and "externalTrafficPolicy" not in spec


# ------------------------------------------------------------------ secrets


def _env(docs: list[Obj]) -> dict[str, Obj]:
    return {e["name"]: e for e in bridge_container(docs)["env"]}


def _secret_file_env(docs: list[Obj], name: str) -> tuple[str, str]:
    """(Secret name, key) behind a *_FILE env var: the file must come from a Secret volume."""
    c = bridge_container(docs)
    path = _env(docs)[name]["value"]
    [mount] = [m for m in c["volumeMounts"] if path.startswith(m["mountPath"].rstrip("/") + "/")]
    [volume] = [v for v in pod_spec(docs)["volumes"] if v["name"] == mount["name"]]
    return volume["secret"]["secretName"], path.rsplit("/", 1)[1]


def test_auth_token_and_tls_from_chart_made_secrets(renderer: Renderer) -> None:
    docs = renderer.ci("external-loadbalancer-values.yaml")
    values = _load_values("external-loadbalancer-values.yaml")
    env = _env(docs)
    ref = env["BRIDGE_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"]
    secret = one(docs, "Secret", ref["name"])
    assert secret["stringData"][ref["key"]] == values["auth"]["token"]
    # The token itself appears nowhere in the workload.
    assert values["auth"]["token"] not in json.dumps(workload(docs))
    expected = {
        "BRIDGE_TLS_CERT_FILE": "tls.crt",
        "BRIDGE_TLS_KEY_FILE": "tls.key",
        "BRIDGE_TLS_CLIENT_CA_FILE": "ca.crt",
    }
    for name, key in expected.items():
        secret_name, file_key = _secret_file_env(docs, name)
        assert file_key == key
        tls_secret = one(docs, "Secret", secret_name)
        assert tls_secret["type"] == "kubernetes.io/tls" and key in tls_secret["stringData"]
    assert (
        one(docs, "Secret", f"{FULLNAME}-tls")["stringData"]["ca.crt"] == values["tls"]["clientCA"]
    )


def test_tls_from_existing_secrets(renderer: Renderer) -> None:
    docs = renderer.ci("tls-values.yaml")
    assert not by_kind(docs, "Secret"), "existing Secrets: the chart makes none"
    assert _secret_file_env(docs, "BRIDGE_TLS_CERT_FILE") == ("simbridge-tls", "tls.crt")
    assert _secret_file_env(docs, "BRIDGE_TLS_CLIENT_CA_FILE") == ("simbridge-tls", "ca.crt")
    assert _secret_file_env(docs, "BRIDGE_SINK_CA_FILE") == ("simbridge-sink-tls", "ca.crt")
    assert _secret_file_env(docs, "BRIDGE_SINK_CERT_FILE") == ("simbridge-sink-tls", "tls.crt")
    assert _secret_file_env(docs, "BRIDGE_SINK_KEY_FILE") == ("simbridge-sink-tls", "tls.key")
    docs = renderer.ci("external-gateway-values.yaml")
    assert not by_kind(docs, "Secret")
    ref = _env(docs)["BRIDGE_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": "simbridge-edge-token", "key": "token"}
    default_env = _env(renderer.render_values({}))
    assert not {"BRIDGE_AUTH_TOKEN", "BRIDGE_TLS_CERT_FILE"} & set(default_env)


# ------------------------------------------------------------------ helm test hook


def test_helm_test_pod(renderer: Renderer) -> None:
    for values_file in CI_FILES:
        docs = renderer.ci(values_file)
        [pod] = by_kind(docs, "Pod")
        assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
        labels = pod["metadata"]["labels"]
        for svc in by_kind(docs, "Service"):
            assert not svc["spec"]["selector"].items() <= labels.items(), (
                f"{values_file}: Service {svc['metadata']['name']} would route edges to the test"
            )
        [c] = pod["spec"]["containers"]
        assert c["image"] == bridge_container(docs)["image"]
        assert c["command"] == ["python", "-c"]
        assert c["args"] == [(CHART / "files" / "hello-check.py").read_text()]
        assert c["securityContext"]["readOnlyRootFilesystem"] is True
        env = {e["name"]: e for e in c["env"]}
        values = helm.Chart.load(str(CHART)).merge_values(_load_values(values_file))
        scheme = "wss" if values["tls"]["enabled"] else "ws"
        port = values["service"]["ports"]["ws"]
        assert env["SIMBRIDGE_URL"]["value"] == (
            f"{scheme}://{FULLNAME}.{NAMESPACE}.svc:{port}/v1/ingest"
        )
        if values["auth"]["enabled"]:
            bridge_ref = _env(docs)["BRIDGE_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"]
            assert env["SIMBRIDGE_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"] == bridge_ref
    assert not by_kind(renderer.render_values({"helmTest": {"enabled": False}}), "Pod")


def test_network_policy_lets_the_helm_test_in(renderer: Renderer) -> None:
    docs = renderer.ci("monitoring-values.yaml")
    np = one(docs, "NetworkPolicy")
    [pod] = by_kind(docs, "Pod")
    ingest_rule = np["spec"]["ingress"][0]
    assert {p["port"] for p in ingest_rule["ports"]} == {"ws", "grpc"}
    selectors = [
        peer["podSelector"]["matchLabels"] for peer in ingest_rule["from"] if "podSelector" in peer
    ]
    assert any(sel.items() <= pod["metadata"]["labels"].items() for sel in selectors)


# ------------------------------------------------------------------ VPA


def test_vertical_pod_autoscaler_resizes_in_place(renderer: Renderer) -> None:
    docs = renderer.ci("vpa-values.yaml")
    vpa = one(docs, "VerticalPodAutoscaler")
    w = workload(docs)
    assert vpa["apiVersion"] == "autoscaling.k8s.io/v1"
    assert vpa["spec"]["targetRef"] == {
        "apiVersion": "apps/v1",
        "kind": w["kind"],
        "name": w["metadata"]["name"],
    }
    assert vpa["spec"]["updatePolicy"] == {"updateMode": "InPlaceOrRecreate"}
    [policy] = vpa["spec"]["resourcePolicy"]["containerPolicies"]
    assert policy["containerName"] == bridge_container(docs)["name"]
    assert policy["controlledResources"] == ["cpu", "memory"]
    # Guaranteed pods keep requests == limits only if VPA scales both together.
    assert policy["controlledValues"] == "RequestsAndLimits"
    for resource in ("cpu", "memory"):
        low = parse_quantity(policy["minAllowed"][resource])
        high = parse_quantity(policy["maxAllowed"][resource])
        assert 0 < low <= high, resource
    # The bridge's resize policy is what makes InPlaceOrRecreate resize without a restart.
    assert {p["restartPolicy"] for p in bridge_container(docs)["resizePolicy"]} == {"NotRequired"}
    docs = renderer.render_values(
        {
            "verticalPodAutoscaler": {"enabled": True, "minReplicas": 1},
            "workload": {"kind": "Deployment"},
        }
    )
    vpa = one(docs, "VerticalPodAutoscaler")
    assert vpa["spec"]["targetRef"]["kind"] == "Deployment"
    assert vpa["spec"]["updatePolicy"]["minReplicas"] == 1


# ------------------------------------------------------------------ alerts and dashboard


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


def _series_in(expr: str) -> set[str]:
    return set(re.findall(r"\bbridge_[a-z0-9_]+\b", expr))


def test_alerts_cover_the_issue_and_query_exported_series(renderer: Renderer) -> None:
    docs = renderer.ci("monitoring-values.yaml")
    rule = one(docs, "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    [group] = rule["spec"]["groups"]
    alerts = {r["alert"]: r for r in group["rules"]}
    assert set(alerts) == {
        "SimbridgeBridgeDown",
        "SimbridgeBridgeAbsent",
        "SimbridgeSinkDisconnected",
        "SimbridgeResizePending",
        "SimbridgeFramesDropped",
        "SimbridgeMemoryNearBudget",
    }
    for name, r in alerts.items():
        series = _series_in(r["expr"])
        assert series or "up{" in r["expr"], name  # bridge down/absent: Prometheus' own up
        assert series <= exported_series(), f"{name} queries {series - exported_series()}"
        assert f'namespace="{NAMESPACE}"' in r["expr"], name
        assert r["labels"]["severity"] == "warning" and r["annotations"]["summary"], name
    assert "> 0.9" in alerts["SimbridgeMemoryNearBudget"]["expr"]
    # Without a sink address there is no sink to be disconnected from.
    docs = renderer.render_values({"prometheusRule": {"enabled": True}})
    [group] = one(docs, "PrometheusRule")["spec"]["groups"]
    assert "SimbridgeSinkDisconnected" not in {r["alert"] for r in group["rules"]}


def test_grafana_dashboard(renderer: Renderer) -> None:
    docs = renderer.ci("monitoring-values.yaml")
    cm = one(docs, "ConfigMap", f"{FULLNAME}-dashboard")
    assert cm["metadata"]["namespace"] == "monitoring"
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    text = (CHART / "dashboards" / "simbridge.json").read_text()
    assert cm["data"]["simbridge.json"] == text.rstrip("\n")
    dashboard = json.loads(text)
    assert dashboard["uid"] == "simbridge" and dashboard["title"]
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert variables == {"datasource", "namespace", "pod"}
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)) >= 8
    queried: set[str] = set()
    for panel in dashboard["panels"]:
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            series = _series_in(target["expr"])
            assert series and series <= exported_series(), (panel["title"], series)
            assert 'namespace="$namespace"' in target["expr"]
            queried |= series
    for important in (
        "bridge_frames_dropped_total",
        "bridge_resize_pending",
        "bridge_sink_connected",
    ):
        assert important in queried


# ------------------------------------------------------------------ Chart.yaml and README


def test_chart_metadata_names_real_maintainers_and_home() -> None:
    meta = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert meta["home"].startswith("https://") and meta["sources"]
    for maintainer in meta["maintainers"]:
        assert maintainer["name"] and maintainer["url"].startswith("https://")
    text = json.dumps(meta).lower()
    for placeholder in ("example", "todo", "changeme", "your-"):
        assert placeholder not in text, placeholder


def _values_table_module() -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "chart_values_table", REPO / "scripts" / "chart_values_table.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_values_table_is_generated_from_values_yaml() -> None:
    module = _values_table_module()
    readme = (CHART / "README.md").read_text()
    generated = module.table(CHART / "values.yaml")
    assert module.updated_readme(readme, generated) == readme, (
        "charts/simbridge/README.md is stale: run `make chart-docs`"
    )
    # Every leaf in values.yaml is in the table, itself or through a documented parent.
    keys = [row.split("`")[1] for row in generated.splitlines()[2:]]
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    def leaves(node: Any, prefix: str = "") -> Iterator[str]:
        if isinstance(node, dict) and node:
            for k, v in node.items():
                yield from leaves(v, f"{prefix}.{k}" if prefix else k)
        else:
            yield prefix

    missing = [
        leaf
        for leaf in leaves(values)
        if not any(leaf == k or leaf.startswith(k + ".") for k in keys)
    ]
    assert not missing, missing
    assert "| `gatewayAPI.httpRoute.enabled` | bool | `false` |" in generated
    assert "| `service.loadBalancerSourceRanges` | list | `[]` |" in generated


def test_values_table_generator_reads_comments() -> None:
    module = _values_table_module()
    text = "# not a key doc\na:\n  # -- first line\n  #    second\n  b: 1\n  c: 2\n# -- top\nd: x\n"
    assert module.documented_keys(text) == [("a.b", "first line second"), ("d", "top")]
