"""The bridge's sans-I/O heart: sessions, rings and the egress log, driven by method calls.

No sockets, clocks, threads or files in here: adapters pass in messages, sizes and timestamps,
and learn about state changes through a :class:`Listener`. That keeps every rule (admission,
duplicates, gaps, cumulative acks, watermarks, ring budgets) unit-testable without an event loop.
"""

from __future__ import annotations

import uuid
from collections import deque
from collections.abc import Awaitable, Callable
from typing import cast

from bridge.protocol import codec, wire
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
from bridge.server.core_types import (
    SPLIT_DATA_BYTES,
    Attached,
    CoreConfig,
    Listener,
    Offer,
    WorkItem,
    stream_config,
    without_data,
)
from bridge.server.egress import EgressLog, Outgoing
from bridge.server.governor import Charge, Component, Governor
from bridge.server.ring import AdmitResult, Entry, Gap, Policy, StreamRing
from bridge.server.session import KIND_POINT_CLOUD, Session, Stream, StreamKey
from bridge.v1 import bridge_pb2 as pb

# The vocabulary lives in bridge.server.core_types; these names stay importable from here.
__all__ = [
    "LANE_BURST",
    "SPLIT_DATA_BYTES",
    "Attached",
    "BridgeCore",
    "CoreConfig",
    "Listener",
    "Offer",
    "WorkItem",
]

LANE_BURST = 8  # picks a lane with work may be passed over in a row (see take_work)


