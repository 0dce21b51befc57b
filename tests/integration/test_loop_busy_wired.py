"""The saturation signal the chart's HPA scales on is really exported by a running bridge: the
event loop's busy seconds grow while the loop works (the counter existed, but serve never gave it
to the loop monitor, so a real bridge exported 0 forever)."""

from __future__ import annotations

import asyncio
import time

from tests.integration.harness import metric, running_bridge

BUSY = "bridge_event_loop_busy_seconds_total"


async def test_a_busy_loop_shows_in_the_busy_counter() -> None:
    async with running_bridge() as bridge:
        await asyncio.sleep(0.3)  # the monitor's first interval
        before = metric(bridge, BUSY)
        for _ in range(5):  # 0.5 s of work on the bridge's own loop, in turns
            end = time.monotonic() + 0.1
            while time.monotonic() < end:
                pass
            await asyncio.sleep(0)
        await asyncio.sleep(0.3)
        grew = metric(bridge, BUSY) - before
    assert grew >= 0.3, f"busy seconds grew by {grew:.3f} over 0.5 s of loop work"
