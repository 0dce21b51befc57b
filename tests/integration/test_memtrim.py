"""release_free_heap: glibc malloc_trim where present, a harmless no-op elsewhere; and the bridge
calls it once a planned ring shrink has drained (so memory.current can fall)."""

from __future__ import annotations

import ctypes.util
from pathlib import Path

import pytest

from bridge.server import app as app_mod
from bridge.server import memtrim
from bridge.server.trimpolicy import HeapTrimPolicy
from loadgen.kubesim.cgroup import CgroupDir
from tests.integration.harness import running_bridge, wait_until

MiB = 1 << 20


def test_missing_libc_is_a_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: None)
    assert memtrim._load() is None
    monkeypatch.setattr(memtrim, "_TRIM", None)
    assert memtrim.release_free_heap() is False


async def test_bridge_trims_the_heap_once_after_a_shrink_drains(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[int] = []
    monkeypatch.setattr(app_mod, "release_free_heap", lambda: calls.append(1) or True)
    monkeypatch.setattr(HeapTrimPolicy, "decide", lambda *a: None)  # the other trigger
    async with running_bridge(ring_budget_bytes=256 << 20, max_frame_bytes=1 << 20) as bridge:
        assert bridge.capacity is not None
        bridge.capacity.set_memory_budget(512 << 20, 128 << 20)  # a grow does nothing...
        assert not await wait_until(lambda: bool(calls), timeout=0.6)
        bridge.capacity.set_memory_budget(64 << 20, 16 << 20)  # ...a shrink trims once drained
        assert await wait_until(lambda: len(calls) == 1, timeout=3)
        assert not await wait_until(lambda: len(calls) > 1, timeout=0.6)


async def test_bridge_trims_at_once_only_past_the_budget_and_after_idle_below_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[int] = []
    monkeypatch.setattr(app_mod, "release_free_heap", lambda: calls.append(1) or True)
    async with running_bridge(heap_trim_idle_seconds=1.5) as bridge:
        base = bridge._baseline_rss + bridge.governor.total_bytes  # e.g. the kept kernel scratch
        slack = bridge._trim.slack_bytes
        # Freed frames the next ones will reuse, well inside the budget: no trim while they churn.
        monkeypatch.setattr(app_mod, "_rss_bytes", lambda: base + slack + 1)
        assert bridge.governor.budget_bytes > 2 * slack
        assert not await wait_until(lambda: bool(calls), timeout=0.8)
        # ...but once they have sat unused for heap_trim_idle_seconds, they go back.
        assert await wait_until(lambda: len(calls) == 1, timeout=2)
        # Past the data budget they go within a second, and at most once a second.
        over = bridge._baseline_rss + bridge.governor.budget_bytes + slack + 1
        monkeypatch.setattr(app_mod, "_rss_bytes", lambda: over)
        assert await wait_until(lambda: len(calls) == 2, timeout=1.5)
        assert not await wait_until(lambda: len(calls) > 2, timeout=0.5)


async def test_bridge_over_its_planned_limit_keeps_trimming_until_under_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A decrease the node holds while usage is above it: the bridge keeps handing free heap back
    (every housekeeping pass, 4 a second) while its RSS is above the limit it plans for, even
    when the free heap is far below the slack (CI: one trim after the drain left RSS a few
    hundred KiB above it)."""
    calls: list[int] = []
    monkeypatch.setattr(app_mod, "release_free_heap", lambda: calls.append(1) or True)
    cg = CgroupDir(str(tmp_path), version="v2")
    cg.write_memory_limit(None)
    async with running_bridge(adapt=True, cgroup_root=str(tmp_path)) as bridge:
        assert not await wait_until(lambda: bool(calls), timeout=0.6)  # unlimited: nothing to do
        # A limit just above the baseline: the plan shrinks the budget to its floor (one trim
        # once drained); RSS half a MiB over it, the free heap far below the slack.
        limit = bridge._baseline_rss + 16 * MiB
        cg.write_memory_limit(limit)
        adapter = bridge.adapter
        assert await wait_until(lambda: adapter.plan.memory_limit_bytes == limit, timeout=3)
        rss = limit + (512 << 10)
        assert rss - bridge._baseline_rss - bridge.governor.total_bytes < bridge._trim.slack_bytes
        monkeypatch.setattr(app_mod, "_rss_bytes", lambda: rss)
        shrink_trims = len(calls)
        assert await wait_until(lambda: len(calls) >= shrink_trims + 2, timeout=2.5)
        monkeypatch.setattr(app_mod, "_rss_bytes", lambda: limit - 1)
        settled = len(calls)
        assert not await wait_until(lambda: len(calls) > settled + 1, timeout=1.5)


def test_tune_allocator_is_accepted_by_glibc_or_reports_why_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if memtrim._libc() is None or not hasattr(memtrim._libc(), "mallopt"):
        pytest.skip("no glibc mallopt on this platform")
    assert memtrim.tune_allocator() is True
    monkeypatch.setattr(memtrim, "_libc", lambda: None)
    assert memtrim.tune_allocator() is False
