"""The load generator's layer on top of the SDK (``loadgen.edge``: the open-loop client and the
Publisher, and the ``publish`` command) against the fake ingest server of
tests/integration/fake_bridge.py, over both transports."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from bridge.client import StreamSpec
from bridge.v1 import bridge_pb2 as pb
from loadgen import cli
from loadgen.edge import EdgeClient as LoadEdgeClient
from loadgen.edge import Publisher
from tests.integration.fake_bridge import (
    Env,
    env_fixture,  # noqa: F401 - the fixture (ws, grpc)
    flow,
)


async def test_publisher_runs_open_loop_and_reports(env: Env) -> None:
    pub = Publisher(
        env.transport,  # type: ignore[arg-type]
        env.url,
        edges=2,
        streams_per_edge=2,
        rate_hz=50,
        duration_s=0.4,
        points=500,
        telemetry=True,
    )
    rep = await pub.run()
    assert rep["published"] == 2 * 3 * 20
    assert rep["acked_delivered"] == rep["published"] and rep["undelivered"] == 0
    assert rep["latency"]["count"] == rep["published"]
    assert rep["disconnects"] == 0 and rep["dropped_resend_overflow"] == 0
    assert {h.device_id for h in env.fake.hellos} == {"loadgen-0", "loadgen-1"}
    assert len(env.fake.frames) == 120


async def test_publish_command_prints_a_json_summary(
    env: Env, capsys: pytest.CaptureFixture[str]
) -> None:
    flag = "--ws" if env.transport == "ws" else "--grpc"
    argv = [
        "publish", flag, env.url, "--edges", "2", "--rate", "40", "--duration", "0.25",
        "--points", "200", "--json",
    ]  # fmt: skip
    rc = await asyncio.to_thread(cli.main, argv)  # its own event loop, like the real command
    assert rc == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["published"] == 2 * 10 and rep["undelivered"] == 0
    assert len(env.fake.frames) == 20


def test_unreachable_bridge_exits_1_and_help_lists_the_options(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["publish", "--grpc", "127.0.0.1:9", "--duration", "0.1", "--connect-timeout", "0.3"]
    assert cli.main(argv) == 1
    assert "error:" in capsys.readouterr().err
    assert {"sink", "publish", "demo"} <= set(cli.COMMANDS)  # demo is filled in elsewhere
    with pytest.raises(SystemExit) as exc:
        cli.main(["publish", "--help"])
    assert exc.value.code == 0
    assert "--streams-per-edge" in capsys.readouterr().out


async def test_load_generator_client_is_open_loop_and_samples_latency(env: Env) -> None:
    env.fake.on_welcome = [flow(pb.FlowControl.PAUSE)]
    transport: Any = env.transport
    target = env.url.removeprefix("grpc://")  # the load generator's gRPC targets are host:port
    c = LoadEdgeClient(transport, target, "load", [StreamSpec("a", kind="telemetry")])
    env.clients.append(c)
    await c.start()
    # The PAUSE follows the Welcome: publish only once the client has read it (no race).
    assert await c.wait_for(lambda: c.core.paused("a"), 5.0)
    for i in range(3):  # paused: buffered at once, never waits (open loop)
        await asyncio.wait_for(c.publish("a", {"i": float(i)}), 1.0)
    assert c.core.buffered_frames == 3 and env.fake.frames == []
    await env.fake.broadcast(flow(pb.FlowControl.RESUME))
    assert await c.wait_delivered(5.0)
    rep = c.stats.as_dict()
    assert (rep["acked_delivered"], rep["dropped_resend_overflow"]) == (3, 0)
    assert rep["latency"]["count"] == 3 and len(c.stats.latency_ns) == 3
