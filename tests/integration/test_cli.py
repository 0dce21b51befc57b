"""The ``simbridge`` command line as a user runs it: real processes, real output.

``serve --help`` describes every flag; no subcommand runs a benchmark;
``resources`` prints the plan ``serve`` applies; ``--log-format json`` makes the ready line JSON.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import os
import re
import signal
import subprocess
import sys
from typing import Any

from bridge.config import settings as settings_mod
from bridge.config.settings_help import HELP
from bridge.resources.from_settings import RESERVE_FRACTION
from tests.integration.harness import ROOT, http_get, running_bridge, ws_url

CGROUP_UNLIMITED = ROOT / "tests" / "fixtures" / "cgroups" / "v2-max" / "sys" / "fs" / "cgroup"
MiB = 1024 * 1024


def simbridge(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bridge.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
    )


def _squash(text: str) -> str:
    """Without whitespace: argparse wraps help text anywhere, hyphenated words included."""
    return re.sub(r"\s+", "", text)


def test_every_settings_field_has_a_description() -> None:
    names = {f.name for f in dataclasses.fields(settings_mod.Settings)}
    assert names == set(HELP), f"missing: {names - set(HELP)}, stale: {set(HELP) - names}"


def test_serve_help_describes_every_flag_and_its_allowed_values() -> None:
    proc = simbridge("serve", "--help")
    assert proc.returncode == 0, proc.stderr
    text = _squash(proc.stdout)
    for f in dataclasses.fields(settings_mod.Settings):
        flag = "--" + f.name.replace("_", "-")
        assert flag in text, flag
        assert _squash(HELP[f.name]) in text, f"{flag}: no description"
        assert f"envBRIDGE_{f.name.upper()}" in text, flag
    assert _squash("one of: backpressure, drop_oldest") in text
    assert _squash("one of: auto, cuda, c, numpy") in text
    assert _squash("one of: text, json") in text
    assert _squash("one of: DEBUG, INFO, WARNING, ERROR") in text


def test_the_product_command_line_runs_no_benchmark() -> None:
    """Benchmarks ship with the source tree, not with the package: ``make bench-decimate`` runs
    the decimation one (``simbridge bench`` needed benchmarks/ on the path, so an installed
    wheel could not run it)."""
    listing = simbridge("--help")
    assert listing.returncode == 0 and "  serve " in listing.stdout
    assert "bench" not in listing.stdout
    assert simbridge("bench", "decimate").returncode == 2


def _resources_json(env: dict[str, str]) -> dict[str, Any]:
    proc = simbridge("resources", "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    data: dict[str, Any] = json.loads(proc.stdout)
    return data


def _keys(node: object) -> list[str]:
    if isinstance(node, dict):
        return [k for k, v in node.items() for k in (k, *_keys(v))]
    if isinstance(node, list):
        return [k for item in node for k in _keys(item)]
    return []


async def _serve_ring_budget(env: dict[str, str]) -> int:
    """``simbridge serve`` with adaptation on: the ring budget it planned, from /metrics (one
    process: ``resources`` prints the single process's plan; a pod splits it, its own test)."""
    proc = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "bridge.cli", "serve", "--host", "127.0.0.1", "--processes=1"),
        *("--ws-port", "0", "--grpc-port", "0", "--http-port", "0", "--adapt"),
        env={**os.environ, **env},
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
        http = int(dict(kv.split("=") for kv in line.split()[1:])["http"])
        for _ in range(200):
            _, body = await http_get(http, "/metrics")
            m = re.search(r"^bridge_plan_ring_budget_bytes (\S+)$", body, re.M)
            if m and float(m[1]) > 0:
                return int(float(m[1]))
            await asyncio.sleep(0.05)
        raise AssertionError("serve never planned a ring budget")
    finally:
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), 60)


async def test_resources_prints_the_plan_serve_applies() -> None:
    """One plan: same cgroup (unlimited memory), same settings, same ring budget."""
    for budget in (None, 300 * MiB):
        env = {"BRIDGE_CGROUP_ROOT": str(CGROUP_UNLIMITED)}
        if budget is not None:
            env["BRIDGE_RING_BUDGET_BYTES"] = str(budget)
        data = await asyncio.to_thread(_resources_json, env)
        planned = data["plan"]["ring_budget_bytes"]["value"]
        data_budget = budget or settings_mod.Settings().ring_budget_bytes
        # the rings get the data budget less the governor's forward-progress reserve
        assert planned == data_budget - math.floor(RESERVE_FRACTION * data_budget)
        assert planned == await _serve_ring_budget(env)


def test_resources_json_keys_are_plain_identifiers() -> None:
    data = _resources_json({"BRIDGE_CGROUP_ROOT": str(CGROUP_UNLIMITED)})
    bad = [k for k in _keys(data) if re.search(r"[\s()]", k)]
    assert not bad, bad
    assert "plan" in data and "plan_inputs" in data


def test_resources_reports_bad_settings_like_serve() -> None:
    proc = simbridge("resources", env={"BRIDGE_RING_BUDGET_BYTES": "lots"})
    assert proc.returncode == 2
    assert "ring_budget_bytes: cannot parse 'lots'" in proc.stderr


async def test_json_log_format_makes_the_ready_line_json() -> None:
    proc = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "bridge.cli", "serve", "--host", "127.0.0.1", "--no-adapt"),
        *("--ws-port", "0", "--grpc-port", "0", "--http-port", "0", "--log-format", "json"),
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    try:
        line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
        ready = json.loads(line)
        assert ready["msg"] == "SIMBRIDGE_READY" and ready["level"] == "info"
        status, _ = await http_get(ready["http"], "/healthz")
        assert status == 200
        assert all(isinstance(ready[k], int) and ready[k] > 0 for k in ("ws", "grpc", "http"))
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0
    for text in (out.decode(), err.decode()):
        for log_line in filter(None, text.splitlines()):
            json.loads(log_line)  # every line of both streams is JSON


async def _publish(url: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        *(sys.executable, "-c", "import sys; from loadgen.cli import main; sys.exit(main())"),
        *("publish", "--ws", url, "--edges", "1", "--rate", "10", "--duration", "0.5"),
        *("--points", "100", "--drain-timeout", "1"),
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode()


async def test_publish_exits_nonzero_with_frames_undelivered(free_port: int) -> None:
    # A sink address where nothing listens: frames are accepted, never delivered.
    async with running_bridge(sink_address=f"127.0.0.1:{free_port}") as bridge:
        rc, out = await _publish(ws_url(bridge))
    assert rc == 1, out
    assert re.search(r"error: [1-9]\d* frame\(s\) not delivered", out), out
    # No sink configured: frames count as delivered once offered, and publish succeeds.
    async with running_bridge() as bridge:
        rc, out = await _publish(ws_url(bridge))
    assert rc == 0, out
    assert "undelivered 0" in out
