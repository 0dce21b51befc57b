"""What a connection does to a message before the core sees a frame: chunks and codecs.

Why a module of its own: the ingest connection stays one loop of "receive, admit"; this adapter
turns ``FrameChunk`` pieces into whole frames (:mod:`bridge.server.chunks`) and encoded clouds into
raw records (:mod:`bridge.protocol.compress`), so the core, the rings and decimation never learn
either exists. Sans-I/O: messages, charges and times in; frames, charges and refusals out.
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass, field

from bridge.protocol import codec, compress
from bridge.protocol.errors import DecodeBudgetSpent, ProtocolError
from bridge.server.chunks import DEFAULT_MAX_AGE_SECONDS, Reassembler, check_frame
from bridge.server.governor import Charge
from bridge.v1 import bridge_pb2 as pb

#: A decode whose declared peak memory (output and scratch, :func:`compress.declared`) is above
#: this runs in a worker thread (~1 ms of CPU and more), after that peak is granted by the
#: memory budget; smaller ones are decoded inline. Sized by what the headers *declare*, never by
#: the encoded size: a 1 KB message may declare 16 MiB.
INLINE_DECODE_BYTES = 256 * 1024
#: Default of ``refused_decode_budget_bytes``: decoded bytes of refused decodes a connection may
#: cost beyond what it decoded successfully before it is closed (``DecodeBudgetSpent``).
REFUSED_DECODE_BUDGET_BYTES = 32 << 20


@dataclass(slots=True)
class RefusedDecodes:
    """Decode work a connection made us do for nothing (sans-I/O). Every refused decode adds
    its declared size; every successful one pays back as much; past ``budget_bytes`` the
    connection is closed. An edge with an occasional corrupt frame never gets near it; an edge
    that sends bombs costs at most the budget plus what its good frames cost anyway."""

    budget_bytes: int
    owed_bytes: int = 0

    def refused(self, nbytes: int) -> None:
        self.owed_bytes += nbytes

    def decoded(self, nbytes: int) -> None:
        self.owed_bytes = max(0, self.owed_bytes - nbytes)

    def check(self) -> None:
        if self.owed_bytes > self.budget_bytes:
            raise DecodeBudgetSpent(
                f"refused decodes on this connection cost {self.owed_bytes} decoded bytes, over "
                f"refused_decode_budget_bytes {self.budget_bytes}"
            )


@dataclass(slots=True)
class Ready:
    """A whole frame for the core (``None`` while pieces are missing), its size in bytes as the
    ring holds it (decoded), the charge for those bytes, and refusals to report."""

    frame: pb.Frame | None = None
    size: int = 0
    charge: Charge | None = None
    errors: list[ProtocolError] = field(default_factory=list)
    points: memoryview | None = None  # a large cloud's points, still in the wire bytes
    #: The cloud is still encoded: large enough to be decoded off the event loop
    #: (:meth:`Uplink.decode_data` in a thread, then :meth:`Uplink.settle`); ``size`` is the
    #: encoded size until then.
    encoded: bool = False

    def __enter__(self) -> Ready:
        return self

    def __exit__(self, *exc_info: object) -> None:
        """``with uplink.take(...) as ready:`` releases the charge unless it was handed on."""
        if self.charge is not None and not self.charge.released:
            self.charge.release()


class Uplink:
    """Per connection: the codecs its Hello declared and its incomplete chunked frames."""

    def __init__(
        self,
        hello: pb.Hello,
        streams: Container[str],
        limits: codec.Limits,
        refused_decode_budget_bytes: int = REFUSED_DECODE_BUDGET_BYTES,
        chunk_max_age_seconds: float = DEFAULT_MAX_AGE_SECONDS,
    ) -> None:
        self.codecs = {
            s.stream_id: spec
            for s in hello.streams
            if (spec := compress.spec_of(s)).codec != compress.NONE
        }
        self.limits = limits
        self.chunks = Reassembler(streams, limits.max_frame_bytes, chunk_max_age_seconds)
        self.refusals = RefusedDecodes(refused_decode_budget_bytes)

    @staticmethod
    def check_hello(hello: pb.Hello) -> None:
        """Refuse a Hello that declares a codec this bridge cannot decode (``CodecError``)."""
        for spec in hello.streams:
            compress.spec_of(spec)

    def take(self, msg: pb.EdgeMessage, size: int, charge: Charge, now: float) -> Ready:
        """One parsed message and its charge (taken over: a piece's is transferred to its
        incomplete frame, the rest is released here or returned in :class:`Ready`)."""
        ready = Ready()
        if msg.WhichOneof("kind") == "chunk":
            fed = self.chunks.feed(msg.chunk, charge, now)
            ready.errors = fed.errors
            if fed.data is None or fed.charge is None or fed.header is None:
                return ready
            charge = fed.charge
            try:
                whole = codec.decode_edge(fed.data, self.limits)
                size = len(fed.data)
                del fed
                check_frame(whole.frame, msg.chunk.stream_id, msg.chunk.seq)
            except ProtocolError as exc:
                charge.release()
                if exc.frame is None:
                    exc.frame = pb.Frame(stream_id=msg.chunk.stream_id, seq=msg.chunk.seq)
                ready.errors.append(exc)
                return ready
            frame = whole.frame
        else:
            frame = msg.frame
            abandoned = self.chunks.frame_arrived(frame.stream_id)
            if abandoned is not None:
                ready.errors.append(abandoned)
        return self._decoded(ready, frame, size, charge)

    def take_split(
        self, frame: pb.Frame, points: memoryview | None, size: int, charge: Charge
    ) -> Ready:
        """A whole large cloud whose points were left in the wire bytes (``codec.split_cloud_
        frame``): they stay there unless the stream's codec must decode them."""
        ready = Ready()
        abandoned = self.chunks.frame_arrived(frame.stream_id)
        if abandoned is not None:
            ready.errors.append(abandoned)
        if frame.stream_id in self.codecs and points is not None:
            frame.point_cloud.data = bytes(points)  # the encoded bytes: a fraction of the cloud
            points = None
        return self._decoded(ready, frame, size, charge, points)

    def _decoded(
        self,
        ready: Ready,
        frame: pb.Frame,
        size: int,
        charge: Charge,
        points: memoryview | None = None,
    ) -> Ready:
        """``ready`` with ``frame`` decoded by its stream's codec, or with the refusal (and
        ``charge`` released); a decode too large to run inline is left for the caller. A fatal
        refusal (``DecodeBudgetSpent``) is raised, with ``charge`` released."""
        try:
            size, encoded = self.prepare(frame, size, charge)
            if encoded:
                ready.frame, ready.size, ready.charge, ready.encoded = frame, size, charge, True
                return ready
        except ProtocolError as exc:
            charge.release()
            if exc.fatal:
                raise
            ready.errors.append(exc)
            return ready
        ready.frame, ready.size, ready.charge, ready.points = frame, size, charge, points
        return ready

    def plan(self, frame: pb.Frame, *, admitted: bool = False) -> compress.Declared | None:
        """What decoding ``frame``'s cloud will hold, from its headers only (``None``: no
        codec). Refusals (``ProtocolError`` naming the frame) cost no decoding: a declared size
        above the limits, or a connection whose refused decodes spent its budget (fatal; not
        asked again once ``admitted``: the frame passed that check on arrival)."""
        spec = self.codecs.get(frame.stream_id)
        if spec is None or frame.WhichOneof("payload") != "point_cloud":
            return None
        try:
            if not admitted:
                self.refusals.check()
            return compress.declared(
                frame.point_cloud, spec, self.limits.max_points, self.limits.max_frame_bytes
            )
        except ProtocolError as exc:
            exc.frame = pb.Frame(stream_id=frame.stream_id, seq=frame.seq)
            raise

    def prepare(self, frame: pb.Frame, size: int, charge: Charge) -> tuple[int, bool]:
        """The frame's cloud decoded in place when its stream has a codec and the decode's
        declared peak is small (:data:`INLINE_DECODE_BYTES`: charged to ``charge`` first, which
        then shrinks to the decoded frame); (the frame's size now, True when the decode is too
        large for the event loop and left to the caller). A stream without a codec costs one
        lookup: every frame of a batch comes here. A refusal (``ProtocolError`` naming the
        frame; :meth:`plan`'s, or the decode's) leaves ``charge`` to the caller."""
        if frame.stream_id not in self.codecs:
            return size, False
        plan = self.plan(frame)
        if plan is None:
            return size, False
        if plan.peak_bytes > INLINE_DECODE_BYTES:
            return size, True
        charge.resize(charge.nbytes + plan.peak_bytes)  # bounded by INLINE_DECODE_BYTES
        try:
            counts = self.decode_data(frame, plan)
        except ProtocolError:
            self.refusals.refused(plan.decoded_bytes)
            raise
        return self.settle(size, *counts, charge), False

    def decode_data(self, frame: pb.Frame, plan: compress.Declared) -> tuple[int, int]:
        """Decode ``frame``'s cloud in place as ``plan`` (from :meth:`plan`) declared; (encoded,
        decoded) bytes of its data. Touches nothing but ``frame``: safe in a worker thread (zstd
        and numpy release the GIL). A refusal is counted with :meth:`refused` by the caller."""
        spec = self.codecs[frame.stream_id]
        try:
            return compress.decode_declared(frame.point_cloud, spec, plan)
        except ProtocolError as exc:
            exc.frame = pb.Frame(stream_id=frame.stream_id, seq=frame.seq)
            raise

    def settle(self, size: int, encoded: int, decoded: int, charge: Charge) -> int:
        """The frame's size once decoded; ``charge`` (which held the decode's peak) shrinks to
        it, and the decoded bytes pay back refused decode work."""
        self.refusals.decoded(decoded)
        size = size - encoded + decoded
        charge.resize(size)
        return size

    def close(self) -> None:
        self.chunks.close()
