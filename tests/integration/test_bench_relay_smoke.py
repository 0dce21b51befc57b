"""Keeps ``benchmarks.relay.cli`` from rotting: one tiny cell per target through the real machinery
(bridge and raw relays as child processes, the benchmark's sink and clients in this process).

Speed is not asserted (CI timings are noise); the accounting is: every message a client sent
reached the sink exactly once and in order, and nothing went wrong on the way.
"""

from __future__ import annotations

import math

from prometheus_client.parser import text_string_to_metric_families

from benchmarks.relay import cli as relay
from tests.integration.harness import http_get


async def test_one_small_cell_per_target_accounts_for_every_message() -> None:
    cfg = relay.BenchConfig(
        sizes=("1KB",), conns=(2,), targets=relay.TARGETS, seconds=0.5, warmup=0.1, window=4
    )
    results = await relay.run(cfg)

    assert [r.target for r in results] == list(relay.TARGETS)
    for r in results:
        assert r.errors == [], (r.target, r.errors)
        assert r.sent > 0, r.target
        assert r.sink_received == r.completed == r.sent, r
        assert r.msgs_per_s > 0 and math.isfinite(r.p99_ms), r
        assert r.wire_bytes > 1024  # a 1 KB cloud plus the protocol's framing
    for r in results:
        assert (r.ratio is not None) == r.target.startswith("bridge"), r
        # the bridge acks what it delivered (at least one message per edge); a raw relay never
        if r.target.startswith("bridge"):
            assert r.replies_per_frame is not None and r.replies_per_frame > 0, r
        else:
            assert r.replies_per_frame is None, r
    report = relay.format_report(results, cfg)
    assert "bridge/raw" in report and "acks/frame" in report


async def test_two_bridge_processes_share_the_ports_and_each_serves_connections() -> None:
    """``--bridge-procs 2`` (docs/scaling.md's prototype): two ``serve --reuse-port`` processes
    on one port pair, each with its own push stream; every message still arrives exactly once."""
    cfg = relay.BenchConfig(
        sizes=("1KB",),
        conns=(16,),  # 16 hashed connections all on one of 2 processes: p = 2^-15
        targets=("bridge-ws", "bridge-grpc"),
        seconds=0.5,
        warmup=0.1,
        window=2,
        bridge_procs=2,
    )
    async with relay.Bench(cfg) as bench:
        results = await bench.run_all()
        group = bench.servers["bridge"]
        assert isinstance(group, relay.ServerGroup)
        assert bench.sink.bridge_streams == 2
        received = []
        for server in group.servers:
            assert server.child is not None
            _, text = await http_get(server.child.ports["http"], "/metrics")
            received.append(_metric_sum(text, "bridge_frames_received_total"))
        assert "CPU share" in group.spread()
    for r in results:
        assert r.errors == [], (r.target, r.errors)
        assert r.sink_received == r.completed == r.sent > 0, r
    assert all(n > 0 for n in received), received  # the kernel spread connections to both
    assert sum(received) >= sum(r.sent for r in results)


def _metric_sum(text: str, name: str) -> float:
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    )
