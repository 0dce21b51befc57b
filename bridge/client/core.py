"""The edge's half of the protocol as a state machine: no sockets, no clocks, no tasks.

Why sans-I/O: resume is the hard part of an edge (keep every frame until the bridge says
*delivered*, resend above the right seq after a reconnect, never resend what the bridge already
holds), and it is easiest to get right where it can be tested message by message. The async client
(:mod:`bridge.client.client`) feeds this core the messages it receives and the time, and sends what
:meth:`EdgeCore.next_to_send` hands out.

What it tracks: per stream the next seq, the bounded resend buffer (bytes and frames, shared by all
streams), the bridge's cumulative ``accepted_seq`` / ``delivered_seq`` and PAUSE/RESUME state.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from bridge.client.codecs import CloudCodec, codec_spec, encode_payload
from bridge.client.payload import Kind, Payload, PreparedPayload, frame_head
from bridge.protocol.compress import CodecSpec
from bridge.v1 import bridge_pb2 as pb

Overflow = Literal["default", "backpressure", "drop_oldest"]
_OVERFLOW = {
    "default": pb.OVERFLOW_POLICY_UNSPECIFIED,
    "backpressure": pb.BACKPRESSURE,
    "drop_oldest": pb.DROP_OLDEST,
}
_KINDS = {"point_cloud": pb.POINT_CLOUD, "telemetry": pb.TELEMETRY}
Priority = Literal["default", "control", "telemetry", "bulk"]
_PRIORITIES = {
    "default": pb.PRIORITY_UNSPECIFIED,
    "control": pb.PRIORITY_CONTROL,
    "telemetry": pb.PRIORITY_TELEMETRY,
    "bulk": pb.PRIORITY_BULK,
}
#: The lane of a stream that does not choose one: telemetry before clouds.
_DEFAULT_LANE = {"point_cloud": pb.PRIORITY_BULK, "telemetry": pb.PRIORITY_TELEMETRY}
#: Error codes that refuse one frame (``Error.seq``) for good: resending it cannot succeed.
FRAME_REJECTIONS = frozenset(
    {
        pb.INVALID_LAYOUT,
        pb.TOO_LARGE,
        pb.TOO_MANY_POINTS,
        pb.UNKNOWN_STREAM,
        pb.SEQ_REGRESSION,
        pb.CODEC_ERROR,
    }
)
#: Error codes after which a chunked frame is sent again from its first piece.
CHUNK_RESTARTS = frozenset({pb.CHUNK_ABANDONED, pb.CHUNK_SEQUENCE})
#: Called with (stream_id, seq, capture_time_ns, now_ns) for every frame newly delivered.
DeliveryHook = Callable[[str, int, int, int], None]


@dataclass(frozen=True, slots=True)
class StreamSpec:
    """One stream the edge declares in its Hello (``bridge.v1.StreamSpec``).

    ``voxel_size`` 0 and ``overflow`` "default" take the bridge's settings. ``overflow`` also
    decides what ``publish`` does when there is no room: "drop_oldest" streams never wait (the
    bridge and the resend buffer drop their oldest frames, and count them); other streams wait
    for RESUME and for room in the resend buffer. A ``bridge.v1.OverflowPolicy`` number is
    accepted too.
    """

    stream_id: str
    kind: Kind = "point_cloud"
    voxel_size: float = 0.0
    passthrough: bool = False
    overflow: Overflow | int = "default"
    max_points: int = 0
    priority: Priority = "default"
    codec: CloudCodec = "none"
    step: float = 0.001
    attr_step: float = 0.0
    level: int = 0

    def __post_init__(self) -> None:
        if self.priority not in _PRIORITIES:
            raise ValueError(f"priority must be one of {sorted(_PRIORITIES)}")
        if self.codec != "none":
            if self.kind != "point_cloud":
                raise ValueError("codecs apply to point-cloud streams only")
            self.codec_spec  # noqa: B018 - validates the codec's parameters
        if not self.stream_id:
            raise ValueError("stream_id must not be empty")
        if self.kind not in _KINDS:
            raise ValueError(f"kind must be 'point_cloud' or 'telemetry', got {self.kind!r}")
        if self.voxel_size < 0 or self.max_points < 0:
            raise ValueError("voxel_size and max_points must be >= 0")
        if isinstance(self.overflow, str) and self.overflow not in _OVERFLOW:
            raise ValueError(f"overflow must be one of {sorted(_OVERFLOW)}, got {self.overflow!r}")

    @property
    def policy(self) -> int:
        """The ``bridge.v1.OverflowPolicy`` number."""
        return _OVERFLOW[self.overflow] if isinstance(self.overflow, str) else int(self.overflow)

    @property
    def waits_for_room(self) -> bool:
        return self.policy != pb.DROP_OLDEST

    @property
    def lane(self) -> int:
        """The ``bridge.v1.Priority`` this stream's frames are sent with (lower goes first)."""
        return _PRIORITIES[self.priority] or _DEFAULT_LANE[self.kind]

    @property
    def codec_spec(self) -> CodecSpec:
        return codec_spec(self.codec, step=self.step, attr_step=self.attr_step, level=self.level)

    def to_proto(self) -> pb.StreamSpec:
        codec, params = self.codec_spec.to_proto()
        return pb.StreamSpec(
            stream_id=self.stream_id,
            kind=_KINDS[self.kind],
            voxel_size=self.voxel_size,
            passthrough=self.passthrough,
            overflow=self.policy,  # type: ignore[arg-type]
            max_points=self.max_points,
            priority=_PRIORITIES[self.priority],
            codec=codec,  # type: ignore[arg-type]
            codec_params=params,
        )


