"""The chart grants no more than the bridge uses: security context, RBAC (the bridge's and the
resizer's Roles), network policies, and credentials from Secrets."""

from __future__ import annotations

import json

import pytest

from tests.unit.chart_support import (
    CHART,
    CI_FILES,
    FULLNAME,
    NAMESPACE,
    Obj,
    Renderer,
    bridge_container,
    bridge_env,
    by_kind,
    helm,
    load_values,
    most_replicas,
    one,
    pod_spec,
    renderer_fixture,  # noqa: F401 - the module-scoped fixture
    workload,
)


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


# ------------------------------------------------------------------------------------------ RBAC


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


@pytest.mark.parametrize("values_file", CI_FILES)
def test_bridge_role_grants_exactly_what_the_bridge_uses(
    renderer: Renderer, values_file: str
) -> None:
    docs = renderer.ci(values_file)
    values = helm.Chart.load(str(CHART)).merge_values(load_values(values_file))
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
    values = helm.Chart.load(str(CHART)).merge_values(load_values(values_file))
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


def test_scaled_to_zero_never_widens_pod_access(renderer: Renderer) -> None:
    """replicas: 0 must not drop resourceNames (which would grant every pod in the namespace)."""
    docs = renderer.render_values({"replicas": 0, "resizer": {"enabled": True}})
    for role in by_kind(docs, "Role"):
        for rule in role["rules"]:
            if "pods" in rule["resources"] or "pods/resize" in rule["resources"]:
                assert rule["resourceNames"] == [f"{FULLNAME}-0"]


# -------------------------------------------------------------------------------- network policy


def test_network_policy(renderer: Renderer) -> None:
    np = one(renderer.ci("monitoring-values.yaml"), "NetworkPolicy")
    assert np["spec"]["policyTypes"] == ["Ingress", "Egress"]
    egress_ports = {p["port"] for rule in np["spec"]["egress"] for p in rule["ports"]}
    assert {53, 443, 6443, 7000} <= egress_ports


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


# --------------------------------------------------------------------------------------- secrets


def _secret_file_env(docs: list[Obj], name: str) -> tuple[str, str]:
    """(Secret name, key) behind a *_FILE env var: the file must come from a Secret volume."""
    c = bridge_container(docs)
    path = bridge_env(docs)[name]["value"]
    [mount] = [m for m in c["volumeMounts"] if path.startswith(m["mountPath"].rstrip("/") + "/")]
    [volume] = [v for v in pod_spec(docs)["volumes"] if v["name"] == mount["name"]]
    return volume["secret"]["secretName"], path.rsplit("/", 1)[1]


def test_auth_token_and_tls_from_chart_made_secrets(renderer: Renderer) -> None:
    docs = renderer.ci("external-loadbalancer-values.yaml")
    values = load_values("external-loadbalancer-values.yaml")
    env = bridge_env(docs)
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
    ref = bridge_env(docs)["BRIDGE_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": "simbridge-edge-token", "key": "token"}
    default_env = bridge_env(renderer.render_values({}))
    assert not {"BRIDGE_AUTH_TOKEN", "BRIDGE_TLS_CERT_FILE"} & set(default_env)
