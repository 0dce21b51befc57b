"""Packaging a new user meets (issue 33): the image carries LICENSE and NOTICE and a HEALTHCHECK
that works, ``make image`` builds the name the chart deploys, and ``npm install`` for the Node
example leaves nothing untracked. The image itself is built by ``make e2e-container``; here the
Dockerfile's own HEALTHCHECK command runs against a real bridge."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import sys

import pytest
import yaml

from tests.integration.harness import ROOT, running_bridge

DOCKERFILE = (ROOT / "Dockerfile").read_text()


def _stage(name: str) -> str:
    """The instructions of one Dockerfile stage."""
    m = re.search(rf"^FROM \S+ AS {name}\n(.*?)(?=^FROM |\Z)", DOCKERFILE, re.M | re.S)
    assert m, name
    return m[1]


def test_runtime_images_carry_license_and_notice() -> None:
    runtime = _stage("runtime-base")  # both cpu and gpu are built FROM it
    assert re.search(r"^COPY LICENSE NOTICE /usr/share/doc/simbridge/$", runtime, re.M)
    # ...and the build context lets both files in (.dockerignore ignores everything else).
    ignore = (ROOT / ".dockerignore").read_text().splitlines()
    assert ignore[ignore.index("*") :].count("!NOTICE") == 1 and "!LICENSE" in ignore
    for stage in ("gpu", "cpu"):
        assert re.search(rf"^FROM runtime-base AS {stage}$", DOCKERFILE, re.M)


def _healthcheck() -> list[str]:
    [line] = [ln for ln in _stage("runtime-base").splitlines() if ln.startswith("HEALTHCHECK")]
    command: list[str] = json.loads(line.split(" CMD ", 1)[1])
    return command


async def _run(command: list[str]) -> int:
    if command[0] == "python3":
        command = [sys.executable, *command[1:]]  # the image's python3 is its venv's
    proc = await asyncio.create_subprocess_exec(*command)
    return await asyncio.wait_for(proc.wait(), 30)


async def test_healthcheck_passes_on_a_live_bridge_and_fails_without_one() -> None:
    command = _healthcheck()
    assert any("http://127.0.0.1:9100/healthz" in part for part in command), command
    async with running_bridge() as bridge:
        assert bridge.ports is not None
        port = bridge.ports.http
        local = [part.replace(":9100/", f":{port}/") for part in command]
        assert await _run(local) == 0
    assert await _run(local) != 0  # nothing listens any more


def test_make_image_tags_the_image_the_chart_deploys() -> None:
    if shutil.which("make") is None:
        pytest.skip("make not installed")
    chart = yaml.safe_load((ROOT / "charts/simbridge/Chart.yaml").read_text())
    values = yaml.safe_load((ROOT / "charts/simbridge/values.yaml").read_text())
    assert values["image"]["tag"] == ""  # the tag is the chart's appVersion
    wanted = f"docker.io/library/{values['image']['repository']}:{chart['appVersion']}"
    for tool in ("podman", "docker"):
        out = subprocess.run(
            ["make", "--no-print-directory", "-n", "image", f"CONTAINER_TOOL={tool}"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        assert out[:2] == [tool, "build"] and out[-1] == ".", out
        assert out[out.index("-t") + 1] == wanted and out[out.index("--target") + 1] == "cpu"
        # podman keeps HEALTHCHECK only in the docker image format
        assert ("--format" in out) == (tool == "podman")


def test_npm_install_for_the_node_example_leaves_nothing_untracked() -> None:
    made_by_npm = ["package.json", "package-lock.json", "node_modules/ws/index.js"]
    proc = subprocess.run(
        ["git", "check-ignore", "--no-index", *made_by_npm],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert sorted(proc.stdout.split()) == sorted(made_by_npm), proc.stdout + proc.stderr
