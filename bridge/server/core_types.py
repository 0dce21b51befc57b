"""The core's vocabulary: what adapters declare to :class:`~bridge.server.core.BridgeCore` (its
config, each stream's spec), what it hands back (offer outcomes, attachments, work items) and
how it tells them about changes (:class:`Listener`).

Kept apart from the core's rules so adapters and ports can name these types without the core's
machinery; pure like the core (no sockets, clocks, threads or files).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Protocol

from bridge.protocol import codec
from bridge.protocol.cloud import CloudLayout
from bridge.protocol.errors import InvalidLayout, ProtocolViolation
from bridge.server.ring import Entry, Policy
from bridge.server.session import KIND_POINT_CLOUD, KIND_TELEMETRY, Session, Stream, StreamConfig
from bridge.v1 import bridge_pb2 as pb

#: The smallest point budget a stream may ask for: with origin-anchored voxels, a voxel wider than
#: the cloud leaves at most 8 occupied voxels (one per octant), so a budget of 8 always converges.
MIN_MAX_POINTS = 8


class Listener(Protocol):
    """How the core tells the adapters that something changed (called synchronously)."""

    def on_space(self, stream: Stream) -> None: ...
    def on_acks(self, session: Session) -> None: ...
    def on_work(self) -> None: ...
    def on_committed(self, entries: list[tuple[Stream, Entry]]) -> None: ...
    def on_evicted(self, stream: Stream, count: int) -> None: ...


class Offer(enum.Enum):
    ACCEPTED = "accepted"
    DUPLICATE = "duplicate"  # at or below accepted_seq: re-acked and ignored
    FULL = "full"  # backpressure: wait for space, then offer again


@dataclass(frozen=True, slots=True)
class CoreConfig:
    limits: codec.Limits
    max_sessions: int
    default_voxel_size: float
    default_policy: Policy
    default_passthrough: bool
    max_known_watermarks: int = 100_000
    session_bytes: int = 24 * 1024  # see SESSION_BYTES
    stream_bytes: int = 1024


# SESSION_BYTES: what one session costs (its connection's buffers and objects, measured ~25 KiB
# per idle WebSocket session, see the README's memory model), charged while the session is known.


@dataclass(frozen=True, slots=True)
class Attached:
    """What :meth:`bridge.server.core.BridgeCore.hello` decided: the session, the Welcome to send,
    and
    the connection it replaced (a device reconnecting while its old connection looked alive: one
    connection per session, the newest wins; the caller closes the old one)."""

    session: Session
    welcome: pb.Welcome
    superseded: object | None


@dataclass(frozen=True, slots=True)
class WorkItem:
    """Everything a worker needs, immutable once handed off the event loop."""

    stream: Stream
    entry: Entry
    frame: pb.Frame  # a large cloud's frame without its data (that is ``data``)
    layout: CloudLayout | None
    points: int  # input points (0 for telemetry), counted once at admission
    data: bytes | memoryview | None = None  # a large cloud's points, held apart from ``frame``


#: Clouds from this size on are held as (frame without data, data): below it, building the
#: smaller frame costs more than the copies it saves.
SPLIT_DATA_BYTES = 64 * 1024


def without_data(frame: pb.Frame) -> pb.Frame:
    """``frame`` with everything but its cloud's point data (stream, seq, time, layout, pose)."""
    cloud = frame.point_cloud
    meta = pb.Frame(stream_id=frame.stream_id, seq=frame.seq, capture_time_ns=frame.capture_time_ns)
    out = meta.point_cloud
    out.point_stride = cloud.point_stride
    out.fields.extend(cloud.fields)
    out.frame_id = cloud.frame_id
    if cloud.HasField("pose"):
        out.pose.CopyFrom(cloud.pose)
    return meta


_POLICIES = {
    pb.BACKPRESSURE: Policy.BACKPRESSURE,
    pb.DROP_OLDEST: Policy.DROP_OLDEST,
}
_LANES = (pb.PRIORITY_CONTROL, pb.PRIORITY_TELEMETRY, pb.PRIORITY_BULK)


def stream_config(spec: pb.StreamSpec, config: CoreConfig) -> StreamConfig:
    """A Hello's stream declaration read into its :class:`StreamConfig` (``config``'s defaults
    fill what the edge left unset), or refused with the error its sender is told."""
    if not spec.stream_id:
        raise ProtocolViolation("StreamSpec without a stream_id")
    if spec.kind not in (KIND_POINT_CLOUD, KIND_TELEMETRY):
        raise ProtocolViolation(f"stream {spec.stream_id!r} has no valid kind")
    if not math.isfinite(spec.voxel_size) or spec.voxel_size < 0:
        raise InvalidLayout(f"stream {spec.stream_id!r}: voxel_size must be a finite number >= 0")
    if spec.priority and spec.priority not in _LANES:
        raise ProtocolViolation(f"stream {spec.stream_id!r}: unknown priority {spec.priority}")
    if 0 < spec.max_points < MIN_MAX_POINTS:
        raise InvalidLayout(
            f"stream {spec.stream_id!r}: max_points must be 0 (no budget) or at least "
            f"{MIN_MAX_POINTS} (a cloud always fits {MIN_MAX_POINTS} voxels around the origin)"
        )
    return StreamConfig(
        kind=spec.kind,
        voxel_size=spec.voxel_size or config.default_voxel_size,
        passthrough=spec.passthrough or config.default_passthrough,
        policy=_POLICIES.get(spec.overflow, config.default_policy),
        max_points=spec.max_points,
        lane=spec.priority
        or (pb.PRIORITY_TELEMETRY if spec.kind == KIND_TELEMETRY else pb.PRIORITY_BULK),
    )
