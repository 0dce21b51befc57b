"""Event-loop lag and busy time.

Lag: how late a periodic timer fires (why: a blocking call on the loop stalls every connection at
once; this histogram shows it before the edges' latencies do).

Busy time: seconds the loop's thread was running or waiting for a CPU, a counter whose rate is the
loop's busy fraction (0..1), the saturation signal the chart's HorizontalPodAutoscaler scales on.
One event loop runs on one core at most, so this is the part of the bridge that more CPU in place
cannot grow past. On Linux it is read from ``/proc/self/task/<tid>/schedstat`` (time on a CPU plus
run-queue wait, which includes CPU-quota throttling and contention with the worker threads);
elsewhere it falls back to the thread's CPU time.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Protocol


class Observer(Protocol):
    def observe(self, amount: float) -> None: ...


class Incrementer(Protocol):
    def inc(self, amount: float = 1) -> None: ...


def _schedstat_seconds(path: str) -> float:
    with open(path, "rb") as f:
        on_cpu, run_delay = f.read().split()[:2]
    return (int(on_cpu) + int(run_delay)) / 1e9


def thread_busy_clock() -> Callable[[], float]:
    """A clock of the calling thread's busy seconds (running or runnable); call it on that thread
    to bind it, then from anywhere."""
    path = f"/proc/self/task/{threading.get_native_id()}/schedstat"
    try:
        _schedstat_seconds(path)
    except (OSError, ValueError):
        return time.thread_time  # no schedstat: CPU time only (throttled waits not counted)
    return lambda: _schedstat_seconds(path)


class LoopLagMonitor:
    def __init__(
        self, histogram: Observer, interval: float = 0.1, busy: Incrementer | None = None
    ) -> None:
        self.histogram = histogram
        self.interval = interval
        self.busy = busy

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        clock = thread_busy_clock() if self.busy is not None else None
        last = clock() if clock is not None else 0.0
        while True:
            due = loop.time() + self.interval
            await asyncio.sleep(self.interval)
            self.histogram.observe(max(0.0, loop.time() - due))
            if clock is not None and self.busy is not None:
                now = clock()
                if now > last:
                    self.busy.inc(now - last)
                last = now
