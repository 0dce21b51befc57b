"""What a new user types first (issue 33): ``--version``, and a misspelt ``BRIDGE_*`` variable."""

from __future__ import annotations

import asyncio
import importlib.metadata
import os
import signal
import subprocess
import sys

from bridge.config import settings as settings_mod
from tests.integration.harness import ROOT


def test_version_prints_the_installed_version_and_exits_0() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bridge.cli", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"simbridge {importlib.metadata.version('simbridge')}"


def test_only_bridge_variables_that_are_no_setting_are_reported() -> None:
    env = {
        "BRIDGE_WSPORT": "1",
        "BRIDGE_WS_PORT": "0",
        "BRIDGE_CONFIG": "x.yaml",
        "BRIDGE_BUILD_NATIVE": "yes",
        "HOME": "/root",
    }
    (line,) = settings_mod.unknown_env(env)
    assert "BRIDGE_WSPORT" in line and "did you mean BRIDGE_WS_PORT?" in line


async def test_serve_warns_about_a_misspelt_variable_in_one_line() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BRIDGE_")}
    proc = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "bridge.cli", "serve", "--host", "127.0.0.1", "--no-adapt"),
        *("--ws-port", "0", "--grpc-port", "0", "--http-port", "0"),
        env={**env, "BRIDGE_WSPORT": "1"},
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    try:
        line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
        assert line.startswith("SIMBRIDGE_READY"), line
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(proc.communicate(), 60)
    warnings = [ln for ln in err.decode().splitlines() if "BRIDGE_WSPORT" in ln]
    assert len(warnings) == 1, err.decode()
    assert "WARNING" in warnings[0] and "BRIDGE_WS_PORT" in warnings[0]


def test_a_config_error_also_names_the_misspelt_variable() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BRIDGE_")}
    proc = subprocess.run(
        [sys.executable, "-m", "bridge.cli", "serve", "--ring-budget-bytes", "lots"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**env, "BRIDGE_RING_BUDGET": "1"},
    )
    assert proc.returncode == 2
    assert "BRIDGE_RING_BUDGET is not a setting" in proc.stderr
    assert "ring_budget_bytes: cannot parse 'lots'" in proc.stderr
