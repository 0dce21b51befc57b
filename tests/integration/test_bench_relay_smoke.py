"""Keeps ``benchmarks.relay`` from rotting: one tiny cell per target through the real machinery
(bridge and raw relays as child processes, the benchmark's sink and clients in this process).

Speed is not asserted (CI timings are noise); the accounting is: every message a client sent
reached the sink exactly once and in order, and nothing went wrong on the way.
"""

from __future__ import annotations

import math

from benchmarks import relay


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
    assert "bridge/raw" in relay.format_report(results, cfg)
