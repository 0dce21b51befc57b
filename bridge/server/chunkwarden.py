"""One connection's incomplete chunked frames, watched on a timer (docs/protocol.md §3.2).

Why a task of its own: an edge that opens chunked frames and never finishes them sends no further
piece that could trigger a check, so age, fair share and the stall deadline are enforced here, not
on the next piece. Refusals and the close go back through the connection's callbacks; nothing
here waits on the peer.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from bridge.protocol.errors import ProtocolError
from bridge.server.chunks import Reassembler
from bridge.server.ingest_config import IngestConfig


class ChunkWarden:
    """``fair_share()``: the bytes of incomplete frames this connection may hold now, or None
    while nobody else waits for memory; ``report(refusals)``: send them to this edge;
    ``close(held_for, held_bytes)``: end the connection (fatal ``CHUNK_ABANDONED``)."""

    def __init__(
        self,
        chunks: Reassembler,
        config: IngestConfig,
        fair_share: Callable[[], int | None],
        report: Callable[[list[ProtocolError]], None],
        close: Callable[[float, int], None],
    ) -> None:
        self._chunks, self._config = chunks, config
        self._fair_share, self._report, self._close = fair_share, report, close
        self._held = asyncio.Event()

    def held(self, now: float) -> list[ProtocolError]:
        """A piece left incomplete frames held: watch them, and cut them back to the fair
        share at once (the refusals for the caller to report)."""
        self._held.set()
        return self.shed(now)

    def shed(self, now: float) -> list[ProtocolError]:
        share = self._fair_share()
        return [] if share is None else self._chunks.shed(share, now)

    async def run(self) -> None:
        """While incomplete chunked frames are held, every ``chunk_check_interval_seconds``:
        drop those past their age, cut the connection back to its fair share of admission
        while other connections wait for memory, and close it once it has held frames for
        ``chunk_stall_seconds`` without completing one."""
        chunks, config = self._chunks, self._config
        while True:
            await self._held.wait()
            while chunks.in_progress:
                await asyncio.sleep(config.chunk_check_interval_seconds)
                now = time.monotonic()
                refusals = chunks.expire(now) + self.shed(now)
                held_for = chunks.stalled_for(now)
                if chunks.in_progress and held_for >= config.chunk_stall_seconds:
                    self._close(held_for, chunks.charged_bytes)
                    return
                self._report(refusals)
            self._held.clear()