class BridgeCore:
    def __init__(self, config: CoreConfig, listener: Listener, governor: Governor) -> None:
        self.config = config
        self.listener = listener
        self.governor = governor
        self.sessions: dict[str, Session] = {}
        self.by_device: dict[str, Session] = {}
        self.streams: dict[StreamKey, Stream] = {}
        self.egress = EgressLog()
        self.auto_ack = False  # no sink configured: delivered once offered to subscribers
        self._state_charges: dict[str, Charge] = {}  # session id -> its state's charge
        # Streams with PENDING entries, one round-robin queue per lane (index = lane - 1).
        self._work_queues: tuple[deque[Stream], ...] = (deque(), deque(), deque())
        self._lane_skipped = [0, 0, 0]  # picks in a row that passed over a lane with work
        self._queued: set[StreamKey] = set()
        self._watermarks: dict[StreamKey, int] = {}
        # Set by the sink pusher (push_impl.MarksLookup): asks the sink for one device's marks.
        self.marks_lookup: Callable[[str], Awaitable[list[tuple[StreamKey, int]]]] | None = None

    # -- sessions ---------------------------------------------------------------------------
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

    def limits_now(self) -> pb.ServerLimits:
        """The limits an edge must respect now: ``max_frame_bytes`` follows the memory plan (the
        largest frame the governor could ever grant at the current budget)."""
        limits = self.config.limits.to_proto()
        limits.max_frame_bytes = min(limits.max_frame_bytes, self.max_admissible_frame_bytes)
        return limits

    @property
    def max_admissible_frame_bytes(self) -> int:
        return self.governor.admissible_bytes

    def _make_room_for_a_session(self) -> None:
        """Detached sessions are kept for resume, but never more than ``max_sessions`` of them:
        forget the longest-detached one that holds no frames, or refuse the new session."""
        detached = [s for s in self.sessions.values() if not s.attached]
        if len(detached) < self.config.max_sessions:
            return
        idle = [s for s in detached if s.buffered_frames == 0]
        if not idle:
            raise TooManySessions(
                f"{len(detached)} detached sessions still hold undelivered frames"
            )
        self._forget([min(idle, key=lambda s: s.detached_at)])

    def _forget(self, sessions: list[Session]) -> None:
        for session in sessions:
            del self.sessions[session.session_id]
            if self.by_device.get(session.device_id) is session:
                del self.by_device[session.device_id]
            for stream in session.streams.values():
                self.streams.pop(stream.key, None)
                stream.ring.release_all()
            charge = self._state_charges.pop(session.session_id, None)
            if charge is not None:
                charge.release()
        if sessions:
            self._rebalance_rings()

    def close(self) -> None:
        """The bridge closed: every session is forgotten, its rings' and state's charges go
        back to the governor (nothing is delivered any more)."""
        self._forget(list(self.sessions.values()))

    def detach(self, session: Session, connection: object, now: float) -> None:
        """The connection ended; the session stays resumable until expired."""
        if session.connection is connection:
            session.attached = False
            session.connection = None
            session.detached_at = now

    def expire(self, now: float, ttl: float) -> list[Session]:
        """Forget detached sessions idle for ``ttl`` seconds whose rings are empty."""
        gone = [
            s
            for s in self.sessions.values()
            if not s.attached and now - s.detached_at >= ttl and s.buffered_frames == 0
        ]
        self._forget(gone)
        return gone

    # -- ingest -----------------------------------------------------------------------------
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
        if stream.key not in self._queued:
            self._queued.add(stream.key)
            self._work_queues[stream.config.lane - 1].append(stream)
        self.listener.on_work()
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

    # -- processing -------------------------------------------------------------------------
    def take_work(self, accept: Callable[[Stream], bool] | None = None) -> WorkItem | None:
        """Next frame to process: the highest lane with pending frames first, round robin over
        its streams (only streams ``accept`` admits, when given: e.g. the cheap ones while every
        worker is busy). Lanes order commits, so the sink and viewers get a telemetry frame
        before the clouds that were queued with it. A lane passed over ``LANE_BURST`` times in
        a row goes first once: an edge that declares everything ``control`` cannot starve the
        other edges' bulk streams (lower lanes keep at least 1 pick in ``LANE_BURST + 1``)."""
        if not self._queued:  # the common miss (called until it returns None): no work at all
            return None
        queues = self._work_queues
        skipped = self._lane_skipped
        order: tuple[int, ...] = (0, 1, 2)
        if max(skipped) >= LANE_BURST:
            starved = max(range(3), key=lambda lane: skipped[lane])
            order = (starved, *(lane for lane in order if lane != starved))
        for lane in order:
            if not queues[lane]:
                continue
            item = self._take_from(queues[lane], accept)
            if item is not None:
                for other in range(3):
                    skipped[other] = (
                        0 if other == lane or not queues[other] else (skipped[other] + 1)
                    )
                return item
        return None

    def _take_from(
        self, queue: deque[Stream], accept: Callable[[Stream], bool] | None
    ) -> WorkItem | None:
        for _ in range(len(queue)):
            stream = queue.popleft()
            if accept is not None and not accept(stream):
                queue.append(stream)
                continue
            entry = stream.ring.take_pending()
            if entry is None:
                self._queued.discard(stream.key)
                continue
            queue.append(stream)
            frame, layout, points, data = cast(
                tuple[pb.Frame, CloudLayout | None, int, bytes | memoryview | None], entry.item
            )
            return WorkItem(stream, entry, frame, layout, points, data)
        return None

    def complete(self, item: WorkItem, result: bytes | tuple[wire.Part, ...]) -> None:
        """A worker produced the serialized ProcessedFrame core for ``item`` (one buffer, or
        parts joined only when sent, so a passthrough payload is not copied once more)."""
        stream = item.stream
        before = stream.ring.occupancy_bytes
        size = len(result) if isinstance(result, bytes) else sum(map(len, result))
        stream.ring.complete(item.entry, result, size)
        committed = [(stream, e) for e in stream.ring.take_committable()]
        for pair in committed:
            self.egress.append(*pair)
        if committed:
            self.listener.on_committed(committed)
            if self.auto_ack:
                self.sink_ack(self.egress.last_bridge_seq)
        if stream.ring.occupancy_bytes < before:
            self.listener.on_space(stream)

    # -- delivery ---------------------------------------------------------------------------
    def sink_ack(self, bridge_seq: int) -> list[Entry]:
        """Cumulative ack from the sink (or auto-ack): free ring entries, advance delivered.

        Returns the entries delivered by this ack (for delivery metrics); an ack at or below
        the last one changes nothing.
        """
        if bridge_seq <= self.egress.acked_bridge_seq:
            return []
        touched: dict[StreamKey, Stream] = {}
        delivered: list[Entry] = []
        for stream, entry in self.egress.pop_acked(bridge_seq):
            if entry.removed:
                continue
            delivered.append(entry)
            stream.ring.ack(entry.seq)
            stream.delivered_seq = max(stream.delivered_seq, entry.seq)
            touched[stream.key] = stream
        for stream in touched.values():
            self._mark_dirty(stream, urgent=True)
            self.listener.on_space(stream)
        return delivered

    # The delivery port (``bridge.server.ports.Delivery``), driven by the sink pusher.
    def sink_connected(self, marks: list[tuple[StreamKey, int]]) -> None:
        """A new sink stream announced what it holds: never resend that, replay the rest."""
        self.sink_watermarks(marks)
        self.egress.rewind()

    def next_batch(self, limit: int) -> list[Entry]:
        return self.egress.take_batch(limit)

    def mark_sent(self, entry: Entry) -> Outgoing | None:
        return self.egress.mark_sent(entry)

    def sink_failed(self) -> None:
        self.egress.clear_in_flight()

    def sink_watermarks(self, marks: list[tuple[StreamKey, int]]) -> None:
        """The sink already holds these (device, stream) seqs: never send them again."""
        for key, seq in marks:
            stream = self.streams.get(key)
            if stream is None:
                if (
                    len(self._watermarks) < self.config.max_known_watermarks
                    or key in self._watermarks
                ):
                    self._watermarks[key] = max(seq, self._watermarks.get(key, 0))
                continue
            self._delivered_elsewhere(stream, seq)
        self.egress.trim_removed()

    def _delivered_elsewhere(self, stream: Stream, seq: int) -> None:
        """The sink holds ``stream`` up to ``seq`` (its watermark, or the edge's delivered_seq
        learnt from another replica): drop what the ring holds up to it, never accept it again."""
        if seq <= stream.delivered_seq:
            return
        stream.ring.ack(seq)
        stream.delivered_seq = seq
        stream.accepted_seq = max(stream.accepted_seq, seq)
        self._mark_dirty(stream, urgent=True)
        self.listener.on_space(stream)

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

    # -- capacity ---------------------------------------------------------------------------
    def set_memory_budget(self, budget_bytes: int, reserve_bytes: int) -> None:
        """Follow a new memory plan: the governor's budget changes at once and the rings'
        fair shares with it (held frames drain; nothing is admitted above the new limit)."""
        self.governor.set_budget(budget_bytes, reserve_bytes)
        self._rebalance_rings()

    def reclaim_for_waiters(self) -> int:
        """Receive grants are waiting: make room for them from ``drop_oldest`` streams."""
        return self.reclaim(max(1, self.governor.waiting_bytes))

    def reclaim(self, nbytes: int) -> int:
        """Admission is waiting for ``nbytes``: evict from ``drop_oldest`` streams (they chose
        to lose old frames rather than stall), fullest first. Returns the bytes freed."""
        freed = 0
        droppable = [s for s in self.streams.values() if s.config.policy is Policy.DROP_OLDEST]
        for stream in sorted(droppable, key=lambda s: s.ring.occupancy_bytes, reverse=True):
            if freed >= nbytes:
                break
            before = stream.ring.occupancy_bytes
            evicted = stream.ring.evict_bytes(nbytes - freed)
            if evicted:
                freed += before - stream.ring.occupancy_bytes
                self.listener.on_evicted(stream, len(evicted))
        if freed:
            self.egress.trim_removed()
        return freed

    def _rebalance_rings(self) -> None:
        per_stream = self.ring_capacity_per_stream
        for stream in self.streams.values():
            before = stream.ring.capacity_bytes
            evicted = stream.ring.resize(per_stream)
            if evicted:
                self.listener.on_evicted(stream, len(evicted))
                self.egress.trim_removed()
            if per_stream > before or evicted:
                self.listener.on_space(stream)

    @property
    def ring_capacity_per_stream(self) -> int:
        """Each stream's fair share of the admission limit; no floor."""
        return self.governor.fair_share(len(self.streams))

    @property
    def buffered_frames(self) -> int:
        return sum(len(s.ring) for s in self.streams.values())

    @property
    def buffered_bytes(self) -> int:
        return sum(s.ring.occupancy_bytes for s in self.streams.values())
