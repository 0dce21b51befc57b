"""``simbridge-loadgen publish --procs N``: edges spread over real child processes against a real
bridge, one merged report, and the generator's own lag flagged."""

from __future__ import annotations

import asyncio
import json

import pytest

from loadgen import cli
from loadgen.edge import longest_stall_s, schedule_lagged
from loadgen.procs import split
from tests.integration.harness import running_bridge, ws_url


def test_edges_split_evenly_and_never_into_empty_processes() -> None:
    assert split(5, 2) == [(0, 3), (3, 2)]
    assert split(2, 4) == [(0, 1), (1, 1)]
    assert split(3, 1) == [(0, 3)]


def test_lag_flag_and_longest_stall() -> None:
    assert not schedule_lagged(1, 100) and schedule_lagged(2, 100)
    s = 1_000_000_000
    # deliveries at 1.1 s, 1.2 s, 2.0 s in a 1..3 s window: the longest gap is 2.0 -> 3.0
    assert longest_stall_s([int(1.1 * s), int(1.2 * s), 2 * s], s, 3 * s) == pytest.approx(1.0)
    assert longest_stall_s([], s, 3 * s) == pytest.approx(2.0)


async def test_publish_over_two_processes_merges_one_report(
    capsys: pytest.CaptureFixture[str],
) -> None:
    async with running_bridge() as bridge:
        argv = [
            "publish", "--ws", ws_url(bridge), "--edges", "3", "--rate", "20",
            "--duration", "0.5", "--points", "500", "--procs", "2", "--json",
        ]  # fmt: skip
        rc = await asyncio.to_thread(cli.main, argv)  # its own event loop, like the command
        assert rc == 0
        rep = json.loads(capsys.readouterr().out)
        assert rep["procs"] == 2 and rep["edges"] == 3
        assert rep["published"] == 3 * 10 == rep["acked_delivered"] and rep["undelivered"] == 0
        assert rep["latency"]["count"] == 30 and "schedule_lagged" in rep
        assert rep["generator_cpu_pct"] > 0 and "_delivered_at_ns" not in rep
        devices = {key[0] for key in bridge.core.streams}
        assert devices == {"loadgen-0", "loadgen-1", "loadgen-2"}
