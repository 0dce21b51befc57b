"""The edge client's sender: writes one connection's frames, batched or in lane pieces.

Why its own module: the connection loop (:mod:`bridge.client.client`) decides *when* a
connection exists; this decides *what goes out on it and in which order* (batches of small
frames, pieces of large ones with higher lanes in between, and no piece while the socket
already holds ``send_lowat_bytes`` unsent). One :class:`Sender` lives for one connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from bridge.client.core import EdgeCore, EdgeStats, Entry
from bridge.client.lanes import CHUNK_OVERHEAD, LaneScheduler
from bridge.client.transport import Connection
from bridge.protocol import batches
from bridge.v1 import bridge_pb2 as pb

log = logging.getLogger(__name__)

#: While the socket holds more than ``send_lowat_bytes`` unsent, pieces wait and the sender looks
#: again when the excess should have drained at the link's rate, at least this long (a higher
#: lane's frame wakes it at once).
LINK_POLL_SECONDS = 0.002


class Sender:
    """Sends ``core``'s frames on ``conn`` until cancelled or a send fails (then it closes
    ``conn``, so the receiver sees the end and the client reconnects).

    ``wake`` is set by whoever gives the sender something to look at (a publish, an Ack, flow
    control); ``notify`` tells the client's waiters that state changed (frames rejected as too
    large for the Welcome's limits)."""

    def __init__(
        self,
        conn: Connection,
        welcome: pb.Welcome,
        *,
        core: EdgeCore,
        stats: EdgeStats,
        lanes: LaneScheduler | None,
        batch_bytes: int,
        batch_linger: float,
        send_lowat_bytes: int,
        wake: asyncio.Event,
        notify: Callable[[], None],
        device_id: str,
    ) -> None:
        self.conn = conn
        self.welcome = welcome
        self.core = core
        self.stats = stats
        self.lanes = lanes
        self.batch_bytes = batch_bytes
        self.batch_linger = batch_linger
        self.send_lowat_bytes = send_lowat_bytes
        self._wake = wake
        self._notify = notify
        self.device_id = device_id

    async def run(self) -> None:
        """The send loop: whole frames in publish order, or with lanes when they are on."""
        if self.lanes is not None:
            return await self._send_lanes(self.conn, self.lanes)
        conn = self.conn
        loop = asyncio.get_running_loop()
        last_send = -1.0
        try:
            while True:
                limit = self.welcome.limits.max_frame_bytes if self.welcome else 0
                entry = self.core.next_to_send(limit)
                if entry is None:
                    self._notify()  # next_to_send may have rejected oversized frames
                    self._wake.clear()
                    if (entry := self.core.next_to_send(limit)) is None:
                        await self._wake.wait()
                        continue
                # Marked before the await: a frame on its way out must not be evicted as unsent.
                self.core.mark_sent(entry)
                dense = loop.time() - last_send < self.batch_linger
                data = await self._message_from(entry, self._batch_cap(), limit, dense=dense)
                await conn.send(data)
                last_send = loop.time()
                del data, entry
                # websockets' send() does not yield while the socket takes data.
                await asyncio.sleep(0)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            await self._send_failed(conn, exc)

    def _batch_cap(self) -> int:
        """Bytes one batch may carry (0: this bridge takes no batches or batching is off)."""
        limits = self.welcome.limits if self.welcome else None
        if limits is None or limits.max_batch_frames < 2 or self.batch_bytes == 0:
            return 0
        cap = self.batch_bytes
        for bound in (limits.max_frame_bytes, limits.max_telemetry_bytes):
            if bound:
                cap = min(cap, bound - 64)  # room for the batch's own key and length
        return cap

    async def _fill_batch(
        self, entries: list[Entry], cap: int, limit: int, *, linger: bool
    ) -> None:
        """Add frames waiting to be sent to ``entries`` (marked sent), within ``cap`` bytes and
        the Welcome's frame count; waits up to ``batch_linger`` for more when ``linger``."""
        max_frames = self.welcome.limits.max_batch_frames
        total = entries[0].nbytes
        deadline = asyncio.get_running_loop().time() + self.batch_linger
        while len(entries) < max_frames:
            nxt = self.core.next_to_send(limit)
            if nxt is None:
                left = deadline - asyncio.get_running_loop().time()
                if not linger or left <= 0:
                    return
                self._wake.clear()
                if (nxt := self.core.next_to_send(limit)) is None:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wake.wait(), left)
                    continue
            if total + nxt.nbytes > cap:
                return
            self.core.mark_sent(nxt)
            entries.append(nxt)
            total += nxt.nbytes

    async def _send_failed(self, conn: Connection, exc: Exception) -> None:
        log.debug("%s: send failed: %r", self.device_id, exc)
        with contextlib.suppress(Exception):
            await conn.close()  # the receiver sees the end and the loop reconnects

    async def _message_from(self, first: Entry, cap: int, limit: int, *, dense: bool) -> bytes:
        """``first`` (marked sent) alone, or with frames waiting behind it as one batch."""
        if first.nbytes >= cap:
            return first.data
        entries = [first]
        await self._fill_batch(entries, cap, limit, linger=dense)
        if len(entries) == 1:
            return first.data
        self.stats.batches += 1
        return batches.edge_batch([e.data for e in entries])

    async def _send_lanes(self, conn: Connection, lanes: LaneScheduler) -> None:
        """The send loop with lanes: pieces of large frames, higher lanes in between. While the
        socket holds more than ``send_lowat_bytes`` unsent, no piece is written; the loop looks
        again when that much should have drained (or at once when a frame is published)."""
        lanes.reset()
        lowat = self.send_lowat_bytes
        loop = asyncio.get_running_loop()
        last_send = -1.0
        try:
            while True:
                limit = self.welcome.limits.max_frame_bytes if self.welcome else 0
                rate = conn.link_bytes_per_second()
                excess = conn.unsent_bytes() - lowat if lowat else 0
                out = lanes.next(limit, pieces=excess <= 0, link_bytes_per_second=rate)
                if out is None:
                    self._notify()  # next may have rejected oversized frames
                    self._wake.clear()
                    excess = conn.unsent_bytes() - lowat if lowat else 0
                    out = lanes.next(limit, pieces=excess <= 0, link_bytes_per_second=rate)
                    if out is None:
                        poll = None
                        if excess > 0:  # the socket drains without telling us
                            delay = excess / rate if rate else LINK_POLL_SECONDS
                            delay = min(max(delay, LINK_POLL_SECONDS), 0.05)
                            poll = loop.call_later(delay, self._wake.set)
                        await self._wake.wait()
                        if poll is not None:
                            poll.cancel()
                        continue
                data = out.data
                if out.done is not None:
                    # Marked before the await, as in run.
                    self.core.mark_sent(out.done)
                    # Small frames may share a message (never a frame that may go in pieces).
                    cap = self._batch_cap()
                    if lanes.mixed:
                        cap = min(cap, lanes.chunk_bytes + CHUNK_OVERHEAD)
                    if out.whole:
                        dense = loop.time() - last_send < self.batch_linger
                        data = await self._message_from(out.done, cap, limit, dense=dense)
                await conn.send(data)
                last_send = loop.time()
                del data, out
                # websockets' send() does not yield while the socket takes data.
                await asyncio.sleep(0)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            await self._send_failed(conn, exc)
