"""The pod the chart runs: env from the downward API and the drain grace, probes and ports,
selectors, StatefulSet or Deployment, DRA, priority, the VPA, the env the bridge accepts, and the
helm test pod."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess

import pytest

from tests.unit.chart_support import (
    CHART,
    CI_FILES,
    FULLNAME,
    NAMESPACE,
    Renderer,
    bridge_container,
    bridge_env,
    by_kind,
    helm,
    load_values,
    one,
    parse_quantity,
    pod_spec,
    renderer_fixture,  # noqa: F401 - the module-scoped fixture
    workload,
)


@pytest.mark.parametrize("values_file", CI_FILES)
def test_downward_api_env_and_drain_consistent(renderer: Renderer, values_file: str) -> None:
    docs = renderer.ci(values_file)
    values = helm.Chart.load(str(CHART)).merge_values(load_values(values_file))
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
    values = helm.Chart.load(str(CHART)).merge_values(load_values(values_file))
    if values["tls"]["enabled"]:
        # The kubelet's gRPC probe speaks plaintext only: with TLS on 9090 it checks the socket.
        assert c["startupProbe"]["tcpSocket"] == {"port": "grpc"}
    else:
        assert c["startupProbe"]["grpc"]["port"] == 9090
    # A throttled bridge (CPU shrunk in place) must not be restarted by its liveness probe quickly.
    live = c["livenessProbe"]
    assert live["timeoutSeconds"] * live["failureThreshold"] >= 20


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


def test_deployment_variant(renderer: Renderer) -> None:
    docs = renderer.ci("deployment-values.yaml")
    d = one(docs, "Deployment")
    assert "serviceName" not in d["spec"]
    assert d["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    for rule in one(docs, "Role")["rules"]:
        assert "resourceNames" not in rule, "a Deployment has no stable pod names to restrict to"


# ---------------------------------------------------------------------------- DRA and scheduling


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


# ------------------------------------------------------------------------------------------- VPA


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


# ---------------------------------------------------------------------- contract with the bridge


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


# -------------------------------------------------------------------------------- helm test hook


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
        values = helm.Chart.load(str(CHART)).merge_values(load_values(values_file))
        scheme = "wss" if values["tls"]["enabled"] else "ws"
        port = values["service"]["ports"]["ws"]
        assert env["SIMBRIDGE_URL"]["value"] == (
            f"{scheme}://{FULLNAME}.{NAMESPACE}.svc:{port}/v1/ingest"
        )
        if values["auth"]["enabled"]:
            bridge_ref = bridge_env(docs)["BRIDGE_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"]
            assert env["SIMBRIDGE_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"] == bridge_ref
    assert not by_kind(renderer.render_values({"helmTest": {"enabled": False}}), "Pod")