@dataclass
class EdgeStats:
    """What one edge did and saw. ``accepted``/``delivered`` count frames newly covered by the
    bridge's cumulative acks; ``dropped`` counts frames evicted from a full resend buffer;
    ``rejected`` frames the bridge refused for good (never resent)."""

    published: int = 0
    sent: int = 0
    batches: int = 0  # messages that carried more than one frame
    resent: int = 0
    accepted: int = 0
    delivered: int = 0
    dropped: int = 0
    rejected: int = 0
    disconnects: int = 0
    reconnects: int = 0
    connect_failures: int = 0
    drains: int = 0
    pauses: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    close_reasons: Counter[str] = field(default_factory=Counter)

    def as_dict(self) -> dict[str, Any]:
        d = dict(vars(self))
        d["errors"] = dict(self.errors)
        d["close_reasons"] = dict(self.close_reasons)
        return d


@dataclass(slots=True)
class Entry:
    """One buffered frame: its small head and the (shared, immutable) prepared payload.

    Why not the serialized message: joining them copies the whole payload, and under overload
    most buffered frames are evicted before they are ever sent. The copy is made by
    :attr:`data`, when the frame goes out.
    """

    stream_id: str
    seq: int
    order: int  # global publish order: "oldest" across streams
    head: bytes
    payload: PreparedPayload
    capture_time_ns: int
    transmissions: int = 0

    @property
    def nbytes(self) -> int:
        return len(self.head) + self.payload.nbytes

    @property
    def data(self) -> bytes:
        """The serialized ``EdgeMessage{frame}``, sent as is on every attempt."""
        return self.head + self.payload.frame_bytes


class StreamState:
    """Per-stream bookkeeping: ``buf`` holds unacknowledged frames in seq order, ``pending`` the
    ones not yet sent on the current connection."""

    __slots__ = (
        "accepted",
        "buf",
        "delivered",
        "handed",
        "next_seq",
        "paused",
        "pending",
        "spec",
        "unaccepted",
    )

    def __init__(self, spec: StreamSpec) -> None:
        self.spec = spec
        self.next_seq = 1
        self.buf: dict[int, Entry] = {}
        self.pending: deque[Entry] = deque()
        # Seqs sent at least once and not yet covered by accepted_seq: an ack counts only
        # these, never the frames evicted unsent that its cumulative seq jumps over.
        self.unaccepted: deque[int] = deque()
        # (seq, capture time) of accepted frames evicted from the buffer: the bridge still
        # delivers them, so they count as delivered then, not as dropped.
        self.handed: deque[tuple[int, int]] = deque()
        self.accepted = 0
        self.delivered = 0
        self.paused = False


