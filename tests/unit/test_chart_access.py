"""Outside access to the bridge: Gateway API routes, the Ingress alternative and a LoadBalancer
Service."""

from __future__ import annotations

import re

from tests.unit.chart_support import (
    CI_FILES,
    FULLNAME,
    REPO,
    Renderer,
    by_kind,
    one,
    renderer_fixture,  # noqa: F401 - the module-scoped fixture
)


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
