"""The load generator's edges: the SDK client (:mod:`bridge.client`) with load-test conventions,
and an open-loop publisher.

Why a layer at all: load runs want what a product edge does not. Publishing is open loop (a frame
is buffered on schedule even while the bridge pauses, so a stall shows up as latency instead of a
slower schedule; no coordinated omission), every delivery is sampled for latency, and reports
keep their historical keys (``acked_delivered``, ``dropped_resend_overflow``). The protocol itself
(resend buffer, resume, PAUSE/RESUME, Drain, TLS) is the SDK's: there is no second client.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from bridge.client import EdgeClient as SdkEdgeClient
from bridge.client import EdgeStats as SdkEdgeStats
from bridge.client import PreparedPayload, StreamSpec
from bridge.client.client import DEFAULT_MAX_MESSAGE_BYTES, cancel_and_wait
from bridge.client.payload import encode_frame
from bridge.client.transport import Transport
from loadgen.clouds import synthetic
from loadgen.record import latency_summary

__all__ = [
    "DEFAULT_MAX_MESSAGE_BYTES",
    "EdgeClient",
    "EdgeStats",
    "LoadStats",
    "PreparedPayload",
    "Publisher",
    "StreamConfig",
    "Transport",
    "cancel_and_wait",
    "encode_frame",
]

#: The load generator's historical name for the SDK's stream declaration.
StreamConfig = StreamSpec
#: Latency samples kept per client (a long run keeps the first ones; the sink keeps a reservoir).
MAX_LATENCY_SAMPLES = 1_000_000
_SUMMED = (
    "published",
    "sent",
    "resent",
    "accepted",
    "delivered",
    "dropped",
    "rejected",
    "disconnects",
    "reconnects",
    "connect_failures",
    "drains",
    "pauses",
)


@dataclass
class LoadStats(SdkEdgeStats):
    """The SDK's counters plus latency samples (delivery time minus scheduled capture time)."""

    latency_ns: list[int] = field(default_factory=list)
    #: Wall-clock time of each delivery ack (for the longest stall across edges and processes).
    delivered_at_ns: list[int] = field(default_factory=list)

    def sample(self, stream_id: str, seq: int, capture_time_ns: int, now_ns: int) -> None:
        if len(self.latency_ns) < MAX_LATENCY_SAMPLES:
            self.latency_ns.append(now_ns - capture_time_ns)
            self.delivered_at_ns.append(now_ns)

    @property
    def acked_accepted(self) -> int:
        return self.accepted

    @property
    def acked_delivered(self) -> int:
        return self.delivered

    @property
    def dropped_resend_overflow(self) -> int:
        return self.dropped

    def add(self, other: SdkEdgeStats) -> None:
        for k in _SUMMED:
            setattr(self, k, getattr(self, k) + getattr(other, k))
        self.errors.update(other.errors)
        self.close_reasons.update(other.close_reasons)
        if isinstance(other, LoadStats):
            self.latency_ns.extend(other.latency_ns)
            self.delivered_at_ns.extend(other.delivered_at_ns)

    def as_dict(self) -> dict[str, Any]:
        """The report's keys (stable across the SDK move)."""
        d = {k: getattr(self, k) for k in _SUMMED}
        d["acked_accepted"] = d.pop("accepted")
        d["acked_delivered"] = d.pop("delivered")
        d["dropped_resend_overflow"] = d.pop("dropped")
        d["errors"] = dict(self.errors)
        d["close_reasons"] = dict(self.close_reasons)
        d["latency"] = latency_summary(self.latency_ns)
        return d


#: The load generator's historical name for its counters (the SDK's plus latency samples).
EdgeStats = LoadStats


def bridge_url(transport: Transport, url: str) -> str:
    """An SDK URL from the load generator's (transport, url) pair: gRPC targets are host:port."""
    if transport not in ("ws", "grpc"):
        raise ValueError(f"transport must be 'ws' or 'grpc', got {transport!r}")
    if transport == "grpc" and "://" not in url:
        return f"grpc://{url}"
    return url


