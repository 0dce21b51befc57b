"""The chart's `helm test` Pod, run for real: its script and environment, rendered by Helm,
against a real bridge on 127.0.0.1 (plain, and with auth token + TLS + client certificates).

Only what cannot exist here is swapped: the Service DNS name becomes the bridge's local address,
and Secret files and values become local files and the rendered Secret's data.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.integration.harness import ROOT, running_bridge

yaml = pytest.importorskip("yaml")
helm = pytest.importorskip("helm_python", reason="helm-python-sdk (bundled Helm) not installed")

CHART = ROOT / "charts" / "simbridge"


def render(values_file: str | None) -> list[dict[str, Any]]:
    values = yaml.safe_load((CHART / "ci" / values_file).read_text()) if values_file else {}
    with helm.Chart.load(str(CHART)) as chart:
        manifests = chart.render(values, name="sb", namespace="sim")
    return [
        d
        for path, text in sorted(manifests.items())
        if path.endswith(".yaml")
        for d in yaml.safe_load_all(text)
        if d
    ]


def hook_pod(docs: list[dict[str, Any]]) -> tuple[str, dict[str, Any]]:
    """The hook's script and its env entries by name."""
    [pod] = [d for d in docs if d["kind"] == "Pod"]
    [container] = pod["spec"]["containers"]
    assert container["command"] == ["python", "-c"]
    return container["args"][0], {e["name"]: e for e in container["env"]}


async def run_check(script: str, env: dict[str, str]) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        script,
        env={"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(ROOT), **env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode()


async def test_helm_test_gets_welcome_from_a_plain_bridge() -> None:
    script, env = hook_pod(render(None))
    assert env["SIMBRIDGE_URL"]["value"] == "ws://sb-simbridge.sim.svc:8080/v1/ingest"
    assert "SIMBRIDGE_AUTH_TOKEN" not in env
    async with running_bridge() as bridge:
        assert bridge.ports is not None
        rc, out = await run_check(
            script,
            {
                "SIMBRIDGE_URL": f"ws://127.0.0.1:{bridge.ports.ws}/v1/ingest",
                "SIMBRIDGE_TIMEOUT_SECONDS": env["SIMBRIDGE_TIMEOUT_SECONDS"]["value"],
            },
        )
    assert rc == 0, out
    assert out.startswith("OK: Welcome from ws://127.0.0.1:")


async def test_helm_test_fails_when_nothing_answers(free_port: int) -> None:
    script, _ = hook_pod(render(None))
    rc, out = await run_check(
        script,
        {
            "SIMBRIDGE_URL": f"ws://127.0.0.1:{free_port}/v1/ingest",
            "SIMBRIDGE_TIMEOUT_SECONDS": "5",
        },
    )
    assert rc == 1 and out.startswith("FAIL:"), out


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA and one bridge certificate valid for the test's server name, for server and client
    auth (with tls.requireClientCert the hook presents the bridge's own pair)."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl CLI not found")
    pki = tmp_path_factory.mktemp("pki")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out",
             "ca.crt", "-days", "1", "-subj", "/CN=simbridge-helm-test-ca", cwd=pki)  # fmt: skip
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "tls.key", "-subj",
             "/CN=bridge.example.com", "-out", "tls.csr", cwd=pki)  # fmt: skip
    (pki / "tls.ext").write_text(
        "subjectAltName=DNS:bridge.example.com\nextendedKeyUsage=serverAuth,clientAuth\n"
    )
    _openssl("x509", "-req", "-in", "tls.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
             "-CAcreateserial", "-days", "1", "-out", "tls.crt", "-extfile", "tls.ext",
             cwd=pki)  # fmt: skip
    return pki


def _tls_env(env: dict[str, Any], pki: Path, port: int) -> dict[str, str]:
    """The hook's env with the Secret's mount point replaced by the local PKI directory."""
    out = {}
    for name in ("SIMBRIDGE_CA_FILE", "SIMBRIDGE_CLIENT_CERT_FILE", "SIMBRIDGE_CLIENT_KEY_FILE"):
        out[name] = str(pki / Path(env[name]["value"]).name)
    out["SIMBRIDGE_TLS_SERVER_NAME"] = env["SIMBRIDGE_TLS_SERVER_NAME"]["value"]
    out["SIMBRIDGE_URL"] = f"wss://127.0.0.1:{port}/v1/ingest"
    out["SIMBRIDGE_TIMEOUT_SECONDS"] = "10"
    return out


async def test_helm_test_with_token_tls_and_client_certificate(pki: Path) -> None:
    docs = render("external-loadbalancer-values.yaml")
    script, env = hook_pod(docs)
    assert env["SIMBRIDGE_URL"]["value"].startswith("wss://sb-simbridge.sim.svc:")
    ref = env["SIMBRIDGE_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"]
    [secret] = [d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"] == ref["name"]]
    token = secret["stringData"][ref["key"]]
    async with running_bridge(
        auth_token=token,
        tls_cert_file=str(pki / "tls.crt"),
        tls_key_file=str(pki / "tls.key"),
        tls_client_ca_file=str(pki / "ca.crt"),
    ) as bridge:
        assert bridge.ports is not None
        base = _tls_env(env, pki, bridge.ports.ws)
        rc, out = await run_check(script, {**base, "SIMBRIDGE_AUTH_TOKEN": token})
        assert rc == 0, out
        assert "OK: Welcome from wss://" in out
        # The same check fails when the token is wrong...
        rc, out = await run_check(script, {**base, "SIMBRIDGE_AUTH_TOKEN": "not-the-token"})
        assert rc == 1 and out.startswith("FAIL: expected Welcome"), out
        assert "got error" in out, out
        # ...and when the server name is not in the certificate.
        rc, out = await run_check(
            script,
            {**base, "SIMBRIDGE_AUTH_TOKEN": token, "SIMBRIDGE_TLS_SERVER_NAME": "other.example"},
        )
        assert rc == 1 and "FAIL:" in out, out
