"""The loop guard of ``conftest.py`` catches a callback that blocks or computes on the loop, and
lets short callbacks through."""

from __future__ import annotations

import asyncio
import time

from tests.integration.conftest import SLOW_CALLBACK_S, guarding_the_loop


def _burn(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_blocking_and_computing_callbacks_are_caught_short_ones_are_not() -> None:
    loop = asyncio.new_event_loop()
    try:
        with guarding_the_loop() as slow:
            loop.call_soon(_burn, 2 * SLOW_CALLBACK_S)  # computes on the loop
            loop.call_soon(time.sleep, 2 * SLOW_CALLBACK_S)  # blocks without using the CPU
            for _ in range(20):  # short ones pass, however late the machine wakes them
                loop.call_soon(time.sleep, 0.001)
            loop.run_until_complete(asyncio.sleep(0.01))
    finally:
        loop.close()
    assert len(slow) == 2, slow
    assert "_burn" in slow[0] and "sleep" in slow[1]