class EdgeClient(SdkEdgeClient):
    """The SDK client as load runs use it: ``(transport, url, device_id, streams)``, open-loop
    ``publish`` (never waits; a full resend buffer evicts its oldest frame and counts it) and
    latency samples in ``stats.latency_ns``."""

    stats: LoadStats

    def __init__(
        self,
        transport: Transport,
        url: str,
        device_id: str,
        streams: Sequence[StreamSpec],
        *,
        resend_buffer_bytes: int = 256 * 1024 * 1024,
        resend_buffer_frames: int = 10_000,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        open_timeout: float = 10.0,
        welcome_timeout: float = 10.0,
        auth_token: str = "",
        seed: int | None = None,
    ) -> None:
        stats = LoadStats()
        super().__init__(
            bridge_url(transport, url),
            device_id=device_id,
            streams=streams,
            token=auth_token,
            resend_buffer_bytes=resend_buffer_bytes,
            resend_buffer_frames=resend_buffer_frames,
            max_message_bytes=max_message_bytes,
            connect_timeout=open_timeout,
            welcome_timeout=welcome_timeout,
            wait_for_room=False,
            stats=stats,
            on_delivered=stats.sample,
            seed=seed,
        )


# ---------------------------------------------------------------------------------------------
# Open-loop publisher


