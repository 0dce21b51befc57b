"""One connection's way into the rings, and the flow control that goes with it.

A frame is offered to its stream's ring. When the ring is full (``backpressure``) the edge gets
``FlowControl PAUSE`` for that stream and the frame waits on its own task, so the connection
keeps being read and the edge's other streams (its telemetry) keep flowing. At most one frame
waits per stream: a second frame of that stream waits for the first, which keeps a stream's
order and stops reading a connection whose edge ignores PAUSE (the transport's own flow control
then holds it). RESUME follows once the ring drained to its low watermark. The same happens
session-wide while the transport waits for the memory governor to grant the next message.
Each frame's charge is transferred to its ring on acceptance (or to the task that parks it), or
released here when the ``with`` block that holds it ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from bridge.server.governor import Charge
from bridge.server.metrics import BridgeMetrics
from bridge.server.ports import IngestCore, Offer, SpaceEvents
from bridge.server.session import Session
from bridge.v1 import bridge_pb2 as pb

log = logging.getLogger("bridge.server.ingest")

Send = Callable[[pb.BridgeMessage], Awaitable[None]]


class Admission:
    """Offers one session's frames and sends its PAUSE/RESUME messages."""

    def __init__(
        self,
        core: IngestCore,
        edges: SpaceEvents,
        session: Session,
        metrics: BridgeMetrics,
        send: Send,
    ) -> None:
        self._core = core
        self._edges = edges
        self._session = session
        self._metrics = metrics
        self._send = send
        self.last_size = 0  # the last message's bytes: the session low watermark's unit
        self._parked: dict[str, asyncio.Future[None]] = {}  # stream -> taken (or given up)
        # Each parked frame's task and the charge transferred to it (released at close if the
        # task was cancelled before it ran: its ``with`` block never started).
        self._park_tasks: dict[asyncio.Task[None], Charge] = {}
        self._paused: set[str] = set()  # streams sent PAUSE and not yet RESUME
        self._flow_want = False  # session-wide PAUSE wanted (a receive grant is waiting)
        self._flow_sent = False
        self._flow_task: asyncio.Future[None] | None = None

    async def admit(
        self, frame: pb.Frame, size: int, charge: Charge, points: memoryview | None = None
    ) -> None:
        """Offer once; a full ring parks the frame on its own task (``charge`` is transferred
        to it) and the caller goes on reading. Otherwise (accepted, a duplicate, an error,
        cancelled) ``charge`` is transferred to the ring or released here."""
        stream_id = frame.stream_id
        with charge:
            parked = self._parked.get(stream_id)
            if parked is not None:  # order within a stream: after the frame already waiting
                await asyncio.wait({parked})
            if self._offer(frame, size, charge, points) is Offer.FULL:
                await self._pause(stream_id)
                if self._edges.draining:
                    return  # not accepted, not acked: the edge resends it after reconnecting
                self._park(frame, size, charge.transfer(), points)

    def on_grant_wait(self, waiting: bool) -> None:
        """Reading stopped for a memory grant: tell the whole session to pause (and resume).
        Then let ``drop_oldest`` streams give way first: they chose losing old frames over
        stalling (this may grant at once, and then RESUME follows the PAUSE)."""
        if waiting:
            self._metrics.backpressure.inc()
        self._flow_want = waiting
        if self._flow_task is None:
            # One sender, whatever the edge reads: a peer that never reads blocks it, and
            # flips in between only update what it sends next (bounded, in order).
            self._flow_task = asyncio.ensure_future(self._flow_sender())
        if waiting:
            self._core.reclaim_for_waiters()

    async def close(self) -> None:
        """The connection ended: parked frames are given up (their charges released; the edge
        resends them), no more flow control is sent."""
        if self._flow_task is not None:
            self._flow_task.cancel()
        parked = list(self._park_tasks.items())
        for task, _ in parked:
            task.cancel()
        if parked:
            await asyncio.gather(*(task for task, _ in parked), return_exceptions=True)
        for _, charge in parked:
            if not charge.released:  # cancelled before its first step: never entered its with
                charge.release()

    # -- offers ------------------------------------------------------------------------------
    def _offer(
        self, frame: pb.Frame, size: int, charge: Charge, points: memoryview | None
    ) -> Offer:
        """Offer the frame; ACCEPTED transfers ``charge`` to its ring."""
        outcome = self._core.offer(self._session, frame, size, time.time_ns(), charge, points)
        if outcome is Offer.ACCEPTED:
            self._metrics.frames_accepted.inc()
        elif outcome is Offer.DUPLICATE:
            self._metrics.frames_duplicate.inc()
        return outcome

    def _park(self, frame: pb.Frame, size: int, charge: Charge, points: memoryview | None) -> None:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._parked[frame.stream_id] = done
        task = asyncio.create_task(self._parked_frame(frame, size, charge, points, done))
        self._park_tasks[task] = charge
        task.add_done_callback(self._park_done)

    def _park_done(self, task: asyncio.Task[None]) -> None:
        self._park_tasks.pop(task, None)
        exc = None if task.cancelled() else task.exception()
        if exc is not None and not isinstance(exc, ConnectionError):
            log.error("parked frame failed: %r", exc)

    async def _parked_frame(
        self,
        frame: pb.Frame,
        size: int,
        charge: Charge,
        points: memoryview | None,
        done: asyncio.Future[None],
    ) -> None:
        """Wait for room and offer until the ring takes the frame; the last one parked on a
        paused stream then sends its RESUME once the ring drained to its low watermark."""
        stream_id = frame.stream_id
        try:
            with charge:  # the ring's once taken; released if the wait ends otherwise
                await self._offer_until_taken(frame, size, charge, points)
        finally:
            # The frame's bytes now live exactly as long as their charge (the ring's, or
            # none): this task may wait a long time for the low watermark below, and an edge
            # that ignores PAUSE keeps a frame parked per stream, so holding them here kept
            # frames the sink had acknowledged resident and uncharged (issue 29).
            del frame, points, charge
            if self._parked.get(stream_id) is done:
                del self._parked[stream_id]
            if not done.done():
                done.set_result(None)
        if stream_id in self._parked or stream_id not in self._paused:
            return  # a newer parked frame of this stream sends the RESUME
        # Hysteresis: RESUME only once the ring drained to its low watermark.
        if not await self._until_resume_ready(stream_id, size) or stream_id in self._parked:
            return
        self._paused.discard(stream_id)
        with contextlib.suppress(ConnectionError):
            await self._send(
                pb.BridgeMessage(
                    flow_control=pb.FlowControl(action=pb.FlowControl.RESUME, stream_id=stream_id)
                )
            )

    async def _offer_until_taken(
        self,
        frame: pb.Frame,
        size: int,
        charge: Charge,
        points: memoryview | None,
    ) -> None:
        await self._until(
            frame.stream_id, lambda: self._offer(frame, size, charge, points) is not Offer.FULL
        )

    async def _until(self, stream_id: str, done: Callable[[], bool]) -> bool:
        """Check ``done`` each time the stream's ring frees space, until it holds (True) or the
        bridge drains (False). The event is cleared before each check: a wake-up between the
        check and the wait is not lost."""
        if done():
            return True
        space = self._edges.space_event((self._session.device_id, stream_id))
        while True:
            space.clear()
            if done():
                return True
            await space.wait()
            if self._edges.draining:
                return False

    # -- flow control ------------------------------------------------------------------------
    async def _pause(self, stream_id: str) -> None:
        """PAUSE the stream once (until its RESUME), counted as backpressure."""
        if stream_id in self._paused:
            return
        self._paused.add(stream_id)
        self._metrics.backpressure.inc()
        await self._send(
            pb.BridgeMessage(
                flow_control=pb.FlowControl(action=pb.FlowControl.PAUSE, stream_id=stream_id)
            )
        )

    async def _flow_sender(self) -> None:
        try:
            while self._flow_want != self._flow_sent:
                want = self._flow_want
                if not want:
                    # Hysteresis: a grant right after a wait means room for one message; a
                    # RESUME then would bring a PAUSE back after the next one. Wait until the
                    # session's rings drained to their low watermark.
                    await self._until_session_drained()
                    if self._flow_want:
                        continue
                action = pb.FlowControl.PAUSE if want else pb.FlowControl.RESUME
                msg = pb.BridgeMessage(flow_control=pb.FlowControl(action=action))
                with contextlib.suppress(ConnectionError):
                    await self._send(msg)
                self._flow_sent = want
        finally:
            self._flow_task = None

    async def _until_session_drained(self) -> None:
        for stream_id in list(self._session.streams):
            if not await self._until_resume_ready(stream_id, self.last_size):
                return

    async def _until_resume_ready(self, stream_id: str, size: int) -> bool:
        """Wait until the paused stream's ring is down to its low watermark (False: draining)."""
        return await self._until(
            stream_id, lambda: self._core.resume_ready(self._session, stream_id, size)
        )
