"""The chart's alerts say where to look (runbook_url into docs/operations.md) and fire when no
bridge can be scraped (issue 33)."""

from __future__ import annotations

import re
from pathlib import Path

from tests.unit.chart_support import (
    NAMESPACE,
    RELEASE,
    Renderer,
    exported_series,
    one,
    renderer_fixture,  # noqa: F401 - the module-scoped fixture
)

REPO = Path(__file__).resolve().parents[2]
OPERATIONS = REPO / "docs" / "operations.md"


def _github_anchors(markdown: str) -> set[str]:
    """GitHub's heading ids: lower case, punctuation dropped, spaces to hyphens."""
    anchors = set()
    for line in markdown.splitlines():
        m = re.match(r"^#{1,6}\s+(.*)$", line)
        if m:
            text = re.sub(r"[^\w\- ]", "", m[1].strip().lower())
            anchors.add(text.replace(" ", "-"))
    return anchors


def _alerts(chart: Renderer, values: dict[str, object]) -> dict[str, dict[str, object]]:
    [group] = one(chart.render_values(values), "PrometheusRule")["spec"]["groups"]
    return {r["alert"]: r for r in group["rules"]}


def test_every_alert_links_to_an_existing_runbook_section(renderer: Renderer) -> None:
    alerts = _alerts(
        renderer,
        {
            "prometheusRule": {"enabled": True},
            "serviceMonitor": {"enabled": True},
            "bridge": {"sinkAddress": "sink:7000"},
        },
    )
    anchors = _github_anchors(OPERATIONS.read_text())
    for name, rule in alerts.items():
        url = rule["annotations"]["runbook_url"]  # type: ignore[index]
        base, _, anchor = url.partition("#")
        assert base.endswith("/docs/operations.md"), url
        assert anchor == name.lower() and anchor in anchors, (name, url)


def test_bridge_down_and_absent_alerts_watch_this_releases_scrapes(
    renderer: Renderer,
) -> None:
    alerts = _alerts(
        renderer, {"prometheusRule": {"enabled": True}, "serviceMonitor": {"enabled": True}}
    )
    up = f'up{{namespace="{NAMESPACE}", service="{RELEASE}-simbridge-metrics"}}'
    assert alerts["SimbridgeBridgeDown"]["expr"] == f"max by (namespace, pod) ({up}) == 0"
    assert alerts["SimbridgeBridgeAbsent"]["expr"] == f"absent({up} == 1)"
    # The service label is the metrics Service the ServiceMonitor selects.
    docs = renderer.render_values({"serviceMonitor": {"enabled": True}})
    one(docs, "Service", f"{RELEASE}-simbridge-metrics")
    # Without the chart's ServiceMonitor there is no such up series: no alert on it.
    assert "SimbridgeBridgeDown" not in _alerts(renderer, {"prometheusRule": {"enabled": True}})
    # The other alerts still query only what the bridge exports.
    for name, rule in alerts.items():
        series = set(re.findall(r"\bbridge_[a-z0-9_]+\b", str(rule["expr"])))
        assert series <= exported_series(), name


def test_alerts_read_each_process_of_a_pod(renderer: Renderer) -> None:
    """A pod of several processes exports its gauges per process (``process`` label): one
    process without its push stream must alert (min, not max), and each process's rings are
    compared with its own budget before the busiest is taken."""
    values = {"prometheusRule": {"enabled": True}, "bridge": {"sinkAddress": "viz:50051"}}
    alerts = _alerts(renderer, values)
    sink = str(alerts["SimbridgeSinkDisconnected"]["expr"])
    assert sink.startswith("min by (namespace, pod) (bridge_sink_connected"), sink
    memory = " ".join(str(alerts["SimbridgeMemoryNearBudget"]["expr"]).split())
    assert memory.startswith("max by (namespace, pod) ( bridge_ring_occupancy_bytes"), memory
    assert "/ (bridge_plan_ring_budget_bytes" in memory, memory
