"""The event loop every loadgen entry point runs on: uvloop when it is installed, else asyncio's
own. Its own module so that the CLI, the publisher processes and the benchmarks share it
without importing one another (procs once imported the CLI for it, and the CLI imports procs)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any


def run_async(coro: Coroutine[Any, Any, int]) -> int:
    """Run on uvloop when it is installed (the loopback ceilings in docs/design.md §6 assume it)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)
