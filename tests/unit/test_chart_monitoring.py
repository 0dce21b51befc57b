"""Monitoring: the ServiceMonitor, the alerts and the Grafana dashboard query only series the bridge
exports."""

from __future__ import annotations

import json
import re

from tests.unit.chart_support import (
    CHART,
    FULLNAME,
    NAMESPACE,
    Renderer,
    by_kind,
    exported_series,
    one,
    renderer_fixture,  # noqa: F401 - the module-scoped fixture
)


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
