"""Subscribe in a pod: one viewer's frames from the pod's other processes (docs/protocol.md §11).

The kernel hands a viewer's ``Subscribe`` call to one process of the pod; the devices are spread
over all of them. That process serves its own devices as always and, for the viewer, follows
every sibling with an internal ``Subscribe`` call on the sibling's private listener. The call
carries the pod secret (metadata :data:`POD_SECRET_METADATA`), which makes the sibling serve its
LOCAL devices only (no call is ever relayed twice), and the viewer's ``stream_ids`` and
``queue_frames``. Each relayed frame goes through the same rule as a local one
(:meth:`bridge.server.subscribers.SubscriberSet.relay`): queued and charged to the governor when
the viewer's queue has room, else skipped and announced as a ``slow_subscriber`` gap. A slow
viewer therefore never makes a sibling buffer for it beyond its own queue there.

One reader task per sibling: a sibling that is slow, gone or restarting stalls only its own
frames. A failed or ended call is dialled again after a back-off (0.1 s doubling to 2 s, reset
once a call delivered a frame or lasted that long). The sibling list is read every second, so a
re-plan (a process added, retired or restarted on a new port) is followed within a second.

What a call may buffer unread is bounded: the HTTP/2 window is fixed (no BDP probing) at
``grpc_window_bytes`` and charged to the governor while the call is open, as the ingest
calls' windows are; a message is at most ``max_frame_bytes`` + 64 KiB and is queued or dropped
as soon as it is read.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Protocol

import grpc

from bridge.server.governor import Component, Governor
from bridge.server.ports import Subscriptions
from bridge.server.subscribers import Subscriber
from bridge.v1 import bridge_pb2 as pb

log = logging.getLogger("bridge.podfeed")

#: The metadata key of an internal call. Not for clients: a call that carries it is checked
#: against the pod secret only, and refused ``UNAUTHENTICATED`` without the right one.
POD_SECRET_METADATA = "x-simbridge-pod-secret"
SUBSCRIBE_METHOD = "/bridge.v1.Visualization/Subscribe"

POLL_SECONDS = 1.0
BACKOFF_FIRST_SECONDS = 0.1
BACKOFF_MAX_SECONDS = 2.0


class SiblingSource(Protocol):
    """The pod as a viewer's process sees it (``bridge.server.podlink`` in a worker)."""

    @property
    def secret(self) -> str: ...

    def siblings(self) -> list[str]:
        """host:port of the other processes' private gRPC listeners, now."""
        ...


class PodSubscriptions(Subscriptions, Protocol):
    """The viewer set, with the rule for a frame another process serialized."""

    @property
    def governor(self) -> Governor: ...

    def relay(self, sub: Subscriber, data: bytes) -> bool: ...


class StaticSiblings:
    """A fixed sibling list (tests, and a pod whose plan does not change); ``addresses`` may be
    replaced at any time."""

    def __init__(self, addresses: list[str], secret: str) -> None:
        self.addresses = list(addresses)
        self.secret = secret

    def siblings(self) -> list[str]:
        return list(self.addresses)


class PodFeed:
    """Relays every sibling's frames for one viewer into that viewer's queue, until closed."""

    def __init__(
        self,
        source: SiblingSource,
        sub: Subscriber,
        subscriptions: PodSubscriptions,
        request: pb.SubscribeRequest,
        *,
        window_bytes: int,
        max_message_bytes: int,
        on_dropped: Callable[[int], None],
        poll_seconds: float = POLL_SECONDS,
    ) -> None:
        self._source = source
        self._sub = sub
        self._subscriptions = subscriptions
        self._request = pb.SubscribeRequest(
            stream_ids=request.stream_ids, queue_frames=request.queue_frames
        ).SerializeToString()  # live only: a sibling's bridge_seq is not this process's
        self._window_bytes = window_bytes
        self._options = [
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.http2.bdp_probe", 0),
            ("grpc.http2.lookahead_bytes", window_bytes),
        ]
        self._on_dropped = on_dropped
        self._poll_seconds = poll_seconds
        self._closed = False
        self._task: asyncio.Task[None] | None = None
        self._readers: dict[str, asyncio.Task[None]] = {}
        self._ending: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        self._task = asyncio.create_task(self._follow_plan(), name="pod-feed")

    async def close(self) -> None:
        """Stop relaying now (nothing more is queued after this returns to the loop), then wait
        for the calls to end and their windows to be given back."""
        self._closed = True
        tasks = [*self._readers.values(), *self._ending]
        if self._task is not None:
            tasks.append(self._task)
        for task in tasks:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _follow_plan(self) -> None:
        while not self._closed:
            try:
                wanted = set(self._source.siblings())
            except Exception:  # the pod link is another module's: keep the last list
                log.exception("reading the pod's siblings failed; keeping the last list")
                wanted = set(self._readers)
            for address in self._readers.keys() - wanted:
                task = self._readers.pop(address)
                task.cancel()
                self._ending.add(task)
                task.add_done_callback(self._ending.discard)
            for address in wanted - self._readers.keys():
                self._readers[address] = asyncio.create_task(
                    self._follow(address), name=f"pod-feed {address}"
                )
            await asyncio.sleep(self._poll_seconds)

    async def _follow(self, address: str) -> None:
        """Keep one call open to ``address``, dialling again after a back-off when it ends."""
        loop = asyncio.get_running_loop()
        delay = BACKOFF_FIRST_SECONDS
        failing = False
        while not self._closed:
            began = loop.time()
            frames = 0
            try:
                frames = await self._relay(address)
                why = "ended"
            except grpc.aio.AioRpcError as exc:
                why = f"{exc.code().name}: {exc.details()}"
            except (ValueError, _NoWindow) as exc:
                why = str(exc)
            if frames or loop.time() - began >= BACKOFF_MAX_SECONDS:
                delay, failing = BACKOFF_FIRST_SECONDS, False
            if not failing:  # one line per outage, not one per attempt
                log.warning("pod sibling %s: call %s; dialling again with back-off", address, why)
                failing = True
            await asyncio.sleep(delay)
            delay = min(2 * delay, BACKOFF_MAX_SECONDS)

    async def _relay(self, address: str) -> int:
        """One internal call: relays its frames until it ends; returns how many it relayed."""
        window = self._subscriptions.governor.try_charge(
            Component.TRANSPORT, self._window_bytes, pinned=True
        )
        if window is None:
            raise _NoWindow(f"no memory for a {self._window_bytes}-byte receive window")
        frames = 0
        with window:
            channel = grpc.aio.insecure_channel(address, options=self._options)
            try:
                call = channel.unary_stream(SUBSCRIBE_METHOD)(
                    self._request, metadata=((POD_SECRET_METADATA, self._source.secret),)
                )
                async for data in call:
                    if self._closed:
                        break
                    frames += 1
                    if not self._subscriptions.relay(self._sub, data):
                        self._on_dropped(1)
            finally:
                await channel.close()
        return frames


class _NoWindow(Exception):
    """The governor has no room for a call's receive window now: try again later."""
