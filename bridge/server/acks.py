"""One edge connection's acks: the core's wake-ups, coalesced into few Ack messages.

Why its own piece: the core wakes a connection's acks twice per frame (accepted, then delivered),
so a wake-up that changes nothing must cost next to nothing; the writer turns them into at most
one Ack per ``ack_interval_seconds``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from bridge.v1 import bridge_pb2 as pb


class AckPacer:
    """Wake-ups in (:meth:`wake`), Ack messages out (:meth:`run`, one task per connection)."""

    def __init__(self, interval_seconds: float, accepted_delay_seconds: float) -> None:
        self._interval = interval_seconds
        self._delay = accepted_delay_seconds
        self._due = asyncio.Event()
        self._urgent = asyncio.Event()
        # Whether each event was set since the writer last took the acks: a repeated wake-up
        # reads two attributes instead of calling Event.set() twice (issue 29/30: per frame).
        self._due_set = False
        self._urgent_set = False

    def wake(self, *, urgent: bool) -> None:
        """Acks changed; ``urgent``: something was delivered (or is a duplicate), send soon."""
        if not self._due_set:
            self._due_set = True
            self._due.set()
        if urgent and not self._urgent_set:
            self._urgent_set = True
            self._urgent.set()

    async def run(
        self,
        take: Callable[[], pb.Ack | None],
        send: Callable[[pb.BridgeMessage], Awaitable[None]],
    ) -> None:
        """Coalesce acks: at most one per interval; an accepted-only change waits up to the
        accepted delay for a delivered one to share the message (halves the acks on a busy
        connection, where each frame would otherwise be acked twice)."""
        while True:
            await self._due.wait()
            if not self._urgent_set:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._urgent.wait(), self._delay)
            self._due.clear()
            self._urgent.clear()
            self._due_set = self._urgent_set = False
            ack = take()
            if ack is not None:
                await send(pb.BridgeMessage(ack=ack))
            await asyncio.sleep(self._interval)
