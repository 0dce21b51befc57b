"""Processing stage: takes frames off the rings, decimates point clouds in the worker pool and
hands the serialized results back to the core on the event loop.

The decimation itself never runs on the loop. At most ``workers * depth`` frames are in flight,
so a pool resize takes effect within one frame per worker. A frame the kernel refuses is still
delivered (raw, ``backend="passthrough"``) and counted: the sink's seq accounting stays whole.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable

from bridge.decimate import Decimator
from bridge.decimate.into import cloud_parts, decimate_parts, kernel_threads
from bridge.protocol import wire
from bridge.server.governor import Charge, Component, Governor
from bridge.server.ports import Work, WorkItem
from bridge.server.session import KIND_POINT_CLOUD, Stream
from bridge.server.workers import WorkerPool
from bridge.v1 import bridge_pb2 as pb

log = logging.getLogger("bridge.server.processing")

Clock = Callable[[], int]
_CPUS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


# ProcessedFrame.point_cloud's key, from the descriptor: a passthrough cloud is spliced in as is.
_POINT_CLOUD_KEY = wire.field_key(pb.ProcessedFrame.DESCRIPTOR, "point_cloud")
SCRATCH_BYTES_PER_POINT = 16  # the kernel's packed key + index per input point (native/README)


def decimation_bytes(item: WorkItem) -> int:
    """What decimating ``item`` may hold besides its ring entry: output (at most the input's
    size) plus the kernel's scratch. Charged (forced) while a worker has it."""
    return item.entry.size + SCRATCH_BYTES_PER_POINT * item.points


def needs_worker(item: WorkItem, decimator: Decimator | None) -> bool:
    """Only decimation is heavy; passthrough and telemetry are cheap enough for the loop."""
    return decimator is not None and item.layout is not None and not item.stream.config.passthrough


def process_frame(
    item: WorkItem, decimator: Decimator | None, clock: Clock = time.time_ns, threads: int = 1
) -> tuple[bytes | tuple[wire.Part, ...], float, str | None]:
    """Build the serialized ProcessedFrame core for ``item`` (no bridge_seq, no gap).

    Returns (bytes or parts to join, decimation seconds, error text or None). A passthrough
    cloud is spliced in as its own serialized part rather than copied into a new message.
    """
    frame = item.frame
    stream = item.stream
    out = pb.ProcessedFrame(
        stream_id=stream.stream_id,
        seq=frame.seq,
        device_id=stream.device_id,
        capture_time_ns=frame.capture_time_ns,
        ingest_time_ns=item.entry.ingest_ns,
    )
    if frame.WhichOneof("payload") == "telemetry":
        out.telemetry.CopyFrom(frame.telemetry)
        out.processed_time_ns = clock()
        return out.SerializeToString(), 0.0, None
    cloud = frame.point_cloud
    info = out.decimation
    info.input_points = item.points
    error = None
    if needs_worker(item, decimator):
        assert decimator is not None and item.layout is not None
        t0 = time.perf_counter()
        try:
            encoded = decimate_parts(
                decimator,
                item.layout,
                cloud,
                out,
                stream.config.voxel_size,
                stream.config.max_points,
                threads,
                clock,
                item.data,
            )
        except ValueError as exc:  # e.g. voxel keys overflow int64 for this voxel size
            error = str(exc)
        else:
            return encoded, time.perf_counter() - t0, None
    info.output_points, info.backend = item.points, "passthrough"
    out.processed_time_ns = clock()
    if item.data is not None:  # spliced around the data already read out: no copy here
        return cloud_parts(out, cloud, item.data), 0.0, error
    raw_cloud = cloud.SerializeToString()
    return (
        (out.SerializeToString(), wire.length_prefix(_POINT_CLOUD_KEY, len(raw_cloud)), raw_cloud),
        0.0,
        error,
    )


