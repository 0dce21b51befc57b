"""The saturation signal the chart's HorizontalPodAutoscaler scales on (issue 32, Build 4):
``bridge_event_loop_busy_seconds_total``, whose rate is the event loop's busy fraction. Measured
here on a real asyncio loop that is kept busy a known share of the time, and on one that competes
for a single CPU with another process (runnable but not running still counts as busy)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from bridge.server.looplag import LoopLagMonitor, thread_busy_clock
from bridge.server.metrics import BridgeMetrics

BUSY = "bridge_event_loop_busy_seconds_total"


def _busy_seconds(registry: CollectorRegistry) -> float:
    value = registry.get_sample_value(BUSY)
    assert value is not None, f"{BUSY} is not exported"
    return value


async def _measure(registry: CollectorRegistry, seconds: float, busy_share: float) -> float:
    """Run the monitor for ``seconds`` while callbacks spin ``busy_share`` of each 20 ms (by the
    wall clock); return the measured busy fraction."""
    metrics = BridgeMetrics(registry)
    monitor = asyncio.create_task(LoopLagMonitor(metrics.loop_lag, busy=metrics.loop_busy).run())
    await asyncio.sleep(0.15)  # the monitor has taken its first reading
    start_busy, start = _busy_seconds(registry), time.monotonic()
    period = 0.02
    while time.monotonic() - start < seconds:
        spin_until = time.monotonic() + period * busy_share
        while time.monotonic() < spin_until:
            pass
        await asyncio.sleep(period * (1 - busy_share))
    elapsed = time.monotonic() - start
    await asyncio.sleep(0.15)  # one more monitor tick books the last spin (the wait is idle)
    monitor.cancel()
    return (_busy_seconds(registry) - start_busy) / elapsed


def test_busy_counter_is_registered_at_zero() -> None:
    registry = CollectorRegistry()
    BridgeMetrics(registry)
    assert _busy_seconds(registry) == 0.0


def test_idle_loop_reads_near_zero() -> None:
    assert asyncio.run(_measure(CollectorRegistry(), 1.0, 0.0)) < 0.1


def test_half_busy_loop_reads_about_half() -> None:
    fraction = asyncio.run(_measure(CollectorRegistry(), 1.5, 0.5))
    assert 0.35 <= fraction <= 0.8, fraction


def test_saturated_loop_reads_near_one() -> None:
    assert asyncio.run(_measure(CollectorRegistry(), 1.0, 1.0)) >= 0.9


@pytest.fixture
def one_cpu_shared_with_a_spinner() -> Iterator[None]:
    """Pin this thread and a CPU-bound process to one CPU: each gets about half of it."""
    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("needs sched_setaffinity (Linux)")
    cpu = min(os.sched_getaffinity(0))
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})
    spinner = subprocess.Popen(
        [sys.executable, "-c", f"import os\nos.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"]
    )
    try:
        time.sleep(0.2)
        yield
    finally:
        spinner.kill()
        spinner.wait()
        os.sched_setaffinity(0, before)


@pytest.mark.skipif(
    not Path(f"/proc/self/task/{threading.get_native_id()}/schedstat").exists(),
    reason="no /proc/<tid>/schedstat: the busy clock falls back to CPU time",
)
def test_waiting_for_a_cpu_counts_as_busy(one_cpu_shared_with_a_spinner: None) -> None:
    """A loop that wants the whole CPU but gets about half of it is saturated: the busy fraction
    includes run-queue wait (the same wait CPU-quota throttling causes), not only CPU time."""
    cpu_before = time.thread_time()
    wall_before = time.monotonic()
    fraction = asyncio.run(_measure(CollectorRegistry(), 1.0, 1.0))
    cpu_share = (time.thread_time() - cpu_before) / (time.monotonic() - wall_before)
    assert cpu_share < 0.75, f"the spinner did not compete for the CPU ({cpu_share:.2f})"
    assert fraction >= 0.9, (fraction, cpu_share)


def test_busy_clock_is_monotonic_and_bounded_by_wall_time() -> None:
    clock = thread_busy_clock()
    c0, w0 = clock(), time.monotonic()
    spin_until = w0 + 0.2
    while time.monotonic() < spin_until:
        pass
    c1, w1 = clock(), time.monotonic()
    assert 0.1 <= c1 - c0 <= (w1 - w0) + 0.01
