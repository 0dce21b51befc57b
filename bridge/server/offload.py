"""Large encoded clouds decoded off the event loop, without reordering a stream's frames.

Why: decoding a 100k-point cloud takes 5-15 ms of CPU; on the event loop that delays every
other connection and stream by as much, telemetry included. zstd and numpy release the GIL, so a
worker thread decodes while the loop keeps reading and admitting other streams' frames.

Per connection: at most one decode in flight, and its declared peak memory (output, copies and
scratch: :func:`bridge.protocol.compress.declared`) is granted by the memory budget *before* it
starts, first come first served like received bytes; a later frame of the same stream, or the next
cloud to decode, waits for it, so each stream's frames are admitted in the order they arrived.
Frames of other streams may overtake the cloud being decoded (as with lanes on the uplink). A decode
that is refused adds its declared size to the connection's refused work
(:class:`bridge.server.uplink.RefusedDecodes`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from bridge.logs import log_task_failure
from bridge.protocol.errors import FrameNeverFits, ProtocolError
from bridge.server.governor import Charge
from bridge.server.uplink import Uplink
from bridge.v1 import bridge_pb2 as pb

log = logging.getLogger(__name__)

#: Offer a frame to the core (its charge is transferred to a ring or released there).
Admit = Callable[[pb.Frame, int, Charge, memoryview | None], Awaitable[None]]
#: Report a refused frame to its sender (not fatal).
Refuse = Callable[[ProtocolError], Awaitable[None]]


class OffLoopDecoder:
    """One connection's decoder thread slot and the frame waiting in it."""

    def __init__(self, uplink: Uplink, admit: Admit, refuse: Refuse) -> None:
        self._uplink = uplink
        self._admit = admit
        self._refuse = refuse
        # (stream, decode + admit, the charge transferred to that task)
        self._pending: tuple[str, asyncio.Task[None], Charge] | None = None
        self._dropped: list[tuple[str, asyncio.Task[None], Charge]] = []

    def admit(
        self,
        frame: pb.Frame,
        size: int,
        charge: Charge,
        points: memoryview | None = None,
        encoded: bool = False,
    ) -> Awaitable[None]:
        """Admit ``frame`` (its ``charge`` is transferred on, or released there) when awaited;
        when ``encoded``, decode it in a thread first and return at once, leaving the admission
        in flight (``charge`` transferred to that task). The common case (nothing in flight,
        nothing to decode) is admission's own coroutine, whose block holds the charge from its
        first step: no coroutine of ours per frame. Await the result at once."""
        if self._pending is None and not encoded:
            return self._admit(frame, size, charge, points)
        return self._ordered(frame, size, charge, points, encoded)

    async def _ordered(
        self, frame: pb.Frame, size: int, charge: Charge, points: memoryview | None, encoded: bool
    ) -> None:
        """:meth:`admit` behind the frame in flight, or a decode put in flight."""
        pending = self._pending
        with charge:
            if pending is not None and (encoded or pending[0] == frame.stream_id):
                await self.settle()
            if not encoded:
                await self._admit(frame, size, charge, points)
                return
            mine = charge.transfer()
            task = asyncio.create_task(self._decode_and_admit(frame, size, mine))
            self._pending = (frame.stream_id, task, mine)

    async def settle(self) -> None:
        """Wait until the frame in flight (if any) is admitted or refused."""
        pending, self._pending = self._pending, None
        if pending is not None:
            await pending[1]

    def drop(self) -> None:
        """The connection failed: the frame in flight is not admitted (nor acknowledged: the
        edge resends it); its task releases its charge (:meth:`close` waits for that)."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending[1].cancel()
            pending[1].add_done_callback(
                log_task_failure(log, "decoding a cloud off the event loop")
            )
            self._dropped.append(pending)

    async def close(self) -> None:
        """The connection ended: drop the frame in flight and wait until its task is done; a
        task cancelled before its first step never entered its ``with``: its charge goes here."""
        self.drop()
        dropped, self._dropped = self._dropped, []
        if dropped:
            await asyncio.gather(*(task for _, task, _ in dropped), return_exceptions=True)
        for _, _, charge in dropped:
            if not charge.released:
                charge.release()

    async def _decode_and_admit(self, frame: pb.Frame, size: int, charge: Charge) -> None:
        with charge:
            try:
                size = await self._decode(frame, size, charge)
            except ProtocolError as exc:
                refused = exc
            else:
                await self._admit(frame, size, charge, None)
                return
        await self._refuse(refused)  # after the charge went back: a refusal holds no data

    async def _decode(self, frame: pb.Frame, size: int, charge: Charge) -> int:
        """Grow ``charge`` by the decode's declared peak, decode in a thread, shrink it to the
        decoded frame; its size."""
        uplink = self._uplink
        plan = uplink.plan(frame, admitted=True)
        assert plan is not None  # only frames Uplink.prepare left to us come here
        if not await _grow(charge, plan.peak_bytes):
            # Counted like a failed decode: an edge that keeps sending clouds whose decode can
            # never be granted makes us read, parse and refuse each one (in the container, a
            # flood of 64 KiB messages declaring 16 MiB clouds stalled the good edge 5.5 s and
            # was never closed); past the budget its connection is closed (decode_budget).
            uplink.refusals.refused(plan.decoded_bytes)
            raise FrameNeverFits(
                f"decoding this cloud needs {plan.peak_bytes} bytes; the memory budget "
                f"admits at most {charge.governor.admissible_bytes}",
                frame=pb.Frame(stream_id=frame.stream_id, seq=frame.seq),
            )
        try:
            encoded, decoded = await asyncio.to_thread(uplink.decode_data, frame, plan)
        except ProtocolError:
            uplink.refusals.refused(plan.decoded_bytes)
            raise
        return uplink.settle(size, encoded, decoded, charge)


async def _grow(charge: Charge, nbytes: int) -> bool:
    """Add ``nbytes`` to ``charge`` through admission: waits, first come first served, like
    any received bytes (the connection reads nothing more meanwhile). False when the budget
    can never grant it."""
    governor = charge.governor
    loop = asyncio.get_running_loop()
    granted: asyncio.Future[Charge | None] = loop.create_future()

    def on_grant(got: Charge | None) -> None:
        if granted.cancelled():
            if got is not None:
                got.release()
        else:
            granted.set_result(got)

    request = governor.request(charge.component, nbytes, on_grant, charge.owner)
    if request is None:
        return False
    if isinstance(request, Charge):
        got: Charge | None = request
    else:
        try:
            got = await granted
        except asyncio.CancelledError:
            governor.cancel(request)
            if granted.done() and not granted.cancelled() and (late := granted.result()):
                late.release()  # granted, then cancelled before this task resumed
            raise
    if got is None:
        return False
    if got.tier is charge.tier:
        charge.merge(got)
    else:  # the frame's bytes were forced (not admitted): one charge of the frame's tier
        charge.resize(charge.nbytes + got.nbytes)
        got.release()
    return True