class Processor:
    """Feeds the worker pool from the core and completes work back on the loop."""

    def __init__(
        self,
        core: Work,
        pool: WorkerPool,
        decimator: Decimator | None,
        *,
        depth: int = 2,
        on_done: Callable[[WorkItem, float, str | None], None] | None = None,
        governor: Governor | None = None,
    ) -> None:
        self.governor = governor
        self._charges: dict[int, Charge] = {}  # id(item) -> its decimation charge
        self.core = core
        self.pool = pool
        self.decimator = decimator
        self.depth = depth
        self._on_done = on_done
        self._in_flight = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._scheduled = False

    def set_decimator(self, decimator: Decimator | None) -> None:
        """Swap the backend live (GPU unhealthy -> CPU); frames in flight finish as they were."""
        self.decimator = decimator

    def notify(self) -> None:
        """There is new work (or room for more): dispatch it soon, on a later loop callback.

        The core calls this from inside ``offer``; processing right there would re-enter the
        core (``take_work``/``complete``) and run fan-out and pushes on the ingest coroutine's
        stack. One scheduled dispatch serves any number of notifications before it runs.
        """
        if self._scheduled:
            return
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        self._scheduled = True
        self._loop.call_soon(self._dispatch)

    def _dispatch(self) -> None:
        self._scheduled = False
        self._fill()

    def _fill(self) -> None:
        """Dispatch as much work as the in-flight bound allows (on the loop, never from inside
        a core call)."""
        limit = self.pool.size * self.depth
        while self._in_flight < limit:
            item = self.core.take_work()
            if item is None:
                break
            if not needs_worker(item, self.decimator):
                self._process_inline(item)
                continue
            threads = kernel_threads(self.pool.size, self._in_flight, _CPUS)
            self._in_flight += 1
            if self.governor is not None:
                self._charges[id(item)] = self.governor.force(
                    Component.DECIMATION, decimation_bytes(item)
                )
            self.pool.submit(self._task(item, self.decimator, threads))

        # Every worker busy: cheap streams (telemetry, passthrough) still go on, so a stream of
        # costly clouds never delays another device's small frames.
        while (item := self.core.take_work(self._cheap_stream)) is not None:
            self._process_inline(item)

    def _cheap_stream(self, stream: Stream) -> bool:
        return (
            self.decimator is None
            or stream.config.passthrough
            or stream.config.kind != KIND_POINT_CLOUD
        )

    def _process_inline(self, item: WorkItem) -> None:
        """Cheap: no thread hop (queue, wake-up, GIL hand-off, call_soon_threadsafe)."""
        result, _, error = process_frame(item, None)
        self.core.complete(item, result)
        if self._on_done is not None:
            self._on_done(item, 0.0, error)

    def _task(
        self, item: WorkItem, decimator: Decimator | None, threads: int = 1
    ) -> Callable[[], None]:
        loop = self._loop or asyncio.get_running_loop()
        assert loop is not None

        def run() -> None:
            result: tuple[bytes | tuple[wire.Part, ...], float, str | None]
            try:
                result = process_frame(item, decimator, threads=threads)
            except Exception as exc:  # never lose the frame silently: report on the loop
                log.exception("processing stream %s seq %s failed", item.stream.key, item.frame.seq)
                result = (b"", 0.0, f"internal: {exc}")
            loop.call_soon_threadsafe(self._finish, item, result)

        return run

    def _finish(
        self, item: WorkItem, result: tuple[bytes | tuple[wire.Part, ...], float, str | None]
    ) -> None:
        self._in_flight -= 1
        charge = self._charges.pop(id(item), None)
        data, spent, error = result
        if not data:  # internal failure: deliver the raw frame so seq accounting stays whole
            data, spent, _ = process_frame(item, None)
        self.core.complete(item, data)  # the ring now charges the result...
        if charge is not None:
            charge.release()  # ...so the worker's charge for it goes only now, never before
        if self._on_done is not None:
            self._on_done(item, spent, error)
        self._fill()  # a loop callback of its own, not inside a core call
