"""The chart's ServiceMonitor against a real bridge (issue 33): Prometheus gets 200, not 401.

The chart is rendered with ``serviceMonitor.enabled`` and ``auth.enabled``; the bridge is started
with the environment the rendered container would have (Secret references resolved from the
rendered Secret); /metrics is then scraped as the Prometheus Operator would from the ServiceMonitor
endpoint: ``Authorization: <type> <Secret value>`` from ``authorization.credentials``, nothing
without it. NOTES.txt's ``curl .../debug/resources`` must pass the same token.
"""

from __future__ import annotations

import asyncio
import base64
import re
from typing import Any

import pytest

from bridge.config import settings as settings_mod
from tests.integration.harness import running_bridge

helm = pytest.importorskip("helm_python", reason="helm-python-sdk (bundled Helm) not installed")
yaml = pytest.importorskip("yaml")
from tests.unit.chart_support import CHART, RELEASE, bridge_container, one  # noqa: E402

TOKEN = "s3cret-token-for-the-scrape"
Obj = dict[str, Any]


def _render(values: Obj) -> tuple[list[Obj], str]:
    chart = helm.Chart.load(str(CHART))
    try:
        manifests = chart.render(values, name=RELEASE, namespace="sim")
    finally:
        chart.close()
    docs = [
        d
        for path, text in sorted(manifests.items())
        if path.endswith((".yaml", ".yml"))
        for d in yaml.safe_load_all(text)
        if d
    ]
    notes = next(text for path, text in manifests.items() if path.endswith("NOTES.txt"))
    return docs, notes


def _secret_value(docs: list[Obj], name: str, key: str) -> str:
    secret = one(docs, "Secret", name)
    if key in secret.get("stringData", {}):
        return str(secret["stringData"][key])
    return base64.b64decode(secret["data"][key]).decode()


def _bridge_env(docs: list[Obj]) -> dict[str, str]:
    """The container's BRIDGE_* settings as the kubelet would pass them (Secrets resolved)."""
    env = {}
    for e in bridge_container(docs)["env"]:
        if "value" in e:
            env[e["name"]] = e["value"]
        elif "secretKeyRef" in e.get("valueFrom", {}):
            ref = e["valueFrom"]["secretKeyRef"]
            env[e["name"]] = _secret_value(docs, ref["name"], ref["key"])
    return {
        k: v for k, v in env.items() if k.startswith("BRIDGE_") and not k.startswith("BRIDGE_POD")
    }


def _prometheus_headers(docs: list[Obj]) -> dict[str, str]:
    """What Prometheus sends for the ServiceMonitor endpoint (authorization, bearerTokenSecret)."""
    [endpoint] = one(docs, "ServiceMonitor")["spec"]["endpoints"]
    auth = endpoint.get("authorization")
    if auth is not None:
        ref = auth["credentials"]
        secret = _secret_value(docs, ref["name"], ref["key"])
        return {"Authorization": f"{auth.get('type', 'Bearer')} {secret}"}
    if "bearerTokenSecret" in endpoint:
        ref = endpoint["bearerTokenSecret"]
        return {"Authorization": f"Bearer {_secret_value(docs, ref['name'], ref['key'])}"}
    return {}


async def _get(port: int, path: str, headers: dict[str, str]) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n{extra}\r\n".encode())
    await writer.drain()
    head = (await reader.read()).split(b"\r\n", 1)[0]
    writer.close()
    return int(head.split()[1])


async def _scrape_as_rendered(values: Obj) -> tuple[int, int, list[Obj], str]:
    docs, notes = _render(values)
    env = _bridge_env(docs)
    settings = settings_mod.load(flags={}, env=env)
    assert settings.auth_token == TOKEN
    async with running_bridge(
        auth_token=settings.auth_token, metrics_auth=settings.metrics_auth
    ) as bridge:
        assert bridge.ports is not None
        with_creds = await _get(bridge.ports.http, "/metrics", _prometheus_headers(docs))
        without = await _get(bridge.ports.http, "/metrics", {})
    return with_creds, without, docs, notes


AUTH_AND_MONITOR: Obj = {
    "auth": {"enabled": True, "token": TOKEN},
    "serviceMonitor": {"enabled": True},
}


async def test_servicemonitor_with_auth_scrapes_200_with_the_rendered_token() -> None:
    with_creds, without, _docs, notes = await _scrape_as_rendered(AUTH_AND_MONITOR)
    assert with_creds == 200
    assert without == 401  # the token is what made the difference
    # NOTES: the curl for /debug/resources sends the token read from the same Secret.
    [curl] = [ln for ln in notes.splitlines() if "curl" in ln and "/debug/resources" in ln]
    assert "Authorization: Bearer $TOKEN" in curl, curl
    [fetch] = [ln for ln in notes.splitlines() if ln.strip().startswith("TOKEN=")]
    assert f"get secret {RELEASE}-simbridge-auth" in fetch and "{.data.token}" in fetch
    assert "base64 -d" in fetch


async def test_metrics_opened_explicitly_scrape_without_credentials() -> None:
    values = {**AUTH_AND_MONITOR, "auth": {**AUTH_AND_MONITOR["auth"], "metrics": "open"}}
    with_creds, without, docs, _ = await _scrape_as_rendered(values)
    [endpoint] = one(docs, "ServiceMonitor")["spec"]["endpoints"]
    assert "authorization" not in endpoint and "bearerTokenSecret" not in endpoint
    assert with_creds == without == 200


def test_servicemonitor_elsewhere_cannot_read_the_token_secret() -> None:
    values = {**AUTH_AND_MONITOR, "serviceMonitor": {"enabled": True, "namespace": "monitoring"}}
    with pytest.raises(helm.HelmError, match=re.escape("serviceMonitor.namespace must be")):
        _render(values)