class EdgeCore:
    """Sequence numbers, the bounded resend buffer, and what acks and flow control do to them."""

    def __init__(
        self,
        device_id: str,
        streams: Sequence[StreamSpec],
        *,
        resend_buffer_bytes: int,
        resend_buffer_frames: int,
        stats: EdgeStats | None = None,
        on_delivered: DeliveryHook | None = None,
        protect_backpressure: bool = True,
    ) -> None:
        if not device_id:
            raise ValueError("device_id must not be empty")
        if not streams:
            raise ValueError("an edge needs at least one stream")
        if len({s.stream_id for s in streams}) != len(streams):
            raise ValueError("stream ids must be unique")
        if resend_buffer_bytes <= 0 or resend_buffer_frames <= 0:
            raise ValueError("resend buffer bounds must be > 0")
        self.device_id = device_id
        self.streams = {s.stream_id: StreamState(s) for s in streams}
        self.max_bytes = resend_buffer_bytes
        self.max_frames = resend_buffer_frames
        self.stats = stats if stats is not None else EdgeStats()
        self.on_delivered = on_delivered
        #: Evict only drop_oldest streams' frames from a full buffer (False: any stream's).
        self.protect_backpressure = protect_backpressure
        self.session_id = ""
        self.welcomed = False
        self.session_paused = False
        self.buffered_bytes = 0
        self.buffered_frames = 0
        self._order = 0

    # -- publishing ---------------------------------------------------------------------------

    def stream(self, stream_id: str) -> StreamState:
        try:
            return self.streams[stream_id]
        except KeyError:
            raise KeyError(
                f"stream {stream_id!r} was not declared (declared: {sorted(self.streams)})"
            ) from None

    def prepare(self, stream_id: str, payload: Payload | PreparedPayload) -> PreparedPayload:
        """Encode ``payload`` for ``stream_id`` (KeyError if undeclared, TypeError if the
        payload does not fit the stream's kind), with the stream's codec. Pure: safe to call
        from any thread."""
        spec = self.stream(stream_id).spec
        return encode_payload(PreparedPayload.of(payload, spec.kind), spec.codec_spec)

    def paused(self, stream_id: str) -> bool:
        return self.session_paused or self.stream(stream_id).paused

    def has_room(self, nbytes: int) -> bool:
        """Whether a frame of about ``nbytes`` fits without evicting anything. An empty buffer
        always takes one frame, however large: a publish must be able to make progress."""
        if self.buffered_frames == 0:
            return True
        return (
            self.buffered_frames < self.max_frames
            and self.buffered_bytes + nbytes <= self.max_bytes
        )

    def must_wait(self, stream_id: str, nbytes: int) -> bool:
        """Backpressure for ``publish``: a stream that is not drop_oldest waits while it is paused
        or while the resend buffer is full."""
        st = self.stream(stream_id)
        if not st.spec.waits_for_room:
            return False
        return self.paused(stream_id) or not self.has_room(nbytes)

    def publish(self, stream_id: str, payload: PreparedPayload, capture_time_ns: int) -> int:
        """Assign the next seq, buffer the frame, evict the oldest frames beyond the bounds."""
        st = self.stream(stream_id)
        if payload.kind != st.spec.kind:
            raise TypeError(f"a {payload.kind} payload on {st.spec.kind} stream {stream_id!r}")
        head = frame_head(stream_id, st.next_seq, capture_time_ns, payload)
        self._order += 1
        entry = Entry(stream_id, st.next_seq, self._order, head, payload, capture_time_ns)
        st.next_seq += 1
        st.buf[entry.seq] = entry
        st.pending.append(entry)
        self.buffered_bytes += entry.nbytes
        self.buffered_frames += 1
        self.stats.published += 1
        while self.buffered_frames > self.max_frames or self.buffered_bytes > self.max_bytes:
            if not self._evict_oldest(entry):
                break  # only protected frames (or the new one) left: over by this frame at most
        return entry.seq

    def _evict_oldest(self, newest: Entry) -> bool:
        """Drop the oldest evictable frame, preferring frames never sent. The newest frame
        always stays (evicting it would make publish a no-op), and backpressure streams'
        frames stay when protected: a drop_oldest stream must never cost a stream that
        promises not to drop. Why unsent first: a frame already sent may be in the bridge's
        hands and get delivered; dropping it would count it twice (dropped and delivered) and
        lose its resend."""
        streams = [
            s
            for s in self.streams.values()
            if not self.protect_backpressure or not s.spec.waits_for_room
        ]
        held: Entry | None = None  # the oldest frame the bridge already accepted
        victim: Entry | None = None
        oldest: Entry | None = None
        for s in streams:
            for e in s.buf.values():
                if e is newest:
                    break
                if e.seq <= s.accepted:
                    if held is None or e.order < held.order:
                        held = e
                    continue
                if oldest is None or e.order < oldest.order:
                    oldest = e
                if e.transmissions == 0:
                    if victim is None or e.order < victim.order:
                        victim = e
                    break
        if held is not None:
            # Accepted: the bridge holds it and delivers it; only its resend is given up.
            st = self.streams[held.stream_id]
            del st.buf[held.seq]
            st.handed.append((held.seq, held.capture_time_ns))
            self._forget(held)
            return True
        victim = victim or oldest
        if victim is None:
            return False
        entry = self.streams[victim.stream_id].buf.pop(victim.seq)
        self._forget(entry)
        self.stats.dropped += 1
        return True

    def _forget(self, entry: Entry) -> None:
        self.buffered_bytes -= entry.nbytes
        self.buffered_frames -= 1

    def reject(self, stream_id: str, seq: int) -> bool:
        """Forget a frame the bridge refused for good (it would be refused again on resend)."""
        st = self.streams.get(stream_id)
        entry = st.buf.pop(seq, None) if st is not None else None
        if entry is None:
            return False
        self._forget(entry)
        self.stats.rejected += 1
        return True

    # -- connection lifecycle -----------------------------------------------------------------

    def hello(self, auth_token: str = "") -> bytes:
        """The serialized ``EdgeMessage{hello}``: streams, the session to resume and, per stream,
        the last ``delivered_seq`` this edge was told (it holds every frame above it)."""
        return pb.EdgeMessage(
            hello=pb.Hello(
                device_id=self.device_id,
                resume_token=self.session_id,
                streams=[s.spec.to_proto() for s in self.streams.values()],
                resume=[
                    pb.ResumeState(stream_id=sid, delivered_seq=s.delivered)
                    for sid, s in self.streams.items()
                ],
                auth_token=auth_token,
            )
        ).SerializeToString()

    def on_welcome(self, welcome: pb.Welcome, now_ns: int) -> None:
        """Adopt the session and queue every buffered frame the bridge does not hold.

        A resumed session still holds what it accepted, so resending starts above
        ``accepted_seq``; a new session (bridge restarted) gets everything above
        ``delivered_seq``, which comes from the sink's watermarks.

        On the first Welcome of this process, a stream the bridge already knows (the device
        published before, from an earlier process) continues above the bridge's seqs: frames
        numbered from 1 again would be taken for duplicates and never delivered.
        """
        first, self.welcomed = not self.welcomed, True
        self.session_id = welcome.session_id
        self.session_paused = False
        states = {s.stream_id: s for s in welcome.streams}
        for sid, st in self.streams.items():
            st.paused = False
            state = states.get(sid)
            if first and state is not None:
                self._continue_after(st, max(state.accepted_seq, state.delivered_seq))
            self._delivered(st, state.delivered_seq if state else 0, now_ns)
            if not (welcome.resumed and state is not None):
                # A new session lost the ring: accepted frames handed to the old one are gone.
                lost = [h for h in st.handed if h[0] > st.delivered]
                self.stats.dropped += len(lost)
                st.handed.clear()
            if welcome.resumed and state is not None:
                start = max(st.delivered, state.accepted_seq)
                self._accepted(st, state.accepted_seq)
            else:
                start = st.delivered
            st.pending = deque(e for e in st.buf.values() if e.seq > start)

    def _continue_after(self, st: StreamState, floor: int) -> None:
        """Shift this stream's seqs (all unsent: no Welcome came before) above ``floor``."""
        if floor <= 0:
            return
        renumbered: dict[int, Entry] = {}
        for e in st.buf.values():
            head = frame_head(e.stream_id, e.seq + floor, e.capture_time_ns, e.payload)
            self.buffered_bytes += len(head) - len(e.head)
            e.seq, e.head = e.seq + floor, head
            renumbered[e.seq] = e
        st.buf = renumbered
        st.next_seq += floor
        st.accepted = st.delivered = floor  # not this process's frames: not counted

    def on_ack(self, ack: pb.Ack, now_ns: int) -> None:
        for sa in ack.streams:
            st = self.streams.get(sa.stream_id)
            if st is not None:
                self._accepted(st, sa.accepted_seq)
                self._delivered(st, sa.delivered_seq, now_ns)

    def _accepted(self, st: StreamState, seq: int) -> None:
        """Advance ``accepted_seq``; count only frames this edge sent (frames evicted unsent are
        gaps the bridge announces, counted once as ``dropped``)."""
        if seq <= st.accepted:
            return
        st.accepted = seq
        while st.unaccepted and st.unaccepted[0] <= seq:
            st.unaccepted.popleft()
            self.stats.accepted += 1

    def _delivered(self, st: StreamState, seq: int, now_ns: int) -> None:
        """Discard buffered frames up to ``seq`` (never earlier)."""
        if seq <= st.delivered:
            return
        st.delivered = seq
        hook = self.on_delivered
        while st.handed and st.handed[0][0] <= seq:
            handed_seq, capture_ns = st.handed.popleft()
            self.stats.delivered += 1
            if hook is not None:
                hook(st.spec.stream_id, handed_seq, capture_ns, now_ns)
        while st.buf:
            first = next(iter(st.buf))
            if first > seq:
                break
            entry = st.buf.pop(first)
            self._forget(entry)
            self.stats.delivered += 1
            if hook is not None:
                hook(entry.stream_id, entry.seq, entry.capture_time_ns, now_ns)

    def on_flow_control(self, fc: pb.FlowControl) -> None:
        if fc.action not in (pb.FlowControl.PAUSE, pb.FlowControl.RESUME):
            return
        paused = fc.action == pb.FlowControl.PAUSE
        self.stats.pauses += paused
        if not fc.stream_id:
            self.session_paused = paused
        elif (st := self.streams.get(fc.stream_id)) is not None:
            st.paused = paused

    def on_error(self, err: pb.Error) -> None:
        """Count the error; forget the frame it names when resending could never succeed, or
        queue it again when the bridge dropped it incomplete (a chunked frame)."""
        self.stats.errors[pb.ErrorCode.Name(err.code)] += 1
        if err.code in FRAME_REJECTIONS and err.stream_id and err.seq:
            self.reject(err.stream_id, err.seq)
        elif err.code in CHUNK_RESTARTS and err.stream_id and err.seq:
            self.requeue(err.stream_id, err.seq)

    def requeue(self, stream_id: str, seq: int) -> bool:
        """Send a buffered frame again on this connection (in seq order); False if it is gone
        (delivered or evicted meanwhile) or already queued."""
        st = self.streams.get(stream_id)
        entry = st.buf.get(seq) if st is not None else None
        if st is None or entry is None or any(e is entry for e in st.pending):
            return False
        st.pending = deque(sorted((*st.pending, entry), key=lambda e: e.seq))
        return True

    # -- sending ------------------------------------------------------------------------------

    def next_to_send(self, max_frame_bytes: int = 0, *, by_lane: bool = False) -> Entry | None:
        """The oldest frame not yet sent on this connection, among streams that are not paused
        (with ``by_lane``: the oldest of the highest-priority lane that has one).

        Frames above ``max_frame_bytes`` (the Welcome's limit, 0 = none) are rejected here:
        sending one would only get the connection closed, again after every reconnect.
        """
        if self.session_paused:
            return None
        lanes = {sid: st.spec.lane if by_lane else 0 for sid, st in self.streams.items()}

        def rank(e: Entry) -> tuple[int, int]:
            return lanes[e.stream_id], e.order

        best: Entry | None = None
        for st in self.streams.values():
            if st.paused:
                continue
            while st.pending and (
                st.pending[0].seq not in st.buf  # acked or evicted meanwhile
                or (max_frame_bytes and st.pending[0].nbytes > max_frame_bytes)
            ):
                head = st.pending.popleft()
                if head.seq in st.buf:
                    self.reject(head.stream_id, head.seq)
            if st.pending and (best is None or rank(st.pending[0]) < rank(best)):
                best = st.pending[0]
        return best

    def mark_sent(self, entry: Entry) -> None:
        st = self.streams[entry.stream_id]
        if st.pending and st.pending[0] is entry:
            st.pending.popleft()
        if entry.transmissions:
            self.stats.resent += 1
        else:
            self.stats.sent += 1
            if entry.seq > st.accepted:
                st.unaccepted.append(entry.seq)
        entry.transmissions += 1

    def all_delivered(self) -> bool:
        return self.buffered_frames == 0