class Publisher:
    """K edges, S point-cloud streams each (plus one telemetry stream), at ``rate_hz`` per stream.

    Each edge runs its own schedule (staggered across one period so K edges do not burst
    together). A tick that is late is still published at once with its *scheduled* capture time.
    """

    def __init__(
        self,
        transport: Transport,
        url: str,
        *,
        edges: int = 1,
        streams_per_edge: int = 1,
        rate_hz: float = 10.0,
        duration_s: float = 5.0,
        points: int = 10_000,
        telemetry: bool = False,
        voxel_size: float = 0.0,
        color: bool = False,
        device_prefix: str = "loadgen",
        seed: int = 0,
        resend_buffer_bytes: int = 256 * 1024 * 1024,
        resend_buffer_frames: int = 10_000,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        drain_timeout_s: float = 10.0,
        connect_timeout_s: float = 10.0,
        auth_token: str = "",
        first_edge: int = 0,
        total_edges: int = 0,
        start_at_ns: int = 0,
    ) -> None:
        if edges < 1 or streams_per_edge < 0 or rate_hz <= 0 or duration_s < 0:
            raise ValueError("edges >= 1, streams_per_edge >= 0, rate_hz > 0, duration_s >= 0")
        if streams_per_edge == 0 and not telemetry:
            raise ValueError("nothing to publish: no point-cloud streams and no telemetry")
        self.rate_hz = rate_hz
        self.duration_s = duration_s
        self.drain_timeout_s = drain_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.telemetry = telemetry
        self.cloud_streams = [f"lidar{i}" for i in range(streams_per_edge)]
        specs = [StreamConfig(s, voxel_size=voxel_size) for s in self.cloud_streams]
        if telemetry:
            specs.append(StreamConfig("telemetry", kind="telemetry"))
        self.clients = [
            EdgeClient(
                transport,
                url,
                f"{device_prefix}-{first_edge + i}",
                specs,
                resend_buffer_bytes=resend_buffer_bytes,
                resend_buffer_frames=resend_buffer_frames,
                max_message_bytes=max_message_bytes,
                auth_token=auth_token,
                seed=seed + first_edge + i,
            )
            for i in range(edges)
        ]
        self.first_edge = first_edge
        self.total_edges = max(total_edges, first_edge + edges)  # for the stagger
        self.start_at_ns = start_at_ns  # wall clock; 0 = as soon as every edge is connected
        # A few distinct clouds shared by all streams: realistic content, bounded memory.
        self.clouds = [
            PreparedPayload.of(synthetic(points, seed + k, color=color).to_proto())
            for k in range(4)
        ]
        self.late_ticks = 0
        self.ticks = 0
        self.max_lag_s = 0.0
        self.elapsed_s = 0.0
        self.window_ns = (0, 0)  # wall clock: when publishing started and ended
        self.cpu_s = 0.0  # this process's CPU while publishing (the generator's own cost)

    async def run(self) -> dict[str, Any]:
        """Connect all edges, publish for ``duration_s``, wait for delivery, close; report."""
        try:
            await asyncio.gather(*(c.start(timeout=self.connect_timeout_s) for c in self.clients))
        except BaseException:
            await asyncio.gather(*(c.close() for c in self.clients))
            raise
        loop = asyncio.get_running_loop()
        # One instant read on both clocks: schedule on the monotonic one, stamp with wall time.
        # Publishers in several processes share ``start_at_ns``, so their schedules line up.
        delay_ns = max(50_000_000, self.start_at_ns - time.time_ns())
        t0_mono, t0_wall = loop.time() + delay_ns / 1e9, time.time_ns() + delay_ns
        period = 1.0 / self.rate_hz
        n = self.total_edges
        cpu0 = time.process_time()
        try:
            await asyncio.gather(
                *(
                    self._drive(c, t0_mono, t0_wall, (self.first_edge + i) * period / n, i)
                    for i, c in enumerate(self.clients)
                )
            )
            self.elapsed_s = loop.time() - t0_mono
            self.window_ns = (t0_wall, t0_wall + int(self.elapsed_s * 1e9))
            self.cpu_s = time.process_time() - cpu0
            await asyncio.gather(*(c.wait_delivered(self.drain_timeout_s) for c in self.clients))
        finally:
            await asyncio.gather(*(c.close() for c in self.clients))
        return self.report()

    async def _drive(
        self, client: EdgeClient, t0_mono: float, t0_wall: int, stagger_s: float, index: int
    ) -> None:
        loop = asyncio.get_running_loop()
        period = 1.0 / self.rate_hz
        for tick in range(int(self.duration_s * self.rate_hz)):
            due = t0_mono + stagger_s + tick * period
            lag = loop.time() - due
            if lag < 0:
                await asyncio.sleep(-lag)
            elif lag > period:
                self.late_ticks += 1
            self.ticks += 1
            self.max_lag_s = max(self.max_lag_s, lag)
            scheduled_ns = t0_wall + int((due - t0_mono) * 1e9)
            for k, sid in enumerate(self.cloud_streams):
                cloud = self.clouds[(tick + k + index) % len(self.clouds)]
                await client.publish(sid, cloud, capture_time_ns=scheduled_ns)
            if self.telemetry:
                values = {"tick": float(tick), "speed_mps": 5.0 + (tick % 10) / 10.0}
                await client.publish("telemetry", values, capture_time_ns=scheduled_ns)

    def report(self) -> dict[str, Any]:
        total = LoadStats()
        buffered = 0
        for c in self.clients:
            total.add(c.stats)
            buffered += c.core.buffered_frames
        out = total.as_dict()
        out.update(
            edges=len(self.clients),
            streams_per_edge=len(self.cloud_streams) + self.telemetry,
            rate_hz=self.rate_hz,
            duration_s=self.duration_s,
            elapsed_s=round(self.elapsed_s, 3),
            publish_rate_hz=round(total.published / self.elapsed_s, 1) if self.elapsed_s else 0,
            undelivered=buffered,
            late_ticks=self.late_ticks,
            max_schedule_lag_ms=round(max(0.0, self.max_lag_s) * 1e3, 3),
            schedule_lagged=schedule_lagged(self.late_ticks, self.ticks),
            generator_cpu_pct=round(100 * self.cpu_s / self.elapsed_s, 1) if self.elapsed_s else 0,
            longest_stall_ms=round(longest_stall_s(total.delivered_at_ns, *self.window_ns) * 1e3),
        )
        return out


def schedule_lagged(late_ticks: int, ticks: int) -> bool:
    """Whether the generator itself fell behind (over 1 % of its ticks a period late): then the
    run measured the generator, not the bridge, and its report says so."""
    return ticks > 0 and late_ticks > 0.01 * ticks


def longest_stall_s(delivered_at_ns: Sequence[int], start_ns: int, end_ns: int) -> float:
    """The longest time without a single delivery while publishing (``start_ns``..``end_ns``,
    wall clock): with work offered all along, any long gap is the bridge (or the generator)
    standing still."""
    if end_ns <= start_ns:
        return 0.0
    inside = sorted(t for t in delivered_at_ns if start_ns <= t <= end_ns)
    marks = [start_ns, *inside, end_ns]
    return max(b - a for a, b in itertools.pairwise(marks)) / 1e9
