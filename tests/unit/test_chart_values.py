"""Values: values.schema.json accepts every scenario and refuses invalid values (the templates'
own checks refuse inconsistent ones) before anything reaches a cluster; values.yaml is documented
line by line and the chart README's values table is generated from it."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

from tests.unit.chart_support import (
    CHART,
    CI_FILES,
    REPO,
    Obj,
    Renderer,
    helm,
    jsonschema,
    load_values,
    renderer_fixture,  # noqa: F401 - the module-scoped fixture
    yaml,
)


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
            validator.validate(chart.merge_values(load_values(name)))


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


# ------------------------------------------------------------------------- Chart.yaml and README


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
