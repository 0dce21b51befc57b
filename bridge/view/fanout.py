"""Fan-out towards viewers through bounded queues that drop instead of waiting.

Why: acknowledgements to the bridge must never wait for a viewer (a browser on a slow link, a
Foxglove client that stopped reading). The MCAP record is written before the ack and never
drops; everything live gets a :class:`DroppingQueue`: when full, the oldest item is dropped and
counted, so a viewer always catches up to the newest frames and the status panel and the
``/<device>/<stream>/gaps`` topic say what it missed.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from bridge.v1 import bridge_pb2 as pb
from bridge.view.convert import OutMessage

log = logging.getLogger("bridge.view.fanout")

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Delivery:
    """One new frame, as the viewers get it after it was recorded and acknowledged."""

    frame: pb.ProcessedFrame
    messages: list[OutMessage]
    received_ns: int


class DroppingQueue(Generic[T]):
    """A bounded FIFO whose ``put`` never blocks: when full it drops the oldest item."""

    def __init__(self, maxsize: int, on_drop: Callable[[T], None] | None = None) -> None:
        if maxsize < 1:
            raise ValueError("maxsize must be >= 1")
        self._items: deque[T] = deque()
        self._maxsize = maxsize
        self._on_drop = on_drop
        self._ready = asyncio.Event()
        self.dropped = 0

    def __len__(self) -> int:
        return len(self._items)

    def put(self, item: T) -> None:
        if len(self._items) >= self._maxsize:
            old = self._items.popleft()
            self.dropped += 1
            if self._on_drop is not None:
                self._on_drop(old)
        self._items.append(item)
        self._ready.set()

    async def get(self) -> T:
        while not self._items:
            self._ready.clear()
            await self._ready.wait()
        return self._items.popleft()


class Outlet(Protocol):
    """A live consumer of deliveries; ``offer`` must return at once."""

    def offer(self, delivery: Delivery) -> None: ...


class Fanout:
    def __init__(self) -> None:
        self.outlets: list[Outlet] = []

    def add(self, outlet: Outlet) -> None:
        self.outlets.append(outlet)

    def offer(self, delivery: Delivery) -> None:
        for outlet in self.outlets:
            try:
                outlet.offer(delivery)
            except Exception:  # one broken viewer must not stop acks or the others
                log.exception("viewer outlet %r failed", outlet)
