"""The core's ingest role: a Hello attaches a connection to a session, each frame is offered to
its stream's ring, and the edge learns what was accepted and delivered through Acks.

Every rule an edge meets lives here (session limits, who may take over a live session, stream
declarations, seq order, duplicates, upstream gaps, payload layouts); what a refused frame is
told is raised as a :mod:`bridge.protocol.errors` exception. Sans-I/O: ``now_ns`` is passed in.
"""

from __future__ import annotations

import math
import uuid
from typing import cast

from bridge.protocol import codec
from bridge.protocol.cloud import CloudLayout
from bridge.protocol.errors import (
    FrameNeverFits,
    InvalidLayout,
    ProtocolViolation,
    SeqRegression,
    SessionTaken,
    TooManySessions,
    TooManyStreams,
    UnknownStream,
)
from bridge.server.core_state import CoreState
from bridge.server.governor import Charge, Component
from bridge.server.ports import SPLIT_DATA_BYTES, Attached, CoreConfig, Offer
from bridge.server.ring import AdmitResult, Gap, Policy, StreamRing
from bridge.server.session import KIND_POINT_CLOUD, KIND_TELEMETRY, Session, Stream, StreamConfig
from bridge.v1 import bridge_pb2 as pb

#: The smallest point budget a stream may ask for: with origin-anchored voxels, a voxel wider than
#: the cloud leaves at most 8 occupied voxels (one per octant), so a budget of 8 always converges.
MIN_MAX_POINTS = 8


