"""release_free_heap: glibc malloc_trim where present, a harmless no-op elsewhere; and the bridge
calls it once a planned ring shrink has drained (so memory.current can fall)."""

from __future__ import annotations

import ctypes.util

import pytest

from bridge import app as app_mod
from bridge import memtrim
from bridge.trimpolicy import HeapTrimPolicy
from tests.integration.harness import running_bridge, wait_until


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


def test_tune_allocator_is_accepted_by_glibc_or_reports_why_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if memtrim._libc() is None or not hasattr(memtrim._libc(), "mallopt"):
        pytest.skip("no glibc mallopt on this platform")
    assert memtrim.tune_allocator() is True
    monkeypatch.setattr(memtrim, "_libc", lambda: None)
    assert memtrim.tune_allocator() is False
