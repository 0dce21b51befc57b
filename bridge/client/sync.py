"""A blocking facade over :class:`EdgeClient` for code that is not async (a simulator's step
loop, a ROS callback, a script).

Why a loop thread: the client must keep reading acks and flow control while the caller does
something else; a private event loop in a daemon thread does that, and each blocking call is one
``run_coroutine_threadsafe`` into it. Payloads are encoded in the caller's thread, so the caller
may reuse its array as soon as ``publish`` returns.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Sequence
from types import TracebackType
from typing import Any, TypeVar

from bridge.client.client import EdgeClient
from bridge.client.core import EdgeStats, StreamSpec
from bridge.client.payload import Payload, PreparedPayload

T = TypeVar("T")


class SyncEdgeClient:
    """``EdgeClient`` with blocking methods; same arguments (see :class:`EdgeClient`)::

    with SyncEdgeClient("grpc://bridge:9090", device_id="sim-1",
                        streams=[StreamSpec("lidar")]) as edge:
        edge.publish("lidar", points)
        edge.drain(timeout=10)
    """

    def __init__(
        self,
        url: str,
        *,
        device_id: str,
        streams: Sequence[StreamSpec],
        start_timeout: float = 10.0,
        **kw: Any,
    ) -> None:
        """``start_timeout``: how long ``with`` waits for the first Welcome; ``kw`` as for
        :class:`EdgeClient`."""
        self.start_timeout = start_timeout
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name=f"edge-loop-{device_id}", daemon=True
        )
        self._thread.start()
        self._closed = False

        async def make() -> EdgeClient:  # asyncio objects belong to the loop that uses them
            return EdgeClient(url, device_id=device_id, streams=streams, **kw)

        try:
            self.client = self._call(make(), None)
        except BaseException:
            self._stop_loop()
            raise

    def _call(self, coro: Coroutine[Any, Any, T], timeout: float | None) -> T:
        if self._closed:
            coro.close()
            raise RuntimeError("this SyncEdgeClient was closed")
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(timeout)
        except TimeoutError:
            future.cancel()  # a publish that timed out must not happen later after all
            raise

    @property
    def stats(self) -> EdgeStats:
        """The live counters (read them for a snapshot; they change as acks arrive)."""
        return self.client.stats

    @property
    def undelivered(self) -> int:
        return self.client.undelivered

    def __enter__(self) -> SyncEdgeClient:
        try:
            self.start(self.start_timeout)
        except BaseException:
            self.close()  # no loop thread left behind when the bridge cannot be reached
            raise
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def start(self, timeout: float = 10.0) -> None:
        """Connect; return once the bridge welcomed this edge (``ConnectionError`` if not)."""
        self._call(self.client.start(timeout=timeout), None)

    def publish(
        self,
        stream_id: str,
        data: Payload | PreparedPayload,
        *,
        capture_time_ns: int | None = None,
        timeout: float | None = None,
    ) -> int:
        """Buffer one frame (blocking while the stream is paused or the buffer full); its seq.
        ``timeout`` bounds that wait (``TimeoutError``)."""
        prepared = self.client.prepare(stream_id, data)
        return self._call(
            self.client.publish(stream_id, prepared, capture_time_ns=capture_time_ns), timeout
        )

    def drain(self, timeout: float = 30.0) -> None:
        """Block until every published frame is delivered (``DeliveryTimeout`` if not)."""
        self._call(self.client.drain(timeout), None)

    def close(self) -> None:
        """Close the connection and stop the loop thread (idempotent)."""
        if self._closed:
            return
        try:
            self._call(self.client.close(), 10.0)
        finally:
            self._closed = True
            self._stop_loop()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10.0)
        if not self._thread.is_alive():
            self._loop.close()