class IngestRole(CoreState):
    @property
    def attached_sessions(self) -> int:
        return sum(1 for s in self.sessions.values() if s.attached)

    def hello(
        self, hello: pb.Hello, connection: object, *, identity_proven: bool = False
    ) -> Attached:
        """Attach a connection to a new or resumed session (see :class:`Attached`).

        A live session is taken over only with its resume token, or when the transport proved
        the device's identity (``identity_proven``: a per-device credential)."""
        if not hello.device_id:
            raise ProtocolViolation("Hello without a device_id")
        session = self.sessions.get(hello.resume_token) if hello.resume_token else None
        if session is not None and session.device_id != hello.device_id:
            raise ProtocolViolation("resume token belongs to another device")
        if session is None:
            session = self.by_device.get(hello.device_id)
            if session is not None and session.attached and not identity_proven:
                # Only the holder of the session's resume token may take over a live session
                # (a device id alone is no credential: subscribers see every device id).
                raise SessionTaken(
                    f"device {hello.device_id!r} has a live session; resume it with its "
                    "session token or wait until it disconnects"
                )
        resumed = session is not None
        if session is None:
            if self.attached_sessions >= self.config.max_sessions:
                raise TooManySessions(f"session limit {self.config.max_sessions} reached")
            self._make_room_for_a_session()
            session = Session(session_id=uuid.uuid4().hex, device_id=hello.device_id)
        elif not session.attached and self.attached_sessions >= self.config.max_sessions:
            raise TooManySessions(f"session limit {self.config.max_sessions} reached")
        new_specs = [s for s in hello.streams if s.stream_id not in session.streams]
        total = len(session.streams) + len({s.stream_id for s in new_specs})
        if total > self.config.limits.max_streams_per_session:
            raise TooManyStreams(
                f"{total} streams exceed max_streams_per_session "
                f"{self.config.limits.max_streams_per_session}"
            )
        configs = {spec.stream_id: stream_config(spec, self.config) for spec in new_specs}
        resume = {r.stream_id: r.delivered_seq for r in hello.resume}
        current = self.by_device.get(hello.device_id)
        prior = current.connection if current is not None and current.attached else None
        superseded = prior if prior is not None and prior is not connection else None
        if not resumed:  # checked last: nothing can fail once the charge is taken
            state = self.governor.try_charge(
                Component.SESSIONS,
                self.config.session_bytes + self.config.stream_bytes * len(configs),
                pinned=True,
            )
            if state is None:
                raise TooManySessions(
                    f"no memory for another session (budget {self.governor.budget_bytes} bytes)"
                )
            self._state_charges[session.session_id] = state
        self.sessions[session.session_id] = session
        self.by_device[session.device_id] = session
        for stream_id, cfg in configs.items():
            key = (session.device_id, stream_id)
            baseline = max(resume.get(stream_id, 0), self._watermarks.pop(key, 0))
            stream = Stream(key, cfg, StreamRing(self.ring_capacity_per_stream, cfg.policy))
            stream.accepted_seq = stream.delivered_seq = baseline
            session.streams[stream_id] = stream
            self.streams[key] = stream
        for stream_id, seq in resume.items():
            if stream_id not in configs and stream_id in session.streams:
                # Delivered elsewhere (another replica) since this session last saw the edge:
                # a stale accepted_seq would announce those frames as an upstream gap.
                self._delivered_elsewhere(session.streams[stream_id], seq)
        self.egress.trim_removed()
        if configs:
            state = self._state_charges[session.session_id]
            state.resize(
                self.config.session_bytes + self.config.stream_bytes * len(session.streams)
            )
            self._rebalance_rings()
        session.attached = True
        session.connection = connection
        session.reset_connection_state()
        welcome = pb.Welcome(
            session_id=session.session_id,
            limits=self.limits_now(),
            resumed=resumed,
            streams=[
                pb.StreamState(
                    stream_id=s.stream_id,
                    delivered_seq=s.delivered_seq,
                    accepted_seq=s.accepted_seq,
                )
                for s in session.streams.values()
            ],
        )
        return Attached(session, welcome, superseded)

    def live_connection(self, device_id: str) -> object | None:
        """The connection the device's session is attached to, or None (no live session): the
        incumbent a Hello refused with :class:`SessionTaken` may challenge."""
        session = self.by_device.get(device_id)
        return session.connection if session is not None and session.attached else None

    def limits_now(self) -> pb.ServerLimits:
        """The limits an edge must respect now: ``max_frame_bytes`` follows the memory plan (the
        largest frame the governor could ever grant at the current budget)."""
        limits = self.config.limits.to_proto()
        limits.max_frame_bytes = min(limits.max_frame_bytes, self.max_admissible_frame_bytes)
        return limits

    @property
    def max_admissible_frame_bytes(self) -> int:
        return self.governor.admissible_bytes

    def offer(
        self,
        session: Session,
        frame: pb.Frame,
        size: int,
        now_ns: int,
        charge: Charge | None = None,
        data: bytes | memoryview | None = None,
    ) -> Offer:
        """Admit one frame of ``size`` wire bytes, or say why not (errors are raised).

        ``charge`` holds the frame's bytes in the governor (granted at receive); when the frame
        is ACCEPTED it is transferred to the ring (the caller's handle is then moved), otherwise
        the caller still owns it. Without one (unit tests, tools) the ring charges the frame
        itself. ``data``: a large cloud's points when
        the transport kept them out of ``frame`` (:func:`codec.split_cloud_frame`).
        """
        stream = session.streams.get(frame.stream_id)
        if stream is None:
            raise UnknownStream(f"stream {frame.stream_id!r} was not declared in Hello")
        if self.governor.never_fits(size):
            raise FrameNeverFits(
                f"stream {frame.stream_id!r}: a frame of {size} bytes can never fit the memory "
                f"budget now (max_frame_bytes is {self.max_admissible_frame_bytes})"
            )
        if frame.seq == 0:
            raise SeqRegression("seq starts at 1")
        if frame.seq <= stream.conn_last_seq:
            raise SeqRegression(
                f"stream {frame.stream_id!r}: seq {frame.seq} after {stream.conn_last_seq}"
            )
        if frame.seq <= stream.accepted_seq:
            stream.conn_last_seq = frame.seq
            self._mark_dirty(stream, urgent=True)
            return Offer.DUPLICATE
        if data is None:
            layout, points, data = self._validate_payload(stream, frame)
            if data is not None:
                frame = without_data(frame)  # the parsed message (and its copy of data) goes
        else:
            layout, points, _ = self._validate_payload(stream, frame, len(data))
        gap = None
        if frame.seq > stream.accepted_seq + 1:
            missing = frame.seq - stream.accepted_seq - 1
            gap = Gap(stream.accepted_seq + 1, frame.seq - 1, missing, "upstream")
        result, evicted = stream.ring.admit(
            frame.seq, size, (frame, layout, points, data), ingest_ns=now_ns, gap=gap
        )
        if evicted:
            self.listener.on_evicted(stream, len(evicted))
        if result is AdmitResult.FULL:
            return Offer.FULL
        stream.ring.hold_newest(  # the ring's own handle: the bridge, not the edge, owns it
            charge.transfer(None, Component.RING)
            if charge is not None
            else self.governor.force(Component.RING, size)
        )
        if gap is not None:
            stream.upstream_gap_frames += gap.count
        stream.conn_last_seq = frame.seq
        stream.accepted_seq = frame.seq
        self._mark_dirty(stream, urgent=False)
        self._queue_work(stream)
        return Offer.ACCEPTED

    def _validate_payload(
        self, stream: Stream, frame: pb.Frame, nbytes: int | None = None
    ) -> tuple[CloudLayout | None, int, bytes | None]:
        """Layout and point count; a large cloud's data is read out here, once (every read of
        a protobuf bytes field is a copy: validation, processing and decimation share it)."""
        payload = frame.WhichOneof("payload")
        if stream.config.kind == KIND_POINT_CLOUD:
            if payload != "point_cloud":
                raise InvalidLayout(f"stream {stream.stream_id!r} expects point_cloud frames")
            cached = cast(codec.CachedLayout | None, stream.layout_cache)
            cloud = frame.point_cloud
            if nbytes is not None:  # the points are held apart already
                layout, points, entry = codec.cloud_layout(
                    cloud, self.config.limits, cached, nbytes
                )
                stream.layout_cache = entry
                return layout, points, None
            data = cloud.data
            layout, points, entry = codec.cloud_layout(cloud, self.config.limits, cached, len(data))
            stream.layout_cache = entry
            return layout, points, data if len(data) >= SPLIT_DATA_BYTES else None
        if payload != "telemetry":
            raise InvalidLayout(f"stream {stream.stream_id!r} expects telemetry frames")
        return None, 0, None

    def resume_ready(self, session: Session, stream_id: str, size: int) -> bool:
        """Whether a paused stream has drained to its low watermark: half its ring free (at
        least one more frame of ``size``). Why not "one frame fits": resuming then pauses again
        after the next frame, a PAUSE/RESUME pair per frame that keeps the edge stop-and-go."""
        stream = session.streams.get(stream_id)
        if stream is None:
            return True
        ring = stream.ring
        # No floor under a ring's share: a frame may be larger than the whole ring (it
        # borrows), so an empty ring always resumes.
        return ring.occupancy_bytes == 0 or ring.free_bytes >= max(size, ring.capacity_bytes // 2)

    # -- the edge's acks ----------------------------------------------------------------------
    def _mark_dirty(self, stream: Stream, *, urgent: bool) -> None:
        """Note an ack change. ``urgent`` (delivered moved, or a duplicate to re-ack) is sent
        promptly; an accepted-only change may wait a little to ride along with the next one."""
        session = self.by_device.get(stream.device_id)
        if session is not None and stream.stream_id in session.streams:
            session.dirty.add(stream.stream_id)
            session.ack_urgent = session.ack_urgent or urgent
            if session.attached:
                self.listener.on_acks(session)

    def take_acks(self, session: Session) -> pb.Ack | None:
        """The Ack to send for streams whose state changed since the last one."""
        if not session.dirty:
            return None
        acks = []
        for stream_id in sorted(session.dirty):
            stream = session.streams.get(stream_id)
            if stream is not None:
                acks.append(
                    pb.StreamAck(
                        stream_id=stream_id,
                        accepted_seq=stream.accepted_seq,
                        delivered_seq=stream.delivered_seq,
                    )
                )
        session.dirty.clear()
        session.ack_urgent = False
        return pb.Ack(streams=acks) if acks else None


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
