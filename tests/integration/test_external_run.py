"""``run --target``: a real bridge and sink on 127.0.0.1 that the runner did not start, and the
scenario's resizes sent with kubectl through the *current context* of a kubeconfig that points at
the Kubernetes stand-in (the cluster case, without a cluster)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from loadgen.external import ExternalRun, KubectlResizer, parse_target
from loadgen.kubesim import KubeSim
from loadgen.scenario import from_mapping
from loadgen.sink import SinkServer
from tests.integration.harness import grpc_target, running_bridge, ws_url

K8S = Path(__file__).resolve().parent.parent / "fixtures" / "k8s"


def test_parse_target() -> None:
    ws = parse_target("ws://bridge.ns.svc:8080")
    assert (ws.transport, ws.address) == ("ws", "ws://bridge.ns.svc:8080/v1/ingest")
    assert parse_target("ws://h:1/other").address == "ws://h:1/other"
    g = parse_target("grpc://10.0.0.7:9090")
    assert (g.transport, g.address, str(g)) == ("grpc", "10.0.0.7:9090", "grpc://10.0.0.7:9090")
    for bad in ("10.0.0.7:9090", "http://h:1", "grpc://h", "grpc://h:1/x", "ws://h:notaport"):
        with pytest.raises(ValueError, match=r"--target|HOST:PORT"):
            parse_target(bad)


def _kubeconfig(tmp_path: Path, server: str) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "sim", "cluster": {"server": server}}],
                "users": [{"name": "u", "user": {}}],
                "contexts": [
                    {"name": "sim", "context": {"cluster": "sim", "user": "u", "namespace": "sim"}}
                ],
                "current-context": "sim",
            }
        )
    )
    return path


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed")
async def test_external_run_delivers_and_resizes_through_the_current_context(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pod: dict[str, Any] = json.loads((K8S / "pod-running-initial.json").read_text())
    async with (
        KubeSim(pod, sync_interval=0.02) as sim,
        SinkServer(listen="127.0.0.1:0", fsync=False) as sink,
    ):
        monkeypatch.setenv("KUBECONFIG", str(_kubeconfig(tmp_path, sim.url)))
        async with running_bridge(sink_address=sink.address, passthrough=True) as bridge:
            targets = [parse_target(ws_url(bridge)), parse_target("grpc://" + grpc_target(bridge))]
            s = from_mapping(
                {
                    "edges": 2,
                    "points": 500,
                    "rate_hz": 10,
                    "duration": "3s",
                    "warmup": "0.5s",
                    "drain": "5s",
                    "adapt_timeout": "2s",
                    "baseline": "none",
                    # accepted and actuated; then one the node can never fit (Infeasible)
                    "resizes": [{"at": "1s", "cpu": 3}, {"at": "2s", "cpu": 40}],
                }
            )
            rep = await ExternalRun(s, targets, resizer=KubectlResizer("sim-bridge-0")).execute()
    t = rep["totals"]
    assert t["published"] == 2 * 2 * 30 and t["acked_delivered"] == t["published"]
    assert sink.record.totals()["delivered"] == t["published"]
    assert {e["transport"] for e in rep["edges"]} == {"ws", "grpc"}
    first, second = rep["resizes"]
    assert first["converged"] is True, first
    st = sim.pod["status"]["containerStatuses"][0]["resources"]
    assert st["limits"]["cpu"] in ("3", "3000m")
    assert second["converged"] is False and "did not converge" in second["notes"][0]
    assert rep["ok"] is False  # a resize failed: the run says so (exit 1 from the CLI)


def test_cli_exit_codes_unreachable_and_bad_arguments(free_port: int, tmp_path: Path) -> None:
    from loadgen.cli import main

    common = ["run", "--builtin", "steady", "--duration", "2", "--quiet", "--out", str(tmp_path)]
    unreachable = [*common, "--target", f"ws://127.0.0.1:{free_port}", "--connect-timeout", "0.5"]
    assert main(unreachable) == 1
    assert main([*common, "--target", f"127.0.0.1:{free_port}"]) == 2  # no scheme
    assert main([*common, "--pod", "p"]) == 2  # --pod without --target
    # a scenario that resizes needs --pod; 'memory: usage' cannot work from outside
    assert main(["run", "--builtin", "ci-short", "--target", f"ws://127.0.0.1:{free_port}"]) == 2
